"""A sample device plugin (device plugin API v1beta1), for demos and tests.

It is a real plugin: it serves ``v1beta1.DevicePlugin`` on its own socket in the
device-plugin directory, registers with ``kubelet.sock``, streams its devices, answers
Allocate with envs, device nodes, annotations and CDI names, and optionally
GetPreferredAllocation (NUMA packing) and PreStartContainer. When ``kubelet.sock`` is
recreated or its own socket is removed (a kubelet or eventsrc restart), it serves again
and registers again. It works against a real kubelet too.

With ``cdi_dir``, it writes a CDI spec for its devices there (``<vendor>-<class>.json``, kind
= the resource name): device ``dev-N`` sets ``SAMPLE_CDI_DEV_N=dev-N`` in the container, so a
runtime configured with that directory resolves the CDI names Allocate gives and a test can see
it did.

Health at runtime: write ``{"dev-3": "Unhealthy"}`` to the health file (default
``ROOT/plugins/sample-<resource>/health.json``); the plugin reads it every 0.2 s and sends
the new list.

Pure asyncio and grpclib: a plugin is a separate program, not part of the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from grpclib import GRPCError, Status
from grpclib.client import Channel
from grpclib.server import Server, Stream

from eventsrc.gen.deviceplugin.v1beta1 import api_pb2 as pb
from eventsrc.gen.deviceplugin.v1beta1.api_grpc import DevicePluginBase, RegistrationStub

log = logging.getLogger("eventsrc.sample-plugin")


def slug(resource: str) -> str:
    return resource.replace("/", "-").replace(".", "-")


class SamplePlugin(DevicePluginBase):
    def __init__(
        self,
        root: Path,
        resource: str,
        devices: int,
        numa_nodes: int,
        preferred: bool = False,
        pre_start: bool = False,
        calls_log: Path | None = None,
        health_file: Path | None = None,
        socket_name: str | None = None,
    ) -> None:
        self.root = root
        self.resource = resource
        self.dir = root / "device-plugins"
        self.kubelet_socket = self.dir / "kubelet.sock"
        self.socket_name = socket_name or f"sample-{slug(resource)}.sock"
        self.socket = self.dir / self.socket_name
        self.preferred = preferred
        self.pre_start = pre_start
        self.calls_log = calls_log
        self.health_file = health_file or root / "plugins" / f"sample-{slug(resource)}" / "health.json"
        k = max(numa_nodes, 1)
        self.numa = {f"dev-{i}": (i * k) // max(devices, 1) if numa_nodes > 0 else -1 for i in range(devices)}
        self.health = {d: "Healthy" for d in self.numa}
        self._changed = asyncio.Event()  # replaced on every change; streams wait on theirs
        self._health_mtime = 0.0

    # ------------------------------------------------------------------ the DevicePlugin service

    def _device_list(self) -> pb.ListAndWatchResponse:
        out = []
        for d, node in self.numa.items():
            dev = pb.Device(ID=d, health=self.health[d])
            if node >= 0:
                dev.topology.nodes.append(pb.NUMANode(ID=node))
            out.append(dev)
        return pb.ListAndWatchResponse(devices=out)

    def _record(self, method: str, **fields: Any) -> None:
        if self.calls_log is not None:
            with open(self.calls_log, "a") as f:
                f.write(json.dumps({"method": method, **fields}) + "\n")

    async def GetDevicePluginOptions(self, stream: Stream[pb.Empty, pb.DevicePluginOptions]) -> None:
        await stream.recv_message()
        await stream.send_message(
            pb.DevicePluginOptions(pre_start_required=self.pre_start, get_preferred_allocation_available=self.preferred)
        )

    async def ListAndWatch(self, stream: Stream[pb.Empty, pb.ListAndWatchResponse]) -> None:
        await stream.recv_message()
        while True:
            changed = self._changed
            await stream.send_message(self._device_list())
            await changed.wait()

    async def GetPreferredAllocation(
        self, stream: Stream[pb.PreferredAllocationRequest, pb.PreferredAllocationResponse]
    ) -> None:
        req = await stream.recv_message()
        assert req is not None
        responses = []
        for cr in req.container_requests:
            self._record(
                "GetPreferredAllocation",
                available=list(cr.available_deviceIDs),
                must_include=list(cr.must_include_deviceIDs),
                size=cr.allocation_size,
            )
            chosen = list(cr.must_include_deviceIDs)
            rest = [d for d in cr.available_deviceIDs if d not in chosen]
            # Pack on the NUMA node with the most candidates.
            by_node: dict[int, list[str]] = {}
            for d in rest:
                by_node.setdefault(self.numa.get(d, -1), []).append(d)
            for _, ids in sorted(by_node.items(), key=lambda kv: (-len(kv[1]), kv[0])):
                for d in sorted(ids, key=lambda x: int(x.split("-")[-1]) if x.split("-")[-1].isdigit() else 0):
                    if len(chosen) >= cr.allocation_size:
                        break
                    chosen.append(d)
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        await stream.send_message(pb.PreferredAllocationResponse(container_responses=responses))

    async def Allocate(self, stream: Stream[pb.AllocateRequest, pb.AllocateResponse]) -> None:
        req = await stream.recv_message()
        assert req is not None
        responses = []
        for cr in req.container_requests:
            ids = list(cr.devices_ids)
            self._record("Allocate", device_ids=ids)
            unknown = [d for d in ids if d not in self.numa]
            if unknown:
                raise GRPCError(Status.INVALID_ARGUMENT, f"unknown devices {unknown}")
            responses.append(
                pb.ContainerAllocateResponse(
                    envs={"SAMPLE_DEVICES": ",".join(ids), "SAMPLE_RESOURCE": self.resource},
                    mounts=[
                        pb.Mount(container_path="/var/run/sample", host_path=str(self.root / "plugins"), read_only=True)
                    ],
                    devices=[
                        pb.DeviceSpec(container_path=f"/dev/{d}", host_path="/dev/null", permissions="rw") for d in ids
                    ],
                    annotations={f"{self.resource.split('/')[0]}/devices": ",".join(ids)},
                    cdi_devices=[pb.CDIDevice(name=f"{self.resource}={d}") for d in ids],
                )
            )
        await stream.send_message(pb.AllocateResponse(container_responses=responses))

    async def PreStartContainer(
        self, stream: Stream[pb.PreStartContainerRequest, pb.PreStartContainerResponse]
    ) -> None:
        req = await stream.recv_message()
        assert req is not None
        self._record("PreStartContainer", device_ids=list(req.devices_ids))
        await stream.send_message(pb.PreStartContainerResponse())

    # ------------------------------------------------------------------ running

    async def register(self) -> None:
        channel = Channel(path=str(self.kubelet_socket))
        try:
            await RegistrationStub(channel).Register(
                pb.RegisterRequest(
                    version="v1beta1",
                    endpoint=self.socket_name,
                    resource_name=self.resource,
                    options=pb.DevicePluginOptions(
                        pre_start_required=self.pre_start, get_preferred_allocation_available=self.preferred
                    ),
                ),
                timeout=15,
            )
        finally:
            channel.close()

    def _read_health(self) -> bool:
        try:
            mtime = self.health_file.stat().st_mtime
        except FileNotFoundError:
            return False
        if mtime == self._health_mtime:
            return False
        self._health_mtime = mtime
        try:
            wanted = json.loads(self.health_file.read_text() or "{}")
        except ValueError:
            log.warning("health file %s is not JSON; ignored", self.health_file)
            return False
        changed = False
        for d in self.numa:
            h = wanted.get(d, "Healthy")
            if self.health[d] != h:
                self.health[d] = h
                changed = True
        return changed

    async def run(self, stop: asyncio.Event) -> None:
        """Serve and register; serve and register again whenever the kubelet restarts."""
        while not stop.is_set():
            while not self.kubelet_socket.exists():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.2)
                if stop.is_set():
                    return
            kubelet_inode = self.kubelet_socket.stat().st_ino
            self.socket.unlink(missing_ok=True)
            server = Server([self])
            await server.start(path=str(self.socket))
            try:
                try:
                    await self.register()
                except (GRPCError, OSError) as exc:
                    log.warning("registration failed, retrying: %s", exc)
                    await asyncio.sleep(0.5)
                    continue
                log.info("registered resource=%s socket=%s", self.resource, self.socket)
                print(
                    f"sample-plugin: registered {self.resource} ({len(self.numa)} devices) on {self.socket}", flush=True
                )
                while not stop.is_set():
                    if self._read_health():
                        changed, self._changed = self._changed, asyncio.Event()
                        changed.set()
                    try:
                        restarted = self.kubelet_socket.stat().st_ino != kubelet_inode
                    except FileNotFoundError:
                        restarted = True
                    if restarted or not self.socket.exists():
                        log.info("kubelet restarted or socket removed: registering again")
                        break
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), 0.2)
            finally:
                server.close()
                await server.wait_closed()
        self.socket.unlink(missing_ok=True)


CDI_VERSION = "0.6.0"


def cdi_env_name(device: str) -> str:
    return "SAMPLE_CDI_" + "".join(ch if ch.isalnum() else "_" for ch in device).upper()


def cdi_spec(resource: str, devices: list[str]) -> dict[str, Any]:
    """The CDI spec of ``devices`` (github.com/cncf-tags/container-device-interface SPEC.md)."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": resource,
        "devices": [{"name": d, "containerEdits": {"env": [f"{cdi_env_name(d)}={d}"]}} for d in devices],
    }


def write_cdi_spec(cdi_dir: Path, resource: str, devices: list[str]) -> Path:
    """Write the spec atomically (a runtime may read the directory at any moment)."""
    cdi_dir.mkdir(parents=True, exist_ok=True)
    path = cdi_dir / f"{slug(resource)}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(cdi_spec(resource, devices), indent=2) + "\n")
    os.replace(tmp, path)
    return path


def main(args: Any) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s", stream=sys.stderr
    )
    root: Path = args.root_dir
    if not (root / "device-plugins").is_dir():
        print(
            f"eventsrc: error: {root}/device-plugins does not exist (start the daemon, or give --root-dir)",
            file=sys.stderr,
        )
        return 1
    plugin = SamplePlugin(
        root,
        args.resource,
        args.devices,
        args.numa_nodes,
        preferred=args.preferred,
        pre_start=args.pre_start,
        calls_log=args.calls_log,
        health_file=args.health_file,
        socket_name=args.socket_name,
    )
    plugin.health_file.parent.mkdir(parents=True, exist_ok=True)
    if args.cdi_dir is not None:
        try:
            spec = write_cdi_spec(args.cdi_dir, args.resource, list(plugin.numa))
        except OSError as exc:
            print(f"eventsrc: error: cannot write the CDI spec in {args.cdi_dir}: {exc.strerror}", file=sys.stderr)
            return 1
        print(f"sample-plugin: CDI spec for {args.resource} written to {spec}", flush=True)
    if len(os.fsencode(plugin.socket)) > 107:
        print(
            f"eventsrc: error: socket path {plugin.socket} is too long for a unix socket (use a shorter --root-dir)",
            file=sys.stderr,
        )
        return 1

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await plugin.run(stop)

    asyncio.run(run())
    return 0
