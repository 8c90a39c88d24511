"""The token bucket shared by PodResources, registrations and device-list recording."""

from __future__ import annotations

import pytest

from eventsrc.rpc.ratelimit import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_the_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=10, burst=3, clock=clock)
    assert [bucket.allow() for _ in range(4)] == [True, True, True, False]
    clock.now += 0.15  # one token back (and half of the next)
    assert bucket.allow() and not bucket.allow()
    clock.now += 60  # never more than the burst saved up
    assert sum(bucket.allow() for _ in range(10)) == 3


def test_delay_says_when_the_next_token_is_there_and_spend_can_owe_one() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=10, burst=1, clock=clock)
    assert bucket.delay() == 0
    bucket.spend()
    assert bucket.delay() == pytest.approx(0.1)
    bucket.spend()  # owed: the next token comes later still
    assert bucket.delay() == pytest.approx(0.2)
    clock.now += 0.15
    assert not bucket.allow() and bucket.delay() == pytest.approx(0.05)
    clock.now += 0.05 + 1e-9
    assert bucket.delay() == 0 and bucket.allow()
