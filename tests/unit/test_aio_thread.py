"""``rpc.aio_thread``: an asyncio loop of its own in a worker thread, called from trio: results and
errors come back, a trio cancellation cancels the asyncio task and returns once it is over, and
leaving the block stops the loop and its thread."""

from __future__ import annotations

import asyncio
import threading

import pytest
import trio

from eventsrc.rpc.aio_thread import open_loop_thread


async def test_a_call_runs_on_the_loops_own_thread_and_returns_its_result() -> None:
    async def where(x: int) -> tuple[int, str, bool]:
        loop = asyncio.get_running_loop()
        return x * 2, threading.current_thread().name, isinstance(loop, asyncio.SelectorEventLoop)

    async with open_loop_thread() as loop:
        doubled, thread, selector = await loop.call(where, 21)
    assert doubled == 42 and selector
    assert thread != threading.current_thread().name


async def test_an_error_comes_back_as_itself() -> None:
    async def fails() -> None:
        raise ValueError("no")

    async with open_loop_thread() as loop:
        with pytest.raises(ValueError, match="no"):
            await loop.call(fails)


async def test_a_trio_cancellation_cancels_the_task_and_waits_for_it() -> None:
    seen: list[str] = []
    started = trio.Event()
    token = trio.lowlevel.current_trio_token()

    async def waits() -> None:
        token.run_sync_soon(started.set)
        try:
            await asyncio.Event().wait()  # never set
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # its cleanup runs before the call returns
            seen.append("cancelled")
            raise

    async with open_loop_thread() as loop:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def call() -> None:
                    await loop.call(waits)

                nursery.start_soon(call)
                await started.wait()
                scope.cancel()
        assert scope.cancelled_caught
        assert seen == ["cancelled"]


async def test_leaving_the_block_stops_the_loop_and_its_thread() -> None:
    before = threading.active_count()
    async with open_loop_thread() as loop:
        assert threading.active_count() >= before
        held = loop.loop
    assert held.is_closed() and not held.is_running()
