"""The elastic runtime: what runs inside each training process (DESIGN.md, layer ``runtime/``).

A DDP training script keeps its loop and changes about five lines (:mod:`~slurm_amoeba.runtime.port`,
``docs/port.md``); or it moves its loop into ``train(state)``::

    from slurm_amoeba import runtime as amoeba

    amoeba.init()                                   # join the job (reads the AMOEBA_* environment)
    model, optimizer = Net(), torch.optim.SGD(...)  # warm-up happens here, while the job keeps training
    sampler = amoeba.ElasticSampler(len(dataset), global_batch=256, seed=0)
    loader = amoeba.ElasticDataLoader(dataset, sampler, num_workers=2, persistent_workers=True)
    state = amoeba.TorchState(model, optimizer, sampler)

    def train(state):
        while state.epoch < 10:
            for step in loader:
                for (x, y), weight in step:
                    (loss_fn(model(x), y) * weight).backward()
                state.step()                        # collective: all-reduce + optimizer step
                if state.step_index % 50 == 0:
                    state.commit()                  # collective: in-memory commit

    amoeba.run(train, state)

The worker side (``worker``, ``group``, ``transfer``, ``state``, ``sampler``, ``loader``, ``gradients``) runs in each
training process; ``run()`` hands the state, and through it the sampler and the loader, the current generation
(``topology``). The coordinator side (:class:`Coordinator` over the pure ``membership``) hosts the store and
decides generations; local mode (:mod:`slurm_amoeba.local`) and the Slurm agent both drive it. The two sides share
only ``protocol`` (store keys and JSON messages), ``errors`` and ``planner``. See ``docs/runtime.md``.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slurm_amoeba.runtime.adaptive import AdaptiveBatch
    from slurm_amoeba.runtime.coordinator import Coordinator, CoordinatorConfig
    from slurm_amoeba.runtime.errors import (
        BatchPlanError,
        JobLostError,
        MembershipChanged,
        RuntimeConfigError,
        RuntimeTimeout,
        StateError,
        WorkerFailure,
    )
    from slurm_amoeba.runtime.loader import ElasticDataLoader, Step
    from slurm_amoeba.runtime.membership import Phase, WorkerStatus
    from slurm_amoeba.runtime.planner import GlobalBatchPlanner, StepPlan
    from slurm_amoeba.runtime.port import ElasticLoop, PortLoader, init_process_group
    from slurm_amoeba.runtime.port_model import ElasticDDP
    from slurm_amoeba.runtime.result import GenerationTiming, RunResult, RunStatus
    from slurm_amoeba.runtime.sampler import ElasticSampler, Progress, StepAssignment
    from slurm_amoeba.runtime.shared_device import SharedDevice
    from slurm_amoeba.runtime.state import StepDriver, TorchState
    from slurm_amoeba.runtime.topology import Generation, Topology
    from slurm_amoeba.runtime.view import CoordinatorView, ThroughputStats
    from slurm_amoeba.runtime.worker import WorkerRuntime, get_runtime, init, run

_WHERE = {
    "AdaptiveBatch": "adaptive",
    "BatchPlanError": "errors",
    "Coordinator": "coordinator",
    "CoordinatorConfig": "coordinator",
    "CoordinatorView": "view",
    "ElasticDataLoader": "loader",
    "ElasticDDP": "port_model",
    "ElasticLoop": "port",
    "ElasticSampler": "sampler",
    "Generation": "topology",
    "GenerationTiming": "result",
    "GlobalBatchPlanner": "planner",
    "JobLostError": "errors",
    "MembershipChanged": "errors",
    "Phase": "membership",
    "PortLoader": "port",
    "Progress": "sampler",
    "RunResult": "result",
    "RunStatus": "result",
    "RuntimeConfigError": "errors",
    "RuntimeTimeout": "errors",
    "SharedDevice": "shared_device",
    "StateError": "errors",
    "Step": "loader",
    "StepAssignment": "sampler",
    "StepDriver": "state",
    "StepPlan": "planner",
    "ThroughputStats": "view",
    "Topology": "topology",
    "TorchState": "state",
    "WorkerFailure": "errors",
    "WorkerRuntime": "worker",
    "WorkerStatus": "membership",
    "get_runtime": "worker",
    "init": "worker",
    "init_process_group": "port",
    "run": "worker",
}

__all__ = [
    "AdaptiveBatch",
    "BatchPlanError",
    "Coordinator",
    "CoordinatorConfig",
    "CoordinatorView",
    "ElasticDDP",
    "ElasticDataLoader",
    "ElasticLoop",
    "ElasticSampler",
    "Generation",
    "GenerationTiming",
    "GlobalBatchPlanner",
    "JobLostError",
    "MembershipChanged",
    "Phase",
    "PortLoader",
    "Progress",
    "RunResult",
    "RunStatus",
    "RuntimeConfigError",
    "RuntimeTimeout",
    "SharedDevice",
    "StateError",
    "Step",
    "StepAssignment",
    "StepDriver",
    "StepPlan",
    "ThroughputStats",
    "Topology",
    "TorchState",
    "WorkerFailure",
    "WorkerRuntime",
    "WorkerStatus",
    "get_runtime",
    "init",
    "init_process_group",
    "run",
]


def __getattr__(name: str) -> object:
    """Import the module that defines ``name`` on first use (PEP 562), so that importing one side of the runtime
    (e.g. ``slurm_amoeba.runtime.coordinator`` in the job's agent) does not import the other."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'slurm_amoeba.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"slurm_amoeba.runtime.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
