"""The marks slurm_amoeba leaves on jobs: the elastic mark in the comment, the daemon's hold mark."""

from __future__ import annotations

import pytest

from slurm_amoeba.slurm.marks import (
    HoldMark,
    elastic_comment,
    parse_elastic_comment,
    parse_hold_mark,
    user_comment,
)


@pytest.mark.parametrize(
    ("comment", "expected"),
    [
        ("amoeba-elastic=2:8", (2, 8)),
        ("amoeba-elastic=2:8 my note", (2, 8)),
        ("amoeba-elastic=3:3", (3, 3)),
        ("amoeba-elastic=0:8", None),
        ("amoeba-elastic=9:8", None),
        ("amoeba-elastic=2:8x", None),
        ("note amoeba-elastic=2:8", None),
        ("amoeba-parent=12", None),
        ("", None),
    ],
)
def test_the_elastic_mark_is_read_only_at_the_start_of_the_comment(
    comment: str, expected: tuple[int, int] | None
) -> None:
    assert parse_elastic_comment(comment) == expected


def test_the_users_comment_survives_the_mark_whole() -> None:
    for mine in ("", "my note", "a: b=c  d", "amoeba-elastic=1:1"):
        comment = elastic_comment(2, 8, mine or None)
        assert parse_elastic_comment(comment) == (2, 8)
        assert user_comment(comment) == mine
    assert user_comment("plain") == "plain"


def test_the_hold_mark_round_trips_and_nothing_else_reads_as_one() -> None:
    mark = HoldMark(since=1795658764, priority=4294901758, gpus=8)
    assert mark.text() == "amoebad-held since=1795658764 priority=4294901758: waiting for 8 GPUs"
    assert parse_hold_mark(mark.text()) == mark
    assert parse_hold_mark("held by the admin") is None
    assert parse_hold_mark("") is None
