"""The admission core (``eventsrc.core.admission``), driven in-process: no sockets, no log.

The views are built as the daemon builds them, by applying records of events; every batch the
core asks to record is applied the same way before the core goes on. The node: one device
plugin (``example.com/gpu``: gpu-0 and gpu-1 on NUMA node 0, gpu-2 and gpu-3 on node 1), one
DRA driver, and 8 CPUs on 2 NUMA nodes (0-3 and 4-7) with CPU 0 reserved.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

import pytest

from eventsrc import events as ev
from eventsrc.core.admission import (
    AdmissionConfig,
    AllocateCall,
    CallResults,
    DriverWanted,
    Intent,
    PluginWanted,
    PodAdmission,
    PreferredAsk,
    PreferredFailed,
    Question,
    Refused,
    pod_difference,
    removal,
)
from eventsrc.core.claims import ClaimWork
from eventsrc.core.cpu.assignment import StaticPolicyOptions
from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.core.cpu.static import CPUManagerConfig, pool_events
from eventsrc.core.cpu.topology import Core, MachineInfo, discover
from eventsrc.core.cpu.topology import Node as NUMANode
from eventsrc.core.devices.holds import restart_events
from eventsrc.core.invariants import Checker
from eventsrc.core.runtime_decisions import handed_on_to_another, placement
from eventsrc.core.topology_manager import TOPOLOGY_AFFINITY_MESSAGE, parse_topology_manager
from eventsrc.errors import AdmissionRefused, NotFound
from eventsrc.events import Record
from eventsrc.inputs.manifest import PodClaim, PodSpec
from eventsrc.state.apply import apply
from eventsrc.state.views import Views

GPU = "example.com/gpu"
DRIVER = "gpu.example.com"
PLAIN = ev.PluginOptions()
WAIT = 30.0

MACHINE = discover(
    MachineInfo(
        num_cores=8,
        num_sockets=2,
        topology=(
            NUMANode(0, tuple(Core(i, 0, (i,)) for i in range(4))),
            NUMANode(1, tuple(Core(i, 1, (4 + i,)) for i in range(4))),
        ),
    )
)
STATIC = CPUManagerConfig("static", MACHINE, CPUSet([0]), StaticPolicyOptions())

T = TypeVar("T")
Q = TypeVar("Q")
A = TypeVar("A")


# --------------------------------------------------------------------------- the node


class Log:
    """Views built by applying records, as the daemon's committer does; the batches recorded."""

    def __init__(self) -> None:
        self.views = Views()
        self.recorded: list[list[ev.EventBase]] = []

    def record(self, events: list[ev.EventBase]) -> None:
        self.recorded.append(list(events))
        for e in events:
            seq = self.views.meta.last_seq + 1
            apply(self.views, Record(seq, 0, "", e.VERSION, e))  # type: ignore[arg-type]


def node(options: ev.PluginOptions = PLAIN, driver: bool = True) -> Log:
    n = Log()
    events: list[ev.EventBase] = [
        ev.PluginRegistered(resource=GPU, endpoint="gpu.sock", options=options),
        ev.DevicesAdded(
            resource=GPU,
            devices=[ev.DeviceInfo(id=f"gpu-{i}", health="Healthy", numa_nodes=[i // 2]) for i in range(4)],
        ),
    ]
    if driver:
        events.append(ev.PluginRegistered(resource=DRIVER, endpoint="/dra.sock", api_version="v1", kind="DRAPlugin"))
    events += pool_events(STATIC, [], {}, "cpu manager started")
    n.record(events)
    return n


def config(policy: str = "none", scope: str = "container", cpus: CPUManagerConfig = STATIC) -> AdmissionConfig:
    return AdmissionConfig(cpus, parse_topology_manager(policy, scope, {}, [0, 1]), WAIT)


def container(
    name: str, gpus: int = 0, cpus: int = 0, kind: str = "app", claims: tuple[str, ...] = ()
) -> ev.ContainerSpec:
    limits = {GPU: str(gpus)} if gpus else {}
    if cpus:  # a Guaranteed container: limits only (requests default to them)
        limits |= {"cpu": str(cpus), "memory": "1Gi"}
    return ev.ContainerSpec(name=name, kind=kind, requests=dict(limits), limits=limits, claims=list(claims))


def claim(uid: str = "claim-1") -> PodClaim:
    return PodClaim(ref=ev.ClaimRef(uid=uid, namespace="default", name=uid), driver=DRIVER)


def pod(*containers: ev.ContainerSpec, uid: str = "pod-1", claims: tuple[PodClaim, ...] = ()) -> PodSpec:
    return PodSpec(
        pod=ev.PodRef(uid=uid, namespace="default", name=uid), containers=list(containers), claims=list(claims)
    )


# --------------------------------------------------------------------------- driving the phases


def run(phase: Generator[Q, A, T], answer: Callable[[Q], A]) -> tuple[T, list[Q]]:
    """Run a phase to its end; what it returned and what it asked, in order."""
    asked: list[Q] = []
    try:
        q = next(phase)
        while True:
            asked.append(q)
            q = phase.send(answer(q))
    except StopIteration as stop:
        return stop.value, asked


def everything_there(options: ev.PluginOptions = PLAIN) -> Callable[[Question], ev.PluginOptions | bool | None]:
    return lambda q: options if isinstance(q, PluginWanted) else True


def no_preference(ask: PreferredAsk) -> list[str] | PreferredFailed:
    raise AssertionError(f"the plugin was asked {ask} though it offers no preference")


def decide(
    n: Log,
    spec: PodSpec,
    cfg: AdmissionConfig | None = None,
    find: Callable[[Question], ev.PluginOptions | bool | None] | None = None,
    preferred: Callable[[PreferredAsk], list[str] | PreferredFailed] = no_preference,
) -> tuple[PodAdmission, Refused | Intent]:
    """known, find, plan and fits, as the shell runs them for a new pod."""
    core = PodAdmission(n.views, cfg or config(), spec)
    assert core.known() is None
    refused, _ = run(core.find(), find or everything_there())
    if refused is not None:
        return core, refused
    decision, _ = run(core.plan(), preferred)
    if isinstance(decision, Intent):
        return core, core.fits() or decision
    return core, decision


def intent(n: Log, spec: PodSpec, cfg: AdmissionConfig | None = None, **kw: Any) -> tuple[PodAdmission, Intent]:
    core, decision = decide(n, spec, cfg, **kw)
    assert isinstance(decision, Intent), decision
    n.record(decision.events)
    return core, decision


def settle(n: Log, core: PodAdmission, results: CallResults) -> Any:
    """Record each batch the core gives, before it goes on; the outcome."""
    outcome, _ = run(core.settle(results), n.record)
    return outcome


def allocation(call: AllocateCall) -> ev.ContainerAllocation:
    return ev.ContainerAllocation(envs={"DEVICES": ",".join(call.device_ids)})


def all_allocated(decision: Intent) -> CallResults:
    return CallResults(allocated=[(c, allocation(c)) for c in decision.allocations])


def admitted(n: Log, spec: PodSpec) -> None:
    """Admit ``spec``: every Allocate succeeds, every claim is prepared."""
    core, decision = intent(n, spec)
    results = all_allocated(decision)
    results.claims += [ev.ClaimPrepared(claim=c.ref, driver=c.driver) for c in spec.claims]
    assert settle(n, core, results).admitted


def kinds(events: list[ev.EventBase]) -> list[str]:
    return [type(e).__name__ for e in events]


def holders(n: Log) -> dict[str, str]:
    return {i: d.holder for i, d in n.views.devices.devices[GPU].items() if d.holder}


# --------------------------------------------------------------------------- a new pod, admitted


def test_a_new_pod_is_admitted_intent_first_then_outcome() -> None:
    n = node(ev.PluginOptions(pre_start_required=True))
    spec = pod(container("app", gpus=2, cpus=2))
    core, decision = intent(
        n, spec, config("single-numa-node"), find=everything_there(n.views.devices.plugins[GPU].options)
    )
    assert kinds(decision.events) == [
        "PodAdmissionStarted",
        "DevicesReserved",
        "CPUsAssigned",
        "SharedPoolChanged",
    ]
    reserved = decision.events[1]
    assert isinstance(reserved, ev.DevicesReserved)
    assert (reserved.container, reserved.device_ids, reserved.choice) == ("app", ["gpu-0", "gpu-1"], "daemon")
    assigned = decision.events[2]
    assert isinstance(assigned, ev.CPUsAssigned)
    assert assigned.cpus == [1, 2]  # NUMA node 0 with the devices (CPU 0 is reserved)
    assert decision.events[3] == ev.SharedPoolChanged(cpus=[0, 3, 4, 5, 6, 7], reason="exclusive CPUs for pod pod-1")
    assert decision.allocations == [AllocateCall("app", GPU, ["gpu-0", "gpu-1"], pre_start=True)]
    assert decision.claim_prepares is None
    assert decision.cpu_pinning == (False,)
    assert n.views.pods.pods["pod-1"].state == "admitting"

    outcome = settle(n, core, all_allocated(decision))
    assert outcome.admitted
    (batch,) = n.recorded[-1:]
    assert kinds(batch) == ["DevicesAllocated", "PodAdmitted"]
    # the containers are the intent's (PodAdmissionStarted): not written a second time
    assert batch[-1] == ev.PodAdmitted(pod=spec.pod, containers=[], qos_class="Guaranteed")
    assert n.views.pods.pods["pod-1"].state == "admitted"
    assert list(n.views.pods.pods["pod-1"].containers) == ["app"]
    assert holders(n) == {"gpu-0": "pod-1/app", "gpu-1": "pod-1/app"}


def test_the_questions_come_in_order_plugins_by_name_then_drivers() -> None:
    n = node()
    n.record([ev.PluginRegistered(resource="example.com/a", endpoint="a.sock")])
    spec = pod(ev.ContainerSpec(name="app", limits={GPU: "1", "example.com/a": "1"}), claims=(claim(),))
    core = PodAdmission(n.views, config(), spec)
    refused, asked = run(core.find(), everything_there())
    assert refused is None
    assert asked == [PluginWanted("example.com/a"), PluginWanted(GPU), DriverWanted(DRIVER)]


# --------------------------------------------------------------------------- a known pod


def test_a_known_pod_is_kept_as_it_is_without_a_question() -> None:
    n = node()
    spec = pod(container("app", gpus=1))
    admitted(n, spec)
    recorded = len(n.recorded)
    again = PodAdmission(n.views, config(), spec)
    assert again.known() is n.views.pods.pods["pod-1"]
    assert len(n.recorded) == recorded


def test_a_known_pod_with_a_changed_request_is_refused_unrecorded() -> None:
    n = node()
    admitted(n, pod(container("app", gpus=1)))
    changed = PodAdmission(n.views, config(), pod(container("app", gpus=2)))
    with pytest.raises(AdmissionRefused) as err:
        changed.known()
    assert str(err.value) == 'pod "pod-1" container "app" changed request for resource "example.com/gpu" from 1 to 2'


def test_a_pod_whose_admission_runs_is_refused_unrecorded() -> None:
    n = node()
    intent(n, pod(container("app", gpus=1)))
    with pytest.raises(AdmissionRefused, match=r"^pod default/pod-1 \(pod-1\) is being admitted$"):
        PodAdmission(n.views, config(), pod(container("app", gpus=1))).known()


# --------------------------------------------------------------------------- refused before the intent


def test_an_unknown_resource_is_refused_with_the_pods_effective_request() -> None:
    n = node()
    fpga = "example.com/fpga"
    spec = pod(
        ev.ContainerSpec(name="init", kind="init", limits={fpga: "3"}),
        ev.ContainerSpec(name="a", limits={fpga: "1"}),
        ev.ContainerSpec(name="b", limits={fpga: "1"}),
    )
    core = PodAdmission(n.views, config(), spec)
    refused, asked = run(core.find(), everything_there())
    assert (refused, asked) == (None, [])  # nothing is waited for
    assert isinstance(run(core.plan(), no_preference)[0], Intent)  # no device plugin's: the predicate's
    reason = f"Node didn't have enough resource: {fpga}, requested: 3, used: 0, capacity: 0"
    kubelet = f"OutOf{fpga}"
    assert core.fits() == Refused(
        f"{kubelet}: {reason}", ev.AdmissionRejected(pod=spec.pod, reason=reason, kubelet_reason=kubelet)
    )


def test_a_plugin_that_stays_away_is_refused() -> None:
    n = node()
    spec = pod(container("app", gpus=1))
    refused, asked = run(PodAdmission(n.views, config(), spec).find(), lambda q: None)
    assert asked == [PluginWanted(GPU)]
    assert isinstance(refused, Refused)
    assert refused.reason == (
        "no healthy devices present; cannot allocate unhealthy devices example.com/gpu "
        "(its plugin did not register within 30 s)"
    )
    assert refused.event == ev.AdmissionRejected(pod=spec.pod, reason=refused.reason)


def test_a_driver_that_stays_away_is_refused() -> None:
    n = node(driver=False)
    spec = pod(container("app", gpus=1), claims=(claim(),))
    refused, asked = run(
        PodAdmission(n.views, config(), spec).find(), lambda q: PLAIN if isinstance(q, PluginWanted) else False
    )
    assert asked == [PluginWanted(GPU), DriverWanted(DRIVER)]
    assert isinstance(refused, Refused)
    assert refused.reason == "DRA driver gpu.example.com is not registered (waited 30 s)"


def test_too_few_devices_is_refused_with_the_kubelets_message() -> None:
    n = node()
    spec = pod(container("app", gpus=5))
    _, refused = decide(n, spec)
    assert isinstance(refused, Refused)
    assert refused.reason == "requested number of devices unavailable for example.com/gpu. Requested: 5, Available: 4"
    assert refused.event == ev.AdmissionRejected(pod=spec.pod, reason=refused.reason)
    assert n.views.pods.pods == {}


def test_cpus_that_cannot_be_taken_are_refused_and_counted_as_a_failed_pinning() -> None:
    n = node()
    spec = pod(container("a", cpus=4), container("b", cpus=4))  # 7 CPUs are not reserved
    _, refused = decide(n, spec)
    assert isinstance(refused, Refused)
    assert refused.reason.startswith("not enough cpus available to satisfy request")
    assert refused.cpu_pinning == (False, True)  # "a" got its CPUs, "b" could not


# --------------------------------------------------------------------------- a plugin away, or past its grace
# The kubelet's words for a resource whose plugin went away, by where the resource stands
# (pkg/kubelet/cm/devicemanager/manager.go). Within the grace period the resource is still
# a device plugin resource (a stopped endpoint, no healthy device: eventsrc waits for the
# plugin first). Past it, GetCapacity forgets its healthy devices; while a pod holds some of
# them it stays a device plugin resource (isDevicePluginResource: allocatedDevices), and
# devicesToAllocate refuses it as unregistered, after the topology manager had the hints
# (none can be met); once none is held, the device manager leaves it alone and the
# predicate admit handler, which runs after the allocation handler, finds capacity 0 (the
# node status setter writes 0 for a dropped plugin's resource). The rows on a stopped
# endpoint and on a dropped resource nobody holds are TestUpdateCapacityAllocatable's last
# steps, as an admission meets them.

FPGA = "example.com/fpga"  # never registered
ACCEL = "example.com/accel"  # never registered, and before example.com/gpu by name

GONE = [ev.PluginDisconnected(resource=GPU, endpoint="gpu.sock", reason="ListAndWatch ended")]
DROPPED = [*GONE, ev.ResourceDropped(resource=GPU, reason="plugin away for 300 s")]
UNREGISTERED = f"cannot allocate unregistered device {GPU}"
TOPOLOGY = TOPOLOGY_AFFINITY_MESSAGE
TOO_FEW = f"requested number of devices unavailable for {GPU}. Requested: 5, Available: 4"
AWAY = f"no healthy devices present; cannot allocate unhealthy devices {GPU} (its plugin did not register within 30 s)"


def connected(n: Log, q: Question) -> bool:
    """A plugin still connected answers at once; one that went away stays away."""
    return isinstance(q, PluginWanted) and n.views.devices.plugins[q.resource].connected


def no_fit(resource: str, requested: int) -> str:
    words = f"Node didn't have enough resource: {resource}, requested: {requested}, used: 0, capacity: 0"
    return f"OutOf{resource}: {words}"


# (id, a pod holds gpu-0 first, what follows, the new pod's limits, topology manager
# policy/scope, the reason, the phase that refuses, the plugins waited for)
GRACE: list[tuple[str, bool, list[ev.EventBase], dict[str, str], str, str, str, list[str]]] = [
    ("within the grace period", True, GONE, {GPU: "1"}, "none/container", AWAY, "find", [GPU]),
    ("past it, a pod holds its devices", True, DROPPED, {GPU: "1"}, "none/container", UNREGISTERED, "plan", []),
    ("past it, held: topology first", True, DROPPED, {GPU: "1"}, "restricted/container", TOPOLOGY, "plan", []),
    ("past it, held: pod scope first", True, DROPPED, {GPU: "1"}, "single-numa-node/pod", TOPOLOGY, "plan", []),
    ("past it, held: best-effort admits", True, DROPPED, {GPU: "1"}, "best-effort/container", UNREGISTERED, "plan", []),
    ("past it, nobody holds any", False, DROPPED, {GPU: "2"}, "none/container", no_fit(GPU, 2), "fits", []),
    ("never registered", False, [], {FPGA: "1"}, "none/container", no_fit(FPGA, 1), "fits", []),
    ("the device manager first", True, DROPPED, {ACCEL: "1", GPU: "1"}, "none/container", UNREGISTERED, "plan", []),
    ("too few devices first", False, [], {ACCEL: "1", GPU: "5"}, "none/container", TOO_FEW, "plan", [GPU]),
    ("the predicate last", False, [], {ACCEL: "2", GPU: "1"}, "none/container", no_fit(ACCEL, 2), "fits", [GPU]),
]


@pytest.mark.parametrize(
    ("held", "then", "limits", "tm", "reason", "phase", "waited"),
    [row[1:] for row in GRACE],
    ids=[row[0] for row in GRACE],
)
def test_a_resource_whose_plugin_went_away_is_refused_with_the_kubelets_words(
    held: bool,
    then: list[ev.EventBase],
    limits: dict[str, str],
    tm: str,
    reason: str,
    phase: str,
    waited: list[str],
) -> None:
    n = node()
    if held:
        admitted(n, pod(container("app", gpus=1), uid="keeps"))
        assert holders(n) == {"gpu-0": "keeps/app"}
    n.record(then)
    spec = pod(ev.ContainerSpec(name="app", requests=dict(limits), limits=limits), uid="late")
    policy, scope = tm.split("/")
    core = PodAdmission(n.views, config(policy, scope), spec)
    assert core.known() is None
    refused, asked = run(core.find(), lambda q: PLAIN if connected(n, q) else None)
    assert asked == [PluginWanted(r) for r in waited]
    if phase != "find":
        assert refused is None
        refused, _ = run(core.plan(), no_preference)
    if phase == "fits":
        assert isinstance(refused, Intent)
        refused = core.fits()
    assert isinstance(refused, Refused)
    assert refused.reason == reason
    topology = reason == TOPOLOGY  # the merged hint is the policy's (tested there)
    # the recorded reason is the kubelet's message; the answer puts its reason word first
    word = refused.event.kubelet_reason
    assert (refused.event.pod, f"{word}: {refused.event.reason}" if word else refused.event.reason) == (
        spec.pod,
        reason,
    )
    assert word == (f"OutOf{reason.split(': ', 2)[2].split(',')[0]}" if reason.startswith("OutOf") else "")
    assert refused.event.container == ("app" if topology and scope == "container" else "")
    assert bool(refused.event.topology_hint) == topology


# --------------------------------------------------------------------------- the topology manager


def test_container_scope_refusal_names_the_container_and_the_merged_hint() -> None:
    n = node()
    spec = pod(container("small", gpus=1), container("big", gpus=3))  # no NUMA node holds 3
    _, refused = decide(n, spec, config("single-numa-node", "container"))
    assert isinstance(refused, Refused)
    assert refused.reason == TOPOLOGY_AFFINITY_MESSAGE
    assert (refused.event.container, refused.event.topology_hint) == ("big", "{<nil> false}")  # no single-node hint


def test_container_scope_refuses_when_cpus_and_devices_disagree() -> None:
    n = node()
    # Node 0 has free devices and no free CPU; node 1 free CPUs and no free device.
    n.record(
        [
            ev.DevicesReserved(pod_uid="other", container="c", resource=GPU, device_ids=["gpu-2", "gpu-3"]),
            ev.CPUsAssigned(pod_uid="other", container="c", cpus=[1, 2, 3]),
        ]
    )
    _, refused = decide(n, pod(container("app", gpus=1, cpus=1)), config("restricted", "container"))
    assert isinstance(refused, Refused)
    assert refused.reason == TOPOLOGY_AFFINITY_MESSAGE
    assert (refused.event.container, refused.event.topology_hint) == ("app", "{01 false}")
    _, admitted = decide(n, pod(container("app", gpus=1, cpus=1)), config("best-effort", "container"))
    assert isinstance(admitted, Intent)  # best-effort takes the same merged hint


def test_pod_scope_refusal_is_for_the_whole_pod() -> None:
    n = node()
    spec = pod(container("a", gpus=2), container("b", gpus=1))  # 3 for the pod: no single node
    _, refused = decide(n, spec, config("single-numa-node", "pod"))
    assert isinstance(refused, Refused)
    assert refused.reason == TOPOLOGY_AFFINITY_MESSAGE
    assert (refused.event.container, refused.event.topology_hint) == ("", "{<nil> false}")


def test_pod_scope_puts_every_container_on_the_one_node() -> None:
    n = node()
    n.record([ev.DevicesReserved(pod_uid="other", container="c", resource=GPU, device_ids=["gpu-0"])])
    spec = pod(container("a", gpus=1, cpus=1), container("b", gpus=1, cpus=1))
    _, decision = decide(n, spec, config("single-numa-node", "pod"))
    assert isinstance(decision, Intent)
    devices = [e.device_ids for e in decision.events if isinstance(e, ev.DevicesReserved)]
    cpus = [e.cpus for e in decision.events if isinstance(e, ev.CPUsAssigned)]
    assert devices == [["gpu-2"], ["gpu-3"]]  # node 1: node 0 has one device left
    assert cpus == [[4], [5]]


# --------------------------------------------------------------------------- GetPreferredAllocation


def test_the_plugins_preference_is_taken() -> None:
    n = node(ev.PluginOptions(get_preferred_allocation_available=True))
    asks: list[PreferredAsk] = []

    def prefer(ask: PreferredAsk) -> list[str]:
        asks.append(ask)
        return ["gpu-3", "gpu-1"]

    _, decision = decide(
        n, pod(container("app", gpus=2)), find=everything_there(n.views.devices.plugins[GPU].options), preferred=prefer
    )
    assert asks == [PreferredAsk("app", GPU, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"], [], 2)]
    assert isinstance(decision, Intent)
    reserved = decision.events[1]
    assert isinstance(reserved, ev.DevicesReserved)
    assert (sorted(reserved.device_ids), reserved.choice, reserved.note) == (["gpu-1", "gpu-3"], "plugin", "")


def test_a_failed_get_preferred_allocation_falls_back_to_the_daemons_choice() -> None:
    n = node(ev.PluginOptions(get_preferred_allocation_available=True))
    failure = PreferredFailed("device plugin GetPreferredAllocation rpc failed with err: the plugin went away")
    _, decision = decide(
        n,
        pod(container("app", gpus=2)),
        find=everything_there(n.views.devices.plugins[GPU].options),
        preferred=lambda ask: failure,
    )
    assert isinstance(decision, Intent)
    reserved = decision.events[1]
    assert isinstance(reserved, ev.DevicesReserved)
    assert (reserved.device_ids, reserved.choice) == (["gpu-0", "gpu-1"], "daemon")
    assert reserved.note == f"GetPreferredAllocation failed, the daemon chose instead: {failure.reason}"


# --------------------------------------------------------------------------- calls that fail


def test_an_allocate_failure_after_earlier_containers_undoes_all_but_the_failed_step() -> None:
    n = node()
    spec = pod(container("a", gpus=1, cpus=1), container("b", gpus=1, cpus=1), claims=(claim(),))
    core, decision = intent(n, spec)
    first, second = decision.allocations
    assert (first.container, second.container) == ("a", "b")
    results = CallResults(allocated=[(first, allocation(first))], failed=(second, "the plugin went away"))
    outcome = settle(n, core, results)
    reason = "Allocate failed for example.com/gpu in container b: the plugin went away"
    assert (outcome.admitted, outcome.reason, outcome.failed) == (False, reason, second)
    # the outcome, then the undo computed from the views it left
    failure, undo = n.recorded[-2:]
    assert kinds(failure)[-1] == "AllocationFailed"
    batch = failure + undo
    assert kinds(batch) == [
        "DevicesAllocated",  # what "a" got
        "AllocationFailed",  # frees "b"'s devices itself
        "DevicesReleased",  # "a" only
        "CPUsReleased",
        "CPUsReleased",
        "SharedPoolChanged",
        "PodReferenceRemoved",
        "ClaimUnprepareStarted",
        "AdmissionRejected",
    ]
    assert batch[1] == ev.AllocationFailed(
        pod_uid="pod-1", container="b", resource=GPU, device_ids=second.device_ids, reason=reason
    )
    released = batch[2]
    assert isinstance(released, ev.DevicesReleased)
    assert (released.container, released.device_ids, released.reason) == ("a", first.device_ids, "admission failed")
    assert batch[5] == ev.SharedPoolChanged(cpus=list(range(8)), reason="admission failed")
    assert batch[-1] == ev.AdmissionRejected(pod=spec.pod, reason=reason, container="b")
    assert n.views.pods.pods == {}
    assert holders(n) == {}
    assert n.views.cpus.assignments == {}
    assert n.views.pods.rejected["pod-1"] == reason


def test_a_claim_prepare_failure_records_the_answers_then_undoes_from_the_views_they_left() -> None:
    n = node()
    spec = pod(container("app", gpus=1, cpus=1, claims=("claim-1",)), claims=(claim(),))
    core, decision = intent(n, spec)
    assert decision.claim_prepares == [ClaimWork(DRIVER, (claim().ref,))]
    failed = ev.ClaimPrepareFailed(claim=claim().ref, driver=DRIVER, reason="NodePrepareResources failed: no")
    results = all_allocated(decision)
    results.claims.append(failed)
    settle_phase = core.settle(results)
    answers = next(settle_phase)
    assert kinds(answers) == ["DevicesAllocated", "ClaimPrepareFailed"]
    n.record(answers)
    # Another pod's CPUs are recorded before the undo is computed: the undo's pool keeps them.
    n.record([ev.CPUsAssigned(pod_uid="other", container="c", cpus=[7])])
    undo = settle_phase.send(None)
    n.record(undo)
    with pytest.raises(StopIteration) as stop:
        settle_phase.send(None)
    assert (stop.value.value.admitted, stop.value.value.reason, stop.value.value.failed) == (False, failed.reason, None)
    assert kinds(undo) == [
        "DevicesReleased",
        "CPUsReleased",
        "SharedPoolChanged",
        "PodReferenceRemoved",
        "ClaimUnprepareStarted",
        "AdmissionRejected",
    ]
    assert undo[2] == ev.SharedPoolChanged(cpus=[0, 1, 2, 3, 4, 5, 6], reason="admission failed")
    assert undo[-1] == ev.AdmissionRejected(pod=spec.pod, reason=failed.reason)
    assert n.views.pods.pods == {}
    assert holders(n) == {}
    assert n.views.claims.claims["claim-1"].state == "unpreparing"


# --------------------------------------------------------------------------- claims


def test_a_pod_with_claims_only_asks_for_its_driver_and_prepares_them() -> None:
    n = node()
    spec = pod(container("app", claims=("claim-1",)), claims=(claim(),))
    core = PodAdmission(n.views, config(), spec)
    refused, asked = run(core.find(), everything_there())
    assert (refused, asked) == (None, [DriverWanted(DRIVER)])
    decision, _ = run(core.plan(), no_preference)
    assert isinstance(decision, Intent)
    assert decision.events == [
        ev.PodAdmissionStarted(pod=spec.pod, containers=spec.containers),
        ev.PodReferenceAdded(claim_uid="claim-1", pod_uid="pod-1"),
        ev.ClaimPrepareStarted(claim=claim().ref, driver=DRIVER, pod_uid="pod-1"),
    ]
    assert decision.allocations == []
    assert decision.claim_prepares == [ClaimWork(DRIVER, (claim().ref,))]
    n.record(decision.events)
    prepared = ev.ClaimPrepared(claim=claim().ref, driver=DRIVER, devices=[ev.PreparedDevice(device_name="d0")])
    outcome = settle(n, core, CallResults(claims=[prepared]))
    assert outcome.admitted
    assert n.recorded[-1] == [
        prepared,
        ev.PodAdmitted(pod=spec.pod, qos_class="BestEffort"),
    ]
    assert n.views.claims.claims["claim-1"].state == "prepared"


def test_a_pod_with_claims_and_devices_gets_both() -> None:
    n = node()
    spec = pod(container("app", gpus=1, claims=("claim-1",)), claims=(claim(),))
    core, decision = intent(n, spec)
    assert kinds(decision.events) == [
        "PodAdmissionStarted",
        "DevicesReserved",
        "PodReferenceAdded",
        "ClaimPrepareStarted",
    ]
    results = all_allocated(decision)
    results.claims.append(ev.ClaimPrepared(claim=claim().ref, driver=DRIVER))
    assert settle(n, core, results).admitted
    assert kinds(n.recorded[-1]) == ["DevicesAllocated", "ClaimPrepared", "PodAdmitted"]


def test_a_claim_prepared_for_another_pod_is_only_referenced() -> None:
    n = node()
    admitted(n, pod(container("app", claims=("claim-1",)), uid="pod-0", claims=(claim(),)))
    _, shared = decide(n, pod(container("app", claims=("claim-1",)), claims=(claim(),)))
    assert isinstance(shared, Intent)
    assert kinds(shared.events) == ["PodAdmissionStarted", "PodReferenceAdded"]
    assert shared.claim_prepares == []  # a PrepareResources operation with nothing to call


# --------------------------------------------------------------------------- removal


def test_removal_releases_everything_and_forgets_the_pod() -> None:
    n = node()
    admitted(n, pod(container("app", gpus=1, claims=("claim-1",)), claims=(claim(),)))
    events = removal(n.views, STATIC, "pod-1", "pod removed")
    assert kinds(events) == ["DevicesReleased", "PodReferenceRemoved", "ClaimUnprepareStarted", "PodRemoved"]
    n.record(events)
    assert n.views.pods.pods == {}
    assert holders(n) == {}


def test_removal_of_a_pod_with_exclusive_cpus_keeps_the_logs_order() -> None:
    n = node()
    admitted(n, pod(container("app", cpus=2, claims=("claim-1",)), claims=(claim(),)))
    events = removal(n.views, STATIC, "pod-1", "pod removed")
    # The claim references go just before the last event, here the shared pool's change.
    assert kinds(events) == [
        "CPUsReleased",
        "PodRemoved",
        "PodReferenceRemoved",
        "ClaimUnprepareStarted",
        "SharedPoolChanged",
    ]
    assert events[-1] == ev.SharedPoolChanged(cpus=list(range(8)), reason="pod pod-1 removed")


def test_removal_of_an_unknown_pod_or_one_being_admitted_is_refused() -> None:
    n = node()
    with pytest.raises(NotFound, match="^no pod with uid pod-1$"):
        removal(n.views, STATIC, "pod-1", "pod removed")
    intent(n, pod(container("app", gpus=1)))
    with pytest.raises(AdmissionRefused, match=r"is being admitted; remove it once that ends$"):
        removal(n.views, STATIC, "pod-1", "pod removed")


# --------------------------------------------------------------------------- one pod per uid


@pytest.mark.parametrize(
    ("other", "reason"),
    [
        (
            PodSpec(pod=ev.PodRef(uid="pod-1", namespace="default", name="other"), containers=[container("app", 1)]),
            "uid pod-1 is pod default/pod-1, not default/other",
        ),
        (
            pod(container("app", gpus=1), container("sidecar")),
            "pod default/pod-1 (pod-1) has the containers app (app); this request has others",
        ),
        (
            pod(container("app", gpus=1, kind="init")),
            "pod default/pod-1 (pod-1) has the containers app (app); this request has others",
        ),
        (
            pod(container("app", gpus=1, cpus=2)),
            "pod default/pod-1 (pod-1) container 'app' has other resources "
            "(requests {'example.com/gpu': '1'}, limits {'example.com/gpu': '1'})",
        ),
    ],
)
def test_another_pod_under_a_known_uid_is_refused_unrecorded(other: PodSpec, reason: str) -> None:
    n = node()
    spec = pod(container("app", gpus=1))
    admitted(n, spec)
    recorded = len(n.recorded)
    with pytest.raises(AdmissionRefused) as err:
        PodAdmission(n.views, config(), other).known()
    assert str(err.value) == reason
    assert pod_difference(spec, other) == reason  # the same, for an admission still under way
    assert pod_difference(spec, pod(container("app", gpus=1))) is None
    assert len(n.recorded) == recorded


def checked(n: Log, batches: bool = False) -> list[tuple[str, int]]:
    """``replay --check``'s rules over everything ``n`` recorded: (rule, seq) of each violation.
    ``batches``: each batch under one correlation id, as the shell appends it."""
    checker = Checker()
    found = []
    numbered = ((b, e) for b, batch in enumerate(n.recorded) for e in batch)
    for seq, (b, e) in enumerate(numbered, 1):
        found += checker.feed(Record(seq, seq, f"c{b if batches else seq}", e.VERSION, e))  # type: ignore[arg-type]
    found += checker.finish()
    return [(v.rule, v.seq) for v in found]


def test_replay_check_reports_devices_left_reserved_under_an_admitted_pod() -> None:
    # Two admissions of one uid decided at once, as the shell once let them be: the second
    # finds the first's reservation as its own and admits the pod before any Allocate answered.
    n = node()
    spec = pod(container("app", gpus=1))
    first, second = PodAdmission(n.views, config(), spec), PodAdmission(n.views, config(), spec)
    assert first.known() is None and second.known() is None
    decisions = []
    for core in (first, second):  # each under the admission lock in turn
        assert run(core.find(), everything_there())[0] is None
        decision, _ = run(core.plan(), no_preference)
        assert isinstance(decision, Intent)
        n.record(decision.events)
        decisions.append(decision)
    decision, second_decision = decisions
    assert second_decision.allocations == []  # the first's reservation, taken as its own
    assert settle(n, second, CallResults()).admitted
    admitted_at = sum(len(b) for b in n.recorded)
    assert n.views.devices.devices[GPU]["gpu-0"].hold == "reserved"
    assert ("reserved-under-admitted-pod", admitted_at) in checked(n)
    assert settle(n, first, all_allocated(decision)).admitted  # the first's outcome, late

    one = node()
    admitted(one, spec)
    assert not [rule for rule, _ in checked(one) if rule == "reserved-under-admitted-pod"]


def test_a_known_pod_recorded_without_requests_is_the_same_pod_with_them_defaulted() -> None:
    # Pods the node API admitted before it defaulted requests to limits are recorded so.
    n = node()
    limits = {GPU: "1", "cpu": "2"}
    admitted(n, pod(ev.ContainerSpec(name="app", limits=limits)))
    again = pod(ev.ContainerSpec(name="app", requests=dict(limits), limits=limits))
    assert PodAdmission(n.views, config(), again).known() is n.views.pods.pods["pod-1"]


def test_an_allocate_failure_releases_the_devices_an_init_container_handed_on() -> None:
    """The init container's device is reused by the app container; the init container's
    Allocate answered, the app container's failed. DevicesAllocated hands the device back to
    the init container and AllocationFailed frees only the app container's: the undo releases
    the init container's too, so the refused pod keeps nothing."""
    n = node()
    spec = pod(container("init", gpus=1, kind="init"), container("app", gpus=2))
    core, decision = intent(n, spec)
    first, second = decision.allocations
    assert (first.container, second.container) == ("init", "app")
    assert set(first.device_ids) < set(second.device_ids)  # handed on
    outcome = settle(n, core, CallResults(allocated=[(first, allocation(first))], failed=(second, "boom")))
    assert not outcome.admitted
    # the outcome, then the undo computed from the views it left
    failure, undo = n.recorded[-2:]
    assert kinds(failure)[-1] == "AllocationFailed"
    batch = failure + undo
    assert kinds(batch) == ["DevicesAllocated", "AllocationFailed", "DevicesReleased", "AdmissionRejected"]
    assert batch[2] == ev.DevicesReleased(
        pod_uid="pod-1", container="init", resource=GPU, device_ids=first.device_ids, reason="admission failed"
    )
    assert holders(n) == {}
    assert n.views.pods.pods == {}


# --------------------------------------------------------------------------- a pod that grows by container
# A pod eventsrc reads from the container runtime's facts (NRI) comes one container at a time:
# its first container's creation admits the pod, each later one grows it (issue 27).


def runtime_pod(c: ev.ContainerSpec, uid: str = "pod-1") -> PodSpec:
    return PodSpec(pod=ev.PodRef(uid=uid, namespace="default", name=uid), containers=[c], source=ev.FROM_RUNTIME)


def ran(n: Log, name: str, exited: bool, uid: str = "pod-1") -> None:
    """The runtime created ``name`` of pod ``uid`` (and it exited, when ``exited``)."""
    cid = f"{uid}-{name}"
    events: list[ev.EventBase] = [ev.ContainerCreated(container_id=cid, sandbox_id="s1", pod_uid=uid, name=name)]
    if exited:
        events.append(ev.ContainerStopped(container_id=cid, pod_uid=uid, exit_code=0))
    n.record(events)


def grow(n: Log, c: ev.ContainerSpec, cfg: AdmissionConfig | None = None) -> tuple[PodAdmission, Intent]:
    core = PodAdmission.grow(n.views, cfg or config(), runtime_pod(c))
    assert isinstance(core, PodAdmission)
    assert core.known() is None
    assert run(core.find(), everything_there())[0] is None
    decision, _ = run(core.plan(), no_preference)
    assert isinstance(decision, Intent), decision
    assert core.fits() is None
    n.record(decision.events)
    return core, decision


def test_a_runtime_pod_grows_by_container_and_an_init_containers_cpus_and_devices_pass_on() -> None:
    n = node()
    admitted(n, runtime_pod(container("init", gpus=1, cpus=1)))
    pod_view = n.views.pods.pods["pod-1"]
    assert (pod_view.source, list(pod_view.containers)) == (ev.FROM_RUNTIME, ["init"])
    (init_cpus,) = [n.views.cpus.assignments["pod-1"]["init"]]
    ran(n, "init", exited=True)

    core, decision = grow(n, container("main", gpus=1, cpus=1))
    assert kinds(decision.events) == ["ContainerAdmissionStarted", "DevicesReserved", "CPUsAssigned"]
    assert decision.events[0] == ev.ContainerAdmissionStarted(
        pod=ev.PodRef(uid="pod-1", namespace="default", name="pod-1"),
        container=container("main", gpus=1, cpus=1),
        finished=["init"],
    )
    reserved, assigned = decision.events[1:]
    assert isinstance(reserved, ev.DevicesReserved) and isinstance(assigned, ev.CPUsAssigned)
    assert (reserved.container, reserved.choice) == ("main", "reused")  # the init container's device
    assert reserved.device_ids == list(n.views.pods.pods["pod-1"].containers["init"].devices[GPU])
    assert assigned.cpus == init_cpus  # as the kubelet's cpusToReuse: the pool does not change
    assert pod_view.growing == "main" and pod_view.state == "admitted"
    assert pod_view.containers["init"].kind == "init"
    assert [c.container for c in decision.allocations] == ["main"]
    assert settle(n, core, all_allocated(decision)).admitted
    assert kinds(n.recorded[-1]) == ["DevicesAllocated", "ContainerAdmitted"]
    assert pod_view.growing == ""
    ran(n, "main", exited=False)

    core, decision = grow(n, ev.ContainerSpec(name="sidecar", requests={"cpu": "500m"}, limits={"cpu": "500m"}))
    assert kinds(decision.events) == ["ContainerAdmissionStarted"]  # a share of the pool: nothing exclusive
    assert decision.events[0].finished == []  # type: ignore[attr-defined]
    assert settle(n, core, CallResults()).admitted
    assert list(pod_view.containers) == ["init", "main", "sidecar"]
    assert checked(n, batches=True) == []


def test_a_container_the_pod_has_is_kept_and_a_pod_admitted_whole_does_not_grow() -> None:
    n = node()
    admitted(n, runtime_pod(container("app", cpus=1)))
    recorded = len(n.recorded)
    assert PodAdmission.grow(n.views, config(), runtime_pod(container("app", cpus=1))) is n.views.pods.pods["pod-1"]
    assert PodAdmission.grow(n.views, config(), runtime_pod(container("app"), uid="pod-2")) is None  # a new pod
    assert len(n.recorded) == recorded

    admitted(n, pod(container("app", cpus=1), uid="whole"))
    with pytest.raises(AdmissionRefused) as err:
        PodAdmission.grow(n.views, config(), runtime_pod(container("other"), uid="whole"))
    assert str(err.value) == "pod default/whole (whole) was admitted whole, without container 'other'"
    impostor = PodSpec(pod=ev.PodRef(uid="pod-1", namespace="default", name="x"), containers=[container("b")])
    with pytest.raises(AdmissionRefused, match="uid pod-1 is pod default/pod-1, not default/x"):
        PodAdmission.grow(n.views, config(), impostor)


def test_a_failed_growth_gives_back_only_the_new_containers_devices_and_cpus() -> None:
    n = node()
    admitted(n, runtime_pod(container("first", gpus=1, cpus=1)))
    ran(n, "first", exited=False)
    held_before = holders(n)
    pool_before = list(n.views.cpus.shared)
    core, decision = grow(n, container("second", gpus=1, cpus=2))
    assert decision.events[0].finished == []  # type: ignore[attr-defined]  # "first" runs
    with pytest.raises(AdmissionRefused, match="is being admitted"):  # one growth at a time, no removal meanwhile
        removal(n.views, STATIC, "pod-1", "gone")
    (call,) = decision.allocations
    outcome = settle(n, core, CallResults(failed=(call, "boom")))
    assert not outcome.admitted
    failed, undo = n.recorded[-2:]
    assert kinds(failed) == ["AllocationFailed"]  # which frees the devices of the failed call
    assert kinds(undo) == ["CPUsReleased", "SharedPoolChanged", "AdmissionRejected"]
    assert (undo[0].container, undo[-1].container) == ("second", "second")  # type: ignore[attr-defined]
    pod_view = n.views.pods.pods["pod-1"]
    assert (pod_view.state, pod_view.growing, list(pod_view.containers)) == ("admitted", "", ["first"])
    assert holders(n) == held_before
    assert list(n.views.cpus.shared) == pool_before
    assert "pod-1" not in n.views.runtime.gone
    assert checked(n, batches=True) == []  # a container refused leaves the pod admitted: no violation


def test_a_restart_during_a_growth_gives_back_that_container_alone() -> None:
    n = node()
    admitted(n, runtime_pod(container("first", gpus=1, cpus=1)))
    ran(n, "first", exited=False)
    held_before = holders(n)
    grow(n, container("second", gpus=1))
    finish = restart_events(n.views)
    reason = "the daemon restarted during the admission"
    assert [e for e in finish if not isinstance(e, ev.PluginDisconnected)] == [
        ev.DevicesReleased(
            pod_uid="pod-1",
            container="second",
            resource=GPU,
            device_ids=list(n.views.pods.pods["pod-1"].containers["second"].devices[GPU]),
            reason=reason,
        ),
        ev.AdmissionRejected(
            pod=ev.PodRef(uid="pod-1", namespace="default", name="pod-1"), reason=reason, container="second"
        ),
    ]
    n.record(finish)
    assert holders(n) == held_before
    assert list(n.views.pods.pods["pod-1"].containers) == ["first"]


def test_only_the_new_container_is_planned_and_devices_pass_on_as_the_kubelets_devices_to_reuse() -> None:
    # Two init containers, then two app containers: the kubelet's devicesToReuse after each.
    n = node()
    admitted(n, runtime_pod(container("i1", gpus=2)))
    ran(n, "i1", exited=True)
    first = set(n.views.pods.pods["pod-1"].containers["i1"].devices[GPU])
    for name, gpus, exited in (("i2", 1, True), ("a", 1, False), ("b", 1, False)):
        core, decision = grow(n, container(name, gpus=gpus))
        assert {s.container for s in core_steps(decision)} == {name}  # the others are not planned again
        assert [c.container for c in decision.allocations] == [name]
        assert settle(n, core, all_allocated(decision)).admitted
        ran(n, name, exited=exited)
    pod_view = n.views.pods.pods["pod-1"]
    got = {name: set(pod_view.containers[name].devices[GPU]) for name in ("i1", "i2", "a", "b")}
    assert got["i2"] < first and got["a"] < first  # i2 reused one of i1's; a one of the two inits'
    assert got["b"] <= first and got["b"] != got["a"]  # b the other: nothing new taken from the node
    assert len(holders(n)) == 2
    assert checked(n, batches=True) == []


def core_steps(decision: Intent) -> list[ev.DevicesReserved]:
    return [e for e in decision.events if isinstance(e, ev.DevicesReserved)]


def test_a_sibling_whose_device_turned_unhealthy_does_not_refuse_a_new_container() -> None:
    n = node()
    admitted(n, runtime_pod(container("a", gpus=1)))
    ran(n, "a", exited=False)
    (held,) = n.views.pods.pods["pod-1"].containers["a"].devices[GPU]
    n.record([ev.DeviceHealthChanged(resource=GPU, device_id=held, health="Unhealthy", numa_nodes=[0])])
    core, decision = grow(n, container("b", gpus=1))
    assert settle(n, core, all_allocated(decision)).admitted


def test_pod_scope_grows_by_a_container_asking_the_same_resource() -> None:
    n = node()
    cfg = config("single-numa-node", "pod")
    core, decision = intent(n, runtime_pod(container("a", gpus=1)), cfg)
    assert settle(n, core, all_allocated(decision)).admitted
    ran(n, "a", exited=False)
    core, decision = grow(n, container("b", gpus=1), cfg)
    assert settle(n, core, all_allocated(decision)).admitted


def test_a_container_never_seen_created_is_no_init_container_and_one_created_again_gets_the_pool() -> None:
    n = node()
    admitted(n, runtime_pod(container("a", cpus=2)))  # its creation refused later: never recorded created
    core, decision = grow(n, container("b", cpus=2))
    assert decision.events[0].finished == []  # type: ignore[attr-defined]
    assert settle(n, core, all_allocated(decision)).admitted
    assigned = n.views.cpus.assignments["pod-1"]
    assert not set(assigned["a"]) & set(assigned["b"])

    # An app container that exited before the next was created is taken for an init container;
    # created again, it must not run on what the next one took over.
    ran(n, "b", exited=True)
    core, decision = grow(n, container("c", cpus=2))
    assert decision.events[0].finished == ["b"]  # type: ignore[attr-defined]
    assert settle(n, core, all_allocated(decision)).admitted
    assert n.views.cpus.assignments["pod-1"]["c"] == assigned["b"]
    assert handed_on_to_another(n.views, "pod-1", "b")
    assert placement(n.views, STATIC, "pod-1", "b").cpus == sorted(n.views.cpus.shared)
    assert placement(n.views, STATIC, "pod-1", "c").cpus == assigned["b"]
