"""Admission at the requested size in the daemon: holds with a mark, releases with the priority given back, the
starvation bound, nothing left behind at a stop or after a crash, the rights check and the configuration (a Slurm
that lives in memory)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from pathlib import Path

import pytest

from slurm_amoeba.cli.amoebactl import _format_status
from slurm_amoeba.daemon.actuator import operator_rights
from slurm_amoeba.daemon.admission import Admitter, HeldJob, make_admitter
from slurm_amoeba.daemon.agents import AgentRecord, Registration, Report
from slurm_amoeba.daemon.config import Admission, ConfigError, load_config, parse_config
from slurm_amoeba.daemon.daemon import Daemon, DaemonUser
from slurm_amoeba.daemon.metrics import DaemonMetrics
from slurm_amoeba.daemon.observer import ClusterView
from slurm_amoeba.daemon.refusals import Refusals
from slurm_amoeba.daemon.snapshot import build_snapshot
from slurm_amoeba.policy import Hold
from slurm_amoeba.policy.admission import AdmissionGate, slurm_rule
from slurm_amoeba.policy.amoebad import AdmissionLayer, AmoebadPolicy
from slurm_amoeba.policy.fifo import FifoPolicy
from slurm_amoeba.slurm import CliSlurmClient, JobRecord, JobState, NodeRecord, SlurmCommandError
from slurm_amoeba.slurm.marks import HoldMark, parse_hold_mark
from tests.unit.daemon.fakes import ME, job, node

PENDING = JobState.PENDING
ELASTIC = "amoeba-elastic=2:8 my own note"


@dataclasses.dataclass
class MemorySlurm:
    """Jobs in memory whose hold, priority and AdminComment the daemon's calls change, as Slurm would."""

    records: dict[int, JobRecord]
    nodes: list[NodeRecord]
    calls: list[tuple[str, int, object]] = dataclasses.field(default_factory=list)
    refuse: bool = False
    config: dict[str, str] = dataclasses.field(
        default_factory=lambda: {"SlurmUser": "slurm(64030)", "PriorityType": "priority/basic"}
    )
    lowest: int = 10
    level: str = "None"  # the daemon's user's AdminLevel

    def _get(self, argv: str, job_id: int) -> JobRecord:
        if self.refuse:
            raise SlurmCommandError(["scontrol", argv], 1, "Access/permission denied")
        if job_id not in self.records:
            raise SlurmCommandError(["scontrol", argv], 1, "Invalid job id specified")
        return self.records[job_id]

    def hold(self, job_id: int) -> None:
        self.calls.append(("hold", job_id, None))
        record = self._get("hold", job_id)
        self.records[job_id] = dataclasses.replace(record, priority=0, state_reason="JobHeldAdmin")

    def release(self, job_id: int) -> None:
        self.calls.append(("release", job_id, None))
        record = self._get("release", job_id)
        self.lowest -= 1  # priority/basic: a released job goes to the back of the queue
        self.records[job_id] = dataclasses.replace(record, priority=self.lowest, state_reason="None")

    def set_priority(self, job_id: int, priority: int) -> None:
        self.calls.append(("priority", job_id, priority))
        self.records[job_id] = dataclasses.replace(self._get("update", job_id), priority=priority)

    def set_admin_comment(self, job_id: int, text: str) -> None:
        self.calls.append(("comment", job_id, text))
        self.records[job_id] = dataclasses.replace(self._get("update", job_id), admin_comment=text)

    def config_values(self) -> dict[str, str]:
        return dict(self.config)

    def admin_level(self, user: str) -> str:
        return self.level

    def past_service(self, job_ids: Collection[int]) -> dict[int, float]:
        return {}

    def view(self, now: float = 2_000.0) -> ClusterView:
        return ClusterView(tuple(self.records.values()), tuple(self.nodes), now)


def elastic_job(job_id: int = 7, *, gpus: int = 2, comment: str = ELASTIC, **kwargs: object) -> JobRecord:
    record = job(job_id, state=PENDING, comment=comment, priority=500, **kwargs)  # type: ignore[arg-type]
    return dataclasses.replace(record, gpus_requested=gpus, time_limit_s=600)


def cluster(used: int) -> list[NodeRecord]:
    """4 nodes x 4 GPUs, ``used`` of them taken (filling nodes in order)."""
    out = []
    for index in range(4):
        taken = min(4, max(0, used - 4 * index))
        out.append(node(f"n{index + 1}", used=taken))
    return out


@dataclasses.dataclass(frozen=True)
class Round:
    """What one round of admission did, as a test reads it."""

    held: tuple[str, ...]
    released: tuple[str, ...]
    starved: tuple[str, ...]
    waiting: tuple[HeldJob, ...]
    failed: tuple[str, ...]
    backing_off: tuple[str, ...]


class RoundOfAdmission:
    """The daemon's admission path in one object: the snapshot step, the admission layer's verdicts, the Admitter
    (as the executor calls it)."""

    def __init__(self, slurm: MemorySlurm, settings: Admission, user: str = "amoebad") -> None:
        self.slurm = slurm
        self.admitter = Admitter(settings, slurm, DaemonMetrics(), user=user)
        self.gate = AdmissionGate(
            FifoPolicy(), slurm_rule(settings.max_hold_s), frozenset(), frozenset(settings.users), 64
        )
        self.settings = settings

    def apply(self, view: ClusterView, now: float, agents: Mapping[str, AgentRecord] | None = None) -> Round:
        obs = build_snapshot(
            view,
            agents or {},
            pinned=(),
            regular_partitions=("batch",),
            elastic_partition="elastic",
            stale_after_s=60.0,
            now=now,
        )
        jobs = {info.job_id: info for info in obs.snapshot.jobs}
        self.admitter.sync(jobs, now)
        done: dict[str, list[str]] = {"held": [], "released": [], "starved": [], "failed": [], "backing_off": []}
        if self.settings.enabled:
            wanted = {job.job_id: job for job in self.gate.rule_view(obs.snapshot).jobs}
            for action in self.gate.verdicts(obs.snapshot, now):
                info = jobs[action.job_id]
                if not self.admitter.refusals.ready(info.job_id, now):
                    done["backing_off"].append(info.job_id)
                    continue
                if isinstance(action, Hold):
                    gpus = wanted[info.job_id].requested_workers * info.gpus_per_worker
                    ok = self.admitter.hold(info.job_id, info.owner, info.priority, gpus, action.reason, now)
                    key = "held"
                else:
                    ok = self.admitter.release(info.job_id, info.owner, action.reason, now, starved=action.starved)
                    key = "starved" if action.starved else "released"
                done[key if ok else "failed"].append(info.job_id)
        return Round(
            tuple(done["held"]),
            tuple(done["released"]),
            tuple(done["starved"]),
            self.admitter.waiting,
            tuple(done["failed"]),
            tuple(done["backing_off"]),
        )


#: Admission with the daemon holding in Slurm itself (administrator rights).
BY_DAEMON = Admission(enabled=True, holds_by="daemon")


def admitter(slurm: MemorySlurm, *, user: str = "amoebad", **settings: object) -> RoundOfAdmission:
    config = Admission(enabled=True, holds_by="daemon", **settings)  # type: ignore[arg-type]
    return RoundOfAdmission(slurm, config, user)


def test_held_while_few_gpus_are_free_released_with_its_priority_back_and_held_again_when_it_stops_fitting() -> None:
    slurm = MemorySlurm({7: elastic_job()}, cluster(used=12))
    daemon = admitter(slurm)
    first = daemon.apply(slurm.view(), 2_000.0)
    assert first.held == ("7",)
    assert slurm.calls[:2] == [("comment", 7, HoldMark(2000, 500, 8).text()), ("hold", 7, None)]  # mark first
    record = slurm.records[7]
    assert record.priority == 0 and parse_hold_mark(record.admin_comment) == HoldMark(2000, 500, 8)
    assert [(h.job_id, h.wanted) for h in first.waiting] == [("7", 8)]
    assert daemon.apply(slurm.view(), 2_005.0).waiting[0].since == 2000.0  # still waiting: nothing called
    assert len(slurm.calls) == 2
    slurm.nodes = cluster(used=8)
    second = daemon.apply(slurm.view(), 2_010.0)
    assert second.released == ("7",)
    assert slurm.calls[2:] == [("release", 7, None), ("comment", 7, ""), ("priority", 7, 500)]
    assert slurm.records[7].admin_comment == "" and slurm.records[7].priority == 500
    # Released but not started yet, it no longer fits: no memory of the release, the rule holds it again.
    slurm.nodes = cluster(used=16)
    assert daemon.apply(slurm.view(), 2_011.0).held == ("7",)
    assert parse_hold_mark(slurm.records[7].admin_comment) == HoldMark(2011, 500, 8)


def managed(job_id: int, workers: int, low: int = 2) -> tuple[list[JobRecord], dict[str, AgentRecord]]:
    """A running elastic job the daemon manages: ``workers`` GPUs on node n1 (its allocation), its agent's record."""
    records = [
        job(job_id, het_job_id=job_id, het_job_offset=0, gpus={}),
        job(job_id + 1, het_job_id=job_id, het_job_offset=1, gpus={"n1": workers}),
    ]
    reg = Registration(str(job_id), "tcp://127.0.0.1:5000", low, 8, 1, "batch", "elastic")
    record = AgentRecord(registration=reg, uid=ME, user="alice", registered_at=1_900.0)
    record.accept_report(Report(workers, 1, workers, {}, (), (), 1_999.0))
    return records, {str(job_id): record}


def test_running_managed_jobs_workers_above_their_minimum_are_lendable_and_a_job_with_room_is_not_held() -> None:
    lender, agents = managed(3, workers=4, low=2)
    slurm = MemorySlurm({7: elastic_job(7, comment="amoeba-elastic=2:6")}, cluster(used=12))
    for record in lender:
        slurm.records[record.job_id] = record
    # 4 free GPUs and 2 workers of job 3 above its minimum: 6, the requested size.
    assert admitter(slurm).apply(slurm.view(), 2_000.0, agents).held == ()
    assert slurm.calls == []
    # Without its agent job 3 is a fixed-size job: nothing lendable, and job 7 waits held.
    assert admitter(slurm).apply(slurm.view(), 2_000.0).held == ("7",)
    # At its minimum, it lends nothing either.
    lender, agents = managed(3, workers=4, low=4)
    slurm = MemorySlurm({7: elastic_job(7, comment="amoeba-elastic=2:6")}, cluster(used=12))
    for record in lender:
        slurm.records[record.job_id] = record
    assert admitter(slurm).apply(slurm.view(), 2_000.0, agents).held == ("7",)


def test_the_starvation_bound_counts_from_submission_and_releases_a_job_pending_too_long() -> None:
    slurm = MemorySlurm({7: elastic_job(submit_time=1_990)}, cluster(used=12))
    daemon = admitter(slurm, max_hold_s=40.0)
    assert daemon.apply(slurm.view(), 2_000.0).held == ("7",)
    assert daemon.apply(slurm.view(), 2_029.0).starved == ()
    assert daemon.apply(slurm.view(), 2_030.0).starved == ("7",)  # 40 s since its submission, 30 s held
    assert slurm.records[7].priority == 500 and slurm.records[7].admin_comment == ""
    assert daemon.apply(slurm.view(), 2_031.0).held == ()  # an ordinary pending job now
    # A job pending longer than the bound when the daemon first sees it is never held.
    slurm = MemorySlurm({8: elastic_job(8, submit_time=1_000)}, cluster(used=12))
    assert admitter(slurm, max_hold_s=40.0).apply(slurm.view(), 2_000.0).held == ()
    assert slurm.calls == []


def test_the_stop_releases_every_held_job_and_a_crash_leaves_marks_the_next_daemon_finds() -> None:
    slurm = MemorySlurm({7: elastic_job(), 8: elastic_job(8, submit_time=1_001)}, cluster(used=12))
    daemon = admitter(slurm)
    assert daemon.apply(slurm.view(), 2_000.0).held == ("7", "8")
    # A crash: a new daemon with admission on keeps the holds (and their hold time) ...
    again = admitter(slurm, max_hold_s=1_100.0)
    kept = again.apply(slurm.view(), 2_050.0)
    assert kept.held == () and {h.job_id: h.since for h in kept.waiting} == {"7": 2000.0, "8": 2000.0}
    assert again.apply(slurm.view(), 2_100.0).starved == ("7",)  # 1100 s since its submission
    assert again.apply(slurm.view(), 2_101.0).starved == ("8",)
    # ... and one with admission off releases them on its first round.
    slurm = MemorySlurm({7: elastic_job()}, cluster(used=12))
    admitter(slurm).apply(slurm.view(), 2_000.0)
    RoundOfAdmission(slurm, Admission(enabled=False, holds_by="daemon")).apply(slurm.view(), 2_001.0)
    assert slurm.records[7].priority == 500 and slurm.records[7].state_reason == "None"
    # The stop.
    slurm = MemorySlurm({7: elastic_job()}, cluster(used=12))
    daemon = admitter(slurm)
    daemon.apply(slurm.view(), 2_000.0)
    assert daemon.admitter.release_all() == 1
    assert slurm.records[7].priority == 500 and slurm.records[7].admin_comment == ""


def test_a_release_slurm_refuses_is_logged_with_the_command(caplog: pytest.LogCaptureFixture) -> None:
    slurm = MemorySlurm({7: elastic_job()}, cluster(used=12))
    daemon = admitter(slurm)
    daemon.apply(slurm.view(), 2_000.0)
    slurm.refuse = True
    assert daemon.admitter.release_all() == 0
    assert "release it with `scontrol release 7`" in caplog.text


def test_other_holds_other_users_other_partitions_and_plain_jobs_are_never_touched() -> None:
    records = {
        1: elastic_job(1, reason="JobHeldUser"),  # the owner's hold (priority stays 500 in this double)
        2: dataclasses.replace(elastic_job(2), priority=0, state_reason="JobHeldAdmin"),  # an admin's hold
        3: elastic_job(3, user="bob"),
        4: elastic_job(4, partition="elastic"),
        5: elastic_job(5, comment="just a comment"),
    }
    slurm = MemorySlurm(records, cluster(used=12))
    admitter(slurm, users=("alice",)).apply(slurm.view(), 2_000.0)
    assert slurm.calls == []


def test_a_mark_left_on_a_released_job_is_cleared() -> None:
    marked = dataclasses.replace(elastic_job(), admin_comment=HoldMark(1, 500, 8).text())
    slurm = MemorySlurm({7: marked}, cluster(used=0))
    admitter(slurm).apply(slurm.view(), 2_000.0)
    assert slurm.calls == [("comment", 7, "")]


def test_the_requested_size_is_the_marks_max_capped_by_the_site_and_the_cluster() -> None:
    records = (
        elastic_job(7, gpus=4, comment="amoeba-elastic=2:8"),  # 2 GPUs per worker
        elastic_job(8, gpus=2, comment="amoeba-elastic=2:64"),
    )
    obs = build_snapshot(
        ClusterView(records, tuple(cluster(0)), 0.0),
        {},
        pinned=(),
        regular_partitions=("batch",),
        elastic_partition="elastic",
        stale_after_s=60.0,
        now=0.0,
    )

    def wanted(max_workers: int) -> dict[str, int]:
        view = AdmissionGate(FifoPolicy(), max_workers=max_workers).rule_view(obs.snapshot)
        return {job.job_id: job.requested_workers * job.gpus_per_worker for job in view.jobs}

    assert wanted(6) == {"7": 12, "8": 6}  # 7: 6 workers (the site's cap) x 2; 8: 6 x 1
    assert wanted(64) == {"7": 16, "8": 16}  # the cluster's 16


def test_status_shows_a_held_job_as_held_by_amoebad() -> None:
    data = {
        "pid": 1,
        "uid": 0,
        "uptime_s": 3.0,
        "listen": "tcp://x:1",
        "policy": "elastic-backfill",
        "interval_s": 5.0,
        "draining": False,
        "jobs": {"elastic": 0, "regular_running": 1, "regular_pending": 0},
        "workers": 0,
        "gpus": {"free": 4, "total": 16},
        "agents": 0,
        "in_flight": {},
        "pinned": [],
        "admission": {
            "enabled": True,
            "max_hold_s": 3600.0,
            "held_count": 1,
            "held": [{"job_id": "7", "user": "alice", "wanted": 8, "since": 1.0, "held_s": 12.0}],
        },
    }
    text = _format_status(data)
    assert "job 7 (user alice): held by amoebad: waiting for 8 GPUs, 12 s so far" in text


def test_enabling_without_rights_is_refused_and_the_config_is_read() -> None:
    slurm = MemorySlurm({}, [])
    with pytest.raises(ConfigError, match=r"admission.enabled refused: .*or set admission.enabled: false"):
        make_admitter(
            Admission(enabled=True, holds_by="daemon"), ("batch",), slurm, DaemonMetrics(), uid=1003, user="amoeba"
        )
    with pytest.raises(ConfigError, match="cannot hold jobs"):
        make_admitter(
            Admission(enabled=True, holds_by="daemon"), ("batch",), object(), DaemonMetrics(), uid=0, user="root"
        )
    assert make_admitter(Admission(enabled=False), ("batch",), object(), DaemonMetrics(), uid=1003, user="x") is None
    owners = make_admitter(Admission(), ("batch",), object(), DaemonMetrics(), uid=1003, user="x")
    assert owners is not None and owners.owners_hold and not owners.restore_priority  # the default needs no rights
    made = make_admitter(
        Admission(enabled=True, holds_by="daemon"), ("batch",), slurm, DaemonMetrics(), uid=0, user="root"
    )
    assert made is not None and made.restore_priority
    assert parse_config({}).admission == Admission()
    config = parse_config({"admission": {"enabled": True, "max_hold_s": 60, "partitions": ["batch"], "users": ["a"]}})
    assert config.admission == Admission(True, 60.0, ("batch",), ("a",))
    for section, key in (({"max_hold_s": 0}, "max_hold_s"), ({"users": "a"}, "users"), ({"x": 1}, "x")):
        with pytest.raises(ConfigError, match=rf"admission\.{key}"):
            parse_config({"admission": section})
    shipped = load_config(Path(__file__).resolve().parents[3] / "configs" / "amoebad.yaml")
    assert shipped.admission == Admission()


def test_the_simulated_default_admission_is_the_shipped_daemon_rule_for_rule() -> None:
    # docs/simulator.md's figures for "the daemon's default" are the simulator's `amoebad` policy with the admission
    # layer and its other settings as they come; they speak of amoebad only while these agree with what it ships.
    shipped = load_config(Path(__file__).resolve().parents[3] / "configs" / "amoebad.yaml")
    simulated = AmoebadPolicy(admission=AdmissionLayer())
    assert simulated.admission is not None and simulated.admission.max_hold_s == shipped.admission.max_hold_s
    assert (simulated.whole_node is not None) == shipped.whole_node_starts
    assert (simulated.las_order is not None) == shipped.queue_order.enabled
    # The simulator's what-ifs without a live counterpart stay off: starting an arrival below its request to spare
    # long jobs' loans, or smaller on one node.
    admission = simulated.admission
    assert admission.spare_tail_factor == 0 and not admission.spare_longer_jobs and not admission.compact_admissions


def test_admission_needs_an_administrator_because_slurm_refuses_an_operator_the_admin_comment() -> None:
    # Live on the replay cluster an Operator's every hold failed: `scontrol update JobId=N AdminComment=...` ->
    # "Access/permission denied" (hold, release and Priority= went through), so no job was ever held.
    slurm = MemorySlurm({}, [], level="Operator")
    with pytest.raises(ConfigError) as refused:
        make_admitter(
            Admission(enabled=True, holds_by="daemon"), ("batch",), slurm, DaemonMetrics(), uid=1003, user="amoebad"
        )
    text = str(refused.value)
    assert "AdminLevel Operator" in text and "sacctmgr modify user amoebad set adminlevel=Administrator" in text
    assert "only administrators set the AdminComment" in text and text.endswith("or set admission.enabled: false")
    slurm.level = "Administrator"
    made = make_admitter(
        Admission(enabled=True, holds_by="daemon"), ("batch",), slurm, DaemonMetrics(), uid=1003, user="amoebad"
    )
    assert made is not None
    slurm.level = "Operator"  # queue ordering only sets priorities: an Operator still may
    assert operator_rights(slurm, 1003, "amoebad") == ("AdminLevel Operator", "")


def test_amoebad_refuses_to_start_with_admission_and_no_rights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "amoebad.yaml"
    config.write_text("metrics: {port: 0}\nlisten: tcp://127.0.0.1:1\nadmission: {enabled: true, holds_by: daemon}\n")
    monkeypatch.setattr(CliSlurmClient, "config_values", lambda self: {"SlurmUser": "slurm(64030)"})
    monkeypatch.setattr(CliSlurmClient, "admin_level", lambda self, user: "None")
    with pytest.raises(ConfigError) as refused:
        Daemon(load_config(config), CliSlurmClient({}, timeout=1), user=DaemonUser(1003, "amoeba"))
    err = str(refused.value)
    assert "admission.enabled refused: amoebad runs as amoeba (uid 1003)" in err
    assert "sacctmgr modify user amoeba set adminlevel=Administrator" in err


def test_a_refused_hold_backs_off_per_job_with_one_warning_naming_the_fix(caplog: pytest.LogCaptureFixture) -> None:
    slurm = MemorySlurm({7: elastic_job(), 8: elastic_job(8, submit_time=1_001)}, cluster(used=12), refuse=True)
    daemon = admitter(slurm, user="amoeba-replayd")
    caplog.set_level("DEBUG", logger="slurm_amoeba.daemon.refusals")
    tried: list[float] = []
    for now in range(2_000, 2_100):  # one round a second, Slurm refusing every call
        before = len(slurm.calls)
        done = daemon.apply(slurm.view(), float(now))
        if len(slurm.calls) > before:
            tried.append(now - 2_000)
            assert done.failed == ("7", "8") and done.backing_off == ()
        else:
            assert done.backing_off == ("7", "8") and done.failed == ()
    assert tried == [0, 10, 30, 70]  # waits of 10, 20, 40 s, then 80 s (past the end)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2  # one per job, then debug-level
    assert "hold of job 7 refused by Slurm" in warnings[0] and "Access/permission denied" in warnings[0]
    assert "`sacctmgr modify user amoeba-replayd set adminlevel=Administrator`" in warnings[0]
    assert "admission.enabled: false" in warnings[0]
    assert sum(r.levelname == "DEBUG" and "refused again" in r.getMessage() for r in caplog.records) == 6
    # Granted the right: the next try holds the job and forgets its refusals; a new refusal warns again.
    slurm.refuse = False
    assert daemon.apply(slurm.view(), 2_170.0).held == ("7", "8")
    assert daemon.admitter.refusals.refusals("7") == 0
    slurm.nodes = cluster(used=0)
    slurm.refuse = True
    caplog.clear()
    assert daemon.apply(slurm.view(), 2_171.0).failed == ("7", "8")  # the release is refused now
    assert [r.getMessage().split(":")[0] for r in caplog.records if r.levelname == "WARNING"] == [
        "[daemon/admission] release of job 7 refused by Slurm",
        "[daemon/admission] release of job 8 refused by Slurm",
    ]
    assert daemon.apply(slurm.view(), 2_172.0).backing_off == ("7", "8")


def test_a_job_that_leaves_is_forgotten_and_another_refusal_names_no_rights_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    slurm = MemorySlurm({7: elastic_job()}, cluster(used=12), refuse=True)
    daemon = admitter(slurm)
    daemon.apply(slurm.view(), 2_000.0)
    assert daemon.admitter.refusals.refusals("7") == 1
    del slurm.records[7]
    daemon.apply(slurm.view(), 2_001.0)
    assert daemon.admitter.refusals.refusals("7") == 0 and daemon.admitter.refusals.waiting(2_001.0) == ()
    slurm = MemorySlurm({7: elastic_job()}, cluster(used=12))

    def busy(job_id: int, text: str) -> None:
        raise SlurmCommandError(["scontrol", "update"], 1, "Slurm temporarily unable to accept job, sleeping")

    slurm.set_admin_comment = busy  # type: ignore[method-assign]
    caplog.clear()
    assert admitter(slurm).apply(slurm.view(), 2_000.0).failed == ("7",)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "temporarily unable" in warning and "sacctmgr" not in warning


def test_the_stop_tries_every_held_job_whatever_its_backoff() -> None:
    slurm = MemorySlurm({7: elastic_job()}, cluster(used=12))
    daemon = admitter(slurm)
    daemon.apply(slurm.view(), 2_000.0)
    slurm.nodes = cluster(used=0)
    slurm.refuse = True
    daemon.apply(slurm.view(), 2_001.0)  # the release refused: job 7 backs off
    assert not daemon.admitter.refusals.ready("7", 2_002.0)
    slurm.refuse = False
    assert daemon.admitter.release_all() == 1


def test_the_backoff_doubles_up_to_its_cap_and_counts_one_step_a_round() -> None:
    refusals = Refusals("[test]", "the fix", base_s=10.0, cap_s=60.0)
    error = SlurmCommandError(["scontrol", "hold", "7"], 1, "Access/permission denied")
    waits = [refusals.refused("7", "hold", error, now) for now in (0.0, 10.0, 30.0, 70.0, 130.0, 130.0, 190.0)]
    assert waits == [10.0, 20.0, 40.0, 60.0, 60.0, 60.0, 60.0]
    assert refusals.refusals("7") == 6 and refusals.waiting(200.0) == ("7",) and refusals.ready("7", 250.0)
    with pytest.raises(ValueError):
        Refusals("[test]", "", base_s=0.0)
