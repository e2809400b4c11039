"""A site's question, answered from its own history: what if a share of our jobs were elastic?

Simulation flow (DESIGN.md): an accounting export (:mod:`slurm_amoeba.sim.accounting`) -> the same jobs twice through
the engine: once under the ``slurm`` baseline (what the site's Slurm did, modelled), once with a share of the jobs
given a worker range and the daemon's elastic backfill running on top of the same Slurm model
(the ``amoebad`` policy) -> figures side by side (``amoeba-sim site``).

Elastic jobs that never ran elastic speed up or slow down by the scaling model of
:class:`~slurm_amoeba.sim.engine.WorkModel` (``(size / requested) ** scaling_exponent``, default
:data:`~slurm_amoeba.sim.engine.DEFAULT_SCALING_EXPONENT`, measured on the shared Pollux traces).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from slurm_amoeba.policy import make_policy
from slurm_amoeba.sim.accounting import History
from slurm_amoeba.sim.data import SimError
from slurm_amoeba.sim.engine import DEFAULT_SCALING_EXPONENT, SimConfig, Simulator, trace_models
from slurm_amoeba.sim.metrics import percentile
from slurm_amoeba.sim.report import format_table
from slurm_amoeba.sim.runner import RunOutcome
from slurm_amoeba.sim.workload import make_elastic

#: The two runs' labels.
BASELINE, ELASTIC = "slurm", "slurm+elastic"

_ROWS = (
    ("avg_jct_s", "avg JCT (s)"),
    ("p50_jct_s", "p50 JCT (s)"),
    ("p99_jct_s", "p99 JCT (s)"),
    ("avg_queue_s", "avg queueing (s)"),
    ("regular_wait_s", "regular jobs' avg wait (s)"),
    ("gpu_util", "GPU utilization"),
    ("makespan_s", "makespan (s)"),
    ("preemptions", "preemptions"),
    ("resizes", "resizes"),
)


@dataclasses.dataclass(frozen=True)
class SiteOptions:
    """How the elastic run differs from the baseline.

    Attributes:
        fraction: share of the jobs given a worker range (picked by a hash of the job id, stable across runs).
        factor: a range runs from ``requested / factor`` to ``requested * factor`` GPUs (capped by the cluster).
        scaling_exponent: the scaling model of jobs that never ran elastic.
        knobs: the ``slurm`` policy's settings (from ``--slurm-conf`` and ``--knob``), the same in both runs (the
            ``amoebad`` policy of the elastic run takes them too).
    """

    fraction: float = 0.5
    factor: float = 2.0
    scaling_exponent: float = DEFAULT_SCALING_EXPONENT
    knobs: Mapping[str, object] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise SimError(f"elastic fraction {self.fraction} must lie between 0 and 1")
        if not 0.0 <= self.scaling_exponent <= 1.0:
            raise SimError(
                f"scaling exponent {self.scaling_exponent} must lie between 0 (no speed-up) and 1 (linear scaling)"
            )


@dataclasses.dataclass(frozen=True)
class SiteComparison:
    """Both runs of a history.

    Attributes:
        outcomes: the baseline's and the elastic run's outcomes (labels :data:`BASELINE`, :data:`ELASTIC`).
        elastic_jobs: how many jobs had a worker range in the elastic run.
        history: the jobs that were replayed.
    """

    outcomes: list[RunOutcome]
    elastic_jobs: int
    history: History

    def figures(self) -> dict[str, dict[str, float]]:
        """label -> figures (the summary keys plus ``regular_wait_s``)."""
        return {outcome.policy: outcome.summary for outcome in self.outcomes}

    def recorded(self) -> dict[str, float]:
        """What the site's Slurm really did with these jobs (from the export), for the baseline's fidelity."""
        jcts, waits = self.history.recorded_jcts, self.history.recorded_waits
        return {
            "avg_jct_s": _mean(jcts),
            "p50_jct_s": percentile(jcts, 0.5),
            "p99_jct_s": percentile(jcts, 0.99),
            "avg_queue_s": _mean(waits),
        }

    def table(self) -> str:
        """The figures side by side with the relative change, and what the export recorded."""
        base, elastic = (outcome.summary for outcome in self.outcomes)
        recorded = self.recorded()
        rows = [["figure", "recorded", BASELINE, ELASTIC, "change"]]
        for key, label in _ROWS:
            before, after = base[key], elastic[key]
            change = "-" if not before or math.isnan(before) or math.isnan(after) else f"{after / before - 1:+.1%}"
            digits = 3 if key == "gpu_util" else 0
            real = f"{recorded[key]:.0f}" if key in recorded else "-"
            rows.append([label, real, f"{before:.{digits}f}", f"{after:.{digits}f}", change])
        return format_table(rows)


def compare_site(history: History, config: SimConfig, options: SiteOptions, name: str = "history") -> SiteComparison:
    """Replay a history under the ``slurm`` baseline and with a share of its jobs elastic.

    Args:
        history: the site's jobs.
        config: the model cluster (the site's nodes and GPUs) and its costs.
        options: the elastic run's settings.
        name: the history's name in the outcomes.

    Returns:
        Both runs.

    Raises:
        SimError: a job larger than the cluster, or settings out of range.
        PolicyError: bad ``slurm`` knobs.
    """
    jobs = history.jobs
    elastic = make_elastic(jobs, {}, options.fraction, options.factor, config.total_gpus, duration_jobs=True)
    resizable = {job.name for job in elastic if job.max_workers > job.min_workers}
    models = trace_models({}, config.gpus_per_node, options.scaling_exponent)
    outcomes = []
    for label, workload, grow in ((BASELINE, jobs, False), (ELASTIC, elastic, True)):
        policy = make_policy("amoebad" if grow else "slurm", **options.knobs)
        result = Simulator(workload, policy, config, models).run()
        summary = result.summary()
        waits = [
            record.first_start - record.submit_time
            for record in result.jobs
            if record.name not in resizable and record.first_start is not None
        ]
        summary["regular_wait_s"] = _mean(waits)
        summary["elastic_jobs"] = float(len(resizable) if grow else 0)
        outcomes.append(RunOutcome(label, name, summary, result.jcts(), result.usage, result.total_gpus))
    return SiteComparison(outcomes, len(resizable), history)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan
