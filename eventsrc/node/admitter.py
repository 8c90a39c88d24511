"""Admission and removal of pods: the shell around the admission core (``eventsrc.core.admission``).

    admit(pod)
      one admission per uid at a time: a call for a uid whose admission runs waits for it
      and gets its answer (the same pod), or is refused (another pod)  core: pod_difference()
      a pod the views know already: kept as it is, or refused          core: known()
      under the admission lock (decisions are serial, as in the kubelet):
        the plugins and drivers it needs, waiting up to ``wait``        core: find()
        for those known but away
        the topology manager's admission, timed: GetPreferredAllocation core: plan()
        when the core asks
        the predicate, after the allocation (as the kubelet's handlers) core: fits()
        record the intent: PodAdmissionStarted, DevicesReserved, CPUsAssigned, claim references
        and prepares
      shielded from cancellation from here on:
        Allocate (+ PreStartContainer) per new step until one fails; NodePrepareResources
        record the outcome: PodAdmitted, or the undo and AdmissionRejected core: settle()
      with nothing to call (no devices, no claims): the intent and PodAdmitted are one append,
      still under the lock (docs/adr/0030)

    remove(uid)
      record what the core gives: the releases and PodRemoved             core: removal()

The shell decides nothing: it answers the core's questions, appends what the core returns,
makes the calls the core lists, counts the metrics and logs. A crash between intent and
outcome is finished on the next start from the log alone (``core.devices.holds.restart_events``):
the pod was never acknowledged, its devices go back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import msgspec
import trio

from eventsrc import events as ev
from eventsrc.core.admission import (
    AdmissionConfig,
    AllocateCall,
    CallResults,
    PluginWanted,
    PodAdmission,
    PreferredAsk,
    PreferredFailed,
    Question,
    Refused,
    pod_difference,
    removal,
)
from eventsrc.errors import AdmissionRefused
from eventsrc.inputs.allocations import allocation_from_proto
from eventsrc.inputs.manifest import PodSpec
from eventsrc.log.commit import new_correlation_id
from eventsrc.node.device_manager import PluginCallFailed
from eventsrc.node.dra_manager import log_claim_outcomes
from eventsrc.node.interfaces import ClaimDrivers, D, DevicePlugins, PluginEndpoint, Recorder
from eventsrc.obs.logger import correlation, get_logger
from eventsrc.rpc.bridge import CALL_ERRORS, why
from eventsrc.state.views import PodView

log = get_logger(__name__)

DEFAULT_ADMISSION_WAIT = 30.0
ALLOCATE_TIMEOUT = 60.0
_CALL_ERRORS: tuple[type[BaseException], ...] = (*CALL_ERRORS, PluginCallFailed)

T = TypeVar("T")
Q = TypeVar("Q")
A = TypeVar("A")
R = TypeVar("R")


async def drive(phase: Generator[Q, A, R], answer: Callable[[Q], Awaitable[A]]) -> R:
    """Run one of the core's phases to its end, answering each thing it yields."""
    try:
        asked = next(phase)
        while True:
            asked = phase.send(await answer(asked))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _copy(pod: PodView) -> PodView:
    return msgspec.convert(msgspec.to_builtins(pod), PodView)


def _name(spec: PodSpec) -> str:
    return f"{spec.pod.namespace}/{spec.pod.name}"


@dataclass
class _Running:
    """An admission under way: the pod it admits, and once ``done``, its answer (None when it
    ended without one: cancelled before its intent, the caller gone)."""

    spec: PodSpec
    done: trio.Event = field(default_factory=trio.Event)
    answer: tuple[PodView, str] | AdmissionRefused | None = None


@dataclass
class _Found(Generic[D]):
    """The plugins and drivers an admission found, to make its calls with."""

    endpoints: dict[str, PluginEndpoint] = field(default_factory=dict)
    drivers: dict[str, D] = field(default_factory=dict)


class Admission(Generic[D]):
    """Admission and removal (``eventsrc.api.node.Admitter``)."""

    def __init__(
        self,
        recorder: Recorder,
        config: AdmissionConfig,
        devices: DevicePlugins,
        dra: ClaimDrivers[D],
        readers_wait: Callable[[], AbstractContextManager[None]] = nullcontext,
    ) -> None:
        self.recorder = recorder
        self.readers_wait = readers_wait  # around each admission and removal: readers of the history wait (api.readers)
        self.config = config
        self.devices = devices
        self.dra = dra
        self._lock = trio.Lock()
        self._running: dict[str, _Running] = {}  # pod uid -> its admission under way
        # Held from computing events from the views to recording them, for every decision that
        # releases or takes (an intent, an outcome's undo, a removal): the views one decision
        # reads hold every record the others appended (SharedPoolChanged carries the whole set).
        self._one_decision = trio.Lock()  # one admission or removal at a time

    async def admit(self, spec: PodSpec) -> tuple[PodView, str]:
        """Admit ``spec``; return the pod as admitted and the correlation id.

        While an admission of the same uid runs, waits for it and answers as it did (the
        same pod), or refuses at once (another pod under that uid). Raises AdmissionRefused
        with the reason (recorded as AdmissionRejected, unless the pod was known already).
        """
        uid = spec.pod.uid
        while (running := self._running.get(uid)) is not None:
            other = pod_difference(running.spec, spec)
            if other is not None:
                raise AdmissionRefused(other)
            log.info("pod admission waits for the one under way", pod=_name(spec), uid=uid)
            await running.done.wait()
            if isinstance(running.answer, AdmissionRefused):
                raise AdmissionRefused(str(running.answer))
            if running.answer is not None:
                return running.answer
            # The first caller went away before its admission had an answer: admit here.
        running = self._running[uid] = _Running(spec)
        try:
            with (
                self.readers_wait(),
                correlation(new_correlation_id()) as cid,
            ):  # on every line logged and record appended for this pod
                running.answer = (await self._admit(spec), cid)
            return running.answer
        except AdmissionRefused as refused:
            running.answer = refused
            raise
        finally:
            del self._running[uid]
            running.done.set()

    async def _admit(self, spec: PodSpec) -> PodView:
        views = self.recorder.views
        # A pod read from the runtime's facts comes one container at a time: the pod grows.
        grown = PodAdmission.grow(views, self.config, spec) if spec.source == ev.FROM_RUNTIME else None
        if isinstance(grown, PodView):
            return grown
        core = grown or PodAdmission(views, self.config, spec)
        known = core.known()
        if known is not None:
            return known
        metrics = self.recorder.metrics
        found: _Found[D] = _Found()
        async with self._lock:
            refused = await drive(core.find(), lambda asked: self._find(asked, found))
            if refused is not None:
                raise await self._refuse(spec, refused)
            async with self._one_decision:
                with metrics.topology_admission():
                    decision = await drive(core.plan(), lambda ask: self._preferred(found.endpoints[ask.resource], ask))
                    for failed in decision.cpu_pinning:
                        metrics.cpu_pinning(failed=failed)
                    if isinstance(decision, Refused):
                        raise await self._refuse(spec, decision)
                unfit = core.fits()  # not the topology manager's: not counted as its error
                if unfit is not None:
                    raise await self._refuse(spec, unfit)
                if not decision.allocations and decision.claim_prepares is None:
                    # Nothing is called between the intent and the outcome: one append holds both,
                    # and a crash leaves both or neither.
                    return await self._settle(spec, core, CallResults(), intent=decision.events)
                await self.recorder.record(decision.events)  # durable and in the views: the next admission sees it
        results = CallResults()
        with trio.CancelScope(shield=True):  # an acknowledged intent always gets its outcome
            await self._allocate(decision.allocations, found.endpoints, results)
            if results.failed is None and decision.claim_prepares is not None:
                with metrics.dra_operation("PrepareResources") as outcome:
                    for work in decision.claim_prepares:
                        outcome += await self.dra.prepare(found.drivers[work.driver], work.claims)
                results.claims += outcome
            async with self._one_decision:
                pod = await self._settle(spec, core, results)
        return pod

    async def _find(self, asked: Question, found: _Found[D]) -> ev.PluginOptions | bool | None:
        """A device plugin's options once it has listed its devices, or whether a DRA driver is
        registered; those known but away are waited for."""
        if isinstance(asked, PluginWanted):
            # Known but away (the daemon or the plugin restarted): unknown is not unhealthy.
            ep = await self._waited(self.devices.listed, self.devices.wait_listed, asked.resource)
            if ep is None:
                return None
            found.endpoints[asked.resource] = ep
            return ep.options
        client = await self._waited(self.dra.connected, self.dra.wait_driver, asked.driver)
        if client is not None:
            found.drivers[asked.driver] = client
        return client is not None

    async def _waited(
        self, now: Callable[[str], T | None], wait: Callable[[str, float], Awaitable[T | None]], name: str
    ) -> T | None:
        """``now(name)``, or else ``wait(name, ...)`` for up to the configured wait, counted as waiting."""
        there = now(name)
        if there is None:
            with self.recorder.metrics.waiting():
                there = await wait(name, self.config.wait)
        return there

    async def _refuse(self, spec: PodSpec, refused: Refused) -> AdmissionRefused:
        await self.recorder.record([refused.event])
        log.info("pod refused", pod=_name(spec), uid=spec.pod.uid, reason=refused.reason)
        return AdmissionRefused(refused.reason)

    async def _preferred(self, ep: PluginEndpoint, ask: PreferredAsk) -> list[str] | PreferredFailed:
        try:
            return await ep.preferred(ask.available, ask.must_include, ask.size)
        except _CALL_ERRORS as exc:
            return PreferredFailed(f"device plugin GetPreferredAllocation rpc failed with err: {why(exc)}")

    async def _allocate(
        self, calls: list[AllocateCall], endpoints: dict[str, PluginEndpoint], results: CallResults
    ) -> None:
        """Allocate (and PreStartContainer when asked) for each call, in order, until one fails."""
        metrics = self.recorder.metrics
        for call in calls:
            ep = endpoints[call.resource]
            try:
                with trio.fail_after(ALLOCATE_TIMEOUT):
                    with metrics.alloc_timer(call.resource):
                        resp = await ep.allocate(call.device_ids, ALLOCATE_TIMEOUT)
                    if call.pre_start:
                        await ep.pre_start(call.device_ids)
                allocation = allocation_from_proto(resp)
            except Exception as exc:  # noqa: BLE001 - every failure gets its outcome recorded
                if not isinstance(exc, _CALL_ERRORS):  # a bug here or in a client: say so, and still settle the pod
                    log.exception("Allocate failed unexpectedly", resource=call.resource, container=call.container)
                results.failed = (call, why(exc))
                metrics.topology_admission_failed()
                return
            results.allocated.append((call, allocation))

    async def _settle(
        self, spec: PodSpec, core: PodAdmission, results: CallResults, intent: Sequence[ev.EventBase] = ()
    ) -> PodView:
        """Record the outcome the core gives for ``results`` (after ``intent``, in its first
        append, when the intent is not recorded yet); the pod, or AdmissionRefused. The caller
        holds ``_one_decision``."""
        log_claim_outcomes(results.claims)
        first = list(intent)

        async def record(events: list[ev.EventBase]) -> list[ev.Record]:
            nonlocal first
            events, first = [*first, *events], []
            return await self.recorder.record(events)

        outcome = await drive(core.settle(results), record)
        uid = spec.pod.uid
        if outcome.admitted:
            if core.growing is None:
                log.info("pod admitted", pod=_name(spec), uid=uid)
            else:
                log.info("container admitted", pod=_name(spec), uid=uid, container=core.growing.container.name)
            return self.recorder.views.pods.pods[uid]
        self.dra.kick()  # the claims the undo released are to be unprepared
        if outcome.failed is None:
            log.warning("pod refused: claim preparation failed", pod=_name(spec), uid=uid, reason=outcome.reason)
        else:
            log.warning(
                "pod refused: allocation failed",
                pod=_name(spec),
                uid=uid,
                container=outcome.failed.container,
                resource=outcome.failed.resource,
                reason=outcome.reason,
            )
        raise AdmissionRefused(outcome.reason)

    async def remove(self, uid: str, reason: str = "pod removed") -> tuple[PodView, str, int]:
        """Release everything ``uid`` holds and forget it; the pod as it was, the correlation
        id and the removal's sequence. Raises NotFound, or AdmissionRefused while its admission runs."""
        views = self.recorder.views
        if uid in self._running:  # not in the views before its intent is recorded
            raise AdmissionRefused(f"pod {uid} is being admitted; remove it once that ends")
        # One decision at a time, each from the views the one before left: two removals at once
        # would both release the pod's devices, the second after someone else got them.
        async with self._one_decision:
            events = removal(views, self.config.cpus, uid, reason)
            pod = _copy(views.pods.pods[uid])
            with self.readers_wait(), correlation(new_correlation_id()) as cid, trio.CancelScope(shield=True):
                records = await self.recorder.record(events)
        with correlation(cid):
            self.dra.kick()  # the claims left with no pod are to be unprepared
            log.info("pod removed", pod=f"{pod.namespace}/{pod.name}", uid=uid, reason=reason)
        return pod, cid, next(r.seq for r in records if isinstance(r.event, ev.PodRemoved))
