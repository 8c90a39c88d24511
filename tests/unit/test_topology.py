"""CPU topology: the upstream table tests as data, the topology file, synthetic machines,
sysfs discovery from fake trees, and ``eventsrc cpu topology``.

Ported from kubernetes/kubernetes ``pkg/kubelet/cm/cpumanager/topology/topology_test.go``
(Test_Discover and the CPUDetails / CPUTopology query tests). Upstream's cadvisor input
``{Id, Cores: [{SocketID, Id, Threads, UncoreCaches}]}`` is written ``Node(id, (Core(id,
socket, threads, uncore caches), ...))``; expected details are written as rows
``(cpus, socket, numa, uncore)`` with the rule that gives the core id, as in
``tests/support/kubelet_topologies.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from eventsrc.core.cpu.cpuset import CPUSet, parse
from eventsrc.core.cpu.topology import (
    Core,
    CPUDetails,
    CPUInfo,
    CPUTopology,
    MachineInfo,
    Node,
    TopologyError,
    decode_topology_file,
    discover,
    encode_topology_file,
    synthetic,
)
from eventsrc.inputs.sysfs_topology import SysfsError, discover_topology, read_machine_info
from tests.conftest import run_cli
from tests.support import kubelet_topologies as kt

REPO = Path(__file__).resolve().parent.parent.parent


def info(numa: int = 0, socket: int = 0, core: int = 0, uncore: int = 0) -> CPUInfo:
    return CPUInfo(numa_node_id=numa, socket_id=socket, core_id=core, uncore_cache_id=uncore)


def rows_details(rows: Sequence[tuple[str, int, int, int]], core_of: Callable[[int], int]) -> CPUDetails:
    return CPUDetails(
        {cpu: info(numa, socket, core_of(cpu), uncore) for cpus, socket, numa, uncore in rows for cpu in parse(cpus)}
    )


# -- Test_Discover ---------------------------------------------------------------------------

_XEON_IDS_A = (0, 1, 2, 8, 9, 16, 17, 18, 24, 25)  # cadvisor core ids, first NUMA node of a socket
_XEON_IDS_B = (3, 4, 10, 11, 12, 19, 20, 26, 27, 28)  # second NUMA node of a socket


def _xeon_cores(socket: int, first_cpu: int, ids: Sequence[int], uncore: int) -> tuple[Core, ...]:
    return tuple(Core(i, socket, (first_cpu + k, first_cpu + k + 40), (uncore,)) for k, i in enumerate(ids))


_HT8 = ((0, 4), (1, 5), (2, 6), (3, 7))

DISCOVER: list[tuple[str, MachineInfo, CPUTopology | None]] = [
    (
        "EmptyUncoreCache",
        MachineInfo(8, 1, (Node(0, tuple(Core(i, 0, t, ()) for i, t in enumerate(_HT8))),)),
        CPUTopology(8, 4, 1, 1, 1, rows_details([("0-7", 0, 0, 0)], lambda c: c % 4)),
    ),
    ("FailNumCores", MachineInfo(0, 0, ()), None),
    (
        "OneSocketHT",
        MachineInfo(8, 1, (Node(0, tuple(Core(i, 0, t, (0,)) for i, t in enumerate(_HT8))),)),
        CPUTopology(8, 4, 1, 1, 1, rows_details([("0-7", 0, 0, 0)], lambda c: c % 4)),
    ),
    (
        "DualSocketMultiNumaPerSocketHT",
        MachineInfo(
            80,
            2,
            (
                Node(0, _xeon_cores(0, 0, _XEON_IDS_A, 0)),
                Node(1, _xeon_cores(0, 10, _XEON_IDS_B, 0)),
                Node(2, _xeon_cores(1, 20, _XEON_IDS_A, 0)),
                Node(3, _xeon_cores(1, 30, _XEON_IDS_B, 0)),
            ),
        ),
        CPUTopology(
            80,
            40,
            2,
            4,
            1,
            rows_details(
                [("0-9,40-49", 0, 0, 0), ("10-19,50-59", 0, 1, 0), ("20-29,60-69", 1, 2, 0), ("30-39,70-79", 1, 3, 0)],
                lambda c: c % 40,
            ),
        ),
    ),
    (
        "DualNumaMultiSocketPerNumaHT",
        MachineInfo(
            80,
            4,
            (
                Node(0, _xeon_cores(0, 0, _XEON_IDS_A, 1) + _xeon_cores(1, 10, _XEON_IDS_B, 1)),
                Node(1, _xeon_cores(2, 20, _XEON_IDS_A, 1) + _xeon_cores(3, 30, _XEON_IDS_B, 1)),
            ),
        ),
        CPUTopology(
            80,
            40,
            4,
            2,
            1,
            rows_details(
                [("0-9,40-49", 0, 0, 1), ("10-19,50-59", 1, 0, 1), ("20-29,60-69", 2, 1, 1), ("30-39,70-79", 3, 1, 1)],
                lambda c: c % 40,
            ),
        ),
    ),
    (
        "DualSocketNoHT",
        MachineInfo(
            4,
            2,
            (
                Node(0, (Core(0, 0, (0,), (0,)), Core(2, 0, (2,), (0,)))),
                Node(1, (Core(1, 1, (1,), (0,)), Core(3, 1, (3,), (0,)))),
            ),
        ),
        CPUTopology(4, 4, 2, 2, 1, rows_details([("0,2", 0, 0, 0), ("1,3", 1, 1, 0)], lambda c: c)),
    ),
    (
        "DualSocketHT - non unique Core'ID's",
        MachineInfo(
            12,
            2,
            (
                Node(0, tuple(Core(i, 0, (i, i + 6), (0,)) for i in range(3))),
                Node(1, tuple(Core(i, 1, (i + 3, i + 9), (0,)) for i in range(3))),
            ),
        ),
        CPUTopology(12, 6, 2, 2, 1, rows_details([("0-2,6-8", 0, 0, 0), ("3-5,9-11", 1, 1, 0)], lambda c: c % 6)),
    ),
    (
        "OneSocketHT fail (repeated thread)",
        MachineInfo(
            8,
            1,
            (
                Node(
                    0,
                    (
                        Core(0, 0, (0, 4), (1,)),
                        Core(1, 0, (1, 5), (1,)),
                        Core(2, 0, (2, 2), (1,)),
                        Core(3, 0, (3, 7), (1,)),
                    ),
                ),
            ),
        ),
        None,
    ),
    (
        "OneSocketHT fail (no threads)",
        MachineInfo(
            8,
            1,
            (
                Node(
                    0,
                    (
                        Core(0, 0, (0, 4), (1,)),
                        Core(1, 0, (1, 5), (1,)),
                        Core(2, 0, (2, 6), (1,)),
                        Core(3, 0, (), (1,)),
                    ),
                ),
            ),
        ),
        None,
    ),
    (
        "UncoreOneSocketNoSMT",
        MachineInfo(32, 1, (Node(0, tuple(Core(i, 0, (i,), (i // 4,)) for i in range(32))),)),
        CPUTopology(32, 32, 1, 1, 8, rows_details([(f"{4 * u}-{4 * u + 3}", 0, 0, u) for u in range(8)], lambda c: c)),
    ),
    (
        "UncoreDualSocketSMT",
        MachineInfo(
            96,
            2,
            tuple(
                Node(n, tuple(Core(i, n // 2, (i, i + 48), (i // 4,)) for i in range(12 * n, 12 * n + 12)))
                for n in range(4)
            ),
        ),
        CPUTopology(
            96,
            48,
            2,
            4,
            12,
            rows_details(
                [(f"{4 * u}-{4 * u + 3},{48 + 4 * u}-{48 + 4 * u + 3}", u // 6, u // 3, u) for u in range(12)],
                lambda c: c % 48,
            ),
        ),
    ),
]


@pytest.mark.parametrize(("name", "machine", "want"), DISCOVER, ids=[d[0] for d in DISCOVER])
def test_discover(name: str, machine: MachineInfo, want: CPUTopology | None) -> None:
    if want is None:
        with pytest.raises(TopologyError):
            discover(machine)
        return
    got = discover(machine)
    assert got == want
    assert got.cpu_details.items() == want.cpu_details.items()


# -- CPUDetails queries ------------------------------------------------------------------------

_KEEP = CPUDetails({0: info(), 1: info(), 2: info()})
KEEP_ONLY = [  # (cpus, want)
    ({0, 1}, {0: info(), 1: info()}),
    ({3}, {}),
    (set(), {}),
    ({0, 1, 2}, {0: info(), 1: info(), 2: info()}),
]

_NIS1 = CPUDetails({0: info(0, 0), 1: info(0, 1), 2: info(1, 2), 3: info(1, 3)})
_NIS2 = CPUDetails({0: info(0, 0), 1: info(1, 0), 2: info(2, 1), 3: info(3, 1)})  # "poorly designed mainboards"
NUMA_NODES_IN_SOCKETS = [(_NIS1, [0, 1, 2], {0, 1}), (_NIS1, [4], set()), (_NIS2, [0], {0, 1}), (_NIS2, [3], set())]

_BY_SOCKET = CPUDetails({0: info(socket=0), 1: info(socket=0), 2: info(socket=1), 3: info(socket=2)})
_BY_NUMA_SOCKET = CPUDetails({0: info(0, 0), 1: info(0, 1), 2: info(1, 2), 3: info(2, 3)})
_BY_NUMA_CORE = CPUDetails({0: info(0, core=0), 1: info(0, core=1), 2: info(1, core=2), 3: info(2, core=3)})
_BY_SOCKET_CORE = CPUDetails(
    {0: info(socket=0, core=0), 1: info(socket=0, core=1), 2: info(socket=1, core=2), 3: info(socket=2, core=3)}
)
_BY_NUMA = CPUDetails({0: info(0), 1: info(0), 2: info(1), 3: info(2)})
_BY_CORE = CPUDetails({0: info(core=0), 1: info(core=0), 2: info(core=1), 3: info(core=2)})

# (what, details, method, ids, want)
QUERIES: list[tuple[str, CPUDetails, str, list[int] | None, set[int]]] = [
    ("NUMANodes", CPUDetails({0: info(0), 1: info(0), 2: info(1), 3: info(1)}), "numa_nodes", None, {0, 1}),
    (
        "Sockets",
        CPUDetails({0: info(socket=0), 1: info(socket=0), 2: info(socket=1), 3: info(socket=1)}),
        "sockets",
        None,
        {0, 1},
    ),
    ("CPUsInSockets in", _BY_SOCKET, "cpus_in_sockets", [0, 1], {0, 1, 2}),
    ("CPUsInSockets not in", _BY_SOCKET, "cpus_in_sockets", [3], set()),
    ("SocketsInNUMANodes in", _BY_NUMA_SOCKET, "sockets_in_numa_nodes", [0, 1], {0, 1, 2}),
    ("SocketsInNUMANodes not in", _BY_NUMA_SOCKET, "sockets_in_numa_nodes", [3], set()),
    ("Cores", CPUDetails({0: info(core=0), 1: info(core=0), 2: info(core=1), 3: info(core=1)}), "cores", None, {0, 1}),
    ("CoresInNUMANodes in", _BY_NUMA_CORE, "cores_in_numa_nodes", [0, 1], {0, 1, 2}),
    ("CoresInNUMANodes not in", _BY_NUMA_CORE, "cores_in_numa_nodes", [3], set()),
    ("CoresInSockets in", _BY_SOCKET_CORE, "cores_in_sockets", [0, 1], {0, 1, 2}),
    ("CoresInSockets not in", _BY_SOCKET_CORE, "cores_in_sockets", [3], set()),
    ("CPUs", CPUDetails({0: info(), 1: info()}), "cpus", None, {0, 1}),
    ("CPUsInNUMANodes in", _BY_NUMA, "cpus_in_numa_nodes", [0, 1], {0, 1, 2}),
    ("CPUsInNUMANodes not in", _BY_NUMA, "cpus_in_numa_nodes", [3], set()),
    ("CPUsInCores in", _BY_CORE, "cpus_in_cores", [0, 1], {0, 1, 2}),
    ("CPUsInCores not in", _BY_CORE, "cpus_in_cores", [3], set()),
    ("CPUsInUncoreCaches single", CPUDetails({0: info(), 1: info()}), "cpus_in_uncore_caches", [0], {0, 1}),
    (
        "CPUsInUncoreCaches multiple",
        CPUDetails({0: info(), 1: info(), 2: info(uncore=1)}),
        "cpus_in_uncore_caches",
        [0, 1],
        {0, 1, 2},
    ),
    ("CPUsInUncoreCaches missing", CPUDetails({0: info()}), "cpus_in_uncore_caches", [1], set()),
    (
        "UncoreInNUMANodes single",
        CPUDetails({0: info(0, uncore=0), 1: info(0, uncore=1)}),
        "uncore_in_numa_nodes",
        [0],
        {0, 1},
    ),
    (
        "UncoreInNUMANodes multiple",
        CPUDetails({0: info(0), 1: info(0), 20: info(1, uncore=1), 21: info(1, uncore=1)}),
        "uncore_in_numa_nodes",
        [0, 1],
        {0, 1},
    ),
    ("UncoreInNUMANodes missing", CPUDetails({0: info(1)}), "uncore_in_numa_nodes", [0], set()),
    ("UncoreCaches", CPUDetails({0: info(), 1: info(uncore=1), 2: info(uncore=2)}), "uncore_caches", None, {0, 1, 2}),
    ("UncoreCaches empty", CPUDetails({}), "uncore_caches", None, set()),
    ("UncoreCaches shared", CPUDetails({0: info(), 1: info(), 2: info()}), "uncore_caches", None, {0}),
]

_SAME_SOCKET = CPUDetails(
    {
        0: info(0, 0, 0),
        4: info(0, 0, 4),
        1: info(1, 1, 1),
        5: info(1, 1, 5),
        2: info(2, 0, 2),
        6: info(2, 0, 6),
        3: info(3, 1, 3),
        7: info(3, 1, 7),
    }
)
SAME_SOCKET = [
    ([], True),
    ([3], True),
    ([2, 2], True),
    ([0, 2], True),
    ([0, 1], False),
    ([0, 1, 2, 3], False),
    ([0, 2, 5], False),
]

_TOPO_DUAL_HT = CPUTopology(
    12, 6, 2, cpu_details=rows_details([("0,2,4,6,8,10", 0, 0, 0), ("1,3,5,7,9,11", 1, 1, 0)], lambda c: c % 6)
)
CPU_IDS = [  # (method, cpu, want or None for an error)
    ("cpu_core_id", 2, 2),
    ("cpu_core_id", 8, 2),
    ("cpu_core_id", -2, None),
    ("cpu_socket_id", 3, 1),
    ("cpu_socket_id", 9, 1),
    ("cpu_socket_id", 1000, None),
    ("cpu_numa_node_id", 0, 0),
    ("cpu_numa_node_id", 6, 0),
    ("cpu_numa_node_id", 1000, None),
]
CPUS_PER_UNCORE = [(8, 0, 0), (16, 2, 8), (8, 1, 8)]  # (num cpus, num uncore caches, want)
UNCORE_CACHE_ID = [  # getUncoreCacheID: (core, want)
    (Core(0, 1, (0,), (5, 6)), 5),
    (Core(0, 2, (0,), ()), 2),
    (Core(0, 1, (0,)), 1),
]

UPSTREAM_CASES = (
    len(DISCOVER)
    + len(KEEP_ONLY)
    + len(NUMA_NODES_IN_SOCKETS)
    + len(QUERIES)
    + len(SAME_SOCKET)
    + len(CPU_IDS)
    + len(CPUS_PER_UNCORE)
    + len(UNCORE_CACHE_ID)
)


def test_upstream_case_count() -> None:
    assert UPSTREAM_CASES == 66


@pytest.mark.parametrize(("cpus", "want"), KEEP_ONLY)
def test_keep_only(cpus: set[int], want: dict[int, CPUInfo]) -> None:
    assert _KEEP.keep_only(CPUSet(cpus)) == CPUDetails(want)


@pytest.mark.parametrize(("details", "ids", "want"), NUMA_NODES_IN_SOCKETS)
def test_numa_nodes_in_sockets(details: CPUDetails, ids: list[int], want: set[int]) -> None:
    assert details.numa_nodes_in_sockets(*ids) == CPUSet(want)


@pytest.mark.parametrize(("what", "details", "method", "ids", "want"), QUERIES, ids=[q[0] for q in QUERIES])
def test_details_query(what: str, details: CPUDetails, method: str, ids: list[int] | None, want: set[int]) -> None:
    fn = getattr(details, method)
    assert (fn() if ids is None else fn(*ids)) == CPUSet(want)


@pytest.mark.parametrize(("numa_nodes", "want"), SAME_SOCKET)
def test_are_numa_nodes_in_same_socket(numa_nodes: list[int], want: bool) -> None:
    assert _SAME_SOCKET.are_numa_nodes_in_same_socket(numa_nodes) is want


@pytest.mark.parametrize(("method", "cpu", "want"), CPU_IDS)
def test_cpu_ids(method: str, cpu: int, want: int | None) -> None:
    fn = getattr(_TOPO_DUAL_HT, method)
    if want is None:
        with pytest.raises(TopologyError, match=f"unknown CPU ID: {cpu}"):
            fn(cpu)
    else:
        assert fn(cpu) == want


@pytest.mark.parametrize(("num_cpus", "num_uncore", "want"), CPUS_PER_UNCORE)
def test_cpus_per_uncore(num_cpus: int, num_uncore: int, want: int) -> None:
    assert CPUTopology(num_cpus, 0, 0, num_uncore_cache=num_uncore).cpus_per_uncore() == want


@pytest.mark.parametrize(("core", "want"), UNCORE_CACHE_ID)
def test_uncore_cache_id(core: Core, want: int) -> None:
    got = discover(MachineInfo(1, 1, (Node(0, (core,)),)))
    assert got.cpu_details[0].uncore_cache_id == want


def test_cores_needed_in_uncore_cache_and_alignment() -> None:
    d = kt.topoUncoreSingleSocketSMT.cpu_details
    assert d.cores_needed_in_uncore_cache(2, 1) == CPUSet([4, 5])
    assert d.cores_needed_in_uncore_cache(9, 1) == CPUSet([4, 5, 6, 7])
    t = kt.topoUncoreSingleSocketSMT
    assert t.is_aligned_at_uncore_cache(CPUSet([0, 8, 3]))
    assert not t.is_aligned_at_uncore_cache(CPUSet([0, 4]))
    assert t.is_aligned_at_uncore_cache(CPUSet([99]))
    assert not t.is_aligned_at_uncore_cache(CPUSet([0, 99]))
    assert (t.cpus_per_core(), t.cpus_per_socket(), t.cpus_per_uncore()) == (2, 16, 8)


# -- the kubelet's test topologies and synthetic machines ------------------------------------

# (name, synthetic arguments): synthetic must reproduce every CPU's socket, NUMA node and core.
SYNTHETIC_MATCHES = [
    ("topoSingleSocketHT", dict(sockets=1, numa_per_socket=1, cores_per_numa=4, threads_per_core=2)),
    (
        "topoDualSocketHT",
        dict(sockets=2, numa_per_socket=1, cores_per_numa=3, threads_per_core=2, interleave_sockets=True),
    ),
    ("topoDualSocketNoHT", dict(sockets=2, numa_per_socket=1, cores_per_numa=4, threads_per_core=1)),
    ("topoDualSocketMultiNumaPerSocketHT", dict(sockets=2, numa_per_socket=2, cores_per_numa=10, threads_per_core=2)),
    (
        "topoDualSocketMultiNumaPerSocketHTLarge",
        dict(sockets=2, numa_per_socket=4, cores_per_numa=16, threads_per_core=2),
    ),
    (
        "topoUncoreSingleSocketMultiNuma",
        dict(sockets=1, numa_per_socket=2, cores_per_numa=8, threads_per_core=1, uncore_per_numa=2),
    ),
    (
        "topoUncoreDualSocketNoSMT",
        dict(sockets=2, numa_per_socket=1, cores_per_numa=8, threads_per_core=1, uncore_per_numa=2),
    ),
    (
        "topoUncoreSingleSocketSMT",
        dict(sockets=1, numa_per_socket=1, cores_per_numa=8, threads_per_core=2, uncore_per_numa=2),
    ),
    (
        "topoUncoreSingleSocketNoSMT",
        dict(sockets=1, numa_per_socket=1, cores_per_numa=16, threads_per_core=1, uncore_per_numa=4),
    ),
]


@pytest.mark.parametrize(("name", "kwargs"), SYNTHETIC_MATCHES, ids=[s[0] for s in SYNTHETIC_MATCHES])
def test_synthetic_matches_kubelet_topology(name: str, kwargs: dict[str, object]) -> None:
    want = kt.KUBELET_TEST_TOPOLOGIES[name]
    got = synthetic(**kwargs)  # type: ignore[arg-type]
    # The declared totals upstream sets (non-zero) are the counted ones.
    for attr in ("num_cpus", "num_cores", "num_sockets", "num_numa_nodes", "num_uncore_cache"):
        if getattr(want, attr):
            assert getattr(got, attr) == getattr(want, attr), attr
    for cpu, w in want.cpu_details.items():
        g = got.cpu_details[cpu]
        assert (g.socket_id, g.numa_node_id, g.core_id) == (w.socket_id, w.numa_node_id, w.core_id), cpu
        if want.num_uncore_cache:
            assert g.uncore_cache_id == w.uncore_cache_id, cpu
    assert got.cpu_details.cpus() == want.cpu_details.cpus()


@pytest.mark.parametrize("name", sorted(kt.KUBELET_TEST_TOPOLOGIES))
def test_kubelet_topologies_are_consistent(name: str) -> None:
    t = kt.KUBELET_TEST_TOPOLOGIES[name]
    d = t.cpu_details
    assert len(d) == t.num_cpus
    assert d.cores().size() == t.num_cores
    assert d.sockets().size() == t.num_sockets
    assert t.num_numa_nodes in (0, d.numa_nodes().size())
    assert t.num_uncore_cache in (0, d.uncore_caches().size())
    for core in d.cores():  # a core sits in one socket and one NUMA node
        cpus = d.cpus_in_cores(core)
        assert len({d[c].socket_id for c in cpus}) == 1
        assert len({d[c].numa_node_id for c in cpus}) == 1
        assert cpus.size() == t.cpus_per_core()


def test_declared_totals_are_kept() -> None:
    assert kt.topoDualSocketHT.num_numa_nodes == 0 and kt.topoDualSocketHT.num_uncore_cache == 0
    assert kt.topoDualSocketHT.cpus_per_uncore() == 0
    assert kt.topoQuadSocketFourWayHT.cpus_per_core() == 4
    assert kt.topoQuadSocketFourWayHT.cpu_details.cpus_in_cores(64) == CPUSet([1, 13, 25, 38])
    assert kt.fakeTopoMultiSocketDualSocketPerNumaHT.cpu_details.sockets_in_numa_nodes(1) == CPUSet([2, 3])


def test_simulated_256_machine() -> None:
    t = kt.SIMULATED_256
    assert (t.num_cpus, t.num_cores, t.num_sockets, t.num_numa_nodes, t.cpus_per_core()) == (256, 128, 2, 4, 2)
    assert t.cpu_details.cpus_in_numa_nodes(1) == parse("32-63,160-191")
    assert t.cpu_details.cpus_in_cores(5) == CPUSet([5, 133])
    example = REPO / "examples" / "topology-256.json"
    assert example.read_bytes() == encode_topology_file(t)
    assert decode_topology_file(example.read_bytes()) == t


def test_synthetic_refuses_bad_shapes() -> None:
    with pytest.raises(TopologyError, match="at least 1"):
        synthetic(0, 1, 1, 1)
    with pytest.raises(TopologyError, match="multiple of uncore caches"):
        synthetic(1, 1, 6, 2, uncore_per_numa=4)


# -- the topology file --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(kt.KUBELET_TEST_TOPOLOGIES))
def test_file_round_trip(name: str) -> None:
    t = kt.KUBELET_TEST_TOPOLOGIES[name]
    data = encode_topology_file(t)
    back = decode_topology_file(data)
    assert back.cpu_details == t.cpu_details
    assert encode_topology_file(back) == data
    doc = json.loads(data)
    assert list(doc) == ["cpus"]
    assert [c["id"] for c in doc["cpus"]] == sorted(t.cpu_details.cpus())
    assert set(doc["cpus"][0]) == {"id", "core", "socket", "numa", "uncore"}


def _file(*cpus: dict[str, object]) -> bytes:
    return json.dumps({"cpus": list(cpus)}).encode()


def test_file_without_uncore_uses_the_socket() -> None:
    t = decode_topology_file(
        _file(
            {"id": 0, "core": 0, "socket": 0, "numa": 0},
            {"id": 1, "core": 1, "socket": 1, "numa": 1},
        )
    )
    assert [t.cpu_details[c].uncore_cache_id for c in (0, 1)] == [0, 1]
    assert (t.num_cpus, t.num_cores, t.num_sockets, t.num_numa_nodes, t.num_uncore_cache) == (2, 2, 2, 2, 2)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "f: Input data was truncated"),
        (b"[]", "f: Expected `object`, got `array`"),
        (b"{}", "f: Object missing required field `cpus`"),
        (_file(), "f: no CPUs"),
        (_file({"id": 0, "core": "0", "socket": 0, "numa": 0}), "f: Expected `int`, got `str` - at `$.cpus[0].core`"),
        (_file({"id": 0, "core": 0, "socket": -1, "numa": 0}), "f: Expected `int` >= 0 - at `$.cpus[0].socket`"),
        (_file({"id": 0, "core": 0, "socket": 0}), "f: Object missing required field `numa` - at `$.cpus[0]`"),
        (
            _file({"id": 0, "core": 0, "socket": 0, "numa": 0, "node": 0}),
            "f: Object contains unknown field `node` - at `$.cpus[0]`",
        ),
        (
            _file({"id": 0, "core": 0, "socket": 0, "numa": 0}, {"id": 0, "core": 1, "socket": 0, "numa": 0}),
            "f: cpus[1]: CPU 0 is listed twice",
        ),
        (
            _file({"id": 0, "core": 0, "socket": 0, "numa": 0}, {"id": 1, "core": 0, "socket": 1, "numa": 0}),
            "f: cpus[1] (CPU 1): core 0 is in socket 1 here but in socket 0 for CPU 0; core ids must be unique across "
            "the machine",
        ),
        (
            _file(
                {"id": 0, "core": 0, "socket": 0, "numa": 0, "uncore": 0},
                {"id": 1, "core": 0, "socket": 0, "numa": 1, "uncore": 0},
            ),
            "f: cpus[1] (CPU 1): core 0 is in numa 1 here but in numa 0 for CPU 0",
        ),
        (
            _file(
                {"id": 0, "core": 0, "socket": 0, "numa": 0, "uncore": 0}, {"id": 1, "core": 1, "socket": 0, "numa": 0}
            ),
            'f: cpus[1] (CPU 1): "uncore" is missing; give it for every CPU or for none',
        ),
    ],
)
def test_file_errors(data: bytes, message: str) -> None:
    with pytest.raises(TopologyError) as err:
        decode_topology_file(data, "f")
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


# -- sysfs ---------------------------------------------------------------------------------------


def fake_sysfs(
    root: Path,
    cpus: dict[int, tuple[int, int, int | None]],
    nodes: dict[int, str] | None,
    online: str | None = None,
) -> Path:
    """A sysfs tree: ``cpus`` maps CPU -> (core_id, physical_package_id, L3 id or None)."""
    base = root / "sys" / "devices" / "system"
    cpu_root = base / "cpu"
    cpu_root.mkdir(parents=True)
    (cpu_root / "online").write_text((online if online is not None else str(CPUSet(cpus))) + "\n")
    for cpu, (core, package, l3) in cpus.items():
        topo = cpu_root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "core_id").write_text(f"{core}\n")
        (topo / "physical_package_id").write_text(f"{package}\n")
        cache = cpu_root / f"cpu{cpu}" / "cache"
        for index, level in enumerate((1, 1, 2)):  # L1d, L1i, L2: never the uncore cache
            (cache / f"index{index}").mkdir(parents=True)
            (cache / f"index{index}" / "level").write_text(f"{level}\n")
            (cache / f"index{index}" / "id").write_text(f"{core}\n")
        if l3 is not None:
            (cache / "index3").mkdir(parents=True)
            (cache / "index3" / "level").write_text("3\n")
            (cache / "index3" / "id").write_text(f"{l3}\n")
    (cpu_root / "cpufreq").mkdir()  # not a CPU
    if nodes is not None:
        for node, cpulist in nodes.items():
            (base / "node" / f"node{node}").mkdir(parents=True)
            (base / "node" / f"node{node}" / "cpulist").write_text(cpulist + "\n")
        (base / "node" / "power").mkdir()
    return root


def dual_socket_ht(tmp_path: Path) -> Path:
    """topoDualSocketHT as Linux shows it: core_id 0-2 on each socket, threads c and c+6."""
    cpus: dict[int, tuple[int, int, int | None]] = {}
    for cpu in range(12):
        socket = cpu % 2
        cpus[cpu] = ((cpu % 6) // 2, socket, socket)
    return fake_sysfs(tmp_path, cpus, {0: "0,2,4,6,8,10", 1: "1,3,5,7,9,11"})


def test_sysfs_dual_socket_ht(tmp_path: Path) -> None:
    t = discover_topology(dual_socket_ht(tmp_path))
    assert (t.num_cpus, t.num_cores, t.num_sockets, t.num_numa_nodes, t.num_uncore_cache) == (12, 6, 2, 2, 2)
    for cpu, want in kt.topoDualSocketHT.cpu_details.items():
        got = t.cpu_details[cpu]
        assert (got.socket_id, got.numa_node_id, got.core_id) == (want.socket_id, want.numa_node_id, want.core_id)
        assert got.uncore_cache_id == got.socket_id


def test_sysfs_machine_info_is_cadvisor_shaped(tmp_path: Path) -> None:
    m = read_machine_info(dual_socket_ht(tmp_path))
    assert (m.num_cores, m.num_sockets) == (12, 2)
    assert [n.id for n in m.topology] == [0, 1]
    assert m.topology[1].cores[0] == Core(id=0, socket_id=1, threads=(1, 7), uncore_caches=(1,))


def test_sysfs_offline_cpus_and_no_l3(tmp_path: Path) -> None:
    cpus: dict[int, tuple[int, int, int | None]] = {c: (c % 4, 0, None) for c in range(8)}
    t = discover_topology(fake_sysfs(tmp_path, cpus, {0: "0-7"}, online="0-5"))
    assert t.cpu_details.cpus() == parse("0-5")
    assert t.cpu_details.cpus_in_cores(2) == CPUSet([2])  # its sibling 6 is offline
    assert t.cpu_details.cpus_in_cores(0) == CPUSet([0, 4])
    assert (t.num_cpus, t.num_cores, t.num_uncore_cache) == (6, 4, 1)
    assert t.cpu_details.uncore_caches() == CPUSet([0])  # no L3 id: the socket stands in


def test_sysfs_without_numa_nodes_uses_sockets(tmp_path: Path) -> None:
    cpus: dict[int, tuple[int, int, int | None]] = {c: (c % 2, c // 2, 7) for c in range(4)}
    t = discover_topology(fake_sysfs(tmp_path, cpus, None))
    assert t.cpu_details.cpus_in_numa_nodes(1) == CPUSet([2, 3])
    assert t.num_numa_nodes == 2 and t.num_uncore_cache == 1


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda r: None, "is not a directory: no sysfs there"),
        (lambda r: fake_sysfs(r, {0: (0, 0, None)}, {0: "0"}, online="0-1"), "CPU 1 is online"),
        (
            lambda r: fake_sysfs(r, {0: (0, 0, None), 1: (1, 0, None)}, {0: "0"}),
            "online CPUs 1 are in no NUMA node's cpulist",
        ),
        (lambda r: fake_sysfs(r, {0: (0, 0, None)}, {0: "0"}, online="zero"), "online: invalid CPU list 'zero'"),
    ],
)
def test_sysfs_errors(tmp_path: Path, breakage: Callable[[Path], object], message: str) -> None:
    breakage(tmp_path)
    with pytest.raises(SysfsError, match=message.replace("(", r"\(")) as err:
        discover_topology(tmp_path)
    assert "\n" not in str(err.value)


def test_sysfs_missing_and_garbled_files(tmp_path: Path) -> None:
    root = fake_sysfs(tmp_path, {0: (0, 0, None), 1: (1, 0, None)}, {0: "0-1"})
    cpu1 = root / "sys" / "devices" / "system" / "cpu" / "cpu1" / "topology"
    (cpu1 / "core_id").write_text("one\n")
    with pytest.raises(SysfsError, match=r"cpu1/topology/core_id: expected an integer, found 'one'"):
        discover_topology(root)
    (cpu1 / "core_id").unlink()
    with pytest.raises(SysfsError, match=r"cannot read .*cpu1/topology/core_id: no such file"):
        discover_topology(root)


# -- eventsrc cpu topology -----------------------------------------------------------------------


def test_cli_sysfs_table_and_json_round_trip(tmp_path: Path) -> None:
    root = dual_socket_ht(tmp_path / "sysfs")
    table = run_cli("cpu", "topology", "--sysfs-root", str(root), check=True)
    assert table.stdout.splitlines()[0].startswith("CPUs 12  cores 6  sockets 2  NUMA nodes 2")
    assert "     1     1       1      3  1,3,5                     1,3,5,7,9,11" in table.stdout
    captured = run_cli("cpu", "topology", "--sysfs-root", str(root), "-o", "json", check=True).stdout
    assert decode_topology_file(captured) == discover_topology(root)
    capture = tmp_path / "capture.json"
    capture.write_text(captured)
    replayed = run_cli("cpu", "topology", "--topology-file", str(capture), "-o", "json", check=True)
    assert replayed.stdout == captured
    again = run_cli("cpu", "topology", "--topology-file", str(capture), check=True)
    assert again.stdout == table.stdout


def test_cli_example_256(tmp_path: Path) -> None:
    out = run_cli("cpu", "topology", "--topology-file", str(REPO / "examples" / "topology-256.json"), check=True).stdout
    assert out.splitlines()[0] == "CPUs 256  cores 128  sockets 2  NUMA nodes 4  uncore caches 4  CPUs per core 2"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--sysfs-root", "{tmp}/nothing"],
            "{tmp}/nothing/sys/devices/system/cpu is not a directory: no sysfs there (give --sysfs-root or "
            "--topology-file)",
        ),
        (["--topology-file", "{tmp}/missing.json"], "cannot read {tmp}/missing.json: No such file or directory"),
        (["--topology-file", "{tmp}/bad.json"], "{tmp}/bad.json: cpus[1]: CPU 0 is listed twice"),
    ],
)
def test_cli_errors(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "bad.json").write_bytes(
        _file({"id": 0, "core": 0, "socket": 0, "numa": 0}, {"id": 0, "core": 0, "socket": 0, "numa": 0})
    )
    proc = run_cli("cpu", "topology", *(a.format(tmp=tmp_path) for a in args))
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == f"eventsrc: error: {message.format(tmp=tmp_path)}\n"


def test_cli_sources_are_exclusive(tmp_path: Path) -> None:
    proc = run_cli("cpu", "topology", "--sysfs-root", "/", "--topology-file", "x")
    assert proc.returncode == 2
    assert "not allowed with argument" in proc.stderr


def test_cli_this_machine() -> None:
    proc = run_cli("cpu", "topology", "-o", "json", check=True)
    t = decode_topology_file(proc.stdout)
    assert t.num_cpus >= 1
