"""Claim preparations (``eventsrc.core.claim_preparations``), pure: the intervals a claim was
prepared on its driver, as the claim lifecycle has it, and the pods it was prepared for."""

from __future__ import annotations

from eventsrc import events as ev
from eventsrc.core.claim_preparations import Preparation, PreparationChange, Preparations, preparations

CLAIM = ev.ClaimRef(uid="c1", namespace="ns", name="gpu")
D = "gpu.example.com"


def numbered(*events: ev.EventBase) -> list[tuple[int, int, ev.EventBase]]:
    return [(seq, seq * 10, e) for seq, e in enumerate(events, 1)]


def test_an_unprepare_that_fails_leaves_it_prepared_until_one_succeeds() -> None:
    got = preparations(
        numbered(
            ev.PodReferenceAdded(claim_uid="c1", pod_uid="p1"),
            ev.ClaimPrepareStarted(claim=CLAIM, driver=D, pod_uid="p1"),
            ev.ClaimPrepared(claim=CLAIM, driver=D),  # 3
            ev.PodReferenceRemoved(claim_uid="c1", pod_uid="p1"),
            ev.ClaimUnprepareStarted(claim=CLAIM, driver=D),
            ev.ClaimUnprepareFailed(claim=CLAIM, driver=D, reason="busy"),
            ev.ClaimUnprepareStarted(claim=CLAIM, driver=D),
            ev.ClaimUnprepared(claim=CLAIM, driver=D),  # 8
        )
    )
    assert got == [PreparationChange(Preparation("c1", "ns", "gpu", D, ("p1",), 3, 30), 8, 80)]


def test_a_failed_prepare_prepares_nothing_and_a_second_pods_prepare_is_the_same_preparation() -> None:
    tracker = Preparations()
    changes = [
        c
        for seq, ts, e in numbered(
            ev.ClaimPrepareStarted(claim=CLAIM, driver=D, pod_uid="p1"),
            ev.ClaimPrepareFailed(claim=CLAIM, driver=D, reason="no"),
            ev.ClaimPrepareStarted(claim=CLAIM, driver=D, pod_uid="p2"),
            ev.ClaimPrepareStarted(claim=CLAIM, driver=D, pod_uid="p3"),  # in flight together
            ev.ClaimPrepared(claim=CLAIM, driver=D),  # 5
            ev.ClaimPrepared(claim=CLAIM, driver=D),  # the second outcome: no new preparation
            ev.ClaimPrepareFailed(claim=CLAIM, driver=D),  # 7, tolerated: the lifecycle leaves prepared
        )
        for c in tracker.feed(seq, ts, e)
    ]
    prep = Preparation("c1", "ns", "gpu", D, ("p1", "p2", "p3"), 5, 50)
    assert changes == [PreparationChange(prep, None, None), PreparationChange(prep, 7, 70)]


def test_a_claim_no_pod_references_leaves_the_state() -> None:
    tracker = Preparations()
    for seq, ts, e in numbered(
        ev.PodReferenceAdded(claim_uid="c1", pod_uid="p1"),
        ev.ClaimPrepareStarted(claim=CLAIM, driver=D, pod_uid="p1"),
        ev.ClaimPrepared(claim=CLAIM, driver=D),
        ev.PodReferenceRemoved(claim_uid="c1", pod_uid="p1"),
    ):
        tracker.feed(seq, ts, e)
    assert list(tracker.state.claims) == ["c1"]  # still prepared
    tracker.feed(5, 50, ev.ClaimUnprepareStarted(claim=CLAIM, driver=D))
    tracker.feed(6, 60, ev.ClaimUnprepared(claim=CLAIM, driver=D))
    assert tracker.state.claims == {}
    tracker.feed(7, 70, ev.PodReferenceRemoved(claim_uid="other", pod_uid="p9"))  # unknown: kept nowhere
    assert tracker.state.claims == {}
