"""The scaling benchmark's short mode (``scripts/bench-policy --scaling --short``): every size and policy measured,
JSON and a plot written."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import scaling


def test_the_short_scaling_run_measures_every_size_and_policy_and_writes_json_and_a_plot(tmp_path: Path) -> None:
    out, picture = tmp_path / "scaling.json", tmp_path / "scaling.png"
    assert scaling.main(["--short", "--policies", "fifo,goodput", "--json", str(out), "--plot", str(picture)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert sorted((row["nodes"], row["policy"]) for row in rows) == [
        (100, "fifo"),
        (100, "goodput"),
        (300, "fifo"),
        (300, "goodput"),
    ]
    assert all(row["jobs"] == 2 * row["nodes"] and row["snapshot_s"] > 0 and row["parse_s"] > 0 for row in rows)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_squeue_text_parses_into_as_many_jobs_as_asked() -> None:
    assert scaling.bench_parse(7, 1)["parse_s"] > 0
    assert json.loads(scaling.squeue_text(7))["jobs"][-1]["job_id"] == 7
