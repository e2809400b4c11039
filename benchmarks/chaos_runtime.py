"""``scripts/chaos-runtime``: hundreds of seeded chaos runs of the elastic runtime, a table of outcomes, JSON.

Each seed is one run of ``tests/unit/runtime/chaos.py``'s :func:`chaos_run` (the toy job, random grows, shrinks,
SIGTERM, SIGKILL at any time, at a switch and during state transfer, SIGSTOP/SIGCONT) against one fixed-size
reference run. ``make test`` runs three seeds (``tests/unit/runtime/test_chaos.py``); this is the long version a
maintainer runs, e.g. ``scripts/chaos-runtime --seeds 0:300 --json chaos.json`` or with ``--budget-s 600``.
A failing seed is re-run alone with ``--seeds N:N+1 --keep DIR`` (worker logs under ``DIR/seed-N/job/logs``).
Exit status 1 when any run hung, broke exactly-once, ended with other parameters or was lost unexpectedly.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.unit.runtime.chaos import ChaosOutcome, chaos_run, run_reference


def _seed_range(text: str) -> range:
    try:
        first, _, last = text.partition(":")
        return range(int(first), int(last))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: expected FIRST:END, e.g. 0:300") from None


def format_table(outcomes: list[ChaosOutcome]) -> str:
    """Outcome counts, then one line per run that did not end well."""
    counts = collections.Counter(o.outcome for o in outcomes)
    seconds = sorted(o.seconds for o in outcomes)
    lines = [f"{'outcome':<16} {'runs':>5}"]
    lines += [f"{name:<16} {count:>5}" for name, count in counts.most_common()]
    if seconds:
        lines.append(
            f"{len(outcomes)} runs; seconds per run: median {seconds[len(seconds) // 2]:.1f}, max {seconds[-1]:.1f}"
        )
    lines += [
        f"seed {o.seed}: {o.outcome} after {o.operations} sizes {o.sizes}: {o.detail}" for o in outcomes if not o.ok
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the seeds (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=_seed_range, default=range(0, 300), help="FIRST:END (default 0:300)")
    parser.add_argument("--budget-s", type=float, default=0.0, help="start no new run after this many seconds")
    parser.add_argument("--operations", type=int, default=3, help="chaos operations per run (default 3)")
    parser.add_argument("--json", type=Path, help="write every outcome here")
    parser.add_argument("--keep", type=Path, help="keep every run's directory (logs, ledgers) under this one")
    args = parser.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="amoeba-chaos-"))
    started = time.monotonic()
    reference = run_reference(work / "fixed")
    outcomes: list[ChaosOutcome] = []
    for seed in args.seeds:
        if args.budget_s and time.monotonic() - started > args.budget_s:
            break
        out = work / f"seed-{seed}"
        outcome = chaos_run(seed, out / "job", reference, operations=args.operations)
        outcomes.append(outcome)
        print(
            f"seed {seed}: {outcome.outcome} {outcome.operations} sizes {outcome.sizes} {outcome.seconds:.1f} s",
            flush=True,
        )
        if outcome.ok and args.keep is None:
            shutil.rmtree(out, ignore_errors=True)
    print(format_table(outcomes))
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(o) for o in outcomes], indent=1))
    if args.keep is None and all(o.ok for o in outcomes):
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
