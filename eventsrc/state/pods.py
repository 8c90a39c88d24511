"""Pods and their containers: what each was admitted with and what it holds."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from eventsrc import events as ev
from eventsrc.state.lifecycles import POD, POD_ABSENT, PodLifecycleState, PodState, Step, pod_state, step
from eventsrc.state.types import Handlers
from eventsrc.state.views import ContainerView, PodView, Views, index_built, shared_allocation

#: Rejections are kept for the newest pods only, so the view stays bounded.
MAX_REJECTED = 1024


@dataclass
class RequestsIndex:
    """What each pod requests, summed (the resource fit's ``used``), kept beside the pods.
    The reducers only say which pods' containers changed (``changed``); the fit
    (``core.fit.node_usage``) counts those again before it reads the sums."""

    source: dict[str, PodView] = field(compare=False, repr=False)
    changed: set[str] = field(default_factory=set)
    per_pod: dict[str, dict[str, int]] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)

    @classmethod
    def build(cls, pods: dict[str, PodView]) -> RequestsIndex:
        return cls(pods, changed=set(pods))


def _touched(v: Views, uid: str) -> None:
    """Pod ``uid`` was added, removed, or its containers changed."""
    index: RequestsIndex | None = index_built(v.pods, v.pods.pods)
    if index is not None:
        index.changed.add(uid)


def _state(v: Views, uid: str) -> PodLifecycleState:
    pod = v.pods.pods.get(uid)
    return POD_ABSENT if pod is None else pod.state


def steps(v: Views, e: ev.EventBase) -> list[Step]:
    """The pod lifecycle step ``e`` makes in ``v`` (none when it is not a pod's event)."""
    if isinstance(e, ev.PodRemoved):
        return [step(POD, _state(v, e.pod_uid), type(e), e.pod_uid)]
    if type(e) in POD.events:  # each of the others names its pod
        uid: str = e.pod.uid  # type: ignore[attr-defined]
        return [step(POD, _state(v, uid), type(e), uid)]
    return []


def admission_started(v: Views, seq: int, e: ev.PodAdmissionStarted) -> None:
    after = POD.next(_state(v, e.pod.uid), type(e))
    pod = v.pods.pods[e.pod.uid] = _new_pod(e.pod, e.containers, pod_state(after), seq)
    pod.source = sys.intern(e.source)
    if pod.source:  # admitted from the runtime's facts: its container may be recorded already
        _mark_ran(v, pod)
    v.pods.rejected.pop(e.pod.uid, None)
    _touched(v, e.pod.uid)


def _mark_ran(v: Views, pod: PodView) -> None:
    """The pod's containers the runtime is recorded to have created (at a Synchronize, before
    their admission)."""
    for c in v.runtime.containers.values():
        if c.pod_uid == pod.uid and (mine := pod.containers.get(c.name)) is not None:
            mine.ran = True


def container_admission_started(v: Views, seq: int, e: ev.ContainerAdmissionStarted) -> None:
    """The pod grows by ``e.container`` (admitting until its outcome); the containers that
    had exited before it are init containers."""
    pod = v.pods.pods.get(e.pod.uid)
    if pod is None:
        return
    for name in e.finished:
        if (done := pod.containers.get(name)) is not None:
            done.kind = "init"
    pod.containers[e.container.name] = _container_view(e.container)
    _mark_ran(v, pod)
    pod.growing, pod.growing_seq = e.container.name, seq
    pod.changed_seq = seq
    _touched(v, e.pod.uid)


def container_admitted(v: Views, seq: int, e: ev.ContainerAdmitted) -> None:
    pod = v.pods.pods.get(e.pod.uid)
    if pod is not None and pod.growing == e.container:
        pod.growing, pod.growing_seq = "", 0
        pod.changed_seq = seq
        pod.qos_class = sys.intern(e.qos_class) or pod.qos_class
    v.pods.rejected.pop(e.pod.uid, None)


def pod_admitted(v: Views, seq: int, e: ev.PodAdmitted) -> None:
    after = pod_state(POD.next(_state(v, e.pod.uid), type(e)))
    pod = v.pods.pods.get(e.pod.uid)
    if pod is None:
        pod = v.pods.pods[e.pod.uid] = _new_pod(e.pod, e.containers, after, seq)
    pod.state = after
    pod.admitted_seq = pod.changed_seq = seq
    pod.qos_class = sys.intern(e.qos_class) or pod.qos_class
    for c in e.containers:  # what the admission started with, kept with what it got
        if c.name not in pod.containers:
            pod.containers[c.name] = _container_view(c)
    v.pods.rejected.pop(e.pod.uid, None)
    _touched(v, e.pod.uid)


def _container_view(c: ev.ContainerSpec) -> ContainerView:
    return ContainerView(kind=c.kind, requests=dict(c.requests), limits=dict(c.limits), claims=list(c.claims))


def _new_pod(ref: ev.PodRef, containers: list[ev.ContainerSpec], state: PodState, seq: int) -> PodView:
    return PodView(
        uid=ref.uid,
        namespace=ref.namespace,
        name=ref.name,
        state=state,
        admitted_seq=seq,
        containers={c.name: _container_view(c) for c in containers},
    )


def admission_rejected(v: Views, seq: int, e: ev.AdmissionRejected) -> None:
    pod = v.pods.pods.get(e.pod.uid)
    if pod is not None and POD.next(_state(v, e.pod.uid), type(e)) == POD_ABSENT:
        del v.pods.pods[e.pod.uid]
    elif pod is not None and pod.growing and pod.growing == e.container:  # a container refused: the pod stays
        del pod.containers[pod.growing]
        pod.growing, pod.growing_seq = "", 0
        pod.changed_seq = seq
    _touched(v, e.pod.uid)
    rejected = v.pods.rejected
    rejected.pop(e.pod.uid, None)
    rejected[e.pod.uid] = e.reason
    if len(rejected) > MAX_REJECTED:
        del rejected[next(iter(rejected))]


def pod_quarantined(v: Views, seq: int, e: ev.PodQuarantined) -> None:
    after = pod_state(POD.next(_state(v, e.pod.uid), type(e)))
    pod = v.pods.pods.get(e.pod.uid)
    if pod is None:  # a holder of devices whose admission the views could not read
        pod = v.pods.pods[e.pod.uid] = _new_pod(e.pod, [], after, seq)
    pod.state = after
    pod.in_doubt = sorted(set(pod.in_doubt) | set(e.corrupt_seqs))
    pod.quarantined_seq = seq
    _touched(v, e.pod.uid)


def pod_removed(v: Views, seq: int, e: ev.PodRemoved) -> None:
    if POD.next(_state(v, e.pod_uid), type(e)) == POD_ABSENT:
        v.pods.pods.pop(e.pod_uid, None)
        _touched(v, e.pod_uid)


def _container(v: Views, seq: int, pod_uid: str, name: str) -> ContainerView | None:
    """The container a record changes; its pod's ``changed_seq`` says so."""
    pod = v.pods.pods.get(pod_uid)
    if pod is None:
        return None
    pod.changed_seq = seq
    c = pod.containers.get(name)
    if c is None:
        c = pod.containers[name] = ContainerView()
    return c


def devices_reserved(v: Views, seq: int, e: ev.DevicesReserved) -> None:
    c = _container(v, seq, e.pod_uid, e.container)
    if c is not None:
        c.devices[e.resource] = tuple(e.device_ids)


def devices_allocated(v: Views, seq: int, e: ev.DevicesAllocated) -> None:
    c = _container(v, seq, e.pod_uid, e.container)
    if c is not None:
        c.devices[e.resource] = tuple(e.device_ids)
        c.allocations[e.resource] = shared_allocation(e.response)


def devices_gone(v: Views, seq: int, e: ev.AllocationFailed | ev.DevicesReleased) -> None:
    c = _container(v, seq, e.pod_uid, e.container)
    if c is not None:
        c.devices.pop(e.resource, None)
        c.allocations.pop(e.resource, None)


def cpus_assigned(v: Views, seq: int, e: ev.CPUsAssigned) -> None:
    c = _container(v, seq, e.pod_uid, e.container)
    if c is not None:
        c.cpus = list(e.cpus)


def cpus_released(v: Views, seq: int, e: ev.CPUsReleased) -> None:
    c = _container(v, seq, e.pod_uid, e.container)
    if c is not None:
        c.cpus = []


def memory_changed(v: Views, seq: int, e: ev.MemoryAssigned | ev.MemoryReleased) -> None:
    """What the container holds changed (its blocks are in ``v.memory``): its pod's listing too."""
    _container(v, seq, e.pod_uid, e.container)


def container_created(v: Views, seq: int, e: ev.ContainerCreated) -> None:
    pod = v.pods.pods.get(e.pod_uid)
    c = pod.containers.get(e.name) if pod is not None else None
    if c is not None:
        c.ran = True


HANDLERS: Handlers = {
    ev.PodAdmissionStarted: admission_started,
    ev.ContainerAdmissionStarted: container_admission_started,
    ev.ContainerAdmitted: container_admitted,
    ev.PodAdmitted: pod_admitted,
    ev.AdmissionRejected: admission_rejected,
    ev.PodRemoved: pod_removed,
    ev.PodQuarantined: pod_quarantined,
    ev.DevicesReserved: devices_reserved,
    ev.DevicesAllocated: devices_allocated,
    ev.AllocationFailed: devices_gone,
    ev.DevicesReleased: devices_gone,
    ev.CPUsAssigned: cpus_assigned,
    ev.CPUsReleased: cpus_released,
    ev.MemoryAssigned: memory_changed,
    ev.MemoryReleased: memory_changed,
    ev.ContainerCreated: container_created,
}
