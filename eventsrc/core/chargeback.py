"""Chargeback: how long each device and exclusive CPU was held, exactly, from the log's records.

Pure: records in, intervals and totals out; no LMDB, no clock ("now" is passed in). The
command (``eventsrc audit usage``, ``eventsrc.offline.usage``) reads the totals from the
usage index (``eventsrc.log.usage_index``), which is fed by this same ``Tracker``; a scan of
every record through ``intervals`` and ``totals`` gives the same answer (a property test
checks it).

What a hold is mirrors the views (``state.devices``, ``state.cpus``, ``state.kubelet``):

* eventsrc's own devices: a device is charged to the container the views name as its holder
  while its hold is *allocated*: from the ``DevicesAllocated`` that gives it to that
  container until the views stop naming it so (its container's ``DevicesReleased`` or
  ``AllocationFailed``, or another container's ``DevicesReserved``/``DevicesAllocated``, as
  when an init container hands it on). The reservation while Allocate is in flight is not
  charged. ``PodRemoved`` and ``PodQuarantined`` end nothing: the views keep a hold until
  its release (a removal records the releases first), and a quarantined pod keeps what it
  holds (docs/adr/0005).
* eventsrc's own exclusive CPUs (resource ``cpu``, device the CPU's number): from
  ``CPUsAssigned`` until ``CPUsReleased``; an assignment replaces the container's set (CPUs
  in both go on, those left out end, new ones start).
* eventsrc's own memory and hugepages (the memory manager): each block of ``MemoryAssigned``
  (the container's whole set, as for observed memory below: resource the type, device its
  NUMA nodes, ``amount`` its bytes) until a set without it or ``MemoryReleased``.
* observed beside a kubelet, pods keyed by namespace/name: devices from
  ``KubeletDevicesObserved`` to ``KubeletDevicesReleased``; CPUs as the whole set of each
  ``KubeletCPUsObserved`` until ``KubeletCPUsReleased``; a claim's devices (resource: the
  driver, device: ``pool/device``) from ``KubeletClaimObserved`` (the claim's whole list)
  to ``KubeletClaimReleased``; memory and hugepages from ``KubeletMemoryObserved`` (the
  container's whole set: resource the type, device its NUMA nodes, ``amount`` its bytes, so
  that its rows are byte-nanoseconds, ``in_bytes``) until a set without that block;
  ``KubeletPodReleased`` ends everything the pod holds.

A hold is charged to the pod (namespace, name, uid) as known when it started: own pods by
their ``PodAdmissionStarted``/``PodAdmitted`` (or ``PodQuarantined``), observed pods as the
kubelet view had them. An observed pod first seen without its uid is bound to it when a record
names it (``KubeletPodObserved`` with the uid, issue 35): its open holds take the uid from then
on, from their start (``Tracker.rebound`` says which), so a pod is one row, not one row with
uid "" and another with its uid. A hold that ended before the uid was learned keeps "".
Times are the records' ``ts_ns``; a hold whose end record is older
than its start (a clock stepped back) lasts 0 ns.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple

import msgspec
from msgspec import Struct, field

from eventsrc import events as ev

#: the pseudo-resource of exclusive CPUs
CPU: Final = "cpu"

By = Literal["namespace", "pod", "device", "resource"]
#: the fields of a group, in the order groups are sorted and printed
FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "namespace": ("namespace", "resource"),
    "pod": ("namespace", "name", "uid", "resource"),
    "device": ("resource", "device"),
    "resource": ("resource",),
}


class Hold(Struct, frozen=True, array_like=True, gc=False):
    """One held device or CPU, from ``start_ns``, charged to a pod; or ``amount`` bytes of
    memory of one type (``resource``: "memory", "hugepages-2Mi", ...) on the NUMA nodes
    ``device`` names, charged in byte-nanoseconds (``in_bytes``)."""

    resource: str
    device: str
    namespace: str
    name: str
    uid: str
    start_ns: int
    amount: int = 1

    def group(self, by: str) -> tuple[str, ...]:
        """The group this hold counts in, as ``FIELDS[by]`` names it."""
        if by == "namespace":
            return (self.namespace, self.resource)
        if by == "pod":
            return (self.namespace, self.name, self.uid, self.resource)
        if by == "device":
            return (self.resource, self.device)
        return (self.resource,)


class Change(NamedTuple):
    """A hold that started (``end_ns`` None) or ended at ``end_ns`` (never before its start)."""

    hold: Hold
    end_ns: int | None


class OwnDevice(Struct, array_like=True, gc=False):
    """A device of eventsrc's own as the views hold it: its holder, and its charged hold
    once allocated (None while reserved)."""

    uid: str
    container: str
    hold: Hold | None = None


class ObservedContainer(Struct, gc=False):
    devices: dict[str, dict[str, Hold]] = field(default_factory=dict)  # resource -> id -> hold
    cpus: dict[int, Hold] = field(default_factory=dict)
    claims: dict[str, dict[str, Hold]] = field(default_factory=dict)  # claim -> "driver\0pool/device" -> hold
    memory: dict[str, Hold] = field(default_factory=dict)  # "type\0numa nodes\0size" -> hold


class ObservedPod(Struct, gc=False):
    uid: str
    namespace: str
    name: str
    containers: dict[str, ObservedContainer] = field(default_factory=dict)


class UsageState(Struct, gc=False):
    """Every hold open after the records fed so far, and what naming a new one takes."""

    names: dict[str, tuple[str, str, bool]] = field(default_factory=dict)  # uid -> (ns, name, admitted)
    devices: dict[str, dict[str, OwnDevice]] = field(default_factory=dict)  # resource -> id -> holder
    cpus: dict[str, dict[str, dict[int, Hold]]] = field(default_factory=dict)  # uid -> container -> cpu -> hold
    observed: dict[str, ObservedPod] = field(default_factory=dict)  # "namespace/name" -> pod
    # uid -> container -> "type\0numa nodes\0size" -> hold: eventsrc's own memory blocks
    memory: dict[str, dict[str, dict[str, Hold]]] = field(default_factory=dict)


class Tracker:
    """Feed records in log order (``feed``); each returns the holds it started and ended."""

    def __init__(self, state: UsageState | None = None) -> None:
        self.state = state if state is not None else UsageState()
        self._out: list[Change] = []
        #: the open holds the last ``feed`` gave their pod's uid, learned since they started:
        #: (as they were, as they are now); each keeps its start
        self.rebound: list[tuple[Hold, Hold]] = []

    def feed(self, ts_ns: int, e: ev.EventBase) -> list[Change]:
        handler = _HANDLERS.get(type(e))
        if handler is None:
            return []
        self._out = []
        self.rebound = []
        handler(self, ts_ns, e)
        return self._out

    def open_holds(self) -> list[Hold]:
        """Every hold still open, in a fixed order."""
        s = self.state
        out = [d.hold for ids in s.devices.values() for d in ids.values() if d.hold is not None]
        out += [h for containers in s.cpus.values() for cpus in containers.values() for h in cpus.values()]
        out += [h for containers in s.memory.values() for blocks in containers.values() for h in blocks.values()]
        for pod in s.observed.values():
            for c in pod.containers.values():
                out += [h for ids in c.devices.values() for h in ids.values()]
                out += c.cpus.values()
                out += [h for devices in c.claims.values() for h in devices.values()]
                out += c.memory.values()
        return out

    # ------------------------------------------------------------------ helpers

    def _open(self, resource: str, device: str, namespace: str, name: str, uid: str, ts: int, amount: int = 1) -> Hold:
        hold = Hold(resource, device, namespace, name, uid, ts, amount)
        self._out.append(Change(hold, None))
        return hold

    def _close(self, hold: Hold, ts: int) -> None:
        self._out.append(Change(hold, max(ts, hold.start_ns)))

    def _own(self, uid: str, resource: str, device: str, ts: int) -> Hold:
        ns, name, _ = self.state.names.get(uid, ("", "", False))
        return self._open(resource, device, ns, name, uid, ts)

    # ------------------------------------------------------------------ eventsrc's own pods (state.pods)

    def _named(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, (ev.PodAdmissionStarted, ev.PodAdmitted, ev.PodQuarantined))
        known = self.state.names.get(e.pod.uid)
        if isinstance(e, ev.PodAdmissionStarted) or known is None:  # the views' PodView is made anew
            known = (e.pod.namespace, e.pod.name, False)
        self.state.names[e.pod.uid] = (known[0], known[1], not isinstance(e, ev.PodAdmissionStarted))

    def _rejected(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, ev.AdmissionRejected)
        known = self.state.names.get(e.pod.uid)
        if known is not None and not known[2]:  # admitting -> gone; admitted or quarantined stay
            del self.state.names[e.pod.uid]

    def _removed(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, ev.PodRemoved)
        self.state.names.pop(e.pod_uid, None)

    # ------------------------------------------------------------------ eventsrc's own devices (state.devices)

    def _reserved(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, ev.DevicesReserved)
        table = self.state.devices.setdefault(e.resource, {})
        for i in dict.fromkeys(e.device_ids):
            d = table.get(i)
            if d is not None and d.hold is not None:
                self._close(d.hold, ts)
            table[i] = OwnDevice(e.pod_uid, e.container)

    def _allocated(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, ev.DevicesAllocated)
        table = self.state.devices.setdefault(e.resource, {})
        for i in dict.fromkeys(e.device_ids):
            d = table.get(i)
            if d is not None and d.hold is not None and (d.uid, d.container) == (e.pod_uid, e.container):
                continue  # allocated again to its holder: the hold goes on
            if d is not None and d.hold is not None:
                self._close(d.hold, ts)
            table[i] = OwnDevice(e.pod_uid, e.container, self._own(e.pod_uid, e.resource, i, ts))

    def _released(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, (ev.DevicesReleased, ev.AllocationFailed))
        table = self.state.devices.get(e.resource)
        if table is None:
            return
        for i in dict.fromkeys(e.device_ids):
            d = table.get(i)
            if d is None or (d.uid, d.container) != (e.pod_uid, e.container):
                continue  # a release concerns only the devices its container holds
            if d.hold is not None:
                self._close(d.hold, ts)
            del table[i]
        if not table:
            del self.state.devices[e.resource]

    # ------------------------------------------------------------------ eventsrc's own CPUs (state.cpus)

    def _set_cpus(self, held: dict[int, Hold], cpus: Iterable[int], ts: int, start: Callable[[int], Hold]) -> None:
        """``held`` becomes ``cpus``: those left out end, new ones start, the others go on."""
        new = set(cpus)
        for cpu in [c for c in held if c not in new]:
            self._close(held.pop(cpu), ts)
        for cpu in sorted(new - held.keys()):
            held[cpu] = start(cpu)

    def _cpus_assigned(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, ev.CPUsAssigned)
        held = self.state.cpus.setdefault(e.pod_uid, {}).setdefault(e.container, {})
        self._set_cpus(held, e.cpus, ts, lambda cpu: self._own(e.pod_uid, CPU, str(cpu), ts))

    def _cpus_released(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, ev.CPUsReleased)
        pod = self.state.cpus.get(e.pod_uid)
        if pod is None or e.container not in pod:
            return
        for hold in pod.pop(e.container).values():
            self._close(hold, ts)
        if not pod:
            del self.state.cpus[e.pod_uid]

    # ------------------------------------------------------------------ eventsrc's own memory (state.memory)

    def _set_memory(
        self,
        held: dict[str, Hold],
        blocks: Iterable[tuple[str, list[int], int]],
        start: Callable[[str, str, int], Hold],
        ts: int,
    ) -> None:
        """``held`` becomes the set ``blocks`` (type, NUMA nodes, bytes): blocks gone or changed
        end, new ones start; a block of 0 bytes (an init container's, all reused) holds nothing."""
        new: dict[str, tuple[str, str, int]] = {}
        for kind, nodes, size in blocks:
            numa = ",".join(map(str, sorted(nodes))) or "-"
            key = f"{kind}\0{numa}\0{size}"
            while key in new:  # the same block twice: held twice
                key += "\0"
            new[key] = (kind, numa, size)
        for key in [k for k in held if k not in new]:
            self._close(held.pop(key), ts)
        for key, (kind, numa, size) in new.items():
            if key not in held and size > 0:
                held[key] = start(kind, numa, size)

    def _memory_assigned(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, ev.MemoryAssigned)
        held = self.state.memory.setdefault(e.pod_uid, {}).setdefault(e.container, {})
        ns, name, _ = self.state.names.get(e.pod_uid, ("", "", False))
        blocks = [(b.type, b.numa_affinity, b.size) for b in e.blocks]

        def opened(kind: str, numa: str, size: int) -> Hold:
            return self._open(kind, numa, ns, name, e.pod_uid, ts, size)

        self._set_memory(held, blocks, opened, ts)

    def _memory_released(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, ev.MemoryReleased)
        pod = self.state.memory.get(e.pod_uid)
        if pod is None or e.container not in pod:
            return
        for hold in pod.pop(e.container).values():
            self._close(hold, ts)
        if not pod:
            del self.state.memory[e.pod_uid]

    # ------------------------------------------------------------------ observed beside a kubelet (state.kubelet)

    def _pod(self, ref: ev.PodRef) -> ObservedPod:
        key = f"{ref.namespace}/{ref.name}"
        p = self.state.observed.get(key)
        if p is None:
            p = self.state.observed[key] = ObservedPod(ref.uid, ref.namespace, ref.name)
        elif ref.uid and not p.uid:
            p.uid = ref.uid
            for c in p.containers.values():
                tables: list[dict[Any, Hold]] = [*c.devices.values(), c.cpus, *c.claims.values(), c.memory]
                for table in tables:
                    self._bind(table, ref.uid)
        return p

    def _bind(self, table: dict[Any, Hold], uid: str) -> None:
        for key, hold in table.items():
            table[key] = msgspec.structs.replace(hold, uid=uid)
            self.rebound.append((hold, table[key]))

    def _container(self, ref: ev.PodRef, name: str) -> tuple[ObservedPod, ObservedContainer]:
        p = self._pod(ref)
        return p, p.containers.setdefault(name, ObservedContainer())

    def _held(self, ref: ev.PodRef, name: str) -> ObservedContainer | None:
        p = self.state.observed.get(f"{ref.namespace}/{ref.name}")
        return None if p is None else p.containers.get(name)

    def _observed(self, p: ObservedPod, resource: str, device: str, ts: int) -> Hold:
        return self._open(resource, device, p.namespace, p.name, p.uid, ts)

    def _kubelet_pod(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, ev.KubeletPodObserved)
        self._pod(e.pod)

    def _kubelet_memory(self, ts: int, e: ev.EventBase) -> None:
        """The container's whole memory set: blocks gone or changed end, new ones start."""
        assert isinstance(e, ev.KubeletMemoryObserved)
        p, c = self._container(e.pod, e.container)
        blocks = [(m.memory_type, m.numa_nodes, m.size) for m in e.memory]
        self._set_memory(
            c.memory, blocks, lambda k, numa, n: self._open(k, numa, p.namespace, p.name, p.uid, ts, n), ts
        )

    def _kubelet_pod_released(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, ev.KubeletPodReleased)
        p = self.state.observed.pop(f"{e.pod.namespace}/{e.pod.name}", None)
        if p is None:
            return
        for c in p.containers.values():
            for hold in [
                *(h for ids in c.devices.values() for h in ids.values()),
                *c.cpus.values(),
                *c.memory.values(),
            ]:
                self._close(hold, ts)
            for devices in c.claims.values():
                for hold in devices.values():
                    self._close(hold, ts)

    def _kubelet_devices(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, ev.KubeletDevicesObserved)
        p, c = self._container(e.pod, e.container)
        held = c.devices.setdefault(e.resource, {})
        for i in dict.fromkeys(e.device_ids):
            if i not in held:
                held[i] = self._observed(p, e.resource, i, ts)
        if not held:
            del c.devices[e.resource]

    def _kubelet_devices_released(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, ev.KubeletDevicesReleased)
        c = self._held(e.pod, e.container)
        held = None if c is None else c.devices.get(e.resource)
        if c is None or held is None:
            return
        for i in dict.fromkeys(e.device_ids):
            if i in held:
                self._close(held.pop(i), ts)
        if not held:
            del c.devices[e.resource]

    def _kubelet_cpus(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, ev.KubeletCPUsObserved)
        p, c = self._container(e.pod, e.container)
        self._set_cpus(c.cpus, e.cpus, ts, lambda cpu: self._observed(p, CPU, str(cpu), ts))

    def _kubelet_cpus_released(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, ev.KubeletCPUsReleased)
        c = self._held(e.pod, e.container)
        if c is not None:
            for cpu in dict.fromkeys(e.cpus):
                if cpu in c.cpus:
                    self._close(c.cpus.pop(cpu), ts)

    def _kubelet_claim(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, ev.KubeletClaimObserved)
        p, c = self._container(e.pod, e.container)
        held = c.claims.setdefault(f"{e.claim.namespace}/{e.claim.name}", {})
        new = {f"{d.driver}\0{d.pool}/{d.device}": (d.driver, f"{d.pool}/{d.device}") for d in e.devices}
        for key in [k for k in held if k not in new]:
            self._close(held.pop(key), ts)
        for key, (driver, device) in new.items():
            if key not in held:
                held[key] = self._observed(p, driver, device, ts)

    def _kubelet_claim_released(self, ts: int, e: ev.EventBase) -> None:
        assert isinstance(e, ev.KubeletClaimReleased)
        c = self._held(e.pod, e.container)
        devices = None if c is None else c.claims.pop(f"{e.claim.namespace}/{e.claim.name}", None)
        for hold in (devices or {}).values():
            self._close(hold, ts)


#: what ``Tracker.feed`` does with each type of event it reads (the others change nothing)
_HANDLERS: dict[type, Callable[[Tracker, int, ev.EventBase], None]] = {
    ev.PodAdmissionStarted: Tracker._named,
    ev.PodAdmitted: Tracker._named,
    ev.PodQuarantined: Tracker._named,
    ev.AdmissionRejected: Tracker._rejected,
    ev.PodRemoved: Tracker._removed,
    ev.DevicesReserved: Tracker._reserved,
    ev.DevicesAllocated: Tracker._allocated,
    ev.DevicesReleased: Tracker._released,
    ev.AllocationFailed: Tracker._released,
    ev.CPUsAssigned: Tracker._cpus_assigned,
    ev.CPUsReleased: Tracker._cpus_released,
    ev.MemoryAssigned: Tracker._memory_assigned,
    ev.MemoryReleased: Tracker._memory_released,
    ev.KubeletPodObserved: Tracker._kubelet_pod,
    ev.KubeletMemoryObserved: Tracker._kubelet_memory,
    ev.KubeletPodReleased: Tracker._kubelet_pod_released,
    ev.KubeletDevicesObserved: Tracker._kubelet_devices,
    ev.KubeletDevicesReleased: Tracker._kubelet_devices_released,
    ev.KubeletCPUsObserved: Tracker._kubelet_cpus,
    ev.KubeletCPUsReleased: Tracker._kubelet_cpus_released,
    ev.KubeletClaimObserved: Tracker._kubelet_claim,
    ev.KubeletClaimReleased: Tracker._kubelet_claim_released,
}


# --------------------------------------------------------------------------- totals


@dataclass(frozen=True)
class Window:
    """The window a total is taken over, [since_ns, until_ns]; open holds count up to until_ns."""

    since_ns: int
    until_ns: int


def window(since_ns: int | None, until_ns: int | None, now_ns: int) -> Window:
    """From --since (None: the beginning) to --until, or to now when --until is absent or later."""
    until = now_ns if until_ns is None else min(until_ns, now_ns)
    return Window(0 if since_ns is None else since_ns, until)


def overlap(start_ns: int, end_ns: int | None, w: Window) -> int:
    """Nanoseconds of [start, end] (end None: still open) inside the window."""
    end = w.until_ns if end_ns is None else min(end_ns, w.until_ns)
    return max(0, end - max(start_ns, w.since_ns))


#: the hours the fleet's rollup of closed holds is kept by (``fleet.usage_hours``): hour h is
#: [h * HOUR_NS, (h + 1) * HOUR_NS)
HOUR_NS: Final = 3_600 * 10**9


#: a closed hold longer than this (a week) is kept out of the hourly rollup, so that a hold's end
#: adds to 170 of its rows at most (a pod of months, a clock that jumped, a forged record would
#: add thousands each); ``fleet usage`` counts it by itself
LONG_NS: Final = 7 * 24 * HOUR_NS


def hour_shares(start_ns: int, end_ns: int) -> list[tuple[int, int]]:
    """(hour, nanoseconds): the part of [start, end) inside each hour it touches, in order; none
    for a hold of no length, or one longer than ``LONG_NS``. Else their sum is ``end - start``."""
    out: list[tuple[int, int]] = []
    if end_ns - start_ns > LONG_NS:
        return out
    t = start_ns
    while t < end_ns:
        hour = t // HOUR_NS
        upto = min(end_ns, (hour + 1) * HOUR_NS)
        out.append((hour, upto - t))
        t = upto
    return out


class Row(NamedTuple):
    """One group's total: its fields (as ``FIELDS[by]`` names them), its nanoseconds, and how
    many of them fell inside a gap (``gap_ns``: not seen; the rest, ``ns - gap_ns``, seen)."""

    group: tuple[str, ...]
    ns: int
    gap_ns: int = 0


# --------------------------------------------------------------------------- what was not seen

#: the sources of ``ObservationGapFound`` that hide holds: while eventsrc was not running, or
#: could not ask the kubelet or hear the runtime, a hold may have ended at any moment, and its
#: release is recorded only when eventsrc sees again. (A "kubelet allocatable" gap says only
#: that what the node offered was not known: every hold was still seen.)
HIDING: Final = frozenset({"eventsrc", "kubelet", "runtime"})

#: a gap as the log told it: (source, since_ns, until_ns), until_ns 0 while open
Span = tuple[str, int, int]


class Blind:
    """The gaps that hide holds, fed the log's records in order (``feed``): a gap is opened by
    an ``ObservationGapFound`` with ``until_ns`` 0 and closed by a later one with the same
    source and ``since_ns``; one recorded closed at once is both."""

    def __init__(self, spans: Iterable[Span] = ()) -> None:
        self.spans: dict[tuple[str, int], int] = {(src, since): until for src, since, until in spans}

    def feed(self, e: ev.EventBase) -> None:
        if isinstance(e, ev.ObservationGapFound) and e.source in HIDING:
            key = (e.source, e.since_ns)
            self.spans[key] = e.until_ns or self.spans.get(key, 0)

    def listed(self) -> list[Span]:
        return sorted((src, since, until) for (src, since), until in self.spans.items())


@dataclass(frozen=True)
class Gaps:
    """The union of the gaps inside a window, as disjoint sorted intervals ``pairs``: what
    ``covered`` counts. Build it with ``merged``."""

    pairs: tuple[tuple[int, int], ...] = ()
    _starts: tuple[int, ...] = ()
    _before: tuple[int, ...] = ()  # the gaps' length before each one

    def covered(self, lo: int, hi: int) -> int:
        """Nanoseconds of [lo, hi] inside the gaps."""
        return max(0, self._upto(hi) - self._upto(lo)) if self.pairs and hi > lo else 0

    def _upto(self, t: int) -> int:
        i = bisect.bisect_right(self._starts, t) - 1
        if i < 0:
            return 0
        start, end = self.pairs[i]
        return self._before[i] + min(t, end) - start


def merged(spans: Iterable[Span], w: Window) -> Gaps:
    """The union of ``spans`` clipped to ``w``; a gap still open runs to the window's end."""
    clipped = sorted(
        (max(since, w.since_ns), min(until or w.until_ns, w.until_ns))
        for _, since, until in spans
        if max(since, w.since_ns) < min(until or w.until_ns, w.until_ns)
    )
    pairs: list[tuple[int, int]] = []
    for lo, hi in clipped:
        if pairs and lo <= pairs[-1][1]:
            pairs[-1] = (pairs[-1][0], max(pairs[-1][1], hi))
        else:
            pairs.append((lo, hi))
    before, total = [], 0
    for lo, hi in pairs:
        before.append(total)
        total += hi - lo
    return Gaps(tuple(pairs), tuple(lo for lo, _ in pairs), tuple(before))


# --------------------------------------------------------------------------- a scan's totals


def observe(records: Iterable[tuple[int, ev.EventBase]]) -> tuple[list[Change], Blind]:
    """Every hold in ``records`` ((ts_ns, event) in log order): each ended one with its end,
    then each still open with end None; and the gaps that hide them."""
    tracker, blind = Tracker(), Blind()
    out: list[Change] = []
    for ts, e in records:
        blind.feed(e)
        out += (c for c in tracker.feed(ts, e) if c.end_ns is not None)
    return out + [Change(h, None) for h in tracker.open_holds()], blind


def intervals(records: Iterable[tuple[int, ev.EventBase]]) -> list[Change]:
    """The holds of ``observe``."""
    return observe(records)[0]


def totals(
    holds: Iterable[Change], by: str, w: Window, resources: frozenset[str] = frozenset(), gaps: Gaps = Gaps()
) -> list[Row]:
    """Nanoseconds per group inside the window, and those inside ``gaps``, sorted by group;
    groups with none left out. ``resources``: only these (empty: all)."""
    sums: dict[tuple[str, ...], tuple[int, int]] = {}
    for hold, end in holds:
        if resources and hold.resource not in resources:
            continue
        lo = max(hold.start_ns, w.since_ns)
        n = overlap(hold.start_ns, end, w)
        if n:
            key = hold.group(by)
            ns, gap_ns = sums.get(key, (0, 0))
            sums[key] = (ns + n * hold.amount, gap_ns + gaps.covered(lo, lo + n) * hold.amount)
    return sorted(Row(k, n, g) for k, (n, g) in sums.items())


def in_bytes(resource: str) -> bool:
    """A resource charged in byte-nanoseconds (memory, hugepages), not in nanoseconds held."""
    return resource == "memory" or resource.startswith("hugepages-")


def seconds_text(ns: int) -> str:
    """Exact seconds with nine decimals: 3600.000000000."""
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


def hours_text(ns: int) -> str:
    """Hours to six places, rounded half up from the exact nanoseconds."""
    micro_hours = (ns + 1_800_000) // 3_600_000  # 1 µh = 3.6 ms
    return f"{micro_hours // 1_000_000}.{micro_hours % 1_000_000:06d}"
