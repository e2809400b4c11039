"""The pure queue ordering: attained service across runs, 2D-LAS order, and the priorities that make Slurm follow it."""

from __future__ import annotations

import dataclasses

import pytest

from slurm_amoeba.policy.actions import SetPriority, Start
from slurm_amoeba.policy.common import las_queue
from slurm_amoeba.policy.fifo import FifoPolicy
from slurm_amoeba.policy.queue_order import (
    DEFAULT_THRESHOLDS_GPU_S,
    MAX_PRIORITY,
    JobService,
    QueueOrderLayer,
    RunSample,
    account,
    las_order,
    las_priorities,
    priority_updates,
)
from slurm_amoeba.policy.types import JobInfo, JobPhase
from tests.unit.policy.helpers import snapshot


def run(job: str, record: str, start: float, gpus: int, running: bool = True) -> RunSample:
    return RunSample(job=job, record=record, running=running, start_time=start, gpus=gpus)


def queued(job_id: str, submit: float, attained: float = 0.0, priority: int = 100, **extra: object) -> JobInfo:
    """A pending job of one GPU."""
    return JobInfo(
        job_id=job_id,
        state=JobPhase.PENDING,
        submit_time=submit,
        requested_workers=1,
        min_workers=1,
        max_workers=1,
        attained_service=attained,
        priority=priority,
        **extra,  # type: ignore[arg-type]
    )


# ---------------------------------------------------------------------------------------------------- accounting


def test_a_running_job_attains_elapsed_time_times_its_gpus() -> None:
    book = account({}, [run("7", "7", start=100.0, gpus=4)], now=130.0)
    assert book["7"].total == pytest.approx(120.0)


def test_an_elastic_job_sums_its_own_records_and_its_satellites() -> None:
    samples = [run("7", "7", 100.0, 2), run("7", "9", 120.0, 1), run("7", "10", 0.0, 1, running=False)]
    assert account({}, samples, now=130.0)["7"].total == pytest.approx(2 * 30 + 1 * 10)


def test_a_requeued_job_keeps_its_service_while_pending_and_adds_its_next_run() -> None:
    book = account({}, [run("7", "7", 100.0, 4)], now=110.0)  # 40
    book = account(book, [run("7", "7", 0.0, 0, running=False)], now=120.0)  # requeued: banked at its last value
    assert book["7"].total == pytest.approx(40.0)
    book = account(book, [run("7", "7", 200.0, 4)], now=205.0)  # runs again: a new start time
    assert book["7"].total == pytest.approx(40.0 + 20.0)
    assert book["7"].banked == pytest.approx(40.0)


def test_a_run_seen_again_with_another_start_time_banks_the_old_run() -> None:
    book = account({}, [run("7", "7", 100.0, 4)], now=110.0)
    book = account(book, [run("7", "7", 150.0, 4)], now=160.0)  # requeued and restarted between two rounds
    assert book["7"].total == pytest.approx(40.0 + 40.0)


def test_a_satellite_that_left_stays_in_its_parents_service() -> None:
    book = account({}, [run("7", "7", 100.0, 1), run("7", "9", 100.0, 3)], now=110.0)
    book = account(book, [run("7", "7", 100.0, 1)], now=120.0)
    assert book["7"].total == pytest.approx(20.0 + 30.0)


def test_jobs_slurm_no_longer_shows_are_dropped_and_the_input_book_is_not_changed() -> None:
    old = {"7": JobService(5.0, {"7": (100.0, 10.0)}), "8": JobService(3.0)}
    new = account(old, [run("8", "8", 0.0, 0, running=False)], now=200.0)
    assert set(new) == {"8"} and new["8"].total == 3.0
    assert old["7"].total == 15.0


# ---------------------------------------------------------------------------------------------------- order


@pytest.mark.parametrize(("attained", "queue"), [(0.0, 0), (99.9, 0), (100.0, 1), (999.0, 1), (1000.0, 2), (1e9, 2)])
def test_the_queue_counts_the_thresholds_reached(attained: float, queue: int) -> None:
    assert las_queue(attained, (100.0, 1000.0)) == queue


def test_the_default_threshold_is_tiresias_16_gpu_hours() -> None:
    assert DEFAULT_THRESHOLDS_GPU_S == (57600.0,)


def test_las_order_is_queue_then_submit_time_then_job_id() -> None:
    jobs = [
        queued("1", submit=10.0, attained=500.0),  # old but served a lot: second queue
        queued("12", submit=30.0),
        queued("3", submit=20.0),
        queued("11", submit=30.0),  # same submit time as 12: by id, numerically
        queued("2", submit=5.0, attained=99.0),  # below the threshold: first queue, oldest
    ]
    assert [job.job_id for job in las_order(jobs, (100.0,))] == ["2", "3", "11", "12", "1"]


# ---------------------------------------------------------------------------------------------------- priorities


def test_priorities_are_the_jobs_own_values_handed_out_along_the_order() -> None:
    order = [queued("b", 2.0, priority=5), queued("c", 3.0, priority=4), queued("a", 1.0, 900.0, priority=6)]
    assert las_priorities(order) == {"b": 6, "c": 5, "a": 4}


def test_equal_priorities_are_spread_so_that_slurm_cannot_tie() -> None:
    order = [queued("x", 1.0, priority=7), queued("y", 2.0, priority=7), queued("z", 3.0, priority=7)]
    assert las_priorities(order) == {"x": 9, "y": 8, "z": 7}


def test_no_priority_is_below_one_since_zero_holds_a_job() -> None:
    order = [queued("x", 1.0, priority=1), queued("y", 2.0, priority=1)]
    wanted = las_priorities(order)
    assert wanted == {"x": 2, "y": 1}


def test_values_at_slurms_ceiling_are_shifted_down_and_stay_distinct() -> None:
    order = [queued("x", 1.0, priority=MAX_PRIORITY), queued("y", 2.0, priority=MAX_PRIORITY)]
    wanted = las_priorities(order)
    assert wanted["x"] == MAX_PRIORITY and wanted["y"] == MAX_PRIORITY - 1


def test_an_empty_queue_has_no_priorities() -> None:
    assert las_priorities([]) == {}


def test_only_the_differences_are_updated_first_in_las_order() -> None:
    order = [queued("b", 2.0, priority=5), queued("c", 3.0, priority=6), queued("d", 4.0, priority=3)]
    wanted = {"b": 6, "c": 5, "d": 3}
    assert priority_updates(order, wanted) == [("b", 6), ("c", 5)]


def test_once_applied_the_order_is_stable() -> None:
    thresholds = (100.0,)
    jobs = [queued("1", 1.0, 500.0, priority=30), queued("2", 2.0, priority=20), queued("3", 3.0, priority=10)]
    order = las_order(jobs, thresholds)
    wanted = las_priorities(order)
    applied = [queued(j.job_id, j.submit_time, j.attained_service, wanted[j.job_id]) for j in jobs]
    order_again = las_order(applied, thresholds)
    assert priority_updates(order_again, las_priorities(order_again)) == []
    assert sorted(applied, key=lambda j: -j.priority) == order_again


def test_a_queue_already_in_order_is_left_alone_even_when_its_values_are_not_the_permutation() -> None:
    order = [queued("b", 2.0, priority=9), queued("c", 3.0, priority=4)]  # a job between them left the queue
    assert priority_updates(order, {"b": 9, "c": 7}) == []


# ---------------------------------------------------------------------------------------------------- the layer


def test_the_layer_adds_priorities_in_las_order_to_the_inner_policys_answer() -> None:
    jobs = [queued("1", 1.0, 500.0, priority=30), queued("2", 2.0, priority=20), queued("3", 3.0, priority=10)]
    actions = QueueOrderLayer(FifoPolicy(), (100.0,)).decide(snapshot([4], jobs), 10.0)
    assert [type(a) for a in actions[:2]] == [Start, Start]  # FIFO's answer first, unchanged
    assert [(a.job_id, a.priority) for a in actions if isinstance(a, SetPriority)] == [
        ("2", 30),
        ("3", 20),
        ("1", 10),
    ]
    assert all(a.reason.startswith("LAS queue") for a in actions if isinstance(a, SetPriority))


def test_the_layer_leaves_held_jobs_other_partitions_and_other_users_alone() -> None:
    jobs = [
        queued("1", 1.0, 500.0, priority=30, owner="alice"),
        queued("2", 2.0, priority=0, owner="alice"),  # Slurm holds it (priority 0)
        queued("3", 3.0, priority=25, owner="alice", held=True, held_since=0.0),  # the daemon holds it
        queued("4", 4.0, priority=40, owner="alice", partition="other"),
        queued("5", 5.0, priority=50, owner="bob"),
        queued("6", 6.0, priority=10, owner="alice"),
    ]
    layer = QueueOrderLayer(FifoPolicy(), (100.0,), partitions=frozenset({"batch"}), users=frozenset({"alice"}))
    jobs = [job if job.partition == "other" else dataclasses.replace(job, partition="batch") for job in jobs]
    assert [job.job_id for job in layer.ordered(snapshot([0], jobs))] == ["6", "1"]
    priorities = [(a.job_id, a.priority) for a in layer.decide(snapshot([0], jobs), 10.0) if isinstance(a, SetPriority)]
    assert priorities == [("6", 30), ("1", 10)]


def test_a_job_whose_priority_the_daemon_set_counts_with_its_own_in_the_band() -> None:
    # Job 2's 35 is the daemon's; Slurm had given it 20: the band stays 30 and 20, it does not climb.
    jobs = [queued("1", 1.0, 500.0, priority=30), queued("2", 2.0, priority=35), queued("3", 3.0, priority=10)]
    layer = QueueOrderLayer(FifoPolicy(), (100.0,), own_priorities={"2": 20})
    priorities = [(a.job_id, a.priority) for a in layer.decide(snapshot([0], jobs), 10.0) if isinstance(a, SetPriority)]
    assert priorities == [("2", 30), ("3", 20), ("1", 10)]
