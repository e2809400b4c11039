"""What a satellite is submitted as: its script, and the terms of its parent it carries (account, QOS, features).

The parent's terms come from its own squeue records; ``squeue-accounts.json`` is a held two-component job recorded on
the test cluster with ``--account=amoeba_sat --qos=amoeba_sat``.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

from slurm_amoeba.agent.config import AgentConfig
from slurm_amoeba.agent.plan import PlaceBeside
from slurm_amoeba.agent.submission import ParentTerms, satellite_options, satellite_script
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.slurm import parse_squeue_json
from tests.unit.agent.fakes import squeue

DATA = Path(__file__).resolve().parents[2] / "data" / "slurm"

CONFIG = AgentConfig(
    job_id="42",
    spec=ElasticSpec(2, 8, gpus_per_worker=2, cpus_per_worker=3, mem_per_worker_mb=1000),
    command=("python", "train.py", "--lr", "0.1 0.2"),
    state_dir=Path("/shared/amoeba-42"),
    advertise_addr="10.0.0.1",
    satellite_time_min=60,
)
TERMS = ParentTerms(account="physics", qos="high", reservation="maint", constraint="a100&ib")


def test_a_heterogeneous_parent_passes_on_its_worker_components_terms() -> None:
    records = sorted(parse_squeue_json((DATA / "squeue-accounts.json").read_text()), key=lambda r: r.het_job_offset)
    assert ParentTerms.of(records) == ParentTerms(account="amoeba_sat", qos="amoeba_sat")
    agent_part = dataclasses.replace(records[0], qos="normal", features="")
    workers = dataclasses.replace(records[1], features="a100", reservation="maint")
    assert ParentTerms.of([agent_part, workers]) == ParentTerms("amoeba_sat", "amoeba_sat", "maint", "a100")


def test_a_one_component_parent_passes_on_its_own_terms_and_a_forgotten_one_none() -> None:
    job = squeue(42, account="physics", qos="normal", features="a100|v100")
    assert ParentTerms.of([job]) == ParentTerms("physics", "normal", "", "a100|v100")
    assert ParentTerms.of([]) == ParentTerms() and ParentTerms().sbatch_args() == ()


def test_the_satellite_script_is_one_node_of_workers_in_the_elastic_partition_with_the_parents_terms() -> None:
    lines = satellite_script(CONFIG, "g3", 2, TERMS).splitlines()
    entry = [sys.executable, "-m", "slurm_amoeba.agent.entry", "satellite", "--parent", "42", "--group", "g3",
             "--ntasks", "2", "--cpus-per-task", "3", "--gpus-per-task", "2", "--log-dir", "/shared/amoeba-42", "--",
             "python", "train.py", "--lr", "0.1 0.2"]  # fmt: skip
    assert lines == [
        "#!/bin/bash",
        "# Written by slurm_amoeba.",
        "#SBATCH --job-name=amoeba-sat-42-g3",
        "#SBATCH --comment=amoeba-parent=42",
        "#SBATCH --partition=elastic",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=2",
        "#SBATCH --cpus-per-task=3",
        "#SBATCH --mem=2000M",
        "#SBATCH --time=60",
        "#SBATCH --output=/shared/amoeba-42/satellite-g3.log",
        "#SBATCH --gpus-per-task=2",
        "#SBATCH --account=physics",
        "#SBATCH --qos=high",
        "#SBATCH --reservation=maint",
        "#SBATCH --constraint=a100&ib",
        "set -euo pipefail",
        shlex.join(entry),
    ]


def test_a_configured_satellite_qos_replaces_the_parents() -> None:
    options = satellite_options(dataclasses.replace(CONFIG, satellite_qos="elastic"), "g1", 1, TERMS)
    assert [a for a in options.extra if a.startswith("--qos")] == ["--qos=elastic"]
    assert "--account=physics" in options.extra


def test_a_cpu_only_satellite_without_terms_asks_for_no_gpus_and_no_terms() -> None:
    config = dataclasses.replace(CONFIG, spec=ElasticSpec(1, 4, gpus_per_worker=0), satellite_time_min=None)
    options = satellite_options(config, "g1", 4, ParentTerms())
    assert options.extra == () and options.time_min is None and options.mem_mb is None


def test_a_satellite_excludes_the_nodes_where_the_job_lost_workers() -> None:
    lines = satellite_script(CONFIG, "g4", 1, TERMS, ("n2", "n4")).splitlines()
    assert [line for line in lines if "exclude" in line] == ["#SBATCH --exclude=n2,n4"]
    assert satellite_options(CONFIG, "g4", 1, TERMS).exclude is None


def test_a_satellite_beside_another_job_is_one_worker_on_one_shard_of_the_hosts_node() -> None:
    beside = PlaceBeside("77", "share", {"s1": 1}, "opportunistic")
    config = dataclasses.replace(CONFIG, spec=ElasticSpec(2, 8, gpus_per_worker=1, cpus_per_worker=3))
    lines = satellite_script(config, "g4", 1, TERMS, (), (beside, "s1")).splitlines()
    assert "#SBATCH --partition=share" in lines and "#SBATCH --nodelist=s1" in lines
    assert "#SBATCH --gres=shard:1" in lines and "#SBATCH --ntasks=1" in lines
    assert not any("gpus-per-task=1" in line or "constraint" in line for line in lines)
    assert "--gpus-per-task 0" in lines[-1]  # the step inherits the shard
    assert "#SBATCH --account=physics" in lines
