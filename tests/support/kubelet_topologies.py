"""The kubelet's test topologies, as data, for the ported CPU assignment and policy tests.

Transcribed from kubernetes/kubernetes ``pkg/kubelet/cm/cpumanager/policy_test.go``
(upstream commit 89b74acb) and, for the uncore-cache machines, from copies of the upstream
test topologies (see ``../shared/kubelet-cpu-algorithms.md`` section 10): those and
``topoUncoreSingleSocketNoSMT`` (inferred from the expectations that use it) are lower
confidence. The declared totals are kept exactly, zeros included: most of these leave
NumNUMANodes and NumUncoreCache unset, and the CPU picking reads the declared values.

Each machine is written as rows ``(cpus, socket, numa, uncore)`` plus the rule that gives a
CPU's core id, as the upstream maps list them (for Linux-numbered machines, CPU ``c`` and
``c + cores`` are the two threads of core ``c``). The names keep upstream's spelling.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from eventsrc.core.cpu.cpuset import parse
from eventsrc.core.cpu.topology import CPUDetails, CPUInfo, CPUTopology, synthetic

Row = tuple[str, int, int, int]  # (cpu list, socket, numa node, uncore cache)


def _topo(
    *,
    num_cpus: int,
    num_sockets: int,
    num_cores: int,
    rows: Sequence[Row],
    core_of: Callable[[int], int],
    num_numa_nodes: int = 0,
    num_uncore_cache: int = 0,
) -> CPUTopology:
    details: dict[int, CPUInfo] = {}
    for cpus, socket, numa, uncore in rows:
        for cpu in parse(cpus):
            assert cpu not in details, f"CPU {cpu} listed twice"
            details[cpu] = CPUInfo(numa_node_id=numa, socket_id=socket, core_id=core_of(cpu), uncore_cache_id=uncore)
    assert len(details) == num_cpus, f"{len(details)} CPUs listed, {num_cpus} declared"
    return CPUTopology(
        num_cpus=num_cpus,
        num_cores=num_cores,
        num_sockets=num_sockets,
        num_numa_nodes=num_numa_nodes,
        num_uncore_cache=num_uncore_cache,
        cpu_details=CPUDetails(details),
    )


def _by_core(rows: Sequence[tuple[int, int, str]]) -> tuple[list[Row], dict[int, int]]:
    """Rows written per core ``(core, socket, cpus)`` (NUMA node = socket, uncore 0)."""
    out: list[Row] = []
    core_of: dict[int, int] = {}
    for core, socket, cpus in rows:
        out.append((cpus, socket, socket, 0))
        for cpu in parse(cpus):
            core_of[cpu] = core
    return out, core_of


topoSingleSocketHT = _topo(
    num_cpus=8,
    num_sockets=1,
    num_cores=4,
    rows=[("0-7", 0, 0, 0)],
    core_of=lambda cpu: cpu % 4,
)

topoDualSocketHT = _topo(
    num_cpus=12,
    num_sockets=2,
    num_cores=6,
    rows=[("0,2,4,6,8,10", 0, 0, 0), ("1,3,5,7,9,11", 1, 1, 0)],
    core_of=lambda cpu: cpu % 6,
)

topoDualSocketNoHT = _topo(
    num_cpus=8,
    num_sockets=2,
    num_cores=8,
    rows=[("0-3", 0, 0, 0), ("4-7", 1, 1, 0)],
    core_of=lambda cpu: cpu,
)

# "fake topology for testing purposes only": threads are adjacent, socket 1 comes first.
topoTripleSocketHT = _topo(
    num_cpus=18,
    num_sockets=3,
    num_cores=9,
    rows=[("0-5", 1, 1, 0), ("6-11", 0, 0, 0), ("12-17", 2, 2, 0)],
    core_of=lambda cpu: cpu // 2,
)

# Knights Landing, SNC-4, from hwloc's lstopo picture: 4 sockets of 18 four-way cores,
# with irregular numbering.
_QUAD_ROWS, _QUAD_CORE = _by_core(
    [
        # socket 0
        (0, 0, "0,109,169,229"),
        (1, 0, "50,110,170,230"),
        (64, 0, "1,13,25,38"),
        (65, 0, "2,14,26,39"),
        (72, 0, "9,21,33,46"),
        (73, 0, "10,22,34,47"),
        (8, 0, "57,117,177,237"),
        (9, 0, "58,118,178,238"),
        (24, 0, "71,131,191,251"),
        (25, 0, "72,132,192,252"),
        (32, 0, "79,139,199,259"),
        (33, 0, "80,140,200,260"),
        (40, 0, "87,147,207,267"),
        (41, 0, "88,148,208,268"),
        (48, 0, "95,155,215,275"),
        (49, 0, "96,156,216,276"),
        (56, 0, "103,163,223,283"),
        (57, 0, "104,164,224,284"),
        # socket 1
        (66, 1, "3,15,27,40"),
        (67, 1, "4,16,28,41"),
        (74, 1, "11,23,35,48"),
        (75, 1, "12,24,36,49"),
        (2, 1, "51,111,171,231"),
        (3, 1, "52,112,172,232"),
        (10, 1, "59,119,179,239"),
        (11, 1, "60,120,180,240"),
        (18, 1, "65,125,185,245"),
        (19, 1, "66,126,186,246"),
        (26, 1, "73,133,193,253"),
        (27, 1, "74,134,194,254"),
        (34, 1, "81,141,201,261"),
        (35, 1, "82,142,202,262"),
        (42, 1, "89,149,209,269"),
        (43, 1, "90,150,210,270"),
        (50, 1, "97,157,217,277"),
        (51, 1, "98,158,218,278"),
        # socket 2
        (68, 2, "5,17,29,42"),
        (69, 2, "6,18,30,43"),
        (4, 2, "53,113,173,233"),
        (5, 2, "54,114,174,234"),
        (12, 2, "61,121,181,241"),
        (13, 2, "62,122,182,242"),
        (20, 2, "67,127,187,247"),
        (21, 2, "68,128,188,248"),
        (28, 2, "75,135,195,255"),
        (29, 2, "76,136,196,256"),
        (36, 2, "83,143,203,263"),
        (37, 2, "84,144,204,264"),
        (44, 2, "91,151,211,271"),
        (45, 2, "92,152,212,272"),
        (52, 2, "99,159,219,279"),
        (53, 2, "100,160,220,280"),
        (60, 2, "105,165,225,285"),
        (61, 2, "106,166,226,286"),
        # socket 3
        (70, 3, "7,19,31,44"),
        (71, 3, "8,20,32,45"),
        (63, 3, "37,108,168,228"),
        (62, 3, "107,167,227,287"),
        (6, 3, "55,115,175,235"),
        (7, 3, "56,116,176,236"),
        (14, 3, "63,123,183,243"),
        (15, 3, "64,124,184,244"),
        (22, 3, "69,129,189,249"),
        (23, 3, "70,130,190,250"),
        (30, 3, "77,137,197,257"),
        (31, 3, "78,138,198,258"),
        (38, 3, "85,145,205,265"),
        (39, 3, "86,146,206,266"),
        (46, 3, "93,153,213,273"),
        (47, 3, "94,154,214,274"),
        (54, 3, "101,161,221,281"),
        (55, 3, "102,162,222,282"),
    ]
)
topoQuadSocketFourWayHT = _topo(
    num_cpus=288,
    num_sockets=4,
    num_cores=72,
    rows=_QUAD_ROWS,
    core_of=_QUAD_CORE.__getitem__,
)

# Dual Xeon Gold 6230 (lscpu: NUMA node0 0-9,40-49; node1 10-19,50-59; node2 20-29,60-69;
# node3 30-39,70-79).
topoDualSocketMultiNumaPerSocketHT = _topo(
    num_cpus=80,
    num_sockets=2,
    num_cores=40,
    num_numa_nodes=4,
    rows=[("0-9,40-49", 0, 0, 0), ("10-19,50-59", 0, 1, 0), ("20-29,60-69", 1, 2, 0), ("30-39,70-79", 1, 3, 0)],
    core_of=lambda cpu: cpu % 40,
)

# The same machine with NUMA cells and sockets flipped (two sockets per NUMA node).
fakeTopoMultiSocketDualSocketPerNumaHT = _topo(
    num_cpus=80,
    num_sockets=4,
    num_cores=40,
    num_numa_nodes=2,
    rows=[("0-9,40-49", 0, 0, 0), ("10-19,50-59", 1, 0, 0), ("20-29,60-69", 2, 1, 0), ("30-39,70-79", 3, 1, 0)],
    core_of=lambda cpu: cpu % 40,
)

# Dual AMD EPYC 7742, NPS=4: 8 NUMA nodes of 16 cores.
topoDualSocketMultiNumaPerSocketHTLarge = _topo(
    num_cpus=256,
    num_sockets=2,
    num_cores=128,
    num_numa_nodes=8,
    rows=[(f"{16 * n}-{16 * n + 15},{128 + 16 * n}-{128 + 16 * n + 15}", n // 4, n, 0) for n in range(8)],
    core_of=lambda cpu: cpu % 128,
)

# Uncore-cache machines (lower confidence, see the module docstring).
topoUncoreSingleSocketMultiNuma = _topo(
    num_cpus=16,
    num_sockets=1,
    num_cores=16,
    num_numa_nodes=2,
    num_uncore_cache=4,
    rows=[("0-3", 0, 0, 0), ("4-7", 0, 0, 1), ("8-11", 0, 1, 2), ("12-15", 0, 1, 3)],
    core_of=lambda cpu: cpu,
)

topoUncoreDualSocketNoSMT = _topo(
    num_cpus=16,
    num_sockets=2,
    num_cores=16,
    num_numa_nodes=2,
    num_uncore_cache=4,
    rows=[("0-3", 0, 0, 0), ("4-7", 0, 0, 1), ("8-11", 1, 1, 2), ("12-15", 1, 1, 3)],
    core_of=lambda cpu: cpu,
)

topoUncoreSingleSocketSMT = _topo(
    num_cpus=16,
    num_sockets=1,
    num_cores=8,
    num_numa_nodes=1,
    num_uncore_cache=2,
    rows=[("0-3,8-11", 0, 0, 0), ("4-7,12-15", 0, 0, 1)],
    core_of=lambda cpu: cpu % 8,
)

# Inferred: no stored copy defines it.
topoUncoreSingleSocketNoSMT = _topo(
    num_cpus=16,
    num_sockets=1,
    num_cores=16,
    num_numa_nodes=1,
    num_uncore_cache=4,
    rows=[("0-3", 0, 0, 0), ("4-7", 0, 0, 1), ("8-11", 0, 0, 2), ("12-15", 0, 0, 3)],
    core_of=lambda cpu: cpu,
)

# A large server, where picking CPUs costs the most (examples/topology-256.json): 2 sockets,
# 4 NUMA nodes, 64 cores per socket, 2 threads per core, one uncore cache per NUMA node.
SIMULATED_256 = synthetic(sockets=2, numa_per_socket=2, cores_per_numa=32, threads_per_core=2)

KUBELET_TEST_TOPOLOGIES: dict[str, CPUTopology] = {
    "topoSingleSocketHT": topoSingleSocketHT,
    "topoDualSocketHT": topoDualSocketHT,
    "topoDualSocketNoHT": topoDualSocketNoHT,
    "topoTripleSocketHT": topoTripleSocketHT,
    "topoQuadSocketFourWayHT": topoQuadSocketFourWayHT,
    "topoDualSocketMultiNumaPerSocketHT": topoDualSocketMultiNumaPerSocketHT,
    "fakeTopoMultiSocketDualSocketPerNumaHT": fakeTopoMultiSocketDualSocketPerNumaHT,
    "topoDualSocketMultiNumaPerSocketHTLarge": topoDualSocketMultiNumaPerSocketHTLarge,
    "topoUncoreSingleSocketMultiNuma": topoUncoreSingleSocketMultiNuma,
    "topoUncoreDualSocketNoSMT": topoUncoreDualSocketNoSMT,
    "topoUncoreSingleSocketSMT": topoUncoreSingleSocketSMT,
    "topoUncoreSingleSocketNoSMT": topoUncoreSingleSocketNoSMT,
}
