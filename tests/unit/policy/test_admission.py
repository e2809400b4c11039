"""Admission at the requested size (policy/admission.py): hold, release, the starvation bound, reservations."""

from __future__ import annotations

import pytest

from slurm_amoeba.policy.admission import (
    Action,
    AdmissionSettings,
    Running,
    Standing,
    Verdict,
    Waiting,
    admit,
    slurm_order,
)

NOW = 1000.0


def elastic(
    job_id: str,
    minimum: int,
    request: int,
    *,
    limit: float | None = 600.0,
    priority: int = 100,
    held_since: float | None = None,
    submit: float = 0.0,
) -> Waiting:
    standing = Standing.HELD if held_since is not None else Standing.NEW
    return Waiting(job_id, minimum, request, limit, priority, submit, standing, held_since)


def rigid(job_id: str, gpus: int, *, limit: float | None = 600.0, priority: int = 100, submit: float = 0.0) -> Waiting:
    return Waiting(job_id, gpus, gpus, limit, priority, submit)


def actions(verdicts: list[Verdict]) -> dict[str, Action]:
    return {v.job_id: v.action for v in verdicts}


@pytest.mark.parametrize(
    ("free", "lendable", "running", "queue", "expected"),
    [
        # 8 requested, 4 free: held (Slurm alone would start it at its minimum of 2)
        (4, 0, [], [elastic("1", 2, 8)], {"1": Action.HOLD}),
        # 8 free: admitted, never held
        (8, 0, [], [elastic("1", 2, 8)], {"1": Action.ADMIT}),
        # 4 free and 4 lent to satellites: the daemon takes the loans back
        (4, 4, [], [elastic("1", 2, 8)], {"1": Action.ADMIT}),
        # held, and now free: released
        (8, 0, [], [elastic("1", 2, 8, held_since=NOW - 5)], {"1": Action.RELEASE}),
        # held and still not free: keeps waiting
        (4, 0, [], [elastic("1", 2, 8, held_since=NOW - 5)], {"1": Action.WAIT}),
        # held past the bound: released anyway (starts at its minimum)
        (4, 0, [], [elastic("1", 2, 8, held_since=NOW - 60)], {"1": Action.STARVED}),
        # two elastic jobs and 8 free: the first in Slurm's order gets them, the second is held
        (
            8,
            0,
            [],
            [elastic("1", 2, 8, priority=200), elastic("2", 2, 8, priority=100)],
            {"1": Action.ADMIT, "2": Action.HOLD},
        ),
        # a rigid job ahead in the queue that starts now takes its GPUs first
        (8, 0, [], [rigid("r", 4, priority=300), elastic("1", 2, 8)], {"1": Action.HOLD}),
        # a rigid job behind it does not
        (8, 0, [], [rigid("r", 4, priority=1), elastic("1", 2, 8, priority=100)], {"1": Action.ADMIT}),
    ],
)
def test_admission_table(
    free: int, lendable: int, running: list[Running], queue: list[Waiting], expected: dict[str, Action]
) -> None:
    verdicts = admit(NOW, free, lendable, running, queue, AdmissionSettings(max_hold_s=30.0))
    assert actions(verdicts) == expected


def test_a_release_that_would_delay_a_rigid_jobs_reservation_is_not_made() -> None:
    # 16 GPUs: 8 free now, 8 busy until NOW+100. A rigid 16-GPU job ahead holds a reservation at NOW+100.
    busy = [Running(8, NOW + 100)]
    queue = [rigid("r", 16, priority=300), elastic("1", 2, 8, limit=600.0, held_since=NOW - 5)]
    assert actions(admit(NOW, 8, 0, busy, queue, AdmissionSettings())) == {"1": Action.WAIT}
    # A job short enough to end before the reservation is released.
    queue = [rigid("r", 16, priority=300), elastic("1", 2, 8, limit=60.0, held_since=NOW - 5)]
    assert actions(admit(NOW, 8, 0, busy, queue, AdmissionSettings())) == {"1": Action.RELEASE}


def test_an_unlimited_job_never_fits_before_a_reservation() -> None:
    busy = [Running(8, NOW + 100)]
    queue = [rigid("r", 16, priority=300), elastic("1", 2, 8, limit=None, held_since=NOW - 5)]
    assert actions(admit(NOW, 8, 0, busy, queue, AdmissionSettings())) == {"1": Action.WAIT}


def test_held_jobs_hold_no_reservation_and_admitted_ones_are_never_held_again() -> None:
    # The held job (first in order) wants 16; the second one fits now and is admitted: the held one reserves nothing.
    queue = [elastic("1", 2, 16, priority=300, held_since=NOW - 1), elastic("2", 2, 4, priority=100)]
    assert actions(admit(NOW, 8, 0, [], queue, AdmissionSettings())) == {"1": Action.WAIT, "2": Action.ADMIT}
    # An admitted job still pending is an ordinary job of its minimum: no verdict, but it takes its GPUs.
    admitted = Waiting("3", 2, 8, 600.0, 400, 0.0, Standing.ADMITTED)
    queue = [admitted, elastic("4", 2, 8, priority=100)]
    assert actions(admit(NOW, 8, 0, [], queue, AdmissionSettings())) == {"4": Action.HOLD}


def test_a_starved_job_takes_its_minimum_in_the_profile() -> None:
    # Job 1 starved (starts at 2 of the 8 free); job 2 asks 8 and now finds 6: held.
    queue = [elastic("1", 2, 16, priority=300, held_since=NOW - 100), elastic("2", 2, 8, priority=100)]
    verdicts = admit(NOW, 8, 0, [], queue, AdmissionSettings(max_hold_s=50.0))
    assert actions(verdicts) == {"1": Action.STARVED, "2": Action.HOLD}
    assert "max_hold_s" in verdicts[0].reason
    assert verdicts[1].available == 6


def test_running_jobs_free_their_gpus_at_their_limit_and_a_job_ending_before_it_needs_them_is_released() -> None:
    busy = [Running(8, NOW + 50)]
    assert actions(admit(NOW, 0, 0, busy, [elastic("1", 2, 8, held_since=NOW - 1)], AdmissionSettings())) == {
        "1": Action.WAIT
    }
    # 8 free now, 8 more at NOW+50 for the rigid 16-GPU job ahead: a 40 s job ends before its reservation.
    queue = [rigid("r", 16, priority=300), elastic("1", 2, 8, limit=40.0, held_since=NOW - 1)]
    assert actions(admit(NOW, 8, 0, busy, queue, AdmissionSettings())) == {"1": Action.RELEASE}


def test_slurm_order_is_priority_then_submit_then_id() -> None:
    queue = [rigid("10", 1, priority=5, submit=3), rigid("9", 1, priority=5, submit=3), rigid("1", 1, priority=9)]
    assert [job.job_id for job in slurm_order(queue)] == ["1", "9", "10"]


def test_max_jobs_bounds_the_walk() -> None:
    queue = [elastic(str(i), 1, 99, priority=100 - i) for i in range(5)]
    assert len(admit(NOW, 4, 0, [], queue, AdmissionSettings(max_jobs=3))) == 3
