"""``eventsrc bench fleet``'s queries: the fleet's tables at fleet scale, and its queries' latency.

Loading ``scale_nodes`` × ``days`` through JetStream and the sink would take hours on one
machine. So the tables the queries read are loaded directly, with COPY, from each node's
generated records (``usage_timing.pods``, ``pods_per_day`` pods a day, 10 minutes to 12 hours
each), into the tables the sink's migration makes, its indexes there, each row made by the
sink's own code:

- ``holds``, of every node: the records fed through ``chargeback.intervals`` (the Tracker the
  sink makes its rows with), and ``usage_hours`` made from them (``rebuild_usage_hours``, what
  the sink adds as the holds end);
- ``records`` and ``audit_index``, of ``records_nodes`` of the nodes, spread evenly (all of them
  at the defaults; 100 of 1,000 with ``--scale-nodes 1000``, which would take too long here
  otherwise): each record stored as the node's log stores it (``events.encode_payload``, each
  carrying the hash of the one before), its row made by ``sink.record_row`` and its index rows
  by ``sink.index_rows`` (``log.index.keys_for``). A node's lookup reads that node's history, as
  at full scale; the B-trees are those of the loaded part.

Then, each the median of ``runs``, as the command runs it (a new connection, the answer, JSON to
a buffer): ``fleet usage`` for each ``--by`` (``sink.usage_totals``), and ``fleet audit device``
(one node's GPU with ``--node``, and without it: a GPU's id, which one node holds as a UUID is,
and a VF's, which every node has) and ``fleet audit pod``
(``fleet_audit.answers``).
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import takewhile
from typing import Any, TextIO

import psycopg
from psycopg import sql

from eventsrc import events as ev
from eventsrc.bench.usage_timing import DAY, GPU, NIC, SEC, pods
from eventsrc.core.chargeback import Change, Window, intervals, window
from eventsrc.events import chain_hash, decode_record, encode_payload
from eventsrc.fleet.fleet_audit import answers, answers_json
from eventsrc.fleet.queries import FLEET_FIELDS, usage_totals
from eventsrc.fleet.rows import RECORD_COLUMNS, index_rows, record_row
from eventsrc.fleet.tables import migrate, rebuild_usage_hours
from eventsrc.offline.render import iso
from eventsrc.offline.usage import render

DATABASE = "fleet_scale"
PODS_PER_DAY = 48.0  # the nodes' pods arrive every 30 minutes of their logs' time


@dataclass(frozen=True)
class Options:
    """What ``eventsrc bench fleet`` was asked for (the flags)."""

    nodes: int = 20
    records: int = 200
    paced_seconds: float = 20.0
    rate: float | None = None  # records/s of each node while paced (None: half the sink's, shared)
    repeats: int = 3
    ceiling_messages: int = 2000
    scale_nodes: int = 100
    records_nodes: int = 100  # of the scale's nodes, those whose records and audit index are loaded
    days: int = 30
    pods_per_day: float = PODS_PER_DAY
    runs: int = 5
    new_process: bool = True  # also time ``eventsrc fleet usage`` as a command, once
    catch_up: int = 2000  # records each node appends while the sink is stopped (the catch-up's backlog)
    keep: bool = False  # keep the bench's directory (the sink's output, the nodes' logs, nats-server's)


END_NS = 1_794_960_000 * SEC  # 2026-11-18T00:00:00Z: the end of the loaded history ("now")
HOLD_COLUMNS = "node, log_id, resource, device, namespace, name, uid, start_ns, end_ns"
INDEX_COLUMNS = "key, node, log_id, seq"


@dataclass
class Query:
    label: str
    rows: int  # rows of the answer
    seconds: float  # median


@dataclass
class Scale:
    nodes: int = 0
    days: int = 0
    pods: int = 0
    records: int = 0  # the records the holds were made from
    holds: int = 0
    load_seconds: float = 0.0
    table_mb: float = 0.0
    index_mb: float = 0.0
    records_nodes: int = 0  # the nodes whose records and audit index were loaded
    records_loaded: int = 0
    index_rows: int = 0
    records_seconds: float = 0.0  # of load_seconds, making and loading records and audit_index
    records_mb: float = 0.0  # records and audit_index, tables
    records_index_mb: float = 0.0  # and their indexes
    hours_seconds: float = 0.0  # of load_seconds, making usage_hours from the holds
    queries: list[Query] = field(default_factory=list)
    new_process: float = 0.0  # ``eventsrc fleet usage`` in a new process, s


def hold_values(c: Change) -> tuple[Any, ...]:
    """A change's columns of ``holds`` after node and log id, as the sink writes them."""
    h = c.hold
    return (h.resource, h.device, h.namespace, h.name, h.uid, h.start_ns, c.end_ns)


def copy(cur: psycopg.Cursor[Any], table: str, columns: str, rows: Iterable[tuple[Any, ...]]) -> None:
    """``rows`` into ``table`` with one COPY."""
    with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(sql.Identifier(table), sql.SQL(columns))) as cp:
        for row in rows:
            cp.write_row(row)


def _say(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


def audited(o: Options) -> list[int]:
    """The nodes whose records and audit index are loaded: ``records_nodes`` of them, spread evenly."""
    step = max(1, o.scale_nodes // o.records_nodes)
    return list(range(0, o.scale_nodes, step))[: o.records_nodes]


def run(dsn: str, o: Options, out: TextIO) -> Scale:
    scale = Scale(nodes=o.scale_nodes, days=o.days)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    db = psycopg.conninfo.make_conninfo(dsn, dbname=DATABASE)
    nodes = audited(o)
    part = "every node" if len(nodes) == o.scale_nodes else f"{len(nodes):,} of the nodes, one in {nodes[1] - nodes[0]}"
    _say(
        out,
        f"\nqueries: {o.scale_nodes:,} nodes × {o.days} days, {o.pods_per_day:g} pods a node a day (10 min to 12 h "
        "each), loaded directly (COPY of the sink's own rows, not through JetStream and the sink): holds of "
        f"every node; records and audit_index of {part}",
    )
    _load(db, o, scale, set(nodes), out)
    _queries(db, o, scale, nodes[len(nodes) // 2], out)
    return scale


def _node_records(i: int, o: Options, counts: list[int]) -> list[tuple[int, ev.EventBase]]:
    """Node ``i``'s records (time, event) over the days before ``END_NS``, in log order."""
    start = END_NS - o.days * DAY
    arrivals = pods(10_000 + i, start, 86_400 / o.pods_per_day, prefix=f"{i:04d}-", gpu_prefix=f"GPU-{i:04d}-")
    out: list[tuple[int, ev.EventBase]] = []
    for ts, events in takewhile(lambda te: te[0] < END_NS, arrivals):
        counts[0] += isinstance(events[0], (ev.PodAdmissionStarted, ev.KubeletPodObserved))
        out += [(ts, e) for e in events]
    counts[1] += len(out)
    return out


def stored_values(records: Iterable[tuple[int, ev.EventBase]]) -> Iterator[bytes]:
    """Each record's value as the node's log stores it: CRC and envelope, carrying the hash of
    the value before it (``events.encode_payload``, as ``EventLog`` appends)."""
    prev = b""
    for ts, e in records:
        value = encode_payload(e, ts, "bench", prev)
        prev = chain_hash(value)
        yield value


def _load_records(cur: psycopg.Cursor[Any], name: str, log_id: str, records: list[Any], scale: Scale) -> None:
    """One node's ``records``, ``audit_index`` and ``node_logs`` rows, made by the sink's code."""
    values = list(stored_values(records))
    copy(cur, "records", RECORD_COLUMNS, (record_row(name, log_id, seq, seq - 1, v) for seq, v in enumerate(values, 1)))
    keys = [row for seq, v in enumerate(values, 1) for row in index_rows(name, log_id, decode_record(seq, v))]
    copy(cur, "audit_index", INDEX_COLUMNS, keys)
    cur.execute("INSERT INTO node_logs (node, log_id, applied_seq) VALUES (%s, %s, %s)", (name, log_id, len(values)))
    scale.records_loaded += len(values)
    scale.index_rows += len(keys)


def _load(db: str, o: Options, scale: Scale, loaded: set[int], out: TextIO) -> None:
    counts = [0, 0]  # pods, records
    t = time.perf_counter()
    said = t
    with psycopg.connect(db, autocommit=True) as conn:
        migrate(conn)
        with conn.transaction(), conn.cursor() as cur:
            for i in range(o.scale_nodes):
                name, log_id = f"node-{i:04d}", f"{i:032x}"
                records = _node_records(i, o, counts)
                holds = [(name, log_id, *hold_values(c)) for c in intervals(records)]
                copy(cur, "holds", HOLD_COLUMNS, holds)
                scale.holds += len(holds)
                if i in loaded:
                    t_records = time.perf_counter()
                    _load_records(cur, name, log_id, records, scale)
                    scale.records_nodes += 1
                    scale.records_seconds += time.perf_counter() - t_records
                if time.perf_counter() - said > 10:
                    _say(
                        out,
                        f"  ... {i + 1:,} of {o.scale_nodes:,} nodes, {scale.holds:,} holds, "
                        f"{scale.records_loaded:,} records",
                    )
                    said = time.perf_counter()
        t_hours = time.perf_counter()
        rebuild_usage_hours(conn)  # the sink keeps it as it writes the holds; they were loaded directly
        scale.hours_seconds = time.perf_counter() - t_hours
        conn.execute("VACUUM ANALYZE holds, records, audit_index, node_logs, usage_hours")
        sizes = conn.execute(
            "SELECT pg_table_size('holds'), pg_indexes_size('holds'), "
            "pg_table_size('records') + pg_table_size('audit_index'), "
            "pg_indexes_size('records') + pg_indexes_size('audit_index')"
        ).fetchone() or (0, 0, 0, 0)
    scale.load_seconds = time.perf_counter() - t
    scale.pods, scale.records = counts
    scale.table_mb, scale.index_mb, scale.records_mb, scale.records_index_mb = (x / 1e6 for x in sizes)
    _say(
        out,
        f"  loaded in {scale.load_seconds:.1f} s, with VACUUM ANALYZE: {scale.holds:,} holds of {scale.pods:,} pods "
        f"(made from {scale.records:,} records; table {scale.table_mb:,.0f} MB, indexes {scale.index_mb:,.0f} MB); "
        f"{scale.records_loaded:,} records and {scale.index_rows:,} audit_index rows of {scale.records_nodes:,} "
        f"nodes ({scale.records_seconds:.1f} s of it; tables {scale.records_mb:,.0f} MB, indexes "
        f"{scale.records_index_mb:,.0f} MB); usage_hours made from the holds in {scale.hours_seconds:.1f} s",
    )


def _timed(fn: Callable[[], int], runs: int) -> tuple[int, float]:
    """The answer's rows and the median seconds of ``runs`` calls."""
    times, rows = [], 0
    for _ in range(runs):
        t = time.perf_counter()
        rows = fn()
        times.append(time.perf_counter() - t)
    return rows, statistics.median(times)


def _usage(db: str, by: str, w: Window, resources: frozenset[str]) -> Callable[[], int]:
    """``fleet usage`` as the command answers it: connect, select, total, render as JSON."""

    def run() -> int:
        with psycopg.connect(db, autocommit=True) as conn:
            rows = usage_totals(conn, by, w, resources)
        render(rows, by, w, "json", io.StringIO(), FLEET_FIELDS.get(by))
        return len(rows)

    return run


def _audit(db: str, what: str, **fields: str) -> Callable[[], int]:
    """``fleet audit device|pod`` as the command answers it: connect, each node's answer, JSON."""
    args = argparse.Namespace(**({"node": "", "since": None, "until": None} | fields))

    def run() -> int:
        with psycopg.connect(db, autocommit=True) as conn:
            found = answers(conn, what, args)
        io.BytesIO().write(answers_json(found))
        return len(found)

    return run


def _queries(db: str, o: Options, scale: Scale, i: int, out: TextIO) -> None:
    """The queries; the audited ones of node ``i``, whose records are loaded."""
    now = END_NS
    month = window(now - o.days * DAY, None, now)
    day = window(now - DAY, None, now)
    at = now - o.days * DAY // 2
    node = f"node-{i:04d}"
    n = int(o.pods_per_day * o.days) // 2 // 5 * 5 + 1  # not a fifth: those are observed, without a uid
    pod = f"uid-{i:04d}-{n:08d}"
    gpu = frozenset({GPU})
    with psycopg.connect(db) as conn:  # a GPU of that node held at T
        held = conn.execute(
            "SELECT device FROM holds WHERE node = %s AND resource = %s AND start_ns <= %s AND end_ns > %s "
            "ORDER BY device LIMIT 1",
            (node, GPU, at, at),
        ).fetchone()
    gpu_id = held[0] if held else f"GPU-{i:04d}-gpu-63"
    with psycopg.connect(db) as conn:  # a VF of that node held at T: its id is on every node
        vf = conn.execute(
            "SELECT device FROM holds WHERE node = %s AND resource = %s AND start_ns <= %s AND end_ns > %s "
            "ORDER BY device LIMIT 1",
            (node, NIC, at, at),
        ).fetchone()
    vf_id = vf[0] if vf else "vf-255"
    every = f"{scale.records_nodes:,} nodes' records loaded" if scale.records_nodes < o.scale_nodes else "every node"
    cases: list[tuple[str, Callable[[], int]]] = [
        (f"fleet usage --by namespace --resource {GPU}, {o.days} days", _usage(db, "namespace", month, gpu)),
        ("fleet usage --by namespace, the last day", _usage(db, "namespace", day, frozenset())),
        ("fleet usage --by pod, the last day", _usage(db, "pod", day, frozenset())),
        ("fleet usage --by device, the last day", _usage(db, "device", day, frozenset())),
        (f"fleet usage --by resource, {o.days} days (every hold)", _usage(db, "resource", month, frozenset())),
        (
            f"fleet audit device {GPU} {gpu_id} --node {node}",
            _audit(db, "device", resource=GPU, device_id=gpu_id, node=node),
        ),
        (
            f"fleet audit device {GPU} {gpu_id} (a GPU's id: one node)",
            _audit(db, "device", resource=GPU, device_id=gpu_id),
        ),
        (f"fleet audit device {NIC} {vf_id} (a VF's id: {every})", _audit(db, "device", resource=NIC, device_id=vf_id)),
        (f"fleet audit pod {pod}", _audit(db, "pod", pod=pod)),
    ]
    _say(out, f"  each the median of {o.runs} runs, a new connection each (as a command makes)")
    for label, fn in cases:
        rows, seconds = _timed(fn, o.runs)
        scale.queries.append(Query(label, rows, seconds))
        unit = "answers" if label.startswith("fleet audit") else "rows"  # an answer a node
        _say(out, f"  {label:<70} {rows:>7,} {unit:<7}  {seconds * 1000:10.1f} ms")
    if not o.new_process:
        return
    cmd = [sys.executable, "-m", "eventsrc", "fleet", "usage", "--postgres", db, "--by", "namespace"]
    cmd += ["--resource", GPU, "--since", iso(month.since_ns), "--until", iso(month.until_ns), "-o", "json"]
    t = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True)
    scale.new_process = time.perf_counter() - t
    _say(
        out,
        f"  eventsrc fleet usage --by namespace --resource {GPU}, {o.days} days, in a new process "
        f"(interpreter start included): {scale.new_process * 1000:,.0f} ms",
    )
