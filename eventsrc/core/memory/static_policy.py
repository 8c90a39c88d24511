"""The kubelet memory manager's Static policy (and None), as pure functions over explicit state.

Ported for behaviour from kubernetes/kubernetes ``pkg/kubelet/cm/memorymanager``
(``policy_static.go``, ``policy_none.go``, ``state/state.go``). No I/O, no clock.

State
-----
The machine state (``MachineState``: NUMA node id -> ``NUMANodeState``) and the container
assignments (``Assignments``: pod uid -> container name -> blocks) are what the kubelet
keeps in its ``memory_manager_state`` checkpoint. Here both are explicit inputs and every
function returns new values: the caller's are never changed. eventsrc never stores the
machine state: it derives it from the machine and the assignments the log holds
(``reconcile``), so "the checkpoint disagrees with the machine" becomes drift, reported per
container, never a refusal to start.

The policy
----------
* Only containers of Guaranteed pods get memory; the blocks are one per requested memory
  resource (``memory``, ``hugepages-<size>``), all on the same NUMA nodes.
* Hints (``calculateHints``): every subset of NUMA nodes, smallest first, whose
  allocatable memory covers the request, minus subsets that break the "single or
  cross-NUMA" rule (a node used alone cannot join a group; a node in a group only with that
  group) and subsets whose free memory (plus the pod's reusable init memory) falls short.
  Preferred are the subsets of the smallest size that had enough *allocatable* memory.
* Allocation takes the merged hint, or the best hint of its own when the merge has no
  affinity, widens a hint that does not fit (``extendTopologyManagerHint``), and refuses a
  hint that breaks the rule. The kubelet's messages, verbatim.
* Init containers: the memory a (non-restartable) init container got can be reused by
  the containers after it (``initContainersReusableMemory``); a later container's blocks
  shrink the init containers' blocks they reuse (``updateInitContainersMemoryBlocks``), so
  that the blocks of a pod add up to what the pod holds. Restartable (sidecar) init
  containers keep theirs, like app containers. ``StaticPolicy.reusable`` is that memory:
  policy state the kubelet keeps in memory only, for the pod being admitted.

Go iterates maps in random order; here resources go in name order and assignments in the
mapping's order. Where Go would dereference a nil memory table (a resource a NUMA node does
not have) the table counts as empty.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from eventsrc.core.memory.machine import (
    MEMORY,
    MemoryConfigError,
    MemoryMachine,
    hugepage_size,
    is_hugepage_resource,
)
from eventsrc.core.resources import QuantityError, parse_quantity, qos_class
from eventsrc.core.topology_manager import ProviderHints, TopologyHint, mask_bits, mask_is_narrower_than, mask_of
from eventsrc.errors import EventsrcError
from eventsrc.events import ContainerSpec

POLICY_NONE = "None"
POLICY_STATIC = "Static"
POLICIES = (POLICY_NONE, POLICY_STATIC)

_INIT_KINDS = ("init", "sidecar")  # sidecar: a restartable init container
_INT64 = 2**63
_NO_DEFAULT_AFFINITY = (
    "[memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available"
)


class MemoryPolicyError(EventsrcError):
    """The pod cannot get its memory: the kubelet's message."""


# --------------------------------------------------------------------------- state.go


@dataclass(frozen=True)
class MemoryTable:
    """``state.MemoryTable``, bytes: ``total`` (TotalMemSize), ``system_reserved``,
    ``allocatable`` (total minus system reserved, minus hugepages for memory),
    ``reserved`` (by containers) and ``free``."""

    total: int
    system_reserved: int
    allocatable: int
    reserved: int
    free: int


@dataclass(frozen=True)
class NUMANodeState:
    """``state.NUMANodeState``: how many blocks use the node, its tables, and the group of
    nodes it is allocated with (``cells``: the node alone when it is not in a group)."""

    number_of_assignments: int
    memory_map: Mapping[str, MemoryTable]
    cells: tuple[int, ...]


MachineState = Mapping[int, NUMANodeState]


@dataclass(frozen=True)
class Block:
    """``state.Block``: ``size`` bytes of ``type`` on the NUMA nodes ``numa_affinity``."""

    numa_affinity: tuple[int, ...]
    type: str
    size: int


Assignments = Mapping[str, Mapping[str, Sequence[Block]]]
SystemReserved = Mapping[int, Mapping[str, int]]
ResourceSizes = dict[str, int]


@dataclass
class _Table:
    total: int
    system_reserved: int
    allocatable: int
    reserved: int
    free: int


@dataclass
class _Node:
    number_of_assignments: int
    memory_map: dict[str, _Table]
    cells: tuple[int, ...]


def _thaw(state: MachineState) -> dict[int, _Node]:
    return {
        n: _Node(
            s.number_of_assignments,
            {r: _Table(t.total, t.system_reserved, t.allocatable, t.reserved, t.free) for r, t in s.memory_map.items()},
            tuple(s.cells),
        )
        for n, s in state.items()
    }


def _freeze(work: Mapping[int, _Node]) -> dict[int, NUMANodeState]:
    return {
        n: NUMANodeState(
            s.number_of_assignments,
            _freeze_tables(s.memory_map),
            s.cells,
        )
        for n, s in work.items()
    }


def _freeze_tables(tables: Mapping[str, _Table]) -> dict[str, MemoryTable]:
    return {r: MemoryTable(t.total, t.system_reserved, t.allocatable, t.reserved, t.free) for r, t in tables.items()}


def _copy_assignments(assignments: Assignments) -> dict[str, dict[str, tuple[Block, ...]]]:
    return {pod: {name: tuple(blocks) for name, blocks in cs.items()} for pod, cs in assignments.items()}


_NO_TABLE = MemoryTable(0, 0, 0, 0, 0)


def _table(state: MachineState, node: int, resource: str) -> MemoryTable:
    s = state.get(node)
    return _NO_TABLE if s is None else s.memory_map.get(resource, _NO_TABLE)


# --------------------------------------------------------------------------- the machine state


def initial_machine_state(machine: MemoryMachine, reserved: SystemReserved) -> dict[int, NUMANodeState]:
    """The Static policy's ``getDefaultMachineState``: per node, each hugepage resource's
    total minus what is reserved of it, and memory minus what is reserved and minus every
    hugepage total of the node. Raises, as ``NewPolicyStatic`` does, when no memory is
    reserved at all. An allocatable that would go below zero (Go wraps around) is zero."""
    if sum(r.get(MEMORY, 0) for r in reserved.values()) <= 0:
        raise MemoryConfigError("[memorymanager] you should specify the system reserved memory")
    state: dict[int, NUMANodeState] = {}
    for node in machine.node_ids():
        totals = machine.nodes[node]
        node_reserved = reserved.get(node, {})
        tables: dict[str, MemoryTable] = {}
        hugepages = 0
        for resource in sorted((r for r in totals if is_hugepage_resource(r)), key=hugepage_size):
            total = totals[resource]
            sr = node_reserved.get(resource, 0)
            allocatable = max(0, total - sr)
            tables[resource] = MemoryTable(total, sr, allocatable, 0, allocatable)
            hugepages += total
        sr = node_reserved.get(MEMORY, 0)
        allocatable = max(0, totals.get(MEMORY, 0) - sr - hugepages)
        tables[MEMORY] = MemoryTable(totals.get(MEMORY, 0), sr, allocatable, 0, allocatable)
        state[node] = NUMANodeState(0, tables, (node,))
    return state


def _reserve(work: dict[int, _Node], nodes: Sequence[int], resource: str, size: int) -> None:
    """``updateMachineState``: count the block on every node of its group, take ``size``
    from the nodes' free memory in order."""
    for n in nodes:
        node = work[n]
        node.number_of_assignments += 1
        node.cells = tuple(nodes)
        if size == 0:
            continue
        t = node.memory_map.get(resource)
        if t is None or t.free <= 0:
            continue
        if t.free >= size:
            t.reserved += size
            t.free -= size
            size = 0
            continue
        size -= t.free
        t.reserved += t.free
        t.free = 0


@dataclass(frozen=True)
class Drift:
    """What ``reconcile`` found: the machine state the kept assignments give, the kept
    assignments, and per (pod uid, container) whose blocks no longer fit, why (one line)."""

    state: dict[int, NUMANodeState]
    assignments: dict[str, dict[str, tuple[Block, ...]]]
    dropped: dict[tuple[str, str], str]


def reconcile(machine: MemoryMachine, reserved: SystemReserved, assignments: Assignments) -> Drift:
    """The machine state for the machine as it is now and the assignments the log holds.

    The kubelet's ``validateState`` recomputes the same state from the machine and its
    checkpoint's assignments, compares it with the checkpoint's machine state, and refuses
    to start on any difference ("the expected machine state is different from the real
    one"), or on an assignment that names a NUMA node or a resource the machine does not
    have. Upstream's drift work (``memory_drift.go``, KEP-6232, alpha behind the
    ``MemoryManagerDriftTolerance`` gate) accepts a regular-memory total that moved by up
    to a bound (the kernel image's size from ``/proc/iomem`` plus 64 MiB) and still
    refuses when a recorded assignment no longer fits.

    eventsrc keeps no machine state to compare with, and must start: here every container's
    blocks, in the mapping's order, either fit (every node and resource exists and the
    nodes' free memory covers each block) and are counted, or are left out of the state
    with a reason in ``dropped``, the kubelet's message where it has one. No bound: any
    change of the machine is taken as it is. The caller decides what a dropped container
    becomes (its memory is no longer accounted for)."""
    work = _thaw(initial_machine_state(machine, reserved))
    kept: dict[str, dict[str, tuple[Block, ...]]] = {}
    dropped: dict[tuple[str, str], str] = {}
    for pod, containers in assignments.items():
        for name, blocks in containers.items():
            trial = copy.deepcopy(work)
            reason = _fit(trial, pod, name, blocks)
            if reason:
                dropped[(pod, name)] = reason
                continue
            work = trial
            kept.setdefault(pod, {})[name] = tuple(blocks)
    return Drift(_freeze(work), kept, dropped)


def _fit(work: dict[int, _Node], pod: str, name: str, blocks: Sequence[Block]) -> str:
    where = f"[memorymanager] (pod: {pod}, container: {name})"
    for b in blocks:
        if any(n not in work for n in b.numa_affinity):
            return f"{where} the memory assignment uses the NUMA that does not exist"
        if any(b.type not in work[n].memory_map for n in b.numa_affinity):
            return f"{where} the memory assignment uses memory resource that does not exist"
    for b in blocks:
        free = sum(work[n].memory_map[b.type].free for n in b.numa_affinity)
        if free < b.size:
            return (
                f"{where} the memory assignment of {b.size} bytes of {b.type} on NUMA nodes "
                f"{list(b.numa_affinity)} no longer fits: {free} bytes free"
            )
        _reserve(work, b.numa_affinity, b.type, b.size)
    return ""


# --------------------------------------------------------------------------- requests


def _as_int64(text: str) -> int:
    try:
        value = parse_quantity(text)
    except QuantityError as err:
        raise MemoryPolicyError(f"[memorymanager] {err}") from None
    if value.denominator != 1 or not -_INT64 <= value < _INT64:
        raise MemoryPolicyError("[memorymanager] failed to represent quantity as int64")
    return int(value)


def requested_resources(container: ContainerSpec) -> ResourceSizes:
    """``getRequestedResources``: the container's memory and hugepage requests in bytes (a
    request the API server would have defaulted from the limit counts as given)."""
    resources = {**container.limits, **container.requests}
    return {
        name: _as_int64(resources[name]) for name in sorted(resources) if name == MEMORY or is_hugepage_resource(name)
    }


def pod_requested_resources(containers: Sequence[ContainerSpec]) -> ResourceSizes:
    """``getPodRequestedResources``: per resource the app containers' sum plus the sidecars',
    or the most any init container needs beside the sidecars started before it, whichever
    is more. Resources no app container asks for are left out, as in the kubelet."""
    init_max: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    apps: dict[str, int] = {}
    for c in containers:
        for name, qty in requested_resources(c).items():
            if c.kind == "sidecar":
                init_max.setdefault(name, 0)
                sidecars[name] = sidecars.get(name, 0) + qty
            elif c.kind == "init":
                init_max[name] = max(init_max.get(name, 0), sidecars.get(name, 0) + qty)
            else:
                apps[name] = apps.get(name, 0) + qty
    return {name: max(total + sidecars.get(name, 0), init_max.get(name, 0)) for name, total in apps.items()}


def _regenerate_hints(blocks: Sequence[Block], requested: ResourceSizes) -> dict[str, list[TopologyHint]] | None:
    """``regenerateHints``: the hints of blocks already held, when they match the request."""
    hints: dict[str, list[TopologyHint]] = {name: [] for name in requested}
    if len(blocks) != len(requested):
        return None
    for b in blocks:
        if b.type not in requested or b.size != requested[b.type]:
            return None
        hints[b.type].append(TopologyHint(mask_of(b.numa_affinity), True))
    return hints


def _violates_group(state: MachineState, bits: Sequence[int]) -> bool:
    """A node already used alone cannot join a group; a node in a group only with it."""
    if len(bits) == 1:
        return False
    for n in bits:
        s = state.get(n)
        if s is None or s.number_of_assignments == 0:
            continue
        if len(s.cells) == 1 or sorted(s.cells) != list(bits):
            return True
    return False


def _satisfies(state: MachineState, mask: int, requested: ResourceSizes) -> bool:
    """``isAffinitySatisfyRequest``: the nodes' free memory (reuse not counted) covers it."""
    bits = mask_bits(mask)
    return all(sum(_table(state, n, r).free for n in bits) >= size for r, size in requested.items())


def _best_hint(hints: Sequence[TopologyHint]) -> TopologyHint:
    """``findBestHint``: preferred first, then the narrowest; ``{nil, false}`` for none."""
    best = TopologyHint(None, False)
    for hint in hints:
        if (
            best.affinity is None
            or (hint.preferred and not best.preferred)
            or (
                hint.preferred == best.preferred
                and hint.affinity is not None
                and mask_is_narrower_than(hint.affinity, best.affinity)
            )
        ):
            best = hint
    return best


# --------------------------------------------------------------------------- the policy


def _guaranteed_request(containers: Sequence[ContainerSpec], read: Callable[[], ResourceSizes]) -> ResourceSizes | None:
    """What ``read`` gives for a Guaranteed pod; None (the kubelet's nil hints) for any other
    pod, or a request the kubelet cannot read."""
    if qos_class(containers) != "Guaranteed":
        return None
    try:
        return read()
    except MemoryPolicyError:
        return None


@dataclass
class StaticPolicy:
    """The Static policy's calls over explicit state. ``reusable`` is its
    ``initContainersReusableMemory``: pod uid -> NUMA mask -> resource -> bytes the
    pod's init containers hold that the containers after them may reuse (only the pod
    last allocated is kept)."""

    reusable: dict[str, dict[int, dict[str, int]]] = field(default_factory=dict)

    def _pod_reusable(self, pod_uid: str, mask: int, resource: str) -> int:
        return self.reusable.get(pod_uid, {}).get(mask, {}).get(resource, 0)

    def _update_pod_reusable(
        self, pod_uid: str, containers: Sequence[ContainerSpec], container: ContainerSpec, blocks: Sequence[Block]
    ) -> None:
        """``updatePodReusableMemory``."""
        for uid in [u for u in self.reusable if u != pod_uid]:
            del self.reusable[uid]
        if _is_regular_init(containers, container):
            pod = self.reusable.setdefault(pod_uid, {})
            for b in blocks:
                table = pod.setdefault(mask_of(b.numa_affinity), {})
                if b.size > table.get(b.type, 0):
                    table[b.type] = b.size
            return
        for b in blocks:
            mask = mask_of(b.numa_affinity)
            reusable = self._pod_reusable(pod_uid, mask, b.type)
            if reusable != 0:
                self.reusable[pod_uid][mask][b.type] = 0 if b.size >= reusable else reusable - b.size

    def calculate_hints(
        self, state: MachineState, pod_uid: str, requested: ResourceSizes
    ) -> dict[str, list[TopologyHint]]:
        """``calculateHints``."""
        nodes = sorted(state)
        min_size = len(nodes)
        hints: dict[str, list[TopologyHint]] = {}
        for size in range(1, len(nodes) + 1):
            for bits in itertools.combinations(nodes, size):
                if any(sum(_table(state, n, r).allocatable for n in bits) < q for r, q in requested.items()):
                    continue
                min_size = min(min_size, size)
                if size == 1 and len(state[bits[0]].cells) > 1:
                    continue
                if _violates_group(state, bits):
                    continue
                mask = mask_of(bits)
                if any(
                    sum(_table(state, n, r).free for n in bits) + self._pod_reusable(pod_uid, mask, r) < q
                    for r, q in requested.items()
                ):
                    continue
                for r in requested:
                    hints.setdefault(r, []).append(TopologyHint(mask, False))
        for r in requested:
            if r in hints:
                hints[r] = [TopologyHint(h.affinity, len(mask_bits(h.affinity or 0)) == min_size) for h in hints[r]]
        return hints

    def topology_hints(
        self,
        state: MachineState,
        assignments: Assignments,
        pod_uid: str,
        containers: Sequence[ContainerSpec],
        container: ContainerSpec,
    ) -> dict[str, list[TopologyHint]] | None:
        """``GetTopologyHints``: None (nil) for a pod that is not Guaranteed or a request the
        kubelet cannot read; the held blocks' hints for a container that has some."""
        requested = _guaranteed_request(containers, lambda: requested_resources(container))
        if requested is None:
            return None
        held = assignments.get(pod_uid, {}).get(container.name)
        if held is not None:
            return _regenerate_hints(held, requested)
        return self.calculate_hints(state, pod_uid, requested)

    def pod_topology_hints(
        self, state: MachineState, assignments: Assignments, pod_uid: str, containers: Sequence[ContainerSpec]
    ) -> dict[str, list[TopologyHint]] | None:
        """``GetPodTopologyHints``: the pod-level request; the first container (init
        containers first) that holds blocks decides, as in the kubelet."""
        requested = _guaranteed_request(containers, lambda: pod_requested_resources(containers))
        if requested is None:
            return None
        held_by_pod = assignments.get(pod_uid, {})
        for c in containers:
            held = held_by_pod.get(c.name)
            if held is not None:
                return _regenerate_hints(held, requested)
        return self.calculate_hints(state, pod_uid, requested)

    def allocate(
        self,
        state: MachineState,
        assignments: Assignments,
        pod_uid: str,
        containers: Sequence[ContainerSpec],
        container: ContainerSpec,
        hint: TopologyHint,
    ) -> Allocation:
        """``Allocate``: the container's blocks within ``hint`` (the merged hint), the new
        machine state and assignments. Raises MemoryPolicyError with the kubelet's message."""
        unchanged = Allocation(dict(state), _copy_assignments(assignments), {})
        if qos_class(containers) != "Guaranteed":
            return unchanged
        held = assignments.get(pod_uid, {}).get(container.name)
        if held is not None:
            self._update_pod_reusable(pod_uid, containers, container, held)
            return unchanged
        requested = requested_resources(container)
        best = hint
        if hint.affinity is None:
            default = _best_hint(self.calculate_hints(state, pod_uid, requested).get(MEMORY, []))
            if default.affinity is None:  # Go: no hints at all (or, unreachable there, none for memory)
                raise MemoryPolicyError(_NO_DEFAULT_AFFINITY)
            if not default.preferred and best.preferred:
                raise MemoryPolicyError("[memorymanager] failed to find the default preferred hint")
            best = default
        assert best.affinity is not None
        if any(n not in state for n in mask_bits(best.affinity)):
            raise MemoryPolicyError(f"[memorymanager] the hint {best} names a NUMA node the machine does not have")
        if not _satisfies(state, best.affinity, requested):
            group = set(mask_bits(best.affinity))
            within = [
                h
                for h in self.calculate_hints(state, pod_uid, requested).get(MEMORY, [])
                if group <= set(mask_bits(h.affinity or 0))
            ]
            if not within:
                raise MemoryPolicyError("[memorymanager] failed to find NUMA nodes to extend the current topology hint")
            extended = _best_hint(within)
            if not extended.preferred and best.preferred:
                raise MemoryPolicyError("[memorymanager] failed to find the extended preferred hint")
            best = extended
        assert best.affinity is not None
        bits = tuple(mask_bits(best.affinity))
        if _violates_group(state, bits):
            raise MemoryPolicyError("[memorymanager] preferred hint violates NUMA node allocation")

        work = _thaw(state)
        blocks: list[Block] = []
        for resource, size in requested.items():
            blocks.append(Block(bits, resource, size))
            reusable = self._pod_reusable(pod_uid, best.affinity, resource)
            _reserve(work, bits, resource, 0 if reusable >= size else size - reusable)
        new_blocks = tuple(blocks)
        self._update_pod_reusable(pod_uid, containers, container, new_blocks)

        new_assignments = _copy_assignments(assignments)
        pod = new_assignments.setdefault(pod_uid, {})
        pod[container.name] = new_blocks
        changed = {container.name: new_blocks}
        changed.update(_shrink_init_blocks(pod, containers, container, new_blocks))
        return Allocation(_freeze(work), new_assignments, changed)


@dataclass(frozen=True)
class Allocation:
    """What ``StaticPolicy.allocate`` gives: the new machine state and assignments, and the
    containers of the pod whose blocks are new or changed (the container allocated first,
    then the init containers whose blocks it reuses), in that order."""

    state: dict[int, NUMANodeState]
    assignments: dict[str, dict[str, tuple[Block, ...]]]
    changed: dict[str, tuple[Block, ...]]


def _init_containers(containers: Sequence[ContainerSpec]) -> list[ContainerSpec]:
    return [c for c in containers if c.kind in _INIT_KINDS]


def _is_regular_init(containers: Sequence[ContainerSpec], container: ContainerSpec) -> bool:
    """``isRegularInitContainer``: an init container of the pod that is not restartable."""
    for c in _init_containers(containers):
        if c.name == container.name:
            return c.kind == "init"
    return False


def _shrink_init_blocks(
    pod: dict[str, tuple[Block, ...]],
    containers: Sequence[ContainerSpec],
    container: ContainerSpec,
    blocks: Sequence[Block],
) -> dict[str, tuple[Block, ...]]:
    """``updateInitContainersMemoryBlocks``: the init containers before ``container`` give up
    in their blocks what it reuses (same type, same nodes), first come first; sidecars keep
    theirs. Updates ``pod`` and returns the blocks that changed."""
    changed: dict[str, tuple[Block, ...]] = {}
    for block in blocks:
        size = block.size
        mask = mask_of(block.numa_affinity)
        for init in _init_containers(containers):
            if init.name == container.name or size == 0:
                break
            if init.kind == "sidecar":
                continue
            held = list(pod.get(init.name, ()))
            if not held:
                continue
            for i, b in enumerate(held):
                if b.size == 0 or b.type != block.type or mask_of(b.numa_affinity) != mask:
                    continue
                if b.size > size:
                    held[i] = Block(b.numa_affinity, b.type, b.size - size)
                    size = 0
                else:
                    size -= b.size
                    held[i] = Block(b.numa_affinity, b.type, 0)
            if tuple(held) != pod[init.name]:
                pod[init.name] = changed[init.name] = tuple(held)
    return changed


@dataclass(frozen=True)
class Removal:
    """What ``remove_container`` gives: the new machine state and assignments, and the
    blocks given back (empty when the container held none)."""

    state: dict[int, NUMANodeState]
    assignments: dict[str, dict[str, tuple[Block, ...]]]
    blocks: tuple[Block, ...]


def remove_container(state: MachineState, assignments: Assignments, pod_uid: str, container: str) -> Removal:
    """``RemoveContainer``: the container's blocks go back to the nodes' free memory, a node
    no block uses any more leaves its group. A container without blocks changes nothing."""
    new_assignments = _copy_assignments(assignments)
    pod = new_assignments.get(pod_uid, {})
    blocks = pod.pop(container, None)
    if blocks is None:
        return Removal(dict(state), new_assignments, ())
    if not pod:
        del new_assignments[pod_uid]
    work = _thaw(state)
    for b in blocks:
        released = b.size
        for n in b.numa_affinity:
            node = work.get(n)
            if node is None:
                continue
            node.number_of_assignments -= 1
            if node.number_of_assignments == 0:
                node.cells = (n,)
            if released == 0:
                continue
            t = node.memory_map.get(b.type)
            if t is None or t.reserved == 0:
                continue
            if t.reserved < released:
                released -= t.reserved
                t.free += t.reserved
                t.reserved = 0
                continue
            t.free += released
            t.reserved -= released
            released = 0
    return Removal(_freeze(work), new_assignments, tuple(blocks))


# --------------------------------------------------------------------------- hint provider


@dataclass
class MemoryProvider:
    """The memory manager for one pod, as the topology manager's hint provider: the None
    policy gives no hints and allocates nothing; the Static policy plans blocks over
    ``state`` and ``assignments``, which it keeps up to date container by container.
    ``steps`` lists (container, blocks, taken) in order: each allocated container, then each
    init container whose blocks it shrank (so an init container can appear twice); ``taken``
    is what the step took of each node's memory (node -> resource -> bytes, only what
    changed), as the machine state counts it: nothing for a shrink."""

    policy: str
    state: MachineState
    assignments: Assignments
    pod_uid: str
    containers: list[ContainerSpec]
    steps: list[tuple[str, tuple[Block, ...], dict[int, dict[str, int]]]] = field(default_factory=list)
    static: StaticPolicy = field(default_factory=StaticPolicy)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise MemoryConfigError(f'unknown policy: "{self.policy}"')

    def topology_hints(self, container: ContainerSpec) -> ProviderHints:
        if self.policy != POLICY_STATIC:
            return None
        return self.static.topology_hints(self.state, self.assignments, self.pod_uid, self.containers, container)

    def pod_topology_hints(self, containers: list[ContainerSpec]) -> ProviderHints:
        if self.policy != POLICY_STATIC:
            return None
        return self.static.pod_topology_hints(self.state, self.assignments, self.pod_uid, containers)

    def allocate(self, container: ContainerSpec, hint: TopologyHint) -> Generator[NoReturn, object, None]:
        """The container's blocks within the hint; asks nothing. Raises MemoryPolicyError
        with the kubelet's message."""
        if self.policy == POLICY_STATIC:
            done = self.static.allocate(self.state, self.assignments, self.pod_uid, self.containers, container, hint)
            taken = _taken(self.state, done.state)
            self.state = done.state
            self.assignments = done.assignments
            for name, blocks in done.changed.items():
                self.steps.append((name, blocks, taken if name == container.name else {}))
        yield from ()  # a generator, as every provider's allocation is


def _taken(before: MachineState, after: MachineState) -> dict[int, dict[str, int]]:
    """What ``after`` reserves beyond ``before``, per node and resource (changes only)."""
    out: dict[int, dict[str, int]] = {}
    for node, state in after.items():
        for resource, table in state.memory_map.items():
            more = table.reserved - _table(before, node, resource).reserved
            if more:
                out.setdefault(node, {})[resource] = more
    return out
