"""Waiting for a condition: the one polling helper of the tests.

A test that must wait for something it cannot be told about (a subprocess recording an event,
a plugin registering) polls a condition until it holds or a bound passes, and fails saying what
it waited for. It never sleeps a fixed time and assumes that something happened meanwhile.

``eventually`` blocks the thread (tests of subprocesses); ``eventually_up`` is ``eventually`` for
a server a harness is starting (``eventsrc.bench.server_process.Server``); ``eventually_trio`` is
the same for a trio test, where a condition the code can signal (an event, a counter it exposes,
``trio.testing.wait_all_tasks_blocked()``) is better still when there is one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import trio

if TYPE_CHECKING:
    from eventsrc.bench.server_process import Server

T = TypeVar("T")


def _timed_out(what: str, timeout: float, last: object, context: Callable[[], str] | None) -> AssertionError:
    message = f"waited {timeout:g} s for {what}; the condition last gave {last!r}"
    return AssertionError(message + (f"\n{context()}" if context is not None else ""))


def eventually(
    condition: Callable[[], T],
    what: str,
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    stop: Callable[[], str | None] | None = None,
    context: Callable[[], str] | None = None,
) -> T:
    """Call ``condition`` every ``interval`` seconds until it returns something truthy, and
    return that. Fails after ``timeout`` seconds, or as soon as ``stop`` gives a reason to stop
    waiting (a process the condition depends on has exited); ``context`` adds what helps to
    understand a failure (a daemon's output)."""
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        if stop is not None and (reason := stop()) is not None:
            raise AssertionError(f"stopped waiting for {what}: {reason}")
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout, got, context)
        time.sleep(interval)


def eventually_up(server: Server, condition: Callable[[], object], what: str, timeout: float) -> None:
    """Poll ``condition`` until it holds; fail at once if ``server`` exits, with its log, and stop
    the server when failing (a start that did not come up leaves nothing running)."""
    try:
        eventually(condition, what, timeout=timeout, interval=0.02, stop=server.exited, context=server.log_tail)
    except BaseException:
        server.stop()
        raise


async def eventually_trio(condition: Callable[[], T], what: str, *, timeout: float = 10.0, interval: float = 0.02) -> T:
    """``eventually`` in a trio test: the other tasks run while it waits."""
    got = condition()
    with trio.move_on_after(timeout):
        while not got:
            await trio.sleep(interval)
            got = condition()
        return got
    raise _timed_out(what, timeout, got, None)
