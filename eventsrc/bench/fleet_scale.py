"""``eventsrc bench fleet``'s queries: the fleet's derived table at fleet scale, and its queries' latency.

Loading ``scale_nodes`` × ``days`` through JetStream and the sink would take hours on one
machine (the sink stores a few hundred records a second). So the ``holds`` table, which the
queries read, is loaded directly: each node's pods (``usage_timing.pods``, ``pods_per_day`` of
them a day, 10 minutes to 12 hours each) are fed through ``chargeback.intervals`` (the Tracker the
sink makes its rows with) and the rows COPYed into the table the sink's migration makes, its
indexes there. The ``records`` table is not loaded at that scale: no query measured reads it.

Then, each the median of ``runs``, as the command runs it (connect, select, total, JSON to a
buffer): ``fleet usage`` for each ``--by``, and as SQL over the indexes the queries have, "who
held this device at T" (``holds_by_device``) and a pod's history (``holds_by_pod``).
"""

from __future__ import annotations

import io
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import takewhile
from typing import TYPE_CHECKING, Any, TextIO

import psycopg
from psycopg import sql

from eventsrc import events as ev
from eventsrc.bench.usage_timing import DAY, GPU, SEC, pods
from eventsrc.core.chargeback import Change, Window, intervals, window
from eventsrc.fleet.sink import FLEET_FIELDS, migrate, usage_totals
from eventsrc.offline.render import iso
from eventsrc.offline.usage import render

if TYPE_CHECKING:
    from eventsrc.bench.fleet import Options

DATABASE = "fleet_scale"
END_NS = 1_794_960_000 * SEC  # 2026-11-18T00:00:00Z: the end of the loaded history ("now")
HOLD_COLUMNS = "node, log_id, resource, device, namespace, name, uid, start_ns, end_ns"


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
    records: int = 0  # the records the holds were made from (not loaded)
    holds: int = 0
    load_seconds: float = 0.0
    table_mb: float = 0.0
    index_mb: float = 0.0
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


def run(dsn: str, o: Options, out: TextIO) -> Scale:
    scale = Scale(nodes=o.scale_nodes, days=o.days)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    db = psycopg.conninfo.make_conninfo(dsn, dbname=DATABASE)
    _say(
        out,
        f"\nqueries: {o.scale_nodes:,} nodes × {o.days} days, {o.pods_per_day:g} pods a node a day (10 min to 12 h "
        "each); the holds table loaded directly (COPY of the Tracker's rows, not through JetStream and the sink)",
    )
    _load(db, o, scale, out)
    _queries(db, o, scale, out)
    return scale


def _node_changes(i: int, o: Options, counts: list[int]) -> list[Change]:
    """Node ``i``'s holds over the days before ``END_NS``, as the sink's Tracker makes them."""
    start = END_NS - o.days * DAY
    arrivals = pods(10_000 + i, start, 86_400 / o.pods_per_day, prefix=f"{i:04d}-")

    def records() -> Iterator[tuple[int, ev._Event]]:
        for ts, events in takewhile(lambda te: te[0] < END_NS, arrivals):
            counts[0] += isinstance(events[0], (ev.PodAdmissionStarted, ev.KubeletPodObserved))
            counts[1] += len(events)
            yield from ((ts, e) for e in events)

    return intervals(records())


def _load(db: str, o: Options, scale: Scale, out: TextIO) -> None:
    counts = [0, 0]  # pods, records
    t = time.perf_counter()
    said = t
    with psycopg.connect(db, autocommit=True) as conn:
        migrate(conn)
        with conn.transaction(), conn.cursor() as cur:

            def rows() -> Iterator[tuple[Any, ...]]:
                nonlocal said
                for i in range(o.scale_nodes):
                    name, log_id = f"node-{i:04d}", f"{i:032x}"
                    for c in _node_changes(i, o, counts):
                        scale.holds += 1
                        yield (name, log_id, *hold_values(c))
                    if time.perf_counter() - said > 10:
                        _say(out, f"  ... {i + 1:,} of {o.scale_nodes:,} nodes, {scale.holds:,} holds")
                        said = time.perf_counter()

            copy(cur, "holds", HOLD_COLUMNS, rows())
        conn.execute("VACUUM ANALYZE holds")
        sizes = conn.execute("SELECT pg_table_size('holds'), pg_indexes_size('holds')").fetchone() or (0, 0)
    scale.load_seconds = time.perf_counter() - t
    scale.pods, scale.records = counts
    scale.table_mb, scale.index_mb = sizes[0] / 1e6, sizes[1] / 1e6
    _say(
        out,
        f"  loaded: {scale.holds:,} holds of {scale.pods:,} pods (made from {scale.records:,} records) in "
        f"{scale.load_seconds:.1f} s, with VACUUM ANALYZE; table {scale.table_mb:,.0f} MB, indexes "
        f"{scale.index_mb:,.0f} MB",
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


def _sql(db: str, query: str, params: tuple[Any, ...]) -> Callable[[], int]:
    def run() -> int:
        with psycopg.connect(db, autocommit=True) as conn:
            return len(conn.execute(query, params).fetchall())

    return run


WHO_HELD = (
    "SELECT node, namespace, name, uid, start_ns, end_ns FROM holds WHERE resource = %s AND device = %s "
    "AND start_ns <= %s AND (end_ns IS NULL OR end_ns > %s)"
)
POD_HISTORY = "SELECT node, resource, device, start_ns, end_ns FROM holds WHERE uid = %s ORDER BY start_ns"


def _queries(db: str, o: Options, scale: Scale, out: TextIO) -> None:
    now = END_NS
    month = window(now - o.days * DAY, None, now)
    day = window(now - DAY, None, now)
    at = now - o.days * DAY // 2
    node = f"node-{o.scale_nodes // 2:04d}"
    n = int(o.pods_per_day * o.days) // 2 // 5 * 5 + 1  # not a fifth: those are observed, without a uid
    pod = f"uid-{o.scale_nodes // 2:04d}-{n:08d}"
    gpu = frozenset({GPU})
    with psycopg.connect(db) as conn:  # a GPU of that node held at T
        held = conn.execute(
            "SELECT device FROM holds WHERE node = %s AND resource = %s AND start_ns <= %s AND end_ns > %s "
            "ORDER BY device LIMIT 1",
            (node, GPU, at, at),
        ).fetchone()
    gpu_id = held[0] if held else "gpu-63"
    cases: list[tuple[str, Callable[[], int]]] = [
        (f"fleet usage --by namespace --resource {GPU}, {o.days} days", _usage(db, "namespace", month, gpu)),
        ("fleet usage --by namespace, the last day", _usage(db, "namespace", day, frozenset())),
        ("fleet usage --by pod, the last day", _usage(db, "pod", day, frozenset())),
        ("fleet usage --by device, the last day", _usage(db, "device", day, frozenset())),
        (f"fleet usage --by resource, {o.days} days (every hold)", _usage(db, "resource", month, frozenset())),
        (
            f"who held {GPU} {gpu_id} on {node} at T (SQL)",
            _sql(db, WHO_HELD + " AND node = %s", (GPU, gpu_id, at, at, node)),
        ),
        (f"who held {GPU} {gpu_id} at T, every node (SQL)", _sql(db, WHO_HELD, (GPU, gpu_id, at, at))),
        (f"a pod's holds, {pod} (SQL)", _sql(db, POD_HISTORY, (pod,))),
    ]
    _say(out, f"  each the median of {o.runs} runs, a new connection each (as a command makes)")
    for label, fn in cases:
        rows, seconds = _timed(fn, o.runs)
        scale.queries.append(Query(label, rows, seconds))
        _say(out, f"  {label:<62} {rows:>7,} rows  {seconds * 1000:10.1f} ms")
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
