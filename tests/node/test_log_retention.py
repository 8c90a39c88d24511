"""Retention cuts on the log itself (docs/adr/0018): the views never change because of a cut,
the chain is verifiable across the archive and the live log, an interrupted cut is undone or
finished, and a segment missing, altered or foreign is named."""

from __future__ import annotations

import errno
import logging
import mmap
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventsrc import events as ev
from eventsrc.core.retention_policy import Retention, boundaries
from eventsrc.core.retention_policy import trouble as trouble_of
from eventsrc.errors import EventsrcError
from eventsrc.log import cut_steps as steps
from eventsrc.log.archive import iter_records, segment_files, verify_archive, verify_segment
from eventsrc.log.index import pod_prefix
from eventsrc.log.snapshots import load_views
from eventsrc.log.store import EventLog
from eventsrc.log.verify import verify
from eventsrc.node import retainer as node_retention
from eventsrc.node.retainer import Retainer
from eventsrc.obs.metrics import Metrics, go_float
from eventsrc.state.apply import rebuild
from tests.node.test_nri_plugin import FakeRecorder
from tests.support.eventually import eventually_trio
from tests.unit.test_projections import events


def filled(path: Path, evs: list[ev.EventBase]) -> EventLog:
    log = EventLog(path)
    for i, e in enumerate(evs, start=1):
        log.append([e], f"c{i}", 1000 + i)
    return log


def cut(log: EventLog, archive: Path | None, seq: int, delete: bool = True) -> steps.Prepared:
    prepared = steps.prepare(log, archive, seq)
    steps.commit(log, prepared)
    while delete and steps.delete_some(log, limit=3)[0]:
        pass
    return prepared


def pods(n: int) -> list[ev.EventBase]:
    return [ev.PodRemoved(pod_uid=f"pod-{i % 7}", reason=f"r{i}") for i in range(n)]


def check_whole(log: EventLog, archive: Path) -> None:
    checked, findings = verify(log)
    assert findings == []
    base = log.base()
    assert base is not None
    segs, problems = verify_archive(archive, log.ledger(), base.seq, base.hash, log.log_id())
    assert problems == []


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(st.lists(events, min_size=1, max_size=40), st.data())
def test_views_after_cuts_equal_the_full_rebuild(
    tmp_path_factory, evs: list[ev.EventBase], data: st.DataObject
) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("r")
    log = filled(d / "log", evs)
    full = rebuild(log.records())
    piece = data.draw(st.integers(1, 8))
    archive = d / "archive"
    for _ in range(data.draw(st.integers(1, 3))):
        marks = boundaries(log.first_seq() - 1, log.last_seq(), piece)
        if not marks:
            break
        cut(log, archive, data.draw(st.sampled_from(marks)), delete=data.draw(st.booleans()))
    views, info = load_views(log, None)
    assert msgspec.msgpack.encode(views) == msgspec.msgpack.encode(full)
    assert [r.seq for r in log.records()] == list(range(log.first_seq(), len(evs) + 1))
    if log.base() is not None:
        check_whole(log, archive)
        # the archive and the live log together are every record, once, in order
        archived = [seq for _f, _l, p in segment_files(archive) for seq, _v in iter_records(p)]
        assert archived + [r.seq for r in log.records()] == list(range(1, len(evs) + 1))
    log.close()


def test_a_cut_moves_the_start_and_queries_begin_after_it(tmp_path: Path) -> None:
    log = filled(tmp_path / "log", pods(40))
    p = cut(log, tmp_path / "archive", 20)
    assert p.entry.records == 20 and p.entry.file
    assert log.first_seq() == 21 and log.last_seq() == 40
    assert log.oldest_stored() == 21
    assert all(s > 20 for s in log.index_seqs(pod_prefix("pod-1")))
    assert log.index_seqs(pod_prefix("pod-1")) == [s for s in range(21, 41) if (s - 1) % 7 == 1]
    check_whole(log, tmp_path / "archive")
    # appends go on linking to the chain
    log.append([ev.PodRemoved(pod_uid="later", reason="x")], "c", 5000)
    assert verify(log)[1] == []
    log.close()
    reader = EventLog(tmp_path / "log", readonly=True)
    assert reader.first_seq() == 21 and reader.last_seq() == 41
    reader.close()


def test_a_deleted_segment_is_reported(tmp_path: Path) -> None:
    log = filled(tmp_path / "log", pods(30))
    cut(log, tmp_path / "archive", 10)
    second = cut(log, tmp_path / "archive", 20)
    check_whole(log, tmp_path / "archive")
    (tmp_path / "archive" / second.entry.file).unlink()
    base = log.base()
    assert base is not None
    _, problems = verify_archive(tmp_path / "archive", log.ledger(), base.seq, base.hash, log.log_id())
    assert [p.what for p in problems] == ["missing"]
    assert "records 11..20" in problems[0].message


def test_an_altered_segment_is_reported(tmp_path: Path) -> None:
    log = filled(tmp_path / "log", pods(30))
    entry = cut(log, tmp_path / "archive", 10).entry
    path = tmp_path / "archive" / entry.file
    os.chmod(path, 0o640)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    assert not verify_segment(path).ok
    base = log.base()
    assert base is not None
    _, problems = verify_archive(tmp_path / "archive", log.ledger(), base.seq, base.hash, log.log_id())
    assert problems and all(p.what == "altered" for p in problems)


def test_a_segment_not_in_the_ledger_is_named_and_an_unfinished_cut_is_undone(tmp_path: Path) -> None:
    log = filled(tmp_path / "log", pods(30))
    archive = tmp_path / "archive"
    cut(log, archive, 10)
    # killed after the segment was sealed, before the base moved: its records are still live
    orphan = steps.prepare(log, archive, 20).entry
    base = log.base()
    assert base is not None and base.seq == 10
    _, problems = verify_archive(archive, log.ledger(), base.seq, base.hash, log.log_id())
    assert [p.what for p in problems] == ["pending"] and orphan.file in problems[0].message
    (archive / f".{orphan.file}.x.tmp").write_bytes(b"torn")
    removed = steps.undo_unfinished(log, archive)
    assert [p.name for p in removed] == [orphan.file]
    assert not list(archive.glob(".*.tmp"))
    check_whole(log, archive)
    assert log.first_seq() == 11 and [r.seq for r in log.records()][0] == 11


def test_a_cut_killed_before_its_deletions_is_finished(tmp_path: Path) -> None:
    log = filled(tmp_path / "log", pods(30))
    full = rebuild(log.records())
    cut(log, tmp_path / "archive", 20, delete=False)
    assert steps.leftovers(log)
    log.close()
    log = EventLog(tmp_path / "log")
    # the records before the base are never read, though still in the file
    assert [r.seq for r in log.records()] == list(range(21, 31))
    views, _ = load_views(log, None)
    assert msgspec.msgpack.encode(views) == msgspec.msgpack.encode(full)
    while steps.delete_some(log)[0]:
        pass
    assert not steps.leftovers(log) and log.oldest_stored() == 21
    check_whole(log, tmp_path / "archive")


def test_a_cut_without_the_archive_keeps_the_chain_in_the_ledger(tmp_path: Path) -> None:
    log = filled(tmp_path / "log", pods(30))
    cut(log, None, 10)
    cut(log, tmp_path / "archive", 20)
    assert [e.file == "" for e in log.ledger()] == [True, False]
    check_whole(log, tmp_path / "archive")
    assert len(segment_files(tmp_path / "archive")) == 1


def test_a_corrupt_record_is_archived_as_it_is_and_named_by_the_segment_check(tmp_path: Path) -> None:
    log = filled(tmp_path / "log", pods(30))
    with log.env.begin(write=True, db=log.events_db) as txn:
        v = bytearray(txn.get((10).to_bytes(8, "big")))
        v[-3] ^= 0x01
        txn.put((10).to_bytes(8, "big"), bytes(v))
    entry = cut(log, tmp_path / "archive", 10).entry
    base = log.base()
    assert base is not None and base.seq == 10 and base.ts_ns == 0  # its time could not be read
    report = verify_segment(tmp_path / "archive" / entry.file)
    assert report.problems == ["record 10 was altered (checksum mismatch)"]
    # record 11 links to record 10 as it was written, not as it was archived: the break shows
    [finding] = verify(log)[1]
    assert (finding.seq, finding.what) == (11, "anchor")


async def test_a_cut_that_cannot_write_its_segment_leaves_the_log_whole(tmp_path: Path) -> None:
    log = filled(tmp_path / "log", pods(40))
    not_a_dir = tmp_path / "archive"
    not_a_dir.write_text("a file where the archive directory should be")
    retainer = Retainer(FakeRecorder(), log, not_a_dir, Retention(max_size=1), piece=10)
    assert await retainer.attempt() is False
    assert log.base() is None and log.first_seq() == 1 and len(list(log.records())) == 40
    assert not retainer.cuts
    # once the archive can be written, the next attempt cuts
    not_a_dir.unlink()
    assert await retainer.attempt() is True
    assert log.base() is not None and retainer.cuts


def test_a_start_removes_no_segment_but_its_own_unfinished_one(tmp_path: Path) -> None:
    """Segments of an older history (a lost or restored log, another log) stay for the operator."""
    old = filled(tmp_path / "old", pods(30))
    cut(old, tmp_path / "archive", 10)
    cut(old, tmp_path / "archive", 20)
    old.close()
    fresh = filled(tmp_path / "log", pods(25))  # a new history starting at record 1
    assert steps.undo_unfinished(fresh, tmp_path / "archive") == []
    assert len(segment_files(tmp_path / "archive")) == 2


def test_a_reader_goes_on_through_a_cut_made_while_it_reads(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from eventsrc.errors import LogCutWhileReadingError
    from eventsrc.log import store
    from eventsrc.log.history import History

    monkeypatch.setattr(store, "READ_CHUNK", 5)
    log = filled(tmp_path / "log", pods(60))
    archive = tmp_path / "archive"
    cut(log, archive, 10)
    history = History(log, archive)
    it = history.records(1)
    seen = [next(it).seq for _ in range(15)]  # 1..10 from the archive, 11..15 from the live log
    cut(log, archive, 40)  # the daemon cuts meanwhile
    seen += [r.seq for r in it]
    assert seen == list(range(1, 61))

    live = History(log, archive, live_only=True)
    it = live.records(41)
    next(it)
    cut(log, archive, 50)
    with pytest.raises(LogCutWhileReadingError):
        list(it)


async def test_a_cut_whose_record_a_kill_prevented_is_recorded_at_start(tmp_path: Path) -> None:
    log = filled(tmp_path / "log", pods(30))
    cut(log, tmp_path / "archive", 10)
    recorder = FakeRecorder()
    await Retainer(recorder, log, tmp_path / "archive", Retention(), piece=10)._record_unrecorded_cut()
    [trimmed] = recorder.of(ev.LogTrimmed)
    assert (trimmed.base_seq, trimmed.records) == (10, 10) and "recorded at start" in trimmed.reason
    log.append([trimmed], "c", 9999)  # as the daemon's recorder would have
    again = FakeRecorder()
    await Retainer(again, log, tmp_path / "archive", Retention(), piece=10)._record_unrecorded_cut()
    assert again.of(ev.LogTrimmed) == []


# --------------------------------------------------------------------------- the cut's worker process


def test_the_workers_cut_equals_the_one_prepared_in_process(tmp_path: Path) -> None:
    """The worker (a process of its own, the log opened read-only) hands back what
    ``prepare`` computes in process: the views at the cut, the base and the ledger entry."""
    from eventsrc.log import cut_worker

    log = filled(tmp_path / "log", pods(40))
    cut(log, tmp_path / "archive", 10)  # so that the views start from a base
    for archive in (tmp_path / "archive", None):
        answer = cut_worker.answer_file()
        try:
            done = subprocess.run(cut_worker.argv(log.path, archive, 30), stdout=answer, check=False)
            got = cut_worker.read(done.returncode, answer)
        finally:
            os.close(answer)
        want = steps.prepare(log, archive, 30)
        assert (got.base, got.entry, bytes(got.views)) == (want.base, want.entry, want.views)
        assert isinstance(got.views, memoryview) and isinstance(got.views.obj, mmap.mmap)  # mapped, not copied
    assert log.base() is not None and log.base().seq == 10  # the worker moved nothing
    log.close()


@pytest.mark.parametrize(
    ("status", "wrote", "said"),
    [
        (0, b"", "answered garbage"),
        (0, b"\x93garbage", "answered garbage"),
        (1, b"cannot cut the log at 7: it starts at 9\n", "cannot cut the log at 7: it starts at 9"),
        (1, b"", "the retention cut's worker failed"),
        (-9, b"", "failed (exit status -9)"),
    ],
)
def test_what_a_worker_that_failed_wrote_is_said(status: int, wrote: bytes, said: str) -> None:
    from eventsrc.log import cut_worker

    answer = cut_worker.answer_file()
    try:
        os.write(answer, wrote)
        with pytest.raises(EventsrcError, match=re.escape(said)):
            cut_worker.read(status, answer)
    finally:
        os.close(answer)


async def test_the_daemons_cut_goes_through_the_worker(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from eventsrc.log import cut_worker

    started = []
    real = cut_worker.argv
    monkeypatch.setattr(cut_worker, "argv", lambda *a: started.append(a) or real(*a))
    monkeypatch.setattr(node_retention, "WORKER_MIN_RECORDS", 40)
    log = filled(tmp_path / "log", pods(40))
    retainer = Retainer(FakeRecorder(), log, tmp_path / "archive", Retention(max_size=1), piece=10)
    assert await retainer.attempt() is True
    assert started == [(log.path, tmp_path / "archive", 40)]
    assert log.first_seq() == 41
    # a small cut after small views stays in a thread
    for i in range(10):
        log.append([ev.PodRemoved(pod_uid="x", reason=str(i))], "c", 9000 + i)
    assert await retainer.attempt() is True
    assert len(started) == 1 and log.first_seq() == 51
    check_whole(log, tmp_path / "archive")
    log.close()


async def test_a_killed_worker_leaves_the_log_whole_and_its_temporary_file_goes_at_start(
    tmp_path: Path,
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    from eventsrc.log import cut_worker

    archive = tmp_path / "archive"
    archive.mkdir()
    killed = (
        "import os, signal, sys; open(sys.argv[1] + '/.segment-x.tmp', 'wb').write(b'half');"
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    monkeypatch.setattr(cut_worker, "argv", lambda _log, arch, _seq: [sys.executable, "-c", killed, str(arch)])
    monkeypatch.setattr(node_retention, "WORKER_MIN_RECORDS", 1)
    log = filled(tmp_path / "log", pods(40))
    retainer = Retainer(FakeRecorder(), log, archive, Retention(max_size=1), piece=10)
    assert await retainer.attempt() is False
    assert log.base() is None and len(list(log.records())) == 40 and not retainer.cuts
    assert steps.undo_unfinished(log, archive) == [] and list(archive.iterdir()) == []
    log.close()


async def test_a_cut_cancelled_while_its_worker_runs_kills_it_and_closes_its_answer(
    tmp_path: Path,
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    from eventsrc.log import cut_worker

    started: list[subprocess.Popen[bytes]] = []
    answers: list[int] = []
    running = trio.Event()
    real_start, real_answer = cut_worker.start, cut_worker.answer_file

    def start(*args, **kwargs):  # type: ignore[no-untyped-def]
        started.append(real_start(*args, **kwargs))
        running.set()
        return started[-1]

    monkeypatch.setattr(cut_worker, "argv", lambda *_: [sys.executable, "-c", "import time; time.sleep(600)"])
    monkeypatch.setattr(cut_worker, "start", start)
    monkeypatch.setattr(cut_worker, "answer_file", lambda: answers.append(real_answer()) or answers[-1])
    log = filled(tmp_path / "log", pods(40))
    retainer = Retainer(FakeRecorder(), log, tmp_path / "archive", Retention(max_size=1), piece=10)
    with trio.move_on_after(60) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(retainer._prepare, tmp_path / "archive", 30)
            await running.wait()
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught
    [proc] = started
    assert proc.returncode == -9  # killed and reaped
    with pytest.raises(OSError):
        os.fstat(answers[0])  # closed
    assert log.base() is None
    log.close()


@pytest.mark.timeout(60)
def test_the_worker_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A killed daemon's worker must not seal a segment after the next start cleaned the
    archive: it gets SIGKILL when its parent ends."""
    from eventsrc.log import cut_worker

    # the worker says on stderr (its parent's pipe) that it is armed, then waits for ever;
    # its stdout is this test's pipe, which reads EOF once it has ended
    worker = (
        "import signal, sys; from eventsrc.log import cut_worker as w; w._die_with(int(sys.argv[1]));"
        "sys.stderr.write('armed\\n'); sys.stderr.flush(); signal.pause()"
    )
    parent = (
        "import os, subprocess, sys;"
        f"w = subprocess.Popen([sys.executable, '-c', {worker!r}, str(os.getpid())], stderr=subprocess.PIPE);"
        "sys.stdout.buffer.write(w.stderr.readline()); sys.stdout.flush()"
    )
    with subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        assert p.stdout.readline() == b"armed\n"
        assert p.stdout.read() == b""
    # and one whose parent is already gone does nothing
    done = subprocess.run(cut_worker.argv(tmp_path / "nolog", None, 1)[:-1] + ["1"], capture_output=True, check=False)
    assert done.returncode == cut_worker.FAILED and done.stdout == b""


async def test_appends_wait_for_a_size_cut_that_lags_a_quarter_piece_behind(tmp_path: Path) -> None:
    log = filled(tmp_path / "log", pods(20))
    retainer = Retainer(FakeRecorder(), log, tmp_path / "archive", Retention(max_size=1), piece=8)
    retainer._cut_planned()  # at record 20
    log.append(pods(1), "c", 5000)
    await retainer.wait_for_room()  # less than a quarter piece (2 records) past it: no wait
    log.append(pods(1), "c", 5001)
    done = []

    async def appender() -> None:
        await retainer.wait_for_room()
        done.append(log.last_seq())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(appender)
        await trio.testing.wait_all_tasks_blocked()
        assert done == []  # held while the cut lags
        retainer._task = trio.lowlevel.current_task()
        await retainer.wait_for_room()  # the retainer's own records never wait
        assert await retainer.attempt() is True  # the cut moves the base: the appender goes on
    base = log.base()
    assert done == [22] and base is not None and base.seq == 16


async def test_nothing_waits_when_no_cut_is_needed(tmp_path: Path) -> None:
    log = filled(tmp_path / "log", pods(40))
    retainer = Retainer(FakeRecorder(), log, tmp_path / "archive", Retention(max_size=1 << 30), piece=8)
    for seq in range(20, 41):
        retainer.maybe_due(seq)  # quarter marks crossed, but the log is far under its bound
    assert await retainer.attempt() is True and log.base() is None
    assert not retainer._behind_since  # so no append waits: no cut is running to end a wait
    await retainer.wait_for_room()


def _said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "eventsrc.node.retainer"]


async def test_failing_cuts_back_off_are_said_once_per_change_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 24, item 7: a failing archive was one ERROR line per attempt (some ten a second
    under load) and seen nowhere else."""
    caplog.set_level(logging.INFO, logger="eventsrc.node.retainer")
    log = filled(tmp_path / "log", pods(40))
    archive = tmp_path / "archive"
    retainer = Retainer(FakeRecorder(), log, archive, Retention(max_size=1), piece=10)
    retainer.retry_first, retainer.retry_max = 0.001, 0.004  # the test's pauses (1 s and 60 s in the daemon)
    metrics = Metrics(retention=lambda: retainer.health)
    real_prepare = steps.prepare
    attempts: list[int] = []
    trouble: list[OSError | None] = []

    def prepare(el: EventLog, where: Path | None, seq: int) -> steps.Prepared:
        attempts.append(seq)
        if trouble[0] is not None:
            # each attempt's temporary file has a name of its own: still one trouble
            raise OSError(trouble[0].errno, trouble[0].strerror, str(where / f".segment-{len(attempts)}.x{seq}.tmp"))
        return real_prepare(el, where, seq)

    monkeypatch.setattr(steps, "prepare", prepare)
    trouble.append(OSError(errno.ENOSPC, "No space left on device"))
    async with trio.open_nursery() as nursery:
        await nursery.start(retainer.run)
        await eventually_trio(lambda: retainer.health.in_a_row >= 4, "four failed attempts")
        assert _said(caplog) == [("ERROR", "retention cut failed")]  # one line, not one per attempt
        health = retainer.health
        assert health.reason == f"No space left on device: {archive}" and health.since_ns > 0
        assert retainer.retry_seconds() == 0.004  # doubled from 0.001, capped
        assert "eventsrc_log_retention_failing 1\n" in metrics.exposition().decode()
        said = trouble_of(retainer.report(), time.time_ns())
        assert "log retention cuts failing" in said and "No space left on device" in said
        assert "appends go on" in said

        trouble[0] = OSError(errno.EACCES, "Permission denied")
        failures = retainer.health.failures
        await eventually_trio(lambda: retainer.health.failures >= failures + 3, "three more failed attempts")
        assert _said(caplog) == [
            ("ERROR", "retention cut failed"),
            ("ERROR", "retention cut failed for another reason"),
        ]
        assert retainer.health.reason == f"Permission denied: {archive}"

        trouble[0] = None  # the archive can be written again
        await eventually_trio(lambda: not retainer.health.failing, "the cuts to recover")
        assert _said(caplog)[2:] == [("INFO", "log cut"), ("INFO", "retention cuts recovered")]
        nursery.cancel_scope.cancel()
    assert log.base() is not None and log.first_seq() == 41
    exposed = metrics.exposition().decode()
    assert "eventsrc_log_retention_failing 0\n" in exposed
    assert f"eventsrc_log_retention_failures_total {go_float(retainer.health.failures)}\n" in exposed
    assert retainer.health.failures == len(attempts) - 1 >= 7
    assert trouble_of(retainer.report(), time.time_ns()) == ""
    log.close()


async def test_appends_stop_waiting_for_a_cut_that_hangs_and_that_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A hung archive disk must not stop admissions for ever, unseen: an append waits
    ``room_wait`` at most for a lagging cut, then the cut is late, in the log and in status."""
    caplog.set_level(logging.INFO, logger="eventsrc.node.retainer")
    log = filled(tmp_path / "log", pods(20))
    retainer = Retainer(FakeRecorder(), log, tmp_path / "archive", Retention(max_size=1), piece=8)
    retainer.room_wait = 0.05  # 30 s in the daemon
    real_prepare = steps.prepare
    release = threading.Event()

    def hung(el: EventLog, where: Path | None, seq: int) -> steps.Prepared:
        release.wait()
        return real_prepare(el, where, seq)

    monkeypatch.setattr(steps, "prepare", hung)
    done: list[bool] = []
    try:
        with trio.fail_after(60):  # a safety net: today's code waits for ever
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: _attempt(retainer, done))
                await eventually_trio(lambda: retainer.report().cut_seconds > 0 and retainer._behind_since, "a cut")
                log.append(pods(2), "c", 5000)  # a quarter piece (2 records) past the planned cut
                await retainer.wait_for_room()  # waits room_wait, then goes on without the cut
                report = retainer.report()
                assert report.late and report.appends_waiting == 0
                assert "lags behind the log; appends go on without it" in trouble_of(report, time.time_ns())
                log.append(pods(2), "c", 5001)
                await retainer.wait_for_room()  # the next append does not wait for it either
                assert [m for lvl, m in _said(caplog) if lvl == "WARNING"] == [
                    "a retention cut is late; appends go on without it and the live log grows past its bound"
                ]
                release.set()
    finally:
        release.set()
    assert done == [True] and log.first_seq() == 25  # cut at 16, then at 24 (the records appended)
    assert not retainer.report().late
    log.close()


async def _attempt(retainer: Retainer, done: list[bool]) -> None:
    done.append(await retainer.attempt())
