"""The daemon's retention task (docs/adr/0018): when the live log outgrows ``logRetention``,
cut it at a piece boundary, in the steps of ``eventsrc.log.cut_steps``: the first (the views
at the cut, the sealed segment) in a process of its own when the cut is large
(``eventsrc.log.cut_worker``: its replay and encoding would hold the daemon's GIL), the others
in worker threads, none holding the log's writer for more than one short transaction.

The task wakes when the log crosses a piece boundary (``maybe_due``, from the commit
path), and, with ``maxAge``, on a clock as well. It first deletes what an interrupted cut
left (records before the base). Where to cut is ``eventsrc.core.retention_policy.plan_cut``.

A failed attempt (a full or unwritable archive) is tried again after a pause that doubles
with each failure in a row, up to a minute (``retry_delay``), and is said once per change
(``after_attempt``): one ERROR line when cutting starts to fail or fails for another reason,
one INFO line when it recovers. Meanwhile appends go on and the live log grows past its
bound; ``report`` tells ``eventsrc status``, the metrics and /healthz.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import trio

from eventsrc import events as ev
from eventsrc.core.retention_policy import (
    RETRY_FIRST_SECONDS,
    RETRY_MAX_SECONDS,
    CutHealth,
    Retention,
    RetentionReport,
    after_attempt,
    boundaries,
    plan_cut,
    retry_delay,
)
from eventsrc.errors import EventsrcError
from eventsrc.log import cut_steps as steps
from eventsrc.log import cut_worker
from eventsrc.log.store import EventLog
from eventsrc.node.interfaces import Recorder
from eventsrc.obs.logger import get_logger

log = get_logger(__name__)

#: the most records one cut takes (a long log is cut in several)
MAX_RECORDS_PER_CUT = 100_000
#: how often ``maxAge`` is looked at when nothing crosses a boundary (a tenth of it, within these)
AGE_CHECK_SECONDS = 60.0
MIN_AGE_CHECK_SECONDS = 1.0
#: how far into the live log a cut's LogTrimmed is looked for at start
TRIMMED_WITHIN = 10_000
#: a cut that replays fewer records, from views that encoded smaller at the previous cut, is
#: prepared in a worker thread: starting the worker process (some 0.2 s) would cost more than
#: the GIL such a thread holds, and small pieces under load would outrun the cuts
WORKER_MIN_RECORDS = 2_000
WORKER_MIN_VIEWS_BYTES = 1 << 20
#: an append waits at most this long for a lagging size cut: past it, the cut is late, the
#: appends go on without it (the live log grows past its bound) and the log and status say so.
#: A hung archive disk must never stop admissions. A cut takes well under a second normally.
ROOM_WAIT_SECONDS = 30.0


@dataclass
class CutReport:
    base_seq: int
    records: int
    segment: str
    seconds: float  # the whole cut, prepare to the last deletion
    longest_pause: float  # the longest transaction that held the log's writer


class Retainer:
    def __init__(
        self,
        recorder: Recorder,
        event_log: EventLog,
        archive: Path,
        policy: Retention,
        piece: int,
        shipped: Callable[[], int | None] = lambda: None,
    ) -> None:
        """``shipped``: with fleet shipping, what JetStream acknowledged (an age cut waits for
        it: ``plan_cut``); None without."""
        self.recorder = recorder
        self.shipped = shipped
        self.event_log = event_log
        self.archive = archive
        self.policy = policy
        self.piece = max(1, piece)
        self._due = trio.Event()
        # Looked at every quarter piece: a cut is due at most a quarter piece over maxSize.
        self.check_every = max(1, self.piece // 4)
        self._mark = event_log.last_seq() // self.check_every
        # Where the log was when a size cut became due and was not made yet (0: none). Past
        # another quarter piece, appends wait for it (``wait_for_room``): the live log stays
        # under maxSize plus one piece however far the load outruns the cuts.
        self._behind_since = 0
        self._caught_up = trio.Event()
        self._caught_up.set()
        self._task: trio.lowlevel.Task | None = None  # the task running ``run``
        self.cuts: deque[CutReport] = deque(maxlen=64)  # this run's last cuts, newest last (bench, tests)
        self._views_bytes = 0  # the encoded views' size at the last cut
        self.health = CutHealth()  # how the cuts fare (``after_attempt``)
        self.live_bytes = 0  # what the live records took at the latest look
        self.appends_waiting = 0
        self._attempt_started = 0.0  # time.monotonic() when the attempt under way began (0: none)
        self._late = False  # appends stopped waiting for the attempt under way
        # seams for the tests: the retry pauses and how long an append waits for a cut
        self.retry_first, self.retry_max = RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS
        self.room_wait = ROOM_WAIT_SECONDS

    def maybe_due(self, last_seq: int) -> None:
        """Called after each commit: wake the task every quarter piece."""
        mark = last_seq // self.check_every
        if mark != self._mark:
            self._mark = mark
            self._due.set()

    def _cut_planned(self) -> None:
        """A cut is planned: appends a quarter piece past this point wait for it (not when an
        earlier cut of this attempt was late: appends do not wait again until it ends)."""
        if self.policy.max_size and not self._behind_since and not self._late:
            self._behind_since = self.event_log.last_seq()
            self._caught_up = trio.Event()

    def _catch_up(self) -> None:
        """The base moved, no cut is needed, or a cut failed: appends need not wait."""
        self._behind_since = 0
        self._caught_up.set()

    def _lagging(self) -> bool:
        return bool(self._behind_since) and self.event_log.last_seq() - self._behind_since >= self.check_every

    async def wait_for_room(self) -> None:
        """Called before each append: while a planned size cut lags a quarter piece behind
        the log, wait for it, ``room_wait`` seconds at most (a cut that fails, or that is
        that late, lets the appends go: a failing archive must not stop the node's
        admissions). The retainer's own records never wait."""
        if self._task is not None and trio.lowlevel.current_task() is self._task:
            return
        if not self._lagging():
            return
        self.appends_waiting += 1
        try:
            with trio.move_on_after(self.room_wait) as waited:
                while self._lagging():
                    await self._caught_up.wait()
        finally:
            self.appends_waiting -= 1
        if waited.cancelled_caught and self._behind_since:
            self._late = True
            log.warning(
                "a retention cut is late; appends go on without it and the live log grows past its bound",
                waited_seconds=self.room_wait,
                cut_seconds=round(time.monotonic() - self._attempt_started, 1) if self._attempt_started else 0,
            )
            self._catch_up()

    def retry_seconds(self) -> float:
        """The pause after the latest attempt (0 when it succeeded)."""
        return retry_delay(self.health.in_a_row, self.retry_first, self.retry_max)

    def report(self) -> RetentionReport:
        """How retention fares, for ``eventsrc status`` (cheap: no I/O)."""
        started = self._attempt_started
        return RetentionReport(
            policy=self.policy,
            health=self.health,
            retry_seconds=self.retry_seconds(),
            live_bytes=self.live_bytes,
            cut_seconds=time.monotonic() - started if started else 0.0,
            late=self._late,
            appends_waiting=self.appends_waiting,
        )

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._task = trio.lowlevel.current_task()
        task_status.started()
        await self._record_unrecorded_cut()
        await self._delete_leftovers()
        if not self.policy.enabled:
            return
        period = None
        if self.policy.max_age_ns:
            period = min(AGE_CHECK_SECONDS, max(MIN_AGE_CHECK_SECONDS, self.policy.max_age_ns / 1e9 / 10))
        try:
            while True:
                if not await self.attempt():
                    # Tried again after the pause, due or not (the log is over its bound
                    # still, or no boundary may come): the boundaries crossed meanwhile wait.
                    await trio.sleep(self.retry_seconds())
                    self._due = trio.Event()
                    continue
                if period is None:
                    await self._due.wait()
                else:
                    with trio.move_on_after(period):
                        await self._due.wait()
                self._due = trio.Event()
        finally:
            self._catch_up()  # no append waits on a task that has ended

    async def attempt(self) -> bool:
        """Cut while due; False when a cut failed (said once per change: ``_tell``)."""
        reason = ""
        self._attempt_started = time.monotonic()
        try:
            await self.cut_while_due()
        except (EventsrcError, OSError) as err:  # a full disk, a lost log, an unwritable archive
            reason = steps.failure_reason(err)
            self._catch_up()
        finally:
            self._attempt_started, self._late = 0.0, False
        self._tell(reason)
        return not reason

    def _tell(self, reason: str) -> None:
        """Record how the attempt fared; log what changed, once."""
        before = self.health
        self.health, change = after_attempt(before, reason, time.time_ns())
        bounds = {"live_bytes": self.live_bytes, "max_size": self.policy.max_size}
        if change == "failing":
            # the live log keeps its records and grows past its bound until a cut succeeds
            log.error(
                "retention cut failed",
                reason=reason,
                retry_seconds=self.retry_seconds(),
                **bounds,
            )
        elif change == "reason changed":
            log.error(
                "retention cut failed for another reason",
                reason=reason,
                failed_attempts=self.health.in_a_row,
                **bounds,
            )
        elif change == "recovered":
            log.info(
                "retention cuts recovered",
                failed_attempts=before.in_a_row,
                failing_seconds=round((time.time_ns() - before.since_ns) / 1e9, 1),
                last_reason=before.reason,
            )

    async def cut_while_due(self) -> None:
        """Cut until the plan says the live log is within its bounds."""
        while True:
            seq, reason = await trio.to_thread.run_sync(self._plan)
            if not seq:
                self._catch_up()
                return
            self._cut_planned()
            await self.cut(seq, reason)

    def _plan(self) -> tuple[int, str]:
        el = self.event_log
        base, last = el.first_seq() - 1, el.last_seq()
        used = self.live_bytes = el.used_bytes()
        marks = boundaries(base, last, self.piece) if self.policy.max_age_ns else []
        times = steps.record_times(el, marks) if marks else {}
        now = time.time_ns()
        seq = plan_cut(
            self.policy,
            base=base,
            last=last,
            piece=self.piece,
            used_bytes=used,
            boundary_ts=times,
            now_ns=now,
            max_records=MAX_RECORDS_PER_CUT,
            shipped=self.shipped(),
        )
        if not seq:
            return 0, ""
        why = []
        if self.policy.max_size and used > self.policy.max_size:
            why.append(f"maxSize: live records take {used} bytes, over {self.policy.max_size}")
        if self.policy.max_age_ns and times.get(seq, now) < now - self.policy.max_age_ns:
            why.append(f"maxAge: record {seq} is older than {self.policy.max_age_ns / 1e9:g} s")
        return seq, "; ".join(why)

    async def cut(self, seq: int, reason: str = "") -> CutReport:
        """Cut the live log at ``seq`` (a record it holds): archive, move the base, record it,
        delete. The first step is a worker process's (a worker thread's for a small cut), the
        others worker threads'; the appends go on between the transactions."""
        t0 = time.perf_counter()
        archive = self.archive if self.policy.archive else None
        records = seq - self.event_log.first_seq() + 1
        if records >= WORKER_MIN_RECORDS or self._views_bytes >= WORKER_MIN_VIEWS_BYTES:
            prepared = await self._prepare(archive, seq)
        else:
            prepared = await trio.to_thread.run_sync(steps.prepare, self.event_log, archive, seq)
        self._views_bytes = len(prepared.views)
        pause = await trio.to_thread.run_sync(steps.commit, self.event_log, prepared)
        self._catch_up()  # the records up to the base are out of the live log now
        entry = prepared.entry
        trimmed = ev.LogTrimmed(base_seq=seq, records=entry.records, segment=entry.file, reason=reason)
        await self.recorder.record([trimmed])
        deleted, longest = await self._delete_leftovers()
        report = CutReport(seq, entry.records, entry.file, time.perf_counter() - t0, max(pause, longest))
        self.cuts.append(report)
        log.info(
            "log cut",
            base_seq=seq,
            records=entry.records,
            deleted=deleted,
            segment=entry.file or "(not archived)",
            seconds=round(report.seconds, 3),
            prepare_seconds=round(prepared.seconds, 3),
            longest_pause_ms=round(report.longest_pause * 1000, 2),
            reason=reason,
        )
        return report

    async def _prepare(self, archive: Path | None, seq: int) -> steps.Prepared:
        """Step 1 in ``cut_worker``'s process; waits for it to end (it is killed if this is
        cancelled). Its seconds are the wall time, the worker's start included."""
        t0 = time.perf_counter()
        answer = cut_worker.answer_file()
        try:
            # From the loop's thread, which lives as long as the daemon: the worker's
            # parent-death signal follows the thread that started it (trio's open_process
            # would start it from a worker thread, which ends when idle).
            proc = cut_worker.start(self.event_log.path, archive, seq, stdout=answer)
            try:
                status = await trio.to_thread.run_sync(proc.wait, abandon_on_cancel=True)
            finally:
                if proc.returncode is None:  # cancelled: the worker goes, reaped off the loop
                    proc.kill()
                    with trio.CancelScope(shield=True):
                        await trio.to_thread.run_sync(proc.wait)
            # mapped, decoded without copying the views (16 MB at 10,000 pods), in a thread
            prepared = await trio.to_thread.run_sync(cut_worker.read, status, answer)
        finally:
            os.close(answer)
        return replace(prepared, seconds=time.perf_counter() - t0)

    async def _record_unrecorded_cut(self) -> None:
        """A kill between moving the base and appending LogTrimmed leaves a cut the history
        does not tell of: the newest ledger entry's record is appended at start (before any
        new cut, only the newest can lack it)."""

        def missing() -> ev.LogTrimmed | None:
            ledger = self.event_log.ledger()
            if not ledger:
                return None
            newest = max(ledger, key=lambda e: e.last)
            first = self.event_log.first_seq()
            for item in self.event_log.records(first, first + TRIMMED_WITHIN - 1):
                trimmed = isinstance(item, ev.Record) and isinstance(item.event, ev.LogTrimmed)
                if trimmed and item.event.base_seq == newest.last:  # type: ignore[union-attr]
                    return None
            return ev.LogTrimmed(
                base_seq=newest.last,
                records=newest.records,
                segment=newest.file,
                reason="recorded at start: the daemon stopped between the cut and its record",
            )

        trimmed = await trio.to_thread.run_sync(missing)
        if trimmed is not None:
            await self.recorder.record([trimmed])
            log.warning("a cut's record was missing; recorded now", base_seq=trimmed.base_seq)

    async def _delete_leftovers(self) -> tuple[int, float]:
        """Delete the records at or before the base, a short transaction at a time."""
        deleted, longest = 0, 0.0
        while True:
            n, seconds = await trio.to_thread.run_sync(steps.delete_some, self.event_log)
            if not n:
                return deleted, longest
            deleted += n
            longest = max(longest, seconds)
