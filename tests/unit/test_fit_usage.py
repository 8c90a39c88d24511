"""The other pods' requests the resource fit reads (``core.fit.node_usage``), kept beside the
pods and counted again only for the pods the reducers marked: always what counting every pod
from scratch gives, whatever the records in between (issue 38, ADR 0043)."""

from __future__ import annotations

import msgspec
from hypothesis import example, given, settings
from hypothesis import strategies as st

from eventsrc import events as ev
from eventsrc.core.fit import node_usage, pod_requests
from eventsrc.events import Record
from eventsrc.state.apply import apply
from eventsrc.state.views import PodsView, Views

UIDS = ["a", "b", "c"]
refs = st.sampled_from([ev.PodRef(uid=u, namespace="ns", name=f"p-{u}") for u in UIDS])
quantities = st.sampled_from(["100m", "1", "250m", "2"])
specs = st.builds(
    ev.ContainerSpec,
    name=st.sampled_from(["init", "main", "side"]),
    kind=st.sampled_from(["init", "sidecar", "app"]),
    requests=st.dictionaries(st.sampled_from(["cpu", "memory"]), quantities, max_size=2),
    limits=st.just({}),
)
EVENTS = st.one_of(
    st.builds(ev.PodAdmissionStarted, pod=refs, containers=st.lists(specs, max_size=3)),
    st.builds(ev.PodAdmitted, pod=refs),
    st.builds(ev.AdmissionRejected, pod=refs, reason=st.just("r"), container=st.sampled_from(["", "main"])),
    st.builds(ev.ContainerAdmissionStarted, pod=refs, container=specs, finished=st.lists(st.just("init"), max_size=1)),
    st.builds(ev.ContainerAdmitted, pod=refs, container=st.just("main")),
    st.builds(ev.PodRemoved, pod_uid=st.sampled_from(UIDS)),
    st.builds(ev.PodQuarantined, pod=refs, corrupt_seqs=st.just([1])),
)


def from_scratch(views: Views, without: str) -> tuple[int, dict[str, int]]:
    """Every pod but ``without``, each counted anew."""
    total: dict[str, int] = {}
    others = 0
    for uid, pod in views.pods.pods.items():
        if uid == without:
            continue
        others += 1
        for name, n in pod_requests(pod.containers.values()).items():
            total[name] = total.get(name, 0) + n
    return others, total


_A = ev.PodRef(uid="a", namespace="ns", name="p-a")
_GROWN = [  # a pod admitted, counted, then grown by a container: counted again
    ev.PodAdmissionStarted(pod=_A, containers=[ev.ContainerSpec(name="main", requests={"cpu": "1"})]),
    ev.PodAdmitted(pod=_A),
    ev.ContainerAdmissionStarted(pod=_A, container=ev.ContainerSpec(name="side", requests={"cpu": "2"})),
]


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENTS, max_size=30), st.sampled_from(["", *UIDS]), st.integers(0, 30))
@example(_GROWN, "", 2)
@example([*_GROWN, ev.AdmissionRejected(pod=_A, reason="r", container="side")], "", 3)
@example([*_GROWN[:2], ev.PodRemoved(pod_uid="a")], "b", 2)
def test_the_kept_sums_are_the_sums_counted_from_scratch(events: list[ev.EventBase], without: str, asked: int) -> None:
    views = Views()
    for i, e in enumerate(events, 1):
        apply(views, Record(i, i, "c", e.VERSION, e))
        if i == asked:  # the index is built here and kept by the reducers from then on
            node_usage(views.pods, without)
    pods, used = node_usage(views.pods, without)
    want_pods, want_used = from_scratch(views, without)
    assert pods == want_pods
    assert {k: v for k, v in used.items() if v} == {k: v for k, v in want_used.items() if v}
    # and an index built now, from the views alone (as a snapshot has them), says the same
    fresh = msgspec.msgpack.decode(msgspec.msgpack.encode(views.pods), type=PodsView)
    again_pods, again_used = node_usage(fresh, without)
    assert (again_pods, {k: v for k, v in again_used.items() if v}) == (pods, {k: v for k, v in used.items() if v})
