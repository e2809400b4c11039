"""The parameters of :class:`~slurm_amoeba.launcher.executor.ElasticExecutor`, and submitit's spellings of them.

A submitit user writes ``update_parameters(timeout_min=60, slurm_partition="gpu", mem_gb=32, slurm_account="lab",
slurm_setup=["module load cuda"])``; this module translates those spellings into :class:`ElasticParameters` (an
elastic job's own names: workers, not nodes or tasks), checks every value before anything is submitted, and refuses
what has no meaning for an elastic job with the reason and what to write instead. An unknown key is refused with
:func:`~slurm_amoeba.core.errors.unknown_key_message` (every valid key with its default). Pure: no Slurm, no I/O.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from slurm_amoeba.core.errors import SpecError, unknown_key_message
from slurm_amoeba.core.jobenv import DEFAULT_CPUS_PER_WORKER, DEFAULT_ELASTIC_PARTITION, DEFAULT_GPUS_PER_WORKER
from slurm_amoeba.core.sharing import DEFAULT_SHARE_PARTITION, SHARE_MODES, share_mode_error
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.launcher.submission import signal_lead_s
from slurm_amoeba.slurm.options import parse_time_minutes


@dataclasses.dataclass(frozen=True)
class ElasticParameters:
    """The parameters :meth:`ElasticExecutor.update_parameters` accepts, with their defaults.

    Attributes:
        min_workers: the fewest workers (the job's first allocation holds exactly these).
        max_workers: the most workers the job grows to.
        gpus_per_worker: GPUs of each worker (one task); 0: CPU only.
        cpus_per_worker: CPUs of each worker.
        mem_per_worker: memory of each worker: MiB as a number, or a Slurm size such as ``"32G"``; 0: Slurm's default.
        partition: partition of the job itself (the agent and the minimum workers); None: the default one.
        elastic_partition: partition of the satellites that grow the job.
        time: time limit in minutes (submitit's ``timeout_min``; ``update_parameters`` also reads a Slurm time such as
            ``"1:00:00"``); None: the partition's.
        job_name: the job's name.
        account: ``--account`` of the job; its satellites are charged to it too.
        qos: ``--qos`` of the job (and its satellites).
        constraint: ``--constraint`` (node features) of the workers (and the satellites).
        reservation: ``--reservation`` of the job (and its satellites).
        exclude: ``--exclude`` nodes for the job's own workers.
        setup: shell lines the batch script runs before the job's agent starts (``module load ...``); what they
            export reaches every worker, also in satellites (sbatch and srun export the environment).
        additional_parameters: further sbatch options of the job, as submitit writes them
            (``{"mail_type": "END"}`` becomes ``--mail-type=END``; ``True`` gives a bare flag).
        daemon_endpoint: the amoebad the agent registers with (None: none).
        python: the interpreter of the agent and of the workers.
        signal_delay_s: how long before the time limit Slurm warns the job's agent, which then has the workers write
            a final checkpoint and requeues the job (submitit's ``slurm_signal_delay_s``); None: 120 s, less for a
            time limit under 8 minutes (:func:`~slurm_amoeba.launcher.submission.signal_lead_s`).
        share: the job opts in to GPU sharing (docs/admin.md, "Sharing GPUs"): ``"guaranteed"`` (its GPUs may host
            another opted-in job's worker, which yields to it) or ``"opportunistic"`` (its extra workers may also
            run beside another job's); ``True`` means ``"guaranteed"``; None: its GPUs are its own. Its minimum
            workers then run in ``share_partition``, one worker with one GPU per node.
        share_partition: the partition of the sharing nodes.
    """

    min_workers: int = 1
    max_workers: int = 1
    gpus_per_worker: int = DEFAULT_GPUS_PER_WORKER
    cpus_per_worker: int = DEFAULT_CPUS_PER_WORKER
    mem_per_worker: int | str = 0
    partition: str | None = None
    elastic_partition: str = DEFAULT_ELASTIC_PARTITION
    time: int | None = None
    job_name: str = "amoeba"
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    reservation: str | None = None
    exclude: str | None = None
    setup: tuple[str, ...] = ()
    additional_parameters: tuple[tuple[str, str | bool], ...] = ()
    daemon_endpoint: str | None = None
    python: str = sys.executable
    signal_delay_s: int | None = None
    share: str | None = None
    share_partition: str = DEFAULT_SHARE_PARTITION

    def spec(self) -> ElasticSpec:
        """The worker range and per-worker resources.

        Raises:
            SpecError: the range or a resource is invalid.
        """
        return ElasticSpec(
            min_workers=self.min_workers,
            max_workers=self.max_workers,
            gpus_per_worker=self.gpus_per_worker,
            cpus_per_worker=self.cpus_per_worker,
            mem_per_worker_mb=parse_memory_mb(self.mem_per_worker),
        )

    def job_terms(self) -> tuple[str, ...]:
        """``--account``/``--qos``/``--reservation`` as sbatch arguments (every component gets them)."""
        pairs = (("account", self.account), ("qos", self.qos), ("reservation", self.reservation))
        return tuple(f"--{key}={value}" for key, value in pairs if value is not None)

    def worker_terms(self) -> tuple[str, ...]:
        """``--constraint``/``--exclude`` as sbatch arguments (the workers' component; the agent runs anywhere)."""
        pairs = (("constraint", self.constraint), ("exclude", self.exclude))
        return tuple(f"--{key}={value}" for key, value in pairs if value is not None)

    def additional_args(self) -> tuple[str, ...]:
        """The additional parameters as sbatch arguments (``True``: a bare flag)."""
        return tuple(f"--{key}" if value is True else f"--{key}={value}" for key, value in self.additional_parameters)


_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*$", re.IGNORECASE)
_UNIT_MB = {"K": 1 / 1024, "M": 1.0, "": 1.0, "G": 1024.0, "T": 1024.0 * 1024.0}


def parse_memory_mb(value: int | str) -> int:
    """Memory as Slurm writes it (``32G``, ``512M``, ``32000``: MiB without a unit) in whole MiB, rounded up.

    Raises:
        SpecError: not a size.
    """
    if isinstance(value, bool):
        raise SpecError(f"mem_per_worker={value!r} is not a size; write MiB as a number or e.g. '32G'")
    if isinstance(value, int):
        if value < 0:
            raise SpecError(f"mem_per_worker={value} is invalid: it must be 0 or more")
        return value
    match = _MEMORY.match(str(value))
    if match is None:
        raise SpecError(f"mem_per_worker={value!r} is not a size; write MiB as a number or e.g. '32G', '512M'")
    megabytes = float(match.group(1)) * _UNIT_MB[match.group(2).upper()]
    return int(-(-megabytes // 1))


def _gigabytes(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise SpecError(f"mem_gb={value!r} is invalid: give a number of GiB, e.g. mem_gb=32")
    return int(-(-(value * 1024) // 1))


#: submitit's spellings -> (our parameter, conversion). Per node in submitit is per worker here: a worker is one task.
SUBMITIT_SPELLINGS: dict[str, tuple[str, Callable[[Any], Any] | None]] = {
    "timeout_min": ("time", None),
    "slurm_time": ("time", None),
    "name": ("job_name", None),
    "slurm_job_name": ("job_name", None),
    "slurm_partition": ("partition", None),
    "slurm_account": ("account", None),
    "slurm_qos": ("qos", None),
    "slurm_constraint": ("constraint", None),
    "slurm_exclude": ("exclude", None),
    "slurm_setup": ("setup", None),
    "slurm_additional_parameters": ("additional_parameters", None),
    "mem": ("mem_per_worker", None),
    "slurm_mem": ("mem_per_worker", None),
    "mem_gb": ("mem_per_worker", _gigabytes),
    "cpus_per_task": ("cpus_per_worker", None),
    "slurm_cpus_per_task": ("cpus_per_worker", None),
    "gpus_per_task": ("gpus_per_worker", None),
    "slurm_gpus_per_task": ("gpus_per_worker", None),
    "slurm_signal_delay_s": ("signal_delay_s", None),
}

_SIZED_IN_WORKERS = (
    "an elastic job is sized in workers (one task each): set min_workers/max_workers and gpus_per_worker, "
    "cpus_per_worker, mem_per_worker"
)
_AGENT_STARTS_WORKERS = "the job's agent starts the workers itself (one srun step per worker group) and handles signals"

#: submitit parameters that have no meaning for an elastic job -> why, and what to write instead.
REFUSED: dict[str, str] = {
    **dict.fromkeys(
        (
            "nodes",
            "slurm_nodes",
            "tasks_per_node",
            "slurm_ntasks_per_node",
            "gpus_per_node",
            "slurm_gpus_per_node",
            "slurm_num_gpus",
            "slurm_mem_per_gpu",
            "slurm_mem_per_cpu",
            "slurm_cpus_per_gpu",
        ),
        _SIZED_IN_WORKERS,
    ),
    **dict.fromkeys(("stderr_to_stdout", "slurm_srun_args", "slurm_use_srun"), _AGENT_STARTS_WORKERS),
    "slurm_comment": "the job's comment carries its elastic mark (amoeba-elastic=MIN:MAX), which amoebad reads "
    "while the job is pending; amoeba-sbatch --comment keeps a comment of yours after the mark",
    "slurm_array_parallelism": "map_array submits one elastic job per item, not a Slurm array",
}

#: sbatch options the executor writes itself -> the parameter that sets them.
_OWN_OPTIONS = {
    "job_name": "job_name",
    "j": "job_name",
    "partition": "partition",
    "p": "partition",
    "time": "time",
    "t": "time",
    "ntasks": "min_workers",
    "n": "min_workers",
    "nodes": "min_workers",
    "ntasks_per_node": "min_workers",
    "cpus_per_task": "cpus_per_worker",
    "gpus": "gpus_per_worker",
    "gpus_per_task": "gpus_per_worker",
    "gpus_per_node": "gpus_per_worker",
    "mem": "mem_per_worker",
    "output": "(the executor's job folder)",
    "error": "(the executor's job folder)",
    "comment": "(the job's elastic mark, amoeba-elastic=MIN:MAX)",
    "array": "(map_array)",
    "account": "account",
    "qos": "qos",
    "reservation": "reservation",
    "constraint": "constraint",
    "exclude": "exclude",
}
_OPTION_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
_ONE_LINE = re.compile(r"^[^\n\r\0]*$")


def _setup(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise SpecError(f"setup={value!r} is not a list of shell lines; write e.g. setup=['module load cuda']")
    for line in value:
        if not isinstance(line, str) or not _ONE_LINE.match(line):
            raise SpecError(f"setup line {line!r} is not one line of text; give each command as its own string")
    return tuple(value)


def _additional(value: Any) -> tuple[tuple[str, str | bool], ...]:
    if not isinstance(value, Mapping):
        raise SpecError(f"additional_parameters={value!r} is not a dict; write e.g. {{'mail_type': 'END'}}")
    options: list[tuple[str, str | bool]] = []
    for key, item in value.items():
        if not isinstance(key, str) or not _OPTION_NAME.match(key):
            raise SpecError(f"additional_parameters: {key!r} is not an sbatch option name such as 'mail_type'")
        own = _OWN_OPTIONS.get(key.replace("-", "_"))
        if own is not None:
            raise SpecError(
                f"additional_parameters: {key!r} is set by the executor; use the parameter {own} instead"
                if not own.startswith("(")
                else f"additional_parameters: {key!r} is set by the executor {own}"
            )
        if item is False or item is None:
            continue
        if item is not True and (not isinstance(item, str | int | float) or not _ONE_LINE.match(str(item))):
            raise SpecError(f"additional_parameters: {key}={item!r} is not a value sbatch takes on one line")
        options.append((key.replace("_", "-"), item if item is True else str(item)))
    return tuple(options)


def _share(value: Any) -> str | None:
    """A sharing mode as ``share=`` takes it: a mode, ``True`` (the first mode), ``False`` or None (no sharing)."""
    if value is True:
        return SHARE_MODES[0]
    if value is None or value is False:
        return None
    if value not in SHARE_MODES:
        raise SpecError(share_mode_error(value, "share"))
    return str(value)


def _optional_text(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or not _ONE_LINE.match(value):
        raise SpecError(f"{name}={value!r} is invalid: give a non-empty string on one line, or None")
    return value


def _time(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):  # Slurm's own formats, as sbatch reads them: "1:00:00", "2-00:00:00", "90"
        return parse_time_minutes(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(
            f"time={value!r} is invalid: give whole minutes (submitit's timeout_min), e.g. time=60, or a Slurm time "
            "such as '1:00:00'"
        )
    return value


def _translate(key: str, value: Any) -> tuple[str, Any]:
    """One given key and value -> (our parameter, value), or SpecError for a refused or unknown key."""
    if key in SUBMITIT_SPELLINGS:
        name, convert = SUBMITIT_SPELLINGS[key]
        return name, convert(value) if convert is not None else value
    if key in REFUSED:
        raise SpecError(f"ElasticExecutor: the parameter {key!r} is not supported: {REFUSED[key]}")
    if key in {f.name for f in dataclasses.fields(ElasticParameters)}:
        return key, value
    defaults = {f.name: f.default for f in dataclasses.fields(ElasticParameters)}
    message = unknown_key_message("ElasticExecutor.update_parameters", key, defaults)
    message += "; submitit's spellings are accepted too: " + ", ".join(SUBMITIT_SPELLINGS)
    if key.startswith("slurm_"):
        message += f"; for another sbatch option write additional_parameters={{{key.removeprefix('slurm_')!r}: ...}}"
    raise SpecError(message)


def updated(current: ElasticParameters, given: Mapping[str, Any]) -> ElasticParameters:
    """``current`` with ``given`` (our names or submitit's) applied, every value checked.

    Raises:
        SpecError: an unknown or unsupported key (with the reason and the valid keys), a bad value, the same
            parameter given twice under two spellings, or an invalid worker range.
    """
    changes: dict[str, Any] = {}
    for key, value in given.items():
        name, converted = _translate(key, value)
        if name in changes:
            raise SpecError(f"ElasticExecutor: {name} is given twice (as {key!r} and another spelling); give it once")
        changes[name] = converted
    if "setup" in changes:
        changes["setup"] = _setup(changes["setup"])
    if "additional_parameters" in changes:
        changes["additional_parameters"] = _additional(changes["additional_parameters"])
    if "time" in changes:
        changes["time"] = _time(changes["time"])
    if "share" in changes:
        changes["share"] = _share(changes["share"])
    if changes.get("signal_delay_s") is not None:
        signal_lead_s(None, changes["signal_delay_s"])  # refuses what Slurm would
    for name in ("partition", "account", "qos", "constraint", "reservation", "exclude", "daemon_endpoint"):
        if name in changes:
            changes[name] = _optional_text(name, changes[name])
    for name in ("job_name", "elastic_partition", "share_partition", "python"):
        if name in changes and _optional_text(name, changes[name]) is None:
            raise SpecError(f"{name}=None is invalid: give a non-empty string")
    for name in ("min_workers", "max_workers", "gpus_per_worker", "cpus_per_worker"):
        value = changes.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"{name}={value!r} is invalid: give a whole number")
    result = dataclasses.replace(current, **changes)
    result.spec()  # the range and resources, with the user's values in the message
    return result
