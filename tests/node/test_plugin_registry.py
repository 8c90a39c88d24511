"""The plugin watcher (``eventsrc.node.plugin_watcher``) against real plugins: the sample DRA
driver in a subprocess, and registration servers written with grpcio."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
import trio
import trio_asyncio

from eventsrc.node import plugin_watcher
from eventsrc.node.plugin_watcher import (
    PluginWatcher,
    no_handler_message,
    registration_failed_message,
    validation_failed_message,
)
from tests.support.eventually import eventually, eventually_trio
from tests.support.grpcio_stubs import (
    dra,
    plugin_registration,
    plugin_registration_handler,
    unix_target,
)

DRIVER = "gpu.example.com"


@pytest.fixture
def root() -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes: keep the root short.
    short = Path(tempfile.mkdtemp(prefix="es-", dir="/tmp"))
    yield short
    shutil.rmtree(short, ignore_errors=True)


class FakeHandler:
    """Records the watcher's calls; refuses when told to."""

    def __init__(self, refuse_validate: str = "", refuse_register: str = "") -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.refuse_validate = refuse_validate
        self.refuse_register = refuse_register

    async def validate(self, name: str, endpoint: str, versions: list[str]) -> None:
        self.calls.append(("validate", name, endpoint, versions))
        if self.refuse_validate:
            raise ValueError(self.refuse_validate)

    async def register(self, name: str, endpoint: str, versions: list[str], socket_path: Path) -> None:
        self.calls.append(("register", name, endpoint, versions, socket_path))
        if self.refuse_register:
            raise RuntimeError(self.refuse_register)

    async def deregister(self, name: str, endpoint: str, socket_path: Path) -> None:
        self.calls.append(("deregister", name, endpoint, socket_path))

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == kind]


class GrpcioRegistration:
    """A registration server written with grpcio: answers GetInfo with ``info`` and records
    every NotifyRegistrationStatus (optionally serving DRA v1 on the same socket)."""

    def __init__(self, path: Path, *, type: str, name: str, endpoint: str = "", versions: tuple[str, ...] = ()) -> None:
        mod = plugin_registration()
        self.path = path
        self.get_info_calls = 0
        self.statuses: list[tuple[bool, str]] = []
        outer = self

        class Servicer(mod.RegistrationServicer):
            def GetInfo(self, request: Any, context: Any) -> Any:
                outer.get_info_calls += 1
                return mod.pb2.PluginInfo(type=type, name=name, endpoint=endpoint, supported_versions=list(versions))

            def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
                outer.statuses.append((request.plugin_registered, request.error))
                return mod.pb2.RegistrationStatusResponse()

        path.parent.mkdir(parents=True, exist_ok=True)
        self.server = grpc.server(ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers([plugin_registration_handler(Servicer())])
        self.server.add_insecure_port(unix_target(path))
        self.server.start()

    def stop(self) -> None:
        self.server.stop(None).wait()
        self.path.unlink(missing_ok=True)


def start_driver(root: Path, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
    calls = root / "driver-calls.jsonl"
    out = open(root / "driver.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eventsrc",
            "--root-dir",
            str(root),
            "sample-dra-driver",
            "--driver",
            DRIVER,
            "--calls-log",
            str(calls),
            *extra,
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    out.close()
    return proc, calls


def read_calls(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def stop_driver(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


async def two_scans(watcher: PluginWatcher, what: str) -> None:
    """Two more scans of the tree as it is now, asked for (nothing else may change it)."""
    for n in (1, 2):
        scans = watcher.scans
        watcher.rescan()
        await eventually_trio(lambda: watcher.scans > scans, f"scan {n} of two {what}")  # noqa: B023


# ---------------------------------------------------------------------------- (a) the sample DRA driver


async def test_sample_dra_driver_registers_and_deregisters(root: Path) -> None:
    registry = root / "plugins_registry"
    reg_sock = registry / f"{DRIVER}-reg.sock"
    dra_sock = root / "plugins" / DRIVER / "dra.sock"
    handler = FakeHandler()
    proc, calls = start_driver(root)
    try:
        async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
            await nursery.start(PluginWatcher(registry, {"DRAPlugin": handler}).run)
            await eventually_trio(lambda: handler.of("register"), "the driver's registration")
            versions = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
            assert handler.calls[:2] == [
                ("validate", DRIVER, str(dra_sock), versions),
                ("register", DRIVER, str(dra_sock), versions, reg_sock),
            ]
            notified = lambda: [c for c in read_calls(calls) if c["method"] == "NotifyRegistrationStatus"]  # noqa: E731
            await eventually_trio(notified, "NotifyRegistrationStatus")
            assert notified() == [{"method": "NotifyRegistrationStatus", "registered": True, "error": ""}]

            # Its registration socket removed: deregistered; the driver serves again: registered again.
            reg_sock.unlink()
            await eventually_trio(lambda: len(handler.of("register")) == 2, "registration again")
            assert handler.of("deregister") == [("deregister", DRIVER, str(dra_sock), reg_sock)]
            await eventually_trio(lambda: len(notified()) == 2, "the second NotifyRegistrationStatus")

            # SIGTERM: the driver removes its sockets, the watcher deregisters it.
            proc.send_signal(signal.SIGTERM)
            await trio.to_thread.run_sync(lambda: proc.wait(timeout=10))
            assert proc.returncode == 0
            await eventually_trio(lambda: len(handler.of("deregister")) == 2, "deregistration")
            assert not reg_sock.exists() and not dra_sock.exists()
            nursery.cancel_scope.cancel()
    finally:
        stop_driver(proc)


def test_sample_dra_driver_prepares_and_unprepares(root: Path) -> None:
    """The driver's DRA service, called with grpcio (v1 and v1beta1), and its failure injection."""
    proc, calls = start_driver(root, "--fail-prepare", "uid-bad")
    dra_sock = root / "plugins" / DRIVER / "dra.sock"
    state_file = root / "plugins" / DRIVER / "state.json"
    control = root / "plugins" / DRIVER / "control.json"
    try:
        eventually(
            (root / "plugins_registry" / f"{DRIVER}-reg.sock").exists,
            "the driver's registration socket",
            timeout=15,
            stop=lambda: None if proc.poll() is None else (root / "driver.log").read_text(),
        )
        v1, v1beta1 = dra("v1"), dra("v1beta1")
        with grpc.insecure_channel(unix_target(dra_sock)) as channel:
            stub = v1.DRAPluginStub(channel)
            claims = [
                v1.pb2.Claim(namespace="default", uid="uid-a", name="claim-a"),
                v1.pb2.Claim(namespace="default", uid="uid-bad", name="claim-bad"),
            ]
            resp = stub.NodePrepareResources(v1.pb2.NodePrepareResourcesRequest(claims=claims), timeout=5)
            assert set(resp.claims) == {"uid-a", "uid-bad"}
            (device,) = resp.claims["uid-a"].devices
            assert (device.pool_name, device.device_name, list(device.cdi_device_ids)) == (
                "sample",
                "claim-a-0",
                [f"{DRIVER}/device=claim-a-0"],
            )
            assert resp.claims["uid-a"].error == ""
            assert "uid-bad" in resp.claims["uid-bad"].error
            state = json.loads(state_file.read_text())
            assert state == {
                "prepared": {
                    "uid-a": {"namespace": "default", "name": "claim-a", "cdi": [f"{DRIVER}/device=claim-a-0"]}
                }
            }

            # v1beta1, the same driver; idempotent prepare; omit.
            beta = v1beta1.DRAPluginStub(channel)
            control.write_text(json.dumps({"omit": ["uid-c"]}))
            req = v1beta1.pb2.NodePrepareResourcesRequest(
                claims=[
                    v1beta1.pb2.Claim(namespace="default", uid="uid-a", name="claim-a"),
                    v1beta1.pb2.Claim(namespace="ns2", uid="uid-c", name="claim-c"),
                ]
            )
            resp = beta.NodePrepareResources(req, timeout=5)
            assert set(resp.claims) == {"uid-a"}
            assert [d.device_name for d in resp.claims["uid-a"].devices] == ["claim-a-0"]

            # down: UNAVAILABLE for every call, nothing changes.
            control.write_text(json.dumps({"down": True}))
            with pytest.raises(grpc.RpcError) as err:
                stub.NodeUnprepareResources(v1.pb2.NodeUnprepareResourcesRequest(claims=claims[:1]), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert set(json.loads(state_file.read_text())["prepared"]) == {"uid-a"}

            # fail_unprepare, then unprepare (an unknown claim is fine).
            control.write_text(json.dumps({"fail_unprepare": ["uid-a"]}))
            resp = stub.NodeUnprepareResources(v1.pb2.NodeUnprepareResourcesRequest(claims=claims[:1]), timeout=5)
            assert resp.claims["uid-a"].error
            control.write_text("{}")
            unknown = v1.pb2.Claim(namespace="default", uid="uid-x", name="claim-x")
            resp = stub.NodeUnprepareResources(
                v1.pb2.NodeUnprepareResourcesRequest(claims=[claims[0], unknown]), timeout=5
            )
            assert set(resp.claims) == {"uid-a", "uid-x"}
            assert resp.claims["uid-a"].error == "" and resp.claims["uid-x"].error == ""
            assert json.loads(state_file.read_text()) == {"prepared": {}}
        methods = [c["method"] for c in read_calls(calls)]
        assert methods.count("NodePrepareResources") == 2 and methods.count("NodeUnprepareResources") == 3
    finally:
        stop_driver(proc)
    assert proc.returncode == 0


# ---------------------------------------------------------------------------- (b) refused plugins


async def test_unknown_type_is_notified_false_with_the_kubelets_message(root: Path) -> None:
    registry = root / "plugins_registry"
    sock = registry / "csi.sock"
    handler = FakeHandler()
    plugin = GrpcioRegistration(sock, type="CSIPlugin", name="csi.example.com", versions=("1.0.0",))
    try:
        async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
            await nursery.start(PluginWatcher(registry, {"DRAPlugin": handler}).run)
            await eventually_trio(lambda: plugin.statuses, "NotifyRegistrationStatus")
            assert plugin.statuses[0] == (False, no_handler_message("CSIPlugin", sock))
            assert (
                plugin.statuses[0][1]
                == f"RegisterPlugin error -- no handler registered for plugin type: CSIPlugin at socket {sock}"
            )
            assert handler.calls == []
            nursery.cancel_scope.cancel()
    finally:
        plugin.stop()


async def test_validate_and_register_failures_are_notified(root: Path) -> None:
    registry = root / "plugins_registry"
    a = GrpcioRegistration(registry / "a.sock", type="DRAPlugin", name="a.example.com", versions=("v1.DRAPlugin",))
    b = GrpcioRegistration(registry / "b.sock", type="DevicePlugin", name="example.com/b", versions=("v1beta1",))
    dra_handler = FakeHandler(refuse_validate="no supported DRA service")
    dp_handler = FakeHandler(refuse_register="cannot dial")
    try:
        async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
            watcher = PluginWatcher(registry, {"DRAPlugin": dra_handler, "DevicePlugin": dp_handler})
            await nursery.start(watcher.run)
            await eventually_trio(lambda: a.statuses and b.statuses, "both notified")
            assert a.statuses[0] == (False, validation_failed_message("no supported DRA service"))
            assert (
                a.statuses[0][1]
                == "RegisterPlugin error -- plugin validation failed with err: no supported DRA service"
            )
            assert b.statuses[0] == (False, registration_failed_message("cannot dial"))
            assert b.statuses[0][1] == "RegisterPlugin error -- plugin registration failed with err: cannot dial"
            assert not dra_handler.of("register")
            # Neither registered: a socket going away deregisters nothing.
            a.stop()
            b.stop()
            await two_scans(watcher, "without the sockets")
            assert not dra_handler.of("deregister") and not dp_handler.of("deregister")
            nursery.cancel_scope.cancel()
    finally:
        a.stop()
        b.stop()


# ---------------------------------------------------------------------------- (c) appear, then disappear


async def test_socket_that_disappears_is_deregistered(root: Path) -> None:
    registry = root / "plugins_registry"
    sock = registry / "sub" / "plugin.sock"  # a subdirectory is watched too
    handler = FakeHandler()
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        await nursery.start(PluginWatcher(registry, {"DRAPlugin": handler}).run)
        plugin = GrpcioRegistration(sock, type="DRAPlugin", name="x.example.com", versions=("v1.DRAPlugin",))
        try:
            await eventually_trio(lambda: plugin.statuses, "NotifyRegistrationStatus")
            assert plugin.statuses == [(True, "")]
            # An empty endpoint means the registration socket itself.
            assert handler.of("register") == [("register", "x.example.com", str(sock), ["v1.DRAPlugin"], sock)]
        finally:
            plugin.stop()
        await eventually_trio(lambda: handler.of("deregister"), "deregistration")
        assert handler.of("deregister") == [("deregister", "x.example.com", str(sock), sock)]
        nursery.cancel_scope.cancel()


def _inotify_fds() -> list[str]:
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify":
                fds.append(fd)
    return fds


async def test_a_stopped_watcher_closes_its_inotify_instance(root: Path) -> None:
    """Closed in a thread (the kernel's close waits about 10 ms for the watches' readers),
    and closed all the same when the watcher is cancelled."""
    before = _inotify_fds()
    watcher = PluginWatcher(root / "plugins_registry", {})
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        await nursery.start(watcher.run)
        assert watcher.inotify and len(_inotify_fds()) == len(before) + 1
        nursery.cancel_scope.cancel()
    assert _inotify_fds() == before


# ---------------------------------------------------------------------------- (d) ignored names


async def test_dot_names_and_regular_files_are_ignored(root: Path) -> None:
    registry = root / "plugins_registry"
    hidden = GrpcioRegistration(registry / ".hidden.sock", type="DRAPlugin", name="hidden.example.com")
    in_dot_dir = GrpcioRegistration(registry / ".tmp" / "p.sock", type="DRAPlugin", name="dotdir.example.com")
    (registry / "plain.sock").write_text("not a socket")
    handler = FakeHandler()
    try:
        async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
            watcher = PluginWatcher(registry, {"DRAPlugin": handler})
            await nursery.start(watcher.run)
            seen = GrpcioRegistration(registry / "seen.sock", type="DRAPlugin", name="seen.example.com")
            try:
                await eventually_trio(lambda: seen.statuses, "the visible plugin")
                await two_scans(watcher, "more")
            finally:
                seen.stop()
            assert [c[1] for c in handler.of("register")] == ["seen.example.com"]
            assert hidden.get_info_calls == 0 and in_dot_dir.get_info_calls == 0
            nursery.cancel_scope.cancel()
    finally:
        hidden.stop()
        in_dot_dir.stop()


# ---------------------------------------------------------------------------- (e) a plugin that hangs


async def test_hanging_get_info_times_out_and_others_register(
    root: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="eventsrc.node.plugin_watcher")
    # Longer than the kubelet's second, so that the good plugin surely registers meanwhile.
    monkeypatch.setattr(plugin_watcher, "GET_INFO_TIMEOUT", 2.0)
    registry = root / "plugins_registry"
    registry.mkdir(parents=True)
    hung_path = registry / "hung.sock"
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # listens, never accepts, never answers
    hung.bind(str(hung_path))
    hung.listen(16)
    handler = FakeHandler()
    try:
        async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
            # The first scan, before start returns, has started the hung socket's registration.
            await nursery.start(PluginWatcher(registry, {"DRAPlugin": handler}).run)
            timed_out = lambda: [  # noqa: E731
                f
                for r in caplog.records
                if r.getMessage() == "plugin rejected"
                for f in [getattr(r, "fields", {})]
                if "hung.sock" in str(f["socket"]) and "timed out" in f["reason"]
            ]
            good = GrpcioRegistration(registry / "good.sock", type="DRAPlugin", name="good.example.com")
            try:
                await eventually_trio(lambda: good.statuses, "the good plugin")
                assert good.statuses == [(True, "")]
                assert not timed_out(), "the good plugin waited for the hung one"
            finally:
                good.stop()
            await eventually_trio(timed_out, "the hung plugin's GetInfo to time out")
            assert "GetInfo failed: timed out" in timed_out()[0]["reason"]
            await eventually_trio(lambda: handler.of("deregister"), "the good plugin's deregistration")
            assert [c[1] for c in handler.calls] == ["good.example.com"] * 3
            nursery.cancel_scope.cancel()
    finally:
        hung.close()


# ---------------------------------------------------------------------------- (f) inotify, not polling

NEVER = 24 * 3600.0  # a scan period no test outlives: only an inotify event (or a retry) can start a scan
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


@linux_only
async def test_socket_created_is_registered_without_polling(root: Path) -> None:
    registry = root / "plugins_registry"
    handler = FakeHandler()
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        watcher = PluginWatcher(registry, {"DRAPlugin": handler}, period=NEVER)
        await nursery.start(watcher.run)
        assert watcher.inotify, "inotify could not be had"
        sock = registry / "p.sock"
        plugin = GrpcioRegistration(sock, type="DRAPlugin", name="p.example.com", versions=("v1.DRAPlugin",))
        try:
            await eventually_trio(lambda: plugin.statuses, "NotifyRegistrationStatus")
            assert plugin.statuses == [(True, "")]
        finally:
            plugin.stop()
        await eventually_trio(lambda: handler.of("deregister"), "deregistration")
        assert handler.of("deregister") == [("deregister", "p.example.com", str(sock), sock)]
        nursery.cancel_scope.cancel()


@linux_only
async def test_socket_in_a_new_subdirectory_is_registered_without_polling(root: Path) -> None:
    registry = root / "plugins_registry"
    handler = FakeHandler()
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        watcher = PluginWatcher(registry, {"DRAPlugin": handler}, period=NEVER)
        await nursery.start(watcher.run)
        assert watcher.inotify, "inotify could not be had"
        # Two new levels, the socket bound right after they are made (the deeper one may be
        # made before the watcher has watched the first: it is watched before it is listed).
        nested = GrpcioRegistration(registry / "a" / "b" / "p.sock", type="DRAPlugin", name="nested.example.com")
        # A directory moved in with its socket already in it.
        outside = root / "elsewhere"
        moved = GrpcioRegistration(outside / "q.sock", type="DRAPlugin", name="moved.example.com")
        try:
            await eventually_trio(lambda: nested.statuses, "the nested plugin")
            outside.rename(registry / "moved")
            await eventually_trio(lambda: moved.statuses, "the plugin moved in")
            assert nested.statuses == moved.statuses == [(True, "")]
            assert {c[4] for c in handler.of("register")} == {
                registry / "a" / "b" / "p.sock",
                registry / "moved" / "q.sock",
            }
            # The subdirectory removed: its plugin goes.
            shutil.rmtree(registry / "a")
            await eventually_trio(lambda: handler.of("deregister"), "the nested plugin's deregistration")
            assert [c[1] for c in handler.of("deregister")] == ["nested.example.com"]
        finally:
            nested.stop()
            moved.server.stop(None).wait()
        nursery.cancel_scope.cancel()


@linux_only
async def test_registry_removed_and_made_again_is_polled_until_watched(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="eventsrc.node.plugin_watcher")
    registry = root / "plugins_registry"
    handler = FakeHandler()
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        watcher = PluginWatcher(registry, {"DRAPlugin": handler}, period=NEVER)
        await nursery.start(watcher.run)
        registry.rmdir()  # nothing watches its parent: the watcher polls until it is back
        polling = lambda: [r for r in caplog.records if r.getMessage() == "cannot watch a plugin directory; polling"]  # noqa: E731
        await eventually_trio(polling, "the warning that it polls")
        plugin = GrpcioRegistration(registry / "p.sock", type="DRAPlugin", name="p.example.com")
        try:
            await eventually_trio(lambda: plugin.statuses, "the plugin in the registry made again")
            assert plugin.statuses == [(True, "")]
            assert any(r.getMessage() == "every plugin directory watched again" for r in caplog.records)
        finally:
            plugin.stop()
        await eventually_trio(lambda: handler.of("deregister"), "deregistration")
        nursery.cancel_scope.cancel()


async def test_without_inotify_the_registry_is_polled(
    root: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="eventsrc.node.plugin_watcher")

    def emfile(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    if plugin_watcher.inotify_simple is not None:
        monkeypatch.setattr(plugin_watcher.inotify_simple, "INotify", emfile)
    registry = root / "plugins_registry"
    handler = FakeHandler()
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        watcher = PluginWatcher(registry, {"DRAPlugin": handler})
        await nursery.start(watcher.run)
        assert not watcher.inotify
        (warning,) = [r for r in caplog.records if r.getMessage() == "inotify unavailable; polling the plugin registry"]
        assert getattr(warning, "fields", {})["period"] == plugin_watcher.SCAN_PERIOD
        plugin = GrpcioRegistration(registry / "p.sock", type="DRAPlugin", name="p.example.com")
        try:
            await eventually_trio(lambda: plugin.statuses, "the plugin, polled")
            assert plugin.statuses == [(True, "")]
        finally:
            plugin.stop()
        await eventually_trio(lambda: handler.of("deregister"), "deregistration")
        nursery.cancel_scope.cancel()
