"""``eventsrc backup``: a consistent copy of the log (snapshots and archive segments too), safe while
the daemon runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eventsrc.cli.options import Parents, Subparsers, add_output


def add_parser(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "backup",
        parents=[parents.root],
        help="copy the log (and snapshots and archive) consistently, while the daemon runs",
        description="Copy the event log with LMDB's own consistent copy (one read transaction, compacted, as "
        "'mdb_copy -c' does), the snapshots at or before it and the archive segments its ledger names into DEST, "
        "laid out as a root directory: "
        "'eventsrc --root-dir DEST log|state|audit verify' read it. Safe while the daemon writes; a plain cp of "
        "data.mdb is not. DEST must be new or empty.",
    )
    p.add_argument("dest", type=Path, metavar="DEST", help="a new or empty directory")
    add_output(p)
    p.set_defaults(func=backup)


def backup(args: argparse.Namespace) -> int:
    from eventsrc.log.consistent_copy import backup as copy

    info = copy(args.layout, args.dest.absolute())
    if args.output == "json":
        fields = {
            "dest": str(info.dest),
            "last_seq": info.last_seq,
            "log_bytes": info.log_bytes,
            "snapshots": [str(p) for p in info.snapshots],
            "segments": [str(p) for p in info.segments],
            "missing_segments": info.missing,
        }
        print(json.dumps(fields))
    else:
        segments = f", {len(info.segments)} archive segment(s)" if info.segments or info.missing else ""
        print(
            f"backed up the log up to sequence {info.last_seq} ({info.log_bytes} bytes), {len(info.snapshots)} "
            f"snapshot(s){segments} to {info.dest}; read it with: eventsrc --root-dir {info.dest} log"
        )
    if info.missing:
        from eventsrc.offline.render import escape

        print(
            f"eventsrc: error: archive segment(s) named by the log's ledger were not found, not copied: "
            f"{escape(', '.join(info.missing))}",
            file=sys.stderr,
        )
        return 1
    return 0
