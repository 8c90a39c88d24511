"""The event log on LMDB: append-only, durable, checksummed, growing by itself.

Layout (see docs/adr/0001-lmdb-log.md): one LMDB environment with the named databases

* ``events``: key = big-endian u64 sequence number (first record is 1), value = CRC32 +
  msgpack envelope (see ``eventsrc.events``);
* ``meta``: small facts about the log itself (format version, log id), and after a
  retention cut (docs/adr/0018) its base: the sequence the live log starts after, that
  record's chain hash, the views at it (``base_views``) and the ledger of what left.

This module is synchronous and knows nothing of trio: the trio side
(``eventsrc.log.commit``) runs ``commit`` in a worker thread so that many appenders
share one write transaction and one sync.

Only one process may write (``DirLock``); any number may read at the same time, each
seeing a consistent snapshot per chunk it reads.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import lmdb
import msgspec

from eventsrc.errors import (
    AlreadyRunningError,
    ConcurrencyConflictError,
    DamagedLogError,
    EventsrcError,
    LogCutWhileReadingError,
    NewerLogError,
    NoLogError,
)
from eventsrc.events import (
    CorruptRecordError,
    EventBase,
    Record,
    chain_hash,
    decode_record,
    encode_payload,
)
from eventsrc.log.archive import LedgerEntry, decode_entry, encode_entry
from eventsrc.log.index import keys_for
from eventsrc.obs.logger import get_logger

_log = get_logger(__name__)

LOG_FORMAT = b"1"
INDEX_FORMAT = b"1"
DEFAULT_MAP_SIZE = 1 << 30  # virtual address space only: the file grows as pages are written
READ_CHUNK = 4096


def seq_key(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def key_seq(key: bytes) -> int:
    return int.from_bytes(key, "big")


# LMDB's data file opens with two meta pages (page 0 and page 1), each a 16-byte page
# header and then an MDB_meta: magic (u32) at 16, version (u32), address and map size
# (u64 each), the free database's record, whose first field (u32, at 40) holds the page
# size, the main database's record, then the last page used (u64, at 136) and the
# transaction id (u64, at 144). The newer transaction's meta page is the current one.
_META_MAGIC = 0xBEEFC0DE
_META_FIELDS = struct.Struct("<II")  # magic, version at offset 16
_META_PSIZE = struct.Struct("<I")  # at offset 40
_META_LAST = struct.Struct("<QQ")  # last page, txnid at offset 136
_META_END = 152
_PAGE_SIZES = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


def _meta_page(head: bytes, offset: int) -> tuple[int, int, int] | None:
    """(page size, last page, txnid) of the meta page at ``offset``, or None when it is not one."""
    if len(head) < offset + _META_END:
        return None
    magic, version = _META_FIELDS.unpack_from(head, offset + 16)
    (psize,) = _META_PSIZE.unpack_from(head, offset + 40)
    last, txnid = _META_LAST.unpack_from(head, offset + 136)
    if magic != _META_MAGIC or version != 1 or psize not in _PAGE_SIZES:
        return None
    return psize, last, txnid


def check_data_file(path: Path) -> None:
    """Raise DamagedLogError when the LMDB data file at ``path`` is shorter than its meta pages
    say, or has no valid meta page. LMDB maps the file: reading a page past its end is a
    SIGBUS, not an error, so the size is checked before LMDB ever sees the file. A missing
    or empty file is not checked here (LMDB creates it)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return
            head = f.read(2 * 65536)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise DamagedLogError(f"cannot read the event log file {path}: {exc.strerror}") from None
    first = _meta_page(head, 0)
    second = _meta_page(head, first[0]) if first else None
    if second is None and first is None:
        raise DamagedLogError(
            f"the event log file {path} is damaged: neither LMDB meta page is valid "
            f"(magic {_META_MAGIC:#x}, version 1, a page size), file size {size} bytes"
        )
    psize, last, _ = max((m for m in (first, second) if m is not None), key=lambda m: m[2])
    needed = (last + 1) * psize
    if size < needed:
        raise DamagedLogError(
            f"the event log file {path} is damaged: {size} bytes, but its meta page says pages 0-{last} "
            f"of {psize} bytes ({needed} bytes) are in use; it was truncated"
        )


def _damaged(path: Path, exc: lmdb.Error) -> DamagedLogError:
    """An LMDB error while reading: the data file's pages contradict each other."""
    return DamagedLogError(f"the event log file {path / 'data.mdb'} is damaged: {exc}")


F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class Base(msgspec.Struct, frozen=True, kw_only=True):
    """Where the live log starts after retention cuts: record ``seq`` and everything
    before it have left; ``hash`` is that record's chain hash (the first live record links
    to it) and ``ts_ns`` its time. The views at ``seq`` are kept beside it (``base_views``)."""

    seq: int
    hash: bytes
    ts_ns: int


_base_decoder = msgspec.msgpack.Decoder(Base)
_LEDGER = b"seg/"
_VIEWS = b"base_views/"
#: the base views are kept in pieces this long: each fits in a page, so no cut needs a run
#: of contiguous free pages (an overflow value's), which a fragmented file would grow for
VIEWS_CHUNK = 1536


def _reading(method: F) -> F:
    """Turn an LMDB error of ``method`` (a read) into DamagedLogError."""

    @functools.wraps(method)
    def wrapper(self: EventLog, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except lmdb.Error as exc:
            raise _damaged(self.path, exc) from None

    return wrapper  # type: ignore[return-value]


def _newer(stored: bytes | None, ours: bytes) -> bool:
    """A format number in ``meta`` above this code's (anything not a number counts as newer)."""
    return stored is not None and not (stored.isdigit() and int(stored) <= int(ours))


#: In the log's directory, the writer's last synced sequence (8 bytes, big-endian), under an
#: exclusive ``flock`` held while the writer has the log open (docs/adr/0042).
SYNCED_FILE = "synced"


def _open_synced(path: Path) -> int:
    """The writer's ``SYNCED_FILE``, locked for as long as it is open. A reader's probe holds a
    shared lock for an instant: a few tries (a second writer is kept out by ``DirLock``)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    for _ in range(50):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            time.sleep(0.01)
    os.close(fd)
    raise EventsrcError(f"another writer holds {path}: one writer per event log")


def read_synced(path: Path) -> int | None:
    """What a writer running now has published as synced; None when no writer runs (its lock
    is free: the log is what it shows) or the file cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # a writer has it: its word
            raw = os.pread(fd, 8, 0)
            return int.from_bytes(raw, "big") if len(raw) == 8 else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class DirLock:
    """One writer per state directory: an exclusive ``flock`` on ``path``.

    The lock dies with the process (even on SIGKILL), so a stale file never blocks a start.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:  # a read-only or unwritable root: the environment's error, exit 1
            raise EventsrcError(f"cannot open the lock file {self.path}: {exc.strerror}") from None
        try:
            # A few tries: ``holder`` (``eventsrc status``) holds a shared lock for an
            # instant while it probes, and a start at that instant is not a second daemon.
            for attempt in range(20):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if attempt == 19:
                        raise
                    time.sleep(0.01)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise AlreadyRunningError(
                f"eventsrc is already running on {self.path.parent.parent} (pid {holder}); "
                "one daemon per state directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @staticmethod
    def holder(path: Path) -> int | None:
        """The pid holding the lock at ``path``, or None when nobody holds it."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.pread(fd, 32, 0).decode(errors="replace").strip()
                return int(text) if text.isdigit() else -1
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)


class PendingAppend:
    """One caller's append inside a group commit. ``commit`` fills ``records`` or ``error``."""

    __slots__ = (
        "events",
        "correlation_id",
        "ts_ns",
        "expect_last",
        "records",
        "error",
        "waiter",
        "done",
        "prepared",
        "observed",
    )

    def __init__(
        self,
        events: Sequence[EventBase],
        correlation_id: str,
        ts_ns: int = 0,  # 0: stamped by the log at commit
        expect_last: int | None = None,
    ) -> None:
        self.events = events
        self.correlation_id = correlation_id
        self.ts_ns = ts_ns
        self.expect_last = expect_last
        self.records: list[Record] = []
        self.error: BaseException | None = None
        self.waiter: object = None  # the trio task parked on this append, if any
        self.done = False  # committed (or failed) and applied
        #: its records and index entries when prepared ahead of its batch (an observation
        #: projected onto the views before its append: ``eventsrc.log.commit``)
        self.prepared: Prepared | None = None
        #: an observation: what computes its events, at its turn (``eventsrc.log.commit``)
        self.observed: Callable[[], Sequence[EventBase]] | None = None


#: A prepared batch: the (key, value) records and the (key, b"") index entries to write.
Prepared = tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]]]


class EventLog:
    """An open log. Writers must hold the state directory's ``DirLock`` (see ``open_writer``)."""

    def __init__(
        self,
        path: Path,
        *,
        readonly: bool = False,
        map_size: int = DEFAULT_MAP_SIZE,
        lock: bool = True,
    ) -> None:
        self.path = Path(path)
        self.readonly = readonly
        if readonly and not (self.path / "data.mdb").exists():
            raise NoLogError(f"no event log at {self.path}")
        if not readonly:
            self.path.mkdir(mode=0o750, parents=True, exist_ok=True)
        check_data_file(self.path / "data.mdb")
        try:
            self.env = lmdb.open(
                str(self.path),
                map_size=map_size,
                max_dbs=16,
                readonly=readonly,
                lock=lock,
                sync=True,
                metasync=True,
                readahead=False,
                create=not readonly,
                mode=0o600,  # data.mdb and lock.mdb: the daemon's user only (py-lmdb's default is 0644)
            )
        except lmdb.InvalidError as exc:
            raise DamagedLogError(f"the event log file {self.path / 'data.mdb'} is damaged: {exc}") from None
        except lmdb.Error as exc:
            raise EventsrcError(f"cannot open the event log at {self.path}: {exc}") from None
        # Resizing the map must not overlap a transaction of this process: readers take
        # this lock per chunk, the writer takes it to grow the map.
        self._txn_lock = threading.Lock()
        # One write transaction of this process at a time (the committer's, a cut's): LMDB
        # serialises them anyway, but the map may only be resized with none open, and a
        # thread waiting for LMDB's writer mutex must not hold the readers' lock meanwhile.
        self._write_lock = threading.Lock()
        try:
            self._open_dbs(readonly)
        except lmdb.Error as exc:
            self.env.close()
            raise _damaged(self.path, exc) from None
        self._durable_hash = self._prev_hash
        #: why appends stopped: the data file was deleted or replaced under this writer
        self.lost = ""
        self._file_id: tuple[int, int] | None = None
        if not readonly:
            st = os.stat(self.path / "data.mdb")
            self._file_id = (st.st_dev, st.st_ino)
            self._upgrade()

    def _open_dbs(self, readonly: bool) -> None:
        self.events_db = self.env.open_db(b"events", create=not readonly)
        self.meta_db = self.env.open_db(b"meta", create=not readonly)
        try:
            self.index_db: Any = self.env.open_db(b"index", create=not readonly)
        except lmdb.NotFoundError:
            self.index_db = None  # a log from before the index, opened read-only
        if not readonly:
            with self.env.begin(write=True, db=self.meta_db) as txn:
                if txn.get(b"format") is None:
                    txn.put(b"format", LOG_FORMAT)
                    txn.put(b"log_id", uuid.uuid4().hex.encode())
        self._refuse_newer_formats()
        self._base = self._read_base()
        self._last_seq = self._read_last_seq()  # durable
        self._assigned = self._last_seq  # given to prepared batches, durable or not yet
        self._prev_hash = self._last_value_hash()  # the chain's link to the newest record
        self._synced_fd = None if readonly else _open_synced(self.path / SYNCED_FILE)
        self._publish()

    # ------------------------------------------------------------------ reading

    def _read_txn(self) -> lmdb.Transaction:
        try:
            return self.env.begin(db=self.events_db)
        except lmdb.MapResizedError:
            # Another process grew the map: adopt its size and try again.
            self.env.set_mapsize(0)
            return self.env.begin(db=self.events_db)

    def _read_last_seq(self) -> int:
        with self._txn_lock, self._read_txn() as txn:
            cur = txn.cursor()
            last = key_seq(bytes(cur.key())) if cur.last() else 0
        return max(last, self._base.seq if self._base else 0)

    def _read_base(self) -> Base | None:
        raw = self._meta(b"base")
        if raw is None:
            return None
        try:
            return _base_decoder.decode(raw)
        except msgspec.MsgspecError as exc:
            raise DamagedLogError(
                f"the event log at {self.path} is damaged: its base record is unreadable ({exc})"
            ) from None

    def base(self) -> Base | None:
        """Where the live log starts (None: at record 1). A reader reads it afresh: the
        daemon may cut meanwhile."""
        if self.readonly:
            self._base = self._read_base()
        return self._base

    def first_seq(self) -> int:
        """The first record the live log holds (or will hold): the base plus one."""
        b = self.base()
        return b.seq + 1 if b else 1

    @_reading
    def base_views(self) -> bytes | None:
        """The encoded views at the base (a snapshot file's bytes), or None before any cut."""
        parts = []
        with self._txn_lock, self.env.begin(db=self.meta_db) as txn:
            cur = txn.cursor()
            if cur.set_range(_VIEWS):
                for k, v in cur:
                    if not bytes(k).startswith(_VIEWS):
                        break
                    parts.append(bytes(v))
        return b"".join(parts) if parts else None

    @_reading
    def ledger(self) -> list[LedgerEntry]:
        """What retention cuts took out of the live log, oldest first."""
        out = []
        with self._txn_lock, self.env.begin(db=self.meta_db) as txn:
            cur = txn.cursor()
            if cur.set_range(_LEDGER):
                for k, v in cur:
                    if not bytes(k).startswith(_LEDGER):
                        break
                    try:
                        out.append(decode_entry(bytes(v)))
                    except msgspec.MsgspecError as exc:
                        raise DamagedLogError(
                            f"the event log at {self.path}: a ledger entry is unreadable ({exc})"
                        ) from None
        return out

    def last_seq(self) -> int:
        """The newest sequence synced: this writer's own count, or re-read for a reader, up to
        what a writer running meanwhile has published as synced (``SYNCED_FILE``): LMDB shows
        a transaction to readers while its commit's sync is still under way (docs/adr/0042)."""
        if self.readonly:
            last = self._read_last_seq()
            synced = read_synced(self.path / SYNCED_FILE)
            self._last_seq = last if synced is None else min(last, synced)
        return self._last_seq

    def _publish(self) -> None:
        """Say the last synced sequence to readers in other processes (no sync of its own:
        after a crash the writer is gone, and readers then take the log as it is)."""
        if self._synced_fd is not None:
            os.pwrite(self._synced_fd, self._last_seq.to_bytes(8, "big"), 0)

    def _last_value_hash(self) -> bytes:
        base = self._base.seq if self._base else 0
        with self._txn_lock, self._read_txn() as txn:
            cur = txn.cursor()
            if cur.last() and key_seq(bytes(cur.key())) > base:
                return chain_hash(bytes(cur.value()))
        return self._base.hash if self._base else b""

    def _meta(self, key: bytes) -> bytes | None:
        with self._txn_lock, self.env.begin(db=self.meta_db) as txn:
            v = txn.get(key)
        return bytes(v) if v is not None else None

    def _refuse_newer_formats(self) -> None:
        """A log whose layout a newer eventsrc changed (``format``) is not opened at all: its
        keys and values could mean something else. A newer index (``index_format``) stops
        writers, which would add keys of the old shape to it, and audit queries
        (``index_seqs``). Record-level changes never bump these (docs/adr/0010)."""
        fmt, index = self._meta(b"format"), self._meta(b"index_format")
        self._index_newer = _newer(index, INDEX_FORMAT)
        if _newer(fmt, LOG_FORMAT) or (self._index_newer and not self.readonly):
            key, stored = ("format", fmt) if _newer(fmt, LOG_FORMAT) else ("index_format", index)
            self.env.close()
            raise NewerLogError(
                f"the event log at {self.path} has {key} {(stored or b'').decode(errors='replace')}, newer than this "
                f"eventsrc reads (format {LOG_FORMAT.decode()}, index_format {INDEX_FORMAT.decode()}): "
                "run the newer eventsrc that wrote it"
            )

    def _upgrade(self) -> None:
        """Bring a log written by an older eventsrc up to date, once: build the secondary
        index it lacks, and anchor the records written before the hash chain existed (a
        digest over them, kept in ``meta``, that ``verify`` checks)."""
        if self._meta(b"index_format") is None:
            for chunk in self.raw_chunks(1):
                entries = []
                for k, v in chunk:
                    try:
                        rec = decode_record(key_seq(k), v)
                    except CorruptRecordError:
                        continue
                    entries += [(prefix + k, b"") for prefix in keys_for(rec.event)]
                with self.env.begin(write=True, db=self.index_db) as txn:
                    txn.cursor().putmulti(entries)
            with self.env.begin(write=True, db=self.meta_db) as txn:
                txn.put(b"index_format", INDEX_FORMAT)
        if self._meta(b"chain_anchor") is None:
            digest = hashlib.blake2b(digest_size=16)
            for chunk in self.raw_chunks(1):
                for _, v in chunk:
                    digest.update(chain_hash(v))
            with self.env.begin(write=True, db=self.meta_db) as txn:
                txn.put(b"chain_anchor", self._last_seq.to_bytes(8, "big") + digest.digest())

    @_reading
    def index_seqs(self, prefix: bytes, from_seq: int = 1, until_seq: int | None = None) -> list[int]:
        """The sequences of the records indexed under ``prefix``, ascending (no scan)."""
        if self.index_db is None:
            raise EventsrcError(f"the log at {self.path} has no index yet: run 'eventsrc serve' on it once to build it")
        if self._index_newer:
            raise NewerLogError(
                f"the log at {self.path} has an index from a newer eventsrc: run that version to query it"
            )
        out = []
        start = prefix + max(from_seq, self.first_seq()).to_bytes(8, "big")
        with self._txn_lock, self.env.begin(db=self.index_db) as txn:
            cur = txn.cursor()
            if cur.set_range(start):
                for k in cur.iternext(keys=True, values=False):
                    if not k.startswith(prefix) or len(k) != len(prefix) + 8:
                        if not k.startswith(prefix):
                            break
                        continue
                    seq = key_seq(k[len(prefix) :])
                    if until_seq is not None and seq > until_seq:
                        break
                    out.append(seq)
        return out

    @_reading
    def read_many(self, seqs: Iterable[int]) -> list[Record | CorruptRecordError]:
        out: list[Record | CorruptRecordError] = []
        with self._txn_lock, self._read_txn() as txn:
            for seq in seqs:
                v = txn.get(seq_key(seq))
                if v is None:
                    out.append(CorruptRecordError(seq, "missing"))
                    continue
                try:
                    out.append(decode_record(seq, bytes(v)))
                except CorruptRecordError as err:
                    out.append(err)
        return out

    @_reading
    def log_id(self) -> str:
        with self._txn_lock, self.env.begin(db=self.meta_db) as txn:
            v = txn.get(b"log_id")
        return v.decode() if v else ""

    def raw_chunks(
        self, from_seq: int = 1, until_seq: int | None = None, strict: bool = False
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        """(key, value) pairs in chunks; each chunk is read in its own short transaction.
        Only the live log: records up to the base, which a cut may not have deleted yet, are
        never read. ``strict``: raise LogCutWhileReadingError when a cut has moved the base
        to or past the next record wanted (``from_seq`` first), instead of going on after it."""
        if until_seq is None and self.readonly:
            until_seq = self.last_seq()  # not a transaction whose sync is under way
        start = seq_key(max(from_seq, self.first_seq()))
        while True:
            # no more than asked for is read (a reader of a few records pays for a few)
            n = READ_CHUNK if until_seq is None else min(READ_CHUNK, until_seq - key_seq(start) + 1)
            if n <= 0:
                return
            chunk, base_seq = self._chunk(start, n)
            if strict and base_seq >= key_seq(start):
                raise LogCutWhileReadingError(key_seq(start), base_seq)
            if not chunk:
                return
            if until_seq is not None:
                limit = seq_key(until_seq)
                if chunk[-1][0] > limit:
                    chunk = [kv for kv in chunk if kv[0] <= limit]
                    if chunk:
                        yield chunk
                    return
            yield chunk
            if len(chunk) < n:
                return
            start = seq_key(key_seq(chunk[-1][0]) + 1)

    def _chunk(self, start: bytes, n: int = READ_CHUNK) -> tuple[list[tuple[bytes, bytes]], int]:
        """Up to ``n`` (key, value) pairs from key ``start``, and the base they were read
        under, in one read transaction."""
        chunk: list[tuple[bytes, bytes]] = []
        try:
            with self._txn_lock, self._read_txn() as txn:
                raw = txn.get(b"base", db=self.meta_db)
                base_seq = _base_decoder.decode(raw).seq if raw is not None else 0
                cur = txn.cursor()
                if not cur.set_range(start):
                    return chunk, base_seq
                for kv in cur:
                    chunk.append(kv)  # type: ignore[arg-type]  # bytes: buffers=False
                    if len(chunk) >= n:
                        break
        except (lmdb.Error, msgspec.MsgspecError) as exc:
            raise DamagedLogError(f"the event log file {self.path / 'data.mdb'} is damaged: {exc}") from None
        return chunk, base_seq

    def records(
        self, from_seq: int = 1, until_seq: int | None = None, strict: bool = False
    ) -> Iterator[Record | CorruptRecordError]:
        """Every record from ``from_seq`` to ``until_seq`` (inclusive), in order.

        A corrupt record is *yielded* as a ``CorruptRecordError`` (never skipped, never
        raised), so that callers can name it and go on with the rest. ``strict``: as in
        ``raw_chunks``.
        """
        for chunk in self.raw_chunks(from_seq, until_seq, strict):
            for k, v in chunk:
                seq = key_seq(k)
                try:
                    yield decode_record(seq, v)
                except CorruptRecordError as err:
                    yield err

    @_reading
    def read(self, seq: int) -> Record:
        with self._txn_lock, self._read_txn() as txn:
            v = txn.get(seq_key(seq))
        if v is None:
            raise KeyError(seq)
        return decode_record(seq, bytes(v))

    # ------------------------------------------------------------------ writing

    def prepare(self, batch: Sequence[PendingAppend], now: int = 0) -> Prepared:
        """Give ``batch`` its sequence numbers, after every batch prepared before it, and
        encode it (records, hash chain, index entries). Fills each request's ``records``,
        or its conflict ``error`` (an optimistic-concurrency conflict fails that request
        only). No I/O: ``write`` prepared batches in the order they were prepared, or
        ``abandon`` them.
        """
        if self.readonly:
            raise EventsrcError("the event log is open read-only")
        last = self._assigned
        prev = self._prev_hash
        now = now or time.time_ns()  # the batch's wall-clock time, for requests that left it to the log
        items: list[tuple[bytes, bytes]] = []
        index: list[tuple[bytes, bytes]] = []
        for req in batch:
            if req.expect_last is not None and req.expect_last != last:
                req.records = []
                req.error = ConcurrencyConflictError(req.expect_last, last)
                continue
            ts, cid = req.ts_ns or now, req.correlation_id
            records = []
            marks = (last, prev, len(items), len(index))
            try:
                for ev in req.events:
                    last += 1
                    key = last.to_bytes(8, "big")
                    value = encode_payload(ev, ts, cid, prev)
                    prev = chain_hash(value)
                    items.append((key, value))
                    for prefix in keys_for(ev):
                        index.append((prefix + key, b""))
                    records.append(Record(last, ts, cid, ev.VERSION, ev))  # type: ignore[arg-type]
            except Exception as exc:  # an event that cannot be encoded fails its own append only
                last, prev = marks[0], marks[1]
                del items[marks[2] :], index[marks[3] :]
                req.records = []
                req.error = EventsrcError(f"cannot encode an event of this append: {exc!r}")
                continue
            req.records = records
            req.error = None
        self._assigned = last
        self._prev_hash = prev
        return items, index

    def check_file(self) -> str:
        """ "" while ``data.mdb`` is still the file this writer opened; else what happened to it
        (kept in ``lost``: appends fail from then on). A deleted or replaced data file takes
        every commit into a file nobody will read again: nothing may be acknowledged."""
        if self.lost or self._file_id is None:
            return self.lost
        data = self.path / "data.mdb"
        try:
            st = os.stat(data)
        except FileNotFoundError:
            what = "deleted"
        except OSError as exc:
            what = f"unreadable ({exc.strerror})"
        else:
            if (st.st_dev, st.st_ino) == self._file_id:
                return ""
            what = "replaced by another file"
        self.lost = (
            f"the event log file {data} was {what} while the daemon ran: appends are refused "
            "(restore the log and restart the daemon; docs/operations.md)"
        )
        _log.error("event log file lost; nothing is acknowledged any more", path=data, what=what)
        return self.lost

    def write(self, items: list[tuple[bytes, bytes]], index: list[tuple[bytes, bytes]] | None = None) -> None:
        """Write prepared items in one transaction; returns once it is durable.

        Runs in a worker thread, one at a time, in the order the batches were prepared.
        The map grows when full: MapFullError never escapes. Any other failure raises
        EventsrcError; the caller must then ``abandon`` the sequences given out since.
        """

        def put(txn: lmdb.Transaction) -> None:
            _, added = txn.cursor().putmulti(items, append=True)
            if added != len(items):
                raise lmdb.Error(f"only {added} of {len(items)} records appended")
            if index:
                txn.cursor(db=self.index_db).putmulti(index)

        self._in_write_txn("append to", self.events_db, put)
        if self.check_file():  # committed into a file that is gone: not durable
            raise EventsrcError(self.lost)
        if items:
            self._last_seq = key_seq(items[-1][0])
            self._durable_hash = chain_hash(items[-1][1])
            self._publish()

    def _in_write_txn(self, what: str, db: Any, body: Callable[[lmdb.Transaction], T]) -> T:
        """``body`` in one write transaction on ``db``, under the writer lock; when the map is
        full it grows and ``body`` runs again in a new transaction. One write transaction of
        this process at a time (the committer's, a cut's): the map may only be resized with
        none open. Any LMDB failure is an EventsrcError saying what could not be done."""
        if self.check_file():
            raise EventsrcError(self.lost)
        with self._write_lock:
            while True:
                try:
                    with self.env.begin(write=True, db=db) as txn:
                        return body(txn)
                except lmdb.MapFullError:
                    pass  # grown below, outside the handler, so that its own failure is reported
                except lmdb.Error as exc:
                    raise EventsrcError(f"cannot {what} the event log at {self.path}: {exc}") from None
                self._grow()

    def abandon(self) -> None:
        """Forget the sequences given to prepared batches that were not written."""
        self._assigned = self._last_seq
        self._prev_hash = self._durable_hash

    def commit(self, batch: Sequence[PendingAppend]) -> None:
        """Prepare and write ``batch``: one write transaction, one sync (synchronous). The
        requests prepared ahead (``prepared``) come first and are written as prepared."""
        ahead = 0
        items: list[tuple[bytes, bytes]] = []
        index: list[tuple[bytes, bytes]] = []
        while ahead < len(batch) and (done := batch[ahead].prepared) is not None:
            items += done[0]
            index += done[1]
            ahead += 1
        if ahead < len(batch):
            more, more_index = self.prepare(batch[ahead:])
            items += more
            index += more_index
        try:
            self.write(items, index)
        except EventsrcError as err:
            self.abandon()
            for req in batch:
                req.records = []
                req.error = err
        except BaseException:
            self.abandon()  # no gap and no broken hash link for the next batch
            raise

    def append(
        self, events: Sequence[EventBase], correlation_id: str, ts_ns: int, expect_last: int | None = None
    ) -> list[Record]:
        """Synchronous single append (one transaction, one sync)."""
        req = PendingAppend(events, correlation_id, ts_ns, expect_last)
        self.commit([req])
        if req.error is not None:
            raise req.error
        return req.records

    # ------------------------------------------------------------------ retention (docs/adr/0018)

    def _write_meta(self, puts: list[tuple[bytes, bytes | memoryview]], drop_prefix: bytes = b"") -> None:
        """One write transaction on ``meta``:
        the keys under ``drop_prefix`` are deleted, then ``puts`` written."""

        def put(txn: lmdb.Transaction) -> None:
            if drop_prefix:
                cur = txn.cursor()
                if cur.set_range(drop_prefix):
                    while bytes(cur.key()).startswith(drop_prefix) and cur.delete():
                        pass
            for k, v in puts:
                txn.put(k, v)

        self._in_write_txn("write to", self.meta_db, put)

    def set_base(self, base: Base, views: bytes | memoryview, entry: LedgerEntry) -> None:
        """Move the live log's start to ``base`` in one transaction: the base, the views at
        it and the ledger entry of what left. The records up to it are deleted afterwards
        (``delete_through``); until then they are never read. The views are put in chunks
        of a memoryview, not copied first: LMDB copies them with the GIL released."""
        whole = memoryview(views)
        chunks = [
            (_VIEWS + i.to_bytes(4, "big"), whole[at : at + VIEWS_CHUNK])
            for i, at in enumerate(range(0, len(views), VIEWS_CHUNK))
        ]
        self._write_meta(
            [
                (b"base", msgspec.msgpack.encode(base)),
                *chunks,
                (_LEDGER + entry.first.to_bytes(8, "big"), encode_entry(entry)),
            ],
            drop_prefix=_VIEWS,
        )
        self._base = base
        if self._last_seq < base.seq:  # cannot happen: a cut stops at a record the log holds
            self._last_seq = self._assigned = base.seq
            self._publish()

    def delete_through(self, seq: int, limit: int = 256) -> int:
        """Delete up to ``limit`` of the oldest records at or before ``seq`` (which must not
        be after the base), with their index keys, in one short transaction; the number
        deleted, 0 once none is left. Short, so that appends wait little for the writer."""
        base = self._base.seq if self._base else 0
        if seq > base:
            raise EventsrcError(f"cannot delete record {seq}: the live log's base is {base}")

        def delete(txn: lmdb.Transaction) -> int:
            cur = txn.cursor()
            if not cur.first():
                return 0
            doomed: list[tuple[bytes, bytes]] = []
            for k, v in cur:
                key = bytes(k)
                if key_seq(key) > seq or len(doomed) >= limit:
                    break
                doomed.append((key, bytes(v)))
            index = txn.cursor(db=self.index_db)
            for k, v in doomed:
                txn.delete(k)
                try:
                    rec = decode_record(key_seq(k), v)
                except CorruptRecordError:
                    continue  # its keys, if any, stay: queries start after the base
                for prefix in keys_for(rec.event):
                    if index.set_key(prefix + k):
                        index.delete()
            return len(doomed)

        return self._in_write_txn("delete from", self.events_db, delete)

    @_reading
    def oldest_stored(self) -> int:
        """The oldest record still in the file, base or not (0: none)."""
        with self._txn_lock, self._read_txn() as txn:
            cur = txn.cursor()
            return key_seq(bytes(cur.key())) if cur.first() else 0

    @_reading
    def used_bytes(self) -> int:
        """What the live records and their index keys take in the file (B-tree pages)."""
        total = 0
        with self._txn_lock, self.env.begin() as txn:
            for db in (self.events_db, self.index_db):
                if db is None:
                    continue
                st = txn.stat(db)
                total += (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * st["psize"]
        return total

    def _grow(self) -> None:
        """Double the map. The caller holds ``_write_lock`` (no write transaction of this
        process is open); readers are kept out by ``_txn_lock``."""
        try:
            with self._txn_lock:
                size = self.env.info()["map_size"]
                self.env.set_mapsize(size * 2)
        except lmdb.Error as exc:
            raise EventsrcError(f"cannot grow the event log at {self.path}: {exc}") from None

    def map_size(self) -> int:
        return int(self.env.info()["map_size"])

    def disk_bytes(self) -> int:
        return (self.path / "data.mdb").stat().st_size

    def close(self) -> None:
        if self._synced_fd is not None:
            os.close(self._synced_fd)  # the lock goes with it: readers no longer stop there
            self._synced_fd = None
        self.env.close()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
