"""The submitit internals ElasticExecutor extends are still there, with the shapes it relies on.

The executor overrides submitit's private hooks and reads private state (see its module docstring); pyproject pins
submitit to the minor version these were checked against (``submitit>=1.5,<1.6``). When a new submitit changes any
of them, these tests fail and name what changed: adapt the executor, then widen the pin.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import re
from pathlib import Path

import pytest
import submitit
from submitit.core import core, utils

from slurm_amoeba.launcher.executor import ElasticExecutor, ElasticInfoWatcher, ElasticJob
from tests.unit.agent.fakes import FakeSlurm


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def test_the_installed_submitit_is_inside_the_pinned_range_and_the_pin_has_an_upper_bound() -> None:
    (requirement,) = [r for r in importlib.metadata.requires("slurm-amoeba") or [] if r.startswith("submitit")]
    bounds = dict(re.findall(r"(>=|<)\s*([\d.]+)", requirement))
    assert set(bounds) == {">=", "<"}, f"submitit must be pinned to a range with an upper bound: {requirement}"
    installed = _version(submitit.__version__)
    assert _version(bounds[">="]) <= installed < _version(bounds["<"]), (submitit.__version__, requirement)


@pytest.mark.parametrize(
    ("owner", "method", "parameters"),
    [
        (core.PicklingExecutor, "_internal_process_submissions", ["self", "delayed_submissions"]),
        (core.PicklingExecutor, "_submit_command", ["self", "command"]),
        (core.PicklingExecutor, "_make_submission_file_text", ["self", "command", "uid"]),
        (core.PicklingExecutor, "_make_submission_command", ["self", "submission_file_path"]),
        (core.PicklingExecutor, "_get_job_id_from_submission_command", ["string"]),
        (core.PicklingExecutor, "_num_tasks", ["self"]),
        (core.Executor, "_valid_parameters", ["cls"]),
        (core.Executor, "_internal_update_parameters", ["self", "kwargs"]),
        (core.Executor, "map_array", ["self", "fn", "iterable"]),
        (core.Executor, "submit_array", ["self", "fns"]),
        (core.Job, "__init__", ["self", "folder", "job_id", "tasks"]),
        (core.Job, "_get_outcome_and_result", ["self"]),
        (core.InfoWatcher, "get_info", ["self", "job_id", "mode"]),
        (core.InfoWatcher, "is_done", ["self", "job_id", "mode"]),
        (utils.JobPaths, "__init__", ["self", "folder", "job_id", "task_id"]),
        (utils.JobPaths, "move_temporary_file", ["self", "tmp_path", "name", "keep_as_symlink"]),
        (utils.DelayedSubmission, "load", ["cls", "filepath"]),
        (utils, "cloudpickle_dump", ["obj", "filename"]),
    ],
)
def test_the_hooks_the_executor_uses_keep_their_signatures(owner: object, method: str, parameters: list[str]) -> None:
    function = getattr(owner, method, None)
    assert function is not None, (
        f"submitit {submitit.__version__}: {getattr(owner, '__name__', owner)}.{method} is gone"
    )
    found = list(inspect.signature(function).parameters)
    if inspect.ismethod(function):  # a classmethod, bound: its first parameter is not listed
        found = ["cls", *found]
    assert found == parameters, f"submitit {submitit.__version__}: {method}{found}, the executor expects {parameters}"


def test_the_private_state_the_executor_reads_is_there(tmp_path: Path) -> None:
    watcher = ElasticInfoWatcher(FakeSlurm())
    for name in ("_registered", "_finished", "_info_dict", "_num_calls", "_last_status_check"):
        assert hasattr(watcher, name), f"submitit {submitit.__version__}: InfoWatcher.{name} is gone"
    executor = ElasticExecutor(folder=tmp_path)
    assert hasattr(executor, "_submitit_command_str") and hasattr(executor, "_throttle")
    paths = utils.JobPaths(tmp_path, job_id="5", task_id=0)
    for name in ("submitted_pickle", "result_pickle", "stdout", "stderr", "folder", "submission_file"):
        assert isinstance(getattr(paths, name), Path), f"submitit {submitit.__version__}: JobPaths.{name}"
    assert paths.stdout.name == "5_0_log.out" and paths.result_pickle.name == "5_0_result.pkl"


def test_a_job_reads_the_result_file_the_worker_writes(tmp_path: Path) -> None:
    paths = utils.JobPaths(tmp_path, job_id="9", task_id=0)
    utils.cloudpickle_dump(("success", {"loss": 0.5}), paths.result_pickle)
    job: ElasticJob[dict[str, float]] = ElasticJob(
        folder=tmp_path, job_id="9", tasks=[0], watcher=ElasticInfoWatcher(FakeSlurm())
    )
    assert job.done() and job.result() == {"loss": 0.5}
