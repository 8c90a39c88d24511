"""The LMDB log: append, read, optimistic concurrency, group commit, growth, follow, locking."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from eventsrc import events as ev
from eventsrc.errors import AlreadyRunningError, ConcurrencyConflictError, EventsrcError, NoLogError
from eventsrc.events import CorruptRecordError
from eventsrc.log.commit import GroupCommitter, follow
from eventsrc.log.history import History
from eventsrc.log.store import DirLock, EventLog, PendingAppend
from eventsrc.log.verify import verify
from tests.support.eventually import eventually_trio

WRITER = Path(__file__).parent.parent / "support" / "writer_proc.py"


def removed(i: int) -> ev.PodRemoved:
    return ev.PodRemoved(pod_uid=f"pod-{i}", reason="test")


def uids(items: list) -> list[str]:
    return [r.event.pod_uid for r in items]


def test_append_assigns_contiguous_sequences_and_reads_back(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "log")
    recs = log.append([removed(1), removed(2)], "c1", 10)
    assert [r.seq for r in recs] == [1, 2]
    recs = log.append([removed(3)], "c2", 11)
    assert recs[0].seq == 3 and log.last_seq() == 3
    got = list(log.records())
    assert uids(got) == ["pod-1", "pod-2", "pod-3"]
    assert [r.correlation_id for r in got] == ["c1", "c1", "c2"]
    assert uids(list(log.records(2))) == ["pod-2", "pod-3"]
    assert uids(list(log.records(1, 2))) == ["pod-1", "pod-2"]
    assert list(log.records(4)) == []
    assert log.read(2).event == removed(2)


def test_range_reads_cross_chunk_boundaries(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "log")
    log.append([removed(i) for i in range(10_000)], "c", 1)
    assert [r.seq for r in log.records(4000, 8200)] == list(range(4000, 8201))
    assert len(list(log.records())) == 10_000


def test_optimistic_concurrency_conflict_is_the_callers_error(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "log")
    log.append([removed(1)], "c", 1, expect_last=0)
    with pytest.raises(ConcurrencyConflictError) as err:
        log.append([removed(2)], "c", 1, expect_last=0)
    assert (err.value.expected, err.value.actual) == (0, 1)
    assert "expected last sequence 0" in str(err.value)
    assert log.append([removed(2)], "c", 1, expect_last=1)[0].seq == 2
    assert log.last_seq() == 2


def test_map_grows_by_itself(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "log", map_size=64 * 1024)
    start = log.map_size()
    big = ev.DevicesAdded(
        resource="r", devices=[ev.DeviceInfo(id=f"dev-{i:04d}", health="Healthy") for i in range(200)]
    )
    for _ in range(200):
        log.append([big], "c", 1)
    assert log.map_size() > start
    assert log.last_seq() == 200
    log.close()
    reopened = EventLog(tmp_path / "log", readonly=True)
    assert len(list(reopened.records())) == 200


def write_in_subprocess(path: Path, count: int, map_size: int = 1 << 30) -> list[str]:
    proc = subprocess.run(
        [sys.executable, str(WRITER), str(path), str(count), "1", str(map_size)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return proc.stdout.splitlines()


def test_reader_sees_growth_made_by_another_writer(tmp_path: Path) -> None:
    write_in_subprocess(tmp_path / "log", 1, map_size=64 * 1024)
    reader = EventLog(tmp_path / "log", readonly=True)
    first = reader.last_seq()
    assert first >= 1
    acks = write_in_subprocess(tmp_path / "log", 2000, map_size=64 * 1024)
    assert reader.last_seq() == first + len(acks)
    assert len(list(reader.records())) == reader.last_seq()


def test_one_writer_per_state_directory(tmp_path: Path) -> None:
    lock = DirLock(tmp_path / "daemon.lock")
    lock.acquire()
    other = DirLock(tmp_path / "daemon.lock")
    with pytest.raises(AlreadyRunningError, match="already running"):
        other.acquire()
    assert DirLock.holder(tmp_path / "daemon.lock") is not None
    lock.release()
    assert DirLock.holder(tmp_path / "daemon.lock") is None
    other.acquire()
    other.release()


def test_a_status_probe_at_the_moment_of_a_start_does_not_refuse_it(tmp_path: Path) -> None:
    """``holder`` (what ``eventsrc status`` asks) takes a shared lock for an instant; a
    daemon starting in that instant is not a second daemon."""
    import fcntl
    import threading

    path = tmp_path / "daemon.lock"
    path.write_text("12345")  # the pid of a previous run, long gone
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # a probe in progress
    threading.Timer(0.05, os.close, (fd,)).start()  # and over 50 ms later
    lock = DirLock(path)
    lock.acquire()
    assert path.read_text() == str(os.getpid())
    lock.release()


def test_readonly_open_of_missing_log_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(NoLogError, match="no event log"):
        EventLog(tmp_path / "nothing", readonly=True)


def test_corrupt_record_is_yielded_not_skipped(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "log")
    log.append([removed(i) for i in range(5)], "c", 1)
    with log.env.begin(write=True, db=log.events_db) as txn:
        value = bytearray(txn.get((3).to_bytes(8, "big")))
        value[-2] ^= 0xFF
        txn.put((3).to_bytes(8, "big"), bytes(value))
    items = list(log.records())
    assert [i.seq for i in items] == [1, 2, 3, 4, 5]
    assert isinstance(items[2], CorruptRecordError) and items[2].seq == 3
    assert all(not isinstance(i, CorruptRecordError) for i in items[:2] + items[3:])


async def test_group_commit_shares_transactions_among_concurrent_writers(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "log")
    committer = GroupCommitter(log)
    acked: dict[str, int] = {}

    async def writer(w: int) -> None:
        for i in range(20):
            (rec,) = await committer.append([ev.PodRemoved(pod_uid=f"w{w}-{i}")])
            acked[rec.event.pod_uid] = rec.seq  # type: ignore[union-attr]

    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        async with trio.open_nursery() as writers:
            for w in range(64):
                writers.start_soon(writer, w)
        nursery.cancel_scope.cancel()
    assert len(acked) == 64 * 20
    assert sorted(acked.values()) == list(range(1, 64 * 20 + 1))
    # Batching happened: far fewer transactions than appends.
    assert committer.batches < 64 * 20 / 8
    on_disk = {r.event.pod_uid: r.seq for r in log.records()}  # type: ignore[union-attr]
    assert on_disk == acked


async def test_a_failed_write_fails_its_batch_and_the_log_stays_contiguous(tmp_path: Path) -> None:
    """A failed durable write fails its batch's appenders, and only theirs; the sequences they
    were given are given out again to the batches after it, so the log stays contiguous and
    chained."""
    log = EventLog(tmp_path / "log")
    write = log.write
    calls = 0

    def flaky(items: list, index: list | None = None) -> None:  # type: ignore[type-arg]
        nonlocal calls
        calls += 1
        if calls == 3:
            failing.append(len(items))
            raise EventsrcError("disk says no")
        write(items, index)

    failing: list[int] = []  # the records of the batch whose write failed
    log.write = flaky  # type: ignore[method-assign]
    committer = GroupCommitter(log)
    acked: dict[str, int] = {}
    failed: list[str] = []

    async def writer(w: int) -> None:
        for i in range(10):
            uid = f"w{w}-{i}"
            try:
                (rec,) = await committer.append([ev.PodRemoved(pod_uid=uid)])
                acked[uid] = rec.seq
            except EventsrcError:
                failed.append(uid)

    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        async with trio.open_nursery() as writers:
            for w in range(64):
                writers.start_soon(writer, w)
        nursery.cancel_scope.cancel()
    assert failing and len(failed) == failing[0] and len(acked) + len(failed) == 640
    assert sorted(acked.values()) == list(range(1, len(acked) + 1))
    on_disk = {r.event.pod_uid: r.seq for r in log.records()}  # type: ignore[union-attr]
    assert on_disk == acked
    last, findings = verify(log)
    assert last == len(acked) and findings == []


async def test_cancelling_the_committer_commits_what_it_took_and_what_is_queued(tmp_path: Path) -> None:
    """Shutdown while one batch syncs and another append waits behind it: both are
    committed and both appenders return (before, the queued one was dropped and its
    appender parked forever)."""
    import threading

    log = EventLog(tmp_path / "log")
    in_thread, release = threading.Event(), threading.Event()
    commit = log.commit

    def slow(batch: list) -> None:  # type: ignore[type-arg]
        in_thread.set()
        release.wait()  # a sync that lasts until the test has cancelled the committer
        commit(batch)

    log.commit = slow  # type: ignore[method-assign]
    committer = GroupCommitter(log)
    got: dict[str, int] = {}

    async def append(name: str) -> None:
        got[name] = (await committer.append([removed(0)]))[0].seq

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                with scope:
                    await committer.run(task_status=task_status)

            await nursery.start(run)
            nursery.start_soon(append, "a")
            await trio.to_thread.run_sync(in_thread.wait)
            nursery.start_soon(append, "b")
            await trio.testing.wait_all_tasks_blocked()  # b waits behind a's batch
            scope.cancel()
            release.set()
    assert got == {"a": 1, "b": 2} and log.last_seq() == 2


async def test_an_event_that_cannot_be_encoded_fails_its_own_append_only(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "log")
    committer = GroupCommitter(log)
    results: dict[str, object] = {}

    async def append(name: str, event: ev.EventBase) -> None:
        try:
            results[name] = [r.seq for r in await committer.append([removed(1), event])]
        except EventsrcError as err:
            results[name] = err

    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        async with trio.open_nursery() as batch:
            batch.start_soon(append, "good", removed(2))
            batch.start_soon(append, "bad", ev.PodRemoved(pod_uid=object()))  # type: ignore[arg-type]  # a bug upstream
            batch.start_soon(append, "after", removed(3))
        nursery.cancel_scope.cancel()
    assert committer.batches == 1
    assert isinstance(results["bad"], EventsrcError) and "cannot encode" in str(results["bad"])
    assert sorted([results["good"], results["after"]]) == [[1, 2], [3, 4]]  # type: ignore[type-var]
    assert verify(log) == (4, [])


@pytest.mark.parametrize("where", ["write", "apply"])
async def test_a_failure_no_append_caused_wakes_every_appender_and_stops_the_committer(
    tmp_path: Path, where: str
) -> None:
    """A bug or the machine failing the commit (not an EventsrcError), or the views failing
    to apply it: every appender learns it, ``run`` raises (the daemon stops and rebuilds
    from the log), and no sequence is skipped for whatever is committed after a restart."""
    log = EventLog(tmp_path / "log")
    write = log.write

    def broken(items: list, index: list | None = None) -> None:  # type: ignore[type-arg]
        raise RuntimeError("a bug")

    def broken_apply(records: list) -> None:  # type: ignore[type-arg]
        raise RuntimeError("a reducer bug")

    if where == "write":
        log.write = broken  # type: ignore[method-assign]
    committer = GroupCommitter(log, on_commit=broken_apply if where == "apply" else None)
    errors: list[BaseException] = []

    async def append(i: int) -> None:
        try:
            await committer.append([removed(i)])
        except EventsrcError as err:
            errors.append(err)

    with trio.fail_after(10), pytest.raises(BaseExceptionGroup) as raised:
        async with trio.open_nursery() as nursery:
            await nursery.start(committer.run)
            for i in range(20):
                nursery.start_soon(append, i)
    assert raised.group_contains(RuntimeError)
    assert len(errors) == 20 and all("a bug" in str(e) or "reducer bug" in str(e) for e in errors)
    before = log.last_seq()  # applying failed after the commit: those records are durable
    assert before == (0 if where == "write" else 20)
    log.write = write  # type: ignore[method-assign]
    log.commit([PendingAppend([removed(99)], "cid")])
    assert log.last_seq() == before + 1 and verify(log) == (before + 1, [])


async def test_conflicting_append_fails_alone_inside_a_batch(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "log")
    committer = GroupCommitter(log)
    results: dict[str, object] = {}

    async def append(name: str, expect: int | None) -> None:
        try:
            results[name] = (await committer.append([ev.PodRemoved(pod_uid=name)], expect_last=expect))[0].seq
        except ConcurrencyConflictError as err:
            results[name] = err

    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        async with trio.open_nursery() as batch:
            batch.start_soon(append, "a", 0)
            batch.start_soon(append, "b", 0)  # same expectation: one of the two loses
        await append("c", 1)
        nursery.cancel_scope.cancel()
    assert committer.batches == 2  # a and b shared one transaction
    won, lost = (results["a"], results["b"]) if results["a"] == 1 else (results["b"], results["a"])
    assert won == 1
    assert isinstance(lost, ConcurrencyConflictError) and lost.actual == 1
    assert results["c"] == 2
    assert log.last_seq() == 2


async def test_follow_wakes_on_new_appends(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "log")
    log.append([removed(0)], "c", 1)
    committer = GroupCommitter(log)
    seen: list[int] = []

    async def tail() -> None:
        async for item in follow(History(log, None), 1, committer, poll_interval=30):
            seen.append(item.seq)
            if len(seen) == 3:
                return

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(committer.run)
            async with trio.open_nursery() as tailing:  # until tail has seen three
                tailing.start_soon(tail)
                await trio.testing.wait_all_tasks_blocked()  # tail has read the log and waits
                assert seen == [1]
                await committer.append([removed(1)])
                await committer.append([removed(2)])
            nursery.cancel_scope.cancel()
    assert seen == [1, 2, 3]


async def test_follow_polls_a_log_written_by_another_process(tmp_path: Path) -> None:
    write_in_subprocess(tmp_path / "log", 1)
    reader = EventLog(tmp_path / "log", readonly=True)
    seen: list[int] = []

    async def tail() -> None:
        async for item in follow(History(reader, None), 1, poll_interval=0.02):
            seen.append(item.seq)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tail)
            first = reader.last_seq()
            await eventually_trio(lambda: len(seen) == first, "the tail to read what was there")
            acks = await trio.to_thread.run_sync(write_in_subprocess, tmp_path / "log", 5)
            total = reader.last_seq()
            assert len(acks) >= 5 and total > len(acks)
            await eventually_trio(lambda: len(seen) >= total, "the tail to read what was written since")
            nursery.cancel_scope.cancel()
    assert seen == list(range(1, total + 1))


async def test_a_long_batch_is_applied_in_order_letting_others_run_between_appends_never_inside_one(
    tmp_path: Path,
) -> None:
    log = EventLog(tmp_path / "log")
    calls: list[list[int]] = []  # each on_commit call's sequences
    seen_by_others: list[int] = []  # how many records were applied when another task ran

    def slow_apply(records: list) -> None:
        time.sleep(0.001 * len(records))  # plays records that take long to apply
        calls.append([r.seq for r in records])

    batches: list[int] = []
    committer = GroupCommitter(log, on_commit=slow_apply, on_batch=batches.append)
    n = 40
    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        done = trio.Event()

        async def other() -> None:
            while not done.is_set():
                seen_by_others.append(sum(map(len, calls)))
                await trio.lowlevel.checkpoint()

        nursery.start_soon(other)
        # one batch: 38 appends of one record, then one of two (queued before the committer runs)
        pending = [committer.submit([removed(i)]) for i in range(n - 2)]
        pending.append(committer.submit([removed(n - 2), removed(n - 1)]))
        got = [await committer.wait(p) for p in pending]
        # every appender resumes after all of the batch is applied
        assert sum(map(len, calls)) == n and [r.seq for rs in got for r in rs] == list(range(1, n + 1))
        done.set()
        nursery.cancel_scope.cancel()
    assert [seq for call in calls for seq in call] == list(range(1, n + 1))  # in order
    assert calls[-1] == [n - 1, n]  # an append is applied whole
    assert batches == [n] and committer.apply_pauses > 0
    assert any(0 < k < n for k in seen_by_others)  # another task ran in the middle of the batch


async def test_one_long_append_is_applied_in_one_call(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "log")
    calls: list[int] = []
    committer = GroupCommitter(log, on_commit=lambda records: calls.append(len(records)))
    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        await committer.append([removed(i) for i in range(30)])
        await committer.append([removed(i) for i in range(5)])
        nursery.cancel_scope.cancel()
    assert calls == [30, 5] and committer.apply_pauses == 0
