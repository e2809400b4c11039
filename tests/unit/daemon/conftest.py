"""Fixtures of the daemon's unit tests: the real daemon loop on a real socket, over a Slurm in memory."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_amoeba.daemon import Daemon, DaemonConfig
from tests.unit.daemon.fakes import FakeSlurm, job, node


@pytest.fixture(autouse=True)
def _munge(munged: None) -> None:
    """Every daemon test sends or checks munge credentials."""


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[Daemon, threading.Thread]]:
    """A daemon running its loop in a thread (rounds every 0.2 s); job 100 holds 2 of n1's 4 GPUs."""
    slurm = FakeSlurm(job_list=[job(100, gpus={"n1": 2})], node_list=[node("n1", used=2)])
    config = DaemonConfig(interval_s=0.2, listen="tcp://127.0.0.1:*", metrics_port=0, state_file=str(tmp_path / "s"))
    daemon = Daemon(config, slurm)
    daemon.start()
    stop = threading.Event()
    thread = threading.Thread(target=daemon.run, args=(stop,), daemon=True)
    thread.start()
    yield daemon, thread
    stop.set()
    thread.join(10)
    daemon.close()
