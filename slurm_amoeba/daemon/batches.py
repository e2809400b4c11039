"""The global batch the ``goodput`` policy chose for adaptive jobs, sent with their resize directives.

Part of the decide step (:func:`slurm_amoeba.daemon.rounds.decide`), pure. For a managed job whose runtime reported
adaptive-batch statistics, the snapshot put its goodput model in ``JobInfo.adaptive``; the policy's batch at a size
is the model's best there (:meth:`slurm_amoeba.policy.goodput.GoodputModel.best`, what the policy assumed when it
weighed the job's goodput). A resize of such a job carries the batch for its new size; a job the policy leaves at
its size gets a directive to the same size carrying only a new batch when its batch has drifted from the model's
best by :data:`REBATCH_FACTOR` or more (the noise scale grows as training goes on), unless it is pinned, moving
or sharing GPUs (a job of fixed size gets such batch-only directives too). Only the ``goodput`` policy's
decisions carry batches: other policies weigh sizes only, and the job's runtime keeps choosing its own batch
(docs/runtime.md section 12). Jobs with a fixed batch, or whose user sets the batch, never get one.
"""

from __future__ import annotations

from collections.abc import Mapping

from slurm_amoeba.policy.types import JobInfo

#: The policy whose decisions carry batches.
BATCH_POLICY = "goodput"
#: A job the policy keeps at its size is sent a new batch only when its own differs by this factor or more.
REBATCH_FACTOR = 1.25


def policy_batches(
    policy_name: str, managed: Mapping[str, JobInfo], targets: Mapping[str, int], reasons: Mapping[str, str]
) -> tuple[dict[str, int], dict[str, str], dict[str, int]]:
    """The directives with the policy's batches (see the module docstring).

    Args:
        policy_name: the configured policy's name.
        managed: job id -> the managed jobs as the snapshot shows them.
        targets: job id -> the size ordered (:func:`~slurm_amoeba.daemon.rounds.resize_targets`).
        reasons: job id -> why.

    Returns:
        ``(targets, reasons, batches)``: the targets and reasons with the batch-only directives added, and job id ->
        the global batch to send.
    """
    out_targets, out_reasons = dict(targets), dict(reasons)
    batches: dict[str, int] = {}
    if policy_name != BATCH_POLICY:
        return out_targets, out_reasons, batches
    for job_id, info in managed.items():
        model = info.adaptive
        if model is None or info.batch is None:
            continue
        if job_id in targets:
            batches[job_id] = model.best(targets[job_id])[0]
            continue
        if info.pinned or info.resizing or info.shared_with is not None:  # its size need not be elastic
            continue
        best = model.best(info.workers)[0]
        if max(best, info.batch) >= REBATCH_FACTOR * min(best, info.batch):
            out_targets[job_id] = info.workers
            out_reasons[job_id] = f"goodput: global batch {best} at {info.workers} workers (it runs {info.batch})"
            batches[job_id] = best
    return out_targets, out_reasons, batches


__all__ = ["BATCH_POLICY", "REBATCH_FACTOR", "policy_batches"]
