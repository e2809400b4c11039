"""Benchmarks and studies of slurm_amoeba: run them through ``scripts/bench-*`` and ``scripts/sim-report``.

They live outside the package on purpose: nothing here is installed or importable as ``slurm_amoeba.*``.
Each script prints a table and writes JSON; the README says what each measures.
"""
