"""A satellite carries its parent job's account and QOS, on the real local cluster.

The cluster's accounting (slurmdbd) gets an account and a QOS of its own for this test (``sacctmgr`` as root; both are
kept, adding them again changes nothing). The parent is a held heterogeneous job like the one ``amoeba-sbatch``
submits, with ``--account``/``--qos`` on both components; the agent runs in this process against the real Slurm with a
fake coordinator and main step, and grows once: the satellite that reaches Slurm is charged like its parent. (The
test cluster's nodes have no features and it holds no reservation: the unit tests check those at the level of the
rendered submission.)
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_amoeba.agent.agent import Agent
from slurm_amoeba.agent.config import AgentConfig
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.slurm import CliSlurmClient, JobRecord, SubmitOptions, render_batch_script
from tests.conftest import ClusterHandle
from tests.unit.agent.fakes import FakeCoordinator, FakeSteps

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]

ACCOUNT = QOS = "amoeba_sat"


def sacctmgr(cluster: ClusterHandle, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sacctmgr", "-i", *args], env=cluster.env, capture_output=True, text=True, timeout=30, check=False
    )


@pytest.fixture
def account(slurm_cluster: ClusterHandle) -> str:
    """The test's account and QOS exist and this user may use both (``sacctmgr`` says "Nothing new added" after)."""
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    sacctmgr(slurm_cluster, "add", "qos", QOS)
    sacctmgr(slurm_cluster, "add", "account", ACCOUNT, "Description=slurm_amoeba tests", "Organization=tests")
    sacctmgr(slurm_cluster, "add", "user", user, f"account={ACCOUNT}", f"qos=normal,{QOS}")
    listed = sacctmgr(slurm_cluster, "-n", "-P", "list", "assoc", f"user={user}", "format=account,qos")
    if f"{ACCOUNT}|" not in listed.stdout:
        pytest.skip(f"the cluster's accounting did not take account {ACCOUNT!r}: {listed.stdout} {listed.stderr}")
    return ACCOUNT


@pytest.fixture
def mine(slurm_cluster: ClusterHandle) -> Iterator[list[int]]:
    """The jobs the test submitted, cancelled afterwards (only those: the cluster is shared)."""
    jobs: list[int] = []
    yield jobs
    client = slurm_cluster.client()
    for job in jobs:
        client.cancel(job)


def submit_held_parent(cli: CliSlurmClient, tmp_path: Path, account: str) -> int:
    """A held two-component job charged to ``account`` with QOS ``QOS``, as amoeba-sbatch would submit it."""
    terms = (f"--account={account}", f"--qos={QOS}")
    parts = [SubmitOptions(name="amoeba-terms-parent", ntasks=1, extra=terms), SubmitOptions(ntasks=1, extra=terms)]
    script = tmp_path / "parent.sh"
    script.write_text(render_batch_script(parts, [["true"]]))
    return cli.submit(script, SubmitOptions(hold=True))


def record_of(cli: CliSlurmClient, job_id: int, timeout: float = 20.0) -> JobRecord:
    deadline = time.monotonic() + timeout
    while (found := cli.job(job_id)) is None:
        if time.monotonic() > deadline:
            pytest.fail(f"squeue does not show job {job_id} after {timeout:g} s")
        time.sleep(0.3)
    return found


def test_a_satellite_is_charged_to_its_parents_account_and_qos(
    slurm_cluster: ClusterHandle,
    mine: list[int],
    account: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = slurm_cluster.client()
    parent = submit_held_parent(client, tmp_path, account)
    mine.append(parent)
    parent_record = record_of(client, parent)
    assert (parent_record.account, parent_record.qos) == (account, QOS), "the cluster did not charge the parent"

    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))  # the satellite's sbatch inherits the agent's env
    config = AgentConfig(
        job_id=str(parent),
        spec=ElasticSpec(1, 2, gpus_per_worker=1),
        command=(sys.executable, "-c", "import time; time.sleep(60)"),
        state_dir=tmp_path / "state",
        advertise_addr="127.0.0.1",
        elastic_partition=slurm_cluster.elastic_partition,
    )
    agent = Agent(config, client, coordinator=FakeCoordinator(), step_starter=FakeSteps())
    agent.start_main_group()
    try:
        agent.resize(2, "test")
        assert agent.round() is None
        (satellite,) = [g for g in agent.groups if g.satellite]
        mine.append(satellite.slurm_job)
        found = record_of(client, satellite.slurm_job)
        assert (found.name, found.partition) == (f"amoeba-sat-{parent}-g1", slurm_cluster.elastic_partition)
        assert (found.account, found.qos) == (account, QOS)
    finally:
        agent.shutdown()
