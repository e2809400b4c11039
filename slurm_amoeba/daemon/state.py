"""What the daemon keeps across a restart: pins, the drain switch, resizes the agents accepted, and shares.

Everything else is rebuilt from Slurm and from the agents re-registering (DESIGN.md, restart recovery). Acknowledged
resizes are kept so that a restarted daemon does not order a job again while it is still moving to a size the
previous daemon ordered ("nothing decided twice"); the agents' own reports (target != size) say the same, and this
file covers the moment between the agent's acknowledgement and its next report. Shares (a job's workers placed
beside another job's, GPU sharing) are kept so that a restarted daemon still knows which sharer to send back to its
own workers when the host needs its place (the agents' reports do not say where their workers run).

The file is JSON, replaced atomically (write, fsync, rename). A file that cannot be read is set aside with a
warning and the daemon starts without it: losing pins is better than not starting.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

from slurm_amoeba.core.messages import ProtocolError
from slurm_amoeba.daemon.agents import Beside, InFlight, check_job_id

logger = logging.getLogger(__name__)

STATE_VERSION = 1


@dataclasses.dataclass
class DaemonState:
    """The persistent part of the daemon's state.

    Attributes:
        pinned: job ids excluded from the policy.
        draining: every elastic job is held at its minimum.
        in_flight: job id -> an acknowledged resize not yet reached.
        shares: job id -> its workers beside another job (the share the daemon ordered and has not taken back).
    """

    pinned: set[str] = dataclasses.field(default_factory=set)
    draining: bool = False
    in_flight: dict[str, InFlight] = dataclasses.field(default_factory=dict)
    shares: dict[str, Beside] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "version": STATE_VERSION,
            "pinned": sorted(self.pinned),
            "draining": self.draining,
            "in_flight": {job: dataclasses.asdict(entry) for job, entry in sorted(self.in_flight.items())},
            "shares": {job: beside.to_body() for job, beside in sorted(self.shares.items())},
        }

    @classmethod
    def from_json(cls, doc: Any) -> DaemonState:
        """Read the JSON form.

        Raises:
            ValueError: the document is not a state of this version.
        """
        if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION:
            raise ValueError(f"not a version-{STATE_VERSION} state document")
        pinned = doc.get("pinned", [])
        draining = doc.get("draining", False)
        entries = doc.get("in_flight", {})
        if not isinstance(pinned, list) or not isinstance(draining, bool) or not isinstance(entries, dict):
            raise ValueError("pinned must be a list, draining a boolean and in_flight an object")
        in_flight: dict[str, InFlight] = {}
        for job, entry in entries.items():
            if not isinstance(entry, dict):
                raise ValueError(f"in_flight[{job!r}] is not an object")
            target, ordered_at = entry.get("target"), entry.get("ordered_at")
            if isinstance(target, bool) or not isinstance(target, int) or not isinstance(ordered_at, (int, float)):
                raise ValueError(f"in_flight[{job!r}] needs an integer target and a time ordered_at")
            in_flight[check_job_id(str(job))] = InFlight(
                target=target,
                ordered_at=float(ordered_at),
                source=str(entry.get("source", "policy")),
                reason=str(entry.get("reason", "")),
                acknowledged=True,
                acknowledged_at=float(entry.get("acknowledged_at") or ordered_at),
            )
        shares_doc = doc.get("shares", {})  # absent in files written before shares were kept
        if not isinstance(shares_doc, dict):
            raise ValueError("shares must be an object")
        shares: dict[str, Beside] = {}
        for job, body in shares_doc.items():
            if not isinstance(body, dict):
                raise ValueError(f"shares[{job!r}] is not an object")
            try:
                shares[check_job_id(str(job))] = Beside.from_body(body)
            except ProtocolError as exc:
                raise ValueError(f"shares[{job!r}]: {exc}") from exc
        return cls({check_job_id(str(job)) for job in pinned}, draining, in_flight, shares)


def load_state(path: Path | None) -> DaemonState:
    """Read the state file; a missing file is an empty state, an unreadable one is set aside.

    Args:
        path: the state file, or None when the daemon keeps no state.

    Returns:
        The state.
    """
    if path is None or not path.exists():
        return DaemonState()
    try:
        return DaemonState.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        aside = path.with_name(path.name + ".unreadable")
        logger.error(
            "[daemon/recovery] state file %s cannot be read (%s); moved it to %s and starting without pins",
            path,
            exc,
            aside,
        )
        try:
            path.replace(aside)
        except OSError as move_exc:
            logger.error("[daemon/recovery] could not move %s aside: %s", path, move_exc)
        return DaemonState()


def save_state(path: Path | None, state: DaemonState) -> None:
    """Write the state file atomically; a failure is logged, not raised (the daemon keeps running).

    Args:
        path: the state file, or None when the daemon keeps no state.
        state: what to write.
    """
    if path is None:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as handle:
            json.dump(state.to_json(), handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    except OSError as exc:
        logger.error("[daemon/recovery] could not write state file %s: %s; pins may not survive a restart", path, exc)
        tmp.unlink(missing_ok=True)
