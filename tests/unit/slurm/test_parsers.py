"""Parsers of squeue/sinfo JSON, GRES strings and sbatch replies, on output recorded from the test cluster.

The recordings in ``tests/data/slurm`` come from ``scripts/slurm-cluster`` (Slurm 22.05.8): ``squeue-mixed.json``
holds a satellite-like job in the elastic partition holding 2 GPUs, a running heterogeneous job of two components
and a held job; ``squeue-finished.json`` the same jobs after ``scancel``; ``squeue-accounts.json`` a held
heterogeneous job of two components submitted with ``--account=amoeba_sat --qos=amoeba_sat`` (an account and QOS made
with ``sacctmgr``; the cluster's other jobs left out); ``sinfo-*.json`` the 4 nodes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.slurm import (
    JobState,
    parse_gpu_indices,
    parse_gres_count,
    parse_sbatch_reply,
    parse_sinfo_json,
    parse_squeue_json,
    parse_step_lines,
)
from slurm_amoeba.slurm.parsers import parse_default_partition, parse_past_service, tres_gpus

DATA = Path(__file__).resolve().parents[2] / "data" / "slurm"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


def test_squeue_json_gives_jobs_with_states_nodes_and_gpu_indices() -> None:
    jobs = {j.job_id: j for j in parse_squeue_json(recorded("squeue-mixed.json"))}
    assert set(jobs) == {1, 2, 3, 4}
    sat = jobs[1]
    assert (sat.name, sat.comment, sat.partition) == ("amoeba-sat", "amoeba-parent=123", "elastic")
    assert sat.state is JobState.RUNNING and sat.nodes == ("n3",)
    assert sat.gpus_per_node == 2 and sat.gpu_indices == ((0, 1),) and sat.gpus_held == 2
    assert jobs[2].gpu_indices == ((2,),)
    held = jobs[4]
    assert held.state is JobState.PENDING and held.state_reason == "JobHeldUser" and held.nodes == ()


def test_squeue_json_gives_heterogeneous_components_their_leader_and_offset() -> None:
    jobs = {j.job_id: j for j in parse_squeue_json(recorded("squeue-mixed.json"))}
    assert (jobs[2].het_job_id, jobs[2].het_job_offset) == (2, 0)
    assert (jobs[3].het_job_id, jobs[3].het_job_offset) == (2, 1)
    assert jobs[3].gpus_per_node == 0 and jobs[3].nodes == ("n4",)
    assert not jobs[1].is_het_component


def test_squeue_json_reports_remembered_finished_jobs() -> None:
    jobs = parse_squeue_json(recorded("squeue-finished.json"))
    assert {j.state for j in jobs} == {JobState.CANCELLED}
    assert all(j.state.is_final() and not j.state.is_active() for j in jobs)


def test_squeue_json_gives_each_component_its_account_qos_reservation_and_features() -> None:
    jobs = {j.job_id: j for j in parse_squeue_json(recorded("squeue-accounts.json"))}
    assert sorted((j.het_job_id, j.het_job_offset) for j in jobs.values()) == [(4, 0), (4, 1)]
    for record in jobs.values():
        assert (record.account, record.qos, record.reservation, record.features) == ("amoeba_sat", "amoeba_sat", "", "")
    # The test cluster's nodes have no features and it holds no reservation: Slurm spells them this way.
    doc = json.loads(recorded("squeue-accounts.json"))
    doc["jobs"][1].update(features="a100&ib", resv_name="maint")
    worker = parse_squeue_json(json.dumps(doc))[1]
    assert (worker.features, worker.reservation) == ("a100&ib", "maint")


def test_a_job_without_accounting_fields_reads_as_empty_ones() -> None:
    doc = json.loads(recorded("squeue-mixed.json"))
    for field in ("account", "qos", "resv_name", "features"):
        doc["jobs"][0].pop(field)
    record = parse_squeue_json(json.dumps(doc))[0]
    assert (record.account, record.qos, record.reservation, record.features) == ("", "", "", "")


def test_squeue_json_gives_admin_comments_time_limits_and_requested_gpus() -> None:
    doc = json.loads(recorded("squeue-accounts.json"))
    doc["jobs"][0].update(admin_comment="amoebad-held since=1 priority=2: waiting for 8 GPUs", time_limit=5)
    doc["jobs"][1].update(time_limit=None, tres_req_str="cpu=2,mem=8000M,node=1,billing=2,gres/gpu=2")
    agent, worker = parse_squeue_json(json.dumps(doc))
    assert (agent.admin_comment, agent.time_limit_s) == ("amoebad-held since=1 priority=2: waiting for 8 GPUs", 300)
    assert (worker.time_limit_s, worker.gpus_requested) == (None, 2)
    doc["jobs"][1].update(tres_req_str="gres/gpu=x")
    with pytest.raises(ParseError, match="tres_req_str"):
        parse_squeue_json(json.dumps(doc))


def test_squeue_json_gives_each_component_its_submitted_tasks_and_gpus_per_task() -> None:
    records = {r.job_id: r for r in parse_squeue_json(recorded("squeue-elastic-shapes.json"))}
    assert [(records[j].tasks, records[j].gpus_per_task) for j in (66, 67, 70)] == [(1, 0), (2, 1), (2, 1)]


@pytest.mark.parametrize(
    ("tres", "gpus"),
    [("gres:gpu:2", 2), ("gres/gpu=3", 3), ("cpu=2,gres:gpu:a100:4", 4), ("cpu=2", 0), ("", 0), ("gres:gpux:2", 0)],
)
def test_gpus_per_task_read_every_spelling_of_tres_per_task(tres: str, gpus: int) -> None:
    doc = json.loads(recorded("squeue-elastic-shapes.json"))
    doc["jobs"][0]["tres_per_task"] = tres
    assert parse_squeue_json(json.dumps(doc))[0].gpus_per_task == gpus


@pytest.mark.parametrize(
    ("state", "reason", "preempted"),
    [
        (JobState.CANCELLED, "Preempted", True),
        (JobState.CANCELLED, "JobPreempted", True),
        (JobState.PREEMPTED, "None", True),
        (JobState.CANCELLED, "None", False),
        (JobState.FAILED, "NonZeroExitCode", False),
        (JobState.RUNNING, "None", False),
    ],
)
def test_a_job_reads_as_preempted_by_its_state_or_its_reason(state: JobState, reason: str, preempted: bool) -> None:
    record = parse_squeue_json(recorded("squeue-mixed.json"))[0]
    assert dataclasses.replace(record, state=state, state_reason=reason).was_preempted is preempted


def test_sinfo_json_gives_gpus_total_used_and_free_per_node() -> None:
    nodes = {n.name: n for n in parse_sinfo_json(recorded("sinfo-mixed.json"))}
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    assert nodes["n1"].address == "10.77.0.11"
    assert nodes["n3"].gpus_total == 4 and nodes["n3"].gpus_used == 3 and nodes["n3"].gpus_free == 1
    assert nodes["n1"].partitions == ("batch", "elastic")
    idle = parse_sinfo_json(recorded("sinfo-idle.json"))
    assert sum(n.gpus_free for n in idle) == 16


def test_a_drained_node_offers_no_free_gpus() -> None:
    doc = json.loads(recorded("sinfo-idle.json"))
    doc["nodes"][0]["state_flags"] = ["DRAIN"]
    nodes = parse_sinfo_json(json.dumps(doc))
    assert nodes[0].gpus_free == 0 and nodes[1].gpus_free == 4


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("gpu:4", 4),
        ("gpu:a100:2(S:0-1)", 2),
        ("gpu:(null):3(IDX:0-2)", 3),
        ("gpu:1,shard:8", 1),
        ("", 0),
        ("(null)", 0),
        ("gpu:a100:2,gpu:v100:1", 3),
    ],
)
def test_gres_counts(text: str, count: int) -> None:
    assert parse_gres_count(text) == count


def test_gpu_indices_are_node_wide() -> None:
    assert parse_gpu_indices("gpu:2(IDX:2-3)") == (2, 3)
    assert parse_gpu_indices("gpu:a100:3(IDX:0,2-3)") == (0, 2, 3)
    assert parse_gpu_indices("gpu:0(IDX:N/A)") == ()


def test_a_gpu_held_as_shards_is_a_gpu_the_job_runs_on() -> None:
    assert parse_gpu_indices("shard:2(IDX:1)") == (1,)
    assert parse_gpu_indices("gpu:1(IDX:0),shard:1(IDX:3)") == (0, 3)
    assert parse_gres_count("gpu:4,shard:12") == 4, "a node's shards are not more GPUs"


def test_step_lines_give_job_step_nodes_and_name() -> None:
    steps = parse_step_lines("18.0|n1|stepA\n18.1|n[1-2]|name|with|bars\n18.batch|n1|batch\n")
    assert [(s.job_id, s.step, s.number, s.nodes, s.name) for s in steps] == [
        (18, "0", 0, ("n1",), "stepA"),
        (18, "1", 1, ("n1", "n2"), "name|with|bars"),
        (18, "batch", None, ("n1",), "batch"),
    ]
    with pytest.raises(ParseError, match="line 1"):
        parse_step_lines("garbage")


def test_sbatch_replies() -> None:
    assert parse_sbatch_reply("123\n") == 123
    assert parse_sbatch_reply("77;amoeba\n") == 77
    with pytest.raises(ParseError, match="no job id.*Submitted batch job"):
        parse_sbatch_reply("Submitted batch job 12\nsomething odd")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        "[]",
        '{"jobs": 3}',
        '{"jobs": [3]}',
        '{"jobs": [{"job_id": "x"}]}',
        '{"errors": [{"error": "boom"}], "jobs": []}',
        '{"jobs": [{"job_id": 1, "job_state": "RUNNING", "user_id": 0, "nodes": "n[1-"}]}',
    ],
)
def test_malformed_squeue_output_raises_parse_error_naming_the_source(text: str) -> None:
    with pytest.raises(ParseError, match="squeue --json|hostlist"):
        parse_squeue_json(text)


def _mangle(value: Any, draw: st.DrawFn) -> Any:
    """Replace, drop or retype parts of a recorded document, recursively."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            action = draw(st.integers(0, 9))
            if action == 0:
                continue
            out[key] = (
                draw(st.sampled_from([None, 1, "x", [], {}, -5, "n[", True])) if action == 1 else _mangle(item, draw)
            )
        return out
    if isinstance(value, list):
        return [_mangle(v, draw) for v in value[: draw(st.integers(0, len(value)))]]
    return value


@st.composite
def mangled_documents(draw: st.DrawFn, name: str) -> str:
    return json.dumps(_mangle(json.loads(recorded(name)), draw))


@settings(max_examples=150, deadline=None)
@given(mangled_documents("squeue-mixed.json"))
def test_mangled_squeue_json_raises_only_parse_error(text: str) -> None:
    try:
        parse_squeue_json(text)
    except ParseError:
        pass


@settings(max_examples=150, deadline=None)
@given(mangled_documents("sinfo-mixed.json"))
def test_mangled_sinfo_json_raises_only_parse_error(text: str) -> None:
    try:
        parse_sinfo_json(text)
    except ParseError:
        pass


@given(st.text(max_size=200))
def test_arbitrary_text_raises_only_parse_error(text: str) -> None:
    for parse in (
        parse_squeue_json,
        parse_sinfo_json,
        parse_sbatch_reply,
        parse_gres_count,
        parse_gpu_indices,
        parse_step_lines,
    ):
        try:
            parse(text)
        except ParseError:
            pass


def test_tres_gpus_takes_the_untyped_count_else_sums_the_typed_ones() -> None:
    assert tres_gpus("billing=2,cpu=2,gres/gpu=4,mem=8000M,node=1") == 4
    assert tres_gpus("cpu=2,gres/gpu:a100=2,gres/gpu:v100=1") == 3
    assert tres_gpus("gres/gpu:a100=2,gres/gpu=2") == 2
    assert tres_gpus("cpu=2,mem=1G") == 0
    # sacct lines whose GPUs are typed count too; a line with an unreadable count is skipped
    assert parse_past_service("7|10|cpu=1,gres/gpu:a100=2\n8|10|gres/gpu=x\n") == {7: 20.0}


def test_the_default_partition_is_the_one_scontrol_marks_default_yes() -> None:
    text = (
        "PartitionName=batch AllowGroups=ALL Default=YES GraceTime=0 Nodes=n[1-4]\n"
        "PartitionName=elastic AllowGroups=ALL Default=NO GraceTime=10 Nodes=n[1-4]\n"
    )
    assert parse_default_partition(text) == "batch"
    assert parse_default_partition(text.replace("Default=YES", "Default=NO")) is None
    assert parse_default_partition("") is None
