"""The memory manager (policy Static) through the daemon, on a described 2-NUMA machine:
memory aligned with CPUs and devices, PodResources as the kubelet answers, and a start on a
machine whose memory changed (docs/adr/0044)."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import grpc
import pytest

from eventsrc.gen.podresources.v1 import api_pb2 as pr
from tests.conftest import run_cli
from tests.e2e.test_devices_e2e import Plugin
from tests.support.grpcio_stubs import pod_resources_client, unix_target

GI = 1024**3
MI = 1024**2


def machine(path: Path, memory: dict[str, dict[str, int]]) -> Path:
    """8 CPUs, 4 per NUMA node (CPUs 0-3 on node 0), and ``memory`` per node."""
    cpus = [{"id": i, "core": i, "socket": i // 4, "numa": i // 4, "uncore": i // 4} for i in range(8)]
    path.write_text(json.dumps({"cpus": cpus, "memory": memory}))
    return path


TWO_NODES = {"0": {"memory": 4 * GI}, "1": {"memory": 4 * GI}}


def serve_args(topology: Path, *more: str) -> tuple[str, ...]:
    return (
        *("--cpu-manager-policy", "static", "--reserved-cpu-count", "1"),
        *("--topology-manager-policy", "single-numa-node", "--topology-file", str(topology)),
        # the kubelet's check: --reserved-memory adds up to the memory kept back (here only
        # the default memory.available<100Mi threshold)
        *("--memory-manager-policy", "Static", "--reserved-memory", "0:memory=100Mi"),
        *more,
    )


def pod(tmp: Path, name: str, cpu: str, memory: str, devices: int = 0) -> Path:
    path = tmp / f"{name}.yaml"
    dev = f", example.com/dev: {devices}" if devices else ""
    path.write_text(
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, uid: uid-{name}}}\nspec:\n"
        f"  containers:\n  - name: main\n    resources:\n      limits: {{cpu: '{cpu}', memory: {memory}{dev}}}\n"
    )
    return path


def listed(root: Path) -> tuple[pr.ListPodResourcesResponse, pr.AllocatableResourcesResponse]:
    with grpc.insecure_channel(unix_target(root / "pod-resources" / "kubelet.sock")) as ch:
        client = pod_resources_client(ch)
        return client.List(pr.ListPodResourcesRequest()), client.GetAllocatableResources(
            pr.AllocatableResourcesRequest()
        )


def memory_of(answer: pr.ListPodResourcesResponse, name: str) -> list[tuple[str, int, list[int]]]:
    (p,) = [p for p in answer.pod_resources if p.name == name]
    return [(m.memory_type, m.size, [n.ID for n in m.topology.nodes]) for m in p.containers[0].memory]


def test_cpus_device_and_memory_on_one_numa_node(root: Path, tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    """Issue 38: a Guaranteed pod with 2 CPUs, a device and 1Gi gets all three on one NUMA
    node; under single-numa-node, a pod whose memory fits on no one node is refused with the
    kubelet's reason; PodResources lists the blocks and the allocatable memory per node as
    the kubelet's memory manager does."""
    topology = machine(tmp_path / "machine.json", TWO_NODES)
    daemon_factory(*serve_args(topology))
    plugin = Plugin(root, "--devices", "2", "--numa-nodes", "2")
    try:
        plugin.wait_registered()
        # Node 0 has 3 free CPUs (CPU 0 is reserved): take 2 of them so that "a" must go to node 1.
        first = run_cli("admit", "-f", str(pod(tmp_path, "first", "2", "1Gi")), root=root)
        assert first.returncode == 0, first.stderr
        got = run_cli("admit", "-f", str(pod(tmp_path, "a", "2", "1Gi", devices=1)), "-o", "json", root=root)
        assert got.returncode == 0, got.stderr
        c = json.loads(got.stdout)["containers"][0]
        cpu_nodes = {int(x) // 4 for x in c["cpu_ids"]}
        device_nodes = {int(d.split("-")[1]) for r in c["resources"] for d in r["device_ids"]}  # dev-i on node i
        answer, alloc = listed(root)
        assert memory_of(answer, "first") == [("memory", GI, [0])]
        assert cpu_nodes == device_nodes == {1}
        assert memory_of(answer, "a") == [("memory", GI, [1])]
        # GetAllocatableResources: per node, what --reserved-memory leaves (node 0 keeps 100Mi).
        assert sorted((m.memory_type, m.size, [n.ID for n in m.topology.nodes]) for m in alloc.memory) == [
            ("memory", 4 * GI - 100 * MI, [0]),
            ("memory", 4 * GI, [1]),
        ]
        # Node 1's CPUs all taken; node 0 keeps 1 CPU and 2972Mi free, node 1 3056Mi.
        b = run_cli("admit", "-f", str(pod(tmp_path, "b", "2", "16Mi")), root=root)
        assert b.returncode == 0, b.stderr
        # 1 CPU (node 0 only) and 3000Mi (node 1 only): no one node has both.
        misfit = run_cli("admit", "-f", str(pod(tmp_path, "misfit", "1", "3000Mi")), root=root)
        assert misfit.returncode == 1
        assert misfit.stderr.strip().endswith("Resources cannot be allocated with Topology locality"), misfit.stderr
        # 5Gi fits on no node, and nodes used alone make no group: the memory manager gives no
        # hint (the topology manager's "no preference"), then cannot widen node 0: its error.
        wide = run_cli("admit", "-f", str(pod(tmp_path, "wide", "1", "5Gi")), root=root)
        assert wide.returncode == 1
        assert wide.stderr.strip().endswith(
            "[memorymanager] failed to find NUMA nodes to extend the current topology hint"
        ), wide.stderr
        records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()]
        assert [
            (r["event"]["pod"]["name"], r["event"]["topology_hint"])
            for r in records
            if r["type"] == "AdmissionRejected"
        ] == [("misfit", "{<nil> false}"), ("wide", "")]
        # The memory records: one MemoryAssigned per container, what it took of its node.
        assigned = [r["event"] for r in records if r["type"] == "MemoryAssigned"]
        assert [(e["pod_uid"], e["taken"]) for e in assigned] == [
            ("uid-first", {"0": {"memory": GI}}),
            ("uid-a", {"1": {"memory": GI}}),
            ("uid-b", {"1": {"memory": 16 * MI}}),
        ]
        # Removed: the memory goes back, and the next pod can have node 0's memory again.
        assert run_cli("remove", "uid-first", root=root).returncode == 0
        records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()]
        released = [r["event"] for r in records if r["type"] == "MemoryReleased"]
        assert [(e["pod_uid"], e["returned"]) for e in released] == [("uid-first", {"0": {"memory": GI}})]
        # replay --step says what each memory record changed
        steps = run_cli("replay", "--step", root=root, check=True).stdout
        assert re.search(rf"MemoryAssigned +memory of default/a/main: - -> memory {GI} NUMA 1$", steps, re.M)
        released_line = rf"MemoryReleased +memory of default/first/main: memory {GI} NUMA 0 -> - \(pod removed\)$"
        assert re.search(released_line, steps, re.M)
        # Audit: the pod's history names its block; usage charges it in byte-hours, NUMA node 0.
        history = run_cli("audit", "pod", "uid-first", root=root, check=True).stdout
        assert "memory (1)" in history and f"memory {GI} bytes NUMA 0 assigned" in history
        usage = run_cli("audit", "usage", "--resource", "memory", "--by", "device", "-o", "json", root=root)
        assert usage.returncode == 0, usage.stderr
        rows = json.loads(usage.stdout)
        assert sorted(r["device"] for r in rows) == ["0", "1"]
        assert all(r["measure"] == "byte-seconds" and float(r["hours"]) > 0 for r in rows)
    finally:
        plugin.stop()


@pytest.mark.parametrize(
    ("shift", "new", "lost"),
    [
        ("a byte", {"0": {"memory": 4 * GI - 1}, "1": {"memory": 4 * GI + 1}}, []),
        ("a page", {"0": {"memory": 4 * GI + 4096}, "1": {"memory": 4 * GI - 4096}}, []),
        ("node 1's memory", {"0": {"memory": 4 * GI}, "1": {"memory": 0}}, ["uid-one"]),
    ],
)
def test_a_machine_whose_memory_moved_starts_and_says_what_no_longer_fits(  # type: ignore[no-untyped-def]
    root: Path, tmp_path: Path, daemon_factory, shift: str, new: dict[str, dict[str, int]], lost: list[str]
) -> None:
    """Issue 38: the kubelet refuses to start when the memory per NUMA node differs from its
    checkpoint (kubernetes#131253). eventsrc starts, records the change, keeps every
    assignment that still fits, names each that does not, and admits against the new machine."""
    topology = machine(tmp_path / "machine.json", TWO_NODES)
    args = serve_args(topology)
    d = daemon_factory(*args)
    for name, cpu in (("zero", "3"), ("one", "1")):  # node 0's 3 free CPUs, then node 1
        got = run_cli("admit", "-f", str(pod(tmp_path, name, cpu, "1Gi")), root=root)
        assert got.returncode == 0, got.stderr
    answer, _ = listed(root)
    assert memory_of(answer, "zero") == [("memory", GI, [0])] and memory_of(answer, "one") == [("memory", GI, [1])]
    d.stop(signal.SIGTERM)

    machine(topology, new)
    again = daemon_factory(*args)  # ready: it started
    records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()]
    (changed,) = [r["event"] for r in records if r["type"] == "MemoryMachineChanged" and r["event"]["old"]]
    assert changed["new"] == new and changed["old"] == TWO_NODES
    assert sorted(changed["unaccounted"]) == lost
    assert len(changed["no_longer_fit"]) == len(lost)
    for uid in lost:
        (line,) = [x for x in changed["no_longer_fit"] if uid in x]
        assert "no longer fits" in line
        assert uid in again.output()  # the warning names it
    # Every pod keeps its blocks; those that fit are counted, the others not.
    answer, alloc = listed(root)
    assert memory_of(answer, "zero") == [("memory", GI, [0])] and memory_of(answer, "one") == [("memory", GI, [1])]
    assert sorted((m.size, [n.ID for n in m.topology.nodes]) for m in alloc.memory) == sorted(
        (sizes["memory"] - (100 * MI if node == "0" else 0), [int(node)])
        for node, sizes in new.items()
        if sizes["memory"] - (100 * MI if node == "0" else 0) > 0
    )
    # New pods are admitted against the machine as it is (node 0 has about 2.9Gi left, the node 1.9Gi; half a
    # CPU is no exclusive CPU: the memory manager alone has a say).
    more = run_cli("admit", "-f", str(pod(tmp_path, "more", "500m", "1Gi")), "-o", "json", root=root)
    assert more.returncode == 0, more.stderr
    answer, _ = listed(root)
    assert memory_of(answer, "more") == [("memory", GI, [0])]
    # A restart on the same machine records nothing more.
    again.stop(signal.SIGTERM)
    daemon_factory(*args)
    records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()]
    assert len([r for r in records if r["type"] == "MemoryMachineChanged"]) == 2
