"""Pure scheduling policies shared by the daemon and the simulator (DESIGN.md, layer ``policy/``).

A policy is a pure function of a :class:`Snapshot` and the current time that answers with :class:`Decision` objects;
it does no I/O and reads no clock. The daemon builds snapshots from ``squeue``/``sinfo`` and the agents' reports, the
simulator from its own state; both check the answer with :func:`check_decisions` and apply it. Build a policy by
name with :func:`make_policy`.
"""

from slurm_amoeba.policy.backfill import ElasticBackfillPolicy
from slurm_amoeba.policy.check import check_decisions
from slurm_amoeba.policy.drain import DrainPolicy, drain_decisions
from slurm_amoeba.policy.fifo import FifoPolicy
from slurm_amoeba.policy.registry import DEFAULT_POLICY, make_policy, policy_knobs, policy_names
from slurm_amoeba.policy.sharing import SjfSharingPolicy, sharing_benefit
from slurm_amoeba.policy.srtf import SrtfPolicy
from slurm_amoeba.policy.tiresias import ElasticTiresiasPolicy, TiresiasPolicy, las_order
from slurm_amoeba.policy.types import (
    Decision,
    DecisionKind,
    JobInfo,
    JobPhase,
    NodeInfo,
    Policy,
    PolicyError,
    Snapshot,
)

__all__ = [
    "DEFAULT_POLICY",
    "Decision",
    "DecisionKind",
    "DrainPolicy",
    "ElasticBackfillPolicy",
    "ElasticTiresiasPolicy",
    "FifoPolicy",
    "JobInfo",
    "JobPhase",
    "NodeInfo",
    "Policy",
    "PolicyError",
    "SjfSharingPolicy",
    "Snapshot",
    "SrtfPolicy",
    "TiresiasPolicy",
    "check_decisions",
    "drain_decisions",
    "las_order",
    "make_policy",
    "policy_knobs",
    "policy_names",
    "sharing_benefit",
]
