#!/bin/bash
# Written by slurm_amoeba.
#SBATCH --job-name="job with space"
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH hetjob
#SBATCH --partition=batch
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:2
set -euo pipefail
srun --het-group=0 amoeba-agent --arg 'it'"'"'s'
echo '$NOT_EXPANDED'
