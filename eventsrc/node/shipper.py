"""Fleet shipping: every record of the node's log, in sequence order, to a NATS JetStream
stream (issue 28, ADR 0031 and 0032; ``core.fleet_names`` names the subjects, ids and
headers, ``core.shipping`` decides the resume and says how it fares).

    run()              connect (nats-py, on trio-asyncio's loop), with backoff while the
                       servers are away; nothing on the admission path waits for it
      the stream       created when missing (``ensure_stream``)
      resume           from the last message the stream holds on this node's subject (the
                       stream says what was acknowledged, not a local cursor), after checking
                       that it is the log's record at that sequence, byte for byte: when not
                       (a log restored from a backup behind the stream), nothing is shipped,
                       it is said once, and the next connection checks again
      publish          the records from there as the log holds them: the archive's
                       (``History.stored``, read in a worker thread) while they are before the
                       live log's first, then the live log's; ``WINDOW`` publishes in flight
                       (``publish_window``); ``shipped`` is the highest sequence up to which
                       JetStream acknowledged every record (retention's age cuts wait for it)

What neither the live log nor the archive holds any more (cut without an archive, a segment
deleted or damaged) is said once and passed over: the next record names the last one shipped
(``Eventsrc-Follows``), so the sink does not wait for it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
import trio
from nats.js import JetStreamContext

from eventsrc.core.backoff import Backoff
from eventsrc.core.fleet_names import (
    DEFAULT_PREFIX,
    DEFAULT_STREAM,
    Node,
    acknowledged,
)
from eventsrc.core.shipping import (
    CONNECTED,
    CONNECTING,
    DISCONNECTED,
    DIVERGED,
    WALK,
    Seen,
    ShippingReport,
    State,
    judge,
    namesakes,
    record_time,
    resume_from,
)
from eventsrc.errors import EventsrcError, LogCutWhileReadingError
from eventsrc.events import CorruptRecordError, Record, chain_hash, decode_record
from eventsrc.log.history import History
from eventsrc.log.store import EventLog, key_seq
from eventsrc.obs.logger import get_logger
from eventsrc.rpc.bridge import to_aio
from eventsrc.rpc.jetstream import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    CONNECT_TIMEOUT,
    FAILURES,
    PERMISSIONS_VIOLATION,
    NatsAuth,
    connect,
    ensure_stream,
)

log = get_logger(__name__)

PUBLISH_TIMEOUT = 10.0
CHUNK = 256  # records read from the log (or the archive) at a time
#: publishes in flight at once: JetStream acknowledges them in order on one connection, and a
#: batch of CHUNK records costs a round trip per WINDOW instead of one per record
WINDOW = 64
#: s: how often, while shipping, the stream is asked for other logs under this node's name
NAMESAKES_EVERY = 60.0


@dataclass(frozen=True)
class FleetOptions:
    """``serve --fleet-nats``: the servers, the stream, this node's name, its credentials."""

    servers: tuple[str, ...]
    node_name: str
    stream: str = DEFAULT_STREAM
    prefix: str = DEFAULT_PREFIX
    replicas: int = 1
    auth: NatsAuth | None = None  # None: no credentials


class DivergedError(Exception):
    """The stream's last record of this log is not the log's (``core.shipping.divergence``)."""


class Shipper:
    """Ships ``event_log`` (and what retention cut into ``archive``) to the fleet;
    ``appended(seq)`` returns once the log holds ``seq``."""

    def __init__(
        self,
        event_log: EventLog,
        appended: Callable[[int], Awaitable[None]],
        options: FleetOptions,
        archive: Path | None = None,
        window: int = WINDOW,
    ) -> None:
        self.event_log = event_log
        self.appended = appended
        self.options = options
        self.archive = archive
        self.window = max(1, window)
        self.node = Node(options.node_name, event_log.log_id())
        #: every record up to it is acknowledged by JetStream (0: none known yet)
        self.shipped = 0
        self.state: State = CONNECTING
        self.reason = ""  # why disconnected or diverged
        self.forgery = ""  # the last message on the subject found not to be this log's record
        self.namesake = ""  # other logs shipping under this node's name, as last said
        self._namesakes_due = 0.0  # trio's clock: when to ask the stream for them again
        self._known = False  # ``shipped`` was learnt from the stream in this run
        self._ts: dict[int, int] = {}  # the time of each record of the batch in flight
        self._history: History | None = None  # while shipping from the archive
        self._said = ""  # the last trouble logged, said once until it changes
        self._gap_said = 0
        self._was_up = False  # the session under way connected

    def report(self) -> ShippingReport:
        """How shipping fares, for status, the metrics and /healthz (one LMDB read at most)."""
        return ShippingReport(
            state=self.state,
            reason=self.reason or self.forgery or self.namesake,
            shipped_seq=self.shipped,
            last_seq=self.event_log.last_seq(),
            oldest_unshipped_ns=self._oldest_unshipped_ns(),
        )

    def _oldest_unshipped_ns(self) -> int:
        seq = self.shipped + 1
        if seq > self.event_log.last_seq():
            return 0
        if seq in self._ts:
            return self._ts[seq]
        if seq >= self.event_log.first_seq():
            (item,) = self.event_log.read_many([seq])
            if isinstance(item, Record):
                return item.ts_ns
        base = self.event_log.base()  # in the archive: its records are no newer than the base
        return base.ts_ns if base is not None else 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Ship for as long as the daemon runs: connect again with backoff whenever the
        connection or the servers go, or the stream and the log diverged."""
        task_status.started()
        backoff = Backoff(BACKOFF_FIRST, BACKOFF_MAX)
        while True:
            self._was_up = False
            try:
                await self._session()
            except DivergedError as exc:
                self._trouble(DIVERGED, str(exc))
            except FAILURES as exc:
                self._trouble(DISCONNECTED, str(exc) or type(exc).__name__)
            except Exception as exc:  # a bug here must not end the daemon: shipping is beside its work
                log.exception("fleet shipping failed unexpectedly; retrying")
                self._trouble(DISCONNECTED, f"unexpected: {type(exc).__name__}", said=True)
            if self._was_up:  # a connection that worked: the next attempt comes soon
                backoff.reset()
            await trio.sleep(backoff.next())

    def _trouble(self, state: State, reason: str, said: bool = False) -> None:
        """Not shipping, for ``reason``: said once until it changes."""
        self.state, self.reason = state, reason
        if reason == self._said or said:
            self._said = reason
            return
        servers = ",".join(self.options.servers)
        if state == DIVERGED:
            log.error(
                "fleet shipping stopped: the stream and the log diverged; not shipping, checking again at "
                "each connection",
                servers=servers,
                reason=reason,
            )
        else:
            log.warning("fleet shipping disconnected; retrying", servers=servers, reason=reason)
        self._said = reason

    async def _session(self) -> None:
        lost = trio.CancelScope()  # cancelled when the connection closes (the server went)
        refusals: list[Exception] = []

        async def closed() -> None:
            lost.cancel()

        async def error(exc: Exception) -> None:
            if PERMISSIONS_VIOLATION in str(exc).lower():  # the request is never answered: now, not at its timeout
                refusals.append(exc)
                lost.cancel()

        nc = await connect(self.options.servers, closed, self.options.auth, error)
        try:
            with lost:
                js = nc.jetstream()
                await to_aio(ensure_stream)(js, self.options.stream, self.options.prefix, self.options.replicas)
                stream_last = await self._resume(js)
                await self._namesakes(js)
                self.shipped = resume_from(stream_last, self.shipped if self._known else None, self.window)
                self._known = True
                self.state, self.reason, self._said, self._was_up = CONNECTED, "", "", True
                log.info("fleet shipping connected", servers=",".join(self.options.servers), from_seq=self.shipped + 1)
                await self._ship(js)
            if refusals:
                raise ConnectionError(f"the server refused: {refusals[0]}")
            raise ConnectionError(f"the connection closed ({nc.last_error or 'by the server'})")
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CONNECT_TIMEOUT):
                await to_aio(nc.close)()

    async def _resume(self, js: JetStreamContext) -> int:
        """The last sequence of this log the stream holds on its subject, once checked against the
        log (``shipping.judge``): DivergedError when the stream holds a fork of it; messages after
        the log's own that are none of its history (another publisher's) are said, and passed
        over: the log's own records go after them, under ids nobody could take first."""
        walk, complete = await self._walk(js)
        if not walk:
            return 0
        resume = judge(walk, self.event_log.last_seq(), complete)
        if resume.diverged:
            raise DivergedError(resume.diverged)
        if resume.forged:
            self._forged(resume.forged)
        return resume.stream_last

    async def _namesakes(self, js: JetStreamContext) -> None:
        """Other logs shipped under this node's name that wrote after this log began (two nodes
        given one name): said once, and in status (``shipping.namesakes``). Asked at each
        connection, and every ``NAMESAKES_EVERY`` while shipping."""
        others = await to_aio(self._other_logs)(js)
        first = await trio.to_thread.run_sync(self._first_time)
        said = namesakes(self.node.name, first, others)
        self._namesakes_due = trio.current_time() + NAMESAKES_EVERY
        if said and said != self.namesake:
            log.warning("another log ships under this node's name", node=self.node.name, reason=said)
        self.namesake = said

    async def _other_logs(self, js: JetStreamContext) -> list[tuple[str, int]]:
        """(log id, the time of its last record) of each other log on this node name's subjects.
        An asyncio coroutine (``to_aio``)."""
        own = self.node.subject(self.options.prefix)
        info = await js.stream_info(self.options.stream, subjects_filter=own.rsplit(".", 1)[0] + ".*")
        others: list[tuple[str, int]] = []
        for subject in sorted((info.state.subjects or {}) if info.state else {}):
            if subject != own:
                raw = await self._last_raw(js, subject)
                if raw is not None:
                    others.append((subject.rsplit(".", 1)[1], record_time(dict(raw.headers or {}), raw.data or b"")))
        return others

    def _first_time(self) -> int:
        """The time of the live log's first record (0: none yet). A worker thread's."""
        first = self.event_log.first_seq()
        if first > self.event_log.last_seq():
            return 0
        (item,) = self.event_log.read_many([first])
        return item.ts_ns if isinstance(item, Record) else 0

    async def _walk(self, js: JetStreamContext) -> tuple[list[Seen], bool]:
        """The messages on this log's subject, newest first, down to the first that is the log's
        own record (at most ``WALK``); and whether the subject's first was reached."""
        subject = self.node.subject(self.options.prefix)
        walk: list[Seen] = []
        raw = await to_aio(self._last_raw)(js, subject)
        while raw is not None and len(walk) < WALK:
            headers, data = dict(raw.headers or {}), raw.data or b""
            try:
                seq: int | None = acknowledged(self.node, headers)
            except ValueError:
                seq = None
            ours = await trio.to_thread.run_sync(self._stored_at, seq) if seq else None
            before = await trio.to_thread.run_sync(self._stored_at, seq - 1) if seq and seq > 1 else None
            walk.append(Seen(seq, data, ours, before))
            if seq is not None and (data == ours or (ours is None and seq <= self.event_log.last_seq())):
                return walk, False
            raw = await to_aio(self._previous_raw)(js, subject, raw.seq or 0)
        return walk, raw is None

    async def _last_raw(self, js: JetStreamContext, subject: str) -> Any:
        try:
            return await js.get_last_msg(self.options.stream, subject)
        except nats.js.errors.NotFoundError:
            return None

    async def _previous_raw(self, js: JetStreamContext, subject: str, before: int) -> Any:
        """The message on ``subject`` before stream sequence ``before`` (None: none): JetStream
        gives the next message on a subject from a sequence, so it is found by halving."""

        async def first_from(seq: int) -> Any:
            try:
                return await js.get_msg(self.options.stream, seq=seq, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                return None

        found = await first_from(1)
        if found is None or (found.seq or 0) >= before:
            return None
        low, high = found.seq or 0, before - 1  # the last on the subject before ``before`` is in [low, high]
        while low < high:
            mid = (low + high + 1) // 2
            got = await first_from(mid)
            if got is not None and (got.seq or 0) < before:
                low, found = got.seq or 0, got  # at or after mid: the range shrinks from below
            else:
                high = mid - 1  # none on the subject from mid to before
        return found

    def _forged(self, reason: str) -> None:
        """A message on this log's subject is not this log's record: said once, in status too."""
        if reason != self.forgery:
            log.warning(
                "a message on this node's subject is not this node's record (another publisher?); shipping "
                "the node's own",
                subject=self.node.subject(self.options.prefix),
                reason=reason,
            )
            self.forgery = reason

    def _stored_at(self, seq: int) -> bytes | None:
        """Record ``seq`` as the log stored it, from the live log or the archive (None when
        neither holds it; past the log's end too). A worker thread's."""
        if seq > self.event_log.last_seq():
            return None
        if seq >= self.event_log.first_seq():
            try:
                for chunk in self.event_log.raw_chunks(seq, seq, strict=True):
                    return chunk[0][1]
            except LogCutWhileReadingError:
                pass  # cut meanwhile: it is in the archive now
        try:
            got = History(self.event_log, self.archive).stored(seq, 1)
        except EventsrcError:
            return None
        return got[0][1] if got else None

    async def _ship(self, js: JetStreamContext) -> None:
        subject = self.node.subject(self.options.prefix)
        while True:
            wanted = self.shipped + 1
            await self.appended(wanted)
            batch, next_wanted = await self._batch(wanted)
            if not batch:
                await self.appended(next_wanted)  # what was passed over leaves nothing to send yet
                continue
            messages, follows, self._ts = [], self.shipped, {}
            for seq, value in batch:
                kind, self._ts[seq] = _type_and_time(seq, value)
                messages.append(
                    (seq, value, self.node.headers(seq, kind, follows=follows, value_hash=chain_hash(value)))
                )
                follows = seq
            await to_aio(publish_window)(
                js, subject, self.options.stream, messages, self.window, PUBLISH_TIMEOUT, self._acked
            )
            if trio.current_time() >= self._namesakes_due:  # asked again now and then, not per batch
                await self._namesakes(js)

    def _acked(self, seq: int) -> None:
        self.shipped = seq
        self._ts.pop(seq, None)

    async def _batch(self, wanted: int) -> tuple[list[tuple[int, bytes]], int]:
        """Up to CHUNK records from ``wanted`` on, (seq, stored value), without a gap: the
        archive's while ``wanted`` is before the live log, else the live log's; and where the
        next batch starts when this one is empty (after what no one holds any more)."""
        if wanted < self.event_log.first_seq():
            got, held = await trio.to_thread.run_sync(self._archived, wanted)
            if held > wanted:
                self._say_cut(wanted, held - 1)
            if got:
                return got, held
            wanted = held  # nothing archived from there: the live log's first
        else:
            self._history = None  # the archive is behind: what it loaded goes
        last = self.event_log.last_seq()
        try:
            chunk = next(iter(self.event_log.raw_chunks(wanted, min(last, wanted + CHUNK - 1), strict=True)), [])
        except LogCutWhileReadingError:
            return [], self.shipped + 1  # cut meanwhile: from the archive, at once
        return [(key_seq(k), v) for k, v in chunk], wanted

    def _archived(self, wanted: int) -> tuple[list[tuple[int, bytes]], int]:
        """Up to CHUNK archived records from the first at or after ``wanted`` that a segment
        holds, and that first (the live log's first when none does). A worker thread's."""
        if self._history is None:
            self._history = History(self.event_log, self.archive)
        else:
            self._history.refresh()  # cut again meanwhile
        history = self._history
        while True:
            held = history.held_from(wanted)
            if held >= history.live_first_seq():
                return [], held
            try:
                return history.stored(held, CHUNK), held
            except EventsrcError as exc:  # a damaged segment: what it holds is gone too
                end = next(e.last for e, _ in history.segments if e.first <= held <= e.last)
                log.warning("an archive segment cannot be shipped", first_seq=held, last_seq=end, reason=str(exc))
                history.segments = [(e, p) for e, p in history.segments if e.last != end]
                wanted = end + 1

    def _say_cut(self, first: int, last: int) -> None:
        if last > self._gap_said:
            log.warning(
                "records were cut from the live log before they were shipped and the archive does not hold "
                "them: not shipped",
                first_seq=first,
                last_seq=last,
            )
            self._gap_said = last


async def publish_window(
    js: JetStreamContext,
    subject: str,
    stream: str,
    messages: Sequence[tuple[int, bytes, dict[str, str]]],
    window: int,
    timeout: float,
    acked: Callable[[int], None],
) -> None:
    """Publish ``messages`` (seq, payload, headers) in order with at most ``window`` in
    flight (nats-py's ``publish_async``), and call ``acked(seq)`` for each as JetStream
    acknowledges it, in order: the first error (or an acknowledgement later than ``timeout``)
    is raised, and what is still in flight is cancelled. An asyncio coroutine (``to_aio``)."""
    pending: deque[tuple[int, asyncio.Future[Any]]] = deque()

    async def oldest() -> None:
        seq, future = pending[0]
        await asyncio.wait_for(future, timeout)
        pending.popleft()
        acked(seq)

    try:
        for seq, payload, headers in messages:
            while len(pending) >= window:
                await oldest()
            pending.append((seq, await js.publish_async(subject, payload, stream=stream, headers=headers)))
        while pending:
            await oldest()
    finally:
        for _, future in pending:
            future.cancel()


def _type_and_time(seq: int, value: bytes) -> tuple[str, int]:
    """The record's event type, for the message's header, and its time ("" and 0 for a
    corrupt record: it is shipped as the log holds it, and the sink names it corrupt as the
    log's readers do)."""
    try:
        record = decode_record(seq, value)
    except CorruptRecordError:
        return "", 0
    return type(record.event).__name__, record.ts_ns
