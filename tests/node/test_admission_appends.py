"""The admission shell (``eventsrc.node.admitter.Admission``) and its appends: an admission that
calls nothing (no device, no claim) records its intent and its outcome in one append, before
anything else is decided; one that calls a plugin records the intent, makes the call, then the
outcome. A recorder that applies each append to real views (tests/support/recorder.py); a fake
device plugin; trio's mock clock."""

from __future__ import annotations

import trio
import trio.testing

from eventsrc import events as ev
from eventsrc.core.admission import AdmissionConfig
from eventsrc.core.cpu.assignment import StaticPolicyOptions
from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.core.cpu.static import CPUManagerConfig, pool_events
from eventsrc.core.cpu.topology import Core, MachineInfo, discover
from eventsrc.core.cpu.topology import Node as NUMANode
from eventsrc.core.topology_manager import parse_topology_manager
from eventsrc.errors import AdmissionRefused
from eventsrc.gen.deviceplugin.v1beta1 import api_pb2 as pb
from eventsrc.inputs.manifest import PodSpec
from eventsrc.node.admitter import Admission
from tests.support.recorder import FakeRecorder

GPU = "example.com/gpu"
MACHINE = discover(
    MachineInfo(num_cores=4, num_sockets=1, topology=(NUMANode(0, tuple(Core(i, 0, (i,)) for i in range(4))),))
)
STATIC = CPUManagerConfig("static", MACHINE, CPUSet([0]), StaticPolicyOptions())


class Plugin:
    options = ev.PluginOptions()

    async def allocate(self, device_ids: list[str], timeout: float | None) -> pb.ContainerAllocateResponse:
        return pb.ContainerAllocateResponse(envs={"GPU": ",".join(device_ids)})

    async def preferred(self, available: list[str], must_include: list[str], size: int) -> list[str]:
        return available[:size]

    async def pre_start(self, device_ids: list[str]) -> None:
        return None


class Devices:
    socket = None

    def listed(self, resource: str) -> Plugin | None:
        return Plugin() if resource == GPU else None

    async def wait_listed(self, resource: str, timeout: float) -> Plugin | None:
        return self.listed(resource)


class Drivers:
    def kick(self) -> None:
        return None


def node() -> tuple[FakeRecorder, Admission[object]]:
    recorder = FakeRecorder(
        ev.PluginRegistered(resource=GPU, endpoint="gpu.sock", options=ev.PluginOptions()),
        ev.DevicesAdded(resource=GPU, devices=[ev.DeviceInfo(id="gpu-0", health="Healthy", numa_nodes=[0])]),
        *pool_events(STATIC, [], {}, "cpu manager started"),
        delay=0.01,  # the sync: others run meanwhile
    )
    config = AdmissionConfig(STATIC, parse_topology_manager("none", "container", {}, [0]), 30.0)
    return recorder, Admission(recorder, config, Devices(), Drivers())  # type: ignore[arg-type]


def guaranteed(uid: str, cpus: int, gpus: int = 0) -> PodSpec:
    limits = {"cpu": str(cpus), "memory": "1Gi"} | ({GPU: str(gpus)} if gpus else {})
    container = ev.ContainerSpec(name="app", requests=dict(limits), limits=limits)
    return PodSpec(pod=ev.PodRef(uid=uid, namespace="default", name=uid), containers=[container])


async def test_an_admission_that_calls_nothing_is_one_append_and_the_next_one_sees_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    recorder, admission = node()
    before = len(recorder.appends)
    outcome: dict[str, str] = {}

    async def admit(uid: str) -> None:
        try:
            await admission.admit(guaranteed(uid, cpus=2))
            outcome[uid] = "admitted"
        except AdmissionRefused as exc:
            outcome[uid] = str(exc)

    async with trio.open_nursery() as nursery:  # at once: the second decides from the first's append
        nursery.start_soon(admit, "a")
        nursery.start_soon(admit, "b")

    kinds = [[type(e).__name__ for e in append] for append in recorder.appends[before:]]
    admitted = [k for k in kinds if "PodAdmitted" in k]
    assert len(admitted) == 1, kinds
    assert admitted[0][0] == "PodAdmissionStarted" and admitted[0][-1] == "PodAdmitted"
    assert "CPUsAssigned" in admitted[0]
    # three CPUs are free of four (CPU 0 reserved): two pods of two cannot both have them
    assert list(outcome.values()).count("admitted") == 1, outcome
    assert sum(len(cpus) for pod in recorder.views.cpus.assignments.values() for cpus in pod.values()) == 2


async def test_an_admission_that_calls_a_plugin_records_its_intent_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    recorder, admission = node()
    before = len(recorder.appends)
    await admission.admit(guaranteed("a", cpus=1, gpus=1))
    kinds = [[type(e).__name__ for e in append] for append in recorder.appends[before:]]
    assert len(kinds) == 2, kinds
    assert kinds[0][0] == "PodAdmissionStarted" and "DevicesReserved" in kinds[0] and "PodAdmitted" not in kinds[0]
    assert kinds[1] == ["DevicesAllocated", "PodAdmitted"]
