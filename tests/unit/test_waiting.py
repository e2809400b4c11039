"""The tests' wait (tests/waiting.py): it returns the first true value and fails naming what it waited for."""

from __future__ import annotations

import pytest

from tests.waiting import wait_until


def test_wait_until_returns_the_first_true_value_the_predicate_gives() -> None:
    values = iter([None, [], ["ready"], ["later"]])
    assert wait_until("a list", lambda: next(values), timeout=5, every=0.001) == ["ready"]


def test_wait_until_fails_with_what_it_waited_for_and_the_last_value() -> None:
    calls: list[int] = []

    def never() -> dict[str, int]:
        calls.append(1)
        return {}

    with pytest.raises(
        pytest.fail.Exception, match=r"after 0.05 s waiting for the round to finish; the last value was \{\}"
    ):
        wait_until("the round to finish", never, timeout=0.05, every=0.01)
    assert len(calls) >= 2, "it polled, then gave up"
