"""Session fixtures shared by every test: the real local Slurm cluster.

``slurm_cluster`` brings the 4-node cluster of ``scripts/slurm-cluster`` up once per session, yields a
:class:`ClusterHandle`, and always brings it down again (also on failure, Ctrl-C or SIGTERM), then checks that no
daemon, namespace or bridge is left. A cluster that was already up before the session is reused and left up.

Tests that need the cluster are marked ``slurm``. Where the cluster cannot run (not root, no packages) they skip,
except with ``AMOEBA_REQUIRE_SLURM=1`` (CI), where a skipped ``slurm`` test is an error.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from slurm_amoeba.slurm import CliSlurmClient

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SCRIPT = REPO / "scripts" / "slurm-cluster"
CLUSTER_DIR = Path(os.environ.get("AMOEBA_CLUSTER_DIR", "/tmp/slurm-amoeba-cluster"))
DAEMONS = ("slurmctld", "slurmd", "slurmdbd", "mariadbd", "munged")


def require_slurm() -> bool:
    """Whether a Slurm test that cannot run must fail instead of skipping (CI sets this)."""
    return os.environ.get("AMOEBA_REQUIRE_SLURM", "") not in ("", "0")


@dataclasses.dataclass(frozen=True)
class ClusterHandle:
    """What tests know about the running local cluster.

    Attributes:
        root: the cluster's state directory.
        conf: path of slurm.conf (``SLURM_CONF``).
        conf_dir: the directory of slurm.conf and its siblings.
        plugstack_dir: where SPANK plugin configurations go (``plugstack.conf`` includes ``*.conf`` there).
        env: this process's environment plus ``SLURM_CONF``, for commands run against the cluster.
        nodes: node names.
        addresses: node name -> address (the root namespace cannot resolve node names).
        gpus_per_node: fake GPUs on each node.
        regular_partition: the default partition.
        elastic_partition: the preemptible partition (lower PriorityTier) where satellites run.
        grace_time_s: the elastic partition's GraceTime.
    """

    root: Path
    conf: Path
    conf_dir: Path
    plugstack_dir: Path
    env: dict[str, str]
    nodes: tuple[str, ...]
    addresses: dict[str, str]
    gpus_per_node: int
    regular_partition: str
    elastic_partition: str
    grace_time_s: int

    @property
    def partitions(self) -> tuple[str, str]:
        """Both partitions, regular first."""
        return (self.regular_partition, self.elastic_partition)

    def client(self, timeout: float = 30.0) -> CliSlurmClient:
        """A Slurm client for this cluster."""
        return CliSlurmClient(self.env, timeout=timeout)


def installed_tool(name: str, why: str) -> str:
    """The path of a program that ``scripts/bootstrap`` installs (``why``: where it comes from).

    Missing, the test is skipped on a developer's machine; under ``AMOEBA_REQUIRE_SLURM=1`` (CI, after the bootstrap)
    it fails instead, since a missing program there is a broken bootstrap, not a machine without it.
    """
    found = shutil.which(name)
    if found is None:
        reason = f"{name} is not installed ({why}; scripts/bootstrap installs it)"
        if require_slurm():
            pytest.fail(reason)
        pytest.skip(reason)
    return found


def _cluster_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return f"the local Slurm cluster needs root (uid is {os.geteuid()}); run `make test` as root"
    for tool in ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "sinfo"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} is not installed; `make test` (scripts/bootstrap) installs Debian's packages"
    return None


def _script(action: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLUSTER_SCRIPT), action], capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO
    )


def leftovers() -> list[str]:
    """Daemons, namespaces and the bridge of the test cluster that are still there (empty when all is clean)."""
    found: list[str] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            comm = (proc / "comm").read_text().strip()
        except OSError:
            continue
        if comm in DAEMONS or comm.startswith("slurmstepd"):
            found.append(f"process {comm} (pid {proc.name})")
    netns = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True, check=False)
    if netns.stdout.strip():
        found.extend(f"namespace {ns['name']}" for ns in json.loads(netns.stdout) if ns["name"].startswith("amoeba-"))
    bridge = subprocess.run(["ip", "link", "show", "amoeba0"], capture_output=True, text=True, check=False)
    if bridge.returncode == 0:
        found.append("bridge amoeba0")
    return found


def _handle() -> ClusterHandle:
    env = dict(os.environ)
    conf = CLUSTER_DIR / "etc" / "slurm.conf"
    env["SLURM_CONF"] = str(conf)
    nodes = CliSlurmClient(env).nodes(partition="batch")  # the sharing partition's node (n5) is no regular one
    text = conf.read_text()
    grace = next(
        int(word.split("=", 1)[1])
        for line in text.splitlines()
        if line.startswith("PartitionName=elastic")
        for word in line.split()
        if word.startswith("GraceTime=")
    )
    return ClusterHandle(
        root=CLUSTER_DIR,
        conf=conf,
        conf_dir=conf.parent,
        plugstack_dir=conf.parent / "plugstack.conf.d",
        env=env,
        nodes=tuple(sorted({n.name for n in nodes})),
        addresses={n.name: n.address for n in nodes},
        gpus_per_node=max((n.gpus_total for n in nodes), default=0),
        regular_partition="batch",
        elastic_partition="elastic",
        grace_time_s=grace,
    )


class _Teardown:
    """Brings the cluster down exactly once, from the fixture, atexit, or a signal; only in the process that started
    it (a test's forked child inherits the atexit handler and must not stop the session's cluster on its exit)."""

    def __init__(self) -> None:
        self.done = False
        self.pid = os.getpid()

    def __call__(self) -> str:
        if self.done or os.getpid() != self.pid:
            return ""
        self.done = True
        result = _script("down", timeout=120)
        return result.stdout + result.stderr


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[ClusterHandle]:
    """The real 4-node local Slurm cluster (see the module docstring)."""
    reason = _cluster_unavailable_reason()
    if reason is not None:
        if require_slurm():
            pytest.fail(f"AMOEBA_REQUIRE_SLURM=1 but the Slurm cluster cannot run: {reason}")
        pytest.skip(reason)
    if _script("status", timeout=60).returncode == 0:
        yield _handle()  # someone else's cluster (a developer's): reuse it, leave it up
        return
    before = set(leftovers())  # e.g. a munged that was running already: not ours to stop
    teardown = _Teardown()
    atexit.register(teardown)
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        up = _script("up", timeout=300)
        if up.returncode != 0:
            pytest.fail(f"scripts/slurm-cluster up failed (exit {up.returncode}):\n{up.stdout}\n{up.stderr}")
        yield _handle()
    finally:
        output = teardown()
        signal.signal(signal.SIGTERM, previous)
    left = [x for x in leftovers() if x not in before]
    assert not left, f"scripts/slurm-cluster down left these behind: {left}\n{output}"


def _munge_answers() -> bool:
    try:
        return subprocess.run(["munge", "-n"], capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _munged_unavailable_reason() -> str | None:
    """Why this process cannot start munged, or None when it can."""
    if os.geteuid() != 0 or (shutil.which("munged") is None and not Path("/usr/sbin/munged").exists()):
        return "these tests need munged, which is not running and cannot be started here (root and Debian's munge)"
    return None


@dataclasses.dataclass(frozen=True)
class _StartedMunged:
    """A munge daemon this test process started on the default socket (as the cluster script does)."""

    state: Path

    @classmethod
    def start(cls) -> _StartedMunged:
        """Start munged and wait until it answers; fails the test (or the session) when it cannot."""
        reason = _munged_unavailable_reason()
        if reason is not None:
            pytest.fail(reason)
        # not under pytest's root-only tree: munged runs as munge
        state = Path(tempfile.mkdtemp(prefix="amoeba-munge-"))
        shutil.chown(state, "munge", "munge")
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        started = cls(state)
        subprocess.run(
            [
                "runuser",
                "-u",
                "munge",
                "--",
                "/usr/sbin/munged",
                f"--pid-file={started.pid_file}",
                f"--log-file={state}/munged.log",
                f"--seed-file={state}/munged.seed",
                "--force",
            ],
            check=True,
            timeout=30,
        )
        deadline = time.monotonic() + 10
        while not _munge_answers():
            if time.monotonic() > deadline:
                started.stop()
                pytest.fail(f"munged did not answer within 10 s; see {state}/munged.log")
            time.sleep(0.1)
        return started

    @property
    def pid_file(self) -> Path:
        """Where munged wrote its pid."""
        return self.state / "munged.pid"

    def stop(self) -> None:
        """Stop this munged and remove its state."""
        if self.pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(self.pid_file.read_text().strip()), signal.SIGTERM)
        shutil.rmtree(self.state, ignore_errors=True)


@pytest.fixture(scope="session")
def munged() -> Iterator[None]:
    """A munge daemon on the default socket (the daemon's and the agents' credentials need one).

    Reuses a running munged (the cluster's, the machine's, or the one the pytest-xdist controller started for its
    workers: see :func:`pytest_sessionstart`); otherwise starts one for the session and stops it afterwards.
    """
    if _munge_answers():
        yield
        return
    started = _StartedMunged.start()
    try:
        yield
    finally:
        started.stop()


#: The munged a pytest-xdist controller started for its workers.
_CONTROLLER_MUNGED = pytest.StashKey[_StartedMunged]()


def _is_xdist_controller(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", 0)) and not hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under pytest-xdist (``-n``), the controller starts munged for all its workers when none answers.

    A worker's session-scoped :func:`munged` would otherwise start one per worker on the same socket, and stop it
    when that worker's session ends, while the other worker may still be running tests that need it.
    """
    config = session.config
    if _is_xdist_controller(config) and not _munge_answers() and _munged_unavailable_reason() is None:
        config.stash[_CONTROLLER_MUNGED] = _StartedMunged.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop the munged that :func:`pytest_sessionstart` started (after every worker has finished)."""
    started = session.config.stash.get(_CONTROLLER_MUNGED, None)
    if started is not None:
        started.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """With AMOEBA_REQUIRE_SLURM=1, a skipped ``slurm`` test is reported as failed."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and require_slurm() and item.get_closest_marker("slurm") is not None:
        report.outcome = "failed"
        report.longrepr = f"AMOEBA_REQUIRE_SLURM=1 forbids skipping Slurm tests; it was skipped: {report.longrepr}"
