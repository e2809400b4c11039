"""``amoebad``, the control daemon (DESIGN.md, layer ``daemon/``, the control flow).

observer (``squeue``/``sinfo`` JSON + the agents' reports) -> :class:`~slurm_amoeba.policy.Snapshot` -> policy ->
actuator -> authenticated ``resize`` directives to the job agents over ZeroMQ. The daemon runs unprivileged and never
submits or cancels other users' jobs: every Slurm action on a job is its agent's, as the job's owner.

Modules: :mod:`.config` (``amoebad.yaml``), :mod:`.observer` (one read of Slurm), :mod:`.snapshot` (the policy's
snapshot), :mod:`.agents` (registrations and reports), :mod:`.actuator` (directives), :mod:`.executor` (the typed
actions applied live), :mod:`.rounds` (observe -> snapshot -> decide -> act), :mod:`.requests` (the API and its
who-may-do-what table), :mod:`.limits` (requests per uid, the site's worker caps), :mod:`.ledger` (registered jobs,
resizes and moves in flight, the state file), :mod:`.daemon` (the one thread that runs rounds and answers requests;
the policy's composition), :mod:`.state` (restart recovery), :mod:`.metrics` (Prometheus).
"""

from slurm_amoeba.daemon.config import ConfigError, DaemonConfig, load_config, parse_config
from slurm_amoeba.daemon.daemon import Daemon, compose_policy
from slurm_amoeba.daemon.observer import ClusterView, Observation, observe, satellite_parent
from slurm_amoeba.daemon.rounds import RoundSummary
from slurm_amoeba.daemon.snapshot import build_snapshot

__all__ = [
    "ClusterView",
    "ConfigError",
    "Daemon",
    "DaemonConfig",
    "Observation",
    "RoundSummary",
    "build_snapshot",
    "compose_policy",
    "load_config",
    "observe",
    "parse_config",
    "satellite_parent",
]
