"""``amoebad``: start the control daemon (the logic lives in :mod:`slurm_amoeba.daemon`).

``amoebad --config /etc/amoebad/amoebad.yaml`` runs until SIGTERM or SIGINT; ``amoebad --config FILE --check``
validates the file and prints what the daemon would run with. The configuration may also come from
``AMOEBAD_CONFIG``. Exit status: 0 after a clean stop, 2 for a bad configuration, 1 when the daemon cannot start.

SIGHUP reads the configuration's file again (``systemctl reload amoebad``; :meth:`Daemon.reload
<slurm_amoeba.daemon.Daemon.reload>`): an invalid file keeps the running configuration, and the log says why.
With ``ha.lease_dir`` set, amoebad starts as the standby of a pair (:mod:`slurm_amoeba.daemon.standby`) and becomes
the active daemon once it holds the lease; a daemon that loses the lease stops at once and exits with status 1, so
that systemd starts it again, as a standby.
Logs go to stderr; under systemd (``JOURNAL_STREAM`` names stderr) each line carries its syslog priority
(``<6>``) and no timestamp of its own, since journald stamps it (``--log-format`` chooses).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Protocol

import zmq

from slurm_amoeba.cli.entry import add_version_flag
from slurm_amoeba.daemon import ConfigError, Daemon, DaemonConfig, compose_policy, load_config
from slurm_amoeba.daemon.lease import Lease, LeaseError
from slurm_amoeba.daemon.standby import Standby, make_lease
from slurm_amoeba.slurm import CliSlurmClient

DEFAULT_CONFIG = "/etc/amoebad/amoebad.yaml"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="amoebad", description="The slurm_amoeba control daemon: grows and shrinks elastic jobs."
    )
    parser.add_argument(
        "--config",
        default=os.environ.get("AMOEBAD_CONFIG", DEFAULT_CONFIG),
        help=f"the YAML configuration (env AMOEBAD_CONFIG; default {DEFAULT_CONFIG})",
    )
    add_version_flag(parser, "amoebad")
    parser.add_argument("--check", action="store_true", help="validate the configuration, print it and exit")
    parser.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), help="overrides log_level of the configuration"
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=os.environ.get("AMOEBAD_LOG_FORMAT", "auto"),
        help="plain: timestamped lines; journal: syslog priority prefix and no timestamp (journald adds its own); "
        "auto: journal when stderr is journald's stream (JOURNAL_STREAM), else plain (env AMOEBAD_LOG_FORMAT)",
    )
    return parser


LOG_FORMATS = ("auto", "plain", "journal")
#: Python's log levels as syslog priorities (journald reads a ``<N>`` prefix as the line's priority).
_PRIORITIES = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}


class JournalFormatter(logging.Formatter):
    """A line for journald: ``<6>INFO    message`` (the priority prefix, no timestamp: journald stamps lines)."""

    def __init__(self) -> None:
        super().__init__("%(levelname)-7s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        priority = _PRIORITIES.get(record.levelno, 6 if record.levelno < logging.WARNING else 3)
        # Every line of a multi-line record (a traceback) gets the prefix, so none is read at the default priority.
        return "\n".join(f"<{priority}>{line}" for line in super().format(record).splitlines())


def stderr_is_journal(env: Mapping[str, str], stderr_fd: int = 2) -> bool:
    """Whether stderr is the journald stream systemd gave the service (``JOURNAL_STREAM=DEVICE:INODE`` names it)."""
    device, _, inode = env.get("JOURNAL_STREAM", "").partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        st = os.fstat(stderr_fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


def log_formatter(choice: str, env: Mapping[str, str], stderr_fd: int = 2) -> logging.Formatter:
    """The formatter of ``--log-format`` ``choice`` (``auto`` looks at ``JOURNAL_STREAM``)."""
    if choice == "journal" or (choice == "auto" and stderr_is_journal(env, stderr_fd)):
        return JournalFormatter()
    return logging.Formatter("%(asctime)s %(levelname)-7s %(message)s")


def _queue_order(config: DaemonConfig) -> str:
    queue = config.queue_order
    if not queue.enabled:
        return "off"
    parts = ",".join(queue.partitions or config.regular_partitions)
    thresholds = ", ".join(f"{t:g}" for t in queue.thresholds_gpu_s)
    return f"on in {parts} (thresholds {thresholds} GPU-s; needs Slurm operator rights, checked at start)"


def _admission(config: DaemonConfig) -> str:
    admission = config.admission
    if not admission.enabled:
        return "off"
    parts = ",".join(admission.partitions or config.regular_partitions)
    return f"on in {parts} (max_hold_s {admission.max_hold_s:g}; needs Slurm operator rights, checked at start)"


def _ha(config: DaemonConfig) -> str:
    ha = config.ha
    if not ha.enabled:
        return "off (this daemon runs alone)"
    return (
        f"lease in {ha.lease_dir}, advertised as {ha.advertise}, renewed every {ha.renew_s:g} s, expiry "
        f"{ha.expiry_s:g} s + margin {ha.margin_s:g} s; a standby takes over within "
        f"{ha.takeover_bound_s(config.interval_s):g} s"
    )


def _describe(config: DaemonConfig) -> str:
    knobs = ", ".join(f"{k}={v!r}" for k, v in config.effective_knobs().items()) or "defaults"
    return "\n".join(
        [
            f"configuration {config.source} is valid:",
            f"  listen            {config.listen}",
            f"  metrics           {config.metrics_address}:{config.metrics_port}"
            + (" (off)" if not config.metrics_port else ""),
            f"  interval_s        {config.interval_s:g}",
            f"  policy            {config.policy} ({knobs})",
            f"  partitions        regular={','.join(config.regular_partitions)} elastic={config.elastic_partition}",
            f"  operators         {', '.join(config.operators) or '(only the daemon user)'}",
            f"  agents            timeout {config.agents.timeout_s:g} s, {config.agents.retries} retries, "
            f"{config.agents.parallel} in parallel",
            f"  state_file        {config.state_file or '(none: pins do not survive a restart)'}",
            f"  queue_order       {_queue_order(config)}",
            f"  admission         {_admission(config)}",
            f"  ha                {_ha(config)}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``amoebad``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        config = load_config(args.config)
        compose_policy(config)  # a policy the daemon cannot apply live is refused here, --check included
    except ConfigError as exc:
        print(f"amoebad: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(_describe(config))
        return 0
    if config.state_file and not os.access(Path(config.state_file).parent, os.W_OK):
        print(
            f"amoebad: state_file {config.state_file!r}: cannot write to {str(Path(config.state_file).parent)!r}; "
            f"create it for the daemon's user (the systemd unit's StateDirectory= does) or change state_file",
            file=sys.stderr,
        )
        return 2
    if args.log_format not in LOG_FORMATS:  # from AMOEBAD_LOG_FORMAT, which argparse's choices do not check
        print(
            f"amoebad: AMOEBAD_LOG_FORMAT={args.log_format!r}: write one of {', '.join(LOG_FORMATS)}", file=sys.stderr
        )
        return 2
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(log_formatter(args.log_format, os.environ))
    logging.basicConfig(level=(args.log_level or config.log_level).upper(), handlers=[handler])
    env = dict(os.environ)
    if config.slurm_conf:
        env["SLURM_CONF"] = config.slurm_conf
    stop = threading.Event()
    reload_wanted = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logging.getLogger("slurm_amoeba.daemon").info("[daemon] %s: stopping", signal.Signals(signum).name)
        stop.set()

    def on_hangup(signum: int, frame: FrameType | None) -> None:
        reload_wanted.set()  # the loop reads the file again before its next step

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_hangup)
    lease: Lease | None = None
    if config.ha.enabled:
        try:
            lease = make_lease(config)
        except LeaseError as exc:
            print(f"amoebad: {exc}", file=sys.stderr)
            return 2
        status = _stand_by(config, lease, stop)
        if status is not None:
            return status
    try:
        daemon = Daemon(config, CliSlurmClient.from_environment(env, timeout=config.slurm_timeout_s), lease=lease)
    except ConfigError as exc:  # e.g. queue_order.enabled or admission.enabled without Slurm operator rights
        print(f"amoebad: {exc}", file=sys.stderr)
        return 2

    def on_reload(signum: int, frame: FrameType | None) -> None:
        daemon.request_reload()

    signal.signal(signal.SIGHUP, on_reload)
    if reload_wanted.is_set():
        daemon.request_reload()
    if not _listening(config, daemon):
        return 1
    tune_gc()
    try:
        daemon.run(stop)
    finally:
        if daemon.deposed:
            daemon.abandon()
        else:
            daemon.close()
    return 1 if daemon.deposed else 0


#: The collector's first threshold while the daemon runs (Python's default: 700). A round on a large cluster makes
#: tens of thousands of short-lived objects (a snapshot's jobs, a decision's placements) that reference counting
#: frees; with the default the collector runs dozens of times a round for nothing. The benchmark that set it: the
#: snapshot and decision of a 10,000-node cluster (docs/operations.md, "Large clusters").
GC_THRESHOLD = 50_000


def tune_gc() -> None:
    """Once started: what start-up built (the configuration, the imported modules, the state) is frozen out of the
    collector's scans (``gc.freeze``), and the collector runs every :data:`GC_THRESHOLD` allocations."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, older, oldest)


class _Listener(Protocol):
    """What starts listening (the daemon, or the standby) and closes again."""

    def start(self) -> None: ...

    def close(self) -> None: ...


def _listening(config: DaemonConfig, listener: _Listener) -> bool:
    """Start ``listener``; on a port that cannot be had, say which and close it again (False)."""
    try:
        listener.start()
    except (zmq.ZMQError, OSError) as exc:
        print(f"amoebad: cannot listen on {config.listen} / metrics port {config.metrics_port}: {exc}", file=sys.stderr)
        listener.close()
        return False
    return True


def _stand_by(config: DaemonConfig, lease: Lease, stop: threading.Event) -> int | None:
    """Run as the standby until this daemon holds the lease; None then, else the exit status."""
    standby = Standby(config, lease)
    if not _listening(config, standby):
        return 1
    try:
        holds = standby.run(stop)
    finally:
        standby.close()
    return None if holds else (0 if stop.is_set() else 1)


if __name__ == "__main__":
    sys.exit(main())
