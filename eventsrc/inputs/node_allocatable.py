"""The node's capacity and what is kept back from pods, from the configuration and the machine
(the shell around ``core.fit``): the allocatable the resource fit admits pods against."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.core.cpu.topology import CPUTopology
from eventsrc.core.fit import CPU, EPHEMERAL_STORAGE, PODS, node_allocatable, quantity_integer
from eventsrc.core.memory.machine import MEMORY, MemoryMachine
from eventsrc.core.resources import QuantityError, parse_quantity
from eventsrc.errors import EventsrcError

#: Hard eviction signals that keep back a resource the fit counts (the kubelet's
#: ``hardEvictionReservation``): the others (inodes, imagefs, pids) are no pod request.
_EVICTION_SIGNALS = {"memory.available": MEMORY, "nodefs.available": EPHEMERAL_STORAGE}


class AllocatableError(EventsrcError):
    """A reservation or threshold that cannot be read: the flag and what is wrong, one line."""

    exit_code = 2


def _reservation(values: Mapping[str, str], flag: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, text in values.items():
        try:
            n = quantity_integer(name, text)
        except QuantityError as err:
            raise AllocatableError(f"{flag}: {name}={text}: {err}") from None
        if n < 0:
            raise AllocatableError(f"{flag}: {name}={text}: must not be negative")
        out[name] = n
    return out


def _eviction(values: Mapping[str, str], capacity: Mapping[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for signal, text in values.items():
        resource = _EVICTION_SIGNALS.get(signal)
        if resource is None:
            continue
        try:
            if text.endswith("%"):
                share = Fraction(text[:-1]) / 100
                if not 0 <= share <= 1:
                    raise QuantityError("a percentage must be between 0% and 100%")
                out[resource] = math.ceil(capacity.get(resource, 0) * share)
            else:
                out[resource] = math.ceil(parse_quantity(text))
        except (QuantityError, ValueError) as err:
            raise AllocatableError(f"--eviction-hard: {signal}<{text}: {err}") from None
    return out


def reserved_cpu_count(system_reserved: Mapping[str, str], kube_reserved: Mapping[str, str]) -> int:
    """The CPUs the static CPU manager reserves when no list is given: the cpu of
    ``--kube-reserved`` and ``--system-reserved``, rounded up to whole CPUs (the kubelet's
    ``numReservedCPUs``)."""
    millis = _reservation({k: v for k, v in system_reserved.items() if k == CPU}, "--system-reserved").get(CPU, 0)
    millis += _reservation({k: v for k, v in kube_reserved.items() if k == CPU}, "--kube-reserved").get(CPU, 0)
    return math.ceil(millis / 1000)


def filesystem_bytes(path: Path) -> int | None:
    """The size of the filesystem holding ``path`` (the kubelet's ephemeral-storage capacity:
    its root's filesystem), or None when it cannot be had."""
    for place in (path, *path.absolute().parents):  # the root is made later: its nearest parent
        try:
            st = os.statvfs(place)
        except FileNotFoundError:
            continue
        except OSError:
            return None
        return st.f_blocks * st.f_frsize
    return None


def memory_capacity(machine: MemoryMachine) -> dict[str, int]:
    """The node's memory and hugepages capacity: every NUMA node's, summed."""
    out: dict[str, int] = {}
    for sizes in machine.nodes.values():
        for name, size in sizes.items():
            out[name] = out.get(name, 0) + size
    return out


@dataclass(frozen=True)
class NodeResources:
    """The node's allocatable (``core.fit``), and the memory kept back from it (kube- and
    system-reserved plus the memory.available threshold, as a quantity: what the memory
    manager's ``--reserved-memory`` must add up to)."""

    allocatable: dict[str, int]
    reserved_memory: str


def load_allocatable(
    *,
    topology: CPUTopology,
    reserved_cpus: CPUSet,
    reserved_cpu_count: int,
    system_reserved: Mapping[str, str],
    kube_reserved: Mapping[str, str],
    eviction_hard: Mapping[str, str],
    max_pods: int,
    memory: Mapping[str, int] | None,
    storage: int | None,
) -> NodeResources:
    """The node's allocatable, as the kubelet's node status says it. ``memory``: the machine's
    memory and hugepages in bytes (None: unknown, not checked); ``storage``: its root
    filesystem's bytes (None: not checked). CPU capacity is every CPU of the topology; what
    is kept back of it is ``--reserved-cpus`` when given (it overrides the cpu of
    ``--kube-reserved`` and ``--system-reserved``, as in the kubelet), else those two, else
    ``--reserved-cpu-count`` whole CPUs."""
    capacity: dict[str, int] = {CPU: len(topology.cpu_details) * 1000, PODS: max_pods}
    if memory is not None:
        capacity.update(memory)
    if storage is not None:
        capacity[EPHEMERAL_STORAGE] = storage
    system = _reservation(system_reserved, "--system-reserved")
    kube = _reservation(kube_reserved, "--kube-reserved")
    reserved = {name: system.get(name, 0) + kube.get(name, 0) for name in system.keys() | kube.keys()}
    if reserved_cpus:
        reserved[CPU] = len(reserved_cpus) * 1000
    elif CPU not in reserved:
        reserved[CPU] = reserved_cpu_count * 1000
    eviction = _eviction(eviction_hard, capacity)
    kept = reserved.get(MEMORY, 0) + eviction.get(MEMORY, 0)
    return NodeResources(node_allocatable(capacity, reserved, eviction), str(kept))
