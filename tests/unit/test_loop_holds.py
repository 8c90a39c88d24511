"""The loop's task steps timed where they happen (``eventsrc.obs.loop``): a step that keeps
the loop is found with its task's name and when it ended, and only in the spans it ended in;
its CPU time tells the loop's own work from another thread's and from waiting."""

from __future__ import annotations

import threading
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
    kept = [step for step in holds.recent if step.task == "slow-request"]
    assert len(kept) == 1 and kept[0].seconds >= SLOW and before < kept[0].end_ns <= after
    assert kept[0] in holds.since(before)
    assert holds.since(after) == []  # it ended before that span began
    assert all(step.seconds >= KEEP_SECONDS for step in holds.recent)
    # it slept: a long step, but not the loop's work
    assert kept[0].cpu < SLOW / 2 and holds.cpu_over == 0


def _spin(seconds: float) -> None:
    """Burn ``seconds`` of this thread's CPU time."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def test_a_step_that_works_is_told_from_one_that_waits() -> None:
    holds = LoopHolds()

    async def busy() -> None:
        await trio.lowlevel.checkpoint()
        _spin(SLOW)  # the loop's own work
        await trio.lowlevel.checkpoint()

    async def other_thread() -> None:
        await trio.lowlevel.checkpoint()
        worker = threading.Thread(target=_spin, args=(SLOW,))
        worker.start()
        worker.join()  # the loop waits while another thread of the process works
        await trio.lowlevel.checkpoint()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(busy, name="busy")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other_thread, name="other-thread")

    trio.run(main, instruments=[holds])
    (worked,) = (step for step in holds.recent if step.task == "busy")
    assert worked.cpu >= SLOW and worked.process_cpu >= worked.cpu and worked.seconds >= SLOW
    assert holds.longest_cpu >= SLOW and holds.longest_cpu_task == "busy" and holds.cpu_over == 1
    (waited,) = (step for step in holds.recent if step.task == "other-thread")
    assert waited.seconds >= SLOW and waited.cpu < SLOW / 2 and waited.process_cpu - waited.cpu >= SLOW


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
