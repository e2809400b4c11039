"""The job agent: one per elastic job, for the job's whole life (DESIGN.md, layer ``agent/``).

It hosts the runtime's rendezvous store, runs the worker groups (one Slurm step each, in the main allocation or in
a satellite job), grows and shrinks on directive, handles preemption, and reports progress and throughput.
"""
