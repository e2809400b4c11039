"""The application model against the measured traces."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.sim.application import Application, canonical_placement, load_application, load_applications
from slurm_amoeba.sim.data import SimError


@pytest.fixture(scope="module")
def apps(data_dir: Path) -> dict[str, Application]:
    return load_applications(data_dir / "pollux" / "traces")


def test_canonical_placement_is_the_smallest_rotation_without_empty_nodes() -> None:
    assert canonical_placement((4, 0, 2)) == (2, 4)
    assert canonical_placement((3, 1, 2)) == (1, 2, 3)


def test_a_measured_placement_and_batch_returns_the_measurement(apps: dict[str, Application], pollux: Path) -> None:
    first = (pollux / "traces" / "cifar10" / "placements.csv").read_text().splitlines()[1].split(",")
    step, sync = apps["cifar10"].step_time((int(first[0]),), int(first[1]))
    assert (step, sync) == pytest.approx((float(first[2]), float(first[3])))


def test_step_time_is_interpolated_between_measured_local_batches(apps: dict[str, Application]) -> None:
    app = apps["cifar10"]
    low, high = app.step_time((4,), 32), app.step_time((4,), 45)
    middle = app.step_time((4,), 38)
    assert min(low[0], high[0]) <= middle[0] <= max(low[0], high[0])


def test_unmeasured_placements_fall_between_their_neighbours(apps: dict[str, Application]) -> None:
    app = apps["imagenet"]
    five = app.step_time((4, 4, 4, 4, 4), 100)[0]
    four, six = app.step_time((4, 4, 4, 4), 100)[0], app.step_time((4, 4, 4, 4, 4, 4), 100)[0]
    assert min(four, six) <= five <= max(four, six)


def test_batch_planning_keeps_the_global_batch_and_respects_memory(apps: dict[str, Application]) -> None:
    yolo = apps["yolov3"]
    local, accum = yolo.plan_batch(64, 4)
    assert (local, accum) == (8, 1)
    assert 4 * local * (accum + 1) == 64
    assert apps["ncf"].plan_batch(32768, 1) == (16384, 1)  # a single replica above the smallest batch accumulates


def test_gain_is_one_at_the_smallest_batch_and_grows_with_the_batch(apps: dict[str, Application]) -> None:
    app = apps["cifar10"]
    assert app.gain(app.init_batch, 0) == pytest.approx(1.0)
    assert app.gain(2048, 50) > 1.0
    with pytest.raises(SimError, match="global batch 99999 lies outside the validated range 128..4096"):
        app.gain(99999, 0)


def test_epochs_end_in_increasing_progress_up_to_the_completion_epoch(apps: dict[str, Application]) -> None:
    for name, epochs in {"bert": 2, "cifar10": 100, "imagenet": 90}.items():
        ends = apps[name].epoch_ends()
        assert len(ends) == epochs
        assert all(b > a for a, b in itertools.pairwise(ends))


def test_a_malformed_trace_names_file_and_line(tmp_path: Path, pollux: Path) -> None:
    folder = tmp_path / "cifar10"
    folder.mkdir()
    for source in (pollux / "traces" / "cifar10").iterdir():
        (folder / source.name).write_text(source.read_text())
    lines = (folder / "placements.csv").read_text().splitlines()
    lines[5] = "4,64,fast,0.1"
    (folder / "placements.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ParseError, match=r"placements.csv: line 6: step_time='fast' is not a number"):
        load_application(folder)


def test_an_application_without_a_known_completion_epoch_is_refused(tmp_path: Path) -> None:
    (tmp_path / "gpt").mkdir()
    with pytest.raises(SimError, match="application gpt: its completion epoch is unknown"):
        load_application(tmp_path / "gpt")
