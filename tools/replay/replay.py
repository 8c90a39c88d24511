#!/usr/bin/env python3
"""Replay an eventsrc log, read-only, and print the views as they were at a point.

    tools/replay/replay.py PATH [--until SEQ] [-o table|json]

PATH is a kubelet root (with eventsrc/log/ inside), the log directory itself, or a
directory holding a copied data.mdb (taken from another machine, say). The log is opened
read-only and without LMDB's lock file, so nothing is ever written to what is read.
Uses only eventsrc.log and eventsrc.state: never the daemon.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from eventsrc.errors import EventsrcError
from eventsrc.log.store import EventLog
from eventsrc.state.apply import rebuild


def find_log(path: Path) -> Path:
    for candidate in (path / "eventsrc" / "log", path / "log", path):
        if (candidate / "data.mdb").is_file():
            return candidate
    if path.name == "data.mdb" and path.is_file():
        return path.parent
    raise EventsrcError(f"no eventsrc log at {path} (looked for eventsrc/log/data.mdb, log/data.mdb, data.mdb)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="replay", description=__doc__.split("\n\n")[0])
    p.add_argument("path", type=Path, help="kubelet root, log directory, or directory with a copied data.mdb")
    p.add_argument("--until", type=int, default=None, metavar="SEQ", help="stop after record SEQ")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = p.parse_args(argv)
    try:
        log = EventLog(find_log(args.path), readonly=True, lock=False)
        views = rebuild(log.records(1, args.until))
    except EventsrcError as err:
        print(f"replay: error: {err}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(msgspec.json.encode(views).decode())
    else:
        from rich.console import Console

        from eventsrc.cli.render import views_tables

        console = Console()
        for table in views_tables(views):
            console.print(table)
    if views.meta.corrupt:
        print(f"replay: corrupt record(s) at sequence {', '.join(map(str, sorted(views.meta.corrupt)))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
