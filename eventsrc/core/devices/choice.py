"""Which devices a pod's containers get: the kubelet's devicesToAllocate, as a pure planner.

The kubelet's steps, in its order (pkg/kubelet/cm/devicemanager/manager.go):

1. a container that already holds devices for the resource keeps them; a changed count
   is an error; they must still be healthy;
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

The planner is a generator: it yields a ``PreferredAsk`` whenever the plugin must be
asked and receives the plugin's answer (a list of ids, or a ``PreferredFailed``). It
returns the ``PodPlan``. No I/O happens here; the shell does the asking.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import re
from collections.abc import Callable, Collection, Generator, Iterable, Mapping
from dataclasses import dataclass, field

from eventsrc.events import ContainerSpec
from eventsrc.state.views import DeviceView

_DIGITS = re.compile(r"(\d+)")


class Refusal(Exception):
    """The pod cannot get its devices; the message is the kubelet's reason."""


@functools.lru_cache(maxsize=1 << 16)
def natural_key(device_id: str) -> tuple[object, ...]:
    """``dev-2`` before ``dev-10``."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(device_id))


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


def generate_hints(
    devices: Mapping[str, list[int]],
    available: Iterable[str],
    reusable: Iterable[str],
    request: int,
    numa_nodes: list[int],
) -> list[Hint]:
    """generateDeviceTopologyHints: every NUMA mask that can hold ``request`` devices.

    ``devices`` is every device of the resource (any health) with its NUMA nodes;
    ``preferred`` marks the masks as narrow as the narrowest that could hold the request
    on an empty node.
    """
    reusable = list(reusable)
    # Devices are counted per distinct NUMA set once: each mask is then a sum over the
    # few sets, not a pass over every device (the same counts as the kubelet's loops).
    everywhere = _count_per_set(devices.values())
    free = _count_per_set(devices.get(i) for i in available)
    min_size = len(numa_nodes)
    hints: list[Hint] = []
    for size in range(1, len(numa_nodes) + 1):
        for combo in itertools.combinations(numa_nodes, size):
            mask = frozenset(combo)
            if sum(n for nodes, n in everywhere.items() if not mask.isdisjoint(nodes)) >= request:
                min_size = min(min_size, size)
            count = 0
            ok = True
            for device_id in reusable:
                nodes = devices.get(device_id)
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


def _count_per_set(node_lists: Iterable[list[int] | None]) -> dict[tuple[int, ...], int]:
    """How many devices sit on each distinct NUMA set (devices without topology left out)."""
    per_set: dict[tuple[int, ...], int] = {}
    for nodes in node_lists:
        if nodes:
            key = tuple(sorted(set(nodes)))  # at most 2**n - 1 keys on n nodes, whatever a plugin lists
            per_set[key] = per_set.get(key, 0) + 1
    return per_set


def container_hints(
    table: Mapping[str, DeviceView],
    held_by_container: Iterable[str],
    in_use: Iterable[str],
    reusable: Iterable[str],
    request: int,
    numa_nodes: list[int],
) -> list[Hint] | None:
    """GetTopologyHints for one resource of one container: None means "no preference"
    (no device has topology); an empty list means it cannot be satisfied."""
    machine = frozenset(numa_nodes)
    topology = {i: aligned_nodes(d.numa_nodes, machine) for i, d in table.items()}
    if not any(topology.values()):
        return None
    held = list(held_by_container)
    if held:
        if len(held) != request:
            return []
        return _sorted(generate_hints(topology, held, [], request, numa_nodes))
    used = set(in_use)
    free = [i for i, d in table.items() if d.health == "Healthy" and i not in used]
    reuse = list(reusable)
    if len(set(free) | set(reuse)) < request:
        return []
    return _sorted(generate_hints(topology, free, reuse, request, numa_nodes))


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
    """What the planner needs to know about one resource."""

    table: Mapping[str, DeviceView]  # every device of the resource, with health and NUMA
    in_use: set[str]  # held by any container (this pod's earlier steps are added as it goes)
    offers_preferred: bool = False


def _packing_order(
    ids: Iterable[str], table: Mapping[str, DeviceView], needed: int, numa_nodes: list[int]
) -> list[str]:
    """The first ``needed`` devices in packing order: those on the narrowest NUMA set that
    can hold ``needed`` among ``ids`` first (the lowest such set on a tie), then by NUMA
    nodes, then by natural id."""
    ids = list(ids)
    if needed <= 0 or not ids:
        return []
    machine = frozenset(numa_nodes)
    nodes_of = {i: tuple(sorted(set(aligned_nodes(table[i].numa_nodes, machine)))) if i in table else () for i in ids}
    # Count per distinct node set once; then each mask is a sum over the few sets.
    per_set = _count_per_set(list(n) for n in nodes_of.values())
    best = _narrowest_holding(sorted(machine), per_set, needed)

    def key(i: str) -> tuple[object, ...]:
        nodes = nodes_of[i]
        inside = bool(best) and bool(nodes) and best.issuperset(nodes)
        return (not inside, nodes or (1 << 30,), natural_key(i))

    if needed < 16:
        return heapq.nsmallest(needed, ids, key=key)
    return sorted(ids, key=key)[:needed]


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


def plan_pod(
    containers: list[ContainerSpec],
    requests: Mapping[str, Mapping[str, int]],
    resources: Mapping[str, ResourceState],
    held: Mapping[tuple[str, str], list[str]] | None = None,
    hints: Mapping[tuple[str, str], frozenset[int] | None] | None = None,
    numa_nodes: list[int] | None = None,
    pod_uid: str = "",
    affinity_of: AffinityOf | None = None,
    device_hints_needed: bool = True,
) -> Generator[PreferredAsk, list[str] | PreferredFailed, PodPlan]:
    """Plan every container's devices, in admission order (init containers first).

    ``requests[container][resource]`` is the device count; ``held`` what each
    (container, resource) already holds; ``hints`` the topology manager's NUMA affinity
    for each (container, resource), None for no preference. With ``affinity_of``, the
    topology manager is asked instead, container by container, with this container's
    device hints computed after the previous containers got theirs (its container scope);
    it returns the container's NUMA affinity or raises Refusal. Without
    ``device_hints_needed`` (no merge per container: the pod scope merged once already, and
    the none policy, like the kubelet's admitPolicyNone, merges nothing) ``affinity_of``
    gets no device hints. Raises Refusal.
    """
    held = held or {}
    hints = hints or {}
    nodes_all = (
        numa_nodes
        if numa_nodes is not None
        else sorted({n for r in resources.values() for d in r.table.values() for n in d.numa_nodes})
    )
    plan = PodPlan()
    pool: dict[str, set[str]] = {}  # devicesToReuse, per resource
    for c in containers:
        container_affinity: frozenset[int] | None = None
        if affinity_of is not None:
            device_hints: dict[str, list[Hint] | None] = {}
            for resource, required in sorted(requests.get(c.name, {}).items()) if device_hints_needed else ():
                if resource in resources:
                    st = resources[resource]
                    device_hints[resource] = container_hints(
                        st.table,
                        held.get((c.name, resource), []),
                        st.in_use,
                        pool.get(resource, set()),
                        required,
                        nodes_all,
                    )
            container_affinity = affinity_of(c, device_hints)
        for resource in sorted(requests.get(c.name, {})):
            required = requests[c.name][resource]
            if resource not in resources:
                raise Refusal(f"cannot allocate unregistered device {resource}")
            state = resources[resource]
            step = yield from _devices_to_allocate(
                c.name,
                resource,
                required,
                state,
                list(held.get((c.name, resource), [])),
                pool.setdefault(resource, set()),
                container_affinity if affinity_of is not None else hints.get((c.name, resource)),
                nodes_all,
                pod_uid,
            )
            plan.steps.append(step)
            state.in_use.update(step.device_ids)
            ids = set(step.device_ids)
            if c.kind == "init":
                pool[resource] |= ids
            else:
                pool[resource] -= ids
    return plan


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
    healthy = {i for i, d in table.items() if d.health == "Healthy" and not d.removed}
    if current and len(current) != required:
        raise Refusal(changed_request(pod_uid, container, resource, len(current), required))
    if not healthy:
        raise Refusal(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
    if current:
        if not healthy.issuperset(current):
            raise Refusal(
                f"previously allocated devices are no longer healthy; cannot allocate unhealthy devices {resource}"
            )
        return Step(container, resource, sorted(current, key=natural_key), "kept", new=False)

    needed = required
    allocated: list[str] = []

    def take(candidates: Iterable[str]) -> bool:
        nonlocal needed
        taken = set(allocated)
        for i in _packing_order([i for i in candidates if i not in taken], table, needed, numa_nodes):
            allocated.append(i)
            needed -= 1
        return needed == 0

    def done(choice: str, note: str = "") -> Step:
        return Step(container, resource, allocated, choice, note)

    if take(reusable):
        return done("reused")
    available = healthy - state.in_use - set(allocated)
    if len(available) < needed:
        raise Refusal(
            f"requested number of devices unavailable for {resource}. Requested: {needed}, Available: {len(available)}"
        )
    aligned, unaligned, no_affinity = filter_by_affinity(available, table, hint, numa_nodes)
    choice, note = "daemon", ""

    def ask(candidates: set[str]) -> Generator[PreferredAsk, list[str] | PreferredFailed, set[str]]:
        nonlocal choice, note
        if not state.offers_preferred:
            return set()
        answer = yield PreferredAsk(
            container,
            resource,
            sorted(candidates | set(allocated), key=natural_key),
            sorted(allocated, key=natural_key),
            required,
        )
        if isinstance(answer, PreferredFailed):
            note = f"GetPreferredAllocation failed, the daemon chose instead: {answer.reason}"
            return set()
        preferred = set(answer) & candidates
        choice = "plugin"
        if len(preferred) < len(set(answer)):
            note = "the plugin's preference named devices that were not candidates; they were ignored"
        return preferred

    if needed < len(aligned):
        preferred = yield from ask(aligned)
        if take(preferred & aligned) or take(aligned):
            return done(choice, note)
    else:
        if take(aligned):
            return done("daemon")
        preferred = yield from ask(available)
        if take(preferred & available) or take(unaligned) or take(no_affinity):
            return done(choice, note)
    raise Refusal(
        f"unexpectedly allocated less resources than required. Requested: {required}, Got: {required - needed}"
    )
