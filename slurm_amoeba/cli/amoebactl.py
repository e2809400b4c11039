"""``amoebactl``: ask the control daemon what it sees, and tell it what to do.

``amoebactl status | jobs | watch | resize JOB N | pin JOB | unpin JOB | drain | resume | policy show``, with
``--json`` for the raw reply. ``watch`` redraws the elastic jobs (size, target, throughput, last event) every
``--interval`` seconds until ``q`` or Ctrl-C. ``resize --local`` needs no daemon: it sends the directive to the job's
own agent, found through its status file (``--state-dir``, else ``AMOEBA_STATE_DIR``, else ``./amoeba-JOB``), signed
with munge as the caller, whom the agent obeys only if they own the job. The daemon is found at ``--endpoint``, else
``AMOEBA_DAEMON_ENDPOINT``, else ``tcp://127.0.0.1:6820``; a standby pair's two addresses may be given
comma-separated: amoebactl asks them in turn and follows a standby to the active daemon it names. ``--json``,
``--endpoint`` and ``--timeout`` may stand before or after the subcommand. Every request is signed with munge: the
daemon knows who asks. Exit status: 0 done, 1 refused (the reason is printed), 2 bad usage, 3 the daemon did not
answer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_amoeba.cli.entry import add_version_flag
from slurm_amoeba.core.errors import AmoebaError, SpecError
from slurm_amoeba.core.jobenv import ENV_DAEMON_ENDPOINT, ENV_STATE_DIR
from slurm_amoeba.core.messages import Message, quote, standby_redirect
from slurm_amoeba.launcher.handle import AgentHandle
from slurm_amoeba.transport.channel import ChannelError, request
from slurm_amoeba.transport.munge import MungeError

DEFAULT_ENDPOINT = "tcp://127.0.0.1:6820"


def _common_flags(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """The flags that may stand before or after the subcommand (``amoebactl --json jobs`` = ``amoebactl jobs --json``).

    The subcommands' copies default to SUPPRESS, so that a flag given before the subcommand is not reset by them.
    """

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--endpoint",
        default=default(os.environ.get(ENV_DAEMON_ENDPOINT) or DEFAULT_ENDPOINT),
        help=f"the daemon (env AMOEBA_DAEMON_ENDPOINT; default {DEFAULT_ENDPOINT})",
    )
    parser.add_argument(
        "--timeout", type=float, default=default(15.0), help="seconds to wait for the answer (default 15)"
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="print the reply data as JSON")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="amoebactl", description="Talk to amoebad, the elastic-job daemon.")
    add_version_flag(parser, "amoebactl")
    _common_flags(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _common_flags(common, defaults=False)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", parents=[common], help="the daemon, the cluster, resizes in flight, orphan satellites")
    sub.add_parser("jobs", parents=[common], help="elastic jobs: sizes, throughput, history")
    resize = sub.add_parser("resize", parents=[common], help="resize an elastic job (its owner or an operator)")
    resize.add_argument("job", help="Slurm job id")
    resize.add_argument("workers", type=int, help="the new size, within the job's range")
    resize.add_argument("--reason", default="", help="a note for the logs")
    resize.add_argument(
        "--local",
        action="store_true",
        help="no daemon: ask the job's agent directly (run as the job's owner, where its state directory is seen)",
    )
    resize.add_argument(
        "--state-dir",
        default=None,
        help="with --local: the job's state directory (default AMOEBA_STATE_DIR or ./amoeba-JOB)",
    )
    watch = sub.add_parser("watch", parents=[common], help="a live view of the elastic jobs (q or Ctrl-C quits)")
    watch.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    pin = sub.add_parser("pin", parents=[common], help="keep the policy off a job (its owner or an operator)")
    pin.add_argument("job", help="Slurm job id")
    unpin = sub.add_parser("unpin", parents=[common], help="let the policy resize a job again")
    unpin.add_argument("job", help="Slurm job id")
    share = sub.add_parser(
        "share", parents=[common], help="place new workers of a job beside another job's on its GPUs (operators)"
    )
    share.add_argument("job", help="Slurm job id of the sharer (submitted with --share=opportunistic)")
    share.add_argument("host", help="Slurm job id of the job whose GPUs it shares (submitted with --share)")
    share.add_argument("node", help="a node the host runs on")
    share.add_argument("--workers", type=int, default=1, help="workers to place there (default 1)")
    sub.add_parser(
        "drain", parents=[common], help="shrink every elastic job to its minimum and keep it there (operators)"
    )
    sub.add_parser("resume", parents=[common], help="end a drain (operators)")
    policy = sub.add_parser("policy", parents=[common], help="the daemon's policy")
    policy.add_argument("what", choices=["show"], help="show: name, knobs, the policies available")
    return parser


def _message(args: argparse.Namespace) -> Message:
    command = args.command
    if command == "resize":
        return Message("resize", {"job_id": args.job, "target": args.workers, "reason": args.reason})
    if command in ("pin", "unpin"):
        return Message("pin", {"job_id": args.job, "pinned": command == "pin"})
    if command == "share":
        return Message("share", {"job_id": args.job, "host": args.host, "nodes": {args.node: args.workers}})
    if command == "policy":
        return Message("policy_show", {})
    return Message(command, {})


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def _throughput(table: Mapping[str, Any]) -> str:
    return " ".join(f"{size}:{float(rate):.0f}" for size, rate in table.items()) or "-"


def _adaptive(stats: Mapping[str, Any]) -> str:
    phi = stats.get("noise_scale")
    efficiency = stats.get("efficiency")
    parts = [
        f"global batch {stats.get('global_batch')} (range {stats.get('base_batch')}..{stats.get('max_batch')}, "
        f"chosen by {json.dumps(stats.get('batch_source') or 'unknown')})",
        "noise scale " + ("not measured" if phi is None else f"{float(phi):.4g}"),
    ]
    if efficiency is not None:
        parts.append(f"efficiency {float(efficiency):.3f}")
    if stats.get("policy_batch") is not None:
        parts.append(f"policy's batch {stats['policy_batch']}")
    return ", ".join(parts)


def _format_jobs(data: Mapping[str, Any]) -> str:
    jobs = data.get("jobs", [])
    others = int(data.get("others") or 0)
    hidden = f"{others} elastic job(s) of other users (only operators see them)" if others else ""
    if not jobs:
        return hidden or "no elastic job is registered with the daemon"
    rows = [["JOB", "USER", "SIZE", "TARGET", "RANGE", "GPU/W", "SATELLITES", "PINNED", "REPORT", "THROUGHPUT"]]
    for job in jobs:
        age = job.get("last_report_age_s")
        rows.append(
            [
                str(job["job_id"]),
                str(job["user"]),
                "-" if job["size"] is None else str(job["size"]),
                "-" if job["target"] is None else str(job["target"]),
                f"{job['min_workers']}..{job['max_workers']}",
                str(job["gpus_per_worker"]),
                ",".join(job["satellites"]) or "-",
                "yes" if job["pinned"] else "no",
                "never" if age is None else f"{age:.0f} s ago",
                _throughput(job["throughput"]),
            ]
        )
    lines = [_table(rows)]
    for job in jobs:
        adaptive = job.get("adaptive")
        if isinstance(adaptive, Mapping):  # an adaptive-batch job: what its batch is and why
            lines.append(f"\njob {job['job_id']}: {_adaptive(adaptive)}")
        failing = job.get("failing_nodes") or {}
        if failing:  # repeated infrastructure failures under the job (its agent excludes these nodes)
            named = ", ".join(f"{json.dumps(node)} ({int(count)} times)" for node, count in sorted(failing.items()))
            lines.append(f"\njob {job['job_id']}: nodes failing under it: {named}")
        if job["history"]:
            lines.append(f"\njob {job['job_id']} history (newest last):")
            lines.extend(f"  {json.dumps(event)}" for event in job["history"])  # escaped: no control reaches a terminal
    if hidden:
        lines.append(f"\n{hidden}")
    return "\n".join(lines)


def _config_line(config: object) -> list[str]:
    """The status line naming the configuration in force (none from a daemon that does not say)."""
    if not isinstance(config, Mapping):
        return []
    return [f"config      {config.get('source')} (sha256 {config.get('digest') or '-'}; SIGHUP reloads it)"]


def _ha_line(ha: object) -> list[str]:
    """The status line of a daemon of a standby pair (none from a daemon that runs alone or does not say)."""
    if not isinstance(ha, Mapping) or ha.get("role") in (None, "single"):
        return []
    return [f"ha          {ha.get('role')}, lease generation {ha.get('generation')} in {ha.get('lease_dir')}"]


def _format_status(data: Mapping[str, Any]) -> str:
    jobs = data["jobs"]
    last = data.get("last_round") or {}
    lines = [
        f"daemon      pid {data['pid']}, uid {data['uid']}, up {data['uptime_s']:.0f} s, listening on {data['listen']}",
        f"policy      {data['policy']} every {data['interval_s']:g} s" + ("  (DRAINING)" if data["draining"] else ""),
        *_config_line(data.get("config")),
        *_ha_line(data.get("ha")),
        f"jobs        {jobs['elastic']} elastic ({data['workers']} workers), {jobs['regular_running']} regular "
        f"running, {jobs['regular_pending']} regular pending",
        f"gpus        {data['gpus']['free']} free of {data['gpus']['total']}",
        f"agents      {data['agents']} registered",
        "in flight   " + (", ".join(f"{job} -> {n}" for job, n in data["in_flight"].items()) or "none"),
        "pinned      " + (", ".join(data["pinned"]) or "none"),
    ]
    if last:
        error = f", error: {last['error']}" if last.get("error") else ""
        lines.append(
            f"last round  {last['duration_s'] * 1000:.1f} ms (policy {last['policy_s'] * 1000:.1f} ms), "
            f"{len(last['ordered'])} resize(s) ordered{error}"
        )
    admission = data.get("admission") or {}
    if admission.get("enabled") or admission.get("held"):
        lines.append(
            f"admission   at the requested size, {admission.get('held_count', 0)} job(s) held "
            f"(released anyway after {admission.get('max_hold_s', 0):g} s)"
        )
    for job in admission.get("held", []):
        lines.append(
            f"  job {job['job_id']} (user {job['user']}): held by amoebad: waiting for {job['wanted']} GPUs, "
            f"{float(job.get('held_s', 0)):.0f} s so far"
        )
    orphans = data.get("orphans", [])
    lines.append(f"orphans     {len(orphans)}")
    for sat in orphans:
        lines.append(f"  satellite {sat['job_id']} of gone job {sat['parent']} (user {sat['user']}): scancel it")
    for sat in data.get("unclaimed", []):
        lines.append(f"  satellite {sat['job_id']} of job {sat['parent']} is not listed by its agent")
    if data.get("limited_to_own_jobs"):
        lines.append(
            f"shown       your own jobs only; in all {data.get('pinned_count', 0)} pinned, "
            f"{data.get('orphans_count', 0)} orphan(s), {data.get('unclaimed_count', 0)} unclaimed satellite(s) "
            f"(operators see every job)"
        )
    return "\n".join(lines)


def _format(command: str, data: Mapping[str, Any]) -> str:
    if command == "status":
        return _format_status(data)
    if command == "jobs":
        return _format_jobs(data)
    if command == "policy":
        knobs = ", ".join(f"{k}={v!r}" for k, v in data["knobs"].items()) or "defaults"
        return f"{data['name']} ({knobs}); available: {', '.join(data['available'])}"
    if command == "resize":
        note = f" ({data['note']})" if data.get("note") else ""
        return f"the job's agent accepted: size {data.get('size')} -> target {data.get('target')}{note}"
    if command in ("pin", "unpin"):
        return f"job {data['job_id']} is {'pinned' if data['pinned'] else 'no longer pinned'}"
    if command == "share":
        return f"job {data['job_id']} goes beside job {data['host']} on {data['nodes']} at the daemon's next round"
    return "draining: every elastic job goes to its minimum" if data.get("draining") else "resumed: the policy decides"


#: Pages of ``jobs`` amoebactl follows at most (a daemon whose ``next`` never ends cannot hold it forever).
MAX_PAGES = 10_000


def _ask(args: argparse.Namespace, message: Message) -> Mapping[str, Any]:
    """Ask the active daemon: each address of ``--endpoint`` in turn (comma-separated), and the active daemon a
    standby names; the answer of the first that answers, once it is not a standby's.

    Raises:
        ChannelError: no address answered (the last one's error).
    """
    endpoints = [part.strip() for part in str(args.endpoint).split(",") if part.strip()] or [DEFAULT_ENDPOINT]
    standby: Mapping[str, Any] | None = None
    failure: ChannelError | None = None
    for endpoint in endpoints:
        try:
            reply = request(endpoint, message, timeout_s=args.timeout, retries=0)
        except ChannelError as exc:
            failure = exc
            continue
        active = standby_redirect(reply)
        if active is None:
            return reply.body
        standby = reply.body
        if active and active not in endpoints:
            try:
                followed = request(active, message, timeout_s=args.timeout, retries=0)
            except ChannelError as exc:
                failure = exc
                continue
            if standby_redirect(followed) is None:
                return followed.body
    if standby is not None:
        return standby  # only standbys answered: say so (the refusal names the active daemon, if any)
    assert failure is not None
    raise failure


def _jobs(args: argparse.Namespace) -> dict[str, Any]:
    """Every page of ``jobs``, as one reply body (the daemon sends at most a page per request)."""
    jobs: list[Any] = []
    offset = 0
    for _ in range(MAX_PAGES):
        body = _ask(args, Message("jobs", {"offset": offset}))
        if not body["ok"]:
            return dict(body)
        data = body["data"]
        jobs.extend(data.get("jobs", []))
        following = data.get("next")
        if not isinstance(following, int) or isinstance(following, bool) or following <= offset:
            return {**body, "data": {**data, "jobs": jobs, "next": None}}
        offset = following
    raise ChannelError(f"jobs: the daemon sent more than {MAX_PAGES} pages; is it the daemon?")


def _resize_locally(args: argparse.Namespace) -> int:
    """``resize --local``: the directive goes to the job's agent, signed as the caller; the answer must come from the
    caller's uid (the agent runs as the job's owner)."""
    state_dir = Path(args.state_dir or os.environ.get(ENV_STATE_DIR) or f"amoeba-{args.job}")
    handle = AgentHandle(args.job, state_dir)
    try:
        target = handle.resize(
            args.workers,
            reason=args.reason or "amoebactl resize --local",
            timeout_s=args.timeout,
            expect_uid=os.getuid(),
        )
    except SpecError as exc:
        print(f"amoebactl: refused: {exc}", file=sys.stderr)
        return 1
    except (AmoebaError, MungeError) as exc:
        print(f"amoebactl: {exc} (state directory {state_dir}; --state-dir names another)", file=sys.stderr)
        return 3
    print(f"job {args.job}: its agent accepted: target {target}")
    return 0


def _watch_row(job: Mapping[str, Any]) -> list[str]:
    size = job.get("size")
    rate = (job.get("throughput") or {}).get(str(size))
    history = job.get("history") or []
    last = history[-1] if history and isinstance(history[-1], Mapping) else {}
    event = str(last.get("event", "-"))
    return [
        str(job["job_id"]),
        str(job["user"]),
        "-" if size is None else str(size),
        "-" if job.get("target") is None else str(job["target"]),
        f"{job['min_workers']}..{job['max_workers']}",
        "-" if rate is None else f"{float(rate):.1f}",
        json.dumps(event)[1:-1][:40],
    ]


def watch_screen(data: Mapping[str, Any], endpoint: str, interval_s: float) -> str:
    """One frame of ``watch``: a title line, then a row per elastic job."""
    rows = [["JOB", "USER", "SIZE", "TARGET", "RANGE", "SAMPLES/S", "LAST EVENT"]]
    rows += [_watch_row(job) for job in data.get("jobs", [])]
    title = f"amoebactl watch: {endpoint}, every {interval_s:g} s; q quits"
    body = _table(rows) if len(rows) > 1 else "no elastic job is registered with the daemon"
    return f"{title}\n\n{body}\n"


def _watch(args: argparse.Namespace) -> int:
    """Redraw the jobs until q or Ctrl-C (or the daemon stops answering)."""
    if args.interval <= 0:
        print(f"amoebactl: --interval {args.interval} must be more than 0 seconds", file=sys.stderr)
        return 2
    with _keys() as pressed:
        try:
            while True:
                body = _jobs(args)
                if not body["ok"]:
                    print(f"amoebactl: refused: {quote(body['error'], 2000)[1:-1]}", file=sys.stderr)
                    return 1
                sys.stdout.write("\x1b[H\x1b[2J" + watch_screen(body["data"], args.endpoint, args.interval))
                sys.stdout.flush()
                if pressed(args.interval) in ("q", "Q"):
                    return 0
        except KeyboardInterrupt:
            return 0
        except (ChannelError, MungeError) as exc:
            print(f"amoebactl: {exc}", file=sys.stderr)
            return 3


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[float], str]]:
    """Read single keys from a terminal (cbreak mode, restored on exit); off a terminal, just wait."""
    if not sys.stdin.isatty():

        def wait(timeout: float) -> str:
            time.sleep(timeout)
            return ""

        yield wait
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def pressed(timeout: float) -> str:
        ready, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, 1).decode(errors="replace") if ready else ""

    try:
        yield pressed
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``amoebactl``; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.timeout <= 0:
        print(f"amoebactl: --timeout {args.timeout} must be more than 0 seconds", file=sys.stderr)
        return 2
    if args.command == "resize" and args.local:
        return _resize_locally(args)
    if args.command == "watch":
        return _watch(args)
    try:
        body = _jobs(args) if args.command == "jobs" else dict(_ask(args, _message(args)))
    except (ChannelError, MungeError) as exc:
        print(f"amoebactl: {exc}", file=sys.stderr)
        return 3
    if not body["ok"]:
        print(f"amoebactl: refused: {quote(body['error'], 2000)[1:-1]}", file=sys.stderr)
        return 1
    data = body["data"]
    print(json.dumps(data, indent=2, sort_keys=True) if args.json else _format(args.command, data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
