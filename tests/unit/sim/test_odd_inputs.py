"""Every odd input of ``amoeba-sim`` is refused with exit 2 and a sentence naming the file, line or job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_amoeba.cli.sim import main

_HEADER = "name,time,application,num_replicas,batch_size\n"
_PHILLY = "timestamp,duration,num_gpus,gpu_time,cluster\n"


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_a_header_only_workload_is_refused(pollux: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text(_HEADER)
    err = _fails(["run", "--policy", "fifo", "--workload", str(empty)], capsys)
    assert f"{empty}: the workload holds no job (only a header line)" in err


def test_a_job_larger_than_the_cluster_is_refused_before_simulating_with_its_line(
    pollux: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = tmp_path / "big.csv"
    big.write_text(_HEADER + "ok,0,cifar10,2,128\nhuge,10,cifar10,128,1024\n")
    for policy in ("tiresias", "e-tiresias", "slurm"):
        err = _fails(["run", "--policy", policy, "--workload", str(big)], capsys)
        assert "job huge (line 3) requests 128 GPUs but the cluster has 64" in err
        assert str(big) in err


def test_a_job_lasting_ages_under_a_ticking_policy_asks_for_a_horizon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ages = tmp_path / "ages.csv"
    ages.write_text(_PHILLY + "2017-10-09 07:01:55,1e18,1,1e18,x\n2017-10-09 07:02:55,100,1,100,x\n")
    err = _fails(["run", "--policy", "tiresias", "--workload", str(ages)], capsys)
    assert "job philly-2 (line 2) runs 1e+18 s" in err and "pass --horizon SECONDS" in err
    out = tmp_path / "h.json"
    argv = ["run", "--policy", "e-tiresias", "--workload", str(ages), "--horizon", "7200", "--json", str(out)]
    assert main(argv) == 0
    figures = json.loads(out.read_text())["e-tiresias"]["ages"]
    assert (figures["jobs"], figures["unfinished"]) == (2, 1)


@pytest.mark.parametrize(
    ("knob", "expected"),
    [
        ("min_gain=abc", "min_gain of policy e-tiresias is a number (default 0.1)"),
        ("min_gain", "is not NAME=VALUE"),
        ("lottery=1", "unknown key 'lottery'"),
        ("min_gain=-1", "min_gain=-1.0 must be 0 or more"),
    ],
)
def test_bad_knobs_are_refused_naming_the_knob(
    pollux: Path, knob: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = str(pollux / "workloads" / "workload-1.csv")
    err = _fails(["run", "--policy", "e-tiresias", "--workload", workload, "--knob", knob], capsys)
    assert expected in err


def test_a_whole_number_knob_refuses_a_fraction(pollux: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = str(pollux / "workloads" / "workload-1.csv")
    err = _fails(["run", "--policy", "slurm", "--workload", workload, "--knob", "bf_max_job_test=2.5"], capsys)
    assert "bf_max_job_test of policy slurm is a whole number (default 500)" in err


@pytest.mark.parametrize(("batch", "words"), [(8, "batch_size=8"), (1_000_000, "batch_size=1000000")])
def test_a_batch_outside_the_validated_range_names_file_line_and_job(
    pollux: Path, tmp_path: Path, batch: int, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = tmp_path / "batch.csv"
    workload.write_text(_HEADER + f"fine,0,cifar10,2,128\nodd,5,cifar10,2,{batch}\n")
    err = _fails(["run", "--policy", "fifo", "--workload", str(workload)], capsys)
    assert f"{workload}: line 3: job odd: {words} lies outside the range the cifar10 traces validate" in err


def test_compare_names_the_bad_file_and_runs_the_rest_when_asked(
    pollux: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "good.csv").write_text(_HEADER + "a,0,cifar10,2,128\nb,60,cifar10,1,128\n")
    (folder / "bad.csv").write_text(_HEADER + "a,0,cifar10,two,128\n")
    argv = ["compare", "--workloads", str(folder), "--policies", "fifo", "--quiet", "--processes", "1"]
    err = _fails(argv, capsys)
    assert f"{folder / 'bad.csv'}: line 2: num_replicas='two' is not a number" in err
    out = tmp_path / "rest.json"
    assert main([*argv, "--keep-going", "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"skipped: {folder / 'bad.csv'}" in captured.err
    assert list(json.loads(out.read_text())["fifo"]) == ["good"]


def test_compare_fails_when_every_file_is_bad(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "only.csv").write_text(_HEADER)
    err = _fails(["compare", "--workloads", str(folder), "--policies", "fifo", "--quiet", "--keep-going"], capsys)
    assert "only.csv: the workload holds no job" in err and "every run failed (1)" in err
