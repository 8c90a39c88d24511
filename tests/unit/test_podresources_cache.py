"""PodResources List answers kept per log sequence and per admitted pod (``api.podresources.ListCache``):
the cached answer is always the one built from scratch, byte for byte."""

from __future__ import annotations

from eventsrc import events as ev
from eventsrc.api.podresources import ListCache, pod_resources
from eventsrc.gen.podresources.v1 import api_pb2 as pb
from eventsrc.state.lifecycles import ADMITTED
from eventsrc.state.views import Views
from tests.unit.test_listing_caches import DEV, Node, same


def fresh(views: Views) -> pb.ListPodResourcesResponse:
    pods = [pod_resources(views, p) for p in views.pods.pods.values() if p.state == ADMITTED]
    return pb.ListPodResourcesResponse(pod_resources=pods)


def test_the_cached_answer_is_the_fresh_one_through_admissions_removals_and_moves() -> None:
    node, cache = Node(), ListCache()
    node.record(
        ev.DevicesAdded(
            resource=DEV, devices=[ev.DeviceInfo(id=f"d{i}", health="Healthy", numa_nodes=[0]) for i in range(3)]
        )
    )
    same(cache.answer(node.views), fresh(node.views))
    node.admit("a", "d0")
    node.admit("b", "d1")
    first = cache.answer(node.views)
    assert len(same(first, fresh(node.views)).pod_resources) == 2
    passes = cache.passes
    assert cache.answer(node.views).data == first.data  # no record since: the same answer,
    assert cache.passes == passes  # not built again
    node.record(
        ev.PodRemoved(pod_uid="a"), ev.DevicesReleased(pod_uid="a", container="app", resource=DEV, device_ids=["d0"])
    )
    got = same(cache.answer(node.views), fresh(node.views))
    assert [p.name for p in got.pod_resources] == ["b"]
    # a held device moves to NUMA node 1: the pod's message shows it
    node.record(ev.DeviceHealthChanged(resource=DEV, device_id="d1", health="Healthy", numa_nodes=[1]))
    moved = same(cache.answer(node.views), fresh(node.views))
    assert moved.pod_resources[0].containers[0].devices[0].topology.nodes[0].ID == 1
    # a CPU released from an admitted pod (as a policy change at start does): shown at once
    node.record(ev.CPUsAssigned(pod_uid="b", container="app", cpus=[3]))
    same(cache.answer(node.views), fresh(node.views))
    node.record(ev.CPUsReleased(pod_uid="b", container="app", cpus=[3]))
    got = same(cache.answer(node.views), fresh(node.views))
    assert list(got.pod_resources[0].containers[0].cpu_ids) == []
    # readmitted under the same uid with another device
    node.record(
        ev.PodRemoved(pod_uid="b"), ev.DevicesReleased(pod_uid="b", container="app", resource=DEV, device_ids=["d1"])
    )
    node.admit("b", "d2")
    got = same(cache.answer(node.views), fresh(node.views))
    assert list(got.pod_resources[0].containers[0].devices[0].device_ids) == ["d2"]
