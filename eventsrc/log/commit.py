"""The trio side of the log: group commit and the live tail.

``GroupCommitter.run`` is one task in the daemon's nursery. Appenders queue their events
and wait; the task takes everything queued, commits it in a worker thread (one write
transaction, one sync) and wakes every appender of that batch. While a sync is in flight
new appenders pile up, so the next batch is bigger: throughput rises with concurrency
while each append still returns only after its own durable commit.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import AsyncIterator, Callable, Sequence

import trio
from trio.lowlevel import Abort, Task, current_task, reschedule, wait_task_rescheduled

from eventsrc.errors import LogClosedError
from eventsrc.events import CorruptRecordError, Record, _Event
from eventsrc.log.store import EventLog, PendingAppend

_cid_random = random.Random(secrets.randbits(128))


def new_correlation_id() -> str:
    """64 random bits as 16 hex digits: unique enough per node, cheap on the hot path."""
    return f"{_cid_random.getrandbits(64):016x}"


def _no_abort(_: object) -> Abort:
    # Once queued, an append is committed; the appender must wait to learn the outcome.
    return Abort.FAILED


class GroupCommitter:
    def __init__(
        self,
        log: EventLog,
        on_commit: Callable[[list[Record]], None] | None = None,
    ) -> None:
        self.log = log
        self._queue: list[tuple[PendingAppend, Task]] = []
        self._work = trio.Event()
        self._appended = trio.Event()
        self._closed = False
        self._on_commit = on_commit
        #: Sizes of the last batches (for metrics and benchmarks).
        self.batches = 0
        self.appended = 0

    async def append(
        self,
        events: Sequence[_Event],
        correlation_id: str | None = None,
        expect_last: int | None = None,
    ) -> list[Record]:
        """Append ``events`` as one unit; return them with their sequence numbers.

        Waits until the batch holding them is durable. Raises ConcurrencyConflictError if
        ``expect_last`` is given and the log's last sequence differs at commit time.
        Not cancellable once queued: the caller always learns whether its events are in.
        """
        if self._closed:
            raise LogClosedError("the event log is closed")
        req = PendingAppend(events, correlation_id or new_correlation_id(), 0, expect_last)
        self._queue.append((req, current_task()))
        self._work.set()
        # Parked until the committer reschedules this task (the cheapest wake-up trio has:
        # with 64 writers, the per-append overhead decides the group-commit gain).
        await wait_task_rescheduled(_no_abort)
        if req.error is not None:
            raise req.error
        return req.records

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Commit queued appends until cancelled; on cancel, commit what is queued, then stop."""
        task_status.started()
        try:
            while True:
                await self._work.wait()
                await self._commit_queued()
        finally:
            self._closed = True
            with trio.CancelScope(shield=True):
                await self._commit_queued()

    async def _commit_queued(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            self._work = trio.Event()
            reqs = [r for r, _ in batch]
            # The thread cannot be abandoned: the appenders must learn the outcome.
            await trio.to_thread.run_sync(self.log.commit, reqs)
            self.batches += 1
            committed: list[Record] = []
            for r in reqs:
                committed.extend(r.records)
            self.appended += len(committed)
            if committed and self._on_commit is not None:
                self._on_commit(committed)
            for _, task in batch:
                reschedule(task)
            appended, self._appended = self._appended, trio.Event()
            appended.set()
        self._work = trio.Event()

    async def wait_appended(self) -> None:
        await self._appended.wait()


async def follow(
    log: EventLog,
    from_seq: int = 1,
    committer: GroupCommitter | None = None,
    poll_interval: float = 0.2,
) -> AsyncIterator[Record | CorruptRecordError]:
    """Every record from ``from_seq`` on, then each new one as it is appended, forever.

    In the writing process it wakes on the committer's append signal; a reader in another
    process polls every ``poll_interval`` seconds. Cancel the caller to stop.
    """
    next_seq = max(from_seq, 1)
    while True:
        progressed = False
        for item in log.records(next_seq):
            progressed = True
            next_seq = item.seq + 1
            yield item
            if next_seq % 1024 == 0:
                await trio.lowlevel.checkpoint()
        if progressed:
            continue
        if committer is not None:
            with trio.move_on_after(poll_interval):
                await committer.wait_appended()
        else:
            await trio.sleep(poll_interval)
