"""The job's rendezvous is the job's: sealed store values (runtime/auth.py) and an intruder at a running job's store.

The intruder is a TCPStore client in the test process that knows the store's address but not the job's secret: it
registers a worker of its own, impersonates a member, tries to change the allowed sizes, forges assignments and a
progress report. The job (the local-job harness, two workers of the toy trainer) must finish with the fixed-size
run's parameters and never count the intruder.
"""

from __future__ import annotations

import datetime
import json
import os
import stat
import time
from pathlib import Path

import pytest
from torch._C._distributed_c10d import TCPStore

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.runtime.auth import (
    ENV_JOB_SECRET,
    ENV_JOB_SECRET_FILE,
    AuthError,
    JobKey,
    Opener,
    Sealer,
)
from slurm_amoeba.runtime.coordinator import Coordinator, CoordinatorConfig
from slurm_amoeba.runtime.protocol import (
    EVENTS_KEY,
    PROGRESS_KEY,
    AssignAction,
    Assignment,
    EventKind,
    WorkerEvent,
    assignment_key,
    heartbeat_key,
)
from tests.unit.runtime.conftest import ReferenceRun
from tests.unit.runtime.jobs import ToyJob, final_params
from tests.unit.runtime.test_elastic_job import assert_same_params
from tests.waiting import wait_until

KEY = "amoeba/assign/w0/3"


def test_a_sealed_value_opens_only_with_the_secret_for_its_key_and_sender() -> None:
    key = JobKey.new()
    sealed = Sealer(key, "w0").seal(KEY, "hello")
    assert Opener(key).open(KEY, sealed, sender="w0") == "hello"
    with pytest.raises(AuthError, match="HMAC"):
        Opener(JobKey.new()).open(KEY, sealed)  # another job's secret
    with pytest.raises(AuthError, match="HMAC"):
        Opener(key).open("amoeba/assign/w0/4", sealed)  # copied to another key
    with pytest.raises(AuthError, match="not by 'w1'"):
        Opener(key).open(KEY, sealed, sender="w1")
    header, text = sealed.split("\n", 1)
    doc = json.loads(header)
    assert text == "hello", "the text follows the header as it is"
    with pytest.raises(AuthError, match="HMAC"):
        Opener(key).open(KEY, f"{header}\nhellO")
    for field, value in (("s", "w1"), ("n", doc["n"] + 1), ("e", "00")):
        with pytest.raises(AuthError, match="HMAC"):
            Opener(key).open(KEY, json.dumps({**doc, field: value}) + "\nhello")


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[" * 100_000 + b"\n",
        b'{"s": 1}\n',
        b'{"s":"a","e":"b","n":true,"h":""}\nx',
        b'{"s":"a","e":"b","n":1,"h":""}',  # no newline: no text
    ],
)
def test_garbage_is_refused_as_unsealed(raw: bytes) -> None:
    opener = Opener(JobKey.new())
    with pytest.raises(AuthError):
        opener.open(KEY, raw)
    assert opener.refused == 1


def test_a_replayed_value_is_refused_where_freshness_counts() -> None:
    key = JobKey.new()
    sealer, opener = Sealer(key, "w0"), Opener(key)
    first, second = sealer.seal(KEY, "a"), sealer.seal(KEY, "b")
    assert opener.open(KEY, first, fresh=True) == "a" and opener.open(KEY, second, fresh=True) == "b"
    for old in (first, second):
        with pytest.raises(AuthError, match="replayed"):
            opener.open(KEY, old, fresh=True)
    restarted = Sealer(key, "w0")  # a new process with the same id: a new epoch, counted on its own
    assert opener.open(KEY, restarted.seal(KEY, "c"), fresh=True) == "c"


def test_the_secret_file_is_0600_and_a_readable_one_is_refused(tmp_path: Path) -> None:
    key = JobKey.new()
    path = key.write(tmp_path / "job.secret")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = JobKey.from_environ({ENV_JOB_SECRET_FILE: str(path)})
    sealed = Sealer(key, "w0").seal(KEY, "x")
    assert Opener(again).open(KEY, sealed) == "x"
    path.chmod(0o644)
    with pytest.raises(SpecError, match="readable by others"):
        JobKey.from_environ({ENV_JOB_SECRET_FILE: str(path)})
    with pytest.raises(SpecError, match="no job secret"):
        JobKey.from_environ({})
    with pytest.raises(SpecError, match="not hex"):
        JobKey.from_environ({ENV_JOB_SECRET: "zz" * 32})


def test_the_coordinator_hands_the_secret_in_a_file_or_the_environment(tmp_path: Path) -> None:
    secret_file = tmp_path / "job.secret"
    with Coordinator(CoordinatorConfig(job_id="job1", secret_file=str(secret_file))) as coordinator:
        env = coordinator.worker_env("w0")
        assert env[ENV_JOB_SECRET_FILE] == str(secret_file) and ENV_JOB_SECRET not in env
        assert JobKey.from_environ(env).hex() == coordinator.job_key.hex()
    with Coordinator(CoordinatorConfig(job_id="job2")) as coordinator:
        assert coordinator.worker_env("w0")[ENV_JOB_SECRET] == coordinator.job_key.hex()


class Intruder:
    """A client of the job's store without the job's secret."""

    def __init__(self, port: int) -> None:
        timeout = datetime.timedelta(seconds=10)
        self.store = TCPStore("127.0.0.1", port, is_master=False, timeout=timeout, use_libuv=True)

    def push(self, kind: EventKind, worker: str, **fields: object) -> None:
        event = WorkerEvent(kind=kind, worker=worker, time=time.time(), **fields)  # type: ignore[arg-type]
        self.store.queue_push(EVENTS_KEY, event.to_json())

    def sealed_without_the_secret(self, worker: str) -> None:
        """Events sealed with a key of its own, claiming to be ``worker``."""
        sealer = Sealer(JobKey.new(), worker)
        event = WorkerEvent(kind=EventKind.READY, worker=worker, time=time.time(), allowed_sizes=(1,))
        self.store.queue_push(EVENTS_KEY, sealer.seal(EVENTS_KEY, event.to_json()))

    def attack(self, members: tuple[str, ...]) -> None:
        self.push(EventKind.REGISTERED, "intruder", pid=os.getpid(), host="localhost")
        self.push(EventKind.READY, "intruder", allowed_sizes=(1, 2, 3))
        self.store.set(heartbeat_key("intruder"), repr(time.time()))
        for member in members:
            self.push(EventKind.READY, member, allowed_sizes=(7,))  # only members may change what members share
            self.push(EventKind.ERROR, member, message="forged")
            self.sealed_without_the_secret(member)
            for seq in range(1, 8):  # forged future assignments: ignored, and replaced by the coordinator's own
                key = assignment_key(member, seq)
                if not self.store.check([key]):
                    self.store.set(key, Assignment(AssignAction.LEAVE, reason="forged").to_json())
        self.store.set(PROGRESS_KEY, json.dumps({"world_size": 99, "samples_per_s": 1e9, "step_time_s": 1e-9}))


@pytest.mark.timeout(200)
def test_a_client_without_the_secret_cannot_join_or_steer_a_running_job(
    tmp_path: Path, fixed_run: ReferenceRun
) -> None:
    out = tmp_path / "attacked"
    with ToyJob(out, workers=2, hold=True, extra_args=["--step-delay", "0.01"]) as toy:
        job = toy.job
        toy.release(4)
        view = toy.wait_members(2)
        toy.wait_held(4)
        assert view.plan is not None
        intruder = Intruder(job.coordinator.port)
        refused = job.coordinator.view().refused
        intruder.attack(view.plan.members)
        attacked_at = time.time()
        forged = 2 + 3 * len(view.plan.members)  # the events Intruder.attack pushes
        wait_until(
            "the coordinator to read every forged event", lambda: job.coordinator.view().refused >= refused + forged
        )
        wait_until(
            "the coordinator to read a progress report rank 0 wrote after the forged one",
            lambda: job.coordinator.view().progress.get("time", 0.0) > attacked_at,
        )
        view = job.coordinator.view()
        assert "intruder" not in view.workers and view.world_size == 2
        assert 99 not in view.throughput
        assert {w.status.value for w in view.workers.values()} == {"member"}
        assert job.coordinator._opener.refused >= 6
        result = toy.finish()
    assert result.phase.value == "finished", result
    assert [r.plan.world_size for r in result.view.history] == [2], "no switch was forced"
    assert "intruder" not in result.view.workers
    assert_same_params(fixed_run, final_params(out), expected_workers=2)
    assert set(result.returncodes.values()) == {0}, "no forged LEAVE was obeyed"
