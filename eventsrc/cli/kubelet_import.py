"""``eventsrc import-kubelet``: the kubelet's checkpoint files appended to the log as events,
to move a node from the kubelet without draining it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventsrc.cli.options import Parents, Subparsers, add_output
from eventsrc.errors import EventsrcError
from eventsrc.layout import Layout

if TYPE_CHECKING:
    from eventsrc import events as ev
    from eventsrc.inputs import kubelet_checkpoints as ki


def add_parser(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "import-kubelet",
        parents=[parents.root],
        help="import the kubelet's checkpoint files into the log (migration without draining)",
        description="Read the kubelet's checkpoint files (device manager, CPU manager, DRA manager), verify "
        "their checksums as the kubelet does (a mismatch is reported, never guessed around), and append the "
        "events that reproduce their state in one append with one correlation id. Refused while a daemon "
        "runs on --root-dir, and when the log already has pods (unless --force). The checkpoints record no "
        "pod names or namespaces: imported pods have none.",
    )
    p.add_argument(
        "--device-checkpoint",
        type=Path,
        default=None,
        metavar="FILE",
        help="the device manager's kubelet_internal_checkpoint",
    )
    p.add_argument("--cpu-state", type=Path, default=None, metavar="FILE", help="the CPU manager's cpu_manager_state")
    p.add_argument("--dra-state", type=Path, default=None, metavar="FILE", help="the DRA manager's dra_manager_state")
    p.add_argument("--dry-run", action="store_true", help="print the events without writing anything")
    p.add_argument("--force", action="store_true", help="import even when the log already has pods")
    add_output(p)
    p.set_defaults(func=import_kubelet)


def import_kubelet(args: argparse.Namespace) -> int:
    import uuid

    from eventsrc.inputs import kubelet_checkpoints as ki

    if args.device_checkpoint is None and args.cpu_state is None and args.dra_state is None:
        raise EventsrcError("nothing to import: give --device-checkpoint, --cpu-state and/or --dra-state")
    try:  # every checksum is verified before anything is written
        device = ki.read_device_checkpoint(args.device_checkpoint) if args.device_checkpoint else None
        cpu = ki.read_cpu_state(args.cpu_state) if args.cpu_state else None
        dra = ki.read_dra_state(args.dra_state) if args.dra_state else None
        events = ki.events_from(device, cpu, dra)  # also refuses what cannot be imported, before any write
    except ki.CheckpointError as err:
        raise ki.CheckpointError(f"{err}; nothing was imported") from None
    warnings = []
    if cpu is not None and not cpu.verified:
        warnings.append(f"{cpu.source}: checksum 0, accepted unverified (as the kubelet does)")
    cid = uuid.uuid4().hex
    seqs = (0, 0)
    if not args.dry_run:
        events, seqs = _append(args.layout, events, cid, args.force, (device, cpu, dra))
    sources = [str(s.source) for s in (device, cpu, dra) if s is not None]
    if args.output == "json":
        _print_json(args, events, sources, warnings, cid, seqs)
    else:
        _print_table(args, events, warnings, cid, seqs)
    return 0


def _append(
    layout: Layout,
    events: list[ev.EventBase],
    cid: str,
    force: bool,
    checkpoints: tuple[ki.DeviceCheckpoint | None, ki.CPUCheckpoint | None, ki.DRACheckpoint | None],
) -> tuple[list[ev.EventBase], tuple[int, int]]:
    """Append the events under ``layout`` with one correlation id, holding the root's lock;
    refused while a daemon runs there, or when the log has pods (unless ``force``). Returns
    the events appended and their first and last sequence."""
    import time

    from eventsrc.errors import AlreadyRunningError
    from eventsrc.inputs import kubelet_checkpoints as ki
    from eventsrc.log.snapshots import load_views
    from eventsrc.log.store import DirLock, EventLog
    from eventsrc.state.lifecycles import ADMITTED, ADMITTING

    layout.create()
    lock = DirLock(layout.lock)
    try:
        lock.acquire()
    except AlreadyRunningError:
        pid = DirLock.holder(layout.lock)
        raise EventsrcError(
            f"eventsrc (pid {pid}) is running on {layout.root}: stop it before importing kubelet checkpoints; "
            "nothing was imported"
        ) from None
    try:
        with EventLog(layout.log) as event_log:
            views, _ = load_views(event_log, layout.snapshots)
            live = [u for u, p in views.pods.pods.items() if p.state in (ADMITTED, ADMITTING)]
            if live and not force:
                raise EventsrcError(
                    f"the log under {layout.root} already has {len(live)} pod(s); importing would duplicate "
                    "or contradict them (use --force to import anyway); nothing was imported"
                )
            if views.cpus.policy:  # the policy the import replaces, as PolicyConfigurationChanged.old
                events = ki.events_from(*checkpoints, old_cpu_policy=views.cpus.policy)
            records = event_log.append(events, cid, time.time_ns())
    finally:
        lock.release()
    return events, ((records[0].seq, records[-1].seq) if records else (0, 0))


def _print_json(
    args: argparse.Namespace,
    events: list[ev.EventBase],
    sources: list[str],
    warnings: list[str],
    cid: str,
    seqs: tuple[int, int],
) -> None:
    import msgspec

    from eventsrc.inputs import kubelet_checkpoints as ki

    out: dict[str, Any] = {
        "dry_run": args.dry_run,
        "root_dir": str(args.layout.root),
        "files": sources,
        "correlation_id": "" if args.dry_run else cid,
        "first_seq": seqs[0],
        "last_seq": seqs[1],
        "summary": msgspec.to_builtins(ki.summarize(events)),
        "warnings": warnings,
    }
    if args.dry_run:
        out["events"] = [{"type": type(e).__name__, "event": msgspec.to_builtins(e)} for e in events]
    print(json.dumps(out))


def _print_table(
    args: argparse.Namespace, events: list[ev.EventBase], warnings: list[str], cid: str, seqs: tuple[int, int]
) -> None:
    from eventsrc.events import Record
    from eventsrc.inputs import kubelet_checkpoints as ki
    from eventsrc.offline import render

    for w in warnings:
        print(f"eventsrc: warning: {w}", file=sys.stderr)
    if args.dry_run:
        print(f"{'TYPE':<26}  EVENT")
        for e in events:
            record = Record(0, 0, "", e.VERSION, e)  # type: ignore[arg-type]
            print(f"{type(e).__name__:<26}  {render.record_summary(record)}")
    s = ki.summarize(events)
    verb = "would import" if args.dry_run else f"imported into {args.layout.root}"
    print(
        f"{verb}: {s.pods} pods ({s.containers} containers), {s.resources} device resources with "
        f"{s.devices} healthy devices, {s.device_allocations} device allocations, {s.cpu_assignments} CPU "
        f"assignments (policy {s.cpu_policy or '-'}), {s.claims} claims; {s.events} events"
        + (f" (sequences {seqs[0]}-{seqs[1]}, correlation id {cid})" if seqs[0] else "")
    )
