"""The claims of docs/security.md, one test each (the document names the test next to its claim).

Hostile plugins are written with grpcio and raw serializers, so that they can send what no
well-behaved plugin would: garbage bytes, oversized messages, floods, calls that never
answer. Most tests share one daemon (``shared``), each with its own resource names; tests
that need short call deadlines run the daemon in this process, with the deadlines patched.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import grpclib.server
import lmdb
import msgspec
import pytest
import trio
import trio_asyncio

from eventsrc import events as ev
from eventsrc.core.devices.flaps import FLAP_WINDOW
from eventsrc.events import chain_hash, decode_record, encode_payload, prev_hash_of
from eventsrc.gen.deviceplugin.v1beta1 import api_pb2 as pb
from eventsrc.gen.dra.v1 import api_pb2 as drapb
from eventsrc.gen.pluginregistration.v1 import api_pb2 as regpb
from eventsrc.layout import Layout
from eventsrc.log.store import seq_key
from eventsrc.node import admitter as admission_module
from eventsrc.node import device_manager as device_plugins
from eventsrc.node import dra_manager as dra
from eventsrc.node.device_manager import RegistrationRejected, RegistryHandler
from eventsrc.node.dra_manager import DRAManager, DRARejected
from eventsrc.node.plugin_watcher import PluginWatcher
from eventsrc.rpc.bridge import serve_unix
from eventsrc.rpc.codec import MAX_MESSAGE_BYTES
from tests.conftest import Daemon, run_cli
from tests.e2e.test_dra_e2e import claim_yaml
from tests.e2e.test_dra_e2e import pod_yaml as claim_pod_yaml
from tests.node.test_plugin_registry import GrpcioRegistration
from tests.support.eventually import eventually_trio
from tests.support.grpcio_stubs import registration_client, unix_target

OK = grpc.StatusCode.OK


# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """Children started inside inherit ``mask``."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _raw(message: Any) -> bytes:
    """grpcio serializer: a message, or bytes sent as they are (garbage included)."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def devices(*ids: str, numa: int | None = 0, health: str = "Healthy") -> pb.ListAndWatchResponse:
    out = pb.ListAndWatchResponse()
    for i in ids:
        d = out.devices.add(ID=i, health=health)
        if numa is not None:
            d.topology.nodes.add(ID=numa)
    return out


_REQUESTS = {
    "GetDevicePluginOptions": pb.Empty,
    "GetPreferredAllocation": pb.PreferredAllocationRequest,
    "Allocate": pb.AllocateRequest,
    "PreStartContainer": pb.PreStartContainerRequest,
}


class Hostile:
    """A v1beta1 device plugin written with grpcio that does what it is told.

    ``on[method]`` maps a request to the answer: a message, or raw bytes (garbage); it may
    block (``hang``). ``lists`` feeds ListAndWatch: each item is sent as it is; None ends
    the stream.
    """

    def __init__(
        self,
        root: Path,
        resource: str,
        first: pb.ListAndWatchResponse | bytes | None = None,
        *,
        directory: Path | None = None,
        preferred: bool = False,
        pre_start: bool = False,
    ) -> None:
        self.resource = resource
        self.kubelet_socket = root / "device-plugins" / "kubelet.sock"
        self.directory = directory or root / "device-plugins"
        self.name = "h-" + uuid.uuid4().hex[:8]
        self.socket = self.directory / f"{self.name}.sock"
        self.options = pb.DevicePluginOptions(
            pre_start_required=pre_start, get_preferred_allocation_available=preferred
        )
        self.lists: queue.Queue[Any] = queue.Queue()
        if first is not None:
            self.lists.put(first)
        self.release = threading.Event()  # hung calls return when set
        self.unanswered = 0  # calls in hang() that have not returned
        self._counting = threading.Lock()
        self.stream_ended = threading.Event()
        self.calls: list[tuple[str, Any]] = []
        self.on: dict[str, Callable[[Any], Any]] = {
            "GetDevicePluginOptions": lambda req: self.options,
            "GetPreferredAllocation": lambda req: pb.PreferredAllocationResponse(
                container_responses=[
                    pb.ContainerPreferredAllocationResponse(
                        deviceIDs=list(req.container_requests[0].available_deviceIDs)[
                            : req.container_requests[0].allocation_size
                        ]
                    )
                ]
            ),
            "Allocate": lambda req: pb.AllocateResponse(
                container_responses=[
                    pb.ContainerAllocateResponse(envs={"DEVICES": ",".join(req.container_requests[0].devices_ids)})
                ]
            ),
            "PreStartContainer": lambda req: pb.PreStartContainerResponse(),
        }
        self._server: grpc.Server | None = None

    def hang(self, request: Any) -> bytes:
        with self._counting:
            self.unanswered += 1
        self.release.wait(60)
        with self._counting:
            self.unanswered -= 1
        return b""

    def called(self, method: str) -> list[Any]:
        return [r for m, r in list(self.calls) if m == method]

    def _unary(self, method: str) -> grpc.RpcMethodHandler:
        def call(request: Any, context: grpc.ServicerContext) -> Any:
            self.calls.append((method, request))
            return self.on[method](request)

        return grpc.unary_unary_rpc_method_handler(
            call, request_deserializer=_REQUESTS[method].FromString, response_serializer=_raw
        )

    def _list_and_watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.calls.append(("ListAndWatch", request))
        try:
            while context.is_active():
                try:
                    item = self.lists.get(timeout=0.1)
                except queue.Empty:
                    continue
                if item is None:
                    return
                yield item
        finally:
            self.stream_ended.set()

    def start(self) -> Hostile:
        self.directory.mkdir(parents=True, exist_ok=True)
        handlers = {m: self._unary(m) for m in _REQUESTS}
        handlers["ListAndWatch"] = grpc.unary_stream_rpc_method_handler(
            self._list_and_watch, request_deserializer=pb.Empty.FromString, response_serializer=_raw
        )
        server = grpc.server(ThreadPoolExecutor(max_workers=16))
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("v1beta1.DevicePlugin", handlers)])
        server.add_insecure_port(unix_target(self.socket))
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        self.release.set()
        self.lists.put(None)
        if self._server is not None:
            self._server.stop(0.2).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)

    def register(
        self, endpoint: str | None = None, resource: str | None = None, version: str = "v1beta1", timeout: float = 15
    ) -> tuple[grpc.StatusCode, str]:
        """Register on kubelet.sock: (status code, its details)."""
        req = pb.RegisterRequest(
            version=version,
            endpoint=self.socket.name if endpoint is None else endpoint,
            resource_name=self.resource if resource is None else resource,
            options=self.options,
        )
        with grpc.insecure_channel(unix_target(self.kubelet_socket)) as channel:
            try:
                registration_client(channel).Register(req, timeout=timeout)
            except grpc.RpcError as err:
                return err.code(), err.details() or ""
        return OK, ""


class HostileDriver:
    """A DRA driver written with grpcio: the registration service and DRA v1 on one socket in
    plugins_registry. ``prepare`` maps a NodePrepareResourcesRequest to the answer."""

    def __init__(self, root: Path, name: str = "gpu.example.com") -> None:
        self.name = name
        self.socket = root / "plugins_registry" / f"{name}-{uuid.uuid4().hex[:6]}.sock"
        self.release = threading.Event()
        self.prepare: Callable[[Any], Any] = lambda req: drapb.NodePrepareResourcesResponse()
        self.unprepare: Callable[[Any], Any] = lambda req: drapb.NodeUnprepareResourcesResponse(
            claims={c.uid: drapb.NodeUnprepareResourceResponse() for c in req.claims}
        )
        self.statuses: list[tuple[bool, str]] = []
        self.unanswered = 0  # calls in hang() that have not returned
        self._counting = threading.Lock()
        self._server: grpc.Server | None = None

    def hang(self, request: Any) -> bytes:
        with self._counting:
            self.unanswered += 1
        self.release.wait(60)
        with self._counting:
            self.unanswered -= 1
        return b""

    def start(self) -> HostileDriver:
        def unary(fn: Callable[[Any], Any], request_type: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                lambda req, ctx: fn(req), request_deserializer=request_type.FromString, response_serializer=_raw
            )

        def notified(req: Any) -> Any:
            self.statuses.append((req.plugin_registered, req.error))
            return regpb.RegistrationStatusResponse()

        info = regpb.PluginInfo(type="DRAPlugin", name=self.name, endpoint="", supported_versions=["v1.DRAPlugin"])
        registration = {
            "GetInfo": unary(lambda req: info, regpb.InfoRequest),
            "NotifyRegistrationStatus": unary(notified, regpb.RegistrationStatus),
        }
        service = {
            "NodePrepareResources": unary(lambda req: self.prepare(req), drapb.NodePrepareResourcesRequest),
            "NodeUnprepareResources": unary(lambda req: self.unprepare(req), drapb.NodeUnprepareResourcesRequest),
        }
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        server = grpc.server(ThreadPoolExecutor(max_workers=8))
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler("pluginregistration.Registration", registration),
                grpc.method_handlers_generic_handler("k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin", service),
            ]
        )
        server.add_insecure_port(unix_target(self.socket))
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.stop(0.2).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)


@pytest.fixture
def hostile() -> Iterator[list[Any]]:
    """Plugins and drivers a test started; stopped at its end."""
    started: list[Any] = []
    yield started
    for p in started:
        p.stop()


@pytest.fixture(scope="module")
def shared() -> Iterator[Daemon]:
    """One daemon for the tests that do not need their own (each uses its own resources)."""
    short = Path(tempfile.mkdtemp(prefix="es-", dir="/tmp"))
    daemon = Daemon(short / "root")
    yield daemon
    if daemon.proc.poll() is None:
        daemon.proc.kill()
        daemon.proc.wait()
    shutil.rmtree(short, ignore_errors=True)


def resource_name(tag: str) -> str:
    return f"hostile.example.com/{tag}-{uuid.uuid4().hex[:6]}"


def records(root: Path, type_: str | None = None, resource: str | None = None) -> list[dict[str, Any]]:
    proc = run_cli("log", "-o", "json", root=root, check=True)
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return [
        r
        for r in out
        if (type_ is None or r["type"] == type_) and (resource is None or r["event"].get("resource") == resource)
    ]


def state(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(run_cli("state", "-o", "json", root=root, check=True).stdout)
    return out


def wait_for(what: str, probe: Callable[[], Any], daemon: Daemon, timeout: float = 15.0) -> Any:
    """Poll ``probe`` until it returns something truthy; fail early if the daemon died."""
    return daemon.eventually(probe, what, timeout=timeout)


def alive(daemon: Daemon) -> bool:
    return daemon.proc.poll() is None and run_cli("status", root=daemon.root).returncode == 0


def start(hostile: list[Any], daemon: Daemon, resource: str, first: Any, **kw: Any) -> Hostile:
    """A hostile plugin started and registered (its first list not awaited)."""
    plugin = Hostile(daemon.root, resource, first, **kw).start()
    hostile.append(plugin)
    code, details = plugin.register()
    assert code == OK, details
    return plugin


def listed(daemon: Daemon, resource: str, ids: set[str]) -> None:
    wait_for(
        f"the devices of {resource}",
        lambda: set(state(daemon.root)["devices"]["devices"].get(resource, {})) == ids,
        daemon,
    )


def disconnected(daemon: Daemon, resource: str) -> str:
    (rec,) = wait_for(
        f"the disconnection of {resource}", lambda: records(daemon.root, "PluginDisconnected", resource), daemon
    )
    reason: str = rec["event"]["reason"]
    return reason


def pod_yaml(resource: str, count: int, name: str = "") -> str:
    return (
        "apiVersion: v1\nkind: Pod\n"
        f"metadata: {{name: {name or 'p-' + uuid.uuid4().hex[:6]}, namespace: default, uid: {uuid.uuid4()}}}\n"
        f"spec:\n  containers:\n  - name: app\n    resources:\n      limits: {{{resource}: {count}}}\n"
    )


def admit(daemon: Daemon, tmp_path: Path, resource: str, count: int) -> tuple[int, dict[str, Any], str]:
    path = tmp_path / f"pod-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(pod_yaml(resource, count))
    proc = run_cli("admit", "-f", str(path), "-o", "json", root=daemon.root)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout) if proc.returncode == 0 else {}, proc.stderr


@contextlib.asynccontextmanager
async def in_process(root: Path) -> AsyncIterator[Any]:
    """The daemon in this process (so that its deadlines can be patched short)."""
    from eventsrc.node.daemon import serve

    async with trio.open_nursery() as nursery:
        daemon = await nursery.start(partial(serve, Layout(root), admission_wait=2.0))
        try:
            yield daemon
        finally:
            nursery.cancel_scope.cancel()


async def until(what: str, probe: Callable[[], Any], timeout: float = 10.0) -> None:
    await eventually_trio(probe, what, timeout=timeout)


async def admit_in_process(root: Path, pod: str, *more: Path) -> tuple[int, str]:
    """Admit with the CLI (a client of the node API, as a user would): exit code and output."""
    path = root.parent / f"pod-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(pod)
    args = ["admit", "-f", str(path), *(a for m in more for a in ("-f", str(m))), "-o", "json"]
    proc = await trio.to_thread.run_sync(partial(run_cli, *args, root=root))
    return proc.returncode, proc.stdout + proc.stderr


async def records_in_process(root: Path, type_: str, resource: str | None = None) -> list[dict[str, Any]]:
    return await trio.to_thread.run_sync(partial(records, root, type_, resource))


async def answering(root: Path) -> bool:
    """The in-process daemon still serves its node API."""
    proc = await trio.to_thread.run_sync(partial(run_cli, "status", root=root))
    return proc.returncode == 0


async def register_in_process(daemon: Any, plugin: Hostile, **kw: Any) -> tuple[grpc.StatusCode, str]:
    return await trio.to_thread.run_sync(partial(plugin.register, **kw))


async def started_in_process(daemon: Any, hostile: list[Any], resource: str, **kw: Any) -> Hostile:
    plugin = Hostile(daemon.layout.root, resource, devices("d-0", "d-1", "d-2", "d-3"), **kw).start()
    hostile.append(plugin)
    code, details = await register_in_process(daemon, plugin)
    assert code == OK, details
    await until(
        "the first list",
        lambda: resource in daemon.devices.endpoints and daemon.devices.endpoints[resource].listed.is_set(),
    )
    return plugin


# =========================================================================== (a) files and sockets


def test_sockets_have_fixed_modes_whatever_the_umask(daemon_factory: type[Daemon]) -> None:
    with umask(0):
        daemon = daemon_factory()
    root = daemon.root
    sockets = {
        root / "eventsrc" / "api.sock": 0o600,
        root / "device-plugins" / "kubelet.sock": 0o755,
        root / "pod-resources" / "kubelet.sock": 0o755,
    }
    for path, mode in sockets.items():
        assert stat.S_ISSOCK(path.lstat().st_mode), path
        assert mode_of(path) == mode, f"{path}: {oct(mode_of(path))}"


async def test_socket_mode_is_set_before_the_socket_accepts(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    start_listening = grpclib.server.Server.start

    async def start(self: Any, *args: Any, **kw: Any) -> None:
        path = kw["sock"].getsockname()
        seen["mode"] = stat.S_IMODE(os.stat(path).st_mode)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
            seen["connected"] = True
        except ConnectionRefusedError:
            seen["connected"] = False
        finally:
            probe.close()
        await start_listening(self, *args, **kw)

    monkeypatch.setattr(grpclib.server.Server, "start", start)
    root.mkdir()
    with umask(0):
        async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
            await nursery.start(serve_unix, [], root / "api.sock", 0o600)
            nursery.cancel_scope.cancel()
    assert seen == {"mode": 0o600, "connected": False}


def test_state_files_are_private_whatever_the_umask(daemon_factory: type[Daemon]) -> None:
    with umask(0):
        daemon = daemon_factory()
    root = daemon.root
    for d in ("", "device-plugins", "plugins_registry", "plugins", "pod-resources", "eventsrc", "eventsrc/log"):
        assert mode_of(root / d) == 0o750, f"{root / d}: {oct(mode_of(root / d))}"
    for f in ("eventsrc/log/data.mdb", "eventsrc/log/lock.mdb", "eventsrc/daemon.lock"):
        assert mode_of(root / f) == 0o600, f"{root / f}: {oct(mode_of(root / f))}"
    assert mode_of(root / "eventsrc" / "status.json") == 0o644

    def private(path: Path) -> bool:
        """Writable by the owner only; readable by the owner only, but for status.json."""
        return (
            mode_of(path) & (0o022 if path.name == "status.json" else 0o077) == 0
            or path.is_dir()
            and mode_of(path) == 0o750
        )

    assert [p for p in (root / "eventsrc").rglob("*") if not private(p)] == []
    assert daemon.stop() == 0
    snapshots = root / "eventsrc" / "snapshots"
    assert mode_of(snapshots) == 0o750
    assert list(snapshots.iterdir())
    assert [p for p in (root / "eventsrc").rglob("*") if not private(p)] == []


def test_state_directory_is_narrowed_to_0750(root: Path, daemon_factory: type[Daemon]) -> None:
    (root / "eventsrc").mkdir(parents=True)
    (root / "eventsrc").chmod(0o777)
    daemon_factory()
    assert mode_of(root / "eventsrc") == 0o750


# =========================================================================== (b) who can register


def test_registration_checks_no_identity(shared: Daemon, hostile: list[Any]) -> None:
    resource = resource_name("anyone")
    plugin = Hostile(shared.root, resource, devices("a-0")).start()
    hostile.append(plugin)
    os.chown(plugin.socket, 65534, 65534)  # nobody's socket, open to all
    plugin.socket.chmod(0o777)
    code, details = plugin.register()
    assert code == OK, details
    listed(shared, resource, {"a-0"})


# =========================================================================== (c) paths


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="es-x-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


BAD_ENDPOINTS = [
    pytest.param("symlink", "is a symbolic link", id="symlink-out-of-the-directory"),
    pytest.param("file", "is not a unix socket", id="regular-file"),
    pytest.param("a\x00b.sock", "NUL byte", id="nul"),
    pytest.param("/tmp/plugin.sock", "must be a plain file name", id="absolute"),
    pytest.param("../device-plugins/x.sock", "must be a plain file name", id="dotdot"),
    pytest.param("kubelet.sock", "the registration socket itself", id="kubelet-sock"),
    pytest.param("x" * 100 + ".sock", "unix sockets allow 107", id="too-long"),
]


@pytest.mark.parametrize(("endpoint", "message"), BAD_ENDPOINTS)
def test_endpoint_must_be_a_socket_in_the_directory(
    shared: Daemon, hostile: list[Any], elsewhere: Path, endpoint: str, message: str
) -> None:
    resource = resource_name("ep")
    # The plugin serves outside the device-plugin directory; only the test's endpoint leads to it.
    plugin = Hostile(shared.root, resource, devices("e-0"), directory=elsewhere).start()
    hostile.append(plugin)
    if endpoint == "symlink":
        endpoint = f"link-{plugin.name}.sock"
        (shared.root / "device-plugins" / endpoint).symlink_to(plugin.socket)
    elif endpoint == "file":
        endpoint = f"file-{plugin.name}.sock"
        (shared.root / "device-plugins" / endpoint).write_text("")
    code, details = plugin.register(endpoint=endpoint)
    assert code == grpc.StatusCode.UNKNOWN and message in details, (code, details)
    (rejected,) = records(shared.root, "PluginRegistrationRejected", resource)
    assert rejected["event"]["reason"] == details
    assert plugin.calls == []  # never dialled
    assert alive(shared)


async def test_plugins_registry_follows_no_symlinks(root: Path, elsewhere: Path) -> None:
    registry = root / "plugins_registry"
    registry.mkdir(parents=True)
    outside = GrpcioRegistration(elsewhere / f"{uuid.uuid4().hex[:6]}.sock", type="DRAPlugin", name="out.example.com")
    nested = elsewhere / f"dir-{uuid.uuid4().hex[:6]}"
    in_linked_dir = GrpcioRegistration(nested / "reg.sock", type="DRAPlugin", name="dir.example.com")
    (registry / "link.sock").symlink_to(outside.path)
    (registry / "linkdir").symlink_to(nested)
    calls: list[str] = []

    class Handler:
        async def validate(self, name: str, endpoint: str, versions: list[str]) -> None:
            calls.append(name)

        async def register(self, name: str, endpoint: str, versions: list[str], socket_path: Path) -> None:
            calls.append(name)

        async def deregister(self, name: str, endpoint: str, socket_path: Path) -> None:
            pass

    try:
        async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
            watcher = PluginWatcher(registry, {"DRAPlugin": Handler()}, period=0.1)
            await nursery.start(watcher.run)
            seen = GrpcioRegistration(registry / "seen.sock", type="DRAPlugin", name="seen.example.com")
            try:
                await until("the plugin in the directory", lambda: seen.statuses)
                scans = watcher.scans
                await until("several more scans", lambda: watcher.scans >= scans + 5)
            finally:
                seen.stop()
            nursery.cancel_scope.cancel()
    finally:
        outside.stop()
        in_linked_dir.stop()
    assert outside.get_info_calls == 0 and in_linked_dir.get_info_calls == 0
    assert set(calls) == {"seen.example.com"}


def _registry_endpoints(elsewhere: Path, listener: socket.socket) -> dict[str, tuple[str, str]]:
    sock = elsewhere / f"s-{uuid.uuid4().hex[:6]}.sock"
    listener.bind(str(sock))
    link = elsewhere / f"l-{uuid.uuid4().hex[:6]}.sock"
    link.symlink_to(sock)
    plain = elsewhere / f"f-{uuid.uuid4().hex[:6]}.sock"
    plain.write_text("")
    return {
        "socket": (str(sock), ""),
        "relative": ("plugins/x/dra.sock", "is not an absolute path"),
        "symlink": (str(link), "is a symbolic link"),
        "regular-file": (str(plain), "is not a unix socket"),
        "missing": (str(elsewhere / "missing.sock"), "cannot dial the endpoint"),
        "nul": (str(sock) + "\x00x", "NUL byte"),
        "too-long": ("/" + "x" * 120 + ".sock", "unix sockets allow 107"),
    }


@pytest.mark.parametrize("kind", ["DRAPlugin", "DevicePlugin"])
async def test_registry_endpoints_must_be_absolute_sockets(elsewhere: Path, kind: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        cases = _registry_endpoints(elsewhere, listener)
    for case, (endpoint, message) in cases.items():
        if kind == "DRAPlugin":
            call = DRAManager(None).validate("gpu.example.com", endpoint, ["v1.DRAPlugin"])  # type: ignore[arg-type]
            refusal: type[Exception] = DRARejected
        else:
            call = RegistryHandler(None).validate("example.com/gpu", endpoint, ["v1beta1"])  # type: ignore[arg-type]
            refusal = RegistrationRejected
        if not message:
            await call
            continue
        with pytest.raises(refusal) as info:
            await call
        assert message in str(info.value), (case, str(info.value))


# =========================================================================== (d) limits


def test_limits_are_the_documented_ones() -> None:
    assert MAX_MESSAGE_BYTES == 4 * 1024 * 1024
    assert (device_plugins.MAX_RESOURCES, device_plugins.MAX_DEVICES, device_plugins.MAX_ID_BYTES) == (
        256,
        10_000,
        1024,
    )
    assert (device_plugins.MAX_NUMA_NODES, device_plugins.MAX_ENV_BYTES, device_plugins.MAX_ALLOCATION_BYTES) == (
        64,
        131_072,
        1_048_576,
    )
    assert (device_plugins.LIST_RATE, device_plugins.LIST_BURST, FLAP_WINDOW) == (10.0, 20, 1.0)
    assert (device_plugins.REGISTER_RATE, device_plugins.REGISTER_BURST, device_plugins.MAX_REGISTER_BYTES) == (
        10.0,
        32,
        4096,
    )
    assert (dra.MAX_DRIVERS, dra.MAX_NAME_BYTES) == (256, 253)
    deadlines = (device_plugins.DIAL_TIMEOUT, device_plugins.PREFERRED_TIMEOUT, device_plugins.PRE_START_TIMEOUT)
    assert (*deadlines, admission_module.ALLOCATE_TIMEOUT, dra.CALL_TIMEOUT) == (10.0, 10.0, 30.0, 60.0, 45.0)


def test_register_request_over_the_message_limit_is_refused(shared: Daemon, hostile: list[Any]) -> None:
    plugin = Hostile(shared.root, "unused.example.com/x", devices("o-0")).start()
    hostile.append(plugin)
    resource = "big.example.com/" + "x" * (MAX_MESSAGE_BYTES + 1024)
    code, details = plugin.register(resource=resource)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
    assert "larger than max" in details
    assert not [
        r for r in records(shared.root, "PluginRegistrationRejected") if r["event"]["resource"].startswith("big.")
    ]
    assert alive(shared)


def test_long_register_request_is_refused_unrecorded(shared: Daemon, hostile: list[Any]) -> None:
    plugin = Hostile(shared.root, "unused.example.com/x", devices("o-0")).start()
    hostile.append(plugin)
    code, details = plugin.register(resource="long.example.com/" + "x" * 5000)
    assert code == grpc.StatusCode.UNKNOWN and "at most 4096 are taken" in details, (code, details)
    assert not [
        r for r in records(shared.root, "PluginRegistrationRejected") if r["event"]["resource"].startswith("long.")
    ]
    assert alive(shared)


def test_oversized_list_cuts_the_plugin_off(shared: Daemon, hostile: list[Any]) -> None:
    resource = resource_name("big")
    start(hostile, shared, resource, devices("x" * (MAX_MESSAGE_BYTES + 1024)))
    reason = disconnected(shared, resource)
    assert "RESOURCE_EXHAUSTED" in reason and "larger than max" in reason, reason
    assert records(shared.root, "DevicesAdded", resource) == []
    assert alive(shared)


def _too_many_numa_nodes() -> pb.ListAndWatchResponse:
    msg = devices("n-0", numa=None)
    for n in range(device_plugins.MAX_NUMA_NODES + 1):
        msg.devices[0].topology.nodes.add(ID=n)
    return msg


LIST_LIMITS = [
    pytest.param(
        lambda: devices(*(f"d-{i}" for i in range(device_plugins.MAX_DEVICES + 1))), "devices; at most", id="devices"
    ),
    pytest.param(lambda: devices("i" * (device_plugins.MAX_ID_BYTES + 1)), "longer than", id="device-id"),
    pytest.param(lambda: devices("h-0", health="H" * (device_plugins.MAX_ID_BYTES + 1)), "longer than", id="health"),
    pytest.param(_too_many_numa_nodes, "NUMA nodes; at most", id="numa-nodes"),
]


@pytest.mark.parametrize(("message", "words"), LIST_LIMITS)
def test_list_limits_cut_the_plugin_off(
    shared: Daemon, hostile: list[Any], message: Callable[[], pb.ListAndWatchResponse], words: str
) -> None:
    resource = resource_name("limits")
    start(hostile, shared, resource, message())
    reason = disconnected(shared, resource)
    assert reason.startswith("cut off: its ListAndWatch message") and words in reason, reason
    assert records(shared.root, "DevicesAdded", resource) == []
    assert alive(shared)


def test_long_strings_cannot_break_the_log(shared: Daemon, hostile: list[Any]) -> None:
    # The longest resource name the kubelet's rules allow, and a device ID just within the limit:
    # their audit index key is longer than LMDB takes (511 bytes), so the log keys a digest.
    resource = (
        ".".join(["l" * 60] * 3) + "." + "d" * (244 - 183 - 13) + ".example.com/" + "x" * 57 + uuid.uuid4().hex[:6]
    )
    device = "i" * device_plugins.MAX_ID_BYTES
    start(hostile, shared, resource, devices(device))
    listed(shared, resource, {device})
    audit = run_cli("audit", "device", resource, device, "-o", "json", root=shared.root)
    assert audit.returncode == 0, audit.stderr
    assert [c["what"] for c in json.loads(audit.stdout)["changes"]] == ["listed"]  # found through the index
    assert alive(shared)


def test_list_flood_is_coalesced_and_the_newest_list_recorded(shared: Daemon, hostile: list[Any]) -> None:
    resource = resource_name("flood")
    plugin = start(hostile, shared, resource, devices("f-0", "f-1"))
    listed(shared, resource, {"f-0", "f-1"})
    # Spread over two seconds, so that the daemon could record each list if it did not pace them.
    floods = 800
    began = time.monotonic()
    for i in range(floods):
        plugin.lists.put(devices("f-0", "f-1", health="Unhealthy" if i % 2 == 0 else "Healthy"))
        time.sleep(0.0025)
    plugin.lists.put(devices("f-0", "f-1", "f-final", health="Unhealthy"))  # the newest list

    def final() -> bool:
        table = state(shared.root)["devices"]["devices"].get(resource, {})
        return set(table) == {"f-0", "f-1", "f-final"} and all(d["health"] == "Unhealthy" for d in table.values())

    wait_for("the newest list in the state", final, shared, timeout=30)
    elapsed = time.monotonic() - began
    assert plugin.lists.empty()  # the daemon read every message
    # Every list recorded that changed f-0's health is one record (the flood alternates it).
    updates = len(
        [r for r in records(shared.root, "DeviceHealthChanged", resource) if r["event"]["device_id"] == "f-0"]
    )
    assert updates <= 20 + 10 * elapsed + 2, (updates, elapsed)  # a burst of 20, then 10 a second
    assert alive(shared)


def test_the_newest_list_is_recorded_before_a_disconnection(shared: Daemon, hostile: list[Any]) -> None:
    resource = resource_name("last")
    plugin = start(hostile, shared, resource, devices("l-0"))
    listed(shared, resource, {"l-0"})
    for i in range(100):  # more than the burst: the last of them wait to be recorded
        plugin.lists.put(devices("l-0", health="Unhealthy" if i % 2 == 0 else "Healthy"))
    plugin.lists.put(devices("l-0", "l-last"))
    plugin.lists.put(None)  # and the stream ends at once
    assert "stream ended" in disconnected(shared, resource)
    kinds = [r["type"] for r in records(shared.root, resource=resource)]
    assert kinds.index("PluginDisconnected") > max(i for i, k in enumerate(kinds) if k == "DevicesAdded")
    table = state(shared.root)["devices"]["devices"][resource]
    assert set(table) == {"l-0", "l-last"} and table["l-0"]["health"] == "Healthy"


def test_register_flood_is_rate_limited_and_not_recorded(daemon_factory: type[Daemon], hostile: list[Any]) -> None:
    daemon = daemon_factory()
    plugin = Hostile(daemon.root, "flood.example.com/r", devices("r-0")).start()
    hostile.append(plugin)
    calls = 100
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=20) as pool:
        codes = [c for c, _ in pool.map(lambda _: plugin.register(version="v0"), range(calls))]
    elapsed = time.monotonic() - began
    limited = codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert limited >= 1 and limited + codes.count(grpc.StatusCode.UNKNOWN) == calls, codes
    rejected = records(daemon.root, "PluginRegistrationRejected")
    assert len(rejected) == calls - limited
    assert len(rejected) <= 32 + 10 * elapsed + 1  # a burst of 32, then 10 a second

    def served() -> tuple[Any, str] | None:
        code, details = plugin.register()
        return None if code == grpc.StatusCode.RESOURCE_EXHAUSTED else (code, details)

    code, details = wait_for("a registration served once tokens come back", served, daemon)
    assert code == OK, details


async def test_resource_count_is_capped(root: Path, hostile: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_plugins, "MAX_RESOURCES", 2)
    async with in_process(root) as d:
        plugin = Hostile(root, "cap.example.com/a", devices("c-0")).start()
        hostile.append(plugin)
        for name in ("cap.example.com/a", "cap.example.com/b"):
            assert await register_in_process(d, plugin, resource=name) == (OK, "")
        code, details = await register_in_process(d, plugin, resource="cap.example.com/c")
        assert code == grpc.StatusCode.UNKNOWN and "2 resources are known" in details, details
        assert await register_in_process(d, plugin, resource="cap.example.com/a") == (
            OK,
            "",
        )  # a known one may come back
        assert set(d.views.devices.plugins) == {"cap.example.com/a", "cap.example.com/b"}


async def test_dra_driver_count_and_name_are_capped(elsewhere: Path) -> None:
    manager = DRAManager(None)  # type: ignore[arg-type]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        sock = str(elsewhere / f"d-{uuid.uuid4().hex[:6]}.sock")
        listener.bind(sock)
        manager.clients = {f"d{i}.example.com": None for i in range(dra.MAX_DRIVERS)}  # type: ignore[misc]
        with pytest.raises(DRARejected, match="256 DRA drivers are registered"):
            await manager.validate("new.example.com", sock, ["v1.DRAPlugin"])
        await manager.validate("d0.example.com", sock, ["v1.DRAPlugin"])  # a registered one may come back
        with pytest.raises(DRARejected, match="longer than 253 bytes"):
            await manager.validate("x" * 254, sock, ["v1.DRAPlugin"])


ALLOCATE_LIMITS = [
    pytest.param(
        lambda req: pb.AllocateResponse(
            container_responses=[pb.ContainerAllocateResponse(envs={"BIG": "v" * device_plugins.MAX_ENV_BYTES})]
        ),
        "execve's limit",
        id="env-entry",
    ),
    pytest.param(
        lambda req: pb.AllocateResponse(
            container_responses=[pb.ContainerAllocateResponse(annotations={f"a{i}": "v" * 4096 for i in range(300)})]
        ),
        "bytes long; at most",
        id="answer-size",
    ),
    pytest.param(lambda req: pb.AllocateResponse(), "has no container response", id="no-answer"),
    pytest.param(
        # Over the 4 MiB message limit: refused by the daemon's Allocate client from the
        # message's 5-byte prefix (the limit set at start reaches each plugin's channel).
        lambda req: pb.AllocateResponse(
            container_responses=[pb.ContainerAllocateResponse(annotations={f"a{i}": "v" * 4096 for i in range(1100)})]
        ),
        "received message larger than max",
        id="over-the-message-limit",
    ),
]


@pytest.mark.parametrize(("answer", "words"), ALLOCATE_LIMITS)
def test_allocate_answer_limits_refuse_the_pod(
    shared: Daemon, hostile: list[Any], tmp_path: Path, answer: Callable[[Any], Any], words: str
) -> None:
    resource = resource_name("alloc")
    plugin = start(hostile, shared, resource, devices("a-0", "a-1"))
    listed(shared, resource, {"a-0", "a-1"})
    plugin.on["Allocate"] = answer
    rc, _, err = admit(shared, tmp_path, resource, 1)
    assert rc == 1 and words in err, err
    table = state(shared.root)["devices"]["devices"][resource]
    assert all(d["holder"] == "" for d in table.values())
    assert alive(shared)


# =========================================================================== (e) hostile plugins


GARBAGE = b"\xff\xfe this is not a protobuf message \x00\x01"


@pytest.mark.parametrize("method", ["ListAndWatch", "Allocate", "GetDevicePluginOptions"])
def test_garbage_from_a_plugin_is_a_failed_call(
    shared: Daemon, hostile: list[Any], tmp_path: Path, method: str
) -> None:
    resource = resource_name("garbage")
    plugin = Hostile(shared.root, resource, GARBAGE if method == "ListAndWatch" else devices("g-0")).start()
    hostile.append(plugin)
    if method == "GetDevicePluginOptions":
        plugin.on[method] = lambda req: GARBAGE
        code, details = plugin.register()
        assert code == grpc.StatusCode.UNKNOWN and "cannot decode" in details, details
    else:
        assert plugin.register() == (OK, "")
    if method == "ListAndWatch":
        assert "cannot decode" in disconnected(shared, resource)
    if method == "Allocate":
        listed(shared, resource, {"g-0"})
        plugin.on["Allocate"] = lambda req: GARBAGE
        rc, _, err = admit(shared, tmp_path, resource, 1)
        assert rc == 1 and "cannot decode" in err, err
        assert (
            state(shared.root)["devices"]["devices"][resource]["g-0"]["holder"] == ""
        )  # the pod is not left admitting
    assert alive(shared)


def test_a_plugin_dying_mid_allocate_settles_the_pod(shared: Daemon, hostile: list[Any], tmp_path: Path) -> None:
    """The plugin goes away in the middle of Allocate (its server stops, dropping the call):
    the call's failure is recorded, the pod is refused and its device released, never left
    "admitting"; the request is not sent again."""
    resource = resource_name("dies")
    plugin = start(hostile, shared, resource, devices("z-0"))
    listed(shared, resource, {"z-0"})

    def die(req: Any) -> bytes:
        assert plugin._server is not None
        plugin._server.stop(0)  # connections dropped, in-flight calls cancelled: no answer
        return b""

    plugin.on["Allocate"] = die
    rc, _, err = admit(shared, tmp_path, resource, 1)
    assert rc == 1, err
    assert len(plugin.called("Allocate")) == 1
    (failed,) = records(shared.root, "AllocationFailed", resource)
    assert failed["event"]["reason"], failed
    pods = state(shared.root)["pods"]["pods"].values()
    assert not [p for p in pods if p["state"] == "admitting"], pods
    assert state(shared.root)["devices"]["devices"][resource]["z-0"]["holder"] == ""
    assert alive(shared)


def _prepared(req: Any) -> Any:
    device = drapb.Device(
        request_names=["gpu"], pool_name="node-a", device_name="gpu-0", cdi_device_ids=["example.com/gpu=gpu-0"]
    )
    return drapb.NodePrepareResourcesResponse(
        claims={c.uid: drapb.NodePrepareResourceResponse(devices=[device]) for c in req.claims}
    )


def test_garbage_from_a_dra_driver_is_a_failed_call(
    daemon_factory: type[Daemon], hostile: list[Any], tmp_path: Path
) -> None:
    daemon = daemon_factory()
    driver = HostileDriver(daemon.root).start()
    hostile.append(driver)
    wait_for("the driver's registration", lambda: driver.statuses, daemon)
    assert driver.statuses == [(True, "")]

    def admit_with_claim(name: str) -> tuple[subprocess.CompletedProcess[str], str]:
        pod_uid, claim_uid = str(uuid.uuid4()), str(uuid.uuid4())
        claim = claim_yaml(tmp_path, f"c-{name}", claim_uid, [(name, pod_uid)])
        pod = claim_pod_yaml(tmp_path, name, pod_uid, f"c-{name}")
        return run_cli("admit", "-f", str(pod), "-f", str(claim), "-o", "json", root=daemon.root), pod_uid

    # At admission: the claim's preparation fails, the pod is refused, nothing stays held.
    driver.prepare = lambda req: GARBAGE
    proc, _ = admit_with_claim("p1")
    assert proc.returncode == 1 and "cannot decode" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    failed = records(daemon.root, "ClaimPrepareFailed")
    assert failed and all("cannot decode" in f["event"]["reason"] for f in failed)
    assert [p["state"] for p in state(daemon.root)["pods"]["pods"].values()] == []
    # In the background (the claim work loop): the unprepare fails and is retried; the daemon lives.
    driver.prepare = _prepared
    proc, pod_uid = admit_with_claim("p2")
    assert proc.returncode == 0, proc.stderr
    unprepares: list[Any] = []

    def garbage_unprepare(req: Any) -> bytes:
        unprepares.append(req)
        return GARBAGE

    driver.unprepare = garbage_unprepare
    assert run_cli("remove", pod_uid, root=daemon.root).returncode == 0
    wait_for("a failed unprepare", lambda: records(daemon.root, "ClaimUnprepareFailed"), daemon)
    assert "cannot decode" in records(daemon.root, "ClaimUnprepareFailed")[0]["event"]["reason"]
    wait_for("the unprepare retried", lambda: len(unprepares) >= 2, daemon)
    assert alive(daemon)


async def test_hung_allocate_times_out_and_other_resources_are_admitted_meanwhile(
    root: Path, hostile: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # long enough for the other admission to finish first on a loaded 2-core machine
    monkeypatch.setattr(admission_module, "ALLOCATE_TIMEOUT", 5.0)
    async with in_process(root) as d:
        hung = await started_in_process(d, hostile, "hung.example.com/dev")
        good = await started_in_process(d, hostile, "good.example.com/dev")
        hung.on["Allocate"] = hung.hang
        outcome: dict[str, Any] = {}

        async def admit_hung() -> None:
            outcome["hung"] = await admit_in_process(root, pod_yaml("hung.example.com/dev", 1))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(admit_hung)
            await until("the hung Allocate", lambda: hung.called("Allocate"))
            rc, out = await admit_in_process(root, pod_yaml("good.example.com/dev", 1))
            assert rc == 0, out
            assert "hung" not in outcome  # still waiting for its plugin
        assert good.called("Allocate")
        rc, out = outcome["hung"]
        assert rc == 1 and "timed out" in out, (rc, out)
        (failed,) = await records_in_process(root, "AllocationFailed", "hung.example.com/dev")
        assert "timed out" in failed["event"]["reason"], failed
        assert hung.unanswered == 1  # the daemon gave up on a call the plugin never answered
        assert all(dev.holder == "" for dev in d.views.devices.devices["hung.example.com/dev"].values())
        assert await answering(root)


async def test_hung_preferred_allocation_times_out_and_the_daemon_chooses(
    root: Path, hostile: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(device_plugins, "PREFERRED_TIMEOUT", 1.0)
    async with in_process(root) as d:
        plugin = await started_in_process(d, hostile, "pref.example.com/dev", preferred=True)
        plugin.on["GetPreferredAllocation"] = plugin.hang
        rc, out = await admit_in_process(root, pod_yaml("pref.example.com/dev", 1))
        assert rc == 0, out
        assert plugin.called("GetPreferredAllocation") and plugin.called("Allocate")
        assert plugin.unanswered == 1  # admitted while the plugin still had not answered
        (reserved,) = await records_in_process(root, "DevicesReserved", "pref.example.com/dev")
        assert reserved["event"]["choice"] == "daemon", reserved
        assert "GetPreferredAllocation" in reserved["event"]["note"], reserved
        assert "timed out" in reserved["event"]["note"], reserved
        assert await answering(root)


async def test_hung_pre_start_container_times_out(
    root: Path, hostile: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(device_plugins, "PRE_START_TIMEOUT", 1.0)
    async with in_process(root) as d:
        plugin = await started_in_process(d, hostile, "prestart.example.com/dev", pre_start=True)
        plugin.on["PreStartContainer"] = plugin.hang
        rc, out = await admit_in_process(root, pod_yaml("prestart.example.com/dev", 1))
        assert rc == 1 and "timed out" in out, out
        (failed,) = await records_in_process(root, "AllocationFailed", "prestart.example.com/dev")
        assert "timed out" in failed["event"]["reason"], failed
        assert plugin.unanswered == 1
        assert await answering(root)


async def test_hung_get_device_plugin_options_refuses_the_registration(
    root: Path, hostile: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(device_plugins, "DIAL_TIMEOUT", 1.0)
    async with in_process(root) as d:
        hung = Hostile(root, "dial.example.com/hung", devices("h-0")).start()
        hostile.append(hung)
        hung.on["GetDevicePluginOptions"] = hung.hang
        outcome: dict[str, Any] = {}

        async def register_hung() -> None:
            outcome["hung"] = await register_in_process(d, hung)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(register_hung)
            await until("the hung options call", lambda: hung.called("GetDevicePluginOptions"))
            await started_in_process(d, hostile, "dial.example.com/good")  # not held up meanwhile
            assert "hung" not in outcome
        code, details = outcome["hung"]
        assert code == grpc.StatusCode.UNKNOWN and "timed out" in details, details
        (rejected,) = await records_in_process(root, "PluginRegistrationRejected", "dial.example.com/hung")
        assert "timed out" in rejected["event"]["reason"], rejected
        assert hung.unanswered == 1
        assert "dial.example.com/hung" not in d.devices.endpoints
        assert await answering(root)


async def test_hung_node_prepare_resources_times_out(
    root: Path, hostile: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dra, "CALL_TIMEOUT", 1.0)
    async with in_process(root) as d:
        driver = HostileDriver(root).start()
        hostile.append(driver)
        driver.prepare = driver.hang
        await until("the driver", lambda: driver.name in d.dra.clients)
        pod_uid, claim_uid = str(uuid.uuid4()), str(uuid.uuid4())
        claim = claim_yaml(tmp_path, "c1", claim_uid, [("p1", pod_uid)])
        rc, out = await admit_in_process(root, claim_pod_yaml(tmp_path, "p1", pod_uid, "c1").read_text(), claim)
        assert rc == 1 and "timed out" in out, out
        failed = await records_in_process(root, "ClaimPrepareFailed")
        assert failed and all("timed out" in f["event"]["reason"] for f in failed), failed
        assert driver.unanswered == 1
        assert await answering(root)
        assert d.views.claims.claims.get(claim_uid) is None or not d.views.claims.claims[claim_uid].pods


def test_plugin_cannot_hand_out_devices_it_was_not_asked_for(
    shared: Daemon, hostile: list[Any], tmp_path: Path
) -> None:
    resource = resource_name("choice")
    plugin = start(hostile, shared, resource, devices("c-0", "c-1", "c-2", "c-3"), preferred=True)
    listed(shared, resource, {"c-0", "c-1", "c-2", "c-3"})
    rc, first, err = admit(shared, tmp_path, resource, 1)
    assert rc == 0, err
    (held,) = [i for c in first["containers"] for r in c["resources"] for i in r["device_ids"]]
    # The plugin prefers a device another pod holds, one that does not exist, and one free one.
    free = sorted({"c-0", "c-1", "c-2", "c-3"} - {held})
    plugin.on["GetPreferredAllocation"] = lambda req: pb.PreferredAllocationResponse(
        container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=[held, "ghost", free[0]])]
    )
    rc, second, err = admit(shared, tmp_path, resource, 2)
    assert rc == 0, err
    got = [i for c in second["containers"] for r in c["resources"] for i in r["device_ids"]]
    assert len(got) == 2 and free[0] in got and held not in got and "ghost" not in got
    assert sorted(plugin.called("Allocate")[-1].container_requests[0].devices_ids) == sorted(got)
    allocated = records(shared.root, "DevicesAllocated", resource)
    assert [sorted(r["event"]["device_ids"]) for r in allocated] == [[held], sorted(got)]


def test_allocate_answer_is_passed_through_unchecked(shared: Daemon, hostile: list[Any], tmp_path: Path) -> None:
    resource = resource_name("pass")
    plugin = start(hostile, shared, resource, devices("p-0"))
    listed(shared, resource, {"p-0"})
    first = pb.ContainerAllocateResponse(
        envs={"LD_PRELOAD": "/tmp/anything.so"},
        mounts=[pb.Mount(container_path="/host-etc", host_path="/etc", read_only=False)],
        devices=[pb.DeviceSpec(container_path="/dev/mem", host_path="/dev/mem", permissions="rwm")],
        annotations={"any": "thing"},
    )
    second = pb.ContainerAllocateResponse(envs={"IGNORED": "the second container response"})
    plugin.on["Allocate"] = lambda req: pb.AllocateResponse(container_responses=[first, second])
    rc, _, err = admit(shared, tmp_path, resource, 1)
    assert rc == 0, err
    (allocated,) = records(shared.root, "DevicesAllocated", resource)
    response = allocated["event"]["response"]
    assert response["envs"] == {"LD_PRELOAD": "/tmp/anything.so"}
    assert response["mounts"] == [{"container_path": "/host-etc", "host_path": "/etc", "read_only": False}]
    assert response["devices"] == [{"container_path": "/dev/mem", "host_path": "/dev/mem", "permissions": "rwm"}]
    assert response["annotations"] == {"any": "thing"}


def test_nothing_a_plugin_sends_names_a_file_the_daemon_writes(
    shared: Daemon, hostile: list[Any], tmp_path: Path, elsewhere: Path
) -> None:
    resource = resource_name("files")
    target = elsewhere / f"written-{uuid.uuid4().hex[:6]}"
    relative = os.path.relpath(target, shared.root / "device-plugins")
    plugin = start(hostile, shared, resource, devices(relative, str(target)))
    listed(shared, resource, {relative, str(target)})
    path = str(target)
    plugin.on["Allocate"] = lambda req: pb.AllocateResponse(
        container_responses=[
            pb.ContainerAllocateResponse(
                envs={"F": path},
                mounts=[pb.Mount(container_path=path, host_path=path)],
                devices=[pb.DeviceSpec(container_path=path, host_path=path, permissions="rw")],
                annotations={path: path},
                cdi_devices=[pb.CDIDevice(name=path)],
            )
        ]
    )
    rc, _, err = admit(shared, tmp_path, resource, 2)
    assert rc == 0, err
    assert run_cli("audit", "device", resource, relative, root=shared.root).returncode == 0
    assert not target.exists() and list(elsewhere.glob("written-*")) == []


def test_newest_registration_takes_a_resource_over(shared: Daemon, hostile: list[Any]) -> None:
    resource = resource_name("takeover")
    first = start(hostile, shared, resource, devices("first-0"))
    listed(shared, resource, {"first-0"})
    second = start(hostile, shared, resource, devices("second-0"))
    wait_for(
        "the second plugin's devices",
        lambda: (
            {i for i, d in state(shared.root)["devices"]["devices"][resource].items() if not d.get("removed")}
            == {"second-0"}
        ),
        shared,
    )
    assert first.stream_ended.wait(10)  # the first plugin's stream was ended
    registered = records(shared.root, "PluginRegistered", resource)
    assert [r["event"]["endpoint"] for r in registered] == [first.socket.name, second.socket.name]
    assert records(shared.root, "PluginDisconnected", resource) == []


# =========================================================================== (f) the node API


def inet_listeners(pid: int) -> list[str]:
    """The TCP sockets listening and the UDP sockets bound by process ``pid``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6", "udp", "udp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes and (table.startswith("udp") or fields[3] == "0A"):
                found.append(f"{table} {fields[1]}")
    return found


def test_no_network_listener_by_default(shared: Daemon) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:  # the probe sees a listener
        probe.bind(("127.0.0.1", 0))
        probe.listen(1)
        assert inet_listeners(os.getpid())
    assert alive(shared)
    assert inet_listeners(shared.proc.pid) == []


# =========================================================================== (g) the log


def _stopped_log(daemon_factory: type[Daemon]) -> Path:
    daemon = daemon_factory()
    assert daemon.stop() == 0
    return daemon.root


def _rewrite(root: Path, change: Callable[[dict[int, bytes]], dict[int, bytes]]) -> None:
    env = lmdb.open(str(root / "eventsrc" / "log"), max_dbs=16)
    try:
        db = env.open_db(b"events")
        with env.begin(db=db) as txn:
            values = {int.from_bytes(k, "big"): bytes(v) for k, v in txn.cursor()}
        new = change(values)
        with env.begin(write=True, db=db) as txn:
            for seq in values.keys() - new.keys():
                txn.delete(seq_key(seq))
            for seq, value in new.items():
                txn.put(seq_key(seq), value)
    finally:
        env.close()


def _edited(value: bytes, seq: int, prev_hash: bytes) -> bytes:
    """Record ``seq`` with its DaemonStarted version changed, re-encoded with a valid CRC."""
    rec = decode_record(seq, value)
    assert isinstance(rec.event, ev.DaemonStarted)
    event = msgspec.structs.replace(rec.event, version="0.0.0-forged")
    return encode_payload(event, rec.ts_ns, rec.correlation_id, prev_hash)


def _verify(root: Path) -> list[dict[str, Any]]:
    proc = run_cli("audit", "verify", "-o", "json", root=root)
    findings: list[dict[str, Any]] = json.loads(proc.stdout)["findings"]
    return findings


def test_audit_verify_finds_an_edited_record(daemon_factory: type[Daemon]) -> None:
    root = _stopped_log(daemon_factory)
    assert _verify(root) == []

    def edit(values: dict[int, bytes]) -> dict[int, bytes]:
        return {**values, 1: _edited(values[1], 1, prev_hash_of(values[1]))}

    _rewrite(root, edit)
    findings = _verify(root)
    assert [(f["seq"], f["what"]) for f in findings] == [(1, "altered")], findings


def test_root_can_rewrite_the_chain_undetected(daemon_factory: type[Daemon]) -> None:
    root = _stopped_log(daemon_factory)

    def forge(values: dict[int, bytes]) -> dict[int, bytes]:
        out = {1: _edited(values[1], 1, prev_hash_of(values[1]))}
        for seq in sorted(values)[1:]:
            rec = decode_record(seq, values[seq])
            out[seq] = encode_payload(rec.event, rec.ts_ns, rec.correlation_id, chain_hash(out[seq - 1]))
        return out

    _rewrite(root, forge)
    assert _verify(root) == []
    assert "0.0.0-forged" in run_cli("log", "-o", "json", root=root, check=True).stdout


def test_removing_the_newest_records_is_not_detected(daemon_factory: type[Daemon]) -> None:
    root = _stopped_log(daemon_factory)
    _rewrite(root, lambda values: {seq: v for seq, v in values.items() if seq < max(values)})
    assert _verify(root) == []
