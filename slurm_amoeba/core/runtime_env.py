"""The worker environment contract: the variables a launcher sets so a process can join an elastic job.

Whoever starts a training process for slurm_amoeba — local mode (``slurm_amoeba.local``) or the job's agent on
Slurm (DESIGN.md, flow 1) — sets these variables; the elastic runtime (``slurm_amoeba.runtime``) reads them with
:meth:`WorkerEnv.from_environ`. They live here, in the backend-free ``core`` layer, so that the launcher side can
build them without importing torch.

========================= ========== ================================================================================
variable                  required   meaning
========================= ========== ================================================================================
``AMOEBA_JOB_ID``         yes        the job's name, used in log prefixes and store keys
``AMOEBA_WORKER_ID``      yes        this worker's unique id within the job (letters, digits, ``-``, ``_``, ``.``)
``AMOEBA_STORE_ADDR``     yes        host name or address of the coordinator's TCPStore, reachable from the worker
``AMOEBA_STORE_PORT``     yes        its TCP port
``AMOEBA_COLLECTIVE_TIMEOUT_S`` no   deadline of one collective (all-reduce, broadcast, group formation); default 30
``AMOEBA_JOIN_TIMEOUT_S`` no         how long a warm joiner waits to be admitted before it gives up; default 3600
``AMOEBA_HEARTBEAT_S``    no         interval of the worker's heartbeat in the store; default 0.5
``AMOEBA_POLL_S``         no         how often a worker looks for pending membership changes in the store; default 0.05
``AMOEBA_MAX_LOCAL_BATCH`` no        memory cap: most samples one forward/backward pass may hold; 0 = no cap
``AMOEBA_DEVICE``         no         ``cpu``, ``cuda`` or ``auto`` (default: ``cuda`` when torch sees a GPU)
``AMOEBA_CUDA_DEVICE``    no         CUDA device index for this worker (default ``LOCAL_RANK`` or 0)
========================= ========== ================================================================================

While a worker is a member of a generation, the runtime also sets the torchrun contract in its own environment
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; the master is the
coordinator's store) so that libraries which read them see the current generation; the launcher does not set them.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping

from slurm_amoeba.core.errors import SpecError

ENV_JOB_ID = "AMOEBA_JOB_ID"
ENV_WORKER_ID = "AMOEBA_WORKER_ID"
ENV_STORE_ADDR = "AMOEBA_STORE_ADDR"
ENV_STORE_PORT = "AMOEBA_STORE_PORT"
ENV_COLLECTIVE_TIMEOUT_S = "AMOEBA_COLLECTIVE_TIMEOUT_S"
ENV_JOIN_TIMEOUT_S = "AMOEBA_JOIN_TIMEOUT_S"
ENV_HEARTBEAT_S = "AMOEBA_HEARTBEAT_S"
ENV_POLL_S = "AMOEBA_POLL_S"
ENV_MAX_LOCAL_BATCH = "AMOEBA_MAX_LOCAL_BATCH"
ENV_DEVICE = "AMOEBA_DEVICE"
ENV_CUDA_DEVICE = "AMOEBA_CUDA_DEVICE"

#: The torchrun variables the runtime exports for each generation it joins.
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_DEVICES = ("auto", "cpu", "cuda")


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "")
    if text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise SpecError(f"{name}={text!r} is not a number; set it to a positive number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise SpecError(f"{name}={text!r} is invalid; set it to a positive number of seconds")
    return value


@dataclasses.dataclass(frozen=True)
class WorkerEnv:
    """Everything a worker process needs to find its job's coordinator, as read from its environment.

    Attributes:
        job_id: the job's name.
        worker_id: this worker's id, unique within the job.
        store_addr: host of the coordinator's TCPStore.
        store_port: port of the coordinator's TCPStore.
        collective_timeout_s: deadline of one collective operation.
        join_timeout_s: how long a warm joiner waits to be admitted.
        heartbeat_s: heartbeat interval.
        poll_s: interval at which the worker looks for pending membership changes.
        max_local_batch: memory cap on samples per forward/backward pass (0 = none).
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        cuda_device: CUDA device index, or -1 to use ``LOCAL_RANK`` (or 0).
    """

    job_id: str
    worker_id: str
    store_addr: str
    store_port: int
    collective_timeout_s: float = 30.0
    join_timeout_s: float = 3600.0
    heartbeat_s: float = 0.5
    poll_s: float = 0.05
    max_local_batch: int = 0
    device: str = "auto"
    cuda_device: int = -1

    def __post_init__(self) -> None:
        for name in ("job_id", "worker_id"):
            value = getattr(self, name)
            if not _ID.match(value):
                raise SpecError(f"{name}={value!r} is invalid: use 1 to 128 letters, digits, '-', '_' or '.'")
        if not self.store_addr:
            raise SpecError("store_addr is empty: set AMOEBA_STORE_ADDR to the coordinator's host")
        if not 0 < self.store_port < 65536:
            raise SpecError(f"store_port={self.store_port} is not a TCP port (1..65535)")
        if self.device not in _DEVICES:
            raise SpecError(f"device={self.device!r} is invalid: use one of {', '.join(_DEVICES)}")
        if self.max_local_batch < 0:
            raise SpecError(f"max_local_batch={self.max_local_batch} is invalid: use 0 (no cap) or more")

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> WorkerEnv:
        """Read the contract from an environment mapping (usually ``os.environ``).

        Args:
            env: the environment.

        Returns:
            The worker's environment.

        Raises:
            SpecError: a required variable is missing or a value is malformed; the message names it.
        """
        missing = [n for n in (ENV_JOB_ID, ENV_WORKER_ID, ENV_STORE_ADDR, ENV_STORE_PORT) if not env.get(n)]
        if missing:
            raise SpecError(
                f"the elastic runtime needs {', '.join(missing)} in the environment; start the worker with "
                "amoeba-local (local mode) or through the job's agent, which set them"
            )
        port_text = env[ENV_STORE_PORT]
        if not port_text.isdigit():
            raise SpecError(f"{ENV_STORE_PORT}={port_text!r} is not a port number")
        batch_text = env.get(ENV_MAX_LOCAL_BATCH, "") or "0"
        if not batch_text.isdigit():
            raise SpecError(f"{ENV_MAX_LOCAL_BATCH}={batch_text!r} is not a whole number (0 = no cap)")
        cuda_text = env.get(ENV_CUDA_DEVICE, "") or "-1"
        try:
            cuda_device = int(cuda_text)
        except ValueError:
            raise SpecError(f"{ENV_CUDA_DEVICE}={cuda_text!r} is not a device index") from None
        return cls(
            job_id=env[ENV_JOB_ID],
            worker_id=env[ENV_WORKER_ID],
            store_addr=env[ENV_STORE_ADDR],
            store_port=int(port_text),
            collective_timeout_s=_positive_float(env, ENV_COLLECTIVE_TIMEOUT_S, 30.0),
            join_timeout_s=_positive_float(env, ENV_JOIN_TIMEOUT_S, 3600.0),
            heartbeat_s=_positive_float(env, ENV_HEARTBEAT_S, 0.5),
            poll_s=_positive_float(env, ENV_POLL_S, 0.05),
            max_local_batch=int(batch_text),
            device=env.get(ENV_DEVICE, "") or "auto",
            cuda_device=cuda_device,
        )

    def to_environ(self) -> dict[str, str]:
        """Render the contract as environment variables for a launcher.

        Returns:
            The variables to add to the worker's environment.
        """
        return {
            ENV_JOB_ID: self.job_id,
            ENV_WORKER_ID: self.worker_id,
            ENV_STORE_ADDR: self.store_addr,
            ENV_STORE_PORT: str(self.store_port),
            ENV_COLLECTIVE_TIMEOUT_S: repr(self.collective_timeout_s),
            ENV_JOIN_TIMEOUT_S: repr(self.join_timeout_s),
            ENV_HEARTBEAT_S: repr(self.heartbeat_s),
            ENV_POLL_S: repr(self.poll_s),
            ENV_MAX_LOCAL_BATCH: str(self.max_local_batch),
            ENV_DEVICE: self.device,
            ENV_CUDA_DEVICE: str(self.cuda_device),
        }
