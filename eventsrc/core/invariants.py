"""Invariants of the views, checked event by event (``eventsrc replay --check``).

Pure: views and records in, violations out. No clock: time is the records' timestamps.

Each rule has a short name (``RULES``). How each one is detected:

* ``device-double-held``: a DevicesReserved or DevicesAllocated of a device whose holder,
  before the event, is a container of another *live* pod (admitting or admitted), or
  another container of the same pod when neither is an init container (the kubelet
  hands an init container's devices on to the containers after it). The devices view keeps
  one holder per device, so the second holder is seen in the event itself.
* ``cpu-double-exclusive``: a CPUsAssigned of a CPU that is already exclusive to a
  container of another live pod (or, neither being an init container, of the same pod).
* ``exclusive-in-shared-pool``: at the end of each run of records sharing a
  correlation id (the daemon records a CPUsAssigned and its SharedPoolChanged
  together), a CPU both exclusive and in the recorded shared pool. Blamed on the
  group's SharedPoolChanged that put it there, else on its CPUsAssigned that took it.
* ``reserved-cpu-exclusive``: a CPUsAssigned of a CPU in the reserved set of the CPU
  policy last recorded (PolicyConfigurationChanged, ``reserved``). CPUs a container
  held before the reserved set changed are kept until it ends, as the daemon does.
* ``claim-unprepared-under-live-pod``: a ClaimUnprepareStarted or ClaimUnprepared of
  a claim still referenced by a live pod.
* ``dangling-reservation``: a DevicesReserved whose pod is still admitting, judged in
  sequence order, never by the records' wall-clock stamps (a clock step must not make
  or hide a violation). At the end of each correlation-id run (so the outcomes a restart
  records with its DaemonStarted count) and at the end, it is dangling when
  - a later daemon instance started (DaemonStarted) and its start-up run ended without the
    outcome: a restart finishes every admission the previous instance left open, so this
    one was lost; or
  - the same instance recorded the outcomes (PodAdmitted or AdmissionRejected) of more than
    ``reservation_window`` admissions after it: admissions decide one at a time, and one
    waits for its plugin calls at most a bounded time, so that many others finishing first
    means it was left behind.
* ``unhealthy-device-allocated``: a DevicesReserved of a device whose health, before
  the event, is not "Healthy" (an unknown device counts as unhealthy). A device that
  turns unhealthy while its Allocate call is in flight is not a violation.
* ``reserved-under-admitted-pod``: a PodAdmitted (or a DevicesReserved) after which a
  device is still only reserved for the admitted pod: its Allocate outcome was never
  recorded, yet the pod was acknowledged (two admissions of one uid at once did this).
* ``unexpected-transition``: an event that arrives at a pod, a device or a claim in a
  state whose row of its lifecycle table (``eventsrc.state.lifecycles``) does not expect
  it. The reducers apply it anyway (they are total); this rule says it happened.

Beside a kubelet (``serve --beside-kubelet``) the kubelet decides, and eventsrc records what it
saw. What the kubelet got wrong is a *finding* (``FINDINGS``), reported apart from the rules
above, which judge only eventsrc's own views (observed facts never change them), so that a
health check can tell a kubelet's fault from eventsrc's (docs/adr/0038):

* ``kubelet-device-in-two-pods``: at the end of a run of records sharing a correlation id with
  a KubeletDevicesObserved, a device the observed views say containers of two pods hold at once.
* ``kubelet-cpu-in-two-pods``: likewise an exclusive CPU, after a KubeletCPUsObserved.

Two containers of one pod are not judged (an init container's resources are handed on), nor
DRA claim devices (a claim may be shared by pods), nor CPUs in the observed shared pool
(``eventsrc.core.kubelet_observations.held_twice`` says what is held twice).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eventsrc import events as ev
from eventsrc.core.cpu.cpuset import CPUSet, CPUSetParseError
from eventsrc.core.kubelet_observations import CPUS, held_twice, newly_held
from eventsrc.events import CorruptRecordError, Record
from eventsrc.state.apply import apply, lifecycle_steps
from eventsrc.state.lifecycles import (
    ADMITTED,
    ADMITTING,
    ALLOCATED,
    CLAIM,
    POD,
    RESERVED,
    Step,
    holder_text,
    parse_holder,
)
from eventsrc.state.views import Views

RULES: dict[str, str] = {
    "device-double-held": "no device held by two live containers",
    "cpu-double-exclusive": "no CPU exclusive to two containers",
    "exclusive-in-shared-pool": "exclusive CPUs never in the shared pool",
    "reserved-cpu-exclusive": "reserved CPUs never exclusive",
    "claim-unprepared-under-live-pod": "no claim unprepared under a live pod",
    "dangling-reservation": "no reservation left without an outcome by a restart or many later admissions",
    "unhealthy-device-allocated": "no allocation of an unhealthy device",
    "reserved-under-admitted-pod": "no device of an admitted pod left reserved without its allocation",
    "unexpected-transition": "every event arrives in a state its lifecycle expects it in",
}

#: What a kubelet beside eventsrc got wrong: findings, not invariants eventsrc keeps.
FINDINGS: dict[str, str] = {
    "kubelet-device-in-two-pods": "a device the kubelet gave to two pods at once (observed: the kubelet's fault)",
    "kubelet-cpu-in-two-pods": "an exclusive CPU the kubelet gave to two pods at once (observed: the kubelet's fault)",
}

#: How many later admissions' outcomes a reservation may wait behind (``dangling-reservation``).
DEFAULT_RESERVATION_WINDOW = 1000


@dataclass(frozen=True)
class _Reservation:
    """An admitting pod's first DevicesReserved, with the instance and the count of
    admission outcomes it was recorded at."""

    record: Record
    boot: int
    outcomes: int


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str
    #: the record that broke the invariant
    seq: int
    correlation_id: str = ""
    #: the record after which it was seen (later than ``seq`` for the deferred rules)
    detected_seq: int = 0

    @property
    def finding(self) -> bool:
        """A finding about the kubelet (``FINDINGS``), not a broken invariant of eventsrc's."""
        return self.rule in FINDINGS


# --------------------------------------------------------------------------- helpers


def who(views: Views, pod_uid: str, container: str = "") -> str:
    """``namespace/name/container`` when the pod is known, else ``uid/container``."""
    pod = views.pods.pods.get(pod_uid)
    base = f"{pod.namespace}/{pod.name}" if pod is not None and pod.name else pod_uid
    return f"{base}/{container}" if container else base


def _live(views: Views, pod_uid: str) -> bool:
    return pod_uid in views.pods.pods


def _kind(views: Views, pod_uid: str, container: str) -> str:
    pod = views.pods.pods.get(pod_uid)
    c = pod.containers.get(container) if pod is not None else None
    return c.kind if c is not None else ""


def _handed_on(views: Views, pod_uid: str, holder_container: str, container: str) -> bool:
    """Within one pod, an init container hands its resource on to a later container (the
    daemon records each step's reservation, then each step's allocation, so the event may
    also name the init container while the later one holds it)."""
    return holder_container == container or "init" in (
        _kind(views, pod_uid, holder_container),
        _kind(views, pod_uid, container),
    )


def _hold(hold: str) -> str:
    return {RESERVED: "reserved by", ALLOCATED: "allocated to"}.get(hold, "held by")


def reserved_cpus(views: Views) -> CPUSet:
    text = views.cpus.policy.get("reserved", "")
    if not isinstance(text, str) or not text:
        return CPUSet()
    try:
        return CPUSet.parse(text)
    except CPUSetParseError:
        return CPUSet()


def assigned_cpus(views: Views) -> CPUSet:
    return CPUSet(c for containers in views.cpus.assignments.values() for cpus in containers.values() for c in cpus)


def _v(rule: str, message: str, rec: Record, detected: int = 0) -> Violation:
    return Violation(rule, message, rec.seq, rec.correlation_id, detected or rec.seq)


# --------------------------------------------------------------------------- per event


def before_apply(views: Views, rec: Record) -> list[Violation]:
    """The rules decided by one event and the views just before it."""
    e = rec.event
    out: list[Violation] = []
    if isinstance(e, (ev.DevicesReserved, ev.DevicesAllocated)):
        table = views.devices.devices.get(e.resource, {})
        verb = "reserved for" if isinstance(e, ev.DevicesReserved) else "allocated to"
        for device_id in e.device_ids:
            d = table.get(device_id)
            holder = parse_holder(d.holder) if d is not None else None
            if d is not None and holder is not None and d.holder != holder_text(e.pod_uid, e.container):
                pod_uid, container = holder
                if not _live(views, pod_uid):
                    continue
                if pod_uid == e.pod_uid and _handed_on(views, pod_uid, container, e.container):
                    continue
                out.append(
                    _v(
                        "device-double-held",
                        f"{device_id} {e.resource} {verb} {who(views, e.pod_uid, e.container)} "
                        f"while {_hold(d.hold)} {who(views, pod_uid, container)} (a live pod)",
                        rec,
                    )
                )
            if isinstance(e, ev.DevicesReserved):
                health = d.health if d is not None else "Unknown"
                if health != "Healthy":
                    state = f"health {health}" if d is not None else "not listed by its plugin (health Unknown)"
                    out.append(
                        _v(
                            "unhealthy-device-allocated",
                            f"{device_id} {e.resource} reserved for {who(views, e.pod_uid, e.container)} "
                            f"but it is {state}",
                            rec,
                        )
                    )
    elif isinstance(e, ev.CPUsAssigned):
        cpus = CPUSet(e.cpus)
        for pod_uid, containers in views.cpus.assignments.items():
            for container, held in containers.items():
                if pod_uid == e.pod_uid and _handed_on(views, pod_uid, container, e.container):
                    continue
                if not _live(views, pod_uid):
                    continue
                both = cpus & CPUSet(held)
                if both:
                    out.append(
                        _v(
                            "cpu-double-exclusive",
                            f"cpus {both} assigned to {who(views, e.pod_uid, e.container)} "
                            f"while exclusive to {who(views, pod_uid, container)}",
                            rec,
                        )
                    )
        reserved = cpus & reserved_cpus(views)
        if reserved:
            out.append(
                _v(
                    "reserved-cpu-exclusive",
                    f"reserved cpus {reserved} assigned to {who(views, e.pod_uid, e.container)} "
                    f"(reserved: {views.cpus.policy.get('reserved')})",
                    rec,
                )
            )
    elif isinstance(e, (ev.ClaimUnprepareStarted, ev.ClaimUnprepared)):
        claim = views.claims.claims.get(e.claim.uid)
        live = [p for p in claim.pods if _live(views, p)] if claim is not None else []
        if live:
            name = f"{e.claim.namespace}/{e.claim.name}" if e.claim.name else e.claim.uid
            verb = "unprepare started" if isinstance(e, ev.ClaimUnprepareStarted) else "unprepared"
            out.append(
                _v(
                    "claim-unprepared-under-live-pod",
                    f"claim {name} {verb} while pod {', '.join(who(views, p) for p in live)} uses it",
                    rec,
                )
            )
    out += [_unexpected(views, rec, s) for s in lifecycle_steps(views, e) if not s.expected]
    return out


def after_apply(views: Views, rec: Record) -> list[Violation]:
    """The rules decided by the views just after one event."""
    e = rec.event
    admitted = (ev.PodAdmitted, ev.ContainerAdmitted)
    uid = e.pod.uid if isinstance(e, admitted) else e.pod_uid if isinstance(e, ev.DevicesReserved) else None
    pod = views.pods.pods.get(uid) if uid is not None else None
    if pod is None or pod.state != ADMITTED:
        return []
    out = []
    for resource, table in sorted(views.devices.devices.items()):
        for device_id, d in sorted(table.items()):
            holder = parse_holder(d.holder)
            # (a container being admitted into the admitted pod holds its devices reserved until its outcome)
            if d.hold == RESERVED and holder is not None and holder.pod_uid == uid and holder.container != pod.growing:
                out.append(
                    _v(
                        "reserved-under-admitted-pod",
                        f"{device_id} {resource} still reserved for {who(views, uid, holder.container)} "
                        f"(since seq {d.since_seq}), yet the pod is admitted",
                        rec,
                    )
                )
    return out


def _unexpected(views: Views, rec: Record, step: Step) -> Violation:
    e = rec.event
    if step.lifecycle == POD.name:
        subject = f"pod {who(views, step.key)}"
    elif step.lifecycle == CLAIM.name:
        claim = views.claims.claims.get(step.key)
        subject = f"claim {claim.namespace}/{claim.name}" if claim is not None and claim.name else f"claim {step.key}"
    else:
        subject = f"{step.key} {step.resource}"
    where = ", ".join(step.sources) or "no state"
    return _v(
        "unexpected-transition",
        f"{subject}: {type(e).__name__} in state {step.before}; the {step.lifecycle} lifecycle expects it in {where}",
        rec,
    )


def shared_pool_violations(views: Views, group: list[Record]) -> list[Violation]:
    """Exclusive CPUs in the shared pool, at the end of a correlation-id run ``group``."""
    if not any(isinstance(r.event, (ev.CPUsAssigned, ev.SharedPoolChanged)) for r in group):
        return []
    both = assigned_cpus(views) & CPUSet(views.cpus.shared)
    if not both:
        return []
    last = group[-1].seq
    for r in reversed(group):
        if isinstance(r.event, ev.SharedPoolChanged) and CPUSet(r.event.cpus) & both:
            owners = _owners(views, both)
            return [
                _v(
                    "exclusive-in-shared-pool",
                    f"shared pool {CPUSet(r.event.cpus)} holds cpus {both}, exclusive to {owners}",
                    r,
                    last,
                )
            ]
    for r in reversed(group):
        if isinstance(r.event, ev.CPUsAssigned) and CPUSet(r.event.cpus) & both:
            e = r.event
            return [
                _v(
                    "exclusive-in-shared-pool",
                    f"cpus {CPUSet(e.cpus) & both} assigned to {who(views, e.pod_uid, e.container)} "
                    f"stay in the shared pool {CPUSet(views.cpus.shared)}",
                    r,
                    last,
                )
            ]
    return []


def kubelet_double_allocations(views: Views, group: list[Record]) -> list[Violation]:
    """The findings at the end of ``group``: each device or exclusive CPU that a
    KubeletDevicesObserved or KubeletCPUsObserved of it names and containers of two observed
    pods hold, blamed on the last such record."""
    observed = [r for r in group if isinstance(r.event, (ev.KubeletDevicesObserved, ev.KubeletCPUsObserved))]
    if not observed:
        return []
    twice = held_twice(views.kubelet, newly_held(r.event for r in observed))
    out = []
    for r in reversed(observed):  # each blamed once, on the last record of the run naming it
        for resource, i in newly_held([r.event]):
            both = twice.pop((resource, i), [])
            if len(both) > 1:
                if resource == CPUS:
                    rule, what = "kubelet-cpu-in-two-pods", f"exclusive cpu {i}"
                else:
                    rule, what = "kubelet-device-in-two-pods", f"{resource} device {i}"
                message = f"{what} is held by {' and '.join(both)} at once (the kubelet's decision)"
                out.append(_v(rule, message, r, group[-1].seq))
    return out[::-1]


def _owners(views: Views, cpus: CPUSet) -> str:
    out = [
        who(views, uid, name)
        for uid, containers in views.cpus.assignments.items()
        for name, held in containers.items()
        if CPUSet(held) & cpus
    ]
    return ", ".join(out)


# --------------------------------------------------------------------------- the checker


@dataclass
class Checker:
    """Applies records to ``views`` and returns the violations each one reveals.

    ``feed`` every record in order, then ``finish``. A deferred rule (shared pool,
    dangling reservation) is reported once the run of records sharing the correlation id
    of its cause has ended, with the views as they were then.
    """

    views: Views = field(default_factory=Views)
    reservation_window: int = DEFAULT_RESERVATION_WINDOW
    #: the current run of records sharing one correlation id
    group: list[Record] = field(default_factory=list)
    #: pod uid -> its first DevicesReserved while admitting
    reservations: dict[str, _Reservation] = field(default_factory=dict)
    #: the admission outcomes seen (the daemon instance is views.meta.boots)
    outcomes: int = 0
    events: int = 0
    _reported: set[tuple[str, int]] = field(default_factory=set)

    def feed(self, item: Record | CorruptRecordError) -> list[Violation]:
        out: list[Violation] = []
        if isinstance(item, CorruptRecordError):
            apply(self.views, item)
            return out
        if self.group and item.correlation_id != self.group[-1].correlation_id:
            out += self._end_group()
        self.events += 1
        out += before_apply(self.views, item)
        apply(self.views, item)
        out += after_apply(self.views, item)
        e = item.event
        if isinstance(e, (ev.PodAdmitted, ev.AdmissionRejected)):
            self.outcomes += 1
        if isinstance(e, ev.PodAdmissionStarted):
            self.reservations.pop(e.pod.uid, None)
        elif isinstance(e, ev.DevicesReserved) and e.pod_uid not in self.reservations:
            pod = self.views.pods.pods.get(e.pod_uid)
            if pod is not None and pod.state == ADMITTING:
                self.reservations[e.pod_uid] = _Reservation(item, self.views.meta.boots, self.outcomes)
        self.group.append(item)
        return self._new(out)

    def finish(self, complete: bool = True) -> list[Violation]:
        """The deferred rules at the end of the log. ``complete=False``: the replay stopped
        inside a run of records sharing a correlation id (``--until``), so its end is not
        judged (a CPUsAssigned may be cut from its SharedPoolChanged)."""
        if not self.group or not complete:
            return []
        return self._new(self._end_group())

    def _new(self, found: list[Violation]) -> list[Violation]:
        out = []
        for v in found:
            key = (v.rule, v.seq)
            if key not in self._reported:
                self._reported.add(key)
                out.append(v)
        return out

    def _end_group(self) -> list[Violation]:
        group, self.group = self.group, []
        out = shared_pool_violations(self.views, group) + kubelet_double_allocations(self.views, group)
        pods = self.views.pods.pods
        for uid, res in list(self.reservations.items()):
            pod = pods.get(uid)
            if pod is None or pod.state != ADMITTING:
                del self.reservations[uid]
                continue
            later = self.outcomes - res.outcomes
            if res.boot < self.views.meta.boots:
                why = f"the daemon restarted (DaemonStarted at seq {self.views.meta.started_seq}) without its outcome"
            elif later > self.reservation_window:
                why = f"no outcome while {later} later admissions had theirs (window {self.reservation_window})"
            else:
                continue
            rec, e = res.record, res.record.event
            assert isinstance(e, ev.DevicesReserved)
            out.append(
                _v(
                    "dangling-reservation",
                    f"{', '.join(e.device_ids)} {e.resource} reserved for {who(self.views, uid, e.container)} "
                    f"at seq {rec.seq}: {why}",
                    rec,
                    group[-1].seq,
                )
            )
            del self.reservations[uid]
        return out
