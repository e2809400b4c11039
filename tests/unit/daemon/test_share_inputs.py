"""The sharing policies' inputs, live: a report's device memory, the site's GPU memory and co-location prior, the
speeds a job measured alone and beside a partner, the sharer's memory cap, and a sharing policy that pairs two
opted-in jobs in the daemon's own round, without an operator."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import slurm_amoeba.policy.actions as act
from slurm_amoeba.core.sharing import host_status_path
from slurm_amoeba.daemon import Daemon
from slurm_amoeba.daemon.agents import AgentMessageError, AgentRecord, Beside, InFlight, Registration, Report
from slurm_amoeba.daemon.config import DEFAULT_KEPT, ConfigError, Sharing, parse_config
from slurm_amoeba.daemon.executor import GIB, LiveExecutor, memory_cap_bytes
from slurm_amoeba.daemon.ledger import Ledger
from slurm_amoeba.daemon.metrics import DaemonMetrics
from slurm_amoeba.daemon.observer import ClusterView
from slurm_amoeba.daemon.snapshot import SnapshotCache, build_snapshot, sharing_inputs
from slurm_amoeba.policy import JobInfo, NodeInfo, Snapshot
from slurm_amoeba.policy.colocation import packaged_gavel_table, read_colocation
from slurm_amoeba.slurm import JobRecord
from tests.unit.daemon.fakes import ME, FakeSlurm, job, node, register_body, report_body
from tests.unit.daemon.test_daemon import FakeAgent, ask, make_daemon
from tests.unit.daemon.test_executor import RecordingActuator
from tests.unit.policy.helpers import job as info

NOW = 5_000.0
GAVEL = read_colocation(packaged_gavel_table())


def report(size: int = 1, rate: float = 100.0, at: float = NOW, **extra: Any) -> Report:
    return Report(size, 1, extra.pop("target", size), {size: rate}, (), (), at, **extra)


# ---------------------------------------------------------------------------------------------- report and config


def test_a_report_keeps_the_device_memory_its_worker_peaked_at_and_none_when_it_says_nothing() -> None:
    body = {**report_body("7", 1), "memory_gib": 12.5}
    assert Report.from_body(body, NOW).memory_gib == 12.5
    assert Report.from_body(report_body("7", 1), NOW).memory_gib is None


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan"), True, 2.0**21])
def test_a_report_whose_memory_is_not_gib_from_zero_up_is_refused_with_the_value_and_the_fix(bad: object) -> None:
    with pytest.raises(AgentMessageError, match=r"memory_gib = .* give GiB from 0 to \d+ \(e\.g\. 12\.5\)"):
        Report.from_body({**report_body("7", 1), "memory_gib": bad}, NOW)


def test_sharing_reads_the_gpu_memory_per_partition_and_gavels_table_as_the_default_prior() -> None:
    doc = {"enabled": True, "partitions": {"share": 4}, "gpu_memory_gib": {"share": 80}}
    sharing = parse_config({"sharing": doc}).sharing
    assert sharing.gpu_memory_gib == {"share": 80.0} and sharing.default_kept == DEFAULT_KEPT
    assert sharing.colocation == GAVEL and ("cifar10", "imagenet") in GAVEL
    prior = sharing.prior(["cifar10", "imagenet", "mine", ""])
    assert prior[("cifar10", "imagenet")] == GAVEL[("cifar10", "imagenet")]
    assert prior[("mine", "cifar10")] == prior[("cifar10", "mine")] == prior[("mine", "mine")] == DEFAULT_KEPT
    assert all("" not in pair for pair in prior), "a job without a type is never in the prior"
    no_table = parse_config({"sharing": {**doc, "colocation_table": "none", "default_kept": 0.8}}).sharing
    assert no_table.colocation == {} and no_table.prior(["cifar10"]) == {("cifar10", "cifar10"): 0.8}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"default_kept": 0}, r"sharing.default_kept = 0 is invalid: .* in \(0, 1\] \(0.5: two jobs split"),
        ({"default_kept": 1.5}, r"sharing.default_kept = 1.5 is invalid"),
        ({"default_kept": "half"}, r"sharing.default_kept = 'half' is invalid"),
        ({"gpu_memory_gib": {"share": 0}}, r"sharing.gpu_memory_gib.share = 0 is invalid: .* \(e.g. 80"),
        ({"gpu_memory_gib": {"share": True}}, r"sharing.gpu_memory_gib.share = True is invalid"),
        ({"gpu_memory_gib": [80]}, r"sharing.gpu_memory_gib = \[80\] is invalid: give a mapping"),
        ({"gpu_memory_gib": {"bad name!": 80}}, r"give a Slurm partition name"),
        ({"colocation_table": "/no/such/table.json"}, r"cannot read Gavel's throughputs .* or write none"),
        ({"colocation": {}}, r"colocation"),
    ],
    ids=["zero", "over-one", "a-word", "no-memory", "a-flag", "a-list", "a-bad-partition", "no-file", "unknown-key"],
)
def test_a_bad_sharing_value_is_refused_with_the_key_the_value_and_the_fix(
    change: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"sharing": {"enabled": True, "partitions": {"share": 4}, **change}})


def test_a_table_that_is_not_gavels_is_refused_when_the_daemon_reads_its_configuration(tmp_path: Path) -> None:
    table = tmp_path / "t.json"
    table.write_text('{"k80": {}}')
    with pytest.raises(ConfigError, match=r"has no GPU table 'v100'; it has k80"):
        parse_config({"sharing": {"enabled": True, "partitions": {"share": 4}, "colocation_table": str(table)}})


# ---------------------------------------------------------------------------------------------- the snapshot

SHARING = Sharing(enabled=True, partitions={"share": 4}, gpu_memory_gib={"share": 80.0}, colocation=GAVEL)


def registered(job_id: str, mode: str | None, low: int = 1, high: int = 2) -> AgentRecord:
    reg = Registration(job_id, "tcp://127.0.0.1:1", low, high, 1, "batch", "elastic", mode, "share" if mode else "")
    return AgentRecord(registration=reg, uid=ME, user="alice", registered_at=NOW - 30)


def share_job(job_id: int, name: str, limit: int | None = None, submit: int = 1_000) -> JobRecord:
    record = job(job_id, name=name, partition="share", gpus={"s1": 1}, submit_time=submit)
    return dataclasses.replace(record, time_limit_s=limit)


def share_view(*records: JobRecord) -> ClusterView:
    return ClusterView(records, (node("n1"), node("s1", partitions=("share",))), NOW)


def observe_sharing(
    view: ClusterView,
    agents: dict[str, AgentRecord],
    sharing: Sharing | None = SHARING,
    reuse: SnapshotCache | None = None,
) -> Snapshot:
    return build_snapshot(
        view,
        agents,
        pinned=(),
        regular_partitions=["batch"],
        elastic_partition="elastic",
        stale_after_s=10.0,
        now=NOW,
        sharing=sharing,
        reuse=reuse,
    ).snapshot


def test_opted_in_jobs_carry_their_job_name_memory_and_rates_and_the_sharing_nodes_their_gpu_memory() -> None:
    host, sharer, plain = registered("10", "guaranteed"), registered("11", "opportunistic"), registered("12", None)
    host.accept_report(report(memory_gib=30.0, at=NOW - 1))
    host.rates.solo[1], host.rates.shared[(1, "imagenet")] = 100.0, 90.0
    sharer.accept_report(report(at=NOW - 1))
    sharer.rates.solo[1] = 100.0  # its speed alone now: what a loss beside a host would be judged by
    sharer.rates.solo[2] = 150.0  # its size once it grows beside a host
    plain.accept_report(report(memory_gib=5.0, at=NOW - 1))
    view = share_view(share_job(10, "cifar10"), share_job(11, "imagenet"), job(12, name="cifar10", gpus={"n1": 1}))
    snap = observe_sharing(view, {"10": host, "11": sharer, "12": plain})
    jobs = snap.by_id()
    assert (jobs["10"].job_type, jobs["10"].memory_gib, jobs["10"].grows_beside) == ("cifar10", 30.0, False)
    assert (jobs["10"].solo_rate, dict(jobs["10"].shared_rates)) == (100.0, {"imagenet": 90.0})
    assert (jobs["11"].job_type, jobs["11"].grows_beside, jobs["11"].solo_rate) == ("imagenet", True, 150.0)
    assert (jobs["12"].job_type, jobs["12"].memory_gib, jobs["12"].grows_beside) == ("", None, False)
    assert set(snap.colocation) == {(a, b) for a in ("cifar10", "imagenet") for b in ("cifar10", "imagenet")}
    nodes = {n.name: n for n in snap.nodes}
    assert (nodes["s1"].partition, nodes["s1"].gpus_free, nodes["s1"].gpu_memory_gib) == ("share", 0, 80.0)
    assert nodes["n1"].gpu_memory_gib is None
    off = observe_sharing(view, {"10": host, "11": sharer, "12": plain}, None)
    assert off.colocation == {} and "s1" not in {n.name for n in off.nodes}
    assert all((j.job_type, j.memory_gib, j.grows_beside) == ("", None, False) for j in off.jobs)


def test_the_snapshot_cache_builds_a_managed_job_again_when_its_measured_rates_or_its_memory_change() -> None:
    host = registered("10", "guaranteed")
    host.accept_report(report(memory_gib=30.0, at=NOW - 1))
    view, cache = share_view(share_job(10, "cifar10")), SnapshotCache()

    def observed() -> JobInfo:
        return observe_sharing(view, {"10": host}, reuse=cache).job("10")

    first = observed()
    assert observed() is first, "nothing changed: reused"
    host.rates.solo[1], host.rates.version = 120.0, host.rates.version + 1
    assert observed().solo_rate == 120.0
    host.accept_report(report(memory_gib=40.0, at=NOW - 0.5))
    assert observed().memory_gib == 40.0


@pytest.mark.parametrize(
    ("change", "grows"),
    [
        (lambda a: None, True),
        (lambda a: setattr(a, "beside", Beside("10", "share", {"s1": 1}, "opportunistic", ME, "/x")), False),
        (lambda a: setattr(a, "registration", dataclasses.replace(a.registration, max_workers=1)), False),
        (lambda a: setattr(a, "in_flight", InFlight(2, NOW, "policy", "r")), False),
        (lambda a: a.rates.solo.clear(), False),
        (lambda a: setattr(a.rates, "grew_at_a_loss", True), False),
    ],
    ids=[
        "below-its-maximum",
        "beside-a-host-already",
        "at-its-maximum",
        "resizing",
        "unmeasured-alone",
        "grew-at-a-loss",
    ],
)
def test_only_an_opportunistic_job_below_its_maximum_placed_beside_nobody_grows_beside_a_host(
    change: Any, grows: bool
) -> None:
    sharer = registered("11", "opportunistic")
    sharer.accept_report(report(at=NOW - 1))
    sharer.rates.solo[1] = 100.0
    change(sharer)
    snap = observe_sharing(share_view(share_job(11, "imagenet")), {"11": sharer})
    assert snap.job("11").grows_beside is grows


# ---------------------------------------------------------------------------------------------- measured rates


class Books:
    """A ledger with host 10 and opportunistic 11 registered; 11's share beside 10 is placed on demand."""

    def __init__(self) -> None:
        self.ledger = Ledger(parse_config({}), DaemonMetrics(), lambda: NOW)
        for job_id, mode in (("10", "guaranteed"), ("11", "opportunistic")):
            self.ledger.register(registered(job_id, mode).registration, ME, "alice")
        self.types = {"10": "cifar10", "11": "imagenet"}
        self.at = NOW

    def reports(self, host_rate: float, size: int = 1, sharer_size: int = 1, **host: Any) -> None:
        self.at += 2.0
        self.ledger.take_report(self.ledger.agents["10"], report(size, host_rate, self.at, **host))
        self.ledger.take_report(self.ledger.agents["11"], report(sharer_size, 50.0, self.at))
        self.ledger.attribute_rates(self.types)

    def share(self) -> None:
        self.ledger.agents["11"].beside = Beside("10", "share", {"s1": 1}, "opportunistic", ME, "/x")

    @property
    def host(self) -> AgentRecord:
        return self.ledger.agents["10"]


def test_a_rate_counts_as_solo_or_beside_the_partners_type_only_once_the_pairing_held_a_whole_report() -> None:
    books = Books()
    books.reports(100.0)
    assert books.host.rates.solo == {}, "the first sample has no window behind it"
    books.reports(100.0)
    assert books.host.rates.solo == {1: 100.0}
    books.share()
    books.reports(60.0, sharer_size=2)
    assert books.host.rates.shared == {} and books.host.rates.solo == {1: 100.0}, "the window the sharer came in"
    books.reports(80.0, sharer_size=2)
    books.reports(90.0, sharer_size=2)
    assert books.host.rates.shared == {(1, "imagenet"): 85.0}, "smoothed: half of each new sample"
    assert books.ledger.agents["11"].rates.shared == {(2, "cifar10"): 50.0}
    assert books.host.rates.at(1) == (100.0, {"imagenet": 85.0})


@pytest.mark.parametrize(
    "unsettled",
    ["the-host-resizes", "the-sharer-is-in-flight", "two-sharers", "an-unknown-partner-type", "the-same-report"],
)
def test_a_rate_taken_while_the_pairing_is_unsettled_is_skipped(unsettled: str) -> None:
    books = Books()
    books.share()
    books.reports(90.0, sharer_size=2)  # the window before: settled
    if unsettled == "the-host-resizes":
        books.reports(90.0, target=2)
    elif unsettled == "the-sharer-is-in-flight":
        books.ledger.agents["11"].in_flight = InFlight(1, NOW, "policy", "host 10 needs its GPUs back")
        books.reports(90.0, sharer_size=2)
    elif unsettled == "two-sharers":
        books.ledger.register(registered("12", "opportunistic").registration, ME, "alice")
        books.ledger.agents["12"].beside = books.ledger.agents["11"].beside
        books.reports(90.0, sharer_size=2)
    elif unsettled == "an-unknown-partner-type":
        books.types = {"10": "cifar10"}
        books.reports(90.0, sharer_size=2)
    else:
        books.ledger.attribute_rates(books.types)  # no new report: nothing to take
    assert books.host.rates.shared == {}


# ---------------------------------------------------------------------------------------------- the memory cap


def test_a_shares_directive_caps_the_sharers_memory_at_what_the_host_leaves_on_its_tightest_node() -> None:
    ledger = Ledger(parse_config({}), DaemonMetrics(), lambda: NOW)
    for job_id, mode in (("10", "guaranteed"), ("11", "opportunistic")):
        ledger.register(registered(job_id, mode).registration, ME, "alice")
        ledger.agents[job_id].report = report(at=NOW)
    actuator = RecordingActuator()
    executor = LiveExecutor(ledger, actuator, DaemonMetrics(), sharing=SHARING)
    host = info("10", 1, placement={"s1": 1}, low=1, high=2, memory_gib=30.0)
    jobs: dict[str, JobInfo] = {"10": host, "11": info("11", 1, placement={"s2": 1}, low=1, high=2)}
    nodes = {"s1": NodeInfo("s1", 4, 0, "share", 80.0), "s2": NodeInfo("s2", 4, 0, "share", 80.0)}
    executor.apply([act.Share("11", "10", 1, {"s1": 1})], jobs, set(jobs), source="policy", now=NOW, nodes=nodes)
    (sent,) = actuator.sent
    assert sent.place_beside is not None and sent.place_beside.memory_cap_bytes == 50 * GIB
    assert sent.place_beside.to_body()["memory_cap_bytes"] == 50 * GIB
    assert Beside.from_body(sent.place_beside.to_body()) == sent.place_beside  # the state file keeps it
    assert sent.place_beside.status_path == str(host_status_path("10"))


def test_a_sharers_cap_follows_its_hosts_memory_use_and_small_moves_or_an_unknown_use_leave_it() -> None:
    ledger = Ledger(parse_config({}), DaemonMetrics(), lambda: NOW)
    for job_id, mode in (("10", "guaranteed"), ("11", "opportunistic")):
        ledger.register(registered(job_id, mode).registration, ME, "alice")
    ledger.agents["10"].report = report(at=NOW)
    ledger.agents["11"].report = report(size=2, at=NOW)
    ledger.agents["11"].beside = Beside("10", "share", {"s1": 1}, "opportunistic", ME, "/x", memory_cap_bytes=50 * GIB)
    actuator = RecordingActuator()
    executor = LiveExecutor(ledger, actuator, DaemonMetrics(), sharing=SHARING)
    nodes = {"s1": NodeInfo("s1", 4, 0, "share", 80.0), "s2": NodeInfo("s2", 4, 0, "share", 80.0)}

    def round_with(host_gib: float | None) -> None:
        host = info("10", 1, placement={"s1": 1}, low=1, high=2, memory_gib=host_gib)
        jobs: dict[str, JobInfo] = {"10": host, "11": info("11", 2, placement={"s1": 1, "s2": 1}, low=1, high=2)}
        executor.apply([], jobs, set(jobs), source="policy", now=NOW, nodes=nodes)

    round_with(31.0)  # the cap would be 49 GiB: under 5 % of the 50 in force
    assert actuator.sent == []
    round_with(40.0)  # the host needs 10 GiB more: the sharer's cap is lowered, at its own size
    (sent,) = actuator.sent
    assert sent.target == 2 and sent.place_beside is not None and sent.place_beside.memory_cap_bytes == 40 * GIB
    assert sent.place_beside.host == "10" and dict(sent.place_beside.nodes) == {"s1": 1}
    assert sent.reason == "host job 10 uses 40.00 GiB: the memory cap beside it is lowered to 40.00 GiB"
    beside = ledger.agents["11"].beside
    assert beside is not None and beside.memory_cap_bytes == 40 * GIB, "the ledger (and the state file) keep it"
    round_with(10.0)  # the directive is still in flight: nothing more until the sharer settles
    assert len(actuator.sent) == 1
    ledger.agents["11"].in_flight = None
    round_with(None)  # the host's use is no longer known: the cap in force stays
    assert len(actuator.sent) == 1
    round_with(10.0)  # the host gives memory back: the cap is raised
    assert actuator.sent[-1].place_beside is not None and actuator.sent[-1].place_beside.memory_cap_bytes == 70 * GIB
    assert "is raised to 70.00 GiB" in actuator.sent[-1].reason


def test_a_sharer_that_trains_slower_with_its_workers_beside_the_host_goes_back_to_its_own_and_grows_no_more() -> None:
    ledger = Ledger(parse_config({}), DaemonMetrics(), lambda: NOW)
    for job_id, mode in (("10", "guaranteed"), ("11", "opportunistic")):
        ledger.register(registered(job_id, mode).registration, ME, "alice")
    ledger.agents["10"].report = report(at=NOW)
    sharer = ledger.agents["11"]
    sharer.report = report(size=2, at=NOW)
    sharer.beside = Beside("10", "share", {"s1": 1}, "opportunistic", ME, "/x")
    actuator = RecordingActuator()
    executor = LiveExecutor(ledger, actuator, DaemonMetrics(), sharing=SHARING)
    jobs: dict[str, JobInfo] = {
        "10": info("10", 1, placement={"s1": 1}, low=1, high=2),
        "11": info("11", 2, placement={"s1": 1, "s2": 1}, low=1, high=2),
    }
    sharer.rates.solo[1] = 100.0
    sharer.rates.shared[(2, "cifar10")] = 97.0  # within the noise: it stays
    executor.apply([], jobs, set(jobs), source="policy", now=NOW)
    assert actuator.sent == [] and sharer.beside is not None
    sharer.rates.shared[(2, "cifar10")] = 60.0  # its worker beside the host sets a slow pace for both
    executor.apply([], jobs, set(jobs), source="policy", now=NOW)
    (sent,) = actuator.sent
    assert sent.target == 1 and sharer.beside is None and sharer.rates.grew_at_a_loss
    assert sent.reason == (
        "it trains at 60.0 samples/s with 2 workers, 1 beside host job 10, below its 100.0 with its own 1 alone: "
        "it grows beside no host again"
    )
    sharer.in_flight, sharer.report = None, report(size=1, at=NOW + 1)
    inputs = sharing_inputs(sharer, "imagenet", 1, 1, None, sharing=SHARING, hosting=False)
    assert not inputs.grows_beside, "measured: it is never offered as a sharer again"


def test_a_second_job_is_never_placed_beside_a_host_that_has_a_sharer_already() -> None:
    ledger = Ledger(parse_config({}), DaemonMetrics(), lambda: NOW)
    for job_id, mode in (("10", "guaranteed"), ("11", "opportunistic"), ("12", "opportunistic")):
        ledger.register(registered(job_id, mode).registration, ME, "alice")
        ledger.agents[job_id].report = report(at=NOW)
    ledger.agents["11"].beside = Beside("10", "share", {"s1": 1}, "opportunistic", ME, "/x")
    executor = LiveExecutor(ledger, RecordingActuator(), DaemonMetrics(), sharing=SHARING)
    jobs = {job_id: info(job_id, 1, placement={"s1": 1}, low=1, high=2) for job_id in ("10", "11", "12")}
    why = executor.share_refusal(act.Share("12", "10", 1, {"s1": 1}), jobs, set(jobs))
    assert why.startswith("host job 10 has job 11 beside it already: a host has one sharer job at a time")


def test_no_cap_is_sent_where_the_gpus_memory_or_the_hosts_own_use_is_unknown() -> None:
    host = info("10", 1, placement={"s1": 1}, low=1, high=2, memory_gib=30.0)
    assert memory_cap_bytes(host, {"s1": NodeInfo("s1", 4, 0, "share", None)}) == 0
    assert memory_cap_bytes(dataclasses.replace(host, memory_gib=None), {"s1": NodeInfo("s1", 4, 0, "", 80.0)}) == 0
    assert memory_cap_bytes(dataclasses.replace(host, memory_gib=90.0), {"s1": NodeInfo("s1", 4, 0, "", 80.0)}) == 1
    assert "memory_cap_bytes" not in Beside("10", "share", {"s1": 1}, "opportunistic", ME, "/x").to_body()


# ---------------------------------------------------------------------------------------------- the daemon's round


@pytest.fixture
def agents() -> Iterator[tuple[FakeAgent, FakeAgent]]:
    host, sharer = FakeAgent(), FakeAgent()
    yield host, sharer
    host.close()
    sharer.close()


def sharing_daemon(
    tmp_path: Path, policy: str, names: tuple[str, str], limit: int | None = None, default_kept: float = DEFAULT_KEPT
) -> Daemon:
    started = int(time.time()) - 60  # the daemon's clock: a minute into their time limits
    slurm = FakeSlurm(
        job_list=[share_job(10, names[0], limit, started), share_job(11, names[1], limit, started + 1)],
        node_list=[node("n1"), node("s1", partitions=("share",))],
    )
    slurm.set_used()
    return make_daemon(tmp_path, slurm, policy=policy, sharing=dataclasses.replace(SHARING, default_kept=default_kept))


def register_opted_in(d: Daemon, host: FakeAgent, sharer: FakeAgent, memory_gib: float | None = None) -> None:
    for job_id, agent, mode in (("10", host, "guaranteed"), ("11", sharer, "opportunistic")):
        body = {**register_body(job_id, agent.endpoint, 1, 2), "share": mode, "share_partition": "share"}
        assert ask(d, "register", body).body["ok"]
    # two reports a round apart at one worker each: the daemon has their speeds alone (a sharer must have its own)
    for again in (False, True):
        if again:
            assert d.run_round().ordered == {}, "nothing grows beside a host before its speed alone is measured"
        for job_id in ("10", "11"):
            extra = {} if memory_gib is None else {"memory_gib": memory_gib}
            assert ask(d, "report", {**report_body(job_id, 1), **extra}).body["ok"]


def test_antman_places_an_opted_in_opportunistic_job_beside_another_on_its_own_with_the_memory_cap(
    tmp_path: Path, agents: tuple[FakeAgent, FakeAgent]
) -> None:
    # types the table lacks, with a site's prior under which a worker beside the host keeps 97 % of its speed
    d = sharing_daemon(tmp_path, "antman", ("mymodel", "other"), default_kept=0.97)
    try:
        register_opted_in(d, *agents, memory_gib=30.0)
        assert d.run_round().ordered == {"11": 2}
        directive = d.agents["11"].in_flight
        assert directive is not None and "antman: beside 10 with its own micro-batch" in directive.reason
        beside = d.agents["11"].beside
        assert beside is not None and (beside.host, dict(beside.nodes)) == ("10", {"s1": 1})
        assert beside.pace_bound == 0.05 and beside.memory_cap_bytes == 50 * GIB
        assert not agents[0].directives, "the host is never told anything"
    finally:
        d.close()


def test_no_sharer_is_placed_beside_a_host_whose_memory_use_is_unknown_on_gpus_of_known_memory(
    tmp_path: Path, agents: tuple[FakeAgent, FakeAgent]
) -> None:
    d = sharing_daemon(tmp_path, "antman", ("mymodel", "other"))
    try:
        register_opted_in(d, *agents)  # reports without memory_gib
        assert d.run_round().ordered == {} and d.agents["11"].beside is None
    finally:
        d.close()


@pytest.mark.parametrize(
    ("names", "pairs"),
    [(("cifar10", "cifar10"), True), (("mymodel", "other"), False)],
    ids=["a-table-pair-that-pays", "the-default-prior-never-pays"],
)
def test_sjf_bsbf_pairs_two_opted_in_jobs_only_where_the_prior_says_the_pair_finishes_sooner(
    tmp_path: Path, agents: tuple[FakeAgent, FakeAgent], names: tuple[str, str], pairs: bool
) -> None:
    d = sharing_daemon(tmp_path, "sjf-bsbf", names, limit=3600)
    try:
        register_opted_in(d, *agents, memory_gib=30.0)
        assert d.run_round().ordered == ({"11": 2} if pairs else {})
        assert (d.agents["11"].beside is not None) is pairs
    finally:
        d.close()
