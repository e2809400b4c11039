"""Every supported Slurm release's JSON, read into the same records.

The fixtures under ``tests/data/slurm/releases/<series>/`` (written from SchedMD's OpenAPI descriptions; sources in
``SOURCES.md`` beside them) show one cluster through each release's commands and slurmrestd: nodes n1 (batch and
elastic; 2 of 4 GPUs in use), n2 (batch; 4 of 4) and n3 (batch; drained); squeue's jobs 101-105 (105 completing);
sacct's jobs 201-212. Every parser runs over every fixture: the one meant for it gives these records, the others
refuse it with a ParseError.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.sim.accounting import load_history
from slurm_amoeba.slurm.parsers import parse_nodes_json, parse_sacct_json, parse_sinfo_json, parse_squeue_json
from slurm_amoeba.slurm.records import AccountingRecord, JobRecord, JobState, NodeRecord
from slurm_amoeba.slurm.release import DATA_PARSERS, JsonShape, SlurmRelease

RELEASES = Path(__file__).parents[2] / "data" / "slurm" / "releases"
SERIES = ("22.05", "23.02", "23.11", "24.05", "24.11", "25.05", "25.11")
PARSERS: dict[str, Callable[[str], list[object]]] = {
    "squeue": parse_squeue_json,  # type: ignore[dict-item]
    "sinfo": parse_sinfo_json,  # type: ignore[dict-item]
    "nodes": parse_nodes_json,  # type: ignore[dict-item]
    "sacct": parse_sacct_json,  # type: ignore[dict-item]
}
#: Which parser each fixture is for.
MEANT_FOR = {
    "squeue.json": "squeue",
    "slurmrestd-jobs.json": "squeue",
    "sinfo.json": "sinfo",
    "scontrol-nodes.json": "nodes",
    "slurmrestd-nodes.json": "nodes",
    "sacct.json": "sacct",
    "slurmrestd-slurmdb-jobs.json": "sacct",
}
FIXTURES = sorted(RELEASES.glob("*/*.json"))


def fixture_id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def test_every_supported_release_has_its_fixtures() -> None:
    assert tuple(sorted(DATA_PARSERS)) == SERIES
    for series in SERIES:
        names = {path.name for path in (RELEASES / series).glob("*.json")}
        expected = set(MEANT_FOR) - ({"scontrol-nodes.json"} if series == "22.05" else set())  # 23.02 added it
        assert names == expected, series


@pytest.mark.parametrize("path", FIXTURES, ids=fixture_id)
def test_each_fixture_names_its_release_and_json_plugin(path: Path) -> None:
    shape = JsonShape.of(json.loads(path.read_text()))
    assert shape.release is not None and shape.release.series == path.parent.name
    assert shape.data_parser == DATA_PARSERS[path.parent.name]


@pytest.mark.parametrize("path", FIXTURES, ids=fixture_id)
@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_every_parser_reads_its_fixtures_and_refuses_the_others(path: Path, parser: str) -> None:
    text = path.read_text()
    meant = MEANT_FOR[path.name]
    if parser == meant or (parser == "sinfo" and meant == "nodes"):  # sinfo reads the node list too (22.05's shape)
        records = PARSERS[parser](text)
        CHECKS[parser](records)
    elif parser == "nodes" and path.name == "sinfo.json" and path.parent.name == "22.05":
        CHECKS["nodes"](PARSERS[parser](text))  # 22.05's sinfo --json is a node list
    else:
        with pytest.raises(ParseError):
            PARSERS[parser](text)


def check_jobs(records: list[JobRecord]) -> None:
    jobs = {job.job_id: job for job in records}
    assert sorted(jobs) == [101, 102, 103, 104, 105]
    running = jobs[101]
    assert (running.state, running.user, running.uid, running.partition) == (JobState.RUNNING, "alice", 1001, "batch")
    assert (running.nodes, running.gpu_indices, running.gpus_per_node, running.gpus_held) == (("n1",), ((0, 1),), 2, 2)
    assert (running.submit_time, running.start_time, running.time_limit_s) == (1700000000, 1700000100, 3600)
    assert (running.cpus, running.node_count, running.priority, running.account) == (2, 1, 1000, "vision")
    assert (running.het_job_id, running.comment, running.batch_host) == (0, "amoeba:elastic=1:2", "n1")
    pending = jobs[102]
    assert (pending.state, pending.state_reason, pending.nodes, pending.gpu_indices) == (
        JobState.PENDING,
        "Resources",
        (),
        (),
    )
    assert (pending.time_limit_s, pending.gpus_requested, pending.gpus_per_node) == (None, 4, 4)
    leader, member = jobs[103], jobs[104]
    assert (leader.het_job_id, leader.het_job_offset, member.het_job_id, member.het_job_offset) == (103, 0, 103, 1)
    assert (leader.gpu_indices, member.gpu_indices, member.nodes) == (((0, 1),), ((2, 3),), ("n2",))
    assert jobs[105].state is JobState.COMPLETING and jobs[105].partition == "elastic" and jobs[105].qos == "low"


def check_nodes(records: list[NodeRecord]) -> None:
    nodes = {node.name: node for node in records}
    assert sorted(nodes) == ["n1", "n2", "n3"] and len(records) == 3
    n1, n2, n3 = nodes["n1"], nodes["n2"], nodes["n3"]
    assert (n1.state, n1.partitions, n1.gpus_total, n1.gpus_used, n1.gpus_free) == (
        "mixed",
        ("batch", "elastic"),
        4,
        2,
        2,
    )
    assert (n1.address, n1.hostname, n1.cpus, n1.alloc_cpus) == ("10.77.0.11", "n1", 8, 2)
    assert (n2.state, n2.partitions, n2.gpus_used, n2.gpus_free) == ("allocated", ("batch",), 4, 0)
    assert (n3.state, n3.state_flags, n3.is_usable, n3.gpus_free, n3.gpus_total) == ("idle", ("DRAIN",), False, 0, 4)


def check_accounting(records: list[AccountingRecord]) -> None:
    jobs = {job.display_id: job for job in records}
    assert sorted(jobs) == ["200_4", "201", "202", "210+0", "210+1", "212"]
    done = jobs["201"]
    assert (done.state, done.user, done.partition, done.nodes) == (JobState.COMPLETED, "alice", "batch", "n1")
    assert (done.submit_time, done.start_time, done.end_time, done.time_limit_s) == (
        1700001000,
        1700001010,
        1700004610,
        7200,
    )
    assert (done.gpus_allocated, done.gpus_requested) == (2, 2)
    cancelled = jobs["202"]
    assert (cancelled.state, cancelled.start_time, cancelled.time_limit_s, cancelled.gpus_allocated) == (
        JobState.CANCELLED,
        0,
        None,
        0,
    )
    assert cancelled.gpus_requested == 4
    task = jobs["200_4"]
    assert (task.job_id, task.array_job_id, task.array_task_id, task.state, task.time_limit_s) == (
        207,
        200,
        4,
        JobState.TIMEOUT,
        1800,
    )
    assert (jobs["210+1"].job_id, jobs["210+1"].gpus_allocated, jobs["210+0"].time_limit_s) == (211, 2, None)
    assert (jobs["212"].state, jobs["212"].end_time) == (JobState.RUNNING, 0)


CHECKS: dict[str, Callable[[list[object]], None]] = {
    "squeue": check_jobs,  # type: ignore[dict-item]
    "sinfo": check_nodes,  # type: ignore[dict-item]
    "nodes": check_nodes,  # type: ignore[dict-item]
    "sacct": check_accounting,  # type: ignore[dict-item]
}


@pytest.mark.parametrize("series", SERIES)
@pytest.mark.parametrize("name", ["sacct.json", "slurmrestd-slurmdb-jobs.json"])
def test_a_site_history_reads_every_releases_sacct_export(series: str, name: str) -> None:
    history = load_history(RELEASES / series / name)
    assert [(job.name, job.requested_workers, job.duration, job.time_limit) for job in history.jobs] == [
        ("201", 2, 3600.0, 7200.0),
        ("200_4", 1, 1800.0, 1800.0),
        ("210+0", 4, 300.0, None),
        ("210+1", 2, 300.0, None),
    ]
    assert (history.never_started, history.unfinished, history.without_gpus) == (1, 1, 0)


@pytest.mark.parametrize("series", SERIES)
def test_a_missing_required_field_is_named_with_the_release(series: str) -> None:
    document = json.loads((RELEASES / series / "squeue.json").read_text())
    del document["jobs"][1]["job_state"]
    pattern = rf"job 102 \(Slurm {series}\.[0-9]+, data_parser v0\.0\.[0-9]+\).*job_state"
    with pytest.raises(ParseError, match=pattern):
        parse_squeue_json(json.dumps(document))
    document = json.loads((RELEASES / series / "sacct.json").read_text())
    del document["jobs"][0]["time"]["submission"]
    with pytest.raises(ParseError, match=rf"job 201 \(Slurm {series}.*'time/submission' is missing"):
        parse_sacct_json(json.dumps(document))


def test_wrapped_numbers_read_unset_and_infinite_as_no_value() -> None:
    document = json.loads((RELEASES / "25.11" / "squeue.json").read_text())
    job = document["jobs"][0]
    job["time_limit"] = {"set": False, "infinite": True, "number": 0}
    job["priority"] = {"set": False, "infinite": False, "number": 0}
    (read,) = [j for j in parse_squeue_json(json.dumps(document)) if j.job_id == 101]
    assert (read.time_limit_s, read.priority) == (None, 0)


def test_complex_mode_numbers_are_plain_null_or_infinity() -> None:
    # data_parser v0.0.41 and later with +complex: NO_VAL is null, INFINITE is "Infinity", others plain numbers.
    document = json.loads((RELEASES / "24.05" / "squeue.json").read_text())
    job = document["jobs"][0]
    job.update(time_limit="Infinity", priority=77, het_job_id=None, cpus=3, start_time=1700000100)
    (read,) = [j for j in parse_squeue_json(json.dumps(document)) if j.job_id == 101]
    assert (read.time_limit_s, read.priority, read.het_job_id, read.cpus) == (None, 77, 0, 3)


@pytest.mark.parametrize(
    ("text", "release"),
    [
        ("slurm 22.05.8\n", SlurmRelease(22, 5, 8)),
        ("slurm-wlm 23.11.4", SlurmRelease(23, 11, 4)),
        ("slurm 25.11.0-0rc1", SlurmRelease(25, 11, 0)),
        ("slurm 24.05", SlurmRelease(24, 5, 0)),
    ],
)
def test_a_release_is_read_from_the_version_line(text: str, release: SlurmRelease) -> None:
    assert SlurmRelease.parse(text) == release
    assert release.is_supported and release.data_parser == DATA_PARSERS[release.series]


def test_an_unreadable_version_line_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="no Slurm release"):
        SlurmRelease.parse("sinfo: command not found")
    assert not SlurmRelease(21, 8).is_supported and SlurmRelease(21, 8).data_parser is None
