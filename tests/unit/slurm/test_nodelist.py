"""Hostlist expansion and compression, on the shapes Slurm prints."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.slurm import compress_nodelist, expand_nodelist


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        (
            "compute-b2[1-3,5,6,8]",
            ["compute-b21", "compute-b22", "compute-b23", "compute-b25", "compute-b26", "compute-b28"],
        ),
        ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
        ("n[1-2],login", ["n1", "n2", "login"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("", []),
        ("(null)", []),
    ],
)
def test_expands_the_shapes_slurm_prints(text: str, hosts: list[str]) -> None:
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize(
    ("hosts", "text"),
    [
        (["n1", "n2", "n3", "n5"], "n[1-3,5]"),
        (["n1"], "n1"),
        (["gpu08", "gpu09", "gpu10"], "gpu[08-10]"),
        (["login", "n2", "n1"], "login,n[1-2]"),
        (["n3", "n3"], "n3"),
    ],
)
def test_compresses_to_slurm_hostlists(hosts: list[str], text: str) -> None:
    assert compress_nodelist(hosts) == text


@pytest.mark.parametrize("bad", ["n[1-3", "n1-3]", "n[a-b]", "n[3-1]", "n[[1]]", "n1,,n2", "n[1-9999999999]", "a b"])
def test_rejects_malformed_hostlists_with_a_parse_error(bad: str) -> None:
    with pytest.raises(ParseError, match="hostlist"):
        expand_nodelist(bad)


names = st.builds(
    lambda prefix, number, width: f"{prefix}{str(number).zfill(width)}",
    st.sampled_from(["n", "gpu", "rack1-n", "c"]),
    st.integers(0, 300),
    st.sampled_from([0, 0, 3]),
)


@given(st.lists(names, max_size=40))
def test_compress_then_expand_gives_the_same_hosts(hosts: list[str]) -> None:
    assert set(expand_nodelist(compress_nodelist(hosts))) == set(hosts)


@given(st.text(max_size=60))
def test_arbitrary_text_raises_only_parse_error(text: str) -> None:
    try:
        expand_nodelist(text)
    except ParseError:
        pass
