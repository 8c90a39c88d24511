"""The memory manager in eventsrc: the Static policy (``core.memory.static_policy``) over the views,
its decisions as events, and a start on a changed machine (docs/adr/0044).

The kubelet keeps its machine state (per NUMA node and resource: reserved and free bytes, the
blocks counted on the node, its group) in a checkpoint. eventsrc derives it, in a pass over
the nodes, from the machine less ``--reserved-memory`` (``MemoryManagerConfig.initial``) and
what the log's decisions took: each MemoryAssigned says what it took of each node
(``taken``), each MemoryReleased what it gave back, as the kubelet's own arithmetic moves them
(fill the group's nodes in order; give back from the first node holding any). The views keep
the sums (``state.memory``), so an admission costs the nodes, not the pods.

A start compares the machine with the one the log last recorded. When it differs, the
assignments are fitted to the new machine one container at a time in the log's order
(``static.reconcile``): those that fit are counted as they are, those that do not are named,
one line each, and no longer counted (they keep running; their release gives nothing back).
One MemoryMachineChanged records it all; the node starts and admits against the new machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from eventsrc import events as ev
from eventsrc.core.memory.machine import MemoryMachine, hugepage_size, is_hugepage_resource
from eventsrc.core.memory.static_policy import (
    POLICY_STATIC,
    Block,
    MachineState,
    MemoryProvider,
    MemoryTable,
    NUMANodeState,
    SystemReserved,
    reconcile,
)
from eventsrc.events import ContainerSpec
from eventsrc.state.views import MemoryView


@dataclass(frozen=True)
class MemoryManagerConfig:
    """The memory manager as the daemon runs it: the policy ("None" or "Static"), the
    machine and what ``--reserved-memory`` keeps of it, and the machine state with nothing
    assigned (``initial``; empty for None)."""

    policy: str = "None"
    machine: MemoryMachine | None = None
    reserved: SystemReserved = field(default_factory=dict)
    initial: MachineState = field(default_factory=dict)

    @property
    def static(self) -> bool:
        return self.policy == POLICY_STATIC


def _key(node: int) -> str:
    return str(node)


def machine_state(cfg: MemoryManagerConfig, view: MemoryView) -> dict[int, NUMANodeState]:
    """The kubelet's machine state now: ``initial`` with what the view's decisions took."""
    out: dict[int, NUMANodeState] = {}
    for node, start in cfg.initial.items():
        taken = view.reserved.get(_key(node), {})
        tables = {
            resource: MemoryTable(
                t.total,
                t.system_reserved,
                t.allocatable,
                taken.get(resource, 0),
                t.allocatable - taken.get(resource, 0),
            )
            for resource, t in start.memory_map.items()
        }
        count = view.blocks_on.get(_key(node), 0)
        cells = tuple(view.cells.get(_key(node), ())) if count else (node,)
        out[node] = NUMANodeState(count, tables, cells or (node,))
    return out


def blocks_of(view: MemoryView, pod_uid: str) -> dict[str, dict[str, tuple[Block, ...]]]:
    """The pod's assignments as the policy reads them (only its own: the policy reads no other)."""
    held = view.assignments.get(pod_uid)
    if not held:
        return {}
    return {
        pod_uid: {
            name: tuple(Block(tuple(b.numa_affinity), b.type, b.size) for b in blocks) for name, blocks in held.items()
        }
    }


def provider(
    cfg: MemoryManagerConfig, view: MemoryView, pod_uid: str, containers: list[ContainerSpec]
) -> MemoryProvider:
    """The memory manager for one pod's admission (``containers``: every container the pod
    has, a growth's earlier ones too)."""
    if not cfg.static:
        return MemoryProvider(cfg.policy, {}, {}, pod_uid, containers)
    return MemoryProvider(cfg.policy, machine_state(cfg, view), blocks_of(view, pod_uid), pod_uid, containers)


def _sizes(per_node: Mapping[int, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    return {_key(n): dict(sizes) for n, sizes in sorted(per_node.items()) if sizes}


def assigned_events(pod_uid: str, p: MemoryProvider) -> list[ev.EventBase]:
    """MemoryAssigned per step the provider planned, in order."""
    return [
        ev.MemoryAssigned(
            pod_uid=pod_uid,
            container=name,
            blocks=[ev.MemoryBlock(numa_affinity=list(b.numa_affinity), type=b.type, size=b.size) for b in blocks],
            taken=_sizes(taken),
        )
        for name, blocks, taken in p.steps
    ]


def release_events(view: MemoryView, pod_uid: str, reason: str, container: str | None = None) -> list[ev.EventBase]:
    """MemoryReleased per container of the pod holding blocks (``container``: that one), with
    what each gives back as the kubelet's ``RemoveContainer`` does: from each block's nodes in
    order, as much as the node has reserved. A container the machine no longer held
    (``unaccounted``, after a change) gives back nothing."""
    held = view.assignments.get(pod_uid, {})
    reserved = {n: dict(sizes) for n, sizes in view.reserved.items()}
    unaccounted = set(view.unaccounted.get(pod_uid, ()))
    out: list[ev.EventBase] = []
    for name, blocks in held.items():
        if container is not None and name != container:
            continue
        back: dict[str, dict[str, int]] = {}
        if name not in unaccounted:
            for b in blocks:
                left = b.size
                for node in b.numa_affinity:
                    if left == 0:
                        break
                    have = reserved.get(_key(node), {}).get(b.type, 0)
                    give = min(have, left)
                    if give:
                        reserved[_key(node)][b.type] = have - give
                        got = back.setdefault(_key(node), {})
                        got[b.type] = got.get(b.type, 0) + give
                        left -= give
        out.append(ev.MemoryReleased(pod_uid=pod_uid, container=name, returned=back, reason=reason))
    return out


def _recorded(machine: MemoryMachine) -> dict[str, dict[str, int]]:
    return {_key(n): dict(machine.nodes[n]) for n in machine.node_ids()}


def startup_events(cfg: MemoryManagerConfig, view: MemoryView) -> list[ev.EventBase]:
    """At a start with the Static policy: nothing when the machine is the one the log last
    recorded; else one MemoryMachineChanged, the assignments fitted to the machine as it is
    (``static.reconcile``). Never a reason to refuse to start."""
    if not cfg.static or cfg.machine is None:
        return []
    new = _recorded(cfg.machine)
    if new == view.machine:
        return []
    assignments = {
        uid: {name: [Block(tuple(b.numa_affinity), b.type, b.size) for b in blocks] for name, blocks in cs.items()}
        for uid, cs in view.assignments.items()
    }
    drift = reconcile(cfg.machine, cfg.reserved, assignments)
    dropped: dict[str, list[str]] = {}
    for uid, name in drift.dropped:
        dropped.setdefault(uid, []).append(name)
    taken = {n: {r: t.reserved for r, t in s.memory_map.items() if t.reserved} for n, s in drift.state.items()}
    return [
        ev.MemoryMachineChanged(
            old=view.machine,
            new=new,
            no_longer_fit=[drift.dropped[k] for k in sorted(drift.dropped)],
            taken=_sizes(taken),
            unaccounted={uid: sorted(names) for uid, names in sorted(dropped.items())},
        )
    ]


def allocatable_memory(cfg: MemoryManagerConfig) -> list[tuple[int, str, int]]:
    """``GetAllocatableMemory``: (node, resource, bytes) per node and resource with any
    allocatable memory, by node then resource; none for the None policy."""
    if not cfg.static:
        return []
    return [
        (node, resource, t.allocatable)
        for node, state in sorted(cfg.initial.items())
        for resource, t in sorted(state.memory_map.items())
        if t.allocatable
    ]


def numa_nodes(view: MemoryView, pod_uid: str, container: str) -> list[int]:
    """``GetMemoryNUMANodes``: the nodes of the container's blocks (its ``cpuset.mems``)."""
    blocks: Sequence[ev.MemoryBlock] = view.assignments.get(pod_uid, {}).get(container, [])
    return sorted({n for b in blocks for n in b.numa_affinity})


def hugepage_limits(view: MemoryView, pod_uid: str, container: str) -> dict[str, int]:
    """The container's hugepage limits from its blocks: page size as the runtime names it
    ("2MB", "1GB", base 1024) -> bytes."""
    out: dict[str, int] = {}
    for b in view.assignments.get(pod_uid, {}).get(container, []):
        if is_hugepage_resource(b.type):
            name = _page_size_name(hugepage_size(b.type))
            out[name] = out.get(name, 0) + b.size
    return out


def _page_size_name(size: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"
