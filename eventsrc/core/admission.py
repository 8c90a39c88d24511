"""One pod's admission, decided without I/O: topology manager, CPU manager, device manager,
memory manager, DRA claims and the resource fit together, as the events to record and the
calls to make.

Theory of operation
-------------------
A ``PodAdmission`` is made from the views, the daemon's configuration (``AdmissionConfig``)
and the pod. The shell (``eventsrc.node.admitter``) walks it through five phases, in order:

    known()          a pod the views hold already is kept as it is (a restarted kubelet
                     admits its pods again) or refused, unrecorded (its admission has not
                     ended, the uid is another pod's, or its device request changed); None
                     for a new pod
    find()           yields PluginWanted and DriverWanted for each registered resource and
                     DRA driver the pod needs; returns a Refused when one stays away
    plan()           the topology manager (container or pod scope) with the CPU, device and
                     memory managers as its hint providers (``topology_manager.HintProvider``),
                     container by container; yields PreferredAsk
                     when a plugin's preference is wanted; returns a Refused, or the Intent:
                     the events to record before any call, and the calls to make
    fits()           after an Intent, the kubelet's predicate admit handler (which runs after
                     its allocation handler): a Refused for an extended resource no device
                     plugin serves, or for requests the node's allocatable does not hold
                     (``core.fit``: OutOfcpu, ...), or None
    settle(results)  given what the calls returned, yields the outcome events to record,
                     batch by batch, and returns the Outcome: admitted, or refused after the
                     one undo (release devices, CPUs and claims; reject with the reason)

``removal`` gives a removal's events the same way.

Rules:

* Only the phases decide. The shell answers the questions, appends what it is given, makes
  the calls it is given, counts metrics and logs; it chooses nothing.
* ``views`` is the live views object: the shell applies every record it appends to it, so
  each phase reads the views as they are when it runs (other admissions and plugins' lists
  may have been recorded in between, as in the kubelet). A batch ``settle`` yields is in the
  views when ``settle`` resumes; the next batch is computed from them.
* A refusal that is recorded is a value (``Refused``, with its AdmissionRejected); one that is
  not recorded (a pod already known, a removal) raises the user's error.
* No clock, no randomness, no I/O.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from eventsrc import events as ev
from eventsrc.core.claims import ClaimWork
from eventsrc.core.claims import admission_events as claim_admission_events
from eventsrc.core.claims import release_events as claim_release_events
from eventsrc.core.cpu.assignment import TakeError
from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.core.cpu.static import CPUManagerConfig, CPUPlanner, CPUProvider, pool_change
from eventsrc.core.devices.choice import (
    DeviceProvider,
    PreferredAsk,
    PreferredFailed,
    Refusal,
    ResourceState,
    changed_request,
    pod_request,
)
from eventsrc.core.devices.holds import holdings, release_events, remove_pod_events
from eventsrc.core.devices.names import is_extended_resource_name
from eventsrc.core.fit import fits_request, node_usage, pod_requests, remove_missing_extended_resources
from eventsrc.core.memory.manager import MemoryManagerConfig
from eventsrc.core.memory.manager import assigned_events as memory_assigned_events
from eventsrc.core.memory.manager import provider as memory_provider
from eventsrc.core.memory.static_policy import MemoryPolicyError, MemoryProvider
from eventsrc.core.resources import qos_class
from eventsrc.core.runtime_decisions import running_before
from eventsrc.core.topology_manager import HintProvider, TopologyAffinityError, TopologyManager, admit_and_allocate
from eventsrc.errors import AdmissionRefused, NotFound
from eventsrc.events import ContainerSpec
from eventsrc.state.cpus import index_of as cpu_index_of
from eventsrc.state.devices import ResourceIndex, index_of
from eventsrc.state.lifecycles import ADMITTED, QUARANTINED
from eventsrc.state.views import PodView, Views

__all__ = [
    "AdmissionConfig",
    "AllocateCall",
    "CallResults",
    "DriverWanted",
    "Intent",
    "Outcome",
    "PluginWanted",
    "PodAdmission",
    "PreferredAsk",
    "PreferredFailed",
    "Question",
    "Refused",
    "pod_difference",
    "removal",
]

UNDO_REASON = "admission failed"  # the reason of every release an undo records


# --------------------------------------------------------------------------- what goes in


class PodClaim(Protocol):
    """A ResourceClaim the pod brings (``eventsrc.inputs.manifest.PodClaim``)."""

    @property
    def ref(self) -> ev.ClaimRef: ...
    @property
    def driver(self) -> str: ...


class Pod(Protocol):
    """The pod to admit (``eventsrc.inputs.manifest.PodSpec``): its containers in admission
    order (init containers first) and its claims."""

    @property
    def pod(self) -> ev.PodRef: ...
    @property
    def containers(self) -> list[ContainerSpec]: ...
    @property
    def claims(self) -> Sequence[PodClaim]: ...
    @property
    def source(self) -> str: ...


@dataclass(frozen=True)
class _Grown:
    """The one container a growth plans, as the pod it admits (``PodAdmission.grow``)."""

    pod: ev.PodRef
    containers: list[ContainerSpec]
    claims: Sequence[PodClaim] = ()
    source: str = ev.FROM_RUNTIME


@dataclass(frozen=True)
class Growth:
    """A growth: the container it admits; the pod's earlier containers found to be init
    containers (``ContainerAdmissionStarted.finished``); the earlier containers as they are
    now (the pod's QoS class is of them all); what their init containers hand on."""

    container: ContainerSpec
    finished: list[str]
    before: list[ContainerSpec]
    cpus: CPUSet
    devices: dict[str, set[str]]


def _inits(pod: PodView) -> set[str]:
    return {name for name, c in pod.containers.items() if c.kind == "init"}


def finished_containers(views: Views, pod: PodView) -> set[str]:
    """The pod's containers that are init containers: those recorded so, and those the
    runtime ran (ContainerCreated recorded) and no longer runs as the pod grows: reported
    exited, or gone from its listing (a Synchronize lists no exited container). The kubelet
    creates the next container only once an init container has exited. A container the log
    never saw created is not one (its creation may have been refused, and the kubelet went
    on to the next); an app container that exited before the next was created is taken for
    one: created again, it gets the shared pool (``runtime_decisions.handed_on_to_another``)."""
    live = {views.runtime.containers[cid].name for cid in running_before(views, pod)}
    ran = {name for name, c in pod.containers.items() if c.ran}
    return _inits(pod) | (ran - live)


def handed_on(views: Views, pod: PodView, kinds: Mapping[str, str]) -> tuple[CPUSet, dict[str, set[str]]]:
    """What the pod's containers (of ``kinds``) leave for the next one, as the kubelet's
    ``cpusToReuse`` and ``devicesToReuse`` stand after its containers in admission order: an
    init container's CPUs and devices added, any other container's taken out. Only devices a
    container of the pod still holds count: one given back (a growth undone) is free."""
    assigned = views.cpus.assignments.get(pod.uid, {})
    cpus: set[int] = set()
    devices: dict[str, set[str]] = {}
    for name, c in pod.containers.items():
        init = kinds.get(name) == "init"
        own = set(assigned.get(name, ()))
        cpus = cpus | own if init else cpus - own
        for resource, ids in c.devices.items():
            got = devices.setdefault(resource, set())
            if init:
                got |= set(ids)
            else:
                got -= set(ids)
    held: dict[str, set[str]] = {}
    for (_, resource), held_ids in holdings(views, pod.uid).items():
        held.setdefault(resource, set()).update(held_ids)
    reuse = {r: ids & held.get(r, set()) for r, ids in devices.items()}
    return CPUSet(cpus), {r: ids for r, ids in reuse.items() if ids}


def undo_growth(views: Views, cpus: CPUManagerConfig, uid: str, container: str, reason: str) -> list[ev.EventBase]:
    """Release what ``container`` of pod ``uid`` holds (a growth that did not end: the pod
    keeps its other containers), and the shared pool without it."""
    out: list[ev.EventBase] = list(release_events(views, uid, reason, container=container))
    held = views.cpus.assignments.get(uid, {})
    others = [c for name, cs in held.items() if name != container for c in cs]
    after = cpu_index_of(views.cpus).assigned(uid) | set(others)
    out += pool_change(cpus, views.cpus.shared, after, reason)
    return out


@dataclass(frozen=True)
class AdmissionConfig:
    """The daemon's configuration, as admission decides with it."""

    cpus: CPUManagerConfig
    topology: TopologyManager
    wait: float  # seconds the shell waits for a plugin or driver that is away (refusals name it)
    memory: MemoryManagerConfig = MemoryManagerConfig()
    # The node's allocatable, as the resource fit counts it (``core.fit``); a resource it does
    # not name is not checked (memory of a machine not described), and None checks none.
    allocatable: Mapping[str, int] | None = None


def device_requests(container: ContainerSpec) -> dict[str, int]:
    """Extended resources the container asks for (limits, as the kubelet reads them)."""
    return {k: int(v) for k, v in container.limits.items() if is_extended_resource_name(k) and int(v) > 0}


# --------------------------------------------------------------------------- questions


@dataclass(frozen=True)
class PluginWanted:
    """Is the device plugin of ``resource`` there? Answer with its options once it has listed
    its devices (waiting up to ``AdmissionConfig.wait`` while it is away), or None."""

    resource: str


@dataclass(frozen=True)
class DriverWanted:
    """Is the DRA driver ``driver`` registered? Answer True, or False once
    ``AdmissionConfig.wait`` has passed without it."""

    driver: str


Question = PluginWanted | DriverWanted
Answer = ev.PluginOptions | bool | None

# ``plan`` yields ``PreferredAsk`` (GetPreferredAllocation) and takes the plugin's answer: the
# device ids it prefers, or ``PreferredFailed`` with the kubelet's message when the call failed.


# --------------------------------------------------------------------------- what comes out


@dataclass(frozen=True)
class Refused:
    """The pod is refused before its intent: record ``event``, answer ``reason``."""

    reason: str
    event: ev.AdmissionRejected
    cpu_pinning: tuple[bool, ...] = ()  # as in Intent: what the CPU manager did before the refusal


@dataclass(frozen=True)
class AllocateCall:
    """Allocate ``device_ids`` for ``container`` with the plugin of ``resource``, then
    PreStartContainer when ``pre_start`` (the plugin asked for it when it registered)."""

    container: str
    resource: str
    device_ids: list[str]
    pre_start: bool


@dataclass(frozen=True)
class Intent:
    """The pod is admitted by the planner: record ``events`` (durably) before any call."""

    events: list[ev.EventBase]
    # In order, each once, until one fails (a step the container holds already is not called).
    allocations: list[AllocateCall]
    # After every Allocate succeeded: NodePrepareResources per driver (all of them outcome
    # events). None when the pod brings no claims: there is no PrepareResources operation.
    claim_prepares: list[ClaimWork] | None
    # One entry per container that asked for exclusive CPUs: True when it could not get them.
    cpu_pinning: tuple[bool, ...] = ()


@dataclass
class CallResults:
    """What the shell's calls returned, in the order they were made."""

    allocated: list[tuple[AllocateCall, ev.ContainerAllocation]] = field(default_factory=list)
    failed: tuple[AllocateCall, str] | None = None  # the call that failed and why (its error)
    claims: list[ev.EventBase] = field(default_factory=list)  # ClaimPrepared / ClaimPrepareFailed


@dataclass(frozen=True)
class Outcome:
    """Whether the pod was admitted; when not, why, and the Allocate that failed (None when a
    claim could not be prepared)."""

    admitted: bool
    reason: str = ""
    failed: AllocateCall | None = None


# --------------------------------------------------------------------------- one pod, one uid
# A uid names one pod: the same uid given again must come with the same pod (a retry, or a
# restarted kubelet admitting its pods again), never another one.


@dataclass(frozen=True)
class _Shape:
    """What must be the same for two admissions of one uid to be one pod."""

    uid: str
    namespace: str
    name: str
    # per container, in order: (name, kind, requests, limits)
    containers: tuple[tuple[str, str, Mapping[str, str], Mapping[str, str]], ...]


def _shape(pod: Pod) -> _Shape:
    cs = tuple((c.name, c.kind, c.requests, c.limits) for c in pod.containers)
    return _Shape(pod.pod.uid, pod.pod.namespace, pod.pod.name, cs)


def _shape_of_view(pod: PodView) -> _Shape:
    cs = tuple((name, c.kind, c.requests, c.limits) for name, c in pod.containers.items())
    return _Shape(pod.uid, pod.namespace, pod.name, cs)


def _identity_difference(was: _Shape, now: _Shape) -> str | None:
    """Why ``now`` is not the pod ``was`` by its name and containers, or None."""
    if (was.namespace, was.name) != (now.namespace, now.name):
        return f"uid {was.uid} is pod {was.namespace}/{was.name}, not {now.namespace}/{now.name}"
    before = [(name, kind) for name, kind, _, _ in was.containers]
    after = [(name, kind) for name, kind, _, _ in now.containers]
    if before != after:
        listed = ", ".join(f"{name} ({kind})" for name, kind in before)
        return f"pod {was.namespace}/{was.name} ({was.uid}) has the containers {listed}; this request has others"
    return None


def _defaulted(requests: Mapping[str, str], limits: Mapping[str, str]) -> dict[str, str]:
    """Requests as the apiserver defaults them: a resource with a limit and no request asks
    its limit (a pod recorded before the CLI and the node API both defaulted compares alike)."""
    return {**limits, **requests}


def _resources_difference(was: _Shape, now: _Shape) -> str | None:
    for (name, _, requests, limits), (_, _, requests2, limits2) in zip(was.containers, now.containers, strict=True):
        if (_defaulted(requests, limits), dict(limits)) != (_defaulted(requests2, limits2), dict(limits2)):
            return (
                f"pod {was.namespace}/{was.name} ({was.uid}) container {name!r} has other resources "
                f"(requests {dict(requests)}, limits {dict(limits)})"
            )
    return None


def pod_difference(was: Pod, now: Pod) -> str | None:
    """Why ``now`` is not the pod ``was`` (an admission of the same uid still running), or None."""
    first, second = _shape(was), _shape(now)
    return _identity_difference(first, second) or _resources_difference(first, second)


# --------------------------------------------------------------------------- one admission


class PodAdmission:
    """One pod's admission; its phases run once each, in order (see the module's header)."""

    def __init__(self, views: Views, config: AdmissionConfig, pod: Pod, growing: Growth | None = None) -> None:
        """``growing``: the admission of one more container of an admitted pod
        (``PodAdmission.grow``); ``pod`` then holds the pod's containers and that one last."""
        self.views = views
        self.config = config
        self.pod = pod
        self.uid = pod.pod.uid
        self.growing = growing
        self.requests = {c.name: device_requests(c) for c in pod.containers}
        self._options: dict[str, ev.PluginOptions] = {}  # per resource, as find() got them
        self._planned: set[str] = set()  # the device plugin resources plan() gave devices

    @classmethod
    def grow(cls, views: Views, config: AdmissionConfig, pod: Pod) -> PodAdmission | PodView | None:
        """The admission of ``pod``'s one container (a pod admitted from the runtime's facts,
        told of one container at a time) into the pod the views hold. None when the pod is
        not known or not admitted (admitted whole, its admission still running, or
        quarantined: ``known`` says); the pod, kept as it is, when it has the container.
        Raises AdmissionRefused (not recorded) while one of its containers is admitted, when
        the uid is another pod's, or when the pod was admitted whole (through the node API: a
        container its admission did not name gets no exclusive CPUs or devices, docs/nri.md)."""
        (new,) = pod.containers
        known = views.pods.pods.get(pod.pod.uid)
        if known is None or known.state != ADMITTED:
            return None
        if known.growing:
            raise AdmissionRefused(
                f"pod {known.namespace}/{known.name} ({known.uid}) is admitting container {known.growing!r}"
            )
        if new.name in known.containers:
            return known
        if (known.namespace, known.name) != (pod.pod.namespace, pod.pod.name):
            raise AdmissionRefused(
                f"uid {known.uid} is pod {known.namespace}/{known.name}, not {pod.pod.namespace}/{pod.pod.name}"
            )
        if known.source != ev.FROM_RUNTIME:
            raise AdmissionRefused(
                f"pod {known.namespace}/{known.name} ({known.uid}) was admitted whole, without container {new.name!r}"
            )
        finished = finished_containers(views, known)
        kinds = {name: "init" if name in finished else c.kind for name, c in known.containers.items()}
        before = [
            ContainerSpec(
                name=name, kind=kinds[name], requests=dict(c.requests), limits=dict(c.limits), claims=list(c.claims)
            )
            for name, c in known.containers.items()
        ]
        cpus, devices = handed_on(views, known, kinds)
        growth = Growth(new, sorted(finished - _inits(known)), before, cpus, devices)
        # Only the new container is planned: the others keep what they hold, untouched.
        return cls(views, config, _Grown(pod=pod.pod, containers=[new]), growth)

    def _refused(
        self, reason: str, container: str = "", hint: str = "", pinning: Sequence[bool] = (), kubelet_reason: str = ""
    ) -> Refused:
        """The refusal: ``reason`` is the kubelet's message; ``kubelet_reason`` its reason
        word where it has one of its own (``OutOfcpu``), put before the message answered."""
        if self.growing is not None:
            container = self.growing.container.name
        event = ev.AdmissionRejected(
            pod=self.pod.pod, reason=reason, container=container, topology_hint=hint, kubelet_reason=kubelet_reason
        )
        return Refused(f"{kubelet_reason}: {reason}" if kubelet_reason else reason, event, tuple(pinning))

    # ------------------------------------------------------------------ known

    def known(self) -> PodView | None:
        """The pod as the views hold it, kept as it is; None when it is new. Raises
        AdmissionRefused (not recorded) while its admission runs, when the uid is another
        pod's (``pod_difference``), or when a container's device count changed."""
        pod = self.views.pods.pods.get(self.uid)
        if pod is None or self.growing is not None:
            return None
        if pod.state == QUARANTINED:
            raise AdmissionRefused(
                f"pod {pod.uid} is quarantined (records {', '.join(map(str, pod.in_doubt))} are in doubt, "
                "docs/adr/0005): remove it first"
            )
        if pod.state != ADMITTED:
            raise AdmissionRefused(f"pod {pod.namespace}/{pod.name} ({pod.uid}) is being admitted")
        known, asked = _shape_of_view(pod), _shape(self.pod)
        other = _identity_difference(known, asked)
        if other is not None:
            raise AdmissionRefused(other)
        for container, reqs in self.requests.items():
            have = pod.containers.get(container)
            for resource, n in reqs.items():
                got = len(have.devices.get(resource, [])) if have else 0
                if got != n:
                    raise AdmissionRefused(changed_request(pod.uid, container, resource, got, n))
        other = _resources_difference(known, asked)
        if other is not None:
            raise AdmissionRefused(other)
        return pod

    # ------------------------------------------------------------------ find

    def _resources(self) -> list[str]:
        """The extended resources the pod asks for, by name."""
        return sorted({r for reqs in self.requests.values() for r in reqs})

    def find(self) -> Generator[Question, Answer, Refused | None]:
        """Every device plugin (by resource name), then every DRA driver the pod needs. A
        resource with no plugin registered has no endpoint to wait for: plan() refuses it
        when a pod still holds its devices, fits() when none does."""
        wait = self.config.wait
        for resource in self._resources():
            if resource not in self.views.devices.plugins:
                continue
            options = yield PluginWanted(resource)
            if not isinstance(options, ev.PluginOptions):
                return self._refused(
                    f"no healthy devices present; cannot allocate unhealthy devices {resource} ({self._away(resource)})"
                )
            self._options[resource] = options
        for driver in sorted({c.driver for c in self.pod.claims}):
            if not (yield DriverWanted(driver)):
                return self._refused(f"DRA driver {driver} is not registered (waited {wait:g} s)")
        return None

    def _away(self, resource: str) -> str:
        """Why ``resource``'s plugin gave no options: not registered since the daemon
        started, or registered (this run) without sending its device list."""
        plugin = self.views.devices.plugins.get(resource)
        wait = f"{self.config.wait:g} s"
        if plugin is not None and plugin.connected and 0 < self.views.meta.started_seq < plugin.registered_seq:
            return f"its plugin registered at seq {plugin.registered_seq} but sent no device list within {wait}"
        return f"its plugin did not register within {wait}"

    # ------------------------------------------------------------------ plan

    def plan(self) -> Generator[PreferredAsk, list[str] | PreferredFailed, Refused | Intent]:
        """Devices and exclusive CPUs for every container, with the topology manager's say.

        The topology manager's scope asks its hint providers, the CPU manager then the device
        manager (the kubelet's order), for hints, merges them (per container, or once for the
        pod), and has each provider allocate the container within the merged hint, container
        by container (``topology_manager.admit_and_allocate``). The device manager yields
        ``PreferredAsk`` when a plugin's preference is wanted. An extended resource that is
        no device plugin's is left to the predicate (``fits``).
        """
        devices = self._devices()
        self._planned = set(devices.resources)
        cpus = self._cpus()
        before = self.growing.before if self.growing is not None else []
        memory = memory_provider(self.config.memory, self.views.memory, self.uid, [*before, *self.pod.containers])
        providers: list[HintProvider[PreferredAsk, list[str] | PreferredFailed]] = [cpus, devices, memory]
        try:
            yield from admit_and_allocate(self.config.topology, self.pod.containers, providers)
        except TopologyAffinityError as refusal:
            return self._refused(
                str(refusal), container=refusal.container, hint=str(refusal.hint), pinning=cpus.pinning
            )
        except (Refusal, TakeError, MemoryPolicyError) as refusal:
            return self._refused(str(refusal), pinning=cpus.pinning)
        return self._intent(devices, cpus, memory)

    def _devices(self) -> DeviceProvider:
        """The device manager for this pod, with the pod's device plugin resources (the
        kubelet's isDevicePluginResource): those of a registered plugin ``find`` got options
        for, and those whose plugin was dropped after its grace period while a pod still holds
        their devices (``registered`` False: the topology manager gets their hints, then
        devicesToAllocate refuses them); and what the pod holds already (a known pod admitted
        again). The provider passes over the pod's other extended resources: the predicate's
        (``fits``)."""
        views = self.views
        resources = {}
        index = index_of(views.devices)
        for resource in self._resources():
            r = index.resources.get(resource) or ResourceIndex()
            registered = resource in views.devices.plugins
            options = self._options.get(resource)
            if registered and options is None:  # registered since find(): not waited for
                continue
            if not registered and not any(d.holder for d in r.devices.values()):
                continue
            # The index's free devices stand for "every device but those held": in_use is
            # only what this pod takes as it goes (no pass over the devices, nor a copy).
            resources[resource] = ResourceState(
                table=views.devices.devices.get(resource, {}),
                in_use=set(),
                offers_preferred=registered and options is not None and options.get_preferred_allocation_available,
                free=r.free,
                everywhere=r.everywhere,
                healthy=r.healthy,
                registered=registered,
            )
        growing = self.growing
        held = holdings(views, self.uid) if self.uid in views.pods.pods and growing is None else {}
        # The machine's NUMA nodes (as the topology manager got them), never the ids plugins
        # report: hints are masks over these, as the kubelet's are.
        numa_nodes = list(self.config.topology.numa_info.nodes)
        reuse = {r: set(ids) for r, ids in growing.devices.items()} if growing is not None else {}
        return DeviceProvider(self.requests, resources, held, numa_nodes, self.uid, reuse)

    def _qos(self) -> str:
        """The pod's QoS class, of every container it has (a growth: so far)."""
        before = self.growing.before if self.growing is not None else []
        return qos_class([*before, *self.pod.containers])

    def _cpus(self) -> CPUProvider:
        """The CPU manager for this pod."""
        cpus = self.views.cpus
        reuse = self.growing.cpus if self.growing is not None else None
        planner = CPUPlanner(self.config.cpus, cpus.assignments, self.uid, self._qos(), cpu_index_of(cpus), reuse)
        return CPUProvider(planner)

    def _intent(self, devices: DeviceProvider, cpus: CPUProvider, memory: MemoryProvider) -> Intent:
        """What the providers planned, as the events to record before any call and the calls:
        devices reserved, CPUs assigned (final with the intent: no plugin call) and the shared
        pool without them, the claims' references and prepares; an Allocate per new step."""
        uid = self.uid
        growing = self.growing
        intent: list[ev.EventBase] = [
            ev.PodAdmissionStarted(pod=self.pod.pod, containers=self.pod.containers, source=self.pod.source)
            if growing is None
            else ev.ContainerAdmissionStarted(pod=self.pod.pod, container=growing.container, finished=growing.finished)
        ]
        intent += [
            ev.DevicesReserved(
                pod_uid=uid,
                container=s.container,
                resource=s.resource,
                device_ids=s.device_ids,
                choice=s.choice,
                note=s.note,
            )
            for s in devices.plan.steps
        ]
        intent += self._cpu_events(cpus.planner)
        intent += memory_assigned_events(uid, memory)
        claims = claim_admission_events(self.views, uid, [(c.ref, c.driver) for c in self.pod.claims])
        intent += claims.events
        allocations = [
            AllocateCall(s.container, s.resource, s.device_ids, self._options[s.resource].pre_start_required)
            for s in devices.plan.steps
            if s.new
        ]
        return Intent(intent, allocations, claims.work() if self.pod.claims else None, tuple(cpus.pinning))

    def _cpu_events(self, cpus: CPUPlanner) -> list[ev.EventBase]:
        """CPUsAssigned per container that got new exclusive CPUs, then the shared pool with
        this pod's CPUs as planned in place of any it had."""
        uid = self.uid
        new = [s for s in cpus.steps if s.new]
        out: list[ev.EventBase] = [
            ev.CPUsAssigned(pod_uid=uid, container=s.container, cpus=s.cpus.sorted_list()) for s in new
        ]
        if new:
            # A growth keeps what the pod's other containers hold: only the new one was planned.
            others = "" if self.growing is not None else uid
            after = cpu_index_of(self.views.cpus).assigned(without_pod=others).union(*(s.cpus for s in cpus.steps))
            out += pool_change(self.config.cpus, self.views.cpus.shared, after, f"exclusive CPUs for pod {uid}")
        return out

    # ------------------------------------------------------------------ fits

    def fits(self) -> Refused | None:
        """After plan() gave an Intent: the kubelet's predicate admit handler, which runs after
        the allocation handler. An extended resource plan() gave no devices is no device
        plugin's (none is registered, and no pod holds its devices): the node has 0 of it
        (the kubelet's node status keeps 0 for a dropped plugin's resource; one never
        registered is refused alike, ADR 0006), and the pod's effective request (init
        containers hand theirs on) does not fit."""
        for resource in self._resources():
            if resource not in self._planned:
                needed = pod_request(self.pod.containers, self.requests, resource)
                return self._refused(
                    f"Node didn't have enough resource: {resource}, requested: {needed}, used: 0, capacity: 0",
                    kubelet_reason=f"OutOf{resource}",
                )
        return self._fit()

    def _fit(self) -> Refused | None:
        """The resource fit (``core.fit``): the pod's requests (of all its containers, a
        growth's too) against the node's allocatable less what the other pods request; the
        first resource short refuses, with the kubelet's reason and words. A device plugin's
        resource always fits once its devices are planned: the kubelet raises its allocatable
        to the devices allocated, this pod's counted (``sanitizeNodeAllocatable``)."""
        allocatable = self.config.allocatable
        if allocatable is None:
            return None
        before = self.growing.before if self.growing is not None else []
        wants = remove_missing_extended_resources(pod_requests([*before, *self.pod.containers]), allocatable)
        # a resource the node does not know of (memory of a machine not described) is not checked
        checked = {r: n for r, n in wants.items() if r in allocatable and r not in self._planned}
        pods, used = node_usage(self.views.pods, self.uid)
        short = fits_request(checked, pods, used, allocatable)
        if not short:
            return None
        first = short[0]
        return self._refused(first.message(), kubelet_reason=first.reason())

    # ------------------------------------------------------------------ settle

    def settle(self, results: CallResults) -> Generator[list[ev.EventBase], object, Outcome]:
        """The outcome of the calls: PodAdmitted; or, when an Allocate failed, the failure and
        the undo; or, when a claim could not be prepared, the drivers' answers first and then
        the undo. Each batch yielded is to be recorded as one unit before resuming."""
        uid = self.uid
        outcome: list[ev.EventBase] = [
            ev.DevicesAllocated(
                pod_uid=uid, container=c.container, resource=c.resource, device_ids=c.device_ids, response=r
            )
            for c, r in results.allocated
        ]
        outcome += results.claims
        if results.failed is not None:
            call, error = results.failed
            reason = f"Allocate failed for {call.resource} in container {call.container}: {error}"
            failed = ev.AllocationFailed(
                pod_uid=uid, container=call.container, resource=call.resource, device_ids=call.device_ids, reason=reason
            )
            # AllocationFailed frees the failed step's devices; the undo is computed from the
            # views this batch leaves (a device an init container handed on is its own again).
            yield [*outcome, failed]
            yield [*self._undo(), ev.AdmissionRejected(pod=self.pod.pod, reason=reason, container=call.container)]
            return Outcome(admitted=False, reason=reason, failed=call)
        claim_failure = next((e for e in results.claims if isinstance(e, ev.ClaimPrepareFailed)), None)
        if claim_failure is not None:
            yield outcome  # what the drivers answered, claim by claim
            yield [*self._undo(), ev.AdmissionRejected(pod=self.pod.pod, reason=claim_failure.reason)]
            return Outcome(admitted=False, reason=claim_failure.reason)
        # Its containers are in this admission's PodAdmissionStarted: not written twice.
        admitted: ev.EventBase = (
            ev.PodAdmitted(pod=self.pod.pod, qos_class=self._qos())
            if self.growing is None
            else ev.ContainerAdmitted(pod=self.pod.pod, container=self.growing.container.name, qos_class=self._qos())
        )
        yield [*outcome, admitted]
        return Outcome(admitted=True)

    def _undo(self) -> list[ev.EventBase]:
        """Release every device, every exclusive CPU and every claim reference of the pod, as
        the views hold them now; of a growth, what the new container holds."""
        if self.growing is not None:
            return undo_growth(self.views, self.config.cpus, self.uid, self.growing.container.name, UNDO_REASON)
        views = self.views
        uid = self.uid
        out: list[ev.EventBase] = list(release_events(views, uid, UNDO_REASON))
        out += pool_change(self.config.cpus, views.cpus.shared, cpu_index_of(views.cpus).assigned(uid), UNDO_REASON)
        out += claim_release_events(views, uid)[0]
        return out


# --------------------------------------------------------------------------- removal


def removal(views: Views, cpus: CPUManagerConfig, uid: str, reason: str) -> list[ev.EventBase]:
    """The events that release everything pod ``uid`` holds and forget it. Raises NotFound, or
    AdmissionRefused while its admission runs (neither is recorded).

    The claim references go just before the last event: before PodRemoved, or, when the
    shared pool changes, between PodRemoved and SharedPoolChanged (the order logs hold).
    The unprepare intents among them are carried out by the DRA manager.
    """
    pod = views.pods.pods.get(uid)
    if pod is None:
        raise NotFound(f"no pod with uid {uid}")
    if pod.state == QUARANTINED:  # an operator resolves it: the removal says so
        reason = f"{reason}: released by the operator while quarantined (records in doubt: {pod.in_doubt})"
    elif pod.state != ADMITTED or pod.growing:
        raise AdmissionRefused(f"pod {pod.namespace}/{pod.name} ({uid}) is being admitted; remove it once that ends")
    events = remove_pod_events(views, uid, reason)
    events += pool_change(cpus, views.cpus.shared, cpu_index_of(views.cpus).assigned(uid), f"pod {uid} removed")
    events[-1:-1] = claim_release_events(views, uid)[0]
    return events
