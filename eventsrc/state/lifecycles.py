"""Lifecycles: a DRA claim, a device's hold and a pod, each a table of state x event -> state.

Theory of operation
-------------------

Three things in the views go through states: a pod (being admitted, then admitted), a
device (free, reserved while its Allocate call is in flight, allocated; and whether its
plugin still lists it) and a DRA claim (prepared and unprepared on its driver, referenced
by pods). Each has one table here, ``expected``: for each state, the event types that may
arrive in it and the state each leads to. The daemon records only what these tables
expect; everything that names a lifecycle state reads it from here:

* the reducers (``pods.py``, ``devices.py``, ``claim_lifecycle.py``) take the next state from
  ``Lifecycle.next``, and the view fields are typed with these states;
* ``eventsrc replay --check`` (``eventsrc.core.invariants``) reports an event that arrives
  in a state whose row does not expect it, as the rule ``unexpected-transition``;
* ``eventsrc audit`` and ``eventsrc replay --step`` name states with these constants;
* the diagrams in docs/adr/0008 and 0013 are ``Lifecycle.render()`` of these tables (a
  test compares them).

Two rules. First, everything that decides a lifecycle state lives in this module. Second,
the tables never refuse: the log is the truth, and a reducer never fails. So each table
has a second part, ``tolerated``: where an event that its row does not expect takes the
subject anyway. It is what the reducers have always done (an event's usual target, or no
change), written down so that every state x event pair has exactly one next state. Events
keep plain strings; only the views are typed.

What the tables leave to their reducers: a release (``AllocationFailed``,
``DevicesReleased``) concerns only the devices its container holds (an init container's
devices are handed on to the next container, which then holds them); a claim that no pod
references leaves the views in the states of ``Lifecycle.leaves``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Generic, Literal, NamedTuple, TypeVar

from eventsrc import events as ev

S = TypeVar("S", bound=str)
EventType = type[ev.EventBase]


@dataclass(frozen=True)
class Lifecycle(Generic[S]):
    """One lifecycle: its states (``absent`` is "not in the views") and its two tables."""

    name: str
    absent: S
    states: tuple[S, ...]
    events: tuple[EventType, ...]
    #: (state, event type) -> state: what the daemon records.
    expected: Mapping[tuple[S, EventType], S]
    #: (state, event type) -> state for every other pair: where the reducers go anyway.
    tolerated: Mapping[tuple[S, EventType], S]
    #: how a state is shown where its value says nothing ("" for a referenced claim)
    labels: Mapping[S, str] = field(default_factory=dict)
    #: states in which a subject nothing refers to any more leaves the views, and when
    leaves: tuple[S, ...] = ()
    leaves_when: str = ""

    def expects(self, state: S, event: EventType) -> bool:
        return (state, event) in self.expected

    def next(self, state: S, event: EventType) -> S:
        """The state ``event`` leads to from ``state``; total: an unknown pair stays put."""
        key = (state, event)
        return self.expected.get(key, self.tolerated.get(key, state))

    def target(self, event: EventType) -> S:
        """The one state ``event`` leads to from every state it is expected in (claim outcomes
        have one: what the record says the driver did)."""
        targets = {self.expected[(s, event)] for s in self.states if (s, event) in self.expected}
        if len(targets) != 1:
            raise ValueError(f"{event.__name__} leads to {len(targets)} states in the {self.name} lifecycle")
        return targets.pop()

    def sources(self, event: EventType) -> list[S]:
        """The states in which ``event`` is expected."""
        return [s for s in self.states if (s, event) in self.expected]

    def label(self, state: S) -> str:
        return self.labels.get(state, state)

    def render(self) -> str:
        """The expected table as a text diagram, one transition per line (ADRs show it). An
        event every state in the views expects and none changes is one line, ``(any)``."""
        present = [s for s in self.states if s != self.absent]
        loops = [e for e in self.events if all(self.expected.get((s, e)) == s for s in present)]
        rows = [("(any)", f"--{e.__name__}-->", "(unchanged)") for e in loops]
        rows += [
            (self.label(s), f"--{e.__name__}-->", self.label(self.expected[s, e]))
            for s in self.states
            for e in self.events
            if (s, e) in self.expected and not (e in loops and s != self.absent)
        ]
        if self.leaves:
            leaving = ", ".join(self.label(s) for s in self.leaves)
            rows.append((leaving, f"--({self.leaves_when})-->", self.label(self.absent)))
        left = max(len(r[0]) for r in rows)
        mid = max(len(r[1]) for r in rows)
        return "\n".join(f"{a:<{left}}  {b:<{mid}}  {c}".rstrip() for a, b, c in rows) + "\n"


def _complete(
    states: tuple[S, ...],
    events: tuple[EventType, ...],
    expected: Mapping[tuple[S, EventType], S],
    otherwise: Callable[[S, EventType], S],
) -> dict[tuple[S, EventType], S]:
    """The tolerated part: ``otherwise`` for every pair ``expected`` leaves out."""
    return {(s, e): otherwise(s, e) for s in states for e in events if (s, e) not in expected}


# --------------------------------------------------------------------------- pods

PodState = Literal["admitting", "admitted", "quarantined"]
PodLifecycleState = Literal["none", "admitting", "admitted", "quarantined"]

POD_ABSENT: Final = "none"
#: between PodAdmissionStarted and its outcome; the pod's devices are reserved
ADMITTING: Final = "admitting"
#: acknowledged to its client; holds its devices, CPUs and claims until PodRemoved
ADMITTED: Final = "admitted"
#: its records are in doubt (a corrupt record may have been its outcome, a release or its
#: removal): it keeps what it holds until an operator removes it (docs/adr/0005)
QUARANTINED: Final = "quarantined"

_POD_EVENTS: tuple[EventType, ...] = (
    ev.PodAdmissionStarted,
    ev.ContainerAdmissionStarted,
    ev.ContainerAdmitted,
    ev.PodAdmitted,
    ev.AdmissionRejected,
    ev.PodQuarantined,
    ev.PodRemoved,
)
_POD_EXPECTED: dict[tuple[PodLifecycleState, EventType], PodLifecycleState] = {
    (POD_ABSENT, ev.PodAdmissionStarted): ADMITTING,
    (POD_ABSENT, ev.PodAdmitted): ADMITTED,  # imported from the kubelet's checkpoints
    (POD_ABSENT, ev.AdmissionRejected): POD_ABSENT,  # refused before any intent
    (POD_ABSENT, ev.PodQuarantined): QUARANTINED,  # holds devices, its admission unreadable
    (ADMITTING, ev.PodAdmitted): ADMITTED,
    (ADMITTING, ev.AdmissionRejected): POD_ABSENT,
    (ADMITTING, ev.PodQuarantined): QUARANTINED,  # a start found its outcome in doubt
    # a pod read from the runtime grows by container; its other containers stay admitted
    (ADMITTED, ev.ContainerAdmissionStarted): ADMITTED,
    (ADMITTED, ev.ContainerAdmitted): ADMITTED,
    (ADMITTED, ev.AdmissionRejected): ADMITTED,  # that container refused, or undone
    (ADMITTED, ev.PodRemoved): POD_ABSENT,
    (QUARANTINED, ev.PodRemoved): POD_ABSENT,  # by an operator
}
_POD_STATES: tuple[PodLifecycleState, ...] = (POD_ABSENT, ADMITTING, ADMITTED, QUARANTINED)


def _pod_otherwise(state: PodLifecycleState, event: EventType) -> PodLifecycleState:
    # A refusal leaves an admitted or quarantined pod as it is, and so does a container's
    # admission; the other events have one target.
    if event in (ev.AdmissionRejected, ev.ContainerAdmissionStarted, ev.ContainerAdmitted):
        return state
    if event is ev.PodAdmissionStarted:
        return ADMITTING
    if event is ev.PodQuarantined:
        return QUARANTINED
    return ADMITTED if event is ev.PodAdmitted else POD_ABSENT


POD: Final = Lifecycle[PodLifecycleState](
    name="pod",
    absent=POD_ABSENT,
    states=_POD_STATES,
    events=_POD_EVENTS,
    expected=_POD_EXPECTED,
    tolerated=_complete(_POD_STATES, _POD_EVENTS, _POD_EXPECTED, _pod_otherwise),
    labels={POD_ABSENT: "(none)"},
)


def pod_state(state: PodLifecycleState) -> PodState:
    """A state of a pod in the views (``POD_ABSENT`` is no pod; callers drop it first)."""
    if state == QUARANTINED:
        return QUARANTINED
    return ADMITTED if state == ADMITTED else ADMITTING


# --------------------------------------------------------------------------- device holds

#: ``DeviceView.hold``: "" when free
Hold = Literal["", "reserved", "allocated"]
DeviceState = Literal["absent", "free", "reserved", "allocated", "reserved-unlisted", "allocated-unlisted"]

DEVICE_ABSENT: Final = "absent"
#: listed by its plugin, held by nobody
FREE: Final = "free"
#: held by a container while its Allocate call is in flight
RESERVED: Final = "reserved"
#: held by a container, with the plugin's Allocate response
ALLOCATED: Final = "allocated"
#: still held, but no longer in its plugin's list: it leaves the views when released
RESERVED_UNLISTED: Final = "reserved-unlisted"
ALLOCATED_UNLISTED: Final = "allocated-unlisted"

NOT_HELD: Final = ""

_LISTING = (ev.DevicesAdded, ev.DeviceHealthChanged)
_UNLISTING = (ev.DevicesRemoved, ev.ResourceDropped)
_RELEASES = (ev.AllocationFailed, ev.DevicesReleased)
_DEVICE_EVENTS: tuple[EventType, ...] = (
    *_LISTING,
    *_UNLISTING,
    ev.DevicesReserved,
    ev.DevicesAllocated,
    *_RELEASES,
)
_DEVICE_STATES: tuple[DeviceState, ...] = (
    DEVICE_ABSENT,
    FREE,
    RESERVED,
    ALLOCATED,
    RESERVED_UNLISTED,
    ALLOCATED_UNLISTED,
)
_DEVICE_EXPECTED: dict[tuple[DeviceState, EventType], DeviceState] = {
    (DEVICE_ABSENT, ev.DevicesAdded): FREE,
    (DEVICE_ABSENT, ev.DevicesAllocated): ALLOCATED,  # imported: held before (or without) being listed
    (FREE, ev.DevicesAdded): FREE,
    (FREE, ev.DeviceHealthChanged): FREE,
    (FREE, ev.DevicesRemoved): DEVICE_ABSENT,
    (FREE, ev.ResourceDropped): DEVICE_ABSENT,
    (FREE, ev.DevicesReserved): RESERVED,
    (FREE, ev.DevicesAllocated): ALLOCATED,  # imported from the kubelet's checkpoints
    (RESERVED, ev.DevicesAdded): RESERVED,
    (RESERVED, ev.DeviceHealthChanged): RESERVED,
    (RESERVED, ev.DevicesRemoved): RESERVED_UNLISTED,
    (RESERVED, ev.ResourceDropped): RESERVED_UNLISTED,
    (RESERVED, ev.DevicesReserved): RESERVED,  # an init container hands it on
    (RESERVED, ev.DevicesAllocated): ALLOCATED,
    (RESERVED, ev.AllocationFailed): FREE,
    (RESERVED, ev.DevicesReleased): FREE,
    (ALLOCATED, ev.DevicesAdded): ALLOCATED,
    (ALLOCATED, ev.DeviceHealthChanged): ALLOCATED,
    (ALLOCATED, ev.DevicesRemoved): ALLOCATED_UNLISTED,
    (ALLOCATED, ev.ResourceDropped): ALLOCATED_UNLISTED,
    (ALLOCATED, ev.DevicesAllocated): ALLOCATED,  # an init container hands it on
    (ALLOCATED, ev.DevicesReserved): RESERVED,  # ... to a container admitted at its creation (a pod that grows)
    (ALLOCATED, ev.DevicesReleased): FREE,
    (RESERVED_UNLISTED, ev.DevicesAdded): RESERVED,
    (RESERVED_UNLISTED, ev.DeviceHealthChanged): RESERVED,
    (RESERVED_UNLISTED, ev.ResourceDropped): RESERVED_UNLISTED,
    (RESERVED_UNLISTED, ev.DevicesAllocated): ALLOCATED_UNLISTED,
    (RESERVED_UNLISTED, ev.AllocationFailed): DEVICE_ABSENT,
    (RESERVED_UNLISTED, ev.DevicesReleased): DEVICE_ABSENT,
    (ALLOCATED_UNLISTED, ev.DevicesAdded): ALLOCATED,
    (ALLOCATED_UNLISTED, ev.DeviceHealthChanged): ALLOCATED,
    (ALLOCATED_UNLISTED, ev.ResourceDropped): ALLOCATED_UNLISTED,
    (ALLOCATED_UNLISTED, ev.DevicesAllocated): ALLOCATED_UNLISTED,
    (ALLOCATED_UNLISTED, ev.DevicesReleased): DEVICE_ABSENT,
}


def device_state(hold: Hold, listed: bool) -> DeviceState:
    """The lifecycle state of a device in the views, from its hold and its listing."""
    if hold == RESERVED:
        return RESERVED if listed else RESERVED_UNLISTED
    if hold == ALLOCATED:
        return ALLOCATED if listed else ALLOCATED_UNLISTED
    return FREE


def hold_of(state: DeviceState) -> Hold:
    if state in (RESERVED, RESERVED_UNLISTED):
        return RESERVED
    if state in (ALLOCATED, ALLOCATED_UNLISTED):
        return ALLOCATED
    return NOT_HELD


def is_listed(state: DeviceState) -> bool:
    return state not in (RESERVED_UNLISTED, ALLOCATED_UNLISTED)


def _device_otherwise(state: DeviceState, event: EventType) -> DeviceState:
    # Each event sets one of the two things a device state is made of, and keeps the other:
    # listing events set whether it is listed (a free device no longer listed goes), the
    # holds set its hold, a release frees it (an unlisted one goes).
    hold, listed = hold_of(state), is_listed(state) and state != DEVICE_ABSENT
    if event in _LISTING:
        return device_state(hold, True)
    if event in _UNLISTING:
        return device_state(hold, False) if hold else DEVICE_ABSENT
    if event is ev.DevicesReserved:
        return device_state(RESERVED, listed or state == DEVICE_ABSENT)
    if event is ev.DevicesAllocated:
        return device_state(ALLOCATED, listed or state == DEVICE_ABSENT)
    return FREE if listed else DEVICE_ABSENT


DEVICE: Final = Lifecycle[DeviceState](
    name="device hold",
    absent=DEVICE_ABSENT,
    states=_DEVICE_STATES,
    events=_DEVICE_EVENTS,
    expected=_DEVICE_EXPECTED,
    tolerated=_complete(_DEVICE_STATES, _DEVICE_EVENTS, _DEVICE_EXPECTED, _device_otherwise),
    labels={DEVICE_ABSENT: "(absent)"},
)


class Holder(NamedTuple):
    """Who holds a device: one container of one pod."""

    pod_uid: str
    container: str


def holder_text(pod_uid: str, container: str) -> str:
    """``DeviceView.holder`` of a device ``container`` of ``pod_uid`` holds."""
    return f"{pod_uid}/{container}"


def parse_holder(text: str) -> Holder | None:
    """The container a ``DeviceView.holder`` names; None when the device is free."""
    if not text:
        return None
    pod_uid, _, container = text.partition("/")
    return Holder(pod_uid, container)


# --------------------------------------------------------------------------- claims

ClaimState = Literal["", "preparing", "prepared", "prepare-failed", "unpreparing", "unprepared", "unprepare-failed"]
ClaimLifecycleState = Literal[
    "none", "", "preparing", "prepared", "prepare-failed", "unpreparing", "unprepared", "unprepare-failed"
]

CLAIM_ABSENT: Final = "none"
#: referenced by pods, never prepared (the view spells it "")
REFERENCED: Final = ""
PREPARING: Final = "preparing"
PREPARED: Final = "prepared"
PREPARE_FAILED: Final = "prepare-failed"
UNPREPARING: Final = "unpreparing"
#: unprepared on its driver; kept while pods still reference it
UNPREPARED: Final = "unprepared"
UNPREPARE_FAILED: Final = "unprepare-failed"

_REFERENCES = (ev.PodReferenceAdded, ev.PodReferenceRemoved)
#: the events about a claim's calls to its driver (intents and outcomes), each with one target
DRIVER_EVENTS: Final = (
    ev.ClaimPrepareStarted,
    ev.ClaimPrepared,
    ev.ClaimPrepareFailed,
    ev.ClaimUnprepareStarted,
    ev.ClaimUnprepared,
    ev.ClaimUnprepareFailed,
)
_CLAIM_TARGETS: dict[EventType, ClaimLifecycleState] = dict(
    zip(DRIVER_EVENTS, (PREPARING, PREPARED, PREPARE_FAILED, UNPREPARING, UNPREPARED, UNPREPARE_FAILED), strict=True)
)
_CLAIM_EVENTS: tuple[EventType, ...] = (*_REFERENCES, *DRIVER_EVENTS)
_CLAIM_STATES: tuple[ClaimLifecycleState, ...] = (
    CLAIM_ABSENT,
    REFERENCED,
    PREPARING,
    PREPARED,
    PREPARE_FAILED,
    UNPREPARING,
    UNPREPARED,
    UNPREPARE_FAILED,
)
_CLAIM_EXPECTED: dict[tuple[ClaimLifecycleState, EventType], ClaimLifecycleState] = {
    (CLAIM_ABSENT, ev.PodReferenceAdded): REFERENCED,
    (CLAIM_ABSENT, ev.ClaimPrepared): PREPARED,  # imported from the kubelet's checkpoints
    # In every state of a claim in the views, pods come and go (a pod admitted while its
    # claim is being unprepared prepares it again).
    **{(s, e): s for s in _CLAIM_STATES[1:] for e in _REFERENCES},
    (REFERENCED, ev.ClaimPrepareStarted): PREPARING,
    (REFERENCED, ev.ClaimPrepared): PREPARED,  # imported from the kubelet's checkpoints
    (PREPARING, ev.ClaimPrepareStarted): PREPARING,  # another pod, while the first prepare is in flight
    (PREPARING, ev.ClaimPrepared): PREPARED,
    (PREPARING, ev.ClaimPrepareFailed): PREPARE_FAILED,
    (PREPARING, ev.ClaimUnprepareStarted): UNPREPARING,  # the pod's Allocate failed first
    # Two prepares in flight (two pods): the second outcome follows the first.
    (PREPARED, ev.ClaimPrepared): PREPARED,
    (PREPARED, ev.ClaimPrepareFailed): PREPARE_FAILED,
    (PREPARED, ev.ClaimUnprepareStarted): UNPREPARING,
    (PREPARE_FAILED, ev.ClaimPrepareStarted): PREPARING,
    (PREPARE_FAILED, ev.ClaimPrepared): PREPARED,
    (PREPARE_FAILED, ev.ClaimPrepareFailed): PREPARE_FAILED,
    (PREPARE_FAILED, ev.ClaimUnprepareStarted): UNPREPARING,  # no pod needs it: it may be prepared
    (UNPREPARING, ev.ClaimPrepareStarted): PREPARING,
    (UNPREPARING, ev.ClaimUnprepared): UNPREPARED,
    (UNPREPARING, ev.ClaimUnprepareFailed): UNPREPARE_FAILED,
    (UNPREPARED, ev.ClaimPrepareStarted): PREPARING,
    (UNPREPARE_FAILED, ev.ClaimPrepareStarted): PREPARING,
    (UNPREPARE_FAILED, ev.ClaimUnprepared): UNPREPARED,  # retried
    (UNPREPARE_FAILED, ev.ClaimUnprepareFailed): UNPREPARE_FAILED,
}


def _claim_otherwise(state: ClaimLifecycleState, event: EventType) -> ClaimLifecycleState:
    # A reference changes which pods use a claim, not its state; a driver's event has one target,
    # but for an unprepare's outcome while a prepare begun after it is still in flight. The
    # driver's calls run one at a time, and each outcome is recorded as its call returns, so the
    # outcomes follow the calls' order: this unprepare ran first, and the prepare may yet have
    # prepared the claim. Taking UNPREPARED there left a claim prepared on its driver that no
    # restart unprepared (tests/crash/test_dra_crash.py: a SIGKILL between the two outcomes).
    # Once the prepare's outcome is in, a later unprepare's outcome is the driver's last word.
    if event in _STALE_UNPREPARE and state == PREPARING:
        return state
    return _CLAIM_TARGETS.get(event, state)


_STALE_UNPREPARE: frozenset[EventType] = frozenset({ev.ClaimUnprepared, ev.ClaimUnprepareFailed})


CLAIM: Final = Lifecycle[ClaimLifecycleState](
    name="claim",
    absent=CLAIM_ABSENT,
    states=_CLAIM_STATES,
    events=_CLAIM_EVENTS,
    expected=_CLAIM_EXPECTED,
    tolerated=_complete(_CLAIM_STATES, _CLAIM_EVENTS, _CLAIM_EXPECTED, _claim_otherwise),
    labels={CLAIM_ABSENT: "(none)", REFERENCED: "referenced"},
    leaves=(REFERENCED, UNPREPARED),
    leaves_when="no pod left",
)


def claim_state(state: ClaimLifecycleState) -> ClaimState:
    """A state of a claim in the views (``CLAIM_ABSENT`` is no claim; callers drop it first)."""
    return REFERENCED if state == CLAIM_ABSENT else state


LIFECYCLES: tuple[Lifecycle[PodLifecycleState] | Lifecycle[DeviceState] | Lifecycle[ClaimLifecycleState], ...] = (
    POD,
    DEVICE,
    CLAIM,
)


@dataclass(frozen=True)
class Step:
    """An event arriving at one subject of a lifecycle (a pod, a claim or a device)."""

    lifecycle: str
    #: the subject's state before the event, and whether the lifecycle expects the event there
    before: str
    expected: bool
    #: what the lifecycle expects the event from
    sources: tuple[str, ...]
    #: pod uid, claim uid, or device id
    key: str
    #: the device's resource
    resource: str = ""


def step(lifecycle: Lifecycle[S], before: S, event: EventType, key: str, resource: str = "") -> Step:
    return Step(
        lifecycle.name,
        lifecycle.label(before),
        lifecycle.expects(before, event),
        tuple(lifecycle.label(s) for s in lifecycle.sources(event)),
        key,
        resource,
    )
