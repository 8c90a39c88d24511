"""The stand-in kubelet (tests/support/kubelet.py) answers as the kubelet, and its files parse.

A grpcio client talks to it over its unix socket. The rate limit is tested with a held
clock (exact counts) and once at real speed (a burst far over the limit sees a rejection).
"""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from eventsrc.inputs import kubelet_checkpoints as ki
from testbed.servers import kubelet_checkpoints as kc
from tests.support.grpcio_stubs import pod_resources_client, unix_target
from tests.support.kubelet import (
    GET_DISABLED,
    QPS,
    RATE_LIMITED,
    Claim,
    ClaimDevice,
    Container,
    Device,
    Memory,
    StandInKubelet,
    pb,
    pod_not_found,
)

GPU0 = Device("example.com/gpu", "gpu-0", numa=(0,))
GPU1 = Device("example.com/gpu", "gpu-1", numa=(0, 1))
NIC = Device("example.com/nic", "nic-7")  # no topology
CLAIM = Claim(
    "gpu-claim",
    "team-a",
    (ClaimDevice("gpu.example.com", "node-a", "gpu-3", cdi=("example.com/gpu=gpu-3",), request_names=("gpu",)),),
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def kubelet(short_tmp: Path) -> Iterator[StandInKubelet]:
    with StandInKubelet(short_tmp / "kubelet") as k:
        yield k


def client(k: StandInKubelet) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(unix_target(k.socket))
    return channel, pod_resources_client(channel)


def populate(k: StandInKubelet) -> None:
    k.set_allocatable(
        devices=[GPU0, GPU1, NIC],
        cpus=range(8),
        memory=[Memory("memory", 8 << 30, (0,)), Memory("memory", 8 << 30, (1,))],
    )
    k.set_pod(
        "team-a",
        "trainer",
        [
            Container("setup", devices=[NIC], kind="init"),
            Container("main", devices=[GPU0, GPU1], cpus=[2, 3], memory=[Memory("memory", 1 << 30, (0,))]),
            Container("proxy", devices=[NIC], kind="sidecar", claims=[CLAIM]),
        ],
    )
    k.set_pod("team-a", "done", [Container("main", cpus=[4])], active=False)


def status_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    err: Any = info.value
    return err.code(), err.details()


def test_list_get_and_allocatable_answer_as_the_kubelet(kubelet: StandInKubelet) -> None:
    populate(kubelet)
    channel, stub = client(kubelet)
    with channel:
        listed = stub.List(pb.ListPodResourcesRequest())
        (pod,) = listed.pod_resources  # the terminated pod is not active: not listed
        assert (pod.name, pod.namespace) == ("trainer", "team-a")
        # the restartable init container first, the plain init container left out
        assert [c.name for c in pod.containers] == ["proxy", "main"]
        proxy, main = pod.containers
        # one entry per device and NUMA node; gpu-1 sits on two nodes
        assert [(d.resource_name, list(d.device_ids), [n.ID for n in d.topology.nodes]) for d in main.devices] == [
            ("example.com/gpu", ["gpu-0"], [0]),
            ("example.com/gpu", ["gpu-1"], [0]),
            ("example.com/gpu", ["gpu-1"], [1]),
        ]
        assert list(main.cpu_ids) == [2, 3]
        assert [(m.memory_type, m.size, [n.ID for n in m.topology.nodes]) for m in main.memory] == [
            ("memory", 1 << 30, [0])
        ]
        (nic,) = proxy.devices
        assert nic.device_ids == ["nic-7"] and not nic.HasField("topology")
        (dyn,) = proxy.dynamic_resources
        assert (dyn.claim_name, dyn.claim_namespace) == ("gpu-claim", "team-a")
        (res,) = dyn.claim_resources
        assert (res.driver_name, res.pool_name, res.device_name) == ("gpu.example.com", "node-a", "gpu-3")
        assert [c.name for c in res.cdi_devices] == ["example.com/gpu=gpu-3"] and not res.HasField("share_id")

        got = stub.Get(pb.GetPodResourcesRequest(pod_name="trainer", pod_namespace="team-a"))
        assert got.pod_resources == pod
        # Get asks the pod manager, which still knows a terminated pod
        done = stub.Get(pb.GetPodResourcesRequest(pod_name="done", pod_namespace="team-a")).pod_resources
        assert [list(c.cpu_ids) for c in done.containers] == [[4]]
        code, details = status_of(lambda: stub.Get(pb.GetPodResourcesRequest(pod_name="nope", pod_namespace="x")))
        assert (
            code == grpc.StatusCode.UNKNOWN
            and details == pod_not_found("x", "nope") == "pod nope in namespace x not found"
        )

        alloc = stub.GetAllocatableResources(pb.AllocatableResourcesRequest())
        assert sorted(d.device_ids[0] for d in alloc.devices) == ["gpu-0", "gpu-1", "gpu-1", "nic-7"]
        assert list(alloc.cpu_ids) == list(range(8))
        assert [(m.size, m.topology.nodes[0].ID) for m in alloc.memory] == [(8 << 30, 0), (8 << 30, 1)]

        kubelet.remove_pod("team-a", "trainer")
        assert not stub.List(pb.ListPodResourcesRequest()).pod_resources
    assert kubelet.calls == {"List": 2, "Get": 3, "GetAllocatableResources": 1} and not kubelet.rejected


def test_get_switched_off_or_absent(short_tmp: Path) -> None:
    req = pb.GetPodResourcesRequest(pod_name="trainer", pod_namespace="team-a")
    with StandInKubelet(short_tmp / "gate-off", get_enabled=False) as k:
        populate(k)
        channel, stub = client(k)
        with channel:
            assert status_of(lambda: stub.Get(req)) == (grpc.StatusCode.UNKNOWN, GET_DISABLED)
        assert k.calls["Get"] == 1
    with StandInKubelet(short_tmp / "v1.26", minor=26) as k:
        populate(k)
        channel, stub = client(k)
        with channel:
            code, details = status_of(lambda: stub.Get(req))
            assert code == grpc.StatusCode.UNIMPLEMENTED and "unknown method Get" in details
            (pod,) = stub.List(pb.ListPodResourcesRequest()).pod_resources
            assert not any(c.dynamic_resources for c in pod.containers)  # a 1.27 field
        assert k.calls["Get"] == 0  # an unknown method never reaches the limiter


def test_rate_limit_counts_exactly_with_a_held_clock(short_tmp: Path) -> None:
    clock = Clock()
    with StandInKubelet(short_tmp / "kubelet", clock=clock) as k:
        channel, stub = client(k)
        with channel:
            for _ in range(6):
                stub.List(pb.ListPodResourcesRequest())
            for _ in range(4):
                stub.GetAllocatableResources(pb.AllocatableResourcesRequest())
            # the burst of 10 is spent, over every method: the 11th call is refused
            assert status_of(lambda: stub.List(pb.ListPodResourcesRequest())) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                RATE_LIMITED,
            )
            code, _ = status_of(lambda: stub.Get(pb.GetPodResourcesRequest(pod_name="a", pod_namespace="b")))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED  # refused before the pod is looked up
            clock.now += 1 / QPS + 1e-9  # one token back at 100 a second
            stub.List(pb.ListPodResourcesRequest())
            assert status_of(lambda: stub.List(pb.ListPodResourcesRequest()))[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
            clock.now += 60  # never more than the burst saved up
            results = []
            for _ in range(12):
                try:
                    stub.List(pb.ListPodResourcesRequest())
                    results.append(True)
                except grpc.RpcError:
                    results.append(False)
            assert results == [True] * 10 + [False] * 2
    assert k.calls == {"List": 21, "GetAllocatableResources": 4, "Get": 1}
    assert k.rejected == {"List": 4, "Get": 1}


def test_a_burst_at_real_speed_meets_the_limit(kubelet: StandInKubelet) -> None:
    calls = 300  # at 100 a second with a burst of 10, passing them all would take 2.9 s
    channel, stub = client(kubelet)
    with channel:
        futures = [stub.List.future(pb.ListPodResourcesRequest()) for _ in range(calls)]
        codes = []
        for f in futures:
            try:
                f.result()
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())  # type: ignore[attr-defined]
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes
    assert kubelet.calls["List"] == calls and kubelet.rejected["List"] == codes.count(
        grpc.StatusCode.RESOURCE_EXHAUSTED
    )


def test_restarting_lists_nothing_then_everything_again(kubelet: StandInKubelet) -> None:
    populate(kubelet)
    with kubelet.restarting():  # the socket is made again, and its answers are a fresh kubelet's
        channel, stub = client(kubelet)
        with channel:
            assert list(stub.List(pb.ListPodResourcesRequest()).pod_resources) == []
            code, details = status_of(
                lambda: stub.Get(pb.GetPodResourcesRequest(pod_name="trainer", pod_namespace="team-a"))
            )
            assert code == grpc.StatusCode.UNKNOWN and details == pod_not_found("team-a", "trainer")
            alloc = stub.GetAllocatableResources(pb.AllocatableResourcesRequest())
            assert not alloc.devices and list(alloc.cpu_ids) == list(range(8))  # no plugin back yet
    channel, stub = client(kubelet)
    with channel:
        assert [p.name for p in stub.List(pb.ListPodResourcesRequest()).pod_resources] == ["trainer"]


def test_stop_removes_the_socket_and_start_serves_on_it_again(kubelet: StandInKubelet) -> None:
    assert stat.S_ISSOCK(kubelet.socket.stat().st_mode)
    kubelet.stop()
    assert not kubelet.socket.exists()
    channel, stub = client(kubelet)
    with channel:
        assert status_of(lambda: stub.List(pb.ListPodResourcesRequest()))[0] == grpc.StatusCode.UNAVAILABLE
    kubelet.start()
    assert stat.S_ISSOCK(kubelet.socket.stat().st_mode)
    channel, stub = client(kubelet)
    with channel:
        assert list(stub.List(pb.ListPodResourcesRequest()).pod_resources) == []


def test_its_checkpoint_files_parse_with_eventsrcs_parsers(kubelet: StandInKubelet) -> None:
    populate(kubelet)
    paths = kubelet.write_checkpoints()
    root = kubelet.root
    assert paths == [root / "device-plugins/kubelet_internal_checkpoint", root / "cpu_manager_state"] + [
        root / "memory_manager_state",
        root / "dra_manager_state",
    ]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in paths)
    assert not [p for p in root.rglob(".*") if p.is_file()]  # every temporary file was renamed
    trainer, done = kubelet.pods()

    device = ki.read_device_checkpoint(paths[0])
    assert device.registered_devices == {"example.com/gpu": ["gpu-0", "gpu-1"], "example.com/nic": ["nic-7"]}
    held = {(e.pod_uid, e.container_name, e.resource_name): e.device_ids for e in device.entries or []}
    assert held == {
        (trainer.uid, "setup", "example.com/nic"): {-1: ["nic-7"]},
        (trainer.uid, "main", "example.com/gpu"): {0: ["gpu-0", "gpu-1"], 1: ["gpu-1"]},
        (trainer.uid, "proxy", "example.com/nic"): {-1: ["nic-7"]},
    }

    cpu = ki.read_cpu_state(paths[1])
    assert cpu.verified and cpu.policy_name == "static" and cpu.default_cpu_set == "0-1,5-7"
    assert cpu.entries == {trainer.uid: {"main": "2-3"}, done.uid: {"main": "4"}}

    dra = ki.read_dra_state(paths[3])
    (claim,) = dra.entries
    assert (claim.claim_name, claim.namespace, claim.pod_uids) == ("gpu-claim", "team-a", [trainer.uid])
    assert claim.driver_state["gpu.example.com"][0].cdi_device_ids == ["example.com/gpu=gpu-3"]

    # eventsrc has no memory-manager parser: check the file against its own rendering
    memory = json.loads(paths[2].read_bytes())
    assert memory["machineState"]["0"]["memoryMap"]["memory"] == {
        "total": 8 << 30,
        "systemReserved": 0,
        "allocatable": 8 << 30,
        "reserved": 1 << 30,
        "free": 7 << 30,
    }
    assert memory["entries"] == {trainer.uid: {"main": [{"numaAffinity": [0], "type": "memory", "size": 1 << 30}]}}


def test_the_writers_give_the_facts_files_worked_examples_byte_for_byte() -> None:
    pod = "0f6e5d1c-0000-4000-8000-00000000a001"
    state = kc.MemoryState(
        "Static",
        {0: kc.NUMANodeState(1, {"memory": kc.MemoryTable(4096, 1024, 1024)}, [0])},
        {pod: {"app": [kc.MemoryBlock([0], "memory", 1024)]}},
    )
    assert kc.memory_state(state) == (
        b'{"policyName":"Static","machineState":{"0":{"numberOfAssignments":1,"memoryMap":{"memory":'
        b'{"total":4096,"systemReserved":1024,"allocatable":3072,"reserved":1024,"free":2048}},"cells":[0]}},'
        b'"entries":{"0f6e5d1c-0000-4000-8000-00000000a001":{"app":[{"numaAffinity":[0],"type":"memory",'
        b'"size":1024}]}},"checksum":3810358120}'
    )
    assert kc.cpu_state("none", "", {}) == b'{"policyName":"none","defaultCpuSet":"","checksum":1353318690}'
    assert kc.cpu_state("static", "0,3-7", {pod: {"app": "1-2"}}).endswith(b'"checksum":233944212}')
    claim = ki.DRAClaim(
        claim_uid="7c1d0a52-0000-4000-8000-00000000c001",
        claim_name="gpu-claim",
        namespace="default",
        pod_uids=[pod],
        driver_state={
            "gpu.example.com": [
                ki.DRADevice(
                    pool_name="node-a",
                    device_name="gpu-0",
                    request_names=["gpu"],
                    cdi_device_ids=["example.com/gpu=gpu-0"],
                )
            ]
        },
    )
    assert kc.dra_state([claim], share_ids=False).endswith(b'"Checksum":3066407621}')
    assert ki.parse_dra_state(kc.dra_state([claim])).entries == [claim]  # with ShareID: null
    assert (
        kc.device_checkpoint(None, {})
        == b'{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":'
        + str(
            ki.fnv32a(
                "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)<nil> "
                "RegisteredDevices:(map[string][]string)map[]}"
            )
        ).encode()
        + b"}"
    )


def test_files_caught_mid_update(kubelet: StandInKubelet) -> None:
    populate(kubelet)
    path = kubelet.write_cpu_state()
    good = path.read_bytes()
    kc.write_torn(path, good)
    assert 0 < len(path.read_bytes()) < len(good)
    with pytest.raises(ki.CheckpointError, match="not valid JSON"):
        ki.read_cpu_state(path)
    kc.write_garbage(path)
    with pytest.raises(ki.CheckpointError, match="not valid JSON"):
        ki.read_cpu_state(path)
    path.write_bytes(good.replace(b'"2-3"', b'"2-4"'))  # whole, but not what its checksum says
    with pytest.raises(ki.ChecksumMismatchError):
        ki.read_cpu_state(path)
    kubelet.write_cpu_state()
    tmp = kc.leave_temp(path, kc.cpu_state("none", "", {}))
    assert tmp.parent == path.parent and tmp.name.startswith(".cpu_manager_state")
    assert ki.read_cpu_state(path).entries  # the file itself keeps its last whole content
