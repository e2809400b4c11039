#!/bin/bash
# An elastic job for amoeba-sbatch: `amoeba-sbatch --elastic 2:8 examples/job.sh [training options]`.
# amoeba-run becomes the job's agent and runs one worker per GPU of the allocation, growing and shrinking.
# `exec`: the agent, not this shell, then receives Slurm's time-limit warning (--signal=B:USR1) and requeues the job.
#SBATCH --job-name=elastic-mlp
# The batch script runs in the directory it was submitted from (the repository root here).
exec amoeba-run python examples/elastic_mlp.py "$@"
