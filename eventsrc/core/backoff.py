"""Doubling delays between tries, capped: pure (the caller sleeps). The one way eventsrc
waits before trying again, whatever it tries (connecting to the runtime, the kubelet, NATS or
PostgreSQL; registering a plugin; finishing claim work; a retention cut)."""

from __future__ import annotations

from dataclasses import dataclass


def delay(failures: int, first: float, most: float) -> float:
    """The wait after ``failures`` failures in a row: 0 after none, then ``first``, doubling,
    up to ``most``."""
    if failures <= 0:
        return 0.0
    return min(most, first * 2 ** min(failures - 1, 62))


@dataclass
class Backoff:
    """``next()`` gives ``first``, then twice the last, up to ``most``; ``reset()`` (after a
    success) starts again."""

    first: float
    most: float
    failures: int = 0

    def next(self) -> float:
        self.failures += 1
        return delay(self.failures, self.first, self.most)

    def reset(self) -> None:
        self.failures = 0
