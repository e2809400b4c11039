"""The settings of one job's agent (:class:`AgentConfig`), built by ``amoeba-run`` from the job it runs in, and the
daemon identity the site pins (:func:`configured_daemon_uid`).

Which uid ``amoebad`` runs as comes from the site, never from whoever answers on the daemon's port: the SPANK
plugin's plugstack argument ``daemon_uid=N`` or ``daemon_user=NAME`` exported into the job as ``AMOEBA_DAEMON_UID``,
else the site file ``/etc/slurm-amoeba/daemon.conf`` (``AMOEBA_SITE_FILE`` names another; lines ``daemon_uid = N``
or ``daemon_user = NAME``, ``#`` comments). With neither, the agent trusts only a daemon of the job's own uid (a
user's private amoebad, as in tests) — see docs/admin.md, "Security model".
"""

from __future__ import annotations

import dataclasses
import os
import pwd
from collections.abc import Mapping
from pathlib import Path

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.core.jobenv import ENV_DAEMON_UID
from slurm_amoeba.core.messages import quote
from slurm_amoeba.core.sharing import DEFAULT_SHARE_PARTITION
from slurm_amoeba.core.spec import ElasticSpec

#: The site file the agent reads the daemon's identity from when the job's environment does not carry it.
SITE_FILE = Path("/etc/slurm-amoeba/daemon.conf")
#: Names another site file (tests; a site that keeps its configuration elsewhere).
ENV_SITE_FILE = "AMOEBA_SITE_FILE"
_MAX_SITE_FILE = 65536
#: How many times a job may requeue itself before its time limit (read by ``amoeba-run``; the executor sets it from
#: ``max_num_timeout``).
ENV_MAX_REQUEUES = "AMOEBA_MAX_REQUEUES"
#: How many times a job may restart from its disk checkpoint in one allocation (read by ``amoeba-run``).
ENV_MAX_RESTARTS = "AMOEBA_MAX_RESTARTS"
DEFAULT_MAX_REQUEUES = 3  # submitit's default max_num_timeout
DEFAULT_MAX_RESTARTS = 3


def _uid_of(key: str, value: str, where: str) -> int:
    if key == "daemon_uid":
        if not (value.isascii() and value.isdigit()) or len(value) > 10:
            raise SpecError(f"{where}: daemon_uid={quote(value)} is not a uid; give a number, e.g. daemon_uid=990")
        return int(value)
    try:
        return pwd.getpwnam(value).pw_uid
    except KeyError:
        raise SpecError(f"{where}: daemon_user={quote(value)} is no user on this node; name amoebad's user") from None


def read_site_file(path: Path) -> int | None:
    """The daemon's uid from a site file (``daemon_uid = N`` or ``daemon_user = NAME``), or None when it has none.

    Raises:
        SpecError: the file is unreadable, too large, or names a malformed uid or an unknown user.
    """
    try:
        with path.open("rb") as handle:
            data = handle.read(_MAX_SITE_FILE + 1)
    except OSError as exc:
        raise SpecError(f"cannot read the site file {path}: {exc.strerror}") from None
    if len(data) > _MAX_SITE_FILE:
        raise SpecError(f"the site file {path} is over {_MAX_SITE_FILE} bytes; it holds a few key = value lines")
    uid: int | None = None
    for number, raw in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = (part.strip() for part in line.partition("="))
        if not sep:
            raise SpecError(f"{path}:{number}: {quote(line)} is not key = value")
        if key in ("daemon_uid", "daemon_user"):
            uid = _uid_of(key, value, f"{path}:{number}")
    return uid


def configured_daemon_uid(environ: Mapping[str, str] | None = None) -> int | None:
    """The uid ``amoebad`` runs as, as the site configured it (see the module docstring); None: not configured.

    Raises:
        SpecError: a configured value is malformed (the message names where it came from and the fix).
    """
    env = os.environ if environ is None else environ
    text = env.get(ENV_DAEMON_UID, "")
    if text:
        return _uid_of("daemon_uid", text, ENV_DAEMON_UID)
    path = Path(env.get(ENV_SITE_FILE, "") or SITE_FILE)
    if not path.exists():
        return None
    return read_site_file(path)


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """What one agent needs to know.

    Attributes:
        job_id: the Slurm job id of the elastic job (the heterogeneous leader).
        spec: worker range and per-worker resources.
        command: argv each worker runs (the user's training program).
        state_dir: where the status file, satellite scripts and logs go (on a file system the submitter sees).
        advertise_addr: the address of the agent's node that workers and the daemon can reach.
        elastic_partition: where satellites run.
        daemon_endpoint: the daemon's address (``tcp://host:port``), or None to run without a daemon.
        daemon_uid: the uid the daemon runs as (:func:`configured_daemon_uid`); None: only a daemon of the job's
            own uid is trusted.
        worker_env: extra environment for every worker.
        satellite_time_min: time limit of satellites in minutes (None: the partition's).
        satellite_qos: the QOS of satellites; None: the parent job's own. A site whose preemption is QOS-based
            (``PreemptType=preempt/qos``) names its preemptible QOS here, or satellites would not be preemptible.
        main_het_group: the heterogeneous component the main worker group runs in (1 with ``amoeba-sbatch``); None
            for a one-component allocation (plain ``sbatch --elastic``), where the workers' step shares the job with
            the agent in the batch step.
        max_requeues: how many times the job may requeue itself before its time limit (submitit's
            ``max_num_timeout``; ``AMOEBA_MAX_REQUEUES``); a requeue by Slurm (a node failure) does not count.
        max_restarts: how many times, in one allocation, the job may restart from its newest disk checkpoint after
            losing every worker that held its state (``AMOEBA_MAX_RESTARTS``).
        stop_timeout_s: before a requeue, how long the workers get to leave and write a final checkpoint.
        poll_s: how often the agent looks at Slurm and the coordinator.
        report_s: how often it reports to the daemon.
        coordinator: further coordinator settings (timeouts).
        share: the job's GPU sharing mode (``AMOEBA_SHARE``; its minimum workers hold shards, not GPUs, and it may
            be told to place workers beside another job), or None.
        share_partition: the partition of the sharing nodes (``AMOEBA_SHARE_PARTITION``).
    """

    job_id: str
    spec: ElasticSpec
    command: tuple[str, ...]
    state_dir: Path
    advertise_addr: str
    elastic_partition: str = "elastic"
    daemon_endpoint: str | None = None
    daemon_uid: int | None = None
    worker_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    satellite_time_min: int | None = None
    satellite_qos: str | None = None
    main_het_group: int | None = 1
    max_requeues: int = DEFAULT_MAX_REQUEUES
    max_restarts: int = DEFAULT_MAX_RESTARTS
    stop_timeout_s: float = 60.0
    poll_s: float = 0.5
    report_s: float = 2.0
    coordinator: Mapping[str, float] = dataclasses.field(default_factory=dict)
    share: str | None = None
    share_partition: str = DEFAULT_SHARE_PARTITION

    def __post_init__(self) -> None:
        if not self.command:
            raise SpecError("the agent needs a worker command to run, e.g. ['python', 'train.py']")
        if not self.job_id.isdigit():
            raise SpecError(f"job_id={self.job_id!r} is not a Slurm job id")
        if self.max_requeues < 0 or self.max_restarts < 0:
            raise SpecError(
                f"max_requeues={self.max_requeues}, max_restarts={self.max_restarts}: give 0 (never) or more"
            )


def count_from_environ(environ: Mapping[str, str], name: str, default: int) -> int:
    """A whole number from the job's environment (``AMOEBA_MAX_REQUEUES``, ...); ``default`` when unset or empty.

    Raises:
        SpecError: the value is not a whole number (the message names the variable).
    """
    text = environ.get(name, "")
    if not text:
        return default
    if not (text.isascii() and text.isdigit()):
        raise SpecError(f"{name}={quote(text)} is not a whole number; set e.g. {name}={default}")
    return int(text)
