"""Beside a kubelet (``serve --beside-kubelet DIR``): the shell that asks the kubelet what it
decided and records it as observed (``eventsrc.core.kubelet_observations`` says what changed).

It reads, and never writes, under DIR:

* the kubelet's PodResources v1 at ``DIR/pod-resources/kubelet.sock``: ``List`` (and
  ``GetAllocatableResources``) on each look at the whole node, ``Get`` for the pods a runtime
  event names where the kubelet serves it (1.27+, behind a feature gate before 1.34), ``List``
  otherwise. Calls keep well under the kubelet's rate limit (100/s, burst 10): at most
  ``CALL_RATE`` a second, one at a time;
* its checkpoint files: a change of one is a reason to look (inotify on DIR and
  DIR/device-plugins, as NFD's topology-updater watches them), the CPU manager's gives the
  shared pool (PodResources does not list it), the device manager's gives pod uids where the
  runtime is not seen. A file that cannot be read or verified is recorded, once per reason.

It looks on each runtime event (NRI, when ``--nri-socket`` is given), on each change of a
checkpoint file or of the PodResources socket, and every ``resync`` seconds; never busily.
When the kubelet cannot be asked, the time is recorded as a gap (``ObservationGapFound``,
source "kubelet") and closed by the next answer; so is the time eventsrc itself was not
running, at its start.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import trio
from grpclib import Status
from grpclib.exceptions import GRPCError

from eventsrc import events as ev
from eventsrc.core.backoff import Backoff
from eventsrc.core.kubelet_observations import (
    CPUManager,
    Identities,
    Look,
    SeenClaim,
    SeenContainer,
    SeenDevices,
    SeenPod,
    allocatable_changes,
    cpu_disagreements,
    double_allocations,
    identities,
    missing,
    observe,
    release_gone,
    taken_from_another,
)
from eventsrc.errors import EventsrcError
from eventsrc.gen.podresources.v1 import api_grpc as pr_grpc
from eventsrc.gen.podresources.v1 import api_pb2 as pr
from eventsrc.inputs import kubelet_checkpoints as ki
from eventsrc.node.interfaces import Recorder
from eventsrc.obs.logger import get_logger
from eventsrc.rpc.bridge import CALL_ERRORS, endpoint_socket_error, to_aio, unix_channel, why
from eventsrc.rpc.ratelimit import TokenBucket
from eventsrc.state.views import Views

log = get_logger(__name__)

DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet")
DEFAULT_ROOT = Path("/var/lib/eventsrc")
DEFAULT_RESYNC = 60.0
CALL_TIMEOUT = 10.0
CALL_RATE = 10.0  # calls a second at most: a tenth of the kubelet's limit, for the other readers
CALL_BURST = 3
RETRY_FIRST = 1.0
#: how long the kubelet's answer and its CPU manager's file must disagree to be a fact
DISAGREEMENT_LASTS = 2.0
GET_DISABLED = "PodResources API Get method disabled"
RUNTIME_EVENTS = (
    ev.PodSandboxStarted,
    ev.PodSandboxRemoved,
    ev.ContainerCreated,
    ev.ContainerStarted,
    ev.ContainerStopped,
    ev.ContainerRemoved,
    ev.RuntimeConnected,
)


@dataclass(frozen=True)
class BesideOptions:
    kubelet_dir: Path = DEFAULT_KUBELET_DIR
    resync: float = DEFAULT_RESYNC
    runtime: bool = False  # NRI is in use (--nri-socket): the runtime's sandboxes are seen

    @property
    def socket(self) -> Path:
        return self.kubelet_dir / "pod-resources" / "kubelet.sock"

    def checkpoints(self) -> dict[str, Path]:
        d = self.kubelet_dir
        return {
            ki.DEVICE_CHECKPOINT: d / "device-plugins" / ki.DEVICE_CHECKPOINT,
            ki.CPU_STATE: d / ki.CPU_STATE,
            ki.MEMORY_STATE: d / ki.MEMORY_STATE,
            ki.DRA_STATE: d / ki.DRA_STATE,
        }


def refuse_root_inside(root: Path, kubelet_dir: Path) -> None:
    """eventsrc's own state may be neither the kubelet's directory nor under it: it never
    creates anything there. Raises EventsrcError (one line)."""
    r, k = root.resolve(), kubelet_dir.resolve()
    if r == k or k in r.parents:
        raise EventsrcError(
            f"--root-dir {root} is inside the kubelet's directory {kubelet_dir}: beside a kubelet eventsrc writes "
            f"nothing there; give its own, e.g. --root-dir {DEFAULT_ROOT}"
        )


class KubeletUnavailable(EventsrcError):
    pass


def _numa(t: pr.TopologyInfo) -> tuple[int, ...]:
    return tuple(sorted(n.ID for n in t.nodes))


def seen_pod(p: pr.PodResources) -> SeenPod:
    """A PodResources answer's pod, as the core compares it."""
    containers = []
    for c in p.containers:
        claims = tuple(
            SeenClaim(
                namespace=d.claim_namespace,
                name=d.claim_name,
                devices=tuple(
                    ev.ObservedClaimDevice(
                        driver=r.driver_name,
                        pool=r.pool_name,
                        device=r.device_name,
                        cdi_devices=[x.name for x in r.cdi_devices],
                        share_id=r.share_id,
                    )
                    for r in d.claim_resources
                ),
            )
            for d in c.dynamic_resources
        )
        containers.append(
            SeenContainer(
                name=c.name,
                devices=tuple(
                    SeenDevices(resource=d.resource_name, device_ids=tuple(d.device_ids), numa_nodes=_numa(d.topology))
                    for d in c.devices
                ),
                cpus=tuple(c.cpu_ids),
                memory=tuple(
                    ev.ObservedMemory(memory_type=m.memory_type, size=m.size, numa_nodes=list(_numa(m.topology)))
                    for m in c.memory
                ),
                claims=claims,
            )
        )
    return SeenPod(namespace=p.namespace, name=p.name, containers=tuple(containers))


class KubeletClient:
    """PodResources v1 on the kubelet's socket, connected on first use and after a failure."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._channel: Any = None
        self._stub: pr_grpc.PodResourcesListerStub | None = None
        self.get_served = True  # until the kubelet says otherwise
        self._bucket = TokenBucket(CALL_RATE, CALL_BURST, trio.current_time)

    async def _call(self, method: str, request: Any) -> Any:
        reason = endpoint_socket_error(self.path)
        if reason:
            self.close()
            raise KubeletUnavailable(reason)
        await trio.sleep(self._bucket.delay())
        self._bucket.spend()
        if self._stub is None:
            self._channel = unix_channel(self.path)
            self._stub = pr_grpc.PodResourcesListerStub(self._channel)
        try:
            return await to_aio(getattr(self._stub, method))(request, timeout=CALL_TIMEOUT)
        except GRPCError as exc:
            if method == "Get" and exc.status in (Status.UNIMPLEMENTED, Status.UNKNOWN):
                raise  # the caller tells "not served" and "not found" apart
            if exc.status is not Status.RESOURCE_EXHAUSTED:  # that: other readers took the kubelet's budget
                self.close()
            raise KubeletUnavailable(f"{method} on {self.path}: {why(exc)}") from None
        except CALL_ERRORS as exc:
            self.close()
            raise KubeletUnavailable(f"{method} on {self.path}: {why(exc)}") from None

    async def list(self) -> list[pr.PodResources]:
        answer = await self._call("List", pr.ListPodResourcesRequest())
        return list(answer.pod_resources)

    async def get(self, namespace: str, name: str) -> pr.PodResources | None:
        """The pod, or None when the kubelet does not know it. Raises NotImplementedError
        when the kubelet does not serve Get (older, or its feature gate off)."""
        try:
            answer = await self._call("Get", pr.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace))
        except GRPCError as exc:
            if exc.status is Status.UNIMPLEMENTED or GET_DISABLED in (exc.message or ""):
                self.get_served = False
                raise NotImplementedError from None
            if "not found" in (exc.message or ""):
                return None
            self.close()
            raise KubeletUnavailable(f"Get on {self.path}: {why(exc)}") from None
        return answer.pod_resources if answer.HasField("pod_resources") else None

    async def allocatable(self) -> pr.AllocatableResourcesResponse:
        return await self._call("GetAllocatableResources", pr.AllocatableResourcesRequest())

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel, self._stub = None, None


class Beside:
    """The observer. ``saw(records)`` is told every batch the log committed (the runtime's
    events among them ask for a look); ``run`` looks until cancelled."""

    def __init__(
        self,
        recorder: Recorder,
        options: BesideOptions,
        runtime_synchronized: Callable[[], bool] = lambda: False,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.recorder = recorder
        self.runtime_synchronized = runtime_synchronized  # NRI's view is current (this run synchronized)
        self.options = options
        self.clock = clock
        self.client = KubeletClient(options.socket)
        self._full = True
        self._pods: set[str] = set()  # "namespace/name" to ask with Get
        self._removed: set[str] = set()  # uids whose last sandbox the runtime removed
        self._wake = trio.Event()
        self._said: dict[str, str] = {}  # checkpoint path -> the reason last recorded
        self._files: dict[str, _Read] = {}  # checkpoint name -> as last read (read again only when changed)
        self._device_uids: dict[tuple[str, str, str], str] = {}
        self._runtime_gaps: list[ev.EventBase] = []  # to record: the runtime (dis)connected
        self._missing: frozenset[str] = frozenset()  # observed pods the last complete look did not list
        self._allocatable_trouble = ""  # why GetAllocatableResources could not be had, as last said
        self._answered_ns = 0  # when the kubelet last answered a look (0: not in this run)
        self._disagreed: dict[bytes, float] = {}  # the CPU disagreements the last complete look found: since
        self._said_disagreed: set[bytes] = set()  # those recorded, while they last

    # ----------------------------------------------------------------- asked to look

    def saw(self, records: Sequence[ev.Record]) -> None:
        views = self.recorder.views
        if self.options.runtime:
            gaps = runtime_gap_events(views, [*self._runtime_gaps, *records])
            if gaps:
                self._runtime_gaps = gaps
                self._wake.set()
        for r in records:
            e = r.event
            if not isinstance(e, RUNTIME_EVENTS):
                continue
            if isinstance(e, ev.PodSandboxStarted):
                self._pods.add(f"{e.pod.namespace}/{e.pod.name}")
            elif isinstance(e, ev.ContainerCreated):
                s = views.runtime.sandboxes.get(e.sandbox_id)
                if s is not None:
                    self._pods.add(f"{s.namespace}/{s.name}")
                else:
                    self._full = True
            elif isinstance(e, ev.PodSandboxRemoved):
                if e.pod_uid and not any(s.uid == e.pod_uid for s in views.runtime.sandboxes.values()):
                    self._removed.add(e.pod_uid)
                self._full = True
            elif isinstance(e, (ev.ContainerStopped, ev.ContainerRemoved, ev.RuntimeConnected)):
                self._full = True
            self._wake.set()

    def look_again(self) -> None:
        self._full = True
        self._wake.set()

    # ----------------------------------------------------------------- running

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Look now, then on every reason to, until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_files)
            nursery.start_soon(self._resync)
            task_status.started()
            retry = Backoff(RETRY_FIRST, self.options.resync)
            while True:
                try:
                    await self.look()
                    retry.reset()
                except KubeletUnavailable as exc:
                    await self._gap_open("kubelet", str(exc))
                    with trio.move_on_after(retry.next()):
                        await self._wake.wait()
                    continue
                await self._wake.wait()

    async def _resync(self) -> None:
        while True:
            await trio.sleep(self.options.resync)
            self.look_again()

    async def look(self) -> None:
        """One look: the checkpoint files, then the kubelet (every pod when a full look is due,
        else the pods runtime events named), then what it says differs, recorded."""
        self._wake = trio.Event()
        gaps, self._runtime_gaps = self._runtime_gaps, []
        if gaps:
            await self._observe(gaps)
        await self._close_runtime_gap()
        full, pods, removed = self._full, self._pods, self._removed
        self._full, self._pods, self._removed = False, set(), set()
        try:
            await self._read_checkpoints()
            answer: Look | None = None
            allocatable: pr.AllocatableResourcesResponse | None = None
            if not full and pods and self.client.get_served:
                try:
                    found = []
                    for key in sorted(pods):
                        ns, _, name = key.partition("/")
                        p = await self.client.get(ns, name)
                        if p is not None:
                            found.append(seen_pod(p))
                    answer = Look(pods=tuple(found), complete=False, asked=frozenset(pods), source="Get")
                    self._answered_ns = self.clock()  # the kubelet's last good answer
                    if taken_from_another(self.recorder.views.kubelet, answer):
                        answer = None  # only the whole list says whether its holder let it go
                except NotImplementedError:
                    full = True
            if full or (pods and answer is None):
                answer = Look(pods=tuple(seen_pod(p) for p in await self.client.list()), complete=True)
                self._answered_ns = self.clock()
                allocatable = await self._allocatable()  # a kubelet without it may stop meanwhile
        except BaseException:
            # asked again next time: nothing of this look was recorded
            self._full, self._pods = self._full or full, self._pods | pods
            self._removed |= removed
            raise
        await self._gap_close("kubelet")
        await self._record_look(answer, allocatable, removed)

    async def _allocatable(self) -> pr.AllocatableResourcesResponse | None:
        """GetAllocatableResources, or None (said once per reason) when the kubelet does not
        answer it: what the pods hold is still looked at."""
        try:
            answer = await self.client.allocatable()
        except KubeletUnavailable as exc:
            if str(exc) != self._allocatable_trouble:
                self._allocatable_trouble = str(exc)
                log.warning("the kubelet's allocatable devices and CPUs not seen", reason=str(exc))
            return None
        self._allocatable_trouble = ""
        return answer

    async def _close_runtime_gap(self) -> None:
        """A runtime gap recorded open after the runtime connected again (its close was
        computed before the open was recorded) is closed now."""
        views = self.recorder.views
        since = views.kubelet.gaps.get("runtime")
        if since is not None and views.runtime.connected and not self._runtime_gaps:
            await self._observe([ev.ObservationGapFound(source="runtime", since_ns=since, until_ns=self.clock())])

    async def _record_look(
        self, answer: Look | None, allocatable: pr.AllocatableResourcesResponse | None, removed: set[str]
    ) -> None:
        views = self.recorder.views
        current = self.options.runtime and self.runtime_synchronized()
        runtime = views.runtime if current else None
        before = self._missing
        if answer is not None and answer.complete:
            self._missing = missing(views.kubelet, answer)
        events: list[ev.EventBase] = release_gone(views.kubelet, answer, runtime, removed, before)
        if events:
            await self._observe(events)
        if answer is not None:
            ids: Identities = identities(runtime, self._device_uids, self._cpu_manager(), self._memory_manager())
            events = observe(views.kubelet, answer, ids)
            if events:
                await self._observe(events)
                await self._record_findings(events)
            if answer.complete:
                await self._record_disagreements(cpu_disagreements(self.recorder.views.kubelet, answer, ids))
        if allocatable is not None:
            devices: dict[str, dict[str, tuple[int, ...]]] = {}
            for d in allocatable.devices:
                for i in d.device_ids:
                    devices.setdefault(d.resource_name, {})[i] = _numa(d.topology)
            events = allocatable_changes(views.kubelet, devices, allocatable.cpu_ids)
            await self._allocatable_seen(events)
        elif answer is not None and answer.complete and self._allocatable_trouble:
            await self._allocatable_from_checkpoint()

    async def _allocatable_from_checkpoint(self) -> None:
        """Without GetAllocatableResources: the device manager checkpoint's RegisteredDevices (the
        healthy devices each plugin registered), recorded as such; where that file is not read
        either, nothing shows allocatable: a gap ("kubelet allocatable") until something does."""
        views = self.recorder.views
        read = self._files.get(ki.DEVICE_CHECKPOINT)
        checkpoint = read.result if read is not None else None
        if not isinstance(checkpoint, ki.DeviceCheckpoint):
            if ALLOCATABLE_GAP not in views.kubelet.gaps:
                reason = f"{self._allocatable_trouble}; and no device checkpoint read"
                await self._observe(
                    [ev.ObservationGapFound(source=ALLOCATABLE_GAP, since_ns=self.clock(), reason=reason)]
                )
            return
        devices = {r: {i: () for i in ids or ()} for r, ids in (checkpoint.registered_devices or {}).items()}
        source = f"checkpoint {self.options.checkpoints()[ki.DEVICE_CHECKPOINT]} (RegisteredDevices)"
        events = allocatable_changes(views.kubelet, devices, views.kubelet.allocatable_cpus, source)
        await self._allocatable_seen(events)

    async def _allocatable_seen(self, events: list[ev.EventBase]) -> None:
        since = self.recorder.views.kubelet.gaps.get(ALLOCATABLE_GAP)
        if since is not None:
            events = [ev.ObservationGapFound(source=ALLOCATABLE_GAP, since_ns=since, until_ns=self.clock()), *events]
        if events:
            await self._observe(events)

    def _cpu_manager(self) -> CPUManager | None:
        """The CPU manager's state as last read (None: not read: no CPU is known exclusive)."""
        read = self._files.get(ki.CPU_STATE)
        state = read.result if read is not None else None
        if not isinstance(state, ki.CPUCheckpoint):
            return None
        # whatever its format (1.20's to 1.37's): a container's CPUs, by pod uid and name (with
        # pod-level resources, within its pod's exclusive CPUs, and so no other pod's)
        exclusive = {key: frozenset(cpus) for key, cpus in state.containers.items()}
        source = str(self.options.checkpoints()[ki.CPU_STATE])
        return CPUManager(exclusive=exclusive, shared=frozenset(state.shared), source=source, policy=state.policy_name)

    def _memory_manager(self) -> dict[tuple[str, str], tuple[ev.ObservedMemory, ...]]:
        """Each container's memory blocks as the memory manager's state last read gives them."""
        read = self._files.get(ki.MEMORY_STATE)
        state = read.result if read is not None else None
        if not isinstance(state, ki.MemoryCheckpoint):
            return {}
        return {
            key: tuple(
                ev.ObservedMemory(memory_type=b.type, size=b.size, numa_nodes=b.numa_affinity or []) for b in blocks
            )
            for key, blocks in state.containers.items()
        }

    async def _record_disagreements(self, found: list[ev.KubeletCPUsDisagreed]) -> None:
        """Those ``found`` at every complete look for ``DISAGREEMENT_LASTS`` seconds, each once
        while it lasts. The kubelet writes its file as its state changes, within milliseconds;
        eventsrc reads the file and asks for the answer at different moments."""
        now = trio.current_time()
        seen = {msgspec.json.encode(d): d for d in found}
        self._disagreed = {key: self._disagreed.get(key, now) for key in seen}
        self._said_disagreed &= self._disagreed.keys()
        new = [
            d
            for key, d in seen.items()
            if now - self._disagreed[key] >= DISAGREEMENT_LASTS and key not in self._said_disagreed
        ]
        self._said_disagreed |= {msgspec.json.encode(d) for d in new}
        for d in new:
            log.warning("the kubelet lists cpus its CPU manager's state does not give", pod=d.pod.name, listed=d.listed)
        if new:
            await self._observe(list(new))

    async def _record_findings(self, observed: list[ev.EventBase]) -> None:
        """What the kubelet got wrong in what ``observed`` (just recorded) says: a device or an
        exclusive CPU listed for two pods at once. Said and recorded as the kubelet's fault."""
        found = double_allocations(self.recorder.views.kubelet, observed)
        for f in found:
            log.warning(
                "the kubelet gave one resource to two pods at once", resource=f.resource, ids=f.ids, holders=f.holders
            )
        if found:
            await self._observe(found)

    # ----------------------------------------------------------------- gaps

    async def _observe(self, events: Sequence[ev.EventBase]) -> None:
        """What the kubelet did, or what eventsrc could not see of it: an observation (in the
        views now, in the log within the committer's wait; docs/adr/0042)."""
        await self.recorder.observe(lambda: events)

    async def _gap_open(self, source: str, reason: str) -> None:
        if source in self.recorder.views.kubelet.gaps:
            return
        log.warning("cannot see the kubelet; the time is recorded as a gap", reason=reason)
        # from the last good answer: nothing is known of the kubelet after it (a kubelet that stops
        # leaves its socket; the look that finds it gone comes up to a resync later)
        since = self._answered_ns or self.clock()
        await self._observe([ev.ObservationGapFound(source=source, since_ns=since, reason=reason)])

    async def _gap_close(self, source: str) -> None:
        since = self.recorder.views.kubelet.gaps.get(source)
        if since is None:
            return
        log.info("the kubelet answers again", source=source)
        await self._observe([ev.ObservationGapFound(source=source, since_ns=since, until_ns=self.clock())])

    # ----------------------------------------------------------------- checkpoint files

    async def _read_checkpoints(self) -> None:
        """Each checkpoint file read and verified: one that cannot be is recorded once per reason,
        and is a gap (source "checkpoint PATH") until it is read again."""
        events: list[ev.EventBase] = []
        gaps = self.recorder.views.kubelet.gaps
        paths = self.options.checkpoints()
        # one thread for all (small files, each opened without blocking); abandoned on cancel, so
        # that whatever a read does, the daemon stops
        before = self._files
        self._files = await trio.to_thread.run_sync(_read_checkpoints, paths, before, abandon_on_cancel=True)
        for name, path in paths.items():
            source = f"checkpoint {path}"
            read = self._files[name].result
            if self._files[name] is before.get(name) and not isinstance(read, ki.CheckpointError):
                continue  # unchanged since it was read: nothing new in it
            if isinstance(read, ki.CheckpointError):
                reason = str(read)
                if self._said.get(str(path)) != reason:
                    self._said[str(path)] = reason
                    log.warning("kubelet checkpoint file not read", path=path, reason=reason)
                    events.append(ev.KubeletCheckpointReadFailed(path=str(path), reason=reason))
                    if source not in gaps:
                        events.append(ev.ObservationGapFound(source=source, since_ns=self.clock(), reason=reason))
                continue
            self._said.pop(str(path), None)
            if source in gaps:
                events.append(ev.ObservationGapFound(source=source, since_ns=gaps[source], until_ns=self.clock()))
            if isinstance(read, ki.DeviceCheckpoint):
                entries = read.entries or []
                self._device_uids = {
                    (e.container_name, e.resource_name, i): e.pod_uid for e in entries for i in e.all_device_ids()
                }
            elif isinstance(read, ki.CPUCheckpoint):
                shared = sorted(read.shared)
                if shared != self.recorder.views.kubelet.shared:
                    events.append(ev.KubeletSharedPoolObserved(cpus=shared, policy=read.policy_name, source=str(path)))
        if events:
            await self._observe(events)

    async def _watch_files(self) -> None:
        """Look again when a checkpoint file is replaced or the PodResources socket comes or
        goes (inotify; where it cannot be had, the resync is the only trigger)."""
        watched = _Watch.open(self.options)
        if watched is None:
            return
        try:
            while True:
                if await watched.changed():
                    self.look_again()
        finally:
            await watched.aclose()


#: the gap while nothing shows what is allocatable (no GetAllocatableResources, no device checkpoint)
ALLOCATABLE_GAP = "kubelet allocatable"


class _Read(NamedTuple):
    """A checkpoint file as last read: its key (None: not there) and what it gave."""

    key: ki.FileKey | None
    result: Any  # the parsed file, None (not there), or the CheckpointError that says why not


def _read_checkpoints(paths: dict[str, Path], before: dict[str, _Read]) -> dict[str, _Read]:
    """Each file parsed, or why not; a file whose key is the one ``before`` gives is not read
    again (the same answer). A worker thread's; nothing in it waits on anything but the disk:
    the files are opened without blocking and read up to a cap (``ki.open_regular``)."""
    out: dict[str, _Read] = {}
    for name, path in paths.items():
        try:
            opened = ki.open_regular(path)
        except ki.CheckpointError as exc:
            out[name] = _Read(None, exc)
            continue
        if opened is None:
            out[name] = _Read(None, None)
            continue
        fd, key = opened
        last = before.get(name)
        if last is not None and last.key == key:
            os.close(fd)
            out[name] = last
            continue
        try:
            out[name] = _Read(key, _parse_checkpoint(name, path, ki.read_open(fd, path)))
        except ki.CheckpointError as exc:
            out[name] = _Read(key, exc)
    return out


def _parse_checkpoint(name: str, path: Path, data: bytes) -> Any:
    """The parsed file. Raises CheckpointError."""
    if name == ki.DEVICE_CHECKPOINT:
        return ki.parse_device_checkpoint(data, str(path))
    if name == ki.CPU_STATE:
        return ki.parse_cpu_state(data, str(path))
    if name == ki.DRA_STATE:
        return ki.parse_dra_state(data, str(path))
    return ki.parse_memory_state(data, str(path))


class _Watch:
    """inotify on DIR, DIR/device-plugins and DIR/pod-resources: names that matter only."""

    NAMES = frozenset({ki.DEVICE_CHECKPOINT, ki.CPU_STATE, ki.MEMORY_STATE, ki.DRA_STATE, "kubelet.sock"})
    DIRS = frozenset({"device-plugins", "pod-resources"})

    def __init__(self, options: BesideOptions, inotify: Any, flags: Any) -> None:
        self.options = options
        self._inotify = inotify
        self._mask = flags.CREATE | flags.DELETE | flags.MOVED_TO | flags.MOVED_FROM | flags.CLOSE_WRITE | flags.ONLYDIR
        self._overflow = flags.Q_OVERFLOW
        self._add()

    @classmethod
    def open(cls, options: BesideOptions) -> _Watch | None:
        try:
            import inotify_simple

            return cls(options, inotify_simple.INotify(nonblocking=True), inotify_simple.flags)
        except (ImportError, OSError, AttributeError) as exc:
            log.warning("inotify unavailable: the kubelet is looked at on runtime events and resyncs", reason=str(exc))
            return None

    def _add(self) -> None:
        d = self.options.kubelet_dir
        for where in (d, d / "device-plugins", d / "pod-resources"):
            with contextlib.suppress(OSError):  # not there (yet): DIR's own watch says when it comes
                self._inotify.add_watch(where, self._mask)

    async def changed(self) -> bool:
        await trio.lowlevel.wait_readable(self._inotify.fd)
        events = self._inotify.read(timeout=0)
        if any(e.name in self.DIRS for e in events):
            self._add()
        return any(e.mask & self._overflow or e.name in self.NAMES or e.name in self.DIRS for e in events)

    async def aclose(self) -> None:
        trio.lowlevel.notify_closing(self._inotify.fd)
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self._inotify.close)


# --------------------------------------------------------------------------- at the start


def start_events(
    views: Views, last_ts_ns: int | None, now_ns: int, runtime: bool, stopped_cleanly: bool
) -> list[ev.EventBase]:
    """What a start beside a kubelet records after DaemonStarted: the time eventsrc itself was
    not running (from its previous last record: when it stopped, or the last sign of life of a
    run that was killed), closing the gaps the previous run left open at that point; and, with
    NRI, the runtime not seen until it connects."""
    out: list[ev.EventBase] = []
    if last_ts_ns is not None:
        for source, since in sorted(views.kubelet.gaps.items()):
            out.append(ev.ObservationGapFound(source=source, since_ns=since, until_ns=max(since, last_ts_ns)))
        how = "stopped" if stopped_cleanly else "killed or crashed; from its last record"
        out.append(
            ev.ObservationGapFound(
                source="eventsrc",
                since_ns=last_ts_ns,
                until_ns=now_ns,
                reason=f"eventsrc was not running ({how})",
            )
        )
    if runtime:
        out.append(ev.ObservationGapFound(source="runtime", since_ns=now_ns, reason="the runtime is not connected yet"))
    return out


def runtime_gap_events(views: Views, items: Iterable[ev.Record | ev.EventBase]) -> list[ev.EventBase]:
    """The runtime's gap opened at a disconnection, closed at a connection (NRI's records),
    after the gap events not recorded yet (given first among ``items``, kept)."""
    out: list[ev.EventBase] = []
    open_since = views.kubelet.gaps.get("runtime")
    for item in items:
        if isinstance(item, ev.ObservationGapFound):
            out.append(item)
            open_since = None if item.until_ns else item.since_ns
            continue
        if not isinstance(item, ev.Record):
            continue
        if isinstance(item.event, ev.RuntimeConnected) and open_since is not None:
            out.append(ev.ObservationGapFound(source="runtime", since_ns=open_since, until_ns=item.ts_ns))
            open_since = None
        elif isinstance(item.event, ev.RuntimeDisconnected) and open_since is None:
            open_since = item.ts_ns
            out.append(ev.ObservationGapFound(source="runtime", since_ns=item.ts_ns, reason=item.event.reason))
    return out


__all__ = ["Beside", "BesideOptions", "refuse_root_inside", "start_events"]
