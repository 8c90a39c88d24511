"""The kubelet's decisions as observed beside it (``serve --beside-kubelet``): which devices,
CPUs, memory and claims each container holds, what the node lists as allocatable, and the gaps
in what eventsrc could see. Facts eventsrc did not decide; its own views are untouched."""

from __future__ import annotations

from eventsrc import events as ev
from eventsrc.state.types import Handlers
from eventsrc.state.views import ObservedContainerView, ObservedPodView, Views

#: the observed events about one pod: each names it (``PodRef``; its uid may be "")
OBSERVED_POD_EVENTS = (
    ev.KubeletPodObserved,
    ev.KubeletPodReleased,
    ev.KubeletDevicesObserved,
    ev.KubeletDevicesReleased,
    ev.KubeletCPUsObserved,
    ev.KubeletCPUsReleased,
    ev.KubeletMemoryObserved,
    ev.KubeletClaimObserved,
    ev.KubeletClaimReleased,
)


def pod_key(pod: ev.PodRef) -> str:
    """How the kubelet names a pod in PodResources, and so how the view keys it."""
    return f"{pod.namespace}/{pod.name}"


def claim_device_id(d: ev.ObservedClaimDevice) -> str:
    """A DRA device as ``audit device`` and the metrics name it: the driver is the resource,
    ``pool/device`` the id."""
    return f"{d.pool}/{d.device}"


def claim_key(claim: ev.ClaimRef) -> str:
    return f"{claim.namespace}/{claim.name}"


def _other(p: ObservedPodView, pod: ev.PodRef) -> bool:
    """``pod`` is another pod than ``p`` of the same name: both uids known, and not the same."""
    return bool(p.uid and pod.uid and p.uid != pod.uid)


def _pod(v: Views, seq: int, pod: ev.PodRef) -> ObservedPodView | None:
    """The pod's view (made when new); None when the name is another uid's."""
    key = pod_key(pod)
    p = v.kubelet.pods.get(key)
    if p is None:
        p = v.kubelet.pods[key] = ObservedPodView(uid=pod.uid, namespace=pod.namespace, name=pod.name, since_seq=seq)
    elif _other(p, pod):
        return None
    elif pod.uid and not p.uid:
        p.uid = pod.uid
    return p


def _container(v: Views, seq: int, pod: ev.PodRef, name: str) -> ObservedContainerView | None:
    p = _pod(v, seq, pod)
    if p is None:
        return None
    c = p.containers.get(name)
    if c is None:
        c = p.containers[name] = ObservedContainerView()
    return c


def _held(v: Views, pod: ev.PodRef, name: str) -> ObservedContainerView | None:
    p = v.kubelet.pods.get(pod_key(pod))
    return None if p is None or _other(p, pod) else p.containers.get(name)


def pod_observed(v: Views, seq: int, e: ev.KubeletPodObserved) -> None:
    """A pod first seen, its uid learned, or a new pod under the name (it replaces the old)."""
    p = v.kubelet.pods.get(pod_key(e.pod))
    if p is not None and _other(p, e.pod):
        del v.kubelet.pods[pod_key(e.pod)]
    _pod(v, seq, e.pod)


def pod_released(v: Views, seq: int, e: ev.KubeletPodReleased) -> None:
    p = v.kubelet.pods.get(pod_key(e.pod))
    if p is not None and not _other(p, e.pod):
        del v.kubelet.pods[pod_key(e.pod)]


def devices_observed(v: Views, seq: int, e: ev.KubeletDevicesObserved) -> None:
    c = _container(v, seq, e.pod, e.container)
    if c is None:
        return
    held = c.devices.get(e.resource, [])
    c.devices = {**c.devices, e.resource: held + [i for i in e.device_ids if i not in held]}


def devices_released(v: Views, seq: int, e: ev.KubeletDevicesReleased) -> None:
    c = _held(v, e.pod, e.container)
    if c is None or e.resource not in c.devices:
        return
    gone = set(e.device_ids)
    left = [i for i in c.devices[e.resource] if i not in gone]
    devices = dict(c.devices)
    if left:
        devices[e.resource] = left
    else:
        del devices[e.resource]
    c.devices = devices


def cpus_observed(v: Views, seq: int, e: ev.KubeletCPUsObserved) -> None:
    c = _container(v, seq, e.pod, e.container)
    if c is not None:
        c.cpus = sorted(e.cpus)


def cpus_released(v: Views, seq: int, e: ev.KubeletCPUsReleased) -> None:
    c = _held(v, e.pod, e.container)
    if c is not None:
        gone = set(e.cpus)
        c.cpus = [i for i in c.cpus if i not in gone]


def memory_observed(v: Views, seq: int, e: ev.KubeletMemoryObserved) -> None:
    c = _container(v, seq, e.pod, e.container)
    if c is not None:
        c.memory = list(e.memory)


def claim_observed(v: Views, seq: int, e: ev.KubeletClaimObserved) -> None:
    c = _container(v, seq, e.pod, e.container)
    if c is None:
        return
    c.claims = {**c.claims, claim_key(e.claim): list(e.devices)}


def claim_released(v: Views, seq: int, e: ev.KubeletClaimReleased) -> None:
    c = _held(v, e.pod, e.container)
    if c is not None and claim_key(e.claim) in c.claims:
        c.claims = {k: d for k, d in c.claims.items() if k != claim_key(e.claim)}


def allocatable_changed(v: Views, seq: int, e: ev.KubeletAllocatableChanged) -> None:
    k = v.kubelet
    for resource, ids in e.removed.items():
        known = k.allocatable.get(resource)
        if known is None:
            continue
        for i in ids:
            known.pop(i, None)
        if not known:
            del k.allocatable[resource]
    for resource, devices in e.added.items():
        known = k.allocatable.setdefault(resource, {})
        for d in devices:
            known[d.id] = list(d.numa_nodes)
    if e.cpus_added or e.cpus_removed:
        gone = set(e.cpus_removed)
        k.allocatable_cpus = sorted({*(c for c in k.allocatable_cpus if c not in gone), *e.cpus_added})


def shared_pool_observed(v: Views, seq: int, e: ev.KubeletSharedPoolObserved) -> None:
    v.kubelet.shared = sorted(e.cpus)
    v.kubelet.unreadable.pop(e.source, None)


def checkpoint_unreadable(v: Views, seq: int, e: ev.KubeletCheckpointReadFailed) -> None:
    v.kubelet.unreadable[e.path] = e.reason


def gap(v: Views, seq: int, e: ev.ObservationGapFound) -> None:
    if e.until_ns:
        if v.kubelet.gaps.get(e.source) == e.since_ns:
            del v.kubelet.gaps[e.source]
    else:
        v.kubelet.gaps[e.source] = e.since_ns


HANDLERS: Handlers = {
    ev.KubeletPodObserved: pod_observed,
    ev.KubeletPodReleased: pod_released,
    ev.KubeletDevicesObserved: devices_observed,
    ev.KubeletDevicesReleased: devices_released,
    ev.KubeletCPUsObserved: cpus_observed,
    ev.KubeletCPUsReleased: cpus_released,
    ev.KubeletMemoryObserved: memory_observed,
    ev.KubeletClaimObserved: claim_observed,
    ev.KubeletClaimReleased: claim_released,
    ev.KubeletAllocatableChanged: allocatable_changed,
    ev.KubeletSharedPoolObserved: shared_pool_observed,
    ev.KubeletCheckpointReadFailed: checkpoint_unreadable,
    ev.ObservationGapFound: gap,
}
