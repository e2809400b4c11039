"""The script's own SIGTERM handler, chained behind the runtime's graceful leave (a ported loop, ``runtime/port.py``).

A torchrun script on preemptible nodes installs its own SIGTERM handler (set a flag, save a checkpoint, exit).
Under the elastic runtime SIGTERM means "this worker leaves at the next step boundary" while the job goes on, so the
script's handler must not replace the runtime's, nor run while the worker still trains. :class:`SigtermChain` keeps
the runtime's handler installed (taking over a handler the script installed before or after ``init``) and calls the
script's handler once, at the step boundary where this worker leaves, with the process group still up: the
script's own ``dist.get_rank()``, ``torch.save`` and flags work there as they did (DESIGN.md, layer ``runtime/``,
worker side).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

Handler = Callable[[int, FrameType | None], Any]


class SigtermChain:
    """The runtime's SIGTERM handler in front of the script's.

    Args:
        leave: what the runtime does on SIGTERM (``WorkerRuntime.request_leave``).
        previous: the handler installed before the runtime's (``signal.getsignal(SIGTERM)`` before ``init``).
    """

    def __init__(self, leave: Callable[[], None], previous: object = None) -> None:
        self._leave = leave
        self.user: Handler | None = None
        self.received = False
        self._called = False
        self._adopt_handler(previous)
        self.install()

    def _adopt_handler(self, handler: object) -> None:
        if callable(handler) and handler != self._on_sigterm:
            self.user = handler

    def install(self) -> None:
        """Put the chain in front (main thread only; elsewhere signal handlers cannot be set)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def adopt(self) -> None:
        """Take over a handler the script installed since (called at admission and at every step boundary)."""
        if threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGTERM)
        if current != self._on_sigterm:
            self._adopt_handler(current)
            self.install()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.received = True
        self._leave()

    def leaving(self) -> None:
        """This worker leaves at this boundary: call the script's handler once, if SIGTERM came and it has one.

        ``SystemExit`` from it (``sys.exit()`` in a handler) is swallowed: the runtime ends the worker itself, with
        status 0, once it has left.
        """
        if not self.received or self._called or self.user is None:
            return
        self._called = True
        try:
            self.user(signal.SIGTERM, None)
        except SystemExit:
            log.info("the script's SIGTERM handler asked to exit: the worker exits once it has left the job")
