"""The commands behind ``eventsrc``. Each returns the process exit status."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
from rich.console import Console

from eventsrc.errors import EventsrcError
from eventsrc.events import CorruptRecordError
from eventsrc.layout import Layout
from eventsrc.log.store import DirLock, EventLog


def serve(args: argparse.Namespace) -> int:
    import trio

    from eventsrc.daemon import serve as run

    trio.run(lambda: run(args.layout, snapshot_every=args.snapshot_every))
    return 0


def status(args: argparse.Namespace) -> int:
    layout: Layout = args.layout
    pid = DirLock.holder(layout.lock)
    info: dict[str, Any] = {"root_dir": str(layout.root), "running": pid is not None, "ready": False, "pid": pid}
    reason = ""
    if not layout.root.is_dir():
        reason = f"root directory {layout.root} does not exist"
    elif pid is None:
        reason = f"no eventsrc daemon is running on {layout.root}"
    else:
        try:
            st = json.loads(layout.status.read_text())
        except (OSError, ValueError):
            st = {}
        if st.get("pid") == pid and st.get("ready"):
            info.update(ready=True, instance_id=st.get("instance_id"), version=st.get("version"))
        else:
            reason = f"eventsrc (pid {pid}) holds {layout.root} but is not ready yet"
    if args.output == "json":
        print(json.dumps({**info, "reason": reason}))
    elif not reason:
        print(f"eventsrc is running and ready on {layout.root} (pid {pid}, version {info.get('version')})")
    if reason:
        print(f"eventsrc: {reason}", file=sys.stderr)
        return 1
    return 0


def _open_reader(layout: Layout) -> EventLog:
    return EventLog(layout.require_log(), readonly=True)


def log(args: argparse.Namespace) -> int:
    from eventsrc.cli import render

    event_log = _open_reader(args.layout)
    corrupt: list[CorruptRecordError] = []
    as_json = args.output == "json"
    out = sys.stdout

    def show(item: Any) -> None:
        if isinstance(item, CorruptRecordError):
            corrupt.append(item)
            print(f"eventsrc: error: {item}", file=sys.stderr)
        if as_json:
            out.write(json.dumps(render.record_json(item)) + "\n")
        else:
            out.write(render.record_line(item) + "\n")

    if not as_json:
        out.write(render.RECORD_HEADER + "\n")
    if args.follow:
        import trio

        from eventsrc.log.commit import follow

        async def tail() -> None:
            async for item in follow(event_log, args.from_seq):
                show(item)
                out.flush()

        with contextlib.suppress(KeyboardInterrupt):
            trio.run(tail)
    else:
        for item in event_log.records(args.from_seq, args.until_seq):
            show(item)
    out.flush()
    if corrupt:
        seqs = ", ".join(str(c.seq) for c in corrupt)
        print(f"eventsrc: error: corrupt record(s) at sequence {seqs}; every other record was printed", file=sys.stderr)
        return 1
    return 0


def state(args: argparse.Namespace) -> int:
    from eventsrc.cli import render
    from eventsrc.log.snapshots import load_views

    event_log = _open_reader(args.layout)
    snapdir = args.layout.snapshots if args.use_snapshot else None
    with _progress("replaying", event_log.last_seq()) as advance:
        views, _info = load_views(event_log, snapdir, until_seq=args.until_seq, progress=advance)
    if args.output == "json":
        sys.stdout.write(msgspec.json.encode(views).decode() + "\n")
    else:
        console = Console()
        for table in render.views_tables(views):
            console.print(table)
    if views.meta.corrupt:
        seqs = ", ".join(str(s) for s in sorted(views.meta.corrupt))
        print(f"eventsrc: error: corrupt record(s) at sequence {seqs}; the views hold every other record", file=sys.stderr)
        return 1
    return 0


@contextlib.contextmanager
def _progress(what: str, total: int) -> Iterator[Callable[[int], None] | None]:
    """A progress bar on stderr for long work, when a person is watching."""
    if total < 200_000 or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import Progress

    with Progress(transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task(what, total=total)
        yield lambda seq: bar.update(task, completed=seq)


def bench_log(args: argparse.Namespace) -> int:
    from eventsrc import bench

    if args.events < 1 or args.writers < 1 or args.rounds < 1:
        raise EventsrcError("--events, --writers and --rounds must be at least 1")
    root = args.root_dir if "--root-dir" in " ".join(sys.argv) else None
    bench.run_log_bench(
        events=args.events,
        writers=args.writers,
        seconds=args.seconds,
        rounds=args.rounds,
        snapshot_every=args.snapshot_every,
        workdir=root,
    )
    return 0
