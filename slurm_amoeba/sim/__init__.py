"""The trace-driven simulator (DESIGN.md, the simulation flow).

Workloads (:mod:`~slurm_amoeba.sim.workload`) are replayed by the discrete-event engine
(:mod:`~slurm_amoeba.sim.engine`) on a model cluster whose job speeds come from measured traces
(:mod:`~slurm_amoeba.sim.application`, :mod:`~slurm_amoeba.sim.interference`); the very policies of
``slurm_amoeba.policy`` decide; :mod:`~slurm_amoeba.sim.metrics` and :mod:`~slurm_amoeba.sim.report` summarize.
"""
