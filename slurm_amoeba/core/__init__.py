"""Backend-free types shared by every layer: the elastic specification and the package's errors.

This layer imports neither torch nor zmq and runs no commands (DESIGN.md, layer ``core/``).
"""

from slurm_amoeba.core.errors import AmoebaError, ParseError, SpecError
from slurm_amoeba.core.runtime_env import WorkerEnv
from slurm_amoeba.core.spec import ElasticSpec

__all__ = ["AmoebaError", "ElasticSpec", "ParseError", "SpecError", "WorkerEnv"]
