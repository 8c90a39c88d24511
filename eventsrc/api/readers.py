"""Readers of the node's history take turns, and the node's decisions go first.

A Watch stream replaying the log is all work and no waiting: a hundred of them on one loop
make every step of an admission wait behind a hundred steps of theirs (docs/adr/0028). So
the history is read and sent in turns:

- **one reader at a time**: a reader reads a chunk of records and sends them in its turn,
  and the others wait for theirs, parked (not runnable): the loop runs at most one reader's
  chunk between two steps of anything else;
- **decisions first**: a turn is not given while an admission or a removal runs
  (``deciding``), unless the reader has waited ``patience`` seconds for one to end (so a
  node that decides without pause still serves its readers, a chunk at a time);
- **a turn is lent, not owned**: a reader whose sends wait on its client (a full stream
  window: a client that reads slowly, or not at all) keeps its turn ``lease`` seconds at
  most; the next reader goes on meanwhile.

The turn is trio's (the daemon's tasks); a Watch handler, an asyncio coroutine, asks for it
with ``rpc.bridge.to_trio`` and gives it back with ``done``, which any code may call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import trio

#: records a reader reads and sends in one turn
CHUNK = 32
#: how long a turn may last while its reader waits on its client
LEASE = 0.02
#: how long a reader waits for the decisions under way to end before it takes a turn anyway
PATIENCE = 0.1
#: how long a Watch stream's send may wait on its client before the stream is cut off
WATCH_STALL = 30.0


class Turns:
    """The readers' turns (see the module's docstring)."""

    def __init__(
        self, lease: float = LEASE, patience: float = PATIENCE, clock: Callable[[], float] = trio.current_time
    ) -> None:
        self.lease, self.patience, self._clock = lease, patience, clock
        self._deciding = 0
        self._decided = trio.Event()
        self._decided.set()
        self._holder: object | None = None
        self._lease_end = 0.0
        self._waiting = trio.lowlevel.ParkingLot()
        self._token = trio.lowlevel.current_trio_token()
        self.given = 0  # turns given (tests)

    @contextmanager
    def deciding(self) -> Iterator[None]:
        """Around a decision (an admission, a removal): no turn starts meanwhile."""
        self._deciding += 1
        if self._deciding == 1:
            self._decided = trio.Event()
        try:
            yield
        finally:
            self._deciding -= 1
            if self._deciding == 0:
                self._decided.set()

    async def take(self) -> object:
        """Wait for a turn; the token to give it back with (``done``)."""
        while True:
            if self._deciding:
                with trio.move_on_after(self.patience):
                    await self._decided.wait()
            if self._holder is None or self._clock() >= self._lease_end:
                break
            with trio.move_on_at(self._lease_end):
                await self._waiting.park()
        token = self._holder = object()
        self._lease_end = self._clock() + self.lease
        self.given += 1
        return token

    def done(self, token: object) -> None:
        """The turn ``token`` is over: the next reader's goes on. Callable from any code that
        runs on the daemon's thread (an asyncio handler too): it only schedules the wakeup."""
        self._token.run_sync_soon(self._release, token)

    def _release(self, token: object) -> None:
        if self._holder is token:  # else its lease ran out, and another reader has the turn
            self._holder = None
            self._waiting.unpark()
