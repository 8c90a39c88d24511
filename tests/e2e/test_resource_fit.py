"""The kubelet's resource fit through the daemon: a pod whose requests do not fit what the
node has left is refused with the kubelet's reason and words (docs/adr/0043)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli

TWO_CPUS = {"cpus": [{"id": i, "core": i, "socket": 0, "numa": 0, "uncore": 0} for i in range(2)]}


def pod_yaml(tmp: Path, name: str, cpu: str, *, guaranteed: bool, memory: str = "64Mi") -> Path:
    kind = "limits" if guaranteed else "requests"
    path = tmp / f"{name}.yaml"
    path.write_text(
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, uid: uid-{name}}}\nspec:\n"
        f"  containers:\n  - name: main\n    resources:\n      {kind}: {{cpu: '{cpu}', memory: {memory}}}\n"
    )
    return path


def test_a_one_cpu_pod_beside_a_200m_pod_on_one_allocatable_cpu_is_out_of_cpu(  # type: ignore[no-untyped-def]
    root: Path, tmp_path: Path, daemon_factory
) -> None:
    """What a real kubelet did on a 2-CPU node with CPU 0 reserved (node allocatable cpu
    1000m): the Guaranteed 1-CPU pod beside a 200m pod was refused, OutOfcpu."""
    topology = tmp_path / "two.json"
    topology.write_text(json.dumps(TWO_CPUS))
    daemon_factory("--cpu-manager-policy", "static", "--reserved-cpus", "0", "--topology-file", str(topology))
    small = run_cli("admit", "-f", str(pod_yaml(tmp_path, "small", "200m", guaranteed=False)), root=root)
    assert small.returncode == 0, small.stderr
    big = run_cli("admit", "-f", str(pod_yaml(tmp_path, "big", "1", guaranteed=True)), root=root)
    assert big.returncode == 1
    words = "Node didn't have enough resource: cpu, requested: 1000, used: 200, capacity: 1000"
    assert big.stderr.strip().endswith(f"OutOfcpu: {words}"), big.stderr
    records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()]
    rejected = [r for r in records if r["type"] == "AdmissionRejected"]
    assert [(r["event"]["pod"]["uid"], r["event"]["kubelet_reason"], r["event"]["reason"]) for r in rejected] == [
        ("uid-big", "OutOfcpu", words)
    ]
    # Nothing of the refused pod is held: its CPU went to no one, and the small pod fits still.
    state = json.loads(run_cli("state", "-o", "json", root=root, check=True).stdout)
    assert state["cpus"]["assignments"] == {}
    assert list(state["pods"]["pods"]) == ["uid-small"]


def test_the_pod_count_and_memory_are_fitted_too(root: Path, tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    """--max-pods: the next pod is OutOfpods; a memory request over what is left (with
    --system-reserved taken off, on a described machine) is OutOfmemory."""
    topology = tmp_path / "two.json"
    topology.write_text(json.dumps(TWO_CPUS))
    daemon_factory("--max-pods", "1", "--topology-file", str(topology))
    first = run_cli("admit", "-f", str(pod_yaml(tmp_path, "one", "100m", guaranteed=False)), root=root)
    assert first.returncode == 0, first.stderr
    second = run_cli("admit", "-f", str(pod_yaml(tmp_path, "two", "100m", guaranteed=False)), root=root)
    assert second.returncode == 1
    assert second.stderr.strip().endswith(
        "OutOfpods: Node didn't have enough resource: pods, requested: 1, used: 1, capacity: 1"
    ), second.stderr
