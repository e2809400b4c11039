"""amoeba-sbatch's reading of its command line and script, without Slurm (a fake cluster of 4 nodes x 4 GPUs)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.launcher.sbatch import dry_run_release, prepare, submission_env
from slurm_amoeba.slurm import het_submit_args
from slurm_amoeba.slurm.release import SUPPORTED_SERIES, SlurmRelease
from tests.unit.agent.fakes import FakeSlurm, node
from tests.unit.launcher.test_executor import cluster

PLAIN = "#!/bin/bash\n#SBATCH --elastic=2:8\n#SBATCH --ntasks=2 --gpus-per-task=1\namoeba-run python train.py\n"


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\n#SBATCH -J x\namoeba-run python train.py\n")
    return path


@pytest.fixture(autouse=True)
def no_job_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "AMOEBA_GPUS_PER_WORKER",
        "AMOEBA_CPUS_PER_WORKER",
        "AMOEBA_ELASTIC_PARTITION",
        "AMOEBA_ADMISSION_DELAY_S",
    ):
        monkeypatch.delenv(name, raising=False)


def argv_of(*args: str) -> list[str]:
    prepared = prepare(list(args), cluster(4))
    return het_submit_args(prepared.shape.components())


def test_mem_and_gpus_go_to_sbatch_not_to_our_per_worker_options(script: Path) -> None:
    prepared = prepare(["--elastic", "2:4", "--mem", "32000", str(script)], cluster(4))
    assert prepared.shape.spec.mem_per_worker_mb == 0 and prepared.shape.extra == ("--mem", "32000")
    with pytest.raises(SpecError, match=r"sets --gpus 4 itself"):
        prepare(["--elastic", "2:4", "--gpus", "4", str(script)], cluster(4))


def test_our_options_are_never_abbreviated(script: Path) -> None:
    with pytest.raises(SpecError, match="--gpus-per is ambiguous for sbatch"):
        prepare(["--elastic", "2:4", "--gpus-per", "2", str(script)], cluster(4))


@pytest.mark.parametrize("time", ["1:00:00", "2-00:00:00", "30", "5:30", "1-12", "UNLIMITED"])
def test_slurm_time_formats_pass_to_sbatch_unchanged(script: Path, time: str) -> None:
    args = argv_of("--elastic", "2:4", "-t", time, str(script))
    assert args[args.index("-t") + 1] == time


def test_a_time_slurm_cannot_read_is_refused_naming_the_option(script: Path) -> None:
    with pytest.raises(SpecError, match=r"-t 1h: time '1h' is not a Slurm time"):
        prepare(["--elastic", "2:4", "-t", "1h", str(script)], cluster(4))


def test_account_qos_constraint_reservation_reach_the_job_once(script: Path) -> None:
    args = argv_of(
        "--elastic", "2:4", "-A", "acct", "--qos=high", "-C", "a100", "--reservation", "r1", "-p", "batch", str(script)
    )
    line = " ".join(args)
    assert ":" not in args  # one component: the job is no heterogeneous job (SLURM-FACTS.md, hetjob start failure)
    for part in ("-A acct", "--qos=high", "-C a100", "--reservation r1", "--partition=batch"):
        assert line.count(part) == 1, part


def test_script_args_are_the_scripts_even_when_they_look_like_ours(script: Path) -> None:
    prepared = prepare(["--elastic", "2:4", str(script), "--elastic", "9", "--gpus-per-worker", "3"], cluster(4))
    assert prepared.script_args == ["--elastic", "9", "--gpus-per-worker", "3"]
    assert prepared.shape.spec.max_workers == 4


def test_wrap_submits_no_script(script: Path) -> None:
    prepared = prepare(["--elastic", "1:2", "--wrap=amoeba-run python t.py"], cluster(4))
    assert prepared.script is None and prepared.wrap == "amoeba-run python t.py"
    assert "--wrap=amoeba-run python t.py" not in prepared.shape.extra
    with pytest.raises(SpecError, match="--wrap takes no script"):
        prepare(["--elastic", "1:2", "--wrap", "true", str(script)], cluster(4))


def test_test_only_and_dry_run_are_ours(script: Path) -> None:
    prepared = prepare(["--test-only", "--elastic", "1:2", str(script)], cluster(4))
    assert prepared.test_only and not prepared.dry_run and "--test-only" not in prepared.shape.extra
    assert prepare(["--dry-run", "--elastic", "1:2", str(script)], cluster(4)).dry_run


def test_a_plain_sbatch_script_gives_each_worker_its_tasks_gpus_and_the_agent_none(tmp_path: Path) -> None:
    path = tmp_path / "plain.sh"
    path.write_text(PLAIN.replace("--gpus-per-task=1", "--gpus-per-task=2 --cpus-per-task=3"))
    prepared = prepare([str(path)], cluster(4))
    spec = prepared.shape.spec
    assert (spec.min_workers, spec.max_workers, spec.gpus_per_worker, spec.cpus_per_worker) == (2, 8, 2, 3)
    args = het_submit_args(prepared.shape.components())
    assert ":" not in args and "--gpus-per-task=0" not in args  # the agent shares the workers' allocation
    assert "--gpus-per-task=2" in args and "--ntasks=2" in args and "--cpus-per-task=3" in args
    with pytest.raises(SpecError, match=r"#SBATCH --gpus-per-task=2 but the command line 1"):
        prepare(["--gpus-per-worker", "1", str(path)], cluster(4))


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("#SBATCH --gres=gpu:2", "#SBATCH --gres=gpu:2 in .*sizes the job itself"),
        ("#SBATCH -N 2", "#SBATCH -N 2 in"),
        ("#SBATCH --array=1-3", "--array=1-3"),
        ("#SBATCH -t 2h", "-t 2h: time '2h'"),
    ],
)
def test_script_lines_that_would_size_the_agent_are_refused(tmp_path: Path, line: str, needle: str) -> None:
    path = tmp_path / "job.sh"
    path.write_text(f"#!/bin/bash\n#SBATCH --elastic=1:2\n{line}\namoeba-run true\n")
    with pytest.raises(SpecError, match=needle):
        prepare([str(path)], cluster(4))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-n", "2"], "sets -n 2 itself"),
        (["--gpus-per-task=1"], "sets --gpus-per-task=1 itself"),
        (["--array=0-3"], "cannot be a job array"),
        (["-W"], "returns once the job is submitted"),
    ],
)
def test_command_line_options_it_cannot_pass_are_refused(script: Path, args: list[str], needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        prepare(["--elastic", "1:2", *args, str(script)], cluster(4))


def test_the_command_line_range_beats_the_scripts_in_the_job_too(tmp_path: Path) -> None:
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\n#SBATCH --elastic=2:8\namoeba-run true\n")
    prepared = prepare(["--elastic", "1:3", "--elastic-partition", "spot", str(path)], cluster(4))
    assert prepared.shape.extra[-2:] == ("--elastic=1:3", "--elastic-partition=spot")
    with pytest.raises(SpecError, match="--no-elastic: amoeba-sbatch submits an elastic job"):
        prepare(["--elastic", "1:3", "--no-elastic", str(path)], cluster(4))


def test_memory_per_worker_takes_slurms_sizes(script: Path) -> None:
    assert (
        prepare(["--elastic", "2:4", "--mem-per-worker", "32G", str(script)], cluster(4)).shape.spec.mem_per_worker_mb
        == 32768
    )
    assert (
        prepare(["--elastic", "2:4", "--mem-per-worker=500", str(script)], cluster(4)).shape.spec.mem_per_worker_mb
        == 500
    )


def test_an_enclosing_elastic_jobs_option_does_not_reach_the_new_job(script: Path) -> None:
    shape = prepare(["--elastic", "1:3", str(script)], cluster(4)).shape
    enclosing = {"SLURM_SPANK__SLURM_SPANK_OPTION_amoeba_elastic": "2:8", "AMOEBA_ELASTIC_MIN": "2", "PATH": "/bin"}
    env = submission_env(enclosing, shape)
    assert "SLURM_SPANK__SLURM_SPANK_OPTION_amoeba_elastic" not in env
    assert (env["AMOEBA_ELASTIC_MIN"], env["AMOEBA_ELASTIC_MAX"], env["PATH"]) == ("1", "3", "/bin")


def test_the_job_carries_its_elastic_mark_and_the_users_comment_after_it(tmp_path: Path, script: Path) -> None:
    assert "--comment=amoeba-elastic=2:8" in argv_of("--elastic", "2:8", str(script))
    args = argv_of("--elastic", "2:8", "--comment", "my run #3", str(script))
    assert args.count("--comment=amoeba-elastic=2:8 my run #3") == 1 and "my run #3" not in args
    path = tmp_path / "commented.sh"
    path.write_text("#!/bin/bash\n#SBATCH --comment=from-script\namoeba-run python train.py\n")
    assert "--comment=amoeba-elastic=1:4 from-script" in argv_of("--elastic", "1:4", str(path))


def test_a_site_admission_delay_makes_new_jobs_wait_unless_the_user_gave_a_begin(
    script: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not any(a.startswith("--begin") for a in argv_of("--elastic", "2:8", str(script)))
    monkeypatch.setenv("AMOEBA_ADMISSION_DELAY_S", "10")
    assert "--begin=now+10" in argv_of("--elastic", "2:8", str(script))
    mine = argv_of("--elastic", "2:8", "--begin=now+1hour", str(script))
    assert "--begin=now+1hour" in mine and "--begin=now+10" not in mine
    monkeypatch.setenv("AMOEBA_ADMISSION_DELAY_S", "ten")
    with pytest.raises(SpecError, match="AMOEBA_ADMISSION_DELAY_S='ten': give whole seconds"):
        prepare(["--elastic", "2:8", str(script)], cluster(4))


@pytest.mark.parametrize("release", [None, SlurmRelease(22, 5, 8), SlurmRelease(23, 11, 4), SlurmRelease(25, 11, 0)])
@pytest.mark.parametrize("option", ["--tres-per-task", "--container-image"])
def test_an_option_with_its_value_is_never_taken_as_the_script(
    script: Path, release: SlurmRelease | None, option: str
) -> None:
    # --tres-per-task is sbatch's own from 23.02 on and unknown to 22.05's; --container-image is a plugin's (pyxis)
    prepared = prepare(["--elastic", "1:2", option, "gres/gpu:1", str(script)], cluster(4), release)
    assert prepared.script == script
    argv = het_submit_args(prepared.shape.components())
    assert [argv[i + 1] for i, word in enumerate(argv) if word == option] == ["gres/gpu:1"]


def _slurm_that_logs(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose Slurm programs only write their argv to a log (and fail)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "slurm-calls.log"
    for program in ("sinfo", "squeue", "sbatch", "scontrol", "sacct", "srun", "scancel"):
        path = bin_dir / program
        path.write_text(f'#!/bin/sh\necho "{program} $*" >> {log}\nexit 1\n')
        path.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(Path.cwd())}
    env.pop("AMOEBA_SLURM_RELEASE", None)
    return env, log


@pytest.mark.parametrize("release", [[], ["--slurm-release", "22.05"], ["--slurm-release=24.11"]])
def test_a_dry_run_asks_slurm_nothing_not_even_its_release(tmp_path: Path, script: Path, release: list[str]) -> None:
    env, log = _slurm_that_logs(tmp_path)
    argv = [sys.executable, "-m", "slurm_amoeba.launcher.sbatch", "--dry-run", *release, "--elastic", "1:2"]
    done = subprocess.run([*argv, "-t", "30", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "would submit" in done.stderr and "sbatch" in done.stderr and " -t 30 " in done.stderr
    assert not log.exists(), log.read_text()


def test_without_a_dry_run_the_release_is_asked_of_slurm(tmp_path: Path, script: Path) -> None:
    env, log = _slurm_that_logs(tmp_path)
    argv = [sys.executable, "-m", "slurm_amoeba.launcher.sbatch", "--elastic", "1:2", str(script)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and log.read_text().startswith("sinfo --version")


def test_the_release_of_a_dry_run_comes_from_the_flag_then_the_environment_then_the_newest(script: Path) -> None:
    argv = ["--dry-run", "--elastic", "1:2", str(script)]
    assert dry_run_release(argv, {}) == SlurmRelease.parse(SUPPORTED_SERIES[-1])
    assert dry_run_release(argv, {"AMOEBA_SLURM_RELEASE": "23.02"}) == SlurmRelease(23, 2)
    assert dry_run_release(["--slurm-release", "22.05", *argv], {"AMOEBA_SLURM_RELEASE": "23.02"}) == SlurmRelease(
        22, 5
    )
    assert dry_run_release(argv[1:], {"AMOEBA_SLURM_RELEASE": "23.02"}) is None
    with pytest.raises(SpecError, match="'latest' .* is not a release: write e.g. 23.11"):
        dry_run_release(["--slurm-release", "latest", *argv], {})
    with pytest.raises(SpecError, match="goes with --dry-run"):
        dry_run_release(["--slurm-release", "22.05", *argv[1:]], {})


def sharing_cluster() -> FakeSlurm:
    """Four nodes of batch and elastic, and s1 and p1 of the sharing partitions ``share`` and ``pairs``."""
    shared = [dataclasses.replace(node(name), partitions=(part,)) for name, part in (("s1", "share"), ("p1", "pairs"))]
    return FakeSlurm(node_list=[*cluster(4).node_list, *shared])


def test_share_puts_the_minimum_workers_on_shards_of_the_sharing_partition_and_tells_the_agent(script: Path) -> None:
    prepared = prepare(["--elastic", "1:4", "--share", str(script)], sharing_cluster())
    job = " ".join(het_submit_args(prepared.shape.components()))
    assert " : " not in job  # one component: the agent runs in its batch step, on the sharing partition too
    assert "--partition=share" in job and "--gres=shard:2 --ntasks-per-node=1" in job and "--gpus-per-task" not in job
    assert prepared.shape.environment()["AMOEBA_SHARE"] == "guaranteed"
    argv = ["--elastic", "1:4", "--share=opportunistic", "--share-partition", "pairs", str(script)]
    again = prepare(argv, sharing_cluster())
    assert again.shape.environment()["AMOEBA_SHARE"] == "opportunistic"
    assert "--partition=pairs" in " ".join(het_submit_args(again.shape.components()))
    assert "AMOEBA_SHARE" not in prepare(["--elastic", "1:4", str(script)], cluster(4)).shape.environment()


def test_share_with_more_than_one_gpu_per_worker_is_refused_with_the_fix(script: Path) -> None:
    with pytest.raises(SpecError, match=r"--share with 2 GPU\(s\) per worker: .* give --gpus-per-worker 1"):
        prepare(["--elastic", "1:4", "--gpus-per-worker", "2", "--share", str(script)], sharing_cluster())
