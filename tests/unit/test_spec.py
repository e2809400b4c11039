"""The elastic specification: MIN[:MAX] parsing and validation."""

from __future__ import annotations

import pytest

from slurm_amoeba.core import ElasticSpec, SpecError


@pytest.mark.parametrize(("text", "low", "high"), [("2:8", 2, 8), ("3", 3, 3), (" 1 : 4 ", 1, 4)])
def test_parses_worker_ranges(text: str, low: int, high: int) -> None:
    spec = ElasticSpec.parse(text)
    assert (spec.min_workers, spec.max_workers) == (low, high)
    assert spec.is_elastic == (low != high)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("5:2", "max_workers=2 is below min_workers=5.*2:5"),
        ("0", "min_workers=0"),
        ("abc", "'abc' is not MIN"),
        ("2:", "not MIN"),
        ("-1:3", "not MIN"),
    ],
)
def test_bad_ranges_name_the_value_and_the_fix(text: str, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        ElasticSpec.parse(text)


def test_resources_are_validated() -> None:
    with pytest.raises(SpecError, match="cpus_per_worker=0"):
        ElasticSpec(1, 2, cpus_per_worker=0)
