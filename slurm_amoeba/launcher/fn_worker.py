"""The worker side of :class:`~slurm_amoeba.launcher.executor.ElasticExecutor`: run the submitted function.

``python -m slurm_amoeba.launcher.fn_worker`` runs in every worker of the job (started by the agent). It
loads the function submitit pickled into the job folder (a file, never a socket), calls it, and, on the worker that
is rank 0 when the function returns, writes submitit's result file, so that ``job.result()`` is rank 0's return
value. A failure on rank 0 is written as submitit's error outcome (the traceback), so ``job.result()`` raises it.

What the function prints (``sys.stdout``/``sys.stderr``, ``logging`` included) still goes to the worker's own log
in the agent's state folder, and, while this worker is rank 0, is copied to submitit's ``<job id>_0_log.out`` and
``.err``: ``job.stdout()`` and ``job.stderr()`` thus show rank 0's output even when rank 0 moves to another worker
after a resize. Before the first generation (no ``RANK`` yet) the main allocation's first worker counts as rank 0.
Output written below Python (a C library's ``printf``) stays in the worker's own log only.
"""

from __future__ import annotations

import io
import os
import sys
import time
import traceback
from pathlib import Path
from typing import TextIO

from submitit.core import utils

from slurm_amoeba.core.jobenv import ENV_JOB_FOLDER, ENV_PARENT_JOB
from slurm_amoeba.core.runtime_env import ENV_WORKER_ID

PICKLE_WAIT_S = 120.0


#: The worker id of the main allocation's first worker (group g0, task 0): rank 0 until the first generation forms.
FIRST_WORKER_ID = "g0-0"


def _is_rank_zero() -> bool:
    # The runtime keeps RANK current for each generation (torchrun contract); a worker that never joined has none.
    return os.environ.get("RANK") == "0"


def _writes_for_rank_zero() -> bool:
    rank = os.environ.get("RANK")
    return rank == "0" if rank is not None else os.environ.get(ENV_WORKER_ID) == FIRST_WORKER_ID


class RankZeroCopy(io.TextIOBase):
    """A text stream that writes to ``stream`` and, while this worker is rank 0, appends to ``path`` too.

    Args:
        stream: the worker's own stream (its log).
        path: rank 0's file (submitit's stdout or stderr of the job).
    """

    def __init__(self, stream: TextIO, path: Path) -> None:
        super().__init__()
        self._stream = stream
        self._path = path
        self._copy: TextIO | None = None

    def write(self, text: str) -> int:
        """Write ``text`` to the stream, and to rank 0's file while this worker is rank 0."""
        written = self._stream.write(text)
        if _writes_for_rank_zero():
            if self._copy is None:
                self._copy = self._path.open("a", encoding="utf-8", errors="replace")
            self._copy.write(text)
            self._copy.flush()
        return written

    def flush(self) -> None:
        """Flush the worker's stream."""
        self._stream.flush()

    def fileno(self) -> int:
        """The worker's stream's descriptor (what a subprocess inherits)."""
        return self._stream.fileno()

    def isatty(self) -> bool:
        """Whether the worker's stream is a terminal."""
        return self._stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """The worker's stream's encoding."""
        return self._stream.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        """The worker's stream's error handling."""
        return self._stream.errors

    def __getattr__(self, name: str) -> object:
        # What TextIOBase lacks (``buffer``, ``reconfigure``, ...) is the worker's stream's: bytes written to
        # ``sys.stdout.buffer`` go to the worker's log only.
        return getattr(self._stream, name)


def checkpoint_submission(folder: Path, job_id: str) -> str:
    """submitit's ``Checkpointable`` convention, when the job is about to requeue itself (the agent calls it).

    A function with ``__submitit_checkpoint__`` (or ``checkpoint``) is asked, with the submitted arguments, for the
    submission to run after the requeue; what it returns replaces the submitted pickle, and None means "do not
    requeue", as with submitit. It is called in the agent, on the function as submitted: each worker's copy of the
    function ran in its own process, and the training state it built is in the runtime's final disk checkpoint,
    which every requeued job resumes from. A function without the method is requeued as it is, for that reason
    (submitit requeues it only on preemption).

    Returns:
        Why the job must not requeue, or empty.
    """
    paths = utils.JobPaths(folder, job_id=job_id, task_id=0)
    try:
        delayed = utils.DelayedSubmission.load(paths.submitted_pickle)
    except Exception as exc:  # unpickling raises anything the user's code raises on import
        return f"the submitted function cannot be read back from {paths.submitted_pickle}: {exc!r}"
    function = delayed.function
    checkpoint = getattr(function, "__submitit_checkpoint__", None) or getattr(function, "checkpoint", None)
    if checkpoint is None:
        return ""
    try:
        resubmitted = checkpoint(*delayed.args, **delayed.kwargs)
    except Exception as exc:  # the user's checkpoint(): any failure means no requeue, with its reason
        return f"checkpoint() raised {type(exc).__name__}: {exc}"
    if resubmitted is None:
        return "checkpoint function returned None"
    if not isinstance(resubmitted, utils.DelayedSubmission):
        return f"checkpoint() returned {type(resubmitted).__name__}, not a submitit DelayedSubmission"
    tmp = paths.submitted_pickle.with_suffix(".requeue.tmp")
    resubmitted.dump(tmp)
    tmp.replace(paths.submitted_pickle)
    return ""


def _submission_paths() -> utils.JobPaths | None:
    folder = os.environ.get(ENV_JOB_FOLDER, "")
    if not folder:
        return None
    job_id = os.environ.get(ENV_PARENT_JOB) or os.environ.get("SLURM_JOB_ID", "")
    return utils.JobPaths(Path(folder), job_id=job_id, task_id=0)


def warm_up() -> None:
    """Load the submitted function once in a satellite's warm process (:mod:`slurm_amoeba.agent.warm`), so that the
    workers it forks find its module, and what that module imports, already imported. Nothing is called."""
    paths = _submission_paths()
    if paths is not None and paths.submitted_pickle.exists():
        utils.DelayedSubmission.load(paths.submitted_pickle)


def main(argv: list[str] | None = None) -> int:
    """Run the job's function (see the module docstring)."""
    args = sys.argv[1:] if argv is None else argv
    paths = _submission_paths()
    if args or paths is None:
        print(
            "usage: AMOEBA_JOB_FOLDER=DIR python -m slurm_amoeba.launcher.fn_worker (the executor sets it)",
            file=sys.stderr,
        )
        return 2
    deadline = time.monotonic() + PICKLE_WAIT_S
    while not paths.submitted_pickle.exists():  # submitit moves it into place right after sbatch returns
        if time.monotonic() > deadline:
            print(f"amoeba worker: {paths.submitted_pickle} did not appear in {PICKLE_WAIT_S:g} s", file=sys.stderr)
            return 1
        time.sleep(0.1)
    delayed = utils.DelayedSubmission.load(paths.submitted_pickle)
    sys.stdout = RankZeroCopy(sys.stdout, paths.stdout)
    sys.stderr = RankZeroCopy(sys.stderr, paths.stderr)
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
