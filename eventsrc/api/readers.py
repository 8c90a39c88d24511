"""Readers of the node's history take turns, and the node's decisions go first.

A Watch stream replaying the log is all work and no waiting: a hundred of them on one loop
make every step of an admission wait behind a hundred steps of theirs (docs/adr/0028). So
the history is read and sent in turns:

- **one reader at a time**: a reader reads a chunk of records and sends them in its turn,
  and the others wait for theirs, parked (not runnable): the loop runs at most one reader's
  chunk between two steps of anything else;
- **decisions first**: while an admission or a removal runs (``decision_runs``, from its
  request's arrival to its answer), one turn is given every ``patience`` seconds at most (so
  a node that decides without pause still serves its readers, a chunk at a time), and
  between decisions, one after the other;
- **a turn is lent, not owned**: a reader whose sends wait on its client (a full stream
  window: a client that reads slowly, or not at all) keeps its turn ``lease`` seconds at
  most; the next reader goes on meanwhile, and the first sends nothing more (beyond the
  message it was sending) until it has taken another turn.

Turns are given in the order they were asked for, by one task of the daemon's (``run``); a
Watch handler, an asyncio coroutine, asks with ``rpc.bridge.to_trio`` and gives its turn
back with ``done``, which any code on the daemon's thread may call.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import trio

#: records a reader reads and sends in one turn
CHUNK = 16
#: how long a turn may last while its reader waits on its client
LEASE = 0.02
#: while decisions run, the least time between two turns
PATIENCE = 0.1
#: how long a Watch stream's send may wait on its client before the stream is cut off
WATCH_STALL = 30.0


class Holder(Protocol):
    turn: object | None


class _Asked:
    def __init__(self) -> None:
        self.given = trio.Event()
        self.token: object | None = None


class Turns:
    """The readers' turns (see the module's docstring)."""

    def __init__(
        self, lease: float = LEASE, patience: float = PATIENCE, clock: Callable[[], float] = trio.current_time
    ) -> None:
        self.lease, self.patience, self._clock = lease, patience, clock
        self._decisions = 0  # admissions and removals running now
        self._holder: object | None = None
        self._lease_end = 0.0
        self._last_given = -math.inf
        self._asked: deque[_Asked] = deque()
        self._changed = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        self.given = 0  # turns given (tests)

    async def run(self) -> None:
        """Give the turns, for ever (a task of the daemon's)."""
        while True:
            self._changed = trio.Event()
            wake_at = self._give()
            with trio.move_on_at(wake_at):
                await self._changed.wait()

    def _give(self) -> float:
        """Give the next turn if it may start now; else when it may by time alone (inf: not
        before something changes)."""
        if not self._asked:
            return math.inf
        now = self._clock()
        at = max(
            self._lease_end if self._holder is not None else now,
            self._last_given + self.patience if self._decisions else now,
        )
        if at > now:
            return at
        asked = self._asked.popleft()
        asked.token = self._holder = object()
        self._lease_end, self._last_given = now + self.lease, now
        self.given += 1
        asked.given.set()
        return now if self._asked else math.inf

    @contextmanager
    def decision_runs(self) -> Iterator[None]:
        """Around a decision: turns wait (see the module's docstring). Usable on either side
        (trio, or an asyncio handler)."""
        self._decisions += 1
        try:
            yield
        finally:
            self._decisions -= 1
            if self._decisions == 0:
                self._token.run_sync_soon(self._changed_now)

    async def take(self, holder: Holder) -> object:
        """Wait for a turn, noted on ``holder`` (``holder.turn``) as it is given: ``done(holder)``
        gives it back, however its reader ends. The turn's token."""
        asked = _Asked()
        self._asked.append(asked)
        self._changed.set()
        try:
            await asked.given.wait()
        except BaseException:
            if asked.token is None:
                self._asked.remove(asked)
            else:
                self._release(asked.token)
            raise
        assert asked.token is not None
        holder.turn = asked.token
        return asked.token

    def holds(self, token: object) -> bool:
        """Whether ``token`` still has the turn: a reader whose turn passed on (its lease ran
        out while a send waited on its client) sends no more before it takes another."""
        return self._holder is token

    def done(self, holder: Holder) -> None:
        """``holder``'s turn, if it has one, is over: the next reader's goes on. Callable from
        any code that runs on the daemon's thread (an asyncio handler too): it only schedules
        the change."""
        if holder.turn is not None:
            self._token.run_sync_soon(self._release, holder.turn)
            holder.turn = None

    def _release(self, token: object) -> None:
        if self._holder is token:  # else its lease ran out, and another reader has the turn
            self._holder = None
            self._changed.set()

    def _changed_now(self) -> None:
        self._changed.set()


class Cancellable(Protocol):
    def cancel(self) -> Any: ...


class Sending:
    """One Watch stream's sends, as the watchdog sees them."""

    def __init__(self, task: Cancellable) -> None:
        self.task = task
        self.since: float | None = None  # when the send under way began (None: none is)
        self.cut_off = False
        self.turn: object | None = None  # its reader's turn (Turns.take), while it has one


class Stalls:
    """Cuts off the Watch streams whose send has waited on their client ``stall`` seconds (a
    client that does not read): what it has not read is all that is kept for it. One task of
    the daemon's looks every quarter of ``stall``, so no timer is made per send."""

    def __init__(self, stall: float = WATCH_STALL, clock: Callable[[], float] = trio.current_time) -> None:
        self.stall, self._clock = stall, clock
        self._streams: set[Sending] = set()

    def now(self) -> float:
        return self._clock()

    @contextmanager
    def watching(self, task: Cancellable) -> Iterator[Sending]:
        """Around a Watch handler (``task``: its asyncio task): its stream, seen by the watchdog."""
        sending = Sending(task)
        self._streams.add(sending)
        try:
            yield sending
        finally:
            self._streams.discard(sending)

    async def run(self) -> None:
        """Look for stalled streams, for ever (a task of the daemon's)."""
        while True:
            await trio.sleep(self.stall / 4)
            self.look()

    def look(self) -> None:
        now = self._clock()
        for s in self._streams:
            if s.since is not None and now - s.since >= self.stall and not s.cut_off:
                s.cut_off = True
                s.task.cancel()
