"""Pure parsers of Slurm's output: ``squeue``/``sinfo``/``scontrol show nodes``/``sacct`` ``--json`` and slurmrestd's
replies, GRES strings, ``sbatch --parsable``.

Every supported release's JSON (Slurm 22.05 to 25.11: openapi v0.0.38, data_parser v0.0.39 to v0.0.44; the shape is
read from each reply's ``meta``, see :mod:`~slurm_amoeba.slurm.release`) becomes the same typed records
(:mod:`~slurm_amoeba.slurm.records`); fields the project does not read are ignored. No commands run here.
Anything that cannot be understood raises the package's :class:`~slurm_amoeba.core.errors.ParseError` (never
``KeyError``/``TypeError``), naming what was parsed and which release printed it.
Tested on output recorded from the real 22.05 test cluster (``tests/data/slurm/``), on fixtures of every release
written from SchedMD's OpenAPI descriptions (``tests/data/slurm/releases/``), and on mangled input.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.slurm.nodelist import expand_nodelist
from slurm_amoeba.slurm.records import AccountingRecord, JobRecord, JobState, NodeRecord, StepRecord
from slurm_amoeba.slurm.release import JsonShape

_GRES_ITEM = re.compile(r"^gpu(?::(?P<type>\(null\)|[^:(]*))?:(?P<count>[0-9]+)(?:\((?P<detail>[^)]*)\))?$")
_DIGITS = re.compile(r"[0-9]+")
_IDX = re.compile(r"IDX:(?P<idx>[0-9,\-]*|N/A)")
T = TypeVar("T")


class SlurmReportedError(ParseError):
    """The command's JSON carries Slurm's own errors (e.g. slurmctld unreachable) instead of data.

    Attributes:
        errors: Slurm's error entries, as reported.
    """

    def __init__(self, errors: list[Any], *, source: str) -> None:
        self.errors = errors
        described = "; ".join(
            str(e.get("description") or e.get("error") or e) if isinstance(e, dict) else str(e) for e in errors
        )
        super().__init__(f"Slurm reported errors instead of data: {described}", source=source)


def _load_document(text: str, source: str) -> Mapping[str, Any]:
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ParseError(f"output is not JSON ({exc})", source=source, text=text) from None
    if not isinstance(doc, dict):
        raise ParseError(f"expected a JSON object, got {type(doc).__name__}", source=source, text=text)
    errors = doc.get("errors")
    if isinstance(errors, list) and errors:
        raise SlurmReportedError(errors, source=source)
    return doc


class _Fields:
    """One record of a JSON reply, read in any supported release's shape.

    Numbers come plain (22.05, and later releases' ``+complex`` output: ``null`` unset, ``"Infinity"``) or wrapped
    as ``{"set", "infinite", "number"}`` (data_parser v0.0.39 and later); states as a string (up to 23.02) or a list
    whose first item is the base state; name lists as a list or a comma-separated string. Fields absent from a
    record take their default; a required field (no default) that is absent raises :class:`ParseError` naming the
    field and the release.
    """

    def __init__(self, record: Mapping[str, Any], where: str, shape: JsonShape) -> None:
        self._record = record
        self.where = where
        self.shape = shape

    def about(self, what: str) -> _Fields:
        """The same record, its errors naming ``what`` too (``"job 12"``)."""
        return _Fields(self._record, f"{self.where}, {what}", self.shape)

    def error(self, message: str) -> ParseError:
        """A :class:`ParseError` about this record, naming it and the release that printed it."""
        return ParseError(message, source=f"{self.where} ({self.shape.describe()})")

    def raw(self, path: str) -> Any:
        """The value at ``path`` (``"time/limit"`` reads ``time.limit``), or None when any part is absent."""
        value: Any = self._record
        for key in path.split("/"):
            if not isinstance(value, Mapping):
                return None
            value = value.get(key)
        return value

    def text(self, path: str, default: str | None = "") -> str:
        """A string field; None/absent gives ``default`` (None: the field is required)."""
        value = self.raw(path)
        if value is None:
            if default is None:
                raise self.error(f"field {path!r} is missing; every record of this release has it")
            return default
        if not isinstance(value, str):
            raise self.error(f"field {path!r} is {value!r}, not a string")
        return value

    def number(self, path: str, default: int | None = 0) -> int:
        """An integer field, plain or wrapped; unset, infinite or absent gives ``default`` (None: required)."""
        value = self.limit(path)
        if value is None:
            if default is None:
                raise self.error(f"field {path!r} is missing or unset; every record of this release has it")
            return default
        return value

    def limit(self, path: str) -> int | None:
        """An integer field that may be unset or infinite (None then), plain or wrapped."""
        value = self.raw(path)
        if isinstance(value, Mapping) and {"set", "number"} <= value.keys():
            if value.get("infinite") is True or value.get("set") is not True:
                return None
            value = value.get("number")
        if value is None or value in ("Infinity", "Infinite", "infinite", "UNLIMITED"):
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"field {path!r} is {value!r}, not an integer")
        return value

    def names(self, path: str) -> tuple[str, ...]:
        """A list of names: a JSON list of strings or one comma-separated string; absent gives ``()``."""
        value = self.raw(path)
        if value is None:
            return ()
        if isinstance(value, str):
            return tuple(part for part in value.split(",") if part)
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self.error(f"field {path!r} is {value!r}, not a list of names")
        return tuple(value)

    def states(self, path: str) -> tuple[str, ...]:
        """A state: one string (22.05, 23.02) or a list, base state first then flags (23.11 on); required."""
        value = self.raw(path)
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
            return tuple(value)
        if value is None:
            raise self.error(f"field {path!r} is missing; every record of this release has it")
        raise self.error(f"field {path!r} is {value!r}, not a state name or a list of them")


def _job_state(states: Sequence[str]) -> JobState:
    """A job's state from a state list: the flags Slurm's own ``job_state_string`` shows first win over the base."""
    for flag in _JOB_STATE_FLAGS:
        if flag in states[1:]:
            return JobState.parse(flag)
    return JobState.parse(states[0])


#: Job state flags that Slurm's text output (``job_state_string``) shows instead of the base state, in its order.
_JOB_STATE_FLAGS = ("COMPLETING", "RESIZING", "REQUEUED")


def _parse_list(text: str, key: str, source: str, build: Callable[[_Fields], T]) -> list[T]:
    """Each record under ``key`` of the reply ``text``, built into a typed record."""
    return [build(fields) for fields in _records(_load_document(text, source), key, source, text)]


def _records(doc: Mapping[str, Any], key: str, source: str, text: str) -> list[_Fields]:
    """The records under ``key``, each with the reply's shape; raises when the list is absent or not of objects."""
    shape = JsonShape.of(doc)
    items = doc.get(key)
    if not isinstance(items, list):
        raise ParseError(f"no {key!r} list in the output ({shape.describe()})", source=source, text=text)
    for item in items:
        if not isinstance(item, dict):
            raise ParseError(f"an entry of {key!r} is {type(item).__name__}, not an object", source=source, text=text)
    return [_Fields(item, source, shape) for item in items]


def parse_gres_count(text: str, *, source: str = "gres") -> int:
    """Count the GPUs in a GRES string such as ``gpu:4``, ``gpu:a100:2(S:0-1)`` or ``gpu:(null):3(IDX:0-2)``.

    Non-GPU entries (``shard:8``, ``mps:100``) are ignored; an empty string or ``(null)`` means 0.

    Raises:
        ParseError: a ``gpu`` entry without a whole count.
    """
    total = 0
    for item in _split_gres(text):
        if item == "gpu" or item.startswith("gpu:"):
            match = _GRES_ITEM.match(item)
            if match is None:
                raise ParseError(f"cannot read the GPU count of {item!r}", source=source, text=text)
            total += int(match.group("count"))
    return total


def _split_gres(text: str) -> list[str]:
    """Split a GRES list at commas outside parentheses."""
    text = text.strip()
    if not text or text == "(null)":
        return []
    items: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    items.append(text[start:].strip())
    return [i for i in items if i]


def parse_gpu_indices(detail: str, *, source: str = "gres_detail") -> tuple[int, ...]:
    """Read the GPU indices of one node's ``gres_detail`` entry, e.g. ``gpu:2(IDX:0-1)`` -> ``(0, 1)``.

    Indices are node-wide (a second job on a node may get ``(2, 3)``). A GPU the job holds shards of
    (``shard:2(IDX:0)``, GPU sharing) is a GPU it runs on: ``(0,)``.

    Raises:
        ParseError: a GPU entry whose index list cannot be read.
    """
    indices: list[int] = []
    for item in _split_gres(detail):
        if not item.startswith(("gpu", "shard")):
            continue
        match = _IDX.search(item)
        if match is None or match.group("idx") == "N/A":
            continue
        for part in match.group("idx").split(","):
            if not part:
                continue
            bounds = part.split("-")
            if len(bounds) > 2 or not all(_DIGITS.fullmatch(b) for b in bounds):
                raise ParseError(f"bad GPU index range {part!r}", source=source, text=detail)
            low, high = int(bounds[0]), int(bounds[-1])
            if high < low or high - low > 4096:
                raise ParseError(f"bad GPU index range {part!r}", source=source, text=detail)
            indices.extend(range(low, high + 1))
    return tuple(indices)


def _gpus_per_node(tres_per_node: str, source: str) -> int:
    # e.g. "gres:gpu:2", "gres/gpu:2", "gres:gpu:a100:2", "" (no GPUs)
    total = 0
    for item in tres_per_node.split(","):
        item = item.strip()
        for prefix in ("gres:", "gres/"):
            if item.startswith(prefix):
                item = item[len(prefix) :]
        if item.startswith("gpu"):
            total += parse_gres_count(item, source=source)
    return total


_GPUS_PER_TASK = re.compile(r"^(?:gres[:/])?gpu(?::[A-Za-z0-9_.-]+)?[:=](?P<count>[0-9]{1,6})$")


def _gpus_per_task(tres: str) -> int:
    """GPUs in Slurm's ``tres_per_task`` (``gres:gpu:2``, ``gres/gpu=2``, ``gres:gpu:a100:2``); 0 when none."""
    for item in tres.split(","):
        match = _GPUS_PER_TASK.match(item.strip())
        if match:
            return int(match["count"])
    return 0


def parse_squeue_json(text: str) -> list[JobRecord]:
    """Parse ``squeue --json`` (or slurmrestd's job list) of any supported release into job records.

    Reads data_parser v0.0.38 (22.05) through v0.0.44 (25.11); ``scontrol show jobs --json`` has the same shape.
    squeue's JSON ignores ``-j``/``-t``: it returns every job slurmctld still remembers; filter the result.

    Raises:
        ParseError: the output is not JSON, Slurm reported errors, or a job record lacks a field or has one of
            the wrong type (the message names the field and the release).
    """
    return _parse_list(text, "jobs", "squeue --json", _job)


class SqueueReader:
    """``squeue --json`` parsed round after round, each job's record reused while its text stays the same.

    Slurm prints its JSON indented, one line per field, so each job of the ``jobs`` list is a run of lines between
    ``{`` and ``}`` at the list's indentation (a JSON string holds no raw newline, so those lines are never inside
    a string). The reader cuts the list there, without decoding it, and decodes and builds only the jobs whose text
    differs from every job of the last read; the others are answered with the record built then (the same object,
    which the snapshot step's cache then recognises at once, :class:`~slurm_amoeba.daemon.snapshot.SnapshotCache`).
    The rest of the reply (``meta``, ``errors``) is decoded on every read. Output laid out otherwise (compact JSON,
    an empty list) or a piece that does not decode as one object is parsed whole by :func:`parse_squeue_json`, so
    the answer is always the one that function gives.

    Attributes:
        built: jobs decoded and built in the last read.
        reused: jobs answered from the last read's records.
    """

    _LIST = re.compile(r'\n( *)"jobs": \[\n( *)\{\n')

    def __init__(self) -> None:
        self._known: dict[str, JobRecord] = {}
        self._shape: JsonShape | None = None
        self._lock = threading.Lock()
        self.built = 0
        self.reused = 0

    def parse(self, text: str) -> list[JobRecord]:
        """The records :func:`parse_squeue_json` gives for ``text`` (see the class docstring for how); one read at a
        time (the daemon's round and a registration may read at once)."""
        with self._lock:
            return self._parse(text)

    def _parse(self, text: str) -> list[JobRecord]:
        pieces = self._pieces(text)
        try:
            doc = None if pieces is None else _load_document(pieces[0], "squeue --json")
        except ParseError:
            doc = None  # what the whole reply says about itself (Slurm's errors, not JSON) is said below
        if pieces is None or doc is None or doc.get("jobs") != []:
            return self._whole(text)
        shape = JsonShape.of(doc)
        known = self._known if shape == self._shape else {}
        fresh: dict[str, JobRecord] = {}
        records: list[JobRecord] = []
        reused = 0
        for item in pieces[1]:
            record = known.get(item)
            if record is not None:
                reused += 1
            else:
                record = fresh.get(item)
                if record is None:
                    try:
                        value = json.loads("{" + item + "}")
                    except (json.JSONDecodeError, RecursionError):
                        return self._whole(text)  # not cut where Slurm's layout would be: parse it whole
                    record = _job(_Fields(value, "squeue --json", shape))
            fresh[item] = record
            records.append(record)
        self.built, self.reused = len(records) - reused, reused
        self._known, self._shape = fresh, shape
        return records

    def _whole(self, text: str) -> list[JobRecord]:
        """:func:`parse_squeue_json` of the whole reply; the next read starts from nothing."""
        self._known, self._shape = {}, None
        records = parse_squeue_json(text)
        self.built, self.reused = len(records), 0
        return records

    def _pieces(self, text: str) -> tuple[str, list[str]] | None:
        """The reply without its jobs (``"jobs": []``) and each job's text between its braces; None when the
        layout is not Slurm's indented one."""
        found = self._LIST.search(text)
        if found is None:
            return None
        outer, inner = found.group(1), found.group(2)
        if len(inner) <= len(outer):
            return None
        opened = found.end()
        closed = text.find(f"\n{inner}}}\n{outer}]", opened)
        if closed < 0:
            return None
        items = text[opened:closed].split(f"\n{inner}}},\n{inner}{{\n")
        head = text[: found.start(2) - 1] + text[closed + len(inner) + 2 :]
        return head, items


def _job(fields: _Fields) -> JobRecord:
    job_id = fields.number("job_id", None)
    rec = fields.about(f"job {job_id}")
    details = rec.raw("gres_detail") or []
    if not isinstance(details, list) or not all(isinstance(d, str) for d in details):
        raise rec.error(f"gres_detail is {details!r}, not a list of strings")
    return JobRecord(
        job_id=job_id,
        name=rec.text("name"),
        comment=rec.text("comment"),
        state=_job_state(rec.states("job_state")),
        state_reason=rec.text("state_reason"),
        user=rec.text("user_name"),
        uid=rec.number("user_id", None),
        partition=rec.text("partition"),
        nodes=tuple(expand_nodelist(rec.text("nodes"))),
        batch_host=rec.text("batch_host"),
        gpus_per_node=_gpus_per_node(rec.text("tres_per_node"), rec.where),
        gpu_indices=tuple(parse_gpu_indices(d, source=rec.where) for d in details),
        cpus=rec.number("cpus"),
        node_count=rec.number("node_count"),
        het_job_id=rec.number("het_job_id"),
        het_job_offset=rec.number("het_job_offset"),
        submit_time=rec.number("submit_time"),
        start_time=rec.number("start_time"),
        priority=rec.number("priority"),
        account=rec.text("account"),
        qos=rec.text("qos"),
        reservation=rec.text("resv_name"),
        features=rec.text("features"),
        admin_comment=rec.text("admin_comment"),
        time_limit_s=_minutes_to_s(rec.limit("time_limit")),
        gpus_requested=_requested_gpus(rec.text("tres_req_str"), rec),
        tasks=rec.number("tasks"),
        gpus_per_task=_gpus_per_task(rec.text("tres_per_task")),
    )


def _minutes_to_s(minutes: int | None) -> int | None:
    """A time limit in minutes (None, or Slurm's NO_VAL/INFINITE sentinels: unlimited) in seconds."""
    return None if minutes is None or minutes >= _NO_VAL else minutes * 60


#: Slurm's 32-bit NO_VAL (``0xfffffffe``); it and INFINITE (``0xffffffff``) mean "no limit" where they appear raw.
_NO_VAL = 0xFFFFFFFE


def _requested_gpus(text: str, rec: _Fields) -> int:
    try:
        return tres_gpus(text)
    except ValueError:
        raise rec.error(f"field 'tres_req_str' is {text!r}: a GPU count that is not a number") from None


def parse_nodes_json(text: str) -> list[NodeRecord]:
    """Parse ``scontrol show nodes --json`` (23.02 on) or slurmrestd's node list (22.05 on) into node records.

    22.05's ``sinfo --json`` has this shape too. A node's state is ``"idle"`` plus ``state_flags`` (22.05) or a
    list such as ``["IDLE", "DRAIN"]`` (23.02 on); its partitions a list, or a comma-separated string.

    Raises:
        ParseError: the output is not JSON, Slurm reported errors, or a node record is malformed (the message names
            the field and the release).
    """
    return _parse_list(text, "nodes", "scontrol show nodes --json", _node)


def _node(fields: _Fields) -> NodeRecord:
    name = fields.text("name", None)
    rec = fields.about(f"node {name}")
    states = rec.states("state")
    return NodeRecord(
        name=name,
        address=rec.text("address"),
        hostname=rec.text("hostname"),
        state=states[0].lower(),
        state_flags=tuple(f.upper() for f in (*states[1:], *rec.names("state_flags"))),
        partitions=rec.names("partitions"),
        cpus=rec.number("cpus"),
        alloc_cpus=rec.number("alloc_cpus"),
        gpus_total=parse_gres_count(rec.text("gres"), source=rec.where),
        gpus_used=parse_gres_count(rec.text("gres_used"), source=rec.where),
    )


def parse_sinfo_json(text: str) -> list[NodeRecord]:
    """Parse ``sinfo --json`` of any supported release into node records, one per node.

    22.05 prints one record per node (the shape of :func:`parse_nodes_json`). 23.02 on print ``sinfo``: groups of
    nodes alike in partition, state and GRES use (``--json`` groups on ``gres/used``); each node of a group gets
    the group's state, GRES and per-node CPUs, its allocated CPUs an even share of the group's, and the partitions
    of every group it is in.

    Raises:
        ParseError: the output is not JSON, Slurm reported errors, or a record is malformed (the message names the
            field and the release).
    """
    source = "sinfo --json"
    doc = _load_document(text, source)
    if "sinfo" not in doc and "nodes" in doc:
        return [_node(fields) for fields in _records(doc, "nodes", source, text)]
    nodes: dict[str, NodeRecord] = {}
    for group in _records(doc, "sinfo", source, text):
        for node in _sinfo_group(group):
            known = nodes.get(node.name)
            if known is not None:
                node = dataclasses.replace(node, partitions=(*known.partitions, *node.partitions))
            nodes[node.name] = node
    return list(nodes.values())


def _sinfo_group(group: _Fields) -> list[NodeRecord]:
    names = group.names("nodes/nodes")
    rec = group.about(f"nodes {','.join(names) or '(none)'}")
    states = rec.states("node/state")
    addresses, hostnames = rec.names("nodes/addresses"), rec.names("nodes/hostnames")
    partition = rec.text("partition/name")
    alloc_cpus = rec.number("cpus/allocated") // max(len(names), 1)
    return [
        NodeRecord(
            name=name,
            address=addresses[i] if len(addresses) == len(names) else "",
            hostname=hostnames[i] if len(hostnames) == len(names) else "",
            state=states[0].lower(),
            state_flags=tuple(f.upper() for f in states[1:]),
            partitions=(partition,) if partition else (),
            cpus=rec.number("cpus/maximum"),
            alloc_cpus=alloc_cpus,
            gpus_total=parse_gres_count(rec.text("gres/total"), source=rec.where),
            gpus_used=parse_gres_count(rec.text("gres/used"), source=rec.where),
        )
        for i, name in enumerate(names)
    ]


def parse_sacct_json(text: str) -> list[AccountingRecord]:
    """Parse ``sacct --json`` (or slurmrestd's accounting job list) of any supported release into job records.

    Reads openapi/dbv0.0.38 (22.05) through data_parser v0.0.44 (25.11): ``state.current`` a string or a list,
    ``time.limit`` plain minutes or wrapped, TRES as lists of ``{type, name, count}``. Steps are not read.

    Raises:
        ParseError: the output is not JSON, Slurm reported errors, or a job lacks a field or has one of the wrong
            type (the message names the field and the release).
    """
    return _parse_list(text, "jobs", "sacct --json", _accounting)


def _accounting(fields: _Fields) -> AccountingRecord:
    job_id = fields.number("job_id", None)
    rec = fields.about(f"job {job_id}")
    if not isinstance(rec.raw("time"), Mapping):
        raise rec.error("field 'time' is missing; every record of this release has it")
    return AccountingRecord(
        job_id=job_id,
        array_job_id=rec.number("array/job_id"),
        array_task_id=rec.limit("array/task_id"),
        het_job_id=rec.number("het/job_id"),
        het_job_offset=rec.limit("het/job_offset"),
        name=rec.text("name"),
        user=rec.text("user"),
        account=rec.text("account"),
        partition=rec.text("partition"),
        nodes=rec.text("nodes"),
        state=_job_state(rec.states("state/current")),
        submit_time=rec.number("time/submission", None),
        start_time=rec.number("time/start"),
        end_time=rec.number("time/end"),
        time_limit_s=_minutes_to_s(rec.limit("time/limit")),
        gpus_allocated=_tres_list_gpus(rec, "tres/allocated"),
        gpus_requested=_tres_list_gpus(rec, "tres/requested"),
    )


def _tres_list_gpus(rec: _Fields, path: str) -> int:
    """GPUs in a TRES list (``[{"type": "gres", "name": "gpu", "count": 2}, ...]``): the untyped ``gpu`` count when
    present, else the typed ones (``gpu:a100``) summed."""
    items = rec.raw(path) or []
    if not isinstance(items, list) or not all(isinstance(item, Mapping) for item in items):
        raise rec.error(f"field {path!r} is {items!r}, not a list of TRES")
    total = 0
    for item in items:
        if item.get("type") != "gres" or not str(item.get("name") or "").startswith("gpu"):
            continue
        count = _Fields(item, rec.where, rec.shape).number("count")
        if item.get("name") == "gpu":
            return count
        if str(item.get("name")).startswith("gpu:"):
            total += count
    return total


def parse_sbatch_reply(text: str) -> int:
    """Read the job id from ``sbatch --parsable`` (``"123"`` or ``"123;cluster"``).

    Raises:
        ParseError: the reply holds no job id, with the reply quoted, so the user sees what sbatch said.
    """
    line = text.strip().splitlines()[-1].strip() if text.strip() else ""
    head = line.split(";", 1)[0]
    if not _DIGITS.fullmatch(head):
        raise ParseError("could not make sense of sbatch's reply: no job id", source="sbatch --parsable", text=text)
    return int(head)


STEP_FORMAT = "%i|%N|%j"
"""The ``squeue --steps --noheader --format`` that :func:`parse_step_lines` reads (the name last: it may hold ``|``)."""


def parse_step_lines(text: str) -> list[StepRecord]:
    """Parse ``squeue --steps --noheader --format='%i|%N|%j'`` into step records.

    Raises:
        ParseError: a line that is not ``JOB.STEP|NODES|NAME``.
    """
    steps: list[StepRecord] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("|", 2)
        if len(parts) != 3:
            raise ParseError(f"line {number} is not JOB.STEP|NODES|NAME", source="squeue --steps", text=line)
        job, _, step = parts[0].strip().partition(".")
        job = job.split("+", 1)[0]
        if not _DIGITS.fullmatch(job) or not step:
            raise ParseError(f"line {number}: {parts[0]!r} is not JOB.STEP", source="squeue --steps", text=line)
        steps.append(StepRecord(job_id=int(job), step=step, name=parts[2], nodes=tuple(expand_nodelist(parts[1]))))
    return steps


def tres_gpus(text: str) -> int:
    """GPUs in a TRES string such as ``billing=2,cpu=2,gres/gpu=2,mem=8000M,node=1`` (sacct's ``AllocTRES``): the
    untyped ``gres/gpu`` count when present, else the typed ones (``gres/gpu:a100=2``) summed; 0 when none.

    Raises:
        ValueError: a GPU count that is not a number.
    """
    total = 0
    for item in text.split(","):
        key, _, count = item.strip().partition("=")
        if key == "gres/gpu":
            return int(count)  # the untyped total, when present, is authoritative
        if key.startswith("gres/gpu:"):
            total += int(count)
    return total


def parse_past_service(text: str) -> dict[int, float]:
    """``sacct -P --format=JobID,ElapsedRaw,AllocTRES`` lines -> job id -> sum of elapsed x ``gres/gpu`` over its
    records (a heterogeneous job's components count for their leader); unreadable lines are skipped."""
    found: dict[int, float] = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < 3 or not fields[1].strip().isdigit():
            continue
        head = fields[0].split("+", 1)[0].split("_", 1)[0]
        if not head.isdigit():
            continue
        try:
            gpus = tres_gpus(fields[2])
        except ValueError:
            continue
        if gpus:
            found[int(head)] = found.get(int(head), 0.0) + int(fields[1]) * gpus
    return found


def parse_show_config(text: str) -> dict[str, str]:
    """``scontrol show config``'s ``Key = value`` lines as a mapping (other lines are skipped)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            values[key.strip()] = value.strip()
    return values


def parse_default_partition(text: str) -> str | None:
    """The partition marked ``Default=YES`` in ``scontrol show partition --oneliner`` output (one partition a line,
    every release since 22.05); None when none is."""
    for line in text.splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if fields.get("Default") == "YES" and fields.get("PartitionName"):
            return fields["PartitionName"]
    return None
