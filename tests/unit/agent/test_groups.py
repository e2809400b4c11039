"""Worker-group bookkeeping: satellite names and which workers leave on a shrink."""

from __future__ import annotations

from slurm_amoeba.agent.groups import (
    GroupState,
    WorkerGroup,
    choose_leavers,
    worker_ids,
)
from slurm_amoeba.slurm.satellite import parent_comment, parse_satellite_name, satellite_name


def group(name: str, n: int, state: GroupState, at: float, satellite: bool = True) -> WorkerGroup:
    return WorkerGroup(name, satellite, worker_ids(name, n), 100 + int(name[1:]), state, at)


def test_satellite_names_link_to_their_parent() -> None:
    assert satellite_name("42", "g3") == "amoeba-sat-42-g3" and parent_comment("42") == "amoeba-parent=42"
    assert parse_satellite_name("amoeba-sat-42-g3") == ("42", "g3")
    assert parse_satellite_name("amoeba-sat-x-g3") is None and parse_satellite_name("train") is None


def test_the_main_group_never_leaves() -> None:
    groups = [group("g0", 2, GroupState.RUNNING, 0.0, satellite=False)]
    assert choose_leavers(groups, 1) == []


def test_pending_satellites_go_first_then_the_newest_running_ones() -> None:
    main = group("g0", 2, GroupState.RUNNING, 0.0, satellite=False)
    old, new, pending = (
        group("g1", 2, GroupState.RUNNING, 1.0),
        group("g2", 2, GroupState.RUNNING, 2.0),
        group("g3", 1, GroupState.PENDING, 3.0),
    )
    chosen = choose_leavers([main, old, new, pending], 3)
    assert [(g.name, w) for g, w in chosen] == [("g3", ["g3-0"]), ("g2", ["g2-0", "g2-1"])]


def test_whole_groups_are_preferred_and_a_remainder_takes_part_of_one() -> None:
    a, b = group("g1", 2, GroupState.RUNNING, 1.0), group("g2", 4, GroupState.RUNNING, 2.0)
    chosen = choose_leavers([a, b], 3)
    assert [(g.name, w) for g, w in chosen] == [("g1", ["g1-0", "g1-1"]), ("g2", ["g2-3"])]


def test_workers_already_leaving_are_not_chosen_twice() -> None:
    a = group("g1", 2, GroupState.RUNNING, 1.0)
    a.leaving.add("g1-1")
    assert [(g.name, w) for g, w in choose_leavers([a], 2)] == [("g1", ["g1-0"])]
    assert a.active_workers == ["g1-0"]
