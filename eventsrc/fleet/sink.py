"""``eventsrc fleet sink``: the nodes' records from a JetStream stream into PostgreSQL.

    run_sink()           trio, with nats-py on trio-asyncio's loop and psycopg in a worker
                         thread
      migrate()          the schema, versioned (``MIGRATIONS``), under a lock so that
                         several sinks starting at once migrate it once
      a durable pull consumer shared by every sink (explicit acknowledgement); the messages
      of each fetch, in one transaction (``store_many``), then each acknowledged:
        records          the record, once: (node, log id, seq) is its key
        derived rows     made in the node's log order: under a row lock on the node's log
                         (``node_logs``: the sequence applied so far and the trackers'
                         state), the records that follow the applied sequence without a gap
                         are fed to the node's own pure code: ``chargeback.Tracker`` (the
                         holds), ``log.index.keys_for`` (the audit index ``fleet audit``
                         reads, ``fleet_audit``) and ``claim_preparations.Preparations``

A redelivered or replayed message changes nothing (the record is there; the sequence is
applied); a message ahead of a gap waits in ``records`` until the gap is filled, by whichever
sink stores the missing one. So the rows are the same whatever the sinks and the order.
The tables and their migrations are ``fleet.tables``, the rows ``fleet.rows``, the queries
``fleet.queries``, U+0000 ``fleet.nul_escape``; JetStream ``rpc.jetstream``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import nats
import nats.errors
import psycopg
import trio
from nats.js.api import ConsumerConfig
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from eventsrc.core.backoff import Backoff
from eventsrc.core.fleet_names import DEFAULT_PREFIX, DEFAULT_STREAM, SEQ
from eventsrc.core.shipped_records import (
    DATABASE,
    KINDS,
    Refusal,
)
from eventsrc.errors import EventsrcError, first_line
from eventsrc.fleet.rows import BATCH, Message, Outcome, States, quarantine_one, store_many
from eventsrc.fleet.tables import SCHEMA_VERSION, migrate
from eventsrc.obs.logger import get_logger
from eventsrc.rpc.aio_thread import LoopThread, open_loop_thread
from eventsrc.rpc.jetstream import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    FAILURES,
    NatsAuth,
    connect_aio,
    connect_deadline,
    ensure_stream,
    said_refused,
)

log = get_logger(__name__)
T = TypeVar("T")


DURABLE = "eventsrc-sink"
FETCH_WAIT = 1.0
#: s: what a sink fetched and did not acknowledge (it was killed mid-batch) goes to a sink again
#: after this; a fetch's transaction takes far less
ACK_WAIT = 10.0


async def run_sink(
    servers: Sequence[str],
    dsn: str,
    stream: str = DEFAULT_STREAM,
    prefix: str = DEFAULT_PREFIX,
    *,
    replicas: int = 1,
    metrics: SinkMetrics | None = None,
    auth: NatsAuth | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Consume the stream into the database until cancelled, connected to NATS as ``auth``
    (None: no credentials). Raises EventsrcError when the
    database or the servers cannot be reached at the start. Once it has consumed, servers that
    go away, and a database that refuses or loses a fetch's transaction for any reason, are said
    once per reason and tried again with backoff (a sink is a Deployment: it waits for them, as
    the nodes do); what was fetched and not acknowledged is delivered again after ``ACK_WAIT``,
    to this sink or another, if this one is gone."""
    conn = await _connect_database(dsn)
    try:
        try:
            had = await trio.to_thread.run_sync(migrate, conn)
        except psycopg.Error as exc:
            raise EventsrcError(f"cannot make the fleet's tables: {first_line(exc)}") from None
        if had != SCHEMA_VERSION:
            log.info("fleet schema migrated", version_before=had, version=SCHEMA_VERSION)
    except BaseException:
        conn.close()
        raise
    consumer = _Consumer(servers, dsn, stream, prefix, replicas, conn, task_status, metrics or SinkMetrics(), auth)
    failed = ""  # raised once out of the loop (in it, it would come out as an exception group)
    try:
        async with open_loop_thread() as loop:  # nats-py's, of its own (ADR 0045)
            consumer.loop = loop
            failed = await consumer.run()
    finally:
        consumer.close()
    if failed:
        raise EventsrcError(failed)


async def _connect_database(dsn: str) -> psycopg.Connection[Any]:
    try:
        return await trio.to_thread.run_sync(lambda: psycopg.connect(dsn, autocommit=True))
    except psycopg.Error as exc:
        raise EventsrcError(f"cannot connect to PostgreSQL: {first_line(exc)}") from None


#: what a session's start raises when the servers are away
CONNECTING_FAILURES: tuple[type[BaseException], ...] = (*FAILURES, EventsrcError)
#: the SQLSTATE classes of an error about the data stored, not the database: 22 data exception,
#: 23 integrity constraint violation, 54 program limit exceeded (an index row too large: a
#: device id of kilobytes). A fetch refused so is stored message by message, and the one the
#: database refuses alone is quarantined (kind "database"); anything else (privileges, a full
#: disk, a lost connection, a serialization failure) is the database's, retried.
DATA_CLASSES = ("22", "23", "54")


def database_reason(exc: BaseException) -> str:
    """One line for a database error: its SQLSTATE (when it has one) and its first line."""
    state = getattr(exc, "sqlstate", None) if isinstance(exc, psycopg.Error) else None
    return f"{state}: {first_line(exc)}" if state else first_line(exc)


class SinkMetrics:
    """The sink's series (``--metrics-address``): what it stored, what it quarantined and why,
    and the database's refusals."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.stored = Counter(
            "eventsrc_fleet_sink_records_stored", "Records stored as their node's.", registry=self.registry
        )
        self.quarantined = Counter(
            "eventsrc_fleet_sink_messages_quarantined",
            "Messages refused as a node's record and kept apart in the quarantine table, by kind of reason.",
            ["kind"],
            registry=self.registry,
        )
        for kind in KINDS:
            self.quarantined.labels(kind=kind)
        self.database_failures = Counter(
            "eventsrc_fleet_sink_store_failures",
            "Fetches whose transaction the database refused (retried with backoff).",
            registry=self.registry,
        )
        self.database_down = Gauge(
            "eventsrc_fleet_sink_database_failing", "1 while the database refuses the records.", registry=self.registry
        )

    def count(self, outcome: Outcome) -> None:
        self.stored.inc(outcome.stored)
        for kind, n in outcome.quarantined.items():
            self.quarantined.labels(kind=kind).inc(n)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


async def _ack_all(messages: Sequence[Any]) -> None:
    """Acknowledge ``messages`` in order (nats-py's ``Msg.ack``), on asyncio's loop."""
    for m in messages:
        await m.ack()


class _Consumer:
    """The sink's sessions: one NATS connection each, again after the servers went away, with
    backoff; a database that refuses a fetch is retried with the fetch unacknowledged."""

    def __init__(
        self,
        servers: Sequence[str],
        dsn: str,
        stream: str,
        prefix: str,
        replicas: int,
        conn: psycopg.Connection[Any],
        task_status: trio.TaskStatus[None],
        metrics: SinkMetrics,
        auth: NatsAuth | None = None,
    ) -> None:
        self.servers, self.dsn, self.stream, self.prefix, self.replicas = servers, dsn, stream, prefix, replicas
        self.conn: psycopg.Connection[Any] | None = conn
        self.metrics = metrics
        self.auth = auth
        self._task_status: trio.TaskStatus[None] | None = task_status
        self._said = ""
        self._database_said = ""
        self.loop: LoopThread | None = None  # where the NATS client runs (``run_sink``)
        self.states = States()  # the trackers of the node logs it applied last

    async def aio(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """``await fn(...)`` on the NATS client's asyncio loop."""
        assert self.loop is not None, "run_sink gives the consumer its loop"
        return await self.loop.call(fn, *args, **kwargs)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()

    async def run(self) -> str:
        """Consume until cancelled; the one-line reason when the first connection fails."""
        backoff = Backoff(BACKOFF_FIRST, BACKOFF_MAX)
        while True:
            try:
                with trio.fail_after(connect_deadline(self.servers)):
                    nc = await self.aio(connect_aio, self.servers, auth=self.auth)
            except CONNECTING_FAILURES as exc:
                if self._task_status is not None:  # never consumed: the servers are not there
                    return f"cannot connect to NATS ({','.join(self.servers)}): {first_line(exc)}"
                self._say(first_line(exc))
            else:
                try:
                    await self._consume(nc)
                except FAILURES as exc:
                    self._say(first_line(exc))
                    backoff.reset()
            await trio.sleep(backoff.next())

    def _say(self, reason: str) -> None:
        if reason != self._said:
            log.warning("fleet sink disconnected; retrying", servers=",".join(self.servers), reason=reason)
            self._said = reason

    def _ready(self) -> None:
        if self._task_status is not None:
            self._task_status.started()
            self._task_status = None
        elif self._said:
            log.info("fleet sink connected again", servers=",".join(self.servers))
        self._said = ""

    async def _consume(self, nc: nats.NATS) -> None:
        """Store each fetch of the stream in one transaction, then acknowledge its messages,
        until cancelled or the connection closes."""
        try:
            js = nc.jetstream()
            with said_refused(nc):  # the sink's user lacks a right (docs/fleet.md, "NATS permissions")
                await self.aio(ensure_stream, js, self.stream, self.prefix, self.replicas)  # before any node ships
                config = ConsumerConfig(ack_wait=ACK_WAIT)
                sub = await self.aio(
                    js.pull_subscribe, f"{self.prefix}.>", durable=DURABLE, stream=self.stream, config=config
                )
            self._ready()
            ended: BaseException | None = None  # raised out of the nursery, not in a group
            async with trio.open_nursery() as nursery:
                fetched, fetches = trio.open_memory_channel[list[Any] | BaseException](0)
                nursery.start_soon(self._fetching, nc, sub, fetched)
                try:
                    async for messages in fetches:
                        if isinstance(messages, BaseException):
                            raise messages
                        batch = [Message(m.subject, dict(m.headers or {}), m.data) for m in messages]
                        await self._store(batch, messages)
                        # each after the commit: a crash before redelivers what then changes nothing;
                        # all of a fetch in one call on asyncio's loop, not a trip from trio's for each
                        await self.aio(_ack_all, messages)
                except FAILURES as exc:
                    ended = exc
                    nursery.cancel_scope.cancel()
            if ended is not None:
                raise ended
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self.aio(nc.close)

    async def _fetching(
        self, nc: nats.NATS, sub: Any, fetched: trio.MemorySendChannel[list[Any] | BaseException]
    ) -> None:
        """Fetch after fetch, each handed on as soon as the one before is taken: the next fetch
        comes while one is stored (two fetches unacknowledged at most, ``BATCH`` each). What
        ends the session is handed on too (a closed connection, a server gone), and raised by
        the one that takes it, not out of the nursery in a group."""
        async with fetched:
            while True:
                try:
                    messages = await self.aio(sub.fetch, BATCH, timeout=FETCH_WAIT)
                except TimeoutError:  # nats-py's, or asyncio's from inside fetch: nothing came
                    if not nc.is_closed:
                        continue
                    await fetched.send(nats.errors.ConnectionClosedError())
                    return
                except FAILURES as exc:
                    await fetched.send(exc)
                    return
                await fetched.send(messages)

    async def _store(self, batch: list[Message], messages: Sequence[Any]) -> None:
        """``batch`` stored (one transaction), or quarantined. A data error splits the fetch
        message by message (``_store_alone``)."""
        got = await self._until_taken(lambda conn: store_many(conn, batch, self.prefix, self.states), messages)
        if isinstance(got, str):
            await self._store_alone(batch, got, messages)
        else:
            self.metrics.count(got)

    async def _until_taken(
        self, work: Callable[[psycopg.Connection[Any]], Outcome], messages: Sequence[Any]
    ) -> Outcome | str:
        """``work``'s outcome once the database takes its transaction, or the database's reason
        when it refused it for its data (``DATA_CLASSES``). Until then, whatever else the database
        says, tried again with backoff, the messages kept this sink's (``in_progress``) and
        unacknowledged."""
        backoff = Backoff(BACKOFF_FIRST, BACKOFF_MAX)
        while True:
            try:
                if self.conn is None or self.conn.closed or self.conn.broken:
                    self.close()
                    self.conn = None
                    self.conn = await _connect_database(self.dsn)
                outcome = await trio.to_thread.run_sync(work, self.conn)
            except (psycopg.Error, EventsrcError) as exc:
                reason = database_reason(exc)
                if (getattr(exc, "sqlstate", None) or "")[:2] in DATA_CLASSES:
                    return reason
                self._database_failing(reason)
                for m in messages:
                    await self.aio(m.in_progress)  # not delivered to another sink while this one waits
                await trio.sleep(backoff.next())
                continue
            self._database_back()
            return outcome

    async def _store_alone(self, batch: list[Message], reason: str, messages: Sequence[Any]) -> None:
        """Each message of a fetch the database refused for its data, in a transaction of its own;
        the one refused alone is quarantined with the database's reason (retried as a store is)."""
        if len(batch) > 1:
            for one in batch:
                await self._store([one], messages)
            return
        log.warning("the database refused a message; quarantined", subject=batch[0].subject[:300], reason=reason)
        why = Refusal(DATABASE, f"the database refused it: {reason}", seq=batch[0].headers.get(SEQ, "")[:40])
        got = await self._until_taken(lambda conn: quarantine_one(conn, batch[0], why), messages)
        if isinstance(got, str):  # not even its bytes and reason: nothing more can be kept of it
            log.warning(
                "the database refused to quarantine a message; dropped", subject=batch[0].subject[:300], reason=got
            )
        else:
            self.metrics.count(got)

    def _database_failing(self, reason: str) -> None:
        self.metrics.database_failures.inc()
        self.metrics.database_down.set(1)
        if reason != self._database_said:
            log.warning("the database refuses the records; retrying", reason=reason)
            self._database_said = reason

    def _database_back(self) -> None:
        self.metrics.database_down.set(0)
        if self._database_said:
            log.info("the database takes records again")
            self._database_said = ""
