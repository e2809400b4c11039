"""The command-line Slurm client against an emulated sbatch: the environment a job is submitted from.

A fake ``sbatch`` early on PATH records its arguments and the one variable the test watches, and answers like
``sbatch --parsable``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from slurm_amoeba.slurm import CliSlurmClient, SubmitOptions
from slurm_amoeba.slurm.client import independent_job_env

FAKE_SBATCH = """#!{python}
import os, sys
with open({record!r}, "a") as out:
    out.write(" ".join(sys.argv[1:]) + "|" + os.environ.get("AMOEBA_MARK", "-") + "\\n")
print("77;amoeba")
"""


def fake_sbatch(tmp_path: Path) -> tuple[dict[str, str], Path]:
    bin_dir, record = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(FAKE_SBATCH.format(python=sys.executable, record=str(record)))
    sbatch.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "AMOEBA_MARK": "client"}, record


def test_a_submission_runs_in_the_clients_environment_or_the_one_given(tmp_path: Path) -> None:
    env, record = fake_sbatch(tmp_path)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    client = CliSlurmClient(env, timeout=30)
    assert client.submit(script, SubmitOptions(name="a")) == 77
    assert client.submit(script, SubmitOptions(), env={**env, "AMOEBA_MARK": "satellite"}) == 77
    calls = [line.split("|")[:2] for line in record.read_text().splitlines()]
    assert calls == [[f"--parsable --job-name=a {script}", "client"], [f"--parsable {script}", "satellite"]]


def test_an_independent_job_keeps_only_the_cluster_of_the_enclosing_jobs_slurm_variables() -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_HET_SIZE": "2", "SLURM_CONF": "/etc/slurm.conf", "SLURMD_NODENAME": "n1",
           "HOME": "/home/a", "AMOEBA_STORE_PORT": "29400"}  # fmt: skip
    assert independent_job_env(env) == {
        "SLURM_CONF": "/etc/slurm.conf",
        "SLURMD_NODENAME": "n1",
        "HOME": "/home/a",
        "AMOEBA_STORE_PORT": "29400",
    }
