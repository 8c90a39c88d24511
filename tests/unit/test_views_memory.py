"""At 10,000 pods the views keep one copy of what repeats from pod to pod (issue 15): a
decoded pod is keyed by its own uid, a container's equal requests and limits are one dict,
shared with every container that asks for the same,
a plugin's mounts are shared, and the device index names a pod by its PodView's uid and
keeps each NUMA set once. None of it changes what the views encode to."""

from __future__ import annotations

import gc

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventsrc import events as ev
from eventsrc.state import devices as device_state
from eventsrc.state.apply import rebuild
from eventsrc.state.views import Views
from tests.unit.test_projections import as_records, events

RESOURCE = "example.com/gpu"


def _pod_events(n: int) -> list[ev.EventBase]:
    evs: list[ev.EventBase] = [
        ev.DevicesAdded(
            resource=RESOURCE, devices=[ev.DeviceInfo(id=f"d{i}", health="Healthy", numa_nodes=[0]) for i in range(n)]
        )
    ]
    for i in range(n):
        pod = ev.PodRef(uid=f"uid-{i}", namespace="bench", name=f"p{i}")
        spec = ev.ContainerSpec(name="main", requests={RESOURCE: "1"}, limits={RESOURCE: "1"})
        response = ev.ContainerAllocation(
            envs={"DEVICES": f"d{i}"},
            mounts=[ev.Mount(container_path="/var/run/sample", host_path="/run/sample", read_only=True)],
            devices=[ev.DeviceSpec(container_path=f"/dev/d{i}", host_path="/dev/null", permissions="rw")],
        )
        evs += [
            ev.PodAdmissionStarted(pod=pod, containers=[spec]),
            ev.DevicesAllocated(
                pod_uid=pod.uid, container="main", resource=RESOURCE, device_ids=[f"d{i}"], response=response
            ),
            ev.PodAdmitted(pod=pod, qos_class="BestEffort"),
        ]
    return evs


def _shared(views: Views) -> None:
    pods = list(views.pods.pods.items())
    for uid, pod in pods:
        assert uid is pod.uid
        c = pod.containers["main"]
        assert c.limits is c.requests
    (_, a), (_, b) = pods[:2]
    one, two = a.containers["main"].allocations[RESOURCE], b.containers["main"].allocations[RESOURCE]
    assert one.mounts[0] is two.mounts[0]
    assert one.annotations is two.annotations and one.cdi_devices is two.cdi_devices  # none: one empty of each
    assert a.containers["main"].requests is b.containers["main"].requests  # equal requests: one dict
    assert a.containers["main"].cpus is b.containers["main"].cpus and a.in_doubt is b.in_doubt  # none: one empty
    assert one.devices[0].host_path is two.devices[0].host_path
    assert a.namespace is b.namespace and a.qos_class is b.qos_class
    index = device_state.index_of(views.devices)
    for uid in index.holders:
        assert uid is views.pods.pods[uid].uid
    assert index.held_by("uid-1") == {("main", RESOURCE): ["d1"]}
    devices = index.resources[RESOURCE].devices
    assert devices["d0"].numa is devices["d1"].numa
    table = views.devices.devices[RESOURCE]
    assert table["d0"].numa_nodes is table["d1"].numa_nodes  # one list for the devices on node 0


def test_reduced_views_share_what_repeats() -> None:
    _shared(rebuild(as_records(_pod_events(3))))


def test_decoded_views_share_what_repeats_and_encode_the_same() -> None:
    data = msgspec.msgpack.encode(rebuild(as_records(_pod_events(3))))
    decoded = msgspec.msgpack.decode(data, type=Views)
    _shared(decoded)
    assert msgspec.msgpack.encode(decoded) == data


def test_a_limit_unlike_its_request_is_its_own() -> None:
    evs = _pod_events(1)
    start = evs[1]
    assert isinstance(start, ev.PodAdmissionStarted)
    evs[1] = ev.PodAdmissionStarted(
        pod=start.pod, containers=[ev.ContainerSpec(name="main", requests={RESOURCE: "1"}, limits={RESOURCE: "2"})]
    )
    c = rebuild(as_records(evs)).pods.pods["uid-0"].containers["main"]
    assert c.requests == {RESOURCE: "1"} and c.limits == {RESOURCE: "2"}


def test_shared_requests_keep_each_containers_order() -> None:
    from eventsrc.state.views import ContainerView

    first = ContainerView(requests={"a": "1", "b": "2"})
    other_order = ContainerView(requests={"b": "2", "a": "1"})
    assert list(first.requests) == ["a", "b"] and list(other_order.requests) == ["b", "a"]
    assert ContainerView(requests={"a": "1", "b": "2"}).requests is first.requests
    data = msgspec.msgpack.encode(other_order)
    assert msgspec.msgpack.encode(msgspec.msgpack.decode(data, type=ContainerView)) == data


def test_a_plugins_flap_state_shares_equal_listings() -> None:
    from eventsrc.core.devices.flaps import HealthThrottle

    throttle = HealthThrottle(RESOURCE)
    throttle.listed([ev.DeviceInfo(id=f"d{i}", health="Healthy", numa_nodes=[0]) for i in range(3)])
    listings = [f.listed for f in throttle.devices.values()]
    assert listings[0] == ("Healthy", (0,)) and all(x is listings[0] for x in listings)
    assert not hasattr(throttle.devices["d0"], "__dict__")  # slots: 10,000 of them at 10,000 devices


def _untracked(views: Views) -> None:
    """What there are thousands of is out of the cycle collector's sight (``state.views``'
    docstring): each plugin, device, pod and container, and the dicts of them."""
    assert not gc.is_tracked(views.pods.pods)
    for pod in views.pods.pods.values():
        assert not gc.is_tracked(pod) and not gc.is_tracked(pod.containers)
        assert not any(gc.is_tracked(c) for c in pod.containers.values())
    for table in views.devices.devices.values():
        assert not gc.is_tracked(table)
        assert not any(gc.is_tracked(d) for d in table.values())
    assert not any(gc.is_tracked(p) for p in views.devices.plugins.values())


def test_the_views_many_parts_are_not_tracked_by_the_cycle_collector() -> None:
    views = rebuild(as_records(_pod_events(50)))
    _untracked(views)
    _untracked(msgspec.msgpack.decode(msgspec.msgpack.encode(views), type=Views))
    # a new pod's view is untracked from the start, before any collection
    views2 = rebuild(as_records(_pod_events(2)))
    assert not gc.is_tracked(views2.pods.pods["uid-1"])


def _assert_no_cycle(views: Views) -> int:
    """Walks everything reached from ``views``; fails on an object reached again through a
    path that comes back to it. Returns how many objects it went through."""
    on_path: set[int] = set()
    seen = 0

    def parts(obj: object) -> list[object]:
        # an untracked struct has no referents for gc: its fields are read instead
        if isinstance(obj, msgspec.Struct):
            return [getattr(obj, f) for f in obj.__struct_fields__] + list(getattr(obj, "__dict__", {}).values())
        if isinstance(obj, dict):
            return [*obj.keys(), *obj.values()]
        return list(gc.get_referents(obj))

    def walk(obj: object) -> None:
        nonlocal seen
        assert id(obj) not in on_path, f"a cycle through {type(obj).__name__}"
        if isinstance(obj, (str, bytes, int, float, bool, type(None), type)):
            return
        seen += 1
        on_path.add(id(obj))
        for ref in parts(obj):
            walk(ref)
        on_path.discard(id(obj))

    walk(views)
    return seen


def test_the_views_hold_no_reference_cycle() -> None:
    """gc=False is safe only if nothing in the views refers back to what holds it."""
    views = rebuild(as_records(_pod_events(20)))
    assert _assert_no_cycle(views) > 20 * 5  # it went down to each pod's containers


@given(st.lists(events, max_size=60))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_views_from_any_events_hold_no_cycle_and_their_many_parts_are_untracked(evs: list[ev.EventBase]) -> None:
    """Every event type (claims, the runtime's sandboxes and containers, plugins included)."""
    views = rebuild(as_records(evs))
    _assert_no_cycle(views)
    _untracked(views)
    for claim in views.claims.claims.values():
        assert not gc.is_tracked(claim)
    assert not any(gc.is_tracked(d) for d in views.claims.drivers.values())
    assert not any(gc.is_tracked(s) for s in views.runtime.sandboxes.values())
    assert not any(gc.is_tracked(c) for c in views.runtime.containers.values())


def _collected_away(views: Views) -> None:
    """After a full collection, what each pod adds is out of the cycle collector's walk too:
    its device ids and their dict, and the device index's entry for its device; equal mount
    lists are one list. So a full collection does not grow with the pods admitted since the
    last one (docs/adr/0028)."""
    index = device_state.index_of(views.devices)
    gc.collect()
    for pod in views.pods.pods.values():
        c = pod.containers["main"]
        assert not gc.is_tracked(c.devices) and not any(gc.is_tracked(ids) for ids in c.devices.values())
    assert not any(gc.is_tracked(entry) for entry in index.resources[RESOURCE].devices.values())
    allocations = [pod.containers["main"].allocations[RESOURCE] for pod in views.pods.pods.values()]
    assert all(a.mounts is allocations[0].mounts for a in allocations)


def test_what_a_pod_adds_is_untracked_after_a_full_collection() -> None:
    views = rebuild(as_records(_pod_events(20)))
    _collected_away(views)
    _collected_away(msgspec.msgpack.decode(msgspec.msgpack.encode(views), type=Views))
