"""Observations in the group committer (docs/adr/0042): projected onto the views at once, written
in a group with the next decision or within ``observations_wait``, the views always in the log's
order, and no reader that keeps a position served a record before its sync."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from eventsrc import events as ev
from eventsrc.errors import EventsrcError
from eventsrc.layout import Layout
from eventsrc.log.commit import GroupCommitter, ViewsAheadError, follow
from eventsrc.log.history import History
from eventsrc.log.snapshots import snapshot_path
from eventsrc.log.store import EventLog
from eventsrc.node.daemon import Daemon
from eventsrc.state.apply import apply_all
from eventsrc.state.views import Views


def started(i: int) -> ev.PodSandboxStarted:
    return ev.PodSandboxStarted(sandbox_id=f"s{i}", pod=ev.PodRef(uid=f"u{i}", namespace="default", name=f"p{i}"))


def removed(i: int) -> ev.PodRemoved:
    return ev.PodRemoved(pod_uid=f"pod-{i}", reason="test")


class HeldWrites:
    """``EventLog.write`` that, once ``hold()`` is called, waits in its worker thread until
    ``release()``: a sync that takes as long as the test wants."""

    def __init__(self, log: EventLog) -> None:
        self._write = log.write
        self._go = threading.Event()
        self._go.set()
        self.writing = threading.Event()  # a held write has begun
        log.write = self  # type: ignore[method-assign]

    def hold(self) -> None:
        self._go.clear()

    def release(self) -> None:
        self._go.set()

    def __call__(self, items: list, index: list | None = None) -> None:  # type: ignore[type-arg]
        if not self._go.is_set():
            self.writing.set()
            self._go.wait(30)
        self._write(items, index)


def applied_to(views: Views) -> Callable[[list[ev.Record]], None]:
    return lambda records: apply_all(views, records)


def from_the_log(log: EventLog) -> Views:
    views = Views()
    apply_all(views, [r for r in log.records() if isinstance(r, ev.Record)])
    return views


@asynccontextmanager
async def committing(path: Path, wait: float) -> AsyncIterator[tuple[EventLog, Views, GroupCommitter]]:
    """A committer running, its log at ``path`` and its views; on leaving, what is queued is
    written and the views are checked against the log's."""
    log = EventLog(path)
    views = Views()
    committer = GroupCommitter(log, on_commit=applied_to(views), observations_wait=wait)
    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        yield log, views, committer
        nursery.cancel_scope.cancel()
    assert from_the_log(log) == views


async def test_an_observation_is_in_the_views_at_once_and_in_the_log_within_its_wait(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with committing(tmp_path / "log", 0.5) as (log, views, committer):
        t0 = trio.current_time()
        records = await committer.observe(lambda: [started(1)])
        assert trio.current_time() == t0  # nothing waited for
        assert [r.seq for r in records] == [1] and "s1" in views.runtime.sandboxes
        assert log.last_seq() == 0  # not written yet: gathering others
        await committer.observe(lambda: [started(2)])
        await committer.wait_appended()
        assert trio.current_time() - t0 == pytest.approx(0.5)  # the first one's wait, no more
        assert log.last_seq() == 2 and committer.batches == 1  # the two in one append


async def test_a_decision_carries_the_observations_queued_before_it_in_its_append(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with committing(tmp_path / "log", 60) as (log, _, committer):
        t0 = trio.current_time()
        await committer.observe(lambda: [started(1)])
        await committer.observe(lambda: [started(2)])
        decided = await committer.append([removed(3)])
        assert trio.current_time() - t0 < 1  # not the observations' wait: the decision's sync
        assert [r.seq for r in decided] == [3] and log.last_seq() == 3 and committer.batches == 1
    assert [type(r.event).__name__ for r in log.records()] == ["PodSandboxStarted"] * 2 + ["PodRemoved"]


async def test_an_observation_behind_a_write_waits_for_it_so_the_views_follow_the_logs_order(
    tmp_path: Path,
) -> None:
    """A decision is applied once synced; an observation that comes meanwhile is projected
    after it, not before: the views take records in the log's order."""
    log = EventLog(tmp_path / "log")
    held = HeldWrites(log)
    views = Views()
    order: list[str] = []

    def apply(records: list[ev.Record]) -> None:
        order.extend(type(r.event).__name__ for r in records)
        apply_all(views, records)

    committer = GroupCommitter(log, on_commit=apply, observations_wait=60)
    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        held.hold()
        nursery.start_soon(committer.append, [removed(1)])
        await trio.to_thread.run_sync(held.writing.wait)
        seen: list[list[ev.Record]] = []

        async def observe() -> None:
            seen.append(await committer.observe(lambda: [started(2)]))

        nursery.start_soon(observe)
        await trio.testing.wait_all_tasks_blocked()
        assert seen == [] and order == []  # behind the write: not projected before it
        held.release()
        with trio.fail_after(10):
            while not seen:
                await trio.sleep(0.01)
        assert log.last_seq() == 1  # the decision; the observation waits for others
        assert [r.seq for r in seen[0]] == [2] and order == ["PodRemoved", "PodSandboxStarted"]
        nursery.cancel_scope.cancel()
    assert from_the_log(log) == views and log.last_seq() == 2  # written at the stop


async def test_watch_and_follow_never_deliver_a_record_before_its_sync(tmp_path: Path) -> None:
    """With a sync held, the observation is in the views but no reader that keeps a position
    gets it: ``follow`` in the writing process, and the daemon's Watch (which reads through
    ``Daemon.records_from``: up to ``EventLog.last_seq``, what this writer knows synced)."""
    log = EventLog(tmp_path / "log")
    held = HeldWrites(log)
    views = Views()
    committer = GroupCommitter(log, on_commit=applied_to(views), observations_wait=0.01)
    got: list[int] = []

    async def read() -> None:
        history = History(log, None)
        async for item in follow(history, 1, committer, poll_interval=0.01):
            assert isinstance(item, ev.Record)
            got.append(item.seq)

    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        await committer.append([removed(1)])
        nursery.start_soon(read)
        with trio.fail_after(10):
            while got != [1]:
                await trio.sleep(0.01)
        held.hold()
        await committer.observe(lambda: [started(2)])
        assert "s2" in views.runtime.sandboxes
        await trio.to_thread.run_sync(held.writing.wait)  # its write has begun and is held
        for _ in range(5):  # the follower polls meanwhile, and is never served it
            await trio.sleep(0.02)
        assert got == [1] and log.last_seq() == 1
        assert list(log.records(1, log.last_seq())) == list(log.records(1, 1))
        held.release()
        with trio.fail_after(10):
            while got != [1, 2]:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


async def test_a_failed_append_of_projected_observations_stops_the_committer(tmp_path: Path) -> None:
    """The views hold what the log does not: the committer stops (the daemon with it, to be
    rebuilt from the log), and every appender learns it."""
    log = EventLog(tmp_path / "log")

    def full(items: list, index: list | None = None) -> None:  # type: ignore[type-arg]
        raise EventsrcError("cannot append to the event log: No space left on device")

    log.write = full  # type: ignore[method-assign]
    committer = GroupCommitter(log, on_commit=applied_to(Views()), observations_wait=60)
    told: list[BaseException] = []

    async def decide() -> None:
        try:
            await committer.append([removed(2)])
        except EventsrcError as exc:
            told.append(exc)

    with trio.fail_after(10), pytest.raises(BaseExceptionGroup) as raised:
        async with trio.open_nursery() as nursery:
            await nursery.start(committer.run)
            await committer.observe(lambda: [started(1)])
            nursery.start_soon(decide)
    assert raised.group_contains(ViewsAheadError)
    assert len(told) == 1 and "No space left" in str(told[0])
    assert log.last_seq() == 0


async def test_a_failed_append_of_decisions_alone_is_their_appenders_error(tmp_path: Path) -> None:
    """Without observations in it, a failed batch leaves the views as the log: the committer
    goes on (a full disk is told to the appenders; the daemon stays up, failing /healthz)."""
    log = EventLog(tmp_path / "log")
    write = log.write

    def full(items: list, index: list | None = None) -> None:  # type: ignore[type-arg]
        raise EventsrcError("cannot append to the event log: No space left on device")

    log.write = full  # type: ignore[method-assign]
    views = Views()
    committer = GroupCommitter(log, on_commit=applied_to(views), observations_wait=60)
    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        with pytest.raises(EventsrcError, match="No space left"):
            await committer.append([removed(1)])
        log.write = write  # type: ignore[method-assign]
        await committer.observe(lambda: [started(2)])
        assert [r.seq for r in await committer.append([removed(3)])] == [2]
        nursery.cancel_scope.cancel()
    assert from_the_log(log) == views and log.last_seq() == 2


def test_a_reader_in_another_process_stops_where_the_writer_says_it_synced(tmp_path: Path) -> None:
    """``export --follow`` and ``log --follow`` read the log from another process: LMDB shows
    them a transaction while its commit's sync is still under way. The writer publishes what
    it knows synced (``synced``, locked while it writes), and readers stop there (``follow``
    reads up to ``last_seq``); with no writer, the log is what it shows."""
    path = tmp_path / "log"

    def read() -> tuple[int, list[int]]:
        """(last_seq, the records' seqs) as a reader in another process has them."""
        script = (
            "import json, sys\n"
            "from eventsrc.log.store import EventLog\n"
            "log = EventLog(sys.argv[1], readonly=True)\n"
            "print(json.dumps([log.last_seq(), [r.seq for r in log.records()]]))\n"
        )
        out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True)
        last, seqs = json.loads(out.stdout)
        return last, seqs

    writer = EventLog(path)
    writer.append([removed(1)], "c", 1)
    assert read() == (1, [1])
    publish = writer._publish
    writer._publish = lambda: None  # type: ignore[method-assign]  # the sync of the next is under way
    writer.append([removed(2)], "c", 2)
    assert read() == (1, [1])  # LMDB shows record 2 already; the reader stops at 1
    publish()
    assert read() == (2, [1, 2])
    writer._publish = publish  # type: ignore[method-assign]
    writer.append([removed(3)], "c", 3)
    assert read() == (3, [1, 2, 3])
    writer._publish = lambda: None  # type: ignore[method-assign]
    writer.append([removed(4)], "c", 4)
    writer.close()  # no writer: the log is what LMDB shows
    assert read() == (4, [1, 2, 3, 4])


async def test_a_snapshot_is_taken_only_at_a_synced_position(tmp_path: Path) -> None:
    """The views hold an observation the log has not synced: the snapshot writes it first, so
    no snapshot holds what a power loss could take back (a start would find its seq beyond
    the log)."""
    layout = Layout(tmp_path / "root")
    layout.snapshots.mkdir(parents=True)
    log = EventLog(layout.log)
    daemon = Daemon(layout, log, Views(), snapshot_every=1_000_000, observations_wait=60)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.committer.run)
        await daemon.observe(lambda: [started(1)])
        assert (daemon.views.meta.last_seq, log.last_seq()) == (1, 0)
        await daemon.write_snapshot()
        assert log.last_seq() == 1 and snapshot_path(layout.snapshots, 1).exists()
        nursery.cancel_scope.cancel()
    log.close()


@pytest.mark.parametrize("seed", range(12))
async def test_decisions_and_observations_interleaved_leave_the_views_the_log_gives(tmp_path: Path, seed: int) -> None:
    """Tasks append decisions (sandboxes started) and observe (the newest sandbox the views
    hold, removed: an event that depends on the views at its turn) at random moments, while
    batches are being written. Rebuilt from the log, the views are the live ones: every record
    reached them in the log's order, and each observation saw what came before it in the log."""
    rng = random.Random(seed)
    log = EventLog(tmp_path / "log")
    views = Views()
    committer = GroupCommitter(log, on_commit=applied_to(views), observations_wait=rng.choice([0.0, 0.001, 0.01]))
    counter = iter(range(10_000))

    def newest_gone() -> list[ev.EventBase]:
        if not views.runtime.sandboxes:
            return []
        newest = max(views.runtime.sandboxes, key=lambda s: int(s[1:]))
        return [ev.PodSandboxRemoved(sandbox_id=newest, pod_uid=views.runtime.sandboxes[newest].uid)]

    async def actor(n: int) -> None:
        for _ in range(n):
            for _ in range(rng.randrange(3)):
                await trio.lowlevel.checkpoint()
            if rng.random() < 0.5:
                await committer.append([started(next(counter))])
            else:
                await committer.observe(newest_gone)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(committer.run)
            async with trio.open_nursery() as actors:
                for _ in range(4):
                    actors.start_soon(actor, 15)
            nursery.cancel_scope.cancel()
    assert from_the_log(log) == views
    assert log.last_seq() == views.meta.last_seq and committer.batches < log.last_seq()
