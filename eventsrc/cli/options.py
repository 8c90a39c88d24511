"""What every command module of the CLI shares: the parent parsers' flags, ``-o``, and how a
command opens the log to read it.

Each command module has ``add_parser(subparsers, parents)``, which declares its commands and
sets ``func`` to the function that runs one. Command modules are imported to build the parser,
even for ``eventsrc --help``: they import only the standard library at the top, and what a
command needs (lmdb, msgspec, rich, grpclib) inside the function that runs it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TypeAlias

from eventsrc.layout import DEFAULT_ROOT, Layout

if TYPE_CHECKING:
    from eventsrc.log.history import History
    from eventsrc.log.store import EventLog

Command = Callable[[argparse.Namespace], int]
# What ``add_subparsers`` returns: each command module adds its commands to it.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class Parents(NamedTuple):
    """The flags accepted before or after a command name: ``root`` (--root-dir) for every
    command, ``logging`` (--log-level, --log-format) for the daemon's."""

    root: argparse.ArgumentParser
    logging: argparse.ArgumentParser


def root_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--root-dir",
        type=Path,
        default=argparse.SUPPRESS,
        metavar="DIR",
        help=f"the kubelet root directory to work under (default {DEFAULT_ROOT}; the log lives in DIR/eventsrc/)",
    )
    return p


def logging_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=argparse.SUPPRESS,
        help="log level (default info; config logLevel)",
    )
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=argparse.SUPPRESS,
        help="text (key=value, the default) or json (one object per line); config logFormat",
    )
    return p


def add_output(p: argparse.ArgumentParser, choices: Sequence[str] = ("table", "json")) -> None:
    p.add_argument("-o", "--output", choices=choices, default=choices[0], help="output format (default %(default)s)")


def read_input(path: Path) -> bytes:
    """The bytes of the file at ``path``, or of stdin when it is ``-``. Raises OSError."""
    import sys

    return sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()


def open_reader(layout: Layout) -> EventLog:
    """The log under ``layout``, read-only (the daemon may be writing it)."""
    from eventsrc.log.store import EventLog

    return EventLog(layout.require_log(), readonly=True)


def add_live_only(p: argparse.ArgumentParser) -> None:
    """``--live-only``: read the live log alone, not the archive of what retention cut."""
    p.add_argument(
        "--live-only",
        action="store_true",
        help="read only the live log, from where it starts (by default, after retention cuts, the archive "
        "segments under eventsrc/archive are read first, from record 1)",
    )


def open_history(layout: Layout, live_only: bool) -> History:
    """The log under ``layout`` read-only, with its archive unless ``live_only``; a line on
    stderr names the ranges the archive lacks."""
    import sys

    from eventsrc.log.history import History
    from eventsrc.offline.render import escape

    history = History(open_reader(layout), layout.archive, live_only=live_only)
    if note := history.missing_note():
        print(f"eventsrc: warning: {escape(note)}", file=sys.stderr)
    return history
