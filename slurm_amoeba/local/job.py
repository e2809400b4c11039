"""Local mode: one elastic job as N local processes plus an in-process coordinator.

:class:`LocalJob` is what the job's agent is on Slurm, without Slurm: it hosts the
:class:`~slurm_amoeba.runtime.coordinator.Coordinator`, starts each worker as a subprocess with the worker
environment contract (:mod:`slurm_amoeba.core.runtime_env`), watches the processes, and offers the three resize
commands: :meth:`LocalJob.add` (new workers warm up and join), :meth:`LocalJob.remove` (graceful leave at the next
step boundary; :meth:`LocalJob.terminate` does the same through SIGTERM, like Slurm preemption) and
:meth:`LocalJob.kill` (SIGKILL: the survivors roll back to the last commit); :meth:`LocalJob.pause` and
:meth:`LocalJob.resume` (SIGSTOP/SIGCONT) make a worker hang, as a frozen node does. Used by tests, the benchmark and
users without Slurm (``amoeba-local``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from slurm_amoeba.core.runtime_env import ENV_DEVICE, ENV_STORE_ADDR
from slurm_amoeba.runtime.coordinator import Coordinator, CoordinatorConfig
from slurm_amoeba.runtime.errors import RuntimeConfigError, RuntimeTimeout
from slurm_amoeba.runtime.membership import Phase, WorkerStatus
from slurm_amoeba.runtime.view import CoordinatorView

log = logging.getLogger(__name__)


@dataclasses.dataclass
class LocalWorker:
    """One worker process of a local job.

    Attributes:
        worker_id: its id.
        process: the subprocess.
        log_path: file with its stdout and stderr.
        started_at: ``time.monotonic()`` at launch.
        returncode: its exit status once it ended (negative: killed by that signal).
    """

    worker_id: str
    process: subprocess.Popen[bytes]
    log_path: Path
    started_at: float
    returncode: int | None = None


@dataclasses.dataclass(frozen=True)
class LocalJobResult:
    """How a local job ended.

    Attributes:
        phase: ``finished`` or ``lost``.
        returncodes: each worker's exit status.
        view: the coordinator's final snapshot (history, throughput).
    """

    phase: Phase
    returncodes: dict[str, int]
    view: CoordinatorView


class LocalJob:
    """An elastic job as local processes (see the module docstring).

    Args:
        command: the worker command, e.g. ``[sys.executable, "train.py", "--epochs", "3"]``.
        initial_workers: workers started at once; the first generation forms when all are ready.
        max_workers: most members at a time.
        job_id: the job's name.
        env: extra environment for every worker (on top of this process's environment).
        log_dir: where worker logs go (a new temporary directory by default).
        cwd: working directory of the workers.
        cuda_devices: GPU indices to hand out, one per worker (``AMOEBA_CUDA_DEVICE``), the lowest one no live worker
            holds; ``None`` leaves the choice to the workers (``LOCAL_RANK`` or 0).
        **coordinator_settings: further :class:`CoordinatorConfig` fields (timeouts, port, ...).

    Raises:
        RuntimeConfigError: the command is empty or a setting is invalid.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        initial_workers: int = 2,
        max_workers: int = 64,
        job_id: str = "local",
        env: Mapping[str, str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        cuda_devices: Sequence[int] | None = None,
        **coordinator_settings: float | int | str,
    ) -> None:
        if not command:
            raise RuntimeConfigError("the worker command is empty; give the program to run, e.g. python train.py")
        valid = {f.name for f in dataclasses.fields(CoordinatorConfig)} - {"job_id", "initial_workers", "max_workers"}
        unknown = sorted(set(coordinator_settings) - valid)
        if unknown:
            raise RuntimeConfigError(f"unknown coordinator settings {unknown}; valid ones are {sorted(valid)}")
        self.command = list(command)
        self.initial_workers = initial_workers
        self.coordinator = Coordinator(
            CoordinatorConfig(
                job_id=job_id,
                initial_workers=initial_workers,
                max_workers=max_workers,
                **coordinator_settings,  # type: ignore[arg-type]
            )
        )
        self.env = dict(env or {})
        self.log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix=f"amoeba-{job_id}-"))
        self.cwd = cwd
        self.cuda_devices = list(cuda_devices) if cuda_devices is not None else None
        self._device_of: dict[str, int] = {}
        self.workers: dict[str, LocalWorker] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._prefix = f"[{job_id}/local]"

    # ----------------------------------------------------------------------------------------------- lifecycle

    def start_coordinator(self) -> None:
        """Start only the coordinator and the process monitor (idempotent); :meth:`start` calls it."""
        if self._monitor is not None:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.coordinator.start()
        self._monitor = threading.Thread(target=self._watch, name="amoeba-local-monitor", daemon=True)
        self._monitor.start()

    def start(self) -> None:
        """Start the coordinator and the initial workers."""
        self.start_coordinator()
        self.add(self.initial_workers)

    def __enter__(self) -> LocalJob:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill any worker still running and stop the coordinator."""
        self._stop.set()
        with self._lock:
            workers = list(self.workers.values())
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.kill()
        for worker in workers:
            try:
                worker.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("%s worker %s (pid %s) did not exit", self._prefix, worker.worker_id, worker.process.pid)
        if self._monitor is not None:
            self._monitor.join(timeout=5)
        self.coordinator.close()

    def _watch(self) -> None:
        next_fence = 0.0
        while not self._stop.wait(0.02):
            with self._lock:
                workers = [w for w in self.workers.values() if w.returncode is None]
            if time.monotonic() >= next_fence:
                next_fence = time.monotonic() + 0.2
                self._fence(workers)
            for worker in workers:
                code = worker.process.poll()
                if code is None:
                    continue
                worker.returncode = code
                how = f"signal {-code}" if code < 0 else f"status {code}"
                log.info("%s worker %s exited with %s", self._prefix, worker.worker_id, how)
                self.coordinator.mark_dead(worker.worker_id, f"process exited with {how}")

    def _fence(self, running: list[LocalWorker]) -> None:
        """Kill processes the coordinator has given up on (hung, silent), so they cannot come back half-way."""
        try:
            statuses = {w: v.status for w, v in self.coordinator.view().workers.items()}
        except RuntimeConfigError:
            return
        for worker in running:
            if statuses.get(worker.worker_id) is WorkerStatus.DEAD and worker.process.poll() is None:
                log.warning("%s worker %s was declared dead but still runs: killing it", self._prefix, worker.worker_id)
                worker.process.kill()

    # ----------------------------------------------------------------------------------------------- commands

    def add(self, count: int = 1, *, command: Sequence[str] | None = None) -> list[str]:
        """Start ``count`` new workers; they warm up and join at a step boundary once ready.

        Args:
            count: how many.
            command: a different command for these workers (default: the job's).

        Returns:
            Their ids.

        Raises:
            RuntimeConfigError: ``count`` is below 1.
        """
        if count < 1:
            raise RuntimeConfigError(f"add({count}): the number of workers to add must be at least 1")
        ids = []
        for _ in range(count):
            worker_id = self.coordinator.new_worker_id()
            env = {**os.environ, "OMP_NUM_THREADS": "1", **self.env, **self.coordinator.worker_env(worker_id)}
            wanted = self.env.get(ENV_DEVICE) or os.environ.get(ENV_DEVICE)
            if wanted:  # the contract's default ("auto") must not override the device the user asked for
                env[ENV_DEVICE] = wanted
            if _is_loopback(env.get(ENV_STORE_ADDR, "")):
                # Every worker is on this host: gloo's connections go over loopback, not over whatever address the
                # host name resolves to (on some machines one that does not accept connections).
                env.setdefault("GLOO_SOCKET_IFNAME", "lo")
            if self.cuda_devices is not None:
                device = self._free_device()
                self._device_of[worker_id] = device
                env["AMOEBA_CUDA_DEVICE"] = str(device)
            log_path = self.log_dir / f"{worker_id}.log"
            with open(log_path, "wb") as out:
                process = subprocess.Popen(
                    list(command or self.command),
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=self.cwd,
                    start_new_session=True,
                )
            with self._lock:
                self.workers[worker_id] = LocalWorker(worker_id, process, log_path, time.monotonic())
            ids.append(worker_id)
            log.info("%s started worker %s (pid %s)", self._prefix, worker_id, process.pid)
        return ids

    def _free_device(self) -> int:
        assert self.cuda_devices is not None
        with self._lock:
            busy = {self._device_of.get(w) for w, worker in self.workers.items() if worker.process.poll() is None}
        free = [d for d in self.cuda_devices if d not in busy]
        if not free:
            raise RuntimeConfigError(
                f"every GPU in cuda_devices={self.cuda_devices} is held by a live worker; free one or list more"
            )
        return free[0]

    def _worker(self, worker_id: str) -> LocalWorker:
        with self._lock:
            worker = self.workers.get(worker_id)
        if worker is None:
            raise RuntimeConfigError(f"no worker {worker_id!r} in this job; workers: {sorted(self.workers)}")
        return worker

    def remove(self, worker_id: str) -> None:
        """Ask a worker to leave gracefully at the next step boundary (through the coordinator).

        Raises:
            RuntimeConfigError: no such live worker, or it is the last member.
        """
        self._worker(worker_id)
        self.coordinator.request_leave(worker_id)

    def terminate(self, worker_id: str) -> None:
        """Send SIGTERM to a worker's whole process group, as Slurm preemption does (data loader processes
        included): it leaves at the next step boundary.

        Raises:
            RuntimeConfigError: no such worker.
        """
        self._signal_group(worker_id, signal.SIGTERM)

    def kill(self, worker_id: str) -> None:
        """SIGKILL a worker: the survivors notice, roll back to the last commit and go on.

        Raises:
            RuntimeConfigError: no such worker.
        """
        self._worker(worker_id).process.kill()

    def pause(self, worker_id: str) -> None:
        """SIGSTOP a worker's process group: it hangs (no connection reset), as on a frozen node; the others drop
        it after the collective or heartbeat timeout.

        Raises:
            RuntimeConfigError: no such worker.
        """
        self._signal_group(worker_id, signal.SIGSTOP)

    def resume(self, worker_id: str) -> None:
        """SIGCONT a paused worker's process group (if it was declared dead meanwhile, it is fenced).

        Raises:
            RuntimeConfigError: no such worker.
        """
        self._signal_group(worker_id, signal.SIGCONT)

    def _signal_group(self, worker_id: str, signum: signal.Signals) -> None:
        process = self._worker(worker_id).process
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            log.info("%s worker %s is already gone", self._prefix, worker_id)

    def view(self) -> CoordinatorView:
        """The coordinator's snapshot."""
        return self.coordinator.view()

    def wait_for(self, predicate: Callable[[CoordinatorView], bool], timeout_s: float, what: str) -> CoordinatorView:
        """Block until ``predicate(view)`` holds (see :meth:`Coordinator.wait_until`).

        Raises:
            RuntimeTimeout: the deadline passed; the message names ``what``.
        """
        return self.coordinator.wait_until(predicate, timeout_s, what)

    def wait(self, timeout_s: float) -> LocalJobResult:
        """Wait for the job to finish (or be lost) and every worker to exit.

        Args:
            timeout_s: the deadline.

        Returns:
            The result.

        Raises:
            RuntimeTimeout: the job did not end in time (the message lists the worker logs).
        """
        deadline = time.monotonic() + timeout_s
        try:
            view = self.coordinator.wait_until(lambda v: v.phase.is_over(), timeout_s, "the job to end")
            for worker in list(self.workers.values()):
                left = max(0.1, deadline - time.monotonic())
                worker.process.wait(timeout=left)
        except (RuntimeTimeout, subprocess.TimeoutExpired) as exc:
            raise RuntimeTimeout(f"{exc}; worker logs are in {self.log_dir}") from None
        view = self.coordinator.view()
        codes = {w: int(worker.process.returncode or 0) for w, worker in self.workers.items()}
        return LocalJobResult(phase=view.phase, returncodes=codes, view=view)

    def log_tail(self, worker_id: str, lines: int = 30) -> str:
        """The last lines of a worker's log (for error messages)."""
        path = self._worker(worker_id).log_path
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _is_loopback(addr: str) -> bool:
    """Whether ``addr`` is a loopback address (``localhost`` counts)."""
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False
