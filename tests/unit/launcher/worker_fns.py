"""Functions the executor tests submit; importable by the worker process (``tests.unit.launcher.worker_fns``)."""

from __future__ import annotations

import logging
import sys


def shout(word: str) -> str:
    """Print to stdout, log to stderr, and return."""
    print(f"stdout of {word}")
    sys.stdout.buffer.write(b"bytes reach the worker's own log only\n")  # what some libraries do
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
    logging.getLogger("worker").info("stderr of %s", word)
    return word.upper()


def fail(word: str) -> str:
    """Raise."""
    raise RuntimeError(f"{word} went wrong")
