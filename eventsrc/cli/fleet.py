"""``eventsrc fleet``: the fleet's records in PostgreSQL (docs/fleet.md): ``sink`` writes them
from the JetStream stream the nodes ship to; ``usage`` answers as ``audit usage`` does, for
every node at once; ``audit device|pod|claim`` gives each node's own ``audit`` answer."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventsrc.cli.options import Parents, Subparsers, add_output

if TYPE_CHECKING:
    import psycopg

POSTGRES_HELP = "PostgreSQL connection string (default: libpq's PG* environment variables, e.g. PGHOST)"


def add_parser(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "fleet",
        help="the fleet's history in PostgreSQL: the sink from NATS JetStream, and queries",
        description="Every node's log, shipped by 'serve --fleet-nats' to a NATS JetStream stream, written into "
        "PostgreSQL by 'fleet sink' and asked by 'fleet usage' and 'fleet audit' (docs/fleet.md).",
    )
    fsub = p.add_subparsers(dest="what", metavar="WHAT", required=True)
    s = fsub.add_parser(
        "sink",
        help="write the stream's records into PostgreSQL (runs until stopped)",
        description="A durable JetStream consumer (every sink shares it) that stores each record once and the "
        "intervals of device and exclusive CPU holds, made in each node's log order; several may run at once. "
        "Creates and migrates its schema.",
    )
    s.add_argument("--nats", required=True, metavar="URL,...", help="NATS servers (nats://host:port)")
    s.add_argument("--postgres", default="", metavar="DSN", help=POSTGRES_HELP)
    s.add_argument("--stream", default="EVENTSRC", metavar="NAME", help="the stream (default %(default)s)")
    s.add_argument(
        "--replicas",
        type=int,
        default=1,
        choices=range(1, 6),
        metavar="N",
        help="the stream's replicas if this sink creates it (default 1; 3 in a three-server cluster)",
    )
    s.add_argument(
        "--metrics-address",
        default="",
        metavar="HOST:PORT",
        help="serve /metrics (records stored, messages quarantined by reason, the database's refusals) and "
        "/healthz there (default: none)",
    )
    s.add_argument(
        "--nats-user",
        default="",
        metavar="NAME",
        help="the NATS user the sink connects as (needs --nats-password-file; default: no credentials)",
    )
    s.add_argument(
        "--nats-password-file",
        default=None,
        type=Path,
        metavar="FILE",
        help="the file holding the NATS user's password (docs/fleet.md, 'NATS permissions')",
    )
    s.set_defaults(func=sink)
    u = fsub.add_parser(
        "usage",
        help="device-hours and exclusive CPU-hours across the fleet, as 'audit usage' gives them for one node",
        description="How long devices and exclusive CPUs were held on every node the sink has records of, "
        "exact to the nanosecond, with the meaning, times and output of 'eventsrc audit usage'.",
    )
    u.add_argument("--postgres", default="", metavar="DSN", help=POSTGRES_HELP)
    u.add_argument("--resource", action="append", metavar="R", help="only this resource (repeatable; 'cpu')")
    u.add_argument(
        "--by",
        choices=["namespace", "node", "pod", "device", "resource"],
        default="namespace",
        help="group by namespace, node, pod, device or resource (default %(default)s); node and device "
        "rows name their node first",
    )
    u.add_argument("--since", default=None, metavar="TIME", help="from TIME (RFC 3339)")
    u.add_argument("--until", default=None, metavar="TIME", help="up to TIME (RFC 3339; default now)")
    add_output(u, ("table", "json", "csv"))
    u.set_defaults(func=usage)
    _add_audit(fsub)


def _add_audit(fsub: Any) -> None:
    a = fsub.add_parser(
        "audit",
        help="who held a device and when, a pod's or a claim's history, on every node ('audit', from PostgreSQL)",
        description="Each node's own answer to 'eventsrc audit device|pod|claim', made by the node's code from "
        "the records the sink stored (their index is kept by the sink): one answer per node (and log) that has "
        "the device, pod or claim, each naming its node. JSON: an array of the node's answers, each with "
        "'node' and 'log_id' first. Nothing found is one line on stderr and exit 1.",
    )
    asub = a.add_subparsers(dest="audit", metavar="WHAT", required=True)
    d = asub.add_parser(
        "device",
        help="a device's timeline on each node that has it: health changes and every holder",
        description="As 'eventsrc audit device' on each node that has the device (a device id is a node's "
        "own: each node's answer is its own). A SEQ in --since/--until is each node's own sequence.",
    )
    d.add_argument("resource", metavar="RESOURCE", help="the extended resource name, e.g. example.com/gpu")
    d.add_argument("device_id", metavar="DEVICE_ID", help="the device id as its plugin lists it")
    d.add_argument("--since", default=None, metavar="SEQ|TIME", help="from record SEQ, or from TIME (RFC 3339)")
    d.add_argument("--until", default=None, metavar="SEQ|TIME", help="up to record SEQ, or up to TIME (RFC 3339)")
    p = asub.add_parser(
        "pod",
        help="everything a pod asked for, got, was refused and released, on each node it was on",
        description="As 'eventsrc audit pod' on each node whose records name the pod. NAMESPACE/NAME names, on "
        "each node, the newest pod with that name there (each answer says which uid).",
    )
    p.add_argument("pod", metavar="UID|NAMESPACE/NAME")
    c = asub.add_parser(
        "claim",
        help="a DRA claim's prepare/unprepare lifecycle, pods, CDI devices and errors, on each node",
        description="As 'eventsrc audit claim' on each node whose records name the claim.",
    )
    c.add_argument("claim", metavar="UID")
    for q in (d, p, c):
        q.add_argument("--node", default="", metavar="NAME", help="only this node's answer")
        q.add_argument("--postgres", default="", metavar="DSN", help=POSTGRES_HELP)
        add_output(q)
        q.set_defaults(func=audit)


def _connect(dsn: str) -> psycopg.Connection[Any]:
    import psycopg

    from eventsrc.errors import EventsrcError, first_line

    try:
        return psycopg.connect(dsn, autocommit=True)
    except psycopg.Error as exc:
        raise EventsrcError(f"cannot connect to PostgreSQL: {first_line(exc)}") from None


def sink(args: argparse.Namespace) -> int:
    import trio

    from eventsrc.errors import EventsrcError
    from eventsrc.fleet.sink import SinkMetrics, run_sink
    from eventsrc.inputs.config import parse_list
    from eventsrc.obs.metrics import HealthApp, check_address, serve_http
    from eventsrc.rpc.jetstream import NatsAuth

    servers = parse_list(args.nats)
    if bool(args.nats_user) != (args.nats_password_file is not None):
        raise EventsrcError("--nats-user and --nats-password-file go together")
    auth = NatsAuth.read(args.nats_user, args.nats_password_file, "--nats-password-file") if args.nats_user else None
    if args.metrics_address:
        check_address(args.metrics_address)
    metrics = SinkMetrics()
    failed: list[EventsrcError] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            if args.metrics_address:
                app = HealthApp(metrics, live=lambda: "", ready=lambda: "")
                await nursery.start(serve_http, app, args.metrics_address)
            try:
                await run_sink(servers, args.postgres, args.stream, replicas=args.replicas, metrics=metrics, auth=auth)
            except EventsrcError as exc:  # one line, out of the nursery (not in an exception group)
                failed.append(exc)
            nursery.cancel_scope.cancel()

    trio.run(main)
    if failed:
        raise failed[0]
    return 0


def usage(args: argparse.Namespace) -> int:
    from eventsrc.fleet.queries import FLEET_FIELDS, usage_totals
    from eventsrc.offline.usage import parse_window, render

    w = parse_window(args.since, args.until, time.time_ns())
    import psycopg

    from eventsrc.errors import EventsrcError

    with _connect(args.postgres) as conn:
        try:
            rows = usage_totals(conn, args.by, w, frozenset(args.resource or ()))
        except psycopg.errors.UndefinedTable:
            raise EventsrcError("this database has no fleet tables: 'eventsrc fleet sink' makes them") from None
    render(rows, args.by, w, args.output, sys.stdout, FLEET_FIELDS.get(args.by))
    return 0


def audit(args: argparse.Namespace) -> int:
    """fleet audit device|pod|claim: each node's answer, printed as the node prints it."""
    from eventsrc.fleet.fleet_audit import answers, answers_json
    from eventsrc.offline import audit_render
    from eventsrc.offline.audit_queries import DeviceTimeline, PodHistory
    from eventsrc.offline.render import text_lines

    with _connect(args.postgres) as conn:
        found = answers(conn, args.audit, args)
    if args.output == "json":
        sys.stdout.buffer.write(answers_json(found))
    else:
        lines: list[str] = []
        for a in found:
            answer = a.answer
            if isinstance(answer, DeviceTimeline):
                body = audit_render.device_lines(answer)
            elif isinstance(answer, PodHistory):
                body = audit_render.pod_lines(answer)
            else:
                body = audit_render.claim_lines(answer)
            if answer.log is not None:
                body.insert(1, "the fleet lacks " + "; ".join(answer.log.missing))
            lines += [*([""] if lines else []), f"node {a.node} (log {a.log_id})", *body]
        sys.stdout.write(text_lines(lines) + "\n")
    sys.stdout.flush()
    corrupt = sorted({s for a in found for s in a.answer.corrupt})
    if corrupt:
        seqs = ", ".join(str(s) for s in corrupt)
        print(
            f"eventsrc: error: corrupt record(s) at sequence {seqs}; the answer holds every other record",
            file=sys.stderr,
        )
        return 1
    return 0
