"""The log as it is: ``eventsrc log`` (its records, for people), ``export`` (the same as JSON
lines, for fleet pipelines) and ``state`` (the views rebuilt from it).

After retention cuts (docs/adr/0018) each reads the archive segments first, then the live log
(``eventsrc.log.history``), unless ``--live-only``; where the live log starts is said on stderr
(and in ``state``'s table), so that stdout stays the records or the views alone."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from eventsrc.cli.options import Parents, Subparsers, add_live_only, add_output, open_history
from eventsrc.errors import EventsrcError

if TYPE_CHECKING:
    from eventsrc.events import CorruptRecordError
    from eventsrc.log.history import History
    from eventsrc.state.views import Views


def add_parser(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "log",
        parents=[parents.root],
        help="print records of the event log",
        description="Print the records of the event log, oldest first. A corrupt record is "
        "named by its sequence and the rest are printed; the exit status is then 1.",
    )
    p.add_argument(
        "--from", dest="from_seq", type=int, default=1, metavar="SEQ", help="first sequence to print (default 1)"
    )
    p.add_argument("--until", dest="until_seq", type=int, default=None, metavar="SEQ", help="last sequence to print")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new records as they are appended")
    add_live_only(p)
    add_output(p)
    p.set_defaults(func=log)

    p = sub.add_parser(
        "export",
        parents=[parents.root],
        help="stream the log as JSON lines, for fleet pipelines",
        description="Print records as JSON lines (one per record, with its sequence number), oldest first, for "
        "Fluent Bit, Vector or a Kafka producer. Resume after the last sequence a consumer saw with "
        "--from LAST+1; --follow keeps streaming new records. Reads the log directly (the daemon may run).",
    )
    p.add_argument("--from", dest="from_seq", type=int, default=1, metavar="SEQ", help="first sequence (default 1)")
    p.add_argument("--until", dest="until_seq", type=int, default=None, metavar="SEQ", help="last sequence")
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming new records")
    add_live_only(p)
    p.add_argument("-o", "--output", choices=["jsonl"], default="jsonl", help="output format (default %(default)s)")
    p.set_defaults(func=export)

    p = sub.add_parser(
        "state",
        parents=[parents.root],
        help="print the views rebuilt from the log",
        description="Rebuild the devices, CPUs, claims and pods views from the whole log "
        "(the truth; snapshots are not trusted here unless --use-snapshot) and print them. After retention "
        "cuts the whole history is replayed, from record 1 through the archive segments; with --live-only (or "
        "when the archive lacks a range) from the views the log keeps where the live log starts. "
        "Corrupt records are named; the exit status is then 1.",
    )
    p.add_argument(
        "--until",
        dest="until_seq",
        type=int,
        default=None,
        metavar="SEQ",
        help="the views as they were after record SEQ (before the live log's start: from the archive)",
    )
    p.add_argument(
        "--use-snapshot",
        action="store_true",
        help="start from the newest valid snapshot (faster; skips checking older records)",
    )
    add_live_only(p)
    add_output(p)
    p.set_defaults(func=state)


def log(args: argparse.Namespace) -> int:
    from eventsrc.offline import render

    history = open_history(args.layout, args.live_only)
    _say_start(history)
    corrupt: list[CorruptRecordError] = []
    show = _printer(sys.stdout, args.output == "json", corrupt)
    if args.output != "json":
        sys.stdout.write(render.RECORD_HEADER + "\n")
    if args.follow:
        _follow(history, args.from_seq, show)  # the archive's records, then the live log's, followed
    else:
        for item in history.records(args.from_seq, args.until_seq):
            show(item)
    sys.stdout.flush()
    _report_corrupt(corrupt)
    return 1 if corrupt else 0


def _say_start(history: History) -> None:
    """Where the live log starts, on stderr (nothing for a log never cut)."""
    from eventsrc.offline.render import escape

    if note := history.start_note():
        print(f"eventsrc: {escape(note)}", file=sys.stderr)


def _printer(out: TextIO, as_json: bool, corrupt: list[CorruptRecordError]) -> Callable[[Any], None]:
    """Print one record (or a record that cannot be read) as a line; name each corrupt one on
    stderr and keep it in ``corrupt``."""
    from eventsrc.events import CorruptRecordError, ignorable
    from eventsrc.offline import render

    def show(item: Any) -> None:
        if isinstance(item, CorruptRecordError) and not ignorable(item):
            corrupt.append(item)
            print(f"eventsrc: error: {render.escape(str(item))}", file=sys.stderr)
        if as_json:
            out.write(json.dumps(render.record_json(item)) + "\n")
        else:
            out.write(render.record_line(item) + "\n")

    return show


def _follow(history: History, from_seq: int, show: Callable[[Any], None]) -> None:
    """Show the records from ``from_seq`` on, and each new one as it is appended, until Ctrl-C
    (or until records a cut took cannot be read: RecordsCutError)."""
    import trio

    from eventsrc.log.commit import follow

    async def tail() -> None:
        async for item in follow(history, from_seq):
            show(item)
            sys.stdout.flush()

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(tail)


def _report_corrupt(corrupt: list[CorruptRecordError]) -> None:
    from eventsrc.events import FutureRecordError

    newer = [str(c.seq) for c in corrupt if isinstance(c, FutureRecordError)]
    bad = [str(c.seq) for c in corrupt if not isinstance(c, FutureRecordError)]
    if newer:
        print(
            f"eventsrc: error: record(s) {', '.join(newer)} were written by a newer eventsrc "
            "(shown raw; docs/adr/0010)",
            file=sys.stderr,
        )
    if bad:
        print(
            f"eventsrc: error: corrupt record(s) at sequence {', '.join(bad)}; every other record was printed",
            file=sys.stderr,
        )


def export(args: argparse.Namespace) -> int:
    if args.from_seq < 1:
        raise EventsrcError("--from must be at least 1")
    args.output = "json"
    return log(args)


def state(args: argparse.Namespace) -> int:
    import msgspec

    from eventsrc.offline import render

    history = open_history(args.layout, args.live_only)
    start = history.start_note()
    with _progress("replaying", history.last_seq()) as advance:
        views = _rebuild(history, args.layout.snapshots if args.use_snapshot else None, args.until_seq, advance)
    if args.output == "json":
        sys.stdout.write(msgspec.json.encode(views).decode() + "\n")
        if start:
            print(f"eventsrc: {render.escape(start)}", file=sys.stderr)
    else:
        console = render.console()
        for table in render.views_tables(views, start):
            console.print(table)
    if views.meta.corrupt:
        seqs = ", ".join(str(s) for s in sorted(views.meta.corrupt))
        print(
            f"eventsrc: error: corrupt record(s) at sequence {seqs}; the views hold every other record", file=sys.stderr
        )
        return 1
    return 0


def _rebuild(
    history: History, snapdir: Path | None, until_seq: int | None, progress: Callable[[int], None] | None
) -> Views:
    """The views after ``until_seq`` (or now): from the newest usable snapshot when ``snapdir``
    is given and the point is in the live log, else from the start the history allows."""
    from eventsrc.log.snapshots import load_views
    from eventsrc.state.apply import apply_all

    base = history.base
    if snapdir is not None and (base is None or until_seq is None or until_seq >= base.seq):
        return load_views(history.log, snapdir, until_seq=until_seq, progress=progress)[0]
    views = history.start_views(until_seq)
    records = history.records(views.meta.last_seq + 1, until_seq)
    if progress is not None:
        records = _reporting(records, progress)
    return apply_all(views, records)


def _reporting(items: Iterable[Any], progress: Callable[[int], None]) -> Iterator[Any]:
    for item in items:
        if item.seq % 50_000 == 0:
            progress(item.seq)
        yield item


@contextlib.contextmanager
def _progress(what: str, total: int) -> Iterator[Callable[[int], None] | None]:
    """A progress bar on stderr for long work, when a person is watching."""
    if total < 200_000 or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task(what, total=total)
        yield lambda seq: bar.update(task, completed=seq)
