"""The incremental ``squeue --json`` reader (:class:`~slurm_amoeba.slurm.parsers.SqueueReader`): the records of
:func:`~slurm_amoeba.slurm.parsers.parse_squeue_json`, decoding only the jobs whose text changed since the last read.

Run on every release's fixture and on the recordings of the test cluster (``tests/data/slurm``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.slurm.parsers import SlurmReportedError, SqueueReader, parse_squeue_json

DATA = Path(__file__).resolve().parents[2] / "data" / "slurm"
REPLIES = sorted(DATA.glob("squeue-*.json")) + sorted(DATA.glob("releases/*/squeue.json"))


def _document(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


@pytest.mark.parametrize("path", REPLIES, ids=lambda path: str(path.relative_to(DATA)))
def test_reads_every_recorded_reply_as_the_whole_parse_does_and_keeps_the_records_of_a_second_read(path: Path) -> None:
    text = path.read_text()
    reader = SqueueReader()
    first = reader.parse(text)
    assert first == parse_squeue_json(text)
    assert reader.built == len(first) > 0
    second = reader.parse(text)
    assert (reader.built, reader.reused) == (0, len(first))
    assert all(again is before for again, before in zip(second, first, strict=True))


def test_decodes_only_the_jobs_that_changed_ended_or_started() -> None:
    document = _document(DATA / "releases" / "24.11" / "squeue.json")
    sample = document["jobs"][0]
    document["jobs"] = [{**sample, "job_id": job_id} for job_id in range(1, 41)]
    reader = SqueueReader()
    before = {record.job_id: record for record in reader.parse(json.dumps(document, indent=2))}
    jobs = document["jobs"]
    jobs[3] = {**jobs[3], "name": "renamed"}  # changed
    del jobs[10]  # ended
    jobs.append({**sample, "job_id": 99})  # started
    text = json.dumps(document, indent=2)
    after = reader.parse(text)
    assert after == parse_squeue_json(text)
    assert (reader.built, reader.reused) == (2, 38)
    assert [record.name for record in after if record.job_id == 4] == ["renamed"]
    assert all(record is before[record.job_id] for record in after if record.job_id not in (4, 99))


def test_parses_compact_json_and_an_empty_list_whole() -> None:
    document = _document(DATA / "squeue-mixed.json")
    reader = SqueueReader()
    compact = json.dumps(document)
    assert reader.parse(compact) == parse_squeue_json(compact)
    assert reader.parse(compact) == parse_squeue_json(compact)
    assert reader.reused == 0
    empty = json.dumps({**document, "jobs": []}, indent=2)
    assert reader.parse(empty) == []


def test_a_job_cut_out_of_a_layout_that_only_looks_like_slurms_is_parsed_whole() -> None:
    document = _document(DATA / "squeue-mixed.json")
    text = json.dumps(document, indent=2)
    # A job whose closing brace sits at the list's indentation inside it: the cut pieces do not decode.
    odd = text.replace('"job_id"', '"nested": {\n    },\n    {\n      "x": 1\n    },\n      "job_id"', 1)
    with pytest.raises(ParseError):
        parse_squeue_json(odd)
    with pytest.raises(ParseError):
        SqueueReader().parse(odd)


def test_reports_slurms_own_errors_as_the_whole_parse_does() -> None:
    document = _document(DATA / "squeue-mixed.json")
    text = json.dumps({**document, "errors": [{"description": "Unable to contact slurm controller"}]}, indent=2)
    with pytest.raises(SlurmReportedError, match="Unable to contact"):
        SqueueReader().parse(text)
