"""The daemon's full garbage collections run in a loop step of their own
(``node.collector``): never inside the allocation that crossed a threshold."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
import trio
import trio.testing

from eventsrc.node.collector import NEVER, Collector


@pytest.fixture
def full_collections() -> Iterator[list[str]]:
    """The task each full collection ran in ('' outside trio); no automatic collection
    meanwhile (the middle-generation ones are the test's own)."""
    seen: list[str] = []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2:
            try:
                seen.append(trio.lowlevel.current_task().name)
            except RuntimeError:
                seen.append("")

    gc.callbacks.append(note)
    gc.disable()
    try:
        yield seen
    finally:
        gc.enable()
        gc.callbacks.remove(note)


def _middle_collections(n: int) -> None:
    for _ in range(n):
        gc.collect(1)


async def test_a_full_collection_runs_in_the_collectors_own_task(full_collections: list[str]) -> None:
    collector = Collector(every=3)
    before = gc.get_threshold()
    async with trio.open_nursery() as nursery:
        await nursery.start(collector.run, name="collector")
        assert gc.get_threshold()[2] == NEVER  # none starts by itself
        _middle_collections(2)
        await trio.testing.wait_all_tasks_blocked()
        assert (collector.collections, full_collections) == (0, [])
        _middle_collections(1)  # the third: due, but not here
        assert full_collections == []
        await trio.testing.wait_all_tasks_blocked()
        assert collector.collections == 1 and full_collections == ["collector"]
        _middle_collections(3)
        await trio.testing.wait_all_tasks_blocked()
        assert collector.collections == 2 and full_collections == ["collector", "collector"]
        nursery.cancel_scope.cancel()
    assert gc.get_threshold() == before


async def test_middle_collections_in_a_worker_thread_wake_it_too(full_collections: list[str]) -> None:
    collector = Collector(every=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(collector.run, name="collector")
        await trio.to_thread.run_sync(_middle_collections, 2)
        await trio.testing.wait_all_tasks_blocked()
        assert collector.collections == 1 and full_collections == ["collector"]
        nursery.cancel_scope.cancel()


def test_a_long_collection_freezes_what_survived_it() -> None:
    ticks = iter([0.0, 0.001, 1.0, 1.1])  # a short collection, then a long one
    collector = Collector(freeze_after=0.004, clock=lambda: next(ticks))
    frozen = gc.get_freeze_count()
    try:
        collector.collect()
        assert collector.freezes == 0 and gc.get_freeze_count() == frozen
        collector.collect()
        assert collector.freezes == 1 and gc.get_freeze_count() > frozen
    finally:
        gc.unfreeze()
