"""A seeded chaos run of the toy job (not a test module): random grows, shrinks and signals, then the verdict.

:func:`chaos_run` starts a local job of ``toy_train.py``, applies a seeded random sequence of operations to it while
it trains (add workers, graceful leave, SIGTERM, SIGKILL, SIGKILL at a switch or while the state goes to a joiner,
SIGSTOP/SIGCONT), waits for the end within a deadline and returns a :class:`ChaosOutcome`:

* ``finished``: every sample applied exactly once per epoch (per-sample ledger, over the final timeline) and every
  finisher's parameters equal to the fixed-size run's (float64, to rounding); otherwise ``ledger`` or ``params``;
* ``lost``: the job was lost and every worker that held the state had been killed or frozen by the run (the
  documented loss: the runtime keeps no disk checkpoint); ``lost-leaving``: the same, where some of those holders
  were leaving gracefully (docs: "if every worker holding the state leaves or dies at once" -- a leaver does not
  yet hand the state to warm joiners first); a loss without either is ``unexpected-loss``;
* ``hang``: the job did not end within the deadline; ``no-start``: no first generation ever formed.

Used by ``tests/unit/runtime/test_chaos.py`` (a few seeds) and ``scripts/chaos-runtime`` (hundreds).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch

from slurm_amoeba.local import LocalJob
from slurm_amoeba.runtime import CoordinatorView, Phase
from slurm_amoeba.runtime.errors import RuntimeConfigError, RuntimeTimeout
from tests.unit.runtime.jobs import LedgerEntry, applied_ledger, epoch_counts, toy_command

EPOCHS = 6
DATASET = 100
GLOBAL_BATCH = 12
STEPS = EPOCHS * -(-DATASET // GLOBAL_BATCH)
# 1024 hidden units: the first layer's weight and its momentum (64 KiB each in float64) go to joiners as they are,
# not copied (runtime/transfer.py, DIRECT_BYTES), so the chaos runs cover both kinds of message; a learning rate
# scaled down with the width keeps the fixed-size run from diverging.
TOY_ARGS = [
    *("--epochs", str(EPOCHS), "--dataset-size", str(DATASET), "--global-batch", str(GLOBAL_BATCH)),
    *("--hidden", "1024", "--lr", "0.001"),
]
STEP_DELAY_S = 0.04  # makes the run last long enough for joiners to warm up; does not change the parameters
END_DEADLINE_S = 75.0  # after the last operation; beyond it the run counts as a hang
OPERATIONS = ("add", "add2", "remove", "term", "kill", "kill_at_switch", "kill_in_transfer", "stop_short", "stop_long")
TIMEOUT_S = 3.0  # collective, heartbeat and report deadlines of the chaos job


@dataclasses.dataclass
class ChaosOutcome:
    """How one chaos run ended.

    Attributes:
        seed: its seed.
        outcome: ``finished``, ``lost``, ``lost-leaving``, ``hang``, ``no-start``, ``ledger``, ``params`` or
            ``unexpected-loss``.
        operations: what was done, in order (``op:worker``).
        sizes: world size of each generation.
        seconds: wall time of the run.
        detail: what went wrong, for the failing outcomes.
    """

    seed: int
    outcome: str
    operations: list[str]
    sizes: list[int]
    seconds: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        """Finished correctly, or lost in the documented way."""
        return self.outcome in ("finished", "lost", "lost-leaving")


def reference_command(out: Path) -> list[str]:
    """The toy command of the fixed-size reference run that chaos runs are compared with."""
    return toy_command(out, TOY_ARGS, hold=False)


def run_reference(out: Path) -> dict[str, torch.Tensor]:
    """Run the toy job at a fixed size of 2 and return its final parameters."""
    with _job(out, reference_command(out), workers=2) as job:
        result = job.wait(120)
    if result.phase is not Phase.FINISHED:
        raise AssertionError(f"the fixed-size reference run ended {result.phase.value}; logs in {job.log_dir}")
    return _params(out)["w0"]


def _job(out: Path, command: list[str], workers: int) -> LocalJob:
    out.mkdir(parents=True, exist_ok=True)
    return LocalJob(
        command,
        initial_workers=workers,
        job_id="chaos",
        log_dir=out / "logs",
        collective_timeout_s=TIMEOUT_S,
        report_timeout_s=TIMEOUT_S,
        heartbeat_timeout_s=TIMEOUT_S,
        poll_s=0.01,
    )


def _params(out: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {p.stem.removeprefix("params-"): torch.load(p, weights_only=True) for p in sorted(out.glob("params-*.pt"))}


class _Chaos:
    """The operations of one run on a live job, and what they did to the state's holders."""

    def __init__(self, job: LocalJob, rng: random.Random) -> None:
        self.job = job
        self.rng = rng
        self.done: list[str] = []
        self.downed: set[str] = set()  # killed, or frozen past the deadlines
        self.leaving: set[str] = set()  # asked to leave (coordinator or SIGTERM)

    def members(self) -> list[str]:
        view = self.job.view()
        return [] if view.plan is None else [w for w in view.plan.members if w not in self.downed]

    def apply(self, op: str) -> None:
        members = self.members()
        if not members or self.job.view().phase.is_over():
            return
        victim = self.rng.choice(members)
        if op in ("add", "add2"):
            self.job.add(2 if op == "add2" else 1)
        elif op == "remove":
            try:
                self.job.remove(victim)
                self.leaving.add(victim)
            except RuntimeConfigError:  # the last member: refused, as documented
                op = "remove-refused"
        elif op == "term":
            self.leaving.add(victim)
            self.job.terminate(victim)
        elif op == "kill":
            self._down(victim, self.job.kill)
        elif op in ("kill_at_switch", "kill_in_transfer"):
            victim = self._kill_around_switch(op)
        elif op == "stop_short":
            self.job.pause(victim)
            time.sleep(self.rng.uniform(0.05, 0.5))
            self.job.resume(victim)
        elif op == "stop_long":  # past the heartbeat deadline: declared dead and fenced
            self._down(victim, self.job.pause)
        self.done.append(f"{op}:{victim}")

    def _down(self, worker: str, action: Callable[[str], None]) -> None:
        self.downed.add(worker)
        action(worker)

    def _kill_around_switch(self, op: str) -> str:
        """Add a joiner and SIGKILL someone the moment the next generation is planned: a member at the switch, or
        the state's source or the joiner while the state goes over."""
        before = self.job.view().generation
        (joiner,) = self.job.add(1)

        def planned(view: CoordinatorView) -> bool:
            return view.phase.is_over() or (view.generation > before and view.plan is not None)

        try:
            view = self.job.wait_for(planned, 30, "the next generation")
        except RuntimeTimeout:
            return "none (no switch came)"
        if view.plan is None or view.phase.is_over():
            return "none (the job ended first)"
        if op == "kill_at_switch":
            victim = self.rng.choice(list(view.plan.members))
        else:
            victim = self.rng.choice([view.plan.source, joiner])
        self._down(victim, self.job.kill)
        return victim


def chaos_run(seed: int, out: Path, reference: dict[str, torch.Tensor], operations: int = 3) -> ChaosOutcome:
    """One seeded chaos run of the toy job in ``out`` (see the module docstring)."""
    rng = random.Random(seed)
    started = time.monotonic()
    command = toy_command(out, [*TOY_ARGS, "--step-delay", str(STEP_DELAY_S)], hold=True)
    ops = [rng.choice(OPERATIONS) for _ in range(operations)]
    job = _job(out, command, workers=rng.choice([1, 2, 3]))
    job.start_coordinator()
    # The job may not run past a random step until the operations are done (a pending switch still proceeds),
    # so that joiners warm up in time and operations land mid-step as well as at a held step boundary.
    release = rng.randint(3, STEPS // 3)
    job.coordinator.store.set("test/release", str(release))
    with job:
        chaos = _Chaos(job, rng)
        try:
            job.wait_for(lambda v: v.phase is not Phase.STARTING, 60, "the first generation")
            for op in ops:
                time.sleep(rng.uniform(0.0, 1.0))
                chaos.apply(op)
                release += rng.randint(1, 8)
                job.coordinator.store.set("test/release", str(release))
            job.coordinator.store.set("test/release", str(10**9))
            result = job.wait(END_DEADLINE_S)
        except RuntimeTimeout as exc:
            view = job.view()
            sizes = [r.plan.world_size for r in view.history]
            return ChaosOutcome(seed, "hang", chaos.done, sizes, time.monotonic() - started, str(exc))
    view = result.view
    sizes = [r.plan.world_size for r in view.history]
    verdict = ChaosOutcome(seed, "finished", chaos.done, sizes, time.monotonic() - started)
    if not view.history:  # the workers never formed a first generation (e.g. the script fails at start)
        verdict.outcome, verdict.detail = "no-start", view.lost_reason
        return verdict
    if result.phase is Phase.LOST:
        holders = _holders(view)
        if holders <= chaos.downed:
            verdict.outcome = "lost"
        else:
            verdict.outcome = "lost-leaving" if holders <= chaos.downed | chaos.leaving else "unexpected-loss"
        verdict.detail = (
            f"{view.lost_reason}; state holders {sorted(holders)}, downed {sorted(chaos.downed)}, "
            f"leaving {sorted(chaos.leaving)}"
        )
        return verdict
    problem = ledger_problem(out, view)
    if problem:
        verdict.outcome, verdict.detail = "ledger", problem
        return verdict
    problem = params_problem(_params(out), reference, view)
    if problem:
        verdict.outcome, verdict.detail = "params", problem
    return verdict


def _holders(view: CoordinatorView) -> set[str]:
    """The workers that held the state when the job was lost: the last plan's members other than its joiners."""
    if view.plan is None:
        return set()
    return set(view.plan.members) - set(view.plan.joiners) or set(view.plan.members)


def _read_ledgers(out: Path) -> list[LedgerEntry]:
    """Every complete ledger line (a SIGKILL may cut a worker's last line short)."""
    entries = []
    for path in sorted(out.glob("ledger-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            entries.append(LedgerEntry(worker=path.stem.removeprefix("ledger-"), **data))
    return entries


def ledger_problem(out: Path, view: CoordinatorView) -> str:
    """What breaks exactly-once in a finished run's final timeline, or empty."""
    entries = applied_ledger(_read_ledgers(out), view.history)
    counts = epoch_counts(entries)
    if sorted(counts) != list(range(EPOCHS)):
        return f"epochs applied: {sorted(counts)}"
    for epoch, counter in counts.items():
        missing = sorted(set(range(DATASET)) - set(counter))
        twice = sorted(i for i, n in counter.items() if n > 1)
        if missing or twice:
            return f"epoch {epoch}: samples missing {missing[:10]}, applied twice {twice[:10]}"
    per_step: collections.Counter[int] = collections.Counter()
    for entry in entries:
        per_step[entry.step] += len(entry.indices)
    if sorted(per_step) != list(range(STEPS)):
        return f"steps applied: {sorted(per_step)}"
    return ""


def params_problem(
    params: dict[str, dict[str, torch.Tensor]], reference: dict[str, torch.Tensor], view: CoordinatorView
) -> str:
    """How the finishers' parameters differ from the fixed-size run's, or empty."""
    if len(params) != view.world_size:
        return f"{len(params)} workers saved parameters, the last generation had {view.world_size}"
    for worker, tensors in params.items():
        for name, tensor in reference.items():
            diff = (tensors[name] - tensor).abs().max().item()
            if not diff <= 1e-9:  # NaN (a diverged run) counts as a difference
                return f"{worker} {name}: max abs difference {diff:.3g} from the fixed-size run"
    return ""
