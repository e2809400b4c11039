"""Unmodified torchrun-style scripts, made elastic by restarting them at each resize (``amoeba-run --restart``).

``python -m slurm_amoeba.launcher.restart [--grace S] -- python train.py ...`` runs in every worker slot in place of
the script (``amoeba-run --restart`` and ``amoeba-local --restart`` put it there; DESIGN.md, layer ``launcher/``).
This **restart supervisor** joins the elastic runtime as a member, exactly as a worker of the stop-free path does
(same events, heartbeats and assignments: the coordinator, the agent, Slurm-level grow and shrink are unchanged),
and runs the user's script as its child with the torchrun contract of the current generation:

* ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the host's index among the
  members' hosts), ``GROUP_WORLD_SIZE``, ``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``ROLE_NAME``, ``MASTER_ADDR``,
  ``MASTER_PORT``, ``TORCHELASTIC_RESTART_COUNT`` (generations before this one), ``TORCHELASTIC_RUN_ID`` and
  ``TORCHELASTIC_USE_AGENT_STORE=True``: rank 0's supervisor hosts a fresh ``TCPStore`` for each generation at
  ``MASTER_ADDR:MASTER_PORT``, so ``init_process_group()`` with the default ``env://`` finds no stale keys of an
  earlier generation (torchrun's own shared store deadlocks on scale-out in torch 2.13: docs/TORCH-FACTS.md);
* ``AMOEBA_STOP_FILE``: a path that does not exist while the script may run on.

**The checkpoint hook.** When the generation ends (the coordinator asks for a resize, a member is leaving, died or
failed), every supervisor creates the stop file and sends SIGTERM to its script, waits up to the grace time
(``--grace``, ``AMOEBA_RESTART_GRACE_S``, default 30 s) for it to exit, then SIGKILLs it. The script saves its
checkpoint and exits; the members report once every member's script has stopped, and every supervisor of the next
generation starts the script again with the new ``RANK``/``WORLD_SIZE``/``MASTER_*``; it loads its checkpoint.

**Warm start.** When the command is this Python running a script (``python train.py ...``) or a module
(``python -m pkg.train ...``), the supervisor keeps the next generation's interpreter warm: started as soon as the
current script is, it imports torch while the script trains and waits; at the restart it is handed the contract and
runs the script as ``python`` would. Any other command (interpreter options, a shell script) starts cold.

**Exit codes.** A script that exits 0 on its own has finished (the supervisor exits 0 once the job ends). A script
that fails on its own (non-zero status, not after the hook) while its generation is not ending is a script error:
the supervisor publishes it, every other supervisor stops its script, and all exit with that status (the job's
status). A script that fails while the generation ends because a peer died (its collectives fail: the coordinator
aborts the generation within ``AMOEBA_RESTART_SETTLE_S``, default 5 s) is restarted with the others.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch._C._distributed_c10d import TCPStore

from slurm_amoeba.core.errors import AmoebaError, SpecError
from slurm_amoeba.core.runtime_env import ENV_STORE_ADDR, ENV_STORE_PORT, ENV_WORKER_ID, WorkerEnv
from slurm_amoeba.launcher.run import advertise_address
from slurm_amoeba.runtime.auth import (
    COORDINATOR,
    ENV_JOB_SECRET,
    ENV_JOB_SECRET_FILE,
    AuthError,
    JobAuth,
    JobKey,
    join_job,
)
from slurm_amoeba.runtime.group import FormationFailed, GroupSettings, aborted, wait_for_members
from slurm_amoeba.runtime.protocol import (
    EVENTS_KEY,
    AssignAction,
    Assignment,
    EventKind,
    GenerationPlan,
    WorkerEvent,
    assignment_key,
    heartbeat_key,
)

log = logging.getLogger(__name__)

ENV_STOP_FILE = "AMOEBA_STOP_FILE"
ENV_GRACE_S = "AMOEBA_RESTART_GRACE_S"
ENV_SETTLE_S = "AMOEBA_RESTART_SETTLE_S"
DEFAULT_GRACE_S = 30.0
DEFAULT_SETTLE_S = 5.0
#: The supervisors' own keys in the job's store (the runtime's live under ``amoeba/``).
PREFIX = "amoeba-restart/"
ERROR_KEY = PREFIX + "error"
#: What the supervisor runs in each worker slot before the user's command.
MODULE = "slurm_amoeba.launcher.restart"
# Runs between fork and the script: the kernel SIGKILLs the script when its supervisor dies (prctl
# PR_SET_PDEATHSIG), so that a killed supervisor leaves no script training on its own.
_ORPHAN_GUARD = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(70)\n"
    "try:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as exc:\n"
    "    print(f'amoeba restart: cannot run {sys.argv[2]!r}: {exc}', file=sys.stderr)\n"
    "    os._exit(127)\n"
)


# A warm interpreter for the next generation's script: it imports torch (and what a DDP script imports lazily) while
# the current script trains, then waits for its order on stdin — the contract and how to run the script — and runs
# it as ``python script.py ...`` or ``python -m module ...`` would. Same orphan guard as above.
_WARM_START = (
    "import ctypes, json, os, runpy, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(70)\n"
    "import torch, torch.distributed, torch.nn.parallel, torch.optim, torch.utils.data\n"
    "line = sys.stdin.readline()\n"
    "if not line:\n"
    "    os._exit(0)\n"
    "order = json.loads(line)\n"
    "os.environ.update(order['env'])\n"
    "sys.argv = order['argv']\n"
    "if order['module']:\n"
    "    runpy.run_module(order['module'], run_name='__main__', alter_sys=True)\n"
    "else:\n"
    "    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))\n"
    "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def warm_order(command: Sequence[str], python: str = sys.executable) -> dict[str, Any] | None:
    """How a warm interpreter runs ``command`` (``{"module": ..., "argv": [...]}``), or None when it cannot: the
    command is not this Python (same directory, same binary) running a script or ``-m module`` without options."""
    found = shutil.which(command[0]) if command else None
    if found is None or len(command) < 2:
        return None
    same_dir = Path(found).absolute().parent == Path(python).absolute().parent
    if not (same_dir and Path(found).name.startswith("python") and os.path.samefile(found, python)):
        return None
    if command[1] == "-m" and len(command) > 2:
        return {"module": command[2], "argv": [command[2], *command[3:]]}
    if command[1].startswith("-"):
        return None
    return {"module": "", "argv": list(command[1:])}


def restart_command(command: Sequence[str], python: str = sys.executable) -> list[str]:
    """The argv of one worker slot that runs ``command`` under the restart supervisor."""
    return [python, "-m", MODULE, "--", *command]


def master_key(generation: int) -> str:
    """Key where rank 0's supervisor publishes ``MASTER_ADDR:MASTER_PORT`` of a generation."""
    return f"{PREFIX}gen{generation}/master"


def end_key(generation: int) -> str:
    """Key a supervisor sets when it ends a generation on its own (leaving, its script failed)."""
    return f"{PREFIX}gen{generation}/end"


def stopped_key(generation: int, worker_id: str) -> str:
    """Key a supervisor sets once its script of ``generation`` has stopped."""
    return f"{PREFIX}gen{generation}/stopped/{worker_id}"


def torchrun_env(
    plan: GenerationPlan, worker_id: str, master: tuple[str, int], *, job_id: str, stop_file: Path
) -> dict[str, str]:
    """The torchrun contract of ``worker_id`` in ``plan``'s generation (see the module docstring)."""
    rank = plan.rank_of(worker_id)
    local_rank, local_world = plan.local_rank_of(worker_id)
    hosts = list(dict.fromkeys(plan.hosts))
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(plan.world_size),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(hosts.index(plan.hosts[rank])),
        "GROUP_WORLD_SIZE": str(len(hosts)),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(plan.world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": master[0],
        "MASTER_PORT": str(master[1]),
        "TORCHELASTIC_RESTART_COUNT": str(plan.generation - 1),
        "TORCHELASTIC_RUN_ID": job_id,
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        ENV_STOP_FILE: str(stop_file),
    }


def child_environ(base: Mapping[str, str], contract: Mapping[str, str]) -> dict[str, str]:
    """The script's environment: ``base`` without the job's secret and store (only supervisors speak to the
    coordinator), plus ``contract``."""
    hidden = {ENV_JOB_SECRET, ENV_JOB_SECRET_FILE, ENV_STORE_ADDR, ENV_STORE_PORT}
    return {**{k: v for k, v in base.items() if k not in hidden}, **contract}


def exit_status(returncode: int) -> int:
    """A shell's exit status for a child's return code (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "")
    try:
        value = float(text) if text else default
    except ValueError:
        value = -1.0
    if value <= 0:
        raise SpecError(f"{name}={text!r} is invalid; set it to a positive number of seconds")
    return value


@dataclasses.dataclass
class Ending:
    """How one generation ended for this supervisor.

    Attributes:
        failed: its script failed (a collective broke: a peer died), or the generation was aborted.
        leaving: this supervisor got SIGTERM (preemption, shrink).
        error: the job's script error ``(worker, status)`` that ends every supervisor, if any.
        finished: the script exited 0 on its own (training done).
    """

    failed: bool = False
    leaving: bool = False
    error: tuple[str, int] | None = None
    finished: bool = False


class RestartSupervisor:
    """Runs ``command`` as a torchrun worker, restarted at every generation (see the module docstring).

    Args:
        command: the user's script and arguments.
        env: the worker's environment contract.
        key: the job's secret.
        grace_s: how long a script may take to exit after the hook.
        settle_s: how long a supervisor whose script exited on its own waits to learn whether the generation is
            ending (a peer died or left) before it takes the exit as the script's own (finished, or an error).
        stop_dir: where the stop files go.
    """

    def __init__(
        self, command: Sequence[str], env: WorkerEnv, key: JobKey, *, grace_s: float, settle_s: float, stop_dir: Path
    ) -> None:
        self.command = list(command)
        self.env = env
        self.worker_id = env.worker_id
        self.grace_s, self.settle_s = grace_s, settle_s
        self.stop_file = stop_dir / f"amoeba-stop-{env.job_id}-{env.worker_id}-{os.getpid()}"
        self.prefix = f"[{env.job_id}/{env.worker_id}/restart]"
        self._auth = JobAuth(key, env.worker_id)  # seals what it writes, opens what it reads (runtime/auth)
        self._store = self._connect()
        self._seq = 0
        self._leave = threading.Event()
        self._stop = threading.Event()
        self._master_store: TCPStore | None = None  # rank 0 hosts the script's store of the generation
        self._order = warm_order(self.command)
        self._warm: subprocess.Popen[bytes] | None = None  # the next generation's interpreter, warming up
        self.host = socket.gethostname()

    def _connect(self) -> TCPStore:
        timeout = datetime.timedelta(seconds=self.env.collective_timeout_s)
        try:
            return TCPStore(self.env.store_addr, self.env.store_port, is_master=False, timeout=timeout, use_libuv=True)
        except (RuntimeError, OSError) as exc:
            raise AmoebaError(
                f"{self.prefix} cannot reach the coordinator's store at {self.env.store_addr}:{self.env.store_port}: "
                f"{exc}"
            ) from None

    # ----------------------------------------------------------------------------------------------- protocol

    def _push(self, kind: EventKind, **fields: Any) -> None:
        event = WorkerEvent(kind=kind, worker=self.worker_id, time=time.time(), **fields)
        self._store.queue_push(EVENTS_KEY, self._auth.sealer.seal(EVENTS_KEY, event.to_json()))

    def _set(self, key: str, text: str, store: TCPStore | None = None) -> None:
        self._auth.put(store or self._store, key, text)

    def _read(self, key: str) -> str | None:
        """A value any member sealed at ``key``, or None (absent, or not sealed with the job's secret)."""
        if not self._store.check([key]):
            return None
        try:
            return self._auth.opener.open(key, self._store.get(key))
        except AuthError as exc:
            log.warning("%s ignored a forged value at %s: %s", self.prefix, key, exc)
            return None

    def _heartbeats(self) -> None:
        store = self._connect()
        while not self._stop.wait(self.env.heartbeat_s):
            try:
                self._set(heartbeat_key(self.worker_id), repr(time.time()), store)
            except (RuntimeError, ValueError) as exc:
                log.warning("%s heartbeat not written: %s", self.prefix, exc)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._leave.set()

    def _wait_assignment(self, timeout_s: float) -> Assignment:
        key = assignment_key(self.worker_id, self._seq)
        deadline = time.monotonic() + timeout_s
        # A value not sealed by the coordinator reads as absent: the coordinator's own write replaces it.
        while (text := self._auth.read(self._store, key, sender=COORDINATOR)) is None:
            if self._leave.is_set() and self._seq == 0:
                self._push(EventKind.LEFT, message="SIGTERM while waiting for admission")
                return Assignment(AssignAction.LEAVE, reason="SIGTERM while waiting for admission")
            if self._error() is not None:
                return Assignment(AssignAction.FINISH, reason="a script error ended the job")
            if time.monotonic() > deadline:
                raise AmoebaError(f"{self.prefix} waited {timeout_s:.0f} s for the coordinator's assignment {key}")
            time.sleep(0.01 if self._seq else 0.05)  # a member waits milliseconds; a joiner may wait for hours
        self._seq += 1
        return Assignment.from_json(text)

    def _error(self) -> tuple[str, int] | None:
        text = self._read(ERROR_KEY)
        if text is None:
            return None
        data = json.loads(text)
        return str(data["worker"]), int(data["status"])

    def _ending(self, generation: int) -> bool:
        """Whether ``generation`` is ending: the coordinator asked, aborted it, or a member ended it."""
        return (
            self._auth.want(self._store) == generation
            or aborted(self._store, generation, self._auth) is not None
            or self._read(end_key(generation)) is not None
        )

    # ----------------------------------------------------------------------------------------------- lifecycle

    def run(self) -> int:
        """Join the job and run the script in every generation this worker is a member of; the exit status."""
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._set(heartbeat_key(self.worker_id), repr(time.time()))
        self._push(EventKind.REGISTERED, pid=os.getpid(), host=self.host)
        threading.Thread(target=self._heartbeats, name="amoeba-restart-heartbeat", daemon=True).start()
        self._warm_up()
        self._push(EventKind.READY)
        log.info("%s ready: the script starts when the job admits this worker", self.prefix)
        try:
            return self._follow(self._wait_assignment(self.env.join_timeout_s))
        finally:
            self._stop.set()
            self.stop_file.unlink(missing_ok=True)
            if self._warm is not None:
                self._warm.kill()
                self._warm.wait()

    def _follow(self, assignment: Assignment) -> int:
        """Act on assignments until the job ends for this worker; the exit status."""
        after_report_s = 2 * self.env.collective_timeout_s + 30
        while True:
            if assignment.action is AssignAction.STANDBY:
                assignment = self._wait_assignment(self.env.join_timeout_s)
                continue
            if assignment.action is AssignAction.LEAVE:
                log.info("%s leaving: %s", self.prefix, assignment.reason)
                return 0
            if assignment.action is AssignAction.FINISH:
                error = self._error()
                log.info("%s the job ended: %s", self.prefix, assignment.reason)
                return error[1] if error else (1 if "lost" in assignment.reason else 0)
            if assignment.plan is None:
                raise AmoebaError(f"{self.prefix} the coordinator sent a join without a plan: {assignment}")
            ending = self._generation(assignment.plan)
            if ending.error is not None:
                self._push(EventKind.ERROR, message=f"the script of {ending.error[0]} exited with {ending.error[1]}")
                return ending.error[1]
            if ending.finished:
                self._push(EventKind.DONE)
                return 0
            self._push(
                EventKind.REPORT,
                generation=assignment.plan.generation,
                step=0,
                committed_step=0,  # the state is on disk: every member can go on from the script's checkpoint
                leaving=ending.leaving,
                failed=ending.failed,
            )
            assignment = self._wait_assignment(after_report_s)

    def _generation(self, plan: GenerationPlan) -> Ending:
        """Run the script in ``plan``'s generation until it ends; how it ended."""
        try:
            master = self._meet(plan)
        except FormationFailed as exc:
            log.warning("%s %s", self.prefix, exc)
            self._set(stopped_key(plan.generation, self.worker_id), "1")
            return Ending(failed=True)
        self.stop_file.unlink(missing_ok=True)
        contract = torchrun_env(plan, self.worker_id, master, job_id=self.env.job_id, stop_file=self.stop_file)
        started = time.monotonic()
        child = self._launch(contract)
        log.info(
            "%s generation %d: rank %s of %d, script pid %d",
            self.prefix,
            plan.generation,
            contract["RANK"],
            plan.world_size,
            child.pid,
        )
        ending = self._watch(plan, child)
        self._set(stopped_key(plan.generation, self.worker_id), "1")
        if not ending.finished and ending.error is None:
            self._wait_stopped(plan)
        log.info(
            "%s generation %d ended after %.1f s: %s", self.prefix, plan.generation, time.monotonic() - started, ending
        )
        return ending

    def _warm_up(self) -> None:
        """Start the next generation's interpreter now (when the command lets one run it)."""
        if self._order is not None and self._warm is None:
            self._warm = subprocess.Popen(
                [sys.executable, "-c", _WARM_START, str(os.getpid())],
                env=child_environ(os.environ, {}),
                stdin=subprocess.PIPE,
            )

    def _launch(self, contract: Mapping[str, str]) -> subprocess.Popen[bytes]:
        """Start the script with ``contract``: in the warm interpreter when there is one, else in a fresh one."""
        warm, self._warm = self._warm, None
        child: subprocess.Popen[bytes] | None = None
        if warm is not None and warm.stdin is not None and warm.poll() is None:
            try:
                warm.stdin.write((json.dumps({**(self._order or {}), "env": dict(contract)}) + "\n").encode())
                warm.stdin.close()
                child = warm
            except OSError as exc:  # it died meanwhile: start the script cold
                log.warning("%s the warm interpreter is gone (%s): starting the script cold", self.prefix, exc)
                warm.kill()
        if child is None:
            child = subprocess.Popen(
                [sys.executable, "-c", _ORPHAN_GUARD, str(os.getpid()), *self.command],
                env=child_environ(os.environ, contract),
            )
        self._warm_up()
        return child

    def _meet(self, plan: GenerationPlan) -> tuple[str, int]:
        """Meet the other members; rank 0 hosts the script's store. Returns ``(MASTER_ADDR, MASTER_PORT)``.

        Raises:
            FormationFailed: a member did not arrive, or the coordinator aborted the generation.
        """
        settings = GroupSettings(self.worker_id, torch.device("cpu"), "gloo", self.env.collective_timeout_s, self._auth)
        if plan.rank_of(self.worker_id) == 0:
            store = TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False, use_libuv=True)  # noqa: S104
            self._master_store = store  # the previous generation's store goes: its scripts have all stopped
            addr = "127.0.0.1" if set(plan.hosts) == {self.host} else advertise_address()
            self._set(master_key(plan.generation), json.dumps([addr, int(store.port)]))
        wait_for_members(self._store, plan, settings)
        text = self._read(master_key(plan.generation))
        if text is None:
            raise FormationFailed(
                f"rank 0 ({plan.members[0]}) published no MASTER_ADDR for generation {plan.generation}",
                generation=plan.generation,
                missing=(plan.members[0],),
            )
        addr, port = json.loads(text)
        return str(addr), int(port)

    def _watch(self, plan: GenerationPlan, child: subprocess.Popen[bytes]) -> Ending:
        """Wait until the script exits or the generation ends; stop the script in the latter case."""
        generation = plan.generation
        while True:
            code = child.poll()
            if code is not None:
                return (
                    self._finished(plan) if code == 0 and not self._leave.is_set() else self._exited(generation, code)
                )
            error = self._error()
            if self._leave.is_set() or error is not None or self._ending(generation):
                if self._leave.is_set():
                    self._set(end_key(generation), f"{self.worker_id} leaves")
                code = self._stop_child(child)
                return Ending(
                    failed=aborted(self._store, generation, self._auth) is not None,
                    leaving=self._leave.is_set(),
                    error=error,
                )
            time.sleep(self.env.poll_s)

    def _finished(self, plan: GenerationPlan) -> Ending:
        """The script exited 0 on its own: training is over, unless its generation is ending (a member that got
        SIGTERM made every rank save and stop): that is known once every member's script has exited, or the
        generation's end shows, or after the settle time."""
        self._set(stopped_key(plan.generation, self.worker_id), "exited")
        keys = [stopped_key(plan.generation, m) for m in plan.members]
        deadline = time.monotonic() + self.settle_s
        while time.monotonic() < deadline:
            if self._ending(plan.generation):
                return Ending()
            if self._auth.all_sealed(self._store, keys, plan.members):
                break
            time.sleep(0.01)
        return Ending() if self._ending(plan.generation) else Ending(finished=True)

    def _exited(self, generation: int, code: int) -> Ending:
        """The script exited on its own with ``code`` (not 0, or this worker is leaving): a leave, a peer's failure,
        or a script error."""
        if self._leave.is_set():  # SIGTERM reached the script too (Slurm signals every process of a step)
            self._set(end_key(generation), f"{self.worker_id} leaves")
            return Ending(leaving=True)
        deadline = time.monotonic() + self.settle_s
        while time.monotonic() < deadline:
            error = self._error()
            if error is not None:
                return Ending(error=error)
            if self._ending(generation):
                log.warning("%s the script exited with %d as its generation ended: restarting it", self.prefix, code)
                self._set(end_key(generation), f"the script of {self.worker_id} failed")
                return Ending(failed=True)
            time.sleep(0.02)
        status = exit_status(code)
        log.error("%s the script exited with status %d: a script error ends the job", self.prefix, status)
        self._store.compare_set(
            ERROR_KEY, "", self._auth.sealer.seal(ERROR_KEY, json.dumps({"worker": self.worker_id, "status": status}))
        )
        return Ending(error=self._error() or (self.worker_id, status))

    def _stop_child(self, child: subprocess.Popen[bytes]) -> int:
        """The checkpoint hook: stop file and SIGTERM, up to the grace time, then SIGKILL. The return code."""
        self.stop_file.touch()
        child.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            code = child.wait(timeout=self.grace_s)
            log.info(
                "%s the script exited %.2f s after SIGTERM (status %d)", self.prefix, time.monotonic() - sent, code
            )
            return code
        except subprocess.TimeoutExpired:
            log.warning("%s the script did not exit within %.0f s of SIGTERM: killing it", self.prefix, self.grace_s)
            child.kill()
            return child.wait()

    def _wait_stopped(self, plan: GenerationPlan) -> None:
        """Wait until every member's script has stopped (or the coordinator gave up on one), so that nobody reports
        while a script is still saving its checkpoint, and the report deadline starts when all are done."""
        keys = [stopped_key(plan.generation, m) for m in plan.members]
        deadline = time.monotonic() + self.grace_s + self.env.collective_timeout_s
        while not self._auth.all_sealed(self._store, keys, plan.members) and time.monotonic() < deadline:
            if aborted(self._store, plan.generation, self._auth) is not None:
                return
            time.sleep(0.01)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m slurm_amoeba.launcher.restart [--grace S] -- CMD ...``."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {MODULE}",
        description="Run a torchrun-style script in one elastic worker slot, restarted at each resize.",
    )
    parser.add_argument("--grace", type=float, default=None, metavar="S", help=f"default {ENV_GRACE_S} or 30")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = list(args.command[1:] if args.command[:1] == ["--"] else args.command)
    if not command:
        parser.error("give the script after --, e.g. -- python train.py")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        key = JobKey.from_environ(os.environ)
        env = join_job(WorkerEnv.from_environ(os.environ), key)  # the coordinator issues the worker's id
        grace = args.grace if args.grace is not None else _seconds(os.environ, ENV_GRACE_S, DEFAULT_GRACE_S)
        supervisor = RestartSupervisor(
            command,
            env,
            key,
            grace_s=grace,
            settle_s=_seconds(os.environ, ENV_SETTLE_S, DEFAULT_SETTLE_S),
            stop_dir=Path(tempfile.gettempdir()),
        )
        return supervisor.run()
    except AmoebaError as exc:
        print(f"amoeba restart {os.environ.get(ENV_WORKER_ID, '?')}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
