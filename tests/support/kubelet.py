"""A stand-in for a stock kubelet, for tests of ``eventsrc serve --beside-kubelet DIR``.

The kubelet cannot be installed here, so tests play its side: ``StandInKubelet(root)``
serves PodResources v1 with grpcio on ``root/pod-resources/kubelet.sock`` and writes the
kubelet's checkpoint files under ``root``. It answers as the kubelet does
(kubernetes/kubernetes ``pkg/kubelet/apis/podresources/server_v1.go`` and
``grpc/ratelimit.go``; ../shared/kubelet-api.md §4, §5):

* ``List``: the active pods, each with its restartable init containers ("sidecar") and
  then its app containers; plain init containers are left out. ``Get`` finds inactive
  pods too (the pod manager's), ``List`` does not (``GetActivePods``).
* devices: one ``ContainerDevices`` per device and NUMA node, a device without topology
  once without it (``containerDevicesFromResourceDeviceInstances``).
* ``Get`` of an unknown pod: a plain Go error, so gRPC status UNKNOWN with
  "pod <name> in namespace <ns> not found" (the kubelet's wording: the name first).
  ``get_enabled=False``: UNKNOWN "PodResources API Get method disabled" (feature gate
  ``KubeletPodResourcesGet`` off). Before 1.27: a kubelet without ``Get`` in its proto,
  UNIMPLEMENTED, as grpc-go answers an unknown method (it never reaches the limiter).
* each release as data (``ERAS``, ``Era``): what its PodResources serves and what it writes;
  ``StandInKubelet(minor=20)`` plays 1.20, and so on. GetAllocatableResources with its gate off
  (1.21-1.22): UNKNOWN "Pod Resources API GetAllocatableResources disabled".
* the rate limit: a token bucket of 100 calls a second, burst 10, in front of every
  method; a call over it gets RESOURCE_EXHAUSTED "rejected by rate limit". The clock is
  given (``clock=``), so a test can hold time still.

    kubelet = StandInKubelet(tmp_path)          # serving at once
    kubelet.set_allocatable(devices=[Device("example.com/gpu", "gpu-0", numa=(0,))], cpus=range(8))
    kubelet.set_pod("default", "web", [Container("app", devices=[...], cpus=[2, 3])])
    kubelet.write_checkpoints()                 # its files, from the same state
    with kubelet.restarting(): ...              # List empty, Get not found
    kubelet.stop(); kubelet.start()             # the socket gone, then back
    kubelet.calls["List"], kubelet.rejected["List"]
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import grpc

from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.inputs import kubelet_checkpoints as ki
from eventsrc.rpc.ratelimit import TokenBucket
from testbed.servers import kubelet_checkpoints as kc
from tests.support.eventually import eventually
from tests.support.grpcio_stubs import pod_resources, unix_target

pr = pod_resources()
pb = pr.pb2

QPS = 100
BURST = 10
RATE_LIMITED = "rejected by rate limit"
GET_DISABLED = "PodResources API Get method disabled"
SOCKET = "pod-resources/kubelet.sock"


ALLOCATABLE_DISABLED = "Pod Resources API GetAllocatableResources disabled"


@dataclass(frozen=True)
class Era:
    """What a kubelet release serves and writes, as data (kubernetes/kubernetes
    ``pkg/kubelet/apis/podresources``, ``pkg/kubelet/cm/*/state``; docs/kubelet-node.md lists the
    versions eventsrc is tested beside). ``minor``: the first 1.x release of the era."""

    minor: int
    #: ``GetAllocatableResources`` in its proto (1.21), and served with the gate's default
    #: (``KubeletPodResourcesGetAllocatable``: alpha, off, in 1.21-1.22; on from 1.23)
    allocatable: bool = True
    allocatable_on: bool = True
    #: ``Get`` in its proto (1.27)
    get: bool = True
    #: ``cpu_ids`` is the container's whole cpuset, the shared pool included, before 1.21
    #: (kubernetes#97415); only its exclusive CPUs since
    whole_cpuset: bool = False
    memory: bool = True  # ContainerMemory in answers (1.22)
    claims: bool = True  # DynamicResource (1.27)
    claim_devices: bool = True  # ClaimResource's driver, pool and device names (1.31)
    share_ids: bool = True  # a shared device's share id, in answers and the DRA checkpoint (1.35)
    #: the empty ``device-plugins/DEPRECATION`` file the device manager's plugin handler makes,
    #: which sends device plugins to register through ``plugins_registry``
    deprecation_file: bool = True
    #: the formats of ``cpu_manager_state`` and ``memory_manager_state`` it writes (docs/adr/0039;
    #: "" for memory: no memory manager before 1.21); 1.36 as with ``PodLevelResourceManagers`` on
    cpu_state: str = "v2"
    memory_state: str = "v1"


#: one entry per era a scenario runs against (the newest era with ``minor`` <= a release's is its)
ERAS: dict[str, Era] = {
    "1.20": Era(
        20, allocatable=False, allocatable_on=False, get=False, whole_cpuset=True, memory=False, claims=False,
        claim_devices=False, share_ids=False, memory_state="",
    ),
    "1.21": Era(21, allocatable_on=False, get=False, memory=False, claims=False, claim_devices=False, share_ids=False),
    "1.22": Era(22, allocatable_on=False, get=False, claims=False, claim_devices=False, share_ids=False),
    "1.23": Era(23, get=False, claims=False, claim_devices=False, share_ids=False),
    "1.27": Era(27, claim_devices=False, share_ids=False),
    "1.31": Era(31, share_ids=False),
    "1.35": Era(35),
    "1.36": Era(36, cpu_state="v3", memory_state="v2"),
    "1.37": Era(37, cpu_state="v4", memory_state="v3"),
}  # fmt: skip


def era_of(minor: int) -> Era:
    """The era of the kubelet 1.``minor``."""
    return max((e for e in ERAS.values() if e.minor <= minor), key=lambda e: e.minor)


def pod_not_found(namespace: str, name: str) -> str:
    """The kubelet's message for Get of a pod it does not know."""
    return f"pod {name} in namespace {namespace} not found"


@dataclass(frozen=True)
class Device:
    """A device of a resource, with the NUMA nodes its plugin reported (none: no topology)."""

    resource: str
    id: str
    numa: tuple[int, ...] = ()


@dataclass(frozen=True)
class Memory:
    """Memory of one type (``memory``, ``hugepages-2Mi``), in bytes, on these NUMA nodes."""

    type: str
    size: int
    numa: tuple[int, ...] = ()


@dataclass(frozen=True)
class ClaimDevice:
    driver: str
    pool: str
    device: str
    cdi: tuple[str, ...] = ()
    request_names: tuple[str, ...] = ()
    share_id: str | None = None


@dataclass(frozen=True)
class Claim:
    """A ResourceClaim prepared for a container (``uid``: derived from the name when empty)."""

    name: str
    namespace: str
    devices: tuple[ClaimDevice, ...] = ()
    uid: str = ""

    @property
    def claim_uid(self) -> str:
        return self.uid or str(uuid.uuid5(uuid.NAMESPACE_URL, f"claim/{self.namespace}/{self.name}"))


@dataclass(frozen=True)
class Container:
    """A container and what the kubelet's managers gave it. ``kind``: "app", "sidecar" (a
    restartable init container, listed first) or "init" (not listed)."""

    name: str
    devices: Sequence[Device] = ()
    cpus: Sequence[int] = ()
    memory: Sequence[Memory] = ()
    claims: Sequence[Claim] = ()
    kind: Literal["app", "sidecar", "init"] = "app"


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    uid: str
    containers: tuple[Container, ...]
    active: bool = True  # False: terminated, still known to the pod manager


@dataclass
class Allocatable:
    devices: list[Device] = field(default_factory=list)
    cpus: list[int] = field(default_factory=list)
    memory: list[Memory] = field(default_factory=list)


def _topology(numa: Iterable[int]) -> Any:
    return pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in numa])


def container_devices(devices: Iterable[Device]) -> list[Any]:
    """The kubelet's ``ContainerDevices``: one per device and NUMA node."""
    out = []
    for d in devices:
        if not d.numa:
            out.append(pb.ContainerDevices(resource_name=d.resource, device_ids=[d.id]))
        for node in d.numa:
            out.append(pb.ContainerDevices(resource_name=d.resource, device_ids=[d.id], topology=_topology([node])))
    return out


def container_memory(memory: Iterable[Memory]) -> list[Any]:
    return [pb.ContainerMemory(memory_type=m.type, size=m.size, topology=_topology(m.numa)) for m in memory]


class StandInKubelet:
    """PodResources v1 on ``root/pod-resources/kubelet.sock`` and checkpoint files under
    ``root``; every method may be called from any thread. ``minor``: the kubelet's 1.x
    release (features it lacks are left out of answers); ``clock``: the rate limiter's."""

    def __init__(
        self,
        root: Path,
        *,
        get_enabled: bool = True,
        minor: int = 36,
        clock: Callable[[], float] = time.monotonic,
        qps: float = QPS,
        burst: int = BURST,
        start: bool = True,
    ) -> None:
        self.root = root
        self.socket = root / SOCKET
        self.get_enabled = get_enabled
        self.minor = minor
        self.era = era_of(minor)
        self.limiter = TokenBucket(rate=qps, burst=burst, clock=clock)
        self.calls: Counter[str] = Counter()  # every call that reached the server, by method
        self.rejected: Counter[str] = Counter()  # those the rate limit refused
        self.listed_at: list[int] = []  # when each List was answered (wall clock, ns)
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], Pod] = {}
        self._allocatable = Allocatable()
        self._restarting = False
        self._server: grpc.Server | None = None
        # stopped servers kept until the stand-in closes: gRPC removes a unix listener's path when
        # the server is collected, which could be the path a later start() is serving on
        self._stopped: list[grpc.Server] = []
        if start:
            self.start()

    # ----------------------------------------------------------------------- state

    def set_pod(
        self,
        namespace: str,
        name: str,
        containers: Sequence[Container] = (),
        *,
        uid: str = "",
        active: bool = True,
    ) -> Pod:
        """Add or replace a pod (``uid``: derived from namespace and name when empty)."""
        pod = Pod(
            namespace,
            name,
            uid or str(uuid.uuid5(uuid.NAMESPACE_URL, f"pod/{namespace}/{name}")),
            tuple(containers),
            active,
        )
        with self._lock:
            self._pods[(namespace, name)] = pod
        return pod

    def remove_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            self._pods.pop((namespace, name), None)

    def pods(self) -> list[Pod]:
        with self._lock:
            return list(self._pods.values())

    def set_allocatable(
        self, devices: Iterable[Device] = (), cpus: Iterable[int] = (), memory: Iterable[Memory] = ()
    ) -> None:
        """What GetAllocatableResources answers: healthy devices, allocatable CPUs, memory."""
        with self._lock:
            self._allocatable = Allocatable(list(devices), sorted(cpus), list(memory))

    @contextmanager
    def restarting(self, reopen: bool = True) -> Iterator[None]:
        """A kubelet that has just restarted: its pod manager is not synced yet (List answers
        no pods, Get finds none) and no plugin has registered again (no allocatable
        devices). ``reopen``: the socket is removed and made again first, as a new kubelet
        process does."""
        if reopen:
            self.stop()
        with self._lock:
            self._restarting = True
        try:
            if reopen:
                self.start()
            yield
        finally:
            with self._lock:
                self._restarting = False

    # ----------------------------------------------------------------------- the server

    def start(self) -> None:
        """Serve on the socket (made again if it is there, as the kubelet removes it first)."""
        if self._server is not None:
            return
        self.socket.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        if self.era.deprecation_file:
            (self.root / "device-plugins").mkdir(mode=0o750, exist_ok=True)
            (self.root / "device-plugins" / "DEPRECATION").touch()
        server = grpc.server(ThreadPoolExecutor(max_workers=4, thread_name_prefix="standin-kubelet"))
        pr.add_PodResourcesListerServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(unix_target(self.socket))
        server.start()
        self._server = server

    def stop(self, remove_socket: bool = True) -> None:
        """Stop serving and remove the socket; ``remove_socket=False``: leave it, as a kubelet
        that stops or is killed leaves it (a connection is then refused)."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=None).wait()
            self._stopped.append(server)
            if remove_socket:
                # gRPC removes its socket as it destroys the listener, which a loaded machine may
                # see after the stop returns (at once, nearly always; more than 2 s once, in a
                # clean clone's make test): wait for that, so that a socket the next start makes
                # is never the one it removes
                with contextlib.suppress(AssertionError):
                    eventually(lambda: not self.socket.exists(), "the stopped server's socket to go", timeout=30)
        if remove_socket:
            self.socket.unlink(missing_ok=True)

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> StandInKubelet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def admit(self, method: str) -> bool:
        """Count a call and take a token (False: rejected by the rate limit)."""
        with self._lock:
            self.calls[method] += 1
            if self.limiter.allow():
                return True
            self.rejected[method] += 1
            return False

    # ----------------------------------------------------------------------- answers

    def _container(self, pod: Pod, c: Container) -> Any:
        # before 1.21 (kubernetes#97415) cpu_ids is the container's whole cpuset: the shared pool
        # for a container with no exclusive CPUs
        cpus = list(c.cpus) if c.cpus or not self.era.whole_cpuset else sorted(self._shared_pool())
        out = pb.ContainerResources(name=c.name, devices=container_devices(c.devices), cpu_ids=cpus)
        if self.era.memory:
            out.memory.extend(container_memory(c.memory))
        if self.era.claims:
            for claim in c.claims:
                resources = [pb.ClaimResource(cdi_devices=[pb.CDIDevice(name=n) for n in d.cdi]) for d in claim.devices]
                if self.era.claim_devices:
                    for r, d in zip(resources, claim.devices, strict=True):
                        r.driver_name, r.pool_name, r.device_name = d.driver, d.pool, d.device
                        if d.share_id is not None and self.era.share_ids:
                            r.share_id = d.share_id
                out.dynamic_resources.append(
                    pb.DynamicResource(
                        claim_name=claim.name, claim_namespace=claim.namespace, claim_resources=resources
                    )
                )
        return out

    def pod_resources(self, pod: Pod) -> Any:
        listed = [c for c in pod.containers if c.kind == "sidecar"] + [c for c in pod.containers if c.kind == "app"]
        return pb.PodResources(
            name=pod.name, namespace=pod.namespace, containers=[self._container(pod, c) for c in listed]
        )

    def list_answer(self) -> Any:
        with self._lock:
            pods = [] if self._restarting else [p for p in self._pods.values() if p.active]
        return pb.ListPodResourcesResponse(pod_resources=[self.pod_resources(p) for p in pods])

    def get_answer(self, namespace: str, name: str) -> Any | None:
        with self._lock:
            pod = None if self._restarting else self._pods.get((namespace, name))
        return None if pod is None else pb.GetPodResourcesResponse(pod_resources=self.pod_resources(pod))

    def allocatable_answer(self) -> Any:
        with self._lock:
            a, restarting = self._allocatable, self._restarting
        out = pb.AllocatableResourcesResponse(
            devices=[] if restarting else container_devices(a.devices), cpu_ids=a.cpus
        )
        if self.era.memory:
            out.memory.extend(container_memory(a.memory))
        return out

    # ----------------------------------------------------------------------- checkpoints

    def _held(self) -> list[tuple[Pod, Container]]:
        with self._lock:
            return [(p, c) for p in self._pods.values() for c in p.containers]

    def write_device_checkpoint(self) -> Path:
        """``device-plugins/kubelet_internal_checkpoint``: one entry per (pod, container,
        resource), its devices by NUMA node (-1: no topology); the allocatable devices are
        the registered ones."""
        entries = []
        for pod, c in self._held():
            for resource in sorted({d.resource for d in c.devices}):
                by_node: dict[int, list[str] | None] = {}
                for d in c.devices:
                    if d.resource == resource:
                        for node in d.numa or (-1,):
                            ids = by_node.setdefault(node, [])
                            assert ids is not None
                            ids.append(d.id)
                entries.append(
                    ki.PodDevicesEntry(
                        pod_uid=pod.uid,
                        container_name=c.name,
                        resource_name=resource,
                        device_ids=by_node,
                        alloc_resp=b"",
                    )
                )
        with self._lock:
            registered: dict[str, list[str]] = {}
            for d in self._allocatable.devices:
                registered.setdefault(d.resource, []).append(d.id)
        return kc.write(self.root, kc.DEVICE_CHECKPOINT, kc.device_checkpoint(entries or None, registered))

    def write_cpu_state(self, policy: str = "static") -> Path:
        """``cpu_manager_state``: exclusive CPUs per container; the rest of the allocatable
        CPUs are the shared pool."""
        entries: dict[str, dict[str, str]] = {}
        for pod, c in self._held():
            if c.cpus:
                entries.setdefault(pod.uid, {})[c.name] = str(CPUSet(c.cpus))
        default = CPUSet(self._shared_pool())
        content = kc.cpu_state(policy, str(default), entries, version=self.era.cpu_state)
        return kc.write(self.root, kc.CPU_STATE, content)

    def _shared_pool(self) -> set[int]:
        """The allocatable CPUs no container holds exclusively."""
        used = {cpu for _, c in self._held() for cpu in c.cpus}
        with self._lock:
            return set(self._allocatable.cpus) - used

    def write_memory_state(self) -> Path:
        """``memory_manager_state`` (policy Static): each NUMA node's allocatable memory by
        type and what the containers hold of it."""
        entries: dict[str, dict[str, list[kc.MemoryBlock]]] = {}
        reserved: Counter[tuple[int, str]] = Counter()
        assignments: Counter[int] = Counter()
        for pod, c in self._held():
            for m in c.memory:
                entries.setdefault(pod.uid, {}).setdefault(c.name, []).append(
                    kc.MemoryBlock(list(m.numa), m.type, m.size)
                )
                for node in m.numa[:1]:  # a block spanning nodes is charged to the first
                    reserved[(node, m.type)] += m.size
                for node in m.numa:
                    assignments[node] += 1
        with self._lock:
            memory = list(self._allocatable.memory)
        tables: dict[int, dict[str, kc.MemoryTable]] = {}
        for m in memory:
            for node in m.numa or (0,):
                tables.setdefault(node, {})[m.type] = kc.MemoryTable(m.size, reserved=reserved[(node, m.type)])
        machine = {node: kc.NUMANodeState(assignments[node], t, [node]) for node, t in tables.items()}
        state = kc.MemoryState("Static", machine, entries)
        return kc.write(self.root, kc.MEMORY_STATE, kc.memory_state(state, version=self.era.memory_state))

    def write_dra_state(self) -> Path:
        """``dra_manager_state``: every claim a container uses, with the pods that use it."""
        claims: dict[str, tuple[Claim, set[str]]] = {}
        for pod, c in self._held():
            for claim in c.claims:
                claims.setdefault(claim.claim_uid, (claim, set()))[1].add(pod.uid)
        out = []
        for uid, (claim, pods) in sorted(claims.items()):
            drivers: dict[str, list[ki.DRADevice]] = {}
            for d in claim.devices:
                drivers.setdefault(d.driver, []).append(
                    ki.DRADevice(
                        pool_name=d.pool,
                        device_name=d.device,
                        share_id=d.share_id,
                        request_names=list(d.request_names) or None,
                        cdi_device_ids=list(d.cdi) or None,
                    )
                )
            out.append(
                ki.DRAClaim(
                    claim_uid=uid,
                    claim_name=claim.name,
                    namespace=claim.namespace,
                    pod_uids=sorted(pods),
                    driver_state=drivers,
                )
            )
        return kc.write(self.root, kc.DRA_STATE, kc.dra_state(out, share_ids=self.era.share_ids))

    def write_checkpoints(self) -> list[Path]:
        """Every file its era writes, from the current state."""
        memory = [self.write_memory_state()] if self.era.memory_state else []  # none before 1.21
        return [self.write_device_checkpoint(), self.write_cpu_state(), *memory, self.write_dra_state()]


class _Servicer(pr.PodResourcesListerServicer):  # type: ignore[misc,name-defined]
    def __init__(self, kubelet: StandInKubelet) -> None:
        self.k = kubelet

    def _admit(self, method: str, context: grpc.ServicerContext) -> None:
        if not self.k.admit(method):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, RATE_LIMITED)

    def List(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._admit("List", context)
        answer = self.k.list_answer()
        self.k.listed_at.append(time.time_ns())
        return answer

    def GetAllocatableResources(self, request: Any, context: grpc.ServicerContext) -> Any:
        if not self.k.era.allocatable:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, _unknown("GetAllocatableResources"))
        self._admit("GetAllocatableResources", context)
        if not self.k.era.allocatable_on:
            context.abort(grpc.StatusCode.UNKNOWN, ALLOCATABLE_DISABLED)
        return self.k.allocatable_answer()

    def Get(self, request: Any, context: grpc.ServicerContext) -> Any:
        if not self.k.era.get:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, _unknown("Get"))
        self._admit("Get", context)
        if not self.k.get_enabled:
            context.abort(grpc.StatusCode.UNKNOWN, GET_DISABLED)
        answer = self.k.get_answer(request.pod_namespace, request.pod_name)
        if answer is None:
            context.abort(grpc.StatusCode.UNKNOWN, pod_not_found(request.pod_namespace, request.pod_name))
        return answer


def _unknown(method: str) -> str:
    """grpc-go's answer to a method its service does not have."""
    return f"unknown method {method} for service v1.PodResourcesLister"
