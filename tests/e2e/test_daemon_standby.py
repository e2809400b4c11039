"""A standby pair of amoebad (docs/admin.md 5b): SIGKILL of the active daemon while a real elastic job runs; the
standby takes over within the stated bound, the job keeps its size, nothing is ordered twice, and a resize after the
takeover works.

Both daemons run on the cluster's bridge address (10.77.0.1, which the agents in the nodes' namespaces reach) on two
ports, sharing one directory for their lease and state file, as two hosts share a file system. The agent is given
both addresses.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slurm_amoeba.daemon.config import load_config
from slurm_amoeba.slurm import CliSlurmClient
from tests.conftest import ClusterHandle
from tests.e2e.test_daemon_restart import agent_history, env  # noqa: F401 (env is a fixture)
from tests.integration.daemon_helpers import DaemonProcess, end_job, submit_mlp_job, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]

#: The pair's lease timing: short, so that the test runs in a minute; the bound below follows from it.
HA = {"renew_s": 1.0, "expiry_s": 4.0, "margin_s": 1.0}


def standby_pair(cluster: ClusterHandle, workdir: Path) -> tuple[DaemonProcess, DaemonProcess]:
    """Two daemons sharing ``workdir/shared`` (lease and state file), each with its own port, config and log."""
    shared = workdir / "shared"
    shared.mkdir(exist_ok=True)
    first = DaemonProcess(cluster, workdir, host="10.77.0.1", name="first", shared=shared, ha=HA)
    second = DaemonProcess(cluster, workdir, host="10.77.0.1", name="second", shared=shared, ha=HA)
    return first, second


def takeover_bound_s(daemon: DaemonProcess) -> float:
    """The bound amoebad states for this configuration (``amoebad --check`` prints it)."""
    config = load_config(daemon.config)
    return config.ha.takeover_bound_s(config.interval_s)


def sizes(daemon: DaemonProcess) -> list[tuple[int, int]]:
    return [(j["size"], j["target"]) for j in daemon.status_jobs()]


def test_sigkill_of_the_active_daemon_hands_the_job_to_the_standby_within_the_bound(
    slurm_cluster: ClusterHandle,
    env: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    first, second = standby_pair(slurm_cluster, tmp_path)
    first.start()
    wait_until("the first daemon to take the lease", lambda: first.role() == "active", 30)
    second.start()
    assert second.role() == "standby"
    client = CliSlurmClient(env)
    job_id = ""
    try:
        job_id = submit_mlp_job(
            slurm_cluster, env, tmp_path, f"{second.endpoint},{first.endpoint}"
        )  # the standby first
        state_dir = tmp_path / f"amoeba-{job_id}"
        wait_until("the job to grow to 3 workers under the first daemon", lambda: sizes(first) == [(3, 3)], 120)
        assert f"job {job_id} (user root) registered" not in second.log_text()

        first.kill()  # SIGKILL: no lease released, no state saved
        killed_at = time.monotonic()
        bound = takeover_bound_s(second)
        wait_until("the standby to take over", lambda: second.role() == "active", bound + 10)
        took = time.monotonic() - killed_at
        assert took <= bound, f"the standby took over after {took:.1f} s, over the stated bound of {bound:g} s"
        wait_until(
            "the agent to register with the new active daemon",
            lambda: f"job {job_id} (user root) registered" in second.log_text(),
            30,
        )
        wait_until("the new active daemon to see the job's report", lambda: sizes(second) == [(3, 3)], 30)
        status = second.wait_rounds(2)  # two rounds of the new daemon that saw the job: it must not order it again
        assert status["last_round"]["ordered"] == {}, status["last_round"]
        assert sizes(second) == [(3, 3)]
        requested = [e for e in agent_history(state_dir) if e.get("event") == "resize_requested"]
        assert [e["target"] for e in requested] == [3], f"a directive was applied twice: {requested}"

        # A resize after the takeover: pinned, so that the policy does not grow it back at once.
        pinned = second.ask("pin", {"job_id": job_id, "pinned": True})
        assert pinned is not None and pinned.body["ok"], pinned
        resized = second.ask("resize", {"job_id": job_id, "target": 2, "reason": "after the takeover"}, timeout_s=30)
        assert resized is not None and resized.body["ok"], resized
        wait_until("the job to shrink to 2 workers", lambda: sizes(second) == [(2, 2)], 90)

        def targets() -> list[int]:
            return [e["target"] for e in agent_history(state_dir) if e.get("event") == "resize_requested"]

        # the agent's status file is written on its own cadence: wait for the one that holds the shrink
        wait_until("the agent's history to hold the shrink", lambda: len(targets()) >= 2, 30)
        assert targets() == [3, 2]
        status = second.status()
        assert status["ha"]["role"] == "active" and status["ha"]["generation"] == 2
        assert status["orphans"] == [] and status["unclaimed"] == []
    finally:
        second.stop()
        first.stop()
        if job_id:
            end_job(client, job_id)
