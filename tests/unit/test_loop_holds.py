"""The loop's task steps timed where they happen (``eventsrc.obs.loop``): a step that keeps
the loop is found with its task's name and when it ended, and only in the spans it ended in."""

from __future__ import annotations

import time

import pytest
import trio

from eventsrc.obs.loop import KEEP, KEEP_SECONDS, LoopHolds

SLOW = 0.012  # a step that holds the loop at least this long (longer than the 10 ms goal)


async def _slow_step() -> None:
    await trio.lowlevel.checkpoint()
    time.sleep(SLOW)  # plays a request that keeps the loop: no checkpoint for SLOW seconds
    await trio.lowlevel.checkpoint()


def test_a_step_that_keeps_the_loop_is_found_with_its_task_and_time() -> None:
    holds = LoopHolds()
    before = time.monotonic_ns()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_slow_step, name="slow-request")

    trio.run(main, instruments=[holds])
    after = time.monotonic_ns()
    assert holds.steps > 2
    assert holds.longest >= SLOW and holds.longest_task == "slow-request"
    assert holds.over >= 1 and holds.kept >= 1
    kept = [(end, held) for end, held, name in holds.recent if name == "slow-request"]
    assert len(kept) == 1 and kept[0][1] >= SLOW and before < kept[0][0] <= after
    assert holds.longest_since(before) >= (SLOW, "slow-request")
    assert holds.longest_since(after) == (0.0, "")  # it ended before that span began
    assert all(held >= KEEP_SECONDS for _, held, _ in holds.recent)


def test_quick_steps_are_counted_not_kept() -> None:
    holds = LoopHolds()

    async def main() -> None:
        for _ in range(50):
            await trio.lowlevel.checkpoint()

    trio.run(main, instruments=[holds])
    assert holds.steps >= 50
    assert holds.kept == len(holds.recent) <= holds.steps
    assert holds.recent.maxlen == KEEP


def test_added_in_the_middle_of_a_step_that_step_is_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    from eventsrc.obs import loop

    monkeypatch.setattr(loop, "_clock", lambda: 1000.0)  # every step takes no time
    holds = LoopHolds()

    async def main() -> None:
        trio.lowlevel.add_instrument(holds)  # inside a step: its after-hook comes without its before-hook
        await trio.lowlevel.checkpoint()
        await trio.lowlevel.checkpoint()
        trio.lowlevel.remove_instrument(holds)

    trio.run(main)
    assert holds.longest == 0.0 and holds.kept == 0 and holds.steps >= 1
