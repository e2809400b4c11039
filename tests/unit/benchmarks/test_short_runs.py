"""Every benchmark that needs no Slurm runs here in a short mode and writes its result document, so that none rots.

Each test runs the benchmark's own ``main`` with small parameters (seconds, not the minutes of a real run) and
checks the document ``benchmarks.record`` defines: the benchmark's name, the machine, the load before and after,
the parameters and figures. The benchmarks that need the local Slurm cluster, and the slow ones, run in short mode
in ``tests/integration/test_benchmarks.py``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from benchmarks import goodput, loop, policy, share_sim, sim_speed, sim_study
from slurm_amoeba.core.messages import decode
from slurm_amoeba.daemon.observer import ClusterSource
from slurm_amoeba.slurm import JobRecord
from slurm_amoeba.transport.munge import unseal


def _document(path: Path, benchmark: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    assert document["schema"] == 1
    assert document["benchmark"] == benchmark
    assert document["machine"]["cores"] >= 1 and document["machine"]["cpu_model"]
    assert len(document["load_before"]) == 3 and len(document["load_after"]) == 3
    assert document["parameters"], "the document lost the command's parameters"
    return document


def test_the_simulator_study_writes_its_tables_with_their_conditions(tmp_path: Path) -> None:
    out = tmp_path / "sim-fidelity.json"
    assert sim_study.main(["--only", "fidelity", "--processes", "1", "--json", str(out)]) == 0
    document = _document(out, "sim-fidelity")
    table = document["tables"]["fidelity"]
    assert table.count("\n| ") == 4, "one row per load"
    assert document["notes"] and "exact" in document["notes"][0]


def test_the_goodput_decision_benchmark_writes_medians_with_their_range(tmp_path: Path) -> None:
    out = tmp_path / "goodput.json"
    argv = ["--nodes", "20", "--jobs", "40", "--repeats", "3", "--out", str(out)]
    assert goodput.main(argv) == 0
    figures = _document(out, "goodput-decision")["figures"]
    assert figures["decide_min_s"] <= figures["decide_s"] <= figures["decide_max_s"]


def test_the_policy_benchmark_runs_short_without_its_loop(tmp_path: Path) -> None:
    out = tmp_path / "policy.json"
    assert policy.main(["--short", "--skip-loop", "--out", str(out)]) == 0
    document = _document(out, "policy-decision")
    assert document["parameters"]["nodes"] == 50
    assert document["figures"]["decisions"] >= 0 and document["figures"]["decision_s"] > 0


def test_the_philly_speed_benchmark_runs_short_on_a_prefix(tmp_path: Path) -> None:
    out = tmp_path / "philly.json"
    assert sim_speed.main(["--short", "--sizes", "200", "--policies", "fifo", "--json", str(out)]) == 0
    runs = _document(out, "philly-speed")["figures"]["runs"]
    assert [run["jobs"] for run in runs] == [200], "the short mode runs the prefix only, not the whole trace"


def test_the_sharing_benchmark_runs_short_on_one_workload_per_load(tmp_path: Path) -> None:
    out = tmp_path / "share.json"
    assert share_sim.main(["--short", "--loads", "1.0", "--json", str(out)]) == 0
    document = _document(out, "sim-share")
    runs = document["figures"]["runs"]
    assert {run["workload"] for run in runs} == {"workload-1"}, "the short mode runs one workload per load"
    assert [run["row"] for run in runs] == [row.label for row in share_sim.ROWS]
    by_row = {run["row"]: run for run in runs}
    assert by_row["sjf, no sharing"]["shared_jobs"] == 0, "without a co-location table nothing pairs"
    assert by_row["sjf-bsbf"]["shared_jobs"] > 0 and by_row["antman"]["shared_jobs"] > 0
    assert document["tables"]["sharing"].count("\n| 1.0x |") == len(share_sim.ROWS), "one line per policy"


def _no_slurm(records: Sequence[JobRecord]) -> ClusterSource:
    raise AssertionError("the window was refused before any Slurm was asked for")


def test_the_loop_signs_ahead_only_a_window_its_credentials_outlive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        policy.main(["--seal", "ahead", "--duration", "40"])
    assert stopped.value.code == 2
    assert "--duration with --seal ahead: a 40 s window" in capsys.readouterr().err
    with pytest.raises(ValueError, match="outlives their credentials"):
        loop.bench_loop([], {}, _no_slurm, interval_s=1.0, duration_s=31.0, policy_name="fifo", report_s=5.0,
                        per_uid=1, seal_ahead=True)  # fmt: skip


def test_reports_signed_ahead_each_open_for_the_daemon_in_turn(munged: None) -> None:
    spec = [{"job_id": "7", "size": 2}, {"job_id": "8", "size": 1}]
    signed = loop.sealed_reports(spec, 5, "tcp port 6820", time.time())
    assert len({message_id for message_id, _ in signed}) == 5
    jobs = []
    for message_id, (empty, credential, payload) in signed:
        assert empty == b"" and unseal(credential, payload, to="tcp port 6820").uid == os.getuid()
        message = decode(payload)
        assert message.id == message_id and message.kind == "report"
        jobs.append(message.body["job_id"])
    assert jobs == ["7", "8", "7", "8", "7"]
