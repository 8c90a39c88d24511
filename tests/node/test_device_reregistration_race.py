"""A plugin that registers again while its old stream's last list is being recorded (a flap
held back, ADR 0017) keeps its new registration: the old stream's end must not delete it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing

from eventsrc import events as ev
from eventsrc.gen.deviceplugin.v1beta1 import api_pb2 as pb
from eventsrc.node import device_manager as dm
from tests.node.test_nri_plugin import FakeRecorder

RESOURCE = "example.com/r"


class GatedRecorder(FakeRecorder):
    """Holds the second DeviceHealthChanged append (the stream's final pass) until ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = trio.Event()
        self.waiting = trio.Event()
        self.health_appends = 0

    async def record(self, events: Any, correlation_id: str | None = None) -> Any:
        if any(isinstance(e, ev.DeviceHealthChanged) for e in events):
            self.health_appends += 1
            if self.health_appends == 2:
                self.waiting.set()
                await self.gate.wait()
        return await super().record(events, correlation_id)


class Channel:
    def close(self) -> None:
        pass


def endpoint() -> dm.Endpoint:
    return dm.Endpoint(RESOURCE, "a.sock", Path("/tmp/a.sock"), Channel(), None, ev.PluginOptions())  # type: ignore[arg-type]


def listing(health: str) -> pb.ListAndWatchResponse:
    return pb.ListAndWatchResponse(devices=[pb.Device(ID="d0", health=health)])


async def test_a_registration_during_the_old_streams_final_record_is_kept(
    autojump_clock: trio.testing.MockClock, monkeypatch: Any
) -> None:
    recorder = GatedRecorder()
    manager = dm.DeviceManager(recorder, Path("/tmp"), flap_window=3600)

    async def list_and_watch(ep: dm.Endpoint) -> None:
        # Healthy, a failure (recorded at once), back to Healthy (held: the window is an hour)
        for health in ("Healthy", "Unhealthy", "Healthy"):
            await manager._devices_received(ep, listing(health))
            await trio.testing.wait_all_tasks_blocked()

    monkeypatch.setattr(manager, "_list_and_watch", list_and_watch)
    monkeypatch.setattr(dm, "to_aio", lambda f: f)  # the stream above is trio already
    registered = ev.PluginRegistered(resource=RESOURCE, endpoint="a.sock", api_version="v1beta1")
    with trio.fail_after(600):  # mock time: a hang fails at once
        await run(manager, recorder, registered)


async def run(manager: dm.DeviceManager, recorder: GatedRecorder, registered: ev.PluginRegistered) -> None:
    async with trio.open_nursery() as nursery:
        manager._nursery = nursery
        old = endpoint()
        manager.endpoints[RESOURCE] = old
        await FakeRecorder.record(recorder, [registered])
        nursery.start_soon(manager._run_endpoint, old)
        await recorder.waiting.wait()  # the stream ended; its final pass is being recorded
        new = manager.endpoints[RESOURCE] = endpoint()  # the plugin registered again meanwhile
        await FakeRecorder.record(recorder, [registered])
        recorder.gate.set()
        await trio.testing.wait_all_tasks_blocked()
        assert manager.endpoints.get(RESOURCE) is new
        assert recorder.views.devices.plugins[RESOURCE].connected
        assert not any(isinstance(r.event, ev.PluginDisconnected) for r in recorder.records)
        nursery.cancel_scope.cancel()
