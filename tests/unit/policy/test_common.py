"""Placement helpers and the JobInfo/NodeInfo checks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_amoeba.policy import JobInfo, JobPhase, NodeInfo, PolicyError, check_actions
from slurm_amoeba.policy.common import FreeGpus, distribute_spare, place_most_free, realize, shrink_placement

from .helpers import job, snapshot


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
