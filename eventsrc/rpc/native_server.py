"""A gRPC server in trio, for the daemon's own node API (ADR 0011).

The node API is on every admission's path. Served by grpclib, each request crossed from
asyncio into trio and back (``trio_asyncio``); here the ``h2`` state machine (the HTTP/2
library grpclib itself uses) runs on a trio unix socket and the handlers run as trio
tasks. The services are the grpclib-generated ``*Base`` classes, unchanged: their
``__mapping__()`` routes a path to a handler, and a handler gets a ``Stream`` with
``recv_message`` and ``send_message``, as under grpclib. Unary and server-streaming
methods only (all the node API has).

One task per connection reads frames; each request that has ended gets its own task in
that connection's nursery; a reset stream cancels its task, a lost connection cancels
them all. Messages over the received-message limit are refused (RESOURCE_EXHAUSTED),
compressed ones too (UNIMPLEMENTED); an unknown path is UNIMPLEMENTED; a handler's
GRPCError is its status; anything else it raises is logged and answered UNKNOWN. A
request that is not gRPC (not POST, another content-type, no ``te: trailers``) gets
grpclib's answer: HTTP 405, 415 or 400.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import trio
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError
from grpclib.metadata import decode_timeout, encode_grpc_message

from eventsrc.obs.logger import get_logger
from eventsrc.rpc.bridge import bind_unix, check_prefix, frame, max_received, send_some, unframe

log = get_logger("eventsrc.grpc")

_READ = 65536
#: What a socket raises once the peer is gone (or we closed it): the end of a connection.
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError)


def parse_timeout(value: bytes | None) -> float | None:
    """Seconds from a ``grpc-timeout`` header (None: absent or malformed)."""
    if not value:
        return None
    try:
        return decode_timeout(value.decode("ascii"))
    except (ValueError, KeyError, UnicodeDecodeError):
        return None


class _Connection:
    def __init__(self, sock: trio.SocketStream) -> None:
        self.sock = sock
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(
                # As grpclib configures h2 for every other gRPC socket of the daemon: our own
                # headers are fixed and valid, and a request's are checked by ``_refusal``
                # for what the server reads (h2's generic checks were ~10% of an admission).
                client_side=False,
                header_encoding=None,
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
                validate_inbound_headers=False,
                normalize_inbound_headers=False,
            )
        )
        self._send_lock = trio.Lock()
        self.window = trio.Event()  # set (and replaced) whenever the peer opens a window

    async def flush(self) -> None:
        """Send what h2 has queued. h2 counts it as sent once taken, so a send cut short
        (a cancelled handler, a deadline) leaves the connection unusable: it is closed,
        which ends its reader and every call on it."""
        async with self._send_lock:
            data = self.h2.data_to_send()
            if data:
                try:
                    await self.sock.send_all(data)
                except BaseException:
                    self.sock.socket.close()
                    raise

    def window_opened(self) -> None:
        self.window.set()
        self.window = trio.Event()


@dataclass(eq=False)
class _Request:
    headers: dict[bytes, bytes]
    data: bytearray = field(default_factory=bytearray)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    reset: bool = False
    too_big: bool = False


class Stream:
    """What a handler gets: its request, and a way to send its answers."""

    def __init__(self, conn: _Connection, sid: int, request: Any) -> None:
        self._conn = conn
        self._sid = sid
        self._request = request
        self.headers_sent = False

    async def recv_message(self) -> Any:
        """The request (once), then None."""
        request, self._request = self._request, None
        return request

    async def send_message(self, message: Any) -> None:
        conn, h2c, sid = self._conn, self._conn.h2, self._sid
        if not self.headers_sent:
            h2c.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc+proto")])
            self.headers_sent = True
        data = frame(message)
        while True:
            opened = conn.window  # taken first: an opening that comes while we flush counts
            data = send_some(h2c, sid, data, end_stream=False)
            if not data:
                break
            await conn.flush()
            await opened.wait()  # until the peer opens the window
        await conn.flush()

    async def finish(self, status: Status | None, message: str | None, http_status: bytes = b"200") -> None:
        """The trailers, or a trailers-only answer when nothing was sent: then with
        ``http_status`` (not 200 only for a request that is not gRPC, which gets no
        content-type either, as from grpclib)."""
        trailers = [] if status is None else [(b"grpc-status", str(status.value).encode())]
        if message:
            trailers.append((b"grpc-message", encode_grpc_message(message).encode()))
        if not self.headers_sent:
            content = [(b"content-type", b"application/grpc+proto")] if http_status == b"200" else []
            trailers = [(b":status", http_status), *content, *trailers]
        self._conn.h2.send_headers(self._sid, trailers, end_stream=True)
        await self._conn.flush()


async def serve_unix_trio(
    services: Sequence[Any],
    path: Path,
    mode: int | None = None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``services`` (grpclib ``*Base`` instances) on the unix socket ``path`` until
    cancelled. A stale socket file is replaced; ``mode`` is set between bind and listen,
    so no connection is ever accepted under another mode; the socket is removed on exit."""
    mapping: dict[str, Any] = {}
    for service in services:
        mapping.update(service.__mapping__())
    sock = trio.socket.from_stdlib_socket(bind_unix(path, mode))
    try:
        sock.listen(128)
    except BaseException:
        sock.close()
        path.unlink(missing_ok=True)
        raise
    task_status.started()
    try:
        await trio.serve_listeners(partial(_serve_connection, mapping), [trio.SocketListener(sock)])
    finally:
        path.unlink(missing_ok=True)


async def _serve_connection(mapping: Mapping[str, Any], sock: trio.SocketStream) -> None:
    conn = _Connection(sock)
    h2c = conn.h2
    requests: dict[int, _Request] = {}
    limit = max_received()
    try:
        h2c.initiate_connection()
        await conn.flush()
        async with trio.open_nursery() as nursery:
            ending = False
            while not ending:
                try:
                    data = await sock.receive_some(_READ)
                except _GONE:
                    break
                if not data:
                    break
                try:
                    events = h2c.receive_data(data)
                except h2.exceptions.ProtocolError:
                    with contextlib.suppress(*_GONE):
                        await conn.flush()  # the GOAWAY h2 queued
                    break
                for e in events:
                    if isinstance(e, h2.events.RequestReceived):
                        requests[e.stream_id] = _Request(dict(e.headers))
                    elif isinstance(e, h2.events.DataReceived):
                        h2c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                        req = requests.get(e.stream_id)
                        if req is not None and not req.too_big:
                            req.data += e.data
                            if limit is not None and len(req.data) > limit + 5:
                                req.too_big, req.data = True, req.data[:5]
                    elif isinstance(e, h2.events.StreamEnded):
                        req = requests.get(e.stream_id)
                        if req is not None:
                            nursery.start_soon(_handle, conn, mapping, e.stream_id, req, requests)
                    elif isinstance(e, h2.events.StreamReset):
                        req = requests.pop(e.stream_id, None)
                        if req is not None:
                            req.reset = True
                            req.scope.cancel()
                    elif isinstance(e, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
                        conn.window_opened()
                    elif isinstance(e, h2.events.ConnectionTerminated):
                        ending = True  # the client said goodbye: its calls cannot be answered
                try:
                    await conn.flush()
                except _GONE:
                    break
            nursery.cancel_scope.cancel()  # the connection is gone: so are its calls
    finally:
        with trio.CancelScope(shield=True):
            await sock.aclose()


_Answer = tuple[bytes, Status | None, str | None]  # HTTP status, gRPC status, message


def _refusal(headers: dict[bytes, bytes]) -> _Answer | None:
    """What grpclib's server answers a request that is not gRPC: (HTTP status, gRPC
    status, message), or None for a gRPC request."""
    if headers.get(b":method") != b"POST":
        return b"405", None, None
    content_type = headers.get(b"content-type")
    if content_type is None:
        return b"415", Status.UNKNOWN, "Missing content-type header"
    if content_type not in (b"application/grpc", b"application/grpc+proto"):
        return b"415", Status.UNKNOWN, "Unacceptable content-type header"
    if headers.get(b"te") != b"trailers":
        return b"400", Status.UNKNOWN, 'Required "te: trailers" header is missing'
    return None


async def _handle(
    conn: _Connection, mapping: Mapping[str, Any], sid: int, req: _Request, requests: dict[int, _Request]
) -> None:
    stream = Stream(conn, sid, None)
    try:
        answer = _refusal(req.headers) or await _call(stream, mapping, req)
    finally:
        requests.pop(sid, None)
    if req.reset or answer is None:
        return  # the client reset the stream or went away: nobody to answer
    # The client may have gone away first.
    with contextlib.suppress(h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError, *_GONE):
        await stream.finish(answer[1], answer[2], http_status=answer[0])


async def _call(stream: Stream, mapping: Mapping[str, Any], req: _Request) -> _Answer | None:
    """Run the request's handler under its deadline; how to end the call (None: the
    client is gone)."""
    path = req.headers.get(b":path", b"").decode(errors="replace")
    handler = mapping.get(path)
    try:
        with req.scope:
            timeout = parse_timeout(req.headers.get(b"grpc-timeout"))
            with trio.move_on_after(timeout) if timeout is not None else trio.CancelScope() as deadline:
                if handler is None or handler.cardinality not in (Cardinality.UNARY_UNARY, Cardinality.UNARY_STREAM):
                    raise GRPCError(Status.UNIMPLEMENTED, f"Method not found: {path}")
                stream._request = _decode(req, handler.request_type)
                await handler.func(stream)
            if deadline.cancelled_caught:
                return b"200", Status.DEADLINE_EXCEEDED, "Deadline exceeded"
    except GRPCError as exc:
        return b"200", exc.status, exc.message
    except (*_GONE, h2.exceptions.StreamClosedError):
        return None
    except Exception:
        log.exception("node API handler failed", method=path)
        return b"200", Status.UNKNOWN, "Internal Server Error"
    return b"200", Status.OK, None


def _decode(req: _Request, message_type: Any) -> Any:
    if req.too_big:  # only its prefix was kept: over the limit, or more than one message
        check_prefix(req.data[:5], max_received())
        raise GRPCError(Status.INTERNAL, "the request is not exactly one message")
    return unframe(req.data, message_type, "request", max_received())
