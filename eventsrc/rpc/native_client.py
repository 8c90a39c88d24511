"""Unary gRPC calls from trio, without the asyncio bridge (ADR 0011).

The daemon's calls to device plugins (Allocate, GetPreferredAllocation, PreStartContainer)
sit on the admission path. Through grpclib they cross into asyncio and back
(``trio_asyncio``), which cost more than the call itself. This client speaks gRPC over
HTTP/2 with the ``h2`` state machine directly on a trio unix socket: one connection per
plugin, one call at a time on it (a lock), the response read by the caller itself, so no
background task is needed.

What it speaks, as gRPC's HTTP/2 protocol document says: a POST with ``content-type:
application/grpc``, ``te: trailers`` and ``grpc-timeout``; the request as one
length-prefixed message; the answer's headers, one length-prefixed message and the
trailers with ``grpc-status`` and ``grpc-message`` (or a trailers-only answer). Failures
are grpclib's exception types, so callers handle both clients alike (``rpc.CALL_ERRORS``).
Compressed answers are refused; an answer over the message limit is refused from its
5-byte prefix.
"""

from __future__ import annotations

import math
from typing import TypeVar

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import trio
from google.protobuf.message import Message
from grpclib.const import Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.metadata import decode_grpc_message

from eventsrc.rpc.bridge import check_prefix, frame, send_some, unframe

M = TypeVar("M", bound=Message)

_READ = 65536


class _Reconnect(Exception):
    """The reused connection was gone before the request was written: try a fresh one."""


def grpc_timeout(seconds: float) -> bytes:
    """The ``grpc-timeout`` header value: at most 8 digits and a unit."""
    ms = max(1, math.ceil(seconds * 1000))
    if ms < 100_000_000:
        return b"%dm" % ms
    return b"%dS" % min(math.ceil(seconds), 99_999_999)


class UnaryChannel:
    """Unary gRPC calls to the server on the unix socket ``path``.

    The connection is opened on the first call and kept; a call that fails in any way
    closes it (the next call opens a new one). Not for streaming calls.
    """

    def __init__(self, path: str, max_message: int | None = None, authority: str = "localhost") -> None:
        self.path = path
        self.max_message = max_message
        self._authority = authority.encode()
        self._lock = trio.Lock()
        self._sock: trio.SocketStream | None = None
        self._conn: h2.connection.H2Connection | None = None

    async def call(self, method: str, request: Message, response_type: type[M], timeout: float | None) -> M:
        """Call ``method`` (``/package.Service/Method``) with ``request``; its answer.

        Raises GRPCError for a status other than OK (and for an answer that is not one
        message of ``response_type``), StreamTerminatedError or ProtocolError when the
        connection fails, OSError when the socket cannot be dialled, trio.TooSlowError
        after ``timeout`` seconds.

        A kept connection found dead while the request is written (the plugin restarted)
        is dialled again once. Once a request is written it is never sent again: a plugin
        may have acted on it (Allocate is not idempotent), so a connection lost after
        that is the call's error.
        """
        async with self._lock:
            with trio.fail_after(timeout) if timeout is not None else trio.CancelScope():
                try:
                    try:
                        return await self._call(method, request, response_type, timeout)
                    except _Reconnect:
                        self.close()
                        return await self._call(method, request, response_type, timeout)
                except BaseException:
                    self.close()
                    raise

    def close(self) -> None:
        sock, self._sock, self._conn = self._sock, None, None
        if sock is not None:
            sock.socket.close()

    async def _connect(self) -> tuple[trio.SocketStream, h2.connection.H2Connection]:
        sock = await trio.open_unix_socket(self.path)
        try:
            conn = h2.connection.H2Connection(
                h2.config.H2Configuration(
                    # As grpclib configures h2: our own headers are fixed and valid, and of the
                    # peer's only :status, content-type, grpc-status and grpc-message are read
                    # (and checked).
                    client_side=True,
                    header_encoding=None,
                    validate_outbound_headers=False,
                    normalize_outbound_headers=False,
                    validate_inbound_headers=False,
                    normalize_inbound_headers=False,
                )
            )
            conn.initiate_connection()
            await sock.send_all(conn.data_to_send())
        except BaseException as exc:
            sock.socket.close()
            if isinstance(exc, trio.BrokenResourceError):
                raise StreamTerminatedError(f"connection to {self.path} lost: {exc}") from None
            raise
        self._sock, self._conn = sock, conn
        return sock, conn

    async def _call(self, method: str, request: Message, response_type: type[M], timeout: float | None) -> M:
        reused = self._conn is not None
        if self._sock is not None and self._conn is not None:
            sock, conn = self._sock, self._conn
        else:
            sock, conn = await self._connect()
        headers = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", method.encode()),
            (b":authority", self._authority),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            (b"user-agent", b"eventsrc"),
        ]
        if timeout is not None:
            headers.append((b"grpc-timeout", grpc_timeout(timeout)))
        pending = frame(request)
        try:
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, headers)
            pending = send_some(conn, sid, pending, end_stream=True)
            await sock.send_all(conn.data_to_send())
        except (trio.BrokenResourceError, h2.exceptions.ProtocolError) as exc:
            # The peer is gone (EPIPE on a unix socket) or h2 will not open a stream on
            # this connection (it saw a GOAWAY, or ran out of ids): nothing was acted on.
            if reused:
                raise _Reconnect from exc
            raise StreamTerminatedError(f"connection to {self.path} lost: {exc}") from None
        except trio.ClosedResourceError:
            raise StreamTerminatedError(f"the connection to {self.path} was closed") from None
        head: dict[bytes, bytes] = {}
        trailers: dict[bytes, bytes] = {}
        data = bytearray()
        expected: int | None = None  # the answer's length, once its prefix is in
        ended = False
        goaway: h2.events.ConnectionTerminated | None = None
        while not ended:
            if goaway is not None:
                if reused and not head and (goaway.last_stream_id is not None and goaway.last_stream_id < sid):
                    raise _Reconnect  # the server says it never took this stream
                raise StreamTerminatedError(
                    f"{self.path} closed the connection (GOAWAY {goaway.error_code!r}) before the answer ended; "
                    "whether the call was carried out is not known"
                )
            try:
                chunk = await sock.receive_some(_READ)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                chunk = b""
            if not chunk:
                raise StreamTerminatedError(
                    f"connection to {self.path} closed before the answer ended; whether the call was carried out is not known"
                )
            try:
                events = conn.receive_data(chunk)
            except h2.exceptions.ProtocolError as exc:
                raise ProtocolError(f"HTTP/2 error from {self.path}: {exc}") from None
            for e in events:
                if isinstance(e, h2.events.ConnectionTerminated):
                    goaway = e  # the answer may still be complete in this same read
                    continue
                if isinstance(e, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
                    if pending:  # the connection's window or this stream's may have opened
                        pending = send_some(conn, sid, pending, end_stream=True)
                    continue
                if getattr(e, "stream_id", sid) != sid:
                    continue
                if isinstance(e, h2.events.ResponseReceived):
                    head = dict(e.headers)
                elif isinstance(e, h2.events.DataReceived):
                    data += e.data
                    conn.acknowledge_received_data(e.flow_controlled_length, sid)
                    if expected is None and len(data) >= 5:
                        expected = check_prefix(data[:5], self.max_message)  # refused from the prefix, body unread
                    if expected is not None and len(data) > 5 + expected:
                        raise GRPCError(
                            Status.INTERNAL, "the answer is more than one message"
                        )  # never buffered unbounded
                elif isinstance(e, h2.events.TrailersReceived):
                    trailers = dict(e.headers)
                elif isinstance(e, h2.events.StreamEnded):
                    ended = True
                elif isinstance(e, h2.events.StreamReset):
                    raise StreamTerminatedError(f"{self.path} reset the stream (error code {e.error_code!r})")
            if ended:
                break  # what h2 queued meanwhile (window updates) goes out with the next call
            out = conn.data_to_send()
            if out:
                try:
                    await sock.send_all(out)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    raise StreamTerminatedError(
                        f"connection to {self.path} lost before the answer ended; whether the call was carried out is not known"
                    ) from None
        return _answer(head, trailers, bytes(data), response_type)


def _answer(head: dict[bytes, bytes], trailers: dict[bytes, bytes], data: bytes, response_type: type[M]) -> M:
    """The call's outcome from its headers, trailers and body."""
    http = head.get(b":status", b"")
    if http != b"200":
        raise GRPCError(Status.UNKNOWN, f"the server answered HTTP status {http.decode(errors='replace') or 'none'}")
    meta = trailers or head  # a trailers-only answer carries the status in its headers
    raw = meta.get(b"grpc-status")
    if raw is None:
        raise GRPCError(Status.UNKNOWN, "the answer has no grpc-status")
    try:
        status = Status(int(raw))
    except ValueError:
        raise GRPCError(Status.UNKNOWN, f"the answer's grpc-status {raw!r} is not a status") from None
    if status is not Status.OK:
        message = decode_grpc_message(meta.get(b"grpc-message", b"").decode(errors="replace"))
        raise GRPCError(status, message)
    if not head.get(b"content-type", b"").startswith(b"application/grpc"):
        raise GRPCError(Status.UNKNOWN, "the answer is not application/grpc")
    return unframe(data, response_type, "answer", None)  # type: ignore[no-any-return]
