"""Claim preparations: the intervals during which a DRA claim was prepared on its driver, from
the log's records in order (pure: records in, intervals out; the fleet's sink keeps them as
rows, docs/fleet.md).

What a preparation is comes from the claim lifecycle (``state.lifecycles.CLAIM``), the table
``audit claim`` names each step's state with: a claim is prepared while its state is one of
``PREPARED_STATES`` (prepared; being unprepared; its unprepare failed: the driver still has
it). A preparation starts at the record that takes the claim into those states (in practice
``ClaimPrepared``) and ends at the one that takes it out (``ClaimUnprepared``; or a tolerated
``ClaimPrepareFailed`` or ``ClaimPrepareStarted``).

Its pods are the pods it was prepared for and served: the ``pod_uid`` of each
``ClaimPrepareStarted`` since the claim's previous preparation ended, the pods referencing the
claim (``PodReferenceAdded``, not yet ``PodReferenceRemoved``) when it started, and those that
referenced it while it was prepared (a shared claim is prepared once for all of them).

A claim that no pod references leaves the tracker in the states ``CLAIM.leaves`` names, as it
leaves the views, so the state stays as small as the views' claims.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from msgspec import Struct, field

from eventsrc import events as ev
from eventsrc.state.lifecycles import (
    CLAIM,
    CLAIM_ABSENT,
    DRIVER_EVENTS,
    PREPARED,
    UNPREPARE_FAILED,
    UNPREPARING,
    ClaimLifecycleState,
)

#: the claim's states while its driver has it prepared
PREPARED_STATES: Final = frozenset({PREPARED, UNPREPARING, UNPREPARE_FAILED})


class Preparation(NamedTuple):
    """One preparation of a claim on its driver, from the record ``start_seq`` (at ``start_ns``)."""

    claim_uid: str
    namespace: str
    name: str
    driver: str
    pods: tuple[str, ...]  # pod uids, in the order they came
    start_seq: int
    start_ns: int


class PreparationChange(NamedTuple):
    """A preparation as it is after a record: open (``end_seq`` None), or ended at that record."""

    preparation: Preparation
    end_seq: int | None
    end_ns: int | None


class ClaimTrack(Struct, array_like=True, gc=False):
    state: ClaimLifecycleState = CLAIM_ABSENT
    namespace: str = ""
    name: str = ""
    driver: str = ""
    pods: list[str] = field(default_factory=list)  # for the current (or next) preparation
    referencing: list[str] = field(default_factory=list)
    start_seq: int = 0  # 0: not prepared
    start_ns: int = 0


class PreparationsState(Struct, gc=False):
    """Every claim the views hold after the records fed so far."""

    claims: dict[str, ClaimTrack] = field(default_factory=dict)  # claim uid -> track


class Preparations:
    """Feed records in log order (``feed``); each returns the preparations it started, changed
    (a pod added) or ended."""

    def __init__(self, state: PreparationsState | None = None) -> None:
        self.state = state if state is not None else PreparationsState()

    def feed(self, seq: int, ts_ns: int, e: ev.EventBase) -> list[PreparationChange]:
        if isinstance(e, (ev.PodReferenceAdded, ev.PodReferenceRemoved)):
            return self._reference(seq, ts_ns, e)
        if isinstance(e, DRIVER_EVENTS):
            return self._driver(seq, ts_ns, e)
        return []

    def _reference(
        self, seq: int, ts_ns: int, e: ev.PodReferenceAdded | ev.PodReferenceRemoved
    ) -> list[PreparationChange]:
        c = self.state.claims.setdefault(e.claim_uid, ClaimTrack())
        c.state = CLAIM.next(c.state, type(e))
        out: list[PreparationChange] = []
        if isinstance(e, ev.PodReferenceAdded):
            if e.pod_uid not in c.referencing:
                c.referencing.append(e.pod_uid)
            if c.start_seq and _add(c.pods, e.pod_uid):
                out.append(PreparationChange(_preparation(e.claim_uid, c), None, None))
        elif e.pod_uid in c.referencing:
            c.referencing.remove(e.pod_uid)
        self._leave(e.claim_uid, c)
        return out

    def _driver(self, seq: int, ts_ns: int, e: ev.EventBase) -> list[PreparationChange]:
        assert isinstance(e, DRIVER_EVENTS)
        uid = e.claim.uid
        c = self.state.claims.setdefault(uid, ClaimTrack())
        before, after = c.state, CLAIM.next(c.state, type(e))
        c.state = after
        c.namespace, c.name, c.driver = e.claim.namespace or c.namespace, e.claim.name or c.name, e.driver or c.driver
        out: list[PreparationChange] = []
        if before in PREPARED_STATES and after not in PREPARED_STATES:
            out.append(PreparationChange(_preparation(uid, c), seq, max(ts_ns, c.start_ns)))
            c.pods, c.start_seq, c.start_ns = [], 0, 0
        if isinstance(e, ev.ClaimPrepareStarted) and e.pod_uid:
            _add(c.pods, e.pod_uid)
        if before not in PREPARED_STATES and after in PREPARED_STATES:
            for pod in c.referencing:
                _add(c.pods, pod)
            c.start_seq, c.start_ns = seq, ts_ns
            out.append(PreparationChange(_preparation(uid, c), None, None))
        self._leave(uid, c)
        return out

    def _leave(self, uid: str, c: ClaimTrack) -> None:
        if not c.referencing and not c.start_seq and (c.state in CLAIM.leaves or c.state == CLAIM_ABSENT):
            del self.state.claims[uid]


def _add(pods: list[str], uid: str) -> bool:
    if uid in pods:
        return False
    pods.append(uid)
    return True


def _preparation(uid: str, c: ClaimTrack) -> Preparation:
    return Preparation(uid, c.namespace, c.name, c.driver, tuple(c.pods), c.start_seq, c.start_ns)


def preparations(records: list[tuple[int, int, ev.EventBase]]) -> list[PreparationChange]:
    """Every preparation of ``records`` ((seq, ts_ns, event), in log order) as it last stood:
    ended, or still open."""
    tracker = Preparations()
    last: dict[tuple[str, int], PreparationChange] = {}
    for seq, ts_ns, e in records:
        for change in tracker.feed(seq, ts_ns, e):
            last[(change.preparation.claim_uid, change.preparation.start_seq)] = change
    return list(last.values())
