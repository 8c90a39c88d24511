"""An asyncio loop of its own, in a worker thread, for the fleet sink's NATS client (ADR 0045).

nats-py's ``fetch`` makes an asyncio task and a timer for every message it returns. On
trio-asyncio's loop (``rpc.bridge``) every one of those steps is a turn of trio's scheduler:
fetching and acknowledging cost 150 µs a message there, 36 µs on asyncio's own loop. The sink
does nothing else per message on the loop, so its client runs on a loop of its own:

    async with open_loop_thread() as loop:      # a trio nursery's worker thread runs it
        nc = await loop.call(nats.connect, ...)  # an asyncio coroutine, run there; awaited in trio

``call`` is cancellable as any trio call is: trio's cancellation cancels the asyncio task, and
``call`` returns once that task is over (its own cleanup run).
Leaving the block stops the loop and waits for its thread. Only documented API: the loop is
``asyncio.SelectorEventLoop`` (not whatever event loop policy trio-asyncio installed), reached
from trio with ``call_soon_threadsafe`` and back with ``TrioToken.run_sync_soon``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio

T = TypeVar("T")


class LoopThread:
    """An asyncio loop running in a worker thread (``open_loop_thread``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """``await fn(*args, **kwargs)`` on the loop; its result or its exception here."""
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        tasks: list[asyncio.Task[T]] = []

        async def run() -> T:
            return await fn(*args, **kwargs)

        def start() -> None:  # on the loop: a task, which says when it is over, cancelled or not
            task = self.loop.create_task(run())
            task.add_done_callback(lambda _: token.run_sync_soon(done.set))
            tasks.append(task)

        def cancel() -> None:  # on the loop, after ``start`` (the loop runs its callbacks in order)
            tasks[0].cancel()

        self.loop.call_soon_threadsafe(start)
        try:
            await done.wait()
        except BaseException:  # cancelled in trio: cancel it there, and wait until it is over
            self.loop.call_soon_threadsafe(cancel)
            with trio.CancelScope(shield=True):
                await done.wait()
            raise
        return tasks[0].result()


@asynccontextmanager
async def open_loop_thread() -> AsyncIterator[LoopThread]:
    """A new asyncio loop, run in a worker thread until the block is left; then stopped,
    closed, and its thread waited for."""
    loop = asyncio.SelectorEventLoop()
    running = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(token.run_sync_soon, running.set)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, serve)
        try:
            await running.wait()
            yield LoopThread(loop)
        finally:
            loop.call_soon_threadsafe(loop.stop)
