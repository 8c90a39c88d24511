"""The memory manager's assignments and what they take of each NUMA node (docs/adr/0044).

A container's blocks are replaced whole by each MemoryAssigned (an init container's shrink is
a new set) and dropped by MemoryReleased. What each decision took of each node, and what each
release gave back, is in the record (the core did the kubelet's arithmetic), so the sums here
are additions: they never depend on the machine, and a start on a changed machine reads the
same records. MemoryMachineChanged sets the sums the new machine gives."""

from __future__ import annotations

from collections.abc import Mapping

from eventsrc import events as ev
from eventsrc.state.types import Handlers
from eventsrc.state.views import MemoryView, Views


def _add(view: MemoryView, sizes: Mapping[str, Mapping[str, int]], n: int) -> None:
    for node, per_resource in sizes.items():
        at = view.reserved.setdefault(node, {})
        for resource, size in per_resource.items():
            at[resource] = at.get(resource, 0) + n * size
            if not at[resource]:
                del at[resource]
        if not at:
            del view.reserved[node]


def _count(view: MemoryView, uid: str, container: str, blocks: list[ev.MemoryBlock], n: int) -> None:
    """The blocks on each node and the nodes' groups; a container the machine no longer
    holds is not counted."""
    if container in view.unaccounted.get(uid, ()):
        return
    for b in blocks:
        for node in map(str, b.numa_affinity):
            view.blocks_on[node] = view.blocks_on.get(node, 0) + n
            if n > 0:
                view.cells[node] = list(b.numa_affinity)
            elif not view.blocks_on[node]:
                del view.blocks_on[node]
                view.cells.pop(node, None)


def memory_assigned(v: Views, seq: int, e: ev.MemoryAssigned) -> None:
    pod = v.memory.assignments.setdefault(e.pod_uid, {})
    _count(v.memory, e.pod_uid, e.container, pod.get(e.container, []), -1)
    pod[e.container] = list(e.blocks)
    _count(v.memory, e.pod_uid, e.container, pod[e.container], 1)
    _add(v.memory, e.taken, 1)


def memory_released(v: Views, seq: int, e: ev.MemoryReleased) -> None:
    _add(v.memory, e.returned, -1)
    pod = v.memory.assignments.get(e.pod_uid)
    if pod is None:
        return
    _count(v.memory, e.pod_uid, e.container, pod.pop(e.container, []), -1)
    if not pod:
        del v.memory.assignments[e.pod_uid]
    gone = v.memory.unaccounted.get(e.pod_uid)
    if gone is not None and e.container in gone:
        gone.remove(e.container)
        if not gone:
            del v.memory.unaccounted[e.pod_uid]


def machine_changed(v: Views, seq: int, e: ev.MemoryMachineChanged) -> None:
    m = v.memory
    m.machine = {node: dict(sizes) for node, sizes in e.new.items()}
    m.reserved = {node: dict(sizes) for node, sizes in e.taken.items()}
    m.unaccounted = {uid: list(names) for uid, names in e.unaccounted.items()}
    m.blocks_on, m.cells = {}, {}
    for uid, containers in m.assignments.items():
        for name, blocks in containers.items():
            _count(m, uid, name, blocks, 1)


HANDLERS: Handlers = {
    ev.MemoryAssigned: memory_assigned,
    ev.MemoryReleased: memory_released,
    ev.MemoryMachineChanged: machine_changed,
}
