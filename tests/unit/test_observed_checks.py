"""Facts observed beside a kubelet under ``replay --check`` and in the metrics.

(a) Observed events mixed into a log of eventsrc's own decisions make no rule misfire, and
    leave eventsrc's own views as they were (hypothesis, over every observed event type).
(b) ``kubelet-device-in-two-pods``, ``kubelet-cpu-in-two-pods``: a device or exclusive CPU the
    kubelet gave containers of two pods at once is a finding about the kubelet, apart from the
    invariants eventsrc keeps; two containers of one pod, or a pod after the other let go, are not.
    The observer records the same finding (``double_allocations``) when it sees it.
(c) ``eventsrc_device_allocation_info``: one series per device held now, from eventsrc's
    grants and the kubelet's (DRA devices as driver and pool/device); gone when released.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventsrc import events as ev
from eventsrc.core.invariants import FINDINGS, RULES, Checker
from eventsrc.core.kubelet_observations import double_allocations
from eventsrc.obs.metrics import Metrics, device_allocations
from eventsrc.state.apply import apply
from eventsrc.state.views import Views
from tests.unit.test_projections import STRATEGIES

RES = "example.com/dev"
SPEC = [ev.ContainerSpec(name="main", requests={RES: "1", "cpu": "1"}, limits={RES: "1", "cpu": "1"})]
A = ev.PodRef(uid="uid-a", namespace="default", name="a")

#: eventsrc's own decisions: a pod admitted with a device and a CPU, then removed
OWN: list[tuple[str, ev.EventBase]] = [
    ("boot", ev.DaemonStarted(boot_id="b", version="0.1.0", instance_id="i")),
    ("boot", ev.PluginRegistered(resource=RES, endpoint="dev.sock")),
    ("boot", ev.DevicesAdded(resource=RES, devices=[ev.DeviceInfo(id="dev-0", health="Healthy")])),
    ("adm", ev.PodAdmissionStarted(pod=A, containers=SPEC)),
    ("adm", ev.DevicesReserved(pod_uid="uid-a", container="main", resource=RES, device_ids=["dev-0"])),
    ("adm", ev.DevicesAllocated(pod_uid="uid-a", container="main", resource=RES, device_ids=["dev-0"])),
    ("adm", ev.CPUsAssigned(pod_uid="uid-a", container="main", cpus=[1])),
    ("adm", ev.PodAdmitted(pod=A, containers=SPEC, qos_class="Guaranteed")),
    ("rm", ev.DevicesReleased(pod_uid="uid-a", container="main", resource=RES, device_ids=["dev-0"])),
    ("rm", ev.CPUsReleased(pod_uid="uid-a", container="main", cpus=[1])),
    ("rm", ev.PodRemoved(pod_uid="uid-a", reason="deleted")),
]
OBSERVED_TYPES = [t for t in STRATEGIES if t.__name__.startswith("Kubelet") or t is ev.ObservationGapFound]
observed = st.one_of(*(STRATEGIES[t] for t in OBSERVED_TYPES))


def records(items: list[tuple[str, ev.EventBase]]) -> list[ev.Record]:
    return [ev.Record(seq=i, ts_ns=i, correlation_id=cid, version=1, event=e) for i, (cid, e) in enumerate(items, 1)]


def check(items: list[tuple[str, ev.EventBase]]) -> tuple[list[str], Views]:
    checker = Checker()
    found = [v.rule for r in records(items) for v in checker.feed(r)] + [v.rule for v in checker.finish()]
    return found, checker.views


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(OWN)), observed), max_size=25))
def test_observed_events_make_no_rule_misfire(mixed: list[tuple[int, ev.EventBase]]) -> None:
    items = list(OWN)
    for at, e in sorted(mixed, key=lambda x: -x[0]):  # each observed event in a run of its own
        items.insert(at, (f"obs-{len(items)}", e))
    found, views = check(items)
    assert set(found) <= set(FINDINGS), found
    assert own_state(views) == own_state(check(OWN)[1])


def own_state(v: Views) -> object:
    """eventsrc's own views, less the sequences (observed records moved them)."""
    devices = {r: {i: (d.holder, d.hold, d.health) for i, d in ds.items()} for r, ds in v.devices.devices.items()}
    pods = {uid: (p.state, {n: c.devices for n, c in p.containers.items()}) for uid, p in v.pods.pods.items()}
    return devices, pods, v.cpus.assignments, v.cpus.shared, sorted(v.claims.claims)


def seen(pod: str, container: str, ids: list[str]) -> ev.KubeletDevicesObserved:
    ref = ev.PodRef(uid="", namespace="default", name=pod)
    return ev.KubeletDevicesObserved(pod=ref, container=container, resource=RES, device_ids=ids)


def released(pod: str, container: str, ids: list[str]) -> ev.KubeletDevicesReleased:
    ref = ev.PodRef(uid="", namespace="default", name=pod)
    return ev.KubeletDevicesReleased(pod=ref, container=container, resource=RES, device_ids=ids)


def test_a_device_the_kubelet_gave_two_pods_is_its_own_finding() -> None:
    cases: list[tuple[list[tuple[str, ev.EventBase]], list[str]]] = [
        ([("1", seen("a", "main", ["dev-0"])), ("2", seen("b", "main", ["dev-0"]))], ["kubelet-device-in-two-pods"]),
        # init container's devices handed on within one pod: not a finding
        ([("1", seen("a", "init", ["dev-0"])), ("2", seen("a", "main", ["dev-0"]))], []),
        # released first: not a finding, even when both are in one run
        (
            [
                ("1", seen("a", "main", ["dev-0"])),
                ("2", released("a", "main", ["dev-0"])),
                ("3", seen("b", "m", ["dev-0"])),
            ],
            [],
        ),
        (
            [
                ("1", seen("a", "main", ["dev-0"])),
                ("2", seen("b", "main", ["dev-0"])),
                ("2", released("a", "main", ["dev-0"])),
            ],
            [],
        ),
        ([("1", seen("a", "main", ["dev-0"])), ("2", seen("b", "main", ["dev-1"]))], []),
    ]
    for items, want in cases:
        assert check(items)[0] == want, items


def cpus(pod: str, container: str, held: list[int]) -> ev.KubeletCPUsObserved:
    return ev.KubeletCPUsObserved(pod=ev.PodRef(uid="", namespace="default", name=pod), container=container, cpus=held)


def test_exclusive_cpus_the_kubelet_gave_two_pods_are_a_finding_too() -> None:
    two = [("1", cpus("a", "main", [2, 3])), ("2", cpus("b", "main", [3, 4]))]
    assert check(two)[0] == ["kubelet-cpu-in-two-pods"]
    # one pod's containers (an init container hands its CPUs on), or CPUs let go first: nothing
    assert check([("1", cpus("a", "init", [3])), ("2", cpus("a", "main", [3]))])[0] == []
    released = ev.KubeletCPUsReleased(pod=ev.PodRef(uid="", namespace="default", name="a"), container="main", cpus=[3])
    assert check([("1", cpus("a", "main", [3])), ("2", released), ("3", cpus("b", "main", [3]))])[0] == []
    # the shared pool, as a kubelet before GetExclusiveCPUs listed it for every container: not exclusive
    pool = ev.KubeletSharedPoolObserved(cpus=[0, 1], policy="static")
    assert check([("0", pool), ("1", cpus("a", "main", [0, 1])), ("2", cpus("b", "main", [0, 1]))])[0] == []


def test_the_kubelets_findings_are_apart_from_the_invariants_eventsrc_keeps() -> None:
    assert set(FINDINGS) == {"kubelet-device-in-two-pods", "kubelet-cpu-in-two-pods"}
    assert not set(FINDINGS) & set(RULES)
    checker = Checker()
    found = [
        v
        for r in records([("1", seen("a", "main", ["dev-0"])), ("2", seen("b", "main", ["dev-0"]))])
        for v in checker.feed(r)
    ] + checker.finish()
    assert [(v.rule, v.finding) for v in found] == [("kubelet-device-in-two-pods", True)]
    # eventsrc's own double grant (its own admission mode) stays an invariant broken
    B = ev.PodRef(uid="uid-b", namespace="default", name="b")
    own = OWN[:8] + [
        ("adm-b", ev.PodAdmissionStarted(pod=B, containers=SPEC)),
        ("adm-b", ev.DevicesReserved(pod_uid="uid-b", container="main", resource=RES, device_ids=["dev-0"])),
    ]
    checker = Checker()
    broken = [v for r in records(own) for v in checker.feed(r)]
    assert broken and broken[0].rule == "device-double-held" and not broken[0].finding


def test_the_observer_records_what_it_sees_given_twice_once() -> None:
    """``double_allocations``: the findings the shell records after the observed events it
    recorded, one per resource and set of holders, and only for what those events name."""
    views = Views()
    first = [seen("a", "main", ["dev-0", "dev-1"]), cpus("a", "main", [3])]
    second = [seen("b", "main", ["dev-0", "dev-1"]), cpus("b", "side", [3, 5]), seen("c", "main", ["dev-9"])]
    for i, e in enumerate(first, 1):
        apply(views, ev.Record(seq=i, ts_ns=i, correlation_id="1", version=1, event=e))
    assert double_allocations(views.kubelet, first) == []
    for i, e in enumerate(second, 10):
        apply(views, ev.Record(seq=i, ts_ns=i, correlation_id="2", version=1, event=e))
    assert double_allocations(views.kubelet, second) == [
        ev.KubeletDoubleAllocationFound(resource="cpu", ids=["3"], holders=["default/a/main", "default/b/side"]),
        ev.KubeletDoubleAllocationFound(
            resource=RES, ids=["dev-0", "dev-1"], holders=["default/a/main", "default/b/main"]
        ),
    ]
    # nothing new observed: nothing said again
    assert double_allocations(views.kubelet, []) == []


def test_device_allocation_series_from_both_kinds_of_views() -> None:
    views = Views()
    for r in records(OWN[:8]):
        apply(views, r)
    web = ev.PodRef(uid="", namespace="shop", name="web")
    gpu = ev.ObservedClaimDevice(driver="gpu.example.com", pool="node-a", device="gpu-0")
    claim = ev.ClaimRef(uid="c1", namespace="shop", name="gpu")
    observed: list[ev.EventBase] = [
        ev.KubeletDevicesObserved(pod=web, container="app", resource=RES, device_ids=["dev-7"]),
        ev.KubeletClaimObserved(pod=web, container="app", claim=claim, devices=[gpu]),
    ]
    for i, e in enumerate(observed, 100):
        apply(views, ev.Record(seq=i, ts_ns=i, correlation_id="o", version=1, event=e))
    want = {
        (RES, "dev-0", "default", "a", "main"),
        (RES, "dev-7", "shop", "web", "app"),
        ("gpu.example.com", "node-a/gpu-0", "shop", "web", "app"),
    }
    assert set(device_allocations(views)) == want
    text = Metrics(views=lambda: views).exposition().decode()
    assert (
        'eventsrc_device_allocation_info{resource="example.com/dev",device="dev-7",namespace="shop",pod="web",'
        'container="app"} 1' in text
    )
    for i, r in enumerate(records(OWN[8:]), 200):  # eventsrc's pod removed, the kubelet's released
        apply(views, ev.Record(seq=i, ts_ns=i, correlation_id="rm", version=1, event=r.event))
    apply(views, ev.Record(seq=300, ts_ns=300, correlation_id="k", version=1, event=ev.KubeletPodReleased(pod=web)))
    assert list(device_allocations(views)) == []
    assert 'device="dev-7"' not in Metrics(views=lambda: views).exposition().decode()
