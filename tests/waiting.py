"""Waiting in tests for what they assert, instead of sleeping a fixed time and hoping it was long enough.

A test that checks something another thread or process does (a daemon's round, a worker's step, a reply on a
socket) waits on that very condition with :func:`wait_until`, which fails the test naming what it waited for and the
last value it saw. A test that checks that something did *not* happen waits instead on an event proving the other side
had its chance (a later round finished, a reply to a later request arrived), then asserts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

#: The most characters of the last value a failure shows.
SHOWN_CHARS = 2000


def wait_until(what: str, predicate: Callable[[], T | None], timeout: float = 10.0, every: float = 0.02) -> T:
    """Call ``predicate`` every ``every`` seconds until it returns a true value, and return that value.

    Args:
        what: the condition in words, as the failure reads it ("the agent to get the directive").
        predicate: the condition: any value, true or false as ``bool`` takes it (None while there is none yet).
        timeout: seconds to wait before failing the test.
        every: seconds between calls.

    Returns:
        The first true value ``predicate`` returned.

    Raises:
        pytest.fail.Exception: ``predicate`` stayed false ``timeout`` seconds; the message names ``what`` and the
            last value ``predicate`` returned.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            shown = repr(value)
            if len(shown) > SHOWN_CHARS:
                shown = shown[:SHOWN_CHARS] + "..."
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}; the last value was {shown}")
        time.sleep(every)
