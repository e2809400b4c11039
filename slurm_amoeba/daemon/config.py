"""The daemon's configuration (``configs/amoebad.yaml``): read, validated, typed.

Every key has a default except none is required; an unknown key, a wrong type or a value out of range fails with
:class:`ConfigError` naming the file, the key's full path (``agents.timeout_s``), the value and what would be
valid. The policy's name and knobs are checked against the policy registry (DESIGN.md, layer ``policy/``), so a
typo in a knob is caught when the daemon starts, not at its first decision.
"""

from __future__ import annotations

import dataclasses
import grp
import hashlib
import ipaddress
import itertools
import pwd
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import yaml

from slurm_amoeba.core.errors import AmoebaError, unknown_key_message
from slurm_amoeba.policy import DEFAULT_POLICY, PolicyError, make_policy, policy_knobs, policy_names
from slurm_amoeba.policy.colocation import packaged_gavel_table, read_colocation
from slurm_amoeba.policy.slurm_baseline import DEFAULT_MAX_HOLD_S
from slurm_amoeba.slurm.runner import DEFAULT_TIMEOUT_S

_ENDPOINT = re.compile(r"^tcp://(?P<host>\*|[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:]+\]):(?P<port>[0-9]{1,5})$")
#: ``listen`` hosts that name no one address (every interface): a standby pair then needs ``ha.advertise``.
_ANY_HOST = ("*", "0.0.0.0", "[::]")  # noqa: S104 (recognised, never bound here)
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
LOG_LEVELS = ("debug", "info", "warning", "error")
#: How often a job's agent reports (the agent's ``report_s`` default): ``limits.requests_per_s`` must allow it.
AGENT_REPORT_S = 2.0


class ConfigError(AmoebaError, ValueError):
    """The daemon's configuration is invalid; the message names the key, the value and the fix."""


@dataclasses.dataclass(frozen=True)
class AgentSettings:
    """How the daemon talks to job agents.

    Attributes:
        timeout_s: deadline of one directive attempt.
        retries: further attempts after a timeout.
        parallel: directives in flight at once (threads of the actuator).
        stale_after_s: a job whose agent has not reported for this long is left alone by the policy.
        backoff_s: after an agent refused or missed a directive, the job is left alone this long.
    """

    timeout_s: float = 3.0
    retries: int = 1
    parallel: int = 8
    stale_after_s: float = 10.0
    backoff_s: float = 30.0


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one user may ask of the daemon, and the site's worker caps (docs/admin.md, Security model).

    Attributes:
        requests_per_s: requests (reports included) one uid may send per second, sustained; beyond it they are
            refused (the daemon's own uid is not limited). An agent reports every 2 s, so keep it above
            ``agents_per_uid / 2`` with room for ``amoebactl``.
        burst: requests one uid may send at once after a quiet while.
        agents_per_uid: elastic jobs one uid may have registered at once.
        max_workers: the most workers any elastic job runs with at this site (the SPANK plugin's ``max_workers``).
        user_max_workers: uid -> a lower cap for that user's jobs (``max_workers_per_user`` names or uids).
        account_max_workers: Slurm account -> a lower cap for jobs charged to it (``max_workers_per_account``).
    """

    requests_per_s: float = 50.0
    burst: int = 100
    agents_per_uid: int = 64
    max_workers: int = 1024
    user_max_workers: Mapping[int, int] = dataclasses.field(default_factory=dict)
    account_max_workers: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def worker_cap(self, uid: int, account: str) -> tuple[int, str]:
        """The most workers a job of ``uid`` charged to ``account`` may run with, and which setting says so."""
        caps = [(self.max_workers, "limits.max_workers")]
        if uid in self.user_max_workers:
            caps.append((self.user_max_workers[uid], f"limits.max_workers_per_user (uid {uid})"))
        if account in self.account_max_workers:
            caps.append((self.account_max_workers[account], f"limits.max_workers_per_account ({account})"))
        return min(caps)


@dataclasses.dataclass(frozen=True)
class QueueOrder:
    """Ordering Slurm's queue by attained service (docs/admin.md; needs Slurm operator rights, off by default).

    Attributes:
        enabled: whether the daemon sets the priorities of pending jobs.
        thresholds_gpu_s: attained GPU-seconds at which a job moves to the next 2D-LAS queue (increasing).
        partitions: the partitions whose pending jobs the daemon may reorder; empty: the regular partitions.
        users: only these users' jobs are reordered (user names); empty: every user's.
        max_updates_per_round: the most ``scontrol update`` calls of one round (the first jobs in LAS order first).
        revert_on_stop: when the daemon stops, give the jobs it reordered back the priority Slurm had given them.
    """

    enabled: bool = False
    thresholds_gpu_s: tuple[float, ...] = (57600.0,)
    partitions: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    max_updates_per_round: int = 50
    revert_on_stop: bool = True


#: Who holds and releases pending elastic jobs for admission (:attr:`Admission.holds_by`).
HOLDS_BY = ("owner", "daemon")


@dataclasses.dataclass(frozen=True)
class Admission:
    """Admitting elastic jobs at their requested size (docs/admin.md, section 8c): on by default, held by the jobs'
    owners, which needs no Slurm rights.

    Attributes:
        enabled: whether pending elastic jobs are held until their requested size is free or lendable.
        max_hold_s: a job pending this long since its submission is released anyway and starts at its minimum (the
            starvation bound).
        partitions: the partitions whose pending jobs it admits into; empty: the regular partitions.
        users: only these users' elastic jobs are held (user names); empty: every user's.
        holds_by: who holds and releases them: ``owner``, each job's admission guard at the daemon's word, as the
            job's user (no rights); ``daemon``, the daemon itself in Slurm (Slurm administrator rights; also holds
            jobs submitted without a guard).
    """

    enabled: bool = True
    max_hold_s: float = DEFAULT_MAX_HOLD_S
    partitions: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    holds_by: str = "owner"


#: The prior fraction of its speed a job keeps beside a partner when the table lacks their types: two jobs split the
#: device. Under it the benefit rule (``sjf-bsbf``) never pairs two jobs whose speeds were not measured (the pair
#: finishes no sooner than one after the other), while the opportunistic mode (``antman``) still pairs them, its
#: sharer paced to the host's bound; a pair's measured speeds replace it as soon as they are reported.
DEFAULT_KEPT = 0.5


@dataclasses.dataclass(frozen=True)
class Sharing:
    """Two opted-in jobs on one GPU (docs/admin.md, section 8e; off by default).

    Attributes:
        enabled: the site's switch: whether the daemon applies a policy's ``share`` actions (a policy that emits
            them is refused while it is off).
        partitions: partition -> the most workers of other jobs placed beside one host on one of its nodes there;
            a host in a partition not named here hosts nobody.
        gpu_memory_gib: partition -> device memory of one GPU of its nodes (GiB); a partition not named here has
            GPUs of unknown memory, where nothing bounds a sharer's memory and its directive carries no cap.
        colocation_table: Gavel's ``simulation_throughputs.json`` to read the prior from ("": the table shipped with
            the package; ``none``: no table, every pair gets ``default_kept``).
        default_kept: the prior fraction of its speed a job keeps beside a partner for job types the table lacks,
            in (0, 1].
        colocation: the table read from ``colocation_table``: (job type, partner type) -> fraction kept.
    """

    enabled: bool = False
    partitions: Mapping[str, int] = dataclasses.field(default_factory=dict)
    gpu_memory_gib: Mapping[str, float] = dataclasses.field(default_factory=dict)
    colocation_table: str = ""
    default_kept: float = DEFAULT_KEPT
    colocation: Mapping[tuple[str, str], float] = dataclasses.field(default_factory=dict, compare=False)

    def limit(self, partition: str) -> int:
        """The most sharer workers beside one host per node in ``partition`` (0: none)."""
        return self.partitions.get(partition, 0) if self.enabled else 0

    def prior(self, job_types: Iterable[str]) -> ColocationPrior:
        """``Snapshot.colocation`` for jobs of these types (:class:`ColocationPrior`; empty types are left out: a job
        without one is never paired)."""
        return ColocationPrior(self.colocation, self.default_kept, frozenset(kind for kind in job_types if kind))


class ColocationPrior(Mapping[tuple[str, str], float]):
    """The co-location prior over the job types of one snapshot: each ordered pair of them maps to the table's entry,
    else to ``default``; a pair with a type outside ``types`` is not in it. Looked up pair by pair (a snapshot of
    many job types never builds its square).

    Args:
        table: (job type, partner type) -> fraction kept, measured.
        default: the fraction for a pair the table lacks.
        types: the job types present.
    """

    def __init__(self, table: Mapping[tuple[str, str], float], default: float, types: frozenset[str]) -> None:
        self._table, self._default, self._types = table, default, types

    def __getitem__(self, pair: tuple[str, str]) -> float:
        mine, theirs = pair
        if mine not in self._types or theirs not in self._types:
            raise KeyError(pair)
        return self._table.get(pair, self._default)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        kinds = sorted(self._types)
        return ((mine, theirs) for mine in kinds for theirs in kinds)

    def __len__(self) -> int:
        return len(self._types) ** 2


@dataclasses.dataclass(frozen=True)
class HighAvailability:
    """An active/standby pair of daemons sharing a lease (docs/admin.md, "A standby daemon on a second host";
    :mod:`slurm_amoeba.daemon.lease`). Off while ``lease_dir`` is unset.

    Attributes:
        lease_dir: the directory both daemons' hosts mount where the lease lives; None: no standby, no lease.
        advertise: where agents and ``amoebactl`` reach this daemon (``tcp://HOST:PORT``); the standby names it
            to them. Defaults to ``listen`` when that names a host.
        renew_s: how often the active daemon renews the lease and the standby reads it.
        expiry_s: the active daemon stops acting this long after its last renewal it could not repeat.
        margin_s: the standby takes over after the lease went unrenewed for ``expiry_s + margin_s`` of its clock.
    """

    lease_dir: str | None = None
    advertise: str = ""
    renew_s: float = 2.0
    expiry_s: float = 10.0
    margin_s: float = 2.0

    @property
    def enabled(self) -> bool:
        """Whether this daemon is one of a pair."""
        return self.lease_dir is not None

    def takeover_bound_s(self, interval_s: float) -> float:
        """The longest time from the active daemon's death to the standby's first round: the lease it last renewed
        expires (``expiry_s``, plus up to ``renew_s`` since that renewal), the standby's margin, up to ``renew_s``
        until the standby next reads it, and one round."""
        return self.expiry_s + self.margin_s + 2 * self.renew_s + interval_s


@dataclasses.dataclass(frozen=True)
class DaemonConfig:
    """Everything ``amoebad`` is configured with (see ``configs/amoebad.yaml`` for the annotated file).

    Attributes:
        interval_s: seconds between two observe -> decide -> act rounds.
        listen: the ZeroMQ endpoint agents and ``amoebactl`` talk to (``tcp://HOST:PORT``).
        front_process: check the requests' credentials and sign the replies in a process of the daemon's own
            (:mod:`slurm_amoeba.transport.front`), so that the daemon's loop does not wait for munged on each
            request: for sites with thousands of agents (docs/operations.md).
        metrics_address: address of the Prometheus HTTP endpoint.
        metrics_port: its port; 0 switches it off.
        policy: the registered policy name.
        policy_knobs: the policy's settings (checked against the registry).
        regular_partitions: partitions whose pending jobs elastic extras make room for.
        elastic_partition: the preemptible partition satellites run in.
        operators: user names or uids that may resize, pin and drain any job.
        operator_uids: ``operators`` resolved to uids.
        operator_gids: groups (``@group`` entries in ``operators``) whose members are operators.
        agents: how directives are sent.
        limits: request rates and agents per uid, and the site's worker caps.
        resize_timeout_s: a resize not completed within this long is considered abandoned.
        make_room_after_s: a pending regular job younger than this is left to Slurm (which starts it, or preempts
            elastic extras for it, at once); after it the daemon shrinks elastic jobs for it.
        orphan_grace_s: a satellite whose parent is gone is reported after this long.
        whole_node_starts: a pending job that fits on one node but finds no node with enough free GPUs, while
            satellites hold the rest of one, makes those satellites move to free GPUs on other nodes (the
            elastic jobs keep their size; :mod:`slurm_amoeba.policy.moves`). Off by default: measured live, Slurm's
            own preemption of those satellites and the daemon's regrow did as well (docs/admin.md, section 8d).
        queue_order: ordering Slurm's queue by attained service.
        admission: admitting elastic jobs at their requested size.
        sharing: two opted-in jobs on one GPU (off by default).
        ha: the standby pair's lease (off by default).
        slurm_timeout_s: deadline of one Slurm command.
        slurm_conf: ``SLURM_CONF`` for Slurm's commands; None: the environment's.
        state_file: where pins, the drain switch and acknowledged resizes survive a restart; None: nowhere.
        log_level: ``debug``, ``info``, ``warning`` or ``error``.
        source: the file the configuration came from (for messages).
        digest: the SHA-256 of the file's text, first 12 hex digits (empty when not read from a file); the metric
            ``amoeba_config_loaded`` and ``amoebactl status`` name it, so an operator sees which file is in force.
    """

    interval_s: float = 5.0
    listen: str = "tcp://0.0.0.0:6820"
    front_process: bool = False
    metrics_address: str = "127.0.0.1"
    metrics_port: int = 9820
    policy: str = DEFAULT_POLICY
    policy_knobs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    regular_partitions: tuple[str, ...] = ("batch",)
    elastic_partition: str = "elastic"
    operators: tuple[str, ...] = ()
    operator_uids: frozenset[int] = frozenset()
    operator_gids: frozenset[int] = frozenset()
    agents: AgentSettings = dataclasses.field(default_factory=AgentSettings)
    limits: Limits = dataclasses.field(default_factory=Limits)
    resize_timeout_s: float = 120.0
    make_room_after_s: float = 5.0
    orphan_grace_s: float = 30.0
    whole_node_starts: bool = False
    queue_order: QueueOrder = dataclasses.field(default_factory=QueueOrder)
    admission: Admission = dataclasses.field(default_factory=Admission)
    sharing: Sharing = dataclasses.field(default_factory=Sharing)
    ha: HighAvailability = dataclasses.field(default_factory=HighAvailability)
    slurm_timeout_s: float = DEFAULT_TIMEOUT_S
    slurm_conf: str | None = None
    state_file: str | None = None
    log_level: str = "info"
    source: str = "<defaults>"
    digest: str = ""

    def restart_needed_for(self, new: DaemonConfig) -> list[str]:
        """The settings that differ in ``new`` and that only a restart applies (see :data:`RESTART_ONLY`)."""
        return [name for name in RESTART_ONLY if getattr(self, name) != getattr(new, name)]

    def effective_knobs(self) -> dict[str, Any]:
        """The knobs the daemon builds its policy with.

        In the live daemon Slurm starts pending jobs itself, so a policy that can also start them
        (``start_pending``) is told not to unless the configuration says otherwise.
        """
        knobs = dict(self.policy_knobs)
        if "start_pending" in policy_knobs(self.policy) and "start_pending" not in knobs:
            knobs["start_pending"] = False
        return knobs


def _section_defaults() -> dict[str, dict[str, object]]:
    """Every key of every section -> its default, for the message that refuses an unknown key."""
    base = DaemonConfig()
    nested: dict[str, dict[str, object]] = {
        "metrics": {"address": base.metrics_address, "port": base.metrics_port},
        "policy": {"name": base.policy, "knobs": dict(base.policy_knobs)},
        "partitions": {"regular": list(base.regular_partitions), "elastic": base.elastic_partition},
        "agents": dataclasses.asdict(base.agents),
        "slurm": {"timeout_s": base.slurm_timeout_s, "conf": base.slurm_conf},
        "queue_order": {
            "enabled": base.queue_order.enabled,
            "thresholds_gpu_s": list(base.queue_order.thresholds_gpu_s),
            "partitions": list(base.queue_order.partitions),
            "users": list(base.queue_order.users),
            "max_updates_per_round": base.queue_order.max_updates_per_round,
            "revert_on_stop": base.queue_order.revert_on_stop,
        },
        "admission": {
            "enabled": base.admission.enabled,
            "holds_by": base.admission.holds_by,
            "max_hold_s": base.admission.max_hold_s,
            "partitions": list(base.admission.partitions),
            "users": list(base.admission.users),
        },
        "sharing": {
            "enabled": base.sharing.enabled,
            "partitions": dict(base.sharing.partitions),
            "gpu_memory_gib": dict(base.sharing.gpu_memory_gib),
            "colocation_table": base.sharing.colocation_table,
            "default_kept": base.sharing.default_kept,
        },
        "ha": {
            "lease_dir": base.ha.lease_dir,
            "advertise": base.ha.advertise,
            "renew_s": base.ha.renew_s,
            "expiry_s": base.ha.expiry_s,
            "margin_s": base.ha.margin_s,
        },
        "limits": {
            "requests_per_s": base.limits.requests_per_s,
            "burst": base.limits.burst,
            "agents_per_uid": base.limits.agents_per_uid,
            "max_workers": base.limits.max_workers,
            "max_workers_per_user": {},
            "max_workers_per_account": {},
        },
    }
    top: dict[str, object] = {
        "interval_s": base.interval_s,
        "listen": base.listen,
        "front_process": base.front_process,
        "metrics": nested["metrics"],
        "policy": nested["policy"],
        "partitions": nested["partitions"],
        "operators": list(base.operators),
        "agents": nested["agents"],
        "limits": nested["limits"],
        "resize_timeout_s": base.resize_timeout_s,
        "make_room_after_s": base.make_room_after_s,
        "orphan_grace_s": base.orphan_grace_s,
        "whole_node_starts": base.whole_node_starts,
        "slurm": nested["slurm"],
        "queue_order": nested["queue_order"],
        "admission": nested["admission"],
        "sharing": nested["sharing"],
        "ha": nested["ha"],
        "state_file": base.state_file,
        "log_level": base.log_level,
    }
    return {"": top, **nested}


_DEFAULTS = _section_defaults()


class _Section:
    """One mapping of the YAML document, read key by key with checks that name the key's full path."""

    def __init__(self, data: Any, path: str, source: str) -> None:
        self.path = path
        self.source = source
        known = _DEFAULTS[path]
        if data is None:
            data = {}
        if not isinstance(data, dict):
            self.fail(path, data, f"{path or 'the top level'} must be a mapping of keys to values")
        for key in data:
            if not isinstance(key, str) or key not in known:
                raise ConfigError(unknown_key_message(source, self.full(str(key)), known))
        self.data: dict[str, Any] = data

    def full(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, value: Any, why: str) -> NoReturn:
        raise ConfigError(f"{self.source}: {key} = {value!r} is invalid: {why}")

    def number(self, key: str, default: float, *, positive: bool = True, maximum: float | None = None) -> float:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(self.full(key), value, "give a number of seconds")
        number = float(value)
        if number != number or (positive and number <= 0) or (not positive and number < 0):
            self.fail(self.full(key), value, "give a number greater than 0" if positive else "give 0 or more")
        if maximum is not None and number > maximum:
            self.fail(self.full(key), value, f"give at most {maximum:g}")
        return number

    def integer(self, key: str, default: int, low: int, high: int) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.fail(self.full(key), value, f"give a whole number from {low} to {high}")
        return int(value)

    def string(self, key: str, default: str) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str) or not value or "\0" in value or "\n" in value:
            self.fail(self.full(key), value, "give a non-empty string on one line")
        return str(value)

    def optional_string(self, key: str) -> str | None:
        if self.data.get(key) is None:
            return None
        return self.string(key, "")

    def section(self, key: str) -> _Section:
        return _Section(self.data.get(key), self.full(key), self.source)


def _check_endpoint(section: _Section, key: str, value: str) -> None:
    match = _ENDPOINT.match(value)
    if match is None or not 1 <= int(match.group("port")) <= 65535:
        section.fail(
            section.full(key), value, "give tcp://HOST:PORT with a port from 1 to 65535, e.g. tcp://0.0.0.0:6820"
        )


def _check_address(section: _Section, key: str, value: str) -> None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        section.fail(section.full(key), value, "give an IP address to listen on, e.g. 0.0.0.0 or 127.0.0.1")


def _partition(section: _Section, key: str, value: Any) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        section.fail(key, value, "give a Slurm partition name (letters, digits, _ . -)")
    return str(value)


def _operators(section: _Section) -> tuple[tuple[str, ...], frozenset[int], frozenset[int]]:
    raw = section.data.get("operators", [])
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        section.fail("operators", raw, "give a list of user names, uids or @groups")
    names: list[str] = []
    uids: set[int] = set()
    gids: set[int] = set()
    for item in raw:
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            section.fail("operators", item, "each operator is a user name, a uid or @group")
        if isinstance(item, int):
            if item < 0:
                section.fail("operators", item, "a uid is 0 or more")
            uids.add(item)
        elif item.startswith("@"):
            try:
                gids.add(grp.getgrnam(item[1:]).gr_gid)
            except KeyError:
                section.fail("operators", item, f"there is no group {item[1:]!r} on this host")
        else:
            try:
                uids.add(pwd.getpwnam(item).pw_uid)
            except KeyError:
                section.fail("operators", item, f"there is no user {item!r} on this host (`getent passwd {item}`)")
        names.append(str(item))
    return tuple(names), frozenset(uids), frozenset(gids)


def _user_uid(section: _Section, key: str, user: object) -> int:
    if isinstance(user, int) and not isinstance(user, bool) and user >= 0:
        return user
    if isinstance(user, str) and user.isdigit():
        return int(user)
    if isinstance(user, str):
        try:
            return pwd.getpwnam(user).pw_uid
        except KeyError:
            pass
    section.fail(key, user, f"there is no user {user!r} on this host (`getent passwd {user}`); give a name or a uid")


def _caps(section: _Section, key: str, high: int) -> dict[object, int]:
    raw = section.data.get(key) or {}
    if not isinstance(raw, dict):
        section.fail(section.full(key), raw, "give a mapping of names to worker counts")
    caps: dict[object, int] = {}
    for name, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            section.fail(f"{section.full(key)}.{name}", value, f"give a whole number from 1 to {high} (max_workers)")
        caps[name] = value
    return caps


def _limits(top: _Section) -> Limits:
    limits = top.section("limits")
    base = Limits()
    site = limits.integer("max_workers", base.max_workers, 1, 100_000)
    users = _caps(limits, "max_workers_per_user", site)
    accounts = _caps(limits, "max_workers_per_account", site)
    for account in accounts:
        if not isinstance(account, str) or not _NAME.match(account):
            limits.fail(f"limits.max_workers_per_account.{account}", account, "give a Slurm account name")
    rate = limits.number("requests_per_s", base.requests_per_s, maximum=100_000)
    agents = limits.integer("agents_per_uid", base.agents_per_uid, 1, 100_000)
    if rate * AGENT_REPORT_S < agents:
        limits.fail(
            "limits.requests_per_s",
            rate,
            f"each agent reports every {AGENT_REPORT_S:g} s, so limits.agents_per_uid = {agents} agents of one user "
            f"send {agents / AGENT_REPORT_S:g} reports per second; give at least that (and room for amoebactl)",
        )
    return Limits(
        requests_per_s=rate,
        burst=limits.integer("burst", base.burst, 1, 1_000_000),
        agents_per_uid=agents,
        max_workers=site,
        user_max_workers={
            _user_uid(limits, f"limits.max_workers_per_user.{user}", user): cap for user, cap in users.items()
        },
        account_max_workers={str(account): cap for account, cap in accounts.items()},
    )


def _flag(section: _Section, key: str, default: bool) -> bool:
    value = section.data.get(key, default)
    if not isinstance(value, bool):
        section.fail(section.full(key), value, "give true or false")
    return value


def _partitions_and_users(section: _Section, name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A section's ``partitions`` (empty: the regular ones) and ``users`` (empty: everyone) lists."""
    parts = section.data.get("partitions", [])
    if not isinstance(parts, list):
        section.fail(f"{name}.partitions", parts, "give a list of partition names ([] for partitions.regular)")
    users = section.data.get("users", [])
    if not isinstance(users, list) or not all(isinstance(u, str) and _NAME.match(u) for u in users):
        section.fail(f"{name}.users", users, "give a list of user names ([] for every user)")
    return tuple(_partition(section, f"{name}.partitions", p) for p in parts), tuple(users)


def _queue_order(top: _Section) -> QueueOrder:
    section = top.section("queue_order")
    base = QueueOrder()
    raw = section.data.get("thresholds_gpu_s", list(base.thresholds_gpu_s))
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        raw = [raw]
    ok = isinstance(raw, list) and bool(raw) and len(raw) <= 16
    ok = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < float("inf") for v in raw)
    if not ok or any(b <= a for a, b in itertools.pairwise(raw)):
        section.fail(
            "queue_order.thresholds_gpu_s", raw, "give 1 to 16 increasing GPU-second thresholds above 0, e.g. [57600]"
        )
    parts, users = _partitions_and_users(section, "queue_order")
    return QueueOrder(
        enabled=_flag(section, "enabled", base.enabled),
        thresholds_gpu_s=tuple(float(v) for v in raw),
        partitions=parts,
        users=users,
        max_updates_per_round=section.integer("max_updates_per_round", base.max_updates_per_round, 1, 10_000),
        revert_on_stop=_flag(section, "revert_on_stop", base.revert_on_stop),
    )


def _admission(top: _Section) -> Admission:
    section = top.section("admission")
    base = Admission()
    parts, users = _partitions_and_users(section, "admission")
    holds_by = section.string("holds_by", base.holds_by)
    if holds_by not in HOLDS_BY:
        section.fail(section.full("holds_by"), holds_by, f"give one of {', '.join(HOLDS_BY)}")
    return Admission(
        enabled=_flag(section, "enabled", base.enabled),
        holds_by=holds_by,
        max_hold_s=section.number("max_hold_s", base.max_hold_s, maximum=30 * 24 * 3600),
        partitions=parts,
        users=users,
    )


#: The most sharer workers beside one host on one node a site may allow (a GPU holds one host and one sharer; a
#: node this many GPUs).
MAX_SHARERS_PER_NODE = 64


def _sharing(top: _Section) -> Sharing:
    section = top.section("sharing")
    enabled = _flag(section, "enabled", Sharing().enabled)
    limits = _per_partition(
        section,
        "partitions",
        "sharer workers per node, e.g. {share: 4}",
        lambda limit: isinstance(limit, int) and 0 <= limit <= MAX_SHARERS_PER_NODE,
        f"give the most sharer workers beside one host per node, a whole number from 0 to {MAX_SHARERS_PER_NODE} "
        f"(its GPUs, e.g. 4)",
    )
    partitions = {partition: int(limit) for partition, limit in limits.items()}
    raw = section.data.get("partitions") or {}
    if enabled and not any(partitions.values()):
        section.fail(
            "sharing.partitions",
            raw,
            "sharing.enabled is true but no partition may host a sharer: name the sharing partition and its sharers "
            "per node, e.g. partitions: {share: 4}, or set sharing.enabled: false",
        )
    memory = _gpu_memory(section)
    kept = section.data.get("default_kept", DEFAULT_KEPT)
    if isinstance(kept, bool) or not isinstance(kept, (int, float)) or not 0.0 < kept <= 1.0:
        section.fail(
            "sharing.default_kept",
            kept,
            f"give the fraction of its speed a job keeps beside a partner of a type the table lacks, in (0, 1] "
            f"({DEFAULT_KEPT}: two jobs split the device)",
        )
    table_path = section.data.get("colocation_table", "")
    if not isinstance(table_path, str) or "\0" in table_path or "\n" in table_path:
        section.fail("sharing.colocation_table", table_path, "give the path of a Gavel throughputs file, or none")
    return Sharing(
        enabled=enabled,
        partitions=partitions,
        gpu_memory_gib=memory,
        colocation_table=table_path,
        default_kept=float(kept),
        colocation=_colocation_table(section, table_path) if enabled else {},
    )


#: The largest GPU memory a site may state (GiB).
MAX_GPU_MEMORY_GIB = 1 << 20


def _gpu_memory(section: _Section) -> dict[str, float]:
    sizes = _per_partition(
        section,
        "gpu_memory_gib",
        "GiB per GPU, e.g. {share: 80}",
        lambda gib: isinstance(gib, (int, float)) and 0 < gib <= MAX_GPU_MEMORY_GIB,
        f"give the device memory of one GPU of the partition's nodes in GiB, above 0 and at most "
        f"{MAX_GPU_MEMORY_GIB} (e.g. 80 for an H100), or leave the partition out when unknown",
    )
    return {partition: float(gib) for partition, gib in sizes.items()}


def _per_partition(section: _Section, key: str, example: str, valid: Callable[[Any], bool], why: str) -> dict[str, Any]:
    """The mapping of partition names to values at ``key`` of ``section``, each name and value checked (``valid``;
    a flag never is), a bad one failing with ``why``."""
    raw = section.data.get(key) or {}
    if not isinstance(raw, dict):
        section.fail(section.full(key), raw, f"give a mapping of partition names to {example}")
    values: dict[str, Any] = {}
    for name, value in raw.items():
        partition = _partition(section, section.full(key), name)
        if isinstance(value, bool) or not valid(value):
            section.fail(f"{section.full(key)}.{partition}", value, why)
        values[partition] = value
    return values


def _colocation_table(section: _Section, path: str) -> dict[tuple[str, str], float]:
    """The prior's table: Gavel's throughputs at ``path`` ("": the packaged copy; ``none``: no table)."""
    if path == "none":
        return {}
    try:
        return read_colocation(Path(path) if path else packaged_gavel_table())
    except PolicyError as exc:
        section.fail(
            "sharing.colocation_table",
            path or str(packaged_gavel_table()),
            f"{exc}; give the path of Gavel's simulation_throughputs.json, leave the key out for the packaged "
            f"table, or write none to use sharing.default_kept for every pair",
        )


def _ha(top: _Section, listen: str) -> HighAvailability:
    section = top.section("ha")
    base = HighAvailability()
    lease_dir = section.optional_string("lease_dir")
    if lease_dir is None:
        if section.data:
            section.fail("ha.lease_dir", None, "give the shared directory of the lease, e.g. /shared/amoebad/lease")
        return base
    if not Path(lease_dir).is_absolute():
        section.fail("ha.lease_dir", lease_dir, "give an absolute path on a file system both daemons' hosts mount")
    host = _ENDPOINT.match(listen)
    wildcard = host is None or host.group("host") in _ANY_HOST
    advertise = section.string("advertise", "") if "advertise" in section.data else "" if wildcard else listen
    if not advertise:
        section.fail(
            "ha.advertise",
            None,
            f"listen = {listen} names no host: give the address agents reach this daemon at, "
            "e.g. tcp://ctl1.example.org:6820",
        )
    _check_endpoint(section, "advertise", str(advertise))
    renew = section.number("renew_s", base.renew_s, maximum=60)
    expiry = section.number("expiry_s", base.expiry_s, maximum=600)
    if expiry < 2 * renew:
        section.fail(
            "ha.expiry_s", expiry, f"give at least twice ha.renew_s = {renew:g}, so one slow renewal is not fatal"
        )
    return HighAvailability(
        lease_dir=lease_dir,
        advertise=str(advertise),
        renew_s=renew,
        expiry_s=expiry,
        margin_s=section.number("margin_s", base.margin_s, positive=False, maximum=600),
    )


def _knob_type_ok(default: object, value: object) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return True


def _policy(section: _Section) -> tuple[str, dict[str, Any]]:
    policy = section.section("policy")
    name = policy.string("name", DEFAULT_POLICY)
    if name not in policy_names():
        policy.fail("policy.name", name, f"valid policies are: {', '.join(policy_names())}")
    knobs_raw = policy.data.get("knobs", {}) or {}
    if not isinstance(knobs_raw, dict):
        policy.fail("policy.knobs", knobs_raw, "give a mapping of knob names to values")
    valid = policy_knobs(name)
    for key, value in knobs_raw.items():
        if key not in valid:
            raise ConfigError(unknown_key_message(f"{section.source}: policy {name!r}", f"policy.knobs.{key}", valid))
        if not _knob_type_ok(valid[key], value):
            policy.fail(f"policy.knobs.{key}", value, f"give a value like its default {valid[key]!r}")
    try:
        make_policy(name, **knobs_raw)
    except PolicyError as exc:
        raise ConfigError(f"{section.source}: policy.knobs {knobs_raw!r} is invalid: {exc}") from None
    return name, dict(knobs_raw)


def _agents(top: _Section) -> AgentSettings:
    agents = top.section("agents")
    base = AgentSettings()
    return AgentSettings(
        timeout_s=agents.number("timeout_s", base.timeout_s, maximum=300),
        retries=agents.integer("retries", base.retries, 0, 10),
        parallel=agents.integer("parallel", base.parallel, 1, 256),
        stale_after_s=agents.number("stale_after_s", base.stale_after_s),
        backoff_s=agents.number("backoff_s", base.backoff_s, positive=False),
    )


def parse_config(data: Any, source: str = "<config>") -> DaemonConfig:
    """Validate a parsed YAML document and build the configuration.

    Args:
        data: the document (a mapping; None or empty means every default).
        source: where it came from, for messages.

    Returns:
        The configuration.

    Raises:
        ConfigError: an unknown key, a wrong type or a bad value, named with its full key path.
    """
    top = _Section(data, "", source)
    defaults = DaemonConfig()
    interval = top.number("interval_s", defaults.interval_s, maximum=3600)
    listen = top.string("listen", defaults.listen)
    _check_endpoint(top, "listen", listen)
    metrics = top.section("metrics")
    metrics_address = metrics.string("address", defaults.metrics_address)
    _check_address(metrics, "address", metrics_address)
    metrics_port = metrics.integer("port", defaults.metrics_port, 0, 65535)
    name, knobs = _policy(top)
    partitions = top.section("partitions")
    regular_raw = partitions.data.get("regular", list(defaults.regular_partitions))
    if isinstance(regular_raw, str):
        regular_raw = [regular_raw]
    if not isinstance(regular_raw, list) or not regular_raw:
        partitions.fail("partitions.regular", regular_raw, "give a non-empty list of partition names")
    regular = tuple(_partition(partitions, "partitions.regular", item) for item in regular_raw)
    elastic = _partition(partitions, "partitions.elastic", partitions.data.get("elastic", defaults.elastic_partition))
    if elastic in regular:
        partitions.fail(
            "partitions.elastic", elastic, "the elastic partition must not also be a regular one (partitions.regular)"
        )
    operators, uids, gids = _operators(top)
    agent_settings = _agents(top)
    site_limits = _limits(top)
    slurm = top.section("slurm")
    slurm_conf = slurm.optional_string("conf")
    if slurm_conf is not None and not Path(slurm_conf).is_file():
        slurm.fail("slurm.conf", slurm_conf, "no such file; give the path of slurm.conf or leave the key out")
    state_file = top.optional_string("state_file")
    if state_file is not None and not Path(state_file).is_absolute():
        top.fail("state_file", state_file, "give an absolute path, e.g. /var/lib/amoebad/state.json")
    log_level = top.string("log_level", defaults.log_level)
    if log_level not in LOG_LEVELS:
        top.fail("log_level", log_level, f"give one of {', '.join(LOG_LEVELS)}")
    return DaemonConfig(
        interval_s=interval,
        listen=listen,
        front_process=_flag(top, "front_process", defaults.front_process),
        metrics_address=metrics_address,
        metrics_port=metrics_port,
        policy=name,
        policy_knobs=knobs,
        regular_partitions=regular,
        elastic_partition=elastic,
        operators=operators,
        operator_uids=uids,
        operator_gids=gids,
        agents=agent_settings,
        limits=site_limits,
        resize_timeout_s=top.number("resize_timeout_s", defaults.resize_timeout_s),
        make_room_after_s=top.number("make_room_after_s", defaults.make_room_after_s, positive=False, maximum=3600),
        orphan_grace_s=top.number("orphan_grace_s", defaults.orphan_grace_s, positive=False),
        whole_node_starts=_flag(top, "whole_node_starts", defaults.whole_node_starts),
        queue_order=_queue_order(top),
        admission=_admission(top),
        sharing=_sharing(top),
        ha=_ha(top, listen),
        slurm_timeout_s=slurm.number("timeout_s", defaults.slurm_timeout_s, maximum=600),
        slurm_conf=slurm_conf,
        state_file=state_file,
        log_level=log_level,
        source=source,
    )


#: Settings a running daemon cannot take on a reload (SIGHUP): its sockets, its state file, its Slurm commands, its
#: directive senders, its request limits and the operator actions checked against Slurm's rights at start. The
#: others (the policy and its knobs, the round interval, partitions, operators, resize timeouts, ``make_room_after_s``,
#: ``whole_node_starts``, ``log_level``) apply from the next round.
RESTART_ONLY: tuple[str, ...] = (
    "listen",
    "front_process",
    "metrics_address",
    "metrics_port",
    "state_file",
    "slurm_conf",
    "slurm_timeout_s",
    "orphan_grace_s",
    "agents",
    "limits",
    "queue_order",
    "admission",
    "ha",
)


def load_config(path: str | Path) -> DaemonConfig:
    """Read and validate a configuration file.

    Args:
        path: the YAML file.

    Returns:
        The configuration.

    Raises:
        ConfigError: the file cannot be read, is not YAML, or holds an invalid key or value.
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the daemon's configuration {source!r}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}") from None
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return dataclasses.replace(parse_config(data, source), digest=digest)
