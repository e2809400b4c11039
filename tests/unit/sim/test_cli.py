"""``amoeba-sim run`` and ``amoeba-sim compare`` end to end (small inputs, in-process)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from slurm_amoeba.cli.sim import main
from slurm_amoeba.sim.data import SimError
from slurm_amoeba.sim.progress import ProgressBar
from slurm_amoeba.sim.report import binned_utilization, infer_load, load_reference

KEYS = {"avg_jct_s", "p99_jct_s", "makespan_s", "avg_queue_s", "gpu_util", "resizes"}


def test_run_writes_the_figures_as_json(pollux: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.json"
    code = main(
        [
            "run",
            "--policy",
            "e-tiresias",
            "--workload",
            str(pollux / "workloads" / "workload-1.csv"),
            "--json",
            str(out),
        ]
    )
    assert code == 0
    document = json.loads(out.read_text())
    assert set(document["e-tiresias"]["workload-1"]) >= KEYS
    assert "e-tiresias" in capsys.readouterr().out


def test_compare_prints_tables_beside_the_artifact_and_writes_json_and_plot(
    pollux: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "workloads-1.5"
    folder.mkdir()
    for name in ("workload-1.csv", "workload-2.csv"):
        shutil.copy(pollux / "workloads-1.5" / name, folder / name)
    out, png = tmp_path / "cmp.json", tmp_path / "cmp.png"
    code = main(
        [
            "compare",
            "--workloads",
            str(folder),
            "--policies",
            "tiresias,elastic-backfill",
            "--json",
            str(out),
            "--plot",
            str(png),
            "--reference",
            str(pollux / "results-jobload"),
            "--processes",
            "1",
        ]
    )
    assert code == 0
    document = json.loads(out.read_text())
    assert set(document) == {"tiresias", "elastic-backfill"}
    assert set(document["tiresias"]) == {"workload-1", "workload-2"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    captured = capsys.readouterr()
    assert "tiresias (artifact)" in captured.out
    assert "2/4" in captured.err


def test_an_unknown_policy_fails_with_the_valid_names(pollux: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--policy", "magic", "--workload", str(pollux / "workloads" / "workload-1.csv")])
    assert code == 2
    assert "policy 'magic' is not registered; valid policies are: fifo" in capsys.readouterr().err


def test_a_cluster_too_small_for_a_job_fails_with_the_fix(pollux: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "run",
            "--policy",
            "fifo",
            "--workload",
            str(pollux / "workloads" / "workload-1.csv"),
            "--nodes",
            "1",
            "--elastic-fraction",
            "0",
        ]
    )
    assert code == 2
    assert "use more --nodes" in capsys.readouterr().err


def test_a_malformed_workload_fails_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "w.csv"
    path.write_text("name,time,application,num_replicas,batch_size\na,1,cifar10,2,256\nb,1,cifar10,two,256\n")
    assert main(["run", "--policy", "fifo", "--workload", str(path)]) == 2
    assert "line 3: num_replicas='two' is not a number" in capsys.readouterr().err


def test_reference_loading_and_load_names(pollux: Path, tmp_path: Path) -> None:
    assert infer_load(Path("workloads")) == "1.0"
    assert infer_load(Path("x/workloads-0.5")) == "0.5"
    reference = load_reference(pollux / "results-jobload", "2.0")
    assert set(reference) == {"tiresias (artifact)", "pollux (artifact)", "optimus (artifact)"}
    with pytest.raises(SimError, match="no artifact summary for load 3.0"):
        load_reference(pollux / "results-jobload", "3.0")


def test_the_progress_bar_shows_done_out_of_total() -> None:
    bar = ProgressBar(8, width=8)
    assert bar.render(2, "tiresias w1").startswith("[##------] 2/8  tiresias w1")


def test_utilization_is_averaged_per_bin_from_the_step_function() -> None:
    starts, means = binned_utilization([(0.0, 4), (50.0, 2), (150.0, 0)], 4, 100.0)
    assert starts == [0.0, 100.0]
    assert means == pytest.approx([0.75, 0.25])
