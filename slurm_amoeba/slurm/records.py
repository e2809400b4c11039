"""Typed records of what Slurm reports: jobs (squeue), nodes (sinfo, scontrol), accounting (sacct).

Built by :mod:`slurm_amoeba.slurm.parsers` from the commands' JSON; read by the layers above (the agent, the
daemon's observer) so that none of them touches Slurm's raw output.
"""

from __future__ import annotations

import dataclasses
import enum

from slurm_amoeba.slurm.reasons import is_held


class JobState(str, enum.Enum):
    """A Slurm job's base state (``job_state`` in ``squeue --json``).

    Transitions: PENDING -> RUNNING -> COMPLETING -> one of the final states; a running job may also be
    SUSPENDED, PREEMPTED or REQUEUED. States Slurm adds later read as UNKNOWN rather than failing.
    """

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"
    RESIZING = "RESIZING"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def parse(cls, text: str) -> JobState:
        """Read a state name; ``"CANCELLED by 0"`` style suffixes and unknown names are tolerated."""
        head = text.strip().split(" ", 1)[0].upper() if text.strip() else ""
        try:
            return cls(head)
        except ValueError:
            return cls.UNKNOWN

    def is_active(self) -> bool:
        """Whether the job still holds or waits for resources."""
        return self in _ACTIVE_STATES  # a constant: each member named in here would cost an enum lookup per call

    def is_final(self) -> bool:
        """Whether the job has ended and will not run again."""
        return not self.is_active() and self is not JobState.UNKNOWN


#: The states of :meth:`JobState.is_active` (the daemon asks it of every job each round).
_ACTIVE_STATES = (
    JobState.PENDING,
    JobState.RUNNING,
    JobState.SUSPENDED,
    JobState.COMPLETING,
    JobState.REQUEUED,
    JobState.RESIZING,
)


@dataclasses.dataclass(frozen=True)
class JobRecord:
    """One job (or one heterogeneous component) as squeue reports it.

    Attributes:
        job_id: Slurm's job id of this record (a heterogeneous component has its own id).
        name: the job name (``-J``).
        comment: the job comment (``--comment``).
        state: the base state.
        state_reason: why it is in that state (e.g. ``Resources``, ``JobHeldUser``).
        user: the owner's user name.
        uid: the owner's uid.
        partition: the partition it runs or waits in.
        nodes: the nodes it holds (empty while pending).
        batch_host: the node running the batch script (empty while pending).
        gpus_per_node: GPUs requested per node (from ``tres_per_node``).
        gpu_indices: GPU indices held on each node, in the order of ``nodes`` (empty lists while pending).
        cpus: CPUs requested or held.
        node_count: nodes requested or held.
        het_job_id: the heterogeneous job's leader id, or 0 for an ordinary job.
        het_job_offset: the component's index within its heterogeneous job.
        submit_time: submission time (Unix seconds).
        start_time: start time (Unix seconds; 0 or a forecast while pending).
        priority: the scheduling priority.
        account: the account it is charged to (``-A``).
        qos: its quality of service (``--qos``).
        reservation: the reservation it runs in (``--reservation``), or empty.
        features: the node features it requires (``--constraint``), as Slurm spells them, or empty.
        admin_comment: the job's ``AdminComment`` (set by operators only; amoebad marks the jobs it holds there).
        time_limit_s: its time limit in seconds; None when unlimited (or not given).
        gpus_requested: the GPUs it asked for (``gres/gpu`` of its requested TRES), pending or not.
        tasks: the tasks it asked for at submission (``--ntasks``); 0 where the record does not say.
        gpus_per_task: GPUs per task it asked for (``--gpus-per-task``, Slurm's ``tres_per_task``); 0 when not asked
            per task.
    """

    job_id: int
    name: str
    comment: str
    state: JobState
    state_reason: str
    user: str
    uid: int
    partition: str
    nodes: tuple[str, ...]
    batch_host: str
    gpus_per_node: int
    gpu_indices: tuple[tuple[int, ...], ...]
    cpus: int
    node_count: int
    het_job_id: int
    het_job_offset: int
    submit_time: int
    start_time: int
    priority: int
    account: str = ""
    qos: str = ""
    reservation: str = ""
    features: str = ""
    admin_comment: str = ""
    time_limit_s: int | None = None
    gpus_requested: int = 0
    tasks: int = 0
    gpus_per_task: int = 0

    @property
    def is_het_component(self) -> bool:
        """Whether this record is one component of a heterogeneous job."""
        return self.het_job_id != 0

    @property
    def gpus_held(self) -> int:
        """GPUs the job holds now, over all its nodes."""
        return sum(len(ix) for ix in self.gpu_indices)

    @property
    def is_held(self) -> bool:
        """Whether the job is held (its pending reason says so)."""
        return is_held(self.state_reason)

    @property
    def was_preempted(self) -> bool:
        """Whether Slurm took the job's resources for other work (its state or its state reason says preemption).

        With ``PreemptMode=CANCEL`` the state alone does not tell: the reason does.
        """
        return self.state is JobState.PREEMPTED or "preempt" in self.state_reason.lower()


@dataclasses.dataclass(frozen=True)
class NodeRecord:
    """One node as sinfo reports it.

    Attributes:
        name: the node name (``NodeName``).
        address: its address (``NodeAddr``); the root namespace of the test cluster cannot resolve names.
        hostname: its host name.
        state: base state, lower case (``idle``, ``mixed``, ``allocated``, ``down``, ...).
        state_flags: extra flags (``DRAIN``, ``NOT_RESPONDING``, ...).
        partitions: partitions the node belongs to.
        cpus: CPUs configured.
        alloc_cpus: CPUs allocated now.
        gpus_total: GPUs configured.
        gpus_used: GPUs allocated now.
    """

    name: str
    address: str
    hostname: str
    state: str
    state_flags: tuple[str, ...]
    partitions: tuple[str, ...]
    cpus: int
    alloc_cpus: int
    gpus_total: int
    gpus_used: int

    @property
    def gpus_free(self) -> int:
        """GPUs a new job could get on this node now (0 on a node that cannot run jobs)."""
        return self.gpus_total - self.gpus_used if self.is_usable else 0

    @property
    def is_usable(self) -> bool:
        """Whether the node can start new work (not down, drained, or failing)."""
        bad_states = {"down", "drained", "draining", "fail", "failing", "future", "unknown", "error"}
        bad_flags = {
            "DRAIN",
            "DRAINED",
            "DRAINING",
            "NOT_RESPONDING",
            "FAIL",
            "MAINTENANCE",
            "REBOOT_REQUESTED",
        }
        return self.state not in bad_states and not bad_flags.intersection(self.state_flags)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One running step of a job (``squeue --steps``).

    Attributes:
        job_id: the job the step belongs to.
        step: the step id: a number as text (``"0"``), or ``"batch"``/``"extern"``.
        name: the step's name (``srun -J``).
        nodes: the nodes it runs on.
    """

    job_id: int
    step: str
    name: str
    nodes: tuple[str, ...]

    @property
    def number(self) -> int | None:
        """The step's number, or None for the batch and extern steps."""
        return int(self.step) if self.step.isascii() and self.step.isdigit() else None


@dataclasses.dataclass(frozen=True)
class AccountingRecord:
    """One job as Slurm's accounting reports it (``sacct --json``; steps are not read).

    Attributes:
        job_id: Slurm's job id of this record.
        array_job_id: the array's job id, or 0 for a job outside an array.
        array_task_id: the array task's index, or None.
        het_job_id: the heterogeneous job's leader id, or 0.
        het_job_offset: the component's index within its heterogeneous job, or None.
        name: the job name.
        user: the owner's user name.
        account: the account it was charged to.
        partition: the partition it ran or waited in.
        nodes: the nodes it held, as Slurm writes a node list (``n[1-2]``), or ``None assigned``/empty.
        state: its state.
        submit_time: submission time (Unix seconds).
        start_time: start time (Unix seconds), 0 when it never started.
        end_time: end time (Unix seconds), 0 while it has not ended.
        time_limit_s: its time limit in seconds; None when unlimited (or the partition's).
        gpus_allocated: GPUs it held (``gres/gpu`` of its allocated TRES).
        gpus_requested: GPUs it asked for (``gres/gpu`` of its requested TRES).
    """

    job_id: int
    array_job_id: int
    array_task_id: int | None
    het_job_id: int
    het_job_offset: int | None
    name: str
    user: str
    account: str
    partition: str
    nodes: str
    state: JobState
    submit_time: int
    start_time: int
    end_time: int
    time_limit_s: int | None
    gpus_allocated: int
    gpus_requested: int

    @property
    def display_id(self) -> str:
        """The id as ``sacct`` prints it: ``12_3`` for an array task, ``20+1`` for a heterogeneous component."""
        if self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        if self.het_job_offset is not None and self.het_job_id:
            return f"{self.het_job_id}+{self.het_job_offset}"
        return str(self.job_id)
