"""Snapshots: a cache of the views at some sequence, never a source of truth.

A snapshot file holds the views after record ``last_seq`` of one particular log. It is
used only if every check passes: the file decodes, its checksum holds, its format and
the views' schema fingerprint are this code's, it belongs to this log (``log_id``) and
the log still reaches ``last_seq``. Otherwise it is ignored (with the reason logged) and
the views are rebuilt from the log. Deleting every snapshot changes nothing but the
start-up time.
"""

from __future__ import annotations

import gc
import hashlib
import os
import signal
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from eventsrc.errors import DamagedLogError, EventsrcError
from eventsrc.events import CorruptRecordError, Record
from eventsrc.log.store import EventLog
from eventsrc.obs.logger import get_logger
from eventsrc.state.apply import apply_all
from eventsrc.state.views import Views

SNAPSHOT_FORMAT = 1
KEEP = 2
_log = get_logger(__name__)

#: Changes whenever the shape of the views changes, so an old snapshot is never misread.
SCHEMA_FINGERPRINT = hashlib.sha256(
    msgspec.json.encode(msgspec.json.schema(Views)) + str(SNAPSHOT_FORMAT).encode()
).hexdigest()[:16]


class SnapshotFile(msgspec.Struct, kw_only=True):
    format: int
    schema: str
    log_id: str
    last_seq: int
    crc: int
    views: msgspec.Raw


_encoder = msgspec.msgpack.Encoder()
_file_decoder = msgspec.msgpack.Decoder(SnapshotFile)
_views_decoder = msgspec.msgpack.Decoder(Views)


@dataclass
class RebuildInfo:
    snapshot_seq: int | None  # None: full replay
    reason: str  # why no (newer) snapshot was used, or "" when the newest one was
    tail_records: int
    seconds: float


def _reporting(
    items: Iterable[Record | CorruptRecordError], progress: Callable[[int], None]
) -> Iterator[Record | CorruptRecordError]:
    for item in items:
        if item.seq % 50_000 == 0:
            progress(item.seq)
        yield item


def _name(seq: int) -> str:
    return f"snapshot-{seq:020d}.msgpack"


def snapshot_files(snapdir: Path) -> list[Path]:
    """Snapshot files, newest first."""
    if not snapdir.is_dir():
        return []
    return sorted(snapdir.glob("snapshot-*.msgpack"), reverse=True)


def encode_snapshot(views: Views, log_id: str) -> bytes:
    body = _encoder.encode(views)
    return _encoder.encode(
        SnapshotFile(
            format=SNAPSHOT_FORMAT,
            schema=SCHEMA_FINGERPRINT,
            log_id=log_id,
            last_seq=views.meta.last_seq,
            crc=zlib.crc32(body),
            views=msgspec.Raw(body),
        )
    )


def remove_stale_temporaries(snapdir: Path) -> None:
    """Delete the temporary files of snapshot writes a crash interrupted (the writer calls
    this once it holds the state directory's lock, before it writes any)."""
    if snapdir.is_dir():
        for stale in snapdir.glob(".snapshot-*.tmp"):
            stale.unlink(missing_ok=True)


def write_snapshot(snapdir: Path, data: bytes, last_seq: int) -> Path:
    """Write atomically (temp file, fsync, rename, fsync dir); keep the newest ``KEEP``."""
    snapdir.mkdir(mode=0o750, parents=True, exist_ok=True)
    final = snapdir / _name(last_seq)
    fd, name = tempfile.mkstemp(dir=snapdir, prefix=f".{final.name}.", suffix=".tmp")  # mode 0600
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dirfd = os.open(snapdir, os.O_RDONLY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)
    for old in snapshot_files(snapdir)[KEEP:]:
        old.unlink(missing_ok=True)
    return final


def snapshot_path(snapdir: Path, seq: int) -> Path:
    """Where ``write_snapshot`` puts the snapshot taken after record ``seq``."""
    return snapdir / _name(seq)


#: Exit statuses of ``fork_snapshot``'s child: the write failed (OSError), anything else failed.
CHILD_WRITE_FAILED, CHILD_FAILED = 1, 2


def fork_snapshot(snapdir: Path, views: Views, log_id: str) -> int:
    """Start writing a snapshot of ``views`` in a forked child; its pid (``wait_snapshot``).

    The child sees the parent's memory as it was at the fork (copy on write), so it encodes
    the views at exactly ``views.meta.last_seq`` whatever the parent applies meanwhile, and
    the parent's interpreter never waits for the encoding: msgspec holds the GIL for the
    whole of it, 25-60 ms at 10,000 pods, so a worker thread would stall the loop as much.
    The child touches nothing another thread may have held at the fork (no logging, LMDB,
    trio or asyncio): it closes the descriptors it inherited (the state directory's flock
    among them, so that a daemon killed meanwhile can be started again at once), encodes,
    writes (``write_snapshot``) and ends with ``os._exit``."""
    seq = views.meta.last_seq
    pid = os.fork()
    if pid:
        return pid
    status = CHILD_FAILED
    try:
        gc.disable()  # a collection would only copy the parent's pages
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        data = encode_snapshot(views, log_id)
        status = CHILD_WRITE_FAILED
        write_snapshot(snapdir, data, seq)
        status = 0
    finally:
        os._exit(status)


def wait_snapshot(pid: int) -> str:
    """Wait for ``fork_snapshot``'s child ``pid`` to end (blocks: call it in a thread); ""
    when it wrote the snapshot, else what went wrong."""
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return ""
    if code == CHILD_WRITE_FAILED:
        return "the snapshot could not be written (disk full or failing?)"
    return f"the snapshot's process failed (exit status {code})"


def read_snapshot(path: Path, log_id: str, log_last_seq: int) -> Views:
    """Decode and check one snapshot; raises ValueError saying why it cannot be used."""
    try:
        snap = _file_decoder.decode(path.read_bytes())
    except (OSError, ValueError, msgspec.MsgspecError) as exc:
        raise ValueError(f"unreadable ({exc})") from None
    if snap.format != SNAPSHOT_FORMAT or snap.schema != SCHEMA_FINGERPRINT:
        raise ValueError(f"old version (format {snap.format}, schema {snap.schema})")
    if snap.log_id != log_id:
        raise ValueError("belongs to another log")
    if snap.last_seq > log_last_seq:
        raise ValueError(f"ahead of the log (snapshot at {snap.last_seq}, log at {log_last_seq})")
    if zlib.crc32(snap.views) != snap.crc:
        raise ValueError("checksum mismatch")
    try:
        return _views_decoder.decode(snap.views)
    except (ValueError, msgspec.MsgspecError) as exc:
        raise ValueError(f"unreadable views ({exc})") from None


def furthest(snapdir: Path, log_id: str) -> tuple[int, str]:
    """The newest record a readable snapshot of log ``log_id`` was taken at, and its file's
    name; (0, "") when there is none. A log that ends before it has lost records."""
    for path in snapshot_files(snapdir):
        try:
            snap = _file_decoder.decode(path.read_bytes())
        except (OSError, ValueError, msgspec.MsgspecError):
            continue
        if snap.log_id == log_id and zlib.crc32(snap.views) == snap.crc:
            return snap.last_seq, path.name
    return 0, ""


def decode_views(data: bytes, log_id: str, what: str) -> Views:
    """The views in an encoded snapshot (a file's bytes, or the log's base): its checks as
    ``read_snapshot``'s, but a snapshot of another views shape is decoded all the same
    when it can be (fields added since have their defaults)."""
    try:
        snap = _file_decoder.decode(data)
    except (ValueError, msgspec.MsgspecError) as exc:
        raise DamagedLogError(f"{what} is unreadable ({exc})") from None
    if snap.log_id != log_id or zlib.crc32(snap.views) != snap.crc:
        raise DamagedLogError(f"{what} is damaged (checksum or log id)")
    try:
        return _views_decoder.decode(snap.views)
    except (ValueError, msgspec.MsgspecError) as exc:
        raise DamagedLogError(
            f"{what} was written by an eventsrc whose views this one cannot read ({exc}); "
            "run that version, or rebuild from the archive with 'eventsrc state' (without --live-only)"
        ) from None


def base_views(log: EventLog, log_id: str, until_seq: int | None = None) -> Views:
    """The views at the live log's base (docs/adr/0018). Refuses a sequence before it:
    those views can only come from the archive."""
    base = log.base()
    assert base is not None
    if until_seq is not None and until_seq < base.seq:
        raise EventsrcError(
            f"record {until_seq} is before the live log's start ({base.seq + 1}): it is in the archive "
            "(read it without --live-only)"
        )
    data = log.base_views()
    if data is None:
        raise DamagedLogError(f"the event log at {log.path} is damaged: its base ({base.seq}) has no views")
    return decode_views(data, log_id, f"the views at the event log's base ({base.seq})")


def load_views(
    log: EventLog,
    snapdir: Path | None,
    until_seq: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> tuple[Views, RebuildInfo]:
    """Newest usable snapshot plus the tail of the log; a full replay if none is usable.

    ``progress(seq)`` is called every 50,000 records when given."""
    t0 = time.perf_counter()
    last = log.last_seq() if until_seq is None else min(until_seq, log.last_seq())
    views: Views | None = None
    skipped: list[str] = []
    files = snapshot_files(snapdir) if snapdir is not None else []
    base = log.base()
    log_id = log.log_id() if files or base else ""
    for path in files:
        try:
            views = read_snapshot(path, log_id, last)
            if base is not None and views.meta.last_seq < base.seq:
                views = None
                raise ValueError(f"older than the live log's base ({base.seq})")
        except ValueError as exc:
            skipped.append(f"snapshot {path.name} ignored: {exc}")
            _log.warning("snapshot ignored; trying an older one or a full replay", snapshot=path.name, reason=str(exc))
            continue
        break
    if views is None and base is not None:
        views = base_views(log, log_id, until_seq)
    reason = "; ".join(skipped) if skipped else ("" if views is not None else "no snapshot")
    from_seq = 1 if views is None else views.meta.last_seq + 1
    snapshot_seq = None if views is None else views.meta.last_seq
    if views is None:
        views = Views()
    before = views.meta.last_seq
    records: Iterable[Record | CorruptRecordError] = log.records(from_seq, last)
    if progress is not None:
        records = _reporting(records, progress)
    apply_all(views, records)
    tail = max(0, views.meta.last_seq - before)
    return views, RebuildInfo(snapshot_seq, reason, tail, time.perf_counter() - t0)
