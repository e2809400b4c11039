"""slurm_amoeba: elastic deep-learning training on Slurm.

A training job declares a range of workers; while it runs it grows into idle GPUs and shrinks when other work
needs them, without stopping. The package is layered as ``../shared/DESIGN.md`` describes: ``core`` (backend-free
types), ``slurm`` (the only code that runs Slurm commands), and the layers built on them.
"""

__version__ = "0.1.0"
