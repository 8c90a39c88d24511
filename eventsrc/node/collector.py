"""Full garbage collections in a loop step of their own (docs/adr/0023).

CPython starts a full collection of its cycle collector inside whatever allocation
crossed the threshold: in the middle of an admission, a listing's send, a connection's
read, adding the collection's 3-7 ms (at 10,000 pods) to that step's own work. Once the
daemon is ready, ``Collector`` turns the automatic full collections off (the young and
middle generations are collected as ever) and runs them itself: a gc callback counts the
middle-generation collections and, every ``every`` of them, wakes the collector's task
(``TrioToken.run_sync_soon``, safe from any thread and any point of the program), whose
step is then the collection and nothing else.

A full collection that took longer than ``freeze_after`` freezes what survived it: the
next one only walks what was made since (a few ms instead of 142 ms at 10,000 pods). The
price: an object that outlived it and later ends in a reference cycle is never collected
(a cycle-free one is freed as ever, by its reference count); a daemon whose collections
stay short never freezes more than at its start.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import trio

#: Middle-generation collections between two full ones (CPython's default: 10). At 10 the
#: objects promoted between two full collections alone took 7-14 ms to walk at 10,000 pods.
FULL_COLLECTION_EVERY = 2
#: A full collection longer than this freezes what survived it.
FREEZE_AFTER_SECONDS = 0.004
#: The full generation's threshold while the collector runs: never reached.
NEVER = 1 << 30
#: CPython's own, restored after (when another collector's NEVER is what was found)
DEFAULT_FULL_THRESHOLD = 10


class Collector:
    """Runs the full collections in its own task (``run``), every ``every`` middle ones."""

    def __init__(
        self,
        every: int = FULL_COLLECTION_EVERY,
        freeze_after: float = FREEZE_AFTER_SECONDS,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.every = every
        self.freeze_after = freeze_after
        self._clock = clock
        self.middle = 0  # middle-generation collections since the last full one
        self.collections = 0  # full collections run
        self.freezes = 0
        self._due = trio.Event()
        self._asked = False
        self._token: trio.lowlevel.TrioToken | None = None

    def _counted(self, phase: str, info: dict[str, Any]) -> None:
        """The gc callback: runs inside whatever allocation started a collection."""
        if phase != "stop" or info["generation"] != 1:
            return
        self.middle += 1
        if self.middle >= self.every and not self._asked and self._token is not None:
            self._asked = True
            self._token.run_sync_soon(self._wake)

    def _wake(self) -> None:
        self._due.set()

    def collect(self) -> None:
        """One full collection, and a freeze after it if it was long."""
        self.middle = 0
        started = self._clock()
        gc.collect(2)
        took = self._clock() - started
        self.collections += 1
        if took > self.freeze_after:
            gc.freeze()
            self.freezes += 1

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled: automatic full collections off, ours when due; restored after."""
        self._token = trio.lowlevel.current_trio_token()
        young, middle, full = gc.get_threshold()
        gc.set_threshold(young, middle, NEVER)
        gc.callbacks.append(self._counted)
        try:
            task_status.started()
            while True:
                await self._due.wait()
                self._due = trio.Event()
                self.collect()
                self._asked = False
        finally:
            gc.callbacks.remove(self._counted)
            gc.set_threshold(young, middle, DEFAULT_FULL_THRESHOLD if full == NEVER else full)
            self._token = None
