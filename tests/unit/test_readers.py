"""Readers of the history take turns, and decisions go first (``eventsrc.api.readers``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from eventsrc.api.readers import Stalls, Turns


@pytest.fixture
async def nursery() -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as n:
        yield n
        n.cancel_scope.cancel()


class Reader:
    def __init__(self) -> None:
        self.turn: object | None = None


async def given(turns: Turns, nursery: trio.Nursery) -> list[Reader]:
    """A reader asking for a turn: the list it lands in once it has one."""
    got: list[Reader] = []
    reader = Reader()

    async def read() -> None:
        await turns.take(reader)
        got.append(reader)

    nursery.start_soon(read)
    await trio.testing.wait_all_tasks_blocked()
    return got


async def took(turns: Turns) -> Reader:
    reader = Reader()
    await turns.take(reader)
    return reader


async def test_one_reader_at_a_time_in_the_order_they_asked(nursery: trio.Nursery) -> None:
    turns = Turns(lease=3600)
    nursery.start_soon(turns.run)
    first = await took(turns)
    second = await given(turns, nursery)
    third = await given(turns, nursery)
    assert second == third == []  # waiting while the first holds its turn
    turns.done(first)
    await trio.testing.wait_all_tasks_blocked()
    assert len(second) == 1 and second[0].turn is not None and first.turn is None and third == []
    turns.done(second[0])
    await trio.testing.wait_all_tasks_blocked()
    assert len(third) == 1
    assert turns.given == 3


async def test_while_decisions_run_one_turn_per_patience(nursery: trio.Nursery, autojump_clock) -> None:  # type: ignore[no-untyped-def]
    turns = Turns(patience=0.1)
    nursery.start_soon(turns.run)
    with turns.decision_runs():  # a decision that does not end
        start = trio.current_time()
        turns.done(await took(turns))  # the first turn: none was given in the last 0.1 s
        assert trio.current_time() == start
        turns.done(await took(turns))
        assert trio.current_time() - start == pytest.approx(0.1)
        turns.done(await took(turns))
        assert trio.current_time() - start == pytest.approx(0.2)


async def test_a_turn_waits_for_the_decisions_under_way_to_end(nursery: trio.Nursery) -> None:
    turns = Turns(patience=3600)
    nursery.start_soon(turns.run)
    turns.done(await took(turns))  # the patience counts from here
    with turns.decision_runs():
        got = await given(turns, nursery)
        with turns.decision_runs():  # two at once: the turn waits for both
            pass
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
    await trio.testing.wait_all_tasks_blocked()
    assert len(got) == 1


async def test_a_turn_whose_reader_waits_on_its_client_passes_on_when_its_lease_ends(
    nursery: trio.Nursery, autojump_clock
) -> None:  # type: ignore[no-untyped-def]
    turns = Turns(lease=0.02)
    nursery.start_soon(turns.run)
    first = await took(turns)  # not given back in time: its sends wait on a client that does not read
    start = trio.current_time()
    second = await took(turns)
    assert trio.current_time() - start == pytest.approx(0.02)
    assert not turns.holds(first.turn) and turns.holds(second.turn)
    third = await given(turns, nursery)
    turns.done(first)  # given back late: it takes nothing from the one that holds the turn now
    await trio.testing.wait_all_tasks_blocked()
    assert third == []
    turns.done(second)
    await trio.testing.wait_all_tasks_blocked()
    assert len(third) == 1


async def test_a_reader_that_goes_away_while_it_waits_is_forgotten(nursery: trio.Nursery) -> None:
    turns = Turns(lease=3600)
    nursery.start_soon(turns.run)
    first = await took(turns)
    with trio.move_on_after(0) as scope:  # cancelled at once, before its turn
        await took(turns)
    assert scope.cancelled_caught
    waiting = await given(turns, nursery)
    turns.done(first)
    await trio.testing.wait_all_tasks_blocked()
    assert len(waiting) == 1  # the turn went to one still there


class FakeTask:
    def __init__(self) -> None:
        self.cancelled = 0

    def cancel(self) -> None:
        self.cancelled += 1


def test_the_watchdog_cuts_off_a_stream_whose_send_waited_the_stall_and_only_it() -> None:
    now = [100.0]
    stalls = Stalls(stall=30, clock=lambda: now[0])
    stuck, reading, idle = FakeTask(), FakeTask(), FakeTask()
    with stalls.watching(stuck) as s1, stalls.watching(reading) as s2, stalls.watching(idle):
        s1.since = s2.since = stalls.now()  # idle sends nothing: caught up, it waits for records
        now[0] += 29.9
        stalls.look()
        assert stuck.cancelled == 0
        s2.since = stalls.now()  # reading: its sends end and the next one begins
        now[0] += 0.1
        stalls.look()
        stalls.look()  # once only
        assert (stuck.cancelled, reading.cancelled, idle.cancelled) == (1, 0, 0)
        assert s1.cut_off and not s2.cut_off
    stalls.look()  # gone streams are not looked at
    assert stuck.cancelled == 1
