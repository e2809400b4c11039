"""``amoebad``: start the control daemon (the logic lives in :mod:`slurm_amoeba.daemon`).

``amoebad --config /etc/amoebad/amoebad.yaml`` runs until SIGTERM or SIGINT; ``amoebad --config FILE --check``
validates the file and prints what the daemon would run with. The configuration may also come from
``AMOEBAD_CONFIG``. Exit status: 0 after a clean stop, 2 for a bad configuration, 1 when the daemon cannot start.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import zmq

from slurm_amoeba.cli.entry import add_version_flag
from slurm_amoeba.daemon import ConfigError, Daemon, DaemonConfig, compose_policy, load_config
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
    return parser


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
    logging.basicConfig(
        level=(args.log_level or config.log_level).upper(),
        format="%(asctime)s %(levelname)-7s %(message)s",
        stream=sys.stderr,
    )
    env = dict(os.environ)
    if config.slurm_conf:
        env["SLURM_CONF"] = config.slurm_conf
    try:
        daemon = Daemon(config, CliSlurmClient.from_environment(env, timeout=config.slurm_timeout_s))
    except ConfigError as exc:  # e.g. queue_order.enabled or admission.enabled without Slurm operator rights
        print(f"amoebad: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        logging.getLogger("slurm_amoeba.daemon").info("[daemon] %s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        daemon.start()
    except (zmq.ZMQError, OSError) as exc:
        print(f"amoebad: cannot listen on {config.listen} / metrics port {config.metrics_port}: {exc}", file=sys.stderr)
        daemon.close()
        return 1
    try:
        daemon.run(stop)
    finally:
        daemon.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
