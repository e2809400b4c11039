"""What a satellite is submitted as: its sbatch options, its batch script, and what it inherits from its parent.

A satellite (DESIGN.md, control flow: grow) is a job of its own in the elastic partition, submitted by the agent as
the job's owner. It runs :mod:`slurm_amoeba.agent.entry`'s ``satellite`` mode, which starts one worker step of the
group on one node. Besides its partition, name and comment, it carries its parent's **account, QOS, reservation and
node features** — read from the parent job's own record as squeue reports it (:meth:`ParentTerms.of`) — so that a
site that requires an account, or a job that must run on some kind of node, grows like it started — and excludes
(``--exclude``) the nodes where the job lost workers to an infrastructure failure (:mod:`slurm_amoeba.agent.plan`).
A satellite **beside another job** (GPU sharing, :mod:`slurm_amoeba.core.sharing`) is one worker in the sharing
partition on the host's node (``--nodelist``), holding the one shard of a GPU a host leaves (``--gres=shard:1``)
instead of GPUs; its worker learns its role and host from its environment.
:class:`SatelliteSlurm` is the agent's Slurm side for its satellites: it submits, polls and cancels them.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Collection, Mapping, Sequence

from slurm_amoeba.agent.config import AgentConfig
from slurm_amoeba.agent.plan import PlaceBeside
from slurm_amoeba.core.errors import AmoebaError
from slurm_amoeba.core.sharing import ENV_SHARE_HOST, ENV_SHARE_ROLE, SHARER_SHARDS
from slurm_amoeba.slurm.client import SlurmClient, independent_job_env
from slurm_amoeba.slurm.records import JobRecord
from slurm_amoeba.slurm.runner import SlurmCommandError
from slurm_amoeba.slurm.satellite import parent_comment, satellite_name
from slurm_amoeba.slurm.script import SubmitOptions, render_batch_script

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ParentTerms:
    """The parent job's terms that its satellites carry (empty: Slurm's default applies).

    Attributes:
        account: the account the work is charged to (``--account``).
        qos: the quality of service (``--qos``).
        reservation: the reservation it runs in (``--reservation``).
        constraint: the node features it requires (``--constraint``).
    """

    account: str = ""
    qos: str = ""
    reservation: str = ""
    constraint: str = ""

    @classmethod
    def of(cls, components: Sequence[JobRecord]) -> ParentTerms:
        """The terms of a job, from its squeue records (one per heterogeneous component, in offset order).

        The workers' component (offset 1 of the agent's heterogeneous job; the only one of a one-component job)
        decides: satellites hold more of the same workers. No records (Slurm forgot the job): no terms.
        """
        if not components:
            return cls()
        workers = components[1] if len(components) > 1 else components[0]
        return cls(workers.account, workers.qos, workers.reservation, workers.features)

    def sbatch_args(self) -> tuple[str, ...]:
        """The terms as sbatch arguments, those that are set."""
        pairs = (
            ("account", self.account),
            ("qos", self.qos),
            ("reservation", self.reservation),
            ("constraint", self.constraint),
        )
        return tuple(f"--{key}={value}" for key, value in pairs if value)


def satellite_entry(config: AgentConfig, group: str, workers: int, *, shards: bool = False) -> list[str]:
    """The satellite's batch command: :mod:`slurm_amoeba.agent.entry` in ``satellite`` mode, then the user's.
    ``shards``: the satellite holds shards, which its step inherits (it asks for no GPU of its own)."""
    spec = config.spec
    return [
        sys.executable,
        "-m",
        "slurm_amoeba.agent.entry",
        "satellite",
        "--parent",
        config.job_id,
        "--group",
        group,
        "--ntasks",
        str(workers),
        "--cpus-per-task",
        str(spec.cpus_per_worker),
        "--gpus-per-task",
        str(0 if shards else spec.gpus_per_worker),
        "--log-dir",
        str(config.state_dir),
        "--",
        *config.command,
    ]


def satellite_options(
    config: AgentConfig, group: str, workers: int, terms: ParentTerms, exclude: Sequence[str] = ()
) -> SubmitOptions:
    """sbatch options of group ``group``'s satellite of ``workers`` workers on one node, on none of ``exclude``.

    ``config.satellite_qos``, when set, replaces the parent's QOS.
    """
    spec = config.spec
    if config.satellite_qos is not None:
        terms = dataclasses.replace(terms, qos=config.satellite_qos)
    gpus = (f"--gpus-per-task={spec.gpus_per_worker}",) if spec.gpus_per_worker else ()
    return SubmitOptions(
        name=satellite_name(config.job_id, group),
        comment=parent_comment(config.job_id),
        partition=config.elastic_partition,
        nodes=1,
        ntasks=workers,
        cpus_per_task=spec.cpus_per_worker,
        time_min=config.satellite_time_min,
        mem_mb=spec.mem_per_worker_mb * workers or None,
        output=str(config.state_dir / f"satellite-{group}.log"),
        exclude=",".join(exclude) or None,
        # SubmitOptions has no fields for these terms: they pass through as sbatch arguments.
        extra=gpus + terms.sbatch_args(),
    )


def beside_options(config: AgentConfig, group: str, terms: ParentTerms, order: PlaceBeside, node: str) -> SubmitOptions:
    """sbatch options of group ``group``'s satellite of one worker beside job ``order.host`` on ``node``: the
    sharing partition, that node, one shard (the parent's account, QOS and reservation; no node features: the node
    is named)."""
    spec = config.spec
    terms = dataclasses.replace(terms, constraint="")
    return SubmitOptions(
        name=satellite_name(config.job_id, group),
        comment=parent_comment(config.job_id),
        partition=order.partition,
        nodes=1,
        ntasks=1,
        cpus_per_task=spec.cpus_per_worker,
        time_min=config.satellite_time_min,
        mem_mb=spec.mem_per_worker_mb or None,
        output=str(config.state_dir / f"satellite-{group}.log"),
        nodelist=node,
        extra=(f"--gres=shard:{SHARER_SHARDS}", *terms.sbatch_args()),
    )


def satellite_script(
    config: AgentConfig,
    group: str,
    workers: int,
    terms: ParentTerms,
    exclude: Sequence[str] = (),
    beside: tuple[PlaceBeside, str] | None = None,
) -> str:
    """The whole batch script of a satellite (``#SBATCH`` lines, then its entry); ``beside``: (the order, the node)
    of a satellite beside another job."""
    if beside is not None:
        options = beside_options(config, group, terms, *beside)
        return render_batch_script([options], [satellite_entry(config, group, 1, shards=True)])
    options = satellite_options(config, group, workers, terms, exclude)
    return render_batch_script([options], [satellite_entry(config, group, workers)])


class SatelliteSlurm:
    """The agent's Slurm side for its satellites: submits them as the job's owner, polls and cancels them.

    Args:
        config: the agent's settings.
        slurm: the Slurm client.
        prefix: the log prefix (``[job/agent]``).
    """

    def __init__(self, config: AgentConfig, slurm: SlurmClient, prefix: str) -> None:
        self.config = config
        self.slurm = slurm
        self._prefix = prefix
        self._node_gpus: int | None = None
        self._terms: ParentTerms | None = None

    def node_gpus(self) -> int | None:
        """GPUs of the elastic partition's largest node (asked once; None while Slurm cannot be asked)."""
        if self._node_gpus is None:
            try:
                nodes = self.slurm.nodes(partition=self.config.elastic_partition)
            except (SlurmCommandError, AmoebaError) as exc:
                log.warning("%s could not read the elastic partition's nodes: %s", self._prefix, exc)
                return None
            self._node_gpus = max((n.gpus_total for n in nodes), default=0)
        return self._node_gpus

    def poll(self, jobs: Collection[int]) -> dict[int, JobRecord] | None:
        """The satellites' squeue records by job id (those squeue forgot are missing); None if squeue failed."""
        try:
            return {j.job_id: j for j in self.slurm.jobs(job_ids=jobs)}
        except (SlurmCommandError, AmoebaError) as exc:
            log.warning("%s could not read satellites' states: %s", self._prefix, exc)
            return None

    def parent_terms(self) -> ParentTerms:
        """The parent job's terms, read once from its own squeue records.

        Raises:
            SlurmCommandError, ParseError: squeue failed.
        """
        if self._terms is None:
            components = self.slurm.het_components(int(self.config.job_id))
            if not components:
                log.warning(
                    "%s squeue does not show job %s: satellites carry no account or QOS",
                    self._prefix,
                    self.config.job_id,
                )
            self._terms = ParentTerms.of(components)
            log.info("%s satellites carry %s", self._prefix, self._terms)
        return self._terms

    def submit(
        self,
        group: str,
        workers: int,
        env: Mapping[str, str],
        exclude: Sequence[str] = (),
        beside: tuple[PlaceBeside, str] | None = None,
    ) -> int:
        """Write group ``group``'s satellite script to the state directory and submit it; returns its job id.

        Args:
            group: the group's name.
            workers: its workers.
            env: the workers' environment (the satellite inherits it, less the parent job's ``SLURM_*``).
            exclude: nodes it must not run on.
            beside: (the daemon's order, the node) for a satellite beside another job; its worker's environment
                also names its role and host.

        Raises:
            SlurmCommandError, AmoebaError: squeue or sbatch failed, or refused the job.
            OSError: the script could not be written.
        """
        script = self.config.state_dir / f"satellite-{group}.sh"
        script.write_text(satellite_script(self.config, group, workers, self.parent_terms(), exclude, beside))
        if beside is not None:
            env = {**env, ENV_SHARE_ROLE: beside[0].role, ENV_SHARE_HOST: beside[0].host}
        return self.slurm.submit(script, SubmitOptions(), env=independent_job_env(env))

    def cancel(self, job: int) -> None:
        """Cancel a satellite; a failure is logged (the satellite's own watch ends it once its parent is gone)."""
        try:
            self.slurm.cancel(job)
        except SlurmCommandError as exc:
            log.warning("%s could not cancel satellite %d: %s", self._prefix, job, exc)
