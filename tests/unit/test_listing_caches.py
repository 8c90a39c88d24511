"""Listings kept per log sequence and per pod (``api.podresources.ListCache``,
``AllocatableCache``, ``api.node.PodsCache``) and built in paced chunks: the cached answer is
always the one built from scratch (for List and ListPods, kept encoded: byte for byte the
fresh answer serialised whole), and a paced build never mixes two views states."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from google.protobuf.message import Message

from eventsrc import events as ev
from eventsrc.api.node import PodsCache, pod_info
from eventsrc.api.podresources import AllocatableCache, ListCache, allocatable, pod_resources
from eventsrc.events import Record
from eventsrc.gen.node.v1 import node_pb2 as npb
from eventsrc.gen.podresources.v1 import api_pb2 as pb
from eventsrc.rpc.answer_cache import PACED_PASSES
from eventsrc.rpc.codec import PreEncoded
from eventsrc.state.apply import apply_all
from eventsrc.state.lifecycles import ADMITTED
from eventsrc.state.views import Views

DEV = "example.com/dev"
M = TypeVar("M", bound=Message)


def same(got: PreEncoded[M], fresh: M) -> M:
    """``got`` is ``fresh`` byte for byte, as the whole message serialises (deterministic:
    maps by key), and decodes to it; the decoded answer."""
    assert got.message_type is type(fresh)
    assert got.data == fresh.SerializeToString(deterministic=True)
    decoded = got.decoded()
    assert decoded == fresh
    return decoded


class Node:
    def __init__(self) -> None:
        self.views = Views()
        self.seq = 0

    def record(self, *events: ev.EventBase) -> None:
        records = []
        for e in events:
            self.seq += 1
            records.append(Record(seq=self.seq, ts_ns=self.seq, correlation_id="c", version=1, event=e))  # type: ignore[arg-type]
        apply_all(self.views, records)

    def admit(self, uid: str, device: str, claims: list[str] | None = None, started_only: bool = False) -> None:
        pod = ev.PodRef(uid=uid, namespace="default", name=uid)
        containers = [ev.ContainerSpec(name="app", claims=list(claims or []))]
        self.record(
            ev.PodAdmissionStarted(pod=pod, containers=containers),
            ev.DevicesReserved(pod_uid=uid, container="app", resource=DEV, device_ids=[device]),
            ev.DevicesAllocated(
                pod_uid=uid,
                container="app",
                resource=DEV,
                device_ids=[device],
                response=ev.ContainerAllocation(envs={"DEV": device}),
            ),
        )
        if not started_only:
            self.record(ev.PodAdmitted(pod=pod, containers=containers))

    def remove(self, uid: str, device: str) -> None:
        self.record(
            ev.PodRemoved(pod_uid=uid),
            ev.DevicesReleased(pod_uid=uid, container="app", resource=DEV, device_ids=[device]),
        )


def node_with_devices(n: int = 6) -> Node:
    node = Node()
    node.record(
        ev.PluginRegistered(resource=DEV, endpoint="dev.sock"),
        ev.DevicesAdded(
            resource=DEV, devices=[ev.DeviceInfo(id=f"d{i}", health="Healthy", numa_nodes=[0]) for i in range(n)]
        ),
        ev.SharedPoolChanged(cpus=[0, 1, 2, 3]),
    )
    return node


def fresh_list(views: Views) -> pb.ListPodResourcesResponse:
    return pb.ListPodResourcesResponse(
        pod_resources=[pod_resources(views, p) for p in views.pods.pods.values() if p.state == ADMITTED]
    )


def fresh_pods(views: Views) -> npb.ListPodsResponse:
    return npb.ListPodsResponse(
        pods=[pod_info(p, shared=views.cpus.shared, views=views) for p in views.pods.pods.values()]
    )


def prepared(uid: str, cdi: str) -> ev.ClaimPrepared:
    return ev.ClaimPrepared(
        claim=ev.ClaimRef(uid=uid, namespace="default", name=uid),
        driver="gpu.example.com",
        devices=[ev.PreparedDevice(pool_name="p", device_name=cdi, cdi_device_ids=[cdi])],
    )


def test_list_pods_is_the_fresh_answer_through_admissions_quarantine_shared_pool_and_claims() -> None:
    node, cache = node_with_devices(), PodsCache()

    def check() -> npb.ListPodsResponse:
        return same(cache.answer(node.views), fresh_pods(node.views))

    check()
    node.admit("a", "d0")
    node.admit("b", "d1")
    first = cache.answer(node.views)
    assert [p.state for p in same(first, fresh_pods(node.views)).pods] == ["admitted", "admitted"]
    passes = cache.passes
    assert cache.answer(node.views).data == first.data  # no record since: the same answer,
    assert cache.passes == passes  # not built again
    node.admit("c", "d2", started_only=True)  # admitting: listed, built again at each sequence
    assert [p.state for p in check().pods] == ["admitted", "admitted", "admitting"]
    node.record(ev.DevicesReserved(pod_uid="c", container="app", resource="example.com/other", device_ids=["o1"]))
    assert [r.resource for r in check().pods[2].containers[0].resources] == [DEV, "example.com/other"]
    node.record(ev.PodAdmitted(pod=ev.PodRef(uid="c", namespace="default", name="c"), containers=[]))
    assert check().pods[2].state == "admitted"
    # quarantined: its state and the records in doubt show at once (changed_seq does not move)
    node.record(ev.PodQuarantined(pod=ev.PodRef(uid="b", namespace="default", name="b"), corrupt_seqs=[7]))
    got = check()
    assert got.pods[1].state == "quarantined" and list(got.pods[1].in_doubt) == [7]
    node.record(ev.PodQuarantined(pod=ev.PodRef(uid="b", namespace="default", name="b"), corrupt_seqs=[9]))
    assert list(check().pods[1].in_doubt) == [7, 9]
    # the shared pool changes: containers without exclusive CPUs show the new one
    node.record(ev.SharedPoolChanged(cpus=[2, 3]))
    assert list(check().pods[0].containers[0].cpu_ids) == [2, 3]
    node.record(ev.CPUsAssigned(pod_uid="a", container="app", cpus=[1]))
    assert list(check().pods[0].containers[0].cpu_ids) == [1]
    node.remove("a", "d0")
    assert [p.uid for p in check().pods] == ["b", "c"]
    # a pod using a claim: a change of the claim's devices shows (guarded per claim)
    node.record(ev.PodReferenceAdded(claim_uid="k", pod_uid="e"), prepared("k", "cdi/one"))
    node.admit("e", "d3", claims=["k"])
    assert list(check().pods[-1].containers[0].claim_cdi_devices) == ["cdi/one"]
    node.record(prepared("k", "cdi/two"))
    assert list(check().pods[-1].containers[0].claim_cdi_devices) == ["cdi/two"]
    # readmitted under the same uid with another device
    node.remove("c", "d2")
    node.admit("c", "d4")
    got = check()
    assert [p.uid for p in got.pods] == ["b", "e", "c"]
    assert list(got.pods[-1].containers[0].resources[0].device_ids) == ["d4"]


def test_list_is_the_fresh_answer_through_a_quarantine_and_a_numa_move() -> None:
    node, cache = node_with_devices(), ListCache()
    node.admit("a", "d0")
    node.admit("b", "d1")
    same(cache.answer(node.views), fresh_list(node.views))
    node.record(ev.PodQuarantined(pod=ev.PodRef(uid="a", namespace="default", name="a"), corrupt_seqs=[3]))
    got = same(cache.answer(node.views), fresh_list(node.views))
    assert [p.name for p in got.pod_resources] == ["b"]
    node.record(ev.DeviceHealthChanged(resource=DEV, device_id="d1", health="Healthy", numa_nodes=[1]))
    got = same(cache.answer(node.views), fresh_list(node.views))
    assert got.pod_resources[0].containers[0].devices[0].topology.nodes[0].ID == 1


def test_list_is_the_fresh_answer_when_an_admitted_pods_claim_is_prepared_again() -> None:
    node, cache = node_with_devices(), ListCache()
    node.record(ev.PodReferenceAdded(claim_uid="k", pod_uid="e"), prepared("k", "cdi/one"))
    node.admit("e", "d3", claims=["k"])
    same(cache.answer(node.views), fresh_list(node.views))
    node.record(prepared("k", "cdi/two"))  # the pod's changed_seq stays; the claim's devices change
    got = same(cache.answer(node.views), fresh_list(node.views))
    claim = got.pod_resources[0].containers[0].dynamic_resources[0].claim_resources[0]
    assert claim.device_name != ""


def test_allocatable_is_the_fresh_answer_through_health_numa_and_plugin_changes() -> None:
    node, cache = node_with_devices(3), AllocatableCache()
    cpus = [0, 1, 2, 3]

    def check() -> pb.AllocatableResourcesResponse:
        got = cache.answer(node.views, cpus)
        assert got == allocatable(node.views, cpus)
        return got

    first = check()
    assert [list(d.device_ids) for d in first.devices] == [["d0"], ["d1"], ["d2"]]  # one entry a device
    assert cache.answer(node.views, cpus) is first
    node.record(ev.DeviceHealthChanged(resource=DEV, device_id="d1", health="Unhealthy", numa_nodes=[0]))
    assert [list(d.device_ids) for d in check().devices] == [["d0"], ["d2"]]
    node.record(ev.DeviceHealthChanged(resource=DEV, device_id="d2", health="Healthy", numa_nodes=[1]))
    assert [(list(d.device_ids), d.topology.nodes[0].ID) for d in check().devices] == [(["d0"], 0), (["d2"], 1)]
    cpus = [0, 1]  # other CPUs at the same sequence: shown
    assert list(check().cpu_ids) == [0, 1]
    node.record(ev.PluginDisconnected(resource=DEV, endpoint="dev.sock"))
    assert list(check().devices) == []


def run_paced(cache: ListCache | PodsCache, node: Node, during: Callable[[int], None]) -> PreEncoded[Message]:
    """``cache.answer_paced`` with a pause that calls ``during(pause number)``."""
    pauses = 0

    async def pause() -> None:
        nonlocal pauses
        pauses += 1
        during(pauses)

    return asyncio.run(cache.answer_paced(lambda: node.views, pause))


def test_a_paced_build_starts_again_when_a_record_lands_during_a_pause() -> None:
    for cache, fresh in ((ListCache(), fresh_list), (PodsCache(), fresh_pods)):
        node = node_with_devices()
        for i in range(4):
            node.admit(f"p{i}", f"d{i}")
        cache.chunk = 1
        seen: list[int] = []

        def during(n: int, node: Node = node, seen: list[int] = seen) -> None:
            seen.append(n)
            if n == 2:  # a record lands in the middle of the first pass
                node.admit("late", "d5")

        got = run_paced(cache, node, during)
        same(got, fresh(node.views))
        assert len(seen) > 4  # the first pass stopped at its second pause; another one ran
        passes = cache.passes
        assert cache.answer(node.views).data == got.data  # kept for the sequence it was built at
        assert cache.passes == passes


def test_a_paced_build_that_records_keep_interrupting_finishes_without_pausing() -> None:
    for cache, fresh in ((ListCache(), fresh_list), (PodsCache(), fresh_pods)):
        node = node_with_devices(40)
        for i in range(4):
            node.admit(f"p{i}", f"d{i}")
        cache.chunk = 1
        seen: list[int] = []

        def during(n: int, node: Node = node, seen: list[int] = seen) -> None:
            seen.append(n)
            node.admit(f"late{n}", f"d{10 + n}")  # every pause: the pass is never done

        got = run_paced(cache, node, during)
        same(got, fresh(node.views))
        assert len(seen) == PACED_PASSES
