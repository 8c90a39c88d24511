"""Reading the whole history after retention cuts (``eventsrc.log.history``): the archive
segments and the live log read as one, their index covered by scanning the segments, views
rebuilt from record 1, and a missing or damaged segment named."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
import trio

from eventsrc import events as ev
from eventsrc.errors import EventsrcError, RecordsCutError
from eventsrc.log import cut_steps as steps
from eventsrc.log import store
from eventsrc.log.archive import segment_name
from eventsrc.log.commit import follow
from eventsrc.log.history import History
from eventsrc.log.index import device_prefix, name_prefix, pod_prefix
from eventsrc.log.store import EventLog
from eventsrc.offline import audit_queries
from eventsrc.state.apply import rebuild
from eventsrc.state.views import Views

RES = "example.com/dev"
T0 = 1_767_225_600_000_000_000
SPEC = [ev.ContainerSpec(name="main", requests={RES: "1"}, limits={RES: "1"})]


def held_then_cut(path: Path, archive: Path | None, cuts: tuple[int, ...] = (10, 20)) -> EventLog:
    """A log where pod ``hold`` takes dev-0 in records 3..6, then dev-1 flaps to record 20,
    then ``cuts`` (each followed by its LogTrimmed), then dev-0 turns unhealthy."""
    log = EventLog(path)
    n = 0

    def add(*events: ev.EventBase) -> None:
        nonlocal n
        n += 1
        log.append(list(events), f"c{n}", T0 + n)

    hold = ev.PodRef(uid="uid-hold", namespace="default", name="hold")
    add(ev.PluginRegistered(resource=RES, endpoint="dev.sock"))
    add(ev.DevicesAdded(resource=RES, devices=[ev.DeviceInfo(id=d, health="Healthy") for d in ("dev-0", "dev-1")]))
    add(ev.PodAdmissionStarted(pod=hold, containers=SPEC))
    add(ev.DevicesReserved(pod_uid="uid-hold", container="main", resource=RES, device_ids=["dev-0"]))
    add(ev.DevicesAllocated(pod_uid="uid-hold", container="main", resource=RES, device_ids=["dev-0"]))
    add(ev.PodAdmitted(pod=hold, containers=SPEC))
    for i in range(14):
        add(ev.DeviceHealthChanged(resource=RES, device_id="dev-1", health=("Unhealthy", "Healthy")[i % 2]))
    for seq in cuts:
        add(cut(log, archive, seq))
    add(ev.DeviceHealthChanged(resource=RES, device_id="dev-0", health="Unhealthy"))
    return log


def cut(log: EventLog, archive: Path | None, seq: int) -> ev.LogTrimmed:
    """Cut ``log`` at ``seq`` with the daemon's steps (into ``archive``, or dropping the
    records when it is None); the LogTrimmed to append."""
    prepared = steps.prepare(log, archive, seq)
    steps.commit(log, prepared)
    while steps.delete_some(log, limit=4)[0]:
        pass
    return ev.LogTrimmed(base_seq=seq, records=prepared.entry.records, segment=prepared.entry.file, reason="test")


def whole(path: Path) -> EventLog:
    """The same log, never cut: what every reading of the history must equal."""
    return held_then_cut(path, None, cuts=())


def encoded(items: list[ev.Record | ev.CorruptRecordError]) -> list[tuple[int, bytes]]:
    return [(r.seq, msgspec.msgpack.encode(r.event)) for r in items if isinstance(r, ev.Record)]


def test_records_are_the_archive_then_the_live_log(tmp_path: Path) -> None:
    log = held_then_cut(tmp_path / "log", tmp_path / "archive")
    history = History(log, tmp_path / "archive")
    assert history.reading_archive and history.complete() and history.missing() == []
    assert (history.first_seq(), history.live_first_seq()) == (1, 21)
    # the uncut log's records 1..20 are the archive's
    full = whole(tmp_path / "whole")
    got = list(history.records())
    assert [r.seq for r in got] == list(range(1, 24))
    assert encoded(got)[:20] == encoded(list(full.records(1, 20)))
    assert [r.seq for r in history.records(8, 12)] == [8, 9, 10, 11, 12]
    assert [r.seq for r in history.records(19, 22)] == [19, 20, 21, 22]
    assert [r.seq for r in History(log, tmp_path / "archive", live_only=True).records()] == [21, 22, 23]
    # without segments in the directory, only the live log is read
    assert not History(log, tmp_path / "elsewhere").reading_archive


def test_the_index_covers_the_archive(tmp_path: Path) -> None:
    log = held_then_cut(tmp_path / "log", tmp_path / "archive")
    full = whole(tmp_path / "whole")
    history = History(log, tmp_path / "archive")
    live_only = History(log, tmp_path / "archive", live_only=True)
    for prefix in (
        device_prefix(RES, "dev-0"),
        device_prefix(RES, "dev-1"),
        pod_prefix("uid-hold"),
        name_prefix("default", "hold"),
    ):
        # records 1..20 are the same in the uncut log: their index there is what the archive must give
        expected = [s for s in full.index_seqs(prefix) if s <= 20]
        assert history.index_seqs(prefix)[: len(expected)] == expected
        assert history.index_seqs(prefix, 4, 15) == [s for s in expected if 4 <= s <= 15]
        assert all(s >= 21 for s in live_only.index_seqs(prefix))
    assert history.index_seqs(device_prefix(RES, "dev-0")) == [2, 4, 5, 23]
    records = history.read_many([23, 5, 4, 2])
    assert [r.seq for r in records] == [23, 5, 4, 2]
    assert all(isinstance(r, ev.Record) for r in records)
    assert isinstance(records[1], ev.Record) and isinstance(records[1].event, ev.DevicesAllocated)


def test_a_device_held_by_a_pod_in_the_archive_is_still_held(tmp_path: Path) -> None:
    log = held_then_cut(tmp_path / "log", tmp_path / "archive")
    t = audit_queries.device_timeline(History(log, tmp_path / "archive"), RES, "dev-0")
    assert [(h.pod.name, h.still_held, h.start.seq if h.start else None) for h in t.holders] == [("hold", True, 4)]
    assert [c.what for c in t.changes] == ["listed", "health"]
    live = audit_queries.device_timeline(History(log, tmp_path / "archive", live_only=True), RES, "dev-0")
    assert live.holders == [] and [c.at.seq for c in live.changes] == [23]


def test_views_from_record_one_equal_the_uncut_log(tmp_path: Path) -> None:
    log = held_then_cut(tmp_path / "log", tmp_path / "archive")
    full = whole(tmp_path / "whole")
    history = History(log, tmp_path / "archive")
    views = history.start_views(5)
    assert views.meta.last_seq == 0
    from eventsrc.state.apply import apply_all

    at5 = apply_all(views, history.records(1, 5))
    assert msgspec.msgpack.encode(at5) == msgspec.msgpack.encode(rebuild(full.records(1, 5)))
    live = History(log, tmp_path / "archive", live_only=True)
    base = live.start_views()
    assert base.meta.last_seq == 20
    assert msgspec.msgpack.encode(base.devices) == msgspec.msgpack.encode(rebuild(full.records(1, 20)).devices)
    with pytest.raises(EventsrcError, match=r"record 5 is before the live log's start \(record 21\).*--live-only"):
        live.start_views(5)


def test_a_missing_segment_is_named_and_the_rest_is_read(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    log = held_then_cut(tmp_path / "log", archive)
    (archive / segment_name(11, 20)).unlink()
    history = History(log, archive)
    assert [(g.first, g.last, g.why) for g in history.missing()] == [(11, 20, "missing")]
    assert "records 11..20" in history.missing_note() and segment_name(11, 20) in history.missing_note()
    assert [r.seq for r in history.records()] == [*range(1, 11), 21, 22, 23]
    assert history.index_seqs(device_prefix(RES, "dev-1")) == [2, *range(7, 11)]
    assert not history.complete()
    # the views cannot come from record 1: the base's views, and no point before the base
    assert history.start_views().meta.last_seq == 20
    with pytest.raises(EventsrcError, match="cannot rebuild the views before it: it lacks records 11..20"):
        history.start_views(5)


def test_a_cut_without_archive_is_a_gap(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    log = EventLog(tmp_path / "log")
    for i in range(30):
        log.append([ev.PodRemoved(pod_uid=f"p{i % 3}", reason="x")], f"c{i}", T0 + i)
    for seq, where in ((10, None), (20, archive)):
        steps.commit(log, steps.prepare(log, where, seq))
    history = History(log, archive)
    assert [(g.first, g.last, g.why) for g in history.missing()] == [(1, 10, "not archived")]
    assert [r.seq for r in history.records()][:2] == [11, 12]
    assert history.first_seq() == 11


def test_a_damaged_segment_stops_the_reading_with_one_line(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    log = held_then_cut(tmp_path / "log", archive)
    path = archive / segment_name(1, 10)
    path.chmod(0o640)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(EventsrcError) as err:
        list(History(log, archive).records())
    assert segment_name(1, 10) in str(err.value) and "\n" not in str(err.value)
    assert "--live-only" in str(err.value)


def test_a_segment_of_another_log_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    log = held_then_cut(tmp_path / "log", archive)
    other = held_then_cut(tmp_path / "other", tmp_path / "other-archive")
    (archive / segment_name(1, 10)).unlink()
    (archive / segment_name(1, 10)).write_bytes((tmp_path / "other-archive" / segment_name(1, 10)).read_bytes())
    other.close()
    with pytest.raises(EventsrcError, match="not the segment this log archived"):
        list(History(log, archive).records(1, 3))


def test_start_views_of_a_log_never_cut_are_empty(tmp_path: Path) -> None:
    log = whole(tmp_path / "log")
    history = History(log, tmp_path / "archive")
    assert history.complete() and not history.reading_archive and history.start_note() == ""
    assert msgspec.msgpack.encode(history.start_views()) == msgspec.msgpack.encode(Views())
    assert [r.seq for r in history.records()] == list(range(1, 22))


def test_a_corrupt_archived_record_counts_under_every_query(tmp_path: Path) -> None:
    """The archive has no index to say what a corrupt record was about: every query whose
    window covers it names it (and the answer holds every other record)."""
    from eventsrc.log.archive import iter_records, write_segment

    archive = tmp_path / "archive"
    log = held_then_cut(tmp_path / "log", archive)
    path = archive / segment_name(1, 10)
    items = list(iter_records(path))
    seq7, value = items[6]
    items[6] = (seq7, value[:-1] + bytes([value[-1] ^ 0x01]))  # its CRC no longer holds
    path.unlink()
    write_segment(archive, log.log_id(), 1, 10, iter(items))
    history = History(log, archive)
    assert [type(r).__name__ for r in history.records(6, 8)] == ["Record", "CorruptRecordError", "Record"]
    assert history.index_seqs(pod_prefix("uid-hold")) == [3, 4, 5, 6, 7]
    assert history.index_seqs(pod_prefix("uid-hold"), 8) == []
    t = audit_queries.device_timeline(history, RES, "dev-0")
    assert t.corrupt == [7] and [h.pod.name for h in t.holders] == ["hold"]


def test_a_trim_is_shown_in_words_and_escaped(tmp_path: Path) -> None:
    from eventsrc.offline.render import record_json, record_line

    e = ev.LogTrimmed(base_seq=20, records=10, segment="segment-x.zst", reason="maxSize\x1b[2J")
    rec = ev.Record(seq=21, ts_ns=T0, correlation_id="c", version=1, event=e)
    line = record_line(rec)
    assert "records 11..20 left the live log into archive segment segment-x.zst (maxSize\\x1b[2J)" in line
    assert "\x1b" not in line
    assert record_json(rec)["event"]["reason"] == "maxSize\x1b[2J"  # JSON stays exact
    unarchived = ev.Record(seq=21, ts_ns=T0, correlation_id="c", version=1, event=ev.LogTrimmed(base_seq=5, records=5))
    assert "records 1..5 left the live log without an archive (not kept); it starts at 6" in record_line(unarchived)


def flaps(log: EventLog, n: int) -> None:
    """Append ``n`` records (dev-1's health flapping), one a transaction."""
    for i in range(n):
        health = ("Unhealthy", "Healthy")[i % 2]
        log.append([ev.DeviceHealthChanged(resource=RES, device_id="dev-1", health=health)], f"f{i}", T0 + i)


async def take(tail: AsyncIterator[ev.Record | ev.CorruptRecordError], n: int) -> list[int]:
    """The sequences of the next ``n`` records a follower yields: a consumer reading ``n``
    and then stalling (the follower waits at its yield meanwhile)."""
    return [(await anext(tail)).seq for _ in range(n)]


async def test_a_follower_behind_cuts_gets_every_record_in_order_from_the_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "READ_CHUNK", 8)  # the live log is read 8 records at a time
    log, archive = EventLog(tmp_path / "log"), tmp_path / "archive"
    flaps(log, 30)
    # poll_interval: a follower that had to wait for records would hang (and fail_after fail)
    tail = follow(History(log, archive), 1, poll_interval=3600)
    with trio.fail_after(60):
        seen = await take(tail, 5)  # 1..8 read, 1..5 consumed: the consumer stalls
        log.append([cut(log, archive, 20)], "trim", T0)  # 9..20 leave while it holds 6..8
        seen += await take(tail, 26)  # caught up: 1..31
        flaps(log, 20)  # 32..51 come and leave before it reads again
        log.append([cut(log, archive, 40)], "trim", T0)  # 52
        flaps(log, 5)
        log.append([cut(log, archive, 55)], "trim", T0)  # 58
        assert log.first_seq() == 56
        seen += await take(tail, 58 - 31)
    await tail.aclose()
    assert seen == list(range(1, 59))
    assert len(log.ledger()) == 3


@pytest.mark.parametrize("why", ["no archive", "segment missing"])
async def test_a_follower_behind_a_cut_it_cannot_read_stops_at_the_first_record_it_lacks(
    tmp_path: Path, why: str
) -> None:
    log, archive = EventLog(tmp_path / "log"), tmp_path / "archive"
    flaps(log, 30)
    tail = follow(History(log, archive), 1, poll_interval=3600)
    with trio.fail_after(60):
        assert await take(tail, 30) == list(range(1, 31))
        flaps(log, 10)  # 31..40: the follower is behind
        log.append([cut(log, None if why == "no archive" else archive, 35)], "trim", T0)
        if why == "segment missing":
            (archive / segment_name(1, 35)).unlink()
        with pytest.raises(RecordsCutError) as err:
            await anext(tail)
    lacks = "cut without an archive" if why == "no archive" else f"segment {segment_name(1, 35)} is missing"
    assert str(err.value) == (
        f"records 31..35 left the live log before they were read, and the archive lacks records 1..35 ({lacks}): "
        "stopped before record 31"
    )
