"""The ledger's count of registered agents per uid (what a registration's ``limits.agents_per_uid`` check reads, in
constant time however many agents a site has)."""

from __future__ import annotations

from slurm_amoeba.daemon.agents import Registration
from slurm_amoeba.daemon.config import DaemonConfig
from slurm_amoeba.daemon.ledger import Ledger
from slurm_amoeba.daemon.metrics import DaemonMetrics


def _registration(job_id: str) -> Registration:
    return Registration(job_id, "tcp://127.0.0.1:1", 1, 4, 1, "batch", "elastic")


def test_counts_each_uids_agents_through_registrations_again_and_ended_jobs() -> None:
    ledger = Ledger(DaemonConfig(), DaemonMetrics(), lambda: 0.0)
    for job_id in ("1", "2", "3"):
        ledger.register(_registration(job_id), 1000, "alice")
    ledger.register(_registration("4"), 2000, "bob")
    ledger.register(_registration("2"), 1000, "alice")  # its agent registers again: still one job
    assert (ledger.registered_by(1000), ledger.registered_by(2000)) == (3, 1)
    assert ledger.registered_by(1000, besides="2") == 2
    assert ledger.registered_by(2000, besides="2") == 1, "another uid's job is not taken off"
    ledger.forget(["1", "4"], active=["2", "3"])
    assert (ledger.registered_by(1000), ledger.registered_by(2000), ledger.registered_by(3000)) == (2, 0, 0)
    assert ledger.registered_by(1000) == sum(1 for agent in ledger.agents.values() if agent.uid == 1000)
