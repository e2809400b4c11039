"""The worker side of :class:`~slurm_amoeba.launcher.executor.ElasticExecutor`: run the submitted function.

``python -m slurm_amoeba.launcher.fn_worker`` runs in every worker of the job (started by the agent). It
loads the function submitit pickled into the job folder (a file, never a socket), calls it, and, on the worker that
is rank 0 when the function returns, writes submitit's result file, so that ``job.result()`` is rank 0's return
value. A failure on rank 0 is written as submitit's error outcome (the traceback), so ``job.result()`` raises it.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

from submitit.core import utils

from slurm_amoeba.core.jobenv import ENV_JOB_FOLDER, ENV_PARENT_JOB

PICKLE_WAIT_S = 120.0


def _is_rank_zero() -> bool:
    # The runtime keeps RANK current for each generation (torchrun contract); a worker that never joined has none.
    return os.environ.get("RANK") == "0"


def main(argv: list[str] | None = None) -> int:
    """Run the job's function (see the module docstring)."""
    args = sys.argv[1:] if argv is None else argv
    folder = os.environ.get(ENV_JOB_FOLDER, "")
    if args or not folder:
        print(
            "usage: AMOEBA_JOB_FOLDER=DIR python -m slurm_amoeba.launcher.fn_worker (the executor sets it)",
            file=sys.stderr,
        )
        return 2
    job_id = os.environ.get(ENV_PARENT_JOB) or os.environ.get("SLURM_JOB_ID", "")
    paths = utils.JobPaths(Path(folder), job_id=job_id, task_id=0)
    deadline = time.monotonic() + PICKLE_WAIT_S
    while not paths.submitted_pickle.exists():  # submitit moves it into place right after sbatch returns
        if time.monotonic() > deadline:
            print(f"amoeba worker: {paths.submitted_pickle} did not appear in {PICKLE_WAIT_S:g} s", file=sys.stderr)
            return 1
        time.sleep(0.1)
    delayed = utils.DelayedSubmission.load(paths.submitted_pickle)
    try:
        result = delayed.function(*delayed.args, **delayed.kwargs)
    except Exception:  # any failure of the user's function is submitit's error outcome
        trace = traceback.format_exc()
        print(trace, file=sys.stderr)
        if _is_rank_zero() and not paths.result_pickle.exists():
            utils.cloudpickle_dump(("error", trace), paths.result_pickle)
        return 1
    if _is_rank_zero():
        tmp = paths.result_pickle.with_suffix(".tmp")
        utils.cloudpickle_dump(("success", result), tmp)
        tmp.replace(paths.result_pickle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
