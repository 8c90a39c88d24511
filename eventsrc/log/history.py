"""The whole history of a log: its archive segments, then the live log (docs/adr/0018).

After a retention cut the live log starts after its base; what left is in sealed segments
under ``ROOT/eventsrc/archive`` (``eventsrc.log.archive``), named by the log's ledger. The
offline readers (``audit``, ``replay``, ``log``, ``export``, ``state``) read through a
``History``, which joins the two:

* by default, when the log has a base and the archive directory holds segments, the
  segments the ledger names come first, then the live log: ``records(1)`` starts at
  record 1 again;
* with ``live_only`` (``--live-only``), or without a base or segments, only the live log.

A range the ledger names but that cannot be read here (its segment is missing, or the cut
kept no archive) is a ``Gap``: readers read what is there and say which ranges are not
(``missing_note``). Views are rebuilt from record 1 only when nothing is missing;
otherwise they start from the views the log keeps at its base (``start_views``).

Segments have no index: ``index_seqs`` scans each segment whose range overlaps the query
once (``keys_for``, as the log's index does) and keeps what it found for this process.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from eventsrc.errors import EventsrcError, LogCutWhileReadingError
from eventsrc.events import CorruptRecordError, Record, decode_record
from eventsrc.log.archive import LedgerEntry, SegmentError, iter_records, read_header, segment_files
from eventsrc.log.index import keys_for
from eventsrc.log.snapshots import base_views
from eventsrc.log.store import EventLog
from eventsrc.state.views import Views

#: Records of loaded segments kept in memory at once (at least the segment in use; each
#: scanned segment's index stays).
KEEP_RECORDS = 200_000


class Reader(Protocol):
    """What an audit query reads: the index and the records it names (``EventLog`` or ``History``)."""

    def index_seqs(self, prefix: bytes, from_seq: int = 1, until_seq: int | None = None) -> list[int]: ...

    def read_many(self, seqs: Iterable[int]) -> list[Record | CorruptRecordError]: ...


@dataclass(frozen=True)
class Gap:
    """Records the ledger says left the live log, which cannot be read here."""

    first: int
    last: int
    file: str  # the segment's name; "" when the cut kept no archive
    why: str  # "missing", "not archived", "in no ledger entry"

    def text(self) -> str:
        if self.why == "missing":
            return f"records {self.first}..{self.last} (segment {self.file} is missing)"
        if self.why == "not archived":
            return f"records {self.first}..{self.last} (cut without an archive)"
        return f"records {self.first}..{self.last} ({self.why})"


@dataclass
class _Scanned:
    """One segment read through: its records under each index prefix, and the corrupt ones."""

    index: dict[bytes, list[int]]
    corrupt: list[int]


class History:
    """The archive segments and the live log of ``log``, read as one, oldest first."""

    def __init__(self, log: EventLog, archive_dir: Path | None, live_only: bool = False) -> None:
        self.log = log
        self.archive_dir = archive_dir
        self.live_only = live_only
        self.base = log.base()
        #: the ledger's segments present here, oldest first
        self.segments: list[tuple[LedgerEntry, Path]] = []
        self.gaps: list[Gap] = []
        self.ledger: list[LedgerEntry] = []
        present = segment_files(archive_dir) if archive_dir is not None and self.base is not None else []
        #: whether records before the live log's start are read (from the archive)
        self.reading_archive = not live_only and self.base is not None and bool(present)
        if self.base is not None:
            self.ledger = sorted(log.ledger(), key=lambda e: e.first)
        if self.reading_archive:
            self._join({p.name: p for _f, _l, p in present})
        self._firsts = [e.first for e, _ in self.segments]
        self._scanned: dict[str, _Scanned] = {}
        self._values: OrderedDict[str, dict[int, bytes]] = OrderedDict()
        self._checked: set[str] = set()

    def _join(self, files: dict[str, Path]) -> None:
        """The segments to read and the gaps between record 1 and the base."""
        assert self.base is not None
        expected = 1
        for e in self.ledger:
            if e.first > expected:
                self.gaps.append(Gap(expected, e.first - 1, "", "in no ledger entry"))
            expected = max(expected, e.last + 1)
            if not e.file:
                self.gaps.append(Gap(e.first, e.last, "", "not archived"))
            elif e.file not in files:
                self.gaps.append(Gap(e.first, e.last, e.file, "missing"))
            else:
                self.segments.append((e, files[e.file]))
        if expected <= self.base.seq:
            self.gaps.append(Gap(expected, self.base.seq, "", "in no ledger entry"))

    # ------------------------------------------------------------------ where it starts

    def live_first_seq(self) -> int:
        """The first record of the live log."""
        return self.log.first_seq()

    def first_seq(self) -> int:
        """The first record this history can read."""
        if self.segments:
            return min(self.segments[0][0].first, self.live_first_seq())
        return self.live_first_seq()

    def last_seq(self) -> int:
        return self.log.last_seq()

    def missing(self) -> list[Gap]:
        """The ranges before the live log that the archive should hold but cannot give here
        (empty when the archive is not read)."""
        return list(self.gaps)

    def complete(self) -> bool:
        """Whether every record from 1 on can be read (no base, or the archive holds it all)."""
        return self.base is None or (self.reading_archive and not self.gaps)

    def start_note(self) -> str:
        """One line: where the live log starts and what is read before it ("" without a base)."""
        if self.base is None:
            return ""
        first, n = self.live_first_seq(), len(self.segments)
        head = f"the live log starts at record {first}"
        before = f"records 1..{first - 1}"
        if self.live_only:
            return f"{head}; {before} are not read (--live-only)"
        if not self.reading_archive:
            if self.ledger and all(not e.file for e in self.ledger):
                return f"{head}; {before} were cut without an archive"
            return f"{head}; {before} are not read: no archive segments in {self.archive_dir}"
        return f"{head}; {before} are read from {n} archive segment{'s' if n != 1 else ''}"

    def covers(self, seq: int) -> bool:
        """Whether record ``seq`` is in an archive segment read here."""
        return any(e.first <= seq <= e.last for e, _ in self.segments)

    def unreadable(self, seq: int) -> str:
        """Why record ``seq``, before the live log's start, cannot be read here."""
        if self.live_only:
            return "--live-only reads no archive"
        if self.archive_dir is None:
            return "no archive is read"
        self.refresh()
        for e in self.ledger:
            if e.first <= seq <= e.last:
                gap = Gap(e.first, e.last, e.file, "missing" if e.file else "not archived")
                return f"the archive lacks {gap.text()}"
        return "no ledger entry names them"

    def missing_note(self) -> str:
        """One line naming what the archive lacks ("" when nothing is missing)."""
        if not self.gaps:
            return ""
        return "the archive lacks " + "; ".join(g.text() for g in self.gaps) + ": reading what is there"

    def start_views(self, until_seq: int | None = None, until_ns: int | None = None) -> Views:
        """The views to replay from: empty (from record 1) when the whole history can be read,
        else the views at the live log's base. Raises EventsrcError for a point before the
        base that the archive cannot rebuild."""
        if self.complete():
            return Views()
        assert self.base is not None
        before = (until_seq is not None and until_seq < self.base.seq) or (
            until_ns is not None and until_ns < self.base.ts_ns
        )
        if before:
            point = f"record {until_seq}" if until_seq is not None else "that time"
            where = f"{point} is before the live log's start (record {self.live_first_seq()})"
            if self.live_only:
                raise EventsrcError(f"{where}: it is in the archive; read it without --live-only")
            lacking = "; ".join(g.text() for g in self.gaps) or f"no archive segments in {self.archive_dir}"
            raise EventsrcError(f"{where}, and the archive cannot rebuild the views before it: it lacks {lacking}")
        return base_views(self.log, self.log.log_id())

    # ------------------------------------------------------------------ records

    def records(self, from_seq: int = 1, until_seq: int | None = None) -> Iterator[Record | CorruptRecordError]:
        """Every record from ``from_seq`` to ``until_seq`` (inclusive), in order: the archive's
        first, then the live log's. A corrupt record is yielded as a ``CorruptRecordError``.
        A segment that cannot be read to its end raises EventsrcError. When the daemon cuts
        the live log meanwhile, what left is read from its new segment, then the live log
        goes on (with ``live_only``, or without the archive, the cut is an error instead:
        records would be skipped)."""
        next_seq = from_seq
        while True:
            for entry, path in self._overlapping(next_seq, until_seq):
                cached = self._values.get(entry.file)
                items = iter(cached.items()) if cached is not None else self._segment_items(entry, path)
                for seq, value in items:
                    if seq < next_seq:
                        continue
                    if until_seq is not None and seq > until_seq:
                        return
                    yield _decode(seq, value)
                    next_seq = seq + 1
            strict = next_seq > 1 and (self.reading_archive or next_seq >= self.live_first_seq())
            try:
                read_live = False
                for item in self.log.records(next_seq, until_seq, strict=strict):
                    if read_live and item.seq != next_seq:  # a non-strict read went on after a cut
                        raise LogCutWhileReadingError(next_seq, item.seq - 1)
                    read_live = True
                    yield item
                    next_seq = item.seq + 1
                return
            except LogCutWhileReadingError:
                if self.live_only or self.archive_dir is None:
                    raise
                self.refresh()
                if not self.covers(next_seq):
                    raise

    def refresh(self) -> None:
        """Read the base, the ledger and the segments again (the daemon cut the log)."""
        self.base = self.log.base()
        self.segments, self.gaps = [], []
        self.ledger = sorted(self.log.ledger(), key=lambda e: e.first)
        present = segment_files(self.archive_dir) if self.archive_dir is not None else []
        self.reading_archive = not self.live_only and self.base is not None and bool(present)
        if self.reading_archive:
            self._join({p.name: p for _f, _l, p in present})
        self._firsts = [e.first for e, _ in self.segments]

    def index_seqs(self, prefix: bytes, from_seq: int = 1, until_seq: int | None = None) -> list[int]:
        """The sequences of the records under ``prefix`` (``eventsrc.log.index``), archive and
        live log. A corrupt archived record counts under every prefix: the archive keeps no
        index to say what it was about."""
        out: list[int] = []
        for entry, path in self._overlapping(from_seq, until_seq):
            scanned = self._scan(entry, path)
            seqs = sorted(scanned.index.get(prefix, []) + scanned.corrupt)
            out += [s for s in seqs if s >= from_seq and (until_seq is None or s <= until_seq)]
        return out + self.log.index_seqs(prefix, from_seq, until_seq)

    def read_many(self, seqs: Iterable[int]) -> list[Record | CorruptRecordError]:
        """The records ``seqs`` names, in that order; one not found is a CorruptRecordError."""
        seqs = list(seqs)
        live = self.live_first_seq()
        got = dict(zip((s for s in seqs if s >= live), self.log.read_many(s for s in seqs if s >= live), strict=True))
        out: list[Record | CorruptRecordError] = []
        for seq in seqs:
            if seq >= live:
                out.append(got[seq])
                continue
            i = bisect.bisect_right(self._firsts, seq) - 1
            value = None
            if i >= 0 and seq <= self.segments[i][0].last:
                value = self._load(*self.segments[i]).get(seq)
            out.append(_decode(seq, value) if value is not None else CorruptRecordError(seq, "missing"))
        return out

    def stored(self, from_seq: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` records from ``from_seq`` as the log stored them, (seq, value), from
        the archive segment holding ``from_seq`` (empty when no segment here holds it:
        ``held_from`` says where the next one is). Raises EventsrcError for a segment that
        cannot be read. The fleet's shipper sends these bytes as it sends the live log's."""
        i = bisect.bisect_right(self._firsts, from_seq) - 1
        if i < 0 or from_seq > self.segments[i][0].last:
            return []
        entry, path = self.segments[i]
        values = self._load(entry, path)
        until = min(entry.last, from_seq + limit - 1)
        return [(seq, values[seq]) for seq in range(from_seq, until + 1) if seq in values]

    def held_from(self, seq: int) -> int:
        """The first record at or after ``seq`` that can be read here: in a segment, or the
        live log's first."""
        live = self.live_first_seq()
        held = [max(e.first, seq) for e, _ in self.segments if e.last >= seq and e.first < live]
        return min([*held, max(seq, live)])

    # ------------------------------------------------------------------ segments

    def _overlapping(self, from_seq: int, until_seq: int | None) -> list[tuple[LedgerEntry, Path]]:
        return [
            (e, p)
            for e, p in self.segments
            if e.last >= from_seq and (until_seq is None or e.first <= until_seq) and e.first < self.live_first_seq()
        ]

    def _segment_items(self, entry: LedgerEntry, path: Path) -> Iterator[tuple[int, bytes]]:
        """(seq, stored value) of one segment, after checking it is the one the ledger names."""
        if entry.file not in self._checked:
            try:
                header = read_header(path)
            except SegmentError as exc:
                raise EventsrcError(_damaged(entry, str(exc))) from None
            if (header.log_id, header.first_seq, header.last_seq) != (self.log.log_id(), entry.first, entry.last):
                raise EventsrcError(_damaged(entry, "it is not the segment this log archived"))
            self._checked.add(entry.file)
        last = entry.first - 1
        try:
            for seq, value in iter_records(path):
                last = seq
                yield seq, value
        except SegmentError as exc:
            raise EventsrcError(_damaged(entry, f"{exc}, after record {last}")) from None

    def _load(self, entry: LedgerEntry, path: Path) -> dict[int, bytes]:
        """The segment's stored values by sequence (the newest loaded, up to KEEP_RECORDS, are kept)."""
        values = self._values.get(entry.file)
        if values is None:
            values = dict(self._segment_items(entry, path))
            self._values[entry.file] = values
            while len(self._values) > 1 and sum(map(len, self._values.values())) > KEEP_RECORDS:
                self._values.popitem(last=False)
        self._values.move_to_end(entry.file)
        return values

    def _scan(self, entry: LedgerEntry, path: Path) -> _Scanned:
        """The segment's records under each index prefix, scanned once per process."""
        scanned = self._scanned.get(entry.file)
        if scanned is not None:
            return scanned
        scanned = _Scanned({}, [])
        for seq, value in self._load(entry, path).items():
            item = _decode(seq, value)
            if isinstance(item, CorruptRecordError):
                scanned.corrupt.append(seq)
                continue
            for prefix in keys_for(item.event):
                scanned.index.setdefault(prefix, []).append(seq)
        self._scanned[entry.file] = scanned
        return scanned


def _decode(seq: int, value: bytes) -> Record | CorruptRecordError:
    try:
        return decode_record(seq, value)
    except CorruptRecordError as err:
        return err


def _damaged(entry: LedgerEntry, why: str) -> str:
    return (
        f"archive segment {entry.file} (records {entry.first}..{entry.last}) cannot be read: {why}; "
        "run 'eventsrc audit verify', or read the live log only with --live-only"
    )


def archive_dir_of(log_dir: Path) -> Path:
    """The archive directory beside a log directory (ROOT/eventsrc/log -> ROOT/eventsrc/archive)."""
    return log_dir.parent / "archive"
