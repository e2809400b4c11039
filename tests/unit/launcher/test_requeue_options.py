"""How the launchers ask Slurm for the time-limit warning and requeues, and submitit's ``checkpoint()`` convention at
a requeue, without Slurm."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from submitit.core import utils
from submitit.helpers import Checkpointable

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.launcher.fn_worker import checkpoint_submission
from slurm_amoeba.launcher.run import config_from_args
from slurm_amoeba.launcher.sbatch import prepare
from slurm_amoeba.launcher.submission import DEFAULT_SIGNAL_LEAD_S, lifecycle_options, signal_lead_s
from slurm_amoeba.slurm import het_submit_args
from tests.unit.launcher.test_executor import cluster, components, script_of


@pytest.mark.parametrize(
    ("time_min", "given", "expected"),
    [(None, None, DEFAULT_SIGNAL_LEAD_S), (60, None, 120), (8, None, 120), (4, None, 60), (1, None, 15), (1, 40, 40)],
)
def test_the_warning_comes_two_minutes_before_the_limit_or_a_quarter_of_a_short_one(
    time_min: int | None, given: int | None, expected: int
) -> None:
    assert signal_lead_s(time_min, given) == expected


@pytest.mark.parametrize("given", [0, -5, 70000, True])
def test_a_lead_slurm_would_refuse_is_refused_naming_it(given: Any) -> None:
    with pytest.raises(SpecError, match=r"signal_delay_s=.*between 1 and 65535"):
        signal_lead_s(10, given)


def test_the_users_own_signal_or_requeue_option_wins() -> None:
    assert lifecycle_options(90, []) == ("--signal=B:USR1@90", "--requeue")
    assert lifecycle_options(90, ["signal", "time"]) == ("--requeue",)
    assert lifecycle_options(90, ["no-requeue"]) == ("--signal=B:USR1@90",)


def agent_args(*argv: str, script: Path) -> list[str]:
    """The sbatch arguments of the job, whose batch step runs the agent."""
    return het_submit_args(prepare([*argv, str(script)], cluster(4)).shape.components())


def test_amoeba_sbatch_asks_for_the_warning_and_requeues_on_the_agents_component(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nexec amoeba-run python train.py  # the agent is the batch shell\n")
    assert {"--signal=B:USR1@15", "--requeue"} <= set(agent_args("--elastic", "2:4", "-t", "1", script=script))
    script.write_text("#!/bin/bash\n#SBATCH --time=2:00:00\n#SBATCH --signal=B:USR1@300\namoeba-run python t.py\n")
    args = agent_args("--elastic", "2:4", "--no-requeue", script=script)
    assert not any(a.startswith("--signal") for a in args) and "--requeue" not in args


def test_a_script_that_runs_amoeba_run_as_a_child_asks_for_no_warning_and_is_told_why(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n# exec amoeba-run in a comment does not count\namoeba-run python train.py\n")
    prepared = prepare(["--elastic", "2:4", "-t", "30", str(script)], cluster(4))
    args = het_submit_args(prepared.shape.components())
    assert "--requeue" in args and not any(a.startswith("--signal") for a in args)
    assert "does not `exec amoeba-run ...`" in prepared.note


def test_amoeba_sbatch_refuses_a_signal_for_the_steps_naming_the_fix(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\namoeba-run python train.py\n")
    with pytest.raises(SpecError, match=r"--signal=USR1@60 would signal the workers' steps.*--signal=B:USR1@60"):
        prepare(["--elastic", "2:4", "--signal=USR1@60", str(script)], cluster(4))


def test_the_executor_asks_for_the_warning_and_passes_max_num_timeout_to_the_agent(tmp_path: Path) -> None:
    text = script_of(tmp_path, min_workers=2, max_workers=4, timeout_min=60, slurm_signal_delay_s=200)
    (job,) = components(text)
    assert "--signal=B:USR1@200" in job and "--requeue" in job
    assert "export AMOEBA_MAX_REQUEUES=3\n" in text
    assert text.rstrip().splitlines()[-1].startswith("exec "), "the agent must be the batch shell Slurm signals"
    with pytest.raises(SpecError, match="signal_delay_s=0"):
        script_of(tmp_path, slurm_signal_delay_s=0)


class Resumable(Checkpointable):
    """A submitit ``Checkpointable`` that counts its requeues in what it resubmits."""

    def __init__(self, requeues: int = 0) -> None:
        self.requeues = requeues

    def __call__(self, steps: int) -> int:
        return steps

    def checkpoint(self, *args: Any, **kwargs: Any) -> utils.DelayedSubmission:
        return utils.DelayedSubmission(Resumable(self.requeues + 1), *args, **kwargs)


class Declines(Resumable):
    """A ``checkpoint()`` that declines the requeue (submitit: the job ends)."""

    def checkpoint(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        return None


def plain(steps: int) -> int:
    return steps


def submit(folder: Path, fn: Any) -> utils.JobPaths:
    paths = utils.JobPaths(folder, job_id="77", task_id=0)
    paths.folder.mkdir(parents=True, exist_ok=True)
    utils.DelayedSubmission(fn, 5).dump(paths.submitted_pickle)
    return paths


def test_a_checkpointable_function_is_resubmitted_by_its_own_checkpoint_before_the_requeue(tmp_path: Path) -> None:
    paths = submit(tmp_path, Resumable())
    assert checkpoint_submission(tmp_path, "77") == ""
    again = utils.DelayedSubmission.load(paths.submitted_pickle)
    assert isinstance(again.function, Resumable) and again.function.requeues == 1 and again.args == (5,)


def test_a_checkpoint_that_returns_none_declines_the_requeue_and_a_plain_function_is_requeued_as_it_is(
    tmp_path: Path,
) -> None:
    submit(tmp_path / "a", Declines())
    assert checkpoint_submission(tmp_path / "a", "77") == "checkpoint function returned None"
    paths = submit(tmp_path / "b", plain)
    before = paths.submitted_pickle.read_bytes()
    assert checkpoint_submission(tmp_path / "b", "77") == ""
    assert paths.submitted_pickle.read_bytes() == before
    assert "cannot be read back" in checkpoint_submission(tmp_path / "missing", "77")


def test_amoeba_run_reads_the_requeue_and_restart_bounds_from_the_job(tmp_path: Path) -> None:
    args = argparse.Namespace(
        command=["python", "t.py"],
        elastic="2:4",
        gpus_per_worker=0,
        cpus_per_worker=1,
        elastic_partition="elastic",
        state_dir=tmp_path,
        daemon=None,
        restart=False,
    )
    env = {
        "SLURM_JOB_ID": "42",
        "SLURM_HET_SIZE": "2",
        "SLURM_NTASKS_HET_GROUP_1": "2",
        "SLURM_JOB_ID_HET_GROUP_0": "42",
        "AMOEBA_MAX_REQUEUES": "5",
        "AMOEBA_MAX_RESTARTS": "0",
    }
    config = config_from_args(args, env)
    assert (config.max_requeues, config.max_restarts) == (5, 0)
    with pytest.raises(SpecError, match="AMOEBA_MAX_REQUEUES='x' is not a whole number"):
        config_from_args(args, {**env, "AMOEBA_MAX_REQUEUES": "x"})
