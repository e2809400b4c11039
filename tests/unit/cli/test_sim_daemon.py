"""``amoeba-sim run|compare --daemon-config FILE``: Slurm's baseline with exactly that amoebad on top."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from slurm_amoeba.cli.sim import main
from slurm_amoeba.cli.sim_daemon import amoebad_knobs_of, daemon_run
from slurm_amoeba.daemon.config import parse_config
from slurm_amoeba.policy import make_policy
from slurm_amoeba.policy.amoebad import AdmissionLayer, AmoebadPolicy, ElasticLayer, LasOrderLayer, WholeNodeLayer
from slurm_amoeba.sim.data import SimError, data_dir
from slurm_amoeba.sim.engine import SimConfig
from slurm_amoeba.sim.runner import RunSpec, run_one

SHIPPED = Path(__file__).resolve().parents[3] / "configs" / "amoebad.yaml"
#: A small shipped workload (the 0.5x load's first): a run takes well under a second.
WORKLOAD = data_dir() / "pollux" / "workloads-0.5" / "workload-1.csv"


def _config(tmp_path: Path, name: str, document: dict[str, object]) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document))
    return path


def _same(left: dict[str, float], right: dict[str, float]) -> bool:
    return left.keys() == right.keys() and all(
        (math.isnan(a) and math.isnan(b)) if isinstance(a, float) and math.isnan(a) else a == b
        for a, b in ((left[key], right[key]) for key in left)
    )


def test_the_shipped_configuration_simulates_as_the_amoebad_policy_with_its_layers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = daemon_run(SHIPPED)
    assert run.label == "amoebad"
    assert make_policy("amoebad", **run.knobs) == AmoebadPolicy(
        elastic=ElasticLayer(min_gain=0.1), admission=AdmissionLayer(slurm_takes_loans_only=False)
    )
    out = tmp_path / "run.json"
    assert main(["run", "--daemon-config", str(SHIPPED), "--workload", str(WORKLOAD), "--json", str(out)]) == 0
    figures = json.loads(out.read_text())["amoebad"]["workload-1"]
    expected = run_one(RunSpec("amoebad", WORKLOAD, SimConfig(), knobs=tuple(run.knobs.items()))).summary
    shown = {key: (math.nan if value is None else value) for key, value in figures.items()}
    assert _same(
        {key: shown[key] for key in expected if key != "wall_s"}, {k: v for k, v in expected.items() if k != "wall_s"}
    )
    different = run_one(RunSpec("slurm", WORKLOAD, SimConfig())).summary
    assert different["avg_jct_s"] != figures["avg_jct_s"], "the daemon on top changes the run"


def test_admission_whole_node_starts_and_queue_order_become_the_layers() -> None:
    config = parse_config(
        {
            "policy": {"name": "elastic-backfill", "knobs": {"min_gain": 0.3, "grow_by_service": False}},
            "admission": {"enabled": True, "max_hold_s": 600},
            "whole_node_starts": True,
            "queue_order": {"enabled": True, "thresholds_gpu_s": [3600, 57600]},
        }
    )
    assert make_policy("amoebad", **amoebad_knobs_of(config)) == AmoebadPolicy(
        elastic=ElasticLayer(min_gain=0.3, grow_by_service=False),
        admission=AdmissionLayer(max_hold_s=600.0, slurm_takes_loans_only=False),
        whole_node=WholeNodeLayer(),
        las_order=LasOrderLayer((3600.0, 57600.0)),
    )


def test_compare_shows_the_daemon_beside_slurm_in_a_row_named_after_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = _config(tmp_path, "site-a.yaml", {"admission": {"enabled": True}})
    out = tmp_path / "compare.json"
    code = main(["compare", "--workloads", str(WORKLOAD), "--daemon-config", str(site), "--json", str(out), "--quiet"])
    assert code == 0
    assert set(json.loads(out.read_text())) == {"slurm", "site-a"}
    assert "site-a" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("document", "refusal"),
    [
        ({"policy": {"name": "sjf-bsbf"}}, "puts only elastic-backfill on top of Slurm's baseline"),
        ({"whole_node_starts": True, "admission": {"enabled": False}}, "models whole-node starts under admission only"),
    ],
)
def test_a_daemon_the_simulator_cannot_put_on_top_of_slurm_is_refused_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], document: dict[str, object], refusal: str
) -> None:
    path = _config(tmp_path, "odd.yaml", document)
    with pytest.raises(SimError, match=refusal):
        daemon_run(path)
    assert main(["run", "--daemon-config", str(path), "--workload", str(WORKLOAD)]) == 2
    assert refusal in capsys.readouterr().err


def test_a_missing_or_invalid_file_is_refused_with_its_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere.yaml"
    assert main(["run", "--daemon-config", str(missing), "--workload", str(WORKLOAD)]) == 2
    assert f"cannot read the daemon's configuration {str(missing)!r}" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("policy: [elastic-backfill\n")
    assert main(["compare", "--workloads", str(WORKLOAD), "--daemon-config", str(broken)]) == 2
    assert f"{broken} is not valid YAML" in capsys.readouterr().err
    unknown = _config(tmp_path, "unknown.yaml", {"admision": {"enabled": True}})
    assert main(["run", "--daemon-config", str(unknown), "--workload", str(WORKLOAD)]) == 2
    assert "admision" in capsys.readouterr().err


def test_run_takes_a_policy_or_a_daemon_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--workload", str(WORKLOAD)]) == 2
    assert "give --policy NAME or --daemon-config FILE" in capsys.readouterr().err
    assert main(["run", "--policy", "fifo", "--daemon-config", str(SHIPPED), "--workload", str(WORKLOAD)]) == 2
    assert "give one of them" in capsys.readouterr().err
