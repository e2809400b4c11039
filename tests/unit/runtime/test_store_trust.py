"""The job's rendezvous is the job's (issue 11, part 3): every runtime key sealed, worker ids issued by the
coordinator, the store bound to the workers' address, and an intruder at a running job's store during a resize.

The intruders are TCPStore clients in the test process: one without any secret, one with a secret of its own. To
attack the keys of a generation, which live under a token derived from the job's secret, the test lends them the
key *names* (computed with the coordinator's secret) but never the secret itself: the values they write there are
refused because they are not sealed with it, not only because they are hard to find.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from torch._C._distributed_c10d import TCPStore

from slurm_amoeba.core.runtime_env import WorkerEnv
from slurm_amoeba.runtime.auth import COORDINATOR, ENV_JOB_SECRET, JobAuth, JobKey, Sealer, join_job
from slurm_amoeba.runtime.coordinator import Coordinator, CoordinatorConfig, store_bind_address
from slurm_amoeba.runtime.errors import RuntimeTimeout
from slurm_amoeba.runtime.membership import Membership, MembershipConfig, Phase
from slurm_amoeba.runtime.protocol import (
    EVENTS_KEY,
    JOIN_KEY,
    WANT_KEY,
    AssignAction,
    Assignment,
    EventKind,
    JoinRequest,
    WorkerEvent,
    abort_key,
    arrival_key,
    assignment_key,
    heartbeat_key,
    join_answer_key,
    manifest_key,
)
from tests.unit.runtime.conftest import ReferenceRun
from tests.unit.runtime.jobs import ToyJob, final_params
from tests.unit.runtime.test_elastic_job import assert_same_params


def _client(port: int, host: str = "127.0.0.1") -> TCPStore:
    return TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=10), use_libuv=True)


def _reachable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        code = probe.connect_ex((host, port))
    assert code in (0, errno.ECONNREFUSED), os.strerror(code)
    return code == 0


def _listening(port: int) -> list[str]:
    """Local addresses listening on ``port``, as ``ss -ltn`` shows them."""
    ss = shutil.which("ss")
    assert ss is not None
    out = subprocess.run([ss, "-ltnH", f"sport = :{port}"], capture_output=True, text=True, timeout=10, check=True)
    return sorted({line.split()[3] for line in out.stdout.splitlines()})


def test_the_store_listens_on_the_workers_address_only_where_torch_alone_listens_on_every_one() -> None:
    with Coordinator(CoordinatorConfig(job_id="bound", advertise_addr="127.0.0.1")) as coordinator:
        port = coordinator.port
        assert _reachable("127.0.0.1", port)
        assert not _reachable("127.0.0.2", port), "another address of this host reaches the store"
        if shutil.which("ss"):
            assert _listening(port) == [f"127.0.0.1:{port}"]
    # torch's own server, given the same host, listens on every address (the reason for master_listen_fd)
    plain = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True)
    assert _reachable("127.0.0.2", plain.port)
    assert store_bind_address("10.1.2.3") == "10.1.2.3" and store_bind_address("fd00::2") == "fd00::2"
    assert store_bind_address("node07") == "0.0.0.0"  # a host name: every address (it may resolve to 127.0.1.1)


def _env(coordinator: Coordinator, hint: str, **extra: str) -> dict[str, str]:
    return {**coordinator.worker_env(hint), "AMOEBA_COLLECTIVE_TIMEOUT_S": "1", **extra}


def test_the_coordinator_issues_worker_ids_only_to_holders_of_the_secret() -> None:
    with Coordinator(CoordinatorConfig(job_id="ids", loop_interval_s=0.002)) as coordinator:
        env = _env(coordinator, "g0-0")
        key = JobKey.from_environ(env)
        assert join_job(WorkerEnv.from_environ(env), key).worker_id == "g0-0"  # the launcher's hint, when free
        again = join_job(WorkerEnv.from_environ(env), key).worker_id
        assert again != "g0-0", "a second process asking for a taken id gets another"
        for secret in (JobKey.new().hex(), "00" * 32):
            wrong = _env(coordinator, "g0-1", **{ENV_JOB_SECRET: secret})
            with pytest.raises(RuntimeTimeout, match="not this job's secret"):
                join_job(WorkerEnv.from_environ(wrong), JobKey.from_environ(wrong))
        store = _client(coordinator.port)
        nonces = ["a" * 32, "b" * 32]
        store.queue_push(JOIN_KEY, JoinRequest(nonces[0], "g0-1").to_json())  # no seal at all
        sealed = Sealer(key, "g0-2").seal(JOIN_KEY, JoinRequest(nonces[1], "g0-2").to_json())
        store.queue_push(JOIN_KEY, sealed)
        deadline = time.monotonic() + 10
        while not store.check([join_answer_key(nonces[1])]):
            assert time.monotonic() < deadline, "the sealed request was not answered"
            time.sleep(0.01)
        refused = coordinator.refused
        store.delete_key(join_answer_key(nonces[1]))
        store.queue_push(JOIN_KEY, sealed)  # replayed: its nonce was answered
        ghost = WorkerEvent(kind=EventKind.REGISTERED, worker="ghost", time=time.time())
        store.queue_push(EVENTS_KEY, Sealer(key, "ghost").seal(EVENTS_KEY, ghost.to_json()))  # never issued
        coordinator.wait_until(lambda v: v.refused >= refused + 2, 10, "the replay and the ghost refused")
        assert not store.check([join_answer_key(nonces[0])]) and not store.check([join_answer_key(nonces[1])])
        assert "ghost" not in coordinator.view().workers and "g0-1" not in coordinator.view().workers


def _ready(worker: str, sizes: tuple[int, ...] = ()) -> WorkerEvent:
    return WorkerEvent(kind=EventKind.READY, worker=worker, time=0.0, allowed_sizes=sizes)


def test_only_members_change_the_allowed_sizes() -> None:
    membership = Membership(MembershipConfig(initial_workers=2))
    assert membership.handle(_ready("a", (1, 2, 4)), 0.0) and membership.handle(_ready("b", (1, 2, 4)), 0.0)
    membership.decide(0.0)
    assert membership.phase is Phase.RUNNING and membership.plan is not None
    assert not membership.handle(_ready("c", (3,)), 1.0), "a joiner may not change what members share"
    assert membership.allowed_sizes == (1, 2, 4) and membership.workers["c"].status.value == "ready"
    assert membership.handle(_ready("d", (1, 2, 4)), 1.0), "the sizes the members share are no change"
    assert membership.handle(_ready("a", (1, 2)), 2.0) and list(membership.allowed_sizes) == [1, 2]


class Intruder:
    """A client of the job's store that holds no secret, or (``own_secret``) a secret that is not the job's."""

    def __init__(self, port: int, *, own_secret: bool) -> None:
        self.store = _client(port)
        self.key = JobKey.new() if own_secret else None

    def value(self, store_key: str, text: str, sender: str) -> str:
        return text if self.key is None else Sealer(self.key, sender).seal(store_key, text)

    def put(self, store_key: str, text: str, sender: str = COORDINATOR) -> None:
        self.store.set(store_key, self.value(store_key, text, sender))

    def attack(self, job_auth: JobAuth, member: str) -> None:
        """Join, steer the running generation, and plant values where the next one will look."""
        nonce = os.urandom(16).hex()
        self.store.queue_push(JOIN_KEY, self.value(JOIN_KEY, JoinRequest(nonce, "intruder").to_json(), "intruder"))
        event = WorkerEvent(kind=EventKind.READY, worker=member, time=time.time(), allowed_sizes=(1,))
        self.store.queue_push(EVENTS_KEY, self.value(EVENTS_KEY, event.to_json(), member))
        self.put(WANT_KEY, "1")  # would make the members switch at once
        self.put(abort_key(1, job_auth.token(1)), "forged abort")
        token = job_auth.token(2)  # the names of the next generation's keys (lent by the test, see above)
        self.put(abort_key(2, token), "forged abort")
        for worker in (member, "w1", "w2"):
            self.put(arrival_key(2, token, worker), "1", worker)
        forged: dict[str, object] = {"tensors": [], "skeleton": None, "forged": True}
        self.put(manifest_key(2, token), json.dumps(forged), member)
        leave = Assignment(AssignAction.LEAVE, reason="forged").to_json()
        for worker, seq in ((member, 1), ("w1", 0)):  # what the member and the joiner read next
            self.put(assignment_key(worker, seq), leave)


def _replay(coordinator: Coordinator, member: str) -> None:
    """Copy the coordinator's first assignment of ``member`` to the key of its next one (sealed, for another key),
    and a heartbeat of ``member`` back after it moved on (sealed, seen before), until the coordinator refuses it."""
    store = _client(coordinator.port)
    store.set(assignment_key(member, 1), store.get(assignment_key(member, 0)).decode())
    refused = coordinator.refused
    deadline = time.monotonic() + 20
    beat = store.get(heartbeat_key(member)).decode()
    while coordinator.refused == refused:
        assert time.monotonic() < deadline, "the replayed heartbeat was never refused"
        if store.get(heartbeat_key(member)).decode() != beat:
            # Leave the member's new beat in place for a few of the coordinator's reads (every 0.1 s) before the old
            # one goes back: the coordinator opens a heartbeat only when it differs from the last one it read, so a
            # replay written before it read the new beat looks unchanged and is never opened.
            time.sleep(0.3)
            store.set(heartbeat_key(member), beat)
        time.sleep(0.02)


@pytest.mark.timeout(200)
def test_intruders_with_no_secret_or_a_wrong_one_cannot_join_steer_or_feed_a_resizing_job(
    tmp_path: Path, fixed_run: ReferenceRun
) -> None:
    out = tmp_path / "attacked"
    with ToyJob(out, workers=1, hold=True, extra_args=["--step-delay", "0.01"]) as toy:
        job = toy.job
        toy.release(4)
        view = toy.wait_members(1)
        toy.wait_held(4)
        assert view.plan is not None
        (member,) = view.plan.members
        job_auth = JobAuth(job.coordinator.job_key, "test")
        for own_secret in (False, True):
            Intruder(job.coordinator.port, own_secret=own_secret).attack(job_auth, member)
        job.coordinator.wait_until(lambda v: v.refused >= 4, 10, "the forged events and joins refused")
        _replay(job.coordinator, member)
        toy.release(8)
        toy.wait_held(8)
        view = job.coordinator.view()
        assert [r.plan.world_size for r in view.history] == [1], "a forged want or abort was obeyed"
        (joiner,) = job.add(1)  # generation 2 forms where the forged arrivals, abort and manifest wait
        toy.release(12)
        view = toy.wait_members(2)
        result = toy.finish()
    assert result.phase.value == "finished", result
    assert [r.plan.world_size for r in result.view.history] == [1, 2], "one switch, no forced or aborted one"
    assert set(result.view.workers) == {member, joiner}
    assert result.view.refused >= 5
    assert_same_params(fixed_run, final_params(out), expected_workers=2)
    assert set(result.returncodes.values()) == {0}, "no forged LEAVE was obeyed"
