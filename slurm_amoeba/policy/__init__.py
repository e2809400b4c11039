"""Pure scheduling policies shared by the daemon and the simulator (DESIGN.md, layer ``policy/``).

A policy is a pure function of a :class:`Snapshot` and the current time that answers with typed actions
(:mod:`slurm_amoeba.policy.actions`: :class:`Start`, :class:`Resize`, :class:`Preempt`, ...); it does no I/O and
reads no clock. The daemon builds snapshots from ``squeue``/``sinfo`` and the agents' reports, the simulator from its
own state; both check the answer with :func:`check_actions` and apply it through their executor. Build a policy by
name with :func:`make_policy`.
"""

from slurm_amoeba.policy.actions import (
    ACTION_TYPES,
    Action,
    Hold,
    Move,
    Place,
    Preempt,
    Release,
    Resize,
    SetPriority,
    Share,
    Start,
    action_name,
)
from slurm_amoeba.policy.backfill import ElasticBackfillPolicy
from slurm_amoeba.policy.check import check_actions
from slurm_amoeba.policy.drain import DrainPolicy, drain_actions
from slurm_amoeba.policy.fifo import FifoPolicy
from slurm_amoeba.policy.pairing import ShareMode, sharing_benefit
from slurm_amoeba.policy.registry import DEFAULT_POLICY, make_policy, policy_knobs, policy_names
from slurm_amoeba.policy.sharing import PairingPolicy, SjfSharingPolicy
from slurm_amoeba.policy.srtf import SrtfPolicy
from slurm_amoeba.policy.tiresias import ElasticTiresiasPolicy, TiresiasPolicy, las_order
from slurm_amoeba.policy.types import (
    JobInfo,
    JobPhase,
    MicroBatch,
    NodeInfo,
    Policy,
    PolicyError,
    Snapshot,
)

__all__ = [
    "ACTION_TYPES",
    "DEFAULT_POLICY",
    "Action",
    "DrainPolicy",
    "ElasticBackfillPolicy",
    "ElasticTiresiasPolicy",
    "FifoPolicy",
    "Hold",
    "JobInfo",
    "JobPhase",
    "MicroBatch",
    "Move",
    "NodeInfo",
    "PairingPolicy",
    "Place",
    "Policy",
    "PolicyError",
    "Preempt",
    "Release",
    "Resize",
    "SetPriority",
    "Share",
    "ShareMode",
    "SjfSharingPolicy",
    "Snapshot",
    "SrtfPolicy",
    "Start",
    "TiresiasPolicy",
    "action_name",
    "check_actions",
    "drain_actions",
    "las_order",
    "make_policy",
    "policy_knobs",
    "policy_names",
    "sharing_benefit",
]
