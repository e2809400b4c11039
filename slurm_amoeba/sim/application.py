"""The application model: how fast a training job progresses on a placement, built from measured traces.

For each of Pollux's six applications the data holds measured step times per placement and local batch
(``placements.csv``, up to 4 nodes of 4 GPUs), per (nodes, replicas, local batch) on larger clusters
(``scalability.csv``), and validation runs at several global batch sizes (``validation-<batch>.csv``: per epoch,
the progress reached and the gradient statistics). The model follows the facts of Pollux's simulator:

- *progress* is counted in steps of the smallest validated batch; a step at a larger global batch makes the
  statistical-efficiency gain ``(var + sqr) / (var / scale + sqr)`` of progress, with ``scale`` the batch ratio and
  ``sqr``/``var`` the gradient statistics of the current epoch, interpolated linearly between the two nearest
  validated batch sizes;
- a job is done after its completion epoch (bert 2, cifar10 100, ncf 10, imagenet 90, deepspeech2 80, yolov3 50),
  i.e. when its progress reaches the smallest progress any validation run reached at the end of that epoch;
- a global batch ``B`` on ``r`` replicas runs ``ceil(B / r)`` samples per replica, split into gradient-accumulation
  steps so that no step exceeds the application's largest measured local batch (8 for yolov3); a single replica
  with a batch above the smallest validated one accumulates at least twice (as in the artifact);
- step time is interpolated over the local batch for a measured placement (per-node replica counts, rotated to their
  smallest form), else over (nodes, replicas per node, local batch) from both files.

The last point differs in method from the artifact, which triangulates the three-dimensional points (Delaunay):
this model interpolates linearly, one axis at a time (local batch, then replicas per node within each measured node
count, then node count), which needs no triangulation and agrees with the artifact on every measured point.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections import defaultdict
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.sim.data import SimError, data_dir, parse_number, read_rows

#: Epoch after which each application is done (the artifact's ``max_epochs``).
COMPLETION_EPOCHS: dict[str, int] = {
    "bert": 2,
    "cifar10": 100,
    "ncf": 10,
    "imagenet": 90,
    "deepspeech2": 80,
    "yolov3": 50,
}

#: Largest local batch per GPU where memory is smaller than the traces' largest measured one.
MAX_LOCAL_BATCH: dict[str, int] = {"yolov3": 8}

#: The artifact interpolates on at most this many nodes.
MAX_INTERPOLATED_NODES = 16

_PLACEMENT_COLUMNS = ("placement", "local_bsz", "step_time", "sync_time")
_SCALABILITY_COLUMNS = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
_VALIDATION_COLUMNS = ("progress", "iteration", "metric", "grad_sqr", "grad_var")

# (local batch, step time, sync time), sorted by local batch.
_Curve = list[tuple[float, float, float]]


@dataclasses.dataclass(frozen=True)
class ValidationRun:
    """One validation run at a fixed global batch: per epoch, progress reached and gradient statistics.

    Attributes:
        batch_size: the global batch of the run.
        progress: progress at the end of each epoch (index 0 = epoch 1).
        grad_sqr: squared gradient norm estimate per epoch.
        grad_var: gradient variance estimate per epoch.
    """

    batch_size: int
    progress: tuple[float, ...]
    grad_sqr: tuple[float, ...]
    grad_var: tuple[float, ...]


def canonical_placement(placement: Sequence[int]) -> tuple[int, ...]:
    """A placement's smallest rotation without empty nodes (the form the traces are keyed by).

    Args:
        placement: workers per node.

    Returns:
        The canonical tuple, e.g. ``(4, 2)`` -> ``(2, 4)``.
    """
    parts = tuple(count for count in placement if count > 0)
    if not parts:
        return parts
    return min(parts[i:] + parts[:i] for i in range(len(parts)))


def _interp_curve(curve: _Curve, local_bsz: float) -> tuple[float, float]:
    """Linear interpolation of (step, sync) over the local batch, held constant beyond the measured ends."""
    xs = [point[0] for point in curve]
    if local_bsz <= xs[0]:
        return curve[0][1], curve[0][2]
    if local_bsz >= xs[-1]:
        return curve[-1][1], curve[-1][2]
    hi = bisect.bisect_left(xs, local_bsz)
    lo = hi - 1
    frac = (local_bsz - xs[lo]) / (xs[hi] - xs[lo])
    return (
        curve[lo][1] + frac * (curve[hi][1] - curve[lo][1]),
        curve[lo][2] + frac * (curve[hi][2] - curve[lo][2]),
    )


def _interp_axis(points: Sequence[tuple[float, tuple[float, float]]], x: float) -> tuple[float, float]:
    """Linear interpolation of (step, sync) pairs over one sorted axis, clamped at the ends."""
    if x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= x <= x1:
            frac = (x - x0) / (x1 - x0)
            return (y0[0] + frac * (y1[0] - y0[0]), y0[1] + frac * (y1[1] - y0[1]))
    return points[-1][1]


class Application:
    """The measured behaviour of one application.

    Attributes:
        name: the application's name.
        init_batch: the smallest validated global batch (the unit of progress is one step at this batch).
        max_batch: the largest validated global batch.
        min_local_batch: the smallest measured local batch.
        max_local_batch: the largest local batch per GPU.
        completion_epoch: the epoch after which a job is done.
    """

    def __init__(
        self,
        name: str,
        placements: dict[tuple[int, ...], _Curve],
        grid: dict[int, dict[int, _Curve]],
        validation: dict[int, ValidationRun],
        completion_epoch: int,
        max_local_batch: int | None = None,
    ) -> None:
        """Build the model from parsed traces (use :func:`load_application` to read them from files).

        Args:
            name: the application's name.
            placements: canonical placement -> curve over the local batch.
            grid: nodes -> replicas -> curve over the local batch (placement means and scalability rows).
            validation: global batch -> validation run.
            completion_epoch: the epoch after which a job is done.
            max_local_batch: a memory limit below the largest measured local batch, if any.

        Raises:
            SimError: the traces are empty or have fewer epochs than ``completion_epoch``.
        """
        if not placements or not validation:
            raise SimError(f"application {name}: the traces hold no placements or no validation runs")
        short = [run.batch_size for run in validation.values() if len(run.progress) < completion_epoch]
        if short:
            raise SimError(
                f"application {name}: validation runs at batch {short} have fewer than {completion_epoch} epochs"
            )
        self.name = name
        self._placements = placements
        self._grid = grid
        self._validation = dict(sorted(validation.items()))
        self._batches = list(self._validation)
        self.init_batch = self._batches[0]
        self.max_batch = self._batches[-1]
        measured_local = [point[0] for curve in placements.values() for point in curve]
        self.min_local_batch = int(min(measured_local))
        self.max_local_batch = int(max_local_batch or max(measured_local))
        self.completion_epoch = completion_epoch
        self._node_levels = sorted(grid)
        self._step_cache: dict[tuple[tuple[int, ...], int], tuple[float, float]] = {}
        self._gain_cache: dict[tuple[int, int], float] = {}

    def epoch_ends(self) -> list[float]:
        """Progress at the end of each epoch up to the completion epoch (the smallest over validation runs)."""
        runs = list(self._validation.values())
        return [min(run.progress[epoch] for run in runs) for epoch in range(self.completion_epoch)]

    def max_replicas(self, batch_size: int) -> int:
        """The most replicas a global batch can be split over without going below the smallest local batch."""
        return max(1, batch_size // self.min_local_batch)

    def plan_batch(self, batch_size: int, replicas: int, max_local: int | None = None) -> tuple[int, int]:
        """Split a global batch over replicas: the local batch of one step and the accumulation steps.

        Args:
            batch_size: the global batch, kept fixed.
            replicas: the number of replicas.
            max_local: a memory limit per step below the application's (e.g. when sharing a GPU).

        Returns:
            (local batch per step, extra accumulation steps); the global batch is
            ``replicas * local * (accum + 1)``, rounded up from ``batch_size``.
        """
        limit = max_local or self.max_local_batch
        per_replica = math.ceil(batch_size / replicas - 1e-8)
        accum = math.ceil(per_replica / limit - 1e-8) - 1
        if replicas == 1 and batch_size > self.init_batch:
            accum = max(1, accum)
        local = math.ceil(per_replica / (accum + 1) - 1e-8)
        local = max(1, min(local, int(self.max_batch / (replicas * (accum + 1)))))
        return local, accum

    def step_time(self, placement: tuple[int, ...], local_bsz: int) -> tuple[float, float]:
        """(step time, sync time) in seconds of one step of ``local_bsz`` per replica on ``placement``.

        Args:
            placement: workers per node (any order, zeros allowed).
            local_bsz: samples per replica per step.

        Returns:
            Seconds per step and the part of it spent synchronizing gradients.
        """
        key = (canonical_placement(placement), local_bsz)
        cached = self._step_cache.get(key)
        if cached is not None:
            return cached
        canon = key[0]
        curve = self._placements.get(canon)
        if curve is not None:
            result = _interp_curve(curve, local_bsz)
        else:
            result = self._interp_grid(len(canon), sum(canon), local_bsz)
        self._step_cache[key] = result
        return result

    def _interp_grid(self, nodes: int, replicas: int, local_bsz: int) -> tuple[float, float]:
        nodes = min(nodes, MAX_INTERPOLATED_NODES)
        density = replicas / nodes
        levels = self._node_levels
        hi_index = bisect.bisect_left(levels, nodes)
        if hi_index >= len(levels):
            chosen = [levels[-1]]
        elif levels[hi_index] == nodes or hi_index == 0:
            chosen = [levels[hi_index]]
        else:
            chosen = [levels[hi_index - 1], levels[hi_index]]
        values: list[tuple[float, tuple[float, float]]] = []
        for level in chosen:
            by_replicas = self._grid[level]
            points = [(float(r), _interp_curve(curve, local_bsz)) for r, curve in sorted(by_replicas.items())]
            values.append((float(level), _interp_axis(points, density * level)))
        return _interp_axis(values, float(nodes))

    def gain(self, batch_size: int, epoch: int) -> float:
        """Progress made by one step of a global batch during an epoch (the statistical-efficiency gain).

        Args:
            batch_size: the global batch actually run.
            epoch: the current epoch (0-based).

        Returns:
            ``(var + sqr) / (var / scale + sqr)`` with ``scale = batch_size / init_batch``.

        Raises:
            SimError: the batch lies outside the validated range.
        """
        key = (batch_size, epoch)
        cached = self._gain_cache.get(key)
        if cached is not None:
            return cached
        sqr, var = self.grad_stats(batch_size, epoch)
        scale = batch_size / self.init_batch
        result = (var + sqr) / (var / scale + sqr)
        self._gain_cache[key] = result
        return result

    def grad_stats(self, batch_size: int, epoch: int) -> tuple[float, float]:
        """``(grad_sqr, grad_var)`` of an epoch at a global batch, interpolated between the nearest validated runs.

        Raises:
            SimError: the batch lies outside the validated range.
        """
        if not self.init_batch <= batch_size <= self.max_batch:
            raise SimError(
                f"application {self.name}: global batch {batch_size} lies outside the validated range "
                f"{self.init_batch}..{self.max_batch}; pick a batch size in that range"
            )
        index = bisect.bisect_left(self._batches, batch_size)
        high = self._batches[index]
        low = high if high == batch_size else self._batches[index - 1]
        sqr_hi, var_hi = self._validation[high].grad_sqr[epoch], self._validation[high].grad_var[epoch]
        sqr_lo, var_lo = self._validation[low].grad_sqr[epoch], self._validation[low].grad_var[epoch]
        frac = 0.0 if high == low else (batch_size - low) / (high - low)
        return sqr_lo + frac * (sqr_hi - sqr_lo), var_lo + frac * (var_hi - var_lo)

    def measured_local_batches(self) -> list[int]:
        """Every local batch measured on some placement, ascending (where step time bends)."""
        return sorted({int(point[0]) for curve in self._placements.values() for point in curve})

    def rate(self, placement: tuple[int, ...], batch_size: int, epoch: int, max_local: int | None = None) -> float:
        """Progress per second of a job with a fixed global batch on a placement during an epoch.

        Args:
            placement: workers per node.
            batch_size: the job's global batch.
            epoch: the current epoch (0-based).
            max_local: a memory limit per step below the application's (sharing a GPU halves it).

        Returns:
            Progress per second.
        """
        replicas = sum(placement)
        local, accum = self.plan_batch(batch_size, replicas, max_local)
        step, sync = self.step_time(placement, local)
        seconds = step + (step - sync) * accum
        effective = replicas * local * (accum + 1)
        return self.gain(min(effective, self.max_batch), epoch) / seconds


def _load_curves(path: Path) -> dict[tuple[int, ...], _Curve]:
    curves: dict[tuple[int, ...], _Curve] = defaultdict(list)
    for line, row in read_rows(path, _PLACEMENT_COLUMNS):
        text = row["placement"].strip()
        if not text.isdigit():
            raise ParseError(f"line {line}: placement={text!r} is not a string of per-node counts", source=str(path))
        placement = canonical_placement(tuple(int(ch) for ch in text))
        curves[placement].append(
            (
                parse_number(path, line, "local_bsz", row["local_bsz"]),
                parse_number(path, line, "step_time", row["step_time"]),
                parse_number(path, line, "sync_time", row["sync_time"]),
            )
        )
    return {key: _mean_curve(points) for key, points in curves.items()}


def _mean_curve(points: _Curve) -> _Curve:
    grouped: dict[float, list[tuple[float, float]]] = defaultdict(list)
    for local, step, sync in points:
        grouped[local].append((step, sync))
    return [
        (local, sum(s for s, _ in vals) / len(vals), sum(y for _, y in vals) / len(vals))
        for local, vals in sorted(grouped.items())
    ]


def _load_grid(placements: dict[tuple[int, ...], _Curve], path: Path) -> dict[int, dict[int, _Curve]]:
    raw: dict[int, dict[int, _Curve]] = defaultdict(lambda: defaultdict(list))
    for placement, curve in placements.items():
        raw[len(placement)][sum(placement)].extend(curve)
    for line, row in read_rows(path, _SCALABILITY_COLUMNS):
        nodes = int(parse_number(path, line, "num_nodes", row["num_nodes"], integer=True))
        replicas = int(parse_number(path, line, "num_replicas", row["num_replicas"], integer=True))
        raw[nodes][replicas].append(
            (
                parse_number(path, line, "local_bsz", row["local_bsz"]),
                parse_number(path, line, "step_time", row["step_time"]),
                parse_number(path, line, "sync_time", row["sync_time"]),
            )
        )
    return {nodes: {r: _mean_curve(points) for r, points in by_r.items()} for nodes, by_r in raw.items()}


def _load_validation(path: Path, batch_size: int) -> ValidationRun:
    progress: list[float] = []
    sqr: list[float] = []
    var: list[float] = []
    for line, row in read_rows(path, _VALIDATION_COLUMNS):
        progress.append(parse_number(path, line, "progress", row["progress"]))
        sqr.append(parse_number(path, line, "grad_sqr", row["grad_sqr"]))
        var.append(parse_number(path, line, "grad_var", row["grad_var"]))
    return ValidationRun(batch_size, tuple(progress), tuple(sqr), tuple(var))


def load_application(trace_dir: Path, completion_epoch: int | None = None) -> Application:
    """Read one application's traces from its folder.

    Args:
        trace_dir: the folder (its name is the application's name).
        completion_epoch: overrides :data:`COMPLETION_EPOCHS`.

    Returns:
        The model.

    Raises:
        SimError: the folder is missing or the completion epoch is unknown.
        ParseError: a trace file is malformed (the message names the file and line).
    """
    name = trace_dir.name
    if not trace_dir.is_dir():
        raise SimError(f"application {name}: no trace folder at {trace_dir}")
    epoch = completion_epoch or COMPLETION_EPOCHS.get(name)
    if epoch is None:
        raise SimError(
            f"application {name}: its completion epoch is unknown; known ones are {sorted(COMPLETION_EPOCHS)}"
        )
    placements = _load_curves(trace_dir / "placements.csv")
    grid = _load_grid(placements, trace_dir / "scalability.csv")
    validation: dict[int, ValidationRun] = {}
    for path in sorted(trace_dir.glob("validation-*.csv")):
        suffix = path.stem.split("-", 1)[1]
        if not suffix.isdigit():
            raise SimError(f"{path}: the file name must be validation-<batch size>.csv")
        validation[int(suffix)] = _load_validation(path, int(suffix))
    return Application(name, placements, grid, validation, epoch, MAX_LOCAL_BATCH.get(name))


@cache
def load_applications(root: Path | None = None) -> dict[str, Application]:
    """Read all six of Pollux's applications (cached per folder).

    Args:
        root: the ``traces`` folder; the data folder's ``pollux/traces`` by default.

    Returns:
        name -> model.
    """
    folder = root or data_dir() / "pollux" / "traces"
    return {name: load_application(folder / name) for name in COMPLETION_EPOCHS}
