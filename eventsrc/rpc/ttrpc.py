"""NRI's transport in trio: the connection multiplexer and ttrpc, as the plugin plays them.

The wire (containerd/nri ``pkg/net/multiplex``, containerd/ttrpc ``channel.go``), big-endian::

    socket  = frame*      frame   = conn id (u32) | length (u32) | that many bytes
    conn 1  = message*    ttrpc where the plugin serves: the runtime calls nri.pkg.api.v1alpha1.Plugin
    conn 2  = message*    ttrpc where the plugin calls: nri.pkg.api.v1alpha1.Runtime
    message = length (u32) | stream id (u32) | type (u8: 1 request, 2 response, 3 data) | flags (u8)
              | a ttrpc Request{service, method, payload, timeout_nano} or Response{status, payload}

A connection is a byte stream: the runtime's writer (a bufio.Writer under ttrpc) may cut a
message across frames or put several in one, so frames are not message boundaries. Frames
for any other connection id are dropped, as mux.go drops frames for a connection nobody
opened. A message is at most 4 MiB (``MAX_MESSAGE``); a longer one is skipped without being
held, and answered as ttrpc answers it: a request gets RESOURCE_EXHAUSTED on its stream id, a
response fails the call it answers. Either way the connection stays up.

Calls are unary: a client's stream ids are odd and increase; a request carries its deadline
in ``timeout_nano``; the answer's ``Status`` is google.rpc.Status, whose ``message`` (field 2)
is what containerd reports, so a refusal's reason goes there. Streaming (data messages, a
request that keeps its stream open) is refused as ttrpc refuses what it has no stream for.

``Demux`` turns bytes into messages and never touches a socket; ``Session`` is the shell: one
reader task, one writer task for the calls' requests (so a caller's cancellation never cuts a
frame), and a task per request served, all in the session's own nursery. A served request's
task writes its answer itself, in the step its handler returns (no trip through the writer,
and no task its handler woke runs first); only the session's end cancels it. Whoever writes
holds the send lock, so frames never interleave.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

from eventsrc.gen.ttrpc import request_pb2, status_pb2

__all__ = [
    "MAX_IN_FLIGHT",
    "MAX_MESSAGE",
    "PLUGIN_CONN",
    "RUNTIME_CONN",
    "ConnectionLost",
    "Demux",
    "Handler",
    "Message",
    "Oversized",
    "Session",
    "TtrpcError",
    "encode",
    "nri_session",
    "session_over",
]

MAX_MESSAGE = 4 << 20  # ttrpc's messageLengthMax
PLUGIN_CONN = 1  # we serve (multiplex.PluginServiceConn)
RUNTIME_CONN = 2  # we call (multiplex.RuntimeServiceConn)
#: requests of the runtime served at once; one more is answered RESOURCE_EXHAUSTED at once
MAX_IN_FLIGHT = 64

REQUEST, RESPONSE, DATA = 1, 2, 3
FLAG_REMOTE_CLOSED, FLAG_REMOTE_OPEN = 0x1, 0x2

OK, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED = 0, 2, 3, 4
RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 8, 12, 13
#: gRPC's code names, as grpc-go prints them
_CODE_NAMES = (
    *("OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound", "AlreadyExists"),
    *("PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange"),
    *("Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated"),
)

_FRAME = struct.Struct(">II")  # conn id, length
_HEADER = struct.Struct(">IIBB")  # length, stream id, type, flags
_FRAME_AND_HEADER = struct.Struct(">IIIIBB")
_RECEIVE_SIZE = 64 * 1024
_OUTBOX = 16  # whole messages queued for the writer
_LAST_STREAM_ID = 0xFFFF_FFFF


class TtrpcError(Exception):
    """A ttrpc call answered with a non-OK status, or a handler refusing a request."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        name = _CODE_NAMES[self.code] if 0 <= self.code < len(_CODE_NAMES) else f"code {self.code}"
        return f"{name}: {_one_line(self.message)}"


class ConnectionLost(Exception):
    """The socket closed or the peer broke the protocol; str() is one line saying which."""

    def __str__(self) -> str:
        return _one_line(str(self.args[0]) if self.args else "the connection is gone")


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------------------- bytes <-> messages


@dataclass(frozen=True, slots=True)
class Message:
    """One whole ttrpc message of a connection."""

    stream_id: int
    kind: int  # REQUEST, RESPONSE, DATA (or whatever the peer sent)
    flags: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Oversized:
    """A message longer than the limit: its header was read, its bytes are being skipped."""

    stream_id: int
    kind: int
    length: int


def encode(conn: int, stream_id: int, kind: int, flags: int, payload: bytes) -> bytes:
    """One ttrpc message of ``conn`` as one mux frame (a message of at most MAX_MESSAGE bytes
    always fits one frame: mux.go's limit is the message limit plus its header)."""
    if len(payload) > MAX_MESSAGE:
        raise ValueError(f"message length {len(payload)} exceeds maximum message size of {MAX_MESSAGE}")
    head = _FRAME_AND_HEADER.pack(conn, _HEADER.size + len(payload), len(payload), stream_id, kind, flags)
    return head + payload


class _MessageReader:
    """One connection's bytes in, its messages out; holds at most one message and a chunk."""

    def __init__(self, max_message: int) -> None:
        self._max = max_message
        self._buf = bytearray()
        self._skip = 0  # bytes of an oversized message still to come

    @property
    def idle(self) -> bool:
        return not self._buf and not self._skip

    def feed(self, chunk: memoryview) -> list[Message | Oversized]:
        if self._skip:
            n = min(self._skip, len(chunk))
            self._skip -= n
            chunk = chunk[n:]
        self._buf += chunk
        out: list[Message | Oversized] = []
        buf = self._buf
        while len(buf) >= _HEADER.size:
            length, stream_id, kind, flags = _HEADER.unpack_from(buf)
            if length > self._max:
                out.append(Oversized(stream_id, kind, length))
                taken = min(len(buf) - _HEADER.size, length)
                del buf[: _HEADER.size + taken]
                self._skip = length - taken
                if self._skip:
                    break  # buf is empty: everything that follows starts with the rest to skip
                continue
            end = _HEADER.size + length
            if len(buf) < end:
                break
            out.append(Message(stream_id, kind, flags, bytes(buf[_HEADER.size : end])))
            del buf[:end]
        return out


class Demux:
    """The socket's bytes in, ``(conn id, Message | Oversized)`` out, for the connections
    given; frames of any other connection are dropped. No I/O: ``Session`` feeds it."""

    def __init__(self, conns: tuple[int, ...] = (PLUGIN_CONN, RUNTIME_CONN), max_message: int = MAX_MESSAGE) -> None:
        self._readers = {conn: _MessageReader(max_message) for conn in conns}
        self._head = bytearray()  # a frame header being read
        self._conn = 0
        self._left = 0  # bytes of the current frame still to come

    @property
    def idle(self) -> bool:
        """Between frames and between messages (the peer may end the stream here)."""
        return not self._head and not self._left and all(r.idle for r in self._readers.values())

    def feed(self, data: bytes | bytearray) -> list[tuple[int, Message | Oversized]]:
        out: list[tuple[int, Message | Oversized]] = []
        view = memoryview(data)
        while view:
            if not self._left:
                need = _FRAME.size - len(self._head)
                self._head += view[:need]
                view = view[need:]
                if len(self._head) < _FRAME.size:
                    break
                self._conn, self._left = _FRAME.unpack(self._head)
                self._head.clear()
                continue
            chunk, view = view[: self._left], view[self._left :]
            self._left -= len(chunk)
            reader = self._readers.get(self._conn)
            if reader is not None:
                out += [(self._conn, item) for item in reader.feed(chunk)]
        return out


# ---------------------------------------------------------------------------- the session

#: Serves the runtime's requests: (service, method, request payload) -> response payload.
#: Raise TtrpcError to answer with its status; any other exception is answered UNKNOWN.
Handler = Callable[[str, str, bytes], Awaitable[bytes]]


class _Pending:
    """A call waiting for its answer (set once, by the reader or by the connection's loss)."""

    __slots__ = ("done", "response", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.response: request_pb2.Response | None = None
        self.error: Exception | None = None

    def fail(self, error: Exception) -> None:
        if not self.done.is_set():
            self.error = error
            self.done.set()


class Session:
    """One NRI connection: calls to the runtime on conn 2, the runtime's requests served on
    conn 1. Made by ``session_over`` (or ``nri_session``), which runs its tasks."""

    def __init__(self, stream: trio.abc.Stream, handler: Handler, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self._stream = stream
        self._handler = handler
        self._max_in_flight = max_in_flight
        self._outbox_in, self._outbox = trio.open_memory_channel[bytes](_OUTBOX)
        self._send_lock = trio.StrictFIFOLock()  # held while a frame is written: none interleave
        self._nursery: trio.Nursery | None = None
        self._id_lock = trio.Lock()  # a stream id is taken and queued under it: ids reach the wire in order
        self._next_id = 1
        self._pending: dict[int, _Pending] = {}
        self._last_served = 0
        self._in_flight = 0
        self._gone = trio.Event()
        self._lost: str | None = None

    # -------------------------------------------------------------- calling the runtime

    async def call(self, service: str, method: str, payload: bytes, timeout: float | None = None) -> bytes:
        """One unary call on conn 2; waits for its answer.

        TtrpcError on a non-OK status (or an answer that is not one); trio.TooSlowError once
        ``timeout`` seconds pass (the request's timeout_nano says the time left, of ``timeout``
        or of an enclosing deadline, whichever is sooner); ConnectionLost if the connection
        goes. Cancelling the caller abandons the call: a late answer is dropped."""
        with trio.fail_after(math.inf if timeout is None else timeout):
            request = request_pb2.Request(service=service, method=method, payload=payload)
            deadline = trio.current_effective_deadline()
            if deadline != math.inf:
                request.timeout_nano = max(1, round((deadline - trio.current_time()) * 1e9))
            body = request.SerializeToString()
            if len(body) > MAX_MESSAGE:
                raise TtrpcError(
                    RESOURCE_EXHAUSTED, f"message length {len(body)} exceeds maximum message size of {MAX_MESSAGE}"
                )
            pending = _Pending()
            stream_id = 0
            try:
                async with self._id_lock:
                    self._raise_if_gone()
                    stream_id = self._next_id
                    if stream_id > _LAST_STREAM_ID:
                        raise ConnectionLost("every ttrpc stream id of this connection is used up; connect again")
                    self._next_id += 2
                    self._pending[stream_id] = pending
                    await self._queue(encode(RUNTIME_CONN, stream_id, REQUEST, 0, body))
                await pending.done.wait()
            finally:
                self._pending.pop(stream_id, None)
        if pending.error is not None:
            raise pending.error
        assert pending.response is not None
        status = pending.response.status
        if status.code != OK:
            raise TtrpcError(status.code, status.message)
        return pending.response.payload

    async def closed(self) -> None:
        """Returns when the connection is gone: lost, or closed by leaving the session."""
        await self._gone.wait()

    def _answered(self, item: Message | Oversized) -> None:
        """A message of conn 2 reached the reader: it settles the call waiting on its stream, if
        any (one that timed out or was cancelled is no longer waiting; ttrpc drops such too)."""
        pending = self._pending.get(item.stream_id)
        if pending is None or pending.done.is_set():
            return
        if isinstance(item, Oversized):
            pending.fail(
                TtrpcError(
                    RESOURCE_EXHAUSTED, f"message length {item.length} exceeds maximum message size of {MAX_MESSAGE}"
                )
            )
        elif item.kind != RESPONSE:
            pending.fail(TtrpcError(INTERNAL, f"unexpected message of type {item.kind} on stream {item.stream_id}"))
        else:
            try:
                pending.response = request_pb2.Response.FromString(item.payload)
            except Exception as exc:  # protobuf's DecodeError, whatever the bytes
                pending.fail(TtrpcError(INTERNAL, f"cannot decode the response: {exc}"))
                return
            pending.done.set()

    # -------------------------------------------------------------- serving the runtime

    async def _requested(self, item: Message | Oversized) -> None:
        """A message of conn 1 reached the reader: start serving it, or refuse it at once with
        the status ttrpc's server gives (the connection stays up either way)."""
        if isinstance(item, Oversized):
            why = f"message length {item.length} exceeds maximum message size of {MAX_MESSAGE}"
            await self._refuse(item.stream_id, RESOURCE_EXHAUSTED, why)
            return
        if item.stream_id % 2 != 1:
            await self._refuse(item.stream_id, INVALID_ARGUMENT, "StreamID must be odd for client initiated streams")
            return
        if item.kind == DATA:
            await self._refuse(item.stream_id, INVALID_ARGUMENT, "StreamID is no longer active")
            return
        if item.kind != REQUEST:
            return  # ttrpc ignores other types, for what later versions may add
        if item.stream_id <= self._last_served:
            await self._refuse(item.stream_id, INVALID_ARGUMENT, "StreamID cannot be re-used and must increment")
            return
        self._last_served = item.stream_id
        try:
            request = request_pb2.Request.FromString(item.payload)
        except Exception as exc:  # protobuf's DecodeError, whatever the bytes
            await self._refuse(item.stream_id, INVALID_ARGUMENT, f"unmarshal request error: {exc}")
            return
        if item.flags & FLAG_REMOTE_OPEN:
            why = f"{request.service}/{request.method}: streaming requests are not supported"
            await self._refuse(item.stream_id, UNIMPLEMENTED, why)
            return
        if self._in_flight >= self._max_in_flight:
            why = f"{self._in_flight} requests are being served already (at most {self._max_in_flight})"
            await self._refuse(item.stream_id, RESOURCE_EXHAUSTED, why)
            return
        assert self._nursery is not None
        self._in_flight += 1
        self._nursery.start_soon(self._serve, item.stream_id, request)

    async def _serve(self, stream_id: int, request: request_pb2.Request) -> None:
        """Run the handler (within the request's timeout_nano, as ttrpc's server does) and
        queue its answer. Ends early only when the connection goes."""
        try:
            code, message, payload = await self._run_handler(request)
            try:
                body = request_pb2.Response(status=status_pb2.Status(code=code, message=message), payload=payload)
                answer = body.SerializeToString()
            except Exception as exc:  # a code beyond int32, a message protobuf cannot encode
                answer = _status_only(UNKNOWN, f"cannot encode the answer: {type(exc).__name__}")
            if len(answer) > MAX_MESSAGE:
                why = f"response length {len(answer)} exceeds maximum message size of {MAX_MESSAGE}"
                answer = _status_only(RESOURCE_EXHAUSTED, why)
            await self._send(encode(PLUGIN_CONN, stream_id, RESPONSE, 0, answer))
        except ConnectionLost:
            return  # the reader or the writer says so
        finally:
            self._in_flight -= 1

    async def _run_handler(self, request: request_pb2.Request) -> tuple[int, str, bytes]:
        """The handler's answer as (status code, status message, payload)."""
        timeout = request.timeout_nano / 1e9 if request.timeout_nano > 0 else math.inf
        try:
            with trio.move_on_after(timeout) as scope:
                payload = await self._handler(request.service, request.method, request.payload)
            if scope.cancelled_caught:
                return DEADLINE_EXCEEDED, "context deadline exceeded", b""
        except TtrpcError as exc:
            # code 0 would tell the runtime that the refusal succeeded
            return exc.code or UNKNOWN, exc.message, b""
        except Exception as exc:  # a handler's bug answers UNKNOWN, and the connection serves on
            return UNKNOWN, str(exc) or type(exc).__name__, b""
        if not isinstance(payload, bytes):
            return UNKNOWN, f"{request.service}/{request.method} answered {type(payload).__name__}, not bytes", b""
        return OK, "", payload

    async def _refuse(self, stream_id: int, code: int, message: str) -> None:
        await self._queue(encode(PLUGIN_CONN, stream_id, RESPONSE, 0, _status_only(code, message)))

    # -------------------------------------------------------------- the tasks

    async def _queue(self, frame: bytes) -> None:
        """Hand a whole frame to the writer; waits while its queue is full."""
        try:
            await self._outbox_in.send(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._raise_if_gone()
            raise ConnectionLost("the connection is gone") from None

    async def _send(self, frame: bytes) -> None:
        """Write a whole frame from this task, under the send lock. Taken at once when free: an
        awaited acquire would let every task ready to run go first."""
        self._raise_if_gone()
        if self._send_lock.locked():
            await self._send_lock.acquire()
        else:
            self._send_lock.acquire_nowait()
        try:
            await self._stream.send_all(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise self._lose(f"cannot write to the peer: {exc.__cause__ or exc}") from None
        finally:
            self._send_lock.release()

    async def _read(self) -> None:
        """The only reader of the socket: until it ends, feed its bytes through the demux; conn 1's
        requests to the server side, conn 2's answers to the calls waiting for them."""
        demux = Demux()
        while True:
            try:
                data = await self._stream.receive_some(_RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise self._lose(f"cannot read from the peer: {exc.__cause__ or exc}") from None
            if not data:
                where = "" if demux.idle else " in the middle of a message"
                raise self._lose(f"the peer closed the connection{where}")
            for conn, item in demux.feed(data):
                if conn == PLUGIN_CONN:
                    await self._requested(item)
                else:
                    self._answered(item)

    async def _write(self) -> None:
        """The writer of the frames queued (the calls' requests, the refusals): whole frames, in
        the order they were queued."""
        while True:
            try:
                frame = await self._outbox.receive()
            except (trio.ClosedResourceError, trio.EndOfChannel):
                return  # the session is over; whoever ended it says why
            await self._send(frame)

    def _lose(self, reason: str) -> ConnectionLost:
        """The connection is gone (the first reason given stays): wake every call waiting on it
        and every task queueing a frame, and ``closed()``. Returns the error to raise."""
        if self._lost is None:
            self._lost = reason
            for pending in self._pending.values():
                pending.fail(ConnectionLost(reason))
            self._outbox.close()
            self._gone.set()
        return ConnectionLost(self._lost)

    def _raise_if_gone(self) -> None:
        if self._lost is not None:
            raise ConnectionLost(self._lost)


def _status_only(code: int, message: str) -> bytes:
    """A Response carrying only a status; the message is ours (ASCII words and numbers, or a
    peer's service and method names, which came in as valid protobuf strings)."""
    return request_pb2.Response(status=status_pb2.Status(code=code, message=message)).SerializeToString()


@asynccontextmanager
async def session_over(
    stream: trio.abc.Stream, handler: Handler, *, max_in_flight: int = MAX_IN_FLIGHT
) -> AsyncIterator[Session]:
    """Run a session over an already-connected stream (closed on the way out): the reader, the
    writer and the requests served run in a nursery of their own, around the body.

    When the peer closes the stream or it breaks, the body is cancelled and ConnectionLost is
    raised out of the ``async with``, bare. Leaving the body normally cancels what is being
    served, fails calls still waiting (in other tasks) with ConnectionLost, and closes the stream.
    """
    session = Session(stream, handler, max_in_flight)
    try:
        async with trio.open_nursery() as nursery:
            session._nursery = nursery
            nursery.start_soon(session._read)
            nursery.start_soon(session._write)
            yield session
            session._lose("the session was closed")
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        leaf = _the_one(group)
        if leaf is None:
            raise
        raise leaf from leaf.__cause__  # bare, with its own cause; not shown inside the group
    finally:
        session._lose("the session was closed")
        await trio.aclose_forcefully(stream)


@asynccontextmanager
async def nri_session(path: str | os.PathLike[str], handler: Handler) -> AsyncIterator[Session]:
    """Connect to the runtime's NRI socket at ``path`` and run a session over it
    (``session_over``): calls on conn 2 through the Session yielded, ``handler`` serving conn 1.

    An OSError from connecting (no socket, refused) comes out as it is. When the runtime closes
    the socket or breaks the protocol, the body is cancelled and ConnectionLost is raised out of
    the ``async with``. Leaving the body normally closes the socket."""
    stream = await trio.open_unix_socket(os.fspath(path))
    async with session_over(stream, handler) as session:
        yield session


def _the_one(group: BaseExceptionGroup) -> BaseException | None:
    """What the nursery's group stands for: its one exception, or the first ConnectionLost when
    the reader and the writer both saw the end; None when it holds several different ones."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    if len(leaves) == 1 or (leaves and all(isinstance(exc, ConnectionLost) for exc in leaves)):
        return leaves[0]
    return None
