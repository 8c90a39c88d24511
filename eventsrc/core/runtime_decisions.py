"""What a container the runtime creates must get, and what the runtime's state asks of the log.

Pure: the NRI shell (``eventsrc.node.nri``) turns the runtime's messages into the facts below,
asks these functions, records the events they return and sends the adjustments they describe.

    container_spec(...)     a container the runtime carries, as admission reads it: CPU and
                            memory from its cgroup values (the kubelet's shares/quota arithmetic
                            undone), device counts from the pod's annotation
    placement(...)          what an admitted pod's container gets: its exclusive CPUs or the
                            shared pool, the NUMA nodes of those CPUs, and every device plugin
                            Allocate answer and prepared claim's CDI devices
    pool_updates(...)       running containers whose cpuset is not the one they must have
    reconcile(...)          at Synchronize: what the runtime has that the log does not know, and
                            what the log knows that the runtime no longer has
    vanished(...)           sandboxes a Synchronize listed that the runtime's listing (CRI) no
                            longer has: removed without an NRI event (containerd sends none for
                            the sandboxes it recovered at its start)
    not_its_pod(...)        why a sandbox is not the admitted pod whose uid it carries
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec
from msgspec import Struct

from eventsrc import events as ev
from eventsrc.core.cpu.static import CPUManagerConfig
from eventsrc.core.memory.manager import hugepage_limits
from eventsrc.core.memory.manager import numa_nodes as memory_numa_nodes
from eventsrc.state.lifecycles import ADMITTED
from eventsrc.state.views import PodView, Views

#: The pod annotation that carries device requests, which CRI does not (docs/nri.md).
RESOURCES_ANNOTATION = "eventsrc.dev/resources"

# The kubelet's cgroup arithmetic (pkg/kubelet/cm/helpers_linux.go).
MIN_SHARES = 2
SHARES_PER_CPU = 1024
QUOTA_PERIOD = 100_000


class SandboxFacts(Struct, frozen=True, kw_only=True):
    """A pod sandbox as the runtime reported it."""

    id: str
    uid: str
    namespace: str = ""
    name: str = ""
    annotations: dict[str, str] = {}


class ContainerFacts(Struct, frozen=True, kw_only=True):
    """A container as the runtime reported it; ``cpus``/``mems`` are its cpuset (empty: none)."""

    id: str
    sandbox_id: str
    name: str
    state: str = "created"  # "created", "running", "stopped", "unknown"
    cgroups_path: str = ""
    cpus: list[int] = []
    mems: list[int] = []
    devices: list[str] = []
    cdi_devices: list[str] = []
    envs: list[str] = []  # names only
    shares: int = 0
    quota: int = 0
    period: int = 0
    memory_limit: int = 0


class Placement(Struct, frozen=True, kw_only=True):
    """What one container gets. ``cpus`` None: leave the cpuset alone (policy none, or no pool
    recorded yet)."""

    cpus: list[int] | None = None
    mems: list[int] = []
    allocation: ev.ContainerAllocation = ev.ContainerAllocation()
    device_ids: dict[str, list[str]] = {}
    # hugepage limits from the memory manager's blocks: page size ("2MB") -> bytes
    hugepages: dict[str, int] = {}


class Update(Struct, frozen=True, kw_only=True):
    container_id: str
    pod_uid: str
    cpus: list[int]
    mems: list[int]


def milli_from_cgroups(shares: int, quota: int, period: int) -> tuple[int, int]:
    """(request, limit) in milli-CPUs from a container's cgroup values. The kubelet sets
    ``shares = request * 1024 / 1000`` (at least 2) and ``quota = limit * period / 1000``
    (none without a limit); this undoes both, rounding to the nearest milli-CPU."""
    request = 0 if shares <= MIN_SHARES else round(shares * 1000 / SHARES_PER_CPU)
    limit = round(quota * 1000 / (period or QUOTA_PERIOD)) if quota > 0 else 0
    return request, limit


def container_spec(facts: ContainerFacts, devices: Mapping[str, int]) -> ev.ContainerSpec:
    """The container as admission reads it. A CPU limit equal to the request together with a
    memory limit reads as Guaranteed (CRI carries no memory request: the limit stands for it,
    as nri-plugins estimate); ``devices`` come from the pod's annotation."""
    request, limit = milli_from_cgroups(facts.shares, facts.quota, facts.period)
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if request:
        requests["cpu"] = f"{request}m"
    if limit:
        limits["cpu"] = f"{limit}m"
    if facts.memory_limit > 0:
        limits["memory"] = str(facts.memory_limit)
        if request and request == limit:
            requests["memory"] = str(facts.memory_limit)
    for resource, count in sorted(devices.items()):
        requests[resource] = limits[resource] = str(count)
    return ev.ContainerSpec(name=facts.name, requests=requests, limits=limits)


def numa_nodes_of(cfg: CPUManagerConfig, cpus: list[int]) -> list[int]:
    """The NUMA nodes holding ``cpus`` (the cpuset's memory nodes), as the topology knows them."""
    details = cfg.topology.cpu_details
    return sorted({info.numa_node_id for cpu in cpus if (info := details.get(cpu)) is not None})


def memory_nodes(
    views: Views, cfg: CPUManagerConfig, pod_uid: str, container: str, cpus: list[int] | None
) -> list[int]:
    """The container's ``cpuset.mems``: its memory blocks' NUMA nodes (the kubelet's
    ``GetMemoryNUMANodes``), else the nodes holding its CPUs."""
    return memory_numa_nodes(views.memory, pod_uid, container) or (numa_nodes_of(cfg, cpus) if cpus else [])


def placement(views: Views, cfg: CPUManagerConfig, pod_uid: str, container: str) -> Placement:
    """What ``container`` of pod ``pod_uid`` gets, from what its admission recorded."""
    cpus = desired_cpus(views, cfg, pod_uid, container)
    mems = memory_nodes(views, cfg, pod_uid, container, cpus)
    hugepages = hugepage_limits(views.memory, pod_uid, container)
    pod = views.pods.pods.get(pod_uid)
    held = pod.containers.get(container) if pod is not None else None
    if held is None or handed_on_to_another(views, pod_uid, container):
        return Placement(cpus=cpus, mems=mems, hugepages=hugepages)
    envs: dict[str, str] = {}
    mounts: list[ev.Mount] = []
    devices: list[ev.DeviceSpec] = []
    annotations: dict[str, str] = {}
    cdi: list[str] = []
    for resource in sorted(held.allocations):
        a = held.allocations[resource]
        envs.update(a.envs)
        mounts += a.mounts
        devices += a.devices
        annotations.update(a.annotations)
        cdi += [name for name in a.cdi_devices if name not in cdi]
    for claim_uid in held.claims:
        claim = views.claims.claims.get(claim_uid)
        for prepared in claim.devices if claim is not None else ():
            cdi += [name for name in prepared.cdi_device_ids if name not in cdi]
    allocation = ev.ContainerAllocation(
        envs=envs, mounts=mounts, devices=devices, annotations=annotations, cdi_devices=cdi
    )
    return Placement(
        cpus=cpus,
        mems=mems,
        hugepages=hugepages,
        allocation=allocation,
        device_ids={r: list(ids) for r, ids in sorted(held.devices.items())},
    )


def desired_cpus(views: Views, cfg: CPUManagerConfig, pod_uid: str, container: str) -> list[int] | None:
    """The container's exclusive CPUs, else the shared pool; None when the policy sets no cpusets."""
    if not cfg.static:
        return None
    exclusive = views.cpus.assignments.get(pod_uid, {}).get(container)
    if exclusive and not handed_on_to_another(views, pod_uid, container):
        return sorted(exclusive)
    return sorted(views.cpus.shared) or None


def handed_on_to_another(views: Views, pod_uid: str, container: str) -> bool:
    """An init container of the pod whose exclusive CPUs or devices a later container of the
    pod holds now: created again (a container taken for an init container because it had
    exited, or a pod's init containers run again), it gets the shared pool and no devices,
    never what another container runs on."""
    pod = views.pods.pods.get(pod_uid)
    mine = pod.containers.get(container) if pod is not None else None
    if pod is None or mine is None or mine.kind != "init":
        return False
    cpus = set(views.cpus.assignments.get(pod_uid, {}).get(container, ()))
    devices = {(r, i) for r, ids in mine.devices.items() for i in ids}
    for name, c in pod.containers.items():
        if name == container or c.kind == "init":
            continue
        if cpus & set(views.cpus.assignments.get(pod_uid, {}).get(name, ())):
            return True
        if devices & {(r, i) for r, ids in c.devices.items() for i in ids}:
            return True
    return False


def pool_updates(views: Views, cfg: CPUManagerConfig) -> list[Update]:
    """Every container the runtime has (not stopped) whose recorded cpuset is not the one it
    must have now: the shared pool followed an assignment or a release."""
    out = []
    for cid, c in sorted(views.runtime.containers.items()):
        if c.state == "stopped":
            continue
        sandbox = views.runtime.sandboxes.get(c.sandbox_id)
        pod = views.pods.pods.get(c.pod_uid)
        # a sandbox with another pod's uid: the shared pool, nothing of that pod's
        uid = (
            ""
            if sandbox is not None and pod is not None and not_its_pod(pod, sandbox.namespace, sandbox.name)
            else c.pod_uid
        )
        want = desired_cpus(views, cfg, uid, c.name)
        if want is not None and want != c.cpus:
            mems = memory_nodes(views, cfg, uid, c.name, want)
            out.append(Update(container_id=cid, pod_uid=c.pod_uid, cpus=want, mems=mems))
    return out


def created_event(
    facts: ContainerFacts, pod_uid: str, adjusted: bool, got: Placement | None = None
) -> ev.ContainerCreated:
    """ContainerCreated: what the runtime reported, with eventsrc's placement laid over it when
    it adjusted the container (enforce mode)."""
    seen = ev.ContainerCreated(
        container_id=facts.id,
        sandbox_id=facts.sandbox_id,
        pod_uid=pod_uid,
        name=facts.name,
        cgroups_path=facts.cgroups_path,
        cpus=list(facts.cpus),
        mems=list(facts.mems),
        devices=list(facts.devices),
        cdi_devices=list(facts.cdi_devices),
        envs=list(facts.envs),
        adjusted=adjusted,
    )
    if got is None:
        return seen
    a = got.allocation
    return msgspec.structs.replace(
        seen,
        cpus=list(got.cpus) if got.cpus is not None else seen.cpus,
        mems=list(got.mems) if got.cpus is not None or got.mems else seen.mems,
        devices=[*seen.devices, *(d.container_path for d in a.devices if d.container_path not in seen.devices)],
        device_ids=got.device_ids,
        cdi_devices=[*seen.cdi_devices, *(n for n in a.cdi_devices if n not in seen.cdi_devices)],
        envs=sorted({*seen.envs, *a.envs}),
    )


class Reconciled(Struct, frozen=True, kw_only=True):
    """What Synchronize found: ``events`` to record (sandboxes and containers appeared or gone,
    and cpusets that are not what the log says: a container created unadjusted while eventsrc
    was away, or the runtime's own change), and ``unadmitted`` the running containers whose pods
    are not admitted (to be admitted, in enforce mode), each with its sandbox."""

    events: list[ev.EventBase] = []
    unadmitted: list[tuple[SandboxFacts, ContainerFacts]] = []


def pod_ref(sandbox: SandboxFacts) -> ev.PodRef:
    return ev.PodRef(uid=sandbox.uid, namespace=sandbox.namespace, name=sandbox.name)


def reconcile(views: Views, sandboxes: list[SandboxFacts], containers: list[ContainerFacts]) -> Reconciled:
    """The runtime's current state against the log's. Sandboxes gone make their pods owed a
    release (``owed_releases``, from the log once recorded): a pod admitted through the node
    API whose sandbox the runtime has not made yet is left alone."""
    rt = views.runtime
    have_sandboxes = {s.id: s for s in sandboxes}
    have_containers = {c.id: c for c in containers}
    events: list[ev.EventBase] = []
    for cid, c in sorted(rt.containers.items()):
        if cid not in have_containers:
            events.append(ev.ContainerRemoved(container_id=cid, pod_uid=c.pod_uid, reason="gone from the runtime"))
    for sid, s in sorted(rt.sandboxes.items()):
        if sid not in have_sandboxes:
            events.append(ev.PodSandboxRemoved(sandbox_id=sid, pod_uid=s.uid, reason="gone from the runtime"))
    for sid, found in sorted(have_sandboxes.items()):
        if sid not in rt.sandboxes:
            events.append(ev.PodSandboxStarted(sandbox_id=sid, pod=pod_ref(found)))
    unadmitted = []
    started: list[ev.EventBase] = []  # after every stop: a device an init container handed on is not in two
    for cid, now in sorted(have_containers.items()):
        sandbox = have_sandboxes.get(now.sandbox_id)
        known = rt.containers.get(cid)
        if sandbox is None:
            continue  # a container of no pod the runtime listed: nothing to attach it to
        if known is None:
            if now.state != "stopped":
                events.append(created_event(now, sandbox.uid, adjusted=False))
        else:
            mine = events
            if now.state == "running" and known.state == "created":
                mine = started
                mine.append(ev.ContainerStarted(container_id=cid, pod_uid=known.pod_uid))
            elif now.state == "stopped" and known.state != "stopped":
                events.append(ev.ContainerStopped(container_id=cid, pod_uid=known.pod_uid))
            if (now.cpus, now.mems) != (known.cpus, known.mems):
                mine.append(
                    ev.ContainerCPUsUpdated(
                        container_id=cid,
                        pod_uid=known.pod_uid,
                        cpus=list(now.cpus),
                        mems=list(now.mems),
                        reason="as the runtime reports",
                    )
                )
        pod = views.pods.pods.get(sandbox.uid)
        if now.state != "stopped" and (pod is None or pod.state != ADMITTED or grows(pod, now.name)):
            unadmitted.append((sandbox, now))
    return Reconciled(events=events + started, unadmitted=unadmitted)


def vanished(views: Views, listed: Iterable[str], present: set[str]) -> list[ev.PodSandboxRemoved]:
    """The sandboxes of ``listed`` (ids a Synchronize reported, so the runtime had them) that
    the log still holds and the runtime's listing ``present`` no longer has. A sandbox id is
    never used again, so one missing from a later listing was removed: known for sure, not
    guessed. A sandbox whose RunPodSandbox came after the listing is not judged here."""
    sandboxes = views.runtime.sandboxes
    return [
        ev.PodSandboxRemoved(sandbox_id=sid, pod_uid=sandboxes[sid].uid, reason="gone from the runtime's listing")
        for sid in sorted(set(listed))
        if sid in sandboxes and sid not in present
    ]


def grows(pod: PodView, container: str) -> bool:
    """Whether ``container`` of admitted ``pod`` is admitted at its creation (or while it
    runs, found at a Synchronize): the pod was read from the runtime's facts, one container
    at a time, and its admission has not had this one. A pod admitted whole (the node API)
    keeps its admission: a container it did not name runs in the shared pool, with no devices."""
    return pod.source == ev.FROM_RUNTIME and (container not in pod.containers or pod.growing == container)


def running_before(views: Views, pod: PodView) -> set[str]:
    """The ids of the pod's admitted containers the log holds as created or running: before
    the pod grows, the runtime is asked which of them have exited (``ContainerStopped``)."""
    return {
        cid
        for cid, c in views.runtime.containers.items()
        if c.pod_uid == pod.uid and c.state != "stopped" and c.name in pod.containers
    }


def not_its_pod(pod: PodView, namespace: str, name: str) -> str:
    """Why a sandbox named ``namespace/name`` is not ``pod``, whose uid it carries ("" when it
    is). The uid alone is not a pod's identity: whoever makes sandboxes through CRI chooses it.
    A pod recorded with no namespace and name (moved from the kubelet's checkpoints, which
    keep none: ``eventsrc import-kubelet``) is known by its uid alone."""
    if (pod.namespace, pod.name) in ((namespace, name), ("", "")):
        return ""
    return f"its uid {pod.uid} is pod {pod.namespace}/{pod.name}'s, not {namespace}/{name}'s"


class Admission(Struct, frozen=True, kw_only=True):
    """What a container's creation asks of eventsrc, decided once for both NRI modes
    (``admission_for``): ``refused`` (why the sandbox is not the pod its uid names), else
    whether the pod must be ``admitted`` now, and whether it ``grows`` (admitted already, this
    container is new to its admission: the exits of its containers come first)."""

    refused: str = ""
    admit: bool = False
    grows: bool = False


def admission_for(views: Views, sandbox: SandboxFacts, container: str) -> Admission:
    """Whether creating ``container`` in ``sandbox`` needs an admission: the pod is not
    admitted yet (new, or admitting), or it is and grows by this container."""
    pod = views.pods.pods.get(sandbox.uid)
    if pod is None:
        return Admission(admit=True)
    why_not = not_its_pod(pod, sandbox.namespace, sandbox.name)
    if why_not:
        return Admission(refused=why_not)
    if pod.state != ADMITTED:
        return Admission(admit=True)
    return Admission(admit=True, grows=True) if grows(pod, container) else Admission()


#: the runtime's StateChange events eventsrc records (NRI's ``Event`` names)
RUN_POD_SANDBOX, REMOVE_POD_SANDBOX = "RUN_POD_SANDBOX", "REMOVE_POD_SANDBOX"
POST_CREATE_CONTAINER, START_CONTAINER = "POST_CREATE_CONTAINER", "START_CONTAINER"
POST_UPDATE_CONTAINER, REMOVE_CONTAINER = "POST_UPDATE_CONTAINER", "REMOVE_CONTAINER"


def state_events(
    views: Views, event: str, sandbox: SandboxFacts, container: ContainerFacts | None
) -> list[ev.EventBase]:
    """What a runtime's StateChange (``event``, an NRI event name) says, as events, against the
    views as they are: a sandbox run or removed, a container created, started, updated (only
    when its cpuset changed) or removed. A sandbox is recorded as it is, even one whose uid
    names another pod: the runtime has it (refusing it, containerd 2.1 leaves its pause
    process running); its containers are refused at CreateContainer, and its removal owes that
    pod nothing (``state.runtime``)."""
    if event == RUN_POD_SANDBOX:
        return [ev.PodSandboxStarted(sandbox_id=sandbox.id, pod=pod_ref(sandbox))]
    if event == REMOVE_POD_SANDBOX:
        return [ev.PodSandboxRemoved(sandbox_id=sandbox.id, pod_uid=sandbox.uid, reason="removed by the runtime")]
    if container is None:
        return []
    if event == POST_CREATE_CONTAINER:
        return [created_event(container, sandbox.uid, adjusted=False)]
    if event == START_CONTAINER:
        return [ev.ContainerStarted(container_id=container.id, pod_uid=sandbox.uid)]
    if event == POST_UPDATE_CONTAINER:
        known = views.runtime.containers.get(container.id)
        if known is not None and (known.cpus, known.mems) == (container.cpus, container.mems):
            return []
        cpus, mems = container.cpus, container.mems
        reason = "updated by the runtime"
        return [
            ev.ContainerCPUsUpdated(container_id=container.id, pod_uid=sandbox.uid, cpus=cpus, mems=mems, reason=reason)
        ]
    if event == REMOVE_CONTAINER:
        return [ev.ContainerRemoved(container_id=container.id, pod_uid=sandbox.uid)]
    return []


def owed_releases(views: Views) -> list[str]:
    """Pods whose last sandbox the log saw removed and that still hold what they were given:
    each is released (``pod sandbox removed``); after a crash, the next start finds them here."""
    return sorted(uid for uid in views.runtime.gone if uid in views.pods.pods)


def devices_shared(views: Views, container_id: str) -> list[str]:
    """The devices running container ``container_id`` runs with that another running container
    runs with too (the ``replay --check`` rule ``device-in-two-containers``). A device handed on
    from an init container is not shared: the init container stopped first."""
    c = views.runtime.containers.get(container_id)
    if c is None or c.state != "running" or not c.device_ids:
        return []
    mine = {(resource, i) for resource, ids in c.device_ids.items() for i in ids}
    out = []
    for other_id, other in sorted(views.runtime.containers.items()):
        if other_id == container_id or other.state != "running":
            continue
        both = sorted(mine & {(resource, i) for resource, ids in other.device_ids.items() for i in ids})
        for resource, device in both:
            out.append(
                f"{resource} device {device} also runs in container {other.name} ({other_id}) of pod {other.pod_uid}"
            )
    return out


def container_not_held(views: Views, container_id: str) -> list[str]:
    """Why container ``container_id`` (as the views hold it, after its ContainerCreated or
    ContainerCPUsUpdated) runs with CPUs or devices its pod does not hold: the ``replay --check``
    rule. Only containers eventsrc adjusted are judged; an observed runtime answers to its kubelet."""
    c = views.runtime.containers.get(container_id)
    if c is None or not c.adjusted:
        return []
    out = []
    pod = views.pods.pods.get(c.pod_uid)
    held = pod.containers.get(c.name) if pod is not None else None
    exclusive = sorted(views.cpus.assignments.get(c.pod_uid, {}).get(c.name, []))
    shared = set(views.cpus.shared)
    if exclusive and exclusive != c.cpus:
        out.append(f"runs on CPUs {c.cpus} but its pod holds {exclusive}")
    elif not exclusive and c.cpus and shared and set(c.cpus) - shared:
        out.append(f"runs on CPUs {sorted(set(c.cpus) - shared)} outside the shared pool {sorted(shared)}")
    for resource, ids in sorted(c.device_ids.items()):
        have = list(held.devices.get(resource, ())) if held is not None else []
        if sorted(ids) != sorted(have):
            out.append(f"runs with {resource} devices {ids} but its pod holds {have}")
    return out
