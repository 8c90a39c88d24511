"""Which devices a pod's containers get: the kubelet's devicesToAllocate, as a pure planner.

The kubelet's steps, in its order (pkg/kubelet/cm/devicemanager/manager.go):

1. a container that already holds devices for the resource keeps them; a changed count
   is an error; then a resource no plugin is registered for (dropped after its grace
   period while a pod holds its devices) is refused, as is one without a healthy device;
   the devices held must still be healthy;
2. devices left by earlier non-restartable init containers of the same pod are reused
   first (not health-checked, as the kubelet does);
3. the rest comes from healthy devices nobody holds, split by the topology hint into
   aligned / unaligned / no-affinity (everything is no-affinity without a hint);
4. GetPreferredAllocation is asked when the plugin offers it: when more aligned devices
   are free than needed, among the aligned ones; otherwise, once the aligned ones are
   taken, among all available. Its answer is intersected with the candidates and topped
   up by the daemon.

Where the kubelet takes "any" device (a Go map's random order), eventsrc takes them in
a deterministic NUMA-packing order: devices on the fewest NUMA nodes that can hold the
request first, then by natural device-id order. Same rules, repeatable choices.

``DeviceProvider`` is the device manager for one pod, as the topology manager's hint
provider (``topology_manager.HintProvider``): a container's (or the pod's) hints, then a
container's devices. Its allocation is a generator: it yields a ``PreferredAsk`` whenever
the plugin must be asked and receives the plugin's answer (a list of ids, or a
``PreferredFailed``); the steps go to its ``PodPlan``. ``plan_pod`` drives it alone over a
pod. No I/O happens here; the shell does the asking.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from eventsrc.core.topology_manager import ProviderHints, TopologyHint
from eventsrc.events import ContainerSpec
from eventsrc.state.devices import DeviceSets, NumaSet, device_order, natural_key, numa_set
from eventsrc.state.views import DeviceView


class Refusal(Exception):
    """The pod cannot get its devices; the message is the kubelet's reason."""


def unregistered(resource: str) -> str:
    """devicesToAllocate's words for a resource no plugin is registered for."""
    return f"cannot allocate unregistered device {resource}"


# --------------------------------------------------------------------------- topology hints


@dataclass(frozen=True)
class Hint:
    nodes: frozenset[int]
    preferred: bool

    def sort_key(self) -> tuple[bool, int, int]:
        # The kubelet's LessThan: preferred first, then narrower, then the lower mask.
        return (not self.preferred, len(self.nodes), sum(1 << n for n in self.nodes))


def aligned_nodes(device_nodes: Iterable[int], machine_numa_nodes: Collection[int]) -> list[int]:
    """A device's NUMA nodes as alignment uses them: none at all when the plugin named one
    the machine does not have (the device then counts as having no topology, as the
    kubelet's devices without one do), so that hints stay within the machine's nodes."""
    nodes = list(device_nodes)
    return nodes if all(n in machine_numa_nodes for n in nodes) else []


def _hints(
    everywhere: Mapping[NumaSet, int],
    free: Mapping[NumaSet, int],
    reusable: list[list[int] | None],
    request: int,
    numa_nodes: list[int],
) -> list[Hint]:
    """generateDeviceTopologyHints from the counts per NUMA set of every device and of the available ones,
    and the NUMA nodes of each reusable device."""
    min_size = len(numa_nodes)
    hints: list[Hint] = []
    for size in range(1, len(numa_nodes) + 1):
        for combo in itertools.combinations(numa_nodes, size):
            mask = frozenset(combo)
            if sum(n for nodes, n in everywhere.items() if not mask.isdisjoint(nodes)) >= request:
                min_size = min(min_size, size)
            count = 0
            ok = True
            for nodes in reusable:
                if not nodes:
                    # No topology (the kubelet's Topology == nil, or an unknown device): skipped.
                    continue
                if mask.isdisjoint(nodes):
                    ok = False
                    break
                count += 1
            if not ok:
                continue
            count += sum(n for nodes, n in free.items() if not mask.isdisjoint(nodes))
            if count >= request:
                hints.append(Hint(mask, False))
    return [Hint(h.nodes, len(h.nodes) == min_size) for h in hints]


def changed_request(pod_uid: str, container: str, resource: str, got: int, wanted: int) -> str:
    """The kubelet's words for a known container whose device request changed."""
    return f'pod "{pod_uid}" container "{container}" changed request for resource "{resource}" from {got} to {wanted}'


def _count_per_set(node_lists: Iterable[list[int] | None]) -> dict[NumaSet, int]:
    """How many devices sit on each distinct NUMA set (devices without topology left out)."""
    per_set: dict[NumaSet, int] = {}
    for nodes in node_lists:
        if nodes:
            key = numa_set(nodes)  # at most 2**n - 1 keys on n nodes, whatever a plugin lists
            per_set[key] = per_set.get(key, 0) + 1
    return per_set


def _aligned_set(nodes: NumaSet, machine: Collection[int]) -> NumaSet:
    """``aligned_nodes`` of a NUMA set."""
    return nodes if all(n in machine for n in nodes) else ()


def _aligned_counts(per_set: Mapping[NumaSet, int], machine: Collection[int]) -> dict[NumaSet, int]:
    """Counts per NUMA set, as alignment sees the sets (those with topology only)."""
    out: dict[NumaSet, int] = {}
    for nodes, n in per_set.items():
        if n > 0 and (key := _aligned_set(nodes, machine)):
            out[key] = out.get(key, 0) + n
    return out


def _every_set(table: Mapping[str, DeviceView]) -> dict[NumaSet, int]:
    """Every device of ``table`` per NUMA set (those without topology under ``()``)."""
    per_set: dict[NumaSet, int] = {}
    for d in table.values():
        key = numa_set(d.numa_nodes)
        per_set[key] = per_set.get(key, 0) + 1
    return per_set


def container_hints(
    table: Mapping[str, DeviceView],
    held_by_container: Iterable[str],
    in_use: Iterable[str],
    reusable: Iterable[str],
    request: int,
    numa_nodes: list[int],
    *,
    free: DeviceSets | None = None,
    everywhere: Mapping[NumaSet, int] | None = None,
) -> list[Hint] | None:
    """GetTopologyHints for one resource of one container: None means "no preference"
    (no device has topology); an empty list means it cannot be satisfied.

    ``free`` (the healthy devices nobody holds; ``in_use`` then need only name the ones
    this pod took since) and ``everywhere`` (every device per NUMA set) come from the
    views' index (``state.devices.index_of``); without them they are worked out from
    ``table``."""
    machine = frozenset(numa_nodes)
    every = _aligned_counts(_every_set(table) if everywhere is None else everywhere, machine)
    if not every:
        return None

    def nodes_of(device_id: str) -> list[int] | None:
        d = table.get(device_id)
        return None if d is None else aligned_nodes(d.numa_nodes, machine)

    held = list(held_by_container)
    if held:
        if len(held) != request:
            return []
        return _sorted(_hints(every, _count_per_set(nodes_of(i) for i in held), [], request, numa_nodes))
    used = set(in_use)
    reuse = list(reusable)
    if free is None:
        ids = [i for i, d in table.items() if d.health == "Healthy" and i not in used]
        free_counts = _count_per_set(nodes_of(i) for i in ids)
        free_ids: Collection[str] = set(ids)
    else:
        pool = _Pool(free, used)
        free_counts = _aligned_counts(pool.counts(), machine)
        free_ids = pool
    if len(free_ids) + len({i for i in reuse if i not in free_ids}) < request:
        return []
    return _sorted(_hints(every, free_counts, [nodes_of(i) for i in reuse], request, numa_nodes))


def _sorted(hints: list[Hint]) -> list[Hint]:
    return sorted(hints, key=Hint.sort_key)


def filter_by_affinity(
    available: Iterable[str],
    table: Mapping[str, DeviceView],
    hint: frozenset[int] | None,
    numa_nodes: Collection[int] | None = None,
) -> tuple[set[str], set[str], set[str]]:
    """(aligned, unaligned, no affinity), as the kubelet splits the available devices; with
    ``numa_nodes`` (the machine's), a device on a node outside them has no affinity."""
    available = set(available)
    machine = None if numa_nodes is None else frozenset(numa_nodes)

    def nodes_of(d: DeviceView) -> list[int]:
        return d.numa_nodes if machine is None else aligned_nodes(d.numa_nodes, machine)

    if hint is None or not any(nodes_of(d) for d in table.values()):
        return set(), set(), available
    aligned, unaligned, none = set(), set(), set()
    for device_id in available:
        nodes = nodes_of(table[device_id]) if device_id in table else []
        if not nodes:
            none.add(device_id)
        elif hint.intersection(nodes):
            aligned.add(device_id)
        else:
            unaligned.add(device_id)
    return aligned, unaligned, none


@dataclass(frozen=True)
class _Pool(Collection[str]):
    """Candidate devices without a pass over them: those of ``sets`` (on the NUMA sets
    ``on``, all when None) but ``minus``. Counting it costs the sets and ``minus``."""

    sets: DeviceSets
    minus: Collection[str] = frozenset()
    on: frozenset[NumaSet] | None = None

    @classmethod
    def of(cls, ids: Iterable[str], table: Mapping[str, DeviceView]) -> _Pool:
        return cls(DeviceSets.of((i, table[i].numa_nodes if i in table else ()) for i in ids))

    def __contains__(self, device_id: object) -> bool:
        key = self.sets.set_of.get(device_id) if isinstance(device_id, str) else None
        return key is not None and device_id not in self.minus and (self.on is None or key in self.on)

    def lists(self) -> Iterator[tuple[NumaSet, list[str]]]:
        """Each NUMA set's ids (``minus`` still in them), in ``device_order``."""
        for key, ids in self.sets.by_set.items():
            if self.on is None or key in self.on:
                yield key, ids

    def counts(self) -> dict[NumaSet, int]:
        out = {key: len(ids) for key, ids in self.lists()}
        for device_id in self.minus:
            key = self.sets.set_of.get(device_id)
            if key is not None and key in out:
                out[key] -= 1
        return out

    def __len__(self) -> int:
        return sum(self.counts().values())

    def __iter__(self) -> Iterator[str]:
        return (i for _, ids in self.lists() for i in ids if i not in self.minus)

    def only(self, on: Iterable[NumaSet]) -> _Pool:
        return _Pool(self.sets, self.minus, frozenset(on))

    def without(self, ids: Collection[str]) -> _Pool:
        return _Pool(self.sets, {*self.minus, *ids}, self.on) if ids else self


def _split_by_affinity(
    available: _Pool, everywhere: Mapping[NumaSet, int], hint: frozenset[int] | None, numa_nodes: Collection[int]
) -> tuple[_Pool, _Pool, _Pool]:
    """filter_by_affinity, with the machine's nodes, of a pool: whole NUMA sets at a time."""
    machine = frozenset(numa_nodes)
    if hint is None or not _aligned_counts(everywhere, machine):
        return available.only(()), available.only(()), available
    aligned: list[NumaSet] = []
    unaligned: list[NumaSet] = []
    none: list[NumaSet] = []
    for key, _ in available.lists():
        nodes = _aligned_set(key, machine)
        (none if not nodes else aligned if hint.intersection(nodes) else unaligned).append(key)
    return available.only(aligned), available.only(unaligned), available.only(none)


# --------------------------------------------------------------------------- the planner


#: The topology manager, asked per container: (container, its device hints per resource)
#: -> the container's NUMA affinity (None: no preference); raises Refusal to reject.
AffinityOf = Callable[[ContainerSpec, dict[str, "list[Hint] | None"]], "frozenset[int] | None"]


@dataclass(frozen=True)
class PreferredAsk:
    """Ask the plugin of ``resource`` (GetPreferredAllocation) on behalf of ``container``."""

    container: str
    resource: str
    available: list[str]
    must_include: list[str]
    size: int


@dataclass(frozen=True)
class PreferredFailed:
    reason: str


@dataclass(frozen=True)
class Step:
    container: str
    resource: str
    device_ids: list[str]
    choice: str  # "kept", "reused", "plugin", "daemon"
    note: str = ""
    new: bool = True  # False when the container already had them: no Allocate call


@dataclass
class PodPlan:
    steps: list[Step] = field(default_factory=list)


@dataclass
class ResourceState:
    """What the planner needs to know about one resource.

    The admission hands over the views' index (``state.devices.index_of``): ``free``,
    ``everywhere`` and ``healthy``, and ``in_use`` empty; the planner then costs the same
    whatever the number of devices. Without them, they are worked out from ``table`` and
    ``in_use`` (every device held) once."""

    table: Mapping[str, DeviceView]  # every device of the resource, with health and NUMA
    # held by any container beside ``free`` (this pod's earlier steps are added as it goes)
    in_use: set[str]
    offers_preferred: bool = False
    free: DeviceSets | None = None  # healthy, listed devices nobody holds, per NUMA set
    everywhere: Mapping[NumaSet, int] | None = None  # every device per NUMA set
    healthy: int | None = None  # healthy, listed devices, held or not
    # False: no plugin is registered for it (dropped after its grace period) while a pod still
    # holds its devices, which keeps it a device plugin resource (isDevicePluginResource).
    registered: bool = True
    _listed: DeviceSets | None = field(default=None, repr=False)  # without ``free``: the healthy, listed ones

    def free_sets(self) -> DeviceSets:
        if self.free is not None:
            return self.free
        if self._listed is None:
            self._listed = DeviceSets.of(
                (i, d.numa_nodes) for i, d in self.table.items() if d.health == "Healthy" and not d.removed
            )
        return self._listed

    def every_set(self) -> Mapping[NumaSet, int]:
        if self.everywhere is None:
            self.everywhere = _every_set(self.table)
        return self.everywhere

    def healthy_count(self) -> int:
        if self.healthy is None:
            self.healthy = sum(1 for d in self.table.values() if d.health == "Healthy" and not d.removed)
        return self.healthy

    def is_healthy(self, device_id: str) -> bool:
        d = self.table.get(device_id)
        return d is not None and d.health == "Healthy" and not d.removed


def _packing_order(
    ids: Iterable[str], table: Mapping[str, DeviceView], needed: int, numa_nodes: list[int]
) -> list[str]:
    """The first ``needed`` devices in packing order: those on the narrowest NUMA set that
    can hold ``needed`` among ``ids`` first (the lowest such set on a tie), then by NUMA
    nodes, then by natural id."""
    return _pack(_Pool.of(ids, table), needed, numa_nodes)


def _pack(pool: _Pool, needed: int, numa_nodes: list[int]) -> list[str]:
    """``_packing_order`` of a pool: a pass over its NUMA sets, then over the ids it takes
    (those of ``pool.minus`` passed over on the way), never over the rest."""
    if needed <= 0:
        return []
    machine = frozenset(numa_nodes)
    lists: dict[NumaSet, list[list[str]]] = {}  # per set as alignment sees it: the sets' lists
    for key, ids in pool.lists():
        lists.setdefault(_aligned_set(key, machine), []).append(ids)
    # Count per distinct node set once; then each mask is a sum over the few sets.
    per_set = _aligned_counts(pool.counts(), machine)
    best = _narrowest_holding(sorted(machine), per_set, needed)

    def order(nodes: NumaSet) -> tuple[bool, NumaSet]:
        inside = bool(best) and bool(nodes) and best.issuperset(nodes)
        return (not inside, nodes or (1 << 30,))

    out: list[str] = []
    for nodes in sorted(lists, key=order):
        same = lists[nodes]
        for i in same[0] if len(same) == 1 else heapq.merge(*same, key=device_order):
            if i not in pool.minus:
                out.append(i)
                if len(out) == needed:
                    return out
    return out


# Above this many NUMA nodes, the packing order's mask is found greedily: every subset would be
# 2**n masks, and the none policy (which alone can run on such a machine) checks no count.
MAX_EXACT_PACKING_NODES = 10


def _narrowest_holding(numa_nodes: list[int], per_set: Mapping[tuple[int, ...], int], needed: int) -> frozenset[int]:
    """The narrowest (then lowest) mask of ``numa_nodes`` whose devices can hold ``needed``;
    empty when none can. Past MAX_EXACT_PACKING_NODES nodes, the nodes with the most devices
    are added one by one instead (a mask that holds, not always the narrowest)."""

    def holds(mask: frozenset[int]) -> bool:
        return sum(n for nodes, n in per_set.items() if not mask.isdisjoint(nodes)) >= needed

    if not numa_nodes or not per_set:
        return frozenset()
    if len(numa_nodes) <= MAX_EXACT_PACKING_NODES:
        for size in range(1, len(numa_nodes) + 1):
            for combo in itertools.combinations(numa_nodes, size):
                if holds(mask := frozenset(combo)):
                    return mask
        return frozenset()
    on: dict[int, int] = {}
    for nodes, n in per_set.items():
        for node in nodes:
            on[node] = on.get(node, 0) + n
    chosen: set[int] = set()
    for node in sorted(numa_nodes, key=lambda x: (-on.get(x, 0), x)):
        chosen.add(node)
        if holds(frozenset(chosen)):
            return frozenset(chosen)
    return frozenset()


def pod_request(containers: list[ContainerSpec], requests: Mapping[str, Mapping[str, int]], resource: str) -> int:
    """The pod-level device count: the larger of the biggest init container and the rest."""
    init = max((requests[c.name].get(resource, 0) for c in containers if c.kind == "init"), default=0)
    rest = sum(requests[c.name].get(resource, 0) for c in containers if c.kind != "init")
    return max(init, rest)


@dataclass
class DeviceProvider:
    """The device manager for one pod, as the topology manager's hint provider: hints for a
    container (or the pod), then its devices, container by container in admission order.

    ``requests[container][resource]`` is the device count; ``resources`` the device plugin
    resources (the kubelet's isDevicePluginResource: a registered plugin's, or one dropped
    while a pod still holds its devices, ``registered`` False); ``held`` what each
    (container, resource) already holds; ``numa_nodes`` the machine's. A request for any
    other resource is no device manager's: it gives no hint for it and allocates nothing (the
    kubelet's predicate admit handler has it). What the pod takes as it goes is added to each
    resource's ``in_use``, and ``plan`` gets a step per (container, resource).
    """

    requests: Mapping[str, Mapping[str, int]]
    resources: Mapping[str, ResourceState]
    held: Mapping[tuple[str, str], list[str]]
    numa_nodes: list[int]
    pod_uid: str = ""
    # devicesToReuse, per resource: seeded with what the pod's earlier init containers hand on
    # (a pod admitted container by container), then kept as the containers are planned
    reusable: dict[str, set[str]] = field(default_factory=dict)
    plan: PodPlan = field(default_factory=PodPlan, init=False)

    def hints(self, c: ContainerSpec) -> dict[str, list[Hint] | None]:
        """GetTopologyHints: per device plugin resource the container asks for."""
        out: dict[str, list[Hint] | None] = {}
        for resource, required in sorted(self.requests.get(c.name, {}).items()):
            if resource in self.resources:
                st = self.resources[resource]
                out[resource] = container_hints(
                    st.table,
                    self.held.get((c.name, resource), []),
                    st.in_use,
                    self.reusable.get(resource, set()),
                    required,
                    self.numa_nodes,
                    free=st.free,
                    everywhere=st.every_set(),
                )
        return out

    def pod_hints(self, containers: list[ContainerSpec]) -> dict[str, list[Hint] | None]:
        """GetPodTopologyHints: per resource, the pod-level count, with every device a
        container of the pod holds."""
        out: dict[str, list[Hint] | None] = {}
        for resource, st in self.resources.items():
            n = pod_request(containers, self.requests, resource)
            pod_held = [i for (_, r), ids in self.held.items() if r == resource for i in ids]
            reuse = sorted(self.reusable.get(resource, set()))
            out[resource] = container_hints(
                st.table, pod_held, st.in_use, reuse, n, self.numa_nodes, free=st.free, everywhere=st.every_set()
            )
        return out

    def topology_hints(self, container: ContainerSpec) -> ProviderHints:
        return _provider_hints(self.hints(container))

    def pod_topology_hints(self, containers: list[ContainerSpec]) -> ProviderHints:
        return _provider_hints(self.pod_hints(containers))

    def allocate(
        self, container: ContainerSpec, hint: TopologyHint
    ) -> Generator[PreferredAsk, list[str] | PreferredFailed, None]:
        """Allocate (allocateContainerResources): the container's devices, device plugin
        resource by resource, within the hint's nodes."""
        nodes = hint.nodes()
        affinity = frozenset(nodes) if nodes else None
        for resource in sorted(self.requests.get(container.name, {})):
            if resource in self.resources:  # isDevicePluginResource
                yield from self.allocate_resource(container, resource, affinity)

    def allocate_resource(
        self, c: ContainerSpec, resource: str, affinity: frozenset[int] | None
    ) -> Generator[PreferredAsk, list[str] | PreferredFailed, None]:
        """One resource of the container: devicesToAllocate (a resource with no state here
        has no healthyDevices entry: unregistered), then the devices it took count as in
        use, and an init container's are there for the containers after it."""
        if resource not in self.resources:
            raise Refusal(unregistered(resource))
        state = self.resources[resource]
        reusable = self.reusable.setdefault(resource, set())
        step = yield from _devices_to_allocate(
            c.name,
            resource,
            self.requests[c.name][resource],
            state,
            list(self.held.get((c.name, resource), [])),
            reusable,
            affinity,
            self.numa_nodes,
            self.pod_uid,
        )
        self.plan.steps.append(step)
        state.in_use.update(step.device_ids)
        ids = set(step.device_ids)
        if c.kind == "init":
            reusable |= ids
        else:
            reusable -= ids


def _provider_hints(hints: Mapping[str, list[Hint] | None]) -> ProviderHints:
    return {
        r: None if h is None else [TopologyHint.of(sorted(x.nodes), x.preferred) for x in h] for r, h in hints.items()
    }


def plan_pod(
    containers: list[ContainerSpec],
    requests: Mapping[str, Mapping[str, int]],
    resources: Mapping[str, ResourceState],
    held: Mapping[tuple[str, str], list[str]] | None = None,
    hints: Mapping[tuple[str, str], frozenset[int] | None] | None = None,
    numa_nodes: list[int] | None = None,
    pod_uid: str = "",
    affinity_of: AffinityOf | None = None,
) -> Generator[PreferredAsk, list[str] | PreferredFailed, PodPlan]:
    """Plan every container's devices, in admission order (init containers first): the
    device manager alone, with the ``DeviceProvider``.

    ``hints`` is the topology manager's NUMA affinity for each (container, resource), None
    for no preference. With ``affinity_of``, the topology manager is asked instead,
    container by container, with this container's device hints computed after the previous
    containers got theirs (its container scope); it returns the container's NUMA affinity
    or raises Refusal. Raises Refusal.
    """
    hints = hints or {}
    nodes_all = (
        numa_nodes
        if numa_nodes is not None
        else sorted({n for r in resources.values() for nodes in r.every_set() for n in nodes})
    )
    devices = DeviceProvider(requests, resources, held or {}, nodes_all, pod_uid)
    for c in containers:
        container_affinity = None if affinity_of is None else affinity_of(c, devices.hints(c))
        for resource in sorted(requests.get(c.name, {})):
            affinity = container_affinity if affinity_of is not None else hints.get((c.name, resource))
            yield from devices.allocate_resource(c, resource, affinity)
    return devices.plan


def _devices_to_allocate(
    container: str,
    resource: str,
    required: int,
    state: ResourceState,
    current: list[str],
    reusable: set[str],
    hint: frozenset[int] | None,
    numa_nodes: list[int],
    pod_uid: str = "",
) -> Generator[PreferredAsk, list[str] | PreferredFailed, Step]:
    table = state.table
    if current and len(current) != required:
        raise Refusal(changed_request(pod_uid, container, resource, len(current), required))
    if not state.registered:
        raise Refusal(unregistered(resource))
    if not state.healthy_count():
        raise Refusal(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
    if current:
        if not all(state.is_healthy(i) for i in current):
            raise Refusal(
                f"previously allocated devices are no longer healthy; cannot allocate unhealthy devices {resource}"
            )
        return Step(container, resource, sorted(current, key=natural_key), "kept", new=False)

    needed = required
    allocated: list[str] = []

    def take(candidates: _Pool | Iterable[str]) -> bool:
        nonlocal needed
        if isinstance(candidates, _Pool):
            pool = candidates.without(allocated)
        else:
            taken = set(allocated)
            pool = _Pool.of([i for i in candidates if i not in taken], table)
        for i in _pack(pool, needed, numa_nodes):
            allocated.append(i)
            needed -= 1
        return needed == 0

    def done(choice: str, note: str = "") -> Step:
        return Step(container, resource, allocated, choice, note)

    if take(reusable):
        return done("reused")
    # healthy - in_use - allocated, as the index has it: no pass over the devices
    available = _Pool(state.free_sets(), state.in_use.union(allocated))
    if (count := len(available)) < needed:
        raise Refusal(
            f"requested number of devices unavailable for {resource}. Requested: {needed}, Available: {count}"
        )
    aligned, unaligned, no_affinity = _split_by_affinity(available, state.every_set(), hint, numa_nodes)
    choice, note = "daemon", ""

    def ask(candidates: _Pool) -> Generator[PreferredAsk, list[str] | PreferredFailed, set[str]]:
        nonlocal choice, note
        if not state.offers_preferred:
            return set()
        answer = yield PreferredAsk(
            container,
            resource,
            sorted({*candidates, *allocated}, key=device_order),
            sorted(allocated, key=device_order),
            required,
        )
        if isinstance(answer, PreferredFailed):
            note = f"GetPreferredAllocation failed, the daemon chose instead: {answer.reason}"
            return set()
        preferred = {i for i in answer if i in candidates}
        choice = "plugin"
        # what it was asked to include (the container's devices already, e.g. an init
        # container's it reuses) is no fault of the plugin's: only a device it was not offered is
        if any(i not in candidates and i not in allocated for i in answer):
            note = "the plugin's preference named devices that were not candidates; they were ignored"
        return preferred

    if needed < len(aligned):
        preferred = yield from ask(aligned)
        if take(preferred) or take(aligned):
            return done(choice, note)
    else:
        if take(aligned):
            return done("daemon")
        preferred = yield from ask(available)
        if take(preferred) or take(unaligned) or take(no_affinity):
            return done(choice, note)
    raise Refusal(
        f"unexpectedly allocated less resources than required. Requested: {required}, Got: {required - needed}"
    )
