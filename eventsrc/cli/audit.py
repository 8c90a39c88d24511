"""``eventsrc audit``: who held a device and when, a pod's or a claim's history (from the log's
index), and ``audit verify`` (the hash chain)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from eventsrc.cli.options import Parents, Subparsers, add_live_only, add_output, open_history, open_reader

if TYPE_CHECKING:
    from eventsrc.log.archive import ArchiveFinding
    from eventsrc.log.store import EventLog


def add_parser(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "audit",
        parents=[parents.root],
        help="who held a device and when, a pod's or a claim's history (from the log's index)",
        description="Audit queries answered from the log's secondary index (no scan), read-only: the daemon "
        "may run. After retention cuts the archive segments are read too (scanned: they have no index), unless "
        "--live-only. An unknown device, pod or claim is one line on stderr and exit 1.",
    )
    asub = p.add_subparsers(dest="audit", metavar="WHAT", required=True)
    a = asub.add_parser(
        "device",
        parents=[parents.root],
        help="a device's timeline: health changes and every holder",
        description="The device's timeline: listed/removed by its plugin, health changes, and each holder (pod "
        "namespace/name/uid, container, from, until or 'still held', why released), with times and sequences. "
        "With --since/--until, what overlaps that window (a holding released after --until is still held).",
    )
    a.add_argument("resource", metavar="RESOURCE", help="the extended resource name, e.g. example.com/gpu")
    a.add_argument("device_id", metavar="DEVICE_ID", help="the device id as its plugin lists it")
    a.add_argument(
        "--since",
        default=None,
        metavar="SEQ|TIME",
        help="from record SEQ, or from TIME (RFC 3339, e.g. 2026-11-21T23:40:00Z)",
    )
    a.add_argument("--until", default=None, metavar="SEQ|TIME", help="up to record SEQ, or up to TIME (RFC 3339)")
    add_live_only(a)
    add_output(a)
    a.set_defaults(func=query)
    a = asub.add_parser(
        "pod",
        parents=[parents.root],
        help="everything a pod asked for, got, was refused and released",
        description="Everything the pod asked for (containers and requests), got (devices with the plugin's "
        "response, exclusive CPUs, claims), was refused (reason, topology hint) and released, each with its time "
        "and sequence. NAMESPACE/NAME names the newest pod with that name (the answer says which uid).",
    )
    a.add_argument("pod", metavar="UID|NAMESPACE/NAME")
    add_live_only(a)
    add_output(a)
    a.set_defaults(func=query)
    a = asub.add_parser(
        "claim",
        parents=[parents.root],
        help="a DRA claim's prepare/unprepare lifecycle, pods, CDI devices and errors",
        description="The claim's prepare/unprepare lifecycle with times, the pods that referenced it, its CDI "
        "devices and the driver's errors.",
    )
    a.add_argument("claim", metavar="UID")
    add_live_only(a)
    add_output(a)
    a.set_defaults(func=query)
    a = asub.add_parser(
        "usage",
        parents=[parents.root],
        help="device-hours and exclusive CPU-hours per namespace, pod, device or resource (chargeback)",
        description="How long devices and exclusive CPUs were held, exact to the nanosecond, from the intervals in "
        "the log (archive included): eventsrc's own allocations (DevicesAllocated to the release, CPUsAssigned to "
        "CPUsReleased) and those observed beside a kubelet (Kubelet*Observed to Kubelet*Released or "
        "KubeletPodReleased; a DRA claim's devices count under their driver as pool/device). Holds are clipped "
        "to the window; one still open counts up to --until, or to now. Groups are always split by resource "
        "(the pseudo-resource of exclusive CPUs is 'cpu'). Memory and hugepages (eventsrc's memory manager's, "
        "MemoryAssigned to MemoryReleased, and those observed beside a kubelet) "
        "(resources 'memory', 'hugepages-2Mi', 'hugepages-1Gi'; the device is the NUMA nodes) count in "
        "byte-seconds and byte-hours (measure byte-seconds): the bytes a container held times how long. "
        "Exact covers what eventsrc saw: each row also "
        "gives the seconds that fell inside a gap (ObservationGapFound: eventsrc not running, the kubelet or the "
        "runtime not seen; their union, clipped to the window) as not seen, because a hold whose release was "
        "recorded after such a gap may have ended at any moment of it (JSON seconds_seen and seconds_in_gaps; "
        "the table's and CSV's SEEN says all, partly or none, IN_GAPS how much). Answered from the usage index "
        "under eventsrc/usage, kept current by the daemon and brought up to date by each query.",
    )
    a.add_argument(
        "--resource",
        action="append",
        metavar="R",
        help="only this resource (repeatable; default all; 'cpu' for exclusive CPUs, 'memory' or "
        "'hugepages-2Mi' for memory in byte-hours)",
    )
    a.add_argument(
        "--by",
        choices=["namespace", "pod", "device", "resource"],
        default="namespace",
        help="group by (default %(default)s)",
    )
    a.add_argument("--since", default=None, metavar="TIME", help="from TIME (RFC 3339, e.g. 2026-11-01T00:00:00Z)")
    a.add_argument("--until", default=None, metavar="TIME", help="up to TIME (RFC 3339; default now)")
    a.add_argument(
        "--scan",
        action="store_true",
        help="answer from a scan of every record, not the usage index (slow; the same answer)",
    )
    add_output(a, ("table", "json", "csv"))
    a.set_defaults(func=usage)
    a = asub.add_parser(
        "verify",
        parents=[parents.root],
        help="check the hash chain: name the first record altered, removed or reordered",
        description="Walk the log and check every record's checksum and its link to the record before it (the "
        "hash chain), and the anchor over records written before the chain existed. Names each record that was "
        "altered, removed or reordered; exit 1 if any. After retention cuts (docs/adr/0018) the live log is "
        "checked from its base, and each archive segment the log's ledger names is checked on its own and "
        "against its neighbours: a segment missing, altered, or not in the ledger is named too.",
    )
    a.add_argument(
        "--live-only",
        action="store_true",
        help="check the live log only, not the archive segments (for an archive moved elsewhere)",
    )
    add_output(a)
    a.set_defaults(func=verify)


def query(args: argparse.Namespace) -> int:
    """audit device, pod or claim: a query of the index (and of the archive, unless --live-only)."""
    from eventsrc.offline import audit_render

    return audit_render.run(args, open_history(args.layout, args.live_only))


def usage(args: argparse.Namespace) -> int:
    """audit usage: from the usage index, brought up to date first (docs/adr/0026)."""
    from eventsrc.log.usage_index import reading
    from eventsrc.offline import usage as queries

    # the log is opened (and closed) by the index's catch-up, a piece of the history at a time
    log_dir = args.layout.require_log()
    return queries.run(args, lambda: reading(log_dir, args.layout.archive), args.layout.usage)


def _check_base_views(log: EventLog) -> list[ArchiveFinding]:
    """The views kept at the live log's base must decode (every start begins from them)."""
    from eventsrc.errors import EventsrcError
    from eventsrc.log.archive import ArchiveFinding
    from eventsrc.log.snapshots import base_views

    try:
        base_views(log, log.log_id())
    except EventsrcError as err:
        return [ArchiveFinding("altered", str(err))]
    return []


def verify(args: argparse.Namespace) -> int:
    from eventsrc.errors import LogCutWhileReadingError
    from eventsrc.log.archive import ArchiveFinding, verify_archive
    from eventsrc.log.verify import verify
    from eventsrc.offline.render import escape

    log = open_reader(args.layout)
    # A cut by the running daemon while this reads moves the base: check again from the top.
    for attempt in range(5):
        base = log.base()
        try:
            checked, findings = verify(log)
        except LogCutWhileReadingError:
            if attempt == 4:
                raise
            continue
        segments, archived = 0, list[ArchiveFinding]()
        if base is not None and not args.live_only:
            segments, archived = verify_archive(args.layout.archive, log.ledger(), base.seq, base.hash, log.log_id())
            archived += _check_base_views(log)
        if log.base() == base:
            break
    problems = [f.message for f in findings] + [a.message for a in archived if a.what != "pending"]
    if args.output == "json":
        print(
            json.dumps(
                {
                    "checked": checked,
                    "first_seq": log.first_seq(),
                    "findings": [f.__dict__ for f in findings],
                    "segments": segments,
                    "archive_findings": [a.__dict__ for a in archived],
                }
            )
        )
    else:
        for f in findings:
            print(escape(f"{f.seq:>8}  {f.what:<10} {f.message}"))
        for a in archived:
            print(escape(f"{'archive':>8}  {a.what:<10} {a.message}"))
        if not findings:
            start = f" (the live log starts at {log.first_seq()})" if base is not None else ""
            print(f"{checked} records checked{start}: the chain holds")
        if base is not None and not archived and not args.live_only:
            print(f"{segments} archive segments checked: records 1..{base.seq} chain into the live log")
    if problems:
        print(f"eventsrc: error: {escape(problems[0])}", file=sys.stderr)
        return 1
    return 0
