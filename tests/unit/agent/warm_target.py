"""A worker command for tests/unit/agent/test_warm.py: writes what it was started with, then exits as told.

``python warm_target.py OUT_DIR [wait]``: writes ``OUT_DIR/<worker id>.json`` (its argv, ``__name__``, pid, parent
pid, the variables a task gets, its garbage collector's state) and exits with its task number; with ``wait`` it
first waits for SIGTERM (a satellite's shrink) and exits 0 once it came.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import time
from pathlib import Path


def main() -> int:
    out = Path(sys.argv[1])
    worker = os.environ["AMOEBA_WORKER_ID"]
    record = {
        "argv": sys.argv,
        "name": __name__,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "procid": os.environ.get("SLURM_PROCID"),
        "devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cpus": sorted(os.sched_getaffinity(0)),
        "gc_enabled": gc.isenabled(),
        "frozen": gc.get_freeze_count(),
    }
    print(f"worker {worker} running")
    if sys.argv[2:] == ["wait"]:
        told: list[int] = []
        signal.signal(signal.SIGTERM, lambda signum, frame: told.append(signum))
        (out / f"{worker}.ready").write_text("")
        deadline = time.monotonic() + 20
        while not told and time.monotonic() < deadline:
            time.sleep(0.01)
        record["told"] = told
        (out / f"{worker}.json").write_text(json.dumps(record))
        return 0
    (out / f"{worker}.json").write_text(json.dumps(record))
    return int(os.environ["SLURM_PROCID"])


if __name__ == "__main__":
    sys.exit(main())
