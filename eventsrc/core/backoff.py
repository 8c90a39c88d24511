"""Doubling delays between tries, capped: pure (the caller sleeps)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Backoff:
    """``next()`` gives ``first``, then twice the last, up to ``most``; ``reset()`` starts again."""

    first: float
    most: float
    _next: float = 0.0

    def next(self) -> float:
        delay = self._next or self.first
        self._next = min(delay * 2, self.most)
        return delay

    def reset(self) -> None:
        self._next = 0.0
