"""Reading a site's scheduling settings from a slurm.conf."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.policy import make_policy
from slurm_amoeba.policy.slurm_baseline import UNLIMITED_S, SlurmPartition
from slurm_amoeba.sim.slurmconf import parse_slurm_time, read_slurm_conf

# The scheduling lines of the local test cluster's slurm.conf (scripts/slurm-cluster), with a comment and noise.
_LOCAL = """\
ClusterName=amoeba
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
PreemptType=preempt/partition_prio
PreemptMode=CANCEL   # cluster default
NodeName=n[1-4] CPUs=8 RealMemory=8000 Gres=gpu:4 State=UNKNOWN
PartitionName=batch Nodes=n[1-4] Default=YES PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
PartitionName=elastic Nodes=n[1-4] Default=NO PriorityTier=1 PreemptMode=CANCEL GraceTime=10 MaxTime=INFINITE
"""


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 5400.0),
        ("1:30", 90.0),
        ("1:00:00", 3600.0),
        ("2-00:00:00", 172_800.0),
        ("1-2", 93_600.0),
        ("1-2:3", 93_780.0),
        ("UNLIMITED", UNLIMITED_S),
    ],
)
def test_slurm_time_formats(text: str, seconds: float) -> None:
    assert parse_slurm_time(text) == seconds


def test_the_local_clusters_conf_gives_basic_priority_partition_tiers_and_its_shape(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(_LOCAL)
    site = read_slurm_conf(conf)
    assert site.knobs["weight_age"] == site.knobs["weight_job_size"] == 0.0  # no PriorityType: priority/basic
    assert site.knobs["partitions"] == (
        SlurmPartition("batch", 10, "off", 0.0),
        SlurmPartition("elastic", 1, "cancel", 10.0),
    )
    assert (site.grace_time, site.nodes, site.gpus_per_node) == (10.0, 4, 4)
    make_policy("slurm", **site.knobs)


def test_multifactor_weights_and_backfill_parameters_are_read(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "PriorityType=priority/multifactor\nPriorityWeightAge=500 PriorityWeightJobSize=2000\n"
        "PriorityMaxAge=1-0\nPriorityFavorSmall=YES\nSchedulerParameters=bf_window=60,bf_max_job_test=20\n"
        "PartitionName=p PriorityTier=3\n"
    )
    knobs = read_slurm_conf(conf).knobs
    assert {key: knobs[key] for key in ("weight_age", "weight_job_size", "max_age_s", "favor_small")} == {
        "weight_age": 500.0,
        "weight_job_size": 2000.0,
        "max_age_s": 86400.0,
        "favor_small": True,
    }
    assert (knobs["bf_window_s"], knobs["bf_max_job_test"]) == (3600.0, 20)
    # Without PreemptType=preempt/partition_prio no partition preempts.
    assert knobs["partitions"] == (SlurmPartition("p", 3, "off", 0.0),)


def test_a_value_that_cannot_be_read_names_the_file_and_line(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nPriorityMaxAge=soon\n")
    with pytest.raises(ParseError, match=r"slurm.conf: line 2: 'soon' is not a Slurm time"):
        read_slurm_conf(conf)
    conf.write_text("PartitionName=p PreemptMode=SUSPEND\n")
    with pytest.raises(ParseError, match=r"line 1: PreemptMode=SUSPEND is not modelled"):
        read_slurm_conf(conf)
