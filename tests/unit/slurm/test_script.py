"""Submission options and batch-script rendering, compared with a golden file."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.slurm import SubmitOptions, het_submit_args, render_batch_script, sbatch_argv

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "golden"


def test_options_become_sbatch_arguments() -> None:
    opts = SubmitOptions(
        name="amoeba-sat",
        comment="amoeba-parent=12",
        partition="elastic",
        nodes=1,
        gpus_per_node=2,
        mem_mb=1000,
        time_min=5,
        dependency="afterok:3",
        hold=True,
    )
    assert opts.to_args() == [
        "--job-name=amoeba-sat",
        "--comment=amoeba-parent=12",
        "--partition=elastic",
        "--nodes=1",
        "--gres=gpu:2",
        "--mem=1000M",
        "--time=5",
        "--dependency=afterok:3",
        "--hold",
    ]


def test_heterogeneous_components_are_separated_by_a_colon() -> None:
    args = het_submit_args([SubmitOptions(ntasks=1), SubmitOptions(nodes=2, gpus_per_node=1)])
    assert args == ["--ntasks=1", ":", "--nodes=2", "--gres=gpu:1"]


def test_heterogeneous_script_matches_the_golden_file() -> None:
    text = render_batch_script(
        [
            SubmitOptions(name="job with space", ntasks=1, cpus_per_task=1),
            SubmitOptions(nodes=2, ntasks_per_node=1, gpus_per_node=2, partition="batch"),
        ],
        [["srun", "--het-group=0", "amoeba-agent", "--arg", "it's"], ["echo", "$NOT_EXPANDED"]],
    )
    assert text == (GOLDEN / "hetjob.sh").read_text()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"nodes": 0}, "nodes=0"),
        ({"gpus_per_node": -1}, "gpus_per_node=-1"),
        ({"name": "a\nb"}, "newline"),
        ({"dependency": "whenever"}, "dependency='whenever'"),
        ({"cpus_per_task": True}, "cpus_per_task=True"),
    ],
)
def test_bad_values_are_refused_with_the_option_and_value(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(SpecError, match=match):
        SubmitOptions(**kwargs)  # type: ignore[arg-type]


def test_a_script_needs_a_component_and_a_command() -> None:
    with pytest.raises(SpecError, match="component"):
        render_batch_script([], [["true"]])
    with pytest.raises(SpecError, match="command"):
        render_batch_script([SubmitOptions()], [])


def test_the_preamble_runs_after_the_shell_options_and_before_the_commands_as_written() -> None:
    text = render_batch_script([SubmitOptions(ntasks=1)], [["run", "$X"]], ['export DIR="$SLURM_JOB_ID"', "set +u"])
    lines = text.splitlines()
    start = lines.index("set -euo pipefail")
    assert lines[start + 1 :] == ['export DIR="$SLURM_JOB_ID"', "set +u", "run '$X'"]


def test_the_sbatch_command_puts_components_before_the_script_and_its_arguments_after() -> None:
    two = [SubmitOptions(ntasks=1), SubmitOptions(ntasks=2)]
    assert sbatch_argv(two, "job.sh", ["--epochs", "2"]) == [
        "sbatch", "--parsable", "--ntasks=1", ":", "--ntasks=2", "job.sh", "--epochs", "2"
    ]  # fmt: skip
    assert sbatch_argv([], "job.sh", test_only=True) == ["sbatch", "--test-only", "job.sh"]
