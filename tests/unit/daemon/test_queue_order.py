"""Queue ordering in the daemon: which jobs it touches, what it changes (only the differences, bounded), what it does
when jobs vanish, how it reverts, the rights check and the configuration (a Slurm that lives in memory)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from slurm_amoeba.cli import amoebad
from slurm_amoeba.daemon.actuator import Actuator, QueueOrderer, QueueRound, make_queue_orderer, operator_rights
from slurm_amoeba.daemon.config import ConfigError, DaemonConfig, QueueOrder, load_config, parse_config
from slurm_amoeba.daemon.daemon import Daemon, DaemonUser
from slurm_amoeba.daemon.executor import LiveExecutor
from slurm_amoeba.daemon.ledger import Ledger
from slurm_amoeba.daemon.metrics import DaemonMetrics
from slurm_amoeba.daemon.observer import ClusterView, ServiceBook
from slurm_amoeba.daemon.snapshot import build_snapshot
from slurm_amoeba.policy import check_actions
from slurm_amoeba.policy.fifo import FifoPolicy
from slurm_amoeba.policy.queue_order import QueueOrderLayer
from slurm_amoeba.slurm import CliSlurmClient, JobRecord, JobState, SlurmCommandError
from slurm_amoeba.slurm.parsers import parse_past_service
from tests.unit.daemon.fakes import job, satellite

PENDING = JobState.PENDING


@dataclasses.dataclass
class FakeControl:
    """Slurm's priorities in memory; ``gone`` jobs answer as Slurm does for a finished job."""

    priorities: dict[int, int] = dataclasses.field(default_factory=dict)
    calls: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)
    gone: set[int] = dataclasses.field(default_factory=set)
    refuse: bool = False
    config: dict[str, str] = dataclasses.field(
        default_factory=lambda: {"SlurmUser": "slurm(64030)", "PriorityType": "priority/basic"}
    )
    levels: dict[str, str] = dataclasses.field(default_factory=dict)
    past: dict[int, float] = dataclasses.field(default_factory=dict)
    asked: list[list[int]] = dataclasses.field(default_factory=list)

    def _check(self, argv: list[str], job_id: int) -> None:
        if job_id in self.gone:
            raise SlurmCommandError(argv, 1, f"Job has already finished for job {job_id}")
        if self.refuse:
            raise SlurmCommandError(argv, 1, f"Access/permission denied for job {job_id}")

    def set_priority(self, job_id: int, priority: int) -> None:
        self.calls.append(("priority", job_id, priority))
        self._check(["scontrol", "update"], job_id)
        self.priorities[job_id] = priority

    def hold(self, job_id: int) -> None:
        self.calls.append(("hold", job_id, 0))
        self._check(["scontrol", "hold"], job_id)

    def release(self, job_id: int) -> None:
        self.calls.append(("release", job_id, 0))
        self._check(["scontrol", "release"], job_id)

    def config_values(self) -> dict[str, str]:
        return dict(self.config)

    def admin_level(self, user: str) -> str:
        return self.levels.get(user, "None")

    def past_service(self, job_ids: Collection[int]) -> dict[int, float]:
        self.asked.append(sorted(job_ids))
        if self.refuse:
            raise SlurmCommandError(["sacct"], 1, "Slurm accounting storage is disabled")
        return {job: self.past[job] for job in job_ids if job in self.past}


def view(records: list[JobRecord], control: FakeControl, now: float = 2_000.0) -> ClusterView:
    """The records as Slurm shows them, with the priorities the control has set."""
    shown = [dataclasses.replace(r, priority=control.priorities.get(r.job_id, r.priority)) for r in records]
    return ClusterView(tuple(shown), (), now)


def pending(job_id: int, **kwargs: Any) -> JobRecord:
    """A pending job of one GPU in partition batch."""
    return job(job_id, state=PENDING, gpus_per_node=1, **kwargs)


class Ordering:
    """The daemon's queue-ordering path in one object: the service book and the snapshot step, the queue-order
    layer, the executor with its QueueOrderer (as Daemon composes them)."""

    def __init__(self, control: FakeControl, queue: QueueOrderer) -> None:
        self.orderer = queue
        settings = queue.settings
        self.layer = QueueOrderLayer(
            FifoPolicy(),
            settings.thresholds_gpu_s,
            frozenset(queue.partitions),
            frozenset(settings.users),
            queue.touched,
        )
        self.book = ServiceBook(control.past_service)
        ledger = Ledger(DaemonConfig(), queue.metrics, lambda: 0.0)
        self.executor = LiveExecutor(ledger, Actuator(1, 1.0, 0), queue.metrics, orderer=queue, revert_on_stop=False)

    def apply(self, shown: ClusterView, now: float, make_room_after_s: float = 0.0) -> QueueRound:
        obs = build_snapshot(
            shown,
            {},
            pinned=(),
            regular_partitions=("batch",),
            elastic_partition="elastic",
            stale_after_s=60.0,
            now=now,
            make_room_after_s=make_room_after_s,
            service=self.book.update(shown, now),
        )
        jobs = obs.snapshot.queued_by_id()
        actions = self.layer.decide(obs.snapshot, now)
        check_actions(obs.snapshot, actions)  # as the daemon's round does before it applies them
        self.executor.apply(actions, jobs, (), source="policy", now=now)
        self.executor.wait()
        assert self.orderer.last is not None
        return self.orderer.last


def orderer(control: FakeControl, *, release_to_restore: bool = False, **settings: object) -> Ordering:
    settings.setdefault("thresholds_gpu_s", (100.0,))
    config = QueueOrder(enabled=True, **settings)  # type: ignore[arg-type]
    queue = QueueOrderer(config, ("batch",), control, DaemonMetrics(), release_to_restore=release_to_restore)
    return Ordering(control, queue)


def test_a_job_with_much_attained_service_goes_behind_fresh_ones_and_nothing_changes_twice() -> None:
    control = FakeControl()
    queue = orderer(control)
    old = job(1, gpus={"n1": 4}, submit_time=1_000, priority=30)  # started at 1001
    queue.apply(view([old], control, now=1_101.0), 1_101.0)  # 400 GPU-s attained
    requeued = pending(1, submit_time=1_000, priority=30)
    fresh = [
        pending(2, submit_time=1_050, priority=20),
        pending(3, submit_time=1_060, priority=10),
    ]
    records = [requeued, *fresh]
    done = queue.apply(view(records, control), 2_000.0)
    assert control.priorities == {2: 30, 3: 20, 1: 10}
    assert done.changed == (("2", 30), ("3", 20), ("1", 10)) and done.pending == 3
    assert queue.orderer.touched == {"2": 20, "3": 10, "1": 30}
    control.calls.clear()
    again = queue.apply(view(records, control), 2_005.0)
    assert control.calls == [] and again.changed == ()
    assert queue.orderer.metrics.queue_updates.value({"action": "priority", "outcome": "ok"}) == 3
    assert queue.orderer.metrics.queue_jobs.value({"queue": "1"}) == 1


def test_in_submit_order_with_nobody_served_it_changes_nothing() -> None:
    control = FakeControl()
    records = [pending(i, submit_time=1_000 + i, priority=100 - i) for i in range(1, 5)]
    assert orderer(control).apply(view(records, control), 2_000.0).changed == ()
    assert control.calls == []


def test_a_pending_satellite_is_the_daemons_own_extra_and_never_reordered() -> None:
    control = FakeControl()
    queue = orderer(control)
    parent = job(5, gpus={"n1": 4}, submit_time=1_000, partition="batch")
    waiting_sat = satellite(
        8, parent=5, state=PENDING, gpus_per_node=1, submit_time=1_900, priority=50, partition="batch"
    )
    others = [pending(9, submit_time=1_950, priority=40), pending(10, submit_time=1_940, priority=30)]
    queue.apply(view([parent, waiting_sat, *others], control), 2_000.0)
    assert control.priorities == {10: 40, 9: 30}


def test_held_jobs_other_partitions_and_other_users_are_never_touched() -> None:
    control = FakeControl()
    queue = orderer(control, users=("alice",))
    records = [
        pending(1, submit_time=1_000, priority=0, reason="JobHeldUser"),
        pending(2, submit_time=1_010, priority=5, partition="elastic"),
        pending(3, submit_time=1_020, priority=6, partition="batch,elastic"),
        pending(4, submit_time=1_030, priority=7, user="bob"),
        pending(5, submit_time=1_040, priority=1),
        pending(6, submit_time=1_050, priority=2),
    ]
    queue.apply(view(records, control), 2_000.0)
    assert {call[1] for call in control.calls} == {5, 6}


def test_a_heterogeneous_job_is_reordered_through_its_leader_only() -> None:
    control = FakeControl()
    leader = pending(10, het_job_id=10, het_job_offset=0, submit_time=1_000, priority=1)
    member = pending(11, het_job_id=10, het_job_offset=1, submit_time=1_000, priority=1)
    later = pending(12, submit_time=1_100, priority=2)
    orderer(control).apply(view([leader, member, later], control), 2_000.0)
    assert {call[1] for call in control.calls} == {10, 12}


def test_the_bound_defers_the_rest_to_later_rounds_first_jobs_first() -> None:
    control = FakeControl()
    queue = orderer(control, max_updates_per_round=2)
    records = [pending(i, submit_time=1_000 + i, priority=i) for i in range(1, 6)]  # reversed
    first = queue.apply(view(records, control), 2_000.0)
    assert [c[1] for c in control.calls] == [1, 2] and first.deferred == 2  # 3 has its place already
    for _ in range(5):
        queue.apply(view(records, control), 2_000.0)
    shown = view(records, control).jobs
    assert [r.job_id for r in sorted(shown, key=lambda r: -r.priority)] == [1, 2, 3, 4, 5]
    assert queue.orderer.metrics.queue_deferred.value() == 2


def test_a_job_that_vanished_before_its_update_is_counted_and_forgotten() -> None:
    control = FakeControl(gone={1})
    queue = orderer(control)
    records = [
        pending(1, submit_time=1_000, priority=1),
        pending(2, submit_time=1_010, priority=2),
    ]
    done = queue.apply(view(records, control), 2_000.0)
    assert done.vanished == ("1",) and done.changed == (("2", 1),)
    assert queue.orderer.metrics.queue_updates.value({"action": "priority", "outcome": "vanished"}) == 1
    queue.apply(view([records[1]], control), 2_005.0)  # 1 is gone from Slurm's view too
    assert "1" not in queue.orderer.touched


def test_a_refusal_is_counted_as_a_failure() -> None:
    control = FakeControl(refuse=True)
    queue = orderer(control)
    records = [
        pending(1, submit_time=1_000, priority=1),
        pending(2, submit_time=1_010, priority=2),
    ]
    assert queue.apply(view(records, control), 2_000.0).failed == ("1", "2")
    assert queue.orderer.touched == {}


def test_revert_sets_the_priorities_slurm_had_given_under_priority_basic() -> None:
    control = FakeControl()
    queue = orderer(control)
    records = [
        pending(1, submit_time=1_000, priority=1),
        pending(2, submit_time=1_010, priority=2),
    ]
    queue.apply(view(records, control), 2_000.0)
    assert control.priorities == {1: 2, 2: 1}
    assert queue.orderer.revert() == 2
    assert control.priorities == {1: 1, 2: 2} and queue.orderer.touched == {}


def test_revert_holds_and_releases_under_priority_multifactor() -> None:
    control = FakeControl()
    queue = orderer(control, release_to_restore=True)
    records = [
        pending(1, submit_time=1_000, priority=1),
        pending(2, submit_time=1_010, priority=2),
    ]
    queue.apply(view(records, control), 2_000.0)
    control.calls.clear()
    control.gone = {2}  # started meanwhile
    assert queue.orderer.revert() == 1
    assert control.calls == [("hold", 1, 0), ("release", 1, 0), ("hold", 2, 0)]


# ---------------------------------------------------------------------------------------------------- rights


def test_root_the_slurm_user_and_operators_have_the_rights_others_do_not() -> None:
    control = FakeControl(levels={"op": "Operator", "adm": "Administrator"})
    assert operator_rights(control, 0, "root")[0] == "root"
    assert operator_rights(control, 64030, "slurm")[0].startswith("SlurmUser")
    assert operator_rights(control, 1001, "op") == ("AdminLevel Operator", "")
    assert operator_rights(control, 1002, "adm") == ("AdminLevel Administrator", "")
    why, refusal = operator_rights(control, 1003, "amoeba")
    assert why == "" and "sacctmgr modify user amoeba set adminlevel=Operator" in refusal


def test_enabling_without_rights_is_refused_at_start_with_the_fix() -> None:
    settings = QueueOrder(enabled=True)
    with pytest.raises(ConfigError, match="adminlevel=Operator"):
        make_queue_orderer(settings, ("batch",), FakeControl(), DaemonMetrics(), uid=1003, user="amoeba")
    with pytest.raises(ConfigError, match="cannot update jobs"):
        make_queue_orderer(settings, ("batch",), object(), DaemonMetrics(), uid=0, user="root")
    assert make_queue_orderer(QueueOrder(), ("batch",), object(), DaemonMetrics(), uid=1003, user="x") is None
    made = make_queue_orderer(
        settings, ("batch",), FakeControl(levels={"op": "Operator"}), DaemonMetrics(), uid=1001, user="op"
    )
    assert made is not None and not made.release_to_restore


# ---------------------------------------------------------------------------------------------------- configuration


def test_queue_order_is_off_by_default_and_reads_its_keys() -> None:
    assert parse_config({}).queue_order == QueueOrder()
    config = parse_config(
        {
            "queue_order": {
                "enabled": True,
                "thresholds_gpu_s": [3600, 57600],
                "partitions": ["batch", "elastic"],
                "users": ["alice"],
                "max_updates_per_round": 5,
                "revert_on_stop": False,
            }
        }
    )
    assert config.queue_order == QueueOrder(True, (3600.0, 57600.0), ("batch", "elastic"), ("alice",), 5, False)


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"enabled": "yes"}, "queue_order.enabled"),
        ({"thresholds_gpu_s": [100, 50]}, "queue_order.thresholds_gpu_s"),
        ({"thresholds_gpu_s": []}, "queue_order.thresholds_gpu_s"),
        ({"thresholds_gpu_s": [0]}, "queue_order.thresholds_gpu_s"),
        ({"partitions": "batch x"}, "queue_order.partitions"),
        ({"users": ["a b"]}, "queue_order.users"),
        ({"max_updates_per_round": 0}, "queue_order.max_updates_per_round"),
        ({"bogus": 1}, "queue_order.bogus"),
    ],
)
def test_a_bad_queue_order_value_names_its_key(section: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_config({"queue_order": section})


def test_the_shipped_config_documents_the_defaults() -> None:
    shipped = load_config(Path(__file__).resolve().parents[3] / "configs" / "amoebad.yaml")
    assert shipped.queue_order == QueueOrder()


def test_after_a_restart_the_first_round_reads_requeued_jobs_past_runs_from_accounting_once() -> None:
    control = FakeControl(past={1: 500.0})
    queue = orderer(control)
    records = [
        pending(1, submit_time=1_000, priority=3),
        pending(2, submit_time=1_010, priority=2),
    ]
    queue.apply(view(records, control), 2_000.0)
    assert control.asked == [[1, 2]]
    assert control.priorities == {2: 3, 1: 2}  # 1 ran 500 GPU-s before the daemon started: behind 2
    queue.apply(view(records, control), 2_001.0)
    assert control.asked == [[1, 2]]


def test_without_accounting_the_daemon_counts_from_its_own_start() -> None:
    control = FakeControl(past={1: 500.0}, refuse=True)
    queue = orderer(control)
    records = [
        pending(1, submit_time=1_000, priority=3),
        pending(2, submit_time=1_010, priority=2),
    ]
    assert queue.apply(view(records, control), 2_000.0).changed == ()


def test_sacct_lines_give_elapsed_times_gpus_summed_over_runs() -> None:
    text = (
        "9|2|billing=4,cpu=4,gres/gpu=16,node=4\n"
        "9|0|\n"
        "12|3|billing=1,cpu=1,gres/gpu=2,node=1\n"
        "12|5|cpu=1,gres/gpu=2,node=1\n"
        "13+0|4|cpu=1,node=1\n"
        "13+1|4|cpu=2,gres/gpu=4,node=1\n"
        "garbage\n"
        "14|x|gres/gpu=1\n"
    )
    assert parse_past_service(text) == {9: 32.0, 12: 16.0, 13: 16.0}


def test_amoebad_refuses_to_start_with_queue_order_and_no_rights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "amoebad.yaml"
    config.write_text("metrics: {port: 0}\nlisten: tcp://127.0.0.1:1\nqueue_order: {enabled: true}\n")
    monkeypatch.setattr(CliSlurmClient, "config_values", lambda self: {"SlurmUser": "slurm(64030)"})
    monkeypatch.setattr(CliSlurmClient, "admin_level", lambda self, user: "None")
    with pytest.raises(ConfigError, match=r"queue_order.enabled refused: amoebad runs as amoeba \(uid 1003\)"):
        Daemon(load_config(config), CliSlurmClient({}, timeout=1), user=DaemonUser(1003, "amoeba"))
    assert amoebad.main(["--config", str(config), "--check"]) == 0
    assert "queue_order       on in batch (thresholds 57600 GPU-s" in capsys.readouterr().out


def test_a_refused_update_backs_off_without_taking_the_bounds_places(caplog: pytest.LogCaptureFixture) -> None:
    control = FakeControl()
    refused = {1}
    original = control.set_priority

    def set_priority(job_id: int, priority: int) -> None:
        if job_id in refused:
            control.calls.append(("priority", job_id, priority))
            # What Slurm 22.05 answers a user without AdminLevel (measured).
            raise SlurmCommandError(["scontrol", "update"], 1, f"Invalid user id for job {job_id}")
        original(job_id, priority)

    control.set_priority = set_priority  # type: ignore[method-assign]
    queue = Ordering(
        control,
        QueueOrderer(
            QueueOrder(enabled=True, thresholds_gpu_s=(100.0,), max_updates_per_round=1),
            ("batch",),
            control,
            DaemonMetrics(),
            user="amoebad",
        ),
    )
    records = [
        pending(1, submit_time=1_000, priority=1),
        pending(2, submit_time=1_010, priority=2),
        pending(3, submit_time=1_020, priority=3),
    ]
    first = queue.apply(view(records, control), 2_000.0)
    assert first.failed == ("1",) and first.changed == ()
    second = queue.apply(view(records, control), 2_001.0)  # 1 waits: 3 gets the round's one place
    assert second.backing_off == ("1",) and second.changed == (("3", 1),)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "priority of job 1 refused by Slurm" in warning
    assert "`sacctmgr modify user amoebad set adminlevel=Operator`" in warning
    assert "queue_order.enabled: false" in warning
    refused.clear()
    queue.apply(view(records, control), 2_005.0)
    assert [c[1] for c in control.calls if c[1] == 1] == [1]  # not tried again before its 10 s
    assert queue.apply(view(records, control), 2_010.0).changed == (("1", 3),)
    assert queue.orderer.refusals.refusals("1") == 0 and control.priorities == {1: 3, 3: 1}


def test_the_requeued_job_of_the_e2e_scenario_goes_behind_the_fresh_ones_once_it_waits_for_resources() -> None:
    # tests/e2e/test_queue_order.py: A (whole cluster) runs ~3 s, is requeued and keeps the highest priority; X
    # runs while A, B and C wait (whole-cluster jobs of the test's own user, threshold 20 GPU-s).
    control = FakeControl()
    queue = orderer(control, thresholds_gpu_s=(20.0,), users=("amoeba-las",))
    whole = {"gpus_per_node": 4, "node_count": 4, "user": "amoeba-las"}
    cluster = {f"n{i}": 4 for i in range(1, 5)}
    queue.apply(view([job(1, gpus=cluster, user="amoeba-las")], control), 1_004.0)  # 3 s x 16 GPUs
    blocker = job(2, gpus=cluster, submit_time=1_004, user="amoeba-las")
    fresh = [
        job(3, state=PENDING, submit_time=1_004, priority=99, reason="Priority", **whole),  # type: ignore[arg-type]
        job(4, state=PENDING, submit_time=1_004, priority=98, reason="Priority", **whole),  # type: ignore[arg-type]
    ]
    requeued = job(1, state=PENDING, priority=100, reason="BeginTime", **whole)  # type: ignore[arg-type]
    queue.apply(view([requeued, blocker, *fresh], control), 1_005.0)
    assert control.calls == []  # A cannot start before its begin time: not ordered, B and C are in order
    requeued = dataclasses.replace(requeued, state_reason="Resources")  # `scontrol update StartTime=now`
    done = queue.apply(view([requeued, blocker, *fresh], control), 1_006.0)
    assert done.changed == (("3", 100), ("4", 99), ("1", 98))


def test_young_jobs_left_to_slurm_are_ordered_all_the_same() -> None:
    # The e2e scenario as amoebad runs it: B and C were submitted 2 s ago while X holds every GPU, so the snapshot
    # leaves them to Slurm (younger than make_room_after_s, nothing free): they are still in Slurm's queue, behind
    # the requeued A, and queue ordering puts them first.
    control = FakeControl()
    queue = orderer(control, thresholds_gpu_s=(20.0,), users=("amoeba-las",))
    whole = {"gpus_per_node": 4, "node_count": 4, "user": "amoeba-las"}
    cluster = {f"n{i}": 4 for i in range(1, 5)}
    queue.apply(view([job(1, gpus=cluster, user="amoeba-las")], control), 1_004.0, make_room_after_s=5.0)
    blocker = job(2, gpus=cluster, submit_time=1_004, user="amoeba-las")
    fresh = [
        job(3, state=PENDING, submit_time=1_004, priority=99, reason="Priority", **whole),  # type: ignore[arg-type]
        job(4, state=PENDING, submit_time=1_004, priority=98, reason="Priority", **whole),  # type: ignore[arg-type]
    ]
    requeued = job(1, state=PENDING, priority=100, reason="Resources", **whole)  # type: ignore[arg-type]
    done = queue.apply(view([requeued, blocker, *fresh], control), 1_006.0, make_room_after_s=5.0)
    assert done.changed == (("3", 100), ("4", 99), ("1", 98))
    assert queue.orderer.touched == {"3": 99, "4": 98, "1": 100}  # their own priorities, for the revert
