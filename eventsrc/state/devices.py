"""Device plugins and their devices: registration, health, who holds what."""

from __future__ import annotations

from eventsrc import events as ev
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


def _upsert(table: dict[str, DeviceView], seq: int, device_id: str, health: str, numa_nodes: list[int]) -> None:
    """Add a device or update a known one; a known device keeps its holder."""
    known = table.get(device_id)
    if known is None:
        table[device_id] = DeviceView(health=health, numa_nodes=list(numa_nodes), since_seq=seq)
    else:
        known.health = health
        known.numa_nodes = list(numa_nodes)
        known.removed = False


def devices_added(v: Views, seq: int, e: ev.DevicesAdded) -> None:
    table = v.devices.devices.setdefault(e.resource, {})
    for d in e.devices:
        _upsert(table, seq, d.id, d.health, d.numa_nodes)


def devices_removed(v: Views, seq: int, e: ev.DevicesRemoved) -> None:
    table = v.devices.devices.get(e.resource)
    if table is None:
        return
    for device_id in e.device_ids:
        _remove(table, device_id)
    if not table:
        del v.devices.devices[e.resource]


def _remove(table: dict[str, DeviceView], device_id: str) -> None:
    """A free device goes; a held one stays with its holder until released."""
    d = table.get(device_id)
    if d is None:
        return
    if d.holder:
        d.removed = True
        d.health = "Unhealthy"
    else:
        del table[device_id]


def resource_dropped(v: Views, seq: int, e: ev.ResourceDropped) -> None:
    v.devices.plugins.pop(e.resource, None)
    table = v.devices.devices.get(e.resource)
    if table is None:
        return
    for device_id in list(table):
        _remove(table, device_id)
    if not table:
        del v.devices.devices[e.resource]


def device_health_changed(v: Views, seq: int, e: ev.DeviceHealthChanged) -> None:
    _upsert(v.devices.devices.setdefault(e.resource, {}), seq, e.device_id, e.health, e.numa_nodes)


def _hold(v: Views, seq: int, resource: str, ids: list[str], holder: str, hold: str) -> None:
    table = v.devices.devices.setdefault(resource, {})
    for device_id in ids:
        d = table.get(device_id)
        if d is None:
            # Allocated before (or without) being listed: keep the fact, health unknown.
            d = table[device_id] = DeviceView(health="Unknown")
        d.holder = holder
        d.hold = hold
        d.since_seq = seq


def _free(v: Views, seq: int, resource: str, ids: list[str], holder: str) -> None:
    table = v.devices.devices.get(resource)
    if table is None:
        return
    for device_id in ids:
        d = table.get(device_id)
        if d is not None and d.holder == holder:
            if d.removed:
                del table[device_id]
                continue
            d.holder = ""
            d.hold = ""
            d.since_seq = seq
    if not table:
        del v.devices.devices[resource]


def devices_reserved(v: Views, seq: int, e: ev.DevicesReserved) -> None:
    _hold(v, seq, e.resource, e.device_ids, f"{e.pod_uid}/{e.container}", "reserved")


def devices_allocated(v: Views, seq: int, e: ev.DevicesAllocated) -> None:
    _hold(v, seq, e.resource, e.device_ids, f"{e.pod_uid}/{e.container}", "allocated")


def allocation_failed(v: Views, seq: int, e: ev.AllocationFailed) -> None:
    _free(v, seq, e.resource, e.device_ids, f"{e.pod_uid}/{e.container}")


def devices_released(v: Views, seq: int, e: ev.DevicesReleased) -> None:
    _free(v, seq, e.resource, e.device_ids, f"{e.pod_uid}/{e.container}")


HANDLERS: Handlers = {
    ev.PluginRegistered: plugin_registered,
    ev.PluginDisconnected: plugin_disconnected,
    ev.DevicesAdded: devices_added,
    ev.DevicesRemoved: devices_removed,
    ev.ResourceDropped: resource_dropped,
    ev.DeviceHealthChanged: device_health_changed,
    ev.DevicesReserved: devices_reserved,
    ev.DevicesAllocated: devices_allocated,
    ev.AllocationFailed: allocation_failed,
    ev.DevicesReleased: devices_released,
}
