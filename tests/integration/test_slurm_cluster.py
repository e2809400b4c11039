"""The Slurm layer against the real 4-node local cluster (scripts/slurm-cluster).

GPU jobs on 2 nodes, heterogeneous jobs, signalling one step, preemption of the elastic partition within its
GraceTime, accounting, and the errors a user meets: unknown nodes, a script that does not exist, a dead slurmctld.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.slurm import (
    CliSlurmClient,
    JobState,
    SlurmCommandError,
    SubmitOptions,
    render_batch_script,
)
from tests.conftest import ClusterHandle

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]


def wait_until(what: str, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Poll ``predicate`` every 0.2 s; fail the test with ``what`` when it stays false past ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


@pytest.fixture
def client(slurm_cluster: ClusterHandle) -> Iterator[CliSlurmClient]:
    """A client; every job the test leaves behind is cancelled afterwards."""
    cli = slurm_cluster.client()
    before = {j.job_id for j in cli.jobs()}
    yield cli
    for job in cli.jobs():
        if job.job_id not in before and job.state.is_active():
            cli.cancel(job.job_id)
    wait_until("the test's jobs to leave the nodes", lambda: all(not j.state.is_active() for j in cli.jobs()), 60)


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return path


def state_of(cli: CliSlurmClient, job_id: int) -> JobState:
    job = cli.job(job_id)
    return job.state if job is not None else JobState.UNKNOWN


def test_the_cluster_has_four_idle_nodes_with_four_gpus_each(
    slurm_cluster: ClusterHandle, client: CliSlurmClient
) -> None:
    capacity = client.gpus_per_node(partition="batch")
    assert [(c.node, c.total, c.free) for c in capacity] == [(n, 4, 4) for n in ("n1", "n2", "n3", "n4")]
    assert slurm_cluster.addresses == {f"n{i}": f"10.77.0.1{i}" for i in range(1, 5)}
    assert {p for n in client.nodes() for p in n.partitions} == {"batch", "elastic", "share"}
    assert len(client.nodes(partition="elastic")) == 4
    assert [(n.name, n.gpus_total) for n in client.nodes(partition="share")] == [("n5", 4)]  # shards beside


def test_a_two_node_gpu_job_reads_its_gpus_back(tmp_path: Path, client: CliSlurmClient) -> None:
    out = tmp_path / "gpus.out"
    job_script = script(
        tmp_path,
        "gpus.sh",
        "srun --ntasks-per-node=1 bash -c 'echo \"$(hostname) $CUDA_VISIBLE_DEVICES $SLURM_JOB_GPUS\"'\nsleep 60\n",
    )
    job_id = client.submit(job_script, SubmitOptions(nodes=2, gpus_per_node=2, output=str(out), name="gpu-read"))
    wait_until("the GPU job to run", lambda: state_of(client, job_id) is JobState.RUNNING)
    wait_until("both nodes to report", lambda: out.exists() and len(out.read_text().splitlines()) == 2)
    record = client.job(job_id)
    assert record is not None and len(record.nodes) == 2 and record.gpus_per_node == 2
    assert record.gpu_indices == ((0, 1), (0, 1)) and record.gpus_held == 4
    lines = sorted(out.read_text().splitlines())
    assert [line.split()[0] for line in lines] == list(record.nodes)
    assert all(line.split()[1:] == ["0,1", "0,1"] for line in lines)
    free = {c.node: c.free for c in client.gpus_per_node()}
    assert all(free[node] == 2 for node in record.nodes)


def test_a_heterogeneous_job_has_two_components(tmp_path: Path, client: CliSlurmClient) -> None:
    out = tmp_path / "het.out"
    components = [
        SubmitOptions(name="het", ntasks=1, cpus_per_task=1, output=str(out)),
        SubmitOptions(nodes=2, ntasks_per_node=1, gpus_per_node=1),
    ]
    text = render_batch_script(
        components,
        [["srun", "--het-group=1", "bash", "-c", "echo comp1 $(hostname) $CUDA_VISIBLE_DEVICES"], ["sleep", "60"]],
    )
    path = tmp_path / "het.sh"
    path.write_text(text)
    job_id = client.submit(path, SubmitOptions())  # the options are in the script's #SBATCH lines
    wait_until(
        "both components to run",
        lambda: [c.state for c in client.het_components(job_id)] == [JobState.RUNNING] * 2,
    )
    comps = client.het_components(job_id)
    assert [c.het_job_offset for c in comps] == [0, 1]
    assert comps[0].job_id == job_id and comps[1].het_job_id == job_id
    assert comps[0].gpus_held == 0 and comps[1].gpus_held == 2 and len(comps[1].nodes) == 2
    wait_until("component 1's step output", lambda: out.exists() and out.read_text().count("comp1") == 2)


def test_cancelling_one_step_with_sigterm_leaves_the_other_running(tmp_path: Path, client: CliSlurmClient) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    ready = f"touch {marks}/ready.\\$SLURM_STEP_ID"  # the step's process runs: slurmstepd takes signals for it
    step = f"trap 'echo term > {marks}/\\$SLURM_STEP_ID; exit 0' TERM; {ready}; while true; do sleep 0.1; done"
    job_script = script(
        tmp_path,
        "steps.sh",
        f'srun -n1 --exact bash -c "{step}" &\nsrun -n1 --exact bash -c "{step}" &\nwait\n',
    )
    job_id = client.submit(job_script, SubmitOptions(ntasks=2, nodes=1, output=str(tmp_path / "steps.out")))
    wait_until("two steps to run", lambda: _running_steps(client, job_id) == {0, 1})
    wait_until("both steps' TERM handlers to be set", lambda: len(list(marks.glob("ready.*"))) == 2)
    client.cancel(job_id, step=0, signal="TERM")
    wait_until("step 0's TERM handler", lambda: (marks / "0").exists())
    wait_until("step 0 to end", lambda: _running_steps(client, job_id) == {1})
    assert not (marks / "1").exists()
    assert state_of(client, job_id) is JobState.RUNNING


def _running_steps(client: CliSlurmClient, job_id: int) -> set[int]:
    return {s.number for s in client.steps(job_id) if s.number is not None}


def test_a_regular_job_preempts_an_elastic_job_within_its_grace_time(
    tmp_path: Path, slurm_cluster: ClusterHandle, client: CliSlurmClient
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    # The worker step traps TERM as the elastic runtime does: note the time, leave cleanly.
    step = f"trap 'date +%s.%N > {marks}/term.\\$SLURM_NODEID; exit 0' TERM; while true; do sleep 0.1; done"
    elastic = script(tmp_path, "elastic.sh", f'srun --ntasks-per-node=1 bash -c "{step}"\n')
    elastic_id = client.submit(
        elastic,
        SubmitOptions(
            partition=slurm_cluster.elastic_partition,
            nodes=4,
            gpus_per_node=4,
            name="elastic-extra",
            output=str(tmp_path / "elastic.out"),
        ),
    )
    wait_until(
        "the elastic job to hold every GPU",
        lambda: sum(c.free for c in client.gpus_per_node(partition=slurm_cluster.elastic_partition)) == 0,
    )
    started = time.time()
    regular_id = client.submit(
        script(tmp_path, "regular.sh", "date +%s.%N\n"),
        SubmitOptions(
            partition=slurm_cluster.regular_partition, nodes=1, gpus_per_node=1, output=str(tmp_path / "regular.out")
        ),
    )
    grace = slurm_cluster.grace_time_s
    # The shell's redirection creates a mark before `date` writes into it: wait for one with its time in it.
    wait_until("a TERM handler of the elastic job", lambda: bool(_term_times(marks)), timeout=grace + 15)
    term_at = min(_term_times(marks))
    regular_out = tmp_path / "regular.out"
    # slurmd creates the output file when the job starts, before its first line is written: wait for the line.
    wait_until(
        "the regular job to run",
        lambda: regular_out.exists() and bool(regular_out.read_text().split()),
        timeout=grace + 30,
    )
    regular_at = float(regular_out.read_text().split()[0])
    assert term_at - started < grace, "TERM must come at the start of GraceTime, not at its end"
    assert regular_at > term_at
    wait_until("accounting to record the preemption", lambda: _final(client, elastic_id), timeout=30)
    # Its steps left cleanly on TERM, so the batch script may end on its own (COMPLETED) before Slurm cancels it.
    assert client.accounting_state(elastic_id) in (JobState.PREEMPTED, JobState.CANCELLED, JobState.COMPLETED)
    wait_until("the regular job to complete", lambda: client.accounting_state(regular_id) is JobState.COMPLETED)


def _term_times(marks: Path) -> list[float]:
    """The times the TERM handlers wrote so far (a mark just created is still empty)."""
    return [float(text) for text in (p.read_text().strip() for p in marks.iterdir()) if text]


def _final(client: CliSlurmClient, job_id: int) -> bool:
    return client.accounting_state(job_id).is_final()


def test_accounting_knows_a_finished_job(tmp_path: Path, client: CliSlurmClient) -> None:
    job_id = client.submit(script(tmp_path, "ok.sh", "true\n"), SubmitOptions(output=str(tmp_path / "ok.out")))
    wait_until("the job to complete in accounting", lambda: client.accounting_state(job_id) is JobState.COMPLETED)


def test_an_unknown_node_name_gives_a_slurm_command_error(tmp_path: Path, client: CliSlurmClient) -> None:
    with pytest.raises(SlurmCommandError, match="Invalid node name") as info:
        client.submit(script(tmp_path, "x.sh", "true\n"), SubmitOptions(nodelist="nosuchnode"))
    assert info.value.argv[0] == "sbatch" and info.value.returncode == 1


def test_a_script_that_does_not_exist_is_refused_before_submitting(tmp_path: Path, client: CliSlurmClient) -> None:
    before = len(client.jobs())
    with pytest.raises(SpecError, match="does not exist"):
        client.submit(tmp_path / "missing.sh", SubmitOptions())
    assert len(client.jobs()) == before


def test_a_dead_slurmctld_gives_an_error_not_a_hang(tmp_path: Path, slurm_cluster: ClusterHandle) -> None:
    dead_conf = tmp_path / "slurm.conf"
    text = slurm_cluster.conf.read_text().replace("SlurmctldPort=6817", "SlurmctldPort=6999")
    dead_conf.write_text(text)
    env = dict(slurm_cluster.env, SLURM_CONF=str(dead_conf))
    for timeout in (3.0, 60.0):  # killed at its own deadline, or Slurm gives up first: an error either way
        cli = CliSlurmClient(env, timeout=timeout)
        start = time.monotonic()
        with pytest.raises(SlurmCommandError, match="scontrol ping"):
            cli.jobs()
        assert time.monotonic() - start < timeout + 5
    assert not CliSlurmClient(env, timeout=3).ping()
