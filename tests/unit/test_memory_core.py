"""eventsrc.core.memory beyond the kubelet's tables: --reserved-memory, the machine's
description, the hint provider, and allocate-then-remove giving the state back."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventsrc.core.memory.machine import (
    MemoryConfigError,
    MemoryReservation,
    decode_memory_machine,
    decode_reserved_memory,
    get_system_reserved_memory,
    go_quantity_string,
    parse_reserved_memory_flag,
    system_reserved_memory,
    validate_reserved_memory,
)
from eventsrc.core.memory.static_policy import (
    Assignments,
    Block,
    MachineState,
    MemoryPolicyError,
    MemoryProvider,
    StaticPolicy,
    initial_machine_state,
    reconcile,
    remove_container,
)
from eventsrc.core.topology_manager import TopologyHint, admit_and_allocate, mask_of, new_manager
from eventsrc.errors import EventsrcError
from eventsrc.events import ContainerSpec

GI = 2**30
MI = 2**20
BAD_FORMAT = "the reserved memory has incorrect format, expected numaNodeID:type=quantity[,type=quantity...], got "
NOT_EQUAL = 'the total amount "{}" of type "{}" is not equal to the value "{}" determined by Node Allocatable feature'

# --------------------------------------------------------------------------- --reserved-memory


def test_reserved_memory_flag_reads_the_kubelet_form() -> None:
    got = parse_reserved_memory_flag(["0:memory=1Gi,hugepages-2Mi=1Gi;1:memory=2Gi", "2:memory=512Mi"])
    assert got == [
        MemoryReservation(0, {"memory": "1Gi", "hugepages-2Mi": "1Gi"}),
        MemoryReservation(1, {"memory": "2Gi"}),
        MemoryReservation(2, {"memory": "512Mi"}),
    ]
    assert parse_reserved_memory_flag(["0:memory=1Gi", ""]) is None  # an empty value forgets the earlier ones
    assert parse_reserved_memory_flag([]) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "0-memory=1Gi",
            BAD_FORMAT + "0-memory=1Gi",
        ),
        (
            "0:memory=1Gi:x",
            BAD_FORMAT + "0:memory=1Gi:x",
        ),
        ("a:memory=1Gi", "failed to convert the NUMA node ID, exptected integer, got a"),
        ("0:memory", "the reserved limit has incorrect value, expected type=quantatity, got memory"),
        ("0:cpu=1", 'memory type conversion error, unknown type: "cpu"'),
        ("0:memory=1Gb", "failed to parse the quantatity, expected quantatity, got 1Gb"),
    ],
)
def test_reserved_memory_flag_errors_are_the_kubelets(value: str, message: str) -> None:
    with pytest.raises(MemoryConfigError) as err:
        parse_reserved_memory_flag([value])
    assert str(err.value) == message
    assert isinstance(err.value, EventsrcError)


def test_reserved_memory_config_form() -> None:
    items = [{"numaNode": 0, "limits": {"memory": "1Gi", "hugepages-1Gi": 1073741824}}, {"numaNode": 1}]
    assert decode_reserved_memory(items) == [
        MemoryReservation(0, {"memory": "1Gi", "hugepages-1Gi": "1073741824"}),
        MemoryReservation(1, {}),
    ]
    for bad, message in [
        ("0:memory=1Gi", "reservedMemory: expected a list of {numaNode, limits}"),
        ([{"numaNode": "0"}], "reservedMemory[0].numaNode: expected an integer, got '0'"),
        ([{"numaNode": True}], "reservedMemory[0].numaNode: expected an integer, got True"),
        ([{"numaNode": 0, "limit": {}}], "reservedMemory[0]: unknown field 'limit'"),
        ([{"numaNode": 0, "limits": {"memory": [1]}}], "reservedMemory[0].limits.memory: expected a quantity, got [1]"),
    ]:
        with pytest.raises(MemoryConfigError) as err:
            decode_reserved_memory(bad)
        assert str(err.value) == message


MACHINE = decode_memory_machine({"0": {"memory": "16Gi", "hugepages-2Mi": "1Gi"}, "1": {"memory": "16Gi"}})


def test_validate_reserved_memory_accepts_matching_totals() -> None:
    reserved = [MemoryReservation(0, {"memory": "1Gi"}), MemoryReservation(1, {"memory": "1536Mi"})]
    validate_reserved_memory(MACHINE, {"memory": "2560Mi", "cpu": "2"}, reserved)
    assert get_system_reserved_memory(MACHINE, {"memory": "2560Mi"}, reserved) == {
        0: {"memory": GI},
        1: {"memory": 1536 * MI},
    }


@pytest.mark.parametrize(
    ("allocatable", "reserved", "message"),
    [
        (
            {"memory": "2Gi"},
            [MemoryReservation(0, {"memory": "1Gi"})],
            NOT_EQUAL.format("1Gi", "memory", "2Gi"),
        ),
        (
            {"memory": "1G"},
            [MemoryReservation(0, {"memory": "512Mi"}), MemoryReservation(1, {"memory": "512Mi"})],
            NOT_EQUAL.format("1Gi", "memory", "1G"),
        ),
        (
            {"memory": "1Gi"},
            [MemoryReservation(0, {"memory": "1Gi", "hugepages-2Mi": "2Mi"})],
            NOT_EQUAL.format("2Mi", "hugepages-2Mi", "0"),
        ),
        (
            {"memory": "1Gi"},
            [],
            NOT_EQUAL.format("0", "memory", "1Gi"),
        ),
        (
            {"memory": "1Gi"},
            [MemoryReservation(2, {"memory": "1Gi"})],
            "the reserved memory configuration references a NUMA node 2 that does not exist on this machine",
        ),
    ],
)
def test_validate_reserved_memory_messages(
    allocatable: dict[str, str], reserved: list[MemoryReservation], message: str
) -> None:
    with pytest.raises(MemoryConfigError) as err:
        validate_reserved_memory(MACHINE, allocatable, reserved)
    assert str(err.value) == message


def test_system_reserved_keeps_the_later_value_of_a_node_given_twice() -> None:
    reserved = [MemoryReservation(0, {"memory": "1Gi"}), MemoryReservation(0, {"memory": "2Gi"})]
    assert system_reserved_memory(MACHINE, reserved) == {0: {"memory": 2 * GI}, 1: {}}
    with pytest.raises(MemoryConfigError, match="could not covert a variable of type Quantity to int64"):
        system_reserved_memory(MACHINE, [MemoryReservation(0, {"memory": "1.5"})])


@pytest.mark.parametrize(
    ("value", "fmt", "text"),
    [
        (Fraction(2 * GI), "binary", "2Gi"),
        (Fraction(1536 * MI), "binary", "1536Mi"),
        (Fraction(1000), "binary", "1k"),
        (Fraction(1025), "binary", "1025"),
        (Fraction(10**9), "decimal", "1G"),
        (Fraction(1500), "decimal", "1500"),
        (Fraction(0), "binary", "0"),
        (Fraction(3000), "exponent", "3e3"),
        (Fraction(1, 2), "decimal", "500m"),
    ],
)
def test_go_quantity_strings(value: Fraction, fmt: str, text: str) -> None:
    assert go_quantity_string(value, fmt) == text


# --------------------------------------------------------------------------- the machine


def test_decode_memory_machine() -> None:
    m = decode_memory_machine({"1": {"memory": 17179869184}, 0: {"memory": "16Gi", "hugepages-2048Ki": 4 * MI}})
    assert m.node_ids() == [0, 1]
    assert m.nodes[0] == {"memory": 16 * GI, "hugepages-2Mi": 4 * MI}


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ([], "m: expected a mapping of NUMA node id to memory totals"),
        ({"x": {"memory": 1}}, "m: NUMA node id 'x' is not a non-negative integer"),
        ({"-1": {"memory": 1}}, "m: NUMA node id '-1' is not a non-negative integer"),
        ({"1.5": {"memory": 1}}, "m: NUMA node id '1.5' is not a non-negative integer"),
        ({"64": {"memory": 1}}, "m: NUMA node 64: the kubelet's NUMA masks stop at node 63"),
        ({"0": {"memory": -1}}, "m: NUMA node 0: memory: -1 is negative"),
        ({"0": {"memory": "-1Gi"}}, "m: NUMA node 0: memory: '-1Gi' is negative"),
        ({"0": {"memory": 1.5}}, "m: NUMA node 0: memory: expected a number of bytes, got 1.5"),
        ({"0": {"memory": "1.5"}}, "m: NUMA node 0: memory: '1.5' is not a whole number of bytes"),
        ({"0": {"memory": 1, "cpu": 2}}, "m: NUMA node 0: unknown resource 'cpu' (memory or hugepages-<size>)"),
        ({"0": {"memory": 1, "hugepages-x": 2}}, "m: NUMA node 0: hugepages-x: not a hugepage size"),
        (
            {"0": {"memory": 1, "hugepages-2Mi": MI}},
            "m: NUMA node 0: hugepages-2Mi: 1048576 bytes is not a whole number of hugepages-2Mi pages",
        ),
        ({"0": {"hugepages-2Mi": 2 * MI}}, "m: NUMA node 0: no memory total"),
        (
            {"0": {"memory": 1, "hugepages-2Mi": 0, "hugepages-2048Ki": 0}},
            "m: NUMA node 0: hugepages-2048Ki: given twice (as hugepages-2Mi)",
        ),
        ({"0": {"memory": 1}, 0: {"memory": 1}}, "m: NUMA node 0 is given twice"),
    ],
)
def test_decode_memory_machine_errors(mapping: object, message: str) -> None:
    with pytest.raises(MemoryConfigError) as err:
        decode_memory_machine(mapping, "m")
    assert str(err.value) == message
    assert "\n" not in str(err.value)


def test_initial_state_takes_hugepages_and_reservations_out_of_memory() -> None:
    state = initial_machine_state(MACHINE, {0: {"memory": GI, "hugepages-2Mi": 2 * MI}, 1: {"memory": 20 * GI}})
    assert state[0].memory_map["memory"].allocatable == 14 * GI
    assert state[0].memory_map["hugepages-2Mi"].free == GI - 2 * MI
    assert state[1].memory_map["memory"].allocatable == 0  # more reserved than the node has: none left, no wrap
    assert state[1].cells == (1,)


# --------------------------------------------------------------------------- the provider


def guaranteed(name: str, memory: str, kind: str = "app", **hugepages: str) -> ContainerSpec:
    res = {"cpu": "1", "memory": memory, **{k.replace("_", "-"): v for k, v in hugepages.items()}}
    return ContainerSpec(name=name, kind=kind, requests=res, limits=res)


def test_provider_plans_blocks_through_the_topology_manager() -> None:
    machine = decode_memory_machine({"0": {"memory": "4Gi"}, "1": {"memory": "4Gi"}})
    state = initial_machine_state(machine, {0: {"memory": GI}, 1: {"memory": GI}})
    pod = [guaranteed("init", "2Gi", kind="init"), guaranteed("app", "1Gi")]
    provider = MemoryProvider("Static", state, {}, "uid", pod)
    list(admit_and_allocate(new_manager([0, 1], "single-numa-node", "container"), pod, [provider]))
    assert provider.steps == [
        ("init", (Block((0,), "memory", 2 * GI),), {0: {"memory": 2 * GI}}),
        ("app", (Block((0,), "memory", GI),), {}),  # all of it reused: nothing more taken
        ("init", (Block((0,), "memory", GI),), {}),  # the app container reuses half of it
    ]
    assert provider.state[0].memory_map["memory"].reserved == 2 * GI
    assert provider.assignments == {"uid": {"init": provider.steps[2][1], "app": provider.steps[1][1]}}
    assert state[0].memory_map["memory"].reserved == 0  # the input is untouched


def test_provider_refuses_with_the_kubelets_message() -> None:
    machine = decode_memory_machine({"0": {"memory": "4Gi"}})
    state = initial_machine_state(machine, {0: {"memory": GI}})
    pod = [guaranteed("app", "5Gi")]
    provider = MemoryProvider("Static", state, {}, "uid", pod)
    assert provider.topology_hints(pod[0]) == {}
    with pytest.raises(MemoryPolicyError) as err:
        list(provider.allocate(pod[0], TopologyHint(None, False)))
    assert str(err.value) == (
        "[memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available"
    )


def test_none_policy_gives_no_hints_and_allocates_nothing() -> None:
    pod = [guaranteed("app", "1Gi")]
    provider = MemoryProvider("None", {}, {}, "uid", pod)
    assert provider.topology_hints(pod[0]) is None
    assert provider.pod_topology_hints(pod) is None
    assert list(provider.allocate(pod[0], TopologyHint(None, False))) == []
    assert provider.steps == []
    with pytest.raises(MemoryConfigError, match='unknown policy: "static"'):
        MemoryProvider("static", {}, {}, "uid", pod)


def test_pod_hints_use_the_pod_level_request() -> None:
    machine = decode_memory_machine({"0": {"memory": "4Gi"}, "1": {"memory": "4Gi"}})
    state = initial_machine_state(machine, {0: {"memory": GI}, 1: {"memory": GI}})
    pod = [guaranteed("init", "3Gi", kind="init"), guaranteed("a", "2Gi"), guaranteed("b", "2Gi")]
    got = StaticPolicy().pod_topology_hints(state, {}, "uid", pod)
    assert got == {"memory": [TopologyHint(mask_of([0, 1]), True)]}  # 4Gi: no single node has it
    held = {"uid": {"a": (Block((1,), "memory", 4 * GI),)}}
    assert StaticPolicy().pod_topology_hints(state, held, "uid", pod) == {"memory": [TopologyHint(mask_of([1]), True)]}


def test_reconcile_counts_what_fits_and_reports_the_rest() -> None:
    machine = decode_memory_machine({"0": {"memory": "4Gi"}})
    held = {
        "p1": {"a": (Block((0,), "memory", 2 * GI),)},
        "p2": {"b": (Block((0,), "memory", 2 * GI),)},  # the node lost memory: no longer fits
    }
    drift = reconcile(machine, {0: {"memory": GI}}, held)
    assert drift.assignments == {"p1": held["p1"]}
    assert drift.dropped == {
        ("p2", "b"): "[memorymanager] (pod: p2, container: b) the memory assignment of 2147483648 bytes "
        "of memory on NUMA nodes [0] no longer fits: 1073741824 bytes free"
    }
    assert drift.state[0].memory_map["memory"].free == GI


# --------------------------------------------------------------------------- allocate, then remove


Scenario = tuple[dict[str, dict[str, int]], list[tuple[str, list[ContainerSpec], bool]]]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    nodes = draw(st.integers(1, 4))
    machine = {}
    for n in range(nodes):
        pages = draw(st.integers(0, 8))
        machine[str(n)] = {"memory": draw(st.integers(2, 12)) * GI + pages * 2 * MI, "hugepages-2Mi": pages * 2 * MI}
    pods = []
    for i in range(draw(st.integers(1, 8))):
        containers = []
        for j in range(draw(st.integers(1, 3))):
            memory = f"{draw(st.integers(1, 16)) * 256}Mi"
            hp = {"hugepages_2Mi": f"{draw(st.integers(1, 4)) * 2}Mi"} if draw(st.booleans()) else {}
            containers.append(guaranteed(f"c{j}", memory, **hp))
        pods.append((f"pod{i}", containers, draw(st.booleans())))
    return machine, pods


@settings(max_examples=150, deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_allocate_then_remove_gives_the_state_back(scenario: Scenario, rnd: random.Random) -> None:
    machine_map, pods = scenario
    machine = decode_memory_machine(machine_map)
    start = initial_machine_state(machine, {n: {"memory": GI} for n in machine.node_ids()})
    state: MachineState = start
    held: Assignments = {}
    policy = StaticPolicy()
    for uid, containers, preferred in pods:
        for c in containers:
            try:
                done = policy.allocate(state, held, uid, containers, c, TopologyHint(None, preferred))
            except MemoryPolicyError:
                continue
            state, held = done.state, done.assignments
            for node in state.values():  # what is reserved is what the blocks hold, on every node
                for t in node.memory_map.values():
                    assert t.free >= 0 and t.reserved >= 0 and t.free + t.reserved == t.allocatable
    total_blocks = sum(b.size for cs in held.values() for bs in cs.values() for b in bs)
    assert total_blocks == sum(t.reserved for node in state.values() for t in node.memory_map.values())
    assert reconcile(machine, {n: {"memory": GI} for n in machine.node_ids()}, held).dropped == {}
    everything = [(uid, name) for uid, cs in held.items() for name in cs]
    rnd.shuffle(everything)
    for uid, name in everything:
        removed = remove_container(state, held, uid, name)
        assert removed.blocks
        state, held = removed.state, removed.assignments
    assert held == {}
    assert state == start
