"""gRPC inside trio: grpclib servers and clients on trio-asyncio's loop (docs/adr/0002).

grpclib is asyncio-only. The daemon opens one asyncio loop inside ``trio.run`` with
``trio_asyncio.open_loop()``; servers are started and stopped from trio tasks here, and
handlers (asyncio coroutines) reach trio code with ``to_trio``. Everything else in
eventsrc stays trio.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import grpclib.client
import grpclib.server
import trio
import trio_asyncio
from google.protobuf.message import DecodeError
from grpclib import Status
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.server import Server

from eventsrc.errors import EventsrcError

T = TypeVar("T")

#: Call a trio function from an asyncio handler: ``await to_trio(fn)(*args)``.
to_trio = trio_asyncio.trio_as_aio
#: Call an asyncio function (a grpclib call) from trio: ``await to_aio(fn)(*args)``.
to_aio = trio_asyncio.aio_as_trio

#: Everything a call to a peer can fail with: its status, a broken connection, a timeout.
CALL_ERRORS: tuple[type[BaseException], ...] = (
    GRPCError,
    StreamTerminatedError,
    ProtocolError,
    OSError,
    trio.TooSlowError,
    TimeoutError,
    DecodeError,  # a peer's garbage (received messages are decoded in _recv_message, see below)
)


def why(exc: BaseException) -> str:
    """One line saying why a call to a peer failed."""
    if isinstance(exc, GRPCError):
        if exc.status is Status.DEADLINE_EXCEEDED:
            # The peer's deadline (grpc-timeout) fired before ours: a timeout all the same.
            return f"timed out ({exc.status.name}: {exc.message})"
        return f"{exc.status.name}: {exc.message}"
    if isinstance(exc, (trio.TooSlowError, TimeoutError)):
        return "timed out"
    return str(exc) or type(exc).__name__


#: The largest message the daemon takes from a peer: grpc-go's default receive limit, which
#: the kubelet keeps for its device-plugin client and its registration and PodResources
#: servers (none of them sets MaxRecvMsgSize). grpclib has no limit of its own: it would
#: buffer whatever a peer's 4-byte length prefix announces.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

_max_received: int | None = None


def limit_received_messages(max_bytes: int | None) -> None:
    """Refuse, in this process, every received message longer than ``max_bytes`` (None: no
    limit). The daemon sets it at start; the CLI reads its own daemon without one."""
    global _max_received
    _max_received = max_bytes


def max_received() -> int | None:
    """The received-message limit set in this process (None: no limit)."""
    return _max_received


# gRPC's message framing (a flag byte, a 4-byte big-endian length, the message), checked
# the same way by grpclib's reader below and by the trio-native client and server.


def frame(message: Any) -> bytes:
    """``message`` as one uncompressed, length-prefixed gRPC message."""
    body = message.SerializeToString()
    return b"\x00" + len(body).to_bytes(4, "big") + body


def send_some(conn: Any, stream_id: int, pending: bytes, *, end_stream: bool) -> bytes:
    """Queue on the ``h2`` connection as much of ``pending`` as the stream's flow-control
    window and the frame size allow; returns what is left. With ``end_stream``, the
    frame carrying the last byte ends the stream."""
    while pending:
        n = min(conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size, len(pending))
        if n <= 0:
            break
        conn.send_data(stream_id, pending[:n], end_stream=end_stream and n == len(pending))
        pending = pending[n:]
    return pending


def check_prefix(prefix: bytes | bytearray, limit: int | None) -> int:
    """The length a 5-byte message prefix announces. Raises GRPCError for a compressed
    message, or one longer than ``limit`` (grpc-go's status and words)."""
    if prefix[0]:
        raise GRPCError(Status.UNIMPLEMENTED, "compressed messages are not supported")
    length = int.from_bytes(prefix[1:5], "big")
    if limit is not None and length > limit:
        raise GRPCError(Status.RESOURCE_EXHAUSTED, f"received message larger than max ({length} vs. {limit})")
    return length


def decode_message(data: bytes, message_type: Any, decode: Callable[[bytes, Any], Any] | None = None) -> Any:
    """``data`` as a ``message_type``; garbage is a GRPCError (INTERNAL)."""
    try:
        return decode(data, message_type) if decode is not None else message_type.FromString(data)
    except Exception as exc:  # protobuf's DecodeError, or a codec's own complaint
        name = getattr(message_type, "__name__", "message")
        raise GRPCError(Status.INTERNAL, f"cannot decode the {name}: {exc}") from None


def unframe(data: bytes | bytearray, message_type: Any, what: str, limit: int | None) -> Any:
    """Exactly one length-prefixed message of ``message_type`` in ``data`` (a request or an
    answer read whole). Raises GRPCError."""
    if len(data) < 5:
        raise GRPCError(Status.INTERNAL, f"the {what} has no message")
    length = check_prefix(data[:5], limit)
    if len(data) != 5 + length:
        raise GRPCError(Status.INTERNAL, f"the {what} is not exactly one message")
    return decode_message(bytes(data[5:]), message_type)


async def _recv_message(stream: Any, codec: Any, message_type: Any) -> Any:
    """grpclib's ``recv_message`` (grpclib/stream.py), made safe against a hostile peer.

    - A message whose length prefix exceeds the limit is refused from its 5-byte header,
      before its body is read, with grpc-go's status and words (RESOURCE_EXHAUSTED,
      "received message larger than max"); HTTP/2 flow control keeps what the peer can push
      meanwhile to one stream window (4 MiB).
    - What grpclib lets escape from a malformed message (AssertionError for a truncated one,
      NotImplementedError for a compressed one, protobuf's DecodeError for garbage) becomes
      a GRPCError or ProtocolError, which every caller handles (``CALL_ERRORS``); on the
      server side the peer gets that status.
    """
    try:
        meta = await stream.recv_data(5)
        if not meta:
            return None
        data = await stream.recv_data(check_prefix(meta, _max_received))
    except AssertionError:  # grpclib's Buffer.read: the stream ended inside a message
        raise ProtocolError("the peer ended the stream in the middle of a message") from None
    return decode_message(data, message_type, codec.decode)


# grpclib's client and server streams call the module-level name each imported.
grpclib.client.recv_message = _recv_message  # type: ignore[assignment]
grpclib.server.recv_message = _recv_message  # type: ignore[assignment]


MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with the terminating NUL


def check_socket_path(path: Path) -> None:
    """A clear error instead of the kernel's "AF_UNIX path too long"."""
    n = len(os.fsencode(path))
    if n > MAX_SOCKET_PATH:
        raise EventsrcError(
            f"socket path {path} is {n} bytes long; unix sockets allow {MAX_SOCKET_PATH} (use a shorter --root-dir)"
        )


def endpoint_socket_error(endpoint: str) -> str:
    """Why the daemon will not dial ``endpoint`` ("" when it will): an absolute path of at
    most 107 bytes, without NUL, naming a unix socket itself. A symbolic link is refused
    even when it points at a socket: whoever can write the plugin directories must not be
    able to make the daemon connect, with its privileges, to a socket elsewhere."""
    if "\x00" in endpoint:
        return "the endpoint contains a NUL byte"
    if not os.path.isabs(endpoint):
        return f"the endpoint {endpoint!r} is not an absolute path"
    n = len(os.fsencode(endpoint))
    if n > MAX_SOCKET_PATH:
        return f"the endpoint {endpoint} is {n} bytes long; unix sockets allow {MAX_SOCKET_PATH}"
    try:
        mode = os.lstat(endpoint).st_mode
    except OSError as exc:
        return f"cannot dial the endpoint {endpoint}: {exc.strerror}"
    if stat.S_ISLNK(mode):
        return f"the endpoint {endpoint} is a symbolic link; the daemon dials only a socket itself"
    if not stat.S_ISSOCK(mode):
        return f"the endpoint {endpoint} is not a unix socket"
    return ""


def bind_unix(path: Path, mode: int | None) -> socket.socket:
    """A unix stream socket bound at ``path`` (a stale file there replaced), with ``mode``
    set before anyone can connect (the caller listens)."""
    check_socket_path(path)
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        if mode is not None:
            os.chmod(path, mode)
    except BaseException:
        sock.close()
        path.unlink(missing_ok=True)
        raise
    return sock


async def serve_unix(
    handlers: Sequence[Any],
    path: Path,
    mode: int | None = None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve grpclib ``handlers`` on the unix socket ``path`` until cancelled.

    A stale socket file at ``path`` is replaced. The socket is removed on the way out.
    ``mode`` (None: what the umask gives) is set between bind and listen, so that no
    connection is ever accepted under another mode.
    """
    server = Server(list(handlers))
    sock = bind_unix(path, mode)
    try:
        await to_aio(server.start)(sock=sock)  # listens
    except BaseException:
        sock.close()
        path.unlink(missing_ok=True)
        raise
    task_status.started()
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            server.close()
            await to_aio(server.wait_closed)()
            path.unlink(missing_ok=True)
