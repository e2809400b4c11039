"""Run many simulations (policies x workloads), in parallel processes, and collect their figures.

This is what ``amoeba-sim run`` and ``amoeba-sim compare`` call; ``scripts/sim-report`` uses it to regenerate the
tables of ``docs/simulator.md``.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from slurm_amoeba.core.errors import AmoebaError, ParseError
from slurm_amoeba.policy import make_policy
from slurm_amoeba.sim.adaptive import adaptive_models, mark_adaptive, widen_adaptive
from slurm_amoeba.sim.application import load_applications
from slurm_amoeba.sim.data import SimError
from slurm_amoeba.sim.engine import SimConfig, Simulator, trace_models
from slurm_amoeba.sim.interference import load_colocation
from slurm_amoeba.sim.workload import JobSpec, load_philly, load_pollux_workload, make_elastic


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One simulation to run.

    Attributes:
        policy: a registered policy name.
        workload: the workload file.
        config: the cluster and its costs.
        trace_format: ``"pollux"`` (an evaluation workload) or ``"philly"`` (``philly.csv``); ``"auto"`` picks by
            the header.
        elastic_fraction: share of the jobs given a worker range (0 keeps every job at its requested size).
        elastic_factor: how far ranges extend below and above the requested size.
        philly_limit: read only the first jobs of a Philly trace.
        knobs: the policy's settings.
        adaptive_fraction: share of the Pollux jobs whose global batch adapts to each allocation (a stable hash of
            the name picks them; ``sim/adaptive.py``); 0 keeps every batch fixed. An adaptive job's range may reach
            as many workers as its largest batch allows (not only its initial one).
        label: the row the outcome is reported under (default: the policy's name), e.g. the stem of the daemon
            configuration an ``amoebad`` run was built from.
    """

    policy: str
    workload: Path
    config: SimConfig = dataclasses.field(default_factory=SimConfig)
    trace_format: str = "auto"
    elastic_fraction: float = 1.0
    elastic_factor: float = 2.0
    philly_limit: int | None = None
    knobs: tuple[tuple[str, object], ...] = ()
    adaptive_fraction: float = 0.0
    label: str = ""

    @property
    def row(self) -> str:
        """The row the outcome is reported under: ``label``, or the policy's name."""
        return self.label or self.policy

    @property
    def workload_name(self) -> str:
        """The workload's name (its file name without extension)."""
        return self.workload.stem


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What one run measured.

    Attributes:
        policy: the policy's name.
        workload: the workload's name.
        summary: the figures (see :mod:`slurm_amoeba.sim.metrics`).
        jcts: the finished jobs' completion times.
        usage: (time, GPUs held) at every change.
        total_gpus: GPUs in the cluster.
    """

    policy: str
    workload: str
    summary: dict[str, float]
    jcts: list[float]
    usage: list[tuple[float, int]]
    total_gpus: int


def detect_format(path: Path) -> str:
    """``"pollux"`` or ``"philly"``, from the workload's header line.

    Raises:
        SimError: the file is missing or its header is neither format's.
    """
    try:
        with path.open() as handle:
            header = handle.readline()
    except OSError as exc:
        raise SimError(f"cannot read the workload {path}: {exc.strerror}") from None
    columns = {name.strip() for name in header.split(",")}
    if {"application", "num_replicas", "batch_size"} <= columns:
        return "pollux"
    if {"timestamp", "duration", "num_gpus"} <= columns:
        return "philly"
    raise SimError(
        f"{path}: the header {header.strip()!r} is neither a Pollux workload (name,time,application,num_replicas,"
        f"batch_size) nor a Philly trace (timestamp,duration,num_gpus,...)"
    )


def load_jobs(spec: RunSpec) -> list[JobSpec]:
    """The jobs of a run, with elastic ranges applied.

    Raises:
        SimError: unknown format or bad elastic settings.
        ParseError: a malformed workload row.
    """
    kind = detect_format(spec.workload) if spec.trace_format == "auto" else spec.trace_format
    if kind == "philly":
        jobs = load_philly(spec.workload, spec.philly_limit)
    elif kind == "pollux":
        apps = load_applications()
        jobs = load_pollux_workload(spec.workload, apps)
        for job in jobs:
            app = apps[job.application or ""]
            if not app.init_batch <= job.batch_size <= app.max_batch:
                raise ParseError(
                    f"line {job.line}: job {job.name}: batch_size={job.batch_size} lies outside the range the "
                    f"{app.name} traces validate ({app.init_batch}..{app.max_batch}); pick a batch in that range",
                    source=str(spec.workload),
                )
        jobs = mark_adaptive(jobs, spec.adaptive_fraction)
        limits = {
            job.name: apps[job.application].max_replicas(
                apps[job.application].max_batch if job.adaptive else job.batch_size
            )
            for job in jobs
            if job.application
        }
        jobs = make_elastic(jobs, limits, spec.elastic_fraction, spec.elastic_factor, spec.config.total_gpus)
        jobs = widen_adaptive(jobs, limits, spec.elastic_fraction, spec.config.total_gpus)
    else:
        raise SimError(f"trace format {kind!r} is unknown; use pollux, philly or auto")
    if not jobs:
        raise SimError(f"{spec.workload}: the workload holds no job (only a header line); add jobs or leave it out")
    return jobs


def run_one(spec: RunSpec) -> RunOutcome:
    """Run one simulation.

    Args:
        spec: what to run.

    Returns:
        Its outcome.

    Raises:
        PolicyError: unknown policy or knob, or a broken invariant.
        SimError: a job too big for the cluster, an unknown application, ...
    """
    try:
        policy = make_policy(spec.policy, **dict(spec.knobs))
        jobs = load_jobs(spec)
        apps = load_applications() if any(job.application for job in jobs) else {}
        colocation = load_colocation() if apps else {}
        models = trace_models(apps, spec.config.gpus_per_node)
        if any(job.adaptive for job in jobs):
            models = adaptive_models(apps, spec.config.gpus_per_node, models)
        sim = Simulator(jobs, policy, spec.config, models, colocation)
        result = sim.run()
    except AmoebaError as exc:
        if str(spec.workload) in str(exc):
            raise
        raise SimError(f"{spec.workload} under policy {spec.row}: {exc}") from None
    return RunOutcome(
        policy=spec.row,
        workload=spec.workload_name,
        summary=result.summary(),
        jcts=result.jcts(),
        usage=result.usage,
        total_gpus=result.total_gpus,
    )


def run_many(
    specs: Sequence[RunSpec],
    processes: int | None = None,
    progress: Callable[[int, int, RunOutcome | str], None] | None = None,
) -> list[RunOutcome]:
    """Run several simulations, in parallel processes when there is more than one CPU; the first failure stops all.

    Args:
        specs: the runs.
        processes: worker processes (default: the CPUs available, at most the number of runs).
        progress: called after each run with (runs done, runs in all, the outcome).

    Returns:
        The outcomes, in the order of ``specs``.

    Raises:
        SimError: the first failed run, naming its workload file.
    """
    outcomes, _ = run_all(specs, processes, progress, keep_going=False)
    return outcomes


def run_all(
    specs: Sequence[RunSpec],
    processes: int | None = None,
    progress: Callable[[int, int, RunOutcome | str], None] | None = None,
    keep_going: bool = False,
) -> tuple[list[RunOutcome], list[str]]:
    """Run several simulations, in parallel processes when there is more than one CPU.

    Args:
        specs: the runs.
        processes: worker processes (default: the CPUs available, at most the number of runs).
        progress: called after each run with (runs done, runs in all, the outcome or the failure's message).
        keep_going: a run that fails on its input (a bad workload file, a job too big...) is reported and the
            others go on; without it the first such failure stops everything.

    Returns:
        The outcomes of the runs that succeeded, in the order of ``specs``, and one message per failed run (each
        names its workload file and policy).

    Raises:
        SimError: (without ``keep_going``) the first failed run, naming its workload file.
    """
    count = processes or min(len(specs), len(os.sched_getaffinity(0)))
    outcomes: list[RunOutcome | str | None] = [None] * len(specs)
    items = [(index, spec, keep_going) for index, spec in enumerate(specs)]
    if count <= 1 or len(specs) <= 1:
        for index, spec, going in items:
            outcomes[index] = _indexed_run((index, spec, going))[1]
            if progress is not None:
                progress(index + 1, len(specs), outcomes[index] or "")
    else:
        context = multiprocessing.get_context("fork")
        with context.Pool(count) as pool:
            for done, (index, outcome) in enumerate(pool.imap_unordered(_indexed_run, items), start=1):
                outcomes[index] = outcome
                if progress is not None:
                    progress(done, len(specs), outcome)
    succeeded = [outcome for outcome in outcomes if isinstance(outcome, RunOutcome)]
    return succeeded, [outcome for outcome in outcomes if isinstance(outcome, str)]


def _indexed_run(item: tuple[int, RunSpec, bool]) -> tuple[int, RunOutcome | str]:
    index, spec, keep_going = item
    try:
        return index, run_one(spec)
    except AmoebaError as exc:
        if not keep_going:
            # A plain SimError with the whole message crosses the process boundary intact.
            raise SimError(str(exc)) from None
        return index, str(exc)
