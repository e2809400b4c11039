"""Joiners that misbehave at admission (not a test module); they speak the worker protocol themselves.

``fake_joiner.py die``: reports ready and SIGKILLs itself when told to join, before it forms the process group
(the issue's "joiner SIGKILLed right after admission", made deterministic). ``fake_joiner.py no-show``: stays alive
and keeps its heartbeat, but never arrives to form a generation; once the coordinator aborts the generation it
reports the failure like a real member, and waits to be admitted again (a worker stuck before its process group).
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time
from typing import Any

from torch._C._distributed_c10d import TCPStore

from slurm_amoeba.core.runtime_env import WorkerEnv
from slurm_amoeba.runtime.auth import COORDINATOR, JobAuth, JobKey, join_job
from slurm_amoeba.runtime.protocol import (
    EVENTS_KEY,
    AssignAction,
    Assignment,
    EventKind,
    WorkerEvent,
    abort_key,
    assignment_key,
    heartbeat_key,
)


class Fake:
    """The protocol side of a worker, without training."""

    def __init__(self) -> None:
        key = JobKey.from_environ(os.environ)  # it holds the job's secret, as every worker the job launched
        self.env = join_job(WorkerEnv.from_environ(os.environ), key)  # and asks the coordinator for its id
        timeout = datetime.timedelta(seconds=30)
        self.store = TCPStore(self.env.store_addr, self.env.store_port, is_master=False, timeout=timeout)
        self.auth = JobAuth(key, self.env.worker_id)
        self.sealer, self.opener = self.auth.sealer, self.auth.opener

    def push(self, kind: EventKind, **fields: Any) -> None:
        event = WorkerEvent(kind=kind, worker=self.env.worker_id, time=time.time(), **fields)
        self.store.queue_push(EVENTS_KEY, self.sealer.seal(EVENTS_KEY, event.to_json()))

    def wait_for(self, key: str) -> None:
        """Wait for a store key, heartbeating meanwhile."""
        deadline = time.monotonic() + 120
        while not self.store.check([key]):
            beat = heartbeat_key(self.env.worker_id)
            self.store.set(beat, self.sealer.seal(beat, repr(time.time())))
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {key} within 120 s")
            time.sleep(0.01)


def main(mode: str) -> int:
    """Register, report ready, then misbehave at each admission as ``mode`` says."""
    fake = Fake()
    fake.push(EventKind.REGISTERED, pid=os.getpid(), host="localhost")
    fake.push(EventKind.READY)
    seq = 0
    while True:
        key = assignment_key(fake.env.worker_id, seq)
        fake.wait_for(key)
        seq += 1
        assignment = Assignment.from_json(fake.opener.open(key, fake.store.get(key), sender=COORDINATOR))
        print(f"assignment {seq - 1}: {assignment.action.value} {assignment.reason}", flush=True)
        if assignment.action is AssignAction.STANDBY:
            continue
        if assignment.action is not AssignAction.JOIN or assignment.plan is None:
            return 0
        if mode == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        generation = assignment.plan.generation
        fake.wait_for(abort_key(generation, fake.auth.token(generation)))
        fake.push(EventKind.REPORT, generation=generation, step=-1, committed_step=-1, failed=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
