"""Edge to device plugins: the v1beta1 Registration server and one endpoint per plugin.

    DeviceManager.run
      ├─ serve_unix(Registration) on ROOT/device-plugins/kubelet.sock
      ├─ Endpoint tasks, one per registered plugin:
      │    ├─ ListAndWatch: each list checked against the limits, its flaps counted, kept
      │    │  as the newest
      │    └─ recorder: records what the newest list changed, at most LIST_RATE a second,
      │       and again when a held health change's window ends (core.devices.flaps)
      └─ grace timers: a resource whose plugin stays away is dropped after ``grace``

Decisions (what a device list changed, which devices to give) live in eventsrc.core;
this module dials, streams and records. What a plugin may send is bounded here (the
kubelet bounds none of it); docs/security.md gives the reasons.
"""

from __future__ import annotations

import math
import stat
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import trio
from grpclib import GRPCError, Status
from grpclib.client import Channel
from grpclib.server import Stream

from eventsrc import events as ev
from eventsrc.core.devices.flaps import FLAP_WINDOW, Decision, HealthThrottle
from eventsrc.core.devices.holds import DEVICES_PER_RECORD, DeviceList, check_device_list, list_and_watch_events
from eventsrc.core.devices.names import endpoint_error, registration_error
from eventsrc.errors import EventsrcError
from eventsrc.gen.deviceplugin.v1beta1 import api_pb2 as pb
from eventsrc.gen.deviceplugin.v1beta1.api_grpc import DevicePluginStub, RegistrationBase
from eventsrc.log.commit import new_correlation_id
from eventsrc.node.interfaces import Recorder, record_or_log
from eventsrc.obs.logger import correlation, current_correlation_id, get_logger
from eventsrc.rpc.bridge import (
    CALL_ERRORS,
    endpoint_socket_error,
    serve_unix,
    to_aio,
    to_trio,
    unix_channel,
    why,
)
from eventsrc.rpc.ratelimit import TokenBucket
from eventsrc.state.views import DeviceView

log = get_logger(__name__)
T = TypeVar("T")

DIAL_TIMEOUT = 10.0
PREFERRED_TIMEOUT = 10.0  # GetPreferredAllocation (the kubelet waits for ever, under its lock)
PRE_START_TIMEOUT = 30.0  # KubeletPreStartContainerRPCTimeoutInSecs
DEFAULT_GRACE = 300.0  # endpointStopGracePeriod
# kubelet.sock: the mode the kubelet's net.Listen gets under the usual umask 022 (only its
# owner may connect: connect(2) needs write permission), whatever this process's umask.
SOCKET_MODE = 0o755

# What a plugin may send.
MAX_RESOURCES = 256  # resource names known at once; a new one beyond is refused
MAX_DEVICES = 10_000  # devices in one ListAndWatch list (the whole of a resource)
MAX_ID_BYTES = 1024  # a device ID or health string (the API asks for IDs of at most 63)
MAX_NUMA_NODES = 64  # NUMA nodes of one device
MAX_ENV_BYTES = 128 * 1024  # one "KEY=value" of an Allocate answer: execve's MAX_ARG_STRLEN
MAX_ALLOCATION_BYTES = 1024 * 1024  # one container's Allocate answer, encoded
# ListAndWatch lists recorded per second and plugin, after a burst. Lists that come faster
# are coalesced: each replaces the whole previous one, so recording the newest loses no state.
LIST_RATE = 10.0
LIST_BURST = 20
# Register calls per second, all plugins together, after a burst (each is recorded, taken or not).
REGISTER_RATE = 10.0
REGISTER_BURST = 32
# A Register request longer than this cannot be valid (a resource name has at most 317 bytes,
# an endpoint 107); it is refused unrecorded, so that no caller can write big records.
MAX_REGISTER_BYTES = 4096


class RegistrationRejected(EventsrcError):
    pass


class PluginCallFailed(EventsrcError):
    pass


class PluginCutOff(EventsrcError):
    """A plugin sent what the daemon does not take; its stream is ended (the message says why)."""


@dataclass(eq=False)
class Endpoint:
    resource: str
    endpoint: str  # file name in the device-plugin directory, or an absolute path (plugins_registry)
    path: Path
    channel: Channel
    stub: DevicePluginStub
    options: ev.PluginOptions
    flap_window: float = FLAP_WINDOW
    listed: trio.Event = field(default_factory=trio.Event)  # first ListAndWatch message handled
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)
    # The newest ListAndWatch list, and how many lists arrived since the last recording pass.
    newest: list[ev.DeviceInfo] | None = None
    unrecorded: int = 0
    arrived: trio.Event = field(default_factory=trio.Event)  # a list arrived, or the stream ended
    ended: bool = False
    health: HealthThrottle = field(init=False)  # what of the devices' changes is held, counted
    due: float = math.inf  # when a held change's window ends
    coalesced: int = 0  # lists never recorded, since the last log line saying so
    coalesced_logged: float = -math.inf
    reported: frozenset[str] = frozenset()  # what was wrong with its list, already logged
    # Held while its flap state is changed: a list counted, or compared with the views
    lock: trio.Lock = field(default_factory=trio.Lock)

    def __post_init__(self) -> None:
        self.health = HealthThrottle(self.resource, self.flap_window)

    def close(self) -> None:
        self.channel.close()

    # The calls below go through grpclib on ``channel`` (made by ``unix_channel``: answers
    # over the received-message limit are refused). grpclib sends a request once and never
    # again (Allocate is not idempotent): a connection lost after that fails the call.

    async def allocate(self, device_ids: list[str], timeout: float | None) -> pb.ContainerAllocateResponse:
        req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=device_ids)])
        resp = await to_aio(self.stub.Allocate)(req, timeout=timeout)
        if not resp.container_responses:
            raise PluginCallFailed(f"the {self.resource} plugin's Allocate answer has no container response")
        reason = allocation_error(resp.container_responses[0])
        if reason:
            raise PluginCallFailed(f"the {self.resource} plugin's Allocate answer {reason}")
        return resp.container_responses[0]

    async def preferred(self, available: list[str], must_include: list[str], size: int) -> list[str]:
        req = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size
                )
            ]
        )
        resp = await to_aio(self.stub.GetPreferredAllocation)(req, timeout=PREFERRED_TIMEOUT)
        if not resp.container_responses:
            return []
        return list(resp.container_responses[0].deviceIDs)

    async def pre_start(self, device_ids: list[str]) -> None:
        req = pb.PreStartContainerRequest(devices_ids=device_ids)
        await to_aio(self.stub.PreStartContainer)(req, timeout=PRE_START_TIMEOUT)


def list_and_watch_error(msg: pb.ListAndWatchResponse) -> str:
    """Why a ListAndWatch message cuts its plugin off ("" when it is taken)."""
    if len(msg.devices) > MAX_DEVICES:
        return f"lists {len(msg.devices)} devices; at most {MAX_DEVICES} are taken"
    for d in msg.devices:
        if len(d.ID.encode()) > MAX_ID_BYTES or len(d.health.encode()) > MAX_ID_BYTES:
            return f"lists a device whose ID or health is longer than {MAX_ID_BYTES} bytes (ID {d.ID[:64]!r}...)"
        if len(d.topology.nodes) > MAX_NUMA_NODES:
            return f"gives device {d.ID!r} {len(d.topology.nodes)} NUMA nodes; at most {MAX_NUMA_NODES} are taken"
    return ""


def allocation_error(r: pb.ContainerAllocateResponse) -> str:
    """Why an Allocate answer is refused ("" when it is taken as it is: envs, mounts,
    device nodes and annotations are passed on unchecked, as the kubelet does)."""
    size = r.ByteSize()
    if size > MAX_ALLOCATION_BYTES:
        return f"is {size} bytes long; at most {MAX_ALLOCATION_BYTES} are taken"
    for key, value in r.envs.items():
        n = len(key.encode()) + 1 + len(value.encode())
        if n > MAX_ENV_BYTES:
            return f"sets {key[:64]!r} to {n} bytes; at most {MAX_ENV_BYTES} can reach a process (execve's limit)"
    return ""


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
        # Every Register is recorded (PluginRegistered or PluginRegistrationRejected): a
        # process calling it in a loop must not fill the log.
        self._limiter = TokenBucket(REGISTER_RATE, REGISTER_BURST)
        self._limited = 0
        self._limited_logged = -math.inf

    def _rate_limited(self) -> GRPCError:
        self._limited += 1
        now = time.monotonic()
        if now - self._limited_logged >= 10.0:
            log.warning(
                "registrations refused by the rate limit, not recorded",
                count=self._limited,
                rate_per_second=REGISTER_RATE,
                burst=REGISTER_BURST,
            )
            self._limited, self._limited_logged = 0, now
        return GRPCError(Status.RESOURCE_EXHAUSTED, "rejected by rate limit")

    async def Register(self, stream: Stream[pb.RegisterRequest, pb.Empty]) -> None:
        req = await stream.recv_message()
        assert req is not None
        if not self._limiter.allow():
            raise self._rate_limited()
        size = req.ByteSize()
        if size > MAX_REGISTER_BYTES:
            log.warning("registration refused, not recorded", request_bytes=size, max_bytes=MAX_REGISTER_BYTES)
            raise GRPCError(
                Status.UNKNOWN, f"the registration request is {size} bytes long; at most {MAX_REGISTER_BYTES} are taken"
            )
        try:
            await to_trio(self._manager.register)(req.version, req.resource_name, req.endpoint)
        except RegistrationRejected as err:
            # The kubelet returns a plain Go error: gRPC code Unknown with the message.
            raise GRPCError(Status.UNKNOWN, str(err)) from None
        await stream.send_message(pb.Empty())


#: A ListAndWatch list of more devices than this is taken and compared in a worker thread:
#: at 10,000 devices each pass over it (converting, counting flaps, checking, comparing with
#: the views) took 5-13 ms, about 40 ms in all, which the daemon's loop would wait for.
INLINE_DEVICES = 1_000


async def _off_loop(devices: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``: at once for a list of at most ``INLINE_DEVICES`` devices, else in a
    worker thread, so that the loop answers others meanwhile (the thread holds the GIL at
    most ``sys.getswitchinterval()`` at a time). The caller holds the endpoint's lock:
    nothing else touches its flap state meanwhile."""
    if devices <= INLINE_DEVICES:
        return fn(*args)
    return await trio.to_thread.run_sync(fn, *args)


def list_appends(events: list[ev.EventBase]) -> Iterator[list[ev.EventBase]]:
    """A list pass's events as the appends to record them in, in order: each ``DevicesAdded``
    or ``DevicesRemoved`` (at most ``DEVICES_PER_RECORD`` devices) an append of its own, and
    the others ``DEVICES_PER_RECORD`` to an append. The daemon applies an append in one step
    (``log.commit``): a plugin's first list of 10,000 devices is 20 appends of a few ms each,
    not one of 76 ms. Each device's change is whole in its append; a crash between two leaves
    the list partly recorded, as if the plugin had sent it in parts, and the plugin lists it
    again when it registers."""
    group: list[ev.EventBase] = []
    for e in events:
        if isinstance(e, (ev.DevicesAdded, ev.DevicesRemoved)):
            if group:
                yield group
                group = []
            yield [e]
        else:
            group.append(e)
            if len(group) == DEVICES_PER_RECORD:
                yield group
                group = []
    if group:
        yield group


def _take_list(ep: Endpoint, msg: pb.ListAndWatchResponse) -> tuple[str, list[ev.DeviceInfo] | None]:
    """Why ``msg`` cuts its plugin off, or ("", its devices), its flaps counted."""
    reason = list_and_watch_error(msg)
    if reason:
        return reason, None
    # Kept until the next list: its repeated parts (the health, the NUMA nodes) shared
    numa: dict[tuple[int, ...], list[int]] = {}
    newest = [
        ev.DeviceInfo(
            id=d.ID,
            health=sys.intern(d.health),
            numa_nodes=numa.setdefault(nodes := tuple(n.ID for n in d.topology.nodes), list(nodes)),
        )
        for d in msg.devices
    ]
    ep.health.listed(newest)
    return "", newest


def _list_changes(
    ep: Endpoint,
    listed: dict[str, DeviceView],
    newest: list[ev.DeviceInfo],
    machine: Sequence[int],
    now: float,
    final: bool,
) -> tuple[DeviceList, Decision]:
    """What is wrong with the newest list, and what of its changes against ``listed`` (the
    recorded devices it still lists) to record now (the pure core's ``list_and_watch_events``
    and the flap throttle's decision)."""
    checked = check_device_list(newest, machine)
    changed = list_and_watch_events(ep.resource, listed, newest, machine)
    return checked, ep.health.decide(changed, listed, now, final=final)


#: Lines a plugin's list gets per kind of fault (refused, listed twice, on NUMA nodes the
#: machine lacks), then one line with how many more: 10,000 devices on a node this machine
#: does not have took 130 ms of the loop as a line each.
LOGGED_PER_KIND = 32


def _log_checked(ep: Endpoint, checked: DeviceList, machine_numa_nodes: Sequence[int]) -> None:
    """One warning per thing wrong with a plugin's list, when it first shows (a plugin that
    sends the same list ten times a second is told once); past ``LOGGED_PER_KIND`` of a
    kind, one line says how many more."""
    found: dict[str, tuple[str, dict[str, object]]] = {}

    def kind(message: str, what: str, items: list[tuple[str, dict[str, object]]]) -> None:
        for key, fields in items[:LOGGED_PER_KIND]:
            found[f"{what} {key}"] = (message, fields)
        if len(items) > LOGGED_PER_KIND:
            more = len(items) - LOGGED_PER_KIND
            found[f"{what} +{more}"] = (f"{message}: {more} more devices", {"more": more})

    kind(
        "device refused",
        "refused",
        [(f"{i!r} {why}", {"device": i, "reason": why}) for i, why in checked.refused.items()],
    )
    kind(
        "device listed more than once, the last listing taken",
        "duplicate",
        [(repr(i), {"device": i, "times": n}) for i, n in checked.duplicates.items()],
    )
    kind(
        "device on NUMA nodes this machine does not have, not used for alignment",
        "outside",
        [
            (f"{i!r} {ids}", {"device": i, "numa_ids": ids, "machine_numa_nodes": list(machine_numa_nodes)})
            for i, ids in checked.outside.items()
        ],
    )
    for key in sorted(found.keys() - ep.reported):
        message, fields = found[key]
        log.warning(message, resource=ep.resource, endpoint=ep.endpoint, **fields)
    ep.reported = frozenset(found)


def _log_listed(events: list[ev.EventBase]) -> None:
    """What a plugin's ListAndWatch pass recorded: a line per health change (with the flaps
    the record stands for), past ``LOGGED_PER_KIND`` of them one line with how many more;
    one line for the devices added and one per reason for those removed, however many
    records carry them."""
    added = health = 0
    removed: dict[str, list[str]] = {}
    resource = ""  # one plugin's pass: one resource
    for e in events:
        if isinstance(e, ev.DeviceHealthChanged):
            health, resource = health + 1, e.resource
            if health <= LOGGED_PER_KIND:
                flaps = {"coalesced": e.coalesced} if e.coalesced else {}
                (log.info if e.health == "Healthy" else log.warning)(
                    "device health changed", resource=e.resource, device=e.device_id, health=e.health, **flaps
                )
        elif isinstance(e, ev.DevicesAdded):
            added += len(e.devices)
            resource = e.resource
        elif isinstance(e, ev.DevicesRemoved):
            removed.setdefault(e.reason, []).extend(e.device_ids)
            resource = e.resource
    if health > LOGGED_PER_KIND:
        log.warning("device health changed: more devices", resource=resource, more=health - LOGGED_PER_KIND)
    if added:
        log.info("devices added", resource=resource, count=added)
    for reason, ids in removed.items():
        shown = {"more": len(ids) - LOGGED_PER_KIND} if len(ids) > LOGGED_PER_KIND else {}
        log.info("devices removed", resource=resource, devices=ids[:LOGGED_PER_KIND], reason=reason, **shown)


class DeviceManager:
    """The device manager (``eventsrc.node.interfaces.DevicePlugins``): plugins register in
    ``directory`` (its ``kubelet.sock``) and through plugins_registry (``RegistryHandler``)."""

    def __init__(
        self,
        recorder: Recorder,
        directory: Path,
        grace: float = DEFAULT_GRACE,
        machine_numa_nodes: Sequence[int] = (),
        flap_window: float = FLAP_WINDOW,
    ) -> None:
        self.recorder = recorder
        self.directory = directory
        self.flap_window = flap_window  # seconds between two records of a device's health (ADR 0017)
        # NUMA ids a device may be aligned on (the CPU topology's); others are reported.
        self.machine_numa_nodes = list(machine_numa_nodes)
        self.socket = self.directory / "kubelet.sock"
        self.grace = grace
        self.endpoints: dict[str, Endpoint] = {}
        self._changed = trio.Event()  # set whenever an endpoint lists devices or goes away
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        removed = remove_stale_sockets(self.directory)
        if removed:
            log.info("removed stale sockets so that plugins register again", sockets=sorted(removed))
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for plugin in self.recorder.views.devices.plugins.values():
                if not plugin.connected:
                    nursery.start_soon(self._expire, plugin.resource, plugin.disconnected_seq)
            await nursery.start(serve_unix, [RegistrationService(self)], self.socket, SOCKET_MODE)
            task_status.started()
            await trio.sleep_forever()

    # ------------------------------------------------------------------ registration

    async def register(self, version: str, resource: str, endpoint: str, path: Path | None = None) -> None:
        """The kubelet's Register: check, dial, GetDevicePluginOptions, then start streaming.

        Raises RegistrationRejected with the reason; every outcome is an event.
        """
        with correlation(current_correlation_id() or new_correlation_id()):
            await self._register(version, resource, endpoint, path)

    async def _register(self, version: str, resource: str, endpoint: str, path: Path | None) -> None:
        reason = registration_error(version, resource) or (endpoint_error(endpoint) if path is None else "")
        target = path if path is not None else self.directory / endpoint
        # A file name is taken relative to the directory; a path from plugins_registry must be absolute.
        reason = reason or endpoint_socket_error(str(target if path is not None else target.absolute()))
        reason = reason or self._capacity_error(resource)
        if not reason:
            channel = unix_channel(str(target))
            stub = DevicePluginStub(channel)
            try:
                with trio.fail_after(DIAL_TIMEOUT):
                    opts = await to_aio(stub.GetDevicePluginOptions)(pb.Empty(), timeout=DIAL_TIMEOUT)
            except CALL_ERRORS as exc:
                channel.close()
                reason = f"cannot dial the endpoint {target}: {why(exc)}"
        if reason:
            await self.recorder.record(
                [
                    ev.PluginRegistrationRejected(
                        resource=resource, endpoint=endpoint, api_version=version, reason=reason
                    )
                ]
            )
            log.warning("plugin registration rejected", resource=resource, endpoint=endpoint, reason=reason)
            raise RegistrationRejected(reason)
        options = ev.PluginOptions(
            pre_start_required=opts.pre_start_required,
            get_preferred_allocation_available=opts.get_preferred_allocation_available,
        )
        ep = Endpoint(resource, endpoint, target, channel, stub, options, flap_window=self.flap_window)
        old = self.endpoints.get(resource)
        self.endpoints[resource] = ep
        if old is not None:
            old.cancel.cancel()  # the newest registration wins; its list replaces the old one's
        await self.recorder.record(
            [ev.PluginRegistered(resource=resource, endpoint=endpoint, api_version=version, options=options)]
        )
        log.info("plugin registered", resource=resource, endpoint=endpoint, api_version=version)
        assert self._nursery is not None
        self._nursery.start_soon(self._run_endpoint, ep)

    def _capacity_error(self, resource: str) -> str:
        known = self.recorder.views.devices.plugins
        if resource in known or len(known) < MAX_RESOURCES:
            return ""
        return (
            f"{len(known)} resources are known, the most the daemon takes (a plugin of one of them may register again)"
        )

    # ------------------------------------------------------------------ ListAndWatch

    async def _run_endpoint(self, ep: Endpoint) -> None:
        """Stream the plugin's lists until the stream ends, the plugin is cut off, or a newer
        registration cancels ``ep.cancel``; then record what the newest list changed that is
        still held, and the disconnection."""
        reason = "ListAndWatch stream ended"
        recorded = True
        with ep.cancel:
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._record_lists, ep)
                    try:
                        await to_aio(self._list_and_watch)(ep)
                    except PluginCutOff as exc:
                        reason = f"cut off: {exc}"
                        log.warning("plugin cut off", resource=ep.resource, endpoint=ep.endpoint, reason=str(exc))
                    except CALL_ERRORS as exc:
                        reason = f"ListAndWatch failed: {why(exc)}"
                    except Exception as exc:  # a plugin must never take the daemon down
                        log.exception("ListAndWatch failed unexpectedly", resource=ep.resource)
                        reason = f"ListAndWatch failed: {type(exc).__name__}: {exc}"
                    ep.ended = True  # the recorder returns
                    ep.arrived.set()
            except Exception as exc:  # the recorder failed: recording the plugin's list did
                log.exception("recording a ListAndWatch list failed", resource=ep.resource)
                while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
                    exc = exc.exceptions[0]
                reason = f"recording its list failed: {type(exc).__name__}: {exc}"
                recorded = False
        ep.close()
        if self.endpoints.get(ep.resource) is not ep:
            return  # replaced by a newer registration: its list carries the truth, nothing was lost
        if recorded:  # the newest list at once, held changes and flap counts with it (ADR 0017)
            await self._devices_listed(ep, ep.unrecorded, final=True)
            if self.endpoints.get(ep.resource) is not ep:
                return  # a newer registration came while that was recorded: it is the plugin now
        del self.endpoints[ep.resource]
        with correlation(new_correlation_id()):
            recs = await record_or_log(
                self.recorder,
                [ev.PluginDisconnected(resource=ep.resource, endpoint=ep.endpoint, reason=reason)],
                "plugin disconnected",
            )
            log.warning("plugin disconnected", resource=ep.resource, reason=reason, grace_seconds=self.grace)
        self._notify()
        if recs:  # unrecorded, the plugin still shows connected: nothing to expire
            assert self._nursery is not None
            self._nursery.start_soon(self._expire, ep.resource, recs[0].seq)

    async def _list_and_watch(self, ep: Endpoint) -> None:  # runs on asyncio
        async with ep.stub.ListAndWatch.open() as stream:
            await stream.send_message(pb.Empty(), end=True)
            async for msg in stream:
                await to_trio(self._devices_received)(ep, msg)

    async def _devices_received(self, ep: Endpoint, msg: pb.ListAndWatchResponse) -> None:
        """Check one list, count the flaps it makes and keep it as the newest, for the
        recorder; raises PluginCutOff when it breaks a limit. A long list is taken in a
        worker thread (``INLINE_DEVICES``)."""
        async with ep.lock:
            reason, newest = await _off_loop(len(msg.devices), _take_list, ep, msg)
        if reason:
            raise PluginCutOff(f"its ListAndWatch message {reason}")
        ep.newest = newest
        ep.unrecorded += 1
        ep.arrived.set()

    async def _record_lists(self, ep: Endpoint) -> None:
        """Record what the newest list of ``ep`` changed whenever one arrives, and again when a
        held health change's window ends (``ep.due``); at most LIST_RATE passes a second after a
        burst of LIST_BURST: lists that arrive meanwhile are coalesced into the newest. Returns
        once the stream has ended (``_run_endpoint`` records the rest)."""
        bucket = TokenBucket(LIST_RATE, LIST_BURST, clock=trio.current_time)
        while True:
            with trio.move_on_at(ep.due):  # the window's end, as a cancel scope's deadline
                await ep.arrived.wait()
            if ep.arrived.is_set():
                ep.arrived = trio.Event()
            if ep.ended:
                return
            if (delay := bucket.delay()) > 0:
                await trio.sleep(delay)  # lists arriving meanwhile replace ep.newest
            bucket.spend()
            await self._devices_listed(ep, ep.unrecorded)

    async def _devices_listed(self, ep: Endpoint, count: int, *, final: bool = False) -> None:
        """Record what the newest list of ``ep``, the newest of ``count`` lists since the last
        pass, changed and the flap throttle lets through now (``final``: all it holds)."""
        if self.endpoints.get(ep.resource) is not ep or ep.newest is None:
            return
        ep.unrecorded = 0
        ep.coalesced += max(count - 1, 0)
        now = trio.current_time()
        if ep.coalesced and now - ep.coalesced_logged >= 60.0:
            log.warning(
                "ListAndWatch lists coalesced, the newest recorded",
                resource=ep.resource,
                endpoint=ep.endpoint,
                lists=ep.coalesced,
                recorded_per_second=LIST_RATE,
            )
            ep.coalesced, ep.coalesced_logged = 0, now
        machine = self.machine_numa_nodes
        async with ep.lock:
            now = trio.current_time()
            known = self.recorder.views.devices.devices.get(ep.resource, {})
            listed = {k: d for k, d in known.items() if not d.removed}
            newest = ep.newest
            checked, decision = await _off_loop(len(newest), _list_changes, ep, listed, newest, machine, now, final)
        if self.endpoints.get(ep.resource) is not ep:
            return  # replaced while its list was compared: the newer registration's list is the truth
        if count:
            _log_checked(ep, checked, machine)
        ep.due = decision.due
        if decision.events:
            with correlation(new_correlation_id()):  # one update of the plugin's list
                for events in list_appends(decision.events):
                    if final:  # the stream is over: a refused append is logged, the disconnection follows
                        if await record_or_log(self.recorder, events, "device list") is None:
                            return
                    else:
                        await self.recorder.record(events)
                _log_listed(decision.events)
        if not ep.listed.is_set():
            ep.listed.set()
        self._notify()

    async def _expire(self, resource: str, since_seq: int) -> None:
        await trio.sleep(self.grace)
        plugin = self.recorder.views.devices.plugins.get(resource)
        if plugin is None or plugin.connected or resource in self.endpoints or plugin.disconnected_seq != since_seq:
            return
        with correlation(new_correlation_id()):
            reason = f"plugin away for {self.grace:g} s"
            if (
                await record_or_log(
                    self.recorder, [ev.ResourceDropped(resource=resource, reason=reason)], "resource dropped"
                )
                is None
            ):
                return
            log.warning("resource dropped", resource=resource, reason=reason)
        self._notify()

    # ------------------------------------------------------------------ for admission

    def _notify(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def listed(self, resource: str) -> Endpoint | None:
        """The resource's endpoint if it has listed its devices; never waits."""
        ep = self.endpoints.get(resource)
        return ep if ep is not None and ep.listed.is_set() else None

    async def wait_listed(self, resource: str, timeout: float) -> Endpoint | None:
        """The resource's endpoint once it has listed its devices, waiting up to ``timeout``
        while the resource is known but its plugin is away (after a restart, say)."""
        with trio.move_on_after(timeout if math.isfinite(timeout) else math.inf):
            while True:
                ep = self.listed(resource)
                if ep is not None:
                    return ep
                if resource not in self.recorder.views.devices.plugins:
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
        reason = endpoint_socket_error(endpoint)
        if reason:
            raise RegistrationRejected(reason)

    async def register(self, name: str, endpoint: str, versions: list[str], socket_path: Path | None = None) -> None:
        deprecation = self.manager.directory / "DEPRECATION"
        if not deprecation.exists():
            deprecation.touch()
        await self.manager.register("v1beta1", name, endpoint, path=Path(endpoint))

    async def deregister(self, name: str, endpoint: str, socket_path: Path | None = None) -> None:
        ep = self.manager.endpoints.get(name)
        if ep is not None and ep.path == Path(endpoint):
            ep.cancel.cancel()  # its stream ends; the endpoint task records the disconnection
