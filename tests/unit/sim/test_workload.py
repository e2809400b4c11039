"""Workload loaders: both formats, and malformed rows reported with their line numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.sim.data import SimError
from slurm_amoeba.sim.workload import JobSpec, load_philly, load_pollux_workload, make_elastic

HEADER = "name,time,application,num_replicas,batch_size\n"


def _write(tmp_path: Path, text: str, name: str = "w.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_pollux_workloads_have_160_jobs_in_submit_order(pollux: Path) -> None:
    jobs = load_pollux_workload(
        pollux / "workloads" / "workload-6.csv", {"cifar10", "ncf", "bert", "imagenet", "deepspeech2", "yolov3"}
    )
    assert len(jobs) == 160
    assert [job.submit_time for job in jobs] == sorted(job.submit_time for job in jobs)
    assert all(job.min_workers == job.max_workers == job.requested_workers for job in jobs)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("a,1,cifar10,2,256\nb,x,cifar10,2,256\n", "line 3: time='x' is not a number"),
        ("a,1,cifar10,2,256\nb,1,cifar10,2\n", "line 3: 4 fields where the header has 5"),
        ("a,1,cifar10,2.5,256\n", "line 2: num_replicas='2.5' must be a whole number"),
        ("a,1,resnet,2,256\n", "line 2: unknown application 'resnet'; known applications are cifar10"),
        ("a,1,cifar10,2,256\na,5,cifar10,2,256\n", "line 3: job name 'a' was already used on line 2"),
        ("a,1,cifar10,0,256\n", "line 2: .* at least 1 replica"),
    ],
)
def test_malformed_pollux_rows_name_their_line(tmp_path: Path, body: str, message: str) -> None:
    path = _write(tmp_path, HEADER + body)
    with pytest.raises(ParseError, match=message):
        load_pollux_workload(path, {"cifar10"})


def test_a_missing_column_is_reported_with_the_expected_header(tmp_path: Path) -> None:
    path = _write(tmp_path, "name,time,application\na,1,cifar10\n")
    with pytest.raises(ParseError, match="line 1: .* lacks num_replicas, batch_size"):
        load_pollux_workload(path)


def test_philly_jobs_are_sorted_and_relative_to_the_first_submit(tmp_path: Path) -> None:
    text = (
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-09 07:01:55,66.0,1,66.0,c\n"
        "2017-10-09 06:13:03,2951.0,4,11804.0,c\n"
    )
    jobs = load_philly(_write(tmp_path, text))
    assert [(job.submit_time, job.duration, job.requested_workers) for job in jobs] == [
        (0.0, 2951.0, 4),
        (2932.0, 66.0, 1),
    ]
    assert jobs[1].name == "philly-2"


def test_a_bad_philly_timestamp_names_its_line(tmp_path: Path) -> None:
    text = "timestamp,duration,num_gpus\n2017-10-09 07:01:55,6,1\nyesterday,6,1\n"
    with pytest.raises(ParseError, match="line 3: timestamp='yesterday'"):
        load_philly(_write(tmp_path, text))


def test_make_elastic_widens_ranges_within_the_batch_and_cluster_limits() -> None:
    jobs = [JobSpec("a", 0, 4, "cifar10", 256), JobSpec("b", 0, 3, "cifar10", 4096), JobSpec("p", 0, 2, duration=9)]
    elastic = make_elastic(jobs, {"a": 8, "b": 128}, fraction=1.0, factor=2.0, cluster_gpus=4)
    assert [(job.min_workers, job.max_workers) for job in elastic] == [(2, 4), (2, 4), (2, 2)]
    assert make_elastic(jobs, {}, fraction=0.0) == jobs
    with pytest.raises(SimError, match="fraction 1.5"):
        make_elastic(jobs, {}, fraction=1.5)
