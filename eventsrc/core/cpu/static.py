"""The CPU manager's policies (none and static), as pure functions over the views.

The static policy (pkg/kubelet/cm/cpumanager/policy_static.go) in the kubelet's terms:

* the reserved CPUs are an explicit list, or what take-by-topology picks for the
  reserved count on the whole machine;
* containers of Guaranteed pods with a whole CPU request get exclusive CPUs, everything
  else runs on the shared pool: every CPU (minus the reserved ones with
  strict-cpu-reservation) minus every exclusive assignment;
* a pod's init containers hand their CPUs on to the containers after them; a
  restartable (sidecar) init container keeps its own, like an app container;
* with a topology hint, CPUs are taken from the hinted NUMA nodes (or their sockets with
  align-by-socket) first, then from anywhere.

The shared pool is derived, never stored apart from its record in the log
(SharedPoolChanged), so "the state file disagrees with the machine" cannot happen here.
"""

from __future__ import annotations

import itertools
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

from eventsrc.core.cpu.assignment import (
    StaticPolicyOptions,
    TakeError,
    check_smt_alignment,
    take_by_topology,
)
from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.core.cpu.topology import CPUTopology
from eventsrc.core.resources import exclusive_cpus
from eventsrc.core.topology_manager import ProviderHints, TopologyHint
from eventsrc.events import (
    ContainerSpec,
    CPUsReleased,
    EventBase,
    PolicyConfigurationChanged,
    SharedPoolChanged,
)


class AssignedCPUs(Protocol):
    """Every CPU assigned to a container (``state.cpus.CPUIndex``)."""

    def assigned(self, without_pod: str = "") -> set[int]: ...


class CPUPolicyError(TakeError):
    """The pod cannot get its CPUs (or the policy cannot be set up): the kubelet's message."""


@dataclass(frozen=True)
class CPUManagerConfig:
    policy: str  # "none" or "static"
    topology: CPUTopology
    reserved: CPUSet
    options: StaticPolicyOptions

    @property
    def static(self) -> bool:
        return self.policy == "static"

    def describe(self) -> dict[str, object]:
        """What is recorded in PolicyConfigurationChanged and compared across restarts."""
        return {
            "policy": self.policy,
            "reserved": str(self.reserved),
            "options": self.options.to_map(),
            "cpus": str(self.topology.cpu_details.cpus()),
        }


def reserved_cpus(topology: CPUTopology, count: int, explicit: CPUSet | None, options: StaticPolicyOptions) -> CPUSet:
    """The reserved set, as NewStaticPolicy chooses it."""
    everything = topology.cpu_details.cpus()
    if explicit is not None and explicit.size() > 0:
        if not explicit.is_subset_of(everything):
            raise CPUPolicyError(f"reserved CPUs {explicit} are not all on this machine ({everything})")
        return explicit
    if count <= 0:
        raise CPUPolicyError(
            "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"
        )
    try:
        reserved = take_by_topology(topology, everything, count, options)
    except TakeError:
        reserved = CPUSet()
    if reserved.size() != count:
        raise CPUPolicyError(
            f"[cpumanager] unable to reserve the required amount of CPUs (size of {reserved} did not equal {count})"
        )
    result: CPUSet = reserved
    return result


def assigned(assignments: Mapping[str, Mapping[str, Iterable[int]]]) -> CPUSet:
    out: set[int] = set()
    for containers in assignments.values():
        for cpus in containers.values():
            out.update(cpus)
    return CPUSet(out)


def all_cpus(cfg: CPUManagerConfig) -> CPUSet:
    everything = cfg.topology.cpu_details.cpus()
    result: CPUSet = everything - cfg.reserved if cfg.static and cfg.options.strict_cpu_reservation else everything
    return result


def shared_pool(cfg: CPUManagerConfig, assignments: Mapping[str, Mapping[str, Iterable[int]]]) -> CPUSet:
    """The default set: where every container without exclusive CPUs runs."""
    return shared_pool_of(cfg, assigned(assignments) if cfg.static else CPUSet())


def shared_pool_of(cfg: CPUManagerConfig, assigned_cpus: Iterable[int]) -> CPUSet:
    """The default set, given every CPU assigned to a container (``state.cpus.CPUIndex``)."""
    if not cfg.static:
        return cfg.topology.cpu_details.cpus()
    result: CPUSet = all_cpus(cfg) - CPUSet(assigned_cpus)
    return result


def allocatable_cpus(cfg: CPUManagerConfig) -> CPUSet:
    """GetAllocatableCPUs: every CPU but the reserved ones (static); none for the none policy."""
    if not cfg.static:
        return CPUSet()
    result: CPUSet = cfg.topology.cpu_details.cpus() - cfg.reserved
    return result


def _reserved_physical(cfg: CPUManagerConfig) -> CPUSet:
    d = cfg.topology.cpu_details
    cores = [d[c].core_id for c in cfg.reserved]
    result: CPUSet = d.cpus_in_cores(*cores) if cores else CPUSet()
    return result


def allocate(
    cfg: CPUManagerConfig,
    default: CPUSet,
    reusable: CPUSet,
    count: int,
    affinity: Iterable[int] | None = None,
) -> CPUSet:
    """allocateCPUs for one container: ``count`` CPUs from the default set (minus the
    reserved ones) and this pod's reusable CPUs, the hinted NUMA nodes first."""
    if cfg.options.full_pcpus_only:
        check_smt_alignment(count, cfg.topology.cpus_per_core(), (default - _reserved_physical(cfg)).size())
    allocatable = (default - cfg.reserved) | reusable
    result = CPUSet()
    nodes = list(affinity or [])
    if nodes:
        d = cfg.topology.cpu_details
        if cfg.options.align_by_socket:
            aligned = allocatable & d.cpus_in_sockets(*d.sockets_in_numa_nodes(*nodes))
        else:
            aligned = allocatable & d.cpus_in_numa_nodes(*nodes)
        n = min(count, aligned.size())
        if n > 0:
            result = take_by_topology(cfg.topology, aligned, n, cfg.options)
    if result.size() < count:
        rest = take_by_topology(cfg.topology, allocatable - result, count - result.size(), cfg.options)
        result = result | rest
    return result


@dataclass(frozen=True)
class CPUStep:
    container: str
    cpus: CPUSet
    new: bool = True  # False: the container already had them (re-admission)


def plan_pod_cpus(
    cfg: CPUManagerConfig,
    assignments: Mapping[str, Mapping[str, Iterable[int]]],
    pod_uid: str,
    qos: str,
    containers: list[ContainerSpec],
    affinity: Mapping[str, Iterable[int] | None] | None = None,
) -> list[CPUStep]:
    """Exclusive CPUs for each container of a pod, in admission order. Raises CPUPolicyError
    (or the picking's TakeError / SMTAlignmentError) with the kubelet's message."""
    planner = CPUPlanner(cfg, assignments, pod_uid, qos)
    for c in containers:
        planner.allocate(c, (affinity or {}).get(c.name))
    return planner.steps


def pool_events(
    cfg: CPUManagerConfig,
    recorded: Iterable[int],
    assignments: Mapping[str, Mapping[str, Iterable[int]]],
    reason: str,
) -> list[SharedPoolChanged]:
    """A SharedPoolChanged when the pool for ``assignments`` differs from the one recorded."""
    return pool_change(cfg, recorded, assigned(assignments), reason)


def pool_change(
    cfg: CPUManagerConfig, recorded: Iterable[int], assigned_cpus: Iterable[int], reason: str
) -> list[SharedPoolChanged]:
    """``pool_events`` given every CPU assigned to a container, not the assignments."""
    pool = shared_pool_of(cfg, assigned_cpus)
    if pool == CPUSet(recorded):
        return []
    return [SharedPoolChanged(cpus=pool.sorted_list(), reason=reason)]


def startup_events(
    cfg: CPUManagerConfig,
    recorded_policy: Mapping[str, object],
    assignments: Mapping[str, Mapping[str, Iterable[int]]],
) -> list[EventBase]:
    """What a start with ``cfg`` changes, given the configuration and assignments the log
    holds. Never a reason to refuse to start (docs/adr/0007):

    * a changed configuration is recorded (PolicyConfigurationChanged, old and new);
    * static -> none: every exclusive assignment is released;
    * none -> static: running containers are in the shared pool already;
    * reserved CPUs or vanished CPUs that running containers hold are reported in the
      event; those containers keep their CPUs until they end.
    """
    out: list[EventBase] = []
    new: dict[str, object] = dict(cfg.describe())
    everything = cfg.topology.cpu_details.cpus()
    if cfg.static:
        clashes = []
        for uid, containers in sorted(assignments.items()):
            for name, cpus in sorted(containers.items()):
                held = CPUSet(cpus)
                if held & cfg.reserved:
                    clashes.append(f"{uid}/{name} holds reserved CPUs {held & cfg.reserved}")
                if not held.is_subset_of(everything):
                    clashes.append(f"{uid}/{name} holds CPUs this machine does not have: {held - everything}")
        if clashes:
            new["kept_until_they_end"] = clashes
    if dict(recorded_policy) != new:
        out.append(PolicyConfigurationChanged(manager="cpu", old=dict(recorded_policy), new=new))
    if not cfg.static:
        for uid, containers in sorted(assignments.items()):
            for name, cpus in sorted(containers.items()):
                out.append(
                    CPUsReleased(
                        pod_uid=uid, container=name, cpus=sorted(cpus), reason="the CPU manager policy is none"
                    )
                )
    return out


def cpu_hints(cfg: CPUManagerConfig, available: CPUSet, reusable: CPUSet, request: int) -> list[tuple[list[int], bool]]:
    """generateCPUTopologyHints: every NUMA mask that can hold ``request`` CPUs from
    ``available`` plus ``reusable`` (which must all be inside it), with its preferred flag:
    as narrow as the narrowest mask whose NUMA nodes have ``request`` CPUs at all (with
    align-by-socket, also a mask spanning exactly the sockets that takes)."""
    d = cfg.topology.cpu_details
    numa = d.numa_nodes().sorted_list()
    numa_of = {c: d[c].numa_node_id for c in d}
    min_size = len(numa)
    found: list[list[int]] = []
    for size in range(1, len(numa) + 1):
        for combo in itertools.combinations(numa, size):
            inside = set(combo)
            if d.cpus_in_numa_nodes(*combo).size() >= request and size < min_size:
                min_size = size
            if any(numa_of[c] not in inside for c in reusable):
                continue
            matching = reusable.size() + sum(1 for c in available if numa_of[c] in inside)
            if matching >= request:
                found.append(list(combo))
    out: list[tuple[list[int], bool]] = []
    for nodes in found:
        preferred = len(nodes) == min_size
        if cfg.options.align_by_socket and _socket_aligned(cfg, nodes, min_size):
            preferred = True
        out.append((nodes, preferred))
    return out


def _socket_aligned(cfg: CPUManagerConfig, nodes: list[int], min_size: int) -> bool:
    """isHintSocketAligned: the mask's NUMA nodes span exactly as many sockets as the
    narrowest mask needs (from the declared NUMA node and socket counts; never with fewer
    NUMA nodes than sockets)."""
    topo = cfg.topology
    numa_per_socket = topo.num_numa_nodes // topo.num_sockets if topo.num_sockets else 0
    if numa_per_socket == 0:
        return False
    min_sockets = -(-min_size // numa_per_socket)
    return bool(topo.cpu_details.sockets_in_numa_nodes(*nodes).size() == min_sockets)


class CPUPlanner:
    """The static policy for one pod, one container at a time (the topology manager's
    container scope asks for a container's hints after the previous ones are allocated)."""

    def __init__(
        self,
        cfg: CPUManagerConfig,
        assignments: Mapping[str, Mapping[str, Iterable[int]]],
        pod_uid: str,
        qos: str,
        assigned_cpus: AssignedCPUs | None = None,
        reusable: CPUSet | None = None,
    ) -> None:
        """``assigned_cpus``: the views' index of the assigned CPUs, so that the shared pool
        is not worked out from every assignment. ``reusable``: CPUs the pod's earlier init
        containers hand on (a pod admitted container by container)."""
        self.cfg = cfg
        self.qos = qos
        self.have = {name: CPUSet(c) for name, c in assignments.get(pod_uid, {}).items()}
        self.default = (
            shared_pool(cfg, assignments) if assigned_cpus is None else shared_pool_of(cfg, assigned_cpus.assigned())
        )
        self.reusable = reusable or CPUSet()
        self.steps: list[CPUStep] = []

    def request(self, c: ContainerSpec) -> int:
        return exclusive_cpus(self.qos, c) if self.cfg.static else 0

    def hints(self, c: ContainerSpec) -> list[tuple[list[int], bool]] | None:
        """The container's CPU hints; None when it gets no exclusive CPUs (no preference)."""
        n = self.request(c)
        if n == 0:
            return None
        if c.name in self.have:
            held = self.have[c.name]
            return [] if held.size() != n else cpu_hints(self.cfg, held, CPUSet(), n)
        return cpu_hints(self.cfg, self.default - self.cfg.reserved, self.reusable, n)

    def pod_hints(self, containers: list[ContainerSpec]) -> list[tuple[list[int], bool]] | None:
        """The pod scope's hints: the pod-level count, the pod's assigned CPUs reusable."""
        n = pod_cpu_request(self, containers)
        if n == 0:
            return None
        assigned_here = CPUSet()
        for c in containers:
            held = self.have.get(c.name)
            if held is not None:
                if held.size() != self.request(c):
                    return []  # an assignment that no longer matches its request: cannot be satisfied
                assigned_here = assigned_here | held
        if assigned_here.size() == n:
            return cpu_hints(self.cfg, CPUSet(), assigned_here, n)
        return cpu_hints(self.cfg, self.default - self.cfg.reserved, assigned_here | self.reusable, n)

    def allocate(self, c: ContainerSpec, affinity: Iterable[int] | None) -> CPUStep | None:
        n = self.request(c)
        if n == 0:
            return None
        if c.name in self.have:
            step = CPUStep(c.name, self.have[c.name], new=False)
        else:
            step = CPUStep(c.name, allocate(self.cfg, self.default, self.reusable, n, affinity))
            self.default = self.default - step.cpus
        self.reusable = self.reusable | step.cpus if c.kind == "init" else self.reusable - step.cpus
        self.steps.append(step)
        return step


def pod_cpu_request(planner: CPUPlanner, containers: list[ContainerSpec]) -> int:
    """The pod-level count: the larger of the biggest running sum of sidecars up to each
    init container, and app containers plus sidecars."""
    init_max = 0
    sidecars = 0
    apps = 0
    for c in containers:
        n = planner.request(c)
        if c.kind == "sidecar":
            sidecars += n
        elif c.kind == "init":
            init_max = max(init_max, sidecars + n)
        else:
            apps += n
    return max(init_max, apps + sidecars)


def _provider_hints(hints: list[tuple[list[int], bool]] | None) -> ProviderHints:
    """No exclusive CPUs: no preference (a nil map)."""
    return None if hints is None else {"cpu": [TopologyHint.of(nodes, preferred) for nodes, preferred in hints]}


@dataclass
class CPUProvider:
    """The CPU manager for one pod, as the topology manager's hint provider (its
    ``planner`` does the work). ``pinning`` has one entry per container that asked for
    exclusive CPUs, in order: True when it could not get them (the allocation raised)."""

    planner: CPUPlanner
    pinning: list[bool] = field(default_factory=list)

    def topology_hints(self, container: ContainerSpec) -> ProviderHints:
        return _provider_hints(self.planner.hints(container))

    def pod_topology_hints(self, containers: list[ContainerSpec]) -> ProviderHints:
        return _provider_hints(self.planner.pod_hints(containers))

    def allocate(self, container: ContainerSpec, hint: TopologyHint) -> Generator[NoReturn, object, None]:
        """The container's CPUs within the hint's nodes; asks nothing. Raises TakeError
        (CPUPolicyError, SMTAlignmentError) with the kubelet's message."""
        try:
            step = self.planner.allocate(container, hint.nodes())
        except TakeError:
            self.pinning.append(True)
            raise
        if step is not None:  # the container asked for exclusive CPUs
            self.pinning.append(False)
        yield from ()  # a generator, as every provider's allocation is
