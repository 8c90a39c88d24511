"""``eventsrc bench fleet``: the fleet's path (node → JetStream → sink → PostgreSQL) on this
machine, beside what JetStream and PostgreSQL do alone in the same run.

Nothing here is a test: it prints numbers. Real servers of its own: a nats-server with JetStream
(``nats_server``) and a PostgreSQL 15 (``postgres_server``, with ``fsync`` on as in production,
and ``track_commit_timestamp`` so that each row's commit time can be read back).

1. **Nodes.** ``nodes`` simulated nodes, each a real eventsrc log (``EventLog``, the log's own
   batch append) of ``records`` records: pods of 20 namespaces taking GPUs, NIC VFs and
   exclusive CPUs, some observed beside a kubelet (``usage_timing.pods``). Not daemons: each
   node is the daemon's shipper (``node.shipper.Shipper``, the real code) over its log, all of
   them in this process on one trio-asyncio loop, one NATS connection each.
2. **Ceilings.** JetStream alone: the same messages (payload and headers) published by one
   client to a stream of the same configuration, one at a time (each acknowledged before the
   next, as the shipper does) and with up to ``WINDOW`` in flight. PostgreSQL alone: ``COPY``
   of the same rows the sink writes (``records`` and ``holds``) into tables of the same
   definition. Medians of ``repeats``.
3. **Flow.** ``eventsrc fleet sink`` (the real command, a process of its own) consumes the
   stream while every node ships its whole log at once: records/s per node, and through the
   sink (its rows' commit times).
4. **Lag.** Then each node appends pods to its log at a steady rate (half of what the sink
   took, shared by the nodes, unless ``rate`` is given) for ``paced_seconds``, and its shipper
   ships them as the daemon's does: lag from a record's publish (the time JetStream stored it)
   to its commit in PostgreSQL (``pg_xact_commit_timestamp`` of its row), p50 and p99.
5. **Check.** Every record of every log is in PostgreSQL once, and the sink's holds are the
   logs' own intervals (``chargeback.intervals``).
6. **Queries** (``fleet_scale``): ``fleet usage`` and ``fleet audit device|pod`` as the commands answer
   them, on the fleet's tables at fleet scale, loaded directly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import nats
import nats.js.errors
import psycopg
import trio
import trio_asyncio
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

from eventsrc import events as ev
from eventsrc.bench.harness import cpu_seconds, pct
from eventsrc.bench.usage_timing import T0, pods
from eventsrc.core.chargeback import intervals
from eventsrc.core.fleet_names import DEFAULT_PREFIX, DEFAULT_STREAM, NODE, SEQ, Node
from eventsrc.errors import EventsrcError
from eventsrc.events import Record, decode_record
from eventsrc.fleet.rows import INSERT_RECORD, RECORD_COLUMNS, record_row
from eventsrc.fleet.sink import DURABLE
from eventsrc.fleet.tables import migrate
from eventsrc.log.store import EventLog, PendingAppend, key_seq
from eventsrc.node.shipper import FleetOptions, Shipper
from eventsrc.rpc.bridge import to_aio
from eventsrc.rpc.jetstream import FAILURES, connect, ensure_stream
from testbed.benches import fleet_scale
from testbed.benches.fleet_scale import Options
from testbed.servers import nats_server, postgres_server, server_process

CEILING_STREAM = "EVENTSRC_CEILING"
CEILING_PREFIX = "eventsrc.ceiling"
WINDOW = 256  # publishes in flight for JetStream's own rate
SINGLE = 300  # records rows inserted one a transaction, at most, for a durable commit's cost
READY_TIMEOUT = 60.0
RESTARTS = 5  # exits of the sink it is started again after
DRAIN_TIMEOUT = 600.0  # for the sink to store what was published
LOG_MAP = 64 << 20  # each node's log map to start with (it grows)
#: PostgreSQL as in production: every commit durable; and each row's commit time kept
SETTINGS = {"fsync": "on", "synchronous_commit": "on", "track_commit_timestamp": "on"}


@dataclass
class SimNode:
    """One simulated node: its log, the pods it goes on appending, and its shipper."""

    name: str
    log: EventLog
    more: Iterator[tuple[int, list[ev.EventBase]]]
    grew: trio.Event = field(default_factory=trio.Event)
    shipper: Shipper | None = None
    flowed: int = 0  # the last record of the flow phase; those after it were paced
    shipped_at: float = 0.0  # when its shipper had shipped the whole log (perf_counter)

    async def appended(self, seq: int) -> None:
        """The shipper's wait for record ``seq``: returns once the log holds it."""
        while self.log.last_seq() < seq:
            await self.grew.wait()

    def append(self, events: list[ev.EventBase]) -> None:
        """Append one pod's events, stamped now, as the daemon's commit does (a worker thread)."""
        self.log.commit([PendingAppend(events, "bench")])

    def wake(self) -> None:
        grew, self.grew = self.grew, trio.Event()
        grew.set()

    @property
    def node(self) -> Node:
        return Node(self.name, self.log.log_id())


@dataclass
class Flow:
    """The figures of one run of the fleet's path."""

    records: int = 0  # shipped in the flow phase, every node
    node_rates: list[float] = field(default_factory=list)  # records/s of each node, publishing
    publish_seconds: float = 0.0  # from the first shipper's start to the last one done
    sink_rate: float = 0.0  # records/s through the sink: the median of its commits a second
    sink_overall: float = 0.0  # records/s through the sink over the span of its commits
    sink_cpu: float = -1.0  # the sink's CPU over the flow phase, a share of one core (-1: not known)
    sink_exits: list[str] = field(default_factory=list)  # why the sink exited, each time it was started again
    flow_lag: list[float] = field(default_factory=list)  # s, publish → commit, the flow phase
    paced_records: int = 0
    paced_rate: float = 0.0  # records/s of each node while paced
    paced_lag: list[float] = field(default_factory=list)  # s, publish → commit
    append_lag: list[float] = field(default_factory=list)  # s, the log's append → commit
    node_alone: float = 0.0  # one node's shipper alone (median records/s)
    js_one: float = 0.0  # JetStream alone, one at a time (median records/s)
    js_window: float = 0.0  # with WINDOW in flight
    copy_rate: float = 0.0  # PostgreSQL COPY of the same rows (median records/s)
    insert_rate: float = 0.0  # a records row INSERTed a transaction (median records/s)
    catch_up_records: int = 0  # shipped while the sink was stopped, then stored by it started again
    catch_up_rate: float = 0.0  # records/s: those committed after its first commit, over its commits' span
    catch_up_cpu: float = -1.0  # the sink's CPU while it caught up (its start included), a share of one core
    stored: int = 0  # rows in records
    expected: int = 0  # records in the logs
    once: bool = False  # each record once, no gap
    holds: int = 0
    holds_equal: bool = False  # the sink's holds are the logs' own intervals


@dataclass
class Result:
    flow: Flow
    scale: fleet_scale.Scale
    seconds: float


def unavailable() -> str | None:
    """One line saying why the servers cannot be had here, or None."""
    if why := nats_server.why_unavailable():
        return why
    return postgres_server.why_unavailable()


def run_fleet_bench(o: Options, *, workdir: Path | None = None, out: TextIO | None = None) -> Result:
    """Raises EventsrcError (one line) when a server cannot be had or the run fails."""
    out = out or sys.stdout
    if why := unavailable():
        raise EventsrcError(f"no servers to measure with: {why}")
    started = time.perf_counter()
    quiet = logging.getLogger("eventsrc.node.shipper")  # the simulated daemons' "connected", "stream created"
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="eventsrc-bench-fleet-", dir=workdir))
    nats = nats_server.NatsServer(tmp, name="nats")
    pg = postgres_server.PostgresServer(settings=SETTINGS)
    sink: Sink | None = None
    try:
        _start(nats, pg)
        sink = _start_sink(nats.url, pg.dsn, tmp / "sink.log")  # its start overlaps the logs and ceilings
        _header(o, nats, pg, out)
        nodes = _write_logs(tmp / "nodes", o, out)
        flow = Flow()
        _ceilings(nats.url, pg.dsn, nodes, o, flow, out)
        try:
            _one_error(lambda: trio.run(_flow, nats.url, pg.dsn, nodes, sink, o, flow, out))
        finally:
            flow.sink_exits = sink.exits
        _check(pg.dsn, nodes, flow, out)
        for node in nodes:
            node.log.close()
        scale = fleet_scale.run(pg.dsn, o, out)
        result = Result(flow, scale, time.perf_counter() - started)
        _summary(result, o, out)
        return result
    except server_process.WaitedTooLong as exc:
        raise EventsrcError(str(exc).splitlines()[0]) from None
    finally:
        if sink is not None:
            sink.stop()
        nats.stop()
        pg.cleanup()
        if o.keep:
            _say(out, f"kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        quiet.setLevel(level)


def _one_error(run: Callable[[], None]) -> None:
    """``run()``; an EventsrcError raised in a nursery comes out as itself (one line), not in a group."""
    try:
        run()
    except BaseExceptionGroup as group:
        mine, _ = group.split(EventsrcError)
        if mine is None:
            raise
        first: BaseException = mine
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None


def _start(nats: nats_server.NatsServer, pg: postgres_server.PostgresServer) -> None:
    try:
        nats.launch()  # both start at once
        pg.start(READY_TIMEOUT)
        nats.wait_ready(READY_TIMEOUT)
    except (OSError, RuntimeError) as exc:
        raise EventsrcError(f"cannot start the servers: {str(exc).splitlines()[0]}") from None


def _say(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


def _header(o: Options, nats: nats_server.NatsServer, pg: postgres_server.PostgresServer, out: TextIO) -> None:
    fetched = nats_server.ARCHIVE.fetched()
    with psycopg.connect(pg.dsn) as conn:
        version = conn.execute("SHOW server_version").fetchone()
    _say(
        out,
        f"eventsrc bench fleet: {os.cpu_count()} cpus, Python {platform.python_version()}, "
        f"nats-server {fetched.versions.get('nats-server', '?')} (one server, file storage), "
        f"PostgreSQL {version[0] if version else '?'} (fsync on; {pg.binaries.source}); all on this machine\n"
        f"{o.nodes} simulated nodes (real logs, the daemon's shipper each, in this process), one "
        f"'eventsrc fleet sink' process; medians of {o.repeats} for the ceilings, of {o.runs} for the queries\n",
    )


# --------------------------------------------------------------------------- the nodes' logs


def _write_logs(base: Path, o: Options, out: TextIO) -> list[SimNode]:
    """Each node's log of at least ``o.records`` records, written with the log's batch append."""
    t = time.perf_counter()
    nodes = []
    for i in range(o.nodes):
        name = f"node-{i:04d}"
        more = pods(i + 1, T0, 86_400 / o.pods_per_day, prefix=f"{i:04d}-")
        log = EventLog(base / name, map_size=LOG_MAP)
        batch: list[PendingAppend] = []
        count = 0
        while count < o.records:
            ts, events = next(more)
            batch.append(PendingAppend(events, "bench", ts))
            count += len(events)
        log.commit(batch)
        nodes.append(SimNode(name, log, more))
    total = sum(n.log.last_seq() for n in nodes)
    _say(out, f"logs: {o.nodes} nodes, {total:,} records in all, written in {time.perf_counter() - t:.1f} s")
    return nodes


def _messages(nodes: list[SimNode], limit: int | None = None) -> Iterator[tuple[Node, int, bytes]]:
    """(node, seq, the record as the log holds it) of every node, the nodes in turn."""
    taken = 0
    for node in nodes:
        who = node.node
        for chunk in node.log.raw_chunks():
            for key, value in chunk:
                if limit is not None and taken >= limit:
                    return
                yield who, key_seq(key), value
                taken += 1


# --------------------------------------------------------------------------- ceilings


def _ceilings(url: str, dsn: str, nodes: list[SimNode], o: Options, flow: Flow, out: TextIO) -> None:
    sample = [_ceiling_message(node, seq, data) for node, seq, data in _messages(nodes, o.ceiling_messages)]
    one, window, alone = trio.run(_jetstream_ceilings, url, sample, o.repeats, nodes[0])
    flow.js_one, flow.js_window, flow.node_alone = map(statistics.median, (one, window, alone))
    _say(
        out,
        f"ceiling, JetStream alone ({len(sample):,} of the records, the same payloads and headers, one client): "
        f"one at a time {flow.js_one:,.0f} records/s, {WINDOW} in flight {flow.js_window:,.0f} records/s\n"
        f"one node alone, its shipper to a stream of its own ({nodes[0].log.last_seq():,} records): "
        f"{flow.node_alone:,.0f} records/s",
    )
    records, holds = _rows(nodes)
    rates, single = _copy_ceiling(dsn, records, holds, o.repeats)
    flow.copy_rate, flow.insert_rate = statistics.median(rates), statistics.median(single)
    _say(
        out,
        f"ceiling, PostgreSQL COPY of the same rows ({len(records):,} records rows and their {len(holds):,} holds "
        f"rows, one transaction): {flow.copy_rate:,.0f} records/s; a records row a transaction (INSERT, "
        f"durable commit each): {flow.insert_rate:,.0f} records/s",
    )


async def _jetstream_ceilings(
    url: str, sample: list[Message], repeats: int, node: SimNode
) -> tuple[list[float], list[float], list[float]]:
    """JetStream's own rate for ``sample``, one at a time and windowed; and ``node``'s shipper
    alone on the same stream: records/s of each repeat, each on a new stream."""
    one: list[float] = []
    window: list[float] = []
    alone: list[float] = []
    async with trio_asyncio.open_loop():
        nc = await connect([url])
        try:
            js = nc.jetstream(publish_async_max_pending=WINDOW)
            for _ in range(repeats):
                for rates, publish in ((one, _one_at_a_time), (window, _windowed)):
                    await to_aio(_fresh_stream)(js)
                    t = time.perf_counter()
                    await to_aio(publish)(js, sample)
                    rates.append(len(sample) / (time.perf_counter() - t))
                await to_aio(_fresh_stream)(js)
                alone.append(await _ship_alone(url, node))
            await to_aio(js.delete_stream)(CEILING_STREAM)
        finally:
            await to_aio(nc.close)()
    return one, window, alone


async def _ship_alone(url: str, node: SimNode) -> float:
    """records/s of ``node``'s shipper shipping its whole log, the only one, to the ceiling's stream."""
    options = FleetOptions((url,), node.name, stream=CEILING_STREAM, prefix=CEILING_PREFIX)
    shipper = Shipper(node.log, node.appended, options)
    t = time.perf_counter()
    async with trio.open_nursery() as nursery:
        await nursery.start(shipper.run)
        while shipper.shipped < node.log.last_seq():
            await trio.sleep(0.002)
        nursery.cancel_scope.cancel()
    return node.log.last_seq() / (time.perf_counter() - t)


async def _fresh_stream(js: JetStreamContext) -> None:
    """The ceiling's stream, new (no message and no duplicate window left from a repeat), as
    ``ensure_stream`` makes the fleet's."""
    with contextlib.suppress(nats.js.errors.NotFoundError):
        await js.delete_stream(CEILING_STREAM)
    await ensure_stream(js, CEILING_STREAM, CEILING_PREFIX)


Message = tuple[str, bytes, dict[str, str]]  # subject, payload, headers


def _ceiling_message(node: Node, seq: int, data: bytes) -> Message:
    """The message the shipper would publish, on the ceiling's stream."""
    kind = type(decode_record(seq, data).event).__name__
    return node.subject(CEILING_PREFIX), data, node.headers(seq, kind, follows=seq - 1)


async def _one_at_a_time(js: JetStreamContext, sample: list[Message]) -> None:
    for subject, data, headers in sample:
        await js.publish(subject, data, stream=CEILING_STREAM, headers=headers)


async def _windowed(js: JetStreamContext, sample: list[Message]) -> None:
    acks = []
    for subject, data, headers in sample:
        acks.append(await js.publish_async(subject, data, stream=CEILING_STREAM, headers=headers))
    for ack in acks:
        await ack  # each acknowledged: an error is raised here


def _rows(nodes: list[SimNode]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The rows the sink makes of the nodes' logs: records, and holds (the Tracker's intervals)."""
    records = [record_row(node.name, node.log_id, seq, seq - 1, data) for node, seq, data in _messages(nodes)]
    holds = [row for node in nodes for row in _hold_rows(node)]
    return records, holds


def _hold_rows(node: SimNode) -> list[tuple[Any, ...]]:
    who = node.node
    made = intervals((r.ts_ns, r.event) for r in node.log.records() if isinstance(r, Record))
    return [(who.name, who.log_id, *fleet_scale.hold_values(c)) for c in made]


def _copy_ceiling(
    dsn: str, records: list[tuple[Any, ...]], holds: list[tuple[Any, ...]], repeats: int
) -> tuple[list[float], list[float]]:
    """COPY of the rows into tables defined as the sink's (its migration, in a schema of their
    own); and, for what a durable commit a record costs, the records rows (``SINGLE`` of them at
    most) inserted one per transaction."""
    rates, single = [], []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA ceiling")
        conn.execute("SET search_path TO ceiling")
        migrate(conn)
        for _ in range(repeats):
            conn.execute("TRUNCATE records, holds")
            t = time.perf_counter()
            with conn.transaction(), conn.cursor() as cur:
                fleet_scale.copy(cur, "records", RECORD_COLUMNS, records)
                fleet_scale.copy(cur, "holds", fleet_scale.HOLD_COLUMNS, holds)
            rates.append(len(records) / (time.perf_counter() - t))
            conn.execute("TRUNCATE records, holds")
            t = time.perf_counter()
            for row in records[:SINGLE]:
                conn.execute(INSERT_RECORD, row)  # autocommit: a transaction each
            single.append(min(SINGLE, len(records)) / (time.perf_counter() - t))
        conn.execute("DROP SCHEMA ceiling CASCADE")
    return rates, single


# --------------------------------------------------------------------------- the flow


@dataclass
class Sink:
    """``eventsrc fleet sink``, a process of its own, its output in ``log_path``; started again
    when it exits, as its Deployment would (at most ``RESTARTS`` times), each exit counted."""

    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    exits: list[str] = field(default_factory=list)  # why it exited, each time, and in which phase
    phase: str = "before the flow"

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def check(self) -> None:
        """Start it again if it exited; EventsrcError once it has exited too often."""
        if self.proc is None or self.proc.poll() is None:
            return
        lines = [line.strip(" |") for line in self.log_path.read_text(errors="replace").splitlines()]
        last = next((line for line in reversed(lines) if line.strip(" -+")), "")
        self.exits.append(f"{self.phase}, exit {self.proc.returncode}: {last}")
        if len(self.exits) > RESTARTS:
            raise EventsrcError(f"the sink exited {len(self.exits)} times; the last: {self.exits[-1]}")
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            server_process.end(self.proc)


def _start_sink(url: str, dsn: str, log_path: Path) -> Sink:
    argv = [sys.executable, "-m", "eventsrc", "--log-level", "warning", "fleet", "sink", "--nats", url]
    sink = Sink(argv, {**os.environ, **_pg_env(dsn)}, log_path)
    sink.start()
    return sink


def _pg_env(dsn: str) -> dict[str, str]:
    """libpq's PG* variables for ``dsn`` (as an operator would give the sink its database)."""
    names = {"host": "PGHOST", "port": "PGPORT", "user": "PGUSER", "dbname": "PGDATABASE"}
    return {names[k]: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(dsn).items() if k in names and v is not None}


async def _flow(url: str, dsn: str, nodes: list[SimNode], sink: Sink, o: Options, flow: Flow, out: TextIO) -> None:
    async with trio_asyncio.open_loop():
        nc = await connect([url])
        try:
            js = nc.jetstream()
            await _until(lambda: _consumer_ready(js), "the sink's consumer", sink, READY_TIMEOUT)
            async with trio.open_nursery() as nursery:
                await _ship_all(nursery, url, nodes, sink, dsn, flow, out)
                await _paced(nodes, sink, dsn, o, flow, out)
                nursery.cancel_scope.cancel()
            await _lags(js, dsn, nodes, flow)
            await _catch_up(url, dsn, nodes, sink, o, flow, out)
        finally:
            await to_aio(nc.close)()


async def _consumer_ready(js: JetStreamContext) -> bool:
    try:
        await to_aio(js.consumer_info)(DEFAULT_STREAM, DURABLE)
    except FAILURES:
        return False
    return True


async def _until(condition: Callable[[], Awaitable[bool]], what: str, sink: Sink, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        sink.check()
        if time.monotonic() > deadline:
            raise EventsrcError(f"waited {timeout:g} s for {what}")
        await trio.sleep(0.05)


def _stored(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM records").fetchone()
    return int(row[0]) if row else 0


async def _drained(dsn: str, want: int, sink: Sink, out: TextIO) -> None:
    """Until the sink has stored ``want`` records; progress every few seconds."""
    said = time.monotonic()
    deadline = said + DRAIN_TIMEOUT
    while (got := await trio.to_thread.run_sync(_stored, dsn)) < want:
        sink.check()
        if time.monotonic() > deadline:
            raise EventsrcError(f"the sink stored {got:,} of {want:,} records in {DRAIN_TIMEOUT:g} s")
        if time.monotonic() - said > 5:
            _say(out, f"  ... the sink has stored {got:,} of {want:,}")
            said = time.monotonic()
        await trio.sleep(0.2)


async def _ship_all(
    nursery: trio.Nursery,
    url: str,
    nodes: list[SimNode],
    sink: Sink,
    dsn: str,
    flow: Flow,
    out: TextIO,
) -> None:
    """Every node's shipper started at once; until each has shipped its whole log, then until
    the sink has stored it all."""
    flow.records = sum(n.log.last_seq() for n in nodes)
    _say(out, f"\nflow: {len(nodes)} nodes ship {flow.records:,} records at once; the sink stores them")
    sink.phase = "in the flow"
    pid, cpu0 = sink.pid, cpu_seconds(sink.pid)
    t0 = time.perf_counter()
    for node in nodes:
        node.flowed = node.log.last_seq()
        node.shipper = Shipper(node.log, node.appended, FleetOptions((url,), node.name))
        await nursery.start(node.shipper.run)
    waiting = list(nodes)
    while waiting:
        now = time.perf_counter()
        for node in [n for n in waiting if n.shipper is not None and n.shipper.shipped >= n.log.last_seq()]:
            node.shipped_at = now
            waiting.remove(node)
        sink.check()
        await trio.sleep(0.005)
    flow.node_rates = [n.log.last_seq() / (n.shipped_at - t0) for n in nodes]
    flow.publish_seconds = max(n.shipped_at for n in nodes) - t0
    await _drained(dsn, flow.records, sink, out)
    elapsed = time.perf_counter() - t0
    if sink.pid == pid:  # not started again meanwhile
        flow.sink_cpu = (cpu_seconds(pid) - cpu0) / elapsed
    flow.sink_overall, flow.sink_rate = _sink_rates(dsn, flow.records, elapsed)


def _sink_rates(dsn: str, records: int, elapsed: float) -> tuple[float, float]:
    """records/s through the sink: over the span of its commits; and the median of its commits
    a second, the first and last seconds left out (a second it stored nothing in, such as a
    start again, is not one of them). A flow stored in one transaction has no span (its rows
    carry one commit time): then ``elapsed``, from the first publish to the last record stored,
    is the span (a lower bound of the sink's rate: it holds the publishing too)."""
    with psycopg.connect(dsn) as conn:
        seconds = conn.execute(
            "SELECT date_trunc('second', pg_xact_commit_timestamp(xmin)) AS s, count(*) FROM records "
            "GROUP BY s ORDER BY s"
        ).fetchall()
        row = conn.execute(
            "SELECT extract(epoch FROM max(c) - min(c)) FROM "
            "(SELECT pg_xact_commit_timestamp(xmin) AS c FROM records) AS commits"
        ).fetchone()
    span = float(row[0]) if row and row[0] is not None else 0.0
    overall = (records - 1) / span if span > 0 else records / elapsed
    counts = [int(c) for _, c in seconds]
    return overall, statistics.median(counts[1:-1]) if len(counts) >= 3 else overall


async def _paced(nodes: list[SimNode], sink: Sink, dsn: str, o: Options, flow: Flow, out: TextIO) -> None:
    """Each node appends pods at ``flow.paced_rate`` records/s for ``o.paced_seconds``; its
    shipper ships them as they come."""
    flow.paced_rate = o.rate if o.rate is not None else max(0.5, flow.sink_rate / 2 / len(nodes))
    before = sum(n.log.last_seq() for n in nodes)
    sink.phase = "while paced"
    _say(
        out,
        f"\nlag: each node appends {flow.paced_rate:,.1f} records/s for {o.paced_seconds:g} s "
        f"({flow.paced_rate * len(nodes):,.0f} records/s in all"
        + (", half of what the sink took" if o.rate is None else "")
        + "), shipped as they come",
    )
    async with trio.open_nursery() as nursery:
        for node in nodes:
            nursery.start_soon(_append_paced, node, flow.paced_rate, o.paced_seconds)
    flow.paced_records = sum(n.log.last_seq() for n in nodes) - before
    await _drained(dsn, before + flow.paced_records, sink, out)


async def _catch_up(url: str, dsn: str, nodes: list[SimNode], sink: Sink, o: Options, flow: Flow, out: TextIO) -> None:
    """An outage of the sink: it is stopped, each node appends ``o.catch_up`` records and ships
    them, then the sink is started again and stores the backlog. Its rate: the records committed
    after its first commit, over the span from that commit to its last (its start is not in it)."""
    sink.phase = "catching up"
    sink.stop()
    sink.proc = None
    starts = {n.name: n.log.last_seq() for n in nodes}
    for node in nodes:
        pending: list[PendingAppend] = []
        while sum(len(p.events) for p in pending) < o.catch_up:
            pending.append(PendingAppend(next(node.more)[1], "bench"))
        await trio.to_thread.run_sync(node.log.commit, pending)
    flow.catch_up_records = sum(n.log.last_seq() - starts[n.name] for n in nodes)
    _say(
        out,
        f"\ncatch-up: the sink stopped, {len(nodes)} nodes ship {flow.catch_up_records:,} records; then the sink "
        "started again stores them",
    )
    async with trio.open_nursery() as nursery:
        for node in nodes:
            node.shipper = Shipper(node.log, node.appended, FleetOptions((url,), node.name))
            await nursery.start(node.shipper.run)
        while any(n.shipper is not None and n.shipper.shipped < n.log.last_seq() for n in nodes):
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    sink.start()
    pid, cpu0, t0 = sink.pid, cpu_seconds(sink.pid), time.perf_counter()
    await _drained(dsn, sum(n.log.last_seq() for n in nodes), sink, out)
    drained = time.perf_counter()
    if sink.pid == pid:
        flow.catch_up_cpu = (cpu_seconds(pid) - cpu0) / (drained - t0)
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "WITH c AS (SELECT pg_xact_commit_timestamp(r.xmin) AS t FROM records r "
            "JOIN unnest(%s::text[], %s::bigint[]) AS w(node, start) ON r.node = w.node AND r.seq > w.start) "
            "SELECT count(*) FILTER (WHERE t > (SELECT min(t) FROM c)), extract(epoch FROM max(t) - min(t)) FROM c",
            (list(starts), list(starts.values())),
        ).fetchone()
    after_first, span = (int(row[0]), float(row[1] or 0)) if row else (0, 0.0)
    # one commit has no span: then from the start to the last record stored (a lower bound: its start is in it)
    flow.catch_up_rate = after_first / span if span > 0 else flow.catch_up_records / (drained - t0)
    _say(
        out,
        f"  stored at {flow.catch_up_rate:,.0f} records/s ({after_first:,} after its first commit in "
        f"{span:.2f} s), the sink at "
        + (f"{flow.catch_up_cpu:.0%} of a core" if flow.catch_up_cpu >= 0 else "? of a core (started again)"),
    )


async def _append_paced(node: SimNode, rate: float, seconds: float) -> None:
    t0 = time.perf_counter()
    appended = 0
    while (elapsed := time.perf_counter() - t0) < seconds:
        ahead = appended / rate - elapsed  # seconds ahead of the rate
        if ahead > 0:
            await trio.sleep(ahead)
            continue
        _, events = next(node.more)
        await trio.to_thread.run_sync(node.append, events)
        appended += len(events)
        node.wake()


async def _lags(js: JetStreamContext, dsn: str, nodes: list[SimNode], flow: Flow) -> None:
    """publish → commit of every record: the time JetStream stored it (read back through a
    consumer of its own) and its row's commit time; and the log's append → commit while paced."""
    published = await to_aio(_published)(js, flow.records + flow.paced_records)
    with psycopg.connect(dsn) as conn:
        committed = conn.execute(
            "SELECT node, seq, ts_ns, (extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1000000)::bigint "
            "FROM records"
        ).fetchall()
    flowed = {n.name: n.flowed for n in nodes}
    for node, seq, ts_ns, commit_us in committed:
        lag = (commit_us * 1000 - published[node, seq]) / 1e9
        if seq <= flowed[node]:
            flow.flow_lag.append(lag)
        else:
            flow.paced_lag.append(lag)
            flow.append_lag.append((commit_us * 1000 - ts_ns) / 1e9)


async def _published(js: JetStreamContext, count: int) -> dict[tuple[str, int], int]:
    """(node, seq) → the ns JetStream stored it at, from an ephemeral consumer of the stream."""
    sub = await js.pull_subscribe(
        f"{DEFAULT_PREFIX}.>", stream=DEFAULT_STREAM, config=ConsumerConfig(ack_policy=AckPolicy.NONE)
    )
    out: dict[tuple[str, int], int] = {}
    while len(out) < count:
        for m in await sub.fetch(1000, timeout=10):
            headers = m.headers or {}
            out[headers[NODE], int(headers[SEQ])] = int(m.metadata.timestamp.timestamp() * 1e9)
    await sub.unsubscribe()
    return out


# --------------------------------------------------------------------------- check and summary


def _check(dsn: str, nodes: list[SimNode], flow: Flow, out: TextIO) -> None:
    """Each record of each log once in ``records``, no gap; the sink's holds the logs' own."""
    flow.expected = sum(n.log.last_seq() for n in nodes)
    with psycopg.connect(dsn) as conn:
        per_node = {
            (node, log_id): (count, low, high)
            for node, log_id, count, low, high in conn.execute(
                "SELECT node, log_id, count(*), min(seq), max(seq) FROM records GROUP BY node, log_id"
            ).fetchall()
        }
        holds = sorted(conn.execute(f"SELECT {fleet_scale.HOLD_COLUMNS} FROM holds").fetchall(), key=repr)
    flow.stored = sum(count for count, _, _ in per_node.values())
    want = {(n.name, n.log.log_id()): (n.log.last_seq(), 1, n.log.last_seq()) for n in nodes}
    flow.once = per_node == want
    flow.holds = len(holds)
    flow.holds_equal = holds == sorted((row for n in nodes for row in _hold_rows(n)), key=repr)
    _say(
        out,
        f"\ncheck: {flow.stored:,} records in PostgreSQL of {flow.expected:,} in the logs; each once, no gap: "
        f"{'yes' if flow.once else 'NO'}; the sink's {flow.holds:,} holds are the logs' own intervals: "
        f"{'yes' if flow.holds_equal else 'NO'}",
    )


def _ms(xs: list[float], q: float) -> str:
    return f"{pct(xs, q) * 1000:,.1f} ms" if xs else "-"


def _summary(r: Result, o: Options, out: TextIO) -> None:
    f = r.flow
    per_node = statistics.median(f.node_rates)
    aggregate = f.records / f.publish_seconds if f.publish_seconds else 0.0
    _say(
        out,
        "\nsummary (this machine, every server and client on it)\n"
        f"  publishing, one node alone (the daemon's shipper, a record at a time)  {f.node_alone:,.0f} records/s\n"
        f"    ceiling: JetStream alone, one at a time {f.js_one:,.0f} records/s (node / this: "
        f"{f.node_alone / f.js_one:.2f})\n"
        f"  publishing, {len(f.node_rates)} nodes at once (their shippers in this one process)  "
        f"{aggregate:,.0f} records/s, per node median {per_node:,.0f} (min {min(f.node_rates):,.0f}, max "
        f"{max(f.node_rates):,.0f})\n"
        f"    ceiling: JetStream alone, {WINDOW} in flight {f.js_window:,.0f} records/s (all nodes / this: "
        f"{aggregate / f.js_window:.2f})\n"
        f"  through the sink (one 'eventsrc fleet sink', a transaction a fetch)  {f.sink_rate:,.0f} records/s "
        f"(median of its seconds; {f.sink_overall:,.0f} over the whole backlog), "
        + (f"the sink at {f.sink_cpu:.0%} of a core" if f.sink_cpu >= 0 else "the sink's CPU not known (started again)")
        + "\n"
        f"    ceiling: PostgreSQL COPY of the same rows {f.copy_rate:,.0f} records/s (sink / COPY: "
        f"{f.sink_rate / f.copy_rate:.3f}); a row a transaction {f.insert_rate:,.0f} records/s (sink / this: "
        f"{f.sink_rate / f.insert_rate:.2f}); sink / JetStream alone, {WINDOW} in flight: "
        f"{f.sink_rate / f.js_window:.3f}\n"
        f"  catching up after an outage of the sink ({f.catch_up_records:,} records waiting)  "
        f"{f.catch_up_rate:,.0f} records/s (sink / COPY: {f.catch_up_rate / f.copy_rate:.3f})"
        + (f", the sink at {f.catch_up_cpu:.0%} of a core" if f.catch_up_cpu >= 0 else "")
        + "\n"
        f"  lag, publish → commit in PostgreSQL, at {f.paced_rate * len(f.node_rates):,.0f} records/s "
        f"({f.paced_records:,} records)  p50 {_ms(f.paced_lag, 0.5)}, p99 {_ms(f.paced_lag, 0.99)}; "
        f"from the log's append: p50 {_ms(f.append_lag, 0.5)}, p99 {_ms(f.append_lag, 0.99)}\n"
        f"    while every node shipped its whole log at once (a backlog): p50 {_ms(f.flow_lag, 0.5)}, "
        f"p99 {_ms(f.flow_lag, 0.99)}"
        + (
            f"\n  the sink exited {len(f.sink_exits)} time(s) and was started again (the figures include it): "
            + "; ".join(f.sink_exits)
            if f.sink_exits
            else ""
        ),
    )
    s = r.scale
    _say(
        out,
        f"  queries at {s.nodes:,} nodes × {s.days} days ({s.holds:,} holds; {s.records_loaded:,} records of "
        f"{s.records_nodes:,} nodes; loaded directly):\n"
        + "".join(f"    {q.label:<70} {q.seconds * 1000:10.1f} ms\n" for q in s.queries)
        + f"whole run: {r.seconds:.0f} s",
    )
