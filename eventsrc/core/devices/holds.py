"""Device manager decisions: what a ListAndWatch message changed, what a restart must
finish, what a removal releases. Pure: views in, events out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from eventsrc import events as ev
from eventsrc.core.memory.manager import release_events as memory_release_events
from eventsrc.state.devices import index_of
from eventsrc.state.lifecycles import ADMITTING
from eventsrc.state.views import DeviceView, Views


@dataclass(frozen=True)
class DeviceList:
    """A plugin's ListAndWatch list as the daemon takes it, and what it found wrong with it.

    The kubelet takes any list (its map keeps the last of duplicate IDs, an empty ID is a
    device, a NUMA id is whatever the plugin says); here a device that cannot be named or
    placed is refused on its own, and the rest of the list is taken.
    """

    devices: list[ev.DeviceInfo]  # to record: IDs non-empty and unique, NUMA ids non-negative
    refused: dict[str, str] = field(default_factory=dict)  # device ID -> why it is not taken
    duplicates: dict[str, int] = field(default_factory=dict)  # ID -> times listed; the last is taken
    # ID -> its NUMA ids the machine does not have: taken, but not used for alignment
    outside: dict[str, list[int]] = field(default_factory=dict)


def check_device_list(update: Iterable[ev.DeviceInfo], machine_numa_nodes: Collection[int] | None) -> DeviceList:
    """What of ``update`` is taken. A device with an empty ID or a negative NUMA id is
    refused (the ID "" stands for every device listed without one); of devices listed
    under one ID, the last is taken, as in the kubelet's map. NUMA ids the machine does not
    have (when ``machine_numa_nodes`` is given) are kept as the plugin said them, and noted:
    alignment treats such a device as having no topology (``choice.aligned_nodes``)."""
    taken: dict[str, ev.DeviceInfo] = {}
    times: dict[str, int] = {}
    refused: dict[str, str] = {}
    for d in update:
        if not d.id:
            refused[""] = "the device has an empty ID"
            continue
        times[d.id] = times.get(d.id, 0) + 1
        negative = sorted({n for n in d.numa_nodes if n < 0})
        if negative:
            refused[d.id] = f"NUMA id {negative[0]} is negative"
            taken.pop(d.id, None)  # the last listing counts, refused or not
            continue
        refused.pop(d.id, None)
        taken.pop(d.id, None)  # keep the list's order of the listing that counts
        taken[d.id] = d
    outside: dict[str, list[int]] = {}
    if machine_numa_nodes is not None:
        machine = frozenset(machine_numa_nodes)
        for d in taken.values():
            ids = sorted({n for n in d.numa_nodes if n not in machine})
            if ids:
                outside[d.id] = ids
    return DeviceList(
        devices=list(taken.values()),
        refused=refused,
        duplicates={i: n for i, n in times.items() if n > 1},
        outside=outside,
    )


#: Devices one DevicesAdded or DevicesRemoved record carries at most: a plugin's first list
#: of 10,000 devices is 20 records, each applied in a few ms, so that the daemon's loop is
#: never held long by one (the device manager records each as an append of its own, and the
#: committer lets others run between appends).
DEVICES_PER_RECORD = 500


def list_and_watch_events(
    resource: str,
    known: dict[str, DeviceView],
    update: list[ev.DeviceInfo],
    machine_numa_nodes: Collection[int] | None = None,
) -> list[ev.EventBase]:
    """The events that turn the known devices of ``resource`` into ``update`` (the whole list),
    as ``check_device_list`` takes it; devices added or removed go ``DEVICES_PER_RECORD`` to
    a record.

    Held devices that vanish from the list are removed from the list of devices but stay
    held by their containers (the device view keeps a held device until it is released); a
    known device the list now lists in a way that is refused is removed with the reason.
    """
    checked = check_device_list(update, machine_numa_nodes)
    out: list[ev.EventBase] = []
    new = {d.id: d for d in checked.devices}
    added = [d for d in checked.devices if d.id not in known]
    for i in range(0, len(added), DEVICES_PER_RECORD):
        out.append(ev.DevicesAdded(resource=resource, devices=added[i : i + DEVICES_PER_RECORD]))
    for device_id, d in new.items():
        old = known.get(device_id)
        if old is not None and (old.health != d.health or old.numa_nodes != list(d.numa_nodes)):
            out.append(
                ev.DeviceHealthChanged(
                    resource=resource, device_id=device_id, health=d.health, numa_nodes=list(d.numa_nodes)
                )
            )
    gone = [device_id for device_id in known if device_id not in new and device_id not in checked.refused]
    for i in range(0, len(gone), DEVICES_PER_RECORD):
        out.append(
            ev.DevicesRemoved(
                resource=resource, device_ids=gone[i : i + DEVICES_PER_RECORD], reason="not in the plugin's list"
            )
        )
    for device_id in known:
        if device_id in checked.refused:
            reason = f"refused: {checked.refused[device_id]}"
            out.append(ev.DevicesRemoved(resource=resource, device_ids=[device_id], reason=reason))
    return out


def holdings(views: Views, pod_uid: str) -> dict[tuple[str, str], list[str]]:
    """(container, resource) -> device ids that ``pod_uid`` holds, reserved or allocated
    (from the views' index: no pass over the devices)."""
    return index_of(views.devices).held_by(pod_uid)


def release_events(views: Views, pod_uid: str, reason: str, container: str | None = None) -> list[ev.EventBase]:
    """Release every device, exclusive CPU and memory block ``pod_uid`` holds (``container``:
    that one holds)."""
    out: list[ev.EventBase] = []
    for (name, resource), ids in sorted(holdings(views, pod_uid).items()):
        if container is not None and name != container:
            continue
        out.append(
            ev.DevicesReleased(
                pod_uid=pod_uid, container=name, resource=resource, device_ids=sorted(ids), reason=reason
            )
        )
    for name, cpus in sorted(views.cpus.assignments.get(pod_uid, {}).items()):
        if container is None or name == container:
            out.append(ev.CPUsReleased(pod_uid=pod_uid, container=name, cpus=cpus, reason=reason))
    out += memory_release_events(views.memory, pod_uid, reason, container)
    return out


def remove_pod_events(views: Views, pod_uid: str, reason: str) -> list[ev.EventBase]:
    return [*release_events(views, pod_uid, reason), ev.PodRemoved(pod_uid=pod_uid, reason=reason)]


def in_doubt(views: Views) -> dict[str, list[int]]:
    """pod uid -> the corrupt records that may have been its own, for each pod a start must
    not finish on a guess. A corrupt record's pod is unknown, so every pod it could be is
    counted: a pod still admitting when a corrupt record lies after its PodAdmissionStarted
    (it may be the outcome: PodAdmitted, or the refusal and its releases), and a pod that
    holds devices but that the views do not know (the corrupt record may be its admission,
    or the release before its removal)."""
    corrupt = sorted(views.meta.corrupt)
    if not corrupt:
        return {}
    out: dict[str, list[int]] = {}
    for uid, pod in views.pods.pods.items():
        since = pod.admitted_seq if pod.state == ADMITTING else pod.growing_seq if pod.growing else None
        if since is not None and (after := [s for s in corrupt if s > since]):
            out[uid] = after
    for uid in sorted(_holders(views) - views.pods.pods.keys()):
        out[uid] = corrupt
    return out


def _holders(views: Views) -> set[str]:
    return set(index_of(views.devices).holders)


def restart_events(views: Views) -> list[ev.EventBase]:
    """What a start must finish from the previous run, decided from the log alone.

    * a pod whose admission had started but not ended was never acknowledged: its
      reservations and allocations are released and the admission is refused;
    * a device held by a pod the views do not know (never admitted) is released;
    * unless a corrupt record may have been that pod's (``in_doubt``): then the pod is
      quarantined instead, and keeps what it holds until an operator removes it;
    * plugins that were connected are not any more: they must register again.
    """
    out: list[ev.EventBase] = []
    reason = "the daemon restarted during the admission"
    doubt = in_doubt(views)
    for uid, seqs in doubt.items():
        pod = views.pods.pods.get(uid)
        ref = ev.PodRef(uid=uid, namespace=pod.namespace, name=pod.name) if pod else ev.PodRef(uid=uid)
        why = "its admission's outcome" if pod else "its admission, or the release before its removal"
        out.append(
            ev.PodQuarantined(
                pod=ref,
                corrupt_seqs=seqs,
                reason=f"corrupt record(s) {', '.join(map(str, seqs))} may hold {why}; it keeps what it holds "
                "until an operator removes it",
            )
        )
    for uid, pod in views.pods.pods.items():
        if uid in doubt:
            continue
        ref = ev.PodRef(uid=uid, namespace=pod.namespace, name=pod.name)
        if pod.state == ADMITTING:
            out += release_events(views, uid, reason)
            out.append(ev.AdmissionRejected(pod=ref, reason=reason))
        elif pod.growing:  # one container's admission: the pod keeps the others
            out += release_events(views, uid, reason, container=pod.growing)
            out.append(ev.AdmissionRejected(pod=ref, reason=reason, container=pod.growing))
    for uid in sorted(_holders(views) - views.pods.pods.keys() - doubt.keys()):
        out += release_events(views, uid, "held by a pod that was never admitted")
    for plugin in [*views.devices.plugins.values(), *views.claims.drivers.values()]:
        if plugin.connected:
            out.append(
                ev.PluginDisconnected(
                    resource=plugin.resource, endpoint=plugin.endpoint, kind=plugin.kind, reason="the daemon restarted"
                )
            )
    return out
