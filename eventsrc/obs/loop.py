"""How long the daemon's loop is held: every trio task step timed, the long ones kept.

The daemon is one thread running one trio loop; grpclib's handlers run on trio-asyncio's
loop, one trio task that passes through a trio checkpoint between two asyncio callbacks.
So one task step is one piece of work that nobody else can interrupt: a trio task's run
up to its next checkpoint, or one asyncio callback (a handler's step, a connection's
``data_received``). Whatever else lands in it counts too: a garbage collection, a wait
for the GIL held by another thread. The longest step is the longest time the daemon
answered nobody, measured where it happens instead of guessed from a client's round
trips (which include the client's own scheduling).

``LoopHolds`` is a trio Instrument (``trio.lowlevel.add_instrument``): two clock reads a
step, a comparison, and, for a step of at least ``KEEP_SECONDS``, a line in a ring of the
latest ``KEEP`` long steps with the monotonic time it ended (CLOCK_MONOTONIC, the same
clock in every process of the machine: ``eventsrc bench scale`` finds the longest step
of a span from another process). The node API's Status carries it (``as_proto``).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import trio

#: Steps at least this long are kept with their end time and task's name.
KEEP_SECONDS = 0.004
#: How many of the latest long steps are kept.
KEEP = 1024
#: The goal of issue 15 item 3: no request holds the loop longer than about this.
OVER_SECONDS = 0.010

_clock = time.perf_counter
_now_ns = time.monotonic_ns


class LoopHolds(trio.abc.Instrument):
    """The loop's task steps: how many, the longest, how many over ``OVER_SECONDS``, and
    the latest ones of at least ``KEEP_SECONDS`` as (end monotonic ns, seconds, task name)."""

    def __init__(self) -> None:
        self.steps = 0
        self.longest = 0.0
        self.longest_task = ""
        self.over = 0
        self.kept = 0  # steps of at least KEEP_SECONDS, ever (the ring holds the latest KEEP)
        self.recent: deque[tuple[int, float, str]] = deque(maxlen=KEEP)
        self._started = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._started = _clock()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        started, self._started = self._started, 0.0
        if not started:  # added in the middle of this step: its start is unknown
            return
        held = _clock() - started
        self.steps += 1
        if held > self.longest:
            self.longest, self.longest_task = held, task.name
        if held < KEEP_SECONDS:
            return
        self.recent.append((_now_ns(), held, task.name))
        self.kept += 1
        if held >= OVER_SECONDS:
            self.over += 1

    def longest_since(self, since_ns: int) -> tuple[float, str]:
        """The longest kept step that ended after ``since_ns`` (0.0 when none was kept)."""
        return max(((held, name) for end, held, name in self.recent if end > since_ns), default=(0.0, ""))

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "longest_seconds": self.longest,
            "longest_task": self.longest_task,
            "over_10ms": self.over,
            "long_steps": self.kept,
        }
