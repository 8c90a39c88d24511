"""Edge to device plugins: the v1beta1 Registration server and one endpoint per plugin.

    DeviceManager.run
      ├─ serve_unix(Registration) on ROOT/device-plugins/kubelet.sock
      ├─ Endpoint tasks: ListAndWatch of each registered plugin
      └─ grace timers: a resource whose plugin stays away is dropped after ``grace``

Decisions (what a device list changed, which devices to give) live in eventsrc.core;
this module dials, streams and records.
"""

from __future__ import annotations

import logging
import math
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import trio
from grpclib import GRPCError, Status
from grpclib.client import Channel
from grpclib.server import Stream

from eventsrc import events as ev
from eventsrc.core.devices import list_and_watch_events
from eventsrc.core.names import endpoint_error, registration_error
from eventsrc.errors import EventsrcError
from eventsrc.gen.deviceplugin.v1beta1 import api_pb2 as pb
from eventsrc.gen.deviceplugin.v1beta1.api_grpc import DevicePluginStub, RegistrationBase
from eventsrc.rpc import CALL_ERRORS, serve_unix, to_aio, to_trio, why

if TYPE_CHECKING:
    from eventsrc.daemon import Daemon

log = logging.getLogger("eventsrc.devices")

DIAL_TIMEOUT = 10.0
PRE_START_TIMEOUT = 30.0  # KubeletPreStartContainerRPCTimeoutInSecs
DEFAULT_GRACE = 300.0  # endpointStopGracePeriod


class RegistrationRejected(EventsrcError):
    pass


class PluginCallFailed(EventsrcError):
    pass


@dataclass(eq=False)
class Endpoint:
    resource: str
    endpoint: str  # file name in the device-plugin directory, or an absolute path (plugins_registry)
    path: Path
    channel: Channel
    stub: DevicePluginStub
    options: ev.PluginOptions
    listed: trio.Event = field(default_factory=trio.Event)  # first ListAndWatch message handled
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)

    async def allocate(self, device_ids: list[str], timeout: float | None) -> pb.ContainerAllocateResponse:
        req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=device_ids)])
        resp = await to_aio(self.stub.Allocate)(req, timeout=timeout)
        if not resp.container_responses:
            raise PluginCallFailed(f"the {self.resource} plugin's Allocate answer has no container response")
        return resp.container_responses[0]

    async def preferred(self, available: list[str], must_include: list[str], size: int) -> list[str]:
        req = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size
                )
            ]
        )
        resp = await to_aio(self.stub.GetPreferredAllocation)(req, timeout=DIAL_TIMEOUT)
        if not resp.container_responses:
            return []
        return list(resp.container_responses[0].deviceIDs)

    async def pre_start(self, device_ids: list[str]) -> None:
        await to_aio(self.stub.PreStartContainer)(pb.PreStartContainerRequest(devices_ids=device_ids), timeout=PRE_START_TIMEOUT)


def allocation_from_proto(r: pb.ContainerAllocateResponse) -> ev.ContainerAllocation:
    return ev.ContainerAllocation(
        envs=dict(r.envs),
        mounts=[ev.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only) for m in r.mounts],
        devices=[ev.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions) for d in r.devices],
        annotations=dict(r.annotations),
        cdi_devices=[c.name for c in r.cdi_devices],
    )


def remove_stale_sockets(directory: Path) -> list[str]:
    """Delete every unix socket in ``directory`` (as the kubelet does on start), so that
    running plugins notice and register again. Regular files and directories stay."""
    removed = []
    for entry in directory.iterdir():
        try:
            if stat.S_ISSOCK(entry.lstat().st_mode):
                entry.unlink()
                removed.append(entry.name)
        except FileNotFoundError:
            continue
    return removed


class RegistrationService(RegistrationBase):
    def __init__(self, manager: DeviceManager) -> None:
        self._manager = manager

    async def Register(self, stream: Stream[pb.RegisterRequest, pb.Empty]) -> None:
        req = await stream.recv_message()
        assert req is not None
        try:
            await to_trio(self._manager.register)(req.version, req.resource_name, req.endpoint)
        except RegistrationRejected as err:
            # The kubelet returns a plain Go error: gRPC code Unknown with the message.
            raise GRPCError(Status.UNKNOWN, str(err)) from None
        await stream.send_message(pb.Empty())


class DeviceManager:
    def __init__(self, daemon: Daemon, grace: float = DEFAULT_GRACE) -> None:
        self.daemon = daemon
        self.directory = daemon.layout.device_plugins
        self.socket = self.directory / "kubelet.sock"
        self.grace = grace
        self.endpoints: dict[str, Endpoint] = {}
        self._changed = trio.Event()  # set whenever an endpoint lists devices or goes away
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        removed = remove_stale_sockets(self.directory)
        if removed:
            log.info("removed stale sockets so that plugins register again sockets=%s", ",".join(sorted(removed)))
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for plugin in self.daemon.views.devices.plugins.values():
                if not plugin.connected:
                    nursery.start_soon(self._expire, plugin.resource, plugin.disconnected_seq)
            await nursery.start(serve_unix, [RegistrationService(self)], self.socket, None)
            task_status.started()
            await trio.sleep_forever()

    # ------------------------------------------------------------------ registration

    async def register(self, version: str, resource: str, endpoint: str, path: Path | None = None) -> None:
        """The kubelet's Register: check, dial, GetDevicePluginOptions, then start streaming.

        Raises RegistrationRejected with the reason; every outcome is an event.
        """
        reason = registration_error(version, resource) or (endpoint_error(endpoint) if path is None else "")
        target = path if path is not None else self.directory / endpoint
        if not reason:
            channel = Channel(path=str(target))
            stub = DevicePluginStub(channel)
            try:
                with trio.fail_after(DIAL_TIMEOUT):
                    opts = await to_aio(stub.GetDevicePluginOptions)(pb.Empty(), timeout=DIAL_TIMEOUT)
            except CALL_ERRORS as exc:
                channel.close()
                reason = f"cannot dial the endpoint {target}: {why(exc)}"
        if reason:
            await self.daemon.record(
                [ev.PluginRegistrationRejected(resource=resource, endpoint=endpoint, api_version=version, reason=reason)]
            )
            log.warning("registration rejected resource=%s endpoint=%s reason=%r", resource, endpoint, reason)
            raise RegistrationRejected(reason)
        options = ev.PluginOptions(
            pre_start_required=opts.pre_start_required,
            get_preferred_allocation_available=opts.get_preferred_allocation_available,
        )
        ep = Endpoint(resource, endpoint, target, channel, stub, options)
        old = self.endpoints.get(resource)
        self.endpoints[resource] = ep
        if old is not None:
            old.cancel.cancel()  # the newest registration wins; its list replaces the old one's
        await self.daemon.record(
            [ev.PluginRegistered(resource=resource, endpoint=endpoint, api_version=version, options=options)]
        )
        log.info("plugin registered resource=%s endpoint=%s", resource, endpoint)
        assert self._nursery is not None
        self._nursery.start_soon(self._run_endpoint, ep)

    # ------------------------------------------------------------------ ListAndWatch

    async def _run_endpoint(self, ep: Endpoint) -> None:
        reason = "ListAndWatch stream ended"
        with ep.cancel:
            try:
                await to_aio(self._list_and_watch)(ep)
            except CALL_ERRORS as exc:
                reason = f"ListAndWatch failed: {why(exc)}"
            except Exception as exc:  # a plugin must never take the daemon down
                log.exception("ListAndWatch of resource=%s failed unexpectedly", ep.resource)
                reason = f"ListAndWatch failed: {type(exc).__name__}: {exc}"
        ep.channel.close()
        if self.endpoints.get(ep.resource) is not ep:
            return  # replaced by a newer registration: nothing was lost
        del self.endpoints[ep.resource]
        (rec,) = await self.daemon.record([ev.PluginDisconnected(resource=ep.resource, endpoint=ep.endpoint, reason=reason)])
        log.warning("plugin disconnected resource=%s reason=%r grace_s=%s", ep.resource, reason, self.grace)
        self._notify()
        assert self._nursery is not None
        self._nursery.start_soon(self._expire, ep.resource, rec.seq)

    async def _list_and_watch(self, ep: Endpoint) -> None:  # runs on asyncio
        async with ep.stub.ListAndWatch.open() as stream:
            await stream.send_message(pb.Empty(), end=True)
            async for msg in stream:
                await to_trio(self._devices_listed)(ep, msg)

    async def _devices_listed(self, ep: Endpoint, msg: pb.ListAndWatchResponse) -> None:
        if self.endpoints.get(ep.resource) is not ep:
            return
        update = [
            ev.DeviceInfo(id=d.ID, health=d.health, numa_nodes=[n.ID for n in d.topology.nodes])
            for d in msg.devices
        ]
        known = self.daemon.views.devices.devices.get(ep.resource, {})
        events = list_and_watch_events(ep.resource, {k: d for k, d in known.items() if not d.removed}, update)
        if events:
            await self.daemon.record(events)
        if not ep.listed.is_set():
            ep.listed.set()
        self._notify()

    async def _expire(self, resource: str, since_seq: int) -> None:
        await trio.sleep(self.grace)
        plugin = self.daemon.views.devices.plugins.get(resource)
        if plugin is None or plugin.connected or resource in self.endpoints or plugin.disconnected_seq != since_seq:
            return
        await self.daemon.record([ev.ResourceDropped(resource=resource, reason=f"plugin away for {self.grace:g} s")])
        log.warning("resource dropped resource=%s", resource)
        self._notify()

    # ------------------------------------------------------------------ for admission

    def _notify(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    async def wait_listed(self, resource: str, timeout: float) -> Endpoint | None:
        """The resource's endpoint once it has listed its devices, waiting up to ``timeout``
        while the resource is known but its plugin is away (after a restart, say)."""
        with trio.move_on_after(timeout if math.isfinite(timeout) else math.inf):
            while True:
                ep = self.endpoints.get(resource)
                if ep is not None and ep.listed.is_set():
                    return ep
                if resource not in self.daemon.views.devices.plugins:
                    return None
                await self._changed.wait()
        return None



class RegistryHandler:
    """Device plugins that register through plugins_registry (type DevicePlugin), as the
    kubelet accepts them: the same checks, the endpoint is an absolute socket path."""

    def __init__(self, manager: DeviceManager) -> None:
        self.manager = manager

    async def validate(self, name: str, endpoint: str, versions: list[str]) -> None:
        if "v1beta1" not in versions:
            raise RegistrationRejected(f"manager version, v1beta1, is not among plugin supported versions {versions}")
        reason = registration_error("v1beta1", name)
        if reason:
            raise RegistrationRejected(f"invalid name of device plugin socket: {reason}")

    async def register(self, name: str, endpoint: str, versions: list[str], socket_path: Path | None = None) -> None:
        deprecation = self.manager.directory / "DEPRECATION"
        if not deprecation.exists():
            deprecation.touch()
        await self.manager.register("v1beta1", name, endpoint, path=Path(endpoint))

    async def deregister(self, name: str, endpoint: str, socket_path: Path | None = None) -> None:
        ep = self.manager.endpoints.get(name)
        if ep is not None and ep.path == Path(endpoint):
            ep.cancel.cancel()  # its stream ends; the endpoint task records the disconnection
