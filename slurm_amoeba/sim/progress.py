"""A one-line progress bar for long simulation batches (written to stderr, redrawn in place)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """``[########------------]  12/56  tiresias workload-3  4.1 s``, redrawn on every update."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 30) -> None:
        """Start a bar.

        Args:
            total: steps in all.
            stream: where to draw (stderr by default).
            width: characters of the bar itself.
        """
        self.total = max(total, 1)
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self._start = time.perf_counter()
        self._last = ""

    def render(self, done: int, label: str = "") -> str:
        """The bar's text for ``done`` steps (without the carriage return)."""
        filled = round(self.width * min(done, self.total) / self.total)
        elapsed = time.perf_counter() - self._start
        bar = "#" * filled + "-" * (self.width - filled)
        return f"[{bar}] {done:>{len(str(self.total))}}/{self.total}  {label}  {elapsed:.1f} s"

    def update(self, done: int, label: str = "") -> None:
        """Redraw the bar with ``done`` steps finished."""
        text = self.render(done, label)
        pad = " " * max(0, len(self._last) - len(text))
        self.stream.write("\r" + text + pad)
        self.stream.flush()
        self._last = text

    def close(self) -> None:
        """End the bar's line."""
        self.stream.write("\n")
        self.stream.flush()
