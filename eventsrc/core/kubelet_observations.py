"""What eventsrc records beside a kubelet (``serve --beside-kubelet``): from one look at the
kubelet's PodResources answer, the differences from what the log already says, as observed
facts. eventsrc decides nothing here; it says what the kubelet decided, when it saw it.

Theory of operation
-------------------
A *look* is what one answer of the kubelet said: every pod it lists (``List``), or the pods
asked for by name (``Get``), with each container's devices, exclusive CPUs, memory and DRA
claims. ``observe`` compares a look with ``views.kubelet`` and returns the events that make
the view equal to it: a device newly listed for a container is observed, one no longer
listed is released, a container's CPU or memory set that changed is observed whole.

A pod is released only when it is known gone (``release_gone``):

* the runtime removed its last sandbox (with NRI), or
* the kubelet no longer lists it while the runtime runs no container of it.

An empty or partial answer of a kubelet that has just restarted lists none of the pods whose
containers still run, and releases nothing. Without NRI the runtime is not seen: a pod the
kubelet stops listing is released when the answer lists some other pod (an empty answer is
what a restarted kubelet gives too, and releases nothing), see docs/kubelet-node.md.

Pods are named as the kubelet names them, ``namespace/name``; the uid comes from the runtime's
sandboxes (NRI), or from the device checkpoint, and stays "" where neither says it. With NRI,
a listed pod is observed once the runtime has a sandbox of it, so its uid is known, and a pod
whose sandboxes are gone is not observed again from a kubelet's late answer.

Pure: no clock, no I/O. The shell (``eventsrc.node.beside``) asks the kubelet and records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from eventsrc import events as ev
from eventsrc.state.views import KubeletView, ObservedPodView, RuntimeView

NOT_LISTED = "no longer listed by the kubelet"
SANDBOX_GONE = "its last sandbox was removed by the runtime"
NOT_LISTED_NOR_RUNNING = "no longer listed by the kubelet, and the runtime runs none of its containers"
NEW_UID = "the kubelet lists a new pod of that namespace and name"


@dataclass(frozen=True)
class SeenDevices:
    resource: str
    device_ids: tuple[str, ...]
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True)
class SeenClaim:
    namespace: str
    name: str
    devices: tuple[ev.ObservedClaimDevice, ...] = ()


@dataclass(frozen=True)
class SeenContainer:
    name: str
    devices: tuple[SeenDevices, ...] = ()
    cpus: tuple[int, ...] = ()
    memory: tuple[ev.ObservedMemory, ...] = ()
    claims: tuple[SeenClaim, ...] = ()


@dataclass(frozen=True)
class SeenPod:
    namespace: str
    name: str
    containers: tuple[SeenContainer, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Look:
    """One answer of the kubelet: ``complete`` for ``List`` (every pod it has), else the pods
    ``Get`` found among those ``asked`` (a pod asked for and not found is not a release)."""

    pods: tuple[SeenPod, ...]
    complete: bool
    asked: frozenset[str] = frozenset()
    source: str = "List"


@dataclass(frozen=True)
class CPUManager:
    """What the kubelet's CPU manager state (its ``cpu_manager_state`` file) says: each
    container's exclusive CPUs by (pod uid, container name), and the shared pool. A CPU is a
    container's exclusive CPU only when this gives it to that container: a kubelet before 1.21
    lists a container's whole cpuset in ``cpu_ids``, the shared pool included (kubernetes#97415)."""

    exclusive: Mapping[tuple[str, str], frozenset[int]] = field(default_factory=dict)
    shared: frozenset[int] = frozenset()
    source: str = ""
    #: its policy: "none" gives no CPU exclusively (a kubelet before 1.21 then lists every CPU
    #: for every container, and its file keeps no shared pool)
    policy: str = "static"

    def of(self, uid: str, container: str, listed: Iterable[int]) -> tuple[str, frozenset[int]] | None:
        """(pod uid, exclusive CPUs) the state gives the container, or None. A pod whose uid is
        not known ("") is matched by the container's name and exactly the CPUs listed: the uid
        is the entry's when one entry matches, "" when several do (a kubelet that gave those
        CPUs to two pods: exclusive all the same)."""
        if uid:
            cpus = self.exclusive.get((uid, container))
            return None if cpus is None else (uid, cpus)
        want = frozenset(listed)
        found = {u for (u, name), cpus in self.exclusive.items() if name == container and cpus == want}
        if not want or not found:
            return None
        return (found.pop() if len(found) == 1 else ""), want


@dataclass(frozen=True)
class Identities:
    """What says a pod's uid: the runtime's live sandboxes by ``namespace/name``, the device
    checkpoint's entries by (container, resource, device id), and the CPU manager's state
    (``cpus``; None: not read, and then no CPU is known to be exclusive). ``runtime_seen``: the
    runtime's view is current (NRI synchronized in this run); a pod is then observed once a
    sandbox of it is."""

    sandboxes: Mapping[str, str] = field(default_factory=dict)
    checkpoint: Mapping[tuple[str, str, str], str] = field(default_factory=dict)
    runtime_seen: bool = False
    cpus: CPUManager | None = None
    #: the memory manager's state (``memory_manager_state``): each container's blocks by (pod
    #: uid, container name), taken for a container the answer lists no memory for (a kubelet
    #: before 1.22 lists none)
    memory: Mapping[tuple[str, str], tuple[ev.ObservedMemory, ...]] = field(default_factory=dict)


def identities(
    runtime: RuntimeView | None,
    checkpoint: Mapping[tuple[str, str, str], str],
    cpus: CPUManager | None = None,
    memory: Mapping[tuple[str, str], tuple[ev.ObservedMemory, ...]] | None = None,
) -> Identities:
    """The uids the runtime's view (None: not current), the device checkpoint and the CPU
    manager's state give (the newest sandbox of a name wins)."""
    sandboxes: dict[str, str] = {}
    if runtime is not None:
        for s in sorted(runtime.sandboxes.values(), key=lambda s: s.since_seq):
            sandboxes[f"{s.namespace}/{s.name}"] = s.uid
    return Identities(
        sandboxes=sandboxes, checkpoint=checkpoint, runtime_seen=runtime is not None, cpus=cpus, memory=memory or {}
    )


def _uid(pod: SeenPod, ids: Identities, view: KubeletView, shared: frozenset[tuple[str, str, str]]) -> str | None:
    """The pod's uid, "" when nothing says it, None when the runtime is seen and has no
    sandbox of it (not observed now). The kubelet's files name a uid only when every device the
    pod is listed with maps to that one uid in the device checkpoint and every container the
    CPU manager's state gives exactly its listed CPUs is of that uid too, none of its devices is
    listed for another pod in the same look (``shared``: the checkpoint's entry names one of
    them), and no other observed pod has it (the files lag the kubelet: they may still name a
    device's previous holder)."""
    uid = ids.sandboxes.get(pod.key)
    if uid is not None:
        return uid
    if ids.runtime_seen:
        return None
    keys = {(c.name, d.resource, i) for c in pod.containers for d in c.devices for i in d.device_ids}
    if keys & shared:
        return ""
    found = {ids.checkpoint.get(k, "") for k in keys}
    cpus = ids.cpus
    if cpus is not None:
        found |= {given[0] for c in pod.containers if (given := cpus.of("", c.name, c.cpus)) is not None and given[0]}
    if len(found) != 1:
        return ""
    (uid,) = found
    if any(p.uid == uid and key != pod.key for key, p in view.pods.items()):
        return ""
    return uid


def _ref(p: ObservedPodView) -> ev.PodRef:
    return ev.PodRef(uid=p.uid, namespace=p.namespace, name=p.name)


def release_pod(p: ObservedPodView, reason: str) -> list[ev.EventBase]:
    """Everything ``p`` holds released, then the pod."""
    ref = _ref(p)
    out: list[ev.EventBase] = []
    for name, c in p.containers.items():
        for resource, ids in c.devices.items():
            if ids:
                out.append(
                    ev.KubeletDevicesReleased(
                        pod=ref, container=name, resource=resource, device_ids=list(ids), reason=reason
                    )
                )
        if c.cpus:
            out.append(ev.KubeletCPUsReleased(pod=ref, container=name, cpus=list(c.cpus), reason=reason))
        for key, devices in c.claims.items():
            ns, _, claim = key.partition("/")
            out.append(
                ev.KubeletClaimReleased(
                    pod=ref,
                    container=name,
                    claim=ev.ClaimRef(uid="", namespace=ns, name=claim),
                    devices=list(devices),
                    reason=reason,
                )
            )
    out.append(ev.KubeletPodReleased(pod=ref, reason=reason))
    return out


def _container_changes(
    ref: ev.PodRef, seen: SeenContainer, held: ObservedPodView, exclusive: Iterable[int] = ()
) -> list[ev.EventBase]:
    """What the container's listing changes; ``exclusive``: its listed CPUs the CPU manager's
    state gives it (``exclusive_cpus``)."""
    old = held.containers.get(seen.name)
    old_devices = old.devices if old is not None else {}
    out: list[ev.EventBase] = []
    now: dict[str, set[str]] = {}
    for d in seen.devices:
        now.setdefault(d.resource, set()).update(d.device_ids)
    for resource, ids in old_devices.items():
        gone = [i for i in ids if i not in now.get(resource, set())]
        if gone:
            out.append(
                ev.KubeletDevicesReleased(
                    pod=ref, container=seen.name, resource=resource, device_ids=gone, reason=NOT_LISTED
                )
            )
    for d in seen.devices:
        held_ids = old_devices.get(d.resource, [])
        new = [i for i in dict.fromkeys(d.device_ids) if i not in held_ids]
        if new:
            out.append(
                ev.KubeletDevicesObserved(
                    pod=ref, container=seen.name, resource=d.resource, device_ids=new, numa_nodes=list(d.numa_nodes)
                )
            )
    cpus = sorted(exclusive)
    old_cpus = list(old.cpus) if old is not None else []
    if cpus != old_cpus:
        if cpus:
            out.append(ev.KubeletCPUsObserved(pod=ref, container=seen.name, cpus=cpus))
        else:
            out.append(ev.KubeletCPUsReleased(pod=ref, container=seen.name, cpus=old_cpus, reason=NOT_LISTED))
    memory = list(seen.memory)
    if memory != (list(old.memory) if old is not None else []):
        out.append(ev.KubeletMemoryObserved(pod=ref, container=seen.name, memory=memory))
    old_claims = old.claims if old is not None else {}
    seen_claims = {f"{c.namespace}/{c.name}": c for c in seen.claims}
    for key, devices in old_claims.items():
        if key not in seen_claims:
            ns, _, name = key.partition("/")
            out.append(
                ev.KubeletClaimReleased(
                    pod=ref,
                    container=seen.name,
                    claim=ev.ClaimRef(uid="", namespace=ns, name=name),
                    devices=list(devices),
                    reason=NOT_LISTED,
                )
            )
    for key, c in seen_claims.items():
        if old_claims.get(key) != list(c.devices):
            claim = ev.ClaimRef(uid="", namespace=c.namespace, name=c.name)
            out.append(ev.KubeletClaimObserved(pod=ref, container=seen.name, claim=claim, devices=list(c.devices)))
    return out


def observe(view: KubeletView, look: Look, ids: Identities) -> list[ev.EventBase]:
    """The events that bring ``view`` to what ``look`` says, pod by pod (releases before the
    holds that may take the same devices). Pods ``look`` does not list are left to
    ``release_gone``."""
    releases: list[ev.EventBase] = []
    holds: list[ev.EventBase] = []
    pods_with: dict[tuple[str, str, str], int] = {}
    for pod in look.pods:
        for k in {(c.name, d.resource, i) for c in pod.containers for d in c.devices for i in d.device_ids}:
            pods_with[k] = pods_with.get(k, 0) + 1
    shared = frozenset(k for k, n in pods_with.items() if n > 1)  # the kubelet gave it to two pods
    for pod in sorted(look.pods, key=lambda p: p.key):
        uid = _uid(pod, ids, view, shared)
        if uid is None:
            continue  # the runtime has no sandbox of it (yet, or any more): not observed now
        held = view.pods.get(pod.key)
        if held is not None and held.uid and uid and held.uid != uid:
            releases.extend(release_pod(held, NEW_UID))
            held = None
        if held is None:
            held = ObservedPodView(uid=uid, namespace=pod.namespace, name=pod.name)
            holds.append(ev.KubeletPodObserved(pod=_ref(held), source=look.source))
        elif uid and not held.uid:
            held = ObservedPodView(uid=uid, namespace=held.namespace, name=held.name, containers=held.containers)
            holds.append(ev.KubeletPodObserved(pod=_ref(held), source=look.source))
        ref = _ref(held)
        listed = {c.name for c in pod.containers}
        for name in sorted(held.containers):
            if name not in listed:
                releases.extend(_container_changes(ref, SeenContainer(name=name), held))  # all it held goes
        for c in pod.containers:
            if not c.memory and (ref.uid, c.name) in ids.memory:
                c = replace(c, memory=ids.memory[(ref.uid, c.name)])
            for e in _container_changes(ref, c, held, exclusive_cpus(ref.uid, c, ids.cpus)):
                (releases if isinstance(e, _RELEASES) else holds).append(e)
    return releases + holds


def exclusive_cpus(uid: str, seen: SeenContainer, cpus: CPUManager | None) -> frozenset[int]:
    """The container's listed CPUs that the CPU manager's state gives it (none without the
    state: the listing alone cannot tell the shared pool from exclusive CPUs)."""
    given = cpus.of(uid, seen.name, seen.cpus) if cpus is not None else None
    return frozenset() if given is None else given[1] & frozenset(seen.cpus)


def cpu_disagreements(view: KubeletView, look: Look, ids: Identities) -> list[ev.KubeletCPUsDisagreed]:
    """Each listed container whose ``cpu_ids`` the CPU manager's state does not explain: CPUs
    listed that are neither its exclusive CPUs nor (for a kubelet before 1.21, which lists the
    whole cpuset) exactly the shared pool, or exclusive CPUs of its that are not listed. The
    kubelet's answer and its file are read at different moments, so the shell records one only
    when it lasts (``beside.DISAGREEMENT_LASTS``)."""
    if ids.cpus is None or ids.cpus.policy == "none":
        return []
    out: list[ev.KubeletCPUsDisagreed] = []
    for pod in sorted(look.pods, key=lambda p: p.key):
        held = view.pods.get(pod.key)
        uid = held.uid if held is not None else ids.sandboxes.get(pod.key, "")
        for c in pod.containers:
            listed = frozenset(c.cpus)
            given = ids.cpus.of(uid, c.name, listed)
            state = given[1] if given is not None else frozenset()
            if listed == state or (not state and listed == ids.cpus.shared):
                continue
            if not listed and not state:
                continue
            out.append(
                ev.KubeletCPUsDisagreed(
                    pod=ev.PodRef(uid=uid, namespace=pod.namespace, name=pod.name),
                    container=c.name,
                    listed=sorted(listed),
                    checkpoint=sorted(state),
                    source=ids.cpus.source,
                )
            )
    return out


_RELEASES = (ev.KubeletDevicesReleased, ev.KubeletCPUsReleased, ev.KubeletClaimReleased, ev.KubeletPodReleased)


def release_gone(
    view: KubeletView,
    look: Look | None,
    runtime: RuntimeView | None,
    removed_uids: Iterable[str] = (),
    missing_before: frozenset[str] = frozenset(),
) -> list[ev.EventBase]:
    """The pods known gone: those whose uid is in ``removed_uids`` (the runtime removed their
    last sandbox) and, after a complete ``look``, those it does not list while the runtime
    (``runtime``: current) runs none of their containers. Without the runtime's view, a pod is
    released when this look lists some other pod and the previous complete look
    (``missing_before``) did not list it either, or lists one of its devices for another pod:
    one empty or partial answer is what a restarting kubelet gives."""
    out: list[ev.EventBase] = []
    removed = set(removed_uids)
    listed = {p.key for p in look.pods} if look is not None and look.complete else None
    for key, p in sorted(view.pods.items()):
        if p.uid and p.uid in removed:
            out.extend(release_pod(p, SANDBOX_GONE))
            continue
        if listed is None or key in listed:
            continue
        if runtime is not None:
            if not runs(runtime, p):
                out.extend(release_pod(p, NOT_LISTED_NOR_RUNNING))
        elif listed and (key in missing_before or _given_away(p, look)):
            out.extend(release_pod(p, NOT_LISTED))
    return out


def _given_away(p: ObservedPodView, look: Look | None) -> bool:
    """A device ``p`` holds is listed for another pod: the kubelet gave it away."""
    if look is None:
        return False
    held = {(r, i) for c in p.containers.values() for r, ids in c.devices.items() for i in ids}
    return any(
        (d.resource, i) in held for q in look.pods for c in q.containers for d in c.devices for i in d.device_ids
    )


def missing(view: KubeletView, look: Look) -> frozenset[str]:
    """The observed pods a complete ``look`` does not list (for the next ``release_gone``)."""
    listed = {p.key for p in look.pods}
    return frozenset(k for k in view.pods if k not in listed) if look.complete else frozenset()


def runs(runtime: RuntimeView, p: ObservedPodView) -> bool:
    """The runtime runs (or has created and not stopped) a container of the pod: of a sandbox
    with its uid, or with its name when its uid is not known. A completed pod's sandbox stays
    until the pod is deleted; its stopped containers do not hold what the kubelet gave."""
    sandboxes = {
        sid
        for sid, s in runtime.sandboxes.items()
        if (p.uid and s.uid == p.uid) or (not p.uid and (s.namespace, s.name) == (p.namespace, p.name))
    }
    return any(c.sandbox_id in sandboxes and c.state != "stopped" for c in runtime.containers.values())


def taken_from_another(view: KubeletView, look: Look) -> bool:
    """A pod of ``look`` is listed with a device that another observed pod holds: only a
    complete look can say whether that pod let it go."""
    held = {
        (resource, i): key
        for key, p in view.pods.items()
        for c in p.containers.values()
        for resource, ids in c.devices.items()
        for i in ids
    }
    for pod in look.pods:
        for c in pod.containers:
            for d in c.devices:
                if any(held.get((d.resource, i), pod.key) != pod.key for i in d.device_ids):
                    return True
    return False


#: The ``resource`` a double allocation of exclusive CPUs is found under.
CPUS = "cpu"


def held_twice(view: KubeletView, wanted: Iterable[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
    """Of ``wanted`` ((resource, device id), or (``CPUS``, CPU number as text)), those the
    kubelet lists for containers of two or more pods at once, with their holders
    ("namespace/name/container", the pod's first container with it). Two containers of one pod
    are one holder (an init container's devices and CPUs are handed on); DRA claim devices are
    not judged (a claim may be shared); a CPU in the observed shared pool is not exclusive (a
    kubelet before 1.27's GetExclusiveCPUs lists the shared pool for other containers)."""
    keys = set(wanted)
    shared = {str(c) for c in view.shared}
    holders: dict[tuple[str, str], list[str]] = {}
    for key, pod in view.pods.items():
        for cname, c in pod.containers.items():
            held = [(r, i) for r, ids in c.devices.items() for i in ids]
            held += [(CPUS, str(cpu)) for cpu in c.cpus if str(cpu) not in shared]
            for k in held:
                if k not in keys:
                    continue
                pods = holders.setdefault(k, [])
                if not any(p.startswith(f"{key}/") for p in pods):
                    pods.append(f"{key}/{cname}")
    return {k: pods for k, pods in holders.items() if len(pods) > 1}


def newly_held(events: Iterable[ev.EventBase]) -> list[tuple[str, str]]:
    """What observed events say a container holds now: (resource, device id), (``CPUS``, cpu)."""
    out: list[tuple[str, str]] = []
    for e in events:
        if isinstance(e, ev.KubeletDevicesObserved):
            out += [(e.resource, i) for i in e.device_ids]
        elif isinstance(e, ev.KubeletCPUsObserved):
            out += [(CPUS, str(c)) for c in e.cpus]
    return out


def double_allocations(view: KubeletView, events: Iterable[ev.EventBase]) -> list[ev.KubeletDoubleAllocationFound]:
    """The findings once ``events`` (observed) are applied to ``view``: each device or exclusive
    CPU they name that the kubelet now lists for two pods at once, one finding per resource and
    set of holders."""
    found: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (resource, i), pods in sorted(held_twice(view, newly_held(events)).items()):
        found.setdefault((resource, tuple(pods)), []).append(i)
    return [
        ev.KubeletDoubleAllocationFound(resource=resource, ids=ids, holders=list(pods))
        for (resource, pods), ids in found.items()
    ]


def allocatable_changes(
    view: KubeletView, devices: Mapping[str, Mapping[str, tuple[int, ...]]], cpus: Iterable[int], source: str = ""
) -> list[ev.EventBase]:
    """What the kubelet shows allocatable now against the view: one event, or none. ``source``:
    "" for ``GetAllocatableResources``, else the file the devices were read from."""
    added: dict[str, list[ev.DeviceInfo]] = {}
    removed: dict[str, list[str]] = {}
    for resource, ids in sorted(devices.items()):
        known = view.allocatable.get(resource, {})
        new = [
            ev.DeviceInfo(id=i, health="Healthy", numa_nodes=list(numa))
            for i, numa in ids.items()
            if i not in known or known[i] != list(numa)
        ]
        if new:
            added[resource] = new
    for resource, known in sorted(view.allocatable.items()):
        gone = [i for i in known if i not in devices.get(resource, {})]
        if gone:
            removed[resource] = gone
    now = sorted(set(cpus))
    cpus_added = [c for c in now if c not in view.allocatable_cpus]
    cpus_removed = [c for c in view.allocatable_cpus if c not in set(now)]
    if not (added or removed or cpus_added or cpus_removed):
        return []
    change = ev.KubeletAllocatableChanged(
        added=added, removed=removed, cpus_added=cpus_added, cpus_removed=cpus_removed, source=source
    )
    return [change]


__all__ = [
    "CPUManager",
    "Identities",
    "Look",
    "SeenClaim",
    "SeenContainer",
    "SeenDevices",
    "SeenPod",
    "CPUS",
    "allocatable_changes",
    "cpu_disagreements",
    "exclusive_cpus",
    "double_allocations",
    "held_twice",
    "identities",
    "observe",
    "missing",
    "newly_held",
    "release_gone",
    "runs",
    "taken_from_another",
    "release_pod",
]
