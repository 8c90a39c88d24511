"""The views: what the node's resources look like after a prefix of the log.

Every view is a plain msgspec Struct so that a snapshot is just its encoding. The
reducers in the sibling modules change only the views they are given; they never read
a clock, a socket or the log (see ``eventsrc.state.apply``).

The views are trees of data: nothing in them refers back to what holds it. The kinds there
are thousands of (a plugin, a device, a pod and its containers, a claim, the runtime's
sandboxes and containers) are ``gc=False``: Python's cycle collector never tracks them, and
a dict of them (the pods by uid, a pod's containers) is untracked too. At 10,000 pods, each
full collection walked the pods admitted since the previous one (about 20 objects each),
holding the loop 3-11 ms; what a reference count frees is freed as ever. Such a struct must
never be part of a reference cycle (it would never be collected).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from msgspec import Struct, field

from eventsrc.events import (
    ContainerAllocation,
    DeviceSpec,
    MemoryBlock,
    Mount,
    ObservedClaimDevice,
    ObservedMemory,
    PluginOptions,
    PreparedDevice,
)
from eventsrc.state.lifecycles import ADMITTED, NOT_HELD, REFERENCED, ClaimState, Hold, PodState


class PluginView(Struct, kw_only=True, gc=False):
    resource: str
    endpoint: str
    kind: str = "DevicePlugin"
    api_version: str = ""
    options: PluginOptions = PluginOptions()
    connected: bool = True
    registered_seq: int = 0
    disconnected_seq: int = 0


#: A device's NUMA nodes as the views keep them: one list for the devices on the same nodes
#: (replaced whole by the reducers, never changed in place).
_NUMA_LISTS: dict[tuple[int, ...], list[int]] = {}


def shared_numa(nodes: list[int]) -> list[int]:
    """The list the views keep for devices on ``nodes`` (equal, shared; a copy once 4,096
    different ones are kept)."""
    key = tuple(nodes)
    if len(_NUMA_LISTS) >= 1 << 12:
        return list(nodes)
    return _NUMA_LISTS.setdefault(key, list(nodes))


class DeviceView(Struct, kw_only=True, gc=False):
    health: str
    numa_nodes: list[int] = []
    # Who holds it: "" when free, else "pod_uid/container" (lifecycles.holder_text, parse_holder).
    holder: str = ""
    # Its lifecycle state is hold and removed together (lifecycles.DEVICE, device_state).
    hold: Hold = NOT_HELD
    since_seq: int = 0
    # No longer in the plugin's list, but still held: dropped when released.
    removed: bool = False

    def __post_init__(self) -> None:
        self.health = sys.intern(self.health)
        self.numa_nodes = shared_numa(self.numa_nodes)


# --------------------------------------------------------------------------- sharing
# At 10,000 pods, the same few strings (a namespace, a QoS class, a plugin's mount) came
# once per pod from the decoder or the event. Equal values are shared instead, as the views
# are built or decoded; what they encode to is unchanged (tests/unit/test_views_memory.py).


@functools.lru_cache(maxsize=1024)
def _shared_mounts(mounts: tuple[Mount, ...]) -> list[Mount]:
    """One list for equal mount lists seen lately: a plugin gives every container the same
    few. Shared, so not one more object per pod for the cycle collector to walk (docs/adr/0028);
    never changed in place (the allocation is frozen, and replaced whole)."""
    return list(mounts)


#: Shared by every allocation and container without any: never changed in place (events are
#: frozen, and the reducers replace a view's dict or list whole).
_NO_STRINGS: dict[str, str] = {}
_NO_NAMES: list[str] = []
_NO_NUMBERS: list[int] = []


def shared_allocation(a: ContainerAllocation) -> ContainerAllocation:
    """``a``, its repeated parts shared with other containers' allocations (equal, not copied)."""
    return ContainerAllocation(
        envs={sys.intern(k): v for k, v in a.envs.items()} if a.envs else _NO_STRINGS,
        mounts=_shared_mounts(tuple(a.mounts)),
        devices=[
            DeviceSpec(
                container_path=d.container_path,
                host_path=sys.intern(d.host_path),
                permissions=sys.intern(d.permissions),
            )
            for d in a.devices
        ],
        annotations={sys.intern(k): v for k, v in a.annotations.items()} if a.annotations else _NO_STRINGS,
        cdi_devices=a.cdi_devices or _NO_NAMES,
    )


@functools.lru_cache(maxsize=1024)
def _shared_quantities(items: frozenset[tuple[str, str]]) -> dict[str, str]:
    """One dict for equal requests (or limits): most pods ask for the same few."""
    return {sys.intern(k): sys.intern(v) for k, v in sorted(items)}


def shared_quantities(quantities: dict[str, str]) -> dict[str, str]:
    """``quantities`` as the dict shared by every container asking for the same; a dict of
    many entries stays its own (the cache is for the common few). Replaced whole, never
    changed in place."""
    if not quantities:
        return _NO_STRINGS
    if len(quantities) > 8:
        return quantities
    shared = _shared_quantities(frozenset(quantities.items()))
    # equal, and in the same order: a container's dict encodes the same either way
    return shared if list(shared) == list(quantities) else quantities


class _Index(Protocol):
    @property
    def source(self) -> Any: ...


_I = TypeVar("_I", bound=_Index)


def index_beside(view: Struct, source: Any, build: Callable[[Any], _I]) -> _I:
    """The index of ``source`` (a field of ``view``) kept beside ``view``'s fields, built the
    first time it is asked for, or again once ``source`` is another object. ``view`` is a
    Struct with ``dict=True``: msgspec neither encodes nor compares what is beside its fields,
    so an index is never in a snapshot, and the views equal with or without it."""
    index: _I | None = getattr(view, "_index", None)
    if index is None or index.source is not source:
        index = build(source)
        setattr(view, "_index", index)  # noqa: B010 - beside the Struct's fields, not one of them
    return index


def index_built(view: Struct, source: Any) -> Any:
    """The index ``index_beside`` keeps for ``source``, or None when none is built: the
    reducers keep one up to date once it is."""
    index = getattr(view, "_index", None)
    return index if index is not None and index.source is source else None


# ``dict=True``: room for the derived index beside the fields (``state.devices.index_of``).
class DevicesView(Struct, kw_only=True, dict=True):
    plugins: dict[str, PluginView] = field(default_factory=dict)
    # resource -> device id -> device
    devices: dict[str, dict[str, DeviceView]] = field(default_factory=dict)
    # the last record that moved a known device to other NUMA nodes (answers built before it are stale)
    topology_seq: int = 0


class ContainerView(Struct, kw_only=True, gc=False):
    kind: str = "app"
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    # resource -> device ids (reserved or allocated); tuples, so that neither they nor the
    # dict stay tracked by the cycle collector (docs/adr/0028)
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # resource -> the plugin's Allocate response
    allocations: dict[str, ContainerAllocation] = field(default_factory=dict)
    cpus: list[int] = []
    claims: list[str] = []
    # the runtime created it (ContainerCreated): a pod that grows takes it for an init
    # container once it no longer runs (core.admission.finished_containers)
    ran: bool = False

    def __post_init__(self) -> None:
        self.kind = sys.intern(self.kind)
        self.cpus = self.cpus or _NO_NUMBERS  # most have none
        self.claims = self.claims or _NO_NAMES
        self.requests = shared_quantities(self.requests)
        if self.limits == self.requests:  # most often: one dict for both (each only ever replaced whole)
            self.limits = self.requests
        else:
            self.limits = shared_quantities(self.limits)
        for resource, a in self.allocations.items():
            self.allocations[resource] = shared_allocation(a)


class PodView(Struct, kw_only=True, gc=False):
    uid: str
    namespace: str = ""
    name: str = ""
    qos_class: str = ""
    # lifecycles.POD: "admitting" between PodAdmissionStarted and its outcome, then "admitted";
    # "quarantined" when its records are in doubt (docs/adr/0005).
    state: PodState = ADMITTED
    admitted_seq: int = 0
    # the last record that changed what it holds (its admission, a device or CPU given or taken)
    changed_seq: int = 0
    # quarantined: the corrupt records that may have been its own, and the PodQuarantined record
    in_doubt: list[int] = []
    quarantined_seq: int = 0
    containers: dict[str, ContainerView] = field(default_factory=dict)
    # events.FROM_RUNTIME: admitted from the runtime's facts, it grows by container
    source: str = ""
    # the container whose ContainerAdmissionStarted has no outcome yet ("" none), and that record
    growing: str = ""
    growing_seq: int = 0

    def __post_init__(self) -> None:
        # the uid interned: the device index's holders (``state.devices``) find this one
        self.uid = sys.intern(self.uid)
        self.namespace = sys.intern(self.namespace)
        self.qos_class = sys.intern(self.qos_class)
        self.in_doubt = self.in_doubt or _NO_NUMBERS


# ``dict=True``: room for the derived index beside the fields (``core.fit.node_usage``).
class PodsView(Struct, kw_only=True, dict=True):
    pods: dict[str, PodView] = field(default_factory=dict)
    # pod uid -> last admission rejection reason (bounded by pods that were refused)
    rejected: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # decoded, each key is a copy of its pod's uid: keyed by the uid itself instead
        if all(uid == pod.uid for uid, pod in self.pods.items()):
            self.pods = {pod.uid: pod for pod in self.pods.values()}


# ``dict=True``: room for the derived index beside the fields (``state.cpus.index_of``).
class CPUsView(Struct, kw_only=True, dict=True):
    policy: dict[str, Any] = field(default_factory=dict)
    # the shared pool, as last recorded (containers without exclusive CPUs run there)
    shared: list[int] = []
    # pod uid -> container -> exclusive cpus
    assignments: dict[str, dict[str, list[int]]] = field(default_factory=dict)


class MemoryView(Struct, kw_only=True):
    """The memory manager's state, rebuilt from the log (docs/adr/0044): each container's
    blocks, what the decisions took of each NUMA node, and the machine they were made on."""

    # pod uid -> container -> blocks
    assignments: dict[str, dict[str, list[MemoryBlock]]] = field(default_factory=dict)
    # NUMA node id (as a string) -> resource -> bytes taken there (the kubelet's "reserved")
    reserved: dict[str, dict[str, int]] = field(default_factory=dict)
    # NUMA node id -> blocks on it (the kubelet's NumberOfAssignments), and its group
    blocks_on: dict[str, int] = field(default_factory=dict)
    cells: dict[str, list[int]] = field(default_factory=dict)
    # the machine as last recorded (MemoryMachineChanged): node id -> resource -> bytes
    machine: dict[str, dict[str, int]] = field(default_factory=dict)
    # pod uid -> containers whose blocks the machine no longer holds (after a change)
    unaccounted: dict[str, list[str]] = field(default_factory=dict)


class ClaimView(Struct, kw_only=True, gc=False):
    uid: str
    namespace: str = ""
    name: str = ""
    driver: str = ""
    # lifecycles.CLAIM: "" (referenced, never prepared), "preparing", "prepared", ...
    state: ClaimState = REFERENCED
    pods: list[str] = []
    devices: list[PreparedDevice] = []
    error: str = ""
    since_seq: int = 0


class ClaimsView(Struct, kw_only=True):
    claims: dict[str, ClaimView] = field(default_factory=dict)
    # DRA drivers by name
    drivers: dict[str, PluginView] = field(default_factory=dict)


class SandboxView(Struct, kw_only=True, gc=False):
    uid: str
    namespace: str = ""
    name: str = ""
    since_seq: int = 0


class RuntimeContainerView(Struct, kw_only=True, gc=False):
    """A container the runtime has, as recorded: the ContainerCreated facts, then its state."""

    sandbox_id: str
    pod_uid: str
    name: str
    state: str = "created"  # "created", "running", "stopped"
    cgroups_path: str = ""
    cpus: list[int] = []
    mems: list[int] = []
    devices: list[str] = []
    device_ids: dict[str, list[str]] = field(default_factory=dict)
    cdi_devices: list[str] = []
    adjusted: bool = False
    exit_code: int = -1
    created_seq: int = 0


class RuntimeView(Struct, kw_only=True):
    """The container runtime as eventsrc last heard from it over NRI."""

    connected: bool = False
    runtime: str = ""
    mode: str = ""
    # sandbox id -> sandbox; container id -> container (both dropped when removed)
    sandboxes: dict[str, SandboxView] = field(default_factory=dict)
    containers: dict[str, RuntimeContainerView] = field(default_factory=dict)
    # pod uid -> the PodSandboxRemoved seq that took its last sandbox, until the pod is removed
    # (or runs again): what a release still owes, known from the log alone
    gone: dict[str, int] = field(default_factory=dict)


class ObservedContainerView(Struct, kw_only=True, gc=False):
    """What the kubelet says one container holds (``serve --beside-kubelet``)."""

    # resource -> device ids, in the order first seen
    devices: dict[str, list[str]] = field(default_factory=dict)
    cpus: list[int] = []
    memory: list[ObservedMemory] = []
    # "namespace/name" of the claim -> its devices
    claims: dict[str, list[ObservedClaimDevice]] = field(default_factory=dict)


class ObservedPodView(Struct, kw_only=True, gc=False):
    uid: str = ""
    namespace: str = ""
    name: str = ""
    since_seq: int = 0
    containers: dict[str, ObservedContainerView] = field(default_factory=dict)


class KubeletView(Struct, kw_only=True):
    """The kubelet's decisions as eventsrc last observed them (facts, not eventsrc's own)."""

    # "namespace/name" -> pod (the kubelet's PodResources names pods so)
    pods: dict[str, ObservedPodView] = field(default_factory=dict)
    # resource -> device id -> NUMA nodes, as GetAllocatableResources lists them
    allocatable: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    allocatable_cpus: list[int] = []
    # the CPU manager's shared pool, from its checkpoint file
    shared: list[int] = []
    # checkpoint path -> why it could not be read, until it is read again
    unreadable: dict[str, str] = field(default_factory=dict)
    # source -> since_ns of the gap that is still open
    gaps: dict[str, int] = field(default_factory=dict)


class MetaView(Struct, kw_only=True):
    last_seq: int = 0
    boot_id: str = ""
    instance_id: str = ""
    version: str = ""
    running: bool = False
    boots: int = 0
    started_seq: int = 0
    stopped_seq: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    # sequences of records that could not be read, with the reason
    corrupt: dict[int, str] = field(default_factory=dict)
    # of those, the ones a CorruptRecordFound event has put on the record
    corrupt_reported: list[int] = []


class Views(Struct, kw_only=True):
    meta: MetaView = field(default_factory=MetaView)
    devices: DevicesView = field(default_factory=DevicesView)
    pods: PodsView = field(default_factory=PodsView)
    cpus: CPUsView = field(default_factory=CPUsView)
    memory: MemoryView = field(default_factory=MemoryView)
    claims: ClaimsView = field(default_factory=ClaimsView)
    runtime: RuntimeView = field(default_factory=RuntimeView)
    kubelet: KubeletView = field(default_factory=KubeletView)
