"""A site's history as input: reading sacct exports recorded on the local cluster, and ``amoeba-sim site``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_amoeba.cli.sim import main
from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.sim.accounting import PARSABLE_FIELDS, load_history
from slurm_amoeba.sim.engine import SimConfig
from slurm_amoeba.sim.site import BASELINE, ELASTIC, SiteOptions, compare_site

# Recorded on the local 4 x 4-GPU cluster: 20 sleep jobs of 1-4 GPUs with 1-2 minute limits, some cancelled by
# other tests while pending or running (sacct --json -a --name sim-history; sacct -P -X with the same jobs).
DATA = Path(__file__).parent / "data"
JSON, PARSABLE, CONF = DATA / "sacct-local.json", DATA / "sacct-local.txt", DATA / "slurm-local.conf"


def test_both_export_forms_give_the_same_jobs() -> None:
    from_json, from_text = load_history(JSON), load_history(PARSABLE)
    strip = [(job.name, job.submit_time, job.requested_workers, job.duration, job.time_limit) for job in from_json.jobs]
    assert strip == [
        (job.name, job.submit_time, job.requested_workers, job.duration, job.time_limit) for job in from_text.jobs
    ]
    assert (from_json.never_started, from_json.unfinished, from_json.without_gpus) == (2, 0, 0)
    assert len(from_json.jobs) == 18


def test_jobs_map_submit_duration_gpus_partition_user_and_limit() -> None:
    history = load_history(PARSABLE)
    first = history.jobs[0]
    # 69|...|15:09:38|15:09:39|15:09:44|batch|root|00:01:00|...gres/gpu=1...
    assert (first.name, first.submit_time, first.duration, first.requested_workers) == ("69", 0.0, 5.0, 1)
    assert (first.partition, first.user, first.time_limit) == ("batch", "root", 60.0)
    assert history.recorded_jcts[0] == 6.0 and history.recorded_waits[0] == 1.0


def test_a_parsable_export_without_the_fields_names_the_missing_ones(tmp_path: Path) -> None:
    bad = tmp_path / "short.txt"
    bad.write_text("JobID|Submit|Start\n1|2026-11-23T15:09:38|2026-11-23T15:09:39\n")
    with pytest.raises(
        ParseError, match=f"lacks End, Partition, User, Timelimit, AllocTRES, State; .*{PARSABLE_FIELDS[0]}"
    ):
        load_history(bad)


def test_a_bad_time_names_the_line_and_job(tmp_path: Path) -> None:
    lines = PARSABLE.read_text().splitlines()
    lines[2] = lines[2].replace("2026-11-23T15:09:40|", "yesterday|", 1)
    bad = tmp_path / "bad.txt"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ParseError, match=r"line 3: job 70: Start='yesterday' is not a time"):
        load_history(bad)


def test_an_export_with_no_finished_gpu_job_is_refused(tmp_path: Path) -> None:
    lines = PARSABLE.read_text().splitlines()
    only_pending = tmp_path / "pending.txt"
    only_pending.write_text("\n".join([lines[0], *[line for line in lines if "|None|" in line]]) + "\n")
    with pytest.raises(ParseError, match=r"no finished job with GPUs \(2 records: 2 never started"):
        load_history(only_pending)


def test_the_baseline_replays_the_recorded_history_closely() -> None:
    config = SimConfig(nodes=4, gpus_per_node=4, interval=1.0, restart_cost=0.0)
    comparison = compare_site(load_history(JSON), config, SiteOptions(fraction=0.0))
    baseline = comparison.figures()[BASELINE]
    recorded = comparison.recorded()
    # The local cluster runs priority/basic with backfill every second; the recorded mean JCT is 17 s.
    assert baseline["avg_jct_s"] == pytest.approx(recorded["avg_jct_s"], rel=0.15)
    assert comparison.elastic_jobs == 0
    assert comparison.figures()[ELASTIC]["resizes"] == 0


def test_site_answers_in_one_command_with_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "site.json", tmp_path / "site.png"
    argv = ["site", "--history", str(JSON), "--slurm-conf", str(CONF), "--interval", "1", "--elastic-fraction", "1"]
    assert main([*argv, "--scaling-exponent", "1", "--json", str(out), "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert "18 jobs with GPUs; left out: 2 never started" in printed and "cluster: 4 nodes x 4 GPUs" in printed
    document = json.loads(out.read_text())
    baseline, elastic = document[BASELINE]["sacct-local"], document[ELASTIC]["sacct-local"]
    assert elastic["elastic_jobs"] == 18 and elastic["resizes"] > 0
    # With linear scaling, idle GPUs go to the elastic jobs: more GPUs busy, less queueing.
    assert elastic["gpu_util"] > baseline["gpu_util"]
    assert elastic["avg_queue_s"] < baseline["avg_queue_s"]
    assert png.stat().st_size > 10_000


def test_site_refuses_a_scaling_exponent_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["site", "--history", str(JSON), "--nodes", "4", "--scaling-exponent", "1.5"]) == 2
    assert "scaling exponent 1.5 must lie between 0" in capsys.readouterr().err
