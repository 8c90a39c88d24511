"""The loop's task steps timed where they happen (``eventsrc.obs.loop``): a step that keeps
the loop is found with its task's name and when it ended, and only in the spans it ended in;
its CPU time tells the loop's own work from another thread's and from waiting."""

from __future__ import annotations

import pytest
import trio

from eventsrc.obs.loop import KEEP, KEEP_SECONDS, LoopHolds

SLOW = 0.012  # a step that holds the loop this long (longer than the 10 ms goal)


class Clocks:
    """The instrument's clocks, played by the test: a step's wall time, the loop thread's CPU
    time and the process's, each moved only by what the test says happened (no sleeping,
    no spinning, so no figure depends on this machine's load)."""

    def __init__(self) -> None:
        self.wall = self.thread = self.process = 100.0  # not 0: the instrument takes 0 for "no start"
        self.ns = 1_000_000_000

    def work(self, seconds: float) -> None:
        """The loop's thread computes."""
        self.wall += seconds
        self.thread += seconds
        self.process += seconds

    def wait(self, seconds: float) -> None:
        """The loop's thread waits (a blocking call, no core)."""
        self.wall += seconds

    def other_thread(self, seconds: float) -> None:
        """Another thread of the process computes while the loop's waits for it."""
        self.wall += seconds
        self.process += seconds

    def now_ns(self) -> int:
        return self.ns + int(self.wall * 1e9)


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch) -> Clocks:
    from eventsrc.obs import loop

    c = Clocks()
    monkeypatch.setattr(loop, "_clock", lambda: c.wall)
    monkeypatch.setattr(loop, "_thread_cpu", lambda: c.thread)
    monkeypatch.setattr(loop, "_process_cpu", lambda: c.process)
    monkeypatch.setattr(loop, "_now_ns", c.now_ns)
    return c


def test_a_step_that_keeps_the_loop_is_found_with_its_task_and_time(clocks: Clocks) -> None:
    holds = LoopHolds()
    before = clocks.now_ns()

    async def slow_step() -> None:
        await trio.lowlevel.checkpoint()
        clocks.wait(SLOW)  # plays a request that keeps the loop: no checkpoint for SLOW seconds
        await trio.lowlevel.checkpoint()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow_step, name="slow-request")

    trio.run(main, instruments=[holds])
    after = clocks.now_ns() + 1
    assert holds.steps > 2
    assert holds.longest == pytest.approx(SLOW) and holds.longest_task == "slow-request"
    assert holds.over == 1 and holds.kept == 1
    (kept,) = holds.recent
    assert kept.task == "slow-request" and kept.seconds == pytest.approx(SLOW) and before < kept.end_ns <= after
    assert kept in holds.since(before)
    assert holds.since(after) == []  # it ended before that span began
    assert all(step.seconds >= KEEP_SECONDS for step in holds.recent)
    # it waited: a long step, but not the loop's work
    assert kept.cpu == 0 and holds.cpu_over == 0


def test_a_step_that_works_is_told_from_one_that_waits(clocks: Clocks) -> None:
    holds = LoopHolds()

    async def busy() -> None:
        await trio.lowlevel.checkpoint()
        clocks.work(SLOW)  # the loop's own work
        await trio.lowlevel.checkpoint()

    async def other_thread() -> None:
        await trio.lowlevel.checkpoint()
        clocks.other_thread(SLOW)  # the loop waits while another thread of the process works
        await trio.lowlevel.checkpoint()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(busy, name="busy")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(other_thread, name="other-thread")

    trio.run(main, instruments=[holds])
    (worked,) = (step for step in holds.recent if step.task == "busy")
    assert worked.cpu == pytest.approx(SLOW) and worked.process_cpu == pytest.approx(SLOW)
    assert holds.longest_cpu == pytest.approx(SLOW) and holds.longest_cpu_task == "busy" and holds.cpu_over == 1
    (waited,) = (step for step in holds.recent if step.task == "other-thread")
    assert waited.seconds == pytest.approx(SLOW) and waited.cpu == 0 and waited.process_cpu == pytest.approx(SLOW)


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
