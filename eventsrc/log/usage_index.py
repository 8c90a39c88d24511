"""The usage index: what ``eventsrc audit usage`` answers from (docs/adr/0026, 0039).

A derived index, in an LMDB environment of its own beside the log (``ROOT/eventsrc/usage``),
built from the whole history (archive segments and live log, ``History``) by the pure
``core.chargeback.Tracker``. The daemon keeps it current through a process of its own
(``log.usage_feeder``, started by ``node.usage_keeper``), and each query first brings it up
to date with what that left. It never changes the log, and deleting it only costs a rebuild.

Each hold counts in a group per dimension: ``n`` (namespace, resource) and ``d`` (resource,
device). For each group it keeps two sorted lists of points, the starts and the ends of the
group's holds, each point with the running count and sum of the times up to it. The
nanoseconds a group's holds spent inside [S, U] are then F(U) - F(S), where

    F(T) = sum over starts s <= T of (T - s)  -  sum over ends e <= T of (T - e)
         = T * starts(T) - sum_starts(T) - T * ends(T) + sum_ends(T)

(a hold still open has no end, so it counts up to U): four cursor lookups a group, however
long the history. A start is added when a hold starts and an end when it ends, so both lists
grow at their end (a point older than the list's last, after a clock stepped back, rewrites
the running sums after it). Pods are too many to visit each: a pod's ended holds are kept
by the class of their length and their end (``h<class><end><n>`` -> the start and the pod
itself, namespace, name, uid and resource), so that a query reads little more than the holds
it counts; open holds are in the tracker's state. (A pod is not a group with an id: looking
its id up by a digest touched a page anywhere in the file for every new pod.)

What was not seen: the gaps that hide holds (``chargeback.Blind``: eventsrc, the kubelet or
the runtime not seen) are kept whole in ``meta`` (``blind``: a few a restart). A group's
nanoseconds inside them are the sum of F(b) - F(a) over the union of the gaps, [a, b] each
clipped to the window; a pod's, each hold's overlap with that union (``Gaps.covered``).

Databases: ``meta`` (format, log id, the last record fed and its chain hash, the tracker's
state, the gaps, counters), ``groups`` (``k<dim><digest>`` -> id; ``g<dim><id>`` -> the group; a pod's
ended holds) and ``points`` (``<id><s|e><t><n>`` -> running count and sum).

Each chunk of ``CHUNK`` records is fed in one write transaction, with the tracker's state
and the last record's sequence: a crash leaves the index at a chunk's end, and the next feed
goes on from there. Each chunk reads the log and writes the index through mappings of their
own, closed after it: the pages a process touches in a mapping count in its resident set
until it is closed, and LMDB writes each changed page anew, so one mapping over a year of
records held hundreds of MB (docs/performance.md). An index whose log id differs, whose last
record is past the log's end, or whose last record's chain hash is not the log's (a restored
log went another way) is rebuilt from record 1. One process updates it at a time (a lock
file).
"""

from __future__ import annotations

import fcntl
import hashlib
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb
import msgspec

from eventsrc.core.chargeback import (
    Blind,
    Change,
    Gaps,
    Row,
    Span,
    Tracker,
    UsageState,
    Window,
    merged,
    overlap,
)
from eventsrc.errors import EventsrcError
from eventsrc.events import CorruptRecordError, Record, chain_hash
from eventsrc.log.history import History
from eventsrc.log.store import EventLog, key_seq

#: 2: a pod's ended hold names its pod itself, not a group id; 3: the gaps (blind); 4: weighted
#: points and holds (memory's bytes: ``Hold.amount``)
FORMAT = b"4"
MAP_SIZE = 1 << 36  # address space only: the file grows as pages are written
#: records fed per write transaction, each through a mapping of the log and the index of its
#: own (``catch_up``)
CHUNK = 10_000
#: the groups whose ids a feed keeps in memory (a pod is a group: a year has 100,000s)
KEEP_IDS = 10_000
_DIMS = {"namespace": b"n", "device": b"d"}
_U64 = 8
_SUM = 16
_state_decoder = msgspec.msgpack.Decoder(UsageState)
_group_decoder = msgspec.msgpack.Decoder(list[Any])
_spans_decoder = msgspec.msgpack.Decoder(list[Span])


#: what ``catch_up`` reads from: opens a history, and closes it when done
Source = Callable[[], AbstractContextManager[History]]


@contextmanager
def reading(log_dir: Path, archive: Path | None) -> Iterator[History]:
    """The log at ``log_dir`` read-only, with its archive, closed on leaving (a ``Source``).
    Not for a process that holds the log open already (LMDB: one environment per file and
    process)."""
    log = EventLog(log_dir, readonly=True)
    try:
        yield History(log, archive)
    finally:
        log.close()


def kept(history: History) -> Source:
    """A ``Source`` of a history its caller keeps open (and maps whole, for as long)."""
    return lambda: nullcontext(history)


@dataclass
class Update:
    """What a query's catch-up did: ``how`` is "current", "updated", "built" or "rebuilt"."""

    how: str
    records: int = 0
    seconds: float = 0.0
    why: str = ""  # why it was rebuilt
    corrupt: list[int] = field(default_factory=list)


def _key_digest(dim: bytes, group: tuple[str, ...]) -> bytes:
    return b"k" + dim + hashlib.blake2b(msgspec.msgpack.encode(group), digest_size=16).digest()


def _value(count: int, total: int) -> bytes:
    return count.to_bytes(_SUM, "big") + total.to_bytes(_SUM, "big")  # counts of bytes, too


def _parse(value: bytes) -> tuple[int, int]:
    return int.from_bytes(value[:_SUM], "big"), int.from_bytes(value[_SUM:], "big")


class UsageIndex:
    """The usage index at ``path`` (created when missing)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.mkdir(mode=0o750, exist_ok=True)
            self.env = self._open()
        except (OSError, lmdb.Error) as exc:
            raise EventsrcError(f"cannot open the usage index at {path}: {exc}") from None
        self.meta = self.env.open_db(b"meta")
        self.groups = self.env.open_db(b"groups")
        self.points = self.env.open_db(b"points")

    def _open(self) -> lmdb.Environment:
        return lmdb.open(str(self.path), max_dbs=4, map_size=MAP_SIZE, metasync=False, readahead=False)

    def close(self) -> None:
        self.env.close()

    def __enter__(self) -> UsageIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ updating

    def catch_up(self, source: Source, progress: Callable[[str], None] | None = None) -> Update:
        """Feed the records the index has not seen yet (all of them on first use).

        ``source`` opens the history to read; it is opened again every ``CHUNK`` records, and
        the index's environment too, so that the pages of either file this process mapped
        while feeding are let go: a whole year read through one mapping keeps every page it
        touched in the process's resident set (``reading`` opens and closes the log; a
        caller that holds the log open itself passes ``kept(history)``)."""
        t0 = time.perf_counter()
        with open(self.path / "update.lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            with source() as history:
                why = self._stale(history)
                with self.env.begin() as txn:
                    last = key_seq(txn.get(b"seq", db=self.meta) or bytes(8)) if not why else 0
                if why and why != "first use":
                    self._drop()
                end = history.last_seq()
                if last >= end:
                    return Update("current", corrupt=self.corrupt())
                if progress is not None and why:
                    progress(f"building the usage index ({why}) from records 1..{end}, the archive included")
                writer = _Writer(self, history)
            fed, next_seq = 0, last + 1
            while next_seq <= end:
                upto = min(end, next_seq + CHUNK - 1)
                with source() as history:
                    writer.history = history
                    fed += writer.write(history.records(next_seq, upto))
                next_seq = upto + 1
                self._remap()
            how = "built" if why == "first use" else ("rebuilt" if why else "updated")
            return Update(how, fed, time.perf_counter() - t0, why, self.corrupt())

    def _remap(self) -> None:
        """Close the environment and open it again: the pages this process touched in it
        stop counting in its resident set (the file's pages stay in the page cache)."""
        self.env.close()
        self.env = self._open()
        self.meta = self.env.open_db(b"meta")
        self.groups = self.env.open_db(b"groups")
        self.points = self.env.open_db(b"points")

    def _stale(self, history: History) -> str:
        """Why the index must be built from record 1 ("" when it can go on)."""
        with self.env.begin(db=self.meta) as txn:
            fmt, log_id, seq, hashed = (txn.get(k) for k in (b"format", b"log_id", b"seq", b"hash"))
        if fmt is None:
            return "first use"
        if fmt != FORMAT:
            return f"it has format {bytes(fmt).decode(errors='replace')}, this eventsrc writes {FORMAT.decode()}"
        if bytes(log_id or b"").decode() != history.log.log_id():
            return "it was built from another log"
        last = key_seq(bytes(seq or bytes(8)))
        if last > history.last_seq():
            return f"it has records up to {last}, past the log's end ({history.last_seq()})"
        if last >= history.live_first_seq():
            stored = [v for chunk in history.log.raw_chunks(last, last) for _, v in chunk]
            if not stored or chain_hash(stored[0]) != hashed:
                return f"record {last} is not the one it was built from (the log was restored or replaced)"
        return ""

    def _drop(self) -> None:
        with self.env.begin(write=True) as txn:
            for db in (self.meta, self.groups, self.points):
                txn.drop(db, delete=False)

    def fed_seq(self) -> int:
        """The last record fed (0: none)."""
        with self.env.begin(db=self.meta) as txn:
            return key_seq(txn.get(b"seq") or bytes(8))

    def corrupt(self) -> list[int]:
        with self.env.begin(db=self.meta) as txn:
            raw = txn.get(b"corrupt")
        return msgspec.msgpack.decode(raw, type=list[int]) if raw else []

    def gaps(self) -> str:
        """What the history lacked when the index was built ("" when nothing)."""
        with self.env.begin(db=self.meta) as txn:
            raw = txn.get(b"gaps")
        return bytes(raw).decode() if raw else ""

    # ------------------------------------------------------------------ answering

    def totals(self, by: str, w: Window, resources: frozenset[str] = frozenset()) -> list[Row]:
        """Nanoseconds per group inside ``w``, and those inside the gaps that hide holds, as
        ``core.chargeback.totals`` gives them."""
        if w.until_ns <= max(0, w.since_ns):
            return []
        w = Window(max(0, w.since_ns), w.until_ns)  # the index keeps no time before 1970
        with self.env.begin(buffers=True) as txn:
            raw = txn.get(b"blind", db=self.meta)
            gaps = merged(_spans_decoder.decode(raw) if raw else [], w)
            if by == "pod":
                rows = self._pods(txn, w, resources, gaps)
            else:
                dim = _DIMS["namespace" if by == "namespace" else "device"]
                rows = self._step_groups(txn, dim, w, resources, gaps)
        if by == "resource":
            sums: dict[tuple[str, ...], tuple[int, int]] = {}
            for row in rows:
                ns, gap_ns = sums.get(row.group[:1], (0, 0))
                sums[row.group[:1]] = (ns + row.ns, gap_ns + row.gap_ns)
            rows = [Row(k, n, g) for k, (n, g) in sums.items()]
        return sorted(r for r in rows if r.ns)

    def _step_groups(
        self, txn: lmdb.Transaction, dim: bytes, w: Window, resources: frozenset[str], gaps: Gaps
    ) -> list[Row]:
        """F(U) - F(S) a group, and F(b) - F(a) over each gap [a, b] for what it did not see."""
        out = []
        pcur = txn.cursor(db=self.points)
        at = 1 if dim == b"n" else 0  # where the group names its resource
        for gid, group in self._each_group(txn, dim):
            if resources and group[at] not in resources:
                continue
            ns = _f(pcur, gid, w.until_ns) - _f(pcur, gid, w.since_ns)
            gap_ns = sum(_f(pcur, gid, b) - _f(pcur, gid, a) for a, b in gaps.pairs) if ns else 0
            out.append(Row(tuple(group), ns, gap_ns))
        return out

    def _each_group(self, txn: lmdb.Transaction, dim: bytes) -> Iterator[tuple[bytes, list[Any]]]:
        prefix = b"g" + dim
        cur = txn.cursor(db=self.groups)
        if not cur.set_range(prefix):
            return
        for k, v in cur:
            if bytes(k[:2]) != prefix:
                return
            yield bytes(k[2:]), _group_decoder.decode(v)

    def _pods(self, txn: lmdb.Transaction, w: Window, resources: frozenset[str], gaps: Gaps) -> list[Row]:
        """The ended holds that may overlap ``w``, class by class (see ``_Writer._change``),
        then the open ones from the tracker's state."""
        sums: dict[tuple[str, ...], tuple[int, int]] = {}

        def add(group: tuple[str, ...], start: int, n: int, amount: int) -> None:
            lo = max(start, w.since_ns)
            ns, gap_ns = sums.get(group, (0, 0))
            sums[group] = (ns + n * amount, gap_ns + gaps.covered(lo, lo + n) * amount)

        cur = txn.cursor(db=self.groups)
        for c in range(1, 65):
            prefix, last = b"h" + bytes([c]), w.until_ns + (1 << c)
            if not cur.set_range(prefix + w.since_ns.to_bytes(_U64, "big")):
                continue
            for k, v in cur:
                end = int.from_bytes(k[2:10], "big")
                if bytes(k[:2]) != prefix or end > last:
                    break
                start, amount = int.from_bytes(v[:_U64], "big"), int.from_bytes(v[_U64 : 2 * _U64], "big")
                if ns := overlap(start, end, w):
                    group = tuple(_group_decoder.decode(v[2 * _U64 :]))
                    if not resources or group[3] in resources:
                        add(group, start, ns, amount)
        raw = txn.get(b"state", db=self.meta)
        for hold in Tracker(_state_decoder.decode(raw)).open_holds() if raw else []:
            if resources and hold.resource not in resources:
                continue
            if ns := overlap(hold.start_ns, None, w):
                add(hold.group("pod"), hold.start_ns, ns, hold.amount)
        return [Row(k, n, g) for k, (n, g) in sums.items()]


def _f(cur: lmdb.Cursor, gid: bytes, t: int) -> int:
    """F(t) of the group ``gid`` (see the module's docstring)."""
    if t < 0:
        return 0
    starts, sum_starts = _running(cur, gid + b"s", t)
    ends, sum_ends = _running(cur, gid + b"e", t)
    return t * starts - sum_starts - t * ends + sum_ends


def _running(cur: lmdb.Cursor, prefix: bytes, t: int) -> tuple[int, int]:
    """The running (count, sum) of the last point of ``prefix`` at or before ``t``."""
    after = prefix + (t + 1).to_bytes(_U64, "big")
    found = cur.prev() if cur.set_range(after) else cur.last()
    if not found or bytes(cur.key()[: len(prefix)]) != prefix:
        return 0, 0
    return _parse(bytes(cur.value()))


class _Writer:
    """Feeds records into the index, a chunk per write transaction; what it learns of the
    groups and their last points is kept between chunks."""

    def __init__(self, index: UsageIndex, history: History) -> None:
        self.index = index
        self.history = history
        self.log_id = history.log.log_id()
        self.gaps = history.missing_note()
        with index.env.begin() as txn:
            raw = txn.get(b"state", db=index.meta)
            self.tracker = Tracker(_state_decoder.decode(raw) if raw else None)
            self.next_id = key_seq(txn.get(b"next_id", db=index.meta) or bytes(8))
            self.ordinal = key_seq(txn.get(b"ordinal", db=index.meta) or bytes(8))
            corrupt = txn.get(b"corrupt", db=index.meta)
            self.corrupt: list[int] = msgspec.msgpack.decode(corrupt, type=list[int]) if corrupt else []
            blind = txn.get(b"blind", db=index.meta)
            self.blind = Blind(_spans_decoder.decode(blind) if blind else ())
        self.ids: dict[tuple[bytes, tuple[str, ...]], bytes] = {}
        self.last: dict[bytes, tuple[int, int, int]] = {}  # id + kind -> the last point's (t, count, sum)

    def write(self, records: Iterable[Record | CorruptRecordError]) -> int:
        """Feed ``records`` (up to a ``CHUNK``) in one write transaction, each record let go
        once fed; how many there were."""
        index = self.index
        fed, last_seq = 0, 0
        with index.env.begin(write=True) as txn:
            self.txn = txn
            self.gcur = txn.cursor(db=index.groups)
            self.pcur = txn.cursor(db=index.points)
            for item in records:
                fed, last_seq = fed + 1, item.seq
                if isinstance(item, CorruptRecordError):
                    self.corrupt.append(item.seq)
                    continue
                self.blind.feed(item.event)
                for change in self.tracker.feed(item.ts_ns, item.event):
                    self._change(change)
            if not fed:
                return 0
            stored = [v for c in self.history.log.raw_chunks(last_seq, last_seq) for _, v in c]
            last_value = stored[0] if stored else b""
            meta = {
                b"format": FORMAT,
                b"log_id": self.log_id.encode(),
                b"seq": last_seq.to_bytes(_U64, "big"),
                b"hash": chain_hash(last_value) if last_value else b"",
                b"state": msgspec.msgpack.encode(self.tracker.state),
                b"next_id": self.next_id.to_bytes(_U64, "big"),
                b"ordinal": self.ordinal.to_bytes(_U64, "big"),
                b"corrupt": msgspec.msgpack.encode(self.corrupt),
                b"gaps": self.gaps.encode(),
                b"blind": msgspec.msgpack.encode(self.blind.listed()),
            }
            for k, v in meta.items():
                txn.put(k, v, db=index.meta)
        return fed

    def _change(self, change: Change) -> None:
        hold, end = change
        n = self._id(b"n", (hold.namespace, hold.resource))
        d = self._id(b"d", (hold.resource, hold.device))
        if end is None:
            self._point(n + b"s", hold.start_ns, hold.amount)
            self._point(d + b"s", hold.start_ns, hold.amount)
            return
        self._point(n + b"e", end, hold.amount)
        self._point(d + b"e", end, hold.amount)
        # A pod's ended hold, by the class of its length (2**(c-1) <= length < 2**c ns) and its
        # end: one that overlaps [S, U] ends in [S, U + 2**c), so a query reads, class by
        # class, little more than the holds it counts. One of no length counts nowhere.
        c = (end - hold.start_ns).bit_length()
        if c:
            self.ordinal += 1
            key = b"h" + bytes([c]) + max(0, end).to_bytes(_U64, "big") + self.ordinal.to_bytes(_U64, "big")
            pod = msgspec.msgpack.encode(hold.group("pod"))
            start, amount = max(0, hold.start_ns).to_bytes(_U64, "big"), hold.amount.to_bytes(_U64, "big")
            self.gcur.put(key, start + amount + pod)

    def _id(self, dim: bytes, group: tuple[str, ...]) -> bytes:
        gid = self.ids.get((dim, group))
        if gid is not None:
            return gid
        key = _key_digest(dim, group)
        gid = self.gcur.get(key)
        if gid is None:
            gid = self.next_id.to_bytes(4, "big")
            self.next_id += 1
            self.gcur.put(key, gid)
            self.gcur.put(b"g" + dim + gid, msgspec.msgpack.encode(group))
        gid = bytes(gid)
        if len(self.ids) > KEEP_IDS:
            self.ids.clear()
        self.ids[(dim, group)] = gid
        return gid

    def _point(self, prefix: bytes, t: int, weight: int = 1) -> None:
        """A start or end at ``t`` of ``weight`` (a hold's amount): the running count and sum of
        its list grow by ``weight`` and ``weight * t``."""
        t = max(0, t)
        last = self.last.get(prefix)
        if last is None:
            last = (0, 0, 0)
            cur = self.pcur
            found = cur.prev() if cur.set_range(prefix + b"\xff" * 16) else cur.last()
            if found and bytes(cur.key()[: len(prefix)]) == prefix:
                key = bytes(cur.key())
                last = (int.from_bytes(key[len(prefix) : len(prefix) + _U64], "big"), *_parse(bytes(cur.value())))
            self.last[prefix] = last  # what _insert_before_last updates too
        self.ordinal += 1
        key = prefix + t.to_bytes(_U64, "big") + self.ordinal.to_bytes(_U64, "big")
        if t >= last[0]:
            self.pcur.put(key, _value(last[1] + weight, last[2] + weight * t))
            self.last[prefix] = (t, last[1] + weight, last[2] + weight * t)
            return
        self._insert_before_last(prefix, key, t, weight)

    def _insert_before_last(self, prefix: bytes, key: bytes, t: int, weight: int) -> None:
        """A point older than the list's last (a clock stepped back): it goes in its place,
        and every running sum after it grows by it."""
        cur = self.pcur
        before = (0, 0)
        found = cur.prev() if cur.set_range(key) else cur.last()
        if found and bytes(cur.key()[: len(prefix)]) == prefix:
            before = _parse(bytes(cur.value()))
        cur.put(key, _value(before[0] + weight, before[1] + weight * t))
        cur.set_key(key)
        later = []
        while cur.next() and bytes(cur.key()[: len(prefix)]) == prefix:
            count, total = _parse(bytes(cur.value()))
            later.append((bytes(cur.key()), _value(count + weight, total + weight * t)))
        for k, v in later:
            cur.put(k, v)
        t_last, count, total = self.last[prefix]
        self.last[prefix] = (t_last, count + weight, total + weight * t)
