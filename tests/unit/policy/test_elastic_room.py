"""The elastic pass's index of what each node offers a start (``elastic_room._Rooms``): the nodes it chooses are
those of reading every node, also after starts were placed and lenders gave extras back."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from slurm_amoeba.policy import JobInfo, make_policy
from slurm_amoeba.policy.amoebad import AmoebadPolicy
from slurm_amoeba.policy.elastic_room import ElasticPass, _request_floor
from tests.unit.policy.helpers import job, snapshot

NODE_GPUS = 8


def cluster(seed: int, nodes: int = 40) -> tuple[list[JobInfo], list[int]]:
    """Elastic jobs of 1-2 GPUs per worker spread over ``nodes`` nodes of 8 GPUs, some nodes left partly free."""
    rng = random.Random(seed)
    free = [NODE_GPUS] * nodes
    jobs: list[JobInfo] = []
    for index in range(nodes * 2):
        per = rng.choice((1, 1, 2))
        placement: dict[str, int] = {}
        for _ in range(rng.randint(1, 3)):
            node = rng.randrange(nodes)
            if free[node] >= per:
                free[node] -= per
                placement[f"n{node}"] = placement.get(f"n{node}", 0) + 1
        if placement:
            workers = sum(placement.values())
            low = rng.randint(1, workers)
            jobs.append(
                job(
                    f"e{index}",
                    rng.randint(low, workers + 2),
                    placement=placement,
                    low=low,
                    high=workers + 4,
                    gpus_per_worker=per,
                    submit=float(index),
                )
            )
    return jobs, [NODE_GPUS] * nodes


def brute_force(
    elastic: ElasticPass, floor: Callable[[JobInfo], int], workers: int, per: int
) -> tuple[list[str] | None, str, list[str]]:
    """Every node read: the whole node chosen, the roomiest node, and the spread order."""
    nodes = elastic.free_by_node
    offers = {n: (nodes[n] + elastic.lent_on(n, floor)) // per for n in nodes}
    loans = {n: (nodes[n] + elastic.lent_on(n, _request_floor)) // per for n in nodes}
    whole = [n for n in offers if offers[n] >= workers]
    chosen = [min(whole, key=lambda n: (nodes[n] < workers * per, loans[n] < workers, offers[n], n))] if whole else None
    best = max(offers, key=lambda n: (offers[n], nodes[n], n))
    spread = sorted(offers, key=lambda n: (-offers[n], -nodes[n], n))
    return chosen, best, spread


@pytest.mark.parametrize("seed", range(6))
def test_the_index_chooses_the_nodes_reading_every_node_would_also_after_placements(seed: int) -> None:
    running, node_gpus = cluster(seed)
    policy = make_policy("amoebad")
    assert isinstance(policy, AmoebadPolicy)
    snap = snapshot(node_gpus, running)
    elastic = ElasticPass(policy, snap, 0.0, running, set(), {}, {})
    elastic._place_starts([])  # the pass set up (free GPUs, lenders by node) with nothing to start yet
    rng = random.Random(seed)
    for _ in range(30):
        per = rng.choice((1, 2, 4))
        workers = rng.randint(1, 12)
        floor = rng.choice((policy.slurm_floor, policy.daemon_floor))
        rooms = elastic._rooms_under(floor)
        chosen, best, spread = brute_force(elastic, floor, workers, per)
        assert rooms.whole(workers, per) == chosen
        classes = rooms.by_offer(per)
        assert max(names[-1] for names in classes[0]) == best
        assert [name for lists in classes for name in sorted(n for names in lists for n in names)] == spread
        starting = job(f"s{_}", workers, gpus_per_worker=per)
        elastic._make_room(starting, workers, floor)  # free GPUs taken, extras given back: the index follows
