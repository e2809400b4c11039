"""Where the simulator finds its reference data, and a CSV reader that names the line of a bad row.

The data ships inside the package (``slurm_amoeba/sim/datafiles/``, read through :mod:`importlib.resources`):
Pollux's workloads and measured traces (Apache-2.0) and Gavel's co-location throughputs (MIT); its ``SOURCES.md``
names the origin and license of every file. ``AMOEBA_DATA_DIR`` points the simulator at another folder of the same
layout. Paths the user gives (``--workload pollux/workloads/workload-6.csv``) are found in the current directory
first, then in the data folder (:func:`resolve`).
"""

from __future__ import annotations

import csv
import importlib.resources
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from slurm_amoeba.core.errors import AmoebaError, ParseError

#: Environment variable that points at another data folder (one holding ``pollux/`` and ``gavel/``).
DATA_DIR_ENV = "AMOEBA_DATA_DIR"
#: The packaged data folder, relative to the ``slurm_amoeba.sim`` package.
PACKAGED_DATA = "datafiles"


class SimError(AmoebaError, ValueError):
    """The simulator was asked for something it cannot do (a job too big for the cluster, a missing file...)."""


def packaged_data_dir() -> Path:
    """The data folder shipped inside the package.

    Raises:
        SimError: the package is installed in a form that has no folder on disk (a zip), or without its data.
    """
    folder = importlib.resources.files("slurm_amoeba.sim") / PACKAGED_DATA
    if not isinstance(folder, Path) or not folder.is_dir():
        raise SimError(
            f"the simulator's packaged data ({folder}) is not a folder on disk; reinstall slurm-amoeba from a wheel "
            f"or a checkout, or set {DATA_DIR_ENV} to a folder that holds pollux/ and gavel/"
        )
    return folder


def data_dir() -> Path:
    """The folder holding ``pollux/`` and ``gavel/``.

    Returns:
        ``$AMOEBA_DATA_DIR`` when set, else the data shipped with the package.

    Raises:
        SimError: the folder does not exist.
    """
    env = os.environ.get(DATA_DIR_ENV)
    if not env:
        return packaged_data_dir()
    path = Path(env)
    if not path.is_dir():
        raise SimError(
            f"{DATA_DIR_ENV}={env!r} is not a folder; point it at a folder that holds pollux/ and gavel/, or unset "
            f"it to use the data shipped with slurm-amoeba"
        )
    return path


def resolve(path: Path) -> Path:
    """Find a user-given data path: as given (relative to the current directory), else inside :func:`data_dir`.

    ``pollux/workloads/workload-6.csv`` thus names the shipped workload from any directory.

    Args:
        path: the path as the user wrote it.

    Returns:
        The path that exists, or ``path`` unchanged when neither does (the caller's message names it).
    """
    if path.exists() or path.is_absolute():
        return path
    try:
        inside = data_dir() / path
    except SimError:
        return path
    return inside if inside.exists() else path


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
