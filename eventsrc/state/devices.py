"""Device plugins and their devices: registration, health, who holds what."""

from __future__ import annotations

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
    step,
)
from eventsrc.state.types import Handlers
from eventsrc.state.views import DeviceView, PluginView, Views


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
        known = table[device_id] = DeviceView(health=health, numa_nodes=list(numa_nodes), since_seq=seq)
    else:
        known.health = health
        moved = known.numa_nodes != numa_nodes
        known.numa_nodes = list(numa_nodes)
    _enter(known, after)
    return moved


def devices_added(v: Views, seq: int, e: ev.DevicesAdded) -> None:
    table = v.devices.devices.setdefault(e.resource, {})
    for d in e.devices:
        if _upsert(table, seq, d.id, d.health, d.numa_nodes, type(e)):
            v.devices.topology_seq = seq


def devices_removed(v: Views, seq: int, e: ev.DevicesRemoved) -> None:
    table = v.devices.devices.get(e.resource)
    if table is None:
        return
    for device_id in e.device_ids:
        _remove(table, device_id, type(e))
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
    if not table:
        del v.devices.devices[e.resource]


def device_health_changed(v: Views, seq: int, e: ev.DeviceHealthChanged) -> None:
    if _upsert(v.devices.devices.setdefault(e.resource, {}), seq, e.device_id, e.health, e.numa_nodes, type(e)):
        v.devices.topology_seq = seq


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
            continue
        d.holder = ""
        _enter(d, after)
        d.since_seq = seq
    if not table:
        del v.devices.devices[e.resource]


def steps(v: Views, e: ev._Event) -> list[Step]:
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
