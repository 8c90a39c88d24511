"""The kubelet's own device manager table tests, run against the pure planner.

Transcribed from kubernetes/kubernetes pkg/kubelet/cm/devicemanager (manager_test.go and
topology_hints_test.go). The tables are data, at the top; the tests below only drive them.

Devices are written ``id: nodes``: a list of NUMA node ids, or None for a device without
topology. On the wire (and in ``DeviceView``) the kubelet's ``Topology == nil`` and
``Topology{Nodes: []}`` are the same thing, an empty ``numa_nodes``.

Where the kubelet test calls ``devicesToAllocate`` directly with a hand-made
``allocatedDevices`` / reusable set, so do these tests (``_devices_to_allocate`` with a
``ResourceState``); the same tables are then also driven through ``plan_pod``, the reuse
pool coming from an earlier non-restartable init container as it does in a real pod.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator, Mapping
from typing import Any

import pytest

from eventsrc.core.devices.choice import (
    Hint,
    PodPlan,
    PreferredAsk,
    PreferredFailed,
    Refusal,
    ResourceState,
    Step,
    _devices_to_allocate,
    container_hints,
    filter_by_affinity,
    plan_pod,
)
from eventsrc.events import ContainerSpec
from eventsrc.state.views import DeviceView


def devs(prefix: str, ids: range, node: int | None) -> dict[str, list[int] | None]:
    return {f"{prefix}{i}": None if node is None else [node] for i in ids}


# ===================================================================== TestGetTopologyHints
# Container scope, numaNodes [0, 1], every device healthy. ``in_use``: held by another
# container; ``held``: held by the container under test ("fakeContainer"). Expected hints
# are (nodes, preferred), ordered preferred first, then narrower, then lower mask;
# None is the kubelet's nil ("no preference").

TD, TD1, TD2 = "testdevice", "testdevice1", "testdevice2"
ALTERNATING_FOUR = {"Dev1": [0], "Dev2": [1], "Dev3": [0], "Dev4": [1]}
PAIRED_FOUR = {"Dev1": [0], "Dev2": [0], "Dev3": [1], "Dev4": [1]}

CONTAINER_HINTS: list[dict[str, Any]] = [
    {
        "id": "C1 single request, no device has alignment",
        # Dev3 is the kubelet's Topology{Nodes: []}, Dev4 its Topology{Nodes: nil}.
        "resources": {
            TD: {"request": 1, "devices": {"Dev1": None, "Dev2": None, "Dev3": [], "Dev4": None}, "expected": None}
        },
    },
    {
        "id": "C2 single request, only one device with alignment",
        "resources": {
            TD: {"request": 1, "devices": {"Dev1": None, "Dev2": [1]}, "expected": [((1,), True), ((0, 1), False)]}
        },
    },
    {
        "id": "C3 single request, one device per socket",
        "resources": {
            TD: {
                "request": 1,
                "devices": {"Dev1": [0], "Dev2": [1]},
                "expected": [((0,), True), ((1,), True), ((0, 1), False)],
            }
        },
    },
    {
        "id": "C4 request for 2, one device per socket",
        "resources": {TD: {"request": 2, "devices": {"Dev1": [0], "Dev2": [1]}, "expected": [((0, 1), True)]}},
    },
    {
        "id": "C5 request for 2, 2 devices per socket",
        "resources": {
            TD: {"request": 2, "devices": ALTERNATING_FOUR, "expected": [((0,), True), ((1,), True), ((0, 1), False)]}
        },
    },
    {
        "id": "C6 request for 2, optimal on 1 NUMA node, forced cross-NUMA",
        # fakePod/fakeOtherContainer holds Dev1 and Dev2.
        "resources": {
            TD: {"request": 2, "devices": ALTERNATING_FOUR, "in_use": ["Dev1", "Dev2"], "expected": [((0, 1), False)]}
        },
    },
    {
        "id": "C7 2 device types, mixed configuration",
        "resources": {
            TD1: {"request": 2, "devices": ALTERNATING_FOUR, "expected": [((0,), True), ((1,), True), ((0, 1), False)]},
            TD2: {"request": 1, "devices": {"Dev1": [0]}, "expected": [((0,), True), ((0, 1), False)]},
        },
    },
    {
        "id": "C8 single device type, more requested than available",
        "resources": {TD: {"request": 6, "devices": PAIRED_FOUR, "expected": []}},
    },
    {
        "id": "C9 single device type, all already allocated to container",
        "resources": {
            TD: {
                "request": 2,
                "devices": {"Dev1": [0], "Dev2": [0]},
                "held": ["Dev1", "Dev2"],
                "expected": [((0,), True), ((0, 1), False)],
            }
        },
    },
    {
        "id": "C10 single device type, less already allocated to container than requested",
        "resources": {TD: {"request": 4, "devices": PAIRED_FOUR, "held": ["Dev1", "Dev2"], "expected": []}},
    },
    {
        "id": "C11 single device type, more already allocated to container than requested",
        "resources": {
            TD: {"request": 2, "devices": PAIRED_FOUR, "held": ["Dev1", "Dev2", "Dev3", "Dev4"], "expected": []}
        },
    },
    # ---- eventsrc additions: the reuse pool (generateDeviceTopologyHints' reusable loop).
    {
        "id": "X1 reusable device without topology is skipped, not counted (Topology == nil)",
        "resources": {
            TD: {
                "request": 1,
                "devices": {"Dev1": [0], "Dev2": [1], "Dev3": None},
                "in_use": ["Dev3"],
                "reusable": ["Dev3"],
                "expected": [((0,), True), ((1,), True), ((0, 1), False)],
            }
        },
    },
    {
        "id": "X2 a mask must contain every reusable device with topology",
        "resources": {
            TD: {
                "request": 2,
                "devices": {"R1": [0], "Dev2": [1], "Dev3": [0]},
                "in_use": ["R1", "Dev3"],
                "reusable": ["R1"],
                "expected": [((0, 1), False)],
            }
        },
    },
]


# ======================================================= TestGetPreferredAllocationParameters
# Resource "resource", all devices healthy, topology hint {0}. ``allocated``: in use;
# ``reusable``: the reuse pool. The plugin offers GetPreferredAllocation and answers nil.
# Cases 1-3 take the kubelet's path A (more aligned devices free than needed), 4-5 path B
# (every aligned device is taken first, so they are in must_include).

GPA_RESOURCE = "resource"
GPA_PARAMETERS: list[dict[str, Any]] = [
    {
        "id": "1 request for 1, socket 0, 0 allocated, 0 reusable",
        "request": 1,
        "devices": devs("Dev", range(4), 0),
        "allocated": [],
        "reusable": [],
        "available": ["Dev0", "Dev1", "Dev2", "Dev3"],
        "must_include": [],
        "size": 1,
    },
    {
        "id": "2 request for 4, socket 0, 2 allocated, 2 reusable",
        "request": 4,
        "devices": devs("Dev", range(8), 0),
        "allocated": ["Dev0", "Dev5"],
        "reusable": ["Dev0", "Dev5"],
        "available": ["Dev0", "Dev1", "Dev2", "Dev3", "Dev4", "Dev5", "Dev6", "Dev7"],
        "must_include": ["Dev0", "Dev5"],
        "size": 4,
    },
    {
        "id": "3 request for 4, socket 0, 4 allocated, 2 reusable",
        "request": 4,
        "devices": devs("Dev", range(8), 0),
        "allocated": ["Dev0", "Dev5", "Dev4", "Dev1"],
        "reusable": ["Dev0", "Dev5"],
        "available": ["Dev0", "Dev2", "Dev3", "Dev5", "Dev6", "Dev7"],
        "must_include": ["Dev0", "Dev5"],
        "size": 4,
    },
    {
        "id": "4 request for 6, multisocket, 2 allocated, 2 reusable",
        "request": 6,
        "devices": {**devs("Dev", range(4), 0), **devs("Dev", range(4, 8), 1)},
        "allocated": ["Dev1", "Dev6"],
        "reusable": ["Dev1", "Dev6"],
        "available": ["Dev0", "Dev1", "Dev2", "Dev3", "Dev4", "Dev5", "Dev6", "Dev7"],
        "must_include": ["Dev0", "Dev1", "Dev2", "Dev3", "Dev6"],
        "size": 6,
    },
    {
        "id": "5 request for 6, multisocket, 4 allocated, 2 reusable",
        "request": 6,
        "devices": {**devs("Dev", range(4), 0), **devs("Dev", range(4, 8), 1)},
        "allocated": ["Dev0", "Dev1", "Dev6", "Dev7"],
        "reusable": ["Dev1", "Dev6"],
        "available": ["Dev1", "Dev2", "Dev3", "Dev4", "Dev5", "Dev6"],
        "must_include": ["Dev1", "Dev2", "Dev3", "Dev6"],
        "size": 6,
    },
]


# ============================================================ TestTopologyAlignedAllocation
# Nothing allocated, nothing reused. ``gpa``: what GetPreferredAllocation answers (None:
# the plugin does not offer it). ``preferred``: devices the choice must contain.
# ``alignment``: NUMA node of each chosen device's first node -> count ({} without topology).

GPU = "resource"
SIX = {"Dev1": [0], "Dev2": [1], "Dev3": [0], "Dev4": [1], "Dev5": [0], "Dev6": [1]}
EIGHT_ON_FOUR = {"Dev1": [0], "Dev2": [1], "Dev3": [2], "Dev4": [3], "Dev5": [0], "Dev6": [1], "Dev7": [2], "Dev8": [3]}
TWO_HUNDRED = {**devs("Dev", range(100), 0), **devs("Dev", range(100, 200), 1)}
THREE_AND_97 = {**devs("Dev", range(3), 0), **devs("Dev", range(3, 100), 1)}

TOPOLOGY_ALIGNED: list[dict[str, Any]] = [
    {
        "id": "1 single request, no alignment",
        "request": 1,
        "devices": {"Dev1": None, "Dev2": None},
        "hint": (0, 1),
        "gpa": None,
        "preferred": [],
        "alignment": {},
    },
    {
        "id": "2 single request, partial alignment",
        "request": 1,
        "devices": {"Dev1": None, "Dev2": [1]},
        "hint": (1,),
        "gpa": None,
        "preferred": [],
        "alignment": {1: 1},
    },
    {
        "id": "3 single request, socket 0",
        "request": 1,
        "devices": {"Dev1": [0], "Dev2": [1]},
        "hint": (0,),
        "gpa": None,
        "preferred": [],
        "alignment": {0: 1},
    },
    {
        "id": "4 single request, socket 1",
        "request": 1,
        "devices": {"Dev1": [0], "Dev2": [1]},
        "hint": (1,),
        "gpa": None,
        "preferred": [],
        "alignment": {1: 1},
    },
    {
        "id": "5 request for 2, socket 0",
        "request": 2,
        "devices": ALTERNATING_FOUR,
        "hint": (0,),
        "gpa": None,
        "preferred": [],
        "alignment": {0: 2},
    },
    {
        "id": "6 request for 2, socket 1",
        "request": 2,
        "devices": ALTERNATING_FOUR,
        "hint": (1,),
        "gpa": None,
        "preferred": [],
        "alignment": {1: 2},
    },
    {
        "id": "7 request for 4, unsatisfiable, prefer socket 0",
        "request": 4,
        "devices": SIX,
        "hint": (0,),
        "gpa": None,
        "preferred": [],
        "alignment": {0: 3, 1: 1},
    },
    {
        "id": "8 request for 4, unsatisfiable, prefer socket 1",
        "request": 4,
        "devices": SIX,
        "hint": (1,),
        "gpa": None,
        "preferred": [],
        "alignment": {0: 1, 1: 3},
    },
    {
        "id": "9 request for 4, multisocket",
        "request": 4,
        "devices": EIGHT_ON_FOUR,
        "hint": (1, 3),
        "gpa": None,
        "preferred": [],
        "alignment": {1: 2, 3: 2},
    },
    {
        "id": "10 request for 5, socket 0, preferred aligned accepted",
        "request": 5,
        "devices": TWO_HUNDRED,
        "hint": (0,),
        "gpa": ["Dev0", "Dev19", "Dev83", "Dev42", "Dev77"],
        "preferred": ["Dev0", "Dev19", "Dev83", "Dev42", "Dev77"],
        "alignment": {0: 5},
    },
    {
        "id": "11 request for 5, socket 0, preferred aligned accepted, unaligned ignored",
        "request": 5,
        "devices": TWO_HUNDRED,
        "hint": (0,),
        "gpa": ["Dev0", "Dev19", "Dev83", "Dev150", "Dev186"],
        "preferred": ["Dev0", "Dev19", "Dev83"],
        "alignment": {0: 5},
    },
    {
        "id": "12 request for 5, socket 1, preferred aligned accepted, bogus ignored",
        "request": 5,
        "devices": devs("Dev", range(100), 1),
        "hint": (1,),
        "gpa": ["Dev0", "Dev19", "Dev83", "bogus0", "bogus1"],
        "preferred": ["Dev0", "Dev19", "Dev83"],
        "alignment": {1: 5},
    },
    {
        "id": "13 request for 5, multisocket, preferred accepted",
        "request": 5,
        "devices": THREE_AND_97,
        "hint": (0,),
        "gpa": ["Dev0", "Dev1", "Dev2", "Dev42", "Dev83"],
        "preferred": ["Dev0", "Dev1", "Dev2", "Dev42", "Dev83"],
        "alignment": {0: 3, 1: 2},
    },
    {
        "id": "14 request for 5, multisocket, preferred unaligned accepted, bogus ignored",
        "request": 5,
        "devices": THREE_AND_97,
        "hint": (0,),
        "gpa": ["Dev0", "Dev1", "Dev2", "Dev42", "bogus0"],
        "preferred": ["Dev0", "Dev1", "Dev2", "Dev42"],
        "alignment": {0: 3, 1: 2},
    },
]


# ====================================================================== TestFilterByAffinity
# Hint {2}. Rows: available, aligned, unaligned, no affinity.

AFFINITY_DEVICES = {"dev1": [1], "dev2": [1, 2], "dev3": [2], "dev4": [2], "dev5": None}
FILTER_BY_AFFINITY: list[tuple[tuple[int, ...] | None, list[str], list[str], list[str], list[str]]] = [
    ((2,), ["dev1", "dev2"], ["dev2"], ["dev1"], []),
    ((2,), ["dev1", "dev2", "dev3", "dev4"], ["dev2", "dev3", "dev4"], ["dev1"], []),
    # eventsrc additions: a device without topology; no hint at all.
    ((2,), ["dev1", "dev3", "dev5"], ["dev3"], ["dev1"], ["dev5"]),
    (None, ["dev1", "dev2", "dev5"], [], [], ["dev1", "dev2", "dev5"]),
]


# ======================================================== TestPodContainerDeviceToAllocate
# One node: pod1/con1 holds res1 {dev1, dev2}, which exist but are unhealthy; pod2/con2
# holds dev5 of res2, which is not registered (the kubelet's healthyDevices has no entry for
# it: as the views hold a resource dropped after its grace period, its plugin gone and the
# held device kept, unlisted); pod3/con3 holds dev5 of res3, which left the plugin's list
# (res3's healthy devices are dev7 and dev8).

RES1, RES2, RES3 = "domain1.com/resource1", "domain2.com/resource2", "domain2.com/resource3"
TO_ALLOCATE_DEVICES: dict[str, dict[str, dict[str, Any]]] = {
    RES1: {
        "dev1": {"health": "Unhealthy", "holder": "pod1/con1", "hold": "allocated"},
        "dev2": {"health": "Unhealthy", "holder": "pod1/con1", "hold": "allocated"},
    },
    RES2: {"dev5": {"health": "Unhealthy", "holder": "pod2/con2", "hold": "allocated", "removed": True}},
    RES3: {
        "dev5": {"health": "Unhealthy", "holder": "pod3/con3", "hold": "allocated", "removed": True},
        "dev7": {"health": "Healthy"},
        "dev8": {"health": "Healthy"},
    },
}
TO_ALLOCATE_REGISTERED = {RES1, RES3}
TO_ALLOCATE_HELD = {
    ("pod1", "con1", RES1): ["dev1", "dev2"],
    ("pod2", "con2", RES2): ["dev5"],
    ("pod3", "con3", RES3): ["dev5"],
}
TO_ALLOCATE: list[tuple[str, str, str, str, int, str]] = [
    (
        "1 no healthy devices to allocate",
        "pod1",
        "con1",
        RES1,
        2,
        "no healthy devices present; cannot allocate unhealthy devices domain1.com/resource1",
    ),
    ("2 resource not registered", "pod2", "con2", RES2, 1, "cannot allocate unregistered device domain2.com/resource2"),
    (
        "3 previously allocated devices no longer healthy",
        "pod3",
        "con3",
        RES3,
        1,
        "previously allocated devices are no longer healthy; cannot allocate unhealthy devices domain2.com/resource3",
    ),
]


# ========================================================== TestPodContainerDeviceAllocation
# Pods admitted in sequence on one node; each keeps what it got. No GetPreferredAllocation,
# no topology hint. Rows: limits, devices each resource gets (or the refusal), then how many
# devices of res1 and res2 are in use afterwards.

POD_ALLOCATION_DEVICES: dict[str, dict[str, list[int] | None]] = {
    RES1: {"dev1": [0], "dev2": [0]},
    RES2: {"dev3": None, "dev4": None},
}
POD_ALLOCATION: list[tuple[str, dict[str, int], dict[str, int] | str, tuple[int, int]]] = [
    ("1 successful allocation", {RES1: 2, RES2: 1}, {RES1: 2, RES2: 1}, (2, 1)),
    (
        "2 requested number of devices unavailable",
        {RES1: 1},
        "requested number of devices unavailable for domain1.com/resource1. Requested: 1, Available: 0",
        (2, 1),
    ),
    ("3 successful allocation", {RES2: 1}, {RES2: 1}, (2, 2)),
]


# ============================================ TestInitContainerDeviceAllocation (+ restartable)
# Containers in admission order: (name, kind, {resource: count}). Then the expected sizes,
# the (superset, subset, resource) pairs, the groups that must be pairwise disjoint, and
# the number of distinct devices used per resource.

INIT_CONTAINERS: list[dict[str, Any]] = [
    {
        "id": "init containers' devices are reused by app containers",
        "devices": {RES1: {"dev1": None, "dev2": None}, RES2: {"dev3": [0], "dev4": [0]}},
        "containers": [
            ("init1", "init", {RES1: 1}),
            ("init2", "init", {RES1: 2}),
            ("app1", "app", {RES1: 1, RES2: 1}),
            ("app2", "app", {RES1: 1, RES2: 1}),
        ],
        "sizes": {
            ("init1", RES1): 1,
            ("init2", RES1): 2,
            ("app1", RES1): 1,
            ("app2", RES1): 1,
            ("app1", RES2): 1,
            ("app2", RES2): 1,
        },
        "supersets": [("init2", "init1", RES1), ("init2", "app1", RES1), ("init2", "app2", RES1)],
        "disjoint": [(("app1", "app2"), RES1), (("app1", "app2"), RES2)],
        "used": {RES1: 2, RES2: 2},
    },
    {
        "id": "restartable init containers keep theirs",
        "devices": {RES1: devs("dev", range(1, 7), None)},
        "containers": [
            ("init-1", "init", {RES1: 3}),
            ("restartable-init-1", "sidecar", {RES1: 1}),
            ("restartable-init-2", "sidecar", {RES1: 2}),
            ("app-1", "app", {RES1: 1}),
            ("app-2", "app", {RES1: 2}),
        ],
        "sizes": {
            ("init-1", RES1): 3,
            ("restartable-init-1", RES1): 1,
            ("restartable-init-2", RES1): 2,
            ("app-1", RES1): 1,
            ("app-2", RES1): 2,
        },
        "supersets": [("init-1", "restartable-init-1", RES1), ("init-1", "restartable-init-2", RES1)],
        "disjoint": [(("restartable-init-1", "restartable-init-2", "app-1", "app-2"), RES1)],
        "used": {RES1: 6},
    },
]


# =========================================================================== helpers


def table_of(devices: Mapping[str, list[int] | None]) -> dict[str, DeviceView]:
    return {i: DeviceView(health="Healthy", numa_nodes=list(nodes or [])) for i, nodes in devices.items()}


Answer = Callable[[PreferredAsk], "list[str] | PreferredFailed"]


def drive(
    gen: Generator[PreferredAsk, list[str] | PreferredFailed, Any], answer: Answer | None = None
) -> tuple[Any, list[PreferredAsk]]:
    """Run a planner, answering each GetPreferredAllocation; returns (result, asks)."""
    asks: list[PreferredAsk] = []
    try:
        ask = next(gen)
        while True:
            asks.append(ask)
            assert answer is not None, f"unexpected GetPreferredAllocation: {ask}"
            ask = gen.send(answer(ask))
    except StopIteration as stop:
        return stop.value, asks


def chosen(plan: PodPlan) -> dict[tuple[str, str], list[str]]:
    out = {}
    for step in plan.steps:
        assert (step.container, step.resource) not in out
        assert len(set(step.device_ids)) == len(step.device_ids), step
        out[(step.container, step.resource)] = step.device_ids
    return out


def hints_of(expected: list[tuple[tuple[int, ...], bool]] | None) -> list[Hint] | None:
    return None if expected is None else [Hint(frozenset(nodes), preferred) for nodes, preferred in expected]


# =========================================================================== tests


@pytest.mark.parametrize("case", CONTAINER_HINTS, ids=lambda c: c["id"])
def test_container_topology_hints(case: dict[str, Any]) -> None:
    for resource, r in case["resources"].items():
        held = r.get("held", [])
        in_use = set(r.get("in_use", [])) | set(held)
        got = container_hints(table_of(r["devices"]), held, in_use, r.get("reusable", []), r["request"], [0, 1])
        assert got == hints_of(r["expected"]), resource


def test_the_expected_hints_are_in_the_kubelets_order() -> None:
    for case in CONTAINER_HINTS:
        for r in case["resources"].values():
            hints = hints_of(r["expected"])
            if hints:
                # preferred first, then narrower, then the lower mask (the kubelet's LessThan)
                order = sorted(hints, key=lambda h: (not h.preferred, len(h.nodes), sum(1 << n for n in h.nodes)))
                assert hints == order, case["id"]


@pytest.mark.parametrize("mode", ["devicesToAllocate", "plan_pod after an init container"])
@pytest.mark.parametrize("case", GPA_PARAMETERS, ids=lambda c: c["id"])
def test_get_preferred_allocation_parameters(case: dict[str, Any], mode: str) -> None:
    table = table_of(case["devices"])
    numa = sorted({n for nodes in case["devices"].values() for n in nodes or []})
    state = ResourceState(table=table, in_use=set(case["allocated"]), offers_preferred=True)

    def nil(ask: PreferredAsk) -> list[str]:
        return []

    if mode == "devicesToAllocate":
        step, asks = drive(
            _devices_to_allocate(
                "testContainer", GPA_RESOURCE, case["request"], state, [], set(case["reusable"]), frozenset({0}), numa
            ),
            nil,
        )
        assert isinstance(step, Step)
        got = step.device_ids
    else:
        # The reuse pool as a pod has it: what an earlier non-restartable init container holds.
        containers = [ContainerSpec(name="testContainer")]
        requests: dict[str, dict[str, int]] = {"testContainer": {GPA_RESOURCE: case["request"]}}
        held = {}
        if case["reusable"]:
            containers.insert(0, ContainerSpec(name="init", kind="init"))
            requests["init"] = {GPA_RESOURCE: len(case["reusable"])}
            held[("init", GPA_RESOURCE)] = list(case["reusable"])
        plan, asks = drive(
            plan_pod(
                containers,
                requests,
                {GPA_RESOURCE: state},
                held=held,
                hints={("testContainer", GPA_RESOURCE): frozenset({0})},
                numa_nodes=numa,
            ),
            nil,
        )
        got = chosen(plan)[("testContainer", GPA_RESOURCE)]

    assert len(asks) == 1
    (ask,) = asks
    assert (ask.container, ask.resource) == ("testContainer", GPA_RESOURCE)
    assert len(ask.available) == len(set(ask.available))
    assert set(ask.available) == set(case["available"])
    assert len(ask.must_include) == len(set(ask.must_include))
    assert set(ask.must_include) == set(case["must_include"])
    assert ask.size == case["size"]
    # The nil answer is topped up by the daemon: the request is still met, reuse first.
    assert len(got) == len(set(got)) == case["request"]
    assert set(case["reusable"]) <= set(got)
    assert set(got) <= set(table)
    assert not (set(got) - set(case["reusable"])) & set(case["allocated"])


@pytest.mark.parametrize("case", TOPOLOGY_ALIGNED, ids=lambda c: c["id"])
def test_topology_aligned_allocation(case: dict[str, Any]) -> None:
    table = table_of(case["devices"])
    gpa = case["gpa"]
    state = ResourceState(table=table, in_use=set(), offers_preferred=gpa is not None)
    plan, asks = drive(
        plan_pod(
            [ContainerSpec(name="containerName")],
            {"containerName": {GPU: case["request"]}},
            {GPU: state},
            hints={("containerName", GPU): frozenset(case["hint"])},
        ),
        None if gpa is None else (lambda ask: list(gpa)),
    )
    assert len(asks) == (0 if gpa is None else 1)
    got = chosen(plan)[("containerName", GPU)]
    assert len(got) == len(set(got)) == case["request"]
    assert set(got) >= set(case["preferred"])
    alignment: Counter[int] = Counter()
    if any(d.numa_nodes for d in table.values()):
        for device_id in got:
            if table[device_id].numa_nodes:
                alignment[table[device_id].numa_nodes[0]] += 1
    assert dict(alignment) == case["alignment"]


@pytest.mark.parametrize(("hint", "available", "aligned", "unaligned", "none"), FILTER_BY_AFFINITY)
def test_filter_by_affinity(
    hint: tuple[int, ...] | None, available: list[str], aligned: list[str], unaligned: list[str], none: list[str]
) -> None:
    got = filter_by_affinity(available, table_of(AFFINITY_DEVICES), None if hint is None else frozenset(hint))
    assert got == (set(aligned), set(unaligned), set(none))


@pytest.mark.parametrize(
    ("description", "pod", "container", "resource", "required", "error"),
    TO_ALLOCATE,
    ids=[row[0] for row in TO_ALLOCATE],
)
def test_pod_container_device_to_allocate(
    description: str, pod: str, container: str, resource: str, required: int, error: str
) -> None:
    resources = {
        r: ResourceState(
            table={i: DeviceView(**d) for i, d in devices.items()},
            in_use={i for i, d in devices.items() if d.get("holder")},
            registered=r in TO_ALLOCATE_REGISTERED,
        )
        for r, devices in TO_ALLOCATE_DEVICES.items()
    }
    held = {(c, r): ids for (p, c, r), ids in TO_ALLOCATE_HELD.items() if p == pod}
    with pytest.raises(Refusal) as refusal:
        drive(plan_pod([ContainerSpec(name=container)], {container: {resource: required}}, resources, held=held))
    assert str(refusal.value) == error


def test_pod_container_device_allocation() -> None:
    resources = {r: ResourceState(table=table_of(d), in_use=set()) for r, d in POD_ALLOCATION_DEVICES.items()}
    for description, limits, expected, in_use in POD_ALLOCATION:
        if isinstance(expected, str):
            with pytest.raises(Refusal) as refusal:
                drive(plan_pod([ContainerSpec(name="con")], {"con": limits}, resources))
            assert str(refusal.value) == expected, description
        else:
            plan, asks = drive(plan_pod([ContainerSpec(name="con")], {"con": limits}, resources))
            assert asks == []
            got = chosen(plan)
            assert {r: len(got[("con", r)]) for r in limits} == expected, description
        assert (len(resources[RES1].in_use), len(resources[RES2].in_use)) == in_use, description


@pytest.mark.parametrize("case", INIT_CONTAINERS, ids=lambda c: c["id"])
def test_init_container_device_allocation(case: dict[str, Any]) -> None:
    resources = {r: ResourceState(table=table_of(d), in_use=set()) for r, d in case["devices"].items()}
    containers = [ContainerSpec(name=name, kind=kind) for name, kind, _ in case["containers"]]
    requests = {name: dict(reqs) for name, _, reqs in case["containers"]}
    plan, asks = drive(plan_pod(containers, requests, resources))
    assert asks == []
    got = {k: set(v) for k, v in chosen(plan).items()}
    assert {k: len(v) for k, v in got.items()} == case["sizes"]
    for big, small, resource in case["supersets"]:
        assert got[(big, resource)] >= got[(small, resource)], (big, small, resource)
    for names, resource in case["disjoint"]:
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                assert not got[(a, resource)] & got[(b, resource)], (a, b, resource)
    for resource, n in case["used"].items():
        assert len(set().union(*(v for (_, r), v in got.items() if r == resource))) == n
        assert len(resources[resource].in_use) == n


@pytest.mark.parametrize(
    ("extra", "noted"),
    [([], False), (["Elsewhere"], True)],
    ids=["what it was asked to include", "a device not offered"],
)
def test_a_plugin_that_names_its_must_include_devices_is_not_accused(extra: list[str], noted: bool) -> None:
    """A container reusing an init container's devices asks the plugin with them in
    ``available`` and ``must_include``; a plugin that answers with them did nothing wrong.
    Only a device it was not offered makes the note (issue 26's `ml/train`)."""
    devices = devs("Dev", range(8), 0)
    state = ResourceState(table=table_of(devices), in_use={"Dev0", "Dev5"}, offers_preferred=True)

    def answer(ask: PreferredAsk) -> list[str]:
        new = [i for i in ask.available if i not in ask.must_include][: ask.size - len(ask.must_include)]
        return [*ask.must_include, *new, *extra]

    step, (ask,) = drive(
        _devices_to_allocate("main", GPA_RESOURCE, 4, state, [], {"Dev0", "Dev5"}, frozenset({0}), [0]), answer
    )
    assert set(ask.must_include) == {"Dev0", "Dev5"}
    assert isinstance(step, Step) and step.choice == "plugin" and len(step.device_ids) == 4
    assert ("were not candidates" in step.note) is noted
