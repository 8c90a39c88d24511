"""The one way eventsrc waits before trying again (``core/backoff``)."""

from __future__ import annotations

from eventsrc.core.backoff import Backoff, delay


def test_doubling_capped_and_reset_after_a_success() -> None:
    b = Backoff(0.25, 1.5)
    assert [b.next() for _ in range(5)] == [0.25, 0.5, 1.0, 1.5, 1.5]
    b.reset()
    assert b.next() == 0.25
    assert [delay(n, 1.0, 60.0) for n in range(9)] == [0, 1, 2, 4, 8, 16, 32, 60, 60]
    assert delay(10_000, 1.0, 60.0) == 60.0  # no overflow, however long it failed
