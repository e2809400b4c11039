"""scripts/slurm-cluster refuses a second instance that would share a host-wide name with the default one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "slurm-cluster"
NAMES = ("SUBNET", "BRIDGE", "NS_PREFIX", "VETH", "CTLD_PORT", "DBD_PORT", "DB_PORT")


def _status(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("AMOEBA_CLUSTER_")}
    return subprocess.run(
        [str(SCRIPT), "status"], env={**env, **extra}, capture_output=True, text=True, timeout=30, check=False
    )


def test_a_private_directory_with_the_default_names_is_refused_before_anything_runs(tmp_path: Path) -> None:
    done = _status({"AMOEBA_CLUSTER_DIR": str(tmp_path / "private"), "AMOEBA_CLUSTER_BRIDGE": "amoebaz"})
    assert done.returncode == 1
    assert "is not the default instance's" in done.stderr
    for name in NAMES:
        assert (f"AMOEBA_CLUSTER_{name}" in done.stderr) is (name != "BRIDGE"), name
    assert done.stdout == ""  # status never looked at any daemon


def test_a_private_instance_with_its_own_names_is_accepted(tmp_path: Path) -> None:
    private = {
        "AMOEBA_CLUSTER_DIR": str(tmp_path / "private"),
        "AMOEBA_CLUSTER_SUBNET": "10.79.0",
        "AMOEBA_CLUSTER_BRIDGE": "amoebaz",
        "AMOEBA_CLUSTER_NS_PREFIX": "amoebz-",
        "AMOEBA_CLUSTER_VETH": "amz-",
        "AMOEBA_CLUSTER_CTLD_PORT": "6857",
        "AMOEBA_CLUSTER_DBD_PORT": "6859",
        "AMOEBA_CLUSTER_DB_PORT": "33069",
    }
    done = _status(private)
    assert "is not the default instance's" not in done.stderr
    assert "slurmctld    down" in done.stdout  # nothing of that instance runs
