"""The result document every benchmark writes: its figures with the conditions they were measured under.

A benchmark builds a :class:`Recording` when it starts (it reads the machine and its load average then) and calls
:meth:`Recording.write` with its figures when it ends (it reads the load again). The document holds the benchmark's
name, the command's parameters, the machine (cores, CPU model, memory, Python and torch versions), the load average
before and after, the wall time, the figures (medians with their spread, as each benchmark measures them) and,
where a benchmark prints tables, their Markdown. ``scripts/render-results`` renders ``docs/results.md`` from the
documents kept in ``docs/results/`` (:mod:`benchmarks.render_results`); the manuals cite that page.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

#: The document's format; :mod:`benchmarks.render_results` refuses another.
SCHEMA = 1


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (``platform.processor()`` elsewhere, or ``unknown``)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_gib() -> float:
    """The machine's memory in GiB (0 where ``/proc/meminfo`` is missing)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    return 0.0


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """The machine a benchmark runs on: cores (all and usable), CPU model, memory, Python, torch, the kernel."""
    return {
        "cores": os.cpu_count() or 0,
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0,
        "cpu_model": cpu_model(),
        "memory_gib": memory_gib(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "system": f"{platform.system()} {platform.release()}",
    }


def spread(samples: Sequence[float]) -> dict[str, float]:
    """A figure from its samples: median, quartiles (inclusive), min, max and the sample count; only ``n`` (0) for
    no sample (e.g. no switch was followed by three steps of its generation)."""
    if not samples:
        return {"n": 0.0}
    ordered = sorted(float(value) for value in samples)
    quartiles = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else [ordered[0]] * 3
    return {
        "median": statistics.median(ordered),
        "q1": quartiles[0],
        "q3": quartiles[2],
        "min": ordered[0],
        "max": ordered[-1],
        "n": float(len(ordered)),
    }


@dataclasses.dataclass
class Recording:
    """One run of a benchmark: the conditions at its start, and the document it writes at its end.

    Attributes:
        benchmark: the benchmark's name (``grow``, ``sim-study``, ...): the result's anchor in ``docs/results.md``.
        parameters: the command's parameters (``vars(args)`` of its parser), paths as strings.
        command: the command line as run.
    """

    benchmark: str
    parameters: Mapping[str, Any]
    command: str = dataclasses.field(default_factory=lambda: " ".join(sys.argv))
    load_before: tuple[float, float, float] = dataclasses.field(default_factory=os.getloadavg)
    started: float = dataclasses.field(default_factory=time.monotonic)
    started_at: str = dataclasses.field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    )

    def document(
        self, figures: Mapping[str, Any], *, tables: Mapping[str, str] | None = None, notes: Sequence[str] = ()
    ) -> dict[str, Any]:
        """The result document: conditions now (load after, wall time) and what the benchmark measured.

        Args:
            figures: the benchmark's figures (JSON data; medians with their spread where it has samples).
            tables: Markdown tables by section name, for benchmarks that print tables (the simulator's study).
            notes: sentences the page shows with the result (what was left out, what a figure assumes).
        """
        return {
            "schema": SCHEMA,
            "benchmark": self.benchmark,
            "command": self.command,
            "parameters": {key: _plain(value) for key, value in self.parameters.items()},
            "machine": machine(),
            "load_before": list(self.load_before),
            "load_after": list(os.getloadavg()),
            "wall_s": round(time.monotonic() - self.started, 1),
            "measured_at": self.started_at,
            "figures": _plain(figures),
            "tables": dict(tables or {}),
            "notes": list(notes),
        }

    def write(
        self,
        path: Path,
        figures: Mapping[str, Any],
        *,
        tables: Mapping[str, str] | None = None,
        notes: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Write :meth:`document` to ``path`` as JSON (parents made) and return it."""
        document = self.document(figures, tables=tables, notes=notes)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=1, sort_keys=True, allow_nan=False, default=str) + "\n")
        return document


def _plain(value: Any) -> Any:
    """JSON data of a value: paths and other objects as strings, NaN and infinities as ``None``."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)
