"""Warm start: a satellite's workers forked from one process that has already imported torch and the user's module.

DESIGN.md, control flow (grow): a satellite's batch script (:mod:`slurm_amoeba.agent.entry`, ``satellite`` mode)
starts its group's workers. Started cold, each worker is a task of an ``srun`` step that starts Python, imports the
package and the user's module and torch, all of that once per worker and at the same time on the node's cores. Started
warm (this module, the default), the satellite's own process imports torch and the user's module **once** and forks
the workers from itself, on the satellite's one node, inside the satellite's own allocation (its batch step holds all
of the node's CPUs and GPUs of the job), as the job's user.

How, in order (:meth:`WarmWorkers.start`):

1. :func:`fork_plan` reads the worker command: ``PYTHON -m MODULE ARGS...`` or ``PYTHON SCRIPT ARGS...`` with the
   satellite's own interpreter can be run in a forked process; anything else (another interpreter, interpreter
   options, a program that is not Python) cannot.
2. :func:`split_devices` gives each worker its slice of the batch step's ``CUDA_VISIBLE_DEVICES``, ``GPUS`` each, in
   task order, as ``srun --gpus-per-task`` does; :func:`split_cpus` its slice of the CPUs the step may use.
3. :func:`warm_up` imports the modules of ``AMOEBA_WARM_PRELOAD`` (default: torch and the runtime's worker side,
   :data:`DEFAULT_PRELOAD`) and, for a ``-m`` module of
   this package, the module itself, calling its ``warm_up()`` when it has one (the executor's
   :mod:`~slurm_amoeba.launcher.fn_worker` loads the submitted function there, which imports the user's module).
   The warm process never initializes CUDA: :func:`fork_hazard` refuses to fork when CUDA was initialized or a
   Python thread runs besides the main one; each worker initializes CUDA itself, after the fork. The garbage
   collector is off while it imports (:func:`collector_paused`: torch and ``torch._dynamo`` make some 300,000
   objects, over which the collector would otherwise run again and again, about a quarter of the imports' CPU
   time), and what the imports made is frozen (``gc.freeze``) right before the fork: a worker's collections never
   walk those objects (the full collection at the end of its warm-up takes milliseconds instead of a few tenths of
   a second) nor write to their pages, which it thus shares with the warm process.
4. Every worker is forked **held**: it waits on a pipe for one JSON line (``{"run": true}``) before it runs anything
   of the user's. Only when every fork succeeded is each told to run; when one fails, the others read
   ``{"run": false}`` (or the pipe's end) and exit without having run a line of the user's code, and the satellite
   starts the whole group cold. So each worker id runs exactly once, warm or cold, never both.
5. A released worker takes its environment (``SLURM_PROCID``, ``SLURM_LOCALID``, the worker id
   ``<group>-<task>``, its devices), its CPUs, its log (``worker-<group>-<task>.log``, as srun's ``--output``) and
   the default signal handlers, and runs the command in-process with :mod:`runpy`, ``sys.argv`` as the command gave
   it; it exits with the command's status.

Whatever stops the warm start (:class:`WarmStartRefused`, with its reason) is logged by the satellite, which then
starts the workers cold with ``srun``; ``AMOEBA_WARM_START=0`` in the job's environment always starts them cold.
:class:`WarmWorkers` answers the calls the satellite makes on a running ``srun`` (``poll``, ``send_signal``,
``wait``, ``kill``), so that the satellite watches either the same way. Nothing crosses a socket: the pipe carries
one JSON line per worker.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import importlib
import json
import logging
import os
import runpy
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from slurm_amoeba.core.errors import AmoebaError
from slurm_amoeba.core.jobenv import ENV_PARENT_JOB
from slurm_amoeba.core.runtime_env import ENV_WORKER_ID

log = logging.getLogger(__name__)

ENV_WARM_START = "AMOEBA_WARM_START"
"""``0`` in the job's environment: satellites start their workers cold (``srun``), as a plain step."""
ENV_WARM_PRELOAD = "AMOEBA_WARM_PRELOAD"
"""Comma-separated modules the warm process imports before it forks (default: :data:`DEFAULT_PRELOAD`)."""
DEFAULT_PRELOAD = (
    "torch",
    "torch._dynamo",
    *(f"slurm_amoeba.runtime.{m}" for m in ("worker", "group", "transfer", "state", "sampler", "loader", "gradients")),
)
"""torch; what torch imports lazily at a process's first optimizer step (``torch.optim``'s steps import
``torch._dynamo``, and with it sympy: half to nearly as long as torch itself, in every training process); and the
runtime's worker side (``slurm_amoeba.runtime`` imports it at ``init()``: torch.distributed's ~700 modules)."""
OWN_PACKAGE = "slurm_amoeba."


class WarmStartRefused(AmoebaError):
    """The workers cannot be forked warm; the message says why (the satellite starts them cold)."""


@dataclasses.dataclass(frozen=True)
class ForkPlan:
    """What a forked worker runs in-process.

    Attributes:
        module: the module run as ``__main__`` (``python -m MODULE``), or None.
        script: the script run as ``__main__`` (``python SCRIPT``), or None.
        argv: the worker's ``sys.argv`` (``sys.argv[0]`` as Python would set it).
    """

    module: str | None
    script: str | None
    argv: tuple[str, ...]

    def run(self) -> None:
        """Run the command as Python would (in the calling process, with ``sys.argv`` set)."""
        sys.argv = list(self.argv)
        # The warm process imported the package's module to warm it up; running it again as __main__ is meant.
        warnings.filterwarnings("ignore", message=r".*found in sys\.modules after import of package", module="runpy")
        if self.module is not None:
            runpy.run_module(self.module, run_name="__main__", alter_sys=True)
        else:
            assert self.script is not None  # a plan holds one of the two (fork_plan)
            sys.path.insert(0, str(Path(self.script).resolve().parent))
            runpy.run_path(self.script, run_name="__main__")


def _same_interpreter(program: str, python: str) -> bool:
    found = shutil.which(program)
    if found is None:
        return False
    mine = Path(python).absolute()
    theirs = Path(found).absolute()
    # A venv's python is a link to the base interpreter: the same file from another folder is another environment.
    return theirs == mine or (theirs.parent == mine.parent and theirs.samefile(mine))


def fork_plan(command: Sequence[str], python: str = sys.executable) -> ForkPlan:
    """How a forked worker runs ``command`` in-process.

    Args:
        command: the worker command (``PYTHON -m MODULE ARGS...`` or ``PYTHON SCRIPT ARGS...``).
        python: the warm process's interpreter; the command must run this one.

    Raises:
        WarmStartRefused: the command cannot run in a process forked from this one (the reason says which part).
    """
    if len(command) < 2:
        raise WarmStartRefused(f"the worker command {list(command)!r} is not `python -m MODULE` or `python SCRIPT`")
    if not _same_interpreter(command[0], python):
        raise WarmStartRefused(f"the worker command runs {command[0]!r}, not this satellite's Python {python!r}")
    if command[1] == "-m":
        if len(command) < 3:
            raise WarmStartRefused(f"the worker command {list(command)!r} names no module after -m")
        # ``python -m MODULE`` sets sys.argv[0] to the module's file; runpy's alter_sys does the same.
        return ForkPlan(module=command[2], script=None, argv=(command[2], *command[3:]))
    if command[1].startswith("-"):
        raise WarmStartRefused(
            f"the worker command passes the interpreter option {command[1]!r}: a forked worker cannot apply it"
        )
    return ForkPlan(module=None, script=command[1], argv=tuple(command[1:]))


def split_devices(visible: str | None, tasks: int, per_task: int) -> list[str | None]:
    """Each task's ``CUDA_VISIBLE_DEVICES``: ``per_task`` of ``visible``'s devices in order, as srun hands them out.

    Args:
        visible: the batch step's ``CUDA_VISIBLE_DEVICES`` (None: unset).
        tasks: the workers.
        per_task: GPUs of each worker (0: none; each task keeps the variable as it is).

    Raises:
        WarmStartRefused: the step holds fewer devices than the workers need.
    """
    if per_task == 0:
        return [visible] * tasks
    devices = [d for d in (visible or "").split(",") if d]
    if len(devices) < tasks * per_task:
        raise WarmStartRefused(
            f"the satellite's batch step sees CUDA_VISIBLE_DEVICES={visible!r}, fewer than the {tasks} x {per_task} "
            "GPUs its workers take"
        )
    return [",".join(devices[i * per_task : (i + 1) * per_task]) for i in range(tasks)]


def split_cpus(allowed: Sequence[int], tasks: int, per_task: int) -> list[frozenset[int]] | None:
    """Each task's CPUs: ``per_task`` of ``allowed`` in order (``srun --exact``), None when there are too few."""
    cpus = sorted(allowed)
    if len(cpus) < tasks * per_task:
        return None
    return [frozenset(cpus[i * per_task : (i + 1) * per_task]) for i in range(tasks)]


def preload_modules(env: Mapping[str, str]) -> tuple[str, ...]:
    """The modules the warm process imports before it forks (``AMOEBA_WARM_PRELOAD``, else :data:`DEFAULT_PRELOAD`)."""
    value = env.get(ENV_WARM_PRELOAD)
    if value is None:
        return DEFAULT_PRELOAD
    return tuple(m.strip() for m in value.split(",") if m.strip())


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Keep the garbage collector off inside the block (as it was before, after it).

    Imports make objects that live as long as the process, hundreds of thousands for torch; a collector left on
    walks them again at each collection of the oldest generation while they are made. The warm process frees
    nothing worth collecting while it imports, and freezes what it made before it forks (:meth:`WarmWorkers.start`).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def warm_up(plan: ForkPlan, modules: Sequence[str], prefix: str) -> dict[str, float]:
    """Import ``modules`` and, for a module of this package that ``plan`` runs, the module and its ``warm_up()``.

    A module that cannot be imported is logged and left to the workers (each imports it, or fails, as cold).

    Returns:
        The seconds each part took, in order: each of ``modules`` (those already imported take ~0), then
        ``plan.module`` when it was warmed up (its import and its ``warm_up()``, which loads the user's module).
    """
    seconds: dict[str, float] = {}
    for name in modules:
        start = time.monotonic()
        try:
            importlib.import_module(name)
        except Exception as exc:  # any error of a module's import: the workers meet it themselves
            log.warning("%s warm start: cannot preload %s (%s); each worker imports it", prefix, name, exc)
        seconds[name] = time.monotonic() - start
    if plan.module is None or not plan.module.startswith(OWN_PACKAGE):
        return seconds  # a user's module may run its training at import: only the package's own are imported here
    start = time.monotonic()
    try:
        hook = getattr(importlib.import_module(plan.module), "warm_up", None)
        if callable(hook):
            hook()
    except Exception as exc:  # the worker's own run reports it
        log.warning("%s warm start: %s's warm-up failed (%s); each worker does it", prefix, plan.module, exc)
    seconds[plan.module] = time.monotonic() - start
    return seconds


def preload_parts(seconds: Mapping[str, float]) -> str:
    """``seconds`` (from :func:`warm_up`) as the satellite logs them: ``torch 1.21 s, torch._dynamo 0.80 s, ...``,
    the parts under 10 ms left out."""
    return ", ".join(f"{name} {s:.2f} s" for name, s in seconds.items() if s >= 0.01) or "nothing to import"


def fork_hazard() -> str:
    """Why forking this process now would be unsafe (empty when it is safe).

    A Python thread besides the main one, or CUDA initialized (a forked child cannot use it).
    """
    if threading.active_count() > 1:
        names = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        return f"the warm process runs threads {names}: a fork would copy their locks mid-use"
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return "the warm process initialized CUDA: a forked worker could not use it"
    return ""


def exit_status(status: int) -> int:
    """A waited-for worker's exit status as srun reports a task's: the code, or 128 + the signal that ended it."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


@dataclasses.dataclass(frozen=True)
class WorkerSlot:
    """One worker to fork: its task number and what it gets.

    Attributes:
        task: its task number (``SLURM_PROCID``), 0-based.
        worker_id: its worker id, ``<group>-<task>``.
        devices: its ``CUDA_VISIBLE_DEVICES`` (None: unset).
        cpus: its CPUs (None: the satellite's).
        log_path: its log (stdout and stderr).
    """

    task: int
    worker_id: str
    devices: str | None
    cpus: frozenset[int] | None
    log_path: Path

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The worker's environment: ``base`` with the variables a task of its step would have."""
        env = dict(base)
        env.update(SLURM_PROCID=str(self.task), SLURM_LOCALID=str(self.task), SLURM_NODEID="0")
        env[ENV_WORKER_ID] = self.worker_id
        env.setdefault("OMP_NUM_THREADS", "1")
        if self.devices is None:
            env.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            env["CUDA_VISIBLE_DEVICES"] = self.devices
        return env


class WarmWorkers:
    """A satellite's workers, forked from this process (see the module docstring); what a running srun answers.

    Args:
        group: the group's name (``g1``, ...).
        ntasks: its workers.
        cpus_per_task: CPUs of each.
        gpus_per_task: GPUs of each.
        log_dir: the job's state folder (the workers' logs).
        command: the worker command.
        env: the satellite's environment (each worker's starts from it).
    """

    def __init__(
        self,
        group: str,
        ntasks: int,
        cpus_per_task: int,
        gpus_per_task: int,
        log_dir: Path,
        command: Sequence[str],
        env: Mapping[str, str],
    ) -> None:
        self.prefix = f"[{env.get(ENV_PARENT_JOB, '?')}/satellite {group}]"
        self.plan = fork_plan(command)
        devices = split_devices(env.get("CUDA_VISIBLE_DEVICES"), ntasks, gpus_per_task)
        cpus = split_cpus(sorted(os.sched_getaffinity(0)), ntasks, cpus_per_task)
        self.slots = [
            WorkerSlot(i, f"{group}-{i}", devices[i], cpus[i] if cpus else None, log_dir / f"worker-{group}-{i}.log")
            for i in range(ntasks)
        ]
        self.env = dict(env)
        self._pids: dict[int, int] = {}  # pid -> task
        self._codes: dict[int, int] = {}  # task -> exit status

    def start(self, preload: Sequence[str]) -> None:
        """Warm up, fork every worker held, then let them all run (steps 3-5 of the module docstring).

        Raises:
            WarmStartRefused: forking is unsafe here, or a fork failed; no worker ran anything of the user's.
        """
        t0, cpu0 = time.monotonic(), time.process_time()
        with collector_paused():
            parts = warm_up(self.plan, preload, self.prefix)
        hazard = fork_hazard()
        if hazard:
            raise WarmStartRefused(hazard)
        warmed, cpu = time.monotonic(), time.process_time() - cpu0
        gc.freeze()  # what the imports made: no worker's collection walks it or writes to its pages (module doc)
        pipes: list[int] = []
        try:
            for slot in self.slots:
                sys.stdout.flush()
                sys.stderr.flush()
                read_end, write_end = os.pipe()
                try:
                    pid = os.fork()
                except OSError:
                    os.close(read_end)
                    os.close(write_end)
                    raise
                if pid == 0:
                    os.close(write_end)
                    for other in pipes:
                        os.close(other)
                    self._child(slot, read_end)  # never returns
                os.close(read_end)
                pipes.append(write_end)
                self._pids[pid] = slot.task
        except OSError as exc:
            forked = len(self._pids)
            self._release(pipes, run=False)
            self._reap_all()
            raise WarmStartRefused(f"fork failed after {forked} worker(s): {exc}") from None
        self._release(pipes, run=True)
        log.info(
            "%s warm start: %d worker(s) forked (preloading %.2f s, %.2f s of CPU, forking %.3f s; preloaded %s; "
            "%d objects frozen)",
            self.prefix,
            len(self.slots),
            warmed - t0,
            cpu,
            time.monotonic() - warmed,
            preload_parts(parts),
            gc.get_freeze_count(),
        )

    @staticmethod
    def _release(pipes: Sequence[int], *, run: bool) -> None:
        line = (json.dumps({"run": run}) + "\n").encode()
        for fd in pipes:
            try:
                os.write(fd, line)
            except OSError:
                pass  # the worker is gone already: its exit status says so
            finally:
                os.close(fd)

    def _reap_all(self) -> None:
        for pid in list(self._pids):
            os.waitpid(pid, 0)
        self._pids.clear()

    def _child(self, slot: WorkerSlot, release: int) -> None:
        """The forked worker: wait to be released, take the slot's place, run the command, exit with its status."""
        code = 1
        try:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            gc.enable()  # as a started Python has it; the warm process's objects stay frozen (module docstring)
            atexit._clear()  # the satellite's exit handlers are its own: the worker runs only those it registers
            with os.fdopen(release, "rb") as pipe:
                order = json.loads(pipe.readline() or b'{"run": false}')
            if not order.get("run"):
                os._exit(0)
            self._become(slot)
            code = self._run()
        except BaseException:  # the child must never return into the satellite's code
            traceback.print_exc()
        finally:
            _flush_streams()
            os._exit(code)

    def _become(self, slot: WorkerSlot) -> None:
        log_fd = os.open(slot.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.close(null)
        # New streams on the descriptors, as a started Python has (the satellite's may be anything, a test's capture).
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own stream, never closed)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        os.environ.clear()
        os.environ.update(slot.environment(self.env))
        if slot.cpus:
            os.sched_setaffinity(0, slot.cpus)
        root = logging.getLogger()
        for handler in list(root.handlers):  # the satellite's logging is not the user's
            root.removeHandler(handler)
        root.setLevel(logging.WARNING)

    def _run(self) -> int:
        """Run the plan as ``python`` would, with its exit status (threads joined and atexit handlers run first)."""
        try:
            self.plan.run()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except BaseException:  # what the command raises ends it with status 1, traceback in its log, as python does
            traceback.print_exc()
            code = 1
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
        return code

    # -------------------------------------------------------------------- what the satellite asks of a running step

    def poll(self) -> int | None:
        """None while a worker runs; else the highest exit status of them all (srun's rule)."""
        for pid in list(self._pids):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                self._codes[self._pids.pop(pid)] = exit_status(status)
        if self._pids:
            return None
        return max(self._codes.values(), default=0)

    def send_signal(self, sig: int, /) -> None:
        """Send ``sig`` to every running worker (srun forwards a signal to every task)."""
        for pid in self._pids:
            with contextlib.suppress(ProcessLookupError):  # it ended since the last poll
                os.kill(pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for every worker; their highest exit status.

        Raises:
            subprocess.TimeoutExpired: a worker still runs after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"{self.prefix} workers", timeout or 0.0)
            time.sleep(0.05)
        return code

    def kill(self) -> None:
        """Kill every running worker."""
        self.send_signal(signal.SIGKILL)


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing more to write
            stream.flush()
