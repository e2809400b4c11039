"""The job environment contract (``core/jobenv.py``) and its C mirror (``spank/src/amoeba_env.h``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.core.jobenv import DEFAULT_GPUS_PER_WORKER, JobEnv
from slurm_amoeba.core.spec import ElasticSpec

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "spank" / "src" / "amoeba_env.h"
_DEFINE = re.compile(r'^#define\s+(AMOEBA_ENV_\w+)\s+"([^"]*)"\s*$', re.MULTILINE)


def header_names() -> dict[str, str]:
    """Macro -> variable name for every string ``#define`` in the header."""
    return dict(_DEFINE.findall(HEADER.read_text()))


def test_header_names_every_variable_of_jobenv() -> None:
    missing = set(JobEnv.names()) - set(header_names().values())
    assert not missing, f"{HEADER} lacks {sorted(missing)}: add a #define AMOEBA_ENV_... for each"


def test_every_variable_of_the_header_is_in_jobenv() -> None:
    extra = set(header_names().values()) - set(JobEnv.names())
    assert not extra, f"{HEADER} names {sorted(extra)}, which JobEnv does not know"


def test_header_macros_are_named_after_their_variables() -> None:
    for macro, name in header_names().items():
        assert macro == "AMOEBA_ENV_" + name.removeprefix("AMOEBA_"), (macro, name)


def test_plugin_sources_spell_no_variable_outside_the_header() -> None:
    for source in sorted((REPO / "spank" / "src").glob("*.[ch]")):
        if source == HEADER:
            continue
        literals = re.findall(r'"(AMOEBA_[A-Z_]+)"', source.read_text())
        assert not literals, f"{source.name} spells {literals}; use the AMOEBA_ENV_* macros of amoeba_env.h"


def test_empty_environment_gives_the_defaults() -> None:
    env = JobEnv.from_environ({})
    assert env == JobEnv()
    assert env.gpus_per_worker == DEFAULT_GPUS_PER_WORKER == 1
    assert env.elastic_partition == "elastic"
    assert env.elastic_range is None
    assert env.to_environ() == {
        "AMOEBA_ELASTIC_PARTITION": "elastic",
        "AMOEBA_GPUS_PER_WORKER": "1",
        "AMOEBA_CPUS_PER_WORKER": "1",
    }


def test_round_trip_through_the_environment_keeps_every_field() -> None:
    env = JobEnv(
        min_workers=2,
        max_workers=8,
        elastic_partition="spot",
        gpus_per_worker=0,
        cpus_per_worker=4,
        daemon_endpoint="tcp://10.0.0.1:6820",
        daemon_uid=990,
        state_dir="/scratch/a b",
        parent_job="123",
        job_folder="/jobs/123",
        share="opportunistic",
        share_partition="pairs",
    )
    assert JobEnv.from_environ(env.to_environ()) == env
    assert set(env.to_environ()) == set(JobEnv.names())


def test_a_sharing_mode_that_is_not_one_is_refused_naming_the_variable_and_the_modes() -> None:
    with pytest.raises(SpecError, match=r"AMOEBA_SHARE='always' is not a sharing mode: give one of guaranteed, opp"):
        JobEnv.from_environ({"AMOEBA_SHARE": "always"})
    assert JobEnv.from_environ({"AMOEBA_SHARE": ""}).share is None


def test_empty_values_mean_unset() -> None:
    env = JobEnv.from_environ({"AMOEBA_GPUS_PER_WORKER": "", "AMOEBA_DAEMON_ENDPOINT": "", "AMOEBA_ELASTIC_MIN": ""})
    assert env == JobEnv()


def test_min_alone_means_a_fixed_size() -> None:
    assert JobEnv.from_environ({"AMOEBA_ELASTIC_MIN": "3"}).elastic_range == "3:3"


def test_other_variables_are_ignored() -> None:
    assert JobEnv.from_environ({"AMOEBA_ELASTIC_MINX": "x", "PATH": "/bin"}) == JobEnv()


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"AMOEBA_GPUS_PER_WORKER": "two"}, "AMOEBA_GPUS_PER_WORKER='two' is not a whole number"),
        ({"AMOEBA_GPUS_PER_WORKER": "-1"}, "AMOEBA_GPUS_PER_WORKER='-1' is not a whole number"),
        ({"AMOEBA_CPUS_PER_WORKER": "0"}, "AMOEBA_CPUS_PER_WORKER=0 is invalid"),
        ({"AMOEBA_ELASTIC_MIN": "0"}, "AMOEBA_ELASTIC_MIN=0 is invalid"),
        ({"AMOEBA_ELASTIC_MIN": "2.5"}, "AMOEBA_ELASTIC_MIN='2.5'"),
        ({"AMOEBA_ELASTIC_MIN": "٣"}, "AMOEBA_ELASTIC_MIN='٣'"),
        ({"AMOEBA_ELASTIC_MAX": "4"}, "AMOEBA_ELASTIC_MAX=4 is set but AMOEBA_ELASTIC_MIN is not"),
        ({"AMOEBA_ELASTIC_MIN": "5", "AMOEBA_ELASTIC_MAX": "2"}, "AMOEBA_ELASTIC_MAX=2 is below AMOEBA_ELASTIC_MIN=5"),
    ],
)
def test_bad_values_are_refused_naming_variable_and_value(env: dict[str, str], needle: str) -> None:
    with pytest.raises(SpecError) as info:
        JobEnv.from_environ(env)
    assert needle in str(info.value)


def test_values_that_cannot_travel_in_an_environment_are_refused() -> None:
    with pytest.raises(SpecError, match="AMOEBA_STATE_DIR='a\\\\nb'"):
        JobEnv(state_dir="a\nb")
    with pytest.raises(SpecError, match="AMOEBA_ELASTIC_PARTITION=''"):
        JobEnv(elastic_partition="")


def test_for_spec_carries_range_and_resources() -> None:
    spec = ElasticSpec(min_workers=2, max_workers=6, gpus_per_worker=2, cpus_per_worker=3)
    env = JobEnv.for_spec(spec, elastic_partition="spot", daemon_endpoint="tcp://h:1")
    assert env.to_environ() == {
        "AMOEBA_ELASTIC_MIN": "2",
        "AMOEBA_ELASTIC_MAX": "6",
        "AMOEBA_ELASTIC_PARTITION": "spot",
        "AMOEBA_GPUS_PER_WORKER": "2",
        "AMOEBA_CPUS_PER_WORKER": "3",
        "AMOEBA_DAEMON_ENDPOINT": "tcp://h:1",
    }
    assert env.elastic_range == "2:6"
