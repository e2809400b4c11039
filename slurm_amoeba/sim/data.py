"""Where the simulator finds its reference data, and a CSV reader that names the line of a bad row.

The data (``../shared/data`` beside the repository, see its README) holds Pollux's workloads and measured traces and
Gavel's co-location throughputs. ``AMOEBA_DATA_DIR`` overrides the location.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from slurm_amoeba.core.errors import AmoebaError, ParseError

#: Environment variable that points at the data folder (the one holding ``pollux/`` and ``gavel/``).
DATA_DIR_ENV = "AMOEBA_DATA_DIR"


class SimError(AmoebaError, ValueError):
    """The simulator was asked for something it cannot do (a job too big for the cluster, a missing file...)."""


def data_dir() -> Path:
    """The folder holding ``pollux/`` and ``gavel/``.

    Returns:
        ``$AMOEBA_DATA_DIR`` when set, else ``../shared/data`` relative to the repository.

    Raises:
        SimError: the folder does not exist.
    """
    env = os.environ.get(DATA_DIR_ENV)
    path = Path(env) if env else Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
    if not path.is_dir():
        raise SimError(
            f"the simulator's data folder {path} does not exist; set {DATA_DIR_ENV} to the folder that holds "
            f"pollux/ and gavel/ (see ../shared/data/README.md)"
        )
    return path


def read_rows(path: Path, columns: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """Read a CSV file with a header, checking the header and the number of fields of every row.

    Blank lines are skipped.

    Args:
        path: the file.
        columns: the columns the header must contain (others are allowed).

    Yields:
        (line number, column -> text) for every row.

    Raises:
        ParseError: the file is missing, the header lacks a column, or a row has the wrong number of fields.
    """
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise ParseError(f"cannot read the file ({exc.strerror}); check the path", source=str(path)) from None
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise ParseError("the file is empty; it needs a header line " + ",".join(columns), source=str(path))
        missing = [name for name in columns if name not in header]
        if missing:
            raise ParseError(
                f"line 1: the header {','.join(header)!r} lacks {', '.join(missing)}; "
                f"expected the columns {','.join(columns)}",
                source=str(path),
            )
        for row in reader:
            line = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != len(header):
                raise ParseError(
                    f"line {line}: {len(row)} fields where the header has {len(header)} ({','.join(row)!r})",
                    source=str(path),
                )
            yield line, dict(zip(header, row, strict=True))


def parse_number(path: Path, line: int, column: str, text: str, *, integer: bool = False) -> float:
    """Parse one numeric field, naming the file, line and column when it is not a number.

    Args:
        path: the file (for the message).
        line: the line number (for the message).
        column: the column (for the message).
        text: the field.
        integer: require a whole number.

    Returns:
        The value (a float even when ``integer``; it is then whole).

    Raises:
        ParseError: the field is not a (whole) finite number.
    """
    try:
        value = float(text)
    except ValueError:
        raise ParseError(f"line {line}: {column}={text!r} is not a number", source=str(path)) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ParseError(f"line {line}: {column}={text!r} is not a finite number", source=str(path))
    if integer and value != int(value):
        raise ParseError(f"line {line}: {column}={text!r} must be a whole number", source=str(path))
    return value
