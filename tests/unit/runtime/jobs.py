"""Helpers for the runtime tests that launch real local jobs of ``toy_train.py`` (not a test module).

A :class:`ToyJob` wraps a :class:`~slurm_amoeba.local.LocalJob` of the toy trainer with its hold mechanism, and
:func:`applied_ledger` rebuilds which worker applied which samples in the final timeline of a run.
"""

from __future__ import annotations

import collections
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from slurm_amoeba.local import LocalJob, LocalJobResult
from slurm_amoeba.runtime import CoordinatorView, Phase
from slurm_amoeba.runtime.membership import GenerationRecord

TOY = Path(__file__).with_name("toy_train.py")
DEADLINE_S = 90.0
NEVER = 10**9


def toy_command(out: Path, extra_args: list[str], *, hold: bool) -> list[str]:
    """The worker command of the toy trainer."""
    return [sys.executable, str(TOY), "--out", str(out), *extra_args, *(["--hold"] if hold else [])]


class ToyJob:
    """A local job of the toy trainer that a test steers step by step."""

    def __init__(
        self,
        out: Path,
        *,
        workers: int,
        hold: bool,
        extra_args: list[str] | None = None,
        env: dict[str, str] | None = None,
        cuda_devices: list[int] | None = None,
        collective_timeout_s: float = 20,
        heartbeat_timeout_s: float = 15,
    ) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        command = toy_command(out, extra_args or [], hold=hold)
        self.job = LocalJob(
            command,
            initial_workers=workers,
            job_id="toy",
            env={"AMOEBA_DEVICE": "cpu", **(env or {})},  # "auto" would put every worker on a GPU if one is there
            cuda_devices=cuda_devices,
            log_dir=out / "logs",
            collective_timeout_s=collective_timeout_s,
            report_timeout_s=10,
            heartbeat_timeout_s=heartbeat_timeout_s,
            poll_s=0.01,
        )
        self.hold = hold

    def __enter__(self) -> ToyJob:
        self.job.start_coordinator()
        if self.hold:  # before any worker reads it
            self.job.coordinator.store.set("test/release", "0")
        self.job.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.job.close()

    def release(self, step: int) -> None:
        """Let the job run up to (not including) step ``step``."""
        self.job.coordinator.store.set("test/release", str(step))

    def wait_held(self, step: int) -> None:
        """Wait until the job is held before step ``step``."""
        deadline = time.monotonic() + DEADLINE_S
        store = self.job.coordinator.store
        while not (store.check(["test/held"]) and int(store.get("test/held")) == step):
            if time.monotonic() > deadline:
                raise AssertionError(f"the job never held at step {step}; logs in {self.job.log_dir}")
            time.sleep(0.02)

    def wait_ready(self, workers: list[str]) -> None:
        """Wait until the given workers are warm (waiting for admission, or already admitted)."""
        self.job.wait_for(
            lambda v: all(
                v.workers.get(w) is not None and v.workers[w].status.value in ("ready", "member") for w in workers
            ),
            DEADLINE_S,
            f"workers {workers} to be ready",
        )

    def wait_members(self, count: int) -> CoordinatorView:
        """Wait for a running generation of ``count`` members."""
        return self.job.wait_for(
            lambda v: v.phase is Phase.RUNNING and v.world_size == count, DEADLINE_S, f"{count} members"
        )

    def finish(self) -> LocalJobResult:
        """Release every hold and wait for the end."""
        if self.hold:
            self.release(NEVER)
        return self.job.wait(DEADLINE_S)


@dataclass(frozen=True)
class LedgerEntry:
    """One applied step of one worker, from its ledger file."""

    worker: str
    generation: int
    step: int
    epoch: int
    step_samples: int
    micro: list[int]
    indices: list[int]
    rank: int
    world_size: int
    torchrun: list[str]


def read_ledgers(out: Path) -> list[LedgerEntry]:
    """Every ledger line of every worker of a run."""
    entries = []
    for path in sorted(out.glob("ledger-*.jsonl")):
        worker = path.stem.removeprefix("ledger-")
        for line in path.read_text().splitlines():
            data = json.loads(line)
            entries.append(
                LedgerEntry(
                    worker=worker,
                    generation=data["generation"],
                    step=data["step"],
                    epoch=data["epoch"],
                    step_samples=data["step_samples"],
                    micro=data["micro"],
                    indices=data["indices"],
                    rank=data["rank"],
                    world_size=data["world_size"],
                    torchrun=data["torchrun"],
                )
            )
    return entries


def applied_ledger(entries: list[LedgerEntry], history: tuple[GenerationRecord, ...]) -> list[LedgerEntry]:
    """The entries of the final timeline: when generation g starts at step t, earlier work from step t on is undone.

    A rollback therefore discards the rolled-back steps of the failed generation; a step that was rolled back and
    not redone leaves a hole, which the exactly-once check then finds.
    """
    kept: list[LedgerEntry] = []
    by_generation = collections.defaultdict(list)
    for entry in entries:
        by_generation[entry.generation].append(entry)
    for record in history:
        start = record.plan.start_step or 0
        kept = [e for e in kept if e.step < start]
        kept.extend(by_generation.get(record.plan.generation, []))
    return kept


def epoch_counts(entries: list[LedgerEntry]) -> dict[int, collections.Counter[int]]:
    """For each epoch, how many times each sample index was applied."""
    counts: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for entry in entries:
        counts[entry.epoch].update(entry.indices)
    return counts


def final_params(out: Path) -> dict[str, dict[str, torch.Tensor]]:
    """The parameters each finishing worker saved, by worker."""
    params = {}
    for path in sorted(out.glob("params-*.pt")):
        params[path.stem.removeprefix("params-")] = torch.load(path, weights_only=True)
    return params
