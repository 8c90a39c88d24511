"""``eventsrc fleet``: the fleet's records in PostgreSQL (docs/fleet.md): ``sink`` writes them
from the JetStream stream the nodes ship to; ``usage`` answers as ``audit usage`` does, for
every node at once."""

from __future__ import annotations

import argparse
import sys
import time
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
        "PostgreSQL by 'fleet sink' and asked by 'fleet usage' (docs/fleet.md).",
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
    s.set_defaults(func=sink)
    u = fsub.add_parser(
        "usage",
        help="device-hours and exclusive CPU-hours across the fleet, as 'audit usage' gives them for one node",
        description="How long devices and exclusive CPUs were held on every node the sink has records of, "
        "exact to the nanosecond, with the meaning, times and output of 'eventsrc audit usage'.",
    )
    u.add_argument("--postgres", default="", metavar="DSN", help=POSTGRES_HELP)
    u.add_argument("--resource", action="append", metavar="R", help="only this resource (repeatable; 'cpu')")
    u.add_argument("--by", choices=["namespace", "pod", "device", "resource"], default="namespace")
    u.add_argument("--since", default=None, metavar="TIME", help="from TIME (RFC 3339)")
    u.add_argument("--until", default=None, metavar="TIME", help="up to TIME (RFC 3339; default now)")
    add_output(u, ("table", "json", "csv"))
    u.set_defaults(func=usage)


def _connect(dsn: str) -> psycopg.Connection[Any]:
    import psycopg

    from eventsrc.errors import EventsrcError
    from eventsrc.fleet.sink import first_line

    try:
        return psycopg.connect(dsn, autocommit=True)
    except psycopg.Error as exc:
        raise EventsrcError(f"cannot connect to PostgreSQL: {first_line(exc)}") from None


def sink(args: argparse.Namespace) -> int:
    import trio

    from eventsrc.fleet.sink import run_sink
    from eventsrc.inputs.config import parse_list

    servers = parse_list(args.nats)
    trio.run(lambda: run_sink(servers, args.postgres, args.stream))
    return 0


def usage(args: argparse.Namespace) -> int:
    from eventsrc.fleet.sink import usage_totals
    from eventsrc.offline.usage import parse_window, render

    w = parse_window(args.since, args.until, time.time_ns())
    import psycopg

    from eventsrc.errors import EventsrcError

    with _connect(args.postgres) as conn:
        try:
            rows = usage_totals(conn, args.by, w, frozenset(args.resource or ()))
        except psycopg.errors.UndefinedTable:
            raise EventsrcError("this database has no fleet tables: 'eventsrc fleet sink' makes them") from None
    render(rows, args.by, w, args.output, sys.stdout)
    return 0
