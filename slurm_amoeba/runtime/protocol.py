"""The worker <-> coordinator protocol over the job's TCPStore: key names and JSON messages.

Everything in the store is JSON text (never pickle), and every value the runtime reads is sealed with the job's
secret (:mod:`slurm_amoeba.runtime.auth`). A starting worker pushes a join request onto ``join`` and receives the
worker id the coordinator issues at ``joined/<nonce>``. Workers push :class:`WorkerEvent`\\ s onto one queue; the
coordinator answers each worker with numbered :class:`Assignment`\\ s (``assign/<worker>/<seq>``), publishes the
generation it wants to end (``want``), the global batch a scheduling policy chose (``batch``, a
:class:`PolicyBatch`), and reads heartbeats and progress. Everything of generation ``g`` lives under
``gen<g>.<token>/``, where the token is derived from the job's secret (``JobKey.derive``): a client without the
secret cannot even name those keys. Before forming a process group, each member
marks its arrival there (``arrived/<worker>``) and waits for the others, or for the coordinator's ``abort`` when a
member died or failed; the state source publishes its ``manifest``; the process group itself uses ``pg/``
(DESIGN.md, layer ``runtime/``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

from slurm_amoeba.core.errors import ParseError

PREFIX = "amoeba/"
EVENTS_KEY = PREFIX + "events"
WANT_KEY = PREFIX + "want"
PROGRESS_KEY = PREFIX + "progress"
JOB_KEY = PREFIX + "job"
JOIN_KEY = PREFIX + "join"
BATCH_KEY = PREFIX + "batch"
#: Where the coordinator publishes how the job shares its devices (a ``runtime/share.py`` ``ShareDirective``).
SHARE_KEY = PREFIX + "share"
#: The largest global batch a scheduling policy may set (it rides as three bytes on the gradient all-reduce,
#: :class:`~slurm_amoeba.runtime.gns.NormProbe`, exact in any floating-point dtype).
MAX_POLICY_BATCH = (1 << 24) - 1


def heartbeat_key(worker_id: str) -> str:
    """Key of a worker's heartbeat (a wall-clock time as text)."""
    return f"{PREFIX}hb/{worker_id}"


def assignment_key(worker_id: str, seq: int) -> str:
    """Key of the ``seq``-th assignment the coordinator gives a worker."""
    return f"{PREFIX}assign/{worker_id}/{seq}"


def join_answer_key(nonce: str) -> str:
    """Key where the coordinator answers the join request carrying ``nonce`` (the issued worker id)."""
    return f"{PREFIX}joined/{nonce}"


def generation_space(generation: int, token: str) -> str:
    """Where everything of a generation lives; ``token`` comes from the job's secret (``JobAuth.token``)."""
    return f"{PREFIX}gen{generation}.{token}/"


def manifest_key(generation: int, token: str) -> str:
    """Key where the state source of a generation publishes its state manifest."""
    return generation_space(generation, token) + "manifest"


def arrival_key(generation: int, token: str, worker_id: str) -> str:
    """Key a member sets when it starts forming the process group of a generation."""
    return f"{generation_space(generation, token)}arrived/{worker_id}"


def abort_key(generation: int, token: str) -> str:
    """Key the coordinator sets when a generation cannot form: a member died or failed while it formed."""
    return generation_space(generation, token) + "abort"


def group_prefix(generation: int, token: str) -> str:
    """Store prefix of the process group of a generation (torch's own rendezvous keys, which cannot be sealed)."""
    return generation_space(generation, token) + "pg"


def load_object(text: str | bytes, what: str) -> dict[str, Any]:
    """A JSON object from ``text`` (the messages of this module, and ``runtime/share.py``'s).

    Raises:
        ParseError: not JSON, or not an object; ``what`` names the message.
    """
    raw = text.decode() if isinstance(text, bytes) else text
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ParseError(f"not JSON ({exc})", source=what, text=raw) from None
    if not isinstance(data, dict):
        raise ParseError("expected a JSON object", source=what, text=raw)
    return data


class EventKind(str, enum.Enum):
    """What a worker tells the coordinator.

    A worker goes ``registered`` (warming up) -> ``ready`` (waiting for admission) -> ``report`` (once per
    generation it leaves, by switch or failure) ... and ends with ``done``, ``left`` or ``error``.
    """

    REGISTERED = "registered"
    READY = "ready"
    REPORT = "report"
    LEFT = "left"
    ERROR = "error"
    DONE = "done"


@dataclasses.dataclass(frozen=True)
class WorkerEvent:
    """One message from a worker to the coordinator.

    Attributes:
        kind: what happened.
        worker: the worker id.
        time: the worker's wall clock when it sent the event.
        generation: for ``report``: the generation that ended.
        step: for ``report``: the worker's global step now.
        committed_step: for ``report``: the step of its last commit.
        leaving: for ``report``: the worker leaves (SIGTERM or its own decision).
        failed: for ``report``: a collective failed (rollback needed).
        pid: for ``registered``: the process id.
        host: for ``registered``: the host name.
        allowed_sizes: for ``ready``: world sizes the job's global batch accepts (empty = unknown).
        missing: for ``report``: members that had not arrived when forming the generation failed (empty when the
            generation formed, or failed later).
        message: for ``error``/``left``: why.
        failure: for ``error``: its class (:class:`~slurm_amoeba.runtime.failures.FailureClass` value).
        error: for ``error``: the exception's type name.
        traceback: for ``error``: the end of the traceback (the agent prints it in the job's output).
    """

    kind: EventKind
    worker: str
    time: float
    generation: int = 0
    step: int = -1
    committed_step: int = -1
    leaving: bool = False
    failed: bool = False
    pid: int = 0
    host: str = ""
    allowed_sizes: tuple[int, ...] = ()
    missing: tuple[str, ...] = ()
    message: str = ""
    failure: str = ""
    error: str = ""
    traceback: str = ""

    def to_json(self) -> str:
        """Encode as JSON text."""
        data = dataclasses.asdict(self)
        data["kind"] = self.kind.value
        data["allowed_sizes"] = list(self.allowed_sizes)
        data["missing"] = list(self.missing)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> WorkerEvent:
        """Decode JSON text from :meth:`to_json`.

        Raises:
            ParseError: the text is not a valid event.
        """
        data = load_object(text, "worker event")
        try:
            data["kind"] = EventKind(data["kind"])
            data["allowed_sizes"] = tuple(int(s) for s in data.get("allowed_sizes", ()))
            data["missing"] = tuple(str(w) for w in data.get("missing", ()))
            return cls(**data)
        except (KeyError, TypeError, ValueError) as exc:
            raise ParseError(f"not a worker event ({exc})", source="worker event", text=str(text)) from None


@dataclasses.dataclass(frozen=True)
class GenerationPlan:
    """The membership of one generation, decided by the coordinator.

    Attributes:
        generation: its number (1 for the first).
        members: worker ids in rank order.
        hosts: each member's host, in rank order (for ``LOCAL_RANK``).
        source: the member whose state the joiners receive when ``sync`` is set.
        joiners: members that hold no valid state and must receive it (new workers, and members whose step is not
            the source's).
        rollback: the previous generation failed; survivors restore their last commit first.
        sync: the source sends its state to the joiners at the start of the generation.
        start_step: the global step the generation starts at, when known (not for the first generation).
        reason: why the generation was formed, for logs and history.
    """

    generation: int
    members: tuple[str, ...]
    hosts: tuple[str, ...]
    source: str
    joiners: tuple[str, ...] = ()
    rollback: bool = False
    sync: bool = False
    start_step: int | None = None
    reason: str = ""

    @property
    def world_size(self) -> int:
        """Number of members."""
        return len(self.members)

    def rank_of(self, worker_id: str) -> int:
        """Rank of a member.

        Raises:
            ValueError: the worker is not a member.
        """
        return self.members.index(worker_id)

    def local_rank_of(self, worker_id: str) -> tuple[int, int]:
        """A member's rank among the members on its host, and how many members that host has."""
        rank = self.rank_of(worker_id)
        host = self.hosts[rank]
        same = [i for i, h in enumerate(self.hosts) if h == host]
        return same.index(rank), len(same)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dictionary."""
        data = dataclasses.asdict(self)
        data["members"] = list(self.members)
        data["hosts"] = list(self.hosts)
        data["joiners"] = list(self.joiners)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationPlan:
        """Inverse of :meth:`to_dict`.

        Raises:
            ParseError: the dictionary is not a plan.
        """
        try:
            return cls(
                generation=int(data["generation"]),
                members=tuple(str(m) for m in data["members"]),
                hosts=tuple(str(h) for h in data["hosts"]),
                source=str(data["source"]),
                joiners=tuple(str(j) for j in data.get("joiners", ())),
                rollback=bool(data.get("rollback", False)),
                sync=bool(data.get("sync", False)),
                start_step=None if data.get("start_step") is None else int(data["start_step"]),
                reason=str(data.get("reason", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ParseError(f"not a generation plan ({exc})", source="generation plan", text=str(data)) from None


class AssignAction(str, enum.Enum):
    """What the coordinator tells a waiting worker to do."""

    JOIN = "join"  # become a member of the plan's generation
    STANDBY = "standby"  # stay warm and wait for the next assignment
    LEAVE = "leave"  # exit now (leave request, or evicted after missing a deadline)
    FINISH = "finish"  # the job is over (finished or lost); exit


@dataclasses.dataclass(frozen=True)
class Assignment:
    """One answer from the coordinator to one worker.

    Attributes:
        action: what to do.
        plan: for ``join``: the generation to join.
        reason: why, for logs.
        checkpoint: for ``leave``: every member of the generation leaves at this step boundary, so each first writes
            its shard of a final disk checkpoint (when the job writes checkpoints; ``runtime/checkpoint.py``).
    """

    action: AssignAction
    plan: GenerationPlan | None = None
    reason: str = ""
    checkpoint: bool = False

    def to_json(self) -> str:
        """Encode as JSON text."""
        return json.dumps(
            {
                "action": self.action.value,
                "plan": None if self.plan is None else self.plan.to_dict(),
                "reason": self.reason,
                "checkpoint": self.checkpoint,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Assignment:
        """Decode JSON text from :meth:`to_json`.

        Raises:
            ParseError: the text is not an assignment.
        """
        data = load_object(text, "assignment")
        try:
            action = AssignAction(data["action"])
        except (KeyError, ValueError) as exc:
            raise ParseError(f"not an assignment ({exc})", source="assignment", text=str(text)) from None
        plan = data.get("plan")
        if action is AssignAction.JOIN and not isinstance(plan, dict):
            raise ParseError("a join assignment needs a plan", source="assignment", text=str(text))
        return cls(
            action=action,
            plan=GenerationPlan.from_dict(plan) if isinstance(plan, dict) else None,
            reason=str(data.get("reason", "")),
            checkpoint=data.get("checkpoint") is True,
        )


@dataclasses.dataclass(frozen=True)
class JoinRequest:
    """A starting worker asks the coordinator for its id.

    Attributes:
        nonce: fresh random hex (32 digits) naming the answer's key; a nonce seen before is refused.
        hint: the id its launcher suggests (``AMOEBA_WORKER_ID``); the coordinator issues it when it is free.
    """

    nonce: str
    hint: str

    def to_json(self) -> str:
        """Encode as JSON text."""
        return json.dumps({"nonce": self.nonce, "hint": self.hint}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> JoinRequest:
        """Decode JSON text from :meth:`to_json`.

        Raises:
            ParseError: not a join request, or its nonce is not 32 hex digits.
        """
        data = load_object(text, "join request")
        nonce, hint = data.get("nonce"), data.get("hint")
        if not isinstance(nonce, str) or not isinstance(hint, str) or len(nonce) != 32 or not _is_hex(nonce):
            raise ParseError("not a join request (nonce: 32 hex digits, hint: text)", source="join request")
        return cls(nonce=nonce, hint=hint)


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


@dataclasses.dataclass(frozen=True)
class JoinAnswer:
    """The coordinator's answer to a :class:`JoinRequest`.

    Attributes:
        worker: the issued worker id.
        job_id: the job's name (the worker checks it is the job its launcher meant).
    """

    worker: str
    job_id: str

    def to_json(self) -> str:
        """Encode as JSON text."""
        return json.dumps({"worker": self.worker, "job_id": self.job_id}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> JoinAnswer:
        """Decode JSON text from :meth:`to_json`.

        Raises:
            ParseError: not a join answer.
        """
        data = load_object(text, "join answer")
        worker, job_id = data.get("worker"), data.get("job_id")
        if not isinstance(worker, str) or not isinstance(job_id, str):
            raise ParseError("not a join answer (worker, job_id: text)", source="join answer")
        return cls(worker=worker, job_id=job_id)


@dataclasses.dataclass(frozen=True)
class PolicyBatch:
    """The global batch a scheduling policy chose for an adaptive job at one world size (the coordinator's
    ``batch`` key; docs/runtime.md section 12).

    Attributes:
        batch: the global batch, 1 to :data:`MAX_POLICY_BATCH`.
        world_size: the number of workers it is meant for; at other sizes the runtime chooses its own batch.
        seq: grows with every new choice (the coordinator's count).
    """

    batch: int
    world_size: int
    seq: int = 0

    def __post_init__(self) -> None:
        for name, value, low, high in (
            ("batch", self.batch, 1, MAX_POLICY_BATCH),
            ("world_size", self.world_size, 1, 1 << 20),
            ("seq", self.seq, 0, 1 << 53),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ParseError(f"a policy batch's {name} is {value!r:.40}, not an integer in {low}..{high}")

    def to_json(self) -> str:
        """Encode as JSON text."""
        return json.dumps({"batch": self.batch, "world_size": self.world_size, "seq": self.seq}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> PolicyBatch:
        """Decode JSON text from :meth:`to_json`.

        Raises:
            ParseError: not a policy batch, or a value out of range.
        """
        data = load_object(text, "policy batch")
        try:
            return cls(batch=data["batch"], world_size=data["world_size"], seq=data["seq"])
        except KeyError as exc:
            raise ParseError(f"not a policy batch (no {exc})", source="policy batch") from None
