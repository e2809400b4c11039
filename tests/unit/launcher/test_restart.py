"""Unmodified torchrun scripts under the restart supervisor (launcher/restart.py), locally: the torchrun contract,
a job grown, shrunk and hit by a SIGKILL that ends with the fixed-size run's parameters, and a script error's status
ending the job."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import torch

from examples.torchrun_ddp import build_dataset, build_model, build_optimizer
from slurm_amoeba.core.jobenv import JobEnv
from slurm_amoeba.launcher.restart import child_environ, exit_status, restart_command, torchrun_env, warm_order
from slurm_amoeba.launcher.run import build_parser, config_from_args
from slurm_amoeba.launcher.sbatch import prepare
from slurm_amoeba.local.cli import build_parser as local_parser
from slurm_amoeba.local.job import LocalJob
from slurm_amoeba.runtime.membership import Phase
from slurm_amoeba.runtime.protocol import GenerationPlan
from slurm_amoeba.slurm import het_submit_args
from tests.unit.launcher.test_executor import cluster
from tests.unit.slurm.test_allocation import PLAIN
from tests.waiting import wait_until

ROOT = Path(__file__).parents[3]
SCRIPT = ROOT / "examples" / "torchrun_ddp.py"
EPOCHS, SIZE, BATCH = 8, 240, 24  # 80 steps of 24 samples; 24 splits over 1, 2, 3 and 4 ranks
# Short deadlines: a stopped script is given 10 s, a failed one's peers learn of a death within 2 s.
ENV = {"PYTHONPATH": str(ROOT), "AMOEBA_RESTART_GRACE_S": "10", "AMOEBA_RESTART_SETTLE_S": "2"}


def test_the_torchrun_contract_follows_the_plan_hosts_and_generation(tmp_path: Path) -> None:
    plan = GenerationPlan(5, ("w3", "w1", "w7"), ("n1", "n2", "n2"), source="w3")
    env = torchrun_env(plan, "w7", ("10.0.0.1", 29500), job_id="job9", stop_file=tmp_path / "stop")
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")} == {
        "RANK": "2",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "3",
        "LOCAL_WORLD_SIZE": "2",
    }
    assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["TORCHELASTIC_RESTART_COUNT"]) == ("1", "2", "4")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["TORCHELASTIC_USE_AGENT_STORE"]) == (
        "10.0.0.1",
        "29500",
        "True",
    )
    assert env["AMOEBA_STOP_FILE"] == str(tmp_path / "stop")


def test_the_script_sees_neither_the_jobs_secret_nor_its_store() -> None:
    base = {"AMOEBA_JOB_SECRET": "ab", "AMOEBA_STORE_ADDR": "h", "AMOEBA_STORE_PORT": "1", "PATH": "/bin"}
    assert child_environ(base, {"RANK": "0"}) == {"PATH": "/bin", "RANK": "0"}
    assert (exit_status(3), exit_status(-9)) == (3, 137)
    assert restart_command(["python", "t.py"], "py") == [
        "py",
        "-m",
        "slurm_amoeba.launcher.restart",
        "--",
        "python",
        "t.py",
    ]


def reference_parameters() -> list[float]:
    """The same training in one process, without torch.distributed: the fixed-size run's result."""
    model, dataset = build_model(), build_dataset(SIZE)
    optimizer = build_optimizer(model)
    for epoch in range(EPOCHS):
        order = torch.randperm(SIZE, generator=torch.Generator().manual_seed(1 + epoch))  # DistributedSampler's
        for start in range(0, SIZE, BATCH):
            x, y = dataset[order[start : start + BATCH]]
            optimizer.zero_grad()
            torch.nn.MSELoss()(model(x), y).backward()
            optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()


def starts(job: LocalJob, worker: str) -> int:
    """How many times the script started in ``worker``'s slot (it prints one line per start)."""
    return len(re.findall(r"restart \d+, from step", (job.log_dir / f"{worker}.log").read_text(errors="replace")))


def saved_at(checkpoint: Path) -> int:
    """When rank 0 last wrote ``checkpoint`` (ns; 0 before the first save)."""
    return checkpoint.stat().st_mtime_ns if checkpoint.exists() else 0


def wait_started(job: LocalJob, worker: str, count: int, checkpoint: Path, timeout_s: float = 60) -> int:
    """Wait until the script started ``count`` times in ``worker``'s slot and made steps since (rank 0 saved
    ``checkpoint`` periodically after that start); its pid."""
    wait_until(f"{worker}'s script to start {count} times", lambda: starts(job, worker) >= count, timeout_s, 0.05)
    before = saved_at(checkpoint)
    wait_until(f"a periodic save after start {count}", lambda: saved_at(checkpoint) != before, timeout_s, 0.05)
    return int(re.findall(r"script pid (\d+)", (job.log_dir / f"{worker}.log").read_text())[-1])


def test_a_plain_ddp_script_grows_shrinks_survives_a_kill_and_ends_with_the_fixed_size_result(tmp_path: Path) -> None:
    out, checkpoint = tmp_path / "out.json", tmp_path / "ck.pt"
    command = [sys.executable, str(SCRIPT), "--checkpoint", str(checkpoint), "--out", str(out)]
    command += ["--epochs", str(EPOCHS), "--save-every", "5", "--step-sleep", "0.05"]
    with LocalJob(
        restart_command(command), initial_workers=1, max_workers=4, job_id="torchrun", log_dir=tmp_path, env=ENV
    ) as job:
        script = wait_started(job, "w0", 1, checkpoint)
        # The script is held while the joiners start (a loaded machine may take longer than the whole training).
        os.kill(script, signal.SIGSTOP)
        job.add(2)  # 1 -> 3
        job.wait_for(lambda v: len(v.ready_workers()) == 2 or v.generation > 1, 60, "2 ready joiners")
        os.kill(script, signal.SIGCONT)
        job.wait_for(lambda v: v.world_size == 3, 60, "3 members")
        wait_started(job, "w0", 2, checkpoint)  # steps at 3 workers: the hook saves a later step than the last start
        job.terminate("w1")  # 3 -> 2 by SIGTERM to w1 and its script (Slurm preemption): the checkpoint hook
        job.wait_for(lambda v: v.world_size == 2, 60, "2 members")
        wait_started(job, "w0", 3, checkpoint)  # a periodic save at 2 workers
        job.kill("w2")  # 2 -> 1: w0's script fails, restarts from the last periodic checkpoint
        result = job.wait(timeout_s=60)
    assert result.phase is Phase.FINISHED, job.log_tail("w0")
    assert result.returncodes["w0"] == 0
    sizes = [len(record.plan.members) for record in result.view.history]
    assert sizes == [1, 3, 2, 1]
    data = json.loads(out.read_text())
    history = data["history"]  # [restart count, world size, first step] of each start of the script
    assert [h[1] for h in history] == [1, 3, 2, 1] and [h[0] for h in history] == [0, 1, 2, 3]
    assert history[1][2] > 0 and history[2][2] > history[1][2]  # resumed where the hook saved, not from 0
    assert data["step"] == EPOCHS * SIZE // BATCH
    expected = reference_parameters()
    assert max(abs(a - b) for a, b in zip(data["params"], expected, strict=True)) < 1e-9


def test_a_script_error_on_one_rank_ends_every_worker_with_its_status(tmp_path: Path) -> None:
    code = "import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(60)\n"
    env = {**ENV, "AMOEBA_RESTART_SETTLE_S": "1"}  # waited out once: no generation ends to make the exit a restart
    with LocalJob(
        restart_command([sys.executable, "-c", code]), initial_workers=2, job_id="failing", log_dir=tmp_path, env=env
    ) as job:
        started = time.monotonic()
        result = job.wait(timeout_s=40)
    assert result.phase is Phase.LOST
    assert result.returncodes == {"w0": 3, "w1": 3}, {w: job.log_tail(w) for w in result.returncodes}
    assert time.monotonic() - started < 30  # the sleeping rank was stopped, not waited for


def test_amoeba_run_and_amoeba_local_put_the_supervisor_before_the_script_when_asked() -> None:
    env = {**PLAIN, "AMOEBA_ELASTIC_MIN": "2", "AMOEBA_ELASTIC_MAX": "4"}
    parser = build_parser(JobEnv.from_environ(env))
    assert config_from_args(parser.parse_args(["python", "t.py"]), env).command == ("python", "t.py")
    wrapped = config_from_args(parser.parse_args(["--restart", "python", "t.py"]), env).command
    assert wrapped == tuple(restart_command(["python", "t.py"]))
    assert local_parser().parse_args(["--restart", "--", "python", "t.py"]).restart


def test_amoeba_sbatch_restart_is_ours_and_not_passed_to_sbatch(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\namoeba-run python train.py\n")
    prepared = prepare(["--restart", "--elastic", "1:2", str(script)], cluster(4))
    assert prepared.restart and "--restart" not in het_submit_args(prepared.shape.components())
    assert not prepare(["--elastic", "1:2", str(script)], cluster(4)).restart


def test_a_warm_interpreter_runs_this_pythons_scripts_and_modules_and_nothing_else() -> None:
    python = sys.executable
    assert warm_order([python, "t.py", "--x", "1"], python) == {"module": "", "argv": ["t.py", "--x", "1"]}
    assert warm_order([python, "-m", "pkg.train", "-v"], python) == {"module": "pkg.train", "argv": ["pkg.train", "-v"]}
    assert warm_order([python, "-u", "t.py"], python) is None  # interpreter options: a fresh interpreter runs it
    assert warm_order(["bash", "job.sh"], python) is None
    assert warm_order([python], python) is None
