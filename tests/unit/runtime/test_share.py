"""Sharing a device (``runtime/share.py``, ``runtime/shared_device.py``): the directive, the status files and their
owner check, the memory fit, and what a worker does at a step boundary when told a cap or a partner."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import time
from pathlib import Path

import pytest
import torch

from slurm_amoeba import runtime as amoeba
from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.core.sharing import ShareRole, host_status_path
from slurm_amoeba.runtime.auth import COORDINATOR, JobAuth
from slurm_amoeba.runtime.coordinator import Coordinator, CoordinatorConfig
from slurm_amoeba.runtime.pacing import OwnerActivity, PacingConfig, StepRecord
from slurm_amoeba.runtime.plans import Linear, ModelProfile
from slurm_amoeba.runtime.protocol import SHARE_KEY
from slurm_amoeba.runtime.share import (
    ACTIVITY_FORMAT,
    MAX_STATUS_BYTES,
    ActivityFile,
    ActivityReader,
    JobStatus,
    ShareDirective,
    activity_path,
    largest_micro_batch,
    need_bytes,
    read_status,
    write_status,
)
from slurm_amoeba.runtime.shared_device import ReservedPeak, SharedDevice

#: 100 bytes of parameters, 100 of optimizer state, 10 bytes per sample: a worker needs STATE + 10 * micro.
PROFILE = ModelProfile(100, 100, 100, 1, Linear(0, 10), Linear(0, 10), Linear(0, 0), Linear(0, 0), 0.0)
#: PROFILE's bytes before its micro-batch: parameters, gradients, optimizer state, and the runtime's commit of the
#: parameters and optimizer state (runtime/share.py commit_bytes).
STATE = 100 + 100 + 100 + (100 + 100)


def test_a_directive_travels_as_versioned_json() -> None:
    directive = ShareDirective(ShareRole.OPPORTUNISTIC, 4096, "/run/amoeba/g.json", 1000, "", ("w1",), 3)
    text = directive.to_json()
    assert json.loads(text)["version"] == 1
    assert ShareDirective.from_json(text) == directive
    assert directive.applies_to("w1") and not directive.applies_to("w0")
    assert ShareDirective(ShareRole.GUARANTEED).applies_to("anyone")


@pytest.mark.parametrize(
    "data",
    [
        {"role": "guaranteed", "version": 2},
        {"role": "guaranteed"},
        {"role": "owner", "version": 1},
        {"role": "guaranteed", "memory_cap_bytes": -1, "version": 1},
        {"role": "guaranteed", "memory_cap_bytes": True, "version": 1},
        {"role": "guaranteed", "partner_uid": -2, "version": 1},
        {"role": "guaranteed", "partner_status_path": 5, "version": 1},
        {"role": "guaranteed", "pickle": "x", "version": 1},
    ],
)
def test_a_directive_of_another_version_or_with_a_bad_value_is_refused(data: dict[str, object]) -> None:
    with pytest.raises(ParseError):
        ShareDirective.from_json(json.dumps(data))


def test_a_status_file_is_written_atomically_readable_by_others_and_read_back(tmp_path: Path) -> None:
    status = JobStatus("g", "w0", ShareRole.GUARANTEED, (StepRecord(10.0, 0.5), StepRecord(10.6, 0.6)))
    path = tmp_path / "g.json"
    write_status(path, status)
    write_status(path, status)
    assert read_status(path, -1) == status
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["g.json"], "no temporary file is left behind"


def test_a_status_file_of_another_owner_a_link_or_too_large_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    write_status(path, JobStatus("g", "w0", ShareRole.GUARANTEED, ()))
    with pytest.raises(ParseError, match="owned by uid"):
        read_status(path, os.getuid() + 1)
    (tmp_path / "link.json").symlink_to(path)
    with pytest.raises(OSError):
        read_status(tmp_path / "link.json", -1)
    (tmp_path / "big.json").write_text(" " * (MAX_STATUS_BYTES + 1))
    with pytest.raises(ParseError, match="larger"):
        read_status(tmp_path / "big.json", -1)


@pytest.mark.parametrize(
    ("cap", "micro"),
    [
        (0, 32),  # no cap: the whole share in one pass
        (STATE + 10 * 8, 8),
        (STATE + 10 * 8 - 1, 7),  # 7 does not divide 32: five passes of 7, 7, 6, 6, 6
        (STATE + 10 * 32, 32),
        (STATE + 10, 1),
        (STATE + 9, 0),  # not even one sample
    ],
)
def test_the_largest_micro_batch_that_fits_a_cap(cap: int, micro: int) -> None:
    assert largest_micro_batch(PROFILE, 32, 1, cap) == micro


def test_the_need_is_the_peak_at_a_micro_batch_of_one() -> None:
    assert need_bytes(PROFILE, 32, 4) == STATE + 10


class Driver:
    """What sharing asks of the worker runtime; the coordinator's values are a dictionary here."""

    def __init__(self, directive: ShareDirective | None = None, worker_id: str = "w0") -> None:
        self.values = {} if directive is None else {SHARE_KEY: directive.to_json()}
        self.worker_id, self.job_id = worker_id, "job"
        self.rank, self.world_size = 0, 1
        self.leave_requests = 0

    def tell(self, directive: ShareDirective) -> None:
        self.values[SHARE_KEY] = directive.to_json()

    def coordinator_value(self, key: str) -> str | None:
        return self.values.get(key)

    def request_leave(self) -> None:
        self.leave_requests += 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _state(sharing: SharedDevice, driver: Driver, max_local_batch: int = 0) -> amoeba.TorchState:
    model = torch.nn.Linear(4, 1)
    sampler = amoeba.ElasticSampler(256, 32, seed=0, max_local_batch=max_local_batch)
    state = amoeba.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), sampler, sharing=sharing)
    state.bind(driver)  # type: ignore[arg-type]
    return state


def _micro(state: amoeba.TorchState) -> int:
    return max(state.sampler.assignment(0, 1).plan.micro_batches[0])


def test_a_cap_is_applied_before_the_first_step_and_changed_at_a_step_boundary_with_the_same_global_batch() -> None:
    driver = Driver(ShareDirective(ShareRole.OPPORTUNISTIC, memory_cap_bytes=STATE + 10 * 8))
    sharing = SharedDevice(PROFILE, read_every_s=0.0)
    state = _state(sharing, driver)
    assert _micro(state) == 8 and state.sampler.global_batch == 32, "the first step already fits the cap"
    driver.tell(ShareDirective(ShareRole.OPPORTUNISTIC, memory_cap_bytes=STATE + 10 * 4, seq=1))
    state.after_step()
    assert _micro(state) == 4 and state.sampler.assignment(0, 1).plan.step_samples == 32
    assert sharing.report["micro_batch"] == 4
    driver.tell(ShareDirective(ShareRole.OPPORTUNISTIC, seq=2))
    state.after_step()
    assert _micro(state) == 32, "no cap: back to the whole share"


def test_lifting_a_cap_goes_back_to_the_users_own_micro_batch_never_above() -> None:
    driver = Driver(ShareDirective(ShareRole.OPPORTUNISTIC, memory_cap_bytes=STATE + 10 * 32))
    state = _state(SharedDevice(PROFILE, read_every_s=0.0), driver, max_local_batch=16)
    assert _micro(state) == 16
    driver.tell(ShareDirective(ShareRole.OPPORTUNISTIC, seq=1))
    state.after_step()
    assert _micro(state) == 16


def test_an_opportunistic_worker_that_cannot_fit_one_sample_leaves_once() -> None:
    driver = Driver(ShareDirective(ShareRole.OPPORTUNISTIC, memory_cap_bytes=STATE + 10 * 8))
    sharing = SharedDevice(PROFILE, read_every_s=0.0)
    state = _state(sharing, driver)
    driver.tell(ShareDirective(ShareRole.OPPORTUNISTIC, memory_cap_bytes=STATE + 5, seq=1))
    state.after_step()
    state.after_step()
    assert driver.leave_requests == 1 and sharing.leaving
    assert _micro(state) == 8, "the worker leaves with the plan it had"


def test_a_guaranteed_worker_is_never_capped_below_its_need() -> None:
    driver = Driver(ShareDirective(ShareRole.GUARANTEED, memory_cap_bytes=10))
    state = _state(SharedDevice(PROFILE, read_every_s=0.0), driver)
    assert driver.leave_requests == 0 and _micro(state) == 1


def test_a_directive_for_other_workers_changes_nothing() -> None:
    driver = Driver(ShareDirective(ShareRole.OPPORTUNISTIC, memory_cap_bytes=STATE + 5, workers=("w1",)))
    state = _state(SharedDevice(PROFILE, read_every_s=0.0), driver)
    state.after_step()
    assert driver.leave_requests == 0 and _micro(state) == 32


def test_without_a_profile_one_step_is_measured_before_the_cap_applies() -> None:
    driver = Driver(ShareDirective(ShareRole.OPPORTUNISTIC, memory_cap_bytes=1 << 30))
    sharing = SharedDevice(read_every_s=0.0)
    state = _state(sharing, driver)
    state.after_step()  # the first boundary with the cap known: measure the next step
    assert sharing.profile is None and _micro(state) == 32
    state.model(torch.ones(32, 4)).sum().backward()
    state.after_step()
    assert sharing.profile is not None and sharing.profile.memory.per_sample > 0
    assert _micro(state) == 32, "a gibibyte holds the whole share of this model"
    assert sharing.memory_peak_bytes is not None, "the same measured step gave the worker's memory peak"


def _train_step(state: amoeba.TorchState, samples: int) -> None:
    state.model(torch.ones(samples, 4)).sum().backward()


def test_a_cpu_worker_reports_the_peak_of_one_measured_step_with_the_runtimes_commit() -> None:
    sharing = SharedDevice(read_every_s=0.0)  # opted in; no directive yet
    state = _state(sharing, Driver())
    _train_step(state, 32)
    state.after_step()  # the first boundary: the next step is measured
    assert sharing.memory_peak_bytes is None and state.progress_report()["share"]["memory_peak_bytes"] is None
    _train_step(state, 32)
    state.after_step()
    params = sum(p.numel() * p.element_size() for p in state.model.parameters())
    peak = sharing.memory_peak_bytes
    assert peak is not None and peak >= 3 * params + 32 * 4 * 4, "parameters, gradients, commit and the input"
    assert state.progress_report()["share"]["memory_peak_bytes"] == peak
    _train_step(state, 320)
    state.after_step()
    assert sharing.memory_peak_bytes == peak, "measured once: a later, larger step is not measured again"


def test_a_cap_after_the_cpu_workers_measured_step_applies_at_once_without_a_second_measurement() -> None:
    driver = Driver()
    sharing = SharedDevice(read_every_s=0.0)
    state = _state(sharing, driver)
    state.after_step()
    _train_step(state, 32)
    state.after_step()
    assert sharing.profile is not None and sharing.memory_peak_bytes is not None
    profile = sharing.profile
    need = need_bytes(profile, 32, 1)
    driver.tell(ShareDirective(ShareRole.OPPORTUNISTIC, memory_cap_bytes=need + int(profile.memory.per_sample) * 4))
    state.after_step()
    assert _micro(state) < 32 and sharing.profile is profile, "the cap applied at this boundary, from that step"


def test_a_given_profile_stays_while_one_step_is_measured_for_the_memory_peak() -> None:
    sharing = SharedDevice(PROFILE, read_every_s=0.0)
    state = _state(sharing, Driver())
    state.after_step()
    _train_step(state, 32)
    state.after_step()
    assert sharing.profile is PROFILE and sharing.memory_peak_bytes is not None


class Allocator:
    """torch's CUDA peak counters for one device: what the allocator holds and the most it held since a reset."""

    def __init__(self, held: int) -> None:
        self.held = self.peak = held
        self.resets = 0

    def hold(self, held: int) -> None:
        self.held = held
        self.peak = max(self.peak, held)

    def read(self, device: int) -> int:
        assert device == 0
        return self.peak

    def reset(self, device: int) -> None:
        self.peak = self.held
        self.resets += 1


def test_a_gpu_workers_peak_is_the_last_windows_and_falls_within_a_window_after_a_lower_cap() -> None:
    allocator = Allocator(held=6 << 30)
    peak = ReservedPeak(10.0, read=allocator.read, reset=allocator.reset)
    allocator.hold(10 << 30)
    peak.at_boundary(0, 100.0)
    assert peak.peak_bytes == 10 << 30, "read at the first boundary"
    allocator.hold(12 << 30)
    allocator.hold(8 << 30)
    peak.at_boundary(0, 105.0)
    assert (peak.peak_bytes, allocator.resets) == (10 << 30, 1), "not read again inside the window"
    peak.at_boundary(0, 110.0)
    assert peak.peak_bytes == 12 << 30, "the most the last window held"
    allocator.hold(3 << 30)  # a lower cap: the cache emptied
    peak.restart(0, 111.0)
    allocator.hold(4 << 30)
    peak.at_boundary(0, 120.0)
    assert peak.peak_bytes == 12 << 30, "the window from before the cap is not over"
    peak.at_boundary(0, 121.0)
    assert peak.peak_bytes == 4 << 30, "what it held since the cap, not before"


def test_a_gpu_workers_first_reading_is_not_delayed_by_a_cap_applied_before_its_first_step() -> None:
    allocator = Allocator(held=1 << 30)
    peak = ReservedPeak(10.0, read=allocator.read, reset=allocator.reset)
    peak.restart(0, 100.0)
    peak.at_boundary(0, 100.5)
    assert peak.peak_bytes == 1 << 30


def test_the_sharer_paces_itself_by_the_owners_status_and_never_writes_it(tmp_path: Path) -> None:
    clock = Clock()
    owner_path = tmp_path / "owner-w0.json"
    guaranteed = ShareDirective(ShareRole.GUARANTEED, status_path=str(tmp_path / "owner-{worker}.json"))
    owner_state = _state(SharedDevice(PROFILE, read_every_s=0.0, clock=clock), Driver(guaranteed))

    next_end = [clock.now + 0.1]

    def owner_steps(seconds: float) -> None:  # the owner trains on in 0.1 s steps while the sharer sleeps
        end = clock.now + seconds
        while next_end[0] <= end + 1e-9:
            clock.now = next_end[0]
            owner_state.after_step()
            next_end[0] += 0.1
        clock.now = end

    owner_steps(0.3)
    written = owner_path.read_text()
    sharer = SharedDevice(PROFILE, read_every_s=0.0, clock=clock, sleep=owner_steps, pacing=PacingConfig(window=2))
    opportunistic = ShareDirective(ShareRole.OPPORTUNISTIC, partner_status_path=str(owner_path))
    sharer_state = _state(sharer, Driver(opportunistic, worker_id="s0"))
    clock.now += 0.01  # the sharer's step; the owner's step in progress ends later
    sharer_state.after_step()  # one 0.01 s step since it was bound
    assert sharer.paused_s == pytest.approx(0.01 * (1 / 0.02 - 1)), "it starts at the least duty"
    assert sharer.pacer.baseline_s == pytest.approx(0.1), "learned from the owner's steps before it computed"
    clock.now += 0.01
    sharer_state.after_step()
    assert sharer.pacer.duty == pytest.approx(0.12), "the owner kept its speed: the sharer takes more"
    assert owner_path.read_text() != written and read_status(owner_path, -1).role is ShareRole.GUARANTEED


def test_the_owner_writes_its_status_at_most_every_read_interval_and_keeps_every_step(tmp_path: Path) -> None:
    clock = Clock()
    directive = ShareDirective(ShareRole.GUARANTEED, status_path=str(tmp_path / "g-{worker}.json"))
    state = _state(SharedDevice(PROFILE, read_every_s=1.0, clock=clock), Driver(directive))
    for _ in range(3):
        clock.now += 0.1
        state.after_step()
    assert len(read_status(tmp_path / "g-w0.json", -1).steps) == 1, "written at the first step only"
    clock.now += 1.0
    state.after_step()
    steps = read_status(tmp_path / "g-w0.json", -1).steps
    assert len(steps) == 3, "the steps in between are not lost (all but the one measured for the memory peak)"


def test_the_step_measured_for_the_memory_peak_is_not_a_step_time_sharers_pace_against(tmp_path: Path) -> None:
    clock = Clock()
    directive = ShareDirective(ShareRole.GUARANTEED, status_path=str(tmp_path / "g-{worker}.json"))
    sharing = SharedDevice(PROFILE, read_every_s=0.0, clock=clock)
    state = _state(sharing, Driver(directive))
    ends = []
    for _ in range(3):
        clock.now += 0.1
        ends.append(clock.now)
        state.after_step()  # the second step runs under the meter
    assert sharing.memory_peak_bytes is not None
    assert [step.end for step in read_status(tmp_path / "g-w0.json", -1).steps] == [ends[0], ends[2]]


def test_a_new_directive_ends_the_sharers_pause_and_applies_at_once(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "owner.json"
    write_status(path, JobStatus("g", "w0", ShareRole.GUARANTEED, ()))
    directive = ShareDirective(ShareRole.OPPORTUNISTIC, memory_cap_bytes=STATE + 10 * 8, partner_status_path=str(path))
    driver = Driver(directive)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        driver.tell(dataclasses.replace(directive, memory_cap_bytes=STATE + 10 * 2, seq=1))  # the owner grows back

    sharer = SharedDevice(PROFILE, read_every_s=0.05, clock=clock, sleep=sleep)
    state = _state(sharer, driver)
    clock.now += 0.1
    state.after_step()
    assert clock.slept == [0.05] and sharer.paused_s == pytest.approx(0.05), "cut short, not 4.9 s"
    assert _micro(state) == 2


def test_a_partner_status_file_of_another_owner_is_not_believed(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "owner.json"
    write_status(path, JobStatus("g", "w0", ShareRole.GUARANTEED, tuple(StepRecord(990.0 + i, 0.1) for i in range(5))))
    directive = ShareDirective(ShareRole.OPPORTUNISTIC, partner_status_path=str(path), partner_uid=os.getuid() + 1)
    sharer = SharedDevice(PROFILE, read_every_s=0.0, clock=clock, sleep=clock.sleep)
    state = _state(sharer, Driver(directive))
    clock.now += 0.01
    state.after_step()
    assert sharer.pacer.baseline_s is None and sharer.pacer.duty == 0.02, "no feedback: the least duty stays"
    assert clock.slept, "it still yields"


def test_the_coordinator_publishes_the_directive_sealed_with_a_growing_seq() -> None:
    with Coordinator(CoordinatorConfig(job_id="share")) as coordinator:
        first = coordinator.set_share(ShareDirective(ShareRole.OPPORTUNISTIC, memory_cap_bytes=1 << 20))
        second = coordinator.set_share(ShareDirective(ShareRole.OPPORTUNISTIC, memory_cap_bytes=1 << 19))
        assert (first.seq, second.seq) == (1, 2)
        text = JobAuth(coordinator.job_key, "w0").read(coordinator.store, SHARE_KEY, sender=COORDINATOR)
        assert text is not None and ShareDirective.from_json(text) == second


def test_a_guaranteed_job_that_opted_in_writes_its_status_where_the_sharers_beside_it_read_it(tmp_path: Path) -> None:
    env = {"AMOEBA_SHARE": "guaranteed", "AMOEBA_PARENT_JOB": "4242"}
    host = SharedDevice.for_job(env, tmp_path)
    assert host is not None and host.directive is not None and host.directive.role is ShareRole.GUARANTEED
    path = host_status_path("4242", tmp_path)
    assert host.directive.status_path == str(path)
    host_state = _state(host, Driver())  # no directive from its coordinator: the default stays
    host_state.after_step()
    assert read_status(path, os.getuid()).role is ShareRole.GUARANTEED

    # The sharer's directive as its agent publishes it from the daemon's place_beside: partner = the host.
    clock = Clock()
    clock.now = time.time() + 10.0  # the sharer starts after the host's step: that step shows its exclusive speed
    sharer = SharedDevice(PROFILE, read_every_s=0.0, clock=clock, sleep=clock.sleep)
    told = ShareDirective(ShareRole.OPPORTUNISTIC, partner_status_path=str(path), partner_uid=os.getuid(), seq=1)
    sharer_state = _state(sharer, Driver(told, worker_id="g1-0"))
    clock.now += 0.01
    sharer_state.after_step()
    assert sharer.pacer.baseline_s is not None, "it believed the host's status file (its owner checked)"
    assert sharer.paused_s > 0, "and paced itself"


@pytest.mark.parametrize(
    ("env", "role"),
    [
        ({}, None),
        ({"AMOEBA_SHARE": "0", "AMOEBA_PARENT_JOB": "42"}, None),
        ({"AMOEBA_SHARE": "opportunistic", "AMOEBA_PARENT_JOB": "42"}, "none yet"),
        ({"AMOEBA_SHARE": "1", "AMOEBA_PARENT_JOB": "42"}, "guaranteed"),
        ({"AMOEBA_SHARE": "guaranteed", "AMOEBA_PARENT_JOB": "../42"}, "none yet"),
    ],
)
def test_only_a_guaranteed_job_with_a_job_id_starts_with_a_status_file(
    env: dict[str, str], role: str | None, tmp_path: Path
) -> None:
    sharing = SharedDevice.for_job(env, tmp_path)
    if role is None:
        assert sharing is None
        return
    assert sharing is not None
    assert (sharing.directive.role.value if sharing.directive else "none yet") == role


def test_the_directives_pace_bound_sets_the_hosts_target_and_its_sub_batch_caps_the_micro_batch() -> None:
    sharing = SharedDevice(PROFILE, read_every_s=0.0)
    driver = Driver(ShareDirective(ShareRole.OPPORTUNISTIC, pace_bound=0.2, sub_batch=8, seq=1))
    state = _state(sharing, driver)
    state.after_step()
    assert sharing.pacer.config.target == pytest.approx(0.8) and _micro(state) == 8
    driver.tell(ShareDirective(ShareRole.OPPORTUNISTIC, seq=2))  # cleared: the configured target, the user's batch
    state.after_step()
    assert sharing.pacer.config.target == PacingConfig().target and _micro(state) == 32


def test_an_activity_file_is_mapped_readable_by_others_and_follows_every_publication(tmp_path: Path) -> None:
    path = activity_path(tmp_path / "g-w0.json")
    assert path.name == "g-w0.busy"
    owner = ActivityFile(path)
    owner.publish(OwnerActivity(True, 10.0, 0.02, 0.01, 42))
    reader = ActivityReader(path, -1)
    assert reader.read() == OwnerActivity(True, 10.0, 0.02, 0.01, 42)
    owner.publish(OwnerActivity(False, 10.02, 0.02, 0.01, 42))
    assert reader.read() == OwnerActivity(False, 10.02, 0.02, 0.01, 42), "the same mapping, the new record"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and [p.name for p in tmp_path.iterdir()] == [path.name]
    replaced = ActivityFile(path)  # a restarted owner writes a new file
    replaced.publish(OwnerActivity(True, 11.0, 0.03, 0.01, 43))
    assert reader.read().pid == 42, "the old mapping until a refresh"
    reader.refresh()
    assert reader.read() == OwnerActivity(True, 11.0, 0.03, 0.01, 43)
    for handle in (owner, replaced, reader):
        handle.close()


def test_an_activity_file_of_another_owner_a_link_a_wrong_size_or_a_torn_record_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "g.busy"
    ActivityFile(path).publish(OwnerActivity(True, 10.0))
    with pytest.raises(ParseError, match="owned by uid"):
        ActivityReader(path, os.getuid() + 1).read()
    (tmp_path / "link.busy").symlink_to(path)
    with pytest.raises(OSError):
        ActivityReader(tmp_path / "link.busy", -1).read()
    (tmp_path / "short.busy").write_bytes(b"AMBA")
    with pytest.raises(ParseError, match="bytes"):
        ActivityReader(tmp_path / "short.busy", -1).read()
    torn = ACTIVITY_FORMAT.pack(b"AMBA", 1, 3, 1, 0, 10.0, 0.0, 0.0)  # an odd sequence number: a write under way
    (tmp_path / "torn.busy").write_bytes(torn)
    with pytest.raises(ParseError, match="kept changing"):
        ActivityReader(tmp_path / "torn.busy", -1).read()
    (tmp_path / "empty.busy").write_bytes(bytes(ACTIVITY_FORMAT.size))
    with pytest.raises(ParseError, match="no activity record"):
        ActivityReader(tmp_path / "empty.busy", -1).read()


class Owner:
    """A guaranteed worker on a fixed timetable: from ``start`` on, busy ``busy_s`` then idle ``idle_s``, again and
    again; :meth:`until` plays its transitions up to a time through its real ``SharedDevice``."""

    def __init__(self, tmp_path: Path, clock: Clock, busy_s: float, idle_s: float, start: float) -> None:
        directive = ShareDirective(ShareRole.GUARANTEED, status_path=str(tmp_path / "owner-{worker}.json"))
        self.sharing = SharedDevice(PROFILE, read_every_s=0.0, clock=clock)
        self.state = _state(self.sharing, Driver(directive))
        self.clock, self.busy_s, self.idle_s = clock, busy_s, idle_s
        self.start, self.next_change, self.busy = start, start, False
        self.steps: list[object] = []

    def until(self, end: float) -> None:
        while self.next_change <= end + 1e-12:
            self.clock.now = self.next_change
            if self.busy:  # the step's end: idle from here
                self.steps.clear()
                self.state.after_step()
                self.next_change += self.idle_s
            else:  # the step's first micro-batch: busy from here
                batches = self.sharing.micro_batches([0])
                next(batches)
                self.steps.append(batches)
                self.next_change += self.busy_s
            self.busy = not self.busy
        self.clock.now = end

    def busy_between(self, start: float, end: float) -> bool:
        """Whether the timetable has the owner busy at any time in [start, end)."""
        period = self.busy_s + self.idle_s
        offset = (start - self.start + 1e-9) % period  # (a start on a spell's boundary is in the new spell)
        return offset < self.busy_s or offset + (end - start) > period


def test_a_sharer_never_computes_a_micro_batch_while_the_owners_flag_says_busy(tmp_path: Path) -> None:
    clock = Clock()
    owner = Owner(tmp_path, clock, busy_s=0.010, idle_s=0.020, start=clock.now)
    owner.until(clock.now + 0.3)  # its spells are known

    def sleep(seconds: float) -> None:
        owner.until(clock.now + seconds)

    partner = str(tmp_path / "owner-w0.json")
    sharer = SharedDevice(PROFILE, read_every_s=0.0, clock=clock, sleep=sleep)
    sharer_state = _state(sharer, Driver(ShareDirective(ShareRole.OPPORTUNISTIC, partner_status_path=partner)))
    reader = ActivityReader(activity_path(partner), -1)
    chunks: list[tuple[float, bool]] = []
    for _ in range(5):
        for _ in sharer.micro_batches(range(4)):
            chunks.append((clock.now, reader.read().busy))
            owner.until(clock.now + 0.004)  # the sharer's micro-batch
        owner.until(clock.now + 0.002)  # its optimizer step
        sharer_state.after_step()
    assert len(chunks) == 20 and not any(busy for _, busy in chunks), "every micro-batch began while the owner idled"
    late = [start for start, _ in chunks[1:] if owner.busy_between(start, start + 0.004)]
    assert not late, "once its chunk's length is known, none runs into the owner's next busy spell"
    assert sharer.pacer.gated and sharer.waited_s > 0 and sharer.gated_chunks == 25


def test_a_new_directive_ends_the_sharers_wait_and_the_step_finishes_at_once(tmp_path: Path) -> None:
    clock = Clock()
    owner = Owner(tmp_path, clock, busy_s=100.0, idle_s=0.02, start=clock.now)  # one long busy spell
    owner.until(clock.now)
    partner = str(tmp_path / "owner-w0.json")
    directive = ShareDirective(ShareRole.OPPORTUNISTIC, memory_cap_bytes=STATE + 10 * 8, partner_status_path=partner)
    driver = Driver(directive)
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds
        if len(slept) == 3:
            driver.tell(dataclasses.replace(directive, memory_cap_bytes=STATE + 10 * 2, seq=1))  # the owner grows

    sharer = SharedDevice(PROFILE, read_every_s=0.0, clock=clock, sleep=sleep)
    state = _state(sharer, driver)
    assert list(sharer.micro_batches(range(4))) == [0, 1, 2, 3]
    assert len(slept) == 3, "no wait after the new directive: the step ends"
    state.after_step()
    assert _micro(state) == 2, "and the new cap applies at its end"


def test_an_ungated_sharers_pause_ends_when_the_owner_starts_publishing_its_activity(tmp_path: Path) -> None:
    clock = Clock()
    owner = Owner(tmp_path, clock, busy_s=0.010, idle_s=0.010, start=clock.now + 0.25)  # it starts 0.25 s later
    owner.until(clock.now)
    write_status(tmp_path / "owner-w0.json", JobStatus("g", "w0", ShareRole.GUARANTEED, ()))
    partner = str(tmp_path / "owner-w0.json")
    sharer = SharedDevice(PROFILE, read_every_s=0.1, clock=clock, sleep=lambda s: owner.until(clock.now + s))
    state = _state(sharer, Driver(ShareDirective(ShareRole.OPPORTUNISTIC, partner_status_path=partner)))
    clock.now += 0.05
    state.after_step()  # a 0.05 s step at the least duty: a pause of 2.45 s, were it not cut short
    assert sharer.pacer.gated and sharer.pacer.duty == 1.0
    assert sharer.paused_s == pytest.approx(0.2), "the look at 0.25 s, the owner's first busy mark, ends it"


def test_a_sharer_inside_a_micro_batch_stops_between_layers_while_the_owner_is_busy(tmp_path: Path) -> None:
    clock = Clock()
    owner = Owner(tmp_path, clock, busy_s=0.010, idle_s=0.020, start=clock.now)
    owner.until(clock.now + 0.3)
    partner = str(tmp_path / "owner-w0.json")
    sharer = SharedDevice(PROFILE, read_every_s=0.0, clock=clock, sleep=lambda s: owner.until(clock.now + s))
    state = _state(sharer, Driver(ShareDirective(ShareRole.OPPORTUNISTIC, partner_status_path=partner)))
    reader = ActivityReader(activity_path(partner), -1)
    busy_at_layer: list[bool] = []
    state.model.register_forward_pre_hook(lambda module, args: busy_at_layer.append(reader.read().busy))
    for _ in sharer.micro_batches(range(1)):
        assert not reader.read().busy, "admitted in the owner's idle time"
        owner.until(owner.next_change + 0.001)  # the chunk outlasts the idle spell: the owner computes again
        assert reader.read().busy
        loss = state.model(torch.ones(2, 4)).sum()  # the layer waits until the owner idles
        assert sharer.layer_yields == 1 and busy_at_layer == [False]
        owner.until(owner.next_change + 0.001)
        loss.backward()  # and so does its backward
        assert sharer.layer_yields == 2 and not reader.read().busy


def test_only_a_gated_sharers_layers_carry_the_yield_hooks(tmp_path: Path) -> None:
    own = SharedDevice(PROFILE)
    guaranteed = _state(own, Driver(ShareDirective(ShareRole.GUARANTEED)))
    for _ in own.micro_batches(range(2)):
        guaranteed.model(torch.ones(2, 4)).sum().backward()
    assert not guaranteed.model._forward_pre_hooks, "a guaranteed worker's layers pay for no hook"

    clock = Clock()
    owner = Owner(tmp_path, clock, busy_s=0.010, idle_s=0.020, start=clock.now)
    owner.until(clock.now + 0.3)
    directive = ShareDirective(ShareRole.OPPORTUNISTIC, partner_status_path=str(tmp_path / "owner-w0.json"))
    sharer = SharedDevice(PROFILE, read_every_s=0.0, clock=clock, sleep=lambda s: owner.until(clock.now + s))
    state = _state(sharer, Driver(directive))
    assert not state.model._forward_pre_hooks, "no hook before the gate engages"
    for _ in sharer.micro_batches(range(1)):
        pass
    assert sharer.pacer.gated and len(state.model._forward_pre_hooks) == 1
