"""Benchmarks and studies of slurm_amoeba: run them through ``scripts/bench-*`` and ``scripts/sim-report``.

They live outside the package on purpose: nothing here is installed or importable as ``slurm_amoeba.*``.
Each script prints a table and writes its result document (``record.py``); docs/contributing.md says what each
measures, and ``scripts/render-results`` renders docs/results.md from the documents kept in docs/results/.
"""
