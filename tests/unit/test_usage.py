"""The pure interval computation of ``eventsrc audit usage`` (``eventsrc.core.chargeback``):
exact totals against intervals built here, and the holds it tracks equal the views' holds
after any sequence of events (the views are the reference)."""

from __future__ import annotations

import io
import json
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventsrc import events as ev
from eventsrc.core.chargeback import (
    HIDING,
    Row,
    Tracker,
    Window,
    hours_text,
    intervals,
    merged,
    observe,
    seconds_text,
    totals,
    window,
)
from eventsrc.events import Record
from eventsrc.offline.usage import BYTES_NOTE, render, table_lines
from eventsrc.state.apply import apply_all
from eventsrc.state.views import Views

T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
S = 1_000_000_000
H = 3600 * S
GPU = "example.com/gpu"


def pod(uid: str, ns: str = "team-a", name: str = "") -> ev.PodRef:
    return ev.PodRef(uid=uid, namespace=ns, name=name or f"pod-{uid}")


def admitted(uid: str, ns: str = "team-a") -> ev.EventBase:
    return ev.PodAdmitted(pod=pod(uid, ns))


def alloc(uid: str, ids: list[str], container: str = "main", resource: str = GPU) -> ev.EventBase:
    return ev.DevicesAllocated(pod_uid=uid, container=container, resource=resource, device_ids=ids)


def release(uid: str, ids: list[str], container: str = "main", resource: str = GPU) -> ev.EventBase:
    return ev.DevicesReleased(pod_uid=uid, container=container, resource=resource, device_ids=ids)


def total(
    events: list[tuple[int, ev.EventBase]],
    by: str,
    since: int | None = None,
    until: int | None = None,
    now: int = T0 + 100 * H,
) -> list[Row]:
    return totals(intervals(events), by, window(since, until, now))


def test_a_released_device_counts_its_exact_interval() -> None:
    log = [
        (T0, admitted("a")),
        (T0 + S, alloc("a", ["gpu-0", "gpu-1"])),
        (T0 + S + H + 7, release("a", ["gpu-0", "gpu-1"])),
    ]
    assert total(log, "namespace") == [Row(("team-a", GPU), 2 * (H + 7))]
    assert total(log, "device") == [Row((GPU, "gpu-0"), H + 7), Row((GPU, "gpu-1"), H + 7)]
    assert total(log, "pod") == [Row(("team-a", "pod-a", "a", GPU), 2 * (H + 7))]
    assert total(log, "resource") == [Row((GPU,), 2 * (H + 7))]
    assert seconds_text(H + 7) == "3600.000000007" and hours_text(H + 7) == "1.000000"


def test_an_open_hold_counts_to_until_or_now_and_the_window_clips_both_ends() -> None:
    log = [
        (T0, admitted("a")),
        (T0, alloc("a", ["gpu-0"])),
        (T0 + 10 * H, release("a", ["gpu-0"])),
        (T0 + H, admitted("b")),
        (T0 + H, alloc("b", ["gpu-1"])),
    ]
    # gpu-0 [T0, T0+10h] clipped to [T0+2h, T0+5h]: 3 h; gpu-1 open from T0+1h: 3 h
    assert total(log, "device", T0 + 2 * H, T0 + 5 * H) == [Row((GPU, "gpu-0"), 3 * H), Row((GPU, "gpu-1"), 3 * H)]
    # no --until: the open one counts to now; an --until later than now counts to now too
    assert total(log, "device", None, None, now=T0 + 20 * H) == [
        Row((GPU, "gpu-0"), 10 * H),
        Row((GPU, "gpu-1"), 19 * H),
    ]
    assert total(log, "device", None, T0 + 99 * H, now=T0 + 20 * H)[1] == Row((GPU, "gpu-1"), 19 * H)
    # a window before anything, and one of no length
    assert total(log, "device", T0 - 5 * H, T0 - H) == []
    assert total(log, "device", T0 + H, T0 + H) == []


def test_a_device_moved_from_pod_a_to_pod_b() -> None:
    log = [
        (T0, admitted("a", "ns-a")),
        (T0, alloc("a", ["gpu-0"])),
        (T0 + H, release("a", ["gpu-0"])),
        (T0 + H, admitted("b", "ns-b")),
        (T0 + 2 * H, alloc("b", ["gpu-0"])),
        # handed on without a release (an init container's next container): c takes it from b
        (T0 + 3 * H, alloc("b", ["gpu-0"], container="next")),
        (T0 + 5 * H, release("b", ["gpu-0"], container="main")),  # b/main no longer holds it: nothing ends
        (T0 + 6 * H, release("b", ["gpu-0"], container="next")),
    ]
    assert total(log, "namespace") == [Row(("ns-a", GPU), H), Row(("ns-b", GPU), 4 * H)]
    assert total(log, "device") == [Row((GPU, "gpu-0"), 5 * H)]


def test_reservation_is_not_charged_and_removal_ends_nothing_the_views_keep() -> None:
    log = [
        (T0, admitted("a")),
        (T0, ev.DevicesReserved(pod_uid="a", container="main", resource=GPU, device_ids=["gpu-0", "gpu-1"])),
        (T0 + H, ev.AllocationFailed(pod_uid="a", container="main", resource=GPU, device_ids=["gpu-1"], reason="x")),
        (T0 + H, alloc("a", ["gpu-0"])),
        (T0 + 2 * H, ev.PodRemoved(pod_uid="a")),  # no release recorded: the views still hold it
        (T0 + 3 * H, ev.PodQuarantined(pod=pod("a"), corrupt_seqs=[9])),
    ]
    assert total(log, "device", until=T0 + 4 * H) == [Row((GPU, "gpu-0"), 3 * H)]


def test_cpu_sets_that_change() -> None:
    log = [
        (T0, admitted("a")),
        (T0, ev.CPUsAssigned(pod_uid="a", container="main", cpus=[0, 1])),
        (T0 + H, ev.CPUsAssigned(pod_uid="a", container="main", cpus=[1, 2, 2])),
        (T0 + 2 * H, ev.CPUsReleased(pod_uid="a", container="main", cpus=[1, 2])),
    ]
    assert total(log, "device") == [Row(("cpu", "0"), H), Row(("cpu", "1"), 2 * H), Row(("cpu", "2"), H)]
    assert total(log, "namespace") == [Row(("team-a", "cpu"), 4 * H)]


def test_observed_beside_a_kubelet() -> None:
    p = ev.PodRef(uid="", namespace="ml", name="train")
    claim = ev.ClaimRef(uid="c1", namespace="ml", name="gpus")
    d0 = ev.ObservedClaimDevice(driver="gpu.dra", pool="node-a", device="gpu-0")
    d1 = ev.ObservedClaimDevice(driver="gpu.dra", pool="node-a", device="gpu-1")
    log = [
        (T0, ev.KubeletDevicesObserved(pod=p, container="c", resource=GPU, device_ids=["g0", "g1"])),
        (T0 + H, ev.KubeletDevicesObserved(pod=p, container="c", resource=GPU, device_ids=["g1", "g2"])),
        (T0 + 2 * H, ev.KubeletDevicesReleased(pod=p, container="c", resource=GPU, device_ids=["g0", "gX"])),
        (T0, ev.KubeletCPUsObserved(pod=p, container="c", cpus=[4, 5])),
        (T0 + H, ev.KubeletCPUsObserved(pod=p, container="c", cpus=[5, 6])),
        (T0 + 2 * H, ev.KubeletCPUsReleased(pod=p, container="c", cpus=[6])),
        (T0, ev.KubeletClaimObserved(pod=p, container="c", claim=claim, devices=[d0])),
        (T0 + H, ev.KubeletClaimObserved(pod=p, container="c", claim=claim, devices=[d0, d1])),
        (T0 + 2 * H, ev.KubeletClaimReleased(pod=p, container="c", claim=claim)),
        (T0 + 3 * H, ev.KubeletPodReleased(pod=p)),  # ends g1, g2 and cpu 5
        (T0 + 4 * H, ev.KubeletDevicesReleased(pod=p, container="c", resource=GPU, device_ids=["g1"])),  # gone: nothing
    ]
    assert total(log, "device") == [
        Row(("cpu", "4"), H),
        Row(("cpu", "5"), 3 * H),
        Row(("cpu", "6"), H),
        Row((GPU, "g0"), 2 * H),
        Row((GPU, "g1"), 3 * H),
        Row((GPU, "g2"), 2 * H),
        Row(("gpu.dra", "node-a/gpu-0"), 2 * H),
        Row(("gpu.dra", "node-a/gpu-1"), H),
    ]
    assert total(log, "pod", until=T0 + 10 * H) == [
        Row(("ml", "train", "", "cpu"), 5 * H),
        Row(("ml", "train", "", GPU), 7 * H),
        Row(("ml", "train", "", "gpu.dra"), 3 * H),
    ]


def test_memory_and_hugepages_are_charged_in_byte_hours() -> None:
    """Issue 35 item 9: a container's memory blocks as the kubelet lists them, charged by their
    bytes: 1 GiB on NUMA node 0 for an hour is 2^30 byte-hours; a block that shrinks ends and a
    smaller one starts; the pod's release ends them all. The rows say they are byte-seconds."""
    p = ev.PodRef(uid="u1", namespace="ml", name="train")

    def blocks(*mem: tuple[str, int, list[int]]) -> ev.KubeletMemoryObserved:
        memory = [ev.ObservedMemory(memory_type=t, size=n, numa_nodes=numa) for t, n, numa in mem]
        return ev.KubeletMemoryObserved(pod=p, container="c", memory=memory)

    gib, huge = 1 << 30, 2 << 20
    log = [
        (T0, blocks(("memory", gib, [0]), ("hugepages-2Mi", 4 * huge, [0]))),
        (T0 + H, blocks(("memory", gib // 2, [0]), ("hugepages-2Mi", 4 * huge, [0]))),  # memory shrank
        (T0 + 3 * H, ev.KubeletPodReleased(pod=p)),
    ]
    assert total(log, "device") == [Row(("hugepages-2Mi", "0"), 3 * 4 * huge * H), Row(("memory", "0"), 2 * gib * H)]
    assert total(log, "pod") == [
        Row(("ml", "train", "u1", "hugepages-2Mi"), 12 * huge * H),
        Row(("ml", "train", "u1", "memory"), 2 * gib * H),
    ]
    out = io.StringIO()
    render(total(log, "resource"), "resource", Window(T0, T0 + 3 * H), "json", out)
    rows = json.loads(out.getvalue(), parse_float=Decimal)
    assert [(r["resource"], r["hours"], r["measure"]) for r in rows] == [
        ("hugepages-2Mi", Decimal(12 * huge), "byte-seconds"),
        ("memory", Decimal(2 * gib), "byte-seconds"),
    ]
    table = "\n".join(table_lines(total(log, "resource"), "resource", Window(T0, T0 + 3 * H)))
    assert BYTES_NOTE in table


def test_the_memory_managers_own_blocks_are_charged_in_byte_hours() -> None:
    """Issue 38 item 7: eventsrc's own memory decisions: a block from its MemoryAssigned until
    a set without it (an init container's block shrunk as the app container reuses it) or its
    MemoryReleased, charged by its bytes to the pod its admission names."""
    p = ev.PodRef(uid="u1", namespace="ml", name="train")
    gib, huge = 1 << 30, 2 << 20

    def assigned(container: str, *blocks: tuple[str, int, list[int]]) -> ev.MemoryAssigned:
        mem = [ev.MemoryBlock(type=t, size=n, numa_affinity=numa) for t, n, numa in blocks]
        return ev.MemoryAssigned(pod_uid="u1", container=container, blocks=mem)

    log = [
        (T0, ev.PodAdmissionStarted(pod=p, containers=[])),
        (T0, assigned("init", ("memory", 2 * gib, [0, 1]))),
        (T0 + H, assigned("app", ("memory", gib, [0, 1]), ("hugepages-2Mi", 4 * huge, [0, 1]))),
        (T0 + H, assigned("init", ("memory", gib, [0, 1]))),  # shrunk: the app container reuses 1Gi
        (T0 + 2 * H, ev.MemoryReleased(pod_uid="u1", container="init")),
        (T0 + 3 * H, ev.MemoryReleased(pod_uid="u1", container="app")),
        (T0 + 3 * H, ev.PodRemoved(pod_uid="u1")),
    ]
    assert total(log, "device") == [
        Row(("hugepages-2Mi", "0,1"), 2 * 4 * huge * H),
        Row(("memory", "0,1"), (2 + 1 + 2) * gib * H),  # init 2Gi 1h then 1Gi 1h; app 1Gi 2h
    ]
    assert total(log, "pod") == [
        Row(("ml", "train", "u1", "hugepages-2Mi"), 8 * huge * H),
        Row(("ml", "train", "u1", "memory"), 5 * gib * H),
    ]


def test_a_pod_first_seen_without_its_uid_is_one_row_once_the_uid_is_learned() -> None:
    """Issue 35: listed before its uid was known (no device, no NRI), then with it: one row,
    from the first hold's start, not one row with uid "" and one with the uid."""
    nameless = ev.PodRef(uid="", namespace="ml", name="train")
    named = ev.PodRef(uid="u1", namespace="ml", name="train")
    log = [
        (T0, ev.KubeletPodObserved(pod=nameless)),
        (T0, ev.KubeletCPUsObserved(pod=nameless, container="c", cpus=[1])),
        (T0, ev.KubeletDevicesObserved(pod=nameless, container="c", resource=GPU, device_ids=["g0"])),
        (T0 + H, ev.KubeletPodObserved(pod=named)),
        (T0 + 2 * H, ev.KubeletCPUsObserved(pod=named, container="c", cpus=[1, 2])),
        (T0 + 3 * H, ev.KubeletPodReleased(pod=named)),
    ]
    assert total(log, "pod") == [Row(("ml", "train", "u1", "cpu"), 4 * H), Row(("ml", "train", "u1", GPU), 3 * H)]
    tracker = Tracker()
    for ts, e in log[:3]:
        tracker.feed(ts, e)
    assert tracker.feed(*log[3]) == [] and [(a.uid, b.uid, b.start_ns) for a, b in tracker.rebound] == [
        ("", "u1", T0),
        ("", "u1", T0),
    ]


def test_a_clock_stepped_back_makes_a_hold_of_no_length() -> None:
    log = [(T0, admitted("a")), (T0, alloc("a", ["gpu-0"])), (T0 - H, release("a", ["gpu-0"]))]
    assert total(log, "device") == []


def test_resource_filter_and_hours() -> None:
    log = [
        (T0, admitted("a")),
        (T0, alloc("a", ["gpu-0"])),
        (T0, ev.CPUsAssigned(pod_uid="a", container="main", cpus=[3])),
    ]
    w = window(T0, T0 + 5400 * S, T0 + 100 * H)
    assert totals(intervals(log), "resource", w, frozenset({"cpu"})) == [Row(("cpu",), 5400 * S)]
    assert (
        hours_text(5400 * S) == "1.500000"
        and hours_text(1_799_999) == "0.000000"
        and hours_text(1_800_000) == "0.000001"
    )


# --------------------------------------------------------------------------- the views are the reference

UIDS = ["a", "b"]
IDS = ["d0", "d1", "d2"]
CONTAINERS = ["m", "n"]
OBSERVED = [
    ev.PodRef(uid="", namespace="ns", name="p"),
    ev.PodRef(uid="u9", namespace="ns", name="p"),
    ev.PodRef(uid="", namespace="ns", name="q"),
]
CLAIMS = [ev.ClaimRef(uid="c", namespace="ns", name="c1"), ev.ClaimRef(uid="c", namespace="ns", name="c2")]
ids = st.lists(st.sampled_from(IDS), max_size=3)
cpus = st.lists(st.integers(0, 3), max_size=3)
claim_devices = st.lists(
    st.builds(
        ev.ObservedClaimDevice, driver=st.sampled_from(["dra1", "dra2"]), pool=st.just("p"), device=st.sampled_from(IDS)
    ),
    max_size=3,
)
own = dict(pod_uid=st.sampled_from(UIDS), container=st.sampled_from(CONTAINERS))
kubelet = dict(pod=st.sampled_from(OBSERVED), container=st.sampled_from(CONTAINERS))
EVENTS = st.one_of(
    st.builds(ev.PodAdmissionStarted, pod=st.sampled_from([pod(u) for u in UIDS])),
    st.builds(ev.PodAdmitted, pod=st.sampled_from([pod(u) for u in UIDS])),
    st.builds(ev.AdmissionRejected, pod=st.sampled_from([pod(u) for u in UIDS]), reason=st.just("r")),
    st.builds(ev.PodRemoved, pod_uid=st.sampled_from(UIDS)),
    st.builds(ev.PodQuarantined, pod=st.sampled_from([pod(u) for u in UIDS]), corrupt_seqs=st.just([1])),
    st.builds(ev.DevicesReserved, resource=st.just(GPU), device_ids=ids, **own),
    st.builds(ev.DevicesAllocated, resource=st.just(GPU), device_ids=ids, **own),
    st.builds(ev.DevicesReleased, resource=st.just(GPU), device_ids=ids, **own),
    st.builds(ev.AllocationFailed, resource=st.just(GPU), device_ids=ids, reason=st.just("x"), **own),
    st.builds(ev.DevicesRemoved, resource=st.just(GPU), device_ids=ids),
    st.builds(ev.CPUsAssigned, cpus=cpus, **own),
    st.builds(ev.CPUsReleased, cpus=cpus, **own),
    st.builds(ev.KubeletPodObserved, pod=st.sampled_from(OBSERVED)),
    st.builds(ev.KubeletPodReleased, pod=st.sampled_from(OBSERVED)),
    st.builds(ev.KubeletDevicesObserved, resource=st.just(GPU), device_ids=ids, **kubelet),
    st.builds(ev.KubeletDevicesReleased, resource=st.just(GPU), device_ids=ids, **kubelet),
    st.builds(ev.KubeletCPUsObserved, cpus=cpus, **kubelet),
    st.builds(ev.KubeletCPUsReleased, cpus=cpus, **kubelet),
    st.builds(ev.KubeletClaimObserved, claim=st.sampled_from(CLAIMS), devices=claim_devices, **kubelet),
    st.builds(ev.KubeletClaimReleased, claim=st.sampled_from(CLAIMS), **kubelet),
    st.builds(
        ev.KubeletMemoryObserved,
        memory=st.lists(
            st.builds(
                ev.ObservedMemory,
                memory_type=st.sampled_from(["memory", "hugepages-2Mi"]),
                size=st.sampled_from([0, 1, 3 << 30]),
                numa_nodes=st.sampled_from([[], [0], [1, 0]]),
            ),
            max_size=3,
        ),
        **kubelet,
    ),
    st.builds(
        ev.MemoryAssigned,
        blocks=st.lists(
            st.builds(
                ev.MemoryBlock,
                type=st.sampled_from(["memory", "hugepages-2Mi"]),
                size=st.sampled_from([0, 1, 3 << 30]),
                numa_affinity=st.sampled_from([[0], [1, 0]]),
            ),
            max_size=3,
        ),
        **own,
    ),
    st.builds(ev.MemoryReleased, **own),
)


def views_holds(v: Views) -> set[tuple[str, str, str]]:
    """(holder, resource, device) of every hold the views say is charged."""
    out = set()
    for resource, table in v.devices.devices.items():
        for i, d in table.items():
            if d.hold == "allocated":
                out.add((d.holder.partition("/")[0], resource, i))
    for uid, containers in v.cpus.assignments.items():
        out |= {(uid, "cpu", str(c)) for cs in containers.values() for c in cs}
    for uid, held in v.memory.assignments.items():
        out |= {
            (uid, b.type, ",".join(map(str, sorted(b.numa_affinity)))) for bs in held.values() for b in bs if b.size
        }
    for key, p in v.kubelet.pods.items():
        for c in p.containers.values():
            out |= {(key, r, i) for r, devices in c.devices.items() for i in devices}
            out |= {(key, "cpu", str(cpu)) for cpu in c.cpus}
            out |= {(key, d.driver, f"{d.pool}/{d.device}") for ds in c.claims.values() for d in ds}
            out |= {(key, m.memory_type, ",".join(map(str, sorted(m.numa_nodes))) or "-") for m in c.memory if m.size}
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(EVENTS, max_size=40))
def test_the_open_holds_are_the_views_holds(events: list[ev.EventBase]) -> None:
    tracker = Tracker()
    for i, e in enumerate(events):
        tracker.feed(T0 + i * S, e)
    views = apply_all(Views(), (Record(i + 1, T0 + i * S, "c", e.VERSION, e) for i, e in enumerate(events)))  # type: ignore[arg-type]
    # observed pods are all in namespace "ns", keyed by namespace/name; own pods by uid
    got = {(f"ns/{h.name}" if h.namespace == "ns" else h.uid, h.resource, h.device) for h in tracker.open_holds()}
    assert got == views_holds(views)
    # an observed pod's open holds carry its uid as the views know it (learned since, too)
    assert {(h.name, h.uid) for h in tracker.open_holds() if h.namespace == "ns"} <= {
        (p.name, p.uid) for p in views.kubelet.pods.values()
    }


# --------------------------------------------------------------------------- what was not seen


def gap(source: str, since: int, until: int = 0) -> ev.EventBase:
    return ev.ObservationGapFound(source=source, since_ns=since, until_ns=until)


def seen_totals(events: list[tuple[int, ev.EventBase]], by: str, w: Window) -> list[Row]:
    holds, blind = observe(events)
    return totals(holds, by, w, gaps=merged(blind.listed(), w))


def test_the_seconds_eventsrc_was_killed_are_in_a_gap_not_seen() -> None:
    """Issue 35: eventsrc SIGKILLed 10 s into a pod's hold, the pod removed 2 s later, eventsrc
    back 25 s after that: its start records the gap from its last record, then the release."""
    seen = ev.PodRef(uid="u1", namespace="ml", name="train")
    log = [
        (T0, ev.KubeletDevicesObserved(pod=seen, container="c", resource=GPU, device_ids=["Dev-1"])),
        (T0 + 10 * S, ev.KubeletPodObserved(pod=seen)),  # its last record before the kill
        (T0 + 37 * S, gap("eventsrc", T0 + 10 * S, T0 + 37 * S)),
        (T0 + 38 * S, ev.KubeletPodReleased(pod=seen)),
    ]
    w = window(None, None, T0 + H)
    assert seen_totals(log, "pod", w) == [Row(("ml", "train", "u1", GPU), 38 * S, 27 * S)]
    assert seen_totals(log, "device", w) == [Row((GPU, "Dev-1"), 38 * S, 27 * S)]
    # a window that ends inside the gap: only its part of the gap
    assert seen_totals(log, "namespace", window(T0 + 5 * S, T0 + 20 * S, T0 + H)) == [Row(("ml", GPU), 15 * S, 10 * S)]


def test_gaps_of_every_source_count_once_an_open_one_runs_to_the_window_and_allocatable_hides_nothing() -> None:
    log = [
        (T0, admitted("a")),
        (T0, alloc("a", ["gpu-0"])),
        (T0 + H, gap("kubelet", T0 + H, T0 + 3 * H)),
        (T0 + H, gap("runtime", T0 + 2 * H, T0 + 4 * H)),  # overlaps the kubelet's: counted once
        (T0 + 5 * H, gap("kubelet allocatable", T0 + 5 * H)),  # says nothing of holds
        (T0 + 6 * H, gap("eventsrc", T0 + 6 * H)),  # still open (as a test plants it)
    ]
    w = window(None, T0 + 8 * H, T0 + 10 * H)
    assert seen_totals(log, "device", w) == [Row((GPU, "gpu-0"), 8 * H, 3 * H + 2 * H)]
    # a gap opened and closed by a later record with the same source and since_ns
    closed = [*log[:2], (T0 + H, gap("kubelet", T0 + H)), (T0 + 2 * H, gap("kubelet", T0 + H, T0 + 2 * H))]
    assert seen_totals(closed, "resource", w) == [Row((GPU,), 8 * H, H)]


@given(
    st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60), st.sampled_from(sorted(HIDING))), max_size=6),
    st.integers(0, 60),
    st.integers(0, 60),
    st.integers(0, 60),
    st.integers(0, 60),
)
def test_gaps_covered_is_the_count_of_nanoseconds_inside_any_gap(
    spans: list[tuple[int, int, str]], lo: int, hi: int, since: int, until: int
) -> None:
    w = Window(since, until)
    gaps = merged([(src, a, b) for a, b, src in spans], w)
    inside = {t for a, b, _ in spans for t in range(max(a, since), min(b or until, until))}
    assert gaps.covered(lo, hi) == len([t for t in range(lo, hi) if t in inside])
