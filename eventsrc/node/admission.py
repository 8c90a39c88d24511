"""Admission and removal of pods: the shell around the device planner.

    admit(pod)
      under the admission lock (decisions are serial, as in the kubelet):
        wait for the plugins of the resources it needs (known but away: up to ``wait``)
        plan (eventsrc.core.devices.choice; asks plugins for preferences on the way)
        record PodAdmissionStarted + DevicesReserved            <- the intent
      shielded from cancellation from here on:
        Allocate (+ PreStartContainer) per container and resource
        record DevicesAllocated... + PodAdmitted                <- the outcome
        or     AllocationFailed + DevicesReleased... + AdmissionRejected

A crash between intent and outcome is finished on the next start from the log alone
(``core.devices.restart_events``): the pod was never acknowledged, its devices go back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec
import trio

from eventsrc import events as ev
from eventsrc.api.node import AdmissionRefused, NotFound
from eventsrc.core.claims import admission_events as claim_admission_events
from eventsrc.core.claims import release_events as claim_release_events
from eventsrc.core.cpu.assignment import TakeError
from eventsrc.core.cpu.static import CPUPlanner, CPUStep, pool_events, without_pod
from eventsrc.core.devices.choice import (
    Hint,
    PodPlan,
    PreferredAsk,
    PreferredFailed,
    Refusal,
    ResourceState,
    Step,
    container_hints,
    plan_pod,
)
from eventsrc.core.devices.holds import holdings, release_events, remove_pod_events
from eventsrc.core.resources import qos_class
from eventsrc.core.topology_manager import (
    TOPOLOGY_AFFINITY_MESSAGE,
    ProviderHints,
    TopologyHint,
)
from eventsrc.events import ContainerSpec
from eventsrc.inputs.manifest import PodSpec, device_requests
from eventsrc.log.commit import new_correlation_id
from eventsrc.node.device_manager import (
    DeviceManager,
    Endpoint,
    PluginCallFailed,
    allocation_from_proto,
)
from eventsrc.node.dra_manager import DRAClient, log_claim_outcomes
from eventsrc.obs.logger import correlation, get_logger
from eventsrc.rpc.bridge import CALL_ERRORS, why
from eventsrc.state.views import PodView

if TYPE_CHECKING:
    from eventsrc.node.daemon import Daemon

log = get_logger("eventsrc.node.admission")

DEFAULT_ADMISSION_WAIT = 30.0
ALLOCATE_TIMEOUT = 60.0
_CALL_ERRORS: tuple[type[BaseException], ...] = (*CALL_ERRORS, PluginCallFailed)


def _copy(pod: PodView) -> PodView:
    return msgspec.convert(msgspec.to_builtins(pod), PodView)


class TopologyRefusal(Refusal):
    """The topology manager's policy refused the merged hint (TopologyAffinityError)."""

    def __init__(self, hint: TopologyHint, container: str) -> None:
        super().__init__(TOPOLOGY_AFFINITY_MESSAGE)
        self.hint = str(hint)
        self.container = container


def _cpu_provider(hints: list[tuple[list[int], bool]] | None) -> ProviderHints:
    """The CPU manager as a hint provider: no exclusive CPUs, no preference (a nil map)."""
    return None if hints is None else {"cpu": [TopologyHint.of(nodes, preferred) for nodes, preferred in hints]}


def _device_provider(hints: dict[str, list[Hint] | None]) -> ProviderHints:
    return {
        r: None if h is None else [TopologyHint.of(sorted(x.nodes), x.preferred) for x in h] for r, h in hints.items()
    }


def pod_request(containers: list[ContainerSpec], requests: dict[str, dict[str, int]], resource: str) -> int:
    """The pod-level device count: the larger of the biggest init container and the rest."""
    init = max((requests[c.name].get(resource, 0) for c in containers if c.kind == "init"), default=0)
    rest = sum(requests[c.name].get(resource, 0) for c in containers if c.kind != "init")
    return max(init, rest)


@dataclass
class _Calls:
    """What the plugin calls of one admission returned."""

    responses: list[tuple[Step, ev.ContainerAllocation]] = field(default_factory=list)
    failed: tuple[Step, str] | None = None
    claims: list[ev._Event] = field(default_factory=list)  # ClaimPrepared / ClaimPrepareFailed


class Admission:
    def __init__(self, daemon: Daemon, devices: DeviceManager, wait: float = DEFAULT_ADMISSION_WAIT) -> None:
        self.daemon = daemon
        self.devices = devices
        self.wait = wait
        self._lock = trio.Lock()

    async def admit(self, spec: PodSpec) -> tuple[PodView, str]:
        """Admit ``spec``; return the pod as admitted and the correlation id.

        Raises AdmissionRefused with the reason (recorded as AdmissionRejected).
        """
        with correlation(new_correlation_id()) as cid:  # on every line logged and record appended for this pod
            return await self._admit(spec), cid

    async def _admit(self, spec: PodSpec) -> PodView:
        views = self.daemon.views
        uid = spec.pod.uid
        requests = {c.name: device_requests(c) for c in spec.containers}
        existing = views.pods.pods.get(uid)
        if existing is not None:
            return self._readmit(existing, requests)
        async with self._lock:
            endpoints = await self._endpoints(spec, requests)
            drivers = await self._drivers(spec)
            with self.daemon.metrics.topology_admission():
                plan, cpu_steps = await self._plan(spec, requests, endpoints)
            intent: list[ev._Event] = [ev.PodAdmissionStarted(pod=spec.pod, containers=spec.containers)]
            intent += [
                ev.DevicesReserved(
                    pod_uid=uid,
                    container=s.container,
                    resource=s.resource,
                    device_ids=s.device_ids,
                    choice=s.choice,
                    note=s.note,
                )
                for s in plan.steps
            ]
            # CPUs need no plugin call: their assignment is final with the intent.
            intent += [
                ev.CPUsAssigned(pod_uid=uid, container=s.container, cpus=s.cpus.sorted_list())
                for s in cpu_steps
                if s.new
            ]
            if any(s.new for s in cpu_steps):
                after = {**views.cpus.assignments, uid: {s.container: s.cpus.sorted_list() for s in cpu_steps}}
                intent += pool_events(self.daemon.cpus, views.cpus.shared, after, f"exclusive CPUs for pod {uid}")
            claim_plan = claim_admission_events(views, uid, [(c.ref, c.driver) for c in spec.claims])
            intent += claim_plan.events
            await self.daemon.record(intent)  # durable and in the views: the next admission sees it
        calls = _Calls()
        with trio.CancelScope(shield=True):  # an acknowledged intent always gets its outcome
            await self._call_plugins(plan, endpoints, calls)
            if calls.failed is None and spec.claims:
                with self.daemon.metrics.dra_operation("PrepareResources") as outcome:
                    for work in claim_plan.work():
                        outcome += await self.daemon.dra.prepare(drivers[work.driver], work.claims)
                calls.claims += outcome
            pod = await self._record_outcome(spec, plan, calls)
        return pod

    async def _drivers(self, spec: PodSpec) -> dict[str, DRAClient]:
        """The DRA drivers of the pod's claims, waiting for known ones that are away."""
        out = {}
        for driver in sorted({c.driver for c in spec.claims}):
            client = self.daemon.dra.clients.get(driver)
            if client is None:
                with self.daemon.metrics.waiting():
                    client = await self.daemon.dra.wait_driver(driver, self.wait)
            if client is None:
                raise await self._refuse(spec, f"DRA driver {driver} is not registered (waited {self.wait:g} s)")
            out[driver] = client
        return out

    def _readmit(self, pod: PodView, requests: dict[str, dict[str, int]]) -> PodView:
        """Admitting a pod again (a restarted kubelet does): it keeps what it has."""
        if pod.state != "admitted":
            raise AdmissionRefused(f"pod {pod.namespace}/{pod.name} ({pod.uid}) is being admitted")
        for container, reqs in requests.items():
            have = pod.containers.get(container)
            for resource, n in reqs.items():
                got = len(have.devices.get(resource, [])) if have else 0
                if got != n:
                    raise AdmissionRefused(
                        f'pod "{pod.uid}" container "{container}" changed request for resource "{resource}" from {got} to {n}'
                    )
        return pod

    async def _refuse(self, spec: PodSpec, reason: str, container: str = "", hint: str = "") -> AdmissionRefused:
        await self.daemon.record(
            [ev.AdmissionRejected(pod=spec.pod, reason=reason, container=container, topology_hint=hint)]
        )
        log.info("pod refused", pod=f"{spec.pod.namespace}/{spec.pod.name}", uid=spec.pod.uid, reason=reason)
        return AdmissionRefused(reason)

    async def _endpoints(self, spec: PodSpec, requests: dict[str, dict[str, int]]) -> dict[str, Endpoint]:
        views = self.daemon.views
        # The pod's effective request, as the kubelet counts it (init containers hand theirs on).
        resources = {r for reqs in requests.values() for r in reqs}
        needed = {r: pod_request(spec.containers, requests, r) for r in resources}
        running: dict[str, int] = {}
        for c in spec.containers:
            if c.kind != "init":
                for resource, n in requests[c.name].items():
                    running[resource] = running.get(resource, 0) + n
        for resource, n in running.items():
            needed[resource] = max(needed.get(resource, 0), n)
        endpoints = {}
        for resource in sorted(needed):
            if resource not in views.devices.plugins:
                raise await self._refuse(
                    spec,
                    f"Node didn't have enough resource: {resource}, requested: {needed[resource]}, used: 0, capacity: 0",
                )
            ep = self.devices.endpoints.get(resource)
            if ep is None or not ep.listed.is_set():
                # Known but away (the daemon or the plugin restarted): unknown is not unhealthy.
                with self.daemon.metrics.waiting():
                    ep = await self.devices.wait_listed(resource, self.wait)
            if ep is None:
                raise await self._refuse(
                    spec,
                    f"no healthy devices present; cannot allocate unhealthy devices {resource} "
                    f"(its plugin did not register within {self.wait:g} s)",
                )
            endpoints[resource] = ep
        return endpoints

    async def _plan(
        self, spec: PodSpec, requests: dict[str, dict[str, int]], endpoints: dict[str, Endpoint]
    ) -> tuple[PodPlan, list[CPUStep]]:
        """Devices and exclusive CPUs for every container, with the topology manager's say.

        The device planner walks the containers; at each one it asks ``affinity_of``, which
        merges the CPU and device hints (container scope), admits or rejects, and gives the
        container its CPUs within the merged affinity, before its devices are chosen with
        the same affinity, as the kubelet's providers allocate in order.
        """
        views = self.daemon.views
        uid = spec.pod.uid
        resources = {}
        for resource, ep in endpoints.items():
            table = views.devices.devices.get(resource, {})
            in_use = {i for i, d in table.items() if d.holder}
            resources[resource] = ResourceState(
                table=table, in_use=in_use, offers_preferred=ep.options.get_preferred_allocation_available
            )
        held = holdings(views, uid) if uid in views.pods.pods else {}
        cpus = CPUPlanner(self.daemon.cpus, views.cpus.assignments, uid, qos_class(spec.containers))
        tm = self.daemon.topology
        metrics = self.daemon.metrics
        try:
            pod_affinity = self._pod_affinity(spec, requests, resources, held, cpus) if tm.scope == "pod" else None
        except TopologyRefusal as refusal:
            raise await self._refuse(spec, str(refusal), hint=refusal.hint) from None

        def affinity_of(c: ContainerSpec, device_hints: dict[str, list[Hint] | None]) -> frozenset[int] | None:
            nodes = pod_affinity
            if tm.scope == "container":
                best, admit = tm.policy.merge([_cpu_provider(cpus.hints(c)), _device_provider(device_hints)])
                if not admit:
                    raise TopologyRefusal(best, c.name)
                nodes = best.nodes()
            try:
                step = cpus.allocate(c, nodes)
            except TakeError as err:
                metrics.cpu_pinning(failed=True)
                raise Refusal(str(err)) from None
            if step is not None:  # the container asked for exclusive CPUs
                metrics.cpu_pinning(failed=False)
            return frozenset(nodes) if nodes else None

        planner = plan_pod(
            spec.containers,
            requests,
            resources,
            held=held,
            pod_uid=uid,
            affinity_of=affinity_of,
            device_hints_needed=tm.scope == "container",
        )
        try:
            ask = next(planner)
            while True:
                answer = await self._preferred(endpoints[ask.resource], ask)
                ask = planner.send(answer)
        except StopIteration as stop:
            return stop.value, cpus.steps
        except TopologyRefusal as refusal:
            raise await self._refuse(spec, str(refusal), container=refusal.container, hint=refusal.hint) from None
        except Refusal as refusal:
            raise await self._refuse(spec, str(refusal)) from None

    def _pod_affinity(
        self,
        spec: PodSpec,
        requests: dict[str, dict[str, int]],
        resources: dict[str, ResourceState],
        held: Mapping[tuple[str, str], list[str]],
        cpus: CPUPlanner,
    ) -> list[int] | None:
        """The pod scope: one merge of the pod-level hints, for every container."""
        device_hints: dict[str, list[Hint] | None] = {}
        for resource, state in resources.items():
            n = pod_request(spec.containers, requests, resource)
            pod_held = [i for (_, r), ids in held.items() if r == resource for i in ids]
            numa = sorted({x for d in state.table.values() for x in d.numa_nodes})
            device_hints[resource] = container_hints(state.table, pod_held, state.in_use, [], n, numa)
        best, admit = self.daemon.topology.policy.merge(
            [_cpu_provider(cpus.pod_hints(spec.containers)), _device_provider(device_hints)]
        )
        if not admit:
            raise TopologyRefusal(best, "")
        return best.nodes()

    async def _preferred(self, ep: Endpoint, ask: PreferredAsk) -> list[str] | PreferredFailed:
        try:
            return await ep.preferred(ask.available, ask.must_include, ask.size)
        except _CALL_ERRORS as exc:
            return PreferredFailed(f"device plugin GetPreferredAllocation rpc failed with err: {why(exc)}")

    async def _call_plugins(self, plan: PodPlan, endpoints: dict[str, Endpoint], calls: _Calls) -> None:
        """Allocate (and PreStartContainer when asked) for each new step, in order, until one fails."""
        for step in plan.steps:
            if not step.new:
                continue
            ep = endpoints[step.resource]
            try:
                with trio.fail_after(ALLOCATE_TIMEOUT):
                    with self.daemon.metrics.alloc_timer(step.resource):
                        resp = await ep.allocate(step.device_ids, ALLOCATE_TIMEOUT)
                    if ep.options.pre_start_required:
                        await ep.pre_start(step.device_ids)
                allocation = allocation_from_proto(resp)
            except Exception as exc:  # noqa: BLE001 - every failure gets its outcome recorded
                if not isinstance(exc, _CALL_ERRORS):  # a bug here or in a client: say so, and still settle the pod
                    log.exception("Allocate failed unexpectedly", resource=step.resource, container=step.container)
                calls.failed = (step, f"Allocate failed for {step.resource} in container {step.container}: {why(exc)}")
                self.daemon.metrics.topology_admission_failed()
                return
            calls.responses.append((step, allocation))

    async def _record_outcome(self, spec: PodSpec, plan: PodPlan, calls: _Calls) -> PodView:
        uid = spec.pod.uid
        outcome: list[ev._Event] = [
            ev.DevicesAllocated(
                pod_uid=uid, container=s.container, resource=s.resource, device_ids=s.device_ids, response=r
            )
            for s, r in calls.responses
        ]
        outcome += calls.claims
        log_claim_outcomes(calls.claims)
        claim_failure = next((e for e in calls.claims if isinstance(e, ev.ClaimPrepareFailed)), None)
        if calls.failed is None and claim_failure is not None:
            reason = claim_failure.reason
            await self.daemon.record(outcome)  # what the driver answered, claim by claim
            views = self.daemon.views
            undo: list[ev._Event] = list(release_events(views, uid, "admission failed"))
            undo += pool_events(
                self.daemon.cpus, views.cpus.shared, without_pod(views.cpus.assignments, uid), "admission failed"
            )
            undo += claim_release_events(views, uid)[0]
            await self.daemon.record([*undo, ev.AdmissionRejected(pod=spec.pod, reason=reason)])
            self.daemon.dra.kick()
            log.warning(
                "pod refused: claim preparation failed",
                pod=f"{spec.pod.namespace}/{spec.pod.name}",
                uid=uid,
                reason=reason,
            )
            raise AdmissionRefused(reason)
        if calls.failed is not None:
            step, reason = calls.failed
            failed = ev.AllocationFailed(
                pod_uid=uid, container=step.container, resource=step.resource, device_ids=step.device_ids, reason=reason
            )
            views = self.daemon.views
            others: list[ev._Event] = [
                e
                for e in release_events(views, uid, "admission failed")
                if not (
                    isinstance(e, ev.DevicesReleased) and (e.container, e.resource) == (step.container, step.resource)
                )
            ]
            others += pool_events(
                self.daemon.cpus, views.cpus.shared, without_pod(views.cpus.assignments, uid), "admission failed"
            )
            others += claim_release_events(views, uid)[0]
            await self.daemon.record(
                [*outcome, failed, *others, ev.AdmissionRejected(pod=spec.pod, reason=reason, container=step.container)]
            )
            self.daemon.dra.kick()
            log.warning(
                "pod refused: allocation failed",
                pod=f"{spec.pod.namespace}/{spec.pod.name}",
                uid=uid,
                container=step.container,
                resource=step.resource,
                reason=reason,
            )
            raise AdmissionRefused(reason)
        outcome.append(ev.PodAdmitted(pod=spec.pod, containers=spec.containers, qos_class=qos_class(spec.containers)))
        await self.daemon.record(outcome)
        log.info("pod admitted", pod=f"{spec.pod.namespace}/{spec.pod.name}", uid=uid)
        return self.daemon.views.pods.pods[uid]

    async def remove(self, uid: str, reason: str = "pod removed") -> tuple[PodView, str]:
        """Release everything ``uid`` holds and forget it."""
        pod = self.daemon.views.pods.pods.get(uid)
        if pod is None:
            raise NotFound(f"no pod with uid {uid}")
        if pod.state != "admitted":
            raise AdmissionRefused(
                f"pod {pod.namespace}/{pod.name} ({uid}) is being admitted; remove it once that ends"
            )
        before = _copy(pod)
        with correlation(new_correlation_id()) as cid:
            await self._remove(pod, reason)
        return before, cid

    async def _remove(self, pod: PodView, reason: str) -> None:
        uid = pod.uid
        views = self.daemon.views
        events = remove_pod_events(views, uid, reason)
        events += pool_events(
            self.daemon.cpus, views.cpus.shared, without_pod(views.cpus.assignments, uid), f"pod {uid} removed"
        )
        claim_events, _ = claim_release_events(views, uid)
        # The references go with the pod (before PodRemoved); the unprepare intents are
        # carried out by the DRA manager, which retries until the driver answers.
        events[-1:-1] = claim_events
        with trio.CancelScope(shield=True):
            await self.daemon.record(events)
        self.daemon.dra.kick()
        log.info("pod removed", pod=f"{pod.namespace}/{pod.name}", uid=uid, reason=reason)
