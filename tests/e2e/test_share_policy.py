"""GPU sharing by the daemon's own decision (docs/admin.md section 8e): ``policy: antman`` pairs two real opted-in jobs.

The host (``amoeba-sbatch --share``) and the sharer (``--share=opportunistic``) each run their minimum worker on a
GPU of the sharing partition. No operator asks for anything: once both report steadily, the ``antman`` policy pairs
them in a round (their job names are not in the co-location table, so the prior is ``sharing.default_kept``, set
to 0.97 by the shared setup: a worker beside the host keeps more than half of its speed, so the sharer trains faster
with it), and the daemon's executor sends the sharer a directive to place one
worker beside the host: its satellite of one shard lands on the host's GPU. When the host ends, the daemon takes the
place back: the sharer goes back to its own worker.

The GPUs' memory is left unknown (no ``sharing.gpu_memory_gib``), so the pairing needs nothing of the runtime's
memory report; the cap is covered by the unit tests. Needs the cluster started with the sharing partition
(scripts/slurm-cluster's default, ``share`` on n5).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ClusterHandle
from tests.e2e import test_share
from tests.e2e.test_share import SHARE_PARTITION, opted_in_pair, satellites, share_events, workers_record
from tests.integration.daemon_helpers import DaemonProcess, end_job, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]

#: The idle cluster's environment, running this tree's code, once it offers the sharing partition (a fixture).
env = test_share.env


def sizes(daemon: DaemonProcess) -> dict[str, tuple[int, int]]:
    return {j["job_id"]: (j["size"], j["target"]) for j in daemon.status_jobs()}


def test_antman_places_an_opted_in_sharer_beside_a_host_on_its_own_and_takes_the_place_back_when_the_host_ends(
    slurm_cluster: ClusterHandle,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    with opted_in_pair(slurm_cluster, env, tmp_path, "antman") as pair:
        daemon, client, host, sharer = pair.daemon, pair.client, pair.host, pair.sharer
        host_workers = workers_record(client, host)
        assert host_workers is not None and host_workers.partition == SHARE_PARTITION
        (node,) = host_workers.nodes
        (host_gpus,) = host_workers.gpu_indices

        wait_until(
            "the sharer to reach 2 workers beside the host by the policy's decision",
            lambda: sizes(daemon).get(sharer) == (2, 2),
            180,
        )
        log = daemon.log_text()
        assert f"antman: beside {host} with its own micro-batch" in log, "the policy decided it"
        assert "amoebactl share" not in log
        (beside,) = satellites(client, sharer)
        assert beside.partition == SHARE_PARTITION and beside.nodes == (node,)
        assert beside.gpu_indices == (host_gpus,), "the sharer's worker runs on the host's GPU"
        told = wait_until(
            "the sharer's agent to hand its worker beside the host the opportunistic share directive",
            lambda: share_events(daemon, sharer, "share_directive"),
            60,
        )
        assert told[-1]["role"] == "opportunistic" and told[-1]["host"] == host
        assert sizes(daemon).get(host) == (1, 1), "the host keeps its own worker"

        end_job(client, host)
        wait_until("the sharer's satellite beside the host to be released", lambda: not satellites(client, sharer), 120)
        wait_until("the sharer to be back at its own worker", lambda: sizes(daemon).get(sharer) == (1, 1), 90)
        assert f"host job {host} is gone" in daemon.log_text()
        pair.host = ""  # ended
