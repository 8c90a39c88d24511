"""The kubelet's own Static memory policy tables (policy_static_test.go), run against
eventsrc.core.memory. The cases are data (tests/unit/data/memorymanager_static.json, its
``_format`` says how they are written); this module only reads them and compares as the
kubelet's test does: blocks as multisets, machine states with ``areMachineStatesEqual``."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from eventsrc.core.memory.machine import MemoryConfigError, decode_memory_machine
from eventsrc.core.memory.static_policy import (
    POLICY_STATIC,
    Block,
    MachineState,
    MemoryPolicyError,
    MemoryProvider,
    MemoryTable,
    NUMANodeState,
    StaticPolicy,
    initial_machine_state,
    pod_requested_resources,
    reconcile,
    remove_container,
)
from eventsrc.core.resources import parse_quantity
from eventsrc.core.topology_manager import TopologyHint, mask_of
from eventsrc.events import ContainerSpec

TABLES: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "memorymanager_static.json").read_text())


def cases(table: str) -> Any:
    return pytest.mark.parametrize("case", TABLES[table], ids=[c["description"] for c in TABLES[table]])


# --------------------------------------------------------------------------- reading the data


def size(v: int | str) -> int:
    if isinstance(v, int):
        return v
    q = parse_quantity(v)
    assert q.denominator == 1
    return int(q)


def machine_state(d: Mapping[str, Any] | None) -> dict[int, NUMANodeState]:
    out: dict[int, NUMANodeState] = {}
    for node, s in (d or {}).items():
        tables = {
            # [Allocatable, Free, Reserved, SystemReserved, TotalMemSize], the Go test's order
            r: MemoryTable(size(v[4]), size(v[3]), size(v[0]), size(v[2]), size(v[1]))
            for r, v in s.items()
            if r not in ("n", "cells")
        }
        out[int(node)] = NUMANodeState(s.get("n", 0), tables, tuple(s["cells"]))
    return out


def assignments(d: Mapping[str, Any] | None) -> dict[str, dict[str, tuple[Block, ...]]]:
    return {
        pod: {name: tuple(Block(tuple(b[0]), b[1], size(b[2])) for b in blocks) for name, blocks in cs.items()}
        for pod, cs in (d or {}).items()
    }


def reserved(d: Mapping[str, Any] | None) -> dict[int, dict[str, int]]:
    return {int(n): {r: size(v) for r, v in rs.items()} for n, rs in (d or {}).items()}


def pod(d: Mapping[str, Any]) -> tuple[str, list[ContainerSpec]]:
    containers = []
    for c in d["containers"]:
        if "resources" in c:
            req = TABLES["requirements"][c["resources"]]
            requests, limits = req["requests"], req["limits"]
        elif "both" in c:
            requests = limits = c["both"]
        else:
            requests, limits = c.get("requests", {}), c.get("limits", {})
        containers.append(ContainerSpec(name=c["name"], kind=c.get("kind", "app"), requests=requests, limits=limits))
    return d["uid"], containers


def hint(d: Mapping[str, Any]) -> TopologyHint:
    return TopologyHint(None if d["affinity"] is None else mask_of(d["affinity"]), d["preferred"])


def hints(d: Mapping[str, Any] | None) -> dict[str, list[TopologyHint]] | None:
    if d is None:
        return None
    return {r: [TopologyHint(mask_of(h[0]), h[1]) for h in hs] for r, hs in d.items()}


# --------------------------------------------------------------------------- the kubelet test's comparisons


def kubelet_states_equal(ms1: MachineState, ms2: MachineState) -> bool:
    """``areMachineStatesEqual``: same nodes, assignment counts, groups (as sets) and tables;
    free and reserved compared as sums over the node's group."""
    if len(ms1) != len(ms2):
        return False
    for node, s1 in ms1.items():
        s2 = ms2.get(node)
        if s2 is None or s1.number_of_assignments != s2.number_of_assignments:
            return False
        if sorted(s1.cells) != sorted(s2.cells) or s1.memory_map.keys() != s2.memory_map.keys():
            return False
        for r, t1 in s1.memory_map.items():
            t2 = s2.memory_map[r]
            if (t1.total, t1.system_reserved, t1.allocatable) != (t2.total, t2.system_reserved, t2.allocatable):
                return False
            for f in ("free", "reserved"):
                sum1 = sum(getattr(ms1[n].memory_map[r], f) for n in s1.cells)
                sum2 = sum(getattr(ms2[n].memory_map[r], f) for n in s1.cells)
                if sum1 != sum2:
                    return False
    return True


def assignments_equal(a1: Mapping[str, Mapping[str, Any]], a2: Mapping[str, Mapping[str, Any]]) -> bool:
    """``areContainerMemoryAssignmentsEqual``: blocks as multisets."""
    if len(a1) != len(a2):
        return False
    for p, cs in a1.items():
        if p not in a2 or len(cs) != len(a2[p]):
            return False
        for name, blocks in cs.items():
            if name not in a2[p] or Counter(blocks) != Counter(a2[p][name]):
                return False
    return True


# --------------------------------------------------------------------------- the tables


@cases("TestStaticPolicyNew")
def test_static_policy_new(case: dict[str, Any]) -> None:
    sr = reserved(case.get("systemReserved"))
    empty = decode_memory_machine({})
    if case.get("expectedError"):
        with pytest.raises(MemoryConfigError) as err:
            initial_machine_state(empty, sr)
        assert str(err.value) == case["expectedError"]
    else:
        assert initial_machine_state(empty, sr) == {}


@cases("TestStaticPolicyName")
def test_static_policy_name(case: dict[str, Any]) -> None:
    assert case["expectedName"] == POLICY_STATIC
    assert MemoryProvider(POLICY_STATIC, {}, {}, "pod", []).policy == case["expectedName"]


@cases("TestStaticPolicyStart")
def test_static_policy_start(case: dict[str, Any]) -> None:
    machine = decode_memory_machine(case.get("machine", {}), "machineInfo")
    given = assignments(case.get("assignments"))
    drift = reconcile(machine, reserved(case.get("systemReserved")), given)
    own = case.get("eventsrc")
    if own is not None:  # drift the kubelet refuses to start on: eventsrc reports it
        assert {f"{p}/{c}": why for (p, c), why in drift.dropped.items()} == own["dropped"]
        assert kubelet_states_equal(drift.state, machine_state(own["state"]))
        assert not any(drift.assignments.get(p, {}).get(c) for p, c in drift.dropped)
    elif case.get("expectedError"):
        # the checkpoint's machine state is not the one its assignments give on this machine
        assert case["differs"]
        assert not drift.dropped
        assert assignments_equal(drift.assignments, given)
        assert not kubelet_states_equal(drift.state, machine_state(case["machineState"]))
    else:
        assert not drift.dropped
        assert assignments_equal(drift.assignments, assignments(case.get("expectedAssignments")))
        assert kubelet_states_equal(drift.state, machine_state(case["expectedMachineState"]))


def _run_allocations(case: dict[str, Any], which: str) -> None:
    uid, containers = pod(case["pod"])
    state = machine_state(case.get("machineState"))
    state_before = machine_state(case.get("machineState"))
    given = assignments(case.get("assignments"))
    policy = StaticPolicy()
    for other_uid, masks in case.get("initContainersReusableMemory", {}).items():
        policy.reusable[other_uid] = {int(m): dict(t) for m, t in masks.items()}
    current_state: MachineState = state
    current = given
    targets = [c for c in containers if c.kind != "app"] + [c for c in containers if c.kind == "app"]
    if which == "first app":
        targets = [c for c in containers if c.kind == "app"][:1]
    for c in targets:
        if case.get("expectedError"):
            with pytest.raises(MemoryPolicyError) as err:
                policy.allocate(current_state, current, uid, containers, c, hint(case["topologyHint"]))
            assert str(err.value) == case["expectedError"]
            assert state == state_before and given == assignments(case.get("assignments"))  # inputs untouched
            return
        done = policy.allocate(current_state, current, uid, containers, c, hint(case["topologyHint"]))
        current_state, current = done.state, done.assignments
    assert state == state_before and given == assignments(case.get("assignments"))
    assert assignments_equal(current, assignments(case["expectedAssignments"]))
    assert kubelet_states_equal(current_state, machine_state(case["expectedMachineState"]))


@cases("TestStaticPolicyAllocate")
def test_static_policy_allocate(case: dict[str, Any]) -> None:
    _run_allocations(case, "first app")


@cases("TestStaticPolicyAllocateWithInitContainers")
def test_static_policy_allocate_with_init_containers(case: dict[str, Any]) -> None:
    _run_allocations(case, "all")


@cases("TestStaticPolicyAllocateWithRestartableInitContainers")
def test_static_policy_allocate_with_restartable_init_containers(case: dict[str, Any]) -> None:
    _run_allocations(case, "all")


@cases("TestStaticPolicyRemoveContainer")
def test_static_policy_remove_container(case: dict[str, Any]) -> None:
    state = machine_state(case.get("machineState"))
    given = assignments(case.get("assignments"))
    done = remove_container(state, given, "pod1", "container1")
    assert state == machine_state(case.get("machineState")) and given == assignments(case.get("assignments"))
    assert assignments_equal(done.assignments, assignments(case["expectedAssignments"]))
    assert kubelet_states_equal(done.state, machine_state(case["expectedMachineState"]))
    assert Counter(done.blocks) == Counter(given.get("pod1", {}).get("container1", ()))


@cases("TestStaticPolicyGetTopologyHints")
def test_static_policy_get_topology_hints(case: dict[str, Any]) -> None:
    uid, containers = pod(case["pod"])
    app = [c for c in containers if c.kind == "app"][0]
    got = StaticPolicy().topology_hints(
        machine_state(case.get("machineState")), assignments(case.get("assignments")), uid, containers, app
    )
    assert got == hints(case["expectedTopologyHints"])


@cases("Test_getPodRequestedResources")
def test_get_pod_requested_resources(case: dict[str, Any]) -> None:
    _, containers = pod(case["pod"])
    assert pod_requested_resources(containers) == {r: size(v) for r, v in case["expected"].items()}
