"""PodResources v1 (``v1.PodResourcesLister``), wire-compatible with the kubelet's.

Answers are read from the views; nothing here changes state. The kubelet's rate limit
applies: 100 requests per second with a burst of 10; excess calls get RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from grpclib import GRPCError, Status
from grpclib.server import Stream

from eventsrc.gen.podresources.v1 import api_pb2 as pb
from eventsrc.gen.podresources.v1.api_grpc import PodResourcesListerBase
from eventsrc.rpc.answer_cache import SeqCache, element
from eventsrc.rpc.codec import send_encoded
from eventsrc.rpc.ratelimit import TokenBucket
from eventsrc.state.lifecycles import ADMITTED
from eventsrc.state.views import DeviceView, PodView, Views

if TYPE_CHECKING:
    from eventsrc.obs.metrics import Metrics

NO_TOPOLOGY = -1


def container_devices(resource: str, ids: Iterable[str], table: dict[str, DeviceView]) -> list[pb.ContainerDevices]:
    """One entry per device and NUMA node, as the kubelet lists them since 1.21
    (``containerDevicesFromResourceDeviceInstances``): a device with no topology once, with
    none; the kubelet's order is a Go map's, so any order is the kubelet's: these go by id."""
    out = []
    for device_id in sorted(ids):
        d = table.get(device_id)
        nodes = d.numa_nodes if d is not None and d.numa_nodes else [NO_TOPOLOGY]
        for node in sorted(nodes):
            cd = pb.ContainerDevices(resource_name=resource, device_ids=[device_id])
            if node != NO_TOPOLOGY:
                cd.topology.CopyFrom(pb.TopologyInfo(nodes=[pb.NUMANode(ID=node)]))
            out.append(cd)
    return out


def pod_resources(views: Views, pod: PodView) -> pb.PodResources:
    containers = []
    for name, c in pod.containers.items():
        if c.kind == "init":  # the kubelet lists app containers and restartable init containers
            continue
        if name == pod.growing:  # admitted at its creation: listed once admitted
            continue
        cr = pb.ContainerResources(name=name, cpu_ids=sorted(c.cpus))
        for resource, ids in sorted(c.devices.items()):
            cr.devices.extend(container_devices(resource, ids, views.devices.devices.get(resource, {})))
        for block in views.memory.assignments.get(pod.uid, {}).get(name, ()):
            cr.memory.append(_memory(block.type, block.size, block.numa_affinity))
        for claim_uid in c.claims:
            claim = views.claims.claims.get(claim_uid)
            if claim is None:
                continue
            cr.dynamic_resources.append(
                pb.DynamicResource(
                    claim_name=claim.name,
                    claim_namespace=claim.namespace,
                    claim_resources=[
                        pb.ClaimResource(
                            cdi_devices=[pb.CDIDevice(name=n) for n in d.cdi_device_ids],
                            driver_name=claim.driver,
                            pool_name=d.pool_name,
                            device_name=d.device_name,
                        )
                        for d in claim.devices
                    ],
                )
            )
        containers.append(cr)
    return pb.PodResources(name=pod.name, namespace=pod.namespace, containers=containers)


def _memory(kind: str, size: int, nodes: Iterable[int]) -> pb.ContainerMemory:
    """A memory block as the kubelet's ``containerMemoryFromBlock`` lists it."""
    return pb.ContainerMemory(
        memory_type=kind, size=size, topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in nodes])
    )


def allocatable(
    views: Views, cpus: list[int], memory: Iterable[tuple[int, str, int]] = ()
) -> pb.AllocatableResourcesResponse:
    """Healthy devices of connected plugins, the CPUs, and the memory manager's allocatable
    memory per NUMA node (``memory``: node, resource, bytes; none with the None policy)."""
    devices = []
    for resource, plugin in sorted(views.devices.plugins.items()):
        table = views.devices.devices.get(resource, {})
        healthy = [i for i, d in table.items() if d.health == "Healthy" and not d.removed]
        if plugin.connected and healthy:
            devices.extend(container_devices(resource, healthy, table))
    blocks = [_memory(kind, size, [node]) for node, kind, size in memory]
    return pb.AllocatableResourcesResponse(devices=devices, cpu_ids=cpus, memory=blocks)


#: pod_resources' field number in ListPodResourcesResponse
_POD_RESOURCES = pb.ListPodResourcesResponse.DESCRIPTOR.fields_by_name["pod_resources"].number


class ListCache(SeqCache[pb.ListPodResourcesResponse]):
    """List's answer, kept per log sequence, and each pod's part kept encoded from one List
    to the next.

    A pod's part is built again only when a record changed what it holds (its
    ``changed_seq``: its admission, a device or CPU given or taken) or a device moved to other
    NUMA nodes (the views' ``topology_seq``: then every pod's part is built again). A
    claim's devices are fixed while a pod references it (prepared before the pod is admitted,
    unprepared after it is removed). At 10,000 pods a List after a few records costs a pass
    over the pods and a join of their bytes, not building or serialising every message."""

    def __init__(self) -> None:
        super().__init__(pb.ListPodResourcesResponse)
        # uid -> (its changed_seq, or with each claim's since_seq when it uses claims; its
        # element of pod_resources), built at the topology of ``_topology``
        self._pods: dict[str, tuple[int | tuple[int, ...], bytes]] = {}
        self._topology = 0

    def _build(self, views: Views) -> Iterator[None]:
        if views.devices.topology_seq != self._topology:
            self._pods, self._topology = {}, views.devices.topology_seq
        kept: dict[str, tuple[int | tuple[int, ...], bytes]] = {}
        built = 0
        for visited, (uid, pod) in enumerate(views.pods.pods.items(), 1):
            if visited % self.visits == 0:
                yield
            if pod.state != ADMITTED:
                continue
            # a claim prepared again for an admitted pod changes its devices, not the pod's changed_seq
            claims = _claims_seen(views, pod)
            key = (pod.changed_seq, *claims) if claims else pod.changed_seq  # one int for most: 10,000 kept
            cached = self._pods.get(uid)
            if cached is None or cached[0] != key or not pod.changed_seq:
                cached = self._pods[uid] = (key, element(_POD_RESOURCES, pod_resources(views, pod)))
                built += 1
                if built % self.chunk == 0:
                    yield
            kept[uid] = cached
        self._pods = kept
        self._parts = [part for _, part in kept.values()]


def _claims_seen(views: Views, pod: PodView) -> tuple[int, ...]:
    """The last record of each claim the pod's containers use (-1: not in the views)."""
    return tuple(
        c.since_seq if (c := views.claims.claims.get(uid)) is not None else -1
        for ct in pod.containers.values()
        for uid in ct.claims
    )


class AllocatableCache:
    """GetAllocatableResources' answer, kept while the log sequence and the CPUs stay the same
    (devices, their health and topology and the plugins change only with records)."""

    def __init__(self, memory: Iterable[tuple[int, str, int]] = ()) -> None:
        self._key: tuple[int, tuple[int, ...]] | None = None
        self._answer = pb.AllocatableResourcesResponse()
        self._memory = list(memory)  # the daemon's: fixed while it runs

    def answer(self, views: Views, cpus: list[int]) -> pb.AllocatableResourcesResponse:
        key = (views.meta.last_seq, tuple(cpus))
        if key != self._key:
            self._answer, self._key = allocatable(views, cpus, self._memory), key
        return self._answer


class PodResourcesService(PodResourcesListerBase):
    def __init__(
        self,
        views: Callable[[], Views],
        limiter: TokenBucket | None = None,
        cpus: Callable[[], list[int]] = list,
        metrics: Metrics | None = None,
        memory: Iterable[tuple[int, str, int]] = (),
    ) -> None:
        self._views = views
        self._limiter = limiter or TokenBucket()
        self._cpus = cpus
        self._metrics = metrics
        self._list = ListCache()
        self._allocatable = AllocatableCache(memory)

    def _admit(self, method: str) -> None:
        """The rate limit, then the request counted (the kubelet's limiter sits in front of
        its handlers, which count)."""
        if not self._limiter.allow():
            raise GRPCError(Status.RESOURCE_EXHAUSTED, "rejected by rate limit")
        if self._metrics is not None:
            self._metrics.pod_resources_request(method)

    async def List(self, stream: Stream[pb.ListPodResourcesRequest, pb.ListPodResourcesResponse]) -> None:
        await stream.recv_message()
        self._admit("list")
        await send_encoded(stream, await self._list.answer_paced(self._views))

    async def GetAllocatableResources(
        self, stream: Stream[pb.AllocatableResourcesRequest, pb.AllocatableResourcesResponse]
    ) -> None:
        await stream.recv_message()
        self._admit("get_allocatable")
        await stream.send_message(self._allocatable.answer(self._views(), self._cpus()))

    async def Get(self, stream: Stream[pb.GetPodResourcesRequest, pb.GetPodResourcesResponse]) -> None:
        req = await stream.recv_message()
        assert req is not None
        self._admit("get")
        views = self._views()
        for p in views.pods.pods.values():
            if p.state == ADMITTED and p.name == req.pod_name and p.namespace == req.pod_namespace:
                await stream.send_message(pb.GetPodResourcesResponse(pod_resources=pod_resources(views, p)))
                return
        if self._metrics is not None:
            self._metrics.pod_resources_error("get")
        raise GRPCError(Status.NOT_FOUND, f"pod {req.pod_name} in namespace {req.pod_namespace} not found")
