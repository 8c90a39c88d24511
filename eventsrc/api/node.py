"""The node API (``eventsrc.node.v1.Node``): how pods reach the daemon.

Handlers run on the asyncio side (grpclib, ``eventsrc.rpc.bridge.serve_unix``); anything
that changes state crosses into trio once (``to_trio``) and goes through the admission
shell, which records events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol

import msgspec
from grpclib import GRPCError, Status
from grpclib.server import Stream

from eventsrc import __version__
from eventsrc import events as ev
from eventsrc.api.readers import CHUNK, Stalls, Turns
from eventsrc.core.claims import cdi_devices
from eventsrc.core.retention_policy import RetentionReport
from eventsrc.core.shipping import ShippingReport
from eventsrc.errors import AdmissionRefused, BadRequest, EventsrcError, NotFound
from eventsrc.events import CorruptRecordError, Record
from eventsrc.gen.node.v1 import node_pb2 as pb
from eventsrc.gen.node.v1.node_grpc import NodeBase
from eventsrc.inputs.manifest import PodClaim, PodSpec, checked_pod
from eventsrc.obs.logger import get_logger
from eventsrc.obs.loop import LoopHolds
from eventsrc.obs.text import escape
from eventsrc.rpc.answer_cache import SeqCache, element
from eventsrc.rpc.bridge import to_trio
from eventsrc.rpc.codec import send_encoded
from eventsrc.state.lifecycles import ADMITTED
from eventsrc.state.views import ClaimView, ObservedPodView, PodView, Views

log = get_logger(__name__)


class Admitter(Protocol):
    """Admission as the node API and the NRI plugin use it (``eventsrc.node.admitter.Admission``)."""

    def admit(self, spec: PodSpec) -> Awaitable[tuple[PodView, str]]:
        """Admit ``spec``, or keep it as it is when it is admitted already: the pod as admitted
        and the correlation id of its records. Waits for the admission lock and for plugins
        and drivers that are away. Raises AdmissionRefused with the reason."""
        ...

    def remove(self, uid: str, reason: str = ...) -> Awaitable[tuple[PodView, str, int]]:
        """Release everything pod ``uid`` holds and forget it (``reason`` recorded with it):
        the pod as it was, the correlation id and the sequence of its PodRemoved. Raises
        NotFound, or AdmissionRefused while its admission runs."""
        ...


def shown(text: str) -> str:
    """A client's text in an answer: as it is when printable, else quoted with escapes, so
    that an error stays one line a terminal shows as it is (no control or bidi characters)."""
    return text if text.isprintable() else f'"{escape(text)}"'


def claims_from_proto(pod: ev.PodRef, claims: list[pb.ResourceClaim]) -> list[PodClaim]:
    """The pod's ResourceClaims, checked: allocated, one driver, the pod in reservedFor."""
    out = []
    for c in claims:
        where = f"claim {shown(f'{c.namespace or pod.namespace}/{c.name}')}"
        if not c.uid or not c.name:
            raise BadRequest(f"{where}: uid and name are required")
        if not c.results:
            raise BadRequest(f"{where}: not allocated (no status.allocation.devices.results)")
        drivers = sorted({r.driver for r in c.results})
        if len(drivers) != 1 or not drivers[0]:
            raise BadRequest(f"{where}: devices of exactly one driver are supported, got {drivers}")
        if pod.uid not in [r.uid for r in c.reserved_for]:
            raise AdmissionRefused(f"pod {pod.namespace}/{pod.name} ({pod.uid}) is not in the reservedFor of {where}")
        out.append(
            PodClaim(
                ref=ev.ClaimRef(uid=c.uid, namespace=c.namespace or pod.namespace, name=c.name),
                driver=drivers[0],
                devices=[(r.request, r.driver, r.pool, r.device) for r in c.results],
                reserved_for=[r.uid for r in c.reserved_for],
            )
        )
    return out


def pod_from_proto(p: pb.Pod, claims: list[pb.ResourceClaim] | None = None) -> PodSpec:
    """The pod of an Admit request, checked as the CLI checks a manifest
    (``eventsrc.inputs.manifest.checked_pod``), and its claims. Raises BadRequest naming the
    field, or AdmissionRefused."""
    if not p.uid:  # the CLI generates a missing uid; the node API is given one
        raise BadRequest("pod.uid: required")
    given = [
        (
            f"pod.containers[{i}]",
            ev.ContainerSpec(
                name=c.name, kind=c.kind, requests=dict(c.requests), limits=dict(c.limits), claims=list(c.claims)
            ),
        )
        for i, c in enumerate(p.containers)
    ]
    spec = checked_pod(
        ev.PodRef(uid=p.uid, namespace=p.namespace, name=p.name),
        given,
        meta="pod",
        containers_field="pod.containers",
    )
    containers = spec.containers
    ref = spec.pod
    pod_claims = claims_from_proto(ref, list(claims or []))
    known = {c.ref.uid for c in pod_claims}
    for c in containers:
        for uid in c.claims:
            if uid not in known:
                raise AdmissionRefused(f"container {c.name!r} uses claim {shown(uid)} that the pod did not bring")
    return PodSpec(pod=ref, containers=containers, claims=pod_claims)


def pod_to_proto(spec: PodSpec) -> pb.Pod:
    return pb.Pod(
        uid=spec.pod.uid,
        namespace=spec.pod.namespace,
        name=spec.pod.name,
        containers=[
            pb.Container(name=c.name, kind=c.kind, requests=c.requests, limits=c.limits, claims=c.claims)
            for c in spec.containers
        ],
    )


def pod_info(
    pod: PodView,
    state: str | None = None,
    correlation_id: str = "",
    shared: list[int] | None = None,
    views: Views | None = None,
) -> pb.PodInfo:
    info = pb.PodInfo(
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        state=state or pod.state,
        admitted_seq=pod.admitted_seq,
        correlation_id=correlation_id,
        in_doubt=pod.in_doubt,
    )
    for name, c in pod.containers.items():
        ci = pb.ContainerInfo(
            name=name,
            kind=c.kind,
            cpu_ids=sorted(c.cpus) or list(shared or []),
            exclusive_cpus=bool(c.cpus),
            claim_cdi_devices=cdi_devices(views, c.claims) if views is not None else [],
            memory=[
                pb.MemoryBlock(type=b.type, size=b.size, numa_nodes=b.numa_affinity)
                for b in (views.memory.assignments.get(pod.uid, {}).get(name, []) if views is not None else [])
            ],
        )
        for resource, ids in sorted(c.devices.items()):
            a = c.allocations.get(resource)
            ra = pb.ResourceAllocation(resource=resource, device_ids=ids)
            if a is not None:
                ra.envs.update(a.envs)
                ra.annotations.update(a.annotations)
                ra.mounts.extend(
                    pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                    for m in a.mounts
                )
                ra.devices.extend(
                    pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
                    for d in a.devices
                )
                ra.cdi_devices.extend(a.cdi_devices)
            ci.resources.append(ra)
        info.containers.append(ci)
    return info


#: What a pod's PodInfo was built from: its state, changed_seq (0 unless admitted), the log
#: sequence (0 when admitted), admitted_seq, quarantined_seq (in_doubt changes with it); the
#: shared pool, which every PodInfo shows, empties the cache when it changes (``PodsCache``).
PodKey = tuple[str, int, int, int, int]

#: pods' field number in ListPodsResponse
_PODS = pb.ListPodsResponse.DESCRIPTOR.fields_by_name["pods"].number


class PodsCache(SeqCache[pb.ListPodsResponse]):
    """ListPods' answer, kept encoded per log sequence, and each pod's PodInfo kept encoded
    from one call to the next (``rpc.answer_cache.SeqCache``: built in chunks, from one views
    state, sent as it is).

    An admitted pod's message is built again when a record changed what it holds (its
    ``changed_seq``), its state, admission or quarantine changed, the shared pool changed
    (containers without exclusive CPUs show it), or a claim it uses changed (checked through
    each claim's ``since_seq``, for the few pods that use claims). A pod in any other state
    (admitting, quarantined) is built again at every new sequence: such pods are few."""

    def __init__(self) -> None:
        super().__init__(pb.ListPodsResponse)
        self._shared: list[int] | None = None
        # uid -> (key, the claims its containers use with their since_seq, its element of pods)
        self._pods: dict[str, tuple[PodKey | int, tuple[tuple[str, int], ...], bytes]] = {}

    def _build(self, views: Views) -> Iterator[None]:
        if views.cpus.shared != self._shared:  # every pod's message shows the shared pool
            self._shared, self._pods = list(views.cpus.shared), {}
        seq, claims = views.meta.last_seq, views.claims.claims
        kept: dict[str, tuple[PodKey | int, tuple[tuple[str, int], ...], bytes]] = {}
        built = 0
        for visited, (uid, pod) in enumerate(views.pods.pods.items(), 1):
            if visited % self.visits == 0:
                yield
            key = _pod_key(pod, seq)
            cached = self._pods.get(uid)
            if cached is None or cached[0] != key or not _claims_same(claims, cached[1]):
                used = tuple(
                    (u, c.since_seq if (c := claims.get(u)) is not None else -1)
                    for ct in pod.containers.values()
                    for u in ct.claims
                )
                info = pod_info(pod, shared=views.cpus.shared, views=views)
                cached = self._pods[uid] = (key, used, element(_PODS, info))
                built += 1
                if built % self.chunk == 0:
                    yield
            kept[uid] = cached
        self._pods = kept
        self._parts = [part for _, _, part in kept.values()]


def _pod_key(pod: PodView, seq: int) -> PodKey | int:
    """What the pod's PodInfo is built from (``PodKey``). For most pods, admitted and never
    quarantined, that is its ``changed_seq`` alone (its admission sets it with
    ``admitted_seq``), one int object the pod already holds: 10,000 of them are kept."""
    if pod.state == ADMITTED and pod.changed_seq > 0:
        if not pod.quarantined_seq and pod.admitted_seq <= pod.changed_seq:
            return pod.changed_seq
        return (pod.state, pod.changed_seq, 0, pod.admitted_seq, pod.quarantined_seq)
    return (pod.state, 0, seq, pod.admitted_seq, pod.quarantined_seq)


def _claims_same(claims: dict[str, ClaimView], used: tuple[tuple[str, int], ...]) -> bool:
    for uid, since in used:
        c = claims.get(uid)
        if (c.since_seq if c is not None else -1) != since:
            return False
    return True


def find_pod(views: Views, sel: pb.PodSelector) -> PodView:
    if sel.uid:
        pod = views.pods.pods.get(sel.uid)
        if pod is not None:
            return pod
        raise NotFound(f"no pod with uid {shown(sel.uid)}")
    if not sel.name:
        raise BadRequest("give a pod uid, or a namespace and a name")
    namespace = sel.namespace or "default"
    found = [pod for pod in views.pods.pods.values() if pod.name == sel.name and pod.namespace == namespace]
    if len(found) > 1:
        # A pod deleted and created again under its name has a new uid; the kubelet can hold
        # both for a while (admission does not refuse that), and the name no longer says which.
        candidates = ", ".join(f"{shown(p.uid)} ({p.state})" for p in sorted(found, key=lambda p: p.uid))
        raise AdmissionRefused(f"{len(found)} pods are {shown(f'{namespace}/{sel.name}')}: {candidates}; give the uid")
    if found:
        return found[0]
    raise NotFound(f"no pod {shown(f'{namespace}/{sel.name}')}")


def observed_pod_info(p: ObservedPodView, shared: list[int]) -> pb.PodInfo:
    """A pod as observed beside a kubelet: state "observed", since the record that first saw it."""
    info = pb.PodInfo(uid=p.uid, namespace=p.namespace, name=p.name, state="observed", admitted_seq=p.since_seq)
    for name, c in p.containers.items():
        ci = pb.ContainerInfo(
            name=name,
            cpu_ids=sorted(c.cpus) or list(shared),
            exclusive_cpus=bool(c.cpus),
            claim_cdi_devices=[x for devices in c.claims.values() for d in devices for x in d.cdi_devices],
            memory=[pb.MemoryBlock(type=m.memory_type, size=m.size, numa_nodes=m.numa_nodes) for m in c.memory],
        )
        for resource, ids in sorted(c.devices.items()):
            ci.resources.append(pb.ResourceAllocation(resource=resource, device_ids=ids))
        info.containers.append(ci)
    return info


def find_observed_pod(views: Views, sel: pb.PodSelector) -> ObservedPodView:
    pods = views.kubelet.pods
    if sel.uid:
        found = [p for p in pods.values() if p.uid == sel.uid]
        if found:
            return found[0]
        raise NotFound(f"no pod with uid {shown(sel.uid)}")
    if not sel.name:
        raise BadRequest("give a pod uid, or a namespace and a name")
    key = f"{sel.namespace or 'default'}/{sel.name}"
    pod = pods.get(key)
    if pod is None:
        raise NotFound(f"no pod {shown(key)}")
    return pod


def _grpc_error(err: EventsrcError) -> GRPCError:
    """The status of a user's error; its text escaped, since it may quote the client's."""
    text = escape(str(err))
    if isinstance(err, AdmissionRefused):
        return GRPCError(Status.FAILED_PRECONDITION, text)
    if isinstance(err, BadRequest):
        return GRPCError(Status.INVALID_ARGUMENT, text)
    if isinstance(err, NotFound):
        return GRPCError(Status.NOT_FOUND, text)
    return GRPCError(Status.UNAVAILABLE, text)


class NodeService(NodeBase):
    def __init__(
        self,
        views: Callable[[], Views],
        admitter: Admitter,
        status: Callable[[int], pb.StatusResponse],
        history: History | None = None,
        read_only: str = "",
    ) -> None:
        self._views = views
        self._read_only = read_only  # why Admit and Remove are refused ("" when they are not)
        self._admitter = admitter
        self._status = status
        self._history = history
        self._pods = PodsCache()

    def _readers_wait(self) -> AbstractContextManager[None]:
        """From a decision's request to its answer: readers of the history wait (api.readers)."""
        return self._history.turns.decision_runs() if self._history is not None else nullcontext()

    async def Watch(self, stream: Stream[pb.WatchRequest, pb.WatchEvent]) -> None:
        req = await stream.recv_message()
        assert req is not None
        h = self._history
        if h is None:
            raise GRPCError(Status.UNIMPLEMENTED, "this daemon does not serve its history")
        seq = max(1, req.from_seq)
        task = asyncio.current_task()
        assert task is not None  # a handler runs in one
        with h.stalls.watching(task) as sending:
            try:
                while True:
                    # api.readers: one reader at a time, decisions first; the turn is noted on
                    # ``sending`` as it is given, so that it goes back however this handler ends
                    turn = await to_trio(h.turns.take)(sending)
                    batch = h.read(seq, CHUNK)
                    for i, item in enumerate(batch):
                        if i and not h.turns.holds(turn):
                            break  # its turn passed on while a send waited on the client: take another
                        event = watch_event(item)
                        if item.seq > seq:  # seq.. left the live log before they were sent: said, not skipped
                            event.skipped_from = seq
                        sending.since = h.stalls.now()
                        await stream.send_message(event)
                        sending.since = None
                        seq = item.seq + 1
                    h.turns.done(sending)
                    if not batch:
                        await to_trio(h.appended)(seq)
            except asyncio.CancelledError:
                if not sending.cut_off or task.uncancel() > 0:
                    raise  # not the watchdog's alone: the client went, or the daemon stops
            finally:
                h.turns.done(sending)
        log.warning("watch stream cut off: its client read nothing", stall_s=h.stalls.stall, next_seq=seq)
        raise GRPCError(
            Status.RESOURCE_EXHAUSTED,
            f"this watcher read nothing for {h.stalls.stall:g} s with its stream's window full; "
            f"watch again from seq {seq} to go on",
        )

    async def Status(self, stream: Stream[pb.StatusRequest, pb.StatusResponse]) -> None:
        req = await stream.recv_message()
        assert req is not None
        await stream.send_message(self._status(req.loop_holds_since_ns))

    async def Admit(self, stream: Stream[pb.AdmitRequest, pb.PodInfo]) -> None:
        req = await stream.recv_message()
        assert req is not None
        if self._read_only:
            raise GRPCError(Status.FAILED_PRECONDITION, self._read_only)
        with self._readers_wait():
            try:
                spec = pod_from_proto(req.pod, list(req.claims))
                pod, cid = await to_trio(self._admitter.admit)(spec)
            except EventsrcError as err:
                raise _grpc_error(err) from None
            views = self._views()
            info = pod_info(pod, correlation_id=cid, shared=views.cpus.shared, views=views)
        await stream.send_message(info)

    async def Remove(self, stream: Stream[pb.RemoveRequest, pb.PodInfo]) -> None:
        req = await stream.recv_message()
        assert req is not None
        if self._read_only:
            raise GRPCError(Status.FAILED_PRECONDITION, self._read_only)
        with self._readers_wait():
            try:
                # a uid goes to the admitter as it is: it knows the pods whose admission runs
                uid = req.pod.uid or find_pod(self._views(), req.pod).uid
                pod, cid, removed_seq = await to_trio(self._admitter.remove)(uid)
            except EventsrcError as err:
                raise _grpc_error(err) from None
            info = pod_info(pod, state="removed", correlation_id=cid)
            info.removed_seq = removed_seq
        await stream.send_message(info)

    async def ListPods(self, stream: Stream[pb.ListPodsRequest, pb.ListPodsResponse]) -> None:
        await stream.recv_message()
        if self._read_only:  # beside a kubelet: the pods as observed
            views = self._views()
            pods = [observed_pod_info(p, views.kubelet.shared) for _, p in sorted(views.kubelet.pods.items())]
            await stream.send_message(pb.ListPodsResponse(pods=pods))
            return
        await send_encoded(stream, await self._pods.answer_paced(self._views))

    async def GetPod(self, stream: Stream[pb.PodSelector, pb.PodInfo]) -> None:
        sel = await stream.recv_message()
        assert sel is not None
        if self._read_only:
            views = self._views()
            try:
                observed = find_observed_pod(views, sel)
            except EventsrcError as err:
                raise _grpc_error(err) from None
            await stream.send_message(observed_pod_info(observed, views.kubelet.shared))
            return
        try:
            pod = find_pod(self._views(), sel)
        except EventsrcError as err:
            raise _grpc_error(err) from None
        await stream.send_message(pod_info(pod, shared=self._views().cpus.shared, views=self._views()))


@dataclass(frozen=True)
class History:
    """What Watch serves the log's records with (the daemon's)."""

    #: up to ``n`` records from ``seq`` (from the live log's first when ``seq`` is before it)
    read: Callable[[int, int], list[Record | CorruptRecordError]]
    #: returns once the log holds ``seq`` (a trio function)
    appended: Callable[[int], Awaitable[None]]
    turns: Turns
    stalls: Stalls


def watch_event(item: Record | CorruptRecordError) -> pb.WatchEvent:
    if isinstance(item, CorruptRecordError):
        return pb.WatchEvent(seq=item.seq, corrupt=True, reason=item.reason)
    return pb.WatchEvent(
        seq=item.seq,
        ts_ns=item.ts_ns,
        correlation_id=item.correlation_id,
        type=item.type,
        version=item.version,
        event_json=msgspec.json.encode(item.event).decode(),
    )


def status_response(
    ready: bool,
    instance_id: str,
    last_seq: int,
    sockets: list[str],
    pid: int,
    holds: LoopHolds | None = None,
    holds_since_ns: int = 0,
    retention: RetentionReport | None = None,
    fleet: tuple[ShippingReport, int] | None = None,
) -> pb.StatusResponse:
    """The daemon's Status; with ``holds``, how long its loop was held (the long steps that
    ended after ``holds_since_ns`` when it is set); with ``retention`` (when it is on), how
    its cuts fare; with ``fleet`` (shipping's report and the time of asking), how shipping
    fares."""
    resp = pb.StatusResponse(
        ready=ready,
        version=__version__,
        instance_id=instance_id,
        last_seq=last_seq,
        sockets=sockets,
        pid=pid,
    )
    if retention is not None:
        health = retention.health
        resp.retention.CopyFrom(
            pb.RetentionStatus(
                max_size_bytes=retention.policy.max_size,
                max_age_seconds=retention.policy.max_age_ns / 1e9,
                live_bytes=retention.live_bytes,
                failing=health.reason,
                failing_since_unix_ns=health.since_ns,
                failed_attempts=health.in_a_row,
                failures_total=health.failures,
                retry_seconds=retention.retry_seconds,
                cut_seconds=retention.cut_seconds,
                cut_late=retention.late,
                appends_waiting=retention.appends_waiting,
            )
        )
    if fleet is not None:
        shipping, now_ns = fleet
        resp.fleet.CopyFrom(
            pb.FleetStatus(
                state=shipping.state,
                reason=shipping.reason,
                shipped_seq=shipping.shipped_seq,
                lag_records=shipping.lag_records,
                lag_seconds=shipping.lag_seconds(now_ns),
            )
        )
    if holds is not None:
        loop = resp.loop
        loop.steps, loop.longest_seconds, loop.over_10ms = holds.steps, holds.longest, holds.over
        loop.longest_task, loop.long_steps = holds.longest_task, holds.kept
        loop.longest_cpu_seconds, loop.longest_cpu_task = holds.longest_cpu, holds.longest_cpu_task
        loop.cpu_over_10ms = holds.cpu_over
        if holds_since_ns > 0:
            loop.recent.extend(
                pb.LoopHold(
                    end_monotonic_ns=step.end_ns,
                    seconds=step.seconds,
                    task=step.task,
                    cpu_seconds=step.cpu,
                    process_cpu_seconds=step.process_cpu,
                )
                for step in holds.since(holds_since_ns)
            )
    return resp
