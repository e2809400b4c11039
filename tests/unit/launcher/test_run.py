"""``amoeba-run``'s checks of the job it runs in: heterogeneous (amoeba-sbatch) or one component (plain sbatch)."""

from __future__ import annotations

import pytest

from slurm_amoeba.agent.agent import AgentConfig
from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.core.jobenv import JobEnv
from slurm_amoeba.launcher.run import build_parser, config_from_args
from tests.unit.slurm.test_allocation import HET, PLAIN

SPANK = {"AMOEBA_ELASTIC_MIN": "2", "AMOEBA_ELASTIC_MAX": "8", "AMOEBA_ELASTIC_PARTITION": "elastic"}


def config(env: dict[str, str], *argv: str) -> AgentConfig:
    args = build_parser(JobEnv.from_environ(env)).parse_args([*argv, "python", "train.py"])
    return config_from_args(args, env)


def test_plain_sbatch_job_runs_its_workers_in_its_own_allocation() -> None:
    cfg = config({**PLAIN, **SPANK})
    assert cfg.main_het_group is None
    assert (cfg.spec.min_workers, cfg.spec.max_workers, cfg.spec.gpus_per_worker) == (2, 8, 1)
    assert cfg.command == ("python", "train.py") and cfg.job_id == "6"


def test_amoeba_sbatch_job_runs_its_workers_in_component_1() -> None:
    env = {**HET, **SPANK, "AMOEBA_GPUS_PER_WORKER": "1", "AMOEBA_CPUS_PER_WORKER": "1"}
    assert config(env).main_het_group == 1


def test_plain_job_takes_the_gpus_of_a_task_as_a_workers_unless_told() -> None:
    env = {**PLAIN, **SPANK, "SLURM_GPUS_PER_TASK": "2", "SLURM_CPUS_PER_TASK": "3"}
    spec = config(env).spec
    assert (spec.gpus_per_worker, spec.cpus_per_worker) == (2, 3)
    with pytest.raises(SpecError, match=r"gives each task 2 GPU\(s\).*each worker takes 1"):
        config({**env, "AMOEBA_GPUS_PER_WORKER": "1"})


def test_plain_job_too_small_for_its_minimum_names_the_sbatch_lines_to_add() -> None:
    small = {"SLURM_JOB_ID": "7", "SLURM_TASKS_PER_NODE": "1", **SPANK}
    with pytest.raises(
        SpecError, match=r"holds 1 task\(s\), fewer than the 2 minimum.*#SBATCH --ntasks=2 --gpus-per-task=1"
    ):
        config(small)
    with pytest.raises(SpecError, match=r"holds no GPU but each worker takes 1.*--gpus-per-worker 0"):
        config({**small, "SLURM_NTASKS": "2"})
    assert config({**small, "SLURM_NTASKS": "2"}, "--gpus-per-worker", "0").spec.gpus_per_worker == 0


def test_bad_job_variables_are_refused_naming_them() -> None:
    with pytest.raises(SpecError, match="AMOEBA_GPUS_PER_WORKER='x'"):
        config_from_args(
            build_parser(JobEnv()).parse_args(["--elastic", "2:8", "python"]),
            {**PLAIN, **SPANK, "AMOEBA_GPUS_PER_WORKER": "x"},
        )


def test_outside_a_job_or_without_a_range_says_how_to_submit() -> None:
    with pytest.raises(SpecError, match="runs inside a Slurm job"):
        config(SPANK)
    with pytest.raises(SpecError, match="#SBATCH --elastic=MIN:MAX"):
        config(PLAIN)
