"""The memory manager's assignments and what they take of each NUMA node (docs/adr/0044).

A container's blocks are replaced whole by each MemoryAssigned (an init container's shrink is
a new set) and dropped by MemoryReleased; what each block takes of each node is in the block
(``taken``), so the sums here never depend on the machine: a start on a changed machine reads
the same assignments."""

from __future__ import annotations

from eventsrc import events as ev
from eventsrc.state.types import Handlers
from eventsrc.state.views import MemoryView, Views


def _count(view: MemoryView, blocks: list[ev.MemoryBlock], n: int) -> None:
    for b in blocks:
        for node, taken in zip(b.numa_affinity, b.taken, strict=False):
            at = view.reserved.setdefault(str(node), {})
            at[b.type] = at.get(b.type, 0) + n * taken
            if not at[b.type]:
                del at[b.type]
            if not at:
                del view.reserved[str(node)]
        for node in b.numa_affinity:
            key = str(node)
            view.blocks_on[key] = view.blocks_on.get(key, 0) + n
            if not view.blocks_on[key]:
                del view.blocks_on[key]


def memory_assigned(v: Views, seq: int, e: ev.MemoryAssigned) -> None:
    pod = v.memory.assignments.setdefault(e.pod_uid, {})
    _count(v.memory, pod.get(e.container, []), -1)
    pod[e.container] = list(e.blocks)
    _count(v.memory, pod[e.container], 1)


def memory_released(v: Views, seq: int, e: ev.MemoryReleased) -> None:
    pod = v.memory.assignments.get(e.pod_uid)
    if pod is None:
        return
    _count(v.memory, pod.pop(e.container, []), -1)
    if not pod:
        del v.memory.assignments[e.pod_uid]


def machine_changed(v: Views, seq: int, e: ev.MemoryMachineChanged) -> None:
    v.memory.machine = {node: dict(sizes) for node, sizes in e.new.items()}


HANDLERS: Handlers = {
    ev.MemoryAssigned: memory_assigned,
    ev.MemoryReleased: memory_released,
    ev.MemoryMachineChanged: machine_changed,
}
