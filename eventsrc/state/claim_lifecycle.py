"""DRA claims: the prepare/unprepare lifecycle (``lifecycles.CLAIM``) and which pods reference each claim."""

from __future__ import annotations

from eventsrc import events as ev
from eventsrc.state.lifecycles import CLAIM, CLAIM_ABSENT, DRIVER_EVENTS, ClaimLifecycleState, Step, claim_state, step
from eventsrc.state.types import Handlers
from eventsrc.state.views import ClaimView, Views


def _state(v: Views, uid: str) -> ClaimLifecycleState:
    c = v.claims.claims.get(uid)
    return CLAIM_ABSENT if c is None else c.state


def _claim(v: Views, seq: int, ref: ev.ClaimRef, driver: str) -> ClaimView:
    c = v.claims.claims.get(ref.uid)
    if c is None:
        c = v.claims.claims[ref.uid] = ClaimView(uid=ref.uid)
    c.namespace = ref.namespace or c.namespace
    c.name = ref.name or c.name
    c.driver = driver or c.driver
    c.since_seq = seq
    return c


def _driver_said(v: Views, seq: int, e: _DriverEvent) -> ClaimView:
    """The claim after a driver's event: known, named, in the state the event leads to."""
    after = CLAIM.next(_state(v, e.claim.uid), type(e))
    c = _claim(v, seq, e.claim, e.driver)
    c.state = claim_state(after)
    return c


def _leave_if_unused(v: Views, c: ClaimView) -> None:
    if not c.pods and c.state in CLAIM.leaves:
        del v.claims.claims[c.uid]


def steps(v: Views, e: ev.EventBase) -> list[Step]:
    """The claim lifecycle step ``e`` makes in ``v`` (none when it is not a claim's event)."""
    if isinstance(e, (ev.PodReferenceAdded, ev.PodReferenceRemoved)):
        return [step(CLAIM, _state(v, e.claim_uid), type(e), e.claim_uid)]
    if isinstance(e, DRIVER_EVENTS):
        return [step(CLAIM, _state(v, e.claim.uid), type(e), e.claim.uid)]
    return []


def prepare_started(v: Views, seq: int, e: ev.ClaimPrepareStarted) -> None:
    c = _driver_said(v, seq, e)
    c.error = ""


def prepared(v: Views, seq: int, e: ev.ClaimPrepared) -> None:
    c = _driver_said(v, seq, e)
    c.devices = list(e.devices)
    c.error = ""


def prepare_failed(v: Views, seq: int, e: ev.ClaimPrepareFailed) -> None:
    c = _driver_said(v, seq, e)
    c.error = e.reason


def unprepare_started(v: Views, seq: int, e: ev.ClaimUnprepareStarted) -> None:
    _driver_said(v, seq, e)


def unprepared(v: Views, seq: int, e: ev.ClaimUnprepared) -> None:
    c = v.claims.claims.get(e.claim.uid)
    if c is None:  # nothing to unprepare in the views: it stays out of them
        return
    c.state = claim_state(CLAIM.next(c.state, type(e)))
    c.devices = []
    c.since_seq = seq
    _leave_if_unused(v, c)


def unprepare_failed(v: Views, seq: int, e: ev.ClaimUnprepareFailed) -> None:
    c = _driver_said(v, seq, e)
    c.error = e.reason


def reference_added(v: Views, seq: int, e: ev.PodReferenceAdded) -> None:
    c = v.claims.claims.get(e.claim_uid)
    if c is None:
        after = claim_state(CLAIM.next(CLAIM_ABSENT, type(e)))
        c = v.claims.claims[e.claim_uid] = ClaimView(uid=e.claim_uid, state=after, since_seq=seq)
    else:
        c.state = claim_state(CLAIM.next(c.state, type(e)))
    if e.pod_uid not in c.pods:
        c.pods.append(e.pod_uid)


def reference_removed(v: Views, seq: int, e: ev.PodReferenceRemoved) -> None:
    c = v.claims.claims.get(e.claim_uid)
    if c is None:
        return
    c.state = claim_state(CLAIM.next(c.state, type(e)))
    if e.pod_uid in c.pods:
        c.pods.remove(e.pod_uid)
    _leave_if_unused(v, c)


_DriverEvent = (
    ev.ClaimPrepareStarted
    | ev.ClaimPrepared
    | ev.ClaimPrepareFailed
    | ev.ClaimUnprepareStarted
    | ev.ClaimUnprepared
    | ev.ClaimUnprepareFailed
)


HANDLERS: Handlers = {
    ev.ClaimPrepareStarted: prepare_started,
    ev.ClaimPrepared: prepared,
    ev.ClaimPrepareFailed: prepare_failed,
    ev.ClaimUnprepareStarted: unprepare_started,
    ev.ClaimUnprepared: unprepared,
    ev.ClaimUnprepareFailed: unprepare_failed,
    ev.PodReferenceAdded: reference_added,
    ev.PodReferenceRemoved: reference_removed,
}
