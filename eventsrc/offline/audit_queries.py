"""Audit queries: who held a device and when, what a pod asked for and got, a claim's life.

    eventsrc audit device RESOURCE DEVICE_ID [--since T] [--until T] [-o table|json]
    eventsrc audit pod UID|NAMESPACE/NAME [-o table|json]
    eventsrc audit claim UID [-o table|json]

A pod run through the container runtime (NRI, docs/nri.md) also shows its sandboxes and
containers: ids, names, cpusets, devices, with the times each was created, started, stopped,
updated and removed; a device, the containers the runtime created with it.

Every answer comes from the log's secondary index (``eventsrc.log.index``: written in the
same LMDB transaction as the records it points at), never from a scan: a query reads the
sequences under one prefix (``index_seqs``) and then only those records (``read_many``). A
device's holders are named through each pod's own index (the first admission record of that
uid), a pod's claims through each claim's index.

After retention cuts (docs/adr/0018) the query reads through ``eventsrc.log.history``: the
archive segments first (they have no index: each segment the window overlaps is scanned once),
then the live log; with ``--live-only`` the live log alone, and the answer says where it starts.

Times are the records' own (the time the log stamped them); every item carries its
sequence number too, so that ``eventsrc log --from SEQ`` shows the record itself.

The answers are values (msgspec structs); how they are shown, as text or JSON, and the
command that prints them are ``eventsrc.offline.audit_render``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING

from msgspec import Struct

from eventsrc import events as ev
from eventsrc.errors import EventsrcError
from eventsrc.log.index import (
    claim_prefix,
    device_prefix,
    name_prefix,
    observation_prefix,
    pod_prefix,
)
from eventsrc.state.kubelet import OBSERVED_POD_EVENTS, claim_device_id
from eventsrc.state.lifecycles import CLAIM, DRIVER_EVENTS

if TYPE_CHECKING:
    from eventsrc.log.history import History, Reader


class UsageError(EventsrcError):
    """A malformed argument (a bad time): exit 2, as argparse does."""

    exit_code = 2


class NotInLogError(EventsrcError):
    """The device, pod or claim asked about never appears in the log."""


# --------------------------------------------------------------------------- values


def iso(ts_ns: int) -> str:
    return dt.datetime.fromtimestamp(ts_ns / 1e9, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class At(Struct, frozen=True, kw_only=True, gc=False):
    """Where in the log something happened: the record's sequence and time."""

    seq: int
    ts_ns: int
    time: str


def at(rec: ev.Record) -> At:
    return At(seq=rec.seq, ts_ns=rec.ts_ns, time=iso(rec.ts_ns))


class PodName(Struct, frozen=True, kw_only=True, gc=False):
    uid: str
    namespace: str = ""
    name: str = ""


class LogStart(Struct, frozen=True, kw_only=True, gc=False):
    """What an answer read after retention cuts: from ``first_seq`` (1 through the archive),
    the live log from ``live_first_seq``; ``missing``: the ranges the archive lacks."""

    first_seq: int
    live_first_seq: int
    archive_segments: int
    live_only: bool
    missing: list[str] = []


# the container runtime -----------------------------------------------------


class Sandbox(Struct, kw_only=True, gc=False):
    """A pod sandbox the runtime ran (PodSandboxStarted) until it removed it."""

    id: str
    started: At | None = None  # None: before the retained log
    removed: At | None = None
    reason: str = ""


class CPUsetUpdate(Struct, kw_only=True, gc=False):
    """A running container's cpuset changed (ContainerCPUsUpdated)."""

    at: At
    cpus: list[int]
    mems: list[int]
    reason: str = ""


class RuntimeContainer(Struct, kw_only=True, gc=False):
    """A container the runtime created for the pod: what it got, and when it ran.
    ``adjusted``: eventsrc set its cpuset and devices (enforce); otherwise they are what the
    runtime applied (observe). ``cpus``/``mems`` are the cpuset it was created with."""

    id: str
    name: str = ""
    sandbox_id: str = ""
    cgroups_path: str = ""
    cpus: list[int] = []
    mems: list[int] = []
    devices: list[str] = []  # device nodes, as paths in the container
    device_ids: dict[str, list[str]] = {}
    cdi_devices: list[str] = []
    envs: list[str] = []  # names only
    adjusted: bool = False
    created: At | None = None  # None: before the retained log
    started: At | None = None
    cpus_updated: list[CPUsetUpdate] = []
    stopped: At | None = None
    exit_code: int = -1  # -1: the runtime did not say
    removed: At | None = None
    reason: str = ""  # why removed

    @property
    def state(self) -> str:
        if self.removed:
            return "removed"
        if self.stopped:
            return "stopped"
        return "running" if self.started else "created"


class ContainerRun(Struct, kw_only=True, gc=False):
    """A container the runtime created with a device (ContainerCreated.device_ids)."""

    pod: PodName
    container: RuntimeContainer


# device ---------------------------------------------------------------------


class DeviceChange(Struct, kw_only=True, gc=False):
    """The device was listed by its plugin, changed health, or was removed."""

    at: At
    what: str  # "listed", "health" or "removed"
    health: str = ""
    numa_nodes: list[int] = []
    reason: str = ""


class Holding(Struct, kw_only=True, gc=False):
    """One container's hold on the device, from its reservation to its release."""

    pod: PodName
    container: str
    device_ids: list[str]  # the whole grant the device was part of
    start: At | None  # first DevicesReserved or DevicesAllocated (None: before the retained log)
    reserved: At | None = None
    allocated: At | None = None
    choice: str = ""
    note: str = ""
    end: At | None = None  # None: still held (at the end of the window)
    still_held: bool = True
    released_by: str = ""  # "DevicesReleased", "AllocationFailed", "KubeletDevicesReleased"...
    reason: str = ""
    decided_by: str = "eventsrc"  # or "kubelet": observed beside it (``serve --beside-kubelet``)
    # a kubelet hold: the runtime's containers of that pod and name whose lives overlap it (a restart: a new id)
    container_ids: list[RuntimeContainer] = []


class Gap(Struct, kw_only=True, gc=False):
    """A time eventsrc could not see ``source`` ("kubelet", "runtime" or "eventsrc"):
    ObservationGapFound. ``until`` None: still open at the end of the log."""

    source: str
    since_ns: int
    since: str
    until_ns: int = 0
    until: str = ""
    reason: str = ""
    found: At | None = None  # the record that told it
    closed: At | None = None  # the record that closed it


class KubeletFinding(Struct, kw_only=True, gc=False):
    """The kubelet listed the device for two pods at once (KubeletDoubleAllocationFound): its
    fault, recorded when eventsrc saw it (docs/adr/0038)."""

    at: At
    holders: list[str]  # "namespace/name/container"


class DeviceTimeline(Struct, kw_only=True, gc=False):
    resource: str
    device_id: str
    since: At | None = None  # the window asked for, as given (seq and/or time)
    until: At | None = None
    health: str = ""  # as of the end of the window
    numa_nodes: list[int] = []
    listed: bool = False  # listed by its plugin at the end of the window
    changes: list[DeviceChange] = []
    holders: list[Holding] = []
    containers: list[ContainerRun] = []  # the containers the runtime ran with it
    gaps: list[Gap] = []  # what eventsrc could not see while this history ran
    corrupt: list[int] = []
    log: LogStart | None = None  # None: the log was never cut
    findings: list[KubeletFinding] = []  # the kubelet gave it to two pods at once


# pod ------------------------------------------------------------------------


class Asked(Struct, kw_only=True, gc=False):
    at: At
    type: str  # PodAdmissionStarted (or PodAdmitted when the log has no intent, e.g. an import)
    containers: list[ev.ContainerSpec]


class Admitted(Struct, kw_only=True, gc=False):
    at: At
    qos_class: str = ""
    container: str = ""  # a container admitted into the pod at its creation (ContainerAdmitted)


class Refusal(Struct, kw_only=True, gc=False):
    at: At
    reason: str
    container: str = ""
    topology_hint: str = ""


class DeviceGrant(Struct, kw_only=True, gc=False):
    container: str
    resource: str
    device_ids: list[str]
    reserved: At | None = None
    choice: str = ""
    note: str = ""
    allocated: At | None = None
    response: ev.ContainerAllocation | None = None  # the plugin's Allocate response
    failed: At | None = None  # AllocationFailed
    released: At | None = None
    reason: str = ""  # why released, or why the allocation failed


class CPUGrant(Struct, kw_only=True, gc=False):
    container: str
    cpus: list[int]
    assigned: At
    released: At | None = None
    reason: str = ""


class MemoryGrant(Struct, kw_only=True, gc=False):
    """A container's memory blocks (the memory manager), from its MemoryAssigned until its
    release or the next set (``reason`` "replaced": an init container's blocks shrunk as the
    containers after it reuse its memory)."""

    container: str
    blocks: list[ev.MemoryBlock]
    assigned: At
    released: At | None = None
    reason: str = ""


class ClaimUse(Struct, kw_only=True, gc=False):
    uid: str
    namespace: str = ""
    name: str = ""
    driver: str = ""
    referenced: At | None = None
    unreferenced: At | None = None
    state: str = ""  # the claim's state when the pod let go of it (or now)
    cdi_devices: list[str] = []
    error: str = ""


class Removal(Struct, kw_only=True, gc=False):
    at: At
    reason: str = ""


class ObservedDevices(Struct, kw_only=True, gc=False):
    """Devices the kubelet gave a container (KubeletDevicesObserved) until it let them go."""

    resource: str
    device_ids: list[str]
    observed: At
    released: At | None = None
    reason: str = ""


class ObservedCPUs(Struct, kw_only=True, gc=False):
    """The container's exclusive CPUs as the kubelet listed them from ``at`` (the whole set)
    until the next listing or their release."""

    cpus: list[int]
    at: At
    until: At | None = None
    reason: str = ""


class ObservedMemoryStep(Struct, kw_only=True, gc=False):
    at: At
    memory: list[ev.ObservedMemory]


class ObservedClaim(Struct, kw_only=True, gc=False):
    claim: ev.ClaimRef
    devices: list[ev.ObservedClaimDevice]
    observed: At
    released: At | None = None
    reason: str = ""


class ObservedContainer(Struct, kw_only=True, gc=False):
    name: str
    devices: list[ObservedDevices] = []
    cpus: list[ObservedCPUs] = []
    memory: list[ObservedMemoryStep] = []
    claims: list[ObservedClaim] = []
    container_ids: list[RuntimeContainer] = []  # the runtime's containers of that name (restarts: new ids)


class ObservedPod(Struct, kw_only=True, gc=False):
    """What the kubelet decided for the pod, as eventsrc observed it beside it."""

    decided_by: str = "kubelet"
    observed: At | None = None  # its first observed record
    uid_from: str = ""  # how its uid was learned: "kubelet", "runtime" (a sandbox of that name) or ""
    released: At | None = None
    reason: str = ""
    containers: list[ObservedContainer] = []


class Line(Struct, kw_only=True, gc=False):
    """One record, as ``eventsrc log`` summarizes it."""

    at: At
    type: str
    summary: str


class PodHistory(Struct, kw_only=True, gc=False):
    uid: str
    namespace: str = ""
    name: str = ""
    resolved: str = ""  # how NAMESPACE/NAME was resolved to this uid ("" when asked by uid)
    other_uids: list[str] = []  # older pods with the same namespace/name
    asked: list[Asked] = []
    admitted: list[Admitted] = []
    refused: list[Refusal] = []
    devices: list[DeviceGrant] = []
    cpus: list[CPUGrant] = []
    memory: list[MemoryGrant] = []
    claims: list[ClaimUse] = []
    sandboxes: list[Sandbox] = []
    containers: list[RuntimeContainer] = []
    removed: list[Removal] = []
    observed: ObservedPod | None = None  # what a kubelet decided for it (``serve --beside-kubelet``)
    gaps: list[Gap] = []  # what eventsrc could not see while the pod lived
    events: list[Line] = []
    corrupt: list[int] = []
    log: LogStart | None = None  # None: the log was never cut


# claim ----------------------------------------------------------------------


class ClaimStep(Struct, kw_only=True, gc=False):
    at: At
    type: str
    state: str  # the claim's state after this step
    driver: str = ""
    pod_uid: str = ""  # ClaimPrepareStarted: the pod it was prepared for
    reason: str = ""
    devices: list[ev.PreparedDevice] = []


class ClaimPod(Struct, kw_only=True, gc=False):
    pod: PodName
    referenced: At | None = None
    unreferenced: At | None = None


class ClaimHistory(Struct, kw_only=True, gc=False):
    uid: str
    namespace: str = ""
    name: str = ""
    driver: str = ""
    state: str = ""
    lifecycle: list[ClaimStep] = []
    pods: list[ClaimPod] = []
    cdi_devices: list[str] = []  # of the latest preparation
    devices: list[ev.PreparedDevice] = []
    errors: list[ClaimStep] = []
    corrupt: list[int] = []
    log: LogStart | None = None  # None: the log was never cut


# --------------------------------------------------------------------------- reading


def _read(
    log: Reader, prefix: bytes, corrupt: list[int], from_seq: int = 1, until_seq: int | None = None
) -> list[ev.Record]:
    seqs = log.index_seqs(prefix, from_seq, until_seq)
    out: list[ev.Record] = []
    for item in log.read_many(seqs):
        if isinstance(item, ev.CorruptRecordError):
            if item.seq not in corrupt:  # an archived one is under every query (and several are made)
                corrupt.append(item.seq)
        else:
            out.append(item)
    return out


_NAMED = (ev.PodAdmissionStarted, ev.PodAdmitted, ev.AdmissionRejected, ev.PodSandboxStarted)
#: what the kubelet decided, observed beside it: each names its pod (``PodRef``; its uid may be "")
_OBSERVED = OBSERVED_POD_EVENTS
_ADMISSIONS = (ev.PodAdmissionStarted, ev.PodAdmitted, ev.AdmissionRejected)


def pod_name(log: Reader, uid: str, cache: dict[str, PodName] | None = None) -> PodName:
    """The pod's namespace and name: from the first admission record in its own index."""
    if cache is not None and uid in cache:
        return cache[uid]
    found = PodName(uid=uid)
    seqs = log.index_seqs(pod_prefix(uid))
    # The admission record is nearly always the pod's first: read that one, then more.
    i, n = 0, 1
    while i < len(seqs):
        batch, i, n = seqs[i : i + n], i + n, 8
        hit = next(
            (
                r.event.pod
                for r in log.read_many(batch)
                if isinstance(r, ev.Record) and isinstance(r.event, (*_NAMED, *_OBSERVED)) and r.event.pod.name
            ),
            None,
        )
        if hit is not None:
            found = PodName(uid=uid, namespace=hit.namespace, name=hit.name)
            break
    if cache is not None:
        cache[uid] = found
    return found


# --------------------------------------------------------------------------- the runtime

_RUNTIME_EVENTS = (
    ev.PodSandboxStarted,
    ev.PodSandboxRemoved,
    ev.ContainerCreated,
    ev.ContainerStarted,
    ev.ContainerStopped,
    ev.ContainerRemoved,
    ev.ContainerCPUsUpdated,
)


class _Runtime:
    """One pod's sandboxes and containers, from its records in order (``feed`` each)."""

    def __init__(self) -> None:
        self.sandboxes: list[Sandbox] = []
        self.containers: list[RuntimeContainer] = []
        self._sandbox: dict[str, Sandbox] = {}
        self._container: dict[str, RuntimeContainer] = {}

    def _get(self, container_id: str) -> RuntimeContainer:
        c = self._container.get(container_id)
        if c is None:  # created before the retained log (or in a corrupt record)
            c = self._container[container_id] = RuntimeContainer(id=container_id)
            self.containers.append(c)
        return c

    def feed(self, r: ev.Record) -> None:
        e, a = r.event, at(r)
        if isinstance(e, ev.PodSandboxStarted):
            self._sandbox[e.sandbox_id] = sb = Sandbox(id=e.sandbox_id, started=a)
            self.sandboxes.append(sb)
        elif isinstance(e, ev.PodSandboxRemoved):
            sb2 = self._sandbox.pop(e.sandbox_id, None)
            if sb2 is None:
                sb2 = Sandbox(id=e.sandbox_id)
                self.sandboxes.append(sb2)
            sb2.removed, sb2.reason = a, e.reason
            for c in self._container.values():  # the runtime removes a sandbox's containers with it
                if c.sandbox_id == e.sandbox_id and c.removed is None:
                    c.removed, c.reason = a, "with its sandbox" + (f": {e.reason}" if e.reason else "")
        elif isinstance(e, ev.ContainerCreated):
            c = RuntimeContainer(
                id=e.container_id,
                name=e.name,
                sandbox_id=e.sandbox_id,
                cgroups_path=e.cgroups_path,
                cpus=list(e.cpus),
                mems=list(e.mems),
                devices=list(e.devices),
                device_ids={k: list(v) for k, v in e.device_ids.items()},
                cdi_devices=list(e.cdi_devices),
                envs=list(e.envs),
                adjusted=e.adjusted,
                created=a,
            )
            self._container[e.container_id] = c
            self.containers.append(c)
        elif isinstance(e, ev.ContainerStarted):
            self._get(e.container_id).started = a
        elif isinstance(e, ev.ContainerStopped):
            c = self._get(e.container_id)
            c.stopped, c.exit_code = a, e.exit_code
        elif isinstance(e, ev.ContainerRemoved):
            c = self._get(e.container_id)
            c.removed, c.reason = a, e.reason
        elif isinstance(e, ev.ContainerCPUsUpdated):
            update = CPUsetUpdate(at=a, cpus=list(e.cpus), mems=list(e.mems), reason=e.reason)
            self._get(e.container_id).cpus_updated.append(update)

    def container(self, container_id: str, created_seq: int) -> RuntimeContainer | None:
        """The container ``container_id`` created at ``created_seq``."""
        return next(
            (c for c in self.containers if c.id == container_id and c.created and c.created.seq == created_seq), None
        )


# --------------------------------------------------------------------------- observed beside a kubelet


def overlapping(
    containers: list[RuntimeContainer], name: str, start: At | None, end: At | None
) -> list[RuntimeContainer]:
    """The containers named ``name`` whose lives (created to stopped, else removed) overlap the
    hold from ``start`` to ``end`` (None: before the log; still held). A restart is a new id."""
    lo, hi = (start.seq if start else 0), (end.seq if end else None)
    out = []
    for c in containers:
        gone = c.stopped or c.removed
        if (
            c.name == name
            and (hi is None or c.created is None or c.created.seq <= hi)
            and (gone is None or gone.seq >= lo)
        ):
            out.append(c)
    return out


@dataclass
class ObservedRun:
    """One pod the kubelet listed under a namespace/name, from its first observed record to
    its KubeletPodReleased: its uid (as the kubelet said it, else from the runtime's sandbox
    of that name, else "") and its observed records."""

    uid: str
    uid_from: str
    records: list[ev.Record]
    released: bool = False


def observed_runs(recs: list[ev.Record]) -> list[ObservedRun]:
    """The observed pods in ``recs`` (the records of one namespace/name, in order), oldest first.
    A new pod starts after a KubeletPodReleased, or where the kubelet names another uid. A pod
    the kubelet names without a uid takes the uid of the first sandbox of that name started
    while it was listed, else of the newest started before it that no other pod took."""
    runs: list[ObservedRun] = []
    cur: ObservedRun | None = None
    for r in recs:
        e = r.event
        if not isinstance(e, _OBSERVED):
            continue
        uid = e.pod.uid
        if cur is None or cur.released or (uid and cur.uid and uid != cur.uid):
            cur = ObservedRun(uid=uid, uid_from="kubelet" if uid else "", records=[])
            runs.append(cur)
        elif uid and not cur.uid:
            cur.uid, cur.uid_from = uid, "kubelet"
        cur.records.append(r)
        cur.released = cur.released or isinstance(e, ev.KubeletPodReleased)
    sandboxes = [
        (r.seq, r.event.pod.uid) for r in recs if isinstance(r.event, ev.PodSandboxStarted) and r.event.pod.uid
    ]
    taken = {run.uid for run in runs if run.uid}
    for i, run in enumerate(runs):
        if run.uid:
            continue
        first = run.records[0].seq
        last = run.records[-1].seq if run.released else (runs[i + 1].records[0].seq if i + 1 < len(runs) else None)
        free = [(seq, uid) for seq, uid in sandboxes if uid not in taken]
        within = [uid for seq, uid in free if seq >= first and (last is None or seq <= last)]
        before = [uid for seq, uid in free if seq < first]
        pick = within[0] if within else before[-1] if before else ""
        if pick:
            run.uid, run.uid_from = pick, "runtime"
            taken.add(pick)
    return runs


def _named_records(log: Reader, namespace: str, name: str, corrupt: list[int]) -> list[ev.Record]:
    return _read(log, name_prefix(namespace, name), corrupt)


class _Observed:
    """One pod's observed records in order (``feed`` each): what the kubelet gave each container."""

    def __init__(self) -> None:
        self.pod = ObservedPod()
        self._containers: dict[str, ObservedContainer] = {}

    def _c(self, name: str) -> ObservedContainer:
        c = self._containers.get(name)
        if c is None:
            c = self._containers[name] = ObservedContainer(name=name)
            self.pod.containers.append(c)
        return c

    def feed(self, r: ev.Record) -> None:
        e, a = r.event, at(r)
        if self.pod.observed is None:
            self.pod.observed = a
        if isinstance(e, ev.KubeletPodReleased):
            self.pod.released, self.pod.reason = a, e.reason
        elif isinstance(e, ev.KubeletDevicesObserved):
            self._c(e.container).devices.append(
                ObservedDevices(resource=e.resource, device_ids=list(e.device_ids), observed=a)
            )
        elif isinstance(e, ev.KubeletDevicesReleased):
            self._devices_released(self._c(e.container), e, a)
        elif isinstance(e, (ev.KubeletCPUsObserved, ev.KubeletCPUsReleased)):
            self._cpus(self._c(e.container), e, a)
        elif isinstance(e, ev.KubeletMemoryObserved):
            self._c(e.container).memory.append(ObservedMemoryStep(at=a, memory=list(e.memory)))
        elif isinstance(e, ev.KubeletClaimObserved):
            c = self._c(e.container)
            held = next((u for u in c.claims if u.claim == e.claim and u.released is None), None)
            if held is None:
                c.claims.append(ObservedClaim(claim=e.claim, devices=list(e.devices), observed=a))
            else:
                held.devices = list(e.devices)
        elif isinstance(e, ev.KubeletClaimReleased):
            c = self._c(e.container)
            held = next((u for u in c.claims if u.claim == e.claim and u.released is None), None)
            if held is None:  # observed before the retained log
                held = ObservedClaim(claim=e.claim, devices=list(e.devices), observed=a)
                c.claims.append(held)
            held.released, held.reason = a, e.reason

    @staticmethod
    def _devices_released(c: ObservedContainer, e: ev.KubeletDevicesReleased, a: At) -> None:
        gone = set(e.device_ids)
        for h in list(c.devices):
            if h.resource != e.resource or h.released is not None or not gone & set(h.device_ids):
                continue
            left = [i for i in h.device_ids if i not in gone]
            if left:  # part of the grant: the rest stays held
                released = [i for i in h.device_ids if i in gone]
                h.device_ids = left
                h = ObservedDevices(resource=e.resource, device_ids=released, observed=h.observed)
                c.devices.append(h)
            h.released, h.reason = a, e.reason

    @staticmethod
    def _cpus(c: ObservedContainer, e: ev.KubeletCPUsObserved | ev.KubeletCPUsReleased, a: At) -> None:
        held = c.cpus[-1] if c.cpus and c.cpus[-1].until is None else None
        left = sorted(e.cpus) if isinstance(e, ev.KubeletCPUsObserved) else []
        if held is not None:
            held.until = a
            if isinstance(e, ev.KubeletCPUsReleased):
                held.reason = e.reason
                left = [i for i in held.cpus if i not in set(e.cpus)]
        if left:
            c.cpus.append(ObservedCPUs(cpus=left, at=a))


# --------------------------------------------------------------------------- gaps


def observation_gaps(log: Reader, corrupt: list[int]) -> list[Gap]:
    """Every ObservationGapFound of the log, one per gap (its closing record folded in)."""
    gaps: dict[tuple[str, int], Gap] = {}
    for r in _read(log, observation_prefix(), corrupt):
        e = r.event
        if not isinstance(e, ev.ObservationGapFound):
            continue
        g = gaps.get((e.source, e.since_ns))
        if g is None:
            g = gaps[(e.source, e.since_ns)] = Gap(
                source=e.source, since_ns=e.since_ns, since=iso(e.since_ns), found=at(r)
            )
        if e.until_ns:
            g.until_ns, g.until, g.closed = e.until_ns, iso(e.until_ns), at(r)
        g.reason = e.reason or g.reason
    return sorted(gaps.values(), key=lambda g: (g.since_ns, g.source))


def gaps_over(gaps: list[Gap], lo_ns: int, hi_ns: int | None) -> list[Gap]:
    """The gaps that overlap ``lo_ns``..``hi_ns`` (None: up to now); an open gap runs up to now."""
    return [g for g in gaps if (hi_ns is None or g.since_ns <= hi_ns) and (not g.until_ns or g.until_ns >= lo_ns)]


# --------------------------------------------------------------------------- windows


@dataclass(frozen=True)
class Point:
    """A point of the log given on the command line: a sequence or a time."""

    seq: int | None = None
    ts_ns: int | None = None


def parse_point(text: str | None, flag: str) -> Point:
    """``SEQ`` (digits) or an RFC 3339 time (``2026-11-21T23:40:00Z``; no zone: UTC)."""
    if text is None:
        return Point()
    text = text.strip()
    if text.isdigit():
        return Point(seq=int(text))
    try:
        when = dt.datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise UsageError(
            f"{flag} {text!r}: expected a sequence number or an RFC 3339 time like 2026-11-21T23:40:00Z"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)  # exact integer nanoseconds
    return Point(ts_ns=(delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000)


def _window_at(seq: int | None, ts_ns: int | None) -> At | None:
    if seq is None and ts_ns is None:
        return None
    return At(seq=seq or 0, ts_ns=ts_ns or 0, time=iso(ts_ns) if ts_ns is not None else "")


# --------------------------------------------------------------------------- device


def device_timeline(
    log: Reader,
    resource: str,
    device_id: str,
    since_ns: int | None = None,
    until_ns: int | None = None,
    *,
    since_seq: int | None = None,
    until_seq: int | None = None,
) -> DeviceTimeline:
    """The device's health changes and holders within the window (inclusive bounds).

    A holding is shown when it overlaps the window; one that ends after the window is
    "still held" as of its end. Records after the window are never read.
    """
    corrupt: list[int] = []
    recs = _read(log, device_prefix(resource, device_id), corrupt, 1, until_seq)
    if not recs and not corrupt:
        raise NotInLogError(f"no device {device_id} of {resource} in the log")
    if until_ns is not None:
        recs = [r for r in recs if r.ts_ns <= until_ns]

    def before(r: ev.Record) -> bool:
        return (since_seq is not None and r.seq < since_seq) or (since_ns is not None and r.ts_ns < since_ns)

    out = DeviceTimeline(
        resource=resource,
        device_id=device_id,
        since=_window_at(since_seq, since_ns),
        until=_window_at(until_seq, until_ns),
        corrupt=corrupt,
    )
    holdings: list[Holding] = []
    open_: dict[tuple[str, ...], Holding] = {}
    created: list[ev.Record] = []
    for r in recs:
        e = r.event
        a = at(r)
        change: DeviceChange | None = None
        if isinstance(e, ev.ContainerCreated):
            if device_id in e.device_ids.get(resource, []):
                created.append(r)
            continue
        if isinstance(e, ev.DevicesAdded):
            info = next((d for d in e.devices if d.id == device_id), None)
            if info is not None:
                out.health, out.numa_nodes, out.listed = info.health, list(info.numa_nodes), True
                change = DeviceChange(at=a, what="listed", health=info.health, numa_nodes=list(info.numa_nodes))
        elif isinstance(e, ev.DeviceHealthChanged):
            out.health, out.numa_nodes = e.health, list(e.numa_nodes)
            change = DeviceChange(at=a, what="health", health=e.health, numa_nodes=list(e.numa_nodes))
        elif isinstance(e, ev.DevicesRemoved):
            out.listed = False
            change = DeviceChange(at=a, what="removed", health=out.health, reason=e.reason)
        elif isinstance(e, ev.KubeletAllocatableChanged):  # the kubelet lists allocatable (healthy) devices only
            info = next((d for d in e.added.get(resource, []) if d.id == device_id), None)
            shown = e.source or "the kubelet's GetAllocatableResources"
            if info is not None:
                out.health, out.numa_nodes, out.listed = info.health, list(info.numa_nodes), True
                change = DeviceChange(
                    at=a,
                    what="listed",
                    health=info.health,
                    numa_nodes=list(info.numa_nodes),
                    reason=f"registered, as {e.source} shows" if e.source else "",
                )
            elif device_id in e.removed.get(resource, []):
                out.listed = False
                reason = f"no longer allocatable in {shown} (unhealthy or gone)"
                change = DeviceChange(at=a, what="removed", health=out.health, reason=reason)
        elif isinstance(e, (ev.DevicesReserved, ev.DevicesAllocated)):
            key = (e.pod_uid, e.container)
            h = open_.get(key)
            if h is None:
                h = Holding(pod=PodName(uid=e.pod_uid), container=e.container, device_ids=list(e.device_ids), start=a)
                open_[key] = h
                holdings.append(h)
            h.device_ids = list(e.device_ids)
            if isinstance(e, ev.DevicesReserved):
                h.reserved, h.choice, h.note = a, e.choice, e.note
            else:
                h.allocated = a
        elif isinstance(e, (ev.DevicesReleased, ev.AllocationFailed)):
            key = (e.pod_uid, e.container)
            h = open_.pop(key, None)
            if h is None:  # its start is older than the log (retention) or was corrupt
                h = Holding(
                    pod=PodName(uid=e.pod_uid), container=e.container, device_ids=list(e.device_ids), start=None
                )
                holdings.append(h)
            h.end, h.still_held, h.released_by, h.reason = a, False, type(e).__name__, e.reason
        elif isinstance(e, _OBSERVED_HOLDS):
            _observed_hold(e, a, resource, device_id, open_, holdings)
        elif isinstance(e, ev.KubeletDoubleAllocationFound):
            if e.resource == resource and device_id in e.ids and not before(r):
                out.findings.append(KubeletFinding(at=a, holders=list(e.holders)))
            continue
        if change is not None and not before(r):
            out.changes.append(change)
    names: dict[str, PodName] = {}
    runtimes: dict[str, _Runtime] = {}
    named: dict[tuple[str, str], list[ObservedRun]] = {}
    for h in holdings:
        if h.end is not None and before_end(h.end, since_seq, since_ns):
            continue
        if h.decided_by == "eventsrc":  # its containers: those the runtime ran with the device (below)
            h.pod = pod_name(log, h.pod.uid, names)
        elif not h.pod.uid:
            h.pod = _observed_uid(log, h, named, corrupt)
        if h.decided_by == "kubelet" and h.pod.uid:
            rt = _runtime_of(log, h.pod.uid, corrupt, until_seq, until_ns, runtimes)
            h.container_ids = overlapping(rt.containers, h.container, h.start, h.end)
        out.holders.append(h)
    out.containers = _runs(log, created, names, corrupt, until_seq, until_ns, since_seq, since_ns, runtimes)
    first = next((r.ts_ns for r in recs if not before(r)), None)
    if first is not None or since_ns is not None:
        out.gaps = gaps_over(observation_gaps(log, corrupt), since_ns or first or 0, until_ns)
    return out


_OBSERVED_HOLDS = (
    ev.KubeletDevicesObserved,
    ev.KubeletDevicesReleased,
    ev.KubeletClaimObserved,
    ev.KubeletClaimReleased,
)


def _observed_ids(
    e: ev.KubeletDevicesObserved | ev.KubeletDevicesReleased | ev.KubeletClaimObserved | ev.KubeletClaimReleased,
    resource: str,
) -> list[str]:
    """The devices of ``resource`` the event names (a DRA device as ``pool/device`` of its driver)."""
    if isinstance(e, (ev.KubeletDevicesObserved, ev.KubeletDevicesReleased)):
        return list(e.device_ids) if e.resource == resource else []
    return [claim_device_id(d) for d in e.devices if d.driver == resource]


def _observed_hold(
    e: ev.KubeletDevicesObserved | ev.KubeletDevicesReleased | ev.KubeletClaimObserved | ev.KubeletClaimReleased,
    a: At,
    resource: str,
    device_id: str,
    open_: dict[tuple[str, ...], Holding],
    holdings: list[Holding],
) -> None:
    """A hold the kubelet decided, observed: one per pod (by name), container and claim."""
    ids = _observed_ids(e, resource)
    if device_id not in ids:
        return
    claim = (
        f"{e.claim.namespace}/{e.claim.name}"
        if isinstance(e, (ev.KubeletClaimObserved, ev.KubeletClaimReleased))
        else ""
    )
    key = ("kubelet", e.pod.namespace, e.pod.name, e.container, claim)
    h = open_.get(key)
    if h is not None and e.pod.uid and not h.pod.uid:
        h.pod = PodName(uid=e.pod.uid, namespace=e.pod.namespace, name=e.pod.name)
    if isinstance(e, (ev.KubeletDevicesObserved, ev.KubeletClaimObserved)):
        if h is None:
            h = Holding(
                pod=PodName(uid=e.pod.uid, namespace=e.pod.namespace, name=e.pod.name),
                container=e.container,
                device_ids=ids,
                start=a,
                decided_by="kubelet",
                note=f"claim {claim}" if claim else "",
            )
            open_[key] = h
            holdings.append(h)
        return
    open_.pop(key, None)
    if h is None:  # observed before the retained log
        pod = PodName(uid=e.pod.uid, namespace=e.pod.namespace, name=e.pod.name)
        h = Holding(pod=pod, container=e.container, device_ids=ids, start=None, decided_by="kubelet")
        holdings.append(h)
    h.end, h.still_held, h.released_by, h.reason = a, False, type(e).__name__, e.reason


def _observed_uid(
    log: Reader, h: Holding, named: dict[tuple[str, str], list[ObservedRun]], corrupt: list[int]
) -> PodName:
    """The pod of a hold the kubelet named without a uid: the observed pod of that name whose
    records hold the hold's start (its uid from a later record, or from the runtime's sandbox)."""
    key = (h.pod.namespace, h.pod.name)
    if key not in named:
        named[key] = observed_runs(_named_records(log, *key, corrupt))
    mark = h.start or h.end
    for run in named[key]:
        if mark is not None and any(r.seq == mark.seq for r in run.records):
            return PodName(uid=run.uid, namespace=h.pod.namespace, name=h.pod.name)
    return h.pod


def _runtime_of(
    log: Reader, uid: str, corrupt: list[int], until_seq: int | None, until_ns: int | None, cache: dict[str, _Runtime]
) -> _Runtime:
    """The pod's sandboxes and containers up to the window's end (read once per uid)."""
    fold = cache.get(uid)
    if fold is None:
        fold = cache[uid] = _Runtime()
        for pr in _read(log, pod_prefix(uid), corrupt, 1, until_seq):
            if (until_ns is None or pr.ts_ns <= until_ns) and isinstance(pr.event, _RUNTIME_EVENTS):
                fold.feed(pr)
    return fold


def _runs(
    log: Reader,
    created: list[ev.Record],
    names: dict[str, PodName],
    corrupt: list[int],
    until_seq: int | None,
    until_ns: int | None,
    since_seq: int | None,
    since_ns: int | None,
    pods: dict[str, _Runtime],
) -> list[ContainerRun]:
    """The containers created in ``created`` (ContainerCreated records), each with its life
    up to the window's end (read from its pod's index), less those gone before the window."""
    out: list[ContainerRun] = []
    for r in created:
        assert isinstance(r.event, ev.ContainerCreated)
        uid = r.event.pod_uid
        c = _runtime_of(log, uid, corrupt, until_seq, until_ns, pods).container(r.event.container_id, r.seq)
        if c is None:  # not in its pod's index (a corrupt record hid it): what the device's index has
            fold = _Runtime()
            fold.feed(r)
            c = fold.containers[0]
        end = c.stopped or c.removed
        if end is not None and before_end(end, since_seq, since_ns):
            continue
        out.append(ContainerRun(pod=pod_name(log, uid, names), container=c))
    return out


def before_end(end: At, since_seq: int | None, since_ns: int | None) -> bool:
    """A holding that ended before the window starts is outside it."""
    return (since_seq is not None and end.seq < since_seq) or (since_ns is not None and end.ts_ns < since_ns)


# --------------------------------------------------------------------------- pod


def resolve_pod(log: Reader, target: str) -> tuple[str, str, list[str], ObservedRun | None]:
    """(uid, how it was resolved, other uids with that name, the kubelet's pod of that uid when
    one was observed) for ``UID`` or ``NAMESPACE/NAME``. A pod the kubelet named without a uid
    that no sandbox tells has the uid "" (the newest such pod)."""
    if "/" not in target:
        return target, "", [], None
    namespace, name = target.split("/", 1)
    recs = [r for r in log.read_many(log.index_seqs(name_prefix(namespace, name))) if isinstance(r, ev.Record)]
    newest: dict[str, int] = {}  # uid -> the seq of its newest record
    for r in recs:
        if isinstance(r.event, _NAMED):
            newest.pop(r.event.pod.uid, None)
            newest[r.event.pod.uid] = r.seq
    runs = {run.uid: run for run in observed_runs(recs)}  # the newest of each uid
    for uid, run in runs.items():
        newest[uid] = max(newest.pop(uid, 0), run.records[-1].seq)
    uids = sorted(newest, key=lambda u: newest[u])  # ordered by each uid's newest record
    if not uids:
        raise NotInLogError(f"no pod {namespace}/{name} in the log")
    uid = uids[-1]
    how = f"{namespace}/{name} is pod {uid or '(uid unknown: no sandbox of that name)'}" + (
        f" (the newest of {len(uids)} pods with that name)" if len(uids) > 1 else ""
    )
    return uid, how, [u or "(uid unknown)" for u in reversed(uids[:-1])], runs.get(uid)


def _observed_run_of(log: Reader, uid: str, recs: list[ev.Record], corrupt: list[int]) -> ObservedRun | None:
    """The kubelet's pod with this uid, found by its name (its records may not name the uid)."""
    if any(isinstance(r.event, _ADMISSIONS) for r in recs):
        return None  # eventsrc's own pod
    ref = next((r.event.pod for r in recs if isinstance(r.event, (*_NAMED, *_OBSERVED)) and r.event.pod.name), None)
    if ref is None:
        return None
    return next(
        (run for run in observed_runs(_named_records(log, ref.namespace, ref.name, corrupt)) if run.uid == uid), None
    )


def pod_history(log: Reader, uid_or_ns_name: str) -> PodHistory:
    """Everything the pod asked for, got, was refused and released, with times and sequences."""
    from eventsrc.offline.render import record_summary

    uid, how, others, run = resolve_pod(log, uid_or_ns_name)
    corrupt: list[int] = []
    recs = _read(log, pod_prefix(uid), corrupt) if uid else []
    if run is None and not how:
        run = _observed_run_of(log, uid, recs, corrupt)
    if run is not None:  # its records that name no uid are not in the uid's index
        recs = sorted({r.seq: r for r in [*recs, *run.records]}.values(), key=lambda r: r.seq)
    if not recs and not corrupt:
        raise NotInLogError(f"no pod with uid {uid} in the log")
    out = PodHistory(uid=uid, resolved=how, other_uids=others, corrupt=corrupt)
    grants: dict[tuple[str, str], DeviceGrant] = {}
    cpus: dict[str, CPUGrant] = {}
    memory: dict[str, MemoryGrant] = {}
    claims: dict[str, ClaimUse] = {}
    runtime = _Runtime()
    observed = _Observed()
    for r in recs:
        e = r.event
        a = at(r)
        out.events.append(Line(at=a, type=r.type, summary=record_summary(r)))
        if isinstance(e, _RUNTIME_EVENTS):
            runtime.feed(r)
        if isinstance(e, _OBSERVED):
            observed.feed(r)
        if isinstance(e, (*_NAMED, *_OBSERVED)) and not out.name and e.pod.name:
            out.namespace, out.name = e.pod.namespace, e.pod.name
        if isinstance(e, ev.PodAdmissionStarted):
            out.asked.append(Asked(at=a, type=r.type, containers=list(e.containers)))
        elif isinstance(e, ev.ContainerAdmissionStarted):  # the pod grows by a container
            out.asked.append(Asked(at=a, type=r.type, containers=[e.container]))
        elif isinstance(e, ev.ContainerAdmitted):
            out.admitted.append(Admitted(at=a, container=e.container))
        elif isinstance(e, ev.PodAdmitted):
            if not out.asked or (out.admitted and out.asked[-1].at.seq < out.admitted[-1].at.seq):
                out.asked.append(Asked(at=a, type=r.type, containers=list(e.containers)))
            out.admitted.append(Admitted(at=a, qos_class=e.qos_class))
        elif isinstance(e, ev.AdmissionRejected):
            out.refused.append(Refusal(at=a, reason=e.reason, container=e.container, topology_hint=e.topology_hint))
        elif isinstance(e, ev.PodRemoved):
            out.removed.append(Removal(at=a, reason=e.reason))
        elif isinstance(e, (ev.DevicesReserved, ev.DevicesAllocated)):
            g = grants.get((e.container, e.resource))
            if g is None:
                g = DeviceGrant(container=e.container, resource=e.resource, device_ids=list(e.device_ids))
                grants[(e.container, e.resource)] = g
                out.devices.append(g)
            g.device_ids = list(e.device_ids)
            if isinstance(e, ev.DevicesReserved):
                g.reserved, g.choice, g.note = a, e.choice, e.note
            else:
                g.allocated, g.response = a, e.response
        elif isinstance(e, (ev.DevicesReleased, ev.AllocationFailed)):
            g = grants.pop((e.container, e.resource), None)
            if g is None:
                g = DeviceGrant(container=e.container, resource=e.resource, device_ids=list(e.device_ids))
                out.devices.append(g)
            if isinstance(e, ev.AllocationFailed):
                g.failed = a
            else:
                g.released = a
            g.reason = e.reason
        elif isinstance(e, ev.CPUsAssigned):
            c = CPUGrant(container=e.container, cpus=list(e.cpus), assigned=a)
            cpus[e.container] = c
            out.cpus.append(c)
        elif isinstance(e, ev.CPUsReleased):
            c2 = cpus.pop(e.container, None)
            if c2 is not None:
                c2.released, c2.reason = a, e.reason
        elif isinstance(e, (ev.MemoryAssigned, ev.MemoryReleased)):
            m = memory.pop(e.container, None)
            if m is not None:
                m.released, m.reason = a, e.reason if isinstance(e, ev.MemoryReleased) else "replaced"
            if isinstance(e, ev.MemoryAssigned):
                m = memory[e.container] = MemoryGrant(container=e.container, blocks=list(e.blocks), assigned=a)
                out.memory.append(m)
        elif isinstance(e, ev.PodReferenceAdded):
            u = ClaimUse(uid=e.claim_uid, referenced=a)
            claims[e.claim_uid] = u
            out.claims.append(u)
        elif isinstance(e, ev.PodReferenceRemoved):
            u2 = claims.pop(e.claim_uid, None)
            if u2 is None:
                u2 = ClaimUse(uid=e.claim_uid)
                out.claims.append(u2)
            u2.unreferenced = a
    out.sandboxes, out.containers = runtime.sandboxes, runtime.containers
    for use in out.claims:
        _fill_claim_use(log, use, out.corrupt)
    if observed.pod.observed is not None:
        out.observed = observed.pod
        observed.pod.uid_from = run.uid_from if run is not None else "kubelet"
        for oc in observed.pod.containers:
            oc.container_ids = [x for x in runtime.containers if x.name == oc.name]
    gone = _gone(out)
    out.gaps = gaps_over(observation_gaps(log, out.corrupt), recs[0].ts_ns if recs else 0, gone)
    return out


def _gone(h: PodHistory) -> int | None:
    """When the pod was gone (None: it still is not): released by the kubelet, or removed."""
    if h.observed is not None:
        return h.observed.released.ts_ns if h.observed.released is not None else None
    return h.removed[-1].at.ts_ns if h.removed else None


def _fill_claim_use(log: Reader, use: ClaimUse, corrupt: list[int]) -> None:
    """The claim as it was while the pod used it: its name, driver, CDI devices, error."""
    until = use.unreferenced.seq if use.unreferenced is not None else None
    for r in _read(log, claim_prefix(use.uid), corrupt, 1, until):
        e = r.event
        if not isinstance(e, DRIVER_EVENTS):
            continue
        use.namespace, use.name, use.driver = e.claim.namespace or use.namespace, e.claim.name or use.name, e.driver
        use.state = _CLAIM_STATES[type(e)]
        if isinstance(e, ev.ClaimPrepared):
            use.cdi_devices = [i for d in e.devices for i in d.cdi_device_ids]
            use.error = ""
        elif isinstance(e, (ev.ClaimPrepareFailed, ev.ClaimUnprepareFailed)):
            use.error = e.reason


# --------------------------------------------------------------------------- claim

#: the state each of the driver's events leaves a claim in (one, whatever the state before)
_CLAIM_STATES: dict[type[ev.EventBase], str] = {t: CLAIM.target(t) for t in DRIVER_EVENTS}


def claim_history(log: Reader, uid: str) -> ClaimHistory:
    """The claim's prepare/unprepare lifecycle, the pods that referenced it, its devices, its errors."""
    corrupt: list[int] = []
    recs = _read(log, claim_prefix(uid), corrupt)
    if not recs and not corrupt:
        raise NotInLogError(f"no claim with uid {uid} in the log")
    out = ClaimHistory(uid=uid, corrupt=corrupt)
    pods: dict[str, ClaimPod] = {}
    for r in recs:
        e = r.event
        a = at(r)
        if isinstance(e, ev.PodReferenceAdded):
            p = ClaimPod(pod=PodName(uid=e.pod_uid), referenced=a)
            pods[e.pod_uid] = p
            out.pods.append(p)
        elif isinstance(e, ev.PodReferenceRemoved):
            p2 = pods.pop(e.pod_uid, None)
            if p2 is None:
                p2 = ClaimPod(pod=PodName(uid=e.pod_uid))
                out.pods.append(p2)
            p2.unreferenced = a
        elif isinstance(e, DRIVER_EVENTS):
            state = _CLAIM_STATES[type(e)]
            out.namespace = e.claim.namespace or out.namespace
            out.name = e.claim.name or out.name
            out.driver = e.driver or out.driver
            out.state = state
            step = ClaimStep(at=a, type=r.type, state=state, driver=e.driver)
            if isinstance(e, ev.ClaimPrepareStarted):
                step.pod_uid = e.pod_uid
            elif isinstance(e, ev.ClaimPrepared):
                step.devices = list(e.devices)
                out.devices = list(e.devices)
                out.cdi_devices = [i for d in e.devices for i in d.cdi_device_ids]
            elif isinstance(e, (ev.ClaimPrepareFailed, ev.ClaimUnprepareFailed)):
                step.reason = e.reason
                out.errors.append(step)
            out.lifecycle.append(step)
    names: dict[str, PodName] = {}
    for p in out.pods:
        p.pod = pod_name(log, p.pod.uid, names)
    return out


# --------------------------------------------------------------------------- what was read


def log_start(history: History) -> LogStart | None:
    """What the answer read, when the log was cut (None otherwise)."""
    if history.base is None:
        return None
    return LogStart(
        first_seq=history.first_seq(),
        live_first_seq=history.live_first_seq(),
        archive_segments=len(history.segments),
        live_only=history.live_only,
        missing=[g.text() for g in history.missing()],
    )
