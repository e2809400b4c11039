"""amoebad's log lines: timestamped on a terminal, priority-prefixed without timestamps for journald."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from slurm_amoeba.cli.amoebad import JournalFormatter, log_formatter, stderr_is_journal


def _record(level: int, text: str) -> logging.LogRecord:
    return logging.LogRecord("slurm_amoeba.daemon", level, __file__, 1, text, (), None)


def test_stderr_is_journald_only_when_journal_stream_names_its_device_and_inode(tmp_path: Path) -> None:
    with open(tmp_path / "stream", "w") as stream:
        st = os.fstat(stream.fileno())
        assert stderr_is_journal({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}, stream.fileno())
        assert not stderr_is_journal({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"}, stream.fileno())
        assert not stderr_is_journal({"JOURNAL_STREAM": "garbage"}, stream.fileno())
        assert not stderr_is_journal({}, stream.fileno())


@pytest.mark.parametrize(
    ("level", "prefix"),
    [(logging.DEBUG, "<7>"), (logging.INFO, "<6>"), (logging.WARNING, "<4>"), (logging.ERROR, "<3>")],
)
def test_a_journal_line_carries_its_syslog_priority_and_no_timestamp(level: int, prefix: str) -> None:
    line = JournalFormatter().format(_record(level, "[daemon] hello"))
    assert line == f"{prefix}{logging.getLevelName(level):<7} [daemon] hello"


def test_every_line_of_a_traceback_keeps_the_priority_of_its_record() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record(logging.ERROR, "[daemon] the loop hit an error")
        record.exc_info = sys.exc_info()
    lines = JournalFormatter().format(record).splitlines()
    assert len(lines) > 2 and all(line.startswith("<3>") for line in lines)


def test_auto_writes_timestamps_off_journald_and_journal_forces_the_journal_format() -> None:
    plain = log_formatter("auto", {}).format(_record(logging.INFO, "x"))
    assert plain[:4].isdigit() and plain.endswith("INFO    x")  # 2025-01-01 12:00:00,000 INFO    x
    assert log_formatter("journal", {}).format(_record(logging.INFO, "x")) == "<6>INFO    x"
    assert isinstance(log_formatter("plain", {"JOURNAL_STREAM": "1:1"}), logging.Formatter)
