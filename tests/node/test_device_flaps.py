"""A device plugin flapping a device's health (ADR 0017): the device manager in-process, its
records applied to real Views, against a grpcio device plugin that sends every flip.

Nothing waits on a clock: a window of an hour shows what is recorded at once and what is held
(the stream's end records it); a short window shows the trailing record the timer makes, and
the test waits on the log, not on time. The bound is checked against the trio clock's span.

Run as a script, it measures: ``python -m tests.node.test_device_flaps [SECONDS] [PER_SECOND]``
flaps one device at PER_SECOND (default 1,000) for SECONDS (default 60) with the daemon's
window, and prints the records it cost.
"""

from __future__ import annotations

import logging
import math
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio_asyncio

from eventsrc import events as ev
from eventsrc.core.devices.flaps import FLAP_WINDOW
from eventsrc.node.device_manager import DeviceManager, RegistryHandler
from tests.node.test_nri_plugin import FakeRecorder
from tests.support.eventually import eventually_trio
from tests.support.grpcio_plugin import HEALTHY, UNHEALTHY, Dev, GrpcioPlugin

RES = "example.com/flappy"


@pytest.fixture
def root() -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes: keep the root short.
    short = Path(tempfile.mkdtemp(prefix="es-", dir="/tmp"))
    yield short
    shutil.rmtree(short, ignore_errors=True)


@asynccontextmanager
async def device_manager(root: Path, window: float) -> AsyncIterator[tuple[DeviceManager, FakeRecorder]]:
    (root / "device-plugins").mkdir(exist_ok=True)
    recorder = FakeRecorder()
    manager = DeviceManager(recorder, root / "device-plugins", machine_numa_nodes=[0], flap_window=window)
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        yield manager, recorder
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def flappy_plugin(root: Path, recorder: FakeRecorder) -> AsyncIterator[GrpcioPlugin]:
    """A plugin of two healthy devices, registered and listed."""
    plugin = GrpcioPlugin(root, RES, [Dev("gpu-0", numa=0), Dev("gpu-1", numa=0)]).start()
    try:
        ok, error = await trio.to_thread.run_sync(plugin.register)
        assert ok, error
        await eventually_trio(lambda: len(recorder.views.devices.devices.get(RES, {})) == 2, "the devices listed")
        yield plugin
    finally:
        await trio.to_thread.run_sync(plugin.stop)


def health_records(recorder: FakeRecorder, device_id: str = "gpu-0") -> list[ev.DeviceHealthChanged]:
    return [e for e in recorder.of(ev.DeviceHealthChanged) if e.device_id == device_id]


def accounted(records: list[ev.DeviceHealthChanged]) -> int:
    """The flips ``records`` account for, from a healthy start: one for each that changes the
    health, and the count each carries."""
    total, health = 0, HEALTHY
    for e in records:
        total += (e.health != health) + e.coalesced
        health = e.health
    return total


def health(recorder: FakeRecorder, device_id: str = "gpu-0") -> str:
    return recorder.views.devices.devices[RES][device_id].health


FLIPS = [HEALTHY, UNHEALTHY] * 500 + [HEALTHY]  # 1,001 flips, the last to Healthy


async def test_a_failure_is_recorded_at_once_and_flaps_after_it_are_held_as_a_count(root: Path) -> None:
    async with device_manager(root, window=3600.0) as (manager, recorder), flappy_plugin(root, recorder) as plugin:
        # The first failure of a quiet device does not wait for the window (an hour here).
        plugin.set_health("gpu-0", UNHEALTHY)
        await eventually_trio(lambda: health_records(recorder), "the failure recorded")
        assert health_records(recorder) == [
            ev.DeviceHealthChanged(resource=RES, device_id="gpu-0", health=UNHEALTHY, numa_nodes=[0])
        ]
        assert health(recorder) == UNHEALTHY

        # 1,001 flips inside the window: counted as they come, none recorded; admission sees
        # the device out of service the while (the safe side).
        plugin.flap("gpu-0", FLIPS)
        flaps = manager.endpoints[RES].health.devices["gpu-0"]
        await eventually_trio(lambda: flaps.changes == len(FLIPS), "every flip counted")
        assert len(health_records(recorder)) == 1
        assert health(recorder) == UNHEALTHY

        # The stream's end records what is held, the plugin's last word, before the disconnection.
        await trio.to_thread.run_sync(plugin.stop)
        await eventually_trio(lambda: recorder.of(ev.PluginDisconnected), "the disconnection recorded")
    assert health_records(recorder)[1:] == [
        ev.DeviceHealthChanged(
            resource=RES, device_id="gpu-0", health=HEALTHY, numa_nodes=[0], coalesced=len(FLIPS) - 1
        )
    ]
    assert health(recorder) == HEALTHY == plugin.devices[0].health
    assert recorder.kinds()[-2:] == ["DeviceHealthChanged", "PluginDisconnected"]
    assert not health_records(recorder, "gpu-1")


async def test_a_deregistration_records_what_is_held_before_the_disconnection(root: Path) -> None:
    async with device_manager(root, window=3600.0) as (manager, recorder), flappy_plugin(root, recorder) as plugin:
        plugin.set_health("gpu-0", UNHEALTHY)
        await eventually_trio(lambda: health(recorder) == UNHEALTHY, "the failure recorded")
        plugin.set_health("gpu-0", HEALTHY)
        ep = manager.endpoints[RES]
        await eventually_trio(lambda: ep.health.devices["gpu-0"].changes == 1, "the return counted")
        assert health(recorder) == UNHEALTHY  # held: the window is an hour

        # plugins_registry says the plugin is gone: its stream is cancelled, what it held recorded.
        await RegistryHandler(manager).deregister(RES, str(ep.path))
        await eventually_trio(lambda: recorder.of(ev.PluginDisconnected), "the disconnection recorded")
        assert recorder.kinds()[-2:] == ["DeviceHealthChanged", "PluginDisconnected"]
        assert health(recorder) == HEALTHY == plugin.devices[0].health


async def test_the_window_end_records_the_newest_health_and_the_count_while_the_stream_goes_on(root: Path) -> None:
    window = 0.05
    async with device_manager(root, window) as (manager, recorder), flappy_plugin(root, recorder) as plugin:
        start = trio.current_time()
        plugin.flap("gpu-0", [UNHEALTHY, *FLIPS])

        # Every flip reaches the log, as a record or a count, without the stream ending.
        await eventually_trio(
            lambda: accounted(health_records(recorder)) == 1 + len(FLIPS), "every flip accounted for in the log"
        )
        span = trio.current_time() - start
        records = health_records(recorder)
        assert not recorder.of(ev.PluginDisconnected)
        assert records[-1].health == HEALTHY == health(recorder)  # the plugin's last word
        # At most two records a window, however the flips fell, in the span the test saw.
        assert len(records) <= 2 * (math.floor(span / window) + 1), (len(records), span)
        assert len(records) < len(FLIPS) // 10


# ---------------------------------------------------------------------------- the measurement


async def measure(seconds: float, per_second: float, window: float = FLAP_WINDOW) -> None:
    root = Path(tempfile.mkdtemp(prefix="es-", dir="/tmp"))
    try:
        async with device_manager(root, window) as (manager, recorder), flappy_plugin(root, recorder) as plugin:

            def storm() -> int:
                """Flip gpu-0 at ``per_second`` for ``seconds`` (in steps of 10 ms); the flips made."""
                made, begin = 0, time.monotonic()
                while (now := time.monotonic() - begin) < seconds:
                    due = int(now * per_second)
                    plugin.flap("gpu-0", [UNHEALTHY if i % 2 == 0 else HEALTHY for i in range(made, due)])
                    made = due
                    time.sleep(0.01)
                return made

            start = trio.current_time()
            flips = await trio.to_thread.run_sync(storm)
            await eventually_trio(
                lambda: accounted(health_records(recorder)) == flips, "every flip accounted for", timeout=120
            )
            span = trio.current_time() - start
            records = health_records(recorder)
            print(
                f"{flips} flips of one device in {span:.1f} s ({flips / span:.0f}/s), window {window:g} s: "
                f"{len(records)} DeviceHealthChanged records ({len(records) / span:.2f}/s; "
                f"bound {2 * (math.floor(span / window) + 1)}), "
                f"{sum(e.coalesced for e in records)} flips carried as counts; "
                f"{len(recorder.records)} records in all"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    logging.getLogger("eventsrc").setLevel(logging.ERROR)  # a line per record is not the figure
    seconds, per_second = [float(a) for a in sys.argv[1:3]] + [60.0, 1000.0][len(sys.argv[1:3]) :]
    trio.run(measure, seconds, per_second)
