"""The benchmarks that need the local Slurm cluster (or munged, or minutes of CPU) run here in a short mode.

Each runs its ``scripts/bench-*`` wrapper with small parameters and checks that it wrote its result document
(``benchmarks/record.py``): the benchmark's name, the machine, the load before and after, the parameters and its
figures. The figures of such a short run mean nothing; the test only keeps the benchmark from rotting. The ones
that need no Slurm and take seconds run in ``tests/unit/benchmarks/``; ``bench-backfill``'s short run is the e2e test
``tests/e2e/test_daemon_backfill.py``, which checks its document too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, ClusterHandle


def _run(command: list[str], env: dict[str, str], timeout: float, ok: tuple[int, ...] = (0,)) -> None:
    done = subprocess.run(
        [str(REPO / "scripts" / command[0]), *command[1:]],
        env={**env, "AMOEBA_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO,
    )
    assert done.returncode in ok, f"{' '.join(command)} exited {done.returncode}: {done.stderr[-3000:]}"


def _document(path: Path, benchmark: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    assert document["schema"] == 1 and document["benchmark"] == benchmark
    assert document["machine"]["cores"] >= 1 and len(document["load_after"]) == 3
    assert document["figures"], f"{benchmark} wrote no figures"
    return document


@pytest.mark.slurm
def test_bench_grow_writes_its_result_in_one_round(slurm_cluster: ClusterHandle, tmp_path: Path) -> None:
    out = tmp_path / "grow.json"
    _run(["bench-grow", "--rounds", "1", "--json", str(out)], slurm_cluster.env, timeout=600)
    figures = _document(out, "grow")["figures"]
    assert figures["grow_total_s"] > 0 and figures["grow_total_s_spread"]["n"] == 1
    # The runtime's part, split at the last satellite's fork and the coordinator's ask (warm start, the default).
    grow = figures["rounds"][0]
    assert figures["start"]["warm"] >= 1 and 0 < figures["warm_torch_s"] <= figures["warm_preload_s"]
    assert grow["warm_s"] + grow["ready_s"] + grow["join_s"] == pytest.approx(grow["runtime_s"], abs=0.01)
    assert min(grow["warm_s"], grow["ready_s"], grow["join_s"]) > -0.01  # log times are to the millisecond


@pytest.mark.slurm
def test_bench_sim_fidelity_writes_its_result_for_a_few_jobs(slurm_cluster: ClusterHandle, tmp_path: Path) -> None:
    out = tmp_path / "replay-rigid.json"
    argv = ["--jobs", "3", "--spread-s", "2", "--min-s", "2", "--max-s", "4", "--json", str(out)]
    _run(["bench-sim-fidelity", *argv], slurm_cluster.env, timeout=600, ok=(0, 1))
    _document(out, "replay-rigid")


@pytest.mark.slurm
def test_the_elastic_replay_writes_its_result_for_two_short_jobs(slurm_cluster: ClusterHandle, tmp_path: Path) -> None:
    """It starts its own private cluster instance beside the shared one (root), as a full run does, unless one is up
    already (a minute or so more then), and stops the one it started (the session's leftover check holds it to that);
    a rigid job of 5 s and an elastic one of 18 steps (seed 5)."""
    out = tmp_path / "replay.json"
    argv = ["--elastic", "--short", "--rigid", "1", "--elastic-jobs", "1", "--spread-s", "2", "--seed", "5"]
    argv += ["--json", str(out)]
    _run(["bench-sim-fidelity", *argv], dict(os.environ), timeout=1200, ok=(0, 1))
    summary = _document(out, "replay-seed5")["figures"]["summary"]
    assert summary["jobs"] == 2 and summary["elastic_jobs"] == 1 and set(summary["costs"]) == {"rigid", "elastic"}


def test_bench_policy_runs_its_loop_short(munged: None, tmp_path: Path) -> None:
    """The loop needs munged, not Slurm (its Slurm is synthetic): its simulated agents sign their reports."""
    out = tmp_path / "policy.json"
    _run(["bench-policy", "--short", "--out", str(out)], dict(os.environ), timeout=300)
    figures = _document(out, "policy-loop")["figures"]
    assert figures["report_errors"] == 0, "the daemon refused reports: a limit the run did not raise"
    assert figures["rounds"] >= 1


def test_bench_runtime_writes_its_result_quickly(tmp_path: Path) -> None:
    """No Slurm, but a minute of CPU: the runtime against plain DDP, stop-resume and torchrun, once each."""
    out = tmp_path / "runtime.json"
    _run(["bench-runtime", "--short", "--json", str(out)], dict(os.environ), timeout=900)
    figures = _document(out, "runtime")["figures"]
    assert figures["worker_pause"]["scale_out"]["n"] == 1 and figures["restart_pause"]["scale_in"]["n"] == 1


def test_bench_checkpoint_writes_its_result_quickly(tmp_path: Path) -> None:
    """No Slurm, but a minute or more of CPU: two workers writing checkpoints in the background."""
    out = tmp_path / "checkpoint.json"
    _run(["bench-checkpoint", "--quick", "--block", "10", "--json", str(out)], dict(os.environ), timeout=900)
    assert _document(out, "checkpoint")["figures"]["write_s"] > 0


@pytest.mark.slurm
def test_bench_share_live_pairs_two_jobs_by_the_policy_and_gives_the_place_back_short(
    slurm_cluster: ClusterHandle, tmp_path: Path
) -> None:
    """The live run, short: amoebad's antman policy pairs the two jobs, the sharer's worker lands on the host's GPU
    under the memory cap the daemon computed, the host's resize takes the place back, both ledgers hold."""
    out = tmp_path / "share-live.json"
    command = ["bench-share", "--live", "--short", "--quiet", "--slurm-conf", str(slurm_cluster.conf)]
    _run([*command, "--json", str(out)], slurm_cluster.env, timeout=600)
    figures = _document(out, "share-live")["figures"]
    assert figures["guaranteed_failures"] == 0 and figures["exactly_once"] is True
    assert figures["paired_by"].startswith(f"job {figures['sharer']}: share 1 -> 2 workers, beside job ")
    assert "(antman: beside" in figures["paired_by"] and figures["beside_on_host_gpu"] is True
    # the cap: the fake GPU's 1 GiB less what the host reported it peaked at
    assert 0 < figures["sharer_memory_cap_bytes"] < 1 << 30
    assert figures["host_alone_samples_per_s"] > 0
    # the daemon may measure the sharer slower with its worker beside the host, and give the place back by itself
    assert figures["given_back_for_loss"] or figures["sharer_shared_samples_per_s"] > 0
    assert figures["sharer_own_samples_per_s"] > 0, "the sharer trained on after the place was taken back"


def test_bench_share_writes_its_result_short(tmp_path: Path) -> None:
    """No Slurm, but a minute or more of CPU: a guaranteed job and a paced, capped sharer pinned to one core."""
    out = tmp_path / "share.json"
    _run(["bench-share", "--short", "--json", str(out)], dict(os.environ), timeout=900)
    figures = _document(out, "share")["figures"]
    assert figures["guaranteed_failures"] == 0 and figures["exactly_once"] is True
    assert figures["sharer_micro_after"] < figures["sharer_micro_before"], "the owner grew back: the sharer shrank"
