"""The daemon's state file (survives restarts, an unreadable one is set aside) and its Prometheus text."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from slurm_amoeba.daemon.agents import InFlight
from slurm_amoeba.daemon.metrics import DaemonMetrics, Registry
from slurm_amoeba.daemon.state import DaemonState, load_state, save_state


def test_the_state_survives_a_write_and_a_read(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    flight = InFlight(target=4, ordered_at=12.5, source="policy", reason="r", acknowledged=True, acknowledged_at=13.0)
    save_state(path, DaemonState(pinned={"7", "8"}, draining=True, in_flight={"9": flight}))
    loaded = load_state(path)
    assert loaded.pinned == {"7", "8"} and loaded.draining
    assert loaded.in_flight["9"] == flight
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left


def test_no_state_file_means_an_empty_state(tmp_path: Path) -> None:
    assert load_state(tmp_path / "missing.json") == DaemonState()
    assert load_state(None) == DaemonState()


@pytest.mark.parametrize(
    "text",
    ['{"version": 1, "pinned": ["x; rm"]}', "not json", '{"version": 2}', '{"version": 1, "in_flight": {"9": 4}}'],
)
def test_an_unreadable_state_file_is_set_aside_and_the_daemon_starts_empty(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.json"
    path.write_text(text)
    assert load_state(path) == DaemonState()
    assert not path.exists() and (tmp_path / "state.json.unreadable").read_text() == text
    assert "[daemon/recovery] state file" in caplog.text


def test_metrics_render_in_the_prometheus_text_format() -> None:
    registry = Registry()
    counter = registry.counter("amoeba_things_total", "Things.", ["kind"])
    gauge = registry.gauge("amoeba_level", "A level.", ["job"])
    histogram = registry.histogram("amoeba_seconds", "Durations.", (0.1, 1.0))
    counter.inc(labels={"kind": 'a"b\\c\nd'})
    counter.inc(2, labels={"kind": 'a"b\\c\nd'})
    gauge.replace([({"job": "1"}, 3.0), ({"job": "2"}, 0.5)])
    gauge.replace([({"job": "2"}, 1.0)])
    for value in (0.05, 0.5, 5.0):
        histogram.observe(value)
    lines = [line for line in registry.render().splitlines() if "_created" not in line]
    assert lines == [
        "# HELP amoeba_things_total Things.",
        "# TYPE amoeba_things_total counter",
        'amoeba_things_total{kind="a\\"b\\\\c\\nd"} 3.0',
        "# HELP amoeba_level A level.",
        "# TYPE amoeba_level gauge",
        'amoeba_level{job="2"} 1.0',
        "# HELP amoeba_seconds Durations.",
        "# TYPE amoeba_seconds histogram",
        'amoeba_seconds_bucket{le="0.1"} 1.0',
        'amoeba_seconds_bucket{le="1.0"} 2.0',
        'amoeba_seconds_bucket{le="+Inf"} 3.0',
        "amoeba_seconds_count 3.0",
        "amoeba_seconds_sum 5.55",
    ]
    assert counter.value({"kind": 'a"b\\c\nd'}) == 3 and counter.total() == 3 and histogram.count == 3
    with pytest.raises(ValueError, match="cannot go down"):
        counter.inc(-1, labels={"kind": "x"})
    with pytest.raises(ValueError, match="registered twice"):
        registry.gauge("amoeba_level", "again")
    with pytest.raises(ValueError, match=r"labels \['kind', 'x'\] given, \['kind'\] declared"):
        counter.inc(labels={"kind": "a", "x": "b"})


def test_metric_names_follow_the_prometheus_conventions() -> None:
    registry = Registry()
    with pytest.raises(ValueError, match="ends in _total, e.g. amoeba_things_total"):
        registry.counter("amoeba_things", "Things.")
    with pytest.raises(ValueError, match="name the gauge amoeba_workers"):
        registry.gauge("amoeba_workers_total", "Workers.")


def test_the_daemon_page_has_process_metrics_build_info_and_no_total_gauge() -> None:
    metrics = DaemonMetrics()
    metrics.workers.replace([({"job": "7"}, 3)])
    page = metrics.registry.render()
    types = dict(
        line.split()[2:4] for line in page.splitlines() if line.startswith("# TYPE ")
    )  # name -> counter/gauge/histogram
    assert types["amoeba_workers"] == "gauge" and 'amoeba_workers{job="7"} 3.0' in page
    assert f'amoeba_build_info{{version="{importlib.metadata.version("slurm-amoeba")}"}} 1.0' in page
    assert "process_cpu_seconds_total" in page and "process_resident_memory_bytes" in page
    for name, kind in types.items():
        if name.startswith("amoeba_"):
            assert name.endswith("_total") == (kind == "counter"), (name, kind)
