"""The CPU topology, as the kubelet's cpumanager/topology package models it.

Per logical CPU: a core id (unique across the machine), a socket id, a NUMA node id and an
uncore (L3) cache id. ``CPUTopology`` carries the totals *as declared*, like the Go struct:
many of the kubelet's test topologies leave ``num_numa_nodes`` and ``num_uncore_cache`` at
0, and the CPU picking depends on that (``tests/support/kubelet_topologies.py`` keeps them so).
Topologies read from a file or discovered from sysfs get totals counted from their CPUs.

Three ways in, all pure:

- ``discover(MachineInfo)``: the kubelet's ``topology.Discover`` on cadvisor-shaped facts
  (NUMA nodes holding cores holding thread ids). The sysfs reader
  (``eventsrc/inputs/sysfs_topology.py``) builds that shape. As upstream, a core's id is
  the lowest CPU id among its threads, because cadvisor's core ids repeat across sockets.
- ``decode_topology_file(bytes)`` / ``encode_topology_file(topology)``: the topology file,
  ``{"cpus": [{"id": 0, "core": 0, "socket": 0, "numa": 0, "uncore": 0}, ...]}``, and
  optionally the memory per NUMA node (``"memory"``: the memory manager's, not read here).
- ``synthetic(...)``: regular machines numbered the way Linux numbers them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.errors import EventsrcError


class TopologyError(EventsrcError):
    """A topology that cannot be used: bad file, inconsistent ids, unknown CPU."""


@dataclass(frozen=True, slots=True)
class CPUInfo:
    """Where one logical CPU sits (upstream ``CPUInfo``)."""

    numa_node_id: int = 0
    socket_id: int = 0
    core_id: int = 0
    uncore_cache_id: int = 0


def _index(details: Mapping[int, CPUInfo], attr: str) -> dict[int, frozenset[int]]:
    groups: dict[int, set[int]] = {}
    for cpu, info in details.items():
        groups.setdefault(getattr(info, attr), set()).add(cpu)
    return {k: frozenset(v) for k, v in groups.items()}


def _attr_of(details: Mapping[int, CPUInfo], cpus: Iterable[int], attr: str) -> CPUSet:
    return CPUSet({getattr(details[c], attr) for c in cpus})


class CPUDetails:
    """CPU id -> ``CPUInfo``, immutable, with upstream's ``CPUDetails`` queries.

    Every query answers from indexes built once, so a restricted view (``keep_only``) costs
    one pass over its CPUs.
    """

    __slots__ = ("_cores", "_details", "_numa", "_sockets", "_uncore")

    def __init__(self, details: Mapping[int, CPUInfo] | None = None) -> None:
        self._details: dict[int, CPUInfo] = dict(details or {})
        self._sockets = _index(self._details, "socket_id")
        self._numa = _index(self._details, "numa_node_id")
        self._cores = _index(self._details, "core_id")
        self._uncore = _index(self._details, "uncore_cache_id")

    # -- mapping ---------------------------------------------------------------------------

    def __getitem__(self, cpu: int) -> CPUInfo:
        return self._details[cpu]

    def get(self, cpu: int) -> CPUInfo | None:
        return self._details.get(cpu)

    def __contains__(self, cpu: object) -> bool:
        return cpu in self._details

    def __len__(self) -> int:
        return len(self._details)

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._details))

    def items(self) -> list[tuple[int, CPUInfo]]:
        """(cpu, info) pairs, ascending by CPU id."""
        return sorted(self._details.items())

    def as_dict(self) -> dict[int, CPUInfo]:
        return dict(self._details)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CPUDetails):
            return self._details == other._details
        return NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self._details.items()))

    def __repr__(self) -> str:
        return f"CPUDetails({self._details!r})"

    # -- upstream queries ------------------------------------------------------------------

    def keep_only(self, cpus: CPUSet | Iterable[int]) -> CPUDetails:
        """A new ``CPUDetails`` with only the given CPUs (ids it does not know are ignored)."""
        keep = cpus.as_frozenset() if isinstance(cpus, CPUSet) else frozenset(cpus)
        return CPUDetails({c: i for c, i in self._details.items() if c in keep})

    def cpus(self) -> CPUSet:
        return CPUSet(self._details)

    def sockets(self) -> CPUSet:
        return CPUSet(self._sockets)

    def numa_nodes(self) -> CPUSet:
        return CPUSet(self._numa)

    def cores(self) -> CPUSet:
        return CPUSet(self._cores)

    def uncore_caches(self) -> CPUSet:
        return CPUSet(self._uncore)

    def _cpus_in(self, index: dict[int, frozenset[int]], ids: Iterable[int]) -> CPUSet:
        out: set[int] = set()
        for i in ids:
            out |= index.get(i, frozenset())
        return CPUSet(out)

    def cpus_in_sockets(self, *ids: int) -> CPUSet:
        return self._cpus_in(self._sockets, ids)

    def cpus_in_numa_nodes(self, *ids: int) -> CPUSet:
        return self._cpus_in(self._numa, ids)

    def cpus_in_cores(self, *ids: int) -> CPUSet:
        return self._cpus_in(self._cores, ids)

    def cpus_in_uncore_caches(self, *ids: int) -> CPUSet:
        return self._cpus_in(self._uncore, ids)

    def numa_nodes_in_sockets(self, *ids: int) -> CPUSet:
        return _attr_of(self._details, self.cpus_in_sockets(*ids), "numa_node_id")

    def sockets_in_numa_nodes(self, *ids: int) -> CPUSet:
        return _attr_of(self._details, self.cpus_in_numa_nodes(*ids), "socket_id")

    def cores_in_numa_nodes(self, *ids: int) -> CPUSet:
        return _attr_of(self._details, self.cpus_in_numa_nodes(*ids), "core_id")

    def cores_in_sockets(self, *ids: int) -> CPUSet:
        return _attr_of(self._details, self.cpus_in_sockets(*ids), "core_id")

    def uncore_in_numa_nodes(self, *ids: int) -> CPUSet:
        return _attr_of(self._details, self.cpus_in_numa_nodes(*ids), "uncore_cache_id")

    def cores_in_uncore_caches(self, *ids: int) -> CPUSet:
        """Upstream's unexported ``coresInUncoreCache``."""
        return _attr_of(self._details, self.cpus_in_uncore_caches(*ids), "core_id")

    def cores_needed_in_uncore_cache(self, num_cores_needed: int, *ids: int) -> CPUSet:
        """The cores of those caches, or only the ``num_cores_needed`` lowest core ids."""
        core_ids = self.cores_in_uncore_caches(*ids)
        if core_ids.size() <= num_cores_needed:
            return core_ids
        return core_ids.first(num_cores_needed)

    def are_numa_nodes_in_same_socket(self, numa_nodes: Iterable[int]) -> bool:
        """True when every node is known and all of them sit in at most one socket."""
        ids = list(numa_nodes)
        if any(i not in self._numa for i in ids):
            return False
        return self.sockets_in_numa_nodes(*ids).size() <= 1


@dataclass(frozen=True, slots=True, repr=False)
class CPUTopology:
    """Upstream ``CPUTopology``: declared totals plus the per-CPU details."""

    num_cpus: int
    num_cores: int
    num_sockets: int
    num_numa_nodes: int = 0
    num_uncore_cache: int = 0
    cpu_details: CPUDetails = field(default_factory=CPUDetails)

    @classmethod
    def from_details(cls, details: Mapping[int, CPUInfo] | CPUDetails) -> CPUTopology:
        """A topology whose totals are counted from its CPUs (as ``Discover`` counts them)."""
        d = details if isinstance(details, CPUDetails) else CPUDetails(details)
        return cls(
            num_cpus=len(d),
            num_cores=d.cores().size(),
            num_sockets=d.sockets().size(),
            num_numa_nodes=d.numa_nodes().size(),
            num_uncore_cache=d.uncore_caches().size(),
            cpu_details=d,
        )

    def __repr__(self) -> str:
        return (
            f"CPUTopology(num_cpus={self.num_cpus}, num_cores={self.num_cores}, num_sockets={self.num_sockets}, "
            f"num_numa_nodes={self.num_numa_nodes}, num_uncore_cache={self.num_uncore_cache}, "
            f"cpus={str(self.cpu_details.cpus())!r})"
        )

    def cpus_per_core(self) -> int:
        return self.num_cpus // self.num_cores if self.num_cores else 0

    def cpus_per_socket(self) -> int:
        return self.num_cpus // self.num_sockets if self.num_sockets else 0

    def cpus_per_uncore(self) -> int:
        return self.num_cpus // self.num_uncore_cache if self.num_uncore_cache else 0

    def _info(self, cpu: int) -> CPUInfo:
        info = self.cpu_details.get(cpu)
        if info is None:
            raise TopologyError(f"unknown CPU ID: {cpu}")
        return info

    def cpu_core_id(self, cpu: int) -> int:
        return self._info(cpu).core_id

    def cpu_socket_id(self, cpu: int) -> int:
        return self._info(cpu).socket_id

    def cpu_numa_node_id(self, cpu: int) -> int:
        return self._info(cpu).numa_node_id

    def is_aligned_at_uncore_cache(self, cpus: CPUSet) -> bool:
        """Upstream ``CheckAlignment(...).UncoreCache``: all CPUs share one uncore cache."""
        ids = cpus.sorted_list()
        if len(ids) <= 1:
            return True
        infos = [self.cpu_details.get(c) for c in ids]
        if any(i is None for i in infos):
            return False
        return len({i.uncore_cache_id for i in infos if i is not None}) == 1


# -- Discover: cadvisor-shaped facts to a topology ---------------------------------------


@dataclass(frozen=True, slots=True)
class Core:
    """A cadvisor core: its per-socket id, its socket, its threads, its uncore caches."""

    id: int
    socket_id: int
    threads: tuple[int, ...]
    uncore_caches: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Node:
    """A cadvisor node: a NUMA node id and its cores."""

    id: int
    cores: tuple[Core, ...]


@dataclass(frozen=True, slots=True)
class MachineInfo:
    """The parts of cadvisor's ``MachineInfo`` that ``Discover`` reads.

    ``num_cores`` is cadvisor's name for the number of logical CPUs.
    """

    num_cores: int
    num_sockets: int
    topology: tuple[Node, ...]


def _unique_core_id(threads: tuple[int, ...]) -> int:
    if not threads:
        raise TopologyError("no cpus provided")
    if len(set(threads)) != len(threads):
        raise TopologyError("cpus provided are not unique")
    return min(threads)


def _uncore_cache_id(core: Core) -> int:
    # Without cache information the socket stands in for the uncore cache (as upstream).
    return core.uncore_caches[0] if core.uncore_caches else core.socket_id


def discover(machine: MachineInfo) -> CPUTopology:
    """Upstream ``topology.Discover``."""
    if machine.num_cores == 0:
        raise TopologyError("could not detect number of cpus")
    details: dict[int, CPUInfo] = {}
    num_physical_cores = 0
    for node in machine.topology:
        num_physical_cores += len(node.cores)
        for core in node.cores:
            try:
                core_id = _unique_core_id(core.threads)
            except TopologyError as err:
                raise TopologyError(
                    f"could not get a unique core id for socket {core.socket_id} core {core.id} "
                    f"threads {list(core.threads)}: {err}"
                ) from None
            for cpu in core.threads:
                details[cpu] = CPUInfo(
                    numa_node_id=node.id,
                    socket_id=core.socket_id,
                    core_id=core_id,
                    uncore_cache_id=_uncore_cache_id(core),
                )
    d = CPUDetails(details)
    return CPUTopology(
        num_cpus=machine.num_cores,
        num_cores=num_physical_cores,
        num_sockets=machine.num_sockets,
        num_numa_nodes=d.numa_nodes().size(),
        num_uncore_cache=d.uncore_caches().size(),
        cpu_details=d,
    )


# -- the topology file -------------------------------------------------------------------

_Id = Annotated[int, msgspec.Meta(ge=0)]


class CPUEntry(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One logical CPU of the topology file."""

    id: _Id
    core: _Id
    socket: _Id
    numa: _Id
    uncore: _Id | None = None


class TopologyFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    cpus: list[CPUEntry]
    # the memory and hugepages per NUMA node ({"0": {"memory": "16Gi", "hugepages-2Mi": "1Gi"}}),
    # read by the memory manager (``inputs.cpu_config.load_memory_machine``), not here
    memory: dict[str, dict[str, int | str]] | None = None


def topology_from_entries(entries: Iterable[CPUEntry]) -> CPUTopology:
    """Check the entries and build the topology; every error is one line naming the CPU.

    Rules: at least one CPU; no CPU listed twice; ``uncore`` on every CPU or on none (none
    means the socket stands in for it, as in ``Discover``); a core id belongs to one socket,
    one NUMA node and one uncore cache (core ids are unique across the machine).
    """
    entries = list(entries)
    if not entries:
        raise TopologyError('no CPUs: give at least one entry in "cpus"')
    with_uncore = sum(e.uncore is not None for e in entries)
    if 0 < with_uncore < len(entries):
        i, e = next((i, e) for i, e in enumerate(entries) if e.uncore is None)
        raise TopologyError(f'cpus[{i}] (CPU {e.id}): "uncore" is missing; give it for every CPU or for none')
    details: dict[int, CPUInfo] = {}
    owner: dict[int, tuple[int, CPUEntry]] = {}
    for i, e in enumerate(entries):
        if e.id in details:
            raise TopologyError(f"cpus[{i}]: CPU {e.id} is listed twice")
        uncore = e.uncore if e.uncore is not None else e.socket
        first = owner.setdefault(e.core, (e.id, e))[1]
        for name, mine, theirs in (
            ("socket", e.socket, first.socket),
            ("numa", e.numa, first.numa),
            ("uncore", uncore, first.uncore if first.uncore is not None else first.socket),
        ):
            if mine != theirs:
                raise TopologyError(
                    f"cpus[{i}] (CPU {e.id}): core {e.core} is in {name} {mine} here but in {name} {theirs} "
                    f"for CPU {first.id}; core ids must be unique across the machine"
                )
        details[e.id] = CPUInfo(numa_node_id=e.numa, socket_id=e.socket, core_id=e.core, uncore_cache_id=uncore)
    return CPUTopology.from_details(details)


def decode_topology_file(data: bytes | str, source: str = "topology file") -> CPUTopology:
    """Read a topology file. Errors are one line, prefixed with ``source``."""
    try:
        parsed = msgspec.json.decode(data, type=TopologyFile)
        return topology_from_entries(parsed.cpus)
    except (msgspec.ValidationError, msgspec.DecodeError, TopologyError) as err:
        raise TopologyError(f"{source}: {err}") from None


def topology_entries(topology: CPUTopology) -> list[CPUEntry]:
    return [
        CPUEntry(id=cpu, core=i.core_id, socket=i.socket_id, numa=i.numa_node_id, uncore=i.uncore_cache_id)
        for cpu, i in topology.cpu_details.items()
    ]


def encode_topology_file(topology: CPUTopology) -> bytes:
    """The topology file for ``topology``: one CPU per line, ascending, ``uncore`` always given."""
    lines = [
        f'{{"id": {e.id}, "core": {e.core}, "socket": {e.socket}, "numa": {e.numa}, "uncore": {e.uncore}}}'
        for e in topology_entries(topology)
    ]
    return ('{"cpus": [\n  ' + ",\n  ".join(lines) + "\n]}\n").encode()


def summary_lines(topology: CPUTopology) -> list[str]:
    """A table for people: the totals, then one row per socket / NUMA node / uncore cache."""
    d = topology.cpu_details
    lines = [
        f"CPUs {topology.num_cpus}  cores {topology.num_cores}  sockets {topology.num_sockets}  "
        f"NUMA nodes {topology.num_numa_nodes}  uncore caches {topology.num_uncore_cache}  "
        f"CPUs per core {topology.cpus_per_core()}",
        f"{'SOCKET':>6}  {'NUMA':>4}  {'UNCORE':>6}  {'CORES':>5}  {'CORE IDS':<24}  CPUS",
    ]
    groups: dict[tuple[int, int, int], list[int]] = {}
    for cpu, info in d.items():
        groups.setdefault((info.socket_id, info.numa_node_id, info.uncore_cache_id), []).append(cpu)
    for (socket, numa, uncore), cpus in sorted(groups.items()):
        cores = CPUSet({d[c].core_id for c in cpus})
        lines.append(f"{socket:>6}  {numa:>4}  {uncore:>6}  {cores.size():>5}  {str(cores):<24}  {CPUSet(cpus)}")
    return lines


# -- regular machines --------------------------------------------------------------------


def synthetic(
    sockets: int,
    numa_per_socket: int,
    cores_per_numa: int,
    threads_per_core: int,
    uncore_per_numa: int = 1,
    *,
    interleave_sockets: bool = False,
) -> CPUTopology:
    """A regular machine, numbered as Linux numbers x86 machines.

    Physical cores are numbered 0..C-1 (C = total cores) and a core's threads are CPUs
    ``c, c + C, c + 2C, ...``, so the core id (the lowest thread, as in ``Discover``) is
    ``c``. Cores fill socket 0 first (NUMA node by NUMA node, uncore cache by uncore cache),
    or, with ``interleave_sockets``, go round the sockets (core 0 on socket 0, core 1 on
    socket 1, ...), as on ``topoDualSocketHT``. NUMA node and uncore ids count up across
    the machine.
    """
    if min(sockets, numa_per_socket, cores_per_numa, threads_per_core, uncore_per_numa) < 1:
        raise TopologyError("every count of a synthetic topology must be at least 1")
    if cores_per_numa % uncore_per_numa:
        raise TopologyError(
            f"cores per NUMA node ({cores_per_numa}) must be a multiple of "
            f"uncore caches per NUMA node ({uncore_per_numa})"
        )
    cores_per_socket = numa_per_socket * cores_per_numa
    cores_per_uncore = cores_per_numa // uncore_per_numa
    total_cores = sockets * cores_per_socket
    details: dict[int, CPUInfo] = {}
    for c in range(total_cores):
        if interleave_sockets:
            socket, pos = c % sockets, c // sockets
        else:
            socket, pos = divmod(c, cores_per_socket)
        numa = socket * numa_per_socket + pos // cores_per_numa
        uncore = numa * uncore_per_numa + (pos % cores_per_numa) // cores_per_uncore
        for t in range(threads_per_core):
            details[c + t * total_cores] = CPUInfo(
                numa_node_id=numa, socket_id=socket, core_id=c, uncore_cache_id=uncore
            )
    return CPUTopology.from_details(details)


def single_cpu_topology() -> CPUTopology:
    """One CPU: a stand-in where no topology was given (the none policy does not look)."""
    return CPUTopology.from_details({0: CPUInfo()})
