"""The hand-over between the user's own training loop and :func:`slurm_amoeba.runtime.run`'s generation loop.

A ported script (:mod:`slurm_amoeba.runtime.port`) keeps its loop in the main thread; the runtime's generation loop
(:meth:`~slurm_amoeba.runtime.worker.WorkerRuntime.run`: admission, switches, rollbacks, leave, finish) runs
unchanged in a thread of its own, and the two take turns like a coroutine: exactly one of them runs at a time. The
runtime's thread calls the "training function" :meth:`Bridge.train` once per generation; it gives the turn to the
user's loop and waits for it to come back with what ended the generation's turn (a switch agreed at a step
boundary, a failure, the end of training, an error). The user's loop gets the turn back once the runtime is a
member of the next generation, or with the run's result when the run is over for this worker (DESIGN.md, layer
``runtime/``, worker side).
"""

from __future__ import annotations

import dataclasses
import enum
import queue
import threading
from collections.abc import Callable

from slurm_amoeba.runtime.errors import MembershipChanged, RuntimeConfigError
from slurm_amoeba.runtime.result import RunResult
from slurm_amoeba.runtime.state import TorchState


class Turn(str, enum.Enum):
    """Why the user's loop hands the turn back to the runtime's thread."""

    SWITCH = "switch"  # the members agreed to switch at this step boundary
    FAILED = "failed"  # a runtime collective failed (or the state was refused): ``error`` says which
    DONE = "done"  # the user's training is over: ``run()`` finishes
    ERROR = "error"  # the user's script raised or exits before its loop ended: ``error`` is pushed as an error


@dataclasses.dataclass(frozen=True)
class _Message:
    turn: Turn | None = None  # to the runtime; None: to the user's loop
    error: BaseException | None = None
    result: RunResult[None] | None = None  # the run is over (to the user's loop)


class Bridge:
    """Alternates the user's loop (main thread) and ``run(train, state)`` (the runtime's thread).

    Args:
        run: the runtime's entry point, e.g. ``lambda train, state: runtime.run(train, state, checkpoint=policy)``.
        state: the training state it runs.
    """

    def __init__(self, run: Callable[[Callable[[TorchState], None], TorchState], RunResult[None]], state: TorchState):
        self._run = run
        self._state = state
        self._to_runtime: queue.Queue[_Message] = queue.Queue()
        self._to_loop: queue.Queue[_Message] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.result: RunResult[None] | None = None

    @property
    def started(self) -> bool:
        """Whether the runtime's thread was started (:meth:`admit` was called)."""
        return self._thread is not None

    @property
    def over(self) -> bool:
        """Whether the run is over for this worker (:attr:`result` holds how it ended)."""
        return self.result is not None

    def admit(self) -> RunResult[None] | None:
        """Start the runtime's generation loop and wait until this worker is a member (or the run is over).

        Returns:
            ``None`` once a member, else the run's result.

        Raises:
            BaseException: what ``run()`` raised (e.g. ``StateError`` for a state that does not fit the job's).
        """
        if self._thread is not None:
            raise RuntimeConfigError("the elastic runtime was already started in this process")
        self._thread = threading.Thread(target=self._main, name="amoeba-generations", daemon=True)
        self._thread.start()
        return self._wait()

    def hand_over(self, turn: Turn, error: BaseException | None = None) -> RunResult[None] | None:
        """Give the turn to the runtime and wait for it to come back.

        Args:
            turn: why.
            error: the failure (``FAILED``) or the script's error (``ERROR``).

        Returns:
            ``None`` when this worker is a member of a generation again, else the run's result.

        Raises:
            BaseException: what ``run()`` raised.
        """
        if self._thread is None or self.result is not None:
            raise RuntimeConfigError("the elastic runtime is not running in this process")
        self._to_runtime.put(_Message(turn=turn, error=error))
        return self._wait()

    def _wait(self) -> RunResult[None] | None:
        message = self._to_loop.get()
        if message.error is not None:
            raise message.error
        self.result = message.result
        return message.result

    def _main(self) -> None:
        try:
            result = self._run(self.train, self._state)
        except BaseException as exc:  # handed to the user's loop, which raises it in the main thread
            self._to_loop.put(_Message(error=exc))
            return
        self._to_loop.put(_Message(result=result))

    def train(self, state: TorchState) -> None:
        """The training function ``run()`` calls in each generation: the user's loop runs meanwhile.

        Raises:
            MembershipChanged: the user's loop reached a boundary where the members agreed to switch.
            BaseException: the failure or error the user's loop handed over.
        """
        self._to_loop.put(_Message())
        message = self._to_runtime.get()
        if message.turn is Turn.SWITCH:
            raise MembershipChanged("the members agreed to switch at this step boundary")
        if message.error is not None:
            raise message.error
        if message.turn is not Turn.DONE:  # pragma: no cover - ERROR and FAILED always carry their error
            raise RuntimeConfigError(f"the training loop handed over {message.turn} without an error")

    def join(self, timeout_s: float) -> None:
        """Wait for the runtime's thread to end (after the run is over)."""
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
