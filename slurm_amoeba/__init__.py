"""slurm_amoeba: elastic deep-learning training on Slurm.

A training job declares a range of workers; while it runs it grows into idle GPUs and shrinks when other work
needs them, without stopping. The package is layered as ``docs/DESIGN.md`` describes: ``core`` (backend-free
types), ``slurm`` (the only code that runs Slurm commands), and the layers built on them.
"""

from importlib import metadata as _metadata

try:  # one version, pyproject's, as the installed package metadata says
    __version__ = _metadata.version("slurm-amoeba")
except _metadata.PackageNotFoundError:  # a checkout that was never installed
    __version__ = "0+unknown"
