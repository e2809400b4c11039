"""A handle on a running elastic job's agent: its status file and its directive channel.

Used by :class:`~slurm_amoeba.launcher.executor.ElasticJob` and by shell users' tools for jobs submitted with
``amoeba-sbatch`` (whose agent keeps its state in ``amoeba-<jobid>/`` beside where the job was submitted).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from slurm_amoeba.core.errors import AmoebaError, SpecError
from slurm_amoeba.core.layout import AGENT_STATUS_FILE
from slurm_amoeba.core.messages import Message
from slurm_amoeba.transport.channel import ChannelError, request


class AgentHandle:
    """The agent of elastic job ``job_id`` whose state lives in ``state_dir``."""

    def __init__(self, job_id: str, state_dir: Path) -> None:
        self.job_id = str(job_id)
        self.state_dir = Path(state_dir)

    def status(self) -> dict[str, Any]:
        """The agent's latest status (empty until the agent has started)."""
        try:
            return dict(json.loads((self.state_dir / AGENT_STATUS_FILE).read_text()))
        except (OSError, ValueError):
            return {}

    def workers(self) -> int:
        """Workers training in the current generation (0 before the first)."""
        return int(self.status().get("size", 0))

    def history(self) -> dict[str, Any]:
        """Generations (size, pause before each, start step), events, throughput per worker count, time series."""
        status = self.status()
        return {
            key: status.get(key, default)
            for key, default in (
                ("generations", []),
                ("history", []),
                ("throughput", {}),
                ("groups", []),
                ("series", []),
            )
        }

    def resize(
        self, workers: int, *, reason: str = "user request", timeout_s: float = 10.0, expect_uid: int | None = None
    ) -> int:
        """Ask the agent for ``workers`` workers (see :meth:`ElasticJob.resize`). The request is signed with munge
        (the agent obeys only the job's owner and the daemon); ``expect_uid``: the uid the answer must be signed by
        (the job's owner: a shell user resizing their own job passes their uid, so nobody else's socket answers).

        Raises:
            SpecError: ``workers`` is outside the job's range, or the agent refused.
            AmoebaError: the agent is not running (yet, or any more), or did not answer.
        """
        deadline = time.monotonic() + timeout_s
        endpoint = ""
        while not endpoint:
            endpoint = str(self.status().get("endpoint", ""))
            if not endpoint:
                if time.monotonic() > deadline:
                    raise AmoebaError(
                        f"job {self.job_id}: its agent has not started (no {self.state_dir / AGENT_STATUS_FILE})"
                    )
                time.sleep(0.2)
        message = Message("resize", {"job_id": self.job_id, "target": workers, "reason": reason})
        try:
            reply = request(
                endpoint, message, timeout_s=max(1.0, deadline - time.monotonic()), retries=1, expect_uid=expect_uid
            )
        except ChannelError as exc:
            raise AmoebaError(f"job {self.job_id}: the agent did not take the resize: {exc}") from None
        if not reply.body["ok"]:
            raise SpecError(f"job {self.job_id}: {reply.body['error']}")
        return int(reply.body["data"].get("target", workers))
