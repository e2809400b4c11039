"""The versioned JSON messages between the daemon, the job agents and ``amoebactl`` (DESIGN.md, control flow).

A message is one JSON object ``{"v": 1, "kind": ..., "id": ..., "sent_at": ..., "body": {...}}``; it never holds
anything but JSON (no pickle on the wire). :func:`encode` and :func:`decode` check the version, the kind, the size
and every body field against :data:`SCHEMAS`; anything else raises :class:`ProtocolError` with the field and the
value. Authentication (a munge credential over the encoded bytes) is added by the transport, not here.

Kinds and who sends them:

==================  ===============  ==============================================================================
kind                sender           body
==================  ===============  ==============================================================================
``register``        agent -> daemon  ``job_id``, ``endpoint`` (where the agent takes directives), ``min_workers``,
                                     ``max_workers``, ``gpus_per_worker``, ``partition``, ``elastic_partition``;
                                     optional ``share`` (the job's sharing mode, :data:`SHARE_MODES`) and
                                     ``share_partition`` (where its minimum workers hold shards)
``report``          agent -> daemon  ``job_id``, ``size``, ``generation``, ``target`` (size being reached),
                                     ``throughput`` (``{"<size>": samples/s}``), ``history`` (events),
                                     ``satellites`` (Slurm job ids); optional ``adaptive`` (an adaptive-batch
                                     job's statistics: :data:`ADAPTIVE_FIELDS`) and ``plans`` (a planned job's
                                     ``min_workers``, its smallest feasible size, and predicted
                                     ``samples_per_s`` per size, ``{"<size>": samples/s}``) and ``memory_gib``
                                     (the device memory one worker of the job peaked at, GiB: what a sharer
                                     beside it cannot use)
``resize``          daemon/ctl ->    ``job_id``, ``target``, ``reason``; to an agent it is a directive, to the
                                     daemon a user's request; optional ``batch`` (the global batch the policy
                                     chose for ``target`` workers, 1 to :data:`MAX_BATCH`) and ``vacate`` (a node
                                     name, :data:`NODE_NAME`: move the job's satellites off it, keeping the size)
                                     and ``fence`` (from a daemon of a standby pair: its lease generation; an agent
                                     refuses a directive whose fence is older than one it has seen) and
                                     ``place_beside`` (GPU sharing: ``{"host", "partition", "nodes", "role",
                                     "host_uid", "status_path", "pace_bound", "sub_batch"}`` and optional
                                     ``"memory_cap_bytes"``, the new workers run beside job ``host``,
                                     ``nodes[node]`` of them on each node, in satellites of one shard in
                                     ``partition``, pacing against the host's status file ``status_path`` owned by
                                     ``host_uid``, each under the device memory cap; :func:`check_place_beside`)
``pin``             ctl -> daemon    ``job_id``, ``pinned`` (exclude the job from the policy, or not)
``share``           ctl -> daemon    ``job_id``, ``host``, ``nodes`` (an operator places ``nodes[node]`` new workers
                                     of job ``job_id`` beside job ``host``: a share applied at the next round)
``drain``           ctl -> daemon    (empty): shrink every elastic job to its minimum, and keep it there
``resume``          ctl -> daemon    (empty): end a drain; the policy decides again
``status``          ctl -> daemon    (empty)
``jobs``            ctl -> daemon    optional ``offset`` and ``limit`` (a page of the jobs; the reply's ``next``
                                     is the offset of the next page, or null on the last)
``policy_show``     ctl -> daemon    (empty)
``admission``       guard -> daemon  ``job_id``: what the pending job's admission guard is to do; the reply's
                                     ``verdict`` is ``hold``, ``release`` or ``none`` (``admission.holds_by: owner``)
``reply``           anyone           ``ok``, ``error`` (a sentence, or ""), ``data`` (an object)
==================  ===============  ==============================================================================
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.core.sharing import SHARE_MODES, ShareRole

PROTOCOL_VERSION = 1

#: Ends the daemon's refusal of a registration it cannot vet yet (Slurm's record of the job is being read): the
#: agent registers again within seconds instead of at its next report.
RETRY_SOON = "retry in a few seconds"
MAX_MESSAGE_BYTES = 1 << 20  # 1 MiB: reports with long histories fit; a flood does not
MAX_DEPTH = 8  # nesting of objects/arrays in one message (a report's history event sits at depth 4)
MAX_STRING = 65536  # characters of any one string (key or value)
MAX_INT_DIGITS = 18  # an integer literal longer than this is refused before Python converts it
MAX_HISTORY_EVENTS = 64  # events in one report
MAX_EVENT_BYTES = 2048  # one history event, encoded
MAX_THROUGHPUT_ENTRIES = 1024  # sizes in one report's throughput table
MAX_BATCH = (1 << 24) - 1  # a global batch in a report or a directive (the runtime's policy batch: three bytes)
#: A node name in a directive (``vacate``): what Slurm accepts in a hostlist, one node, at most 64 characters.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_STEP_TIMES = 32  # entries of an adaptive report's step-time table
MAX_LABEL = 16  # characters of a short word in a report (an adaptive job's batch source)
MAX_NOISE_SCALE = 1e15  # samples: a gradient noise scale in a report (larger is as good as infinite)
MAX_STEP_S = 1e5  # seconds of one step in a report's step-time table


#: The role a standby daemon names in its replies (``data["role"]``), with ``data["active"]``: where the active one is.
STANDBY = "standby"


class ProtocolError(ParseError):
    """A message that is not valid JSON of a known kind and version, or whose body is malformed."""


# Field name -> accepted Python types, per kind. ``int`` never accepts bool; ``float`` accepts int.
SCHEMAS: dict[str, dict[str, tuple[type, ...]]] = {
    "register": {
        "job_id": (str,),
        "endpoint": (str,),
        "min_workers": (int,),
        "max_workers": (int,),
        "gpus_per_worker": (int,),
        "partition": (str,),
        "elastic_partition": (str,),
    },
    "report": {
        "job_id": (str,),
        "size": (int,),
        "generation": (int,),
        "target": (int,),
        "throughput": (dict,),
        "history": (list,),
        "satellites": (list,),
    },
    "resize": {"job_id": (str,), "target": (int,), "reason": (str,)},
    "pin": {"job_id": (str,), "pinned": (bool,)},
    "share": {"job_id": (str,), "host": (str,), "nodes": (dict,)},
    "drain": {},
    "resume": {},
    "status": {},
    "jobs": {},
    "policy_show": {},
    "admission": {"job_id": (str,)},
    "reply": {"ok": (bool,), "error": (str,), "data": (dict,)},
}
# Fields a kind may carry but need not (older senders leave them out), checked like :data:`SCHEMAS`' fields.
OPTIONAL_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "jobs": {"offset": (int,), "limit": (int,)},
    "register": {"share": (str,), "share_partition": (str,)},
    "report": {"adaptive": (dict,), "plans": (dict,), "memory_gib": (int, float)},
    "resize": {"batch": (int,), "vacate": (str,), "fence": (int,), "place_beside": (dict,)},
}
#: The most workers one ``place_beside`` puts on one node (a node's GPUs, each holding one host and one sharer).
MAX_BESIDE_PER_NODE = 64
#: The most device memory a report's ``memory_gib`` may state (GiB per worker).
MAX_MEMORY_GIB = 1 << 20
#: The most nodes one ``place_beside`` names.
MAX_BESIDE_NODES = 64
_JOB_ID = re.compile(r"[0-9]{1,12}")
_PARTITION = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_STATUS_PATH = re.compile(r"/[A-Za-z0-9_.\-/]{1,255}")
_NONE = type(None)
#: A report's ``adaptive`` object: field -> (accepted types, required). Values are checked for type, finiteness and
#: count here, for range by the daemon (``daemon/agents.py``). ``step_time_s`` holds at most :data:`MAX_STEP_TIMES`
#: ``[world size, global batch, seconds per step, steps measured]`` entries.
ADAPTIVE_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "global_batch": ((int,), True),
    "base_batch": ((int,), True),
    "max_batch": ((int,), True),
    "noise_scale": ((float, _NONE), True),
    "step_time_s": ((list,), True),
    "efficiency": ((float, _NONE), False),
    "measured_steps": ((int,), False),
    "policy_batch": ((int, _NONE), False),
    "batch_source": ((str,), False),
}
_STEP_TIME_ENTRY = ((int,), (int,), (float,), (int,))


@dataclasses.dataclass(frozen=True)
class Message:
    """One protocol message.

    Attributes:
        kind: one of :data:`SCHEMAS`.
        body: the kind's fields (checked by :func:`encode`/:func:`decode`).
        id: a unique id; a reply carries the id of the request it answers.
        sent_at: the sender's wall clock (Unix seconds), for logs and latency.
        version: the protocol version.
    """

    kind: str
    body: Mapping[str, Any]
    id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    sent_at: float = dataclasses.field(default_factory=time.time)
    version: int = PROTOCOL_VERSION

    def reply(self, *, ok: bool = True, error: str = "", data: Mapping[str, Any] | None = None) -> Message:
        """The reply to this message (same id)."""
        return Message("reply", {"ok": ok, "error": error, "data": dict(data or {})}, id=self.id)


def standby_redirect(reply: Message) -> str | None:
    """The active daemon's endpoint when ``reply`` is a standby's refusal ("standby, active is X"), else None ("":
    a standby that knows no active daemon yet)."""
    data = reply.body.get("data") or {}
    if reply.kind != "reply" or reply.body.get("ok") or data.get("role") != STANDBY:
        return None
    active = data.get("active")
    return active if isinstance(active, str) else ""


def quote(value: object, limit: int = 60) -> str:
    """``value`` for an error message or a log line: ASCII only (no newline or escape reaches a terminal), at most
    ``limit`` characters, cut with ``...``. Refusals never echo more of what a peer sent than this."""
    text = ascii(value)
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ProtocolError(f"an integer of {len(text)} digits is over the {MAX_INT_DIGITS}-digit limit")
    return int(text)


def _refuse_constant(name: str) -> float:
    raise ProtocolError(f"{name} is not a number this protocol accepts")


def _check_shape(doc: object) -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH` and strings longer than :data:`MAX_STRING`, without recursion."""
    stack: list[tuple[object, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if len(value) > MAX_STRING:
                raise ProtocolError(f"a string of {len(value)} characters is over the {MAX_STRING} limit")
        elif isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise ProtocolError(f"nesting deeper than {MAX_DEPTH} levels")
            if isinstance(value, dict):
                stack.extend((key, depth) for key in value)
                stack.extend((item, depth + 1) for item in value.values())
            else:
                stack.extend((item, depth + 1) for item in value)


def _typed(value: object, types: tuple[type, ...]) -> bool:
    """Whether ``value`` is of ``types`` (``int`` never accepts bool, ``float`` accepts int), and a number in it
    finite and within 53 bits."""
    if isinstance(value, bool) and bool not in types:
        return False
    if isinstance(value, int) and not isinstance(value, bool):
        return (int in types or float in types) and -(2**53) < value < 2**53
    if isinstance(value, float):
        return float in types and math.isfinite(value)
    return isinstance(value, types)


def check_adaptive(adaptive: Mapping[str, Any]) -> None:
    """Check a report's ``adaptive`` object field by field (:data:`ADAPTIVE_FIELDS`): names, types, finite numbers,
    the table's size; the ranges are the daemon's to check.

    Raises:
        ProtocolError: the first field that is wrong.
    """
    extra = sorted(set(adaptive) - set(ADAPTIVE_FIELDS))
    if extra:
        raise ProtocolError(f"report: adaptive has unknown field(s) {quote(', '.join(extra[:5]), 80)}")
    for name, (types, required) in ADAPTIVE_FIELDS.items():
        if name not in adaptive:
            if required:
                raise ProtocolError(f"report: adaptive is missing {name!r}")
            continue
        if not _typed(adaptive[name], types):
            kinds = " or ".join("null" if t is _NONE else t.__name__ for t in types)
            raise ProtocolError(f"report: adaptive[{name!r}] is {quote(adaptive[name])}, not a finite {kinds}")
    if len(adaptive.get("batch_source", "")) > MAX_LABEL:
        raise ProtocolError(f"report: adaptive['batch_source'] is longer than {MAX_LABEL} characters")
    table = adaptive["step_time_s"]
    if len(table) > MAX_STEP_TIMES:
        raise ProtocolError(f"report: adaptive step_time_s has {len(table)} entries, over {MAX_STEP_TIMES}")
    for entry in table:
        ok = isinstance(entry, list) and len(entry) == len(_STEP_TIME_ENTRY)
        if not ok or not all(_typed(v, t) for v, t in zip(entry, _STEP_TIME_ENTRY, strict=True)):
            raise ProtocolError(
                f"report: adaptive step_time_s entry {quote(entry)} is not [workers, batch, seconds, steps]"
            )


def check_place_beside(place: Mapping[str, Any]) -> None:
    """Check a directive's ``place_beside`` object: ``host`` a job id, ``partition`` a partition name, ``nodes`` node
    name -> 1 to :data:`MAX_BESIDE_PER_NODE` workers (1 to :data:`MAX_BESIDE_NODES` nodes), ``role`` a
    :class:`~slurm_amoeba.core.sharing.ShareRole` value, ``host_uid`` the host owner's uid, ``status_path`` the
    host's status file (:func:`~slurm_amoeba.core.sharing.host_status_path`), ``pace_bound`` the share of its
    exclusive speed the host may lose (0 to under 1; 0: the runtime's default bound) and ``sub_batch`` the sharer's
    local micro-batch (0: the runtime fits its own); optional ``memory_cap_bytes``, the device memory each new worker
    may use (0 or absent: no cap).

    Raises:
        ProtocolError: the first field that is wrong, named with its value.
    """
    fields = ("host", "partition", "nodes", "role", "host_uid", "status_path", "pace_bound", "sub_batch")
    if not set(fields) <= set(place) <= {*fields, "memory_cap_bytes"}:
        raise ProtocolError(
            f"resize: place_beside has fields {quote(sorted(place), 80)}, not {', '.join(fields)}"
            " (and optionally memory_cap_bytes)"
        )
    cap = place.get("memory_cap_bytes", 0)
    if not _typed(cap, (int,)) or not 0 <= cap < 1 << 50:
        raise ProtocolError(f"resize: place_beside memory_cap_bytes {quote(cap)} is not a byte count of 0 or more")
    host, partition, nodes, role, host_uid, status_path, pace_bound, sub_batch = (place[name] for name in fields)
    if not isinstance(host, str) or _JOB_ID.fullmatch(host) is None:
        raise ProtocolError(f"resize: place_beside host {quote(host)} is not a job id")
    if not isinstance(partition, str) or _PARTITION.fullmatch(partition) is None:
        raise ProtocolError(f"resize: place_beside partition {quote(partition)} is not a partition name")
    if role not in [r.value for r in ShareRole]:
        raise ProtocolError(f"resize: place_beside role {quote(role)} is not one of {', '.join(SHARE_MODES)}")
    if not _typed(host_uid, (int,)) or not 0 <= host_uid < 1 << 32:
        raise ProtocolError(f"resize: place_beside host_uid {quote(host_uid)} is not a uid")
    if not isinstance(status_path, str) or _STATUS_PATH.fullmatch(status_path) is None:
        raise ProtocolError(f"resize: place_beside status_path {quote(status_path)} is not an absolute file path")
    if not _typed(pace_bound, (int, float)) or not 0 <= pace_bound < 1:
        raise ProtocolError(f"resize: place_beside pace_bound {quote(pace_bound)} is not a fraction from 0 to under 1")
    if not _typed(sub_batch, (int,)) or not 0 <= sub_batch < 1 << 31:
        raise ProtocolError(f"resize: place_beside sub_batch {quote(sub_batch)} is not a micro-batch of 0 or more")
    _check_beside_nodes("resize: place_beside", nodes)


def _check_beside_nodes(where: str, nodes: object) -> None:
    """Node name -> 1 to :data:`MAX_BESIDE_PER_NODE` workers, 1 to :data:`MAX_BESIDE_NODES` nodes."""
    if not isinstance(nodes, dict) or not 1 <= len(nodes) <= MAX_BESIDE_NODES:
        raise ProtocolError(f"{where} nodes {quote(nodes)} is not 1 to {MAX_BESIDE_NODES} nodes")
    for node, count in nodes.items():
        if NODE_NAME.fullmatch(node) is None:
            raise ProtocolError(f"{where} node {quote(node)} is not a node name")
        if not _typed(count, (int,)) or not 1 <= count <= MAX_BESIDE_PER_NODE:
            raise ProtocolError(
                f"{where} nodes[{quote(node)}] = {quote(count)} is not 1 to {MAX_BESIDE_PER_NODE} workers"
            )


def _check_report(body: Mapping[str, Any]) -> None:
    history, throughput = body["history"], body["throughput"]
    if len(history) > MAX_HISTORY_EVENTS:
        raise ProtocolError(f"report: {len(history)} history events, over the limit of {MAX_HISTORY_EVENTS}")
    for event in history:
        size = len(json.dumps(event, separators=(",", ":")))
        if size > MAX_EVENT_BYTES:
            raise ProtocolError(f"report: a history event of {size} bytes is over the {MAX_EVENT_BYTES} limit")
    if len(throughput) > MAX_THROUGHPUT_ENTRIES:
        raise ProtocolError(f"report: {len(throughput)} throughput entries, over {MAX_THROUGHPUT_ENTRIES}")
    if "adaptive" in body:
        check_adaptive(body["adaptive"])
    if "memory_gib" in body:
        memory = body["memory_gib"]
        if not math.isfinite(memory) or not 0 <= memory <= MAX_MEMORY_GIB:
            raise ProtocolError(f"report: memory_gib {quote(memory)} is not GiB from 0 to {MAX_MEMORY_GIB}")


def _check_body(kind: str, body: Any) -> dict[str, Any]:
    schema = SCHEMAS.get(kind)
    if schema is None:
        raise ProtocolError(f"unknown message kind {quote(kind)}; known kinds: {', '.join(sorted(SCHEMAS))}")
    if not isinstance(body, dict):
        raise ProtocolError(f"{kind}: body is {type(body).__name__}, not an object")
    missing = sorted(set(schema) - set(body))
    if missing:
        raise ProtocolError(f"{kind}: missing field(s) {', '.join(missing)}")
    optional = OPTIONAL_FIELDS.get(kind, {})
    extra = sorted(set(body) - set(schema) - set(optional))
    if extra:
        named = quote(", ".join(extra[:5]), 80)
        known = sorted({*schema, *optional})
        raise ProtocolError(f"{kind}: unknown field(s) {named}; known: {', '.join(known) or '-'}")
    for name, types in {**schema, **{key: t for key, t in optional.items() if key in body}}.items():
        value = body[name]
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            expected = " or ".join(t.__name__ for t in types)
            raise ProtocolError(f"{kind}: field {name!r} is {quote(value)}, not {expected}")
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**53) < value < 2**53:
            raise ProtocolError(f"{kind}: field {name!r} is {quote(value)}, out of range")
        if isinstance(value, float) and not math.isfinite(value):
            raise ProtocolError(f"{kind}: field {name!r} is {value!r}, not a finite number")
    if kind == "report":
        _check_report(body)
    if kind == "resize" and "batch" in body and not 1 <= body["batch"] <= MAX_BATCH:
        raise ProtocolError(f"resize: batch {quote(body['batch'])} is not a global batch of 1 to {MAX_BATCH}")
    if kind == "resize" and "vacate" in body and NODE_NAME.fullmatch(body["vacate"]) is None:
        raise ProtocolError(f"resize: vacate {quote(body['vacate'])} is not a node name")
    if kind == "resize" and "place_beside" in body:
        check_place_beside(body["place_beside"])
    if kind == "share":
        if _JOB_ID.fullmatch(body["host"]) is None:
            raise ProtocolError(f"share: host {quote(body['host'])} is not a job id")
        _check_beside_nodes("share:", body["nodes"])
    if kind == "register" and "share" in body and body["share"] not in SHARE_MODES:
        raise ProtocolError(f"register: share {quote(body['share'])} is not one of {', '.join(SHARE_MODES)}")
    if kind == "register" and "share_partition" in body and _PARTITION.fullmatch(body["share_partition"]) is None:
        raise ProtocolError(f"register: share_partition {quote(body['share_partition'])} is not a partition name")
    return body


def encode(message: Message) -> bytes:
    """The message as UTF-8 JSON bytes.

    Raises:
        ProtocolError: unknown kind, a body that does not match its schema, or more than 1 MiB.
    """
    body = _check_body(message.kind, dict(message.body))
    _check_shape(body)
    data = json.dumps(
        {"v": message.version, "kind": message.kind, "id": message.id, "sent_at": message.sent_at, "body": body},
        separators=(",", ":"),
        allow_nan=False,
    ).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"{message.kind}: message of {len(data)} bytes is over the {MAX_MESSAGE_BYTES} limit")
    return data


def decode(data: bytes) -> Message:
    """Read a message; never raises anything but :class:`ProtocolError` on bad input.

    Raises:
        ProtocolError: too large, not UTF-8 JSON, a wrong version, an unknown kind or a malformed body.
    """
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes is over the {MAX_MESSAGE_BYTES} limit")
    try:
        doc = json.loads(data.decode("utf-8"), parse_int=_parse_int, parse_constant=_refuse_constant)
    except ProtocolError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError, OverflowError) as exc:
        raise ProtocolError(f"message is not UTF-8 JSON ({exc.__class__.__name__})") from None
    _check_shape(doc)
    if not isinstance(doc, dict):
        raise ProtocolError(f"message is {type(doc).__name__}, not an object")
    version = doc.get("v")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {quote(version)} is not supported; this side speaks {PROTOCOL_VERSION}")
    kind, msg_id, sent_at = doc.get("kind"), doc.get("id"), doc.get("sent_at")
    if not isinstance(kind, str):
        raise ProtocolError(f"message kind is {quote(kind)}, not a string")
    if not isinstance(msg_id, str) or not 0 < len(msg_id) <= 64:
        raise ProtocolError(f"message id is {quote(msg_id)}, not a string of 1..64 characters")
    if isinstance(sent_at, bool) or not isinstance(sent_at, (int, float)) or not math.isfinite(sent_at):
        raise ProtocolError(f"sent_at is {quote(sent_at)}, not a time")
    body = _check_body(kind, doc.get("body"))
    return Message(kind=kind, body=body, id=msg_id, sent_at=float(sent_at), version=version)
