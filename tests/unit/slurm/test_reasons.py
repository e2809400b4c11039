"""squeue's pending-reason codes: which pending jobs free resources could start, which are held."""

from __future__ import annotations

import pytest

from slurm_amoeba.slurm.reasons import BLOCKED_REASONS, PendingReason, is_held, waits_for_resources


@pytest.mark.parametrize(
    ("reason", "waits"),
    [
        ("Resources", True),
        ("Priority", True),
        ("None", True),
        ("ReqNodeNotAvail, Reserved for maintenance", True),  # a code this module does not name
        ("JobHeldUser", False),
        ("JobHeldAdmin", False),
        ("Dependency", False),
        ("BeginTime", False),
        ("PartitionDown", False),
        ("QOSMaxGRESPerUser", False),
    ],
)
def test_only_blocked_reasons_keep_a_job_from_starting_on_free_resources(reason: str, waits: bool) -> None:
    assert waits_for_resources(reason) is waits


def test_every_blocked_reason_reads_as_blocked_by_its_squeue_code_and_the_rest_as_waiting() -> None:
    for reason in PendingReason:
        assert waits_for_resources(reason.value) is (reason not in BLOCKED_REASONS)


@pytest.mark.parametrize(("reason", "held"), [("JobHeldUser", True), ("JobHeldAdmin", True), ("Resources", False)])
def test_a_job_is_held_when_its_reason_says_so(reason: str, held: bool) -> None:
    assert is_held(reason) is held
