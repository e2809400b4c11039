"""Benchmarks of the daemon's decision path and loop (``scripts/bench-policy``).

Two measurements on a synthetic cluster (1,000 nodes x 8 GPUs and 2,000 jobs by default, half of them elastic,
deterministic for a seed):

- **decision time**: Slurm's records and the agents' records -> :func:`build_snapshot` -> ``policy.decide`` ->
  :func:`check_actions`, each timed, median over repetitions (``decision_s`` is the policy's ``decide``; the
  snapshot and the check are reported beside it);
- **loop time under load** (:mod:`benchmarks.loop`): the real :class:`Daemon` loop on a real ZeroMQ socket, with
  every elastic job's agent simulated, registered from its owner's uid (run as root: ``--agents-per-uid`` jobs per
  simulated user, one forked process each) and reporting every ``--report-every`` seconds with munge-signed
  messages; ``loop_s`` is the median round time (observe + snapshot + policy + orders), reported with the worst
  round, how late rounds started, how many reports per second the daemon answered and how fast, ``amoebactl
  status``'s reply time meanwhile, and the limits the load needed raised.

``--out FILE`` writes the result document (:class:`benchmarks.record.Recording`): ``policy-loop``, or
``policy-decision`` with ``--skip-loop`` (``docs/results.md#policy-loop``, ``#policy-decision``).

**Scaling** (``--scaling``, :mod:`benchmarks.scaling`): parse, snapshot and every live policy's decision at 1,000,
10,000 and 50,000 nodes, as a table, JSON and a log-log plot.

Slurm itself is replaced by the synthetic records (no real cluster has 1,000 nodes here); everything after
``squeue``/``sinfo`` is the daemon's real code.

**Two trees side by side** (``--baseline PATH``, with ``--skip-loop``): the decision time of each policy of
``--policies`` in this checkout and in the one at PATH (say, before a refactoring), in alternating rounds of child
processes (``python -m benchmarks.policy --decision-child`` run in each tree, with ``PYTHONPATH`` set to it, so each
side measures its own code on the same seeded cluster); it prints each side's median over the rounds and the ratio
(this tree / baseline) and writes them as JSON (``--output``). Both trees need this version of the module.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.loop import bench_loop, check_signing_window
from benchmarks.record import Recording
from slurm_amoeba.core.messages import Message, encode
from slurm_amoeba.daemon.agents import AgentRecord, Registration, Report
from slurm_amoeba.daemon.observer import ClusterView, Observation
from slurm_amoeba.daemon.snapshot import build_snapshot
from slurm_amoeba.policy import Policy, check_actions, make_policy, policy_names
from slurm_amoeba.slurm import JobRecord, JobState, NodeRecord
from slurm_amoeba.transport.munge import seal, unseal


@dataclasses.dataclass(frozen=True)
class SyntheticCluster:
    """Slurm's records of a synthetic cluster and the registrations of its elastic jobs' agents.

    Attributes:
        jobs: squeue's records.
        nodes: sinfo's records.
        elastic: job id -> (registration, current size).
    """

    jobs: list[JobRecord]
    nodes: list[NodeRecord]
    elastic: dict[str, tuple[Registration, int]]


class SyntheticSlurm:
    """A :class:`~slurm_amoeba.daemon.observer.ClusterSource` over a synthetic cluster."""

    def __init__(self, cluster: SyntheticCluster) -> None:
        self.cluster = cluster

    def jobs(self) -> list[JobRecord]:
        """Every job."""
        return list(self.cluster.jobs)

    def nodes(self) -> list[NodeRecord]:
        """Every node."""
        return list(self.cluster.nodes)


def _record(job_id: int, uid: int, state: JobState, held: dict[str, int], want: int, submit: int) -> JobRecord:
    nodes = tuple(held)
    return JobRecord(
        job_id=job_id,
        name="bench",
        comment="",
        state=state,
        state_reason="Resources" if state is JobState.PENDING else "None",
        user="bench",
        uid=uid,
        partition="batch",
        nodes=nodes,
        batch_host=nodes[0] if nodes else "",
        gpus_per_node=want,
        gpu_indices=tuple(tuple(range(count)) for count in held.values()),
        cpus=1,
        node_count=max(1, len(nodes)),
        het_job_id=0,
        het_job_offset=0,
        submit_time=submit,
        start_time=submit + 10 if state is JobState.RUNNING else 0,
        priority=1000 - job_id % 1000,
    )


def synthetic_cluster(
    nodes: int = 1000, gpus_per_node: int = 8, jobs: int = 2000, elastic_share: float = 0.5, seed: int = 0
) -> SyntheticCluster:
    """A busy cluster: elastic and regular jobs running on ~85% of the GPUs, regular jobs pending for more.

    Args:
        nodes: node count.
        gpus_per_node: GPUs per node.
        jobs: job count (running and pending together).
        elastic_share: the share of jobs that are elastic (all running, each with a registered agent).
        seed: the random seed.

    Returns:
        The cluster.
    """
    rng = random.Random(seed)
    uid = os.getuid()
    free = {f"n{i:04d}": gpus_per_node for i in range(nodes)}
    names = list(free)
    budget = int(nodes * gpus_per_node * 0.85)
    records: list[JobRecord] = []
    elastic: dict[str, tuple[Registration, int]] = {}
    n_elastic = int(jobs * elastic_share)
    cursor = 0
    now = int(time.time())

    def take(gpus: int, per_node_max: int, unit: int = 1) -> dict[str, int]:
        nonlocal cursor
        held: dict[str, int] = {}
        for _ in range(len(names)):
            if gpus == 0:
                break
            name = names[cursor % len(names)]
            grab = min(free[name], gpus, per_node_max) // unit * unit
            if grab:
                held[name] = held.get(name, 0) + grab
                free[name] -= grab
                gpus -= grab
            if free[name] < unit or gpus:
                cursor += 1
        return held

    for index in range(jobs):
        job_id = 1000 + index
        submit = now - rng.randrange(60, 86_400)
        if index < n_elastic:
            gpw = rng.choice((1, 1, 2))
            low = rng.choice((1, 2, 4))
            high = low * rng.choice((2, 4))
            size = rng.randint(low, high)
            if budget < size * gpw:
                size = low
            held = take(size * gpw, gpus_per_node - gpus_per_node % gpw, gpw)
            size = sum(g // gpw for g in held.values())
            low = min(low, max(size, 1))
            high = max(high, low)
            if size == 0:
                records.append(_record(job_id, uid, JobState.PENDING, {}, gpw * low, submit))
                continue
            budget -= size * gpw
            records.append(_record(job_id, uid, JobState.RUNNING, held, gpw, submit))
            reg = Registration(str(job_id), "tcp://127.0.0.1:1", low, high, gpw, "batch", "elastic")
            elastic[str(job_id)] = (reg, size)
        elif budget > 0 and rng.random() < 0.6:
            want = rng.choice((1, 2, 4, 8))
            held = take(want, want)
            budget -= sum(held.values())
            records.append(_record(job_id, uid, JobState.RUNNING, held, want, submit))
        else:
            want = rng.choice((1, 2, 4, 8))
            records.append(_record(job_id, uid, JobState.PENDING, {}, want, submit))
    node_records = [
        NodeRecord(
            name=name,
            address="127.0.0.1",
            hostname=name,
            state="mixed",
            state_flags=(),
            partitions=("batch", "elastic"),
            cpus=64,
            alloc_cpus=0,
            gpus_total=gpus_per_node,
            gpus_used=gpus_per_node - free[name],
        )
        for name in names
    ]
    return SyntheticCluster(records, node_records, elastic)


def _throughput(size: int, high: int) -> dict[int, float]:
    return {n: 100.0 * n**0.9 for n in range(1, high + 1) if n <= size + 1}


def agent_records(cluster: SyntheticCluster, now: float) -> dict[str, AgentRecord]:
    """The daemon's records of the elastic jobs' agents, each with a report received at ``now``."""
    agents: dict[str, AgentRecord] = {}
    for job_id, (reg, size) in cluster.elastic.items():
        record = AgentRecord(registration=reg, uid=os.getuid(), user="bench", registered_at=now)
        record.accept_report(Report(size, 1, size, _throughput(size, reg.max_workers), (), (), now))
        agents[job_id] = record
    return agents


def bench_policy(name: str) -> Policy:
    """The policy as the benchmarks run it (``elastic-backfill`` without starting pending jobs, as the daemon does)."""
    knobs: dict[str, Any] = {"start_pending": False} if name == "elastic-backfill" else {}
    return make_policy(name, **knobs)


def snapshot_of(
    view: ClusterView, agents: Mapping[str, AgentRecord], now: float, stale_after_s: float = 60.0, **options: Any
) -> Observation:
    """:func:`build_snapshot` of the synthetic cluster's partitions (``options``: its further keywords)."""
    return build_snapshot(
        view,
        agents,
        pinned=(),
        regular_partitions=("batch",),
        elastic_partition="elastic",
        stale_after_s=stale_after_s,
        now=now,
        **options,
    )


def bench_decision(cluster: SyntheticCluster, policy_name: str, repeats: int) -> dict[str, float]:
    """Median times of snapshot building, the policy's decision and the invariant check.

    Args:
        cluster: the synthetic cluster.
        policy_name: a registered policy.
        repeats: how many times to measure.

    Returns:
        ``snapshot_s``, ``decision_s``, ``check_s`` (medians), ``decisions`` (how many the policy made) and ``jobs``.
    """
    now = time.time()
    agents = agent_records(cluster, now)
    policy = bench_policy(policy_name)
    view = ClusterView(tuple(cluster.jobs), tuple(cluster.nodes), now)
    snap_t, decide_t, check_t = [], [], []
    made = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        obs = snapshot_of(view, agents, now)
        t1 = time.perf_counter()
        decisions = policy.decide(obs.snapshot, now)
        t2 = time.perf_counter()
        check_actions(obs.snapshot, decisions)
        t3 = time.perf_counter()
        snap_t.append(t1 - t0)
        decide_t.append(t2 - t1)
        check_t.append(t3 - t2)
        made = len(decisions)
    return {
        "snapshot_s": statistics.median(snap_t),
        "decision_s": statistics.median(decide_t),
        "check_s": statistics.median(check_t),
        "decisions": made,
        "jobs": len(obs.snapshot.jobs),
    }


def bench_munge(repeats: int = 300) -> dict[str, float]:
    """Median cost of one munge seal and one unseal of a report-sized message (every request and reply pays both).

    Returns:
        ``munge_seal_s`` and ``munge_unseal_s``.
    """
    body = {"job_id": "1", "size": 4, "generation": 1, "target": 4, "throughput": {"4": 1.0}}
    payload = encode(Message("report", {**body, "history": [], "satellites": []}))
    seals, unseals = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        credential = seal(payload, to="tcp port 6820")
        t1 = time.perf_counter()
        unseal(credential, payload, to="tcp port 6820")
        t2 = time.perf_counter()
        seals.append(t1 - t0)
        unseals.append(t2 - t1)
    return {"munge_seal_s": statistics.median(seals), "munge_unseal_s": statistics.median(unseals)}


#: The decision figures the side-by-side run compares.
DECISION_FIGURES = ("decision_s", "snapshot_s", "check_s")


def _decision_child(cluster: SyntheticCluster, policies: Sequence[str], repeats: int) -> int:
    """One round of the side-by-side run, in the tree under test: every policy's :func:`bench_decision`, as JSON
    (a policy this tree cannot build or run gets ``{"error": ...}``)."""
    out: dict[str, dict[str, Any]] = {}
    for name in policies:
        try:
            out[name] = bench_decision(cluster, name, repeats)
        except Exception as exc:  # reported beside the other side's figures, not fatal (a renamed policy)
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))
    return 0


def _child_round(tree: Path, argv: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Run one :func:`_decision_child` round in ``tree`` (its own ``benchmarks.policy``, its own package).

    Raises:
        RuntimeError: the child failed or printed no JSON.
    """
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "benchmarks.policy", "--decision-child", *argv]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(
            f"the decision round in {tree} failed (exit {done.returncode}): {done.stderr[-2000:]}; does that tree's "
            "benchmarks/policy.py know --decision-child (this version of it)?"
        )
    result: dict[str, dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def side_by_side(
    tree: Path, baseline: Path, argv: Sequence[str], policies: Sequence[str], rounds: int
) -> dict[str, Any]:
    """The decision times of two trees, measured in alternating rounds (the first side alternates too).

    Args:
        tree: this checkout (the side under test, "after").
        baseline: the other checkout ("before").
        argv: the cluster's and the repetitions' options, passed to every child.
        policies: the policies to measure.
        rounds: rounds per side.

    Returns:
        ``samples`` (every child's figures per side), and per policy each side's median over the rounds of each of
        :data:`DECISION_FIGURES`, their ratio (this tree / baseline), the decision time's ratio round by round (its
        spread shows the noise), each side's decision count, and errors.
    """
    sides = {"baseline": baseline, "tree": tree}
    samples: dict[str, list[dict[str, dict[str, Any]]]] = {"baseline": [], "tree": []}
    for index in range(rounds):
        order = ("baseline", "tree") if index % 2 == 0 else ("tree", "baseline")
        for side in order:
            samples[side].append(_child_round(sides[side], argv))
        print(f"round {index + 1}/{rounds} done", file=sys.stderr, flush=True)
    summary: dict[str, dict[str, Any]] = {}
    for name in policies:
        row: dict[str, Any] = {}
        for side in sides:
            got = [sample.get(name, {"error": f"{name} was not measured"}) for sample in samples[side]]
            runs = [run for run in got if "error" not in run]
            if not runs:
                row[side] = {"error": "; ".join(sorted({run["error"] for run in got}))}
                continue
            row[side] = {key: statistics.median(run[key] for run in runs) for key in DECISION_FIGURES}
            row[side]["decisions"] = runs[-1]["decisions"]
        if all("error" not in row[side] for side in sides):
            row["ratio"] = {key: row["tree"][key] / row["baseline"][key] for key in DECISION_FIGURES}
            pairs = zip(samples["tree"], samples["baseline"], strict=True)
            row["round_ratios"] = [
                after[name]["decision_s"] / before[name]["decision_s"]
                for after, before in pairs
                if "decision_s" in after.get(name, {}) and "decision_s" in before.get(name, {})
            ]
        summary[name] = row
    return {
        "tree": str(tree),
        "baseline": str(baseline),
        "rounds": rounds,
        "policies": summary,
        "samples": samples,
    }


def _side_by_side_table(result: dict[str, Any]) -> str:
    lines = [
        f"decision time (median of {result['rounds']} alternating rounds, each a median of repetitions), "
        f"baseline {result['baseline']} -> this tree {result['tree']}",
        f"{'policy':<18} {'before ms':>10} {'after ms':>10} {'after/before':>13} {'per round':>13} {'snapshot':>9}"
        f" {'check':>7} {'decisions':>13}",
    ]
    for name, row in result["policies"].items():
        if "ratio" not in row:
            lines.append(f"{name:<18} {row['baseline'].get('error', '-')} | {row['tree'].get('error', '-')}")
            continue
        before, after, ratio = row["baseline"], row["tree"], row["ratio"]
        lines.append(
            f"{name:<18} {before['decision_s'] * 1000:>10.2f} {after['decision_s'] * 1000:>10.2f} "
            f"{ratio['decision_s']:>13.3f} {min(row['round_ratios']):>6.2f}..{max(row['round_ratios']):<5.2f} "
            f"{ratio['snapshot_s']:>9.3f} {ratio['check_s']:>7.3f} "
            f"{before['decisions']:>6}/{after['decisions']:<6}"
        )
    return "\n".join(lines)


def _table(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key.ljust(width)}  {value}" for key, value in rows)


def main(argv: Sequence[str] | None = None) -> int:
    """``scripts/bench-policy``: print a table, or JSON with ``--json``."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if "--scaling" in args_list:
        from benchmarks import scaling  # only this mode needs it

        return scaling.main(args_list)
    parser = argparse.ArgumentParser(prog="bench-policy", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--agents", type=int, default=1000, help="elastic jobs, each with a simulated agent")
    parser.add_argument("--policy", default="elastic-backfill")
    parser.add_argument("--repeats", type=int, default=15, help="decision measurements (median)")
    parser.add_argument("--interval", type=float, default=5.0, help="the daemon's round interval in the loop run")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds the agents report in the loop run")
    parser.add_argument("--report-every", type=float, default=5.0, help="seconds between an agent's reports")
    parser.add_argument(
        "--agents-per-uid", type=int, default=64, help="elastic jobs per simulated user (run as root: one uid each)"
    )
    parser.add_argument(
        "--seal",
        choices=("live", "ahead"),
        default="live",
        help="the simulated agents sign each report as they send it (live), or every report of the window before it "
        "starts (ahead: at a site each agent signs on its own node; ahead keeps this machine's cores for the daemon "
        "and munged, and needs --duration of at most 30 s)",
    )
    parser.add_argument(
        "--front",
        action="store_true",
        help="the daemon checks credentials and signs replies in its front process (amoebad.yaml's front_process)",
    )
    parser.add_argument("--skip-loop", action="store_true", help="measure the decision time only")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--out", type=Path, default=None, help="also write the result document here")
    parser.add_argument(
        "--short", action="store_true", help="a small cluster (50 nodes, 100 jobs, 3 repeats, a 5 s loop): a check"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="TREE",
        help="with --skip-loop: measure the decision time of this checkout and of TREE side by side, alternating",
    )
    parser.add_argument("--rounds", type=int, default=5, help="with --baseline: alternating rounds per side")
    parser.add_argument(
        "--policies",
        default=",".join(policy_names()),
        help="with --baseline: the policies to measure, comma-separated (default: every registered one)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("bench-policy-side-by-side.json"),
        help="with --baseline: where to write the JSON",
    )
    parser.add_argument("--decision-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(args_list)
    try:
        check_signing_window(args.duration if not args.skip_loop else 0.0, args.seal == "ahead")
    except ValueError as exc:
        parser.error(f"--duration with --seal ahead: {exc}")
    if args.short:
        args.nodes, args.jobs, args.agents, args.repeats, args.interval, args.duration = 50, 100, 50, 3, 1.0, 5.0
    recording = Recording("policy-loop" if not args.skip_loop else "policy-decision", vars(args))
    cluster_args = ["--nodes", str(args.nodes), "--gpus-per-node", str(args.gpus_per_node), "--jobs", str(args.jobs)]
    cluster_args += ["--agents", str(args.agents), "--repeats", str(args.repeats), "--policies", args.policies]
    policies = [name for name in args.policies.split(",") if name]
    if args.baseline is not None:
        if not args.skip_loop:
            parser.error("--baseline compares decision times only; add --skip-loop")
        if not (args.baseline / "benchmarks" / "policy.py").is_file():
            parser.error(f"--baseline {args.baseline}: no benchmarks/policy.py there; give a checkout's root")
        tree = Path(__file__).resolve().parent.parent
        compared = side_by_side(tree, args.baseline.resolve(), cluster_args, policies, args.rounds)
        compared.update(nodes=args.nodes, gpus_per_node=args.gpus_per_node, jobs=args.jobs, agents=args.agents)
        compared.update(repeats=args.repeats, load_average=os.getloadavg())
        args.output.write_text(json.dumps(compared, indent=1) + "\n")
        print(_side_by_side_table(compared))
        print(f"wrote {args.output}")
        return 0
    cluster = synthetic_cluster(args.nodes, args.gpus_per_node, args.jobs, args.agents / max(args.jobs, 1))
    if args.decision_child:
        return _decision_child(cluster, policies, args.repeats)
    result: dict[str, Any] = {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "jobs": len(cluster.jobs),
        "elastic_jobs": len(cluster.elastic),
        "policy": args.policy,
        **bench_decision(cluster, args.policy, args.repeats),
    }
    if not args.skip_loop:  # the loop and munge's cost need munged (the local cluster's, or the site's)
        result.update(bench_munge())
        loop = bench_loop(
            cluster.jobs,
            cluster.elastic,
            lambda records: SyntheticSlurm(dataclasses.replace(cluster, jobs=list(records))),
            interval_s=args.interval,
            duration_s=args.duration,
            policy_name=args.policy,
            report_s=args.report_every,
            per_uid=args.agents_per_uid,
            seal_ahead=args.seal == "ahead",
            front_process=args.front,
        )
        result.update({key: value for key, value in loop.items() if key not in ("agents",)})
    if args.out is not None:
        recording.write(args.out, result)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
        return 0
    rows = [
        (
            "cluster",
            f"{args.nodes} nodes x {args.gpus_per_node} GPUs, {result['jobs']} jobs ({result['elastic_jobs']} elastic)",
        ),
        ("policy", args.policy),
        ("snapshot (median)", f"{result['snapshot_s'] * 1000:.1f} ms"),
        (
            "decision (median)",
            f"{result['decision_s'] * 1000:.1f} ms  (target <= 50 ms; {result['decisions']} decisions)",
        ),
        ("invariant check", f"{result['check_s'] * 1000:.1f} ms"),
    ]
    if not args.skip_loop:
        rows += [
            ("loop round (median)", f"{result['loop_s'] * 1000:.1f} ms of a {args.interval:g} s interval"),
            (
                "loop round (worst)",
                f"{result['loop_max_s'] * 1000:.1f} ms; rounds late by at most "
                f"{result['late_max_s'] * 1000:.0f} ms ({result['rounds']} rounds)",
            ),
            (
                "agents",
                f"{result['elastic_jobs']} of {result['uids']} uids in {result['processes']} processes, reporting "
                f"every {args.report_every:g} s; limits raised: {result['raised_limits'] or 'none'}",
            ),
            (
                "reports answered",
                f"{result['reports_per_s']:.0f}/s ({result['reports_unanswered']} unanswered, "
                f"{result['report_errors']} refused); p50 {result['report_p50_s'] * 1000:.1f} ms, "
                f"p99 {result['report_p99_s'] * 1000:.1f} ms",
            ),
            (
                "daemon CPU",
                f"{result['daemon_cpu_share']:.2f} cores (rounds: {result['round_wall_share']:.2f} of the wall "
                f"time), munged {result['munged_cpu_share']:.2f} cores; "
                f"{result['daemon_cpu_per_report_s'] * 1e6:.0f} us per report: one core of its own answers "
                f"{result['reports_per_daemon_core_s']:.0f} reports/s",
            ),
            (
                "amoebactl status",
                f"p50 {result['status_p50_s'] * 1000:.1f} ms, p99 {result['status_p99_s'] * 1000:.1f} ms "
                f"({result['status_requests']} requests while the agents reported)",
            ),
        ]
    if not args.skip_loop and result["errors"]:
        rows.append(("simulated users failed", "; ".join(result["errors"])[:2000]))
    if "munge_seal_s" in result:
        rows.append(
            (
                "munge per message",
                f"seal {result['munge_seal_s'] * 1000:.2f} ms + unseal {result['munge_unseal_s'] * 1000:.2f} ms "
                "(the daemon pays both for every request: most of its work per report)",
            )
        )
    print(_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
