"""The kubelet's own CPU assignment table tests, run against the port.

Transcribed from kubernetes/kubernetes ``pkg/kubelet/cm/cpumanager/cpu_assignment_test.go``
(upstream b0d609f0 for the accumulator, packed and distributed tables; the master-based copy
that adds the uncore-cache and distribute-cpus-across-cores tables). The tables are data, at
the top; the tests below only drive them. Topologies are named as in the Go tests
(``policy_test.go``) and come from ``tests.support.kubelet_topologies``.

Each take case is ``(description, topology, available, count, expected, error)``: ``expected``
is a CPU list (a Go ``cpuset.New(...)`` of several ids is written as a list string), ``error``
the kubelet's message or ``""``. Options go in a dict of kubelet option names.
"""

from __future__ import annotations

from typing import Any

import pytest

from eventsrc.core.cpu.assignment import (
    PACKED,
    SPREAD,
    CPUAccumulator,
    PolicyOptionError,
    StaticPolicyOptions,
    TakeError,
    parse_policy_options,
    take_by_topology,
    take_by_topology_numa_distributed,
    take_by_topology_numa_packed,
    validate_static_policy_options,
)
from eventsrc.core.cpu.cpuset import CPUSet, parse
from eventsrc.core.cpu.topology import encode_topology_file
from tests.conftest import run_cli
from tests.support import kubelet_topologies as topologies

# --------------------------------------------------------------------------- tables

# TestCPUAccumulatorFreeSockets: (description, topology, available, expected sockets sorted)
FREE_SOCKETS = [
    ("single socket HT, 1 socket free", "topoSingleSocketHT", "0-7", [0]),
    ("single socket HT, 0 sockets free", "topoSingleSocketHT", "1-7", []),
    ("dual socket HT, 2 sockets free", "topoDualSocketHT", "0-11", [0, 1]),
    ("dual socket HT, 1 socket free", "topoDualSocketHT", "0-9,11", [1]),
    ("dual socket HT, 0 sockets free", "topoDualSocketHT", "0,2-9,11", []),
    ("dual socket, multi numa per socket, HT, 2 sockets free", "topoDualSocketMultiNumaPerSocketHT", "0-79", [0, 1]),
    ("dual socket, multi numa per socket, HT, 1 sockets free", "topoDualSocketMultiNumaPerSocketHT", "1-79", [1]),
    ("dual socket, multi numa per socket, HT, 0 sockets free", "topoDualSocketMultiNumaPerSocketHT", "1-78", []),
    (
        "dual numa, multi socket per per socket, HT, 4 sockets free",
        "fakeTopoMultiSocketDualSocketPerNumaHT",
        "0-79",
        [0, 1, 2, 3],
    ),
    (
        "dual numa, multi socket per per socket, HT, 3 sockets free",
        "fakeTopoMultiSocketDualSocketPerNumaHT",
        "0-19,21-79",
        [0, 1, 3],
    ),
    (
        "dual numa, multi socket per per socket, HT, 2 sockets free",
        "fakeTopoMultiSocketDualSocketPerNumaHT",
        "0-59,61-78",
        [0, 1],
    ),
    (
        "dual numa, multi socket per per socket, HT, 1 sockets free",
        "fakeTopoMultiSocketDualSocketPerNumaHT",
        "1-19,21-38,41-60,61-78",
        [1],
    ),
    (
        "dual numa, multi socket per per socket, HT, 0 sockets free",
        "fakeTopoMultiSocketDualSocketPerNumaHT",
        "0-40,42-49,51-68,71-79",
        [],
    ),
]

# TestCPUAccumulatorFreeNUMANodes: (description, topology, available, expected NUMA nodes in order)
FREE_NUMA_NODES = [
    ("single socket HT, 1 NUMA node free", "topoSingleSocketHT", "0-7", [0]),
    ("single socket HT, 0 NUMA Node free", "topoSingleSocketHT", "1-7", []),
    ("dual socket HT, 2 NUMA Node free", "topoDualSocketHT", "0-11", [0, 1]),
    ("dual socket HT, 1 NUMA Node free", "topoDualSocketHT", "0-9,11", [1]),
    ("dual socket HT, 0 NUMA node free", "topoDualSocketHT", "0,2-9,11", []),
    (
        "dual socket, multi numa per socket, HT, 4 NUMA Node free",
        "topoDualSocketMultiNumaPerSocketHT",
        "0-79",
        [0, 1, 2, 3],
    ),
    (
        "dual socket, multi numa per socket, HT, 3 NUMA node free",
        "topoDualSocketMultiNumaPerSocketHT",
        "1-79",
        [1, 2, 3],
    ),
    (
        "dual socket, multi numa per socket, HT, 2 NUMA node free",
        "topoDualSocketMultiNumaPerSocketHT",
        "1-9,11-79",
        [2, 3],
    ),
    (
        "dual socket, multi numa per socket, HT, 1 NUMA node free",
        "topoDualSocketMultiNumaPerSocketHT",
        "1-9,11-59,61-79",
        [3],
    ),
    (
        "dual socket, multi numa per socket, HT, 0 NUMA node free",
        "topoDualSocketMultiNumaPerSocketHT",
        "1-9,11-59,61-78",
        [],
    ),
    (
        "dual numa, multi socket per per socket, HT, 2 NUMA node free",
        "fakeTopoMultiSocketDualSocketPerNumaHT",
        "0-79",
        [0, 1],
    ),
    (
        "dual numa, multi socket per per socket, HT, 1 NUMA node free",
        "fakeTopoMultiSocketDualSocketPerNumaHT",
        "0-9,11-79",
        [1],
    ),
    (
        "dual numa, multi socket per per socket, HT, 0 sockets free",
        "fakeTopoMultiSocketDualSocketPerNumaHT",
        "0-9,11-59,61-79",
        [],
    ),
]

# TestCPUAccumulatorFreeSocketsAndNUMANodes: (description, topology, available, sockets, NUMA nodes)
FREE_SOCKETS_AND_NUMA_NODES = [
    (
        "dual socket, multi numa per socket, HT, 2 Socket/4 NUMA Node free",
        "topoDualSocketMultiNumaPerSocketHT",
        "0-79",
        [0, 1],
        [0, 1, 2, 3],
    ),
    (
        "dual socket, multi numa per socket, HT, 1 Socket/3 NUMA node free",
        "topoDualSocketMultiNumaPerSocketHT",
        "1-79",
        [1],
        [1, 2, 3],
    ),
    (
        "dual socket, multi numa per socket, HT, 1 Socket/ 2 NUMA node free",
        "topoDualSocketMultiNumaPerSocketHT",
        "1-9,11-79",
        [1],
        [2, 3],
    ),
    (
        "dual socket, multi numa per socket, HT, 0 Socket/ 2 NUMA node free",
        "topoDualSocketMultiNumaPerSocketHT",
        "1-59,61-79",
        [],
        [1, 3],
    ),
]

# TestCPUAccumulatorFreeCores: (description, topology, available, expected cores in order)
FREE_CORES = [
    ("single socket HT, 4 cores free", "topoSingleSocketHT", "0-7", [0, 1, 2, 3]),
    ("single socket HT, 3 cores free", "topoSingleSocketHT", "0,1,2,4,5,6", [0, 1, 2]),
    ("single socket HT, 3 cores free (1 partially consumed)", "topoSingleSocketHT", "0-6", [0, 1, 2]),
    ("single socket HT, 0 cores free", "topoSingleSocketHT", "", []),
    ("single socket HT, 0 cores free (4 partially consumed)", "topoSingleSocketHT", "0-3", []),
    ("dual socket HT, 6 cores free", "topoDualSocketHT", "0-11", [0, 2, 4, 1, 3, 5]),
    ("dual socket HT, 5 cores free (1 consumed from socket 0)", "topoDualSocketHT", "1-5,7-11", [2, 4, 1, 3, 5]),
    ("dual socket HT, 4 cores free (1 consumed from each socket)", "topoDualSocketHT", "2-5,8-11", [2, 4, 3, 5]),
]

# TestCPUAccumulatorFreeCPUs: (description, topology, available, expected CPUs in order)
FREE_CPUS = [
    ("single socket HT, 8 cpus free", "topoSingleSocketHT", "0-7", [0, 4, 1, 5, 2, 6, 3, 7]),
    ("single socket HT, 5 cpus free", "topoSingleSocketHT", "3-7", [4, 5, 6, 3, 7]),
    ("dual socket HT, 12 cpus free", "topoDualSocketHT", "0-11", [0, 6, 2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    ("dual socket HT, 11 cpus free", "topoDualSocketHT", "1-11", [6, 2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    ("dual socket HT, 10 cpus free", "topoDualSocketHT", "1-5,7-11", [2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    ("triple socket HT, 12 cpus free", "topoTripleSocketHT", "0-3,6-13", [12, 13, 0, 1, 2, 3, 6, 7, 8, 9, 10, 11]),
]

# TestCPUAccumulatorTake: (description, topology, available, takes, count, satisfied, failed)
ACCUMULATOR_TAKE = [
    ("take 0 cpus from a single socket HT, require 1", "topoSingleSocketHT", "0-7", [""], 1, False, False),
    ("take 0 cpus from a single socket HT, require 1, none available", "topoSingleSocketHT", "", [""], 1, False, True),
    ("take 1 cpu from a single socket HT, require 1", "topoSingleSocketHT", "0-7", ["0"], 1, True, False),
    ("take 1 cpu from a single socket HT, require 2", "topoSingleSocketHT", "0-7", ["0"], 2, False, False),
    (
        "take 2 cpu from a single socket HT, require 4, expect failed",
        "topoSingleSocketHT",
        "0-2",
        ["0", "1"],
        4,
        False,
        True,
    ),
    (
        "take all cpus one at a time from a single socket HT, require 8",
        "topoSingleSocketHT",
        "0-7",
        ["0", "1", "2", "3", "4", "5", "6", "7"],
        8,
        True,
        False,
    ),
]

# commonTakeByTopologyTestCases: (description, topology, available, count, expected, error)
COMMON_TAKE = [
    (
        "take more cpus than are available from single socket with HT",
        "topoSingleSocketHT",
        "0,2,4,6",
        5,
        "",
        "not enough cpus available to satisfy request: requested=5, available=4",
    ),
    ("take zero cpus from single socket with HT", "topoSingleSocketHT", "0-7", 0, "", ""),
    ("take one cpu from single socket with HT", "topoSingleSocketHT", "0-7", 1, "0", ""),
    ("take one cpu from single socket with HT, some cpus are taken", "topoSingleSocketHT", "1,3,5,6,7", 1, "6", ""),
    ("take two cpus from single socket with HT", "topoSingleSocketHT", "0-7", 2, "0,4", ""),
    ("take all cpus from single socket with HT", "topoSingleSocketHT", "0-7", 8, "0-7", ""),
    (
        "take two cpus from single socket with HT, only one core totally free",
        "topoSingleSocketHT",
        "0,1,2,3,6",
        2,
        "2,6",
        "",
    ),
    ("take a socket of cpus from dual socket with HT", "topoDualSocketHT", "0-11", 6, "0,2,4,6,8,10", ""),
    (
        "take a socket of cpus from dual socket with multi-numa-per-socket with HT",
        "topoDualSocketMultiNumaPerSocketHT",
        "0-79",
        40,
        "0-19,40-59",
        "",
    ),
    (
        "take a NUMA node of cpus from dual socket with multi-numa-per-socket with HT",
        "topoDualSocketMultiNumaPerSocketHT",
        "0-79",
        20,
        "0-9,40-49",
        "",
    ),
    (
        "take a NUMA node of cpus from dual socket with multi-numa-per-socket with HT, with 1 NUMA node already taken",
        "topoDualSocketMultiNumaPerSocketHT",
        "10-39,50-79",
        20,
        "10-19,50-59",
        "",
    ),
    (
        "take a socket and a NUMA node of cpus from dual socket with multi-numa-per-socket with HT",
        "topoDualSocketMultiNumaPerSocketHT",
        "0-79",
        60,
        "0-29,40-69",
        "",
    ),
    (
        "take a socket and a NUMA node of cpus from dual socket with multi-numa-per-socket with HT, a core taken",
        "topoDualSocketMultiNumaPerSocketHT",
        "1-39,41-79",
        60,
        "10-39,50-79",
        "",
    ),
]

_UNCORE = {"prefer-align-cpus-by-uncorecache": "true"}

# TestTakeByTopologyNUMAPacked (after the common cases):
# (description, topology, options, available, count, expected, error)
PACKED_TAKE = [
    ("take one cpu from dual socket with HT - core from Socket 0", "topoDualSocketHT", {}, "1-5,7-11", 1, "2", ""),
    (
        "allocate 4 full cores with 3 coming from the first NUMA node (filling it up) and 1 coming from the second "
        "NUMA node",
        "topoDualSocketHT",
        {},
        "0-11",
        8,
        "0,6,2,8,4,10,1,7",
        "",
    ),
    (
        "allocate 32 full cores with 30 coming from the first 3 NUMA nodes (filling them up) and 2 coming from the "
        "fourth NUMA node",
        "topoDualSocketMultiNumaPerSocketHT",
        {},
        "0-79",
        64,
        "0-29,40-69,30,31,70,71",
        "",
    ),
    # PreferAlignByUncoreCache
    (
        "take cpus from two full UncoreCaches and partial from a single UncoreCache",
        "topoUncoreSingleSocketNoSMT",
        _UNCORE,
        "1-15",
        10,
        "1,2,4,5,6,7,8,9,10,11",
        "",
    ),
    (
        "take one cpu from dual socket with HT - core from Socket 0 (uncore)",
        "topoDualSocketHT",
        _UNCORE,
        "1-5,7-11",
        1,
        "1",
        "",
    ),
    (
        "take first available UncoreCache from first socket",
        "topoUncoreDualSocketNoSMT",
        _UNCORE,
        "0-15",
        4,
        "0,1,2,3",
        "",
    ),
    (
        "take all available UncoreCache from first socket",
        "topoUncoreDualSocketNoSMT",
        _UNCORE,
        "2-15",
        6,
        "2,3,4,5,6,7",
        "",
    ),
    (
        "take first available UncoreCache from second socket",
        "topoUncoreDualSocketNoSMT",
        _UNCORE,
        "8-15",
        4,
        "8,9,10,11",
        "",
    ),
    (
        "take first available UncoreCache from available NUMA",
        "topoUncoreSingleSocketMultiNuma",
        _UNCORE,
        "3,4-8,12",
        2,
        "4,5",
        "",
    ),
    (
        "take cpus from best available UncoreCache group of multi uncore cache single socket - SMT enabled",
        "topoUncoreSingleSocketSMT",
        _UNCORE,
        "2-3,10-11,4-7,12-15",
        6,
        "4,5,6,12,13,14",
        "",
    ),
    (
        "take cpus from multiple UncoreCache of single socket - SMT enabled",
        "topoUncoreSingleSocketSMT",
        _UNCORE,
        "1-7,9-15",
        10,
        "4-7,12-15,1,9",
        "",
    ),
]

_SPREAD = {"distribute-cpus-across-cores": "true"}

# TestTakeByTopologyWithSpreadPhysicalCPUsPreferredOption:
# (description, topology, options, available, count, expected, error)
SPREAD_TAKE = [
    ("take a socket of cpus from single socket with HT, 3 cpus", "topoSingleSocketHT", _SPREAD, "0-7", 3, "0,1,2", ""),
    ("take a socket of cpus from dual socket with HT, 2 cpus", "topoDualSocketHT", _SPREAD, "0-11", 2, "0,2", ""),
    ("take a socket of cpus from dual socket with HT, 3 cpus", "topoDualSocketHT", _SPREAD, "0-11", 3, "0,2,4", ""),
    (
        "take a socket of cpus from dual socket with HT, 6 cpus",
        "topoDualSocketHT",
        _SPREAD,
        "0-11",
        6,
        "0,2,4,6,8,10",
        "",
    ),
    ("take cpus from dual socket with HT, 8 cpus", "topoDualSocketHT", _SPREAD, "0-11", 8, "0,2,4,6,8,10,1,3", ""),
    ("take a socket of cpus from dual socket without HT, 2 cpus", "topoDualSocketNoHT", _SPREAD, "0-7", 2, "0,1", ""),
    (
        "take a socket of cpus from dual socket with multi numa per socket and HT, 12 cpus",
        "topoDualSocketMultiNumaPerSocketHT",
        _SPREAD,
        "0-79",
        8,
        "0-7",
        "",
    ),
    (
        "take a socket of cpus from quad socket four way with HT, 12 cpus",
        "topoQuadSocketFourWayHT",
        _SPREAD,
        "0-287",
        12,
        "0-2,9-10,13-14,21-22,25-26,33",
        "",
    ),
]

# commonTakeByTopologyExtendedTestCases (after the common cases, with cpuGroupSize 1):
# (description, topology, available, count, group size, expected, error)
EXTENDED_TAKE = [
    (
        "allocate 4 full cores with 2 distributed across each NUMA node",
        "topoDualSocketHT",
        "0-11",
        8,
        1,
        "0,6,2,8,1,7,3,9",
        "",
    ),
    (
        "allocate 32 full cores with 8 distributed across each NUMA node",
        "topoDualSocketMultiNumaPerSocketHT",
        "0-79",
        64,
        1,
        "0-7,10-17,20-27,30-37,40-47,50-57,60-67,70-77",
        "",
    ),
    (
        "allocate 24 full cores with 8 distributed across the first 3 NUMA nodes",
        "topoDualSocketMultiNumaPerSocketHT",
        "0-79",
        48,
        1,
        "0-7,10-17,20-27,40-47,50-57,60-67",
        "",
    ),
    (
        "allocate 24 full cores with 8 distributed across the first 3 NUMA nodes (taking all but 2 from the first "
        "NUMA node)",
        "topoDualSocketMultiNumaPerSocketHT",
        "1-29,32-39,41-69,72-79",
        48,
        1,
        "1-8,10-17,20-27,41-48,50-57,60-67",
        "",
    ),
    (
        "allocate 24 full cores with 8 distributed across the last 3 NUMA nodes (even though all 8 could be allocated "
        "from the first NUMA node)",
        "topoDualSocketMultiNumaPerSocketHT",
        "2-29,31-39,42-69,71-79",
        48,
        1,
        "10-17,20-27,31-38,50-57,60-67,71-78",
        "",
    ),
    (
        "allocate 8 full cores with 2 distributed across each NUMA node",
        "topoDualSocketMultiNumaPerSocketHT",
        "0-2,10-12,20-22,30-32,40-41,50-51,60-61,70-71",
        16,
        1,
        "0-1,10-11,20-21,30-31,40-41,50-51,60-61,70-71",
        "",
    ),
    (
        "allocate 8 full cores with 2 distributed across each NUMA node (repeated upstream)",
        "topoDualSocketMultiNumaPerSocketHT",
        "0-2,10-12,20-22,30-32,40-41,50-51,60-61,70-71",
        16,
        1,
        "0-1,10-11,20-21,30-31,40-41,50-51,60-61,70-71",
        "",
    ),
]

# TestTakeByTopologyNUMADistributed (after the extended cases):
# (description, topology, available, count, group size, expected, error)
DISTRIBUTED_TAKE = [
    ("take one cpu from dual socket with HT - core from Socket 0", "topoDualSocketHT", "1-5,7-11", 1, 1, "1", ""),
    (
        "take one cpu from dual socket with HT - core from Socket 0 - cpuGroupSize 2",
        "topoDualSocketHT",
        "1-5,7-11",
        1,
        2,
        "2",
        "",
    ),
    (
        "allocate 13 full cores distributed across the first 2 NUMA nodes",
        "topoDualSocketMultiNumaPerSocketHT",
        "0-79",
        26,
        1,
        "0-6,10-16,40-45,50-55",
        "",
    ),
    (
        "allocate 13 full cores distributed across the first 2 NUMA nodes (cpuGroupSize 2)",
        "topoDualSocketMultiNumaPerSocketHT",
        "0-79",
        26,
        2,
        "0-6,10-15,40-46,50-55",
        "",
    ),
    (
        "allocate 31 full cores with 15 CPUs distributed across each NUMA node and 1 CPU spilling over to each of "
        "NUMA 0, 1",
        "topoDualSocketMultiNumaPerSocketHT",
        "0-79",
        62,
        1,
        "0-7,10-17,20-27,30-37,40-47,50-57,60-66,70-76",
        "",
    ),
    (
        "allocate 31 full cores with 14 CPUs distributed across each NUMA node and 2 CPUs spilling over to each of "
        "NUMA 0, 1, 2 (cpuGroupSize 2)",
        "topoDualSocketMultiNumaPerSocketHT",
        "0-79",
        62,
        2,
        "0-7,10-17,20-27,30-36,40-47,50-57,60-67,70-76",
        "",
    ),
    (
        "allocate 31 full cores with 15 CPUs distributed across each NUMA node and 1 CPU spilling over to each of "
        "NUMA 2, 3 (to keep balance)",
        "topoDualSocketMultiNumaPerSocketHT",
        "0-8,10-18,20-39,40-48,50-58,60-79",
        62,
        1,
        "0-7,10-17,20-27,30-37,40-46,50-56,60-67,70-77",
        "",
    ),
    (
        "allocate 31 full cores with 14 CPUs distributed across each NUMA node and 2 CPUs spilling over to each of "
        "NUMA 0, 2, 3 (to keep balance with cpuGroupSize 2)",
        "topoDualSocketMultiNumaPerSocketHT",
        "0-8,10-18,20-39,40-48,50-58,60-79",
        62,
        2,
        "0-7,10-16,20-27,30-37,40-47,50-56,60-67,70-77",
        "",
    ),
    (
        "ensure bestRemainder chosen with NUMA nodes that have enough CPUs to satisfy the request",
        "topoDualSocketMultiNumaPerSocketHT",
        "0-3,10-13,20-23,30-36,40-43,50-53,60-63,70-76",
        34,
        1,
        "0-3,10-13,20-23,30-34,40-43,50-53,60-63,70-74",
        "",
    ),
    (
        "ensure previous failure encountered on live machine has been fixed (1/1)",
        "topoDualSocketMultiNumaPerSocketHTLarge",
        "0,128,30,31,158,159,43-47,171-175,62,63,190,191,75-79,203-207,94,96,222,223,101-111,229-239,126,127,254,255",
        28,
        1,
        "43-47,75-79,96,101-105,171-174,203-206,229-232",
        "",
    ),
]

# NewStaticPolicyOptions (policy_options.go): (options, alpha gate, beta gate, error or "")
POLICY_OPTIONS = [
    ({}, False, True, ""),
    ({"full-pcpus-only": "true"}, False, False, ""),
    ({"full-pcpus-only": "t"}, False, True, ""),
    (
        {"full-pcpus-only": "yes"},
        False,
        True,
        'bad value for option "full-pcpus-only": strconv.ParseBool: parsing "yes": invalid syntax',
    ),
    ({"no-such-option": "true"}, True, True, 'unknown CPU Manager Policy option: "no-such-option"'),
    (
        {"align-by-socket": "true"},
        False,
        True,
        'CPU Manager Policy Alpha-level Options not enabled, but option "align-by-socket" provided',
    ),
    (
        {"distribute-cpus-across-numa": "true"},
        False,
        False,
        'CPU Manager Policy Beta-level Options not enabled, but option "distribute-cpus-across-numa" provided',
    ),
    (
        {"full-pcpus-only": "true", "distribute-cpus-across-cores": "true"},
        True,
        True,
        "static policy options full-pcpus-only and distribute-cpus-across-cores can not be used at the same time",
    ),
    (
        {"distribute-cpus-across-numa": "true", "distribute-cpus-across-cores": "true"},
        True,
        True,
        "static policy options distribute-cpus-across-numa and distribute-cpus-across-cores can not be used at the "
        "same time",
    ),
    (
        {"prefer-align-cpus-by-uncorecache": "true", "distribute-cpus-across-cores": "true"},
        True,
        True,
        "static policy options prefer-align-cpus-by-uncorecache and distribute-cpus-across-cores can not be used at "
        "the same time",
    ),
    (
        {"prefer-align-cpus-by-uncorecache": "true", "distribute-cpus-across-numa": "true"},
        True,
        True,
        "static policy options prefer-align-cpus-by-uncorecache and distribute-cpus-across-numa can not be used at "
        "the same time",
    ),
    ({"full-pcpus-only": "true", "distribute-cpus-across-cores": "false"}, True, True, ""),
    ({"full-pcpus-only": "1", "distribute-cpus-across-numa": "1", "strict-cpu-reservation": "True"}, False, True, ""),
]


# --------------------------------------------------------------------------- helpers


def topo(name: str) -> Any:
    return topologies.KUBELET_TEST_TOPOLOGIES[name]


def cpus(text: str) -> CPUSet:
    return parse(text)


def _ids(cases: list[tuple[Any, ...]]) -> list[str]:
    return [c[0] for c in cases]


def _check(run: Any, expected: str, error: str) -> None:
    # The kubelet tests compare the result with ``expResult`` (the empty set on an error) and
    # the error text when one is expected.
    try:
        got = run()
    except TakeError as e:
        assert error, f"unexpected error: {e}"
        assert str(e) == error
        assert expected == ""
        return
    assert not error, f"expected error {error!r}, got {got}"
    assert got == cpus(expected), f"got {got}, expected {cpus(expected)}"


# --------------------------------------------------------------------------- accumulator


@pytest.mark.parametrize(("desc", "name", "available", "expect"), FREE_SOCKETS, ids=_ids(FREE_SOCKETS))
def test_accumulator_free_sockets(desc: str, name: str, available: str, expect: list[int]) -> None:
    acc = CPUAccumulator.new(topo(name), cpus(available), 0, PACKED)
    assert sorted(acc.free_sockets()) == expect


@pytest.mark.parametrize(("desc", "name", "available", "expect"), FREE_NUMA_NODES, ids=_ids(FREE_NUMA_NODES))
def test_accumulator_free_numa_nodes(desc: str, name: str, available: str, expect: list[int]) -> None:
    acc = CPUAccumulator.new(topo(name), cpus(available), 0, PACKED)
    assert acc.free_numa_nodes() == expect


@pytest.mark.parametrize(
    ("desc", "name", "available", "sockets", "numas"),
    FREE_SOCKETS_AND_NUMA_NODES,
    ids=_ids(FREE_SOCKETS_AND_NUMA_NODES),
)
def test_accumulator_free_sockets_and_numa_nodes(
    desc: str, name: str, available: str, sockets: list[int], numas: list[int]
) -> None:
    acc = CPUAccumulator.new(topo(name), cpus(available), 0, PACKED)
    assert acc.free_numa_nodes() == numas
    assert acc.free_sockets() == sockets


@pytest.mark.parametrize(("desc", "name", "available", "expect"), FREE_CORES, ids=_ids(FREE_CORES))
def test_accumulator_free_cores(desc: str, name: str, available: str, expect: list[int]) -> None:
    acc = CPUAccumulator.new(topo(name), cpus(available), 0, PACKED)
    assert acc.free_cores() == expect


@pytest.mark.parametrize(("desc", "name", "available", "expect"), FREE_CPUS, ids=_ids(FREE_CPUS))
def test_accumulator_free_cpus(desc: str, name: str, available: str, expect: list[int]) -> None:
    acc = CPUAccumulator.new(topo(name), cpus(available), 0, PACKED)
    assert acc.free_cpus() == expect


@pytest.mark.parametrize(
    ("desc", "name", "available", "takes", "count", "satisfied", "failed"), ACCUMULATOR_TAKE, ids=_ids(ACCUMULATOR_TAKE)
)
def test_accumulator_take(
    desc: str, name: str, available: str, takes: list[str], count: int, satisfied: bool, failed: bool
) -> None:
    acc = CPUAccumulator.new(topo(name), cpus(available), count, PACKED)
    taken = 0
    for t in takes:
        mask = sum(1 << c for c in cpus(t))
        acc.take(mask)
        taken += len(cpus(t))
    assert acc.is_satisfied() is satisfied
    assert acc.is_failed() is failed
    for t in takes:
        mask = sum(1 << c for c in cpus(t))
        assert mask & acc.free == 0
        assert mask & ~acc.result == 0
    assert acc.need == count - taken


# --------------------------------------------------------------------------- packed


_PACKED_ALL = [(d, n, {}, a, c, e, err) for d, n, a, c, e, err in COMMON_TAKE] + PACKED_TAKE


@pytest.mark.parametrize(
    ("desc", "name", "options", "available", "count", "expected", "error"), _PACKED_ALL, ids=_ids(_PACKED_ALL)
)
def test_take_by_topology_numa_packed(
    desc: str, name: str, options: dict[str, str], available: str, count: int, expected: str, error: str
) -> None:
    opts = parse_policy_options(options, alpha_enabled=True)
    t = topo(name)
    _check(
        lambda: take_by_topology_numa_packed(
            t, cpus(available), count, opts.sorting_strategy, opts.prefer_align_cpus_by_uncorecache
        ),
        expected,
        error,
    )
    # the static policy's wrapper makes the same choice for these options
    _check(lambda: take_by_topology(t, cpus(available), count, opts), expected, error)


@pytest.mark.parametrize(
    ("desc", "name", "options", "available", "count", "expected", "error"), SPREAD_TAKE, ids=_ids(SPREAD_TAKE)
)
def test_take_by_topology_with_spread_physical_cpus_preferred_option(
    desc: str, name: str, options: dict[str, str], available: str, count: int, expected: str, error: str
) -> None:
    opts = parse_policy_options(options, alpha_enabled=True)
    assert opts.sorting_strategy == SPREAD
    t = topo(name)
    _check(lambda: take_by_topology_numa_packed(t, cpus(available), count, SPREAD, False), expected, error)
    _check(lambda: take_by_topology(t, cpus(available), count, opts), expected, error)


# --------------------------------------------------------------------------- distributed


_DISTRIBUTED_ALL = [(d, n, a, c, 1, e, err) for d, n, a, c, e, err in COMMON_TAKE] + EXTENDED_TAKE + DISTRIBUTED_TAKE


@pytest.mark.parametrize(
    ("desc", "name", "available", "count", "group", "expected", "error"), _DISTRIBUTED_ALL, ids=_ids(_DISTRIBUTED_ALL)
)
def test_take_by_topology_numa_distributed(
    desc: str, name: str, available: str, count: int, group: int, expected: str, error: str
) -> None:
    t = topo(name)
    _check(lambda: take_by_topology_numa_distributed(t, cpus(available), count, group, PACKED), expected, error)
    # through the static policy's wrapper: group size 1 without full-pcpus-only, CPUsPerCore with it
    if group == 1:
        opts = StaticPolicyOptions(distribute_cpus_across_numa=True)
        _check(lambda: take_by_topology(t, cpus(available), count, opts), expected, error)
    elif group == t.cpus_per_core():
        opts = StaticPolicyOptions(distribute_cpus_across_numa=True, full_pcpus_only=True)
        _check(lambda: take_by_topology(t, cpus(available), count, opts), expected, error)


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize(("options", "alpha", "beta", "error"), POLICY_OPTIONS)
def test_parse_policy_options(options: dict[str, str], alpha: bool, beta: bool, error: str) -> None:
    if error:
        with pytest.raises(PolicyOptionError) as info:
            parse_policy_options(options, alpha_enabled=alpha, beta_enabled=beta)
        assert str(info.value) == error
    else:
        opts = parse_policy_options(options, alpha_enabled=alpha, beta_enabled=beta)
        for name, value in options.items():
            assert getattr(opts, name.replace("-", "_")) is (value in ("true", "t", "1", "True"))


# ValidateStaticPolicyOptions: (options, topology, topology manager policy, error or "")
VALIDATE_OPTIONS = [
    ({"align-by-socket": "true"}, "topoDualSocketMultiNumaPerSocketHT", "none", ""),
    ({"align-by-socket": "true"}, "topoUncoreDualSocketNoSMT", "restricted", ""),
    # topoDualSocketHT declares NumNUMANodes 0, so 2 sockets > 0 NUMA nodes
    (
        {"align-by-socket": "true"},
        "topoDualSocketHT",
        "restricted",
        "Align by socket is not compatible with hardware where number of sockets are more than number of NUMA",
    ),
    (
        {"align-by-socket": "true"},
        "topoDualSocketHT",
        "single-numa-node",
        "Topolgy manager single-numa-node policy is incompatible with CPUManager align-by-socket policy option",
    ),
    (
        {"align-by-socket": "true"},
        "fakeTopoMultiSocketDualSocketPerNumaHT",
        "none",
        "Align by socket is not compatible with hardware where number of sockets are more than number of NUMA",
    ),
    ({}, "fakeTopoMultiSocketDualSocketPerNumaHT", "single-numa-node", ""),
]


@pytest.mark.parametrize(("options", "name", "tm_policy", "error"), VALIDATE_OPTIONS)
def test_validate_static_policy_options(options: dict[str, str], name: str, tm_policy: str, error: str) -> None:
    opts = parse_policy_options(options, alpha_enabled=True)
    if error:
        with pytest.raises(PolicyOptionError) as info:
            validate_static_policy_options(opts, topo(name), tm_policy)
        assert str(info.value) == error
    else:
        validate_static_policy_options(opts, topo(name), tm_policy)


# --------------------------------------------------------------------------- the what-if CLI

# (topology, available, count, options, exit code, stdout or stderr fragment)
CLI_TAKE = [
    ("topoDualSocketHT", "1-5,7-11", 1, [], 0, "2\n"),
    ("topoDualSocketHT", "0-11", 8, [], 0, "0-2,4,6-8,10\n"),
    ("topoDualSocketHT", "0-11", 8, ["distribute-cpus-across-numa=true"], 0, "0-3,6-9\n"),
    ("topoDualSocketHT", "0-11", 3, ["distribute-cpus-across-cores=true"], 0, "0,2,4\n"),
    ("topoDualSocketHT", "1-5,7-11", 1, ["prefer-align-cpus-by-uncorecache=true"], 0, "1\n"),
    (
        "topoDualSocketMultiNumaPerSocketHT",
        "0-79",
        62,
        ["distribute-cpus-across-numa=true", "full-pcpus-only=true"],
        0,
        "0-7,10-17,20-27,30-36,40-47,50-57,60-67,70-76\n",
    ),
    ("topoDualSocketHT", "0-11", 0, [], 0, "\n"),
    ("topoDualSocketHT", "0-3", 5, [], 1, "not enough cpus available to satisfy request: requested=5, available=4"),
    (
        "topoDualSocketHT",
        "0-11",
        3,
        ["full-pcpus-only=true"],
        1,
        "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2",
    ),
    (
        "topoDualSocketHT",
        "0-3",
        6,
        ["full-pcpus-only=true"],
        1,
        "SMT Alignment Error: not enough free physical CPUs: "
        "available physical CPUs = 4, requested CPUs = 6, CPUs per core = 2",
    ),
    ("topoDualSocketHT", "0-3x", 1, [], 2, "invalid CPU list"),
    ("topoDualSocketHT", "0-20", 1, [], 2, "are not in the topology"),
    ("topoDualSocketHT", "0-3", 1, ["bogus=true"], 2, 'unknown CPU Manager Policy option: "bogus"'),
    ("topoDualSocketHT", "0-3", 1, ["full-pcpus-only"], 2, "expected NAME=VALUE"),
    (
        "topoDualSocketHT",
        "0-3",
        2,
        ["full-pcpus-only=true", "distribute-cpus-across-cores=true"],
        2,
        "can not be used at the same time",
    ),
]


@pytest.mark.parametrize(("name", "available", "count", "options", "code", "text"), CLI_TAKE)
def test_cli_cpu_take(
    tmp_path: Any, name: str, available: str, count: int, options: list[str], code: int, text: str
) -> None:
    path = tmp_path / "topology.json"
    path.write_bytes(encode_topology_file(topo(name)))
    args = ["cpu", "take", "--topology-file", str(path), "--available", available, "--count", str(count)]
    for o in options:
        args += ["--option", o]
    proc = run_cli(*args)
    assert proc.returncode == code, proc.stderr
    if code == 0:
        assert proc.stdout == text
        assert proc.stderr == ""
    else:
        assert proc.stdout == ""
        assert text in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
