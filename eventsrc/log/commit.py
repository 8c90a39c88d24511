"""The trio side of the log: group commit and the live tail.

``GroupCommitter.run`` is one task in the daemon's nursery. Appenders queue their events
and wait; the task takes everything queued, commits it in a worker thread (one write
transaction, one sync) and wakes every appender of that batch. While a sync is in flight
new appenders pile up, so the next batch is bigger: throughput rises with concurrency
while each append still returns only after its own durable commit.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence

import trio
from trio.lowlevel import Abort, Task, current_task, reschedule, wait_task_rescheduled

from eventsrc.errors import ConcurrencyConflictError, LogClosedError, LogCutWhileReadingError, RecordsCutError
from eventsrc.events import CorruptRecordError, EventBase, Record
from eventsrc.log.history import Gap, History
from eventsrc.log.store import EventLog, PendingAppend
from eventsrc.obs.logger import get_logger

log = get_logger(__name__)

# A random 64-bit start, then a counter: unique per node in practice, and cheap on the
# hot path. The low digits change from one id to the next (people see the last eight).
_cid_counter = itertools.count(secrets.randbits(60))
_cid_next = _cid_counter.__next__


def new_correlation_id() -> str:
    """16 hex digits, unique per request."""
    return f"{_cid_next():016x}"


#: Past this many records of observations queued, they are appended without waiting.
OBSERVATIONS_QUEUED = 1024
#: A batch of at most this many records is applied in one go (most are a request's few).
APPLY_WHOLE = 8
#: Applying a longer batch lets the loop run others after this long (seconds).
APPLY_BUDGET = 0.002
_clock = time.perf_counter


def _no_abort(_: object) -> Abort:
    # Once queued, an append is committed; the appender must wait to learn the outcome.
    return Abort.FAILED


class ViewsAheadError(LogClosedError):
    """Observations were projected onto the views and their append failed: the views hold
    records the log does not. The committer stops, and the daemon with it: its next start
    rebuilds the views from the log (docs/adr/0042)."""


class GroupCommitter:
    """One queue of appends, committed in batches: one write transaction and one sync each.

    Two kinds of append share it (docs/adr/0042):

    - a **decision** (``append``): its appender waits until it is durable, and it is applied
      to the views then; a batch holding a decision is committed at once;
    - an **observation** (``observe``): what already happened, which nothing waits for. It is
      projected onto the views at once, its sequence numbers given, and it waits in the queue
      for the next decision's batch, or at most ``observations_wait`` seconds, to be written
      with others. A decision's batch carries every observation queued before it.

    The log's order is the queue's, and the views take the records in that order: an
    observation that comes while a batch is being written, or behind a queued decision, is
    projected once those are applied (its caller waits for that). A batch whose write fails
    with observations projected in it leaves views ahead of the log: ``run`` raises
    ``ViewsAheadError`` and the daemon stops, to be rebuilt from the log.
    """

    def __init__(
        self,
        log: EventLog,
        on_commit: Callable[[list[Record]], None] | None = None,
        on_batch: Callable[[int], None] | None = None,
        observations_wait: float = 0.0,
    ) -> None:
        """``on_commit(records)``: records to apply to the views (a batch's decisions once
        durable, or one append's at a time in a long batch; an observation when projected);
        ``on_batch(n)``: a durable batch of n records; ``observations_wait``: how long an
        observation may wait for others (0: each is written at once, still after its answer)."""
        self.event_log = log
        self._on_batch = on_batch
        self._queue: list[PendingAppend] = []
        self._idle: Task | None = None  # the committer, parked while the queue is empty
        self._appended = trio.Event()
        self._closed = False
        self._on_commit = on_commit
        self.observations_wait = observations_wait
        self._behind = 0  # appends queued that are not in the views (decisions, observations waiting)
        self._writing = False  # a batch taken from the queue is being written or applied
        self._observed = 0  # records of projected observations in the queue
        self._observed_since = 0.0  # when the first of them was projected (trio's clock)
        self._hurry = trio.Event()  # a decision queued, or too many observations: commit now
        self._failure: BaseException | None = None  # applying a projection failed: stop
        #: Sizes of the last batches (for metrics and benchmarks).
        self.batches = 0
        self.appended = 0
        self.apply_pauses = 0  # times a long batch's apply let the loop run others

    async def append(
        self,
        events: Sequence[EventBase],
        correlation_id: str | None = None,
        expect_last: int | None = None,
    ) -> list[Record]:
        """Append ``events`` as one unit; return them with their sequence numbers.

        Waits until the batch holding them is durable. Raises ConcurrencyConflictError if
        ``expect_last`` is given and the log's last sequence differs at commit time.
        Not cancellable once queued: the caller always learns whether its events are in.
        """
        return await self.wait(self.submit(events, correlation_id, expect_last))

    def submit(
        self,
        events: Sequence[EventBase],
        correlation_id: str | None = None,
        expect_last: int | None = None,
    ) -> PendingAppend:
        """Queue ``events`` without waiting: they are ordered before anything submitted
        later. ``wait`` for them before acting on their being durable."""
        self._check_open()
        req = PendingAppend(events, correlation_id or new_correlation_id(), 0, expect_last)
        self._queue.append(req)
        self._behind += 1
        self._hurry.set()
        self._wake()
        return req

    async def observe(
        self, observed: Callable[[], Sequence[EventBase]], correlation_id: str | None = None
    ) -> list[Record]:
        """Record an observation: ``observed()`` gives its events, from the views at its turn.

        Returns its records once they are in the views, without waiting for them to be
        durable: at once, unless a batch is being written or a decision is queued ahead (then
        once those are applied). They are written with the next decision's batch, or within
        ``observations_wait`` seconds. Raises what ``observed`` raised, or why its events
        cannot be appended (nothing of it is then in the views).
        """
        self._check_open()
        if self.event_log.lost:
            raise LogClosedError(self.event_log.lost)
        req = PendingAppend((), correlation_id or new_correlation_id(), 0)
        req.observed = observed
        if self._writing or self._behind:  # what is ahead is not in the views yet: after it
            self._queue.append(req)
            self._behind += 1
            self._wake()
            return await self.wait(req)
        self._project(req)
        if req.error is not None:
            raise req.error
        if req.records:
            self._queue.append(req)
            self._wake()
        return req.records

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError("the event log is closed")

    def _wake(self) -> None:
        if self._idle is not None:
            committer, self._idle = self._idle, None
            reschedule(committer)

    def _project(self, req: PendingAppend) -> None:
        """Give observation ``req`` its events and sequence numbers and apply it to the views.
        Only while nothing taken from the queue is unapplied and no decision is queued ahead
        of it: the views take the records in the log's order."""
        assert req.observed is not None
        req.done = True
        try:
            events = req.observed()
        except Exception as exc:  # the observation's own failure: nothing of it recorded
            req.error = exc
            req.prepared = ([], [])
            return
        req.events, req.ts_ns = events, time.time_ns()  # when it was seen, not when written
        req.prepared = self.event_log.prepare([req]) if events else ([], [])
        if not req.records:
            return  # nothing, or an event that cannot be encoded (req.error)
        if not self._observed:
            self._observed_since = trio.current_time()
        self._observed += len(req.records)
        if self._observed >= OBSERVATIONS_QUEUED:
            self._hurry.set()
        if self._on_commit is not None:
            try:
                self._on_commit(req.records)
            except BaseException as exc:  # the views are half applied: stop (run raises it)
                self._failure = exc
                self._hurry.set()
                self._wake()
                raise

    async def wait(self, req: PendingAppend) -> list[Record]:
        """Until ``req`` is durable (and applied), or an observation projected; its records,
        or its error raised."""
        if not req.done:
            req.waiter = current_task()
            # Parked until the committer reschedules this task (the cheapest wake-up trio
            # has: with 64 writers, the per-append overhead decides the group-commit gain).
            await wait_task_rescheduled(_no_abort)
        if req.error is not None:
            raise req.error
        return req.records

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Commit queued appends until cancelled; on cancel, commit what is queued, then stop.

        If committing or applying fails in a way no single append caused (a bug, the disk,
        memory), or an append of projected observations fails, every waiting appender gets
        that error and the exception ends ``run``: the daemon stops and is rebuilt from the
        log, rather than going on with views that differ from what the log holds. No appender
        is ever left parked."""
        task_status.started()
        failure: BaseException | None = None
        try:
            while True:
                if not self._queue:
                    self._idle = current_task()
                    await wait_task_rescheduled(self._abort_idle)
                if not self._hurry.is_set() and not self._behind:
                    # Only observations: wait for others to share their append, a decision
                    # that takes them along, or their time.
                    with trio.move_on_at(self._observed_since + self.observations_wait):
                        await self._hurry.wait()
                    self._hurry.set()  # their time is up
                await self._commit_queued()
        except trio.Cancelled:
            raise  # a shutdown: what is queued is still committed, below
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self._closed = True
            try:
                if failure is None:
                    with trio.CancelScope(shield=True):
                        await self._commit_queued(everything=True)
            finally:
                self._fail_queued(failure)  # whatever could not be committed

    def _fail_queued(self, failure: BaseException | None) -> None:
        """Wake every appender still queued with an error (the committer has stopped)."""
        batch, self._queue = self._queue, []
        error = LogClosedError(
            f"the event log stopped before this append was committed: {failure!r}"
            if failure
            else "the event log is closed"
        )
        self._finish(batch, error)

    @staticmethod
    def _finish(batch: list[PendingAppend], error: BaseException | None = None) -> None:
        for req in batch:
            if req.done:
                continue
            if error is not None:
                req.records, req.error = [], error
            req.done = True
            if req.waiter is not None:
                reschedule(req.waiter)  # type: ignore[arg-type]

    def _project_waiting(self) -> None:
        """Project the observations at the queue's head that waited for what was ahead of
        them (nothing is being written now) and wake their callers."""
        for req in self._queue:
            if req.observed is None:
                return  # a decision: the ones after it wait for it
            if req.done:
                continue
            self._behind -= 1
            self._project(req)
            if req.waiter is not None:
                reschedule(req.waiter)  # type: ignore[arg-type]

    async def _commit_queued(self, everything: bool = False) -> None:
        """Write batches while a decision is queued or the observations' time is up (or, with
        ``everything``, until the queue is empty); observations projected meanwhile are left
        for ``run`` to gather others."""
        while self._queue or self._failure is not None:
            if self._failure is not None:
                raise self._failure
            self._project_waiting()
            if not (everything or self._behind or self._hurry.is_set()):
                return
            # Up to the first observation still waiting (behind a decision of this batch).
            cut = next((i for i, r in enumerate(self._queue) if not r.done and r.observed is not None), None)
            batch, self._queue = self._queue[:cut], self._queue[len(self._queue) if cut is None else cut :]
            self._behind -= sum(1 for r in batch if r.observed is None)
            self._observed, self._hurry = 0, trio.Event()
            if self._behind:
                self._hurry.set()
            self._writing = True
            try:
                await self._write(batch)
                self._project_waiting()  # before the batch's appenders see the views
            except BaseException as exc:
                self._finish(
                    batch, LogClosedError(f"the event log failed while committing or applying this append: {exc!r}")
                )
                raise
            finally:
                self._writing = False
            self._finish(batch)
            appended, self._appended = self._appended, trio.Event()
            appended.set()

    async def _write(self, batch: list[PendingAppend]) -> None:
        """Commit ``batch`` (one transaction, one sync) and apply its decisions."""
        # Shielded: once taken from the queue a batch is committed whatever happens to this
        # task, and the thread cannot be abandoned (its appenders must learn the outcome).
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.event_log.commit, batch)
        self.batches += 1
        _log_failed(batch)
        projected = [r for r in batch if r.observed is not None and r.prepared and r.prepared[0]]
        if projected and projected[0].error is not None:
            raise ViewsAheadError(
                f"an append of {len(projected)} observation(s) already in the views failed "
                f"({projected[0].error}): the views are ahead of the log; stopping to rebuild them from it"
            )
        committed = sum(len(req.records) for req in batch)
        self.appended += committed
        if committed and self._on_batch is not None:
            self._on_batch(committed)
        decided = [req.records for req in batch if req.records and req.observed is None]
        if decided and self._on_commit is not None:
            # Before any appender resumes: they see their events in the views.
            await self._apply(decided, sum(map(len, decided)), self._on_commit)

    async def _apply(
        self, appends: list[list[Record]], records: int, on_commit: Callable[[list[Record]], None]
    ) -> None:
        """``on_commit`` of a batch's ``records`` records, in order (``appends``: each
        append's). A batch of more than ``APPLY_WHOLE`` records is applied one append at a
        time, and once ``APPLY_BUDGET`` has gone by the loop runs others before the next
        append: a batch of hundreds of admissions never holds it for long. Others then see
        the views between two appends, a state the log had (``last_seq`` says which), never
        inside one: an append is one unit (a removal's releases with its PodRemoved, an
        admission's CPUs with its shared pool). The batch's appenders resume only once all of
        it is applied. The pause takes no cancellation: what is committed is always applied."""
        if records <= APPLY_WHOLE:
            on_commit([r for append in appends for r in append])
            return
        started = _clock()
        for i, append in enumerate(appends):
            if i and _clock() - started > APPLY_BUDGET:
                await trio.lowlevel.cancel_shielded_checkpoint()
                self.apply_pauses += 1
                started = _clock()
            on_commit(append)

    def _abort_idle(self, _: object) -> Abort:
        self._idle = None
        return Abort.SUCCEEDED

    async def wait_appended(self) -> None:
        await self._appended.wait()


def _log_failed(batch: list[PendingAppend]) -> None:
    """A warning for each append the log refused (a full disk, say): its caller is told, and
    the operator must be too. An optimistic-concurrency conflict is an answer, not a failure."""
    for req in batch:
        if req.error is not None and not isinstance(req.error, ConcurrencyConflictError):
            log.warning(
                "append failed",
                reason=str(req.error),
                events=[type(e).__name__ for e in req.events],
                cid=req.correlation_id,
            )


async def follow(
    history: History,
    from_seq: int = 1,
    committer: GroupCommitter | None = None,
    poll_interval: float = 0.2,
) -> AsyncIterator[Record | CorruptRecordError]:
    """Every record of ``history`` from ``from_seq`` on (the archive's, then the live log's),
    then each new one as it is appended, forever.

    It starts where the history does when ``from_seq`` is before it (the gaps
    ``History.missing`` names at the start are passed over, as every reader does). From
    then on it never skips a record: records a retention cut moves out of the live log
    before they are read (a slow consumer) are read from their archive segment, and when
    they cannot be (no archive, a segment missing, ``live_only``) it raises RecordsCutError
    naming the first of them.

    In the writing process it wakes on the committer's append signal; a reader in another
    process polls every ``poll_interval`` seconds. Cancel the caller to stop.
    """
    told = history.missing()  # passed over at the start: the reader said so
    next_seq = max(from_seq, 1)
    started = False
    while True:
        progressed = False
        if started and next_seq < history.live_first_seq():
            history.refresh()  # cut since the last pass: look for them in the new segments
        try:
            # Up to what the log says synced (in the writing process, what its writer knows
            # synced: a transaction under way is not served; docs/adr/0042).
            for item in history.records(next_seq, history.log.last_seq()):
                if started and item.seq != next_seq and not _passed_over(told, next_seq, item.seq - 1):
                    history.refresh()  # a cut between the look at the live log's start and the read
                    if history.covers(next_seq):
                        progressed = True  # read them from the new segment, at once
                        break
                    raise RecordsCutError(next_seq, item.seq - 1, history.unreadable(next_seq))
                started = progressed = True
                next_seq = item.seq + 1
                yield item
                if next_seq % 1024 == 0:
                    await trio.lowlevel.checkpoint()
        except LogCutWhileReadingError as err:
            raise RecordsCutError(err.next_seq, err.base_seq, history.unreadable(err.next_seq)) from None
        if progressed:
            continue
        if not started:  # nothing from from_seq yet: the live log's start, or the next append
            next_seq = max(next_seq, history.live_first_seq())
            started = True
        if committer is not None:
            with trio.move_on_after(poll_interval):
                await committer.wait_appended()
        else:
            await trio.sleep(poll_interval)


def _passed_over(gaps: list[Gap], first: int, last: int) -> bool:
    """Whether ``gaps`` cover every record from ``first`` to ``last``."""
    for g in sorted(gaps, key=lambda g: g.first):
        if g.first <= first <= g.last:
            first = g.last + 1
    return first > last
