"""A small device plugin (v1beta1) written with grpcio, for interop tests.

grpcio (Google's C-core gRPC) is independent of the daemon's grpclib, so what the daemon
sends and accepts is checked against another implementation of the protocol.

    plugin = GrpcioPlugin(root, "example.com/gpu", devices=[Dev("gpu-0", numa=0), ...])
    plugin.start()
    ok, error = plugin.register()
    ...
    plugin.set_devices([...])      # pushes a new ListAndWatch message
    plugin.flap("gpu-0", [...])    # one message per health, each sent even to a lagging stream
    plugin.calls("Allocate")       # what the daemon asked
    plugin.stop()
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tests.support.grpcio_stubs import (
    device_plugin,
    device_plugin_handler,
    registration_client,
    unix_target,
)

dp = device_plugin()
pb = dp.pb2

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class Dev:
    """A device as the plugin reports it; ``numa`` None: no topology."""

    id: str
    health: str = HEALTHY
    numa: int | None = None


@dataclass(frozen=True)
class Call:
    method: str
    fields: dict[str, Any] = field(default_factory=dict)


#: (available, must_include, size) -> preferred device IDs
Preference = Callable[[list[str], list[str], int], list[str]]


class _Servicer(dp.DevicePluginServicer):  # type: ignore[misc,name-defined]
    def __init__(self, plugin: GrpcioPlugin) -> None:
        self.p = plugin

    def GetDevicePluginOptions(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.p._record("GetDevicePluginOptions")
        return pb.DevicePluginOptions(
            pre_start_required=self.p.pre_start_required,
            get_preferred_allocation_available=self.p.get_preferred_allocation_available,
        )

    def ListAndWatch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.p._record("ListAndWatch")
        cond = self.p._cond
        sent = -1
        while True:
            with cond:
                while sent == self.p._generation and not self.p._stopping and context.is_active():
                    cond.wait(0.1)  # wake up now and then to notice a cancelled stream
                if self.p._stopping or not context.is_active():
                    return
                # The lists ``flap`` made since the last message, each; else only the newest.
                flaps = range(sent + 1, self.p._generation) if sent >= 0 else range(0)
                msgs = [self.p._list_message(self.p._flaps[g]) for g in flaps if g in self.p._flaps]
                msgs.append(self.p._list_message())
                sent = self.p._generation
            yield from msgs

    def GetPreferredAllocation(self, request: Any, context: grpc.ServicerContext) -> Any:
        responses = []
        for cr in request.container_requests:
            available = list(cr.available_deviceIDs)
            must = list(cr.must_include_deviceIDs)
            size = int(cr.allocation_size)
            self.p._record("GetPreferredAllocation", available=available, must_include=must, allocation_size=size)
            if self.p.preferred_error is not None:
                context.abort(*self.p.preferred_error)
            chosen = self.p.preference(available, must, size) if self.p.preference else available[:size]
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        responses = []
        for cr in request.container_requests:
            ids = list(cr.devices_ids)
            self.p._record("Allocate", device_ids=ids)
            if self.p.allocate_error is not None:
                context.abort(*self.p.allocate_error)
            responses.append(
                pb.ContainerAllocateResponse(
                    envs={"GRPCIO_DEVICES": ",".join(ids)},
                    devices=[
                        pb.DeviceSpec(container_path=f"/dev/{d}", host_path="/dev/null", permissions="rw") for d in ids
                    ],
                    cdi_devices=[pb.CDIDevice(name=f"{self.p.resource}={d}") for d in ids],
                )
            )
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.p._record("PreStartContainer", device_ids=list(request.devices_ids))
        return pb.PreStartContainerResponse()


class GrpcioPlugin:
    def __init__(
        self,
        root: Path,
        resource: str,
        devices: Iterable[Dev],
        *,
        name: str | None = None,
        pre_start_required: bool = False,
        get_preferred_allocation_available: bool = False,
        preference: Preference | None = None,
    ) -> None:
        self.root = root
        self.resource = resource
        self.directory = root / "device-plugins"
        self.kubelet_socket = self.directory / "kubelet.sock"
        # Short: a unix socket path has at most 107 characters, and pytest's tmp paths are long.
        self.name = name or "grpcio-" + resource.rsplit("/", 1)[-1]
        self.socket_name = f"{self.name}.sock"
        self.socket = self.directory / self.socket_name
        self.pre_start_required = pre_start_required
        self.get_preferred_allocation_available = get_preferred_allocation_available
        self.preference = preference
        #: (grpc.StatusCode, message) to abort Allocate / GetPreferredAllocation with; None: answer.
        self.allocate_error: tuple[grpc.StatusCode, str] | None = None
        self.preferred_error: tuple[grpc.StatusCode, str] | None = None
        self._devices = list(devices)
        self._generation = 0
        self._flaps: dict[int, list[Dev]] = {}  # generation -> the list ``flap`` made
        self._stopping = False
        self._cond = threading.Condition()
        self._calls: list[Call] = []
        self._calls_lock = threading.Lock()
        self._server: grpc.Server | None = None

    # ------------------------------------------------------------------ state

    def _record(self, method: str, **fields: Any) -> None:
        with self._calls_lock:
            self._calls.append(Call(method, fields))

    def calls(self, method: str | None = None) -> list[Call]:
        with self._calls_lock:
            return [c for c in self._calls if method is None or c.method == method]

    def _list_message(self, devices: list[Dev] | None = None) -> Any:
        out = []
        for d in self._devices if devices is None else devices:
            dev = pb.Device(ID=d.id, health=d.health)
            if d.numa is not None:
                dev.topology.nodes.append(pb.NUMANode(ID=d.numa))
            out.append(dev)
        return pb.ListAndWatchResponse(devices=out)

    @property
    def devices(self) -> list[Dev]:
        with self._cond:
            return list(self._devices)

    def set_devices(self, devices: Iterable[Dev]) -> None:
        """Replace the device list; every open ListAndWatch stream sends it."""
        with self._cond:
            self._devices = list(devices)
            self._generation += 1
            self._cond.notify_all()

    def set_health(self, device_id: str, health: str) -> None:
        with self._cond:
            devices = [Dev(d.id, health, d.numa) if d.id == device_id else d for d in self._devices]
        self.set_devices(devices)

    def flap(self, device_id: str, healths: Iterable[str]) -> None:
        """Give ``device_id`` each health of ``healths`` in turn: one ListAndWatch message each,
        all of them sent to a stream that lags (``set_devices`` sends it only the newest)."""
        with self._cond:
            for health in healths:
                self._devices = [Dev(d.id, health, d.numa) if d.id == device_id else d for d in self._devices]
                self._generation += 1
                self._flaps[self._generation] = self._devices
            self._cond.notify_all()

    # ------------------------------------------------------------------ running

    def start(self) -> GrpcioPlugin:
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        server.add_generic_rpc_handlers([device_plugin_handler(_Servicer(self))])
        server.add_insecure_port(unix_target(self.socket))
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._server is not None:
            self._server.stop(grace=0.5).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)

    def __enter__(self) -> GrpcioPlugin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def register(
        self,
        version: str = "v1beta1",
        resource_name: str | None = None,
        endpoint: str | None = None,
        timeout: float = 15,
    ) -> tuple[bool, str]:
        """``v1beta1.Registration/Register`` on kubelet.sock; (ok, the error's message)."""
        req = pb.RegisterRequest(
            version=version,
            endpoint=self.socket_name if endpoint is None else endpoint,
            resource_name=self.resource if resource_name is None else resource_name,
            options=pb.DevicePluginOptions(
                pre_start_required=self.pre_start_required,
                get_preferred_allocation_available=self.get_preferred_allocation_available,
            ),
        )
        with grpc.insecure_channel(unix_target(self.kubelet_socket)) as channel:
            try:
                registration_client(channel).Register(req, timeout=timeout)
            except grpc.RpcError as err:
                return False, err.details() or ""
        return True, ""
