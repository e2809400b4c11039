"""Names of the files in an elastic job's state directory, shared by the agent that writes them and the readers.

The state directory is the job's own (``<submission folder>/<job id>`` for the executor, ``$AMOEBA_STATE_DIR`` for
``amoeba-run``); only the job's owner writes there.
"""

from __future__ import annotations

AGENT_STATUS_FILE = "agent-status.json"
"""The agent's last status (JSON: endpoint, target, groups, generations), rewritten atomically on every change."""
