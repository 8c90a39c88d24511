"""``eventsrc audit usage``: device-hours and exclusive CPU-hours per namespace, pod, device or
resource, exact to the nanosecond, from the usage index (``eventsrc.log.usage_index``;
docs/adr/0026). What a hold is: ``eventsrc.core.chargeback``.

The index is brought up to date first (built from record 1, archive included, on first use:
a line on stderr says so). Where it cannot be written (a read-only state directory), or with
``--scan``, the answer comes from a scan of every record instead, through the same pure
functions, and stderr says that too.
"""

from __future__ import annotations

import csv
import sys
import time
from decimal import Decimal
from typing import Any, TextIO

import lmdb
import msgspec

from eventsrc.core.chargeback import (
    FIELDS,
    Row,
    Window,
    hours_text,
    in_bytes,
    merged,
    observe,
    seconds_text,
    totals,
    window,
)
from eventsrc.errors import EventsrcError
from eventsrc.events import CorruptRecordError
from eventsrc.log.history import History
from eventsrc.log.usage_index import Source, UsageIndex
from eventsrc.obs.text import escape
from eventsrc.offline.audit_queries import UsageError, iso, parse_point

_json = msgspec.json.Encoder(decimal_format="number")


def note(text: str) -> None:
    print(f"eventsrc: {escape(text)}", file=sys.stderr)


def parse_window(since: str | None, until: str | None, now_ns: int) -> Window:
    """The window of --since and --until: times only (a sequence number names no instant:
    the records of one batch share their time)."""
    points = []
    for text, flag in ((since, "--since"), (until, "--until")):
        point = parse_point(text, flag)
        if point.seq is not None:
            raise UsageError(
                f"{flag} {text}: usage windows are times (RFC 3339, e.g. 2026-11-21T23:40:00Z), not records"
            )
        points.append(point.ts_ns)
    if points[0] is not None and points[1] is not None and points[0] > points[1]:
        raise UsageError(f"--since {since} is after --until {until}")
    return window(points[0], points[1], now_ns)


def scan_totals(history: History, by: str, w: Window, resources: frozenset[str]) -> tuple[list[Row], list[int]]:
    """The answer from a scan of every record (no index): rows and the corrupt records' sequences."""
    corrupt: list[int] = []

    def records() -> Any:
        for item in history.records(1):
            if isinstance(item, CorruptRecordError):
                corrupt.append(item.seq)
            else:
                yield item.ts_ns, item.event

    holds, blind = observe(records())
    return totals(holds, by, w, resources, merged(blind.listed(), w)), corrupt


def answer(
    source: Source, index_path: Any, by: str, w: Window, resources: frozenset[str], scan: bool = False
) -> tuple[list[Row], list[int]]:
    """The rows, from the index (brought up to date from ``source``) or a scan, and the
    corrupt records' sequences."""
    if scan:
        note("answering from a scan of every record (--scan)")
        return _scan(source, by, w, resources)
    try:
        index = UsageIndex(index_path)
    except EventsrcError as err:
        note(f"{err}; answering from a scan of every record instead")
        return _scan(source, by, w, resources)
    with index:
        try:
            update = index.catch_up(source, note)
        except (lmdb.Error, OSError) as err:
            note(f"cannot update the usage index at {index_path}: {err}; answering from a scan of every record instead")
            return _scan(source, by, w, resources)
        if update.how in ("built", "rebuilt"):
            why = f" ({update.why})" if update.how == "rebuilt" else " (first use)"
            note(
                f"usage index {update.how} from {update.records:,} records in {update.seconds:.1f} s{why}, "
                f"at {index_path}"
            )
        if gaps := index.gaps():
            note(f"warning: {gaps}")
        return index.totals(by, w, resources), update.corrupt


def _scan(source: Source, by: str, w: Window, resources: frozenset[str]) -> tuple[list[Row], list[int]]:
    with source() as history:
        if missing := history.missing_note():
            note(f"warning: {missing}")
        return scan_totals(history, by, w, resources)


# --------------------------------------------------------------------------- output


def seen(row: Row) -> str:
    """Whether the row's seconds were all seen: "all", "partly" (some inside a gap) or "none"."""
    return "all" if not row.gap_ns else "none" if row.gap_ns >= row.ns else "partly"


#: what a row's seconds mean, said under a table with seconds inside gaps (and in --help, docs)
BYTES_NOTE = "memory and hugepages rows are byte-seconds and byte-hours: the bytes a container held, times how long"
GAPS_NOTE = (
    "SEEN partly/none: some seconds (IN_GAPS) fell inside a gap, a time eventsrc was not running or could not "
    "see the kubelet or the runtime; the hold may have ended at any moment of it"
)


def render(
    rows: list[Row], by: str, w: Window, output: str, out: TextIO, fields: tuple[str, ...] | None = None
) -> None:
    """``rows`` as ``output``; ``fields`` name a row's group (default: ``audit usage --by``'s).
    A memory or hugepages row's figures are byte-seconds and byte-hours (``measure``)."""
    fields = fields or FIELDS[by]
    if output == "json":
        items = [
            {
                **dict(zip(fields, r.group, strict=True)),
                "seconds": Decimal(seconds_text(r.ns)),
                "hours": Decimal(hours_text(r.ns)),
                "seconds_seen": Decimal(seconds_text(r.ns - r.gap_ns)),
                "seconds_in_gaps": Decimal(seconds_text(r.gap_ns)),
                "measure": measure(r, fields),
            }
            for r in rows
        ]
        out.write(_json.encode(items).decode() + "\n")
    elif output == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([*fields, "seconds", "hours", "seen", "seconds_in_gaps", "measure"])
        for r in rows:
            marks = [seen(r), seconds_text(r.gap_ns), measure(r, fields)]
            writer.writerow([*(escape(x) for x in r.group), seconds_text(r.ns), hours_text(r.ns), *marks])
    else:
        out.write("\n".join(table_lines(rows, by, w, fields)) + "\n")


def table_lines(rows: list[Row], by: str, w: Window, fields: tuple[str, ...] | None = None) -> list[str]:
    from eventsrc.offline.audit_render import column_lines

    head = (
        f"usage by {by} from {iso(w.since_ns)} to {iso(w.until_ns)}: {len(rows)} group{'s' if len(rows) != 1 else ''}"
    )
    if not rows:
        return [head]
    body = [
        [escape(x) or "-" for x in r.group]
        + [seconds_text(r.ns), hours_text(r.ns), seen(r), seconds_text(r.gap_ns) if r.gap_ns else "-"]
        for r in rows
    ]
    columns = [f.upper() for f in fields or FIELDS[by]] + ["SECONDS", "HOURS", "SEEN", "IN_GAPS"]
    note = [GAPS_NOTE] if any(r.gap_ns for r in rows) else []
    fields = fields or FIELDS[by]
    note += [BYTES_NOTE] if any(measure(r, fields) == "byte-seconds" for r in rows) else []
    return [head, *column_lines(columns, body), *note]


def measure(r: Row, fields: tuple[str, ...]) -> str:
    """What a row's seconds count: "seconds" a device or CPU was held, or "byte-seconds" of
    memory or hugepages (``chargeback.in_bytes``)."""
    resource = dict(zip(fields, r.group, strict=True)).get("resource", "")
    return "byte-seconds" if in_bytes(resource) else "seconds"


def run(args: Any, source: Source, index_path: Any) -> int:
    """``eventsrc audit usage``: print the answer; 1 when records were corrupt."""
    w = parse_window(args.since, args.until, time.time_ns())
    resources = frozenset(args.resource or ())
    rows, corrupt = answer(source, index_path, args.by, w, resources, scan=args.scan)
    render(rows, args.by, w, args.output, sys.stdout)
    sys.stdout.flush()
    if corrupt:
        seqs = ", ".join(str(s) for s in sorted(set(corrupt)))
        print(
            f"eventsrc: error: corrupt record(s) at sequence {seqs}; the answer holds every other record",
            file=sys.stderr,
        )
        return 1
    return 0
