"""The shape of an elastic job on Slurm, shared by ``amoeba-sbatch`` and :class:`ElasticExecutor`.

One job of one component: the minimum workers (one task per worker; for a job that opted in to GPU sharing, in the
sharing partition, one worker per node, each holding :data:`~slurm_amoeba.core.sharing.HOST_SHARDS` shards of one
GPU instead of the GPU); the agent runs in its batch step, and the workers as a step of the same allocation (the
shape plain ``sbatch --elastic`` has too). Not a heterogeneous job: Slurm 22.05's backfill starts a heterogeneous
job's components one after the other and, when a later one cannot start at once, deallocates the ones it started
and keeps the job from starting for the credential lifetime (``_het_job_start_now``/``_het_job_kill_now`` in
``src/plugins/sched/backfill/backfill.c``); an elastic job's workers often start by preempting satellites, which
leave only after ``GraceTime``, so every such start failed that way (SLURM-FACTS.md). One component just waits for
the satellites to leave. The worker range and per-worker resources travel to ``amoeba-run`` in the job's environment
(:class:`~slurm_amoeba.core.jobenv.JobEnv`, whose first variables the SPANK plugin sets too).
Everything here is checked before anything is submitted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.core.jobenv import DEFAULT_ELASTIC_PARTITION, JobEnv
from slurm_amoeba.core.sharing import DEFAULT_SHARE_PARTITION, HOST_SHARDS, SHARE_MODES, share_mode_error
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.slurm import SlurmClient, SubmitOptions
from slurm_amoeba.slurm.marks import elastic_comment

DEFAULT_SIGNAL_LEAD_S = 120
"""Seconds before its time limit that Slurm warns a job's agent (``--signal=B:USR1@120``), unless a short time limit
asks for less: the workers stop at a step boundary, write a final checkpoint and the job requeues itself
(:mod:`slurm_amoeba.agent.lifecycle`). Slurm may send it up to a minute early (its time-limit checks are periodic)."""
#: The sbatch options that say how the job ends and comes back; the user's own win over the executor's.
LIFECYCLE_OPTIONS = frozenset({"signal", "requeue", "no-requeue"})
#: Where a site whose daemon admits elastic jobs at their requested size (docs/admin.md, section 8c) says how many
#: seconds a new elastic job waits before Slurm may start it, so that the daemon sees it pending and can hold it.
ADMISSION_DELAY_ENV = "AMOEBA_ADMISSION_DELAY_S"
#: The longest such delay accepted (a site's typo must not keep jobs waiting for hours).
MAX_ADMISSION_DELAY_S = 600


def admission_delay_s(environ: Mapping[str, str], given: Iterable[str] = ()) -> int:
    """Seconds a new elastic job waits before it is eligible (``--begin=now+N``): the site's
    :data:`ADMISSION_DELAY_ENV`, 0 when unset or when the user gave a ``--begin`` of their own (``given``: the names
    of the user's sbatch options).

    Raises:
        SpecError: the variable is not a whole number of seconds from 0 to :data:`MAX_ADMISSION_DELAY_S`.
    """
    raw = environ.get(ADMISSION_DELAY_ENV, "").strip()
    if not raw or "begin" in set(given):
        return 0
    if not raw.isdigit() or int(raw) > MAX_ADMISSION_DELAY_S:
        raise SpecError(
            f"{ADMISSION_DELAY_ENV}={raw!r}: give whole seconds from 0 to {MAX_ADMISSION_DELAY_S} (the daemon's "
            f"round interval and a little more, e.g. 10), or unset it"
        )
    return int(raw)


def signal_lead_s(time_min: int | None, given_s: int | None = None) -> int:
    """How long before the time limit Slurm warns the agent: ``given_s``, else :data:`DEFAULT_SIGNAL_LEAD_S`, but at
    most a quarter of a time limit under 8 minutes (at least 10 s), so that a short job trains before it requeues.

    Raises:
        SpecError: ``given_s`` is not a whole number of seconds between 1 and 65535 (Slurm's range).
    """
    if given_s is not None:
        if isinstance(given_s, bool) or not isinstance(given_s, int) or not 1 <= given_s <= 65535:
            raise SpecError(f"signal_delay_s={given_s!r}: give whole seconds between 1 and 65535, e.g. 120")
        return given_s
    if time_min is not None and time_min * 60 < 4 * DEFAULT_SIGNAL_LEAD_S:
        return max(10, time_min * 60 // 4)
    return DEFAULT_SIGNAL_LEAD_S


def lifecycle_options(lead_s: int, given: Iterable[str]) -> tuple[str, ...]:
    """``--signal=B:USR1@<lead_s>`` and ``--requeue`` for the agent's component, each left out when the user gave
    an option of its kind (``given``: the names of the user's sbatch options, ``#SBATCH`` lines included)."""
    names = set(given)
    out: list[str] = []
    if "signal" not in names:
        out.append(f"--signal=B:USR1@{lead_s}")
    if not names & {"requeue", "no-requeue"}:
        out.append("--requeue")  # also what lets Slurm requeue the job when the agent's node fails
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class ElasticJobShape:
    """An elastic job's Slurm request.

    Attributes:
        spec: worker range and per-worker resources.
        partition: partition of the job itself (the agent and the minimum workers); None: the default.
        elastic_partition: partition of the satellites that grow it.
        name: job name.
        time_min: time limit in minutes (None: the partition's).
        output: the batch script's (the agent's) stdout path pattern.
        error: its stderr path pattern.
        daemon_endpoint: the daemon the agent reports to, if any.
        extra: further sbatch arguments (the user's own sbatch options).
        lifecycle: sbatch arguments for the time limit and requeues (:func:`lifecycle_options`).
        comment: the user's own ``--comment``; the job's comment is the elastic mark followed by it
            (:func:`~slurm_amoeba.slurm.marks.elastic_comment`), which the daemon reads while the job is pending.
        begin_delay_s: the job becomes eligible this many seconds after submission (:func:`admission_delay_s`).
        share: the job's sharing mode (one of :data:`~slurm_amoeba.core.sharing.SHARE_MODES`), or None: its GPUs
            are its own.
        share_partition: the partition of the sharing nodes, where a job that opted in runs its minimum workers.

    Raises:
        SpecError: (on construction) a sharing mode that is not one, or a job that opted in to sharing whose
            workers hold other than one GPU each.
    """

    spec: ElasticSpec
    partition: str | None = None
    elastic_partition: str = DEFAULT_ELASTIC_PARTITION
    name: str | None = None
    time_min: int | None = None
    output: str | None = None
    error: str | None = None
    daemon_endpoint: str | None = None
    extra: tuple[str, ...] = ()
    lifecycle: tuple[str, ...] = ()
    comment: str | None = None
    begin_delay_s: int = 0
    share: str | None = None
    share_partition: str = DEFAULT_SHARE_PARTITION

    def __post_init__(self) -> None:
        if self.share is None:
            return
        if self.share not in SHARE_MODES:
            raise SpecError(share_mode_error(self.share, "--share"))
        if self.spec.gpus_per_worker != 1:
            raise SpecError(
                f"--share with {self.spec.gpus_per_worker} GPU(s) per worker: a shared GPU holds one worker of each "
                "job (Slurm gives a job's shards on a node from one GPU); give --gpus-per-worker 1 or leave out --share"
            )

    def components(self) -> list[SubmitOptions]:
        """The job's one component: the minimum workers, with the agent in its batch step (module docstring)."""
        spec = self.spec
        begin = (f"--begin=now+{self.begin_delay_s}",) if self.begin_delay_s else ()
        gpus: tuple[str, ...] = (f"--gpus-per-task={spec.gpus_per_worker}",) if spec.gpus_per_worker else ()
        if self.share is not None:  # one GPU per node as shards: Slurm gives a job's shards on a node from one GPU
            gpus = (f"--gres=shard:{HOST_SHARDS}", "--ntasks-per-node=1")
        # The user's own options first, ours after them: sbatch takes the last of a repeated option.
        extra = tuple(word for word in self.extra if not word.startswith("--gpus-per-task"))
        job = SubmitOptions(
            name=self.name,
            comment=elastic_comment(spec.min_workers, spec.max_workers, self.comment),
            partition=self.share_partition if self.share is not None else self.partition,
            ntasks=spec.min_workers,
            cpus_per_task=spec.cpus_per_worker,
            time_min=self.time_min,
            mem_mb=spec.mem_per_worker_mb * spec.min_workers or None,
            output=self.output,
            error=self.error,
            extra=(*extra, *self.lifecycle, *begin, *gpus),
        )
        return [job]

    def job_env(self) -> JobEnv:
        """The job's settings as ``amoeba-run`` reads them from its environment."""
        return JobEnv.for_spec(
            self.spec,
            elastic_partition=self.elastic_partition,
            daemon_endpoint=self.daemon_endpoint or None,
            share=self.share,
            share_partition=self.share_partition if self.share is not None else None,
        )

    def environment(self) -> dict[str, str]:
        """What ``amoeba-run`` reads in the job (sbatch exports the submitter's environment)."""
        return self.job_env().to_environ()

    def check_capacity(self, slurm: SlurmClient) -> None:
        """Refuse a job whose minimum can never run in its partition (before anything is submitted).

        Raises:
            SpecError: the partition does not exist, or all its nodes together hold fewer GPUs or CPUs than the
                minimum workers (plus the agent) need.
        """
        partition = self.share_partition if self.share is not None else self.partition
        partition = partition or slurm.default_partition()  # a job that names none goes to the default one
        nodes = slurm.nodes(partition=partition) if partition else slurm.nodes()
        if not nodes:
            raise SpecError(f"partition {partition!r} has no nodes (or does not exist); `sinfo` lists them")
        spec = self.spec
        gpus = sum(n.gpus_total for n in nodes)
        need_gpus = spec.min_workers * spec.gpus_per_worker
        if need_gpus > gpus:
            raise SpecError(
                f"--elastic {spec.min_workers}:{spec.max_workers} with {spec.gpus_per_worker} GPU(s) per worker needs "
                f"{need_gpus} GPUs at least, but partition {partition or '(default)'} has {gpus} in all; "
                f"lower MIN to {gpus // max(1, spec.gpus_per_worker)} or fewer"
            )
        cpus = sum(n.cpus for n in nodes)
        need_cpus = spec.min_workers * spec.cpus_per_worker + 1
        if need_cpus > cpus:
            raise SpecError(
                f"--elastic {spec.min_workers}:{spec.max_workers} needs {need_cpus} CPUs at least (workers and the "
                f"agent), but partition {partition or '(default)'} has {cpus} in all"
            )
