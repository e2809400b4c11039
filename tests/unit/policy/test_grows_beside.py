"""The live daemon's sharers: a running job that may grow beside a host (``JobInfo.grows_beside``) is paired as a
waiting job is, and a sharer without micro-batch profiles keeps its own micro-batch where its memory fits."""

from __future__ import annotations

from slurm_amoeba.policy import JobInfo, NodeInfo, Snapshot, check_actions
from slurm_amoeba.policy.actions import Share
from slurm_amoeba.policy.pairing import ShareMode, sharer_options
from slurm_amoeba.policy.sharing import PairingPolicy
from tests.unit.policy.helpers import job

PRIOR = {(a, b): 0.5 for a in ("a", "b") for b in ("a", "b")}


def cluster(*jobs: JobInfo, memory: float | None = None) -> Snapshot:
    """Node n0 of 2 GPUs, both held; the given jobs."""
    return Snapshot((NodeInfo("n0", 2, 0, "share", memory),), tuple(jobs), PRIOR)


def test_a_job_that_may_grow_beside_a_host_is_paired_with_its_own_micro_batch_and_the_answer_checks() -> None:
    host = job("h", 1, placement={"n0": 1}, low=1, high=2, job_type="a", memory_gib=30.0)
    grower = job("g", 1, placement={"n0": 1}, low=1, high=2, job_type="b", grows_beside=True, memory_gib=20.0)
    snap = cluster(host, grower, memory=80.0)
    (share,) = PairingPolicy(ShareMode.OPPORTUNISTIC).decide(snap, 0.0)
    assert isinstance(share, Share)
    assert (share.job_id, share.host, share.workers, dict(share.placement)) == ("g", "h", 1, {"n0": 1})
    assert (share.sub_batch, share.accumulation, share.pace_bound) == (None, None, 0.05)
    check_actions(snap, [share])


def test_two_jobs_that_may_grow_beside_each_other_make_one_pair_never_two() -> None:
    first = job("x", 1, placement={"n0": 1}, low=1, high=2, job_type="a", grows_beside=True, submit=0.0)
    second = job("y", 1, placement={"n0": 1}, low=1, high=2, job_type="b", grows_beside=True, submit=1.0)
    actions = PairingPolicy(ShareMode.OPPORTUNISTIC).decide(cluster(first, second), 0.0)
    assert [(a.job_id, a.host) for a in actions if isinstance(a, Share)] == [("x", "y")]


def test_a_job_that_may_not_grow_beside_a_host_is_left_alone_and_none_is_its_own_host() -> None:
    alone = job("g", 1, placement={"n0": 1}, low=1, high=2, job_type="b", grows_beside=True)
    plain = job("p", 1, placement={"n0": 1}, low=1, high=2, job_type="b")
    assert PairingPolicy(ShareMode.OPPORTUNISTIC).decide(cluster(alone), 0.0) == []
    assert PairingPolicy(ShareMode.OPPORTUNISTIC).decide(cluster(plain, job("q", 1, placement={"n0": 1})), 0.0) == []


def test_a_sharer_without_profiles_fits_where_its_memory_is_unknown_or_within_what_the_host_leaves() -> None:
    sharer = job("s", 1, job_type="b", memory_gib=20.0)
    assert [size for size, _ in sharer_options(sharer, 50.0)] == [None]
    assert sharer_options(sharer, 10.0) == [] and sharer_options(sharer, 0.0) == []
    assert [profile.memory_gib for _, profile in sharer_options(job("u", 1), 10.0)] == [0.0]
    assert [size for size, _ in sharer_options(sharer, None)] == [None]


def test_no_sharer_is_placed_beside_a_host_that_is_resizing_or_pinned() -> None:
    grower = job("g", 1, placement={"n0": 1}, low=1, high=2, job_type="b", grows_beside=True)
    for change in ({"resizing": True}, {"pinned": True}):
        host = job("h", 1, placement={"n0": 1}, low=1, high=2, job_type="a", **change)
        assert PairingPolicy(ShareMode.OPPORTUNISTIC).decide(cluster(host, grower), 0.0) == []
    host = job("h", 1, placement={"n0": 1}, low=1, high=2, job_type="a")
    actions = PairingPolicy(ShareMode.OPPORTUNISTIC).decide(cluster(host, grower), 0.0)
    assert [a.host for a in actions if isinstance(a, Share)] == ["h"] and len(actions) == 1
