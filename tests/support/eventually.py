"""Waiting for a condition: the one polling helper of the tests.

A test that must wait for something it cannot be told about (a subprocess recording an event,
a plugin registering) polls a condition until it holds or a bound passes, and fails saying what
it waited for. It never sleeps a fixed time and assumes that something happened meanwhile.

``eventually`` blocks the thread (tests of subprocesses); ``eventually_up`` is ``eventually`` for
a server a harness is starting (``testbed.servers.server_process.Server``); both are
``testbed.servers.server_process``'s, where the benchmarks' harnesses use them too (their failure
is an AssertionError, a ``WaitedTooLong``); ``eventually_trio`` is
the same for a trio test, where a condition the code can signal (an event, a counter it exposes,
``trio.testing.wait_all_tasks_blocked()``) is better still when there is one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import trio

from testbed.servers.server_process import eventually, eventually_up, timed_out

__all__ = ["eventually", "eventually_trio", "eventually_up"]
T = TypeVar("T")


async def eventually_trio(condition: Callable[[], T], what: str, *, timeout: float = 10.0, interval: float = 0.02) -> T:
    """``eventually`` in a trio test: the other tasks run while it waits."""
    got = condition()
    with trio.move_on_after(timeout):
        while not got:
            await trio.sleep(interval)
            got = condition()
        return got
    raise timed_out(what, timeout, got, None)
