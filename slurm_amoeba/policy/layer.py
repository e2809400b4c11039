"""The base of a layer composed around a policy: the operator's drain, whole-node moves, admission at the requested
size and queue order (DESIGN.md, control flow).

A layer is itself a :class:`~slurm_amoeba.policy.types.Policy`: it answers under the inner policy's name (a layer is
not another policy), emits the inner policy's action types and its own (:attr:`PolicyLayer.adds`), and decides on
events only when the inner policy does and the layer's own answer does not change with time alone
(:attr:`PolicyLayer.changes_with_time`). Each layer fills :meth:`~slurm_amoeba.policy.types.Policy.decide`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from slurm_amoeba.policy.actions import Action
from slurm_amoeba.policy.types import Policy


@dataclasses.dataclass(frozen=True)
class PolicyLayer:
    """What every layer around a policy shares (see the module docstring).

    Attributes:
        inner: the policy the layer wraps.
        adds: (class attribute) the action types the layer adds to the inner policy's.
        changes_with_time: (class attribute) whether the layer's own answer can change while no job changes.
    """

    adds: ClassVar[frozenset[type[Action]]] = frozenset()
    changes_with_time: ClassVar[bool] = False

    inner: Policy

    @property
    def name(self) -> str:
        """The inner policy's name (a layer is not another policy)."""
        return self.inner.name

    @property
    def decides_on_events_only(self) -> bool:
        """The inner policy's answer, unless the layer's own answer changes with time."""
        return not self.changes_with_time and self.inner.decides_on_events_only

    @property
    def emits(self) -> frozenset[type[Action]]:
        """The inner policy's action types and the layer's own."""
        return self.inner.emits | self.adds
