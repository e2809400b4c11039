"""SIGHUP reloads amoebad's configuration: a valid file applies from the next round, anything else keeps the old."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from slurm_amoeba.daemon import Daemon, load_config
from tests.unit.daemon.fakes import FakeSlurm, job, node


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


PORT = _free_port()
BASE = f"""\
interval_s: 5
listen: tcp://127.0.0.1:{PORT}
metrics: {{port: 0}}
policy: {{name: elastic-backfill}}
log_level: info
"""


def _daemon(tmp_path: Path, text: str = BASE) -> tuple[Daemon, Path]:
    path = tmp_path / "amoebad.yaml"
    path.write_text(text)
    slurm = FakeSlurm(job_list=[job(100, gpus={"n1": 2})], node_list=[node("n1", used=2)])
    return Daemon(load_config(path), slurm), path


def _loaded(daemon: Daemon) -> str:
    return next(
        line for line in daemon.metrics.registry.render().splitlines() if line.startswith("amoeba_config_loaded{")
    )


def test_a_valid_file_replaces_the_configuration_and_the_policy_and_the_metric_names_it(tmp_path: Path) -> None:
    daemon, path = _daemon(tmp_path)
    before = daemon.config.digest
    assert f'digest="{before}"' in _loaded(daemon) and f'source="{path}"' in _loaded(daemon)
    path.write_text(BASE.replace("interval_s: 5", "interval_s: 2").replace("elastic-backfill", "fifo"))
    assert daemon.reload() is True
    assert daemon.config.interval_s == 2 and daemon.config.digest != before
    assert daemon.policy.name == daemon.round_loop.policy.name == daemon.requests.policy.name == "fifo"
    assert (
        daemon.round_loop.config is daemon.config
        and daemon.requests.status()["config"]["digest"] == daemon.config.digest
    )
    assert f'digest="{daemon.config.digest}"' in _loaded(daemon) and before not in daemon.metrics.registry.render()
    assert daemon.metrics.config_reloads.value({"outcome": "applied"}) == 1


@pytest.mark.parametrize(
    ("text", "outcome", "logged"),
    [
        ("interval_s: -1\n", "invalid", "interval_s = -1"),
        ("interval_s: [\n", "invalid", "is not valid YAML"),
        (BASE.replace("elastic-backfill", "sjf-bsbf"), "invalid", "policy 'sjf-bsbf' cannot run in amoebad"),
        (BASE.replace(f":{PORT}", f":{PORT + 1}"), "needs_restart", "changes listen"),
        (BASE + "queue_order: {enabled: true}\n", "needs_restart", "changes queue_order"),
    ],
)
def test_a_file_the_daemon_cannot_take_keeps_the_running_configuration_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str, outcome: str, logged: str
) -> None:
    daemon, path = _daemon(tmp_path)
    running = daemon.config
    path.write_text(text)
    assert daemon.reload() is False
    assert daemon.config is running and daemon.round_loop.config is running
    assert daemon.metrics.config_reloads.value({"outcome": outcome}) == 1
    assert logged in caplog.text and f"keeps running with {path} (sha256 {running.digest})" in caplog.text


def test_a_missing_file_keeps_the_running_configuration(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    daemon, path = _daemon(tmp_path)
    path.unlink()
    assert daemon.reload() is False and daemon.metrics.config_reloads.value({"outcome": "invalid"}) == 1
    assert "cannot read the daemon's configuration" in caplog.text


def test_the_running_loop_reloads_when_asked_as_the_sighup_handler_does(tmp_path: Path) -> None:
    daemon, path = _daemon(tmp_path)
    daemon.start()
    stop = threading.Event()
    thread = threading.Thread(target=daemon.run, args=(stop,), daemon=True)
    thread.start()
    try:
        path.write_text(BASE.replace("interval_s: 5", "interval_s: 0.5"))
        daemon.request_reload()
        deadline = time.monotonic() + 10
        while daemon.config.interval_s != 0.5 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert daemon.config.interval_s == 0.5
    finally:
        stop.set()
        thread.join(10)
        daemon.close()
