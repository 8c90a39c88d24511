"""A token bucket: ``rate`` tokens a second, at most ``burst`` saved up.

The kubelet's limiter for PodResources (100/s, burst 10), and the daemon's own for
registrations and for recording a plugin's device lists. The clock is given, so the
bucket itself does no I/O: ``time.monotonic`` for gRPC handlers, ``trio.current_time``
inside trio tasks, a fake in tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    def __init__(self, rate: float = 100.0, burst: int = 10, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self.tokens = float(burst)
        self.last = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now

    def allow(self) -> bool:
        """Take a token if there is one."""
        self._refill()
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    def delay(self) -> float:
        """Seconds until a token is there (0: now)."""
        self._refill()
        return max(0.0, (1 - self.tokens) / self.rate)

    def spend(self) -> None:
        """Take a token even if it is not there yet: the bucket owes it."""
        self._refill()
        self.tokens -= 1
