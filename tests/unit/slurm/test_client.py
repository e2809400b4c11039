"""The command-line Slurm client against an emulated sbatch: the environment a job is submitted from.

A fake ``sbatch`` early on PATH records its arguments and the one variable the test watches, and answers like
``sbatch --parsable``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.slurm import CliSlurmClient, SubmitOptions
from slurm_amoeba.slurm.client import independent_job_env
from slurm_amoeba.slurm.runner import DEFAULT_TIMEOUT_S, ENV_SLURM_TIMEOUT

FAKE_SBATCH = """#!{python}
import os, sys
with open({record!r}, "a") as out:
    out.write(" ".join(sys.argv[1:]) + "|" + os.environ.get("AMOEBA_MARK", "-") + "\\n")
if "--test-only" in sys.argv:
    print("sbatch: Job 78 to start at 2030-01-01T00:00:00 using 1 processors on nodes n1 in partition batch",
          file=sys.stderr)
else:
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


def test_a_script_submitted_without_components_carries_its_own_directives_and_a_test_submits_nothing(
    tmp_path: Path,
) -> None:
    env, record = fake_sbatch(tmp_path)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --ntasks=2\ntrue\n")
    client = CliSlurmClient(env, timeout=30)
    assert client.submit(script, []) == 77
    answer = client.test_submit(script, SubmitOptions(ntasks=1), ["x"])
    assert answer.startswith("sbatch: Job 78 to start at") and "partition batch" in answer
    calls = [line.split("|")[0] for line in record.read_text().splitlines()]
    assert calls == [f"--parsable {script}", f"--test-only --ntasks=1 {script} x"]


def test_a_programs_client_takes_its_timeout_from_the_environment_unless_the_program_gives_one() -> None:
    assert CliSlurmClient.from_environment({}).timeout == DEFAULT_TIMEOUT_S
    assert CliSlurmClient.from_environment({ENV_SLURM_TIMEOUT: " 12.5 "}).timeout == 12.5
    assert CliSlurmClient.from_environment({ENV_SLURM_TIMEOUT: "12"}, timeout=45).timeout == 45
    assert CliSlurmClient.from_environment({ENV_SLURM_TIMEOUT: "12", "SLURM_CONF": "/c"}).env["SLURM_CONF"] == "/c"


@pytest.mark.parametrize("text", ["soon", "0", "-3", "601", "nan", "inf"])
def test_a_timeout_variable_that_is_not_seconds_is_refused_naming_it_and_the_default(text: str) -> None:
    with pytest.raises(SpecError, match=rf"{ENV_SLURM_TIMEOUT}='{text}' is not a timeout.*default of 30"):
        CliSlurmClient.from_environment({ENV_SLURM_TIMEOUT: text})


def test_an_independent_job_keeps_only_the_cluster_of_the_enclosing_jobs_slurm_variables() -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_HET_SIZE": "2", "SLURM_CONF": "/etc/slurm.conf", "SLURMD_NODENAME": "n1",
           "HOME": "/home/a", "AMOEBA_STORE_PORT": "29400"}  # fmt: skip
    assert independent_job_env(env) == {
        "SLURM_CONF": "/etc/slurm.conf",
        "SLURMD_NODENAME": "n1",
        "HOME": "/home/a",
        "AMOEBA_STORE_PORT": "29400",
    }
