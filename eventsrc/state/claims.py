"""DRA claims: the prepare/unprepare lifecycle and which pods reference each claim."""

from __future__ import annotations

from eventsrc import events as ev
from eventsrc.state.types import Handlers
from eventsrc.state.views import ClaimView, Views


def _claim(v: Views, seq: int, ref: ev.ClaimRef, driver: str) -> ClaimView:
    c = v.claims.claims.get(ref.uid)
    if c is None:
        c = v.claims.claims[ref.uid] = ClaimView(uid=ref.uid)
    c.namespace = ref.namespace or c.namespace
    c.name = ref.name or c.name
    c.driver = driver or c.driver
    c.since_seq = seq
    return c


def prepare_started(v: Views, seq: int, e: ev.ClaimPrepareStarted) -> None:
    c = _claim(v, seq, e.claim, e.driver)
    c.state = "preparing"
    c.error = ""


def prepared(v: Views, seq: int, e: ev.ClaimPrepared) -> None:
    c = _claim(v, seq, e.claim, e.driver)
    c.state = "prepared"
    c.devices = list(e.devices)
    c.error = ""


def prepare_failed(v: Views, seq: int, e: ev.ClaimPrepareFailed) -> None:
    c = _claim(v, seq, e.claim, e.driver)
    c.state = "prepare-failed"
    c.error = e.reason


def unprepare_started(v: Views, seq: int, e: ev.ClaimUnprepareStarted) -> None:
    c = _claim(v, seq, e.claim, e.driver)
    c.state = "unpreparing"


def unprepared(v: Views, seq: int, e: ev.ClaimUnprepared) -> None:
    c = v.claims.claims.get(e.claim.uid)
    if c is not None and not c.pods:
        del v.claims.claims[e.claim.uid]
    elif c is not None:
        c.state = "unprepared"
        c.devices = []
        c.since_seq = seq


def unprepare_failed(v: Views, seq: int, e: ev.ClaimUnprepareFailed) -> None:
    c = _claim(v, seq, e.claim, e.driver)
    c.state = "unprepare-failed"
    c.error = e.reason


def reference_added(v: Views, seq: int, e: ev.PodReferenceAdded) -> None:
    c = v.claims.claims.get(e.claim_uid)
    if c is None:
        c = v.claims.claims[e.claim_uid] = ClaimView(uid=e.claim_uid, since_seq=seq)
    if e.pod_uid not in c.pods:
        c.pods.append(e.pod_uid)


def reference_removed(v: Views, seq: int, e: ev.PodReferenceRemoved) -> None:
    c = v.claims.claims.get(e.claim_uid)
    if c is None:
        return
    if e.pod_uid in c.pods:
        c.pods.remove(e.pod_uid)
    if not c.pods and c.state in ("", "unprepared"):
        del v.claims.claims[e.claim_uid]


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
