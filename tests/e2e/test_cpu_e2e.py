"""The CPU manager in the daemon, on a simulated 256-CPU machine (2 sockets, 4 NUMA nodes,
64 cores per socket, 2 threads per core)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import grpc

from eventsrc.core.cpu.assignment import StaticPolicyOptions, take_by_topology
from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.core.cpu.topology import decode_topology_file
from eventsrc.gen.podresources.v1 import api_pb2 as pr
from tests.conftest import REPO, run_cli
from tests.support.grpcio_stubs import pod_resources_client, unix_target

TOPOLOGY = REPO / "examples" / "topology-256.json"
STATIC = ("--cpu-manager-policy", "static", "--reserved-cpu-count", "4", "--topology-file", str(TOPOLOGY))


def pod_yaml(tmp: Path, name: str, cpu: str, memory: str = "1Gi") -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, uid: uid-{name}}}\nspec:\n"
        f"  containers:\n  - name: main\n    resources:\n      limits: {{cpu: '{cpu}', memory: {memory}}}\n"
    )
    return path


def admit(root: Path, path: Path) -> dict:  # type: ignore[type-arg]
    proc = run_cli("admit", "-f", str(path), "-o", "json", root=root)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def cpus_of(info: dict) -> CPUSet:  # type: ignore[type-arg]
    return CPUSet(int(c) for c in info["containers"][0].get("cpu_ids", []))


def state(root: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(run_cli("state", "-o", "json", root=root, check=True).stdout)  # type: ignore[no-any-return]


def test_guaranteed_pods_get_the_kubelets_cpus_and_keep_them(root: Path, tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    topology = decode_topology_file(TOPOLOGY.read_bytes())
    everything = topology.cpu_details.cpus()
    d = daemon_factory(*STATIC)
    reserved = take_by_topology(topology, everything, 4, StaticPolicyOptions())
    assert str(reserved) == "0-1,128-129"  # the lowest cores first, both threads
    free = everything - reserved
    expected: dict[str, CPUSet] = {}
    for name, n in [("a", 4), ("b", 16), ("c", 1), ("d", 64)]:
        want = take_by_topology(topology, free, n, StaticPolicyOptions())
        info = admit(root, pod_yaml(tmp_path, name, str(n)))
        got = cpus_of(info)
        assert info["containers"][0]["exclusive_cpus"] is True
        assert got == want, f"pod {name}: got {got}, the kubelet would give {want}"
        expected[f"uid-{name}"] = got
        free = free - got
    # Burstable pods run on the shared pool: every CPU but the exclusive ones.
    shared_info = admit(root, pod_yaml(tmp_path, "burst", "500m"))
    assert shared_info["containers"][0]["exclusive_cpus"] is False
    shared = everything - CPUSet(c for s in expected.values() for c in s)
    assert cpus_of(shared_info) == shared
    # PodResources reports the exclusive CPUs per container and the allocatable ones.
    with grpc.insecure_channel(unix_target(root / "pod-resources" / "kubelet.sock")) as ch:
        client = pod_resources_client(ch)
        listed = client.List(pr.ListPodResourcesRequest())
        by_name = {p.name: CPUSet(p.containers[0].cpu_ids) for p in listed.pod_resources}
        alloc = client.GetAllocatableResources(pr.AllocatableResourcesRequest())
    assert {f"uid-{k}": v for k, v in by_name.items() if f"uid-{k}" in expected} == expected
    assert by_name["burst"] == CPUSet()
    assert CPUSet(alloc.cpu_ids) == everything - reserved
    # SIGKILL and restart: the same CPUs.
    d.stop(signal.SIGKILL)
    daemon_factory(*STATIC)
    s = state(root)
    assert {uid: CPUSet(c["main"]) for uid, c in s["cpus"]["assignments"].items()} == expected
    assert CPUSet(s["cpus"]["shared"]) == shared
    # Removing a pod gives its CPUs back to the shared pool (an event says so).
    run_cli("remove", "default/b", root=root, check=True)
    s = state(root)
    assert CPUSet(s["cpus"]["shared"]) == shared | expected["uid-b"]
    last = [json.loads(line) for line in run_cli("log", "-o", "json", root=root).stdout.splitlines()][-3:]
    assert [r["type"] for r in last] == ["CPUsReleased", "PodRemoved", "SharedPoolChanged"]


def test_refusals_use_the_kubelets_messages(root: Path, tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    daemon_factory(*STATIC, "--cpu-manager-policy-options", "full-pcpus-only=true")
    proc = run_cli("admit", "-f", str(pod_yaml(tmp_path, "odd", "3")), root=root)
    assert proc.returncode == 1
    assert "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2" in proc.stderr
    proc = run_cli("admit", "-f", str(pod_yaml(tmp_path, "huge", "300")), root=root)
    assert proc.returncode == 1 and "SMT Alignment Error: not enough free physical CPUs" in proc.stderr


def test_switching_policies_across_restarts_never_refuses_to_start(root: Path, tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d = daemon_factory(*STATIC)
    held = cpus_of(admit(root, pod_yaml(tmp_path, "g", "8")))
    d.stop()
    # static -> none: the exclusive assignment is released, and the log says why.
    d = daemon_factory("--topology-file", str(TOPOLOGY))
    s = state(root)
    assert s["cpus"]["assignments"] == {} and len(s["cpus"]["shared"]) == 256
    records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root).stdout.splitlines()]
    changed = [r for r in records if r["type"] == "PolicyConfigurationChanged"][-1]
    assert changed["event"]["old"]["policy"] == "static" and changed["event"]["new"]["policy"] == "none"
    released = [r for r in records if r["type"] == "CPUsReleased"][-1]["event"]
    assert CPUSet(released["cpus"]) == held and released["reason"] == "the CPU manager policy is none"
    d.stop()
    # none -> static with other reserved CPUs that collide with nothing: starts; pods get CPUs again.
    d = daemon_factory(
        "--cpu-manager-policy", "static", "--reserved-cpus", "0-3,128-131", "--topology-file", str(TOPOLOGY)
    )
    assert cpus_of(admit(root, pod_yaml(tmp_path, "g2", "2"))) & CPUSet.parse("0-3,128-131") == CPUSet()
    d.stop()
    # static again, now reserving CPUs a running pod holds: it starts, reports the clash,
    # and the pod keeps its CPUs until it ends.
    g2 = CPUSet(state(root)["cpus"]["assignments"]["uid-g2"]["main"])
    daemon_factory("--cpu-manager-policy", "static", "--reserved-cpus", str(g2), "--topology-file", str(TOPOLOGY))
    records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root).stdout.splitlines()]
    changed = [r for r in records if r["type"] == "PolicyConfigurationChanged"][-1]["event"]
    assert any("uid-g2/main holds reserved CPUs" in c for c in changed["new"]["kept_until_they_end"])
    assert CPUSet(state(root)["cpus"]["assignments"]["uid-g2"]["main"]) == g2


def _numa_of_cpus(cpus: CPUSet) -> set[int]:
    topology = decode_topology_file(TOPOLOGY.read_bytes())
    return {topology.cpu_details[c].numa_node_id for c in cpus}


def test_topology_manager_aligns_cpus_and_devices(root: Path, tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    from tests.e2e.test_devices_e2e import Plugin

    daemon_factory(*STATIC, "--topology-manager-policy", "single-numa-node")
    plugin = Plugin(root, "--devices", "8", "--numa-nodes", "4")
    try:
        plugin.wait_registered()
        # Fill NUMA node 0 partly so that alignment has to choose.
        for name, cpu, devices in [("x", "4", 2), ("y", "8", 1), ("z", "2", 2)]:
            path = tmp_path / f"{name}.yaml"
            path.write_text(
                f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, uid: uid-{name}}}\n"
                "spec:\n  containers:\n  - name: main\n"
                f"    resources:\n      limits: {{cpu: '{cpu}', memory: 1Gi, example.com/dev: {devices}}}\n"
            )
            info = admit(root, path)
            c = info["containers"][0]
            cpu_nodes = _numa_of_cpus(CPUSet(int(x) for x in c["cpu_ids"]))
            device_nodes = {int(d.split("-")[1]) * 4 // 8 for r in c["resources"] for d in r["device_ids"]}
            assert len(cpu_nodes) == 1 and device_nodes == cpu_nodes, (name, cpu_nodes, device_nodes)
        # 80 CPUs fit on no single NUMA node (64 CPUs each): refused, and the event says why.
        path = tmp_path / "wide.yaml"
        path.write_text(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: wide, uid: uid-wide}\nspec:\n  containers:\n  - name: main\n"
            "    resources:\n      limits: {cpu: '80', memory: 1Gi}\n"
        )
        proc = run_cli("admit", "-f", str(path), root=root)
        assert proc.returncode == 1 and "Resources cannot be allocated with Topology locality" in proc.stderr
        rejected = [json.loads(line) for line in run_cli("log", "-o", "json", root=root).stdout.splitlines()][-1]
        assert rejected["type"] == "AdmissionRejected" and rejected["event"]["topology_hint"] == "{<nil> false}"
        assert rejected["event"]["container"] == "main"
    finally:
        plugin.stop()
