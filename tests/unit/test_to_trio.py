"""A handler's call into trio (``rpc.bridge.to_trio``) leaves no reference cycle: its
arguments and result go with the handler's last reference, not at the next full
collection (docs/adr/0028). trio-asyncio's own ``trio_as_aio`` leaves one per call."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio
import trio_asyncio

from eventsrc.rpc.bridge import to_trio


class Spec:
    """Plays an admission's PodSpec: what a handler passes to trio."""


async def _admit(spec: Spec) -> tuple[Spec, str]:
    await trio.sleep(0)
    return spec, "correlation"


@contextmanager
def _no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _call(adapter: Callable[[Any], Any]) -> weakref.ref[Spec]:
    """A handler's call through ``adapter``, its result dropped; a reference to its argument."""

    async def handler() -> weakref.ref[Spec]:
        spec = Spec()
        got, _ = await adapter(_admit)(spec)
        assert got is spec
        return weakref.ref(spec)

    async with trio_asyncio.open_loop():
        return await trio_asyncio.aio_as_trio(handler)()  # type: ignore[no-any-return]


async def test_a_call_into_trio_leaves_nothing_to_the_cycle_collector() -> None:
    with _no_collector():
        spec = await _call(to_trio)
        assert spec() is None


async def test_trio_asyncios_own_adapter_still_leaves_a_cycle() -> None:
    """Fails once trio-asyncio stops making the cycle: to_trio can then be its adapter again."""
    with _no_collector():
        spec = await _call(trio_asyncio.trio_as_aio)
        assert spec() is not None
    gc.collect()
    assert spec() is None


async def _awaited(future: asyncio.Future[None]) -> None:
    await future


async def test_a_handler_cancelled_during_its_call_leaves_nothing_either() -> None:
    started = trio.Event()
    cancelled = []

    async def slow(spec: Spec) -> None:
        started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.append(True)
            raise

    async def handler(box: list[weakref.ref[Spec]]) -> None:
        spec = Spec()
        box.append(weakref.ref(spec))
        await to_trio(slow)(spec)

    with _no_collector():
        box: list[weakref.ref[Spec]] = []
        async with trio_asyncio.open_loop():
            task = asyncio.ensure_future(handler(box))  # on trio-asyncio's loop
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await trio_asyncio.aio_as_trio(_awaited)(task)
            del task
        assert cancelled == [True]  # the trio side was cancelled, as before
        assert box[0]() is None
