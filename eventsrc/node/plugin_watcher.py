"""The kubelet's plugin watcher: sockets in ``ROOT/plugins_registry/`` register plugins.

    PluginWatcher.run
      └─ at once on an inotify event in the tree (or after an operation ends, at a failed
         plugin's retry time, every 30 s besides): scan, then reconcile
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

- **inotify says when, the scan says what.** Every directory of the tree is watched with
  inotify (``inotify_simple``, read when trio says its fd is readable; docs/adr/0016), as
  the kubelet watches with fsnotify; any event (a name created, deleted, moved, its
  attributes or a written file closed, an overflowed queue) starts a scan of the whole tree,
  and the scan alone decides what is registered: events are never interpreted, so none can
  be lost or misread (the events of a burst are read together: at most 20 scans a second
  for them). A directory is watched before it is listed, so a socket created in a
  new directory right after it is seen by the scan or raises an event. The tree is also
  rescanned every 30 s, in case. Where inotify cannot be had (not Linux, no instance or
  watch left: ``fs.inotify.max_user_instances``, ``max_user_watches``), the watcher says
  so in a warning and polls every 0.5 s as it did before (a directory it cannot watch, the
  registry itself missing, makes it poll too). A socket that appears and disappears
  between two scans is never seen (it was never usable anyway).
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

import contextlib
import errno
import math
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import trio

try:
    import inotify_simple
except ImportError:  # not Linux (termios, fcntl): the watcher polls
    inotify_simple = None

from eventsrc.core.backoff import delay
from eventsrc.errors import EventsrcError
from eventsrc.gen.pluginregistration.v1 import api_pb2 as pb
from eventsrc.gen.pluginregistration.v1.api_grpc import RegistrationStub
from eventsrc.log.commit import new_correlation_id
from eventsrc.node.interfaces import Handler
from eventsrc.obs.logger import correlation, get_logger
from eventsrc.rpc.bridge import CALL_ERRORS, to_aio, unix_channel, why

log = get_logger(__name__)

#: Plugin types (pkg/apis/pluginregistration/v1/constants.go).
CSI_PLUGIN = "CSIPlugin"
DEVICE_PLUGIN = "DevicePlugin"
DRA_PLUGIN = "DRAPlugin"

SCAN_PERIOD = 0.5  # without inotify (or with a directory it cannot watch)
RESCAN_PERIOD = 30.0  # with inotify: a scan in case, no event having asked for one
EVENT_SCAN_INTERVAL = 0.05  # events are read at most 20 times a second: a flood of them costs no more scans
OVERFLOW_WARNING_INTERVAL = 60.0
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


def scan(directory: Path, on_directory: Callable[[Path], None] | None = None) -> dict[Path, SocketKey]:
    """Every unix socket under ``directory`` whose path has no component starting with ".".
    ``on_directory`` is called with each directory walked into, before it is listed."""
    found: dict[Path, SocketKey] = {}
    pending = [directory]
    while pending:
        d = pending.pop()
        if on_directory is not None:
            on_directory(d)
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


class _Watches:
    """The tree's directories watched with inotify: which only tells the watcher when to scan.

    Each scan calls ``watch`` for every directory it walks into (adding a watch is idempotent)
    between ``begin`` and ``end``; ``end`` drops the watches of directories the scan no
    longer walked into (renamed out of the tree, or to a dot name; a deleted directory's
    watch is gone already). ``blind`` says a directory could not be watched: poll meanwhile.
    """

    def __init__(self, root: Path) -> None:
        assert inotify_simple is not None
        f = inotify_simple.flags
        self.root = root
        self._inotify = inotify_simple.INotify(nonblocking=True)
        self._mask = (
            f.CREATE | f.DELETE | f.MOVED_FROM | f.MOVED_TO | f.ATTRIB | f.CLOSE_WRITE | f.DELETE_SELF | f.MOVE_SELF
        ) | f.ONLYDIR
        self._nofollow = f.DONT_FOLLOW  # not for the root: a symbolic link to it is followed, as by the scan
        self._overflow = f.Q_OVERFLOW
        self._wds: set[int] = set()
        self._walked: set[int] = set()
        self._unwatched: tuple[Path, str] | None = None  # a directory of this scan not watched, and why
        self.blind = False
        self.broken = False  # reading failed: polls from then on

    def begin(self) -> None:
        self._walked, self._unwatched = set(), None

    def watch(self, directory: Path) -> None:
        root = directory == self.root
        try:
            wd = self._inotify.add_watch(directory, self._mask | (0 if root else self._nofollow))
        except OSError as exc:
            if not root and exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return  # gone (or no longer a directory) meanwhile: its listing fails too, and is ignored
            if self._unwatched is None:
                self._unwatched = (directory, exc.strerror or str(exc))
            return
        self._walked.add(wd)

    def end(self) -> None:
        for wd in self._wds - self._walked:
            with contextlib.suppress(OSError):  # removed by the kernel already (its directory was deleted)
                self._inotify.rm_watch(wd)
        self._wds = self._walked
        blind = self.broken or self._unwatched is not None
        if blind and not self.blind and self._unwatched is not None:
            where, why = self._unwatched
            log.warning("cannot watch a plugin directory; polling", directory=where, reason=why, period=SCAN_PERIOD)
        elif self.blind and not blind:
            log.info("every plugin directory watched again")
        self.blind = blind

    async def wait(self) -> bool:
        """Until events come; returns whether the kernel's queue overflowed."""
        await trio.lowlevel.wait_readable(self._inotify.fd)
        return any(e.mask & self._overflow for e in self._inotify.read(timeout=0))

    async def aclose(self) -> None:
        """Close the inotify instance in a thread: the kernel waits for its watches' readers
        to finish (synchronize_srcu), about 10 ms, which would hold the loop."""
        trio.lowlevel.notify_closing(self._inotify.fd)
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self._inotify.close)


def _open_watches(root: Path) -> _Watches | None:
    """The watches on ``root``'s tree, or None (with a warning) where inotify cannot be had."""
    if inotify_simple is None:
        reason = "inotify_simple cannot be imported on this platform"
    else:
        try:
            return _Watches(root)
        except (OSError, AttributeError) as exc:  # EMFILE: fs.inotify.max_user_instances; no inotify_init1
            reason = getattr(exc, "strerror", None) or str(exc)
    log.warning("inotify unavailable; polling the plugin registry", directory=root, reason=reason, period=SCAN_PERIOD)
    return None


class PluginWatcher:
    """Registers the plugins whose sockets appear under ``directory`` with ``handlers``
    (keyed by ``PluginInfo.type``), and deregisters them when their sockets go.

    Must run inside ``trio_asyncio.open_loop()`` (grpclib is asyncio).

    ``period`` is how often the tree is scanned with nothing asking for it: by default
    ``RESCAN_PERIOD`` with inotify, ``SCAN_PERIOD`` when polling.
    """

    def __init__(self, directory: Path, handlers: Mapping[str, Handler], *, period: float | None = None) -> None:
        self.directory = directory
        self.handlers = dict(handlers)
        self.period = period
        self._slots: dict[Path, _Slot] = {}
        self._wake = trio.Event()
        self._retry_at = math.inf  # the earliest retry of a failed registration not yet started
        self._watches: _Watches | None = None
        self.scans = 0  # directory scans reconciled so far: a test waits for the next ones
        self.inotify = False  # set by run: whether inotify tells the watcher when to scan

    @property
    def plugins(self) -> dict[Path, RegisteredPlugin]:
        """The plugins registered now, by registration socket."""
        return {p: s.registered for p, s in self._slots.items() if s.registered is not None}

    def rescan(self) -> None:
        """Scan now (whoever knows that the tree changed; a test)."""
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._watches = watches = _open_watches(self.directory)
        self.inotify = watches is not None
        period = self.period if self.period is not None else RESCAN_PERIOD if watches else SCAN_PERIOD
        try:
            async with trio.open_nursery() as nursery:
                self._reconcile(nursery)  # watches the tree before reading its events
                if watches is not None:
                    nursery.start_soon(self._read_events, watches)
                task_status.started()
                while True:
                    wait = min(period, SCAN_PERIOD) if watches is None or watches.blind else period
                    with trio.move_on_at(min(trio.current_time() + wait, self._retry_at)):
                        await self._wake.wait()
                    self._wake = trio.Event()
                    self._reconcile(nursery)
        finally:
            self._watches = None
            if watches is not None:
                await watches.aclose()

    async def _read_events(self, watches: _Watches) -> None:
        """Ask for a scan whenever events come, once they are read (the scan starts after, so it
        sees at least what they announced); what they say is not looked at. After a read, the
        next waits ``EVENT_SCAN_INTERVAL``: the events of a burst are read together."""
        warned = -math.inf
        while True:
            try:
                overflowed = await watches.wait()
            except OSError:
                log.exception("cannot read inotify events; polling", directory=self.directory, period=SCAN_PERIOD)
                watches.broken = watches.blind = True
                self._wake.set()
                return
            if overflowed and trio.current_time() - warned >= OVERFLOW_WARNING_INTERVAL:
                log.warning("inotify queue overflowed; rescanning", directory=self.directory)
                warned = trio.current_time()
            self._wake.set()
            await trio.sleep(EVENT_SCAN_INTERVAL)

    # ------------------------------------------------------------------ reconciling

    def _reconcile(self, nursery: trio.Nursery) -> None:
        watches = self._watches
        try:
            if watches is not None:
                watches.begin()
            found = scan(self.directory, None if watches is None else watches.watch)
            if watches is not None:
                watches.end()
        except Exception:  # never let a scan take the watcher down
            log.exception("cannot scan the plugin registry", directory=self.directory)
            return
        now = trio.current_time()
        self._retry_at = math.inf
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
                else:
                    self._retry_at = min(self._retry_at, slot.retry_at)
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
            slot.retry_at = trio.current_time() + delay(slot.failures, INITIAL_BACKOFF, MAX_BACKOFF)
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
