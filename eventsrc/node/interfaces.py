"""The interfaces of the daemon's parts, each method's contract stated once (as the kubelet's
``devicemanager`` Manager interface does).

    Recorder         what the parts need of the daemon: the views, ``record``, the metrics
    Handler          a consumer of the plugin watcher (the DRA manager; the device manager's
                     plugins_registry handler)
    PluginEndpoint   one registered device plugin, as admission calls it
    DevicePlugins    the device manager (eventsrc.node.device_manager.DeviceManager)
    ClaimDrivers     the DRA manager (eventsrc.node.dra_manager.DRAManager)

Admission, as the node API uses it, is ``eventsrc.api.node.Admitter``. Each part is handed
these, never the daemon: ``eventsrc.node.daemon`` is the one module that knows every part
and wires them together, and no part imports it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

import trio

from eventsrc import events as ev
from eventsrc.errors import EventsrcError
from eventsrc.events import Record
from eventsrc.gen.deviceplugin.v1beta1 import api_pb2 as pb
from eventsrc.obs.logger import get_logger
from eventsrc.obs.metrics import Metrics
from eventsrc.state.views import Views

D = TypeVar("D")  # a DRA manager's connection to one driver: handed out, then handed back


class Recorder(Protocol):
    """The log and the views, as the parts use them."""

    @property
    def views(self) -> Views:
        """The views after every record appended so far. The same object for the daemon's
        life: it is changed in place as records are applied."""
        ...

    @property
    def metrics(self) -> Metrics:
        """Where the parts count and time what they do."""
        ...

    async def record(self, events: Sequence[ev.EventBase], correlation_id: str | None = None) -> list[Record]:
        """Append ``events`` as one unit, durably; they are in ``views`` when this returns.
        Without ``correlation_id`` the records carry the current request's."""
        ...

    async def observe(self, observed: Callable[[], Sequence[ev.EventBase]]) -> list[Record]:
        """Record an observation, what already happened and nothing waits for: ``observed()``
        gives its events from ``views`` at its turn; they are in ``views`` when this returns,
        and in the log with the next decision or within a bounded delay (docs/adr/0042)."""
        ...


log = get_logger(__name__)


async def record_or_log(
    recorder: Recorder, events: Sequence[ev.EventBase], what: str, correlation_id: str | None = None
) -> list[Record] | None:
    """For the daemon's own background work, where no caller waits for the answer: append
    ``events``; an append that fails (a full disk, a log deleted under the daemon) is logged and
    None returned, so the task goes on and the daemon stays up, refusing what needs the log and
    failing /healthz, instead of ending on an exception nobody catches."""
    return await _or_log(recorder.record(events, correlation_id), what)


async def observe_or_log(
    recorder: Recorder, observed: Callable[[], Sequence[ev.EventBase]], what: str
) -> list[Record] | None:
    """``record_or_log`` for an observation: one that cannot be recorded is logged (the
    runtime's next Synchronize finds what it missed), and None returned."""
    return await _or_log(recorder.observe(observed), what)


async def _or_log(recording: Awaitable[list[Record]], what: str) -> list[Record] | None:
    try:
        return await recording
    except EventsrcError as exc:
        log.warning("recording failed", what=what, reason=str(exc))
        return None


class Handler(Protocol):
    """What a plugin consumer provides (the kubelet's ``cache.PluginHandler``).

    ``validate`` and ``register`` refuse a plugin by raising; the exception's text is the
    reason the plugin is told. ``endpoint`` is the plugin's service socket (the registration
    socket when ``PluginInfo.endpoint`` is empty); ``socket_path`` is the registration socket.
    """

    async def validate(self, name: str, endpoint: str, versions: list[str]) -> None: ...

    async def register(self, name: str, endpoint: str, versions: list[str], socket_path: Path) -> None: ...

    async def deregister(self, name: str, endpoint: str, socket_path: Path) -> None: ...


class PluginEndpoint(Protocol):
    """One registered device plugin. Each call has a deadline; a failed call raises one of
    ``eventsrc.rpc.bridge.CALL_ERRORS`` or ``PluginCallFailed``. No call is ever sent twice."""

    @property
    def options(self) -> ev.PluginOptions:
        """What the plugin said at registration (GetDevicePluginOptions)."""
        ...

    async def allocate(self, device_ids: list[str], timeout: float | None) -> pb.ContainerAllocateResponse:
        """Allocate ``device_ids`` for one container; the plugin's answer, checked against the
        daemon's limits (an answer over them raises PluginCallFailed)."""
        ...

    async def preferred(self, available: list[str], must_include: list[str], size: int) -> list[str]:
        """GetPreferredAllocation: the ``size`` devices the plugin prefers among ``available``,
        ``must_include`` among them (as the plugin answers: unchecked)."""
        ...

    async def pre_start(self, device_ids: list[str]) -> None:
        """PreStartContainer for the devices a container was allocated."""
        ...


class DevicePlugins(Protocol):
    """The device manager: the Registration server, one ListAndWatch stream per plugin, and
    the recording of what the plugins list. It records PluginRegistered,
    PluginRegistrationRejected, Devices*, PluginDisconnected and ResourceDropped itself."""

    @property
    def socket(self) -> Path:
        """The Registration socket (``device-plugins/kubelet.sock``)."""
        ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve Registration and run every plugin's stream until cancelled; started once the
        socket is served. Stale sockets in the directory are removed first (plugins notice
        and register again); resources whose plugins are away are dropped after the grace."""
        ...

    def listed(self, resource: str) -> PluginEndpoint | None:
        """The plugin of ``resource`` once it has listed its devices since it registered;
        None when it has not, or when no plugin of ``resource`` is connected. Never waits."""
        ...

    async def wait_listed(self, resource: str, timeout: float) -> PluginEndpoint | None:
        """``listed(resource)``, waiting up to ``timeout`` seconds while the resource is known
        to the views but its plugin is away or has not listed yet (after a restart, say).
        None at once when the resource is unknown, or when the time is up."""
        ...


class ClaimDrivers(Handler, Protocol[D]):
    """The DRA manager: the drivers registered through plugins_registry (as their ``Handler``),
    and the claim work that goes with them. It records the drivers' registrations and, in its
    reconcile loop, the unfinished claim work (prepares after a restart, every unprepare)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Finish claim work until cancelled: at once when kicked, else retried with backoff."""
        ...

    def connected(self, driver: str) -> D | None:
        """The connection to ``driver`` if it is registered now. Never waits."""
        ...

    async def wait_driver(self, driver: str, timeout: float) -> D | None:
        """``connected(driver)``, waiting up to ``timeout`` seconds for it to register."""
        ...

    async def prepare(self, client: D, claims: tuple[ev.ClaimRef, ...]) -> list[ev.EventBase]:
        """NodePrepareResources of ``claims`` with ``client``: one ClaimPrepared or
        ClaimPrepareFailed per claim, not recorded (the caller records them). Never raises for
        a driver's failure. Calls to drivers are made one at a time, in the order asked."""
        ...

    def kick(self) -> None:
        """Look for unfinished claim work now (claims released, prepares that failed)."""
        ...
