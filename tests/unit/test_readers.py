"""Readers of the history take turns, and decisions go first (``eventsrc.api.readers``)."""

from __future__ import annotations

import trio
import trio.testing

from eventsrc.api.readers import Turns


async def test_one_reader_at_a_time_the_next_when_the_turn_is_given_back() -> None:
    turns = Turns(lease=3600)
    first = await turns.take()
    got: list[object] = []

    async def second() -> None:
        got.append(await turns.take())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # parked while the first holds its turn
        turns.done(first)
        await trio.testing.wait_all_tasks_blocked()
        assert len(got) == 1 and got[0] is not first
    assert turns.given == 2


async def test_no_turn_starts_while_a_decision_runs() -> None:
    turns = Turns(patience=3600)
    got: list[object] = []

    async def reader() -> None:
        got.append(await turns.take())

    async with trio.open_nursery() as nursery:
        with turns.deciding():
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            with turns.deciding():  # two at once: the turn waits for both
                pass
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
        await trio.testing.wait_all_tasks_blocked()
        assert len(got) == 1


async def test_a_reader_kept_waiting_by_decisions_takes_a_turn_after_its_patience(autojump_clock) -> None:  # type: ignore[no-untyped-def]
    turns = Turns(patience=0.1)
    with turns.deciding():  # a decision that does not end
        start = trio.current_time()
        await turns.take()
        assert trio.current_time() - start == 0.1


async def test_a_turn_whose_reader_waits_on_its_client_passes_on_when_its_lease_ends(autojump_clock) -> None:  # type: ignore[no-untyped-def]
    turns = Turns(lease=0.02)
    first = await turns.take()  # not given back in time: its sends wait on a client that does not read
    start = trio.current_time()
    second = await turns.take()
    assert trio.current_time() - start == 0.02
    third: list[object] = []

    async def reader() -> None:
        third.append(await turns.take())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        turns.done(first)  # given back late: it takes nothing from the one that holds the turn now
        await trio.testing.wait_all_tasks_blocked()
        assert third == []
        turns.done(second)
        await trio.testing.wait_all_tasks_blocked()
        assert len(third) == 1
