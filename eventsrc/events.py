"""Every fact eventsrc records, its version, and how older versions are read.

Theory of operation
-------------------
A record in the log is an *envelope* around one *event*:

    key   = big-endian u64 sequence number (given by the log, starts at 1)
    value = CRC32 (big-endian u32) of the payload, then the payload
    payload = msgpack array [type, version, ts_ns, correlation_id, body]

``body`` is the event Struct encoded as a msgpack map (field names, no positions), so
adding a field with a default is a compatible change that needs no new version: old
readers ignore the field, new readers fill the default. A change that is *not* additive
(a renamed field, a changed meaning) bumps the type's ``VERSION`` and adds one small
upcaster ``(dict) -> dict`` from the previous version. Reading an old record runs the
chain ``v1 -> v2 -> ... -> current`` on the decoded map, then converts it to the Struct.

Events are named in the past tense: they are facts, not commands. The core decides and
returns events; the shell stamps the time and the correlation id and appends them.
Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Callable
from typing import Any, ClassVar, Final, TypeGuard

import msgspec
from msgspec import Struct

__all__ = [
    "EVENT_TYPES",
    "Event",
    "Record",
    "CorruptRecordError",
    "FutureRecordError",
    "decode_record",
    "encode_payload",
]


class EventBase(Struct, kw_only=True, frozen=True, gc=False):
    """Base of every event. ``VERSION`` is the version written by this code.

    Not a msgspec tagged union: the type name is stored once, in the envelope, and the
    body is decoded with that type's own decoder."""

    VERSION: ClassVar[int] = 1


# --------------------------------------------------------------------------- values


class PodRef(Struct, frozen=True, kw_only=True, gc=False):
    uid: str
    namespace: str = ""
    name: str = ""


class NUMATopology(Struct, frozen=True, kw_only=True, gc=False):
    nodes: list[int] = []


class DeviceInfo(Struct, frozen=True, kw_only=True, gc=False):
    """One device as a plugin reported it in ListAndWatch."""

    id: str
    health: str  # "Healthy" or "Unhealthy", as on the wire
    numa_nodes: list[int] = []


class PluginOptions(Struct, frozen=True, kw_only=True, gc=False):
    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False


class Mount(Struct, frozen=True, kw_only=True, gc=False):
    container_path: str
    host_path: str
    read_only: bool = False


class DeviceSpec(Struct, frozen=True, kw_only=True, gc=False):
    container_path: str
    host_path: str
    permissions: str = ""


class ContainerAllocation(Struct, frozen=True, kw_only=True, gc=False):
    """The device plugin's whole ContainerAllocateResponse."""

    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    devices: list[DeviceSpec] = []
    annotations: dict[str, str] = {}
    cdi_devices: list[str] = []


class ContainerSpec(Struct, frozen=True, kw_only=True, gc=False):
    """A container as admitted: its kind and its resource requests and limits."""

    name: str
    kind: str = "app"  # "init", "sidecar" (restartable init) or "app"
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    claims: list[str] = []  # names of the pod's resource claims this container uses


class ClaimRef(Struct, frozen=True, kw_only=True, gc=False):
    uid: str
    namespace: str = ""
    name: str = ""


class PreparedDevice(Struct, frozen=True, kw_only=True, gc=False):
    request_names: list[str] = []
    pool_name: str = ""
    device_name: str = ""
    cdi_device_ids: list[str] = []


# --------------------------------------------------------------------------- daemon


class DaemonStarted(EventBase, frozen=True):
    """``boot_id`` is the machine's (it changes on reboot); ``instance_id`` this run's."""

    boot_id: str
    version: str
    instance_id: str = ""
    config: dict[str, Any] = {}
    pid: int = 0
    #: what showed a lost history when this start began a new one over it (--accept-empty-log)
    fresh_start: str = ""


class DaemonStopped(EventBase, frozen=True):
    boot_id: str
    instance_id: str = ""
    reason: str = ""


class LogTrimmed(EventBase, frozen=True):
    """A retention cut (docs/adr/0018): records up to ``base_seq`` left the live log, into
    the archive segment ``segment`` ("" when the archive is off). Recorded after the cut."""

    base_seq: int
    records: int
    segment: str = ""
    reason: str = ""  # "maxSize" or "maxAge" and the figures that decided it


class CorruptRecordFound(EventBase, frozen=True):
    """A record whose checksum or encoding is wrong; it is left in place, never rewritten."""

    seq: int
    reason: str


class PolicyConfigurationChanged(EventBase, frozen=True):
    manager: str  # "cpu", "topology", "device", "dra", "daemon"
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}


class ConfigurationChanged(EventBase, frozen=True):
    """This start's effective configuration (the config file's fields, after flags and
    defaults: eventsrc.inputs.config) differs from the one the previous start recorded."""

    old: dict[str, Any] = {}
    new: dict[str, Any] = {}
    changed: list[str] = []  # the fields whose values differ, sorted


# --------------------------------------------------------------------------- plugins


class PluginRegistered(EventBase, frozen=True):
    resource: str
    endpoint: str
    api_version: str = "v1beta1"
    kind: str = "DevicePlugin"  # "DevicePlugin" or "DRAPlugin"
    options: PluginOptions = PluginOptions()


class PluginRegistrationRejected(EventBase, frozen=True):
    resource: str
    endpoint: str
    api_version: str = ""
    kind: str = "DevicePlugin"
    reason: str = ""


class PluginDisconnected(EventBase, frozen=True):
    resource: str
    endpoint: str = ""
    kind: str = "DevicePlugin"
    reason: str = ""


# --------------------------------------------------------------------------- devices


class DevicesAdded(EventBase, frozen=True):
    resource: str
    devices: list[DeviceInfo]


class DevicesRemoved(EventBase, frozen=True):
    resource: str
    device_ids: list[str]
    reason: str = ""


class ResourceDropped(EventBase, frozen=True):
    """The plugin of ``resource`` stayed away past the grace period: its free devices are
    gone, and new admissions are refused as unregistered while a pod holds its devices,
    then as a resource the node has none of."""

    resource: str
    reason: str = ""


class DeviceHealthChanged(EventBase, frozen=True):
    """v1: ``healthy: bool``; v2: ``health`` string and a single ``numa_node`` (-1: none);
    v3: ``numa_nodes`` list, as the device plugin API reports topology.

    ``coalesced`` (additive): changes the plugin listed for the device since its previous
    record that this record stands for beyond its own (flaps inside the window, ADR 0017).
    A record whose health and NUMA nodes are the ones already recorded only reports such
    flaps: the device came back to its recorded state within the window."""

    VERSION: ClassVar[int] = 3
    resource: str
    device_id: str
    health: str
    numa_nodes: list[int] = []
    coalesced: int = 0


# --------------------------------------------------------------------------- pods


#: ``PodAdmissionStarted.source`` of a pod admitted from the container runtime's facts (NRI)
FROM_RUNTIME: Final = "runtime"


class PodAdmissionStarted(EventBase, frozen=True):
    """Intent: the pod is being admitted (recorded before any plugin is called).

    ``source`` is ``FROM_RUNTIME`` for a pod admitted from the container runtime's facts
    (a pod the node API never saw): such a pod grows by container, as the runtime creates
    them (ContainerAdmissionStarted); "" for a pod admitted whole (the node API)."""

    pod: PodRef
    containers: list[ContainerSpec] = []
    source: str = ""


class ContainerAdmissionStarted(EventBase, frozen=True):
    """Intent: one more container of a pod admitted from the runtime's facts, admitted at its
    own creation (the runtime tells of one container at a time); devices and CPUs follow as
    for a pod. ``finished``: earlier containers of the pod the runtime had seen exit before
    this one was created, which are init containers (the kubelet starts the next container
    only once an init container has exited): their exclusive CPUs and devices pass on."""

    pod: PodRef
    container: ContainerSpec
    finished: list[str] = []


class ContainerAdmitted(EventBase, frozen=True):
    """Outcome of a ContainerAdmissionStarted: the container holds what was reserved for it.
    A refusal is an AdmissionRejected naming the container; the pod keeps its other containers."""

    pod: PodRef
    container: str
    qos_class: str = ""  # the pod's, of the containers it has now


class PodAdmitted(EventBase, frozen=True):
    """v1: flat ``uid``/``namespace``/``name``; v2: ``pod`` reference and containers.

    ``containers`` is empty when the admission's PodAdmissionStarted holds them (every
    admission since issue 15: the log does not repeat them); a pod imported from the
    kubelet's checkpoints, which has no intent record, carries them here."""

    VERSION: ClassVar[int] = 2
    pod: PodRef
    containers: list[ContainerSpec] = []
    qos_class: str = ""


class AdmissionRejected(EventBase, frozen=True):
    pod: PodRef
    reason: str
    container: str = ""
    # When the topology manager refused: the merged hint, as the kubelet prints it ("{01 false}").
    topology_hint: str = ""
    # The kubelet's reason word where it has its own, as a pod's status shows it ("OutOfcpu",
    # "OutOfmemory": the resource fit, docs/adr/0043); "" where the reason is the message only.
    kubelet_reason: str = ""


class PodRemoved(EventBase, frozen=True):
    pod_uid: str
    reason: str = ""


class PodQuarantined(EventBase, frozen=True):
    """A pod whose records are in doubt: one of the corrupt records ``corrupt_seqs`` may have
    been its admission's outcome, a release or its removal. It keeps everything it holds
    until an operator removes it; nothing is released on a guess (docs/adr/0005)."""

    pod: PodRef
    corrupt_seqs: list[int]
    reason: str = ""


# --------------------------------------------------------------------------- device allocation


class DevicesReserved(EventBase, frozen=True):
    """Intent, recorded before the plugin's Allocate call. ``choice`` says who chose the
    devices: "kept" (the container had them), "plugin" (GetPreferredAllocation) or
    "daemon"; ``note`` why (e.g. why the plugin's preference was not used)."""

    pod_uid: str
    container: str
    resource: str
    device_ids: list[str]
    choice: str = ""
    note: str = ""


class DevicesAllocated(EventBase, frozen=True):
    """Outcome of Allocate: the devices are the container's, with the plugin's response."""

    pod_uid: str
    container: str
    resource: str
    device_ids: list[str]
    response: ContainerAllocation = ContainerAllocation()


class AllocationFailed(EventBase, frozen=True):
    pod_uid: str
    container: str
    resource: str
    device_ids: list[str] = []
    reason: str = ""


class DevicesReleased(EventBase, frozen=True):
    pod_uid: str
    container: str
    resource: str
    device_ids: list[str]
    reason: str = ""


# --------------------------------------------------------------------------- cpus


class CPUsAssigned(EventBase, frozen=True):
    pod_uid: str
    container: str
    cpus: list[int]


class CPUsReleased(EventBase, frozen=True):
    pod_uid: str
    container: str
    cpus: list[int]
    reason: str = ""


class SharedPoolChanged(EventBase, frozen=True):
    """The CPUs every container without exclusive CPUs may run on, after a change."""

    cpus: list[int]
    reason: str = ""


# --------------------------------------------------------------------------- memory
# The memory manager's decisions (policy Static, docs/adr/0044): no checkpoint, the log.


class MemoryBlock(Struct, frozen=True, kw_only=True, gc=False):
    """A container's memory of one type on a group of NUMA nodes, as PodResources lists it."""

    numa_affinity: list[int]
    type: str  # "memory", "hugepages-2Mi", "hugepages-1Gi"
    size: int  # bytes


class MemoryAssigned(EventBase, frozen=True):
    """The container's memory blocks, the whole set (an init container's shrink, as the
    containers after it reuse its memory, is a new set). ``taken``: what this decision took
    of each NUMA node (node id -> resource -> bytes), as the kubelet's machine state counts
    it: nothing for a shrink, less than the blocks' size for memory reused from an init
    container."""

    pod_uid: str
    container: str
    blocks: list[MemoryBlock]
    taken: dict[str, dict[str, int]] = {}


class MemoryReleased(EventBase, frozen=True):
    """The container's blocks given back; ``returned``: to which nodes (node id -> resource
    -> bytes), as the kubelet's RemoveContainer gives them back."""

    pod_uid: str
    container: str
    returned: dict[str, dict[str, int]] = {}
    reason: str = ""


class MemoryMachineChanged(EventBase, frozen=True):
    """At a start: the memory and hugepages per NUMA node (node id -> resource -> bytes)
    differ from what the log last recorded ({} the first time). The assignments were fitted
    to the new machine in the log's order: ``taken`` is what those that fit take of each
    node now; ``unaccounted`` (pod uid -> containers) those that do not, and
    ``no_longer_fit`` says why, one line each. Those keep running; the machine no longer
    counts their memory (docs/adr/0044)."""

    old: dict[str, dict[str, int]]
    new: dict[str, dict[str, int]]
    no_longer_fit: list[str] = []
    taken: dict[str, dict[str, int]] = {}
    unaccounted: dict[str, list[str]] = {}


# --------------------------------------------------------------------------- claims


class ClaimPrepareStarted(EventBase, frozen=True):
    """Intent, recorded before NodePrepareResources."""

    claim: ClaimRef
    driver: str
    pod_uid: str = ""


class ClaimPrepared(EventBase, frozen=True):
    claim: ClaimRef
    driver: str
    devices: list[PreparedDevice] = []


class ClaimPrepareFailed(EventBase, frozen=True):
    claim: ClaimRef
    driver: str
    reason: str = ""


class ClaimUnprepareStarted(EventBase, frozen=True):
    claim: ClaimRef
    driver: str


class ClaimUnprepared(EventBase, frozen=True):
    claim: ClaimRef
    driver: str


class ClaimUnprepareFailed(EventBase, frozen=True):
    claim: ClaimRef
    driver: str
    reason: str = ""


class PodReferenceAdded(EventBase, frozen=True):
    claim_uid: str
    pod_uid: str


class PodReferenceRemoved(EventBase, frozen=True):
    claim_uid: str
    pod_uid: str


# --------------------------------------------------------------------------- the container runtime (NRI)


class RuntimeConnected(EventBase, frozen=True):
    """eventsrc registered as an NRI plugin of the runtime; ``mode`` "enforce" or "observe"."""

    runtime: str = ""
    runtime_version: str = ""
    plugin: str = ""  # "NN-name", as the runtime names it
    mode: str = "enforce"


class RuntimeDisconnected(EventBase, frozen=True):
    reason: str = ""


class PodSandboxStarted(EventBase, frozen=True):
    """The runtime ran (or, at Synchronize, had) this pod sandbox."""

    sandbox_id: str
    pod: PodRef


class PodSandboxRemoved(EventBase, frozen=True):
    sandbox_id: str
    pod_uid: str
    reason: str = ""


class ContainerCreated(EventBase, frozen=True):
    """A container the runtime created, with what it got. ``adjusted``: eventsrc set it (enforce
    mode); otherwise it is what the runtime applied (observe mode, or created while eventsrc was
    away). ``cpus``/``mems`` empty: no cpuset was set. ``envs`` holds names only."""

    container_id: str
    sandbox_id: str
    pod_uid: str
    name: str
    cgroups_path: str = ""
    cpus: list[int] = []
    mems: list[int] = []
    devices: list[str] = []  # device nodes, as paths in the container
    device_ids: dict[str, list[str]] = {}  # resource -> the device ids it was given (enforce)
    cdi_devices: list[str] = []
    envs: list[str] = []
    adjusted: bool = False


class ContainerStarted(EventBase, frozen=True):
    container_id: str
    pod_uid: str = ""


class ContainerStopped(EventBase, frozen=True):
    """``exit_code`` is -1 when the runtime did not say (NRI 0.8 carries none)."""

    container_id: str
    pod_uid: str = ""
    exit_code: int = -1


class ContainerRemoved(EventBase, frozen=True):
    container_id: str
    pod_uid: str = ""
    reason: str = ""


class ContainerCPUsUpdated(EventBase, frozen=True):
    """A running container's cpuset changed: eventsrc updated it (the shared pool followed an
    assignment or a release), or the runtime reported the change (observe mode)."""

    container_id: str
    pod_uid: str = ""
    cpus: list[int] = []
    mems: list[int] = []
    reason: str = ""


# --------------------------------------------------------------------------- observed beside a kubelet
# Facts eventsrc did not decide: what the kubelet on the node said it decided (PodResources,
# its checkpoint files), recorded as observed (``serve --beside-kubelet``, docs/kubelet-node.md).
# A pod is named as the kubelet names it (namespace and name); its uid is filled in when the
# runtime (NRI) or a checkpoint file says it, and is "" until then.


class ObservedMemory(Struct, frozen=True, kw_only=True, gc=False):
    memory_type: str  # "memory", "hugepages-2Mi", ...
    size: int  # bytes
    numa_nodes: list[int] = []


class ObservedClaimDevice(Struct, frozen=True, kw_only=True, gc=False):
    driver: str
    pool: str = ""
    device: str = ""
    cdi_devices: list[str] = []
    share_id: str = ""


class KubeletPodObserved(EventBase, frozen=True):
    """The kubelet lists the pod (first seen, or its uid learned since)."""

    pod: PodRef
    source: str = ""  # "List", "Get", a checkpoint file's name


class KubeletPodReleased(EventBase, frozen=True):
    """The pod is known gone, and whatever it held with it (its per-resource releases come first)."""

    pod: PodRef
    reason: str = ""


class KubeletDevicesObserved(EventBase, frozen=True):
    """The kubelet gave the container these devices (only the ones it did not hold before)."""

    pod: PodRef
    container: str
    resource: str
    device_ids: list[str]
    numa_nodes: list[int] = []


class KubeletDevicesReleased(EventBase, frozen=True):
    pod: PodRef
    container: str
    resource: str
    device_ids: list[str]
    reason: str = ""


class KubeletCPUsObserved(EventBase, frozen=True):
    """The container's exclusive CPUs, as the kubelet lists them now (the whole set)."""

    pod: PodRef
    container: str
    cpus: list[int]


class KubeletCPUsReleased(EventBase, frozen=True):
    pod: PodRef
    container: str
    cpus: list[int]
    reason: str = ""


class KubeletMemoryObserved(EventBase, frozen=True):
    """The container's memory blocks as the kubelet's memory manager lists them (the whole set;
    empty once it lists none)."""

    pod: PodRef
    container: str
    memory: list[ObservedMemory] = []


class KubeletClaimObserved(EventBase, frozen=True):
    """The container uses the DRA claim with these devices, as the kubelet lists it."""

    pod: PodRef
    container: str
    claim: ClaimRef
    devices: list[ObservedClaimDevice] = []


class KubeletClaimReleased(EventBase, frozen=True):
    pod: PodRef
    container: str
    claim: ClaimRef
    devices: list[ObservedClaimDevice] = []
    reason: str = ""


class KubeletAllocatableChanged(EventBase, frozen=True):
    """What ``GetAllocatableResources`` lists changed: devices appeared (``added``) or left
    (``removed``: unhealthy, or gone from their plugin), CPUs likewise."""

    added: dict[str, list[DeviceInfo]] = {}  # resource -> devices it lists now and did not before
    removed: dict[str, list[str]] = {}  # resource -> device ids it no longer lists
    cpus_added: list[int] = []
    cpus_removed: list[int] = []
    #: where the list came from: "" the kubelet's GetAllocatableResources; else, for a kubelet
    #: without it (before 1.21, or 1.21-1.22 with the gate off), the file it was read from (the
    #: device manager's checkpoint: its RegisteredDevices, with no NUMA nodes and no CPUs)
    source: str = ""


class KubeletSharedPoolObserved(EventBase, frozen=True):
    """The CPU manager's shared pool, from its checkpoint file (PodResources does not list it)."""

    cpus: list[int]
    policy: str = ""
    source: str = ""


class KubeletCPUsDisagreed(EventBase, frozen=True):
    """The kubelet's PodResources answer lists CPUs for a container (``listed``) that its CPU
    manager's state (``source``, the file) does not explain: the state gives the container
    ``checkpoint`` as its exclusive CPUs (empty: none), and what is listed is neither that nor
    exactly the shared pool. Only the CPUs both give are recorded as the container's exclusive
    CPUs. Recorded once it lasts 2 s of looks (the answer and the file are read at different
    moments, and the kubelet writes its file within milliseconds of a change)."""

    pod: PodRef
    container: str
    listed: list[int]
    checkpoint: list[int]
    source: str = ""


class KubeletCheckpointReadFailed(EventBase, frozen=True):
    """A kubelet checkpoint file that could not be read or verified; nothing was taken from it."""

    path: str
    reason: str


class KubeletDoubleAllocationFound(EventBase, frozen=True):
    """The kubelet lists one device (``resource`` a device plugin's resource name) or exclusive
    CPU (``resource`` "cpu") for containers of two or more pods at once (``holders``,
    "namespace/name/container" each). The kubelet's decision, observed: a finding about the
    kubelet, never a failure of eventsrc (docs/adr/0038; ``replay --check`` exits 3 on it)."""

    resource: str
    ids: list[str]
    holders: list[str]


class ObservationGapFound(EventBase, frozen=True):
    """A time eventsrc could not see something it records: ``source`` is "kubelet",
    "runtime" or "eventsrc" (itself not running). ``until_ns`` 0: the gap is still open (a
    later record with the same ``source`` and ``since_ns`` closes it)."""

    source: str
    since_ns: int
    until_ns: int = 0
    reason: str = ""


# --------------------------------------------------------------------------- the union

Event = (
    DaemonStarted
    | DaemonStopped
    | CorruptRecordFound
    | LogTrimmed
    | PolicyConfigurationChanged
    | ConfigurationChanged
    | PluginRegistered
    | PluginRegistrationRejected
    | PluginDisconnected
    | DevicesAdded
    | DevicesRemoved
    | ResourceDropped
    | DeviceHealthChanged
    | PodAdmissionStarted
    | ContainerAdmissionStarted
    | ContainerAdmitted
    | PodAdmitted
    | AdmissionRejected
    | PodRemoved
    | PodQuarantined
    | DevicesReserved
    | DevicesAllocated
    | AllocationFailed
    | DevicesReleased
    | CPUsAssigned
    | CPUsReleased
    | SharedPoolChanged
    | MemoryAssigned
    | MemoryReleased
    | MemoryMachineChanged
    | ClaimPrepareStarted
    | ClaimPrepared
    | ClaimPrepareFailed
    | ClaimUnprepareStarted
    | ClaimUnprepared
    | ClaimUnprepareFailed
    | PodReferenceAdded
    | PodReferenceRemoved
    | RuntimeConnected
    | RuntimeDisconnected
    | PodSandboxStarted
    | PodSandboxRemoved
    | ContainerCreated
    | ContainerStarted
    | ContainerStopped
    | ContainerRemoved
    | ContainerCPUsUpdated
    | KubeletPodObserved
    | KubeletPodReleased
    | KubeletDevicesObserved
    | KubeletDevicesReleased
    | KubeletCPUsObserved
    | KubeletCPUsReleased
    | KubeletMemoryObserved
    | KubeletClaimObserved
    | KubeletClaimReleased
    | KubeletAllocatableChanged
    | KubeletSharedPoolObserved
    | KubeletCPUsDisagreed
    | KubeletCheckpointReadFailed
    | KubeletDoubleAllocationFound
    | ObservationGapFound
)

EVENT_TYPES: Final[dict[str, type[EventBase]]] = {t.__name__: t for t in EventBase.__subclasses__()}


class Record(Struct, frozen=True, gc=False):
    """One event as read from (or acknowledged by) the log."""

    seq: int
    ts_ns: int
    correlation_id: str
    version: int
    event: Event

    @property
    def type(self) -> str:
        return type(self.event).__name__


class CorruptRecordError(Exception):
    """A record that fails its checksum or cannot be decoded. Names its sequence."""

    def __init__(self, seq: int, reason: str) -> None:
        super().__init__(f"record {seq} is corrupt: {reason}")
        self.seq = seq
        self.reason = reason


class FutureRecordError(CorruptRecordError):
    """An intact record (its checksum holds) that a newer eventsrc wrote: an event type this
    code does not know, or a newer version of one it does (docs/adr/0010). It carries the
    envelope and the body as plain data, so readers can show it raw; nothing guesses at it.
    ``skippable``: the writer declared that a reader may ignore it without misjudging the
    node's resources (the envelope's ``s`` flag)."""

    def __init__(
        self,
        seq: int,
        reason: str,
        *,
        type_name: str,
        version: int,
        ts_ns: int,
        correlation_id: str,
        body: Any,
        skippable: bool = False,
    ) -> None:
        super().__init__(seq, reason)
        self.args = (f"record {seq} cannot be read by this eventsrc: {reason}",)
        self.type_name = type_name
        self.version = version
        self.ts_ns = ts_ns
        self.correlation_id = correlation_id
        self.body = body
        self.skippable = skippable


def ignorable(item: object) -> TypeGuard[FutureRecordError]:
    """A newer eventsrc's record that it declared safe for older ones to pass by
    (docs/adr/0010): neither corrupt nor a reason to stop."""
    return isinstance(item, FutureRecordError) and item.skippable


def newer_unreadable(item: object) -> TypeGuard[FutureRecordError]:
    """A newer eventsrc's record that this one can neither read nor pass by."""
    return isinstance(item, FutureRecordError) and not item.skippable


# --------------------------------------------------------------------------- upcasters

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

#: (type name, version) -> function that turns that version's body into version + 1.
UPCASTERS: Final[dict[tuple[str, int], Upcaster]] = {}


def upcaster(type_name: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    def register(fn: Upcaster) -> Upcaster:
        UPCASTERS[(type_name, from_version)] = fn
        return fn

    return register


@upcaster("DeviceHealthChanged", 1)
def _device_health_v1_to_v2(body: dict[str, Any]) -> dict[str, Any]:
    healthy = body.pop("healthy", False)
    body["health"] = "Healthy" if healthy else "Unhealthy"
    body["numa_node"] = -1
    return body


@upcaster("DeviceHealthChanged", 2)
def _device_health_v2_to_v3(body: dict[str, Any]) -> dict[str, Any]:
    node = body.pop("numa_node", -1)
    body["numa_nodes"] = [] if node is None or node < 0 else [node]
    return body


@upcaster("PodAdmitted", 1)
def _pod_admitted_v1_to_v2(body: dict[str, Any]) -> dict[str, Any]:
    body["pod"] = {
        "uid": body.pop("uid"),
        "namespace": body.pop("namespace", ""),
        "name": body.pop("name", ""),
    }
    body.setdefault("containers", [])
    return body


def upcast(type_name: str, version: int, body: dict[str, Any]) -> dict[str, Any]:
    """Run the upcaster chain from ``version`` to the type's current version."""
    current = EVENT_TYPES[type_name].VERSION
    while version < current:
        step = UPCASTERS.get((type_name, version))
        if step is None:
            raise ValueError(f"no upcaster for {type_name} v{version}")
        body = step(body)
        version += 1
    return body


# --------------------------------------------------------------------------- codec


class _Envelope(Struct, array_like=True):
    t: str
    v: int
    ts: int
    cid: str
    e: msgspec.Raw
    # Hash of the previous record's stored value (docs/adr/0009); empty before the chain existed.
    h: bytes = b""
    # Set by a newer writer on a record an older reader may ignore (docs/adr/0010); no
    # event type of this version sets it.
    s: bool = False


_encoder = msgspec.msgpack.Encoder()
_pack_crc = struct.Struct(">I").pack
_envelope_decoder = msgspec.msgpack.Decoder(_Envelope)
_body_decoders = {name: msgspec.msgpack.Decoder(t) for name, t in EVENT_TYPES.items()}
_any_decoder = msgspec.msgpack.Decoder()
_crc = zlib.crc32


def encode_payload(event: EventBase, ts_ns: int, correlation_id: str, prev_hash: bytes = b"") -> bytes:
    """The stored value of one record: CRC32 then the msgpack envelope, which carries the
    hash of the previous record's value (the hash chain)."""
    # Encoded in one pass as the array the _Envelope decoder reads back.
    t = type(event)
    payload = _encoder.encode((t.__name__, t.VERSION, ts_ns, correlation_id, event, prev_hash))
    return _pack_crc(_crc(payload)) + payload


def chain_hash(value: bytes) -> bytes:
    """What the next record carries about this one: 16 bytes of BLAKE2b of its stored value."""
    return hashlib.blake2b(value, digest_size=16).digest()


def prev_hash_of(value: bytes) -> bytes:
    """The predecessor hash a stored value carries (b"" before the chain, or if unreadable)."""
    try:
        return _envelope_decoder.decode(memoryview(value)[4:]).h
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):  # a str that is not UTF-8
        return b""


def decode_record(seq: int, value: bytes) -> Record:
    """Check and decode one stored value. Raises CorruptRecordError naming ``seq``."""
    mv = memoryview(value)
    if len(mv) < 5:
        raise CorruptRecordError(seq, f"record too short ({len(mv)} bytes)")
    payload = mv[4:]
    if _crc(payload) != int.from_bytes(mv[:4], "big"):
        raise CorruptRecordError(seq, "checksum mismatch")
    try:
        env = _envelope_decoder.decode(payload)
        cls = EVENT_TYPES.get(env.t)
        if cls is None or env.v > cls.VERSION:
            # A newer eventsrc wrote this. Additive changes never bump a version, so a
            # newer version is a breaking one: reading it as ours could lie.
            known = "an unknown event type" if cls is None else f"this eventsrc reads up to v{cls.VERSION}"
            raise FutureRecordError(
                seq,
                f"{env.t} v{env.v} is from a newer eventsrc ({known})",
                type_name=env.t,
                version=env.v,
                ts_ns=env.ts,
                correlation_id=env.cid,
                body=_any_decoder.decode(env.e),
                skippable=env.s,
            )
        if env.v == cls.VERSION:
            event = _body_decoders[env.t].decode(env.e)
        else:
            body = _any_decoder.decode(env.e)
            body.pop("type", None)  # early logs stored the type in the body too
            event = msgspec.convert(upcast(env.t, env.v, body), cls)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, KeyError) as exc:
        raise CorruptRecordError(seq, f"undecodable: {exc}") from None
    return Record(seq=seq, ts_ns=env.ts, correlation_id=env.cid, version=env.v, event=event)  # type: ignore[arg-type]
