"""``scripts/render-results``: docs/results.md from the result documents, and nothing typed in by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import render_results
from benchmarks.record import Recording, spread


def test_a_missing_result_is_not_measured_and_names_its_command(tmp_path: Path) -> None:
    page = render_results.render(tmp_path)
    section = page.split("## grow\n", 1)[1].split("\n## ", 1)[0]
    assert "**Not measured in this build.**" in section
    assert "scripts/bench-grow --json docs/results/grow.json" in section
    assert "Recorded in an earlier build, under the conditions stated then" in section


def test_a_result_shows_its_machine_load_parameters_and_spread(tmp_path: Path) -> None:
    recording = Recording("grow", {"rounds": 3})
    recording.write(tmp_path / "grow.json", {"grow_total_s": 6.7, "grow_total_s_spread": spread([6.1, 6.7, 7.4])})
    section = render_results.render(tmp_path).split("## grow\n", 1)[1].split("\n## ", 1)[0]
    assert "Not measured" not in section
    assert "- Machine: " in section and "Load average (1, 5, 15 min) before: " in section
    assert "`rounds=3`" in section
    assert "| `grow_total_s_spread` | 6.7 [6.4..7.05] (6.1..7.4), n=3 |" in section


def test_a_converted_result_states_the_load_and_wall_time_it_did_not_record(tmp_path: Path) -> None:
    document = Recording("scaling", {"rounds": 3}).document({"rounds": 3})
    document.update(load_before=[], load_after=[7.7, 8.5, 6.9], wall_s=None)
    (tmp_path / "scaling.json").write_text(json.dumps(document))
    section = render_results.render(tmp_path).split("## scaling\n", 1)[1].split("\n## ", 1)[0]
    assert "before: not recorded; after: 7.7 / 8.5 / 6.9; wall time not recorded" in section


def test_a_result_the_catalog_does_not_name_is_refused(tmp_path: Path) -> None:
    Recording("no-such-benchmark", {}).write(tmp_path / "no-such-benchmark.json", {"x": 1.0})
    with pytest.raises(ValueError, match="CATALOG does not name"):
        render_results.render(tmp_path)


def test_a_document_of_another_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "grow.json").write_text('{"grow_total_s": 6.7}')
    with pytest.raises(ValueError, match="not a result document"):
        render_results.render(tmp_path)


def test_the_committed_results_page_is_what_the_committed_documents_render() -> None:
    assert render_results.main(["--check"]) == 0, "docs/results.md is out of date: run scripts/render-results"
