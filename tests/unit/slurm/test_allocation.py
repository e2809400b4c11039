"""Reading the batch script's allocation from Slurm's variables (recorded from Slurm 22.05 jobs)."""

from __future__ import annotations

import pytest

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.slurm.allocation import parse_tasks_per_node, worker_allocation

# `sbatch --ntasks=2 --gpus-per-task=1` with `#SBATCH --elastic=2:8` (the SPANK plugin), as the batch script saw it.
PLAIN = {
    "SLURM_JOB_ID": "6",
    "SLURM_CPUS_ON_NODE": "2",
    "SLURM_GPUS_ON_NODE": "2",
    "SLURM_GPUS_PER_TASK": "1",
    "SLURM_JOB_CPUS_PER_NODE": "2",
    "SLURM_NNODES": "1",
    "SLURM_NTASKS": "2",
    "SLURM_TASKS_PER_NODE": "2",
}
# `sbatch --ntasks=1 --cpus-per-task=1 : --ntasks=2 --cpus-per-task=1 --gpus-per-task=1` (amoeba-sbatch's shape).
HET = {
    "SLURM_JOB_ID": "8",
    "SLURM_HET_SIZE": "2",
    "SLURM_NTASKS": "1",
    "SLURM_NTASKS_HET_GROUP_0": "1",
    "SLURM_NTASKS_HET_GROUP_1": "2",
    "SLURM_GPUS_PER_TASK_HET_GROUP_1": "1",
    "SLURM_CPUS_PER_TASK_HET_GROUP_1": "1",
    "SLURM_TASKS_PER_NODE": "1",
}


@pytest.mark.parametrize(("text", "tasks"), [("1", 1), ("2", 2), ("2(x3),1", 7), ("4(x2)", 8), ("1,1,1", 3)])
def test_tasks_per_node_adds_up_compressed_counts(text: str, tasks: int) -> None:
    assert parse_tasks_per_node(text) == tasks


@pytest.mark.parametrize("text", ["", "x", "2(x)", "2(3)", "-1"])
def test_malformed_tasks_per_node_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError, match="SLURM_TASKS_PER_NODE"):
        parse_tasks_per_node(text)


def test_plain_sbatch_job_holds_its_workers_in_its_only_component() -> None:
    alloc = worker_allocation(PLAIN)
    assert (alloc.job_id, alloc.het_group, alloc.tasks, alloc.gpus_per_task) == ("6", None, 2, 1)
    assert alloc.cpus_per_task is None and alloc.gpus_on_batch_node == 2


def test_plain_job_without_a_task_count_counts_tasks_per_node() -> None:
    alloc = worker_allocation({"SLURM_JOB_ID": "7", "SLURM_TASKS_PER_NODE": "1", "SLURM_JOB_CPUS_PER_NODE": "1"})
    assert (alloc.tasks, alloc.gpus_per_task, alloc.gpus_on_batch_node) == (1, None, 0)


def test_heterogeneous_job_holds_its_workers_in_component_1() -> None:
    alloc = worker_allocation(HET)
    assert (alloc.het_group, alloc.tasks, alloc.gpus_per_task, alloc.cpus_per_task) == (1, 2, 1, 1)


def test_typed_gpus_per_task_counts_the_gpus() -> None:
    assert worker_allocation({**PLAIN, "SLURM_GPUS_PER_TASK": "a100:2"}).gpus_per_task == 2


def test_outside_a_job_or_with_garbage_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="SLURM_JOB_ID"):
        worker_allocation({})
    with pytest.raises(ParseError, match="SLURM_NTASKS"):
        worker_allocation({**PLAIN, "SLURM_NTASKS": "two"})
    with pytest.raises(ParseError, match="SLURM_GPUS_PER_TASK"):
        worker_allocation({**PLAIN, "SLURM_GPUS_PER_TASK": "gpu:x"})
