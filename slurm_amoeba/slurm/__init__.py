"""The only code in slurm_amoeba that speaks to Slurm (DESIGN.md, layer ``slurm/``).

It runs Slurm's commands (argv lists with timeouts, never a shell), parses their output into typed records,
and renders batch scripts. It decides nothing: the agent, the daemon and the launcher do that.
"""

from slurm_amoeba.slurm.client import CliSlurmClient, GpuCapacity, SlurmClient
from slurm_amoeba.slurm.nodelist import compress_nodelist, expand_nodelist
from slurm_amoeba.slurm.parsers import (
    SlurmReportedError,
    parse_gpu_indices,
    parse_gres_count,
    parse_nodes_json,
    parse_sacct_json,
    parse_sbatch_reply,
    parse_sinfo_json,
    parse_squeue_json,
    parse_step_lines,
)
from slurm_amoeba.slurm.records import AccountingRecord, JobRecord, JobState, NodeRecord, StepRecord
from slurm_amoeba.slurm.release import SlurmRelease
from slurm_amoeba.slurm.runner import CommandResult, SlurmCommandError, run_command
from slurm_amoeba.slurm.script import SubmitOptions, het_submit_args, render_batch_script, sbatch_argv

__all__ = [
    "AccountingRecord",
    "CliSlurmClient",
    "CommandResult",
    "GpuCapacity",
    "JobRecord",
    "JobState",
    "NodeRecord",
    "SlurmClient",
    "SlurmCommandError",
    "SlurmRelease",
    "SlurmReportedError",
    "StepRecord",
    "SubmitOptions",
    "compress_nodelist",
    "expand_nodelist",
    "het_submit_args",
    "parse_gpu_indices",
    "parse_gres_count",
    "parse_nodes_json",
    "parse_sacct_json",
    "parse_sbatch_reply",
    "parse_sinfo_json",
    "parse_squeue_json",
    "parse_step_lines",
    "render_batch_script",
    "run_command",
    "sbatch_argv",
]
