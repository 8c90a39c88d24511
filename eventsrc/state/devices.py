"""Device plugins and their devices: registration, health, who holds what.

Beside the device table, ``DeviceIndex`` keeps what an admission asks of it, so that an
admission costs the same with eight devices or ten thousand, and with ten pods or five
thousand: the healthy listed devices nobody holds (per resource and NUMA set, each set in
natural id order), every device per NUMA set, the count of healthy listed ones, and what
each pod holds. It is derived from the table alone: never in a snapshot (an attribute
beside ``DevicesView``'s fields, which msgspec neither encodes nor compares), built from
the table the first time it is asked for (``index_of``), then kept by the reducers below,
device by device (``_indexed``). ``tests/unit/test_device_index.py`` checks that it equals
one built from scratch after any sequence of events.
"""

from __future__ import annotations

import bisect
import functools
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

from msgspec import Struct

from eventsrc import events as ev
from eventsrc.state.lifecycles import (
    DEVICE,
    DEVICE_ABSENT,
    DeviceState,
    EventType,
    Step,
    device_state,
    hold_of,
    holder_text,
    is_listed,
    parse_holder,
    step,
)
from eventsrc.state.types import Handlers
from eventsrc.state.views import DevicesView, DeviceView, PluginView, Views, index_beside, index_built, shared_numa

# --------------------------------------------------------------------------- the index

_DIGITS = re.compile(r"(\d+)")

#: A device's NUMA nodes as a set: sorted, each once (at most 2**n - 1 of them on n nodes).
NumaSet = tuple[int, ...]


@functools.lru_cache(maxsize=1 << 16)
def natural_key(device_id: str) -> tuple[object, ...]:
    """``dev-2`` before ``dev-10``. The split alternates text and digits (odd places), so
    each place holds one type; ``str.isdigit`` is no test of a place (it holds for "¹",
    which ``int`` refuses)."""
    return tuple(int(p) if i % 2 else p for i, p in enumerate(_DIGITS.split(device_id)))


def device_order(device_id: str) -> tuple[tuple[object, ...], str]:
    """The natural order, then the id itself (``dev-01`` and ``dev-1`` are one natural key)."""
    return natural_key(device_id), device_id


#: Each NUMA set once, shared by the devices on it (a few sets, thousands of devices).
_NUMA_SETS: dict[NumaSet, NumaSet] = {}


def numa_set(nodes: Iterable[int]) -> NumaSet:
    key = tuple(sorted(set(nodes)))
    return _NUMA_SETS.setdefault(key, key) if len(_NUMA_SETS) < 1 << 12 else key


@dataclass
class DeviceSets:
    """Device ids per NUMA set, each set's ids in ``device_order``."""

    by_set: dict[NumaSet, list[str]] = field(default_factory=dict)
    set_of: dict[str, NumaSet] = field(default_factory=dict)

    @classmethod
    def of(cls, devices: Iterable[tuple[str, Iterable[int]]]) -> DeviceSets:
        out = cls()
        for device_id, nodes in devices:
            if device_id not in out.set_of:
                key = out.set_of[device_id] = numa_set(nodes)
                out.by_set.setdefault(key, []).append(device_id)
        for ids in out.by_set.values():
            ids.sort(key=device_order)
        return out

    def __len__(self) -> int:
        return len(self.set_of)

    def __contains__(self, device_id: object) -> bool:
        return device_id in self.set_of

    def add(self, device_id: str, key: NumaSet, *, in_order: bool = True) -> None:
        """Add ``device_id`` in its place (``in_order``), or at the end: the caller sorts."""
        self.set_of[device_id] = key
        ids = self.by_set.setdefault(key, [])
        if in_order:
            bisect.insort(ids, device_id, key=device_order)
        else:
            ids.append(device_id)

    def discard(self, device_id: str) -> None:
        key = self.set_of.pop(device_id, None)
        if key is None:
            return
        ids = self.by_set[key]
        del ids[bisect.bisect_left(ids, device_order(device_id), key=device_order)]
        if not ids:
            del self.by_set[key]


class _Indexed(Struct, frozen=True, gc=False):
    """A device as the index last saw it (a Struct without gc: a NamedTuple is never
    untracked by the cycle collector, and there is one per device held)."""

    numa: NumaSet
    healthy: bool  # healthy and listed, held or not
    free: bool  # healthy, listed and held by nobody
    holder: str


@dataclass
class ResourceIndex:
    """One resource's devices, as an admission asks for them."""

    devices: dict[str, _Indexed] = field(default_factory=dict)
    everywhere: dict[NumaSet, int] = field(default_factory=dict)  # every device, any health, per NUMA set
    free: DeviceSets = field(default_factory=DeviceSets)
    healthy: int = 0


@dataclass
class DeviceIndex:
    """What an admission asks of the device table, kept beside it (see the module's header)."""

    source: dict[str, dict[str, DeviceView]] = field(compare=False, repr=False)
    resources: dict[str, ResourceIndex] = field(default_factory=dict)
    # pod uid -> (container, resource, device id) of each device it holds (a dict for its
    # order): one dict per pod, not one more per container and resource
    holders: dict[str, dict[tuple[str, str, str], None]] = field(default_factory=dict)

    @classmethod
    def build(cls, devices: dict[str, dict[str, DeviceView]]) -> DeviceIndex:
        index = cls(devices)
        for resource, table in devices.items():
            for device_id, d in table.items():
                index._add(resource, device_id, d, in_order=False)
        for r in index.resources.values():  # once, not a sorted insert per device
            for ids in r.free.by_set.values():
                ids.sort(key=device_order)
        return index

    def sync_many(self, resource: str, device_ids: Iterable[str], table: dict[str, DeviceView]) -> None:
        """``sync`` of each of ``device_ids`` as ``table`` has it now; the free sets they join
        sorted once instead of a sorted insert each (a plugin's first list: thousands)."""
        ids = list(dict.fromkeys(device_ids))  # each once: the table says how it ends
        for device_id in ids:  # every removal first, while the free sets are in order
            self._drop(resource, device_id)
        joined: set[NumaSet] = set()
        for device_id in ids:
            if (d := table.get(device_id)) is not None:
                self._add(resource, device_id, d, in_order=False)
                if (key := self.resources[resource].free.set_of.get(device_id)) is not None:
                    joined.add(key)
        r = self.resources.get(resource)
        if r is None:
            return
        for key in joined:
            r.free.by_set[key].sort(key=device_order)
        if not r.devices:
            del self.resources[resource]

    def sync(self, resource: str, device_id: str, d: DeviceView | None) -> None:
        """``device_id`` of ``resource`` is now ``d`` (None: gone from the table)."""
        self._drop(resource, device_id)
        if d is not None:
            self._add(resource, device_id, d)
        elif (r := self.resources.get(resource)) is not None and not r.devices:
            del self.resources[resource]

    def _drop(self, resource: str, device_id: str) -> None:
        r = self.resources.get(resource)
        old = r.devices.pop(device_id, None) if r is not None else None
        if r is not None and old is not None:
            _count(r.everywhere, old.numa, -1)
            r.healthy -= old.healthy
            if old.free:
                r.free.discard(device_id)
            if old.holder:
                self._hold(old.holder, resource, device_id, held=False)

    def _add(self, resource: str, device_id: str, d: DeviceView, *, in_order: bool = True) -> None:
        r = self.resources.setdefault(resource, ResourceIndex())
        healthy = d.health == "Healthy" and not d.removed
        new = r.devices[device_id] = _Indexed(numa_set(d.numa_nodes), healthy, healthy and not d.holder, d.holder)
        _count(r.everywhere, new.numa, 1)
        r.healthy += healthy
        if new.free:
            r.free.add(device_id, new.numa, in_order=in_order)
        if new.holder:
            self._hold(new.holder, resource, device_id, held=True)

    def _hold(self, holder_text: str, resource: str, device_id: str, *, held: bool) -> None:
        holder = parse_holder(holder_text)
        assert holder is not None
        # interned: the pod's uid is then its PodView's (state.views), not a copy per pod
        key = (sys.intern(holder.container), resource, device_id)
        if held:
            self.holders.setdefault(sys.intern(holder.pod_uid), {})[key] = None
            return
        pod = self.holders[holder.pod_uid]
        del pod[key]
        if not pod:
            del self.holders[holder.pod_uid]

    def held_by(self, pod_uid: str) -> dict[tuple[str, str], list[str]]:
        """(container, resource) -> the device ids ``pod_uid`` holds, reserved or allocated."""
        out: dict[tuple[str, str], list[str]] = {}
        for container, resource, device_id in self.holders.get(pod_uid, {}):
            out.setdefault((container, resource), []).append(device_id)
        return out


def _count(counts: dict[NumaSet, int], key: NumaSet, n: int) -> None:
    counts[key] = counts.get(key, 0) + n
    if not counts[key]:
        del counts[key]


def index_of(view: DevicesView) -> DeviceIndex:
    """The index of ``view``'s devices, built from the table the first time it is asked for."""
    return index_beside(view, view.devices, DeviceIndex.build)


def _indexed(v: Views, resource: str, device_id: str) -> None:
    """Tell the index (once one is built) that a reducer changed ``device_id``."""
    index: DeviceIndex | None = index_built(v.devices, v.devices.devices)
    if index is not None:
        index.sync(resource, device_id, v.devices.devices.get(resource, {}).get(device_id))


# --------------------------------------------------------------------------- the reducers


def plugin_registered(v: Views, seq: int, e: ev.PluginRegistered) -> None:
    plugin = PluginView(
        resource=e.resource,
        endpoint=e.endpoint,
        kind=e.kind,
        api_version=e.api_version,
        options=e.options,
        registered_seq=seq,
    )
    if e.kind == "DRAPlugin":
        v.claims.drivers[e.resource] = plugin
    else:
        v.devices.plugins[e.resource] = plugin


def plugin_disconnected(v: Views, seq: int, e: ev.PluginDisconnected) -> None:
    table = v.claims.drivers if e.kind == "DRAPlugin" else v.devices.plugins
    plugin = table.get(e.resource)
    # A disconnect of an endpoint that has since been replaced leaves the new one alone.
    if plugin is not None and (not e.endpoint or plugin.endpoint == e.endpoint):
        plugin.connected = False
        plugin.disconnected_seq = seq


def _state(d: DeviceView | None) -> DeviceState:
    return DEVICE_ABSENT if d is None else device_state(d.hold, not d.removed)


def _enter(d: DeviceView, state: DeviceState) -> None:
    """Put ``d`` (in the views) in ``state``: its hold and whether its plugin lists it."""
    d.hold = hold_of(state)
    d.removed = not is_listed(state)


def _upsert(
    table: dict[str, DeviceView], seq: int, device_id: str, health: str, numa_nodes: list[int], event: EventType
) -> bool:
    """Add a device or update a known one; a known device keeps its holder. True when a known
    device moved to other NUMA nodes."""
    known = table.get(device_id)
    after = DEVICE.next(_state(known), event)
    moved = False
    if known is None:
        known = table[device_id] = DeviceView(health=health, numa_nodes=numa_nodes, since_seq=seq)
    else:
        known.health = sys.intern(health)
        moved = known.numa_nodes != numa_nodes
        known.numa_nodes = shared_numa(numa_nodes)
    _enter(known, after)
    return moved


def devices_added(v: Views, seq: int, e: ev.DevicesAdded) -> None:
    table = v.devices.devices.setdefault(e.resource, {})
    for d in e.devices:
        if _upsert(table, seq, d.id, d.health, d.numa_nodes, type(e)):
            v.devices.topology_seq = seq
    index: DeviceIndex | None = index_built(v.devices, v.devices.devices)
    if index is not None:
        index.sync_many(e.resource, (d.id for d in e.devices), table)


def devices_removed(v: Views, seq: int, e: ev.DevicesRemoved) -> None:
    table = v.devices.devices.get(e.resource)
    if table is None:
        return
    for device_id in e.device_ids:
        _remove(table, device_id, type(e))
        _indexed(v, e.resource, device_id)
    if not table:
        del v.devices.devices[e.resource]


def _remove(table: dict[str, DeviceView], device_id: str, event: EventType) -> None:
    """A free device goes; a held one stays with its holder until released."""
    d = table.get(device_id)
    if d is None:
        return
    after = DEVICE.next(_state(d), event)
    if after == DEVICE_ABSENT:
        del table[device_id]
    else:
        _enter(d, after)
        d.health = "Unhealthy"


def resource_dropped(v: Views, seq: int, e: ev.ResourceDropped) -> None:
    v.devices.plugins.pop(e.resource, None)
    table = v.devices.devices.get(e.resource)
    if table is None:
        return
    for device_id in list(table):
        _remove(table, device_id, type(e))
        _indexed(v, e.resource, device_id)
    if not table:
        del v.devices.devices[e.resource]


def device_health_changed(v: Views, seq: int, e: ev.DeviceHealthChanged) -> None:
    if _upsert(v.devices.devices.setdefault(e.resource, {}), seq, e.device_id, e.health, e.numa_nodes, type(e)):
        v.devices.topology_seq = seq
    _indexed(v, e.resource, e.device_id)


def _hold(v: Views, seq: int, e: ev.DevicesReserved | ev.DevicesAllocated) -> None:
    table = v.devices.devices.setdefault(e.resource, {})
    for device_id in e.device_ids:
        d = table.get(device_id)
        after = DEVICE.next(_state(d), type(e))
        if d is None:
            # Allocated before (or without) being listed: keep the fact, health unknown.
            d = table[device_id] = DeviceView(health="Unknown")
        d.holder = holder_text(e.pod_uid, e.container)
        _enter(d, after)
        d.since_seq = seq
        _indexed(v, e.resource, device_id)


def _held_by(table: dict[str, DeviceView], e: ev.AllocationFailed | ev.DevicesReleased) -> list[str]:
    """The devices of ``e`` its container holds, each once: the only ones a release concerns."""
    holder = holder_text(e.pod_uid, e.container)
    return [i for i in dict.fromkeys(e.device_ids) if i in table and table[i].holder == holder]


def _free(v: Views, seq: int, e: ev.AllocationFailed | ev.DevicesReleased) -> None:
    """A release concerns only the devices its container holds."""
    table = v.devices.devices.get(e.resource)
    if table is None:
        return
    for device_id in _held_by(table, e):
        d = table[device_id]
        after = DEVICE.next(_state(d), type(e))
        if after == DEVICE_ABSENT:
            del table[device_id]
        else:
            d.holder = ""
            _enter(d, after)
            d.since_seq = seq
        _indexed(v, e.resource, device_id)
    if not table:
        del v.devices.devices[e.resource]


def steps(v: Views, e: ev.EventBase) -> list[Step]:
    """The device lifecycle steps ``e`` makes in ``v``, one per device it concerns."""
    if isinstance(e, (ev.DevicesAdded, ev.DevicesRemoved, ev.ResourceDropped, ev.DeviceHealthChanged)):
        table = v.devices.devices.get(e.resource, {})
        if isinstance(e, ev.DevicesAdded):
            ids = [d.id for d in e.devices]
        elif isinstance(e, ev.DevicesRemoved):
            ids = list(e.device_ids)
        elif isinstance(e, ev.ResourceDropped):
            ids = list(table)
        else:
            ids = [e.device_id]
    elif isinstance(e, (ev.DevicesReserved, ev.DevicesAllocated)):
        table = v.devices.devices.get(e.resource, {})
        ids = list(e.device_ids)
    elif isinstance(e, (ev.AllocationFailed, ev.DevicesReleased)):
        table = v.devices.devices.get(e.resource, {})
        ids = _held_by(table, e)
    else:
        return []
    return [step(DEVICE, _state(table.get(i)), type(e), i, e.resource) for i in ids]


HANDLERS: Handlers = {
    ev.PluginRegistered: plugin_registered,
    ev.PluginDisconnected: plugin_disconnected,
    ev.DevicesAdded: devices_added,
    ev.DevicesRemoved: devices_removed,
    ev.ResourceDropped: resource_dropped,
    ev.DeviceHealthChanged: device_health_changed,
    ev.DevicesReserved: _hold,
    ev.DevicesAllocated: _hold,
    ev.AllocationFailed: _free,
    ev.DevicesReleased: _free,
}
