"""ElasticExecutor's parameters: its own names and submitit's spellings, every value checked before submitting."""

from __future__ import annotations

from typing import Any

import pytest

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.launcher.parameters import ElasticParameters, parse_memory_mb, updated


def given(**kwargs: Any) -> ElasticParameters:
    return updated(ElasticParameters(), kwargs)


def test_submitits_spellings_land_on_the_elastic_parameters() -> None:
    p = given(
        timeout_min=90,
        slurm_partition="gpu",
        slurm_account="lab",
        slurm_qos="high",
        slurm_constraint="a100",
        slurm_exclude="n3",
        slurm_setup=["module load cuda", "export X=1"],
        slurm_additional_parameters={"mail_type": "END", "requeue": True, "no_requeue": False},
        mem_gb=1.5,
        cpus_per_task=4,
        gpus_per_task=2,
        name="train",
    )
    assert (p.time, p.partition, p.account, p.qos, p.job_name) == (90, "gpu", "lab", "high", "train")
    assert (p.mem_per_worker, p.cpus_per_worker, p.gpus_per_worker) == (1536, 4, 2)
    assert p.setup == ("module load cuda", "export X=1")
    assert p.job_terms() == ("--account=lab", "--qos=high")
    assert p.worker_terms() == ("--constraint=a100", "--exclude=n3")
    assert p.additional_args() == ("--mail-type=END", "--requeue")


@pytest.mark.parametrize(
    ("text", "mib"),
    [("32G", 32768), ("32g", 32768), ("512M", 512), ("32000", 32000), ("1T", 1048576), ("1536K", 2), ("1.5GB", 1536)],
)
def test_memory_is_read_as_slurm_writes_it(text: str, mib: int) -> None:
    assert parse_memory_mb(text) == mib
    assert given(slurm_mem=text).spec().mem_per_worker_mb == mib


@pytest.mark.parametrize("bad", ["32 gigs", "-1G", "G", True, -5])
def test_a_memory_that_is_not_a_size_is_named(bad: Any) -> None:
    with pytest.raises(SpecError, match="mem_per_worker="):
        given(mem_per_worker=bad)


def test_an_unknown_key_lists_every_valid_key_with_its_default_and_submitits_spellings() -> None:
    with pytest.raises(SpecError) as caught:
        given(min_wrokers=2)
    message = str(caught.value)
    assert message.startswith("ElasticExecutor.update_parameters: unknown key 'min_wrokers'; valid keys")
    assert "min_workers=1" in message and "mem_per_worker=0" in message and "timeout_min" in message


def test_another_slurm_option_is_pointed_at_additional_parameters() -> None:
    with pytest.raises(SpecError, match=r"additional_parameters=\{'licenses': \.\.\.\}"):
        given(slurm_licenses="matlab:1")


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("nodes", "sized in workers"),
        ("gpus_per_node", "gpus_per_worker"),
        ("slurm_comment", "elastic mark"),
        ("slurm_array_parallelism", "one elastic job per item"),
        ("slurm_srun_args", "agent starts the workers"),
    ],
)
def test_what_means_nothing_for_an_elastic_job_is_refused_with_the_reason(key: str, reason: str) -> None:
    with pytest.raises(SpecError, match=f"'{key}' is not supported: .*{reason}"):
        given(**{key: 1})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"setup": "module load cuda"}, "not a list of shell lines"),
        ({"setup": ["a\nb"]}, "not one line"),
        ({"additional_parameters": {"time": "1:00:00"}}, "use the parameter time instead"),
        ({"additional_parameters": {"output": "x"}}, "set by the executor"),
        ({"additional_parameters": {"Bad Key": 1}}, "not an sbatch option name"),
        ({"additional_parameters": {"gres": "gpu:1\n#SBATCH -p x"}}, "on one line"),
        ({"timeout_min": 0}, "give whole minutes"),
        ({"slurm_time": "an hour"}, "is not a Slurm time"),
        ({"account": ""}, "non-empty string"),
        ({"time": 10, "timeout_min": 20}, "time is given twice"),
        ({"min_workers": 5, "max_workers": 2}, "max_workers=2 is below min_workers=5"),
        ({"min_workers": "2"}, "min_workers='2' is invalid"),
        ({"mem_gb": "lots"}, "mem_gb='lots'"),
    ],
)
def test_bad_values_are_refused_with_the_value_and_the_fix(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        given(**kwargs)


@pytest.mark.parametrize(("value", "minutes"), [(90, 90), ("1:00:00", 60), ("2-00:00:00", 2880), ("45", 45)])
def test_the_time_limit_takes_minutes_or_slurms_time_formats(value: int | str, minutes: int) -> None:
    assert given(timeout_min=value).time == minutes


def test_a_refused_update_leaves_the_parameters_as_they_were() -> None:
    before = given(min_workers=2, max_workers=4)
    with pytest.raises(SpecError):
        updated(before, {"max_workers": 1})
    assert (before.min_workers, before.max_workers) == (2, 4)


def test_share_takes_a_mode_or_true_and_refuses_anything_else_naming_the_modes() -> None:
    assert (given().share, given(share=True).share, given(share="opportunistic").share) == (
        None,
        "guaranteed",
        "opportunistic",
    )
    assert given(share=False).share is None and given(share_partition="pairs").share_partition == "pairs"
    with pytest.raises(SpecError, match=r"share='always' is not a sharing mode: give one of guaranteed, opportunistic"):
        given(share="always")
