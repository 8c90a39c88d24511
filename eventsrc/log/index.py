"""Secondary indexes of the log, written in the same transaction as the events they index.

One LMDB database ``index``; every key is ``<prefix><seq as big-endian u64>`` with an empty
value, so a cursor range over a prefix yields, in order, the sequences of the records
about one thing:

* ``d\\0<resource>\\0<device id>\\0`` – a device (listed, health, reserved, allocated, released, and the
                                      containers the runtime created with it)
* ``p\\0<pod uid>\\0``                – a pod (admission, devices, CPUs, claims, removal, and what the
                                      runtime did with its sandboxes and containers)
* ``n\\0<namespace>/<name>\\0``       – a pod by name (admissions, refusals, sandboxes started)
* ``c\\0<claim uid>\\0``              – a DRA claim
* ``o\\0``                          – what eventsrc could not observe: observation gaps and unreadable
                                      kubelet checkpoints (few; ``audit`` reads them all)

A prefix too long for an LMDB key (511 bytes in all, the sequence included) is replaced by
its kind and a digest of it, ``<kind>\\0#<hex>\\0``: queries build the same prefix, so they
still find it, and no string a peer sends (a plugin's device ID, say) can make an append fail.

Pure: ``keys_for(event)`` decides what a record is about; the log writes the keys.
"""

from __future__ import annotations

import hashlib

from eventsrc import events as ev
from eventsrc.core.kubelet_observations import CPUS
from eventsrc.state.kubelet import OBSERVED_POD_EVENTS, claim_device_id
from eventsrc.state.lifecycles import DRIVER_EVENTS

MAX_KEY = 511  # LMDB's largest key, as built by default (py-lmdb's Environment.max_key_size)
MAX_PREFIX = MAX_KEY - 8  # less the big-endian sequence


def _fit(prefix: bytes) -> bytes:
    if len(prefix) <= MAX_PREFIX:
        return prefix
    return prefix[:2] + b"#" + hashlib.blake2b(prefix, digest_size=32).hexdigest().encode() + b"\0"


def device_prefix(resource: str, device_id: str) -> bytes:
    return _fit(b"d\0" + resource.encode() + b"\0" + device_id.encode() + b"\0")


def pod_prefix(uid: str) -> bytes:
    return _fit(b"p\0" + uid.encode() + b"\0")


def name_prefix(namespace: str, name: str) -> bytes:
    return _fit(b"n\0" + f"{namespace}/{name}".encode() + b"\0")


def claim_prefix(uid: str) -> bytes:
    return _fit(b"c\0" + uid.encode() + b"\0")


def observation_prefix() -> bytes:
    """The gaps in what eventsrc saw (ObservationGapFound) and the kubelet checkpoints it could not read."""
    return b"o\0"


def keys_for(e: ev.EventBase) -> list[bytes]:
    """The index prefixes a record belongs under (the sequence is appended by the log)."""
    if isinstance(e, ev.DevicesAdded):
        return [device_prefix(e.resource, d.id) for d in e.devices]
    if isinstance(e, ev.DevicesRemoved):
        return [device_prefix(e.resource, i) for i in e.device_ids]
    if isinstance(e, ev.DeviceHealthChanged):
        return [device_prefix(e.resource, e.device_id)]
    if isinstance(e, (ev.DevicesReserved, ev.DevicesAllocated, ev.AllocationFailed, ev.DevicesReleased)):
        return [pod_prefix(e.pod_uid), *(device_prefix(e.resource, i) for i in e.device_ids)]
    if isinstance(e, (ev.PodAdmissionStarted, ev.AdmissionRejected)):
        return [pod_prefix(e.pod.uid), name_prefix(e.pod.namespace, e.pod.name)]
    if isinstance(e, (ev.ContainerAdmissionStarted, ev.ContainerAdmitted)):
        return [pod_prefix(e.pod.uid)]
    if isinstance(e, ev.PodAdmitted):
        # Without containers its PodAdmissionStarted holds them, and the name is indexed there.
        named = [name_prefix(e.pod.namespace, e.pod.name)] if e.containers else []
        return [pod_prefix(e.pod.uid), *named]
    if isinstance(e, (ev.PodRemoved, ev.CPUsAssigned, ev.CPUsReleased, ev.MemoryAssigned, ev.MemoryReleased)):
        return [pod_prefix(e.pod_uid)]
    if isinstance(e, (ev.PodReferenceAdded, ev.PodReferenceRemoved)):
        return [pod_prefix(e.pod_uid), claim_prefix(e.claim_uid)]
    if isinstance(e, DRIVER_EVENTS):
        return [claim_prefix(e.claim.uid)]
    if isinstance(e, ev.PodSandboxStarted):
        return (
            [pod_prefix(e.pod.uid), name_prefix(e.pod.namespace, e.pod.name)] if e.pod.name else [pod_prefix(e.pod.uid)]
        )
    if isinstance(e, ev.ContainerCreated):
        devices = [device_prefix(r, i) for r, ids in sorted(e.device_ids.items()) for i in dict.fromkeys(ids)]
        return [pod_prefix(e.pod_uid), *devices]
    if isinstance(e, _RUNTIME_POD_EVENTS) and e.pod_uid:  # "": the runtime did not say (never in practice)
        return [pod_prefix(e.pod_uid)]
    if isinstance(e, OBSERVED_POD_EVENTS):
        return [*_observed_pod(e.pod), *_observed_devices(e)]
    if isinstance(e, ev.KubeletAllocatableChanged):
        added = [device_prefix(r, d.id) for r, devices in sorted(e.added.items()) for d in devices]
        return added + [device_prefix(r, i) for r, ids in sorted(e.removed.items()) for i in ids]
    if isinstance(e, (ev.ObservationGapFound, ev.KubeletCheckpointReadFailed)):
        return [observation_prefix()]
    if isinstance(e, ev.KubeletDoubleAllocationFound):
        # found with the devices it names and the pods that hold them ("namespace/name/container")
        devices = [device_prefix(e.resource, i) for i in e.ids] if e.resource != CPUS else []
        pods = [h.split("/") for h in e.holders]
        return devices + [name_prefix(p[0], p[1]) for p in pods if len(p) == 3]
    return []


def _observed_pod(pod: ev.PodRef) -> list[bytes]:
    """An observed pod is found by its name, and by its uid once known."""
    named = [name_prefix(pod.namespace, pod.name)]
    return [pod_prefix(pod.uid), *named] if pod.uid else named


def _observed_devices(e: ev.EventBase) -> list[bytes]:
    if isinstance(e, (ev.KubeletDevicesObserved, ev.KubeletDevicesReleased)):
        return [device_prefix(e.resource, i) for i in dict.fromkeys(e.device_ids)]
    if isinstance(e, (ev.KubeletClaimObserved, ev.KubeletClaimReleased)):
        return list(dict.fromkeys(device_prefix(d.driver, claim_device_id(d)) for d in e.devices))
    return []


_RUNTIME_POD_EVENTS = (
    ev.PodSandboxRemoved,
    ev.ContainerStarted,
    ev.ContainerStopped,
    ev.ContainerRemoved,
    ev.ContainerCPUsUpdated,
)
