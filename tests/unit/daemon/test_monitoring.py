"""The monitoring kit in configs/monitoring: rules Prometheus accepts, names the daemon exports, and a real
Prometheus that scrapes a running amoebad (over a Slurm in memory) and answers a query through its HTTP API."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurm_amoeba.daemon import Daemon, DaemonConfig
from slurm_amoeba.daemon.metrics import DaemonMetrics
from tests.conftest import installed_tool
from tests.unit.daemon.fakes import FakeSlurm, job, node

KIT = Path(__file__).resolve().parents[3] / "configs" / "monitoring"
RULES = KIT / "amoebad-rules.yml"
DASHBOARD = KIT / "amoebad-dashboard.json"
SCRAPE = KIT / "prometheus-scrape.yml"
#: PromQL words that are not series names.
_PROMQL = {"sum", "by", "on", "rate", "increase", "histogram_quantile", "clamp_min", "time", "le", "instance", "up"}


def _tool(name: str) -> str:
    return installed_tool(name, "Debian's prometheus package")


def _exported() -> set[str]:
    """Every series name the daemon's page carries (histograms with their _bucket/_sum/_count)."""
    names = set()
    for metric in DaemonMetrics().registry.collectors.collect():
        names.add(metric.name)
        names.update(sample.name for sample in metric.samples)
        if metric.type == "histogram":
            names.update(f"{metric.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
        if metric.type == "counter":
            names.add(f"{metric.name}_total")
    return names


def _series(expr: str) -> set[str]:
    without_strings = re.sub(r'"[^"]*"', "", expr)
    without_ranges = re.sub(r"\[[^]]*\]", "", without_strings)
    without_labels = re.sub(r"\{[^}]*\}", "", without_ranges)
    words = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_labels))
    grouped = set(re.findall(r"(?:by|on) \(([^)]*)\)", without_labels))
    labels = {label.strip() for group in grouped for label in group.split(",")}
    return {w for w in words - _PROMQL - labels if not w.replace(".", "").isdigit()}


def _rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_promtool_accepts_the_rules_and_the_scrape_configuration() -> None:
    promtool = _tool("promtool")
    for args in (["check", "rules", str(RULES)], ["check", "config", str(SCRAPE)]):
        done = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def test_every_series_the_rules_and_the_dashboard_name_is_exported_or_recorded() -> None:
    rules = _rules()
    recorded = {rule["record"] for rule in rules if "record" in rule}
    known = _exported() | recorded
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [rule["expr"] for rule in rules] + [
        target["expr"] for panel in dashboard["panels"] for target in panel["targets"]
    ]
    unknown = {name for expr in exprs for name in _series(expr)} - known
    assert unknown == set(), f"named but not exported by amoebad: {sorted(unknown)}"
    assert "amoeba_gpus_capacity" in known and any("amoeba_gpus{" in expr for expr in exprs)


def test_the_dashboard_is_grafana_json_with_a_datasource_variable_and_unique_panel_ids() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and dashboard["uid"] == "amoebad"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and all(panel["targets"] for panel in dashboard["panels"])
    assert all(panel["datasource"]["uid"] == "${datasource}" for panel in dashboard["panels"])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def amoebad(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon running its loop on a Slurm in memory, its metrics on a free loopback port."""
    slurm = FakeSlurm(job_list=[job(100, gpus={"n1": 3})], node_list=[node("n1", total=4, used=3)])
    config = DaemonConfig(interval_s=0.2, listen="tcp://127.0.0.1:*", metrics_port=_free_port())
    daemon = Daemon(config, slurm)
    daemon.start()
    stop = threading.Event()
    thread = threading.Thread(target=daemon.run, args=(stop,), daemon=True)
    thread.start()
    yield daemon
    stop.set()
    thread.join(10)
    daemon.close()


def _query(port: int, expr: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as reply:
        body = json.loads(reply.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_a_real_prometheus_scrapes_amoebad_and_answers_with_its_metrics_and_rules(
    amoebad: Daemon, tmp_path: Path
) -> None:
    prometheus = _tool("prometheus")
    assert amoebad.metrics_server is not None
    config = yaml.safe_load(SCRAPE.read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["scrape_configs"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{amoebad.metrics_server.port}"]}]
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"  # the shipped rules, evaluated every second
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    config["rule_files"] = [str(tmp_path / "rules.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    server = subprocess.Popen(
        [
            prometheus,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    try:
        deadline = time.monotonic() + 60
        capacity: list[dict[str, Any]] = []
        ratio: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not (capacity and ratio):
            time.sleep(0.5)
            try:
                capacity = _query(port, 'amoeba_gpus_capacity{job="amoebad"}')
                ratio = _query(port, "amoeba:gpus_free:ratio")
            except OSError:
                continue  # not listening yet
        log = (tmp_path / "prometheus.log").read_text()
        assert capacity, f"Prometheus read no amoeba_gpus_capacity from amoebad in 60 s:\n{log[-3000:]}"
        assert float(capacity[0]["value"][1]) == 4
        assert ratio and float(ratio[0]["value"][1]) == pytest.approx(0.25)
        up = _query(port, 'up{job="amoebad"}')
        assert float(up[0]["value"][1]) == 1
    finally:
        server.terminate()
        server.wait(30)
