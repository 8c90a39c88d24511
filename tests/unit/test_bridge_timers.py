"""The daemon's asyncio loop drops cancelled timers as asyncio's own loop does
(``rpc.bridge.open_loop``): grpclib sets one per call with a deadline and cancels it when
the call ends; trio-asyncio alone keeps each until the time it was set for."""

from __future__ import annotations

import asyncio

import trio
import trio_asyncio

from eventsrc.rpc.bridge import MIN_CANCELLED_TIMERS, open_loop


async def _set_and_cancel(n: int, delay: float = 60.0) -> list[asyncio.TimerHandle]:
    """10 timers set, and ``n`` set then cancelled once the loop holds them (as a call's
    deadline is cancelled when the call ends)."""
    loop = asyncio.get_running_loop()
    live = [loop.call_later(delay, lambda: None) for _ in range(10)]
    ended = [loop.call_later(delay, lambda: None) for _ in range(n)]
    await asyncio.sleep(0)  # the loop takes them in
    for handle in ended:
        handle.cancel()
    return live


async def _timers_after(opener, n: int) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    async with opener() as loop:
        live = await trio_asyncio.aio_as_trio(_set_and_cancel)(n)
        heap = loop._timers
        return len(heap), sum(1 for t in heap if t in live)


async def test_cancelled_timers_do_not_pile_up() -> None:
    n = 20 * MIN_CANCELLED_TIMERS
    kept, live = await _timers_after(open_loop, n)
    assert live == 10  # the timers still set are all there
    assert kept <= 10 + 2 * MIN_CANCELLED_TIMERS + 10  # of the cancelled, at most about half the heap


async def test_trio_asyncio_alone_keeps_them() -> None:
    """What ``open_loop`` mends (if trio-asyncio mends it itself, this fails: drop ours)."""
    n = 20 * MIN_CANCELLED_TIMERS
    kept, live = await _timers_after(trio_asyncio.open_loop, n)
    assert live == 10
    assert kept == 10 + n


async def test_a_timer_still_fires_after_a_pruning() -> None:
    fired = trio.Event()
    async with open_loop():

        async def main() -> None:
            loop = asyncio.get_running_loop()
            loop.call_later(0.01, fired.set)
            await _set_and_cancel(5 * MIN_CANCELLED_TIMERS)

        await trio_asyncio.aio_as_trio(main)()
        with trio.fail_after(10):
            await fired.wait()


async def test_closing_the_loop_still_cancels_every_timer() -> None:
    """trio-asyncio's shutdown cancels its timers while it walks its heap: a pass that drops
    the cancelled ones meanwhile must not make it skip any."""
    handles: list[asyncio.TimerHandle] = []

    async def many() -> None:
        loop = asyncio.get_running_loop()
        handles.extend(loop.call_later(60.0, lambda: None) for _ in range(10 * MIN_CANCELLED_TIMERS))
        await asyncio.sleep(0)  # the loop takes them in

    async with open_loop():
        await trio_asyncio.aio_as_trio(many)()
    assert all(h.cancelled() for h in handles)
