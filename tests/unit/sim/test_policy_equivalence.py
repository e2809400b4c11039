"""The policy-equivalence check (``benchmarks/policy_equivalence.py``) runs every configuration, records every job to
the last digit, and its comparison names each difference and fails on it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.policy_equivalence import configurations, differences, main, record, simulate
from slurm_amoeba.policy import policy_names

#: Eight jobs of Pollux workload 6 at 1.0x, two of each application, in a short burst: enough for every policy to
#: queue, share, grow and shrink, small enough to run every configuration in seconds.
TINY_WORKLOAD = """name,time,application,num_replicas,batch_size
cifar10-0,0,cifar10,6,2048
deepspeech2-1,30,deepspeech2,8,320
bert-2,60,bert,8,384
ncf-3,90,ncf,1,32768
yolov3-4,120,yolov3,4,64
cifar10-5,150,cifar10,6,2048
bert-6,180,bert,6,384
ncf-7,210,ncf,1,32768
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "workload-tiny.csv"
    path.write_text(TINY_WORKLOAD)
    return path


def test_every_registered_policy_and_every_configuration_runs_and_repeats_to_the_last_digit(tiny: Path) -> None:
    table = configurations()
    assert set(policy_names()) <= set(table)
    before: dict[str, dict[str, object]] = {}
    after: dict[str, dict[str, object]] = {}
    for label, configuration in table.items():
        run = record(simulate(configuration, tiny))
        assert set(run["jobs"]) == {line.split(",")[0] for line in TINY_WORKLOAD.splitlines()[1:]}, label
        assert run["summary"]["unfinished"] == 0.0, label
        assert all(job["jct"] == job["end"] - job["submit"] for job in run["jobs"].values()), label
        before[label] = {"tiny": run}
        after[label] = {"tiny": record(simulate(configuration, tiny))}
    # Through JSON, as the files travel: repr'd floats come back to the last digit.
    assert differences(before, json.loads(json.dumps(after))) == ([], [])


def _run(jct: float, avg: float = 1.0) -> dict[str, object]:
    job = {"submit": 0.0, "start": 1.0, "end": jct, "jct": jct, "resizes": 0, "preemptions": 0, "restarts": 0}
    return {
        "summary": {"avg_jct_s": avg, "p99_jct_s": math.nan},
        "decisions": 3,
        "usage_sha256": "ab",
        "jobs": {"j": job},
    }


def test_a_difference_in_the_last_digit_is_named_with_its_configuration_workload_job_and_both_values() -> None:
    jct = 934.2982477100601
    lines, new = differences({"slurm": {"w": _run(jct)}}, {"slurm": {"w": _run(math.nextafter(jct, 1e9))}})
    assert new == []
    assert lines == [
        f"slurm | w | j | end | {jct!r} | {math.nextafter(jct, 1e9)!r}",
        f"slurm | w | j | jct | {jct!r} | {math.nextafter(jct, 1e9)!r}",
    ]


def test_a_missing_configuration_is_a_difference_and_a_new_one_is_only_listed() -> None:
    lines, new = differences({"fifo": {"w": _run(2.0)}}, {"amoebad": {"w": _run(2.0)}})
    assert lines == ["fifo | - | - | present | missing"]
    assert new == ["amoebad | (new configuration)"]


def test_the_compare_mode_exits_1_on_a_difference_and_0_without(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reference = tmp_path / "before.json"
    assert main(["--only", "fifo", "--workloads", "0.5:2", "--json", str(reference)]) == 0
    same = tmp_path / "same.json"
    assert main(["--only", "fifo", "--workloads", "0.5:2", "--json", str(same), "--compare", str(reference)]) == 0
    assert "no difference" in capsys.readouterr().out
    changed = json.loads(reference.read_text())
    run = changed["results"]["fifo"]["0.5x/workload-2"]
    run["summary"]["avg_jct_s"] *= 1.000001
    other = tmp_path / "changed.json"
    other.write_text(json.dumps(changed))
    assert main(["--compare", str(reference), str(other)]) == 1
    assert "fifo | 0.5x/workload-2 | summary.avg_jct_s |" in capsys.readouterr().out
