"""What retention cut is shipped from the archive, retention's age cuts wait for what JetStream
acknowledged, and a log that diverged from the stream is not shipped (issue 28, ADR 0032):
the shipper in this process, against a real nats-server."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import trio
import trio_asyncio

from eventsrc import events as ev
from eventsrc.core.fleet_names import FOLLOWS, SEQ, Node
from eventsrc.core.retention_policy import Retention
from eventsrc.core.shipping import CONNECTED, DIVERGED
from eventsrc.events import chain_hash, decode_record
from eventsrc.log.archive import iter_records, segment_files
from eventsrc.log.store import EventLog, key_seq
from eventsrc.node.retainer import Retainer
from eventsrc.node.shipper import FleetOptions, Shipper
from eventsrc.rpc.jetstream import ensure_stream
from tests.node.test_log_retention import cut, filled, pods
from tests.support.eventually import eventually_trio
from tests.support.nats import NatsServer, stream_messages
from tests.support.recorder import FakeRecorder

STREAM = "EVENTSRC"


async def ship(
    log: EventLog, archive: Path | None, server: NatsServer, until: Callable[[Shipper], bool], what: str
) -> Shipper:
    """Run a shipper of ``log`` (4 publishes in flight) until ``until`` holds of it."""

    async def appended(seq: int) -> None:
        if log.last_seq() < seq:
            await trio.sleep_forever()  # the log grows no more here

    shipper = Shipper(log, appended, FleetOptions((server.url,), "node-a"), archive, window=4)
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        nursery.start_soon(shipper.run)
        await eventually_trio(lambda: until(shipper), what, timeout=30)
        nursery.cancel_scope.cancel()
    return shipper


def stored(log: EventLog, archive: Path) -> dict[int, bytes]:
    """Every record the archive and the live log hold, as stored."""
    out = {seq: value for _f, _l, path in segment_files(archive) for seq, value in iter_records(path)}
    out.update((key_seq(k), v) for chunk in log.raw_chunks() for k, v in chunk)
    return out


async def test_what_retention_cut_is_shipped_from_the_archive_and_only_what_is_gone_is_passed_over(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    log = filled(tmp_path / "log", pods(50))
    archive = tmp_path / "archive"
    cut(log, archive, 10)  # 1..10 archived
    cut(log, None, 20)  # 11..20 cut without an archive
    deleted = cut(log, archive, 30)  # 21..30 archived, then the segment deleted
    cut(log, archive, 40)  # 31..40 archived; 41..50 live
    (archive / deleted.entry.file).unlink()
    held = stored(log, archive)

    shipper = await ship(log, archive, nats_server, lambda s: s.shipped == 50, "every record held shipped")

    messages = await trio.to_thread.run_sync(stream_messages, nats_server.url, STREAM)
    seqs = [int(m.headers[SEQ]) for m in messages]
    assert seqs == [*range(1, 11), *range(31, 51)]  # each once, in order
    assert [int(m.headers[FOLLOWS]) for m in messages] == [*range(0, 10), 10, *range(31, 50)]
    assert all(m.data == held[seq] for seq, m in zip(seqs, messages, strict=True))  # the stored bytes
    report = shipper.report()
    assert (report.state, report.shipped_seq, report.lag_records) == (CONNECTED, 50, 0)
    log.close()


async def test_a_log_restored_behind_the_stream_is_not_shipped(tmp_path: Path, nats_server: NatsServer) -> None:
    log = filled(tmp_path / "log", pods(5))
    log.close()
    shutil.copytree(tmp_path / "log", tmp_path / "backup")  # the same log id, 5 records
    log = EventLog(tmp_path / "log")
    for i in range(5):
        log.append([ev.PodRemoved(pod_uid="later", reason=str(i))], f"l{i}", 2000 + i)
    await ship(log, None, nats_server, lambda s: s.shipped == 10, "the log shipped")
    log.close()

    backup = EventLog(tmp_path / "backup")
    behind = await ship(backup, None, nats_server, lambda s: s.state == DIVERGED, "the divergence seen")
    assert "holds record 10 of this log, past the log's end" in behind.reason and behind.shipped == 0
    for i in range(6):  # it goes on with records of its own: record 10 is another
        backup.append([ev.PodRemoved(pod_uid="other", reason=str(i))], f"o{i}", 3000 + i)
    other = await ship(backup, None, nats_server, lambda s: s.state == DIVERGED, "the divergence seen")
    assert "record 10 of this log differs from the log's" in other.reason and other.shipped == 0
    assert [
        int(m.headers[SEQ]) for m in await trio.to_thread.run_sync(stream_messages, nats_server.url, STREAM)
    ] == list(range(1, 11))
    backup.close()


async def test_age_cuts_wait_for_what_jetstream_acknowledged_and_size_cuts_do_not(tmp_path: Path) -> None:
    log = filled(tmp_path / "log", pods(40))
    acknowledged = 15
    aged = Retainer(
        FakeRecorder(), log, tmp_path / "archive", Retention(max_age_ns=1), piece=10, shipped=lambda: acknowledged
    )
    assert await aged.attempt() is True
    assert log.first_seq() == 11  # every record is old, and only the acknowledged piece went
    sized = Retainer(
        FakeRecorder(), log, tmp_path / "archive", Retention(max_size=1), piece=10, shipped=lambda: acknowledged
    )
    assert await sized.attempt() is True
    assert log.first_seq() == 41  # over its bound: cut all the same, into the archive
    assert [(f, la) for f, la, _ in segment_files(tmp_path / "archive")] == [(1, 10), (11, 40)]
    log.close()


def publish_as_a_run_before(url: str, node: Node, records: list[tuple[int, bytes]]) -> None:
    """What a run of the daemon before this one left on the stream: ``records`` published as its
    shipper publishes them (the stream created as it creates it)."""
    import asyncio

    import nats

    async def publish() -> None:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            await ensure_stream(js, STREAM)
            for seq, value in records:
                kind = type(decode_record(seq, value).event).__name__
                headers = node.headers(seq, kind, value_hash=chain_hash(value))  # as the shipper's ids are
                await js.publish(node.subject(), value, stream=STREAM, headers=headers)
        finally:
            await nc.close()

    asyncio.run(publish())


async def test_a_hole_a_crash_left_inside_a_failed_window_is_filled_by_the_next_run(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    log = filled(tmp_path / "log", pods(6))
    last = log.last_seq()
    values = [(key_seq(k), v) for chunk in log.raw_chunks() for k, v in chunk]
    # The run before: the publish of last - 1 failed inside the window while that of last was
    # stored, and the daemon was SIGKILLed before it sent last - 1 again.
    hole = last - 1
    node = Node("node-a", log.log_id())
    before = [(seq, v) for seq, v in values if seq != hole]
    await trio.to_thread.run_sync(publish_as_a_run_before, nats_server.url, node, before)

    await ship(log, None, nats_server, lambda s: s.shipped == last, "the log shipped")

    messages = await trio.to_thread.run_sync(stream_messages, nats_server.url, STREAM)
    seqs = [int(m.headers[SEQ]) for m in messages]
    assert seqs == [*range(1, hole), last, hole]  # the hole filled, and nothing stored twice
    log.close()
