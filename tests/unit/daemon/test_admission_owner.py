"""Admission held by the jobs' owners (``admission.holds_by: owner``, the default): the daemon's holds and releases
become verdicts that each job's guard applies as the job's user, and the daemon sees those holds as its own (a
Slurm that lives in memory; the guard is :class:`~slurm_amoeba.launcher.guard.AdmissionGuard` itself)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from slurm_amoeba.daemon.admission import Admitter, OwnerHolds
from slurm_amoeba.daemon.config import Admission
from slurm_amoeba.daemon.metrics import DaemonMetrics
from slurm_amoeba.launcher.guard import AdmissionGuard
from slurm_amoeba.slurm import JobRecord
from slurm_amoeba.slurm.marks import parse_hold_mark
from tests.unit.daemon.test_admission import MemorySlurm, RoundOfAdmission, cluster, elastic_job


@dataclasses.dataclass
class OwnerSlurm:
    """The job's user's view of the same Slurm: an owner's hold is ``JobHeldUser``."""

    slurm: MemorySlurm

    def jobs(self, *, job_ids: Collection[int] | None = None) -> list[JobRecord]:
        return [r for r in self.slurm.records.values() if job_ids is None or r.job_id in job_ids]

    def hold(self, job_id: int) -> None:
        self.slurm.hold(job_id)
        record = self.slurm.records[job_id]
        self.slurm.records[job_id] = dataclasses.replace(record, state_reason="JobHeldUser")

    def release(self, job_id: int) -> None:
        self.slurm.release(job_id)


def owners_round(slurm: MemorySlurm) -> RoundOfAdmission:
    daemon = RoundOfAdmission(slurm, Admission())
    daemon.admitter = Admitter(Admission(), OwnerHolds(), DaemonMetrics(), restore_priority=False)
    return daemon


def test_the_guard_holds_at_the_daemons_word_and_releases_when_the_requested_size_is_free() -> None:
    slurm = MemorySlurm({7: elastic_job()}, cluster(used=12))
    daemon = owners_round(slurm)
    guard = AdmissionGuard(7, OwnerSlurm(slurm), daemon.admitter.verdict, clock=lambda: 0.0)
    first = daemon.apply(daemon.admitter.overlay(slurm.view()), 2_000.0)
    assert first.held == ("7",) and daemon.admitter.verdict("7") == "hold"
    assert slurm.calls == []  # the daemon itself runs no Slurm command
    assert guard.step() and guard.held and slurm.records[7].state_reason == "JobHeldUser"
    # The next round sees the owner's hold as the daemon's, with its mark (since when, what it waits for).
    view = daemon.admitter.overlay(slurm.view())
    mark = parse_hold_mark(next(r for r in view.jobs if r.job_id == 7).admin_comment)
    assert mark is not None and mark.since == 2000 and mark.gpus == 8
    second = daemon.apply(view, 2_010.0)
    assert second.held == () and [held.job_id for held in second.waiting] == ["7"]
    assert guard.step() and guard.held  # still waiting
    slurm.nodes = cluster(used=0)
    third = daemon.apply(daemon.admitter.overlay(slurm.view()), 2_020.0)
    assert third.released == ("7",) and daemon.admitter.verdict("7") == "release"
    assert guard.step() and not guard.held and slurm.records[7].state_reason == "None"
    assert [call[0] for call in slurm.calls] == ["hold", "release"]  # both by the owner's guard


def test_a_hold_its_guard_has_not_made_yet_is_ordered_again_or_dropped_when_the_job_fits_meanwhile() -> None:
    slurm = MemorySlurm({7: elastic_job()}, cluster(used=12))
    daemon = owners_round(slurm)
    daemon.apply(daemon.admitter.overlay(slurm.view()), 2_000.0)
    assert daemon.apply(daemon.admitter.overlay(slurm.view()), 2_010.0).held == ("7",)  # no guard yet: ordered again
    slurm.nodes = cluster(used=0)
    daemon.apply(daemon.admitter.overlay(slurm.view()), 2_020.0)
    assert daemon.admitter.verdict("7") == "none"  # fits now: a guard that comes late does not hold it
    guard = AdmissionGuard(7, OwnerSlurm(slurm), daemon.admitter.verdict, clock=lambda: 0.0)
    assert guard.step() and not guard.held and slurm.calls == []


def test_the_daemon_stopping_leaves_no_hold_behind_its_guard_releases_after_the_silence() -> None:
    slurm = MemorySlurm({7: elastic_job()}, cluster(used=12))
    daemon = owners_round(slurm)
    daemon.apply(daemon.admitter.overlay(slurm.view()), 2_000.0)
    now = [0.0]
    answers: list[str | None] = [daemon.admitter.verdict("7")]
    guard = AdmissionGuard(7, OwnerSlurm(slurm), lambda job: answers[-1], clock=lambda: now[0], silence_s=60.0)
    assert guard.step() and guard.held
    daemon.admitter.release_all()  # the stop: nobody answers from now on
    answers.append(None)
    now[0] = 30.0
    assert guard.step() and guard.held  # a daemon restarting within the silence keeps its holds
    now[0] = 61.0
    assert guard.step() and not guard.held and slurm.records[7].state_reason == "None"


def test_a_job_whose_release_its_guard_has_not_applied_yet_keeps_its_gpus_from_the_jobs_behind_it() -> None:
    slurm = MemorySlurm({7: elastic_job(), 8: elastic_job(8, submit_time=1_001)}, cluster(used=12))
    slurm.records[8] = dataclasses.replace(slurm.records[8], comment="amoeba-elastic=2:16")
    daemon = owners_round(slurm)
    guards = {job: AdmissionGuard(job, OwnerSlurm(slurm), daemon.admitter.verdict, clock=lambda: 0.0) for job in (7, 8)}
    daemon.apply(daemon.admitter.overlay(slurm.view()), 2_000.0)
    assert all(guard.step() and guard.held for guard in guards.values())
    slurm.nodes = cluster(used=0)
    assert daemon.apply(daemon.admitter.overlay(slurm.view()), 2_010.0).released == ("7",)
    # Job 7's guard has not released it yet: its 8 GPUs are not free for job 8 (16 would never fit beside it).
    again = daemon.apply(daemon.admitter.overlay(slurm.view()), 2_011.0)
    assert "8" not in again.released and daemon.admitter.verdict("8") == "hold"
    assert daemon.admitter.verdict("7") == "release"
    # Its guard releases it: Slurm gives it a lower priority (priority/basic), which must not put job 8 ahead of it.
    assert guards[7].step() and not guards[7].held and 0 < slurm.records[7].priority < 500
    after = daemon.apply(daemon.admitter.overlay(slurm.view()), 2_012.0)
    assert after.held == () and after.released == () and daemon.admitter.verdict("8") == "hold"
