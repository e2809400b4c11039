"""A joiner that dies the moment it is admitted (not a test module): it speaks the worker protocol, reports ready,
waits for its first assignment, and SIGKILLs itself when told to join, before it forms the process group.

That is the issue's "joiner SIGKILLed right after admission", made deterministic.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time

from torch._C._distributed_c10d import TCPStore

from slurm_amoeba.core.runtime_env import WorkerEnv
from slurm_amoeba.runtime.protocol import (
    EVENTS_KEY,
    AssignAction,
    Assignment,
    EventKind,
    WorkerEvent,
    assignment_key,
    heartbeat_key,
)


def main() -> int:
    """Register, report ready with the toy job's sizes, die at the first join."""
    env = WorkerEnv.from_environ(os.environ)
    store = TCPStore(env.store_addr, env.store_port, is_master=False, timeout=datetime.timedelta(seconds=30))
    for kind in (EventKind.REGISTERED, EventKind.READY):
        event = WorkerEvent(kind=kind, worker=env.worker_id, time=time.time(), pid=os.getpid(), host="localhost")
        store.queue_push(EVENTS_KEY, event.to_json())
    key = assignment_key(env.worker_id, 0)
    deadline = time.monotonic() + 120
    while not store.check([key]):
        store.set(heartbeat_key(env.worker_id), repr(time.time()))
        if time.monotonic() > deadline:
            return 3
        time.sleep(0.01)
    if Assignment.from_json(store.get(key)).action is AssignAction.JOIN:
        print("admitted: dying before the group forms", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
