"""The live daemon's sharers: a running job that may grow beside a host (``JobInfo.grows_beside``) is paired as a
waiting job is, and a sharer without micro-batch profiles keeps its own micro-batch where its memory fits."""

from __future__ import annotations

from slurm_amoeba.policy import JobInfo, NodeInfo, Snapshot, check_actions
from slurm_amoeba.policy.actions import Share
from slurm_amoeba.policy.pairing import ShareMode, growth_benefit, growth_gain, sharer_options
from slurm_amoeba.policy.sharing import PairingPolicy
from tests.unit.policy.helpers import job

#: Types a and b keep 97 % of their speed beside each other: the host keeps its bound unpaced, and a worker beside
#: it keeps more than half of its speed, so a job of one worker trains faster with it (growth_gain).
PRIOR = {(a, b): 0.97 for a in ("a", "b") for b in ("a", "b")}


def cluster(*jobs: JobInfo, memory: float | None = None, prior: float | None = None) -> Snapshot:
    """Node n0 of 2 GPUs, both held; the given jobs."""
    colocation = PRIOR if prior is None else dict.fromkeys(PRIOR, prior)
    return Snapshot((NodeInfo("n0", 2, 0, "share", memory),), tuple(jobs), colocation)


def test_a_job_that_may_grow_beside_a_host_is_paired_with_its_own_micro_batch_and_the_answer_checks() -> None:
    host = job("h", 1, placement={"n0": 1}, low=1, high=2, job_type="a", memory_gib=30.0)
    grower = job("g", 1, placement={"n0": 1}, low=1, high=2, job_type="b", grows_beside=True, memory_gib=20.0)
    snap = cluster(host, grower, memory=80.0)
    (share,) = PairingPolicy(ShareMode.OPPORTUNISTIC).decide(snap, 0.0)
    assert isinstance(share, Share)
    assert (share.job_id, share.host, share.workers, dict(share.placement)) == ("g", "h", 1, {"n0": 1})
    assert (share.sub_batch, share.accumulation, share.pace_bound) == (None, None, 0.05)
    check_actions(snap, [share])


def test_a_running_job_grows_beside_a_host_only_when_its_workers_there_keep_more_than_its_slowest_pace_costs() -> None:
    """Its steps are split evenly, so the worker beside the host sets every step's pace: a job of one worker gains
    only when that worker keeps more than half of its speed. Two jobs that split the device (0.5 each) never pair;
    at 0.9 each SJF-BSBF pairs them (the grower's time saved outweighs the host's 10 %), AntMan does not (paced to
    keep the host at 95 %, the worker beside it runs at half of 90 %)."""
    host = job("h", 1, placement={"n0": 1}, low=1, high=2, job_type="a", time_limit=1000.0)
    grower = job("g", 1, placement={"n0": 1}, low=1, high=2, job_type="b", grows_beside=True, time_limit=1000.0)
    for mode in ShareMode:
        assert PairingPolicy(mode).decide(cluster(host, grower, prior=0.5), 0.0) == [], mode
    assert PairingPolicy(ShareMode.OPPORTUNISTIC).decide(cluster(host, grower, prior=0.9), 0.0) == []
    assert len(PairingPolicy(ShareMode.BENEFIT).decide(cluster(host, grower, prior=0.9), 0.0)) == 1
    assert growth_gain(1, 1, 0.45) == 0.9 and growth_gain(2, 1, 0.7) > 1.0 > growth_gain(2, 1, 0.66)
    for mode in ShareMode:  # at 0.97 both pay: the grower twice as fast (x 0.97), the host at 97 %
        assert [a.job_id for a in PairingPolicy(mode).decide(cluster(host, grower), 0.0)] == ["g"], mode
    # what the benefit rule weighs: the grower's time saved against the host's lost
    assert growth_benefit(1000.0, 1000.0, 1.94, 0.97) > 0 > growth_benefit(100.0, 1000.0, 1.1, 0.5)


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
