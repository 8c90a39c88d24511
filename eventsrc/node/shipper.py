"""Fleet shipping: every record of the node's log, in sequence order, to a NATS JetStream
stream (issue 28; ``core.fleet_names`` names the subjects, ids and headers).

    run()              connect (nats-py, on trio-asyncio's loop), with backoff while the
                       servers are away; nothing on the admission path waits for it
      the stream       created when missing (``ensure_stream``)
      resume           from the last message the stream holds on this node's subject: the
                       stream says what was acknowledged, not a local cursor
      publish          each record from there as the log holds it, one at a time, each
                       acknowledged by JetStream before the next (the ``Nats-Msg-Id`` makes a
                       publish retried after a lost acknowledgement a duplicate it drops);
                       then wait for the log's next record

Not yet (issue 28): records a retention cut took before they were shipped are not read from
the archive (the shipper says which it could not ship, once), retention does not wait for
shipping, and status, metrics and /healthz do not show it yet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import nats
import nats.errors
import nats.js.errors
import trio
from nats.js import JetStreamContext

from eventsrc.core.fleet_names import (
    DEFAULT_PREFIX,
    DEFAULT_STREAM,
    DUPLICATE_WINDOW_S,
    Node,
    acknowledged,
    stream_subjects,
)
from eventsrc.events import CorruptRecordError, decode_record
from eventsrc.log.store import EventLog, key_seq
from eventsrc.obs.logger import get_logger
from eventsrc.rpc.bridge import to_aio

log = get_logger("eventsrc.node.shipper")

BACKOFF_FIRST, BACKOFF_MAX = 0.25, 10.0
CONNECT_TIMEOUT = 5.0
PUBLISH_TIMEOUT = 10.0
CHUNK = 256  # records read from the log at a time

#: what a NATS server or connection that went away raises; ValueError: the stream's last
#: message on this node's subject is not this log's (``fleet_names.acknowledged``)
FAILURES: tuple[type[BaseException], ...] = (
    ValueError,
    OSError,
    asyncio.TimeoutError,
    trio.TooSlowError,
    nats.errors.Error,
    nats.js.errors.Error,
)


@dataclass(frozen=True)
class FleetOptions:
    """``serve --fleet-nats``: the servers, the stream, this node's name."""

    servers: tuple[str, ...]
    node_name: str
    stream: str = DEFAULT_STREAM
    prefix: str = DEFAULT_PREFIX


async def ensure_stream(js: JetStreamContext, stream: str, prefix: str = DEFAULT_PREFIX) -> None:
    """The stream, created when missing (docs/fleet.md): every node's records, kept on disk,
    a message id stored once within the duplicate window. An asyncio coroutine (``to_aio``)."""
    try:
        await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        config: dict[str, Any] = {
            "name": stream,
            "subjects": stream_subjects(prefix),
            "storage": "file",
            "duplicate_window": DUPLICATE_WINDOW_S,
        }
        await js.add_stream(**config)
        log.info("fleet stream created", stream=stream)


class Shipper:
    """Ships ``event_log`` to the fleet; ``appended(seq)`` returns once the log holds ``seq``."""

    def __init__(self, event_log: EventLog, appended: Callable[[int], Awaitable[None]], options: FleetOptions) -> None:
        self.event_log = event_log
        self.appended = appended
        self.options = options
        self.node = Node(options.node_name, event_log.log_id())
        self.shipped = 0  # the last sequence JetStream acknowledged (0: none known yet)
        self.connected = False
        self._said = ""  # the last trouble logged, said once until it changes
        self._gap_said = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Ship for as long as the daemon runs: connect again with backoff whenever the
        connection or the servers go."""
        task_status.started()
        backoff = BACKOFF_FIRST
        while True:
            try:
                await self._session()
            except FAILURES as exc:
                self._say(str(exc) or type(exc).__name__)
            except Exception:  # a bug here must not end the daemon: shipping is beside its work
                log.exception("fleet shipping failed unexpectedly; retrying")
            if self.connected:
                backoff = BACKOFF_FIRST
            self.connected = False
            await trio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    def _say(self, reason: str) -> None:
        if reason != self._said:
            log.warning("fleet shipping disconnected; retrying", servers=",".join(self.options.servers), reason=reason)
            self._said = reason

    async def _session(self) -> None:
        nc = await connect(self.options.servers)
        try:
            js = nc.jetstream()
            await to_aio(ensure_stream)(js, self.options.stream, self.options.prefix)
            self.shipped = await to_aio(self._acknowledged)(js)
            self.connected = True
            self._said = ""
            log.info("fleet shipping connected", servers=",".join(self.options.servers), from_seq=self.shipped + 1)
            await self._ship(js)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CONNECT_TIMEOUT):
                await to_aio(nc.close)()

    async def _acknowledged(self, js: JetStreamContext) -> int:
        try:
            last = await js.get_last_msg(self.options.stream, self.node.subject(self.options.prefix))
        except nats.js.errors.NotFoundError:
            return 0
        return acknowledged(self.node, dict(last.headers or {}))

    async def _ship(self, js: JetStreamContext) -> None:
        subject = self.node.subject(self.options.prefix)
        while True:
            wanted = self.shipped + 1
            await self.appended(wanted)
            first = self.event_log.first_seq()
            if wanted < first:
                self._say_cut(wanted, first - 1)
                wanted = first
            chunk = next(
                iter(self.event_log.raw_chunks(wanted, min(self.event_log.last_seq(), wanted + CHUNK - 1))), []
            )
            for key, value in chunk:
                seq = key_seq(key)
                headers = self.node.headers(seq, _type_of(seq, value), follows=self.shipped)
                await to_aio(js.publish)(
                    subject, value, timeout=PUBLISH_TIMEOUT, stream=self.options.stream, headers=headers
                )
                self.shipped = seq

    def _say_cut(self, first: int, last: int) -> None:
        if last > self._gap_said:
            log.warning(
                "records were cut from the live log before they were shipped: not shipped (not built yet: "
                "shipping from the archive)",
                first_seq=first,
                last_seq=last,
            )
            self._gap_said = last


def _type_of(seq: int, value: bytes) -> str:
    """The record's event type, for the message's header ("" for a corrupt record: it is
    shipped as the log holds it, and the sink names it corrupt as the log's readers do)."""
    try:
        return type(decode_record(seq, value).event).__name__
    except CorruptRecordError:
        return ""


async def _quiet(exc: Exception) -> None:
    """nats-py's error callback: what went wrong is said by whoever called, once."""


async def connect(servers: Sequence[str]) -> nats.NATS:
    """One connection to the first of ``servers`` that answers, or an error within the connect
    timeout (nats-py alone would retry the servers for ever); it does not reconnect: the
    caller connects again, and resumes from the stream."""
    with trio.fail_after(CONNECT_TIMEOUT * max(1, len(servers)) + 1):
        nc: nats.NATS = await to_aio(nats.connect)(
            servers=list(servers),
            connect_timeout=CONNECT_TIMEOUT,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            error_cb=_quiet,
        )
    return nc
