"""The kubelet's plugin watcher: sockets in ``ROOT/plugins_registry/`` register plugins.

    PluginWatcher.run
      └─ every 0.5 s (or at once after an operation ends): scan, then reconcile
           ├─ a new (or re-created) socket → register: GetInfo, handler, validate, register, notify
           └─ a socket gone (or re-created) → deregister the plugin registered from it

A plugin serves ``pluginregistration.Registration`` on a unix socket that it creates in the
registry directory (or a subdirectory of it). The sequence is the kubelet's
(``pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go``): ``GetInfo`` (1 s),
the handler for ``PluginInfo.type`` (none: the plugin is told so), an empty endpoint means the
registration socket itself, ``validate``, ``register``, then ``NotifyRegistrationStatus``
(5 s) with true, or with false and the kubelet's message when a step refused the plugin.
The watcher is generic: the DRA manager and the device manager provide ``Handler`` s keyed by
plugin type (``"DRAPlugin"``, ``"DevicePlugin"``).

Where this differs from the kubelet, and why:

- **Polling, not inotify.** The directory tree is scanned every ``period`` (0.5 s); no
  fsnotify dependency, and nothing is lost when events would overflow. A socket that appears
  and disappears between two scans is never seen (it was never usable anyway).
- **Re-creation** is a new ``(st_dev, st_ino, st_mtime_ns)``: ``bind`` sets the socket's
  mtime, while ``chmod``/``chown`` (which plugins do right after ``bind``) change only its
  ctime, which would look like a re-creation. A re-created socket deregisters the old plugin,
  then registers the new one, as the kubelet's reconciler does.
- **Names starting with "."** are ignored, for directories too (the kubelet ignores a dot
  directory created while it runs, but walks into one that existed at its start).
  Symbolic links are not followed.
- **Failures are retried** with the kubelet's exponential backoff (0.5 s doubling to
  2 min 2 s), as its reconciler does for a plugin that is not in its actual state. The
  kubelet keeps a plugin whose ``RegisterPlugin`` failed in its actual state (so it is not
  retried, and is deregistered when its socket goes); here it is retried like the others,
  and only a plugin whose ``register`` succeeded is ever deregistered.
- **Dial and GetInfo share the 1 s budget** (grpclib connects on the first call; connecting
  to a unix socket does not wait).

Errors never escape: a plugin (or a handler) that fails, hangs or lies is logged and
rejected, and the watcher keeps serving every other socket. One operation at a time runs
per socket path; different sockets are handled concurrently.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

from eventsrc.errors import EventsrcError
from eventsrc.gen.pluginregistration.v1 import api_pb2 as pb
from eventsrc.gen.pluginregistration.v1.api_grpc import RegistrationStub
from eventsrc.log.commit import new_correlation_id
from eventsrc.node.interfaces import Handler
from eventsrc.obs.logger import correlation, get_logger
from eventsrc.rpc.bridge import CALL_ERRORS, to_aio, unix_channel, why

log = get_logger("eventsrc.plugins")

#: Plugin types (pkg/apis/pluginregistration/v1/constants.go).
CSI_PLUGIN = "CSIPlugin"
DEVICE_PLUGIN = "DevicePlugin"
DRA_PLUGIN = "DRAPlugin"

SCAN_PERIOD = 0.5
GET_INFO_TIMEOUT = 1.0  # operation_generator.go: context.WithTimeout(..., time.Second)
NOTIFY_TIMEOUT = 5.0  # notifyTimeoutDuration
# goroutinemap/exponentialbackoff: initialDurationBeforeRetry, maxDurationBeforeRetry
INITIAL_BACKOFF = 0.5
MAX_BACKOFF = 122.0


# The kubelet's messages (operation_generator.go), sent in RegistrationStatus.error.
def no_handler_message(plugin_type: str, socket_path: Path | str) -> str:
    return f"RegisterPlugin error -- no handler registered for plugin type: {plugin_type} at socket {socket_path}"


def validation_failed_message(err: object) -> str:
    return f"RegisterPlugin error -- plugin validation failed with err: {err}"


def registration_failed_message(err: object) -> str:
    return f"RegisterPlugin error -- plugin registration failed with err: {err}"


SocketKey = tuple[int, int, int]  # st_dev, st_ino, st_mtime_ns: a new value means a new socket


@dataclass(frozen=True)
class RegisteredPlugin:
    socket_path: Path
    key: SocketKey
    type: str
    name: str
    endpoint: str
    versions: tuple[str, ...]
    handler: Handler


@dataclass(eq=False)
class _Slot:
    """What the watcher knows about one socket path."""

    path: Path
    registered: RegisteredPlugin | None = None
    busy: bool = False  # an operation runs for this path
    attempt_key: SocketKey | None = None  # the socket the failed attempts were for
    failures: int = 0
    retry_at: float = 0.0


def scan(directory: Path) -> dict[Path, SocketKey]:
    """Every unix socket under ``directory`` whose path has no component starting with "."."""
    found: dict[Path, SocketKey] = {}
    pending = [directory]
    while pending:
        d = pending.pop()
        try:
            with os.scandir(d) as it:
                entries = list(it)
        except OSError:
            continue  # gone or unreadable: as the kubelet, ignore everything but the root
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                pending.append(Path(entry.path))
            elif stat.S_ISSOCK(st.st_mode):
                found[Path(entry.path)] = (st.st_dev, st.st_ino, st.st_mtime_ns)
    return found


class PluginWatcher:
    """Registers the plugins whose sockets appear under ``directory`` with ``handlers``
    (keyed by ``PluginInfo.type``), and deregisters them when their sockets go.

    Must run inside ``trio_asyncio.open_loop()`` (grpclib is asyncio).
    """

    def __init__(self, directory: Path, handlers: Mapping[str, Handler], *, period: float = SCAN_PERIOD) -> None:
        self.directory = directory
        self.handlers = dict(handlers)
        self.period = period
        self._slots: dict[Path, _Slot] = {}
        self._wake = trio.Event()
        self.scans = 0  # directory scans reconciled so far: a test waits for the next ones

    @property
    def plugins(self) -> dict[Path, RegisteredPlugin]:
        """The plugins registered now, by registration socket."""
        return {p: s.registered for p, s in self._slots.items() if s.registered is not None}

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        async with trio.open_nursery() as nursery:
            self._reconcile(nursery)
            task_status.started()
            while True:
                with trio.move_on_after(self.period):
                    await self._wake.wait()
                self._wake = trio.Event()
                self._reconcile(nursery)

    # ------------------------------------------------------------------ reconciling

    def _reconcile(self, nursery: trio.Nursery) -> None:
        try:
            found = scan(self.directory)
        except Exception:  # never let a scan take the watcher down
            log.exception("cannot scan the plugin registry", directory=self.directory)
            return
        now = trio.current_time()
        for path in found.keys() - self._slots.keys():
            self._slots[path] = _Slot(path)
        for path, slot in list(self._slots.items()):
            if slot.busy:
                continue
            key = found.get(path)
            if slot.registered is not None and slot.registered.key != key:
                slot.busy = True
                nursery.start_soon(self._deregister, slot)
            elif slot.registered is None and key is None:
                del self._slots[path]
            elif slot.registered is None and key is not None:
                if slot.attempt_key != key:  # a new socket: no backoff from an older one
                    slot.attempt_key, slot.failures, slot.retry_at = key, 0, 0.0
                if now >= slot.retry_at:
                    slot.busy = True
                    nursery.start_soon(self._register, slot, key)
        self.scans += 1

    def _done(self, slot: _Slot) -> None:
        slot.busy = False
        self._wake.set()

    # ------------------------------------------------------------------ operations

    async def _register(self, slot: _Slot, key: SocketKey) -> None:
        try:
            with correlation(new_correlation_id()):  # the plugin's records and lines share it
                plugin = await self._register_plugin(slot.path, key)
        except Exception:  # a bug in a handler or here: the plugin is refused, the watcher lives
            log.exception("plugin registration failed", socket=slot.path)
            plugin = None
        if plugin is None:
            slot.failures += 1
            backoff = min(INITIAL_BACKOFF * 2 ** (slot.failures - 1), MAX_BACKOFF)
            slot.retry_at = trio.current_time() + backoff
        else:
            slot.registered = plugin
            slot.failures = 0
        self._done(slot)

    async def _register_plugin(self, path: Path, key: SocketKey) -> RegisteredPlugin | None:
        """The kubelet's GenerateRegisterPluginFunc. Returns None when the plugin was refused."""
        channel = unix_channel(str(path))
        try:
            stub = RegistrationStub(channel)
            try:
                with trio.fail_after(GET_INFO_TIMEOUT):
                    info = await to_aio(stub.GetInfo)(pb.InfoRequest(), timeout=GET_INFO_TIMEOUT)
            except CALL_ERRORS as exc:
                log.warning("plugin rejected", socket=path, reason=f"GetInfo failed: {why(exc)}")
                return None
            versions = list(info.supported_versions)
            handler = self.handlers.get(info.type)
            if handler is None:
                reason = no_handler_message(info.type, path)
                await self._notify(stub, path, False, reason)
                log.warning("plugin rejected", socket=path, type=info.type, name=info.name, reason=reason)
                return None
            endpoint = info.endpoint or str(path.absolute())
            try:
                await handler.validate(info.name, endpoint, versions)
            except Exception as exc:
                reason = validation_failed_message(exc)
                await self._notify(stub, path, False, reason)
                log.warning("plugin rejected", socket=path, type=info.type, name=info.name, reason=reason)
                return None
            try:
                await handler.register(info.name, endpoint, versions, path)
            except Exception as exc:
                reason = registration_failed_message(exc)
                await self._notify(stub, path, False, reason)
                log.warning("plugin rejected", socket=path, type=info.type, name=info.name, reason=reason)
                return None
            plugin = RegisteredPlugin(path, key, info.type, info.name, endpoint, tuple(versions), handler)
            log.info(
                "plugin registered", socket=path, type=info.type, name=info.name, endpoint=endpoint, versions=versions
            )
            # Notified after register, as the kubelet does: a failed notify leaves it registered.
            await self._notify(stub, path, True, "")
            return plugin
        finally:
            channel.close()

    async def _notify(self, stub: RegistrationStub, path: Path, registered: bool, error: str) -> None:
        try:
            with trio.fail_after(NOTIFY_TIMEOUT):
                await to_aio(stub.NotifyRegistrationStatus)(
                    pb.RegistrationStatus(plugin_registered=registered, error=error), timeout=NOTIFY_TIMEOUT
                )
        except CALL_ERRORS as exc:
            log.warning("NotifyRegistrationStatus failed", socket=path, registered=registered, reason=why(exc))

    async def _deregister(self, slot: _Slot) -> None:
        plugin = slot.registered
        assert plugin is not None
        slot.registered = None  # gone from the actual state first, as the kubelet does
        with correlation(new_correlation_id()):
            try:
                await plugin.handler.deregister(plugin.name, plugin.endpoint, plugin.socket_path)
            except EventsrcError as err:  # the log closed under it (the daemon stops)
                log.warning(
                    "plugin deregistration failed", socket=plugin.socket_path, name=plugin.name, reason=str(err)
                )
            except Exception:
                log.exception("plugin deregistration failed", socket=plugin.socket_path, name=plugin.name)
            log.info(
                "plugin removed",
                socket=plugin.socket_path,
                type=plugin.type,
                name=plugin.name,
                endpoint=plugin.endpoint,
            )
        self._done(slot)
