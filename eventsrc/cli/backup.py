"""``eventsrc backup``: a consistent copy of the log (and snapshots), safe while the daemon runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eventsrc.cli.options import Parents, Subparsers, add_output


def add_parser(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "backup",
        parents=[parents.root],
        help="copy the log (and snapshots) consistently, while the daemon runs",
        description="Copy the event log with LMDB's own consistent copy (one read transaction, compacted, as "
        "'mdb_copy -c' does) and the snapshots at or before it into DEST, laid out as a root directory: "
        "'eventsrc --root-dir DEST log|state|audit verify' read it. Safe while the daemon writes; a plain cp of "
        "data.mdb is not. DEST must be new or empty.",
    )
    p.add_argument("dest", type=Path, metavar="DEST", help="a new or empty directory")
    add_output(p)
    p.set_defaults(func=backup)


def backup(args: argparse.Namespace) -> int:
    from eventsrc.log.backup import backup as copy

    info = copy(args.layout, args.dest.absolute())
    if args.output == "json":
        fields = {
            "dest": str(info.dest),
            "last_seq": info.last_seq,
            "log_bytes": info.log_bytes,
            "snapshots": [str(p) for p in info.snapshots],
        }
        print(json.dumps(fields))
    else:
        print(
            f"backed up the log up to sequence {info.last_seq} ({info.log_bytes} bytes) and {len(info.snapshots)} "
            f"snapshot(s) to {info.dest}; read it with: eventsrc --root-dir {info.dest} log"
        )
    return 0
