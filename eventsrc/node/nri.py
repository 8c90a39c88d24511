"""eventsrc as an NRI plugin of the container runtime (containerd 2.x, CRI-O 1.30+).

    run()                       connect to the runtime's NRI socket; on a closed connection or a
                                runtime restart, connect again with backoff, and register again
      RegisterPlugin            "NN-eventsrc" (``--nri-plugin-index``)
      Configure                 answer the events the mode needs; RuntimeConnected
      Synchronize               the runtime's pods and containers against the log
                                (core.runtime_decisions.reconcile): gone sandboxes release their
                                pods, unknown containers are recorded (and admitted, in enforce
                                mode), cpusets corrected
      CreateContainer           enforce: admit the pod from CRI's facts when eventsrc has not
                                seen it (a decision: synced before the answer); observe
                                ContainerCreated with what it gets, then answer the adjustment
                                (cpuset, devices, envs, mounts, annotations, CDI devices) and the
                                shared-pool updates of the other containers
      StateChange               sandboxes run and removed (removal releases the pod), containers
                                started and removed; observe mode: PostCreate/PostUpdate record
                                what the runtime applied
      StopContainer             ContainerStopped
    AfterTheAnswer.run()        observe mode: what was answered before it was observed, observed
                                one at a time in the order of the answers
    follow()                    the shared pool follows: when exclusive CPUs are taken or given
                                back outside a CreateContainer (a node-API admission, a removal),
                                UpdateContainers for the containers in the pool
    watch_listing()             the sandboxes a Synchronize listed, against the runtime's CRI
                                listing: containerd sends no RemovePodSandbox for the sandboxes it
                                recovered at its start (node.cri), so their removal is seen there

Handlers answer within the runtime's request timeout (Configure says it, 2 s by default):
admissions run as tasks of their own and a slow one is answered DeadlineExceeded; releases
and the admissions Synchronize finds owed run beside the handlers. In enforce mode the intent
(the pod's admission) is synced before the CreateContainer answer; a SIGKILL before the answer
makes containerd create the container unadjusted, and the next Synchronize records the cpusets
the runtime reports and puts them right (docs/nri.md, docs/adr/0029). Everything else the plugin
records is an observation of what the runtime did (``Recorder.observe``, docs/adr/0042): in the
views before the answer in enforce mode (after it in observe mode, where eventsrc decides
nothing), in the log with the next decision or within ``observationsWait``; one lost to a crash
is found again at the next Synchronize, behind the gap the start records.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import trio
from google.protobuf.message import DecodeError

from eventsrc import events as ev
from eventsrc.api.node import Admitter
from eventsrc.core.backoff import Backoff
from eventsrc.core.cpu.cpuset import CPUSet, CPUSetParseError, format_list
from eventsrc.core.cpu.static import CPUManagerConfig
from eventsrc.core.runtime_decisions import (
    ContainerFacts,
    Placement,
    SandboxFacts,
    Update,
    admission_for,
    container_spec,
    created_event,
    not_its_pod,
    owed_releases,
    placement,
    pod_ref,
    pool_updates,
    reconcile,
    running_before,
    state_events,
    vanished,
)
from eventsrc.errors import AdmissionRefused, EventsrcError, NotFound, first_line
from eventsrc.gen.nri.v1alpha1 import api_pb2 as nri
from eventsrc.inputs.manifest import ManifestError, PodSpec
from eventsrc.inputs.runtime_annotations import device_requests
from eventsrc.log.commit import new_correlation_id
from eventsrc.node.cri import ListingFailed, SandboxLister, socket_path
from eventsrc.node.interfaces import Recorder, observe_or_log
from eventsrc.obs.logger import correlation, current_correlation_id, get_logger
from eventsrc.obs.text import escape
from eventsrc.rpc import ttrpc
from eventsrc.state.views import PodView

log = get_logger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
DEFAULT_SOCKET = "/var/run/nri/nri.sock"
DEFAULT_INDEX = "10"
PLUGIN_NAME = "eventsrc"
MODES = ("enforce", "observe")
DEFAULT_REQUEST_TIMEOUT = 2.0  # the runtime's, until Configure says otherwise
REGISTER_TIMEOUT = 5.0
BACKOFF_FIRST, BACKOFF_MAX = 0.25, 5.0
#: the share of the runtime's request timeout an admission may take before the answer is a refusal
ANSWER_SHARE = 0.75
#: the share of it the runtime's CRI listing may take before a pod grows (its exits, if NRI
#: has not told them yet); past it, the pod grows with what the log holds
EXITS_SHARE = 0.25
#: pods plus containers one Synchronize may carry (containerd sends them all, in chunks)
MAX_SYNC_OBJECTS = 200_000
#: the runtime's sandbox listing is asked this soon after a container of a sandbox a
#: Synchronize listed stops or goes (doubling while it still has it), and at least this often
LISTING_FIRST, LISTING_EVERY = 0.05, 10.0
#: observe mode's observations answered and not yet observed (AfterTheAnswer); past it, handlers wait for room
ANSWERED_QUEUED = 1024

E = nri.Event
_ENFORCE_EVENTS = (
    E.RUN_POD_SANDBOX,
    E.REMOVE_POD_SANDBOX,
    E.CREATE_CONTAINER,
    E.START_CONTAINER,
    E.STOP_CONTAINER,
    E.REMOVE_CONTAINER,
)
_OBSERVE_EVENTS = (
    E.RUN_POD_SANDBOX,
    E.REMOVE_POD_SANDBOX,
    E.POST_CREATE_CONTAINER,
    E.START_CONTAINER,
    E.POST_UPDATE_CONTAINER,
    E.STOP_CONTAINER,
    E.REMOVE_CONTAINER,
)
_STATES = {
    nri.CONTAINER_CREATED: "created",
    nri.CONTAINER_RUNNING: "running",
    nri.CONTAINER_PAUSED: "running",
    nri.CONTAINER_STOPPED: "stopped",
}


def event_mask(events: tuple[int, ...]) -> int:
    """NRI's subscription bitmask: event E is bit ``1 << (E - 1)``."""
    mask = 0
    for e in events:
        mask |= 1 << (e - 1)
    return mask


@dataclass(frozen=True)
class NRIOptions:
    socket: Path
    index: str = DEFAULT_INDEX
    mode: str = "enforce"
    #: namespaces whose pods may ask for devices by annotation (docs/security.md)
    annotation_namespaces: frozenset[str] = frozenset()
    #: the runtime's CRI socket ("" the kubelet's default for the runtime NRI names)
    runtime_endpoint: str = ""

    def __post_init__(self) -> None:
        if len(self.index) != 2 or not self.index.isdigit():
            raise ValueError(f"NRI plugin index must be exactly two digits, not {self.index!r}")
        if self.mode not in MODES:
            raise ValueError(f"NRI mode must be enforce or observe, not {self.mode!r}")


# --------------------------------------------------------------------------- facts from the wire


def _cpus(text: str) -> list[int]:
    try:
        return CPUSet.parse(text).sorted_list() if text else []
    except CPUSetParseError:
        return []


def sandbox_facts(pod: nri.PodSandbox) -> SandboxFacts:
    return SandboxFacts(
        id=pod.id, uid=pod.uid, namespace=pod.namespace, name=pod.name, annotations=dict(pod.annotations)
    )


def container_facts(c: nri.Container) -> ContainerFacts:
    linux = c.linux
    res = linux.resources
    cpu, mem = res.cpu, res.memory
    return ContainerFacts(
        id=c.id,
        sandbox_id=c.pod_sandbox_id,
        name=c.name,
        state=_STATES.get(c.state, "unknown"),
        cgroups_path=linux.cgroups_path,
        cpus=_cpus(cpu.cpus),
        mems=_cpus(cpu.mems),
        devices=[d.path for d in linux.devices],
        envs=sorted({e.split("=", 1)[0] for e in c.env}),
        shares=cpu.shares.value if cpu.HasField("shares") else 0,
        quota=cpu.quota.value if cpu.HasField("quota") else 0,
        period=cpu.period.value if cpu.HasField("period") else 0,
        memory_limit=mem.limit.value if mem.HasField("limit") else 0,
    )


# --------------------------------------------------------------------------- adjustments to the wire


def _cpu_resources(
    cpus: list[int] | None, mems: list[int], hugepages: Mapping[str, int] | None = None
) -> nri.LinuxResources:
    """The cpuset (``cpus`` None: left alone), its memory nodes, and hugepage limits."""
    return nri.LinuxResources(
        cpu=nri.LinuxCPU(cpus=format_list(cpus) if cpus is not None else "", mems=format_list(mems)),
        hugepage_limits=[nri.HugepageLimit(page_size=size, limit=n) for size, n in sorted((hugepages or {}).items())],
    )


def _linux_device(spec: ev.DeviceSpec) -> nri.LinuxDevice | None:
    """A device plugin's DeviceSpec as an NRI device node: the host node's type and numbers
    (the runtime creates the node from them, as the kubelet's CRI call has it do)."""
    try:
        st = os.stat(spec.host_path)
    except OSError as exc:
        log.warning("device node not found on the host", host_path=spec.host_path, reason=exc.strerror)
        return None
    kind = "c" if stat.S_ISCHR(st.st_mode) else "b" if stat.S_ISBLK(st.st_mode) else ""
    if not kind:
        log.warning("not a device node", host_path=spec.host_path)
        return None
    return nri.LinuxDevice(
        path=spec.container_path,
        type=kind,
        major=os.major(st.st_rdev),
        minor=os.minor(st.st_rdev),
        file_mode=nri.OptionalFileMode(value=stat.S_IMODE(st.st_mode)),
    )


def adjustment(got: Placement) -> tuple[nri.ContainerAdjustment, Placement]:
    """The adjustment for ``got``, and ``got`` with only the device nodes it carries (a node
    missing on the host is left out of both, with a warning)."""
    a = got.allocation
    adjust = nri.ContainerAdjustment(
        annotations=dict(a.annotations),
        env=[nri.KeyValue(key=k, value=v) for k, v in sorted(a.envs.items())],
        mounts=[
            nri.Mount(
                destination=m.container_path,
                type="bind",
                source=m.host_path,
                options=["rbind", "rprivate", "ro" if m.read_only else "rw"],
            )
            for m in a.mounts
        ],
        CDI_devices=[nri.CDIDevice(name=n) for n in a.cdi_devices],
    )
    nodes = [(spec, _linux_device(spec)) for spec in a.devices]
    devices = [d for _, d in nodes if d is not None]
    sent = [spec for spec, d in nodes if d is not None]
    if len(sent) != len(a.devices):
        got = msgspec.structs.replace(got, allocation=msgspec.structs.replace(a, devices=sent))
    placed = got.cpus is not None or got.mems or got.hugepages
    if devices or placed:
        adjust.linux.CopyFrom(
            nri.LinuxContainerAdjustment(
                devices=devices,
                resources=_cpu_resources(got.cpus, got.mems, got.hugepages) if placed else None,
            )
        )
    return adjust, got


def container_updates(updates: list[Update], ignore_failure: bool = True) -> list[nri.ContainerUpdate]:
    """``ignore_failure`` in an answer (the runtime applies them as part of its request);
    ``False`` for UpdateContainers, so a failure is an error, not silently skipped."""
    return [
        nri.ContainerUpdate(
            container_id=u.container_id,
            linux=nri.LinuxContainerUpdate(resources=_cpu_resources(u.cpus, u.mems)),
            ignore_failure=ignore_failure,
        )
        for u in updates
    ]


def updated_events(updates: list[Update], reason: str) -> list[ev.EventBase]:
    return [
        ev.ContainerCPUsUpdated(container_id=u.container_id, pod_uid=u.pod_uid, cpus=u.cpus, mems=u.mems, reason=reason)
        for u in updates
    ]


Observation = Callable[[], list[ev.EventBase]]


class AfterTheAnswer:
    """Observe mode's observations, made after the runtime has its answer: eventsrc decides
    nothing there, so no answer waits even for their projection (docs/adr/0042). The handlers
    queue them; ``run``, one task in the plugin's nursery, observes them one at a time
    (``Recorder.observe``), in the order of the answers, each from the views every earlier one
    left. Once the daemon stops (``drain``), each is observed before its answer again, so the
    stop's record carries them all."""

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder
        self._queue_in, self._queue_out = trio.open_memory_channel[
            tuple[Observation, str, trio.Event, Callable[[], None] | None]
        ](ANSWERED_QUEUED)
        self._queued = 0
        self._empty = trio.Event()
        self._empty.set()
        self._answer_first = True

    async def record(self, observation: Observation, then: Callable[[], None] | None = None) -> None:
        """Queue ``observation`` (called at its turn: the events to record, from the views then),
        and ``then`` to call once it is recorded. Returns once it is queued (waits for room when
        the queue is full), or once it is recorded after ``drain``."""
        recorded = trio.Event()
        if not self._queued:
            self._empty = trio.Event()
        self._queued += 1
        try:
            await self._queue_in.send((observation, current_correlation_id(), recorded, then))
        except BaseException:  # cancelled while waiting for room: never queued
            self._done(then)
            raise
        if not self._answer_first:
            await recorded.wait()

    def _done(self, then: Callable[[], None] | None) -> None:
        if then is not None:
            then()
        self._queued -= 1
        if not self._queued:
            self._empty.set()

    async def run(self) -> None:
        """Record what is queued, in order, until cancelled (a record under way is finished)."""
        async for observation, cid, recorded, then in self._queue_out:
            try:
                with correlation(cid):
                    await observe_or_log(self._recorder, observation, "runtime observation")
            finally:
                recorded.set()
                self._done(then)

    async def recorded(self) -> None:
        """Until every observation queued so far is in the views (or failed and was logged)."""
        await self._empty.wait()

    async def drain(self) -> None:
        """Observe what is queued, and from now on each observation before its answer."""
        self._answer_first = False
        await self.recorded()


# --------------------------------------------------------------------------- the plugin


Handler = Callable[[bytes], Awaitable[bytes]]


class NRIPlugin:
    def __init__(self, recorder: Recorder, admission: Admitter, cpus: CPUManagerConfig, options: NRIOptions) -> None:
        self.recorder = recorder
        self.admission = admission
        self.cpus = cpus
        self.options = options
        self.enforce = options.mode == "enforce"
        self.request_timeout = DEFAULT_REQUEST_TIMEOUT
        self.registrations = 0  # counted, for tests and logs: each Configure of a new connection
        self._kicked = trio.Event()
        self._synced = False
        self.on_synchronized: Callable[[], None] | None = None  # told after each Synchronize (beside a kubelet)
        self._sync_pods: list[nri.PodSandbox] = []
        self._sync_containers: list[nri.Container] = []
        self._nursery: trio.Nursery | None = None
        self._connected = trio.Event()
        self._creating = 0  # CreateContainer answers in the making or not yet recorded (they carry pool updates)
        self._pool_lock = trio.Lock()
        self._session: ttrpc.Session | None = None
        self._created = trio.Event()
        # Sandboxes the last Synchronize listed that the log still holds: the runtime may
        # remove them with no NRI event (``watch_listing``).
        self._listed: set[str] = set()
        self._listing_kick = trio.Event()
        self._lister: SandboxLister | None = None
        self._listing_trouble = ""  # why the listing could not be had, as last said
        self._answered = AfterTheAnswer(recorder)  # observe mode: observed after its answer
        self._methods: dict[str, Handler] = {
            "Configure": self._configure,
            "Synchronize": self._synchronize,
            "Shutdown": self._shutdown,
            "CreateContainer": self._create_container,
            "UpdateContainer": self._update_container,
            "StopContainer": self._stop_container,
            "StateChange": self._state_change,
        }

    @property
    def plugin(self) -> str:
        return f"{self.options.index}-{PLUGIN_NAME}"

    @property
    def synchronized(self) -> bool:
        """Connected, and the runtime's Synchronize of this connection is recorded."""
        return self._synced

    def kick(self) -> None:
        """CPUs were assigned or released: the shared pool's containers may need updates."""
        self._kicked.set()

    async def wait_connected(self) -> None:
        """Returns once a connection has been configured and synchronized (for tests)."""
        await self._connected.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Stay connected to the runtime for as long as the daemon runs."""
        task_status.started()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._answered.run)  # across connections: what one saw outlives it
                await self._stay_connected()
        finally:
            if self._lister is not None:
                self._lister.close()

    async def _stay_connected(self) -> None:
        backoff = Backoff(BACKOFF_FIRST, BACKOFF_MAX)
        said_away = False
        while True:
            try:
                await self._connect_once()
            except OSError as exc:  # no socket yet, or refused: the runtime is not up
                if not said_away:
                    log.info("NRI socket not answering; retrying", socket=str(self.options.socket), reason=exc.strerror)
                    said_away = True
            except (ttrpc.ConnectionLost, ttrpc.TtrpcError, trio.TooSlowError) as exc:
                log.warning("NRI connection ended", socket=str(self.options.socket), reason=first_line(exc))
            except Exception:  # a bug must not end the daemon: the runtime goes on without eventsrc, so must it
                log.exception("NRI connection failed unexpectedly", socket=str(self.options.socket))
            await self._answered.recorded()  # what the connection saw comes before its end
            if self.recorder.views.runtime.connected:  # the log says connected (since Configure): say it went
                await observe_or_log(
                    self.recorder, lambda: [ev.RuntimeDisconnected(reason="connection closed")], "NRI disconnect"
                )
            if self._synced:  # it was up: try again soon
                backoff.reset()
                said_away = False
            self._synced = False
            self._session = None
            self._connected = trio.Event()
            await trio.sleep(backoff.next())

    async def _connect_once(self) -> None:
        async with ttrpc.nri_session(self.options.socket, self._handle) as session, trio.open_nursery() as nursery:
            self._nursery = nursery
            request = nri.RegisterPluginRequest(plugin_name=PLUGIN_NAME, plugin_idx=self.options.index)
            await session.call(RUNTIME_SERVICE, "RegisterPlugin", request.SerializeToString(), REGISTER_TIMEOUT)
            log.info("registered with the runtime over NRI", plugin=self.plugin, mode=self.options.mode)
            if self.enforce:
                nursery.start_soon(self._follow, session)
            nursery.start_soon(self._watch_listing)
            await session.closed()
            nursery.cancel_scope.cancel()

    async def _handle(self, service: str, method: str, payload: bytes) -> bytes:
        handler = self._methods.get(method) if service == PLUGIN_SERVICE else None
        if handler is None:
            raise ttrpc.TtrpcError(ttrpc.UNIMPLEMENTED, f"{service}/{method} is not implemented by {self.plugin}")
        with correlation(new_correlation_id()):
            return await handler(payload)

    # ------------------------------------------------------------------ registration

    async def _configure(self, payload: bytes) -> bytes:
        req = nri.ConfigureRequest.FromString(payload)
        if req.request_timeout > 0:
            self.request_timeout = req.request_timeout / 1000
        self._sync_pods, self._sync_containers = [], []
        connected = ev.RuntimeConnected(
            runtime=req.runtime_name, runtime_version=req.runtime_version, plugin=self.plugin, mode=self.options.mode
        )
        await self.recorder.observe(lambda: [connected])
        self.registrations += 1
        if self._lister is not None:
            self._lister.close()
        path = socket_path(self.options.runtime_endpoint, req.runtime_name)
        self._lister = SandboxLister(path, req.runtime_name, req.runtime_version)
        log.info("configured by the runtime", runtime=f"{req.runtime_name} {req.runtime_version}")
        mask = event_mask(_ENFORCE_EVENTS if self.enforce else _OBSERVE_EVENTS)
        return nri.ConfigureResponse(events=mask).SerializeToString()

    async def _synchronize(self, payload: bytes) -> bytes:
        req = nri.SynchronizeRequest.FromString(payload)
        self._sync_pods += req.pods
        self._sync_containers += req.containers
        if len(self._sync_pods) + len(self._sync_containers) > MAX_SYNC_OBJECTS:
            self._sync_pods, self._sync_containers = [], []
            raise ttrpc.TtrpcError(
                ttrpc.RESOURCE_EXHAUSTED,
                f"eventsrc: Synchronize carries more than {MAX_SYNC_OBJECTS} pods and containers",
            )
        if req.more:
            return nri.SynchronizeResponse(more=True).SerializeToString()
        pods, containers = self._sync_pods, self._sync_containers
        self._sync_pods, self._sync_containers = [], []
        updates = await self._reconcile([sandbox_facts(p) for p in pods], [container_facts(c) for c in containers])
        self._synced = True
        self._connected.set()
        if self.on_synchronized is not None:
            self.on_synchronized()
        log.info("synchronized with the runtime", pods=len(pods), containers=len(containers), updates=len(updates))
        return nri.SynchronizeResponse(update=container_updates(updates)).SerializeToString()

    async def _reconcile(self, sandboxes: list[SandboxFacts], containers: list[ContainerFacts]) -> list[Update]:
        """Record what the runtime did meanwhile; the updates that put every cpuset right. The
        releases owed and the admissions of running containers go on in the background: the
        runtime gives the whole Synchronize one request timeout."""
        await self._answered.recorded()  # the views hold every observation answered before
        views = self.recorder.views
        found = reconcile(views, sandboxes, containers)
        if found.events:
            await self.recorder.observe(lambda: found.events)
        self._listed = {s.id for s in sandboxes}
        if not self.enforce:
            return []
        if self._nursery is not None:
            self._nursery.start_soon(self._settle, found.unadmitted)
        updates = pool_updates(views, self.cpus)
        if updates:
            await self.recorder.observe(lambda: updated_events(updates, "synchronized with the runtime"))
        return updates

    async def _settle(self, unadmitted: Sequence[tuple[SandboxFacts, ContainerFacts]] = ()) -> None:
        """What the log says is owed: release the pods whose sandboxes are gone, and admit the
        running containers' pods (created while eventsrc was away, or whose admission a crash
        cut short); the follower then gives them the cpusets they must have. Devices cannot be
        added to a running container."""
        for uid in owed_releases(self.recorder.views):
            await self._release(uid, "pod sandbox removed")
        if unadmitted:
            # The pool takes back what the releases freed before an admission takes from it: a
            # shared container is never widened onto a CPU an admission has just given away.
            await self._apply_pool()
        for sandbox, c in unadmitted:
            with correlation(new_correlation_id()):
                try:
                    await self._admit_from_runtime(sandbox, c)
                except (AdmissionRefused, ManifestError, EventsrcError) as exc:
                    log.warning(
                        "running container not admitted", pod=_pod_name(sandbox), container=c.name, reason=str(exc)
                    )
                except Exception:  # a bug in one admission must not cut the runtime's connection
                    log.exception("running container not admitted", pod=_pod_name(sandbox), container=c.name)
        self.kick()

    async def _shutdown(self, payload: bytes) -> bytes:
        log.info("the runtime is shutting down")
        return nri.Empty().SerializeToString()

    # ------------------------------------------------------------------ containers

    async def _create_container(self, payload: bytes) -> bytes:
        req = nri.CreateContainerRequest.FromString(payload)
        sandbox, facts = sandbox_facts(req.pod), container_facts(req.container)
        if not self.enforce:
            return nri.CreateContainerResponse().SerializeToString()
        self._creating += 1
        try:
            await self._admitted_in_time(sandbox, facts)
            answer, records = self._adjust(sandbox, facts)
        except BaseException:
            self._created_one()
            raise
        # The intent, the pod's admission, is in the log already; what the runtime makes of the
        # answer is an observation: in the views now, in the log soon (docs/adr/0042).
        try:
            await observe_or_log(self.recorder, lambda: records, "container created")
        finally:
            self._created_one()
        return answer

    def _created_one(self) -> None:
        """A CreateContainer observed, or refused: the follower may go on once none is left."""
        self._creating -= 1
        if not self._creating:
            self._created.set()
            self._created = trio.Event()

    async def _admitted_in_time(self, sandbox: SandboxFacts, facts: ContainerFacts) -> None:
        """Admit the pod when eventsrc has not, within a share of the runtime's request timeout.
        The admission runs as a task of its own: once its intent is recorded it goes on to its
        outcome (Allocate may take long), and a runtime that waits longer than its timeout
        would close the plugin and create the container unadjusted. So the answer is a refusal
        in time, and the runtime's retry finds the pod admitted."""
        need = admission_for(self.recorder.views, sandbox, facts.name)
        if need.refused:
            raise self._refusal(sandbox, facts, need.refused)
        if not need.admit:
            return
        deadline = trio.current_time() + self.request_timeout * ANSWER_SHARE
        pod = self.recorder.views.pods.pods.get(sandbox.uid)
        if need.grows and pod is not None:
            with trio.move_on_at(min(deadline, trio.current_time() + self.request_timeout * EXITS_SHARE)):
                await self._exits_seen(sandbox, pod)
        try:
            spec = runtime_pod(sandbox, facts, self.options.annotation_namespaces)
        except ManifestError as exc:
            raise self._refusal(sandbox, facts, str(exc)) from None
        done = trio.Event()
        outcome: list[Exception] = []

        async def admit() -> None:
            try:
                await self.admission.admit(spec)
            except (AdmissionRefused, EventsrcError) as exc:
                outcome.append(exc)
            finally:
                done.set()
            if sandbox.uid in self.recorder.views.runtime.gone:  # removed meanwhile: its release waited
                await self._settle()

        assert self._nursery is not None
        self._nursery.start_soon(admit)
        with trio.move_on_at(deadline):
            await done.wait()
        if not done.is_set():
            reason = f"eventsrc: admission of pod {_pod_name(sandbox)} did not finish in time; it goes on, retry"
            raise ttrpc.TtrpcError(ttrpc.DEADLINE_EXCEEDED, escape(reason))
        if outcome:
            raise self._refusal(sandbox, facts, str(outcome[0]))
        if self.recorder.views.pods.pods.get(sandbox.uid) is None:  # admit() ended some other way (a bug)
            raise ttrpc.TtrpcError(
                ttrpc.UNKNOWN, f"eventsrc: admission of pod {escape(_pod_name(sandbox))} failed; see its log"
            )

    async def _exits_seen(self, sandbox: SandboxFacts, pod: PodView) -> None:
        """Before ``pod`` grows: the exits of its containers that the runtime has and the log
        lacks, recorded as observed. NRI tells of a container's own exit asynchronously, and
        the kubelet creates the next container once the runtime reports the init container
        exited: the exit may not have reached eventsrc yet."""
        unsure = running_before(self.recorder.views, pod)
        if not unsure or self._lister is None:
            return
        try:
            exited = await self._lister.exited(sandbox.id)
        except ListingFailed as exc:
            log.warning(
                "cannot list the pod's containers: one that exited may be taken for a running one",
                pod=_pod_name(sandbox),
                reason=str(exc),
            )
            return
        stops = [ev.ContainerStopped(container_id=cid, pod_uid=pod.uid) for cid in sorted(unsure & exited)]
        if stops:
            await self.recorder.observe(lambda: stops)

    def _refusal(self, sandbox: SandboxFacts, facts: ContainerFacts, reason: str) -> ttrpc.TtrpcError:
        log.info("container refused", pod=_pod_name(sandbox), container=facts.name, reason=reason)
        return ttrpc.TtrpcError(
            ttrpc.UNKNOWN, escape(f"eventsrc: pod {sandbox.namespace}/{sandbox.name} container {facts.name}: {reason}")
        )

    def _adjust(self, sandbox: SandboxFacts, facts: ContainerFacts) -> tuple[bytes, list[ev.EventBase]]:
        """The answer: what the container gets, and the shared pool's updates; and the records
        that say so, to append as one unit."""
        views = self.recorder.views
        got = placement(views, self.cpus, sandbox.uid, facts.name)
        pod = views.pods.pods.get(sandbox.uid)
        if pod is not None and facts.name not in pod.containers:
            log.warning(
                "container not part of its pod's admission: shared pool, no devices",
                pod=_pod_name(sandbox),
                container=facts.name,
            )
        adjust, got = adjustment(got)  # device nodes missing on the host are neither sent nor recorded
        created = created_event(facts, sandbox.uid, adjusted=True, got=got)
        records: list[ev.EventBase] = []
        if sandbox.id not in views.runtime.sandboxes:
            records.append(ev.PodSandboxStarted(sandbox_id=sandbox.id, pod=pod_ref(sandbox)))
        records.append(created)
        # The admission recorded the pool's change already: the containers there follow it.
        updates = [u for u in pool_updates(views, self.cpus) if u.container_id != facts.id]
        records += updated_events(updates, "the shared pool followed")
        log.info(
            "container adjusted",
            pod=_pod_name(sandbox),
            container=facts.name,
            cpus=format_list(got.cpus) if got.cpus is not None else "",
            cdi=len(got.allocation.cdi_devices),
        )
        answer = nri.CreateContainerResponse(adjust=adjust, update=container_updates(updates))
        return answer.SerializeToString(), records

    async def _admit_from_runtime(self, sandbox: SandboxFacts, facts: ContainerFacts) -> None:
        need = admission_for(self.recorder.views, sandbox, facts.name)
        if need.refused:
            raise AdmissionRefused(need.refused)
        if need.admit:
            await self.admission.admit(runtime_pod(sandbox, facts, self.options.annotation_namespaces))

    async def _update_container(self, payload: bytes) -> bytes:
        return nri.UpdateContainerResponse().SerializeToString()

    async def _stop_container(self, payload: bytes) -> bytes:
        req = nri.StopContainerRequest.FromString(payload)
        stopped = ev.ContainerStopped(container_id=req.container.id, pod_uid=req.pod.uid)
        await self._saw(lambda: [stopped])
        self._kick_listing(req.pod.id)
        return nri.StopContainerResponse().SerializeToString()

    async def _state_change(self, payload: bytes) -> bytes:
        req = nri.StateChangeEvent.FromString(payload)
        sandbox = sandbox_facts(req.pod)
        if req.event == E.REMOVE_POD_SANDBOX:
            self._listed.discard(sandbox.id)
        await self._saw(lambda: self._state_events(req, sandbox))
        if req.event == E.REMOVE_POD_SANDBOX and self.enforce and self._nursery is not None:
            # The release it owes is in the log from here on (views.runtime.gone); it is made
            # beside the handler, as a crash before it would have it made at the next start.
            self._nursery.start_soon(self._settle)
        if req.event in (E.STOP_CONTAINER, E.REMOVE_CONTAINER):
            self._kick_listing(sandbox.id)
        return nri.Empty().SerializeToString()

    async def _saw(self, observation: Observation) -> None:
        """Observe what the runtime says it did: in enforce mode in the views before the answer
        (what eventsrc decides next reads it); in observe mode after it. In the log with the
        next decision or soon after."""
        if not self.enforce:
            await self._answered.record(observation)
            return
        await observe_or_log(self.recorder, observation, "runtime observation")

    async def drain(self) -> None:
        """Before the daemon records its stop: every observation answered so far is observed,
        and each one after before its answer."""
        await self._answered.drain()

    def _state_events(self, req: nri.StateChangeEvent, sandbox: SandboxFacts) -> list[ev.EventBase]:
        """What a StateChange says, as events, from the views as they are (``state_events``)."""
        views = self.recorder.views
        pod = views.pods.pods.get(sandbox.uid)
        why_not = not_its_pod(pod, sandbox.namespace, sandbox.name) if pod is not None else ""
        if req.event == E.RUN_POD_SANDBOX and why_not:
            log.warning("pod sandbox is not the pod its uid names", pod=_pod_name(sandbox), reason=why_not)
        container = container_facts(req.container) if req.HasField("container") else None
        return state_events(views, E.Name(req.event), sandbox, container)

    async def _release(self, uid: str, reason: str) -> None:
        if uid not in self.recorder.views.pods.pods:
            return
        try:
            await self.admission.remove(uid, reason)
        except (NotFound, AdmissionRefused, EventsrcError) as exc:  # still owed: the next Synchronize retries
            log.warning("pod not released", uid=uid, reason=str(exc))

    # ------------------------------------------------------------------ sandboxes gone unsaid

    def _kick_listing(self, sandbox_id: str) -> None:
        """A container of ``sandbox_id`` stopped or went: when a Synchronize listed the
        sandbox, its own removal may follow with no NRI event; look soon."""
        if sandbox_id in self._listed:
            self._listing_kick.set()

    async def _watch_listing(self) -> None:
        """While sandboxes a Synchronize listed are recorded, compare them with the runtime's
        CRI listing: soon after one of their containers stops or goes (then again, at doubling
        intervals, while the runtime still lists it), and every ``LISTING_EVERY`` seconds."""
        soon = Backoff(LISTING_FIRST, LISTING_EVERY)
        delay = LISTING_EVERY
        while True:
            with trio.move_on_after(delay):
                await self._listing_kick.wait()
            kicked = self._listing_kick.is_set()
            if kicked:
                self._listing_kick = trio.Event()
                soon.reset()
            delay = soon.next() if kicked or soon.failures else LISTING_EVERY  # doubling since a kick
            self._listed &= self.recorder.views.runtime.sandboxes.keys()
            if self._synced and self._listed:
                await self._check_listing()

    async def _check_listing(self) -> None:
        assert self._lister is not None  # made at Configure, before Synchronize
        await self._answered.recorded()  # a removal answered, not yet observed, is not gone unsaid
        try:
            present = await self._lister.sandbox_ids()
        except ListingFailed as exc:
            if str(exc) != self._listing_trouble:
                self._listing_trouble = str(exc)
                log.warning(
                    "cannot list the runtime's sandboxes: those it recovered at its start are not seen removed "
                    "until the next registration (--container-runtime-endpoint)",
                    sandboxes=len(self._listed),
                    reason=str(exc),
                )
            return
        if self._listing_trouble:
            self._listing_trouble = ""
            log.info("listing the runtime's sandboxes again", endpoint=self._lister.path)
        gone = vanished(self.recorder.views, self._listed, present)
        what = "sandboxes gone from the runtime's listing"
        if gone and await observe_or_log(self.recorder, lambda: gone, what) is None:
            return  # looked at again at the next check
        self._listed &= present
        if not gone:
            return
        log.info("pod sandboxes gone from the runtime's listing", sandboxes=[e.sandbox_id for e in gone])
        if self.enforce and self._nursery is not None:
            self._nursery.start_soon(self._settle)

    # ------------------------------------------------------------------ the shared pool follows

    async def _follow(self, session: ttrpc.Session) -> None:
        """Update the shared pool's containers whenever exclusive CPUs change hands. Runs beside
        the handlers, never inside one: the runtime holds its lock while it waits for a handler.
        A CreateContainer in the making carries its own updates: the follower waits for it, and
        for its records."""
        self._session = session
        while True:
            await self._kicked.wait()
            self._kicked = trio.Event()
            while self._creating:
                await self._created.wait()
            if self._synced:
                await self._apply_pool()

    async def _apply_pool(self) -> None:
        """One round of shared-pool updates through UpdateContainers, recorded once applied; one
        round at a time (the follower's, or a settling's before it admits)."""
        async with self._pool_lock:
            updates = pool_updates(self.recorder.views, self.cpus)
            if not updates or self._session is None:
                return
            request = nri.UpdateContainersRequest(update=container_updates(updates, ignore_failure=False))
            try:
                answer = await self._session.call(
                    RUNTIME_SERVICE, "UpdateContainers", request.SerializeToString(), self.request_timeout * 4
                )
                failed = {u.container_id for u in nri.UpdateContainersResponse.FromString(answer).failed}
            except (ttrpc.TtrpcError, trio.TooSlowError, DecodeError) as exc:
                # Nothing recorded: what was applied is read back at the next Synchronize.
                log.warning("shared pool update failed", reason=first_line(exc))
                return
            done = [u for u in updates if u.container_id not in failed]
            if failed:
                log.warning("the runtime could not update containers", containers=sorted(failed))
            if done:
                followed = updated_events(done, "the shared pool followed")
                await observe_or_log(self.recorder, lambda: followed, "pool update")


def runtime_pod(sandbox: SandboxFacts, facts: ContainerFacts, annotation_namespaces: frozenset[str]) -> PodSpec:
    """The pod as admission reads it from CRI's facts, with the container being created (CRI
    tells one container at a time: the first admits the pod, each later one grows it). Raises
    ManifestError for a bad annotation, or one in a namespace not in ``annotation_namespaces``."""
    devices = device_requests(sandbox.annotations, sandbox.namespace, annotation_namespaces).get(facts.name, {})
    return PodSpec(pod=pod_ref(sandbox), containers=[container_spec(facts, devices)], source=ev.FROM_RUNTIME)


def _pod_name(sandbox: SandboxFacts) -> str:
    return f"{sandbox.namespace}/{sandbox.name}"  # the log's formatter escapes what it writes
