"""Facts observed beside a kubelet under ``replay --check`` and in the metrics.

(a) Observed events mixed into a log of eventsrc's own decisions make no rule misfire, and
    leave eventsrc's own views as they were (hypothesis, over every observed event type).
(b) ``kubelet-device-in-two-pods``: a device the kubelet gave containers of two pods at once
    is its own finding; two containers of one pod, or a pod after the other let go, are not.
(c) ``eventsrc_device_allocation_info``: one series per device held now, from eventsrc's
    grants and the kubelet's (DRA devices as driver and pool/device); gone when released.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventsrc import events as ev
from eventsrc.core.invariants import Checker
from eventsrc.obs.metrics import Metrics, device_allocations
from eventsrc.state.apply import apply
from eventsrc.state.views import Views
from tests.unit.test_projections import STRATEGIES

RES = "example.com/dev"
SPEC = [ev.ContainerSpec(name="main", requests={RES: "1", "cpu": "1"}, limits={RES: "1", "cpu": "1"})]
A = ev.PodRef(uid="uid-a", namespace="default", name="a")

#: eventsrc's own decisions: a pod admitted with a device and a CPU, then removed
OWN: list[tuple[str, ev._Event]] = [
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


def records(items: list[tuple[str, ev._Event]]) -> list[ev.Record]:
    return [ev.Record(seq=i, ts_ns=i, correlation_id=cid, version=1, event=e) for i, (cid, e) in enumerate(items, 1)]


def check(items: list[tuple[str, ev._Event]]) -> tuple[list[str], Views]:
    checker = Checker()
    found = [v.rule for r in records(items) for v in checker.feed(r)] + [v.rule for v in checker.finish()]
    return found, checker.views


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(OWN)), observed), max_size=25))
def test_observed_events_make_no_rule_misfire(mixed: list[tuple[int, ev._Event]]) -> None:
    items = list(OWN)
    for at, e in sorted(mixed, key=lambda x: -x[0]):  # each observed event in a run of its own
        items.insert(at, (f"obs-{len(items)}", e))
    found, views = check(items)
    assert set(found) <= {"kubelet-device-in-two-pods"}, found
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
    cases: list[tuple[list[tuple[str, ev._Event]], list[str]]] = [
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


def test_device_allocation_series_from_both_kinds_of_views() -> None:
    views = Views()
    for r in records(OWN[:8]):
        apply(views, r)
    web = ev.PodRef(uid="", namespace="shop", name="web")
    gpu = ev.ObservedClaimDevice(driver="gpu.example.com", pool="node-a", device="gpu-0")
    claim = ev.ClaimRef(uid="c1", namespace="shop", name="gpu")
    observed: list[ev._Event] = [
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
