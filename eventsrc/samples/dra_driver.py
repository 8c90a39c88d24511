"""A sample DRA driver (kubelet plugin API ``v1`` and ``v1beta1``), for demos and tests.

It is a real kubelet plugin, laid out as ``k8s.io/dynamic-resource-allocation/kubeletplugin``
lays drivers out:

- ``ROOT/plugins_registry/<driver>-reg.sock`` serves ``pluginregistration.Registration``:
  ``GetInfo`` answers type ``DRAPlugin``, the driver name, the service socket and the
  advertised services (``v1.DRAPlugin``, ``v1beta1.DRAPlugin``); ``NotifyRegistrationStatus``
  is logged.
- ``ROOT/plugins/<driver>/dra.sock`` serves ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``
  (and ``...v1beta1.DRAPlugin``).

``NodePrepareResources`` gives each claim ``--devices-per-claim`` devices named after the
claim (pool ``--pool``, device ``<claim-name>-<n>``, CDI id ``<driver>/device=<claim-name>-<n>``)
and records the claim in the state file; preparing a prepared claim again answers the same
devices. ``NodeUnprepareResources`` forgets the claims (an unknown claim is fine). The state
file (default ``ROOT/plugins/<driver>/state.json``) is replaced atomically on every change::

    {"prepared": {"<uid>": {"namespace": "...", "name": "...", "cdi": ["..."]}}}

Failure injection: the control file (default ``ROOT/plugins/<driver>/control.json``) is read
again on every call::

    {"fail_prepare": [uid, ...], "fail_unprepare": [uid, ...],
     "omit": [uid, ...],   # left out of the response map (neither prepared nor unprepared)
     "down": true}         # every DRA call answers UNAVAILABLE

When its registration socket (or its service socket) is removed or replaced, it serves both
again, so that the kubelet (or eventsrc) registers it again. SIGTERM and SIGINT stop it; its
sockets are removed on the way out.

Pure asyncio and grpclib: a driver is a separate program, not part of the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grpclib import GRPCError, Status
from grpclib.server import Server, Stream

from eventsrc.gen.dra.v1 import api_pb2 as dra_v1
from eventsrc.gen.dra.v1.api_grpc import DRAPluginBase as DRAPluginBaseV1
from eventsrc.gen.dra.v1beta1 import api_pb2 as dra_v1beta1
from eventsrc.gen.dra.v1beta1.api_grpc import DRAPluginBase as DRAPluginBaseV1beta1
from eventsrc.gen.pluginregistration.v1 import api_pb2 as reg
from eventsrc.gen.pluginregistration.v1.api_grpc import RegistrationBase

log = logging.getLogger("eventsrc.sample-dra-driver")

VERSIONS = ("v1", "v1beta1")  # in the kubelet's order of preference
POLL = 0.2
MAX_SOCKET_PATH = 107


def service_name(version: str) -> str:
    """The name advertised in PluginInfo.supported_versions (not the gRPC service name)."""
    return f"{version}.DRAPlugin"


def _ids(value: Any) -> set[str]:
    return {str(v) for v in value} if isinstance(value, list) else set()


class SampleDriver:
    def __init__(
        self,
        root: Path,
        driver: str,
        *,
        versions: Sequence[str] = VERSIONS,
        state_file: Path | None = None,
        control_file: Path | None = None,
        fail_prepare: Sequence[str] = (),
        devices_per_claim: int = 1,
        pool: str = "sample",
        calls_log: Path | None = None,
    ) -> None:
        self.root = root
        self.driver = driver
        self.versions = list(versions)
        self.registry = root / "plugins_registry"
        self.reg_socket = self.registry / f"{driver}-reg.sock"
        self.dir = root / "plugins" / driver
        self.dra_socket = self.dir / "dra.sock"
        self.state_file = state_file or self.dir / "state.json"
        self.control_file = control_file or self.dir / "control.json"
        self.fail_prepare = set(fail_prepare)
        self.devices_per_claim = devices_per_claim
        self.pool = pool
        self.calls_log = calls_log
        self.prepared: dict[str, dict[str, Any]] = self._load_state()

    # ------------------------------------------------------------------ files

    def _load_state(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {}
        except ValueError:
            log.warning("state file %s is not JSON; starting empty", self.state_file)
            return {}
        prepared = data.get("prepared") if isinstance(data, dict) else None
        return dict(prepared) if isinstance(prepared, dict) else {}

    def _save_state(self) -> None:
        """Replace the state file atomically and durably (temp file, fsync, rename, fsync dir)."""
        directory = self.state_file.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".state-", dir=directory)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"prepared": self.prepared}, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.state_file)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _control(self) -> dict[str, Any]:
        try:
            data = json.loads(self.control_file.read_text() or "{}")
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("control file %s unreadable (%s); ignored", self.control_file, exc)
            return {}
        return data if isinstance(data, dict) else {}

    def _record(self, method: str, **fields: Any) -> None:
        if self.calls_log is not None:
            with open(self.calls_log, "a") as f:
                f.write(json.dumps({"method": method, **fields}) + "\n")

    # ------------------------------------------------------------------ the DRA service

    def devices_for(self, name: str) -> list[tuple[str, str]]:
        """(device name, CDI id) of each device prepared for the claim named ``name``."""
        out = []
        for n in range(self.devices_per_claim):
            device = f"{name}-{n}"
            out.append((device, f"{self.driver}/device={device}"))
        return out

    async def prepare(self, stream: Stream[Any, Any], pb: Any) -> None:
        req = await stream.recv_message()
        assert req is not None
        control = self._control()
        uids = [c.uid for c in req.claims]
        self._record(
            "NodePrepareResources", version=pb.__name__.split(".")[-2], claims=uids, down=bool(control.get("down"))
        )
        if control.get("down"):
            log.info("NodePrepareResources claims=%s answer=UNAVAILABLE (down)", ",".join(uids))
            raise GRPCError(Status.UNAVAILABLE, f"driver {self.driver} is down")
        fail = self.fail_prepare | _ids(control.get("fail_prepare"))
        omit = _ids(control.get("omit"))
        resp = pb.NodePrepareResourcesResponse()
        changed = False
        outcome = []
        for claim in req.claims:
            if claim.uid in omit:
                outcome.append(f"{claim.uid}:omitted")
                continue
            if claim.uid in fail:
                resp.claims[
                    claim.uid
                ].error = f"injected failure preparing claim {claim.namespace}/{claim.name} ({claim.uid})"
                outcome.append(f"{claim.uid}:failed")
                continue
            devices = self.devices_for(claim.name)
            entry = {"namespace": claim.namespace, "name": claim.name, "cdi": [cdi for _, cdi in devices]}
            if self.prepared.get(claim.uid) != entry:
                self.prepared[claim.uid] = entry
                changed = True
            for device, cdi in devices:
                resp.claims[claim.uid].devices.append(
                    pb.Device(pool_name=self.pool, device_name=device, cdi_device_ids=[cdi])
                )
            outcome.append(f"{claim.uid}:prepared")
        if changed:
            self._save_state()
        log.info("NodePrepareResources claims=%s", ",".join(outcome) or "-")
        await stream.send_message(resp)

    async def unprepare(self, stream: Stream[Any, Any], pb: Any) -> None:
        req = await stream.recv_message()
        assert req is not None
        control = self._control()
        uids = [c.uid for c in req.claims]
        self._record(
            "NodeUnprepareResources", version=pb.__name__.split(".")[-2], claims=uids, down=bool(control.get("down"))
        )
        if control.get("down"):
            log.info("NodeUnprepareResources claims=%s answer=UNAVAILABLE (down)", ",".join(uids))
            raise GRPCError(Status.UNAVAILABLE, f"driver {self.driver} is down")
        fail = _ids(control.get("fail_unprepare"))
        omit = _ids(control.get("omit"))
        resp = pb.NodeUnprepareResourcesResponse()
        changed = False
        outcome = []
        for claim in req.claims:
            if claim.uid in omit:
                outcome.append(f"{claim.uid}:omitted")
                continue
            if claim.uid in fail:
                resp.claims[
                    claim.uid
                ].error = f"injected failure unpreparing claim {claim.namespace}/{claim.name} ({claim.uid})"
                outcome.append(f"{claim.uid}:failed")
                continue
            if self.prepared.pop(claim.uid, None) is not None:
                changed = True
            resp.claims[claim.uid].SetInParent()  # an empty entry: unprepared
            outcome.append(f"{claim.uid}:unprepared")
        if changed:
            self._save_state()
        log.info("NodeUnprepareResources claims=%s", ",".join(outcome) or "-")
        await stream.send_message(resp)

    # ------------------------------------------------------------------ the Registration service

    def plugin_info(self) -> reg.PluginInfo:
        return reg.PluginInfo(
            type="DRAPlugin",
            name=self.driver,
            endpoint=str(self.dra_socket),
            supported_versions=[service_name(v) for v in self.versions],
        )

    def notified(self, status: reg.RegistrationStatus) -> None:
        self._record("NotifyRegistrationStatus", registered=status.plugin_registered, error=status.error)
        if status.plugin_registered:
            log.info("NotifyRegistrationStatus registered=true")
            print(
                f"sample-dra-driver: registered {self.driver} ({','.join(service_name(v) for v in self.versions)})",
                flush=True,
            )
        else:
            log.warning("NotifyRegistrationStatus registered=false error=%r", status.error)

    # ------------------------------------------------------------------ running

    def services(self) -> list[Any]:
        out: list[Any] = []
        if "v1" in self.versions:
            out.append(_DRAv1(self))
        if "v1beta1" in self.versions:
            out.append(_DRAv1beta1(self))
        return out

    async def run(self, stop: asyncio.Event) -> None:
        """Serve both sockets; serve them again whenever one is removed or replaced."""
        self.registry.mkdir(parents=True, exist_ok=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        while not stop.is_set():
            self.dra_socket.unlink(missing_ok=True)
            self.reg_socket.unlink(missing_ok=True)
            started: list[Server] = []
            try:
                # The service first: it must answer as soon as the kubelet registers the driver.
                for handlers, path in ((self.services(), self.dra_socket), ([_Registration(self)], self.reg_socket)):
                    server = Server(handlers)
                    await server.start(path=str(path))
                    started.append(server)
                inodes = (self.dra_socket.stat().st_ino, self.reg_socket.stat().st_ino)
                log.info("serving driver=%s registration=%s service=%s", self.driver, self.reg_socket, self.dra_socket)
                while not stop.is_set():
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), POLL)
                    try:
                        now = (self.dra_socket.stat().st_ino, self.reg_socket.stat().st_ino)
                    except FileNotFoundError:
                        now = None
                    if now != inodes and not stop.is_set():
                        log.info("a socket was removed or replaced: serving and registering again")
                        break
            except OSError as exc:
                log.warning("cannot serve (%s); retrying", exc)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
            finally:
                for server in reversed(started):
                    server.close()
                for server in reversed(started):
                    await server.wait_closed()
        self.reg_socket.unlink(missing_ok=True)
        self.dra_socket.unlink(missing_ok=True)
        log.info("stopped driver=%s", self.driver)


class _DRAv1(DRAPluginBaseV1):
    def __init__(self, driver: SampleDriver) -> None:
        self._driver = driver

    async def NodePrepareResources(
        self, stream: Stream[dra_v1.NodePrepareResourcesRequest, dra_v1.NodePrepareResourcesResponse]
    ) -> None:
        await self._driver.prepare(stream, dra_v1)

    async def NodeUnprepareResources(
        self, stream: Stream[dra_v1.NodeUnprepareResourcesRequest, dra_v1.NodeUnprepareResourcesResponse]
    ) -> None:
        await self._driver.unprepare(stream, dra_v1)


class _DRAv1beta1(DRAPluginBaseV1beta1):
    def __init__(self, driver: SampleDriver) -> None:
        self._driver = driver

    async def NodePrepareResources(
        self, stream: Stream[dra_v1beta1.NodePrepareResourcesRequest, dra_v1beta1.NodePrepareResourcesResponse]
    ) -> None:
        await self._driver.prepare(stream, dra_v1beta1)

    async def NodeUnprepareResources(
        self, stream: Stream[dra_v1beta1.NodeUnprepareResourcesRequest, dra_v1beta1.NodeUnprepareResourcesResponse]
    ) -> None:
        await self._driver.unprepare(stream, dra_v1beta1)


class _Registration(RegistrationBase):
    def __init__(self, driver: SampleDriver) -> None:
        self._driver = driver

    async def GetInfo(self, stream: Stream[reg.InfoRequest, reg.PluginInfo]) -> None:
        await stream.recv_message()
        self._driver._record("GetInfo")
        log.info("GetInfo")
        await stream.send_message(self._driver.plugin_info())

    async def NotifyRegistrationStatus(
        self, stream: Stream[reg.RegistrationStatus, reg.RegistrationStatusResponse]
    ) -> None:
        status = await stream.recv_message()
        assert status is not None
        self._driver.notified(status)
        await stream.send_message(reg.RegistrationStatusResponse())


def parse_versions(text: str) -> list[str]:
    versions = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in versions if v not in VERSIONS]
    if bad or not versions:
        raise ValueError(f"--versions takes a comma-separated list of {', '.join(VERSIONS)}; got {text!r}")
    return list(dict.fromkeys(versions))


def main(args: Any) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s", stream=sys.stderr
    )
    try:
        versions = parse_versions(args.versions)
    except ValueError as exc:
        print(f"eventsrc: error: {exc}", file=sys.stderr)
        return 2
    driver = SampleDriver(
        args.root_dir,
        args.driver,
        versions=versions,
        state_file=args.state,
        control_file=args.control_file,
        fail_prepare=[u for u in (args.fail_prepare or "").split(",") if u],
        devices_per_claim=args.devices_per_claim,
        pool=args.pool,
        calls_log=args.calls_log,
    )
    for sock in (driver.reg_socket, driver.dra_socket):
        if len(os.fsencode(sock)) > MAX_SOCKET_PATH:
            print(
                f"eventsrc: error: socket path {sock} is too long for a unix socket (use a shorter --root-dir)",
                file=sys.stderr,
            )
            return 1

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await driver.run(stop)

    asyncio.run(run())
    return 0
