"""gRPC inside trio: grpclib servers and clients on trio-asyncio's loop (docs/adr/0002).

grpclib is asyncio-only. The daemon opens one asyncio loop inside ``trio.run`` with
``trio_asyncio.open_loop()``; servers are started and stopped from trio tasks here, and
handlers (asyncio coroutines) reach trio code with ``to_trio``. Everything else in
eventsrc stays trio.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import trio
import trio_asyncio
from grpclib.server import Server

T = TypeVar("T")

#: Call a trio function from an asyncio handler: ``await to_trio(fn)(*args)``.
to_trio = trio_asyncio.trio_as_aio
#: Call an asyncio function (a grpclib call) from trio: ``await to_aio(fn)(*args)``.
to_aio = trio_asyncio.aio_as_trio

# Messages from plugins and clients are small; a hostile peer must not make us buffer more.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def call_trio(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    return to_trio(fn)  # type: ignore[no-any-return]


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
