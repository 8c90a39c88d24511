"""DRA claim decisions: what to prepare, what to unprepare, what a restart must finish.

The claim lifecycle is the table ``eventsrc.state.lifecycles.CLAIM`` (drawn in ADR 0008);
this module decides which of its events to record next.

Intent before the call, outcome after it: a "started" event is always durable before the
driver is called, so a restart knows which calls may have happened. NodePrepareResources
and NodeUnprepareResources are idempotent by contract, which makes finishing them safe.
Pure: views in, events and work lists out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from eventsrc import events as ev
from eventsrc.state.lifecycles import ADMITTED, PREPARED, PREPARING, UNPREPARE_FAILED, UNPREPARED, UNPREPARING
from eventsrc.state.views import ClaimView, Views


@dataclass(frozen=True)
class ClaimWork:
    """A call the shell must make: prepare or unprepare ``claims`` with ``driver``."""

    driver: str
    claims: tuple[ev.ClaimRef, ...]


@dataclass
class ClaimPlan:
    events: list[ev.EventBase] = field(default_factory=list)
    prepare: dict[str, list[ev.ClaimRef]] = field(default_factory=dict)  # driver -> claims

    def work(self) -> list[ClaimWork]:
        return [ClaimWork(d, tuple(c)) for d, c in sorted(self.prepare.items())]


def ref(c: ClaimView) -> ev.ClaimRef:
    return ev.ClaimRef(uid=c.uid, namespace=c.namespace, name=c.name)


def admission_events(views: Views, pod_uid: str, claims: Iterable[tuple[ev.ClaimRef, str]]) -> ClaimPlan:
    """The intent for a pod's claims: a reference for each, and a prepare for each claim not
    prepared yet (a claim shared with a running pod is prepared once)."""
    plan = ClaimPlan()
    for claim, driver in claims:
        plan.events.append(ev.PodReferenceAdded(claim_uid=claim.uid, pod_uid=pod_uid))
        known = views.claims.claims.get(claim.uid)
        if known is not None and known.state == PREPARED:
            continue
        plan.events.append(ev.ClaimPrepareStarted(claim=claim, driver=driver, pod_uid=pod_uid))
        plan.prepare.setdefault(driver, []).append(claim)
    return plan


def release_events(views: Views, pod_uid: str) -> tuple[list[ev.EventBase], list[ClaimWork]]:
    """The pod lets go of its claims; those left with no pod are to be unprepared (intent)."""
    out: list[ev.EventBase] = []
    unprepare: dict[str, list[ev.ClaimRef]] = {}
    for uid, c in sorted(views.claims.claims.items()):
        if pod_uid not in c.pods:
            continue
        out.append(ev.PodReferenceRemoved(claim_uid=uid, pod_uid=pod_uid))
        if c.pods == [pod_uid] and c.driver:
            out.append(ev.ClaimUnprepareStarted(claim=ref(c), driver=c.driver))
            unprepare.setdefault(c.driver, []).append(ref(c))
    return out, [ClaimWork(d, tuple(cs)) for d, cs in sorted(unprepare.items())]


def pending_work(views: Views) -> tuple[list[ev.EventBase], list[ClaimWork], list[ClaimWork]]:
    """What is unfinished in the views (after a restart, or after failures): the events to
    record first, then the prepares and the unprepares to (re)do.

    * a reference from a pod that is gone is removed;
    * a claim an admitted pod needs that is not prepared: prepare it again;
    * a claim no pod needs that may be prepared on its driver (anything but unprepared):
      unprepare it. A pod being admitted right now counts as needing its claims (its
      admission prepares them).
    """
    present = views.pods.pods
    events: list[ev.EventBase] = []
    prepare: dict[str, list[ev.ClaimRef]] = {}
    unprepare: dict[str, list[ev.ClaimRef]] = {}
    for uid, c in sorted(views.claims.claims.items()):
        for p in c.pods:
            if p not in present:
                events.append(ev.PodReferenceRemoved(claim_uid=uid, pod_uid=p))
        needed = any(p in present and present[p].state == ADMITTED for p in c.pods)
        wanted = any(p in present for p in c.pods)
        if not c.driver:
            continue
        if needed and c.state != PREPARED:
            if c.state != PREPARING:
                events.append(ev.ClaimPrepareStarted(claim=ref(c), driver=c.driver))
            prepare.setdefault(c.driver, []).append(ref(c))
        elif not wanted and c.state != UNPREPARED:
            if c.state not in (UNPREPARING, UNPREPARE_FAILED):
                events.append(ev.ClaimUnprepareStarted(claim=ref(c), driver=c.driver))
            unprepare.setdefault(c.driver, []).append(ref(c))
    return (
        events,
        [ClaimWork(d, tuple(cs)) for d, cs in sorted(prepare.items())],
        [ClaimWork(d, tuple(cs)) for d, cs in sorted(unprepare.items())],
    )


def cdi_devices(views: Views, claim_uids: Iterable[str]) -> list[str]:
    """The CDI device ids of prepared claims, as a container using them gets them."""
    out: list[str] = []
    for uid in claim_uids:
        c = views.claims.claims.get(uid)
        if c is None:
            continue
        for d in c.devices:
            out.extend(d.cdi_device_ids)
    return out
