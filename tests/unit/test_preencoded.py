"""Answers sent encoded beforehand (``rpc.codec.PreEncoded``): the codec sends their bytes as
they are, for the method's own reply type only, and the listings joined from each pod's
encoding (``rpc.answer_cache.element``) are byte for byte the whole answer serialised."""

from __future__ import annotations

import asyncio
import random

import pytest
from grpclib.encoding.proto import ProtoCodec

from eventsrc import events as ev
from eventsrc.api.node import PodsCache
from eventsrc.api.podresources import ListCache
from eventsrc.gen.node.v1 import node_pb2 as npb
from eventsrc.gen.podresources.v1 import api_pb2 as pb
from eventsrc.rpc.answer_cache import element
from eventsrc.rpc.codec import YIELD_BEFORE_BYTES, BoundedCodec, PreEncoded, send_encoded
from tests.unit.test_listing_caches import DEV, Node, fresh_list, fresh_pods, node_with_devices, run_paced, same


def test_the_codec_sends_pre_encoded_bytes_as_they_are_for_the_methods_reply_type_only() -> None:
    answer = pb.ListPodResourcesResponse(pod_resources=[pb.PodResources(name="a", namespace="default")])
    data = answer.SerializeToString()
    codec = BoundedCodec()
    assert codec.encode(PreEncoded(pb.ListPodResourcesResponse, data), pb.ListPodResourcesResponse) is data
    assert codec.encode(answer, pb.ListPodResourcesResponse) == data  # a message: grpclib's encoding
    with pytest.raises(TypeError, match="ListPodsResponse"):
        codec.encode(PreEncoded(npb.ListPodsResponse, data), pb.ListPodResourcesResponse)
    with pytest.raises(TypeError):
        codec.encode(answer, npb.ListPodsResponse)
    with pytest.raises(TypeError):  # grpclib's own codec does not know it: no silent pass-through
        ProtoCodec().encode(PreEncoded(pb.ListPodResourcesResponse, data), pb.ListPodResourcesResponse)


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 300_000])
def test_an_element_is_protobufs_own_encoding_of_one_entry(size: int) -> None:
    pod = pb.PodResources(name="n" * size)
    assert element(1, pod) == pb.ListPodResourcesResponse(pod_resources=[pod]).SerializeToString()
    memory = pb.ContainerMemory(memory_type="m" * size)  # field 3: another key
    assert element(3, memory) == pb.AllocatableResourcesResponse(memory=[memory]).SerializeToString()


def many_keyed_allocation(node_seq: int, n: int = 40) -> ev.ContainerAllocation:
    keys = [f"KEY_{i}" for i in range(n)]
    random.Random(node_seq).shuffle(keys)
    return ev.ContainerAllocation(envs={k: k.lower() for k in keys}, annotations={k: "x" for k in reversed(keys)})


def test_listings_with_many_keyed_maps_are_the_whole_answer_byte_for_byte() -> None:
    """Maps serialise in no fixed order unless deterministic: each pod's part and the whole
    answer are deterministic, so they agree whatever order the keys came in."""
    node = node_with_devices(12)
    for i in range(12):
        uid = f"p{i}"
        pod = ev.PodRef(uid=uid, namespace="default", name=uid)
        containers = [ev.ContainerSpec(name="app")]
        node.record(
            ev.PodAdmissionStarted(pod=pod, containers=containers),
            ev.DevicesReserved(pod_uid=uid, container="app", resource=DEV, device_ids=[f"d{i}"]),
            ev.DevicesAllocated(
                pod_uid=uid,
                container="app",
                resource=DEV,
                device_ids=[f"d{i}"],
                response=many_keyed_allocation(i),
            ),
            ev.PodAdmitted(pod=pod, containers=containers),
        )
    pods = same(PodsCache().answer(node.views), fresh_pods(node.views))
    assert len(pods.pods) == 12 and len(pods.pods[0].containers[0].resources[0].envs) == 40
    assert len(same(ListCache().answer(node.views), fresh_list(node.views)).pod_resources) == 12


def test_a_stale_part_is_caught() -> None:
    """The byte check sees a pod's part that was not built again when it should have been."""
    node = node_with_devices()
    node.admit("a", "d0")
    node.admit("b", "d1")
    cache = ListCache()
    same(cache.answer(node.views), fresh_list(node.views))
    old = dict(cache._pods)  # noqa: SLF001 - the parts as they were
    node.record(ev.CPUsAssigned(pod_uid="a", container="app", cpus=[3]))
    cache.answer(node.views)
    cache._pods["a"] = (cache._pods["a"][0], old["a"][1])  # noqa: SLF001 - current key, old bytes
    node.record(ev.SharedPoolChanged(cpus=[0, 1]))  # a new sequence: the answer is joined again
    with pytest.raises(AssertionError):
        same(cache.answer(node.views), fresh_list(node.views))


def test_a_pass_that_builds_nothing_still_pauses_and_starts_again_when_a_record_lands() -> None:
    """Looking at 10,000 pods whose parts are kept is itself several ms: it pauses every
    ``visits`` pods, and a record landing meanwhile starts the pass again."""
    for cache, fresh in ((ListCache(), fresh_list), (PodsCache(), fresh_pods)):
        node = node_with_devices(8)
        for i in range(6):
            node.admit(f"p{i}", f"d{i}")
        cache.answer(node.views)  # every part built
        node.record(ev.SharedPoolChanged(cpus=[0, 1, 2, 3]))  # a new sequence, the same pods
        cache.visits = 2

        seen: list[int] = []

        def during(n: int, node: Node = node, seen: list[int] = seen) -> None:
            seen.append(n)
            if n == 1:  # in the first pass, which built nothing
                node.admit("late", "d7")

        same(run_paced(cache, node, during), fresh(node.views))
        # the first pass stopped at its first pause; the second looked at 7 pods (the 6, and
        # "late" built), pausing at the 2nd, 4th and 6th
        assert len(seen) == 1 + 3


@pytest.mark.parametrize(("size", "after_a_step"), [(YIELD_BEFORE_BYTES - 1, False), (YIELD_BEFORE_BYTES, True)])
def test_a_large_answer_is_sent_from_the_next_loop_step(size: int, after_a_step: bool) -> None:
    """Joining a large answer's parts and grpclib's copy of it are two loop steps."""
    ran: list[str] = []

    class Stream:
        async def send_message(self, message: object) -> None:
            ran.append("send")

    async def main() -> None:
        asyncio.get_running_loop().call_soon(ran.append, "another step")
        await send_encoded(Stream(), PreEncoded(pb.ListPodResourcesResponse, b"x" * size))  # type: ignore[arg-type]
        await asyncio.sleep(0)

    asyncio.run(main())
    assert ran == (["another step", "send"] if after_a_step else ["send", "another step"])
