"""The admission guard applies the daemon's verdicts on its own job and nothing else: it holds once, releases only
the hold it made, leaves its user's own hold alone, lets go when the daemon falls silent, and ends when the job leaves
the queue (a Slurm in memory, verdicts from a list)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from slurm_amoeba.launcher.guard import AdmissionGuard, guard_argv, start_guard
from slurm_amoeba.slurm import JobRecord, JobState, SlurmCommandError
from tests.unit.daemon.fakes import job


@dataclasses.dataclass
class OwnSlurm:
    record: JobRecord
    calls: list[str] = dataclasses.field(default_factory=list)
    down: bool = False

    def jobs(self, *, job_ids: Collection[int] | None = None) -> list[JobRecord]:
        if self.down:
            raise SlurmCommandError(["squeue"], 1, "Socket timed out")
        return [self.record]

    def hold(self, job_id: int) -> None:
        self.calls.append(f"hold {job_id}")
        self.record = dataclasses.replace(self.record, priority=0, state_reason="JobHeldUser")

    def release(self, job_id: int) -> None:
        self.calls.append(f"release {job_id}")
        self.record = dataclasses.replace(self.record, priority=1, state_reason="None")


def guard_of(verdicts: list[str | None], **record: object) -> tuple[AdmissionGuard, OwnSlurm, list[float]]:
    slurm = OwnSlurm(job(7, state=JobState.PENDING, **record))  # type: ignore[arg-type]
    now = [0.0]
    return AdmissionGuard(7, slurm, lambda job_id: verdicts[0], clock=lambda: now[0], silence_s=60.0), slurm, now


def test_holds_once_and_releases_the_hold_it_made_when_the_verdict_changes() -> None:
    verdicts: list[str | None] = ["hold"]
    guard, slurm, _ = guard_of(verdicts)
    assert guard.step() and guard.step()
    assert slurm.calls == ["hold 7"]
    verdicts[0] = "release"
    assert guard.step() and slurm.calls == ["hold 7", "release 7"] and not guard.held


def test_a_hold_of_the_users_own_is_neither_taken_over_nor_released() -> None:
    verdicts: list[str | None] = ["hold"]
    guard, slurm, _ = guard_of(verdicts, reason="JobHeldUser", priority=0)
    assert guard.step() and not guard.held
    verdicts[0] = "release"
    assert guard.step() and slurm.calls == []


def test_a_silent_daemon_gets_its_hold_back_only_after_the_silence() -> None:
    verdicts: list[str | None] = ["hold"]
    guard, slurm, now = guard_of(verdicts)
    guard.step()
    verdicts[0] = None
    now[0] = 59.0
    assert guard.step() and guard.held
    now[0] = 60.0
    assert guard.step() and not guard.held and slurm.calls == ["hold 7", "release 7"]


def test_ends_when_the_job_leaves_the_queue_and_when_slurm_fails_for_long_with_nothing_to_undo() -> None:
    guard, slurm, now = guard_of(["none"])
    slurm.down = True
    assert guard.step()  # one failed squeue (a busy slurmctld) is no reason to stop guarding
    now[0] = 60.0
    assert not guard.step()  # failing for the silence bound with no hold of its own: nothing to guard
    guard, slurm, _ = guard_of(["hold"])
    guard.step()
    slurm.down = True
    assert guard.step()  # a hold to undo: it keeps trying
    slurm.down = False
    slurm.record = dataclasses.replace(slurm.record, state=JobState.RUNNING)
    assert not guard.step()


def test_no_guard_without_a_daemon_or_when_the_user_switched_it_off() -> None:
    assert not start_guard(7, None, {})
    assert not start_guard(7, "tcp://127.0.0.1:1", {"AMOEBA_ADMISSION_GUARD": "0"})
    argv = guard_argv(7, "tcp://h:6820", "/usr/bin/python3")
    assert argv == ["/usr/bin/python3", "-m", "slurm_amoeba.launcher.guard", "--daemon", "tcp://h:6820", "7"]


def test_a_job_not_listed_yet_right_after_its_submission_is_waited_for() -> None:
    guard, slurm, _ = guard_of(["hold"])
    listed = slurm.record
    slurm.record = dataclasses.replace(listed, job_id=8)  # squeue does not show job 7 yet
    assert guard.step() and not guard.held
    slurm.record = listed
    assert guard.step() and guard.held
