"""An adaptive job's statistics through the daemon: the report's checked values, the ledger's latest per job, the
snapshot's goodput table and model, and the ``goodput`` policy's batch on the directives (a real daemon's request
handling and rounds, against a fake agent on a real socket)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_amoeba.daemon import Daemon
from slurm_amoeba.daemon.agents import AdaptiveStats, AgentMessageError, Report
from slurm_amoeba.daemon.snapshot import DENSE_SIZES, adaptive_inputs
from slurm_amoeba.policy import Resize
from slurm_amoeba.policy.goodput import REBATCH_FACTOR, GoodputModel, goodput_rates, model_from_report, with_batches
from slurm_amoeba.policy.types import JobInfo, JobPhase, Snapshot
from tests.unit.daemon.fakes import register_body, report_body
from tests.unit.daemon.test_daemon import FakeAgent, ask, cluster, make_daemon, settle, wait_for

ADAPTIVE: dict[str, Any] = {
    "global_batch": 64,
    "base_batch": 32,
    "max_batch": 1024,
    "noise_scale": 2000.0,
    "step_time_s": [[2, 32, 0.06, 10], [2, 64, 0.08, 30]],
    "efficiency": 0.98,
    "measured_steps": 40,
    "policy_batch": None,
    "batch_source": "runtime",
}


def adaptive_report(size: int, target: int | None = None, **fields: Any) -> dict[str, Any]:
    return {**report_body("100", size, target), "adaptive": {**ADAPTIVE, **fields}}


def stats(**fields: Any) -> AdaptiveStats:
    return AdaptiveStats.from_body({**ADAPTIVE, **fields})


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"global_batch": 16}, "base <= global <= max"),
        ({"max_batch": 1 << 24}, "max <= 16777215"),
        ({"base_batch": 0}, "1 <= base"),
        ({"noise_scale": -1.0}, "noise_scale=-1.0"),
        ({"noise_scale": 1e16}, "noise_scale"),
        ({"step_time_s": [[0, 32, 0.1, 1]]}, "workers, batch, seconds"),
        ({"step_time_s": [[2, 32, 0.0, 1]]}, "workers, batch, seconds"),
        ({"step_time_s": [[2, 32, 1e6, 1]]}, "workers, batch, seconds"),
        ({"step_time_s": [[2, 1 << 25, 0.1, 1]]}, "workers, batch, seconds"),
        ({"step_time_s": [[2, 32, 0.1, -1]]}, "workers, batch, seconds"),
        ({"efficiency": -0.5}, "efficiency"),
        ({"policy_batch": 0}, "policy_batch"),
        ({"measured_steps": -1}, "measured_steps"),
        ({"batch_source": "scheduler"}, "batch_source"),
    ],
)
def test_adaptive_statistics_out_of_range_are_refused_naming_the_value(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(AgentMessageError, match=match):
        stats(**fields)


def test_a_report_keeps_its_statistics_and_gives_them_back_in_the_runtimes_form() -> None:
    report = Report.from_body(adaptive_report(2), received_at=5.0)
    assert report.adaptive is not None and report.adaptive.global_batch == 64
    assert model_from_report(report.adaptive.as_report()) == model_from_report(ADAPTIVE)
    assert Report.from_body(report_body("100", 2), received_at=5.0).adaptive is None


def test_the_snapshots_inputs_are_the_goodput_model_its_rates_and_the_jobs_batch() -> None:
    model, rates, batch = adaptive_inputs(stats(), 8)
    expected = model_from_report(ADAPTIVE)
    assert expected is not None and model == expected
    assert rates == goodput_rates(expected, 8) and batch == 64
    assert adaptive_inputs(stats(policy_batch=256, batch_source="policy"), 8)[2] == 256, "moving to the policy's"
    assert adaptive_inputs(stats(batch_source="user"), 8)[2] is None, "the user owns the batch"
    assert adaptive_inputs(stats(step_time_s=[]), 8) == (None, {}, None), "no step time yet: no model"
    assert adaptive_inputs(None, 8) == (None, {}, None)
    _, wide, _ = adaptive_inputs(stats(), 100_000)
    assert set(range(1, DENSE_SIZES + 1)) <= set(wide) and max(wide) == 100_000
    assert len(wide) < DENSE_SIZES + 45, "beyond the dense sizes, a grid 1.25x apart"
    for size in (DENSE_SIZES + 1, 100, 5000):  # between grid points, what a policy reads is interpolated
        info = JobInfo("1", JobPhase.RUNNING, 0.0, 1, 1, 100_000, workers=1, throughput=wide)
        exact = model.best(size)[1] if model else 0.0
        assert info.rate(size) == pytest.approx(exact, rel=0.02)


def _info(job_id: str, workers: int, model: GoodputModel | None, batch: int | None, **kw: Any) -> JobInfo:
    return JobInfo(job_id, JobPhase.RUNNING, 0.0, 1, 1, 8, workers=workers, adaptive=model, batch=batch, **kw)


def test_goodputs_directives_carry_the_models_batch_and_a_drifted_job_gets_one_at_its_size() -> None:
    model = model_from_report(ADAPTIVE)
    assert model is not None
    at4, at2 = model.best(4)[0], model.best(2)[0]
    drifted = max(1, int(at2 / (REBATCH_FACTOR + 0.1)))
    managed = {
        "1": _info("1", 2, model, 64),  # resized by the policy
        "2": _info("2", 2, model, at2),  # kept at its size, batch already the model's: nothing
        "3": _info("3", 2, model, drifted),  # kept, batch drifted: a directive to the same size
        "4": _info("4", 2, None, None),  # fixed batch: nothing
        "5": _info("5", 2, model, drifted, pinned=True),  # pinned: left alone
        "6": _info("6", 2, model, None),  # the user sets the batch: nothing
    }
    answer = with_batches(Snapshot((), tuple(managed.values())), [Resize("1", 4, reason="grow"), Resize("4", 3)])
    assert [(a.job_id, a.workers, a.batch) for a in answer if isinstance(a, Resize)] == [
        ("1", 4, at4),
        ("4", 3, None),
        ("3", 2, at2),
    ]
    assert len(answer) == 3 and f"global batch {at2}" in answer[2].reason


@contextlib.contextmanager
def registered(
    tmp_path: Path, report: dict[str, Any], *, policy: str = "goodput", high: int = 4
) -> Iterator[tuple[Daemon, FakeAgent]]:
    """A daemon running ``policy`` (its own state file under ``tmp_path``) with job 100 (2 workers, range
    ``high``..4 or 2..2) registered behind a fake agent and ``report`` taken."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    agent = FakeAgent()
    d = make_daemon(tmp_path, cluster(), policy=policy)
    try:
        low = 2 if high == 2 else 1
        assert ask(d, "register", register_body("100", agent.endpoint, low=low, high=high)).body["ok"]
        assert ask(d, "report", report).body["ok"]
        yield d, agent
    finally:
        d.close()
        agent.close()


def first_directive(d: Daemon, agent: FakeAgent, ordered: dict[str, int]) -> dict[str, Any]:
    """Run a round that orders ``ordered``; the body of the directive the agent got, once the daemon applied it."""
    summary = d.run_round()
    assert summary.error == "" and summary.ordered == ordered
    wait_for("the directive", lambda: len(agent.directives) == 1)
    settle(d, "100")
    return dict(agent.directives[0].body)


def test_goodputs_resize_of_an_adaptive_job_carries_the_batch_and_the_ledger_keeps_its_statistics(
    tmp_path: Path,
) -> None:
    model = model_from_report(ADAPTIVE)
    assert model is not None
    with registered(tmp_path, adaptive_report(2)) as (d, agent):
        assert first_directive(d, agent, {"100": 4})["batch"] == model.best(4)[0]
        assert d.agents["100"].in_flight is not None and d.agents["100"].in_flight.batch == model.best(4)[0]
        obs = d.last_observation
        assert obs is not None and obs.managed["100"].adaptive == model
        assert dict(obs.managed["100"].throughput) == goodput_rates(model, 4)
        assert ask(d, "report", report_body("100", 4)).body["ok"], "a report without statistics keeps the last"
        listed = ask(d, "jobs", {}).body["data"]["jobs"][0]["adaptive"]
        assert listed["noise_scale"] == 2000.0 and listed["global_batch"] == 64 and listed["batch_source"] == "runtime"
        refused = ask(d, "report", adaptive_report(4, global_batch=5000))
        assert not refused.body["ok"] and "base <= global <= max" in refused.body["error"]
        assert d.agents["100"].adaptive is not None and d.agents["100"].adaptive.global_batch == 64


def test_a_job_at_its_size_whose_batch_drifted_gets_the_batch_alone_and_only_once(tmp_path: Path) -> None:
    model = model_from_report(ADAPTIVE)
    assert model is not None and model.best(2)[0] >= REBATCH_FACTOR * 32
    with registered(tmp_path, adaptive_report(2, global_batch=32), high=2) as (d, agent):
        assert first_directive(d, agent, {"100": 2}) == {
            "job_id": "100",
            "target": 2,
            "batch": model.best(2)[0],
            "reason": f"goodput: global batch {model.best(2)[0]} at 2 workers (it runs 32)",
        }
        assert d.metrics.decisions.value({"kind": "batch", "source": "policy"}) == 1
        moving = adaptive_report(2, global_batch=32, policy_batch=model.best(2)[0], batch_source="runtime")
        assert ask(d, "report", moving).body["ok"]
        assert d.agents["100"].in_flight is None
        assert d.metrics.resize_latency.count == 0, "a batch-only order is no resize"
        # The round's summary lists every directive it handed to the actuator: none is proof that none is coming.
        assert d.run_round().ordered == {}, "the runtime has the batch: nothing more to send"
        assert len(agent.directives) == 1


def test_other_policies_send_no_batch_and_fixed_batch_jobs_never_get_one(tmp_path: Path) -> None:
    with registered(tmp_path / "tiresias", adaptive_report(2), policy="e-tiresias") as (d, agent):
        assert "batch" not in first_directive(d, agent, {"100": 4})
    with registered(tmp_path / "fixed", report_body("100", 2)) as (d, agent):
        assert "batch" not in first_directive(d, agent, {"100": 4})


def test_a_users_resize_request_cannot_set_the_batch(tmp_path: Path) -> None:
    with registered(tmp_path, report_body("100", 2)) as (d, _):
        refused = ask(d, "resize", {"job_id": "100", "target": 3, "reason": "", "batch": 64})
        assert not refused.body["ok"] and "cannot set the global batch" in refused.body["error"]
