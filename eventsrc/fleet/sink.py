"""``eventsrc fleet sink``: the nodes' records from a JetStream stream into PostgreSQL.

    run_sink()           trio, with nats-py on trio-asyncio's loop and psycopg in a worker
                         thread
      migrate()          the schema, versioned (``MIGRATIONS``), under a lock so that
                         several sinks starting at once migrate it once
      a durable pull consumer shared by every sink (explicit acknowledgement); each
      message, in one transaction (``store``), then acknowledged:
        records          the record, once: (node, log id, seq) is its key
        holds            the node's intervals, made in the node's log order: under a row
                         lock on the node's log (``node_logs``: the sequence applied so far
                         and the ``chargeback.Tracker``'s state), the records that follow
                         the applied sequence without a gap are fed to the Tracker, and each
                         hold it starts or ends is a row inserted or closed

A redelivered or replayed message changes nothing (the record is there; the sequence is
applied); a message ahead of a gap waits in ``records`` until the gap is filled, by whichever
sink stores the missing one. So the rows are the same whatever the sinks and the order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import nats
import nats.errors
import psycopg
import trio
import trio_asyncio
from psycopg.types.json import Jsonb

from eventsrc.core.chargeback import Change, Hold, Row, Tracker, UsageState, Window, totals
from eventsrc.core.fleet_names import DEFAULT_PREFIX, DEFAULT_STREAM, shipped
from eventsrc.errors import EventsrcError
from eventsrc.events import CorruptRecordError, decode_record
from eventsrc.node.shipper import FAILURES, connect, ensure_stream
from eventsrc.obs.logger import get_logger
from eventsrc.offline.render import record_json
from eventsrc.rpc.bridge import to_aio

log = get_logger("eventsrc.fleet.sink")

DURABLE = "eventsrc-sink"
BATCH = 256
FETCH_WAIT = 1.0

#: MIGRATIONS[v] takes the schema from version v to v + 1 (docs/fleet.md)
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE records (
        node text NOT NULL,
        log_id text NOT NULL,
        seq bigint NOT NULL,
        follows bigint NOT NULL,
        type text NOT NULL,
        ts_ns bigint NOT NULL,
        ts timestamptz NOT NULL,
        record jsonb NOT NULL,
        data bytea NOT NULL,
        PRIMARY KEY (node, log_id, seq)
    );
    CREATE TABLE node_logs (
        node text NOT NULL,
        log_id text NOT NULL,
        applied_seq bigint NOT NULL DEFAULT 0,
        tracker bytea,
        PRIMARY KEY (node, log_id)
    );
    CREATE TABLE holds (
        id bigserial PRIMARY KEY,
        node text NOT NULL,
        log_id text NOT NULL,
        resource text NOT NULL,
        device text NOT NULL,
        namespace text NOT NULL,
        name text NOT NULL,
        uid text NOT NULL,
        start_ns bigint NOT NULL,
        end_ns bigint
    );
    CREATE INDEX holds_open ON holds (node, log_id, resource, device) WHERE end_ns IS NULL;
    CREATE INDEX holds_by_device ON holds (resource, device, start_ns);
    CREATE INDEX holds_by_pod ON holds (uid, start_ns);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)
MIGRATION_LOCK = 0x65766E74  # the advisory lock migrations take ("evnt")


def migrate(conn: psycopg.Connection[Any]) -> int:
    """Bring the schema to ``SCHEMA_VERSION`` (one sink at a time); the version it had."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))  # sinks starting at once: one migrates
        conn.execute("CREATE TABLE IF NOT EXISTS eventsrc_schema (version integer NOT NULL)")
        conn.execute("LOCK TABLE eventsrc_schema IN EXCLUSIVE MODE")
        row = conn.execute("SELECT version FROM eventsrc_schema").fetchone()
        if row is None:
            conn.execute("INSERT INTO eventsrc_schema (version) VALUES (0)")
        had = 0 if row is None else int(row[0])
        if had > SCHEMA_VERSION:
            raise EventsrcError(
                f"the database's eventsrc schema is version {had}, newer than this sink's {SCHEMA_VERSION}"
            )
        for version in range(had, SCHEMA_VERSION):
            conn.execute(MIGRATIONS[version])
        conn.execute("UPDATE eventsrc_schema SET version = %s", (SCHEMA_VERSION,))
    return had


_state = msgspec.msgpack.Encoder()
_state_of = msgspec.msgpack.Decoder(UsageState)


def store(conn: psycopg.Connection[Any], node: str, log_id: str, seq: int, follows: int, data: bytes) -> None:
    """One shipped record, in one transaction: stored once, and the node's holds made up to
    the first gap: the records from the applied one on, each following the one before
    (``follows``: the record shipped before it on the node's subject)."""
    with conn.transaction():
        _insert_record(conn, node, log_id, seq, follows, data)
        conn.execute("INSERT INTO node_logs (node, log_id) VALUES (%s, %s) ON CONFLICT DO NOTHING", (node, log_id))
        applied, state = conn.execute(
            "SELECT applied_seq, tracker FROM node_logs WHERE node = %s AND log_id = %s FOR UPDATE", (node, log_id)
        ).fetchone() or (0, None)
        tracker = Tracker(_state_of.decode(state) if state else None)
        following = conn.execute(
            "SELECT seq, follows, data FROM records WHERE node = %s AND log_id = %s AND seq > %s ORDER BY seq",
            (node, log_id, applied),
        ).fetchall()
        for next_seq, next_follows, next_data in following:
            if next_follows != applied:
                break  # a gap: the records after it wait for it
            try:
                record = decode_record(next_seq, bytes(next_data))
            except CorruptRecordError:
                pass  # named corrupt in records; it changes no hold (as on the node)
            else:
                for hold, end_ns in tracker.feed(record.ts_ns, record.event):
                    if end_ns is not None:  # one of the open rows alike (two containers may hold alike)
                        conn.execute(
                            "UPDATE holds SET end_ns = %s WHERE id = (SELECT id FROM holds WHERE node = %s "
                            "AND log_id = %s AND resource = %s AND device = %s AND uid = %s AND start_ns = %s "
                            "AND end_ns IS NULL ORDER BY id LIMIT 1)",
                            (end_ns, node, log_id, hold.resource, hold.device, hold.uid, hold.start_ns),
                        )
                        continue
                    conn.execute(
                        "INSERT INTO holds (node, log_id, resource, device, namespace, name, uid, start_ns, end_ns) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        (
                            node,
                            log_id,
                            hold.resource,
                            hold.device,
                            hold.namespace,
                            hold.name,
                            hold.uid,
                            hold.start_ns,
                            end_ns,
                        ),
                    )
            applied = next_seq
        conn.execute(
            "UPDATE node_logs SET applied_seq = %s, tracker = %s WHERE node = %s AND log_id = %s",
            (applied, _state.encode(tracker.state), node, log_id),
        )


def _insert_record(conn: psycopg.Connection[Any], node: str, log_id: str, seq: int, follows: int, data: bytes) -> None:
    try:
        record = decode_record(seq, data)
    except CorruptRecordError as exc:
        fields: dict[str, Any] = {"seq": seq, "corrupt": True, "reason": exc.reason}
        kind, ts_ns = "", 0
    else:
        fields, kind, ts_ns = record_json(record), record.type, record.ts_ns
    conn.execute(
        "INSERT INTO records (node, log_id, seq, follows, type, ts_ns, ts, record, data) "
        "VALUES (%s, %s, %s, %s, %s, %s, to_timestamp(%s::numeric / 1000000), %s, %s) ON CONFLICT DO NOTHING",
        (node, log_id, seq, follows, kind, ts_ns, ts_ns // 1000, Jsonb(fields), data),
    )


async def run_sink(
    servers: Sequence[str],
    dsn: str,
    stream: str = DEFAULT_STREAM,
    prefix: str = DEFAULT_PREFIX,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Consume the stream into the database until cancelled. Raises EventsrcError when the
    database or the servers cannot be reached at the start."""
    try:
        conn = await trio.to_thread.run_sync(lambda: psycopg.connect(dsn, autocommit=True))
    except psycopg.Error as exc:
        raise EventsrcError(f"cannot connect to PostgreSQL: {first_line(exc)}") from None
    try:
        try:
            had = await trio.to_thread.run_sync(migrate, conn)
        except psycopg.Error as exc:
            raise EventsrcError(f"cannot make the fleet's tables: {first_line(exc)}") from None
        if had != SCHEMA_VERSION:
            log.info("fleet schema migrated", version_before=had, version=SCHEMA_VERSION)
        failed = ""  # raised once out of the loop (in it, it would come out as an exception group)
        async with trio_asyncio.open_loop():
            try:
                nc = await connect(servers)
            except FAILURES as exc:
                failed = f"cannot connect to NATS ({','.join(servers)}): {first_line(exc)}"
            else:
                await _consume(nc, conn, stream, prefix, task_status)
        if failed:
            raise EventsrcError(failed)
    finally:
        conn.close()


async def _consume(
    nc: nats.NATS, conn: psycopg.Connection[Any], stream: str, prefix: str, task_status: trio.TaskStatus[None]
) -> None:
    """Store each message of the stream, then acknowledge it, until cancelled."""
    try:
        js = nc.jetstream()
        await to_aio(ensure_stream)(js, stream, prefix)  # a sink may start before any node ships
        sub = await to_aio(js.pull_subscribe)(f"{prefix}.>", durable=DURABLE, stream=stream)
        task_status.started()
        while True:
            try:
                messages = await to_aio(sub.fetch)(BATCH, timeout=FETCH_WAIT)
            except nats.errors.TimeoutError:
                continue
            for m in messages:
                what = shipped(m.headers or {})
                if what is None:  # not a shipper's: never stored, never delivered again
                    log.warning("a message that is no shipped record was dropped", subject=m.subject)
                    await to_aio(m.term)()
                    continue
                node = what.node
                await trio.to_thread.run_sync(store, conn, node.name, node.log_id, what.seq, what.follows, m.data)
                await to_aio(m.ack)()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            await to_aio(nc.close)()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --------------------------------------------------------------------------- queries


def usage_totals(conn: psycopg.Connection[Any], by: str, w: Window, resources: frozenset[str]) -> list[Row]:
    """``fleet usage``: the holds overlapping the window, from the database (its indexes pick
    them), totalled as the node's own ``audit usage`` totals its intervals (``chargeback.totals``),
    so the two answers are one arithmetic."""
    query = "SELECT resource, device, namespace, name, uid, start_ns, end_ns FROM holds WHERE start_ns <= %s"
    params: list[Any] = [w.until_ns]
    query += " AND (end_ns IS NULL OR end_ns >= %s)"
    params.append(w.since_ns)
    if resources:
        query += " AND resource = ANY(%s)"
        params.append(sorted(resources))
    rows = conn.execute(query, params).fetchall()
    changes = [Change(Hold(r, d, ns, name, uid, start), end) for r, d, ns, name, uid, start, end in rows]
    return totals(changes, by, w, resources)
