"""gRPC inside trio: grpclib servers and clients on trio-asyncio's loop (docs/adr/0002).

grpclib is asyncio-only. The daemon opens one asyncio loop inside ``trio.run`` with
``trio_asyncio.open_loop()``; servers are started and stopped from trio tasks here, and
handlers (asyncio coroutines) reach trio code with ``to_trio``. Everything else in
eventsrc stays trio.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import trio
import trio_asyncio
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
)


def why(exc: BaseException) -> str:
    """One line saying why a call to a peer failed."""
    if isinstance(exc, GRPCError):
        return f"{exc.status.name}: {exc.message}"
    if isinstance(exc, (trio.TooSlowError, TimeoutError)):
        return "timed out"
    return str(exc) or type(exc).__name__


# Messages from plugins and clients are small; a hostile peer must not make us buffer more.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with the terminating NUL


def check_socket_path(path: Path) -> None:
    """A clear error instead of the kernel's "AF_UNIX path too long"."""
    n = len(os.fsencode(path))
    if n > MAX_SOCKET_PATH:
        raise EventsrcError(
            f"socket path {path} is {n} bytes long; unix sockets allow {MAX_SOCKET_PATH} (use a shorter --root-dir)"
        )


async def serve_unix(
    handlers: Sequence[Any],
    path: Path,
    mode: int | None = None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve grpclib ``handlers`` on the unix socket ``path`` until cancelled.

    A stale socket file at ``path`` is replaced. The socket is removed on the way out.
    """
    check_socket_path(path)
    path.unlink(missing_ok=True)
    server = Server(list(handlers))
    await to_aio(server.start)(path=str(path))
    if mode is not None:
        os.chmod(path, mode)
    task_status.started()
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            server.close()
            await to_aio(server.wait_closed)()
            path.unlink(missing_ok=True)
