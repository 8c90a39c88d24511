"""Retention cuts on the log (docs/adr/0018): the shell's steps, each synchronous, each run
by the daemon in a worker thread, except a large cut's ``prepare``, which runs in a process of
its own (``eventsrc.log.cut_worker``) on the log opened read-only. The decision where to cut
is ``eventsrc.core.retention_policy``.

A cut at ``seq`` goes in this order, so that a SIGKILL at any point leaves the old state or
the new one, and the next start finishes or undoes it:

1. ``prepare``: the views at ``seq`` (the base views plus the records up to it) are
   encoded as a snapshot, and, with the archive on, records ``base+1..seq`` are written
   as a sealed segment. A crash here leaves a temporary file (deleted at start) or a
   segment the ledger does not name (deleted at start: the records are still live). The
   worker process dies with the daemon, so it cannot seal one after the next start.
2. ``commit``: one LMDB transaction moves the base to ``seq`` with its views and the
   ledger entry. From here on the records up to ``seq`` are never read.
3. ``delete_some``: the records up to ``seq`` and their index keys are deleted, a few
   hundred per transaction, so that appends wait little. A crash leaves some of them:
   ``leftovers`` says so at start, and they are deleted then.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from eventsrc.errors import EventsrcError
from eventsrc.events import CorruptRecordError, chain_hash, decode_record, prev_hash_of
from eventsrc.log.archive import (
    LedgerEntry,
    SegmentError,
    read_header,
    remove_temporaries,
    segment_files,
    write_segment,
)
from eventsrc.log.snapshots import base_views, encode_snapshot
from eventsrc.log.store import Base, EventLog, key_seq
from eventsrc.state.apply import apply_all
from eventsrc.state.views import Views


def failure_reason(err: EventsrcError | OSError) -> str:
    """Why a cut failed, in one line that stays the same while the trouble does: an OSError on
    a segment's file (its name holds the range, its temporary name a random part) names the
    archive directory instead."""
    if not isinstance(err, OSError):
        return str(err)
    where = err.filename
    if isinstance(where, str) and Path(where).name.startswith((".segment-", "segment-")):
        where = str(Path(where).parent)
    what = err.strerror or str(err)
    return f"{what}: {where}" if where else what


@dataclass(frozen=True)
class Prepared:
    base: Base
    views: bytes | memoryview  # a view into the worker's answer (``cut_worker.read``)
    entry: LedgerEntry
    seconds: float


def views_at(log: EventLog, seq: int) -> Views:
    """The views after record ``seq``: the base's views and the live records up to it."""
    base = log.base()
    views = base_views(log, log.log_id()) if base is not None else Views()
    return apply_all(views, log.records(views.meta.last_seq + 1, seq))


def record_times(log: EventLog, seqs: list[int]) -> dict[int, int]:
    """Each record's timestamp (a record that cannot be read is left out)."""
    out = {}
    for item in log.read_many(seqs):
        if not isinstance(item, Exception):
            out[item.seq] = item.ts_ns
    return out


def _live_items(log: EventLog, first: int, last: int) -> list[tuple[int, bytes]]:
    items = [(key_seq(k), v) for chunk in log.raw_chunks(first, last) for k, v in chunk]
    if not items or items[0][0] != first or items[-1][0] != last:
        got = f"{items[0][0]}..{items[-1][0]}" if items else "none"
        raise EventsrcError(f"cannot cut the log at {last}: records {first}..{last} are not all there (found {got})")
    return items


def prepare(log: EventLog, archive: Path | None, seq: int) -> Prepared:
    """Step 1: the views at ``seq`` and, unless ``archive`` is None, the sealed segment of
    the records leaving the live log. Nothing the log or a reader uses changes yet."""
    t0 = time.perf_counter()
    first = log.first_seq()
    if seq < first:
        raise EventsrcError(f"cannot cut the log at {seq}: it starts at {first}")
    items = _live_items(log, first, seq)
    value = items[-1][1]
    try:
        ts_ns = decode_record(seq, value).ts_ns
    except CorruptRecordError:  # archived as it is (audit verify names it); its time is unknown
        ts_ns = 0
    views = views_at(log, seq)
    data = encode_snapshot(views, log.log_id())
    if archive is not None:
        entry = write_segment(archive, log.log_id(), first, seq, iter(items))
    else:
        entry = LedgerEntry(
            first=first,
            last=seq,
            records=len(items),
            first_link=prev_hash_of(items[0][1]),
            last_hash=chain_hash(value),
            file="",
        )
    base = Base(seq=seq, hash=chain_hash(value), ts_ns=ts_ns)
    return Prepared(base, data, entry, time.perf_counter() - t0)


def commit(log: EventLog, prepared: Prepared) -> float:
    """Step 2: move the base (one transaction); its duration in seconds."""
    t0 = time.perf_counter()
    log.set_base(prepared.base, prepared.views, prepared.entry)
    return time.perf_counter() - t0


def delete_some(log: EventLog, limit: int = 256) -> tuple[int, float]:
    """Step 3, one short transaction: (records deleted, seconds it took)."""
    base = log.base()
    if base is None:
        return 0, 0.0
    t0 = time.perf_counter()
    n = log.delete_through(base.seq, limit)
    return n, time.perf_counter() - t0


def leftovers(log: EventLog) -> bool:
    """Whether records at or before the base are still in the file (a cut interrupted)."""
    base = log.base()
    if base is None:
        return False
    oldest = log.oldest_stored()
    return 0 < oldest <= base.seq


def undo_unfinished(log: EventLog, archive: Path) -> list[Path]:
    """At start: delete the temporary files and the segment of a cut that never moved the
    base: one the ledger does not name, of this log, starting at the live log's first
    record, whose records are all still live. Any other segment the ledger does not name
    (another log's, one from before a restored or lost log) is left for the operator:
    ``audit verify`` names it."""
    remove_temporaries(archive)
    named = {e.file for e in log.ledger()}
    first, last, log_id = log.first_seq(), log.last_seq(), log.log_id()
    removed = []
    for seg_first, seg_last, path in segment_files(archive):
        if path.name in named or seg_first != first or seg_last > last:
            continue
        try:
            header = read_header(path)
        except SegmentError:
            continue
        if header.log_id == log_id and (header.first_seq, header.last_seq) == (seg_first, seg_last):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
