"""The daemon keeps the usage index current (``eventsrc.node.usage_keeper``, docs/adr/0040):
its feeder, a process of its own, brings the index up to the log's end; the keeper starts it
every ``every_records`` records or ``every_seconds`` after the last feed when anything is new,
and says a failure once and the recovery once. The clock is trio's MockClock: nothing sleeps."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from eventsrc import events as ev
from eventsrc.layout import Layout
from eventsrc.log.store import EventLog
from eventsrc.log.usage_index import UsageIndex
from eventsrc.node.usage_keeper import UsageKeeper
from tests.unit.test_usage import GPU, T0, H


def a_log(layout: Layout, pods: int) -> EventLog:
    layout.state.mkdir(parents=True)
    log = EventLog(layout.log)
    for i in range(pods):
        uid = f"u{i}"
        log.append([ev.PodAdmitted(pod=ev.PodRef(uid=uid, namespace="team-a", name=f"p{i}"))], f"a{i}", T0 + i * H)
        allocated = ev.DevicesAllocated(pod_uid=uid, container="m", resource=GPU, device_ids=[f"gpu-{i}"])
        log.append([allocated], f"b{i}", T0 + i * H)
    return log


async def test_the_feeder_brings_the_index_to_the_logs_end(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    log = a_log(layout, 3)
    keeper = UsageKeeper(layout, log.last_seq)
    assert await keeper.feed() == ""
    with UsageIndex(layout.usage) as index:
        assert index.fed_seq() == log.last_seq() == 6
    log.append([ev.DevicesReleased(pod_uid="u0", container="m", resource=GPU, device_ids=["gpu-0"])], "r", T0 + 9 * H)
    assert await keeper.feed() == ""
    with UsageIndex(layout.usage) as index:
        assert index.fed_seq() == 7
    log.close()


async def test_a_feeder_that_cannot_write_the_index_says_why_in_one_line(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    log = a_log(layout, 1)
    layout.usage.write_text("not a directory")
    reason = await UsageKeeper(layout, log.last_seq).feed()
    assert "cannot open the usage index" in reason and "\n" not in reason
    log.close()


async def test_feeds_come_every_n_records_or_after_a_quiet_while_and_failures_are_said_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    last = [0]
    keeper = UsageKeeper(Layout(tmp_path), lambda: last[0])
    keeper.every_records, keeper.every_seconds = 10, 300.0
    outcomes = ["", "disk full", "disk full", ""]
    fed_at: list[tuple[float, int]] = []
    fed = trio.Event()

    async def feed() -> str:
        nonlocal fed
        fed_at.append((trio.current_time(), last[0]))
        fed.set()
        fed = trio.Event()
        return outcomes.pop(0) if outcomes else ""

    keeper.feed = feed  # type: ignore[method-assign]
    caplog.set_level(logging.INFO)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(keeper.run)
        start = trio.current_time()
        last[0] = 9
        keeper.maybe_due(9)  # under the count: no feed until the quiet while has passed
        await trio.testing.wait_all_tasks_blocked()
        assert fed_at == []
        last[0] = 10
        keeper.maybe_due(10)
        waiting = fed
        await waiting.wait()
        assert fed_at == [(start, 10)] and keeper.fed == 10
        last[0] = 12  # two records: fed after the quiet while, not before
        waiting = fed
        await waiting.wait()
        assert fed_at[-1] == (start + 300.0, 12)
        # it failed ("disk full"): tried again after the pause, failed again, then recovered
        while len(fed_at) < 4:
            waiting = fed
            await waiting.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert keeper.fed == 12 and keeper.failing == ""
        nursery.cancel_scope.cancel()
    said = [r.getMessage() for r in caplog.records if r.name == "eventsrc.node.usage_keeper"]
    assert sum("cannot feed the usage index" in m for m in said) == 1
    assert sum("usage index fed again" in m for m in said) == 1
