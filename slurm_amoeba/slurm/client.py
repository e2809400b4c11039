"""The ``SlurmClient`` interface and its implementation over Slurm's command-line tools.

The layers above (the job agent, the daemon, the launcher) speak to Slurm only through a :class:`SlurmClient`,
which carries every call the project makes. :class:`CliSlurmClient` runs ``sbatch``/``scancel``/``scontrol``/
``squeue --json``/``sinfo --json``/``sacct``/``sacctmgr`` through :func:`~slurm_amoeba.slurm.runner.run_command`
(argv lists, timeouts, typed errors). pyslurm cannot be built against Slurm 22.05 (DESIGN.md), so this is the
implementation; the interface leaves room for another.

Each program builds its one client at its entry (``amoebad``, ``amoeba-sbatch``, the in-job ``amoeba-run``, a
satellite's entry, :class:`~slurm_amoeba.launcher.executor.ElasticExecutor`) with
:meth:`CliSlurmClient.from_environment` (one timeout policy: :data:`~slurm_amoeba.slurm.runner.DEFAULT_TIMEOUT_S`,
overridden by ``AMOEBA_SLURM_TIMEOUT_S`` or amoebad's ``slurm.timeout_s``) and hands it down.
"""

from __future__ import annotations

import abc
import dataclasses
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.slurm.parsers import (
    STEP_FORMAT,
    SlurmReportedError,
    SqueueReader,
    parse_default_partition,
    parse_past_service,
    parse_sbatch_reply,
    parse_show_config,
    parse_sinfo_json,
    parse_step_lines,
)
from slurm_amoeba.slurm.records import JobRecord, JobState, NodeRecord, StepRecord
from slurm_amoeba.slurm.release import SlurmRelease
from slurm_amoeba.slurm.runner import DEFAULT_TIMEOUT_S, CommandResult, SlurmCommandError, run_command, timeout_from
from slurm_amoeba.slurm.script import SubmitOptions, sbatch_argv

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class GpuCapacity:
    """GPUs of one node: how many exist and how many a new job could get now."""

    node: str
    total: int
    free: int


def independent_job_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment to submit a job of its own from inside another job.

    The enclosing job's ``SLURM_*`` variables (its heterogeneous components, its SPANK options) must not reach the
    new job, which inherits sbatch's environment: its ``srun`` would look for components it does not have.
    ``SLURM_CONF`` (which cluster to talk to) stays.
    """
    return {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def _existing(script: Path) -> Path:
    path = Path(script)
    if not path.is_file():
        raise SpecError(f"batch script {str(path)!r} does not exist or is not a file")
    return path


def _component_list(components: SubmitOptions | Sequence[SubmitOptions]) -> list[SubmitOptions]:
    return [components] if isinstance(components, SubmitOptions) else list(components)


class SlurmClient(abc.ABC):
    """What slurm_amoeba needs from Slurm. Every method may raise
    :class:`~slurm_amoeba.slurm.runner.SlurmCommandError` (the command failed or timed out) or
    :class:`~slurm_amoeba.core.errors.ParseError` (its output made no sense)."""

    @abc.abstractmethod
    def submit(
        self,
        script: Path,
        components: SubmitOptions | Sequence[SubmitOptions],
        script_args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
    ) -> int:
        """Submit a batch script; several components make a heterogeneous job. Returns the job id.

        ``env`` is the environment sbatch runs in, which the job inherits (sbatch exports it); None: the client's.
        """

    @abc.abstractmethod
    def cancel(self, job_id: int, *, step: int | None = None, signal: str | None = None, full: bool = False) -> None:
        """Cancel a job or one of its steps, or send it a signal (``signal="TERM"``).

        ``full`` also signals the batch script's shell (Slurm signals only the steps otherwise).
        """

    @abc.abstractmethod
    def requeue(self, job_id: int) -> None:
        """Requeue a batch job (``scontrol requeue``; a heterogeneous job by its leader, every component): Slurm ends
        its processes and runs it again under the same id, pending at least ``cred_expire`` (120 s) first."""

    @abc.abstractmethod
    def jobs(
        self,
        *,
        job_ids: Collection[int] | None = None,
        name: str | None = None,
        user: str | None = None,
        states: Collection[JobState] | None = None,
    ) -> list[JobRecord]:
        """Jobs Slurm still remembers, filtered on the client side (squeue's JSON ignores its own filters)."""

    @abc.abstractmethod
    def steps(self, job_id: int) -> list[StepRecord]:
        """The running steps of a job (the batch step included)."""

    @abc.abstractmethod
    def nodes(self, *, partition: str | None = None) -> list[NodeRecord]:
        """Nodes, optionally only those of one partition."""

    def default_partition(self) -> str | None:
        """The partition a job that names none goes to (``Default=YES``); None when the cluster has none or the
        client cannot tell."""
        return None

    @abc.abstractmethod
    def accounting_state(self, job_id: int) -> JobState:
        """The job's state from accounting (``sacct``); works after slurmctld has forgotten the job.

        UNKNOWN while accounting has no record of it (slurmdbd learns of jobs a moment after slurmctld).
        """

    @abc.abstractmethod
    def test_submit(
        self,
        script: Path,
        components: SubmitOptions | Sequence[SubmitOptions],
        script_args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Ask Slurm when and where the job :meth:`submit` would submit would start (``sbatch --test-only``),
        submitting nothing. Returns Slurm's answer as text."""

    @abc.abstractmethod
    def ping(self) -> bool:
        """Whether slurmctld answers; False instead of an error when it does not."""

    # ------------------------------------------------------------------ operator calls (the daemon's queue ordering
    # and admission; Slurm refuses them to a user without the AdminLevel each names)

    @abc.abstractmethod
    def set_priority(self, job_id: int, priority: int) -> None:
        """Give a pending job a fixed priority (operators and administrators only); 0 would hold it: refused.

        Raises:
            ValueError: ``priority`` is below 1.
        """

    @abc.abstractmethod
    def hold(self, job_id: int) -> None:
        """Hold a pending job (an operator's hold: its owner cannot release it)."""

    @abc.abstractmethod
    def release(self, job_id: int) -> None:
        """Release a held job; Slurm's priority plugin computes its priority again."""

    @abc.abstractmethod
    def set_admin_comment(self, job_id: int, text: str) -> None:
        """Set a job's ``AdminComment`` (administrators only; "" clears it).

        Raises:
            ValueError: ``text`` holds a newline or NUL.
        """

    @abc.abstractmethod
    def config_values(self) -> dict[str, str]:
        """slurmctld's running configuration as key -> value."""

    @abc.abstractmethod
    def admin_level(self, user: str) -> str:
        """The user's ``AdminLevel`` in Slurm's accounting (``None``, ``Operator``, ``Administrator``)."""

    @abc.abstractmethod
    def past_service(self, job_ids: Collection[int]) -> dict[int, float]:
        """GPU-seconds the jobs' earlier runs attained, from accounting; jobs without any: absent."""

    def job(self, job_id: int) -> JobRecord | None:
        """The job with this id, or None when Slurm no longer remembers it."""
        found = self.jobs(job_ids=[job_id])
        return found[0] if found else None

    def het_components(self, job_id: int) -> list[JobRecord]:
        """The components of heterogeneous job ``job_id`` (its leader's id), in offset order.

        Returns one record for an ordinary job, and ``[]`` for a job Slurm does not remember.
        """
        records = [j for j in self.jobs() if j.het_job_id == job_id or (j.job_id == job_id and not j.het_job_id)]
        return sorted(records, key=lambda j: j.het_job_offset)

    def gpus_per_node(self, *, partition: str | None = None) -> list[GpuCapacity]:
        """Total and free GPUs of each node (free is 0 on nodes that cannot take work)."""
        return [GpuCapacity(n.name, n.gpus_total, n.gpus_free) for n in self.nodes(partition=partition)]


class CliSlurmClient(SlurmClient):
    """:class:`SlurmClient` over Slurm's command-line tools.

    Args:
        env: the environment of every command (e.g. with ``SLURM_CONF``); None: this process's.
        timeout: seconds each command may run before it is killed and reported.
    """

    def __init__(self, env: Mapping[str, str] | None = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self._env = dict(env) if env is not None else dict(os.environ)
        self._timeout = timeout
        self._squeue = SqueueReader()  # a job whose squeue text did not change keeps its record

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None, *, timeout: float | None = None) -> CliSlurmClient:
        """The client a program builds once at its entry.

        Args:
            env: the environment of every command; None: this process's.
            timeout: seconds per command (a program's own setting, e.g. amoebad's ``slurm.timeout_s``); None:
                ``AMOEBA_SLURM_TIMEOUT_S`` from ``env``, else :data:`~slurm_amoeba.slurm.runner.DEFAULT_TIMEOUT_S`.

        Raises:
            SpecError: ``AMOEBA_SLURM_TIMEOUT_S`` is not a timeout.
        """
        environment = dict(env) if env is not None else dict(os.environ)
        return cls(environment, timeout=timeout_from(environment) if timeout is None else timeout)

    @property
    def timeout(self) -> float:
        """Seconds each command may run."""
        return self._timeout

    @property
    def env(self) -> dict[str, str]:
        """A copy of the environment commands run with."""
        return dict(self._env)

    def _run(self, argv: Sequence[str], timeout: float | None = None) -> str:
        return run_command(argv, timeout=timeout or self._timeout, env=self._env).stdout

    def _parse_json(self, argv: list[str], parse: Callable[[str], list[T]]) -> list[T]:
        """Run a ``--json`` command and parse it; Slurm's own errors in the JSON become a command error."""
        try:
            return parse(self._run(argv))
        except SlurmReportedError as exc:
            raise SlurmCommandError(
                argv, 0, str(exc), hint="slurmctld did not answer; is it up? `scontrol ping` tells"
            ) from None

    def submit(
        self,
        script: Path,
        components: SubmitOptions | Sequence[SubmitOptions],
        script_args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
    ) -> int:
        """See :meth:`SlurmClient.submit`.

        ``components`` empty: the script's own ``#SBATCH`` lines say everything.

        Raises:
            SpecError: the script does not exist, before anything is submitted.
            SlurmCommandError: sbatch refused the job (its message says why).
            ParseError: sbatch's reply holds no job id.
        """
        argv = sbatch_argv(_component_list(components), str(_existing(script)), script_args)
        return parse_sbatch_reply(self._submit_run(argv, env).stdout)

    def test_submit(
        self,
        script: Path,
        components: SubmitOptions | Sequence[SubmitOptions],
        script_args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """See :meth:`SlurmClient.test_submit`.

        Raises:
            SpecError: the script does not exist.
            SlurmCommandError: sbatch refused the job (its message says why).
        """
        argv = sbatch_argv(_component_list(components), str(_existing(script)), script_args, test_only=True)
        answer = self._submit_run(argv, env)
        return (answer.stderr or answer.stdout).strip()  # sbatch --test-only answers on standard error

    def _submit_run(self, argv: Sequence[str], env: Mapping[str, str] | None) -> CommandResult:
        return run_command(argv, timeout=self._timeout, env=self._env if env is None else dict(env))

    def cancel(self, job_id: int, *, step: int | None = None, signal: str | None = None, full: bool = False) -> None:
        """See :meth:`SlurmClient.cancel`."""
        target = f"{job_id}" if step is None else f"{job_id}.{step}"
        argv = ["scancel"]
        if signal is not None:
            argv += ["--signal", signal]
        if full:
            argv.append("--full")
        argv.append(target)
        self._run(argv)

    def requeue(self, job_id: int) -> None:
        """See :meth:`SlurmClient.requeue`."""
        self._run(["scontrol", "requeue", str(job_id)])

    def jobs(
        self,
        *,
        job_ids: Collection[int] | None = None,
        name: str | None = None,
        user: str | None = None,
        states: Collection[JobState] | None = None,
    ) -> list[JobRecord]:
        """See :meth:`SlurmClient.jobs`."""
        records = self._parse_json(["squeue", "--json"], self._squeue.parse)
        ids = set(job_ids) if job_ids is not None else None
        wanted_states = set(states) if states is not None else None
        return [
            j
            for j in records
            if (ids is None or j.job_id in ids)
            and (name is None or j.name == name)
            and (user is None or j.user == user)
            and (wanted_states is None or j.state in wanted_states)
        ]

    def steps(self, job_id: int) -> list[StepRecord]:
        """See :meth:`SlurmClient.steps`."""
        out = self._run(["squeue", "--steps", "--noheader", f"--jobs={job_id}", f"--format={STEP_FORMAT}"])
        return [s for s in parse_step_lines(out) if s.job_id == job_id]

    def nodes(self, *, partition: str | None = None) -> list[NodeRecord]:
        """See :meth:`SlurmClient.nodes`."""
        records = self._parse_json(["sinfo", "--json"], parse_sinfo_json)
        return [n for n in records if partition is None or partition in n.partitions]

    def default_partition(self) -> str | None:
        """See :meth:`SlurmClient.default_partition` (``scontrol show partition --oneliner``)."""
        return parse_default_partition(self._run(["scontrol", "show", "partition", "--oneliner"]))

    def accounting_state(self, job_id: int) -> JobState:
        """See :meth:`SlurmClient.accounting_state`; UNKNOWN while accounting has no record of the job yet."""
        out = self._run(
            [
                "sacct",
                "--noheader",
                "--parsable2",
                "--allocations",
                "--format=JobID,State",
                f"--jobs={job_id}",
            ]
        )
        for line in out.splitlines():
            job, _, state = line.partition("|")
            if job.split("+", 1)[0] == str(job_id):
                return JobState.parse(state)
        return JobState.UNKNOWN

    _slurm_release: SlurmRelease | None = None  # set by slurm_release(), the first time it is asked

    def slurm_release(self) -> SlurmRelease:
        """The cluster's Slurm release (``sinfo --version``), asked once per client and remembered (``release``
        is the release of a held job).

        Raises:
            SlurmCommandError: sinfo failed.
            ParseError: its reply names no release.
        """
        if self._slurm_release is None:
            self._slurm_release = SlurmRelease.parse(self._run(["sinfo", "--version"]))
        return self._slurm_release

    def ping(self) -> bool:
        """See :meth:`SlurmClient.ping` (``scontrol ping``)."""
        try:
            out = self._run(["scontrol", "ping"], timeout=min(self._timeout, 15.0))
        except SlurmCommandError:
            return False
        return "UP" in out

    # ------------------------------------------------------------------ operator actions (queue ordering)

    def set_priority(self, job_id: int, priority: int) -> None:
        """Give a pending job a fixed priority (``scontrol update JobId=N Priority=P``; operators and admins only).

        Slurm then stops computing the job's priority (``priority/multifactor``) until it is held and released.
        Priority 0 would hold the job: refused here.

        Raises:
            ValueError: ``priority`` is below 1.
            SlurmCommandError: Slurm refused (the job is gone, or the caller lacks the rights).
        """
        if priority < 1:
            raise ValueError(f"priority {priority} for job {job_id}: give 1 or more (0 holds the job)")
        self._run(["scontrol", "update", f"JobId={job_id}", f"Priority={priority}"])

    def hold(self, job_id: int) -> None:
        """Hold a pending job (``scontrol hold``; an operator's hold: its owner cannot release it)."""
        self._run(["scontrol", "hold", str(job_id)])

    def release(self, job_id: int) -> None:
        """Release a held job (``scontrol release``); Slurm's priority plugin computes its priority again."""
        self._run(["scontrol", "release", str(job_id)])

    def set_admin_comment(self, job_id: int, text: str) -> None:
        """Set a job's ``AdminComment`` (``scontrol update JobId=N AdminComment=...``; operators and admins only;
        "" clears it). A heterogeneous job's leader passes it to every component.

        Raises:
            ValueError: ``text`` holds a newline or NUL.
            SlurmCommandError: Slurm refused (the job is gone, or the caller lacks the rights).
        """
        if any(c in text for c in "\n\r\0"):
            raise ValueError(f"AdminComment {text!r} for job {job_id}: it may not hold a newline or NUL")
        self._run(["scontrol", "update", f"JobId={job_id}", f"AdminComment={text}"])

    def config_values(self) -> dict[str, str]:
        """slurmctld's running configuration (``scontrol show config``) as key -> value."""
        return parse_show_config(self._run(["scontrol", "show", "config"]))

    def admin_level(self, user: str) -> str:
        """The user's ``AdminLevel`` in Slurm's accounting (``None``, ``Operator``, ``Administrator``).

        Raises:
            SlurmCommandError: sacctmgr failed (no slurmdbd, or it did not answer).
        """
        out = self._run(["sacctmgr", "--noheader", "--parsable2", "show", "user", user, "format=User,AdminLevel"])
        for line in out.splitlines():
            name, _, level = line.partition("|")
            if name.strip() == user:
                return level.strip() or "None"
        return "None"

    def past_service(self, job_ids: Collection[int]) -> dict[int, float]:
        """GPU-seconds the jobs' runs so far attained, from accounting (``sacct --duplicates``): a requeued job's
        earlier runs (for a pending job, every run; its own pending record has none). Jobs without any: absent.

        Raises:
            SlurmCommandError: sacct failed (no slurmdbd, or it did not answer).
        """
        if not job_ids:
            return {}
        ids = ",".join(str(job) for job in sorted(job_ids))
        argv = ["sacct", "-X", "--duplicates", "--noheader", "--parsable2", "--format=JobID,ElapsedRaw,AllocTRES"]
        return parse_past_service(self._run([*argv, f"--jobs={ids}"]))
