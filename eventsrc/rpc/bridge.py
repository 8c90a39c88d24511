"""gRPC inside trio: grpclib servers and clients on trio-asyncio's loop (docs/adr/0002, 0012).

grpclib is asyncio-only. The daemon opens one asyncio loop inside ``trio.run`` with
``trio_asyncio.open_loop()``; servers are started and stopped from trio tasks here
(``serve_unix``), trio code calls a peer with ``to_aio`` on a channel from
``unix_channel``, and handlers (asyncio coroutines) reach trio code with ``to_trio``.
Every channel and server made here bounds what it receives and what each connection
remembers of its closed streams (``rpc.codec``). Everything else in eventsrc stays trio.

The loop is trio-asyncio's own (``trio_asyncio.open_loop()``), used through its documented
API only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import stat
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import trio
import trio_asyncio
from google.protobuf.message import DecodeError
from grpclib import Status
from grpclib.client import Channel
from grpclib.exceptions import GRPCError, ProtocolError, StreamTerminatedError
from grpclib.server import Server

from eventsrc.errors import EventsrcError
from eventsrc.obs.logger import get_logger
from eventsrc.rpc.codec import MAX_MESSAGE_BYTES, BoundedCodec

T = TypeVar("T")


def to_trio(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Call a trio function from an asyncio handler: ``await to_trio(fn)(*args)``.

    trio-asyncio's ``trio_as_aio``, less a reference cycle per call: its handle gives the
    call's future a ``cancel`` that refers to the handle, which refers to the future. The
    pair, and the call's arguments and result with it, then wait for the cycle collector
    (an admission left 17 objects to it, its PodSpec included). Once the call is over
    (the future is done, even when the handler was cancelled: trio-asyncio finishes the
    trio task first), the future's own ``cancel`` is put back, and they go with the
    handler's last reference."""

    async def call(*args: Any) -> T:
        loop: Any = asyncio.get_running_loop()  # trio-asyncio's, which has trio_as_future
        future = loop.trio_as_future(fn, *args)
        try:
            return cast(T, await future)
        finally:
            with contextlib.suppress(AttributeError):  # a trio-asyncio without the override
                del future.cancel

    return call


#: Call an asyncio function (a grpclib call) from trio: ``await to_aio(fn)(*args)``.
to_aio = trio_asyncio.aio_as_trio

#: Everything a call to a peer can fail with: its status, a broken connection, a timeout, or
#: what grpclib's reader lets escape from a malformed answer (AssertionError: the stream
#: ended inside a message; NotImplementedError: a compressed message). Garbage and
#: oversized messages are GRPCErrors (``rpc.codec.BoundedCodec``); DecodeError stays for a
#: channel made without it.
CALL_ERRORS: tuple[type[BaseException], ...] = (
    GRPCError,
    StreamTerminatedError,
    ProtocolError,
    OSError,
    trio.TooSlowError,
    TimeoutError,
    DecodeError,
    AssertionError,
    NotImplementedError,
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
    if isinstance(exc, AssertionError):
        return "the peer ended the stream in the middle of a message"
    if isinstance(exc, NotImplementedError):
        return f"{Status.UNIMPLEMENTED.name}: compressed messages are not supported"
    return str(exc) or type(exc).__name__


def unix_channel(path: str, max_message: int = MAX_MESSAGE_BYTES) -> Channel:
    """A grpclib channel to the unix socket ``path`` that refuses answers longer than
    ``max_message`` (it connects on its first call; close it when done)."""
    # No status details codec: the daemon reads none, and a peer's cannot fail a call.
    return Channel(path=path, codec=BoundedCodec(max_message), status_details_codec=None)


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


log = get_logger(__name__)


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit (the shipped unit sets
    ``LimitNOFILE``); return the soft limit in force. Every connection a server accepts and
    every plugin the daemon dials costs a file descriptor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_cap() -> int:
    """How many connections each of the daemon's gRPC sockets holds at a time: a quarter of
    the open-files limit (three sockets share it with plugins, the log and the metrics
    endpoint), at least 16 and at most 1024."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(16, min(1024, soft // 4))


class CappedListener(socket.socket):
    """A listening unix socket that holds at most ``cap`` accepted connections at a time.

    asyncio's server (grpclib's, through ``loop.create_server(sock=...)``) calls ``accept``
    whenever the socket is readable. A connection over the cap is closed at once, before any
    byte is read or written (its client sees the connection end: gRPC's UNAVAILABLE), so
    idle clients cannot take the file descriptors every other socket and plugin needs; a
    connection under the cap is counted until it is closed.
    """

    def setup(self, cap: int, name: str) -> None:
        self.cap = cap
        self.name = name
        self.live = 0
        self.refused = 0
        self._at_cap = False

    def accept(self) -> tuple[socket.socket, Any]:
        while True:
            conn, addr = super().accept()  # BlockingIOError when none is waiting: asyncio stops there
            if self.live < self.cap:
                break
            conn.close()
            self.refused += 1
            if not self._at_cap:
                self._at_cap = True
                log.warning("connections refused: at the cap", socket=self.name, cap=self.cap)
        self.live += 1
        served = _ServedConnection(conn.family, conn.type, conn.proto, fileno=conn.detach())
        served.listener = self
        return served, addr

    def released(self) -> None:
        self.live -= 1
        if self._at_cap and self.live < self.cap:
            self._at_cap = False
            log.info("connections accepted again", socket=self.name, refused=self.refused)


class _ServedConnection(socket.socket):
    """An accepted connection: it gives its place under the cap back when closed."""

    listener: CappedListener | None = None

    def close(self) -> None:
        listener, self.listener = self.listener, None
        if listener is not None:
            listener.released()
        super().close()


def bind_unix(path: Path, mode: int | None, cap: int | None = None) -> socket.socket:
    """A unix stream socket bound at ``path`` (a stale file there replaced), with ``mode``
    set before anyone can connect (the caller listens); with ``cap``, a CappedListener."""
    check_socket_path(path)
    path.unlink(missing_ok=True)
    if cap is None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        sock = CappedListener(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setup(cap, path.name)
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
    max_message: int = MAX_MESSAGE_BYTES,
    max_connections: int | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve grpclib ``handlers`` on the unix socket ``path`` until cancelled.

    A stale socket file at ``path`` is replaced. The socket is removed on the way out.
    ``mode`` (None: what the umask gives) is set between bind and listen, so that no
    connection is ever accepted under another mode. A request longer than ``max_message``
    is refused (RESOURCE_EXHAUSTED), one that does not decode too (INTERNAL); a request
    that is not gRPC gets grpclib's answer (HTTP 405, 415 or 400). At most
    ``max_connections`` (default ``connection_cap()``) connections are held at a time; one
    over that is closed at once (``CappedListener``).
    """
    server = Server(list(handlers), codec=BoundedCodec(max_message), status_details_codec=None)
    sock = bind_unix(path, mode, connection_cap() if max_connections is None else max_connections)
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
