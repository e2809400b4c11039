"""The scaling benchmark's short mode (``scripts/bench-policy --scaling --short``): every size and policy measured,
its result document (rows and Markdown table) and a plot written; the loop benchmark's simulated users and the
limits it raises for them."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from benchmarks import loop, scaling
from benchmarks.policy import synthetic_cluster
from slurm_amoeba.daemon.config import AGENT_REPORT_S, Limits


def test_the_short_scaling_run_measures_every_size_and_policy_and_writes_json_and_a_plot(tmp_path: Path) -> None:
    out, picture = tmp_path / "scaling.json", tmp_path / "scaling.png"
    assert scaling.main(["--short", "--policies", "fifo,goodput", "--json", str(out), "--plot", str(picture)]) == 0
    document = json.loads(out.read_text())
    assert document["schema"] == 1 and document["benchmark"] == "scaling"
    assert document["parameters"]["policies"] == "fifo,goodput" and len(document["load_after"]) == 3
    rows = document["figures"]["rows"]
    assert sorted((row["nodes"], row["policy"]) for row in rows) == [
        (100, "fifo"),
        (100, "goodput"),
        (300, "fifo"),
        (300, "goodput"),
    ]
    assert all(row["jobs"] == 2 * row["nodes"] and row["snapshot_s"] > 0 and row["parse_s"] > 0 for row in rows)
    tables = document["tables"]
    table = tables[scaling.title(document["figures"])]
    grown = tables[scaling.growth_title(document["figures"])]
    assert table.count("\n| 100 | 200 |") == 2 and table.count("\n| 300 | 600 |") == 2, "a Markdown row per row"
    assert grown.count("| 100 -> 300 |") == 2, "each policy's growth from the smallest size"
    assert document["figures"]["gc"] == "amoebad's (tune_gc)"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_squeue_document_has_as_many_jobs_as_asked_and_every_parse_figure_is_measured() -> None:
    assert scaling.squeue_document(7)["jobs"][-1]["job_id"] == 7
    figures = scaling.bench_parse(40, 1)
    assert sorted(figures) == sorted(scaling.PARSE_FIGURES) and all(value > 0 for value in figures.values())


def test_the_next_rounds_view_keeps_the_records_of_the_jobs_that_did_not_change() -> None:
    cluster = synthetic_cluster(nodes=200, jobs=400, elastic_share=0.1)
    view = scaling.next_view(cluster, random.Random(0), 0.0)
    changed = [new for new, old in zip(view.jobs, cluster.jobs, strict=True) if new is not old]
    assert len(changed) == max(1, int(400 * scaling.MOVED_SHARE))
    assert all(new != old for new, old in zip(view.jobs, cluster.jobs, strict=True) if new is not old)


def test_the_loop_gives_the_elastic_jobs_to_simulated_users_and_leaves_the_others_alone() -> None:
    cluster = synthetic_cluster(nodes=20, jobs=40, elastic_share=0.5)
    records, owner = loop.spread_over_users(cluster.jobs, cluster.elastic, per_uid=8)
    assert sorted(set(owner.values())) == [loop.UID_BASE + i for i in range(math.ceil(len(cluster.elastic) / 8))]
    by_id = {str(r.job_id): r for r in records}
    assert all(by_id[job_id].uid == uid for job_id, uid in owner.items())
    assert all(r.uid == c.uid for r, c in zip(records, cluster.jobs, strict=True) if str(r.job_id) not in owner)


def test_the_loop_raises_only_the_limits_its_agents_per_uid_meet_and_says_which() -> None:
    base = Limits()
    same, none = loop.limits_for(base.agents_per_uid, 5.0, base)
    assert none == {} and same == base
    more, raised = loop.limits_for(400, 5.0, base)
    assert raised == {"agents_per_uid": 400.0, "requests_per_s": 210.0, "burst": 410.0}
    assert more.agents_per_uid == 400 and more.requests_per_s * AGENT_REPORT_S >= 400  # what amoebad.yaml accepts


def test_growth_is_taken_from_the_next_smaller_size_and_divided_by_the_control_pass() -> None:
    def row(nodes: int, one_pass: float, decision: float) -> dict[str, object]:
        figures = dict.fromkeys(("parse_cpu_s", "service_cpu_s", "snapshot_cpu_s"), one_pass)
        return {"policy": "fifo", "nodes": nodes, "one_pass_cpu_s": one_pass, "decision_cpu_s": decision, **figures}

    result = {"rounds": 1, "rows": [row(10, 1.0, 2.0), row(100, 20.0, 40.0), row(1000, 400.0, 1600.0)]}
    grown = {entry["nodes"]: entry for entry in scaling.growth(result)}
    assert sorted(grown) == [100, 1000] and grown[1000]["from"] == 100, "each size against the next smaller one"
    assert math.isclose(grown[100]["decision"], 20.0) and math.isclose(grown[1000]["decision"], 40.0)
    assert math.isclose(grown[100]["beyond_pass"]["decision"], 1.0), "as fast as the pass: linear on this machine"
    assert (
        math.isclose(grown[1000]["beyond_pass"]["decision"], 2.0)
        and grown[1000]["beyond_pass"]["decision"] > (grown[1000]["logn"])
    ), "twice the pass's growth is more than n log n adds"
    assert math.isclose(grown[1000]["logn"], 1.5) and math.isclose(grown[1000]["nlogn"], 15.0)
    table = scaling.growth_table(result)
    assert "| fifo | 100 -> 1000 | x 15.0 | x 20.0 |" in table
    assert table.rstrip().endswith("| x 1.50 | x 1.00 | x 1.00 | x 1.00 | x 2.00 |"), "log n, then each over the pass"


def test_the_control_pass_is_measured_on_a_rounds_view() -> None:
    assert scaling.bench_one_pass(synthetic_cluster(nodes=50, jobs=100, elastic_share=0.1), 2) > 0


def test_a_simulated_agent_follows_its_orders_a_shrink_arrives_and_a_grow_waits_for_satellites() -> None:
    moves = loop.OrderedMoves({"7": 2, "8": 4})
    assert moves.position("7", 0.0) == (2, 2)
    assert moves.order("7", 4, 10.0) == 2, "the directive's answer is the size now"
    assert moves.position("7", 10.0) == (2, 4) and moves.position("7", 1e9) == (2, 4), "growing until the run ends"
    assert moves.order("8", 1, 10.0) == 4
    assert moves.position("8", 10.0 + loop.SHRINK_LAG_S / 2) == (4, 1)
    assert moves.position("8", 10.0 + loop.SHRINK_LAG_S) == (1, 1)
    assert moves.order("7", 1, 20.0) == 2 and moves.position("7", 21.0) == (1, 1), "a later order starts from now"


def test_a_report_says_the_size_and_the_target_it_is_given() -> None:
    job = {"job_id": "7", "size": 2}
    assert loop.report_message(job, 1.0).body["size"] == 2 and loop.report_message(job, 1.0).body["target"] == 2
    moving = loop.report_message(job, 1.0, 2, 4).body
    assert moving["size"] == 2 and moving["target"] == 4 and sorted(moving["throughput"]) == ["1", "2", "3"]
