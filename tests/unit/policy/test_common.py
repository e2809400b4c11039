"""Placement helpers and the JobInfo/NodeInfo checks."""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_amoeba.policy import JobInfo, JobPhase, NodeInfo, PolicyError, check_actions
from slurm_amoeba.policy.common import (
    FreeGpus,
    admit_at_minimum,
    distribute_spare,
    las_fcfs_order,
    las_queue,
    marginal_efficiency,
    place_most_free,
    priority_key,
    priority_order,
    realize,
    schedulable,
    shrink_placement,
    speedup_gain,
)
from slurm_amoeba.policy.types import Snapshot

from .helpers import job, snapshot
from .strategies import snapshots


def test_place_most_free_fills_the_freest_node_first_and_breaks_ties_by_order() -> None:
    assert place_most_free({"a": 2, "b": 4, "c": 4}, 6) == {"b": 4, "c": 2}
    assert place_most_free({"a": 2, "b": 1}, 4) is None


def test_place_most_free_counts_whole_workers_per_node() -> None:
    assert place_most_free({"a": 3, "b": 3}, 2, gpus_per_worker=2) == {"a": 1, "b": 1}
    assert place_most_free({"a": 3, "b": 1}, 2, gpus_per_worker=2) is None


def test_shrink_empties_the_smallest_pieces_first() -> None:
    assert shrink_placement({"a": 3, "b": 1, "c": 2}, 2) == {"a": 3, "c": 1}


def test_distribute_spare_returns_the_grown_sizes_and_leaves_its_argument_as_it_is() -> None:
    elastic = job("e", 2, placement={"a": 2}, low=1, high=4)
    rigid = job("r", 2, placement={"a": 2})
    sizes = {"r": 2, "e": 2}
    grown = distribute_spare([rigid, elastic], sizes, spare_gpus=2, min_gain=0.1)
    assert grown == {"r": 2, "e": 4}
    assert list(grown) == ["r", "e"]
    assert sizes == {"r": 2, "e": 2}


def test_job_info_rejects_inconsistent_values() -> None:
    with pytest.raises(PolicyError, match="worker range 3:2"):
        job("x", 2, low=3, high=2)
    with pytest.raises(PolicyError, match="requested_workers=5 lies outside"):
        job("x", 5, low=1, high=4)
    with pytest.raises(PolicyError, match="does not match workers=0"):
        JobInfo("x", JobPhase.RUNNING, 0.0, 1, 1, 1)
    with pytest.raises(PolicyError, match="gpus_free=5"):
        NodeInfo("n", 4, 5)


def test_rate_interpolates_between_known_sizes_and_never_extrapolates() -> None:
    info = job("x", 2, low=1, high=8, throughput={2: 2.0, 4: 3.0})
    assert info.rate(3) == pytest.approx(2.5)
    assert info.rate(8) is None
    assert info.remaining_time() is None
    timed = job("y", 2, throughput={2: 4.0}, remaining_work=100.0)
    assert timed.remaining_time() == pytest.approx(25.0)


@settings(max_examples=200, deadline=None)
@given(
    free=st.lists(st.integers(0, 8), min_size=1, max_size=12),
    requests=st.lists(st.integers(1, 20), max_size=8),
)
def test_free_gpus_places_like_place_most_free_and_keeps_counts(free: list[int], requests: list[int]) -> None:
    table = {f"n{i}": gpus for i, gpus in enumerate(free)}
    index = FreeGpus(table)
    for workers in requests:
        expected = place_most_free(table, workers)
        assert index.place(workers) == expected
        if expected is not None:
            for name, count in expected.items():
                table[name] -= count
        assert index.free == table
        assert all(gpus >= 0 for gpus in index.free.values())


def _most_free_gpus_first(free: dict[str, int], workers: int, per_worker: int) -> dict[str, int] | None:
    """The rule FreeGpus keeps, by brute force: nodes by most free GPUs (earlier on a tie), whole workers each."""
    placement: dict[str, int] = {}
    for name in sorted(free, key=lambda node: -free[node]):
        take = min(free[name] // per_worker, workers - sum(placement.values()))
        if take > 0:
            placement[name] = take
    return placement if sum(placement.values()) == workers else None


@settings(max_examples=200, deadline=None)
@given(
    free=st.lists(st.integers(0, 8), min_size=1, max_size=12),
    steps=st.lists(st.tuples(st.integers(1, 20), st.sampled_from((1, 2, 4, 8)), st.integers(0, 11)), max_size=12),
)
def test_free_gpus_counts_slots_and_places_whole_workers_on_the_most_free_gpus_after_releases(
    free: list[int], steps: list[tuple[int, int, int]]
) -> None:
    table = {f"n{i}": gpus for i, gpus in enumerate(free)}
    index = FreeGpus(table)
    for workers, per_worker, released in steps:
        name = f"n{released % len(free)}"
        index.change(name, 1)  # a shrink elsewhere gives a GPU back
        table[name] += 1
        assert index.slots(per_worker) == sum(gpus // per_worker for gpus in table.values())
        expected = _most_free_gpus_first(table, workers, per_worker)
        assert index.place(workers, per_worker) == expected
        for node, count in (expected or {}).items():
            table[node] -= count * per_worker
        assert index.free == table


def test_free_gpus_grows_on_own_nodes_first_and_takes_nothing_when_it_cannot() -> None:
    index = FreeGpus({"a": 4, "b": 2, "c": 1})
    assert index.grow({"b": 1}, 3) == {"b": 3, "a": 1}
    assert index.free == {"a": 3, "b": 0, "c": 1}
    assert index.grow({"c": 1}, 9) is None
    assert index.free == {"a": 3, "b": 0, "c": 1}


def test_realize_counts_the_nodes_a_fixed_shrink_moves_workers_to() -> None:
    # e shrinks from 4 workers on n0 to 2 moved to n1 (whole_node_starts): n1's 2 free GPUs are then taken.
    elastic = job("e", 4, low=1, high=4, placement={"n0": 4})
    cluster = snapshot([4, 4], [elastic, job("x", 2, placement={"n1": 2}), job("p", 6)])
    decisions = realize(cluster, {"e": 2, "p": 6}, cluster.jobs, {}, {"e": {"n1": 2}})
    check_actions(cluster, decisions)
    # Only n0's 4 GPUs are free after the move: p (6 workers) does not start.
    assert [(d.job_id, d.workers, dict(d.placement)) for d in decisions] == [("e", 2, {"n1": 2})]


@settings(max_examples=200, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(st.sampled_from((0.0, 1.0, 2.0)), st.sampled_from((0.0, 3600.0, 7200.0, 16 * 3600.0, 1e6))),
        max_size=20,
    ),
    thresholds=st.lists(st.sampled_from((3600.0, 16 * 3600.0, 1e5)), max_size=3, unique=True).map(sorted),
)
def test_las_fcfs_order_is_the_sort_by_queue_then_submit_time_then_id(
    jobs: list[tuple[float, float]], thresholds: list[float]
) -> None:
    infos = [job(f"j{i}", 1, submit=submit, attained_service=attained) for i, (submit, attained) in enumerate(jobs)]
    expected = sorted(infos, key=lambda i: (las_queue(i.attained_service, thresholds), i.submit_time, i.job_id))
    assert las_fcfs_order(reversed(infos), thresholds) == expected


@settings(max_examples=100, deadline=None)
@given(cluster=snapshots(), held=st.sets(st.integers(0, 11)))
def test_schedulable_leaves_out_guests_and_held_jobs_and_counts_free_and_exclusively_held_gpus(
    cluster: Snapshot, held: set[int]
) -> None:
    jobs = tuple(
        dataclasses.replace(info, held=True) if index in held and info.workers == 0 else info
        for index, info in enumerate(cluster.jobs)
    )
    cluster = dataclasses.replace(cluster, jobs=jobs)
    chosen, capacity = schedulable(cluster)
    assert chosen == [info for info in jobs if info.shared_with is None and not info.held]
    assert capacity == cluster.free_gpus + sum(info.gpus for info in jobs if info.shared_with is None)


def _spare_one_worker_at_a_time(
    jobs: Sequence[JobInfo], sizes: dict[str, int], spare: int, min_gain: float, by_service: bool
) -> dict[str, int]:
    """distribute_spare's greedy written plainly: each round, the best-ranked job takes a worker if it is worth one."""
    grown = dict(sizes)

    def rank(info: JobInfo) -> tuple[float, int]:
        size = grown[info.job_id]
        return (info.attained_service if by_service else -speedup_gain(info, size), jobs.index(info))

    candidates = [info for info in jobs if info.is_resizable and 0 < grown.get(info.job_id, 0) < info.max_workers]
    heap = [(rank(info), info.job_id) for info in candidates]
    heapq.heapify(heap)
    by_id = {info.job_id: info for info in jobs}
    while heap and spare > 0:
        _, job_id = heapq.heappop(heap)
        info, size = by_id[job_id], grown[job_id]
        if info.gpus_per_worker > spare or marginal_efficiency(info, size) < min_gain:
            continue
        grown[job_id] = size + 1
        spare -= info.gpus_per_worker
        if size + 1 < info.max_workers:
            heapq.heappush(heap, (rank(info), job_id))
    return grown


@settings(max_examples=200, deadline=None)
@given(
    cluster=snapshots(max_jobs=10),
    spare=st.integers(0, 30),
    min_gain=st.sampled_from((0.0, 0.1, 0.5, 0.9)),
    by_service=st.booleans(),
)
def test_distribute_spare_gives_workers_as_the_plain_greedy_does(
    cluster: Snapshot, spare: int, min_gain: float, by_service: bool
) -> None:
    running = [info for info in cluster.jobs if info.workers > 0]
    sizes = {info.job_id: info.workers for info in running}
    expected = _spare_one_worker_at_a_time(running, sizes, spare, min_gain, by_service)
    assert distribute_spare(running, sizes, spare, min_gain, by_service) == expected


def test_snapshot_indexes_its_jobs_by_id_and_names_an_unknown_one() -> None:
    first, second = job("a", 1, placement={"n0": 1}), job("b", 2)
    cluster = snapshot([4], [first, second])
    assert cluster.by_id() == {"a": first, "b": second}
    assert cluster.job("b") is second
    with pytest.raises(PolicyError, match="'c' is not in the snapshot"):
        cluster.job("c")
    assert dataclasses.replace(cluster, jobs=(second,)).by_id() == {"b": second}


@settings(max_examples=200, deadline=None)
@given(jobs=st.lists(st.tuples(st.integers(0, 3), st.sampled_from((0.0, 1.0, 2.0))), max_size=20))
def test_priority_order_is_the_sort_by_priority_key(jobs: list[tuple[int, float]]) -> None:
    infos = [job(f"j{i}", 1, submit=submit, priority=priority) for i, (priority, submit) in enumerate(jobs)]
    assert priority_order(reversed(infos)) == sorted(infos, key=priority_key)


def test_free_gpus_places_on_a_node_once_when_its_count_came_back_to_an_earlier_one() -> None:
    index = FreeGpus({"a": 4, "b": 4})
    index.change("a", -2)
    index.change("a", 2)  # a's entries for 4 free GPUs: the first and the latest, both current
    assert index.place(6) == {"a": 4, "b": 2}
    assert index.free == {"a": 0, "b": 2}
    assert index.place(2) == {"b": 2}
    assert index.place(1) is None


def test_admit_at_minimum_admits_resizable_and_pending_jobs_at_their_minimum_and_others_at_their_size() -> None:
    pinned = job("p", 4, placement={"n0": 4}, low=2, high=4, pinned=True)
    elastic = job("e", 4, placement={"n1": 4}, low=1, high=4)
    waiting = job("w", 3, low=2, high=6)
    big = job("b", 8)
    sizes, admitted, left = admit_at_minimum([pinned, elastic, big, waiting], 9)
    assert sizes == {"p": 4, "e": 1, "b": 0, "w": 2}
    assert admitted == [pinned, elastic, waiting]
    assert left == 2
