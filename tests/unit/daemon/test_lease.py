"""The lease of a standby pair: two holders on one directory, each with a fake monotonic clock of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_amoeba.daemon.lease import LEASE_FILE, Lease, LeaseRecord, LeaseStore, Role


class FakeClock:
    """A monotonic clock a test moves by hand; each daemon has its own (their offsets differ on purpose)."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


RENEW, EXPIRY, MARGIN = 1.0, 5.0, 1.0


def make(tmp_path: Path, name: str, clock: FakeClock) -> Lease:
    return Lease(
        LeaseStore(tmp_path),
        f"tcp://{name}:6820",
        renew_s=RENEW,
        expiry_s=EXPIRY,
        margin_s=MARGIN,
        clock=clock,
        owner=name,
    )


def step(leases: list[Lease], clocks: list[FakeClock], seconds: float, *, alive: tuple[bool, ...] = ()) -> None:
    """Advance every clock by ``seconds`` in small ticks; each live daemon watches (standby) or keeps (holder)."""
    alive = alive or (True,) * len(leases)
    ticks = int(seconds / 0.25)
    for _ in range(ticks):
        for lease, clock, live in zip(leases, clocks, alive, strict=True):
            clock.advance(0.25)
            if not live:
                continue
            if lease.role is Role.STANDBY:
                lease.watch()
            else:
                lease.keep()
        assert sum(lease.acting() for lease in leases) <= 1, "two daemons act at once"


def test_the_first_daemon_takes_generation_one_and_the_second_stays_standby(tmp_path: Path) -> None:
    first_clock, second_clock = FakeClock(100.0), FakeClock(7.0)
    first, second = make(tmp_path, "a", first_clock), make(tmp_path, "b", second_clock)
    assert first.watch() and first.keep()
    step([first, second], [first_clock, second_clock], 30.0)
    assert first.role is Role.ACTIVE and first.generation == 1 and first.acting()
    assert second.role is Role.STANDBY and not second.acting()
    assert second.describe() == {
        "role": "standby",
        "generation": 1,
        "active": "tcp://a:6820",
        "lease_dir": str(tmp_path),
    }


def test_the_standby_takes_over_only_after_expiry_and_margin_of_its_own_clock(tmp_path: Path) -> None:
    first_clock, second_clock = FakeClock(0.0), FakeClock(1e6)  # wall clocks and boot times differ: never compared
    first, second = make(tmp_path, "a", first_clock), make(tmp_path, "b", second_clock)
    first.watch()
    first.keep()
    step([first, second], [first_clock, second_clock], 5.0)
    # The active one dies: from the standby's first read of its last renewal, expiry + margin must pass.
    step([first, second], [first_clock, second_clock], EXPIRY, alive=(False, True))
    assert not second.acting() and second.describe()["role"] == "standby"
    step([first, second], [first_clock, second_clock], MARGIN + 2 * RENEW, alive=(False, True))
    assert second.acting() and second.generation == 2 and second.describe()["role"] == "active"
    record = LeaseRecord.from_json((tmp_path / LEASE_FILE).read_text())
    assert (record.owner, record.generation) == ("b", 2)


def test_a_paused_active_daemon_that_wakes_after_expiry_stops_without_acting(tmp_path: Path) -> None:
    first_clock, second_clock = FakeClock(0.0), FakeClock(0.0)
    first, second = make(tmp_path, "a", first_clock), make(tmp_path, "b", second_clock)
    first.watch()
    first.keep()
    step([first, second], [first_clock, second_clock], 3.0)
    # SIGSTOP: the active daemon's clock runs on, but it neither renews nor acts.
    step([first, second], [first_clock, second_clock], EXPIRY + MARGIN + 3 * RENEW, alive=(False, True))
    assert second.acting()
    assert not first.acting()  # its own clock says its last renewal expired: nothing leaves, even before keep()
    assert not first.keep() and first.role is Role.DEPOSED
    step([first, second], [first_clock, second_clock], 10.0)
    assert first.role is Role.DEPOSED and second.acting()
    assert LeaseRecord.from_json((tmp_path / LEASE_FILE).read_text()).owner == "b"


def test_an_active_daemon_that_sees_a_newer_claim_stops_at_its_next_renewal(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    first = make(tmp_path, "a", clock)
    first.watch()
    assert first.keep()
    assert LeaseStore(tmp_path).claim(2, "intruder")
    clock.advance(RENEW)
    assert not first.keep() and first.role is Role.DEPOSED


def test_a_renewal_that_slips_in_before_the_claim_makes_the_new_holder_wait(tmp_path: Path) -> None:
    first_clock, second_clock = FakeClock(0.0), FakeClock(0.0)
    first, second = make(tmp_path, "a", first_clock), make(tmp_path, "b", second_clock)
    first.watch()
    first.keep()
    second.watch()  # reads generation 1, serial 1
    second_clock.advance(EXPIRY + MARGIN + 0.5)
    # The old holder renews between the standby's last read and its claim (a slow read, a clock running slow).
    store = LeaseStore(tmp_path)
    original = store.read
    calls = {"n": 0}

    def read_with_a_renewal_between() -> LeaseRecord | None:
        calls["n"] += 1
        record = original()
        if calls["n"] == 1:  # the standby's last read before its claim: the old holder renews right after it
            first_clock.advance(RENEW)
            assert first.keep()
        return record

    second.store.read = read_with_a_renewal_between  # type: ignore[method-assign]
    assert second.watch()
    assert second.role is Role.WAITING and not second.acting()
    step([first, second], [first_clock, second_clock], RENEW)
    assert first.role is Role.DEPOSED  # it saw claim.2 at its next renewal
    step([first, second], [first_clock, second_clock], EXPIRY + MARGIN + RENEW)
    assert second.acting()


def test_two_standbys_that_take_over_at_once_get_one_generation_between_them(tmp_path: Path) -> None:
    clocks = [FakeClock(0.0), FakeClock(0.0)]
    leases = [make(tmp_path, "a", clocks[0]), make(tmp_path, "b", clocks[1])]
    assert leases[0].watch()
    assert not leases[1].watch()  # generation 1 is claimed: it watches the new holder
    assert leases[0].keep() and leases[1].role is Role.STANDBY


def test_an_unreadable_lease_file_is_counted_as_none_and_claims_still_decide(tmp_path: Path) -> None:
    (tmp_path / LEASE_FILE).write_text("not json")
    (tmp_path / "claim.1").write_text("someone")
    lease = make(tmp_path, "a", FakeClock(0.0))
    assert lease.watch() and lease.generation == 2


def test_a_record_with_a_missing_field_is_refused() -> None:
    with pytest.raises(ValueError, match="lacks owner"):
        LeaseRecord.from_json(json.dumps({"owner": "a", "generation": 1, "serial": 1, "expiry_s": 5}))
