"""Shares survive a restart of the daemon: the ledger keeps each share it ordered in the state file, gives it back to
the sharer's agent when it registers again, and forgets it when the share is taken back or the job ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_amoeba.daemon.agents import Beside, Registration
from slurm_amoeba.daemon.config import DaemonConfig
from slurm_amoeba.daemon.ledger import Ledger
from slurm_amoeba.daemon.metrics import DaemonMetrics
from slurm_amoeba.daemon.state import DaemonState, load_state

SHARE = Beside("7", "share", {"n5": 1}, "opportunistic", 1000, "/dev/shm/amoeba-share-7.json", 0.05, 8)


def _ledger(path: Path) -> Ledger:
    return Ledger(DaemonConfig(state_file=str(path)), DaemonMetrics(), lambda: 100.0)


def _register(ledger: Ledger, job_id: str) -> None:
    ledger.register(Registration(job_id, "tcp://127.0.0.1:1", 1, 4, 1, "batch", "elastic"), 1000, "alice")


def test_a_share_ordered_before_a_restart_is_the_sharers_again_when_its_agent_registers(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    before = _ledger(path)
    _register(before, "8")
    before.order(before.agents["8"], 2, "beside job 7", "policy", beside=SHARE)
    before.save()
    assert json.loads(path.read_text())["shares"] == {"8": SHARE.to_body()}

    after = _ledger(path)  # the daemon restarted: nothing but the file
    assert after.state.shares == {"8": SHARE}
    _register(after, "8")
    _register(after, "9")
    assert after.agents["8"].beside == SHARE and after.agents["9"].beside is None


def test_a_share_taken_back_or_of_an_ended_job_leaves_the_state_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    ledger = _ledger(path)
    for job in ("8", "9"):
        _register(ledger, job)
        ledger.order(ledger.agents[job], 2, "beside job 7", "policy", beside=SHARE)
    ledger.order(ledger.agents["8"], 1, "host 7 resized", "policy", unshare=True)
    ledger.save()
    assert set(load_state(path).shares) == {"9"}
    ledger.forget(["9"], active=["7", "8"])
    ledger.save()
    assert load_state(path).shares == {}


def test_a_state_file_without_shares_reads_as_no_share_and_a_wrong_one_names_the_field() -> None:
    old = {"version": 1, "pinned": ["3"], "draining": False, "in_flight": {}}
    assert DaemonState.from_json(old).shares == {}
    bad = {**old, "shares": {"8": {**SHARE.to_body(), "sub_batch": -1}}}
    with pytest.raises(ValueError, match=r"shares\['8'\].*sub_batch"):
        DaemonState.from_json(bad)
