"""The kubelet's own static-policy and CPU topology-hint table tests, run against the port
(``eventsrc.core.cpu.static``).

Transcribed from kubernetes/kubernetes ``pkg/kubelet/cm/cpumanager/policy_static_test.go``
(upstream cea7d97d, the version ``../shared/kubelet-cpu-algorithms.md`` reads) and
``pkg/kubelet/cm/cpumanager/topology_hints_test.go`` (upstream 025a5a15). The tables are
data, at the top; the tests below only drive them. Topologies are named as in the Go tests
and come from ``tests.support.kubelet_topologies``.

How the kubelet's state maps onto eventsrc: the kubelet keeps a default (shared) cpuset
next to the assignments; eventsrc derives it (every CPU, minus the reserved ones with
strict-cpu-reservation, minus every assignment). Each case keeps the kubelet's default set
verbatim; where it is smaller than "all minus assignments", the test adds a filler pod
(``FILLER``, a different pod, so its CPUs are never reusable by the pod under test) holding
the difference, and checks that the derived shared pool is then exactly the kubelet's
default set. A case whose default set holds CPUs that are assigned cannot be represented
and would fail loudly.

CPU sets are written as kubelet list strings (``"0-3,8"``); a Go ``cpuset.New(...)`` is
written sorted. Expected errors are the kubelet's exact messages.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from eventsrc.core.cpu.assignment import (
    PolicyOptionError,
    SMTAlignmentError,
    StaticPolicyOptions,
    TakeError,
    check_smt_alignment,
    parse_policy_options,
)
from eventsrc.core.cpu.cpuset import CPUSet, parse
from eventsrc.core.cpu.static import (
    CPUManagerConfig,
    CPUPlanner,
    allocate,
    plan_pod_cpus,
    pod_cpu_request,
    reserved_cpus,
    shared_pool,
)
from eventsrc.core.cpu.topology import Core, CPUTopology, MachineInfo, Node, discover
from eventsrc.core.resources import qos_class
from eventsrc.events import ContainerSpec
from tests.support import kubelet_topologies as topologies

# --------------------------------------------------------------------------- helpers for the data

_QUAD = topologies.topoQuadSocketFourWayHT
QUAD_ALL = _QUAD.cpu_details.cpus()
QUAD_SOCK0 = _QUAD.cpu_details.cpus_in_sockets(0)
QUAD_SOCK1 = _QUAD.cpu_details.cpus_in_sockets(1)


def _s(text: str) -> CPUSet:
    return parse(text)


# topology_hints_test.go returnMachineInfo(): cadvisor's view of a 2-socket, 2-NUMA-node,
# 6-core, 12-thread machine (NumSockets is left unset, as in the Go test).
HINTS_MACHINE = MachineInfo(
    num_cores=12,
    num_sockets=0,
    topology=(
        Node(
            id=0,
            cores=(
                Core(id=0, socket_id=0, threads=(0, 6)),
                Core(id=1, socket_id=0, threads=(1, 7)),
                Core(id=2, socket_id=0, threads=(2, 8)),
            ),
        ),
        Node(
            id=1,
            cores=(
                Core(id=0, socket_id=1, threads=(3, 9)),
                Core(id=1, socket_id=1, threads=(4, 10)),
                Core(id=2, socket_id=1, threads=(5, 11)),
            ),
        ),
    ),
)

FULL_PCPUS = {"full-pcpus-only": "true"}
STRICT = {"strict-cpu-reservation": "true"}

# --------------------------------------------------------------------------- tables

# TestStaticPolicyStart / TestStaticPolicyStartWithResvList, the part that is the policy's
# and not its state file: the reserved set NewStaticPolicy chooses (an explicit list, or
# take-by-topology of the reserved count) and, where the Go case asserts it, the default
# set Start makes from an empty state (eventsrc's derived shared pool with no assignments).
# "reserved" is read off the case's expected error message where the Go case fails on the
# state ("not all reserved cpus: \"0,6\" ..." names the chosen set).
START_RESERVED: list[dict[str, Any]] = [
    # TestStaticPolicyStart
    {
        "desc": "empty cpuset",
        "topo": "topoDualSocketHT",
        "count": 1,
        "explicit": None,
        "options": {},
        "reserved": "0",
        "pool": "0-11",
    },
    {
        "desc": "reserved cores 0 & 6 are not present in available cpuset",
        "topo": "topoDualSocketHT",
        "count": 2,
        "explicit": None,
        "options": {},
        "reserved": "0,6",
        "pool": None,
    },
    {
        "desc": "some of reserved cores are present in available cpuset (StrictCPUReservationOption)",
        "topo": "topoDualSocketHT",
        "count": 2,
        "explicit": None,
        "options": STRICT,
        "reserved": "0,6",
        "pool": None,
    },
    # TestStaticPolicyStartWithResvList
    {
        "desc": "ResvList: empty cpuset",
        "topo": "topoDualSocketHT",
        "count": 2,
        "explicit": "0-1",
        "options": {},
        "reserved": "0-1",
        "pool": "0-11",
    },
    {
        "desc": "ResvList: empty cpuset with StrictCPUReservationOption enabled",
        "topo": "topoDualSocketHT",
        "count": 2,
        "explicit": "0-1",
        "options": STRICT,
        "reserved": "0-1",
        "pool": "2-11",
    },
]

# TestStaticPolicyAdd, optionsInsensitiveTestCases: each runs with no options and with
# full-pcpus-only. "count" is numReservedCPUs (0: no reserved CPUs), "explicit" reservedCPUs,
# "pod" is makePod(uid, container, request, limit), "expect" None means expCPUAlloc false.
ADD_OPTIONS_INSENSITIVE: list[dict[str, Any]] = [
    {
        "desc": "GuPodMultipleCores, SingleSocketHT, ExpectAllocOneCore",
        "topo": "topoSingleSocketHT",
        "count": 1,
        "assignments": {"fakePod": {"fakeContainer100": "2-3,6-7"}},
        "default": "0-1,4-5",
        "pod": ("fakePod", "fakeContainer3", "2000m", "2000m"),
        "error": "",
        "expect": "1,5",
    },
    {
        "desc": "GuPodMultipleCores, DualSocketHT, ExpectAllocOneSocket",
        "topo": "topoDualSocketHT",
        "count": 1,
        "assignments": {"fakePod": {"fakeContainer100": "2"}},
        "default": "0-1,3-11",
        "pod": ("fakePod", "fakeContainer3", "6000m", "6000m"),
        "error": "",
        "expect": "1,3,5,7,9,11",
    },
    {
        "desc": "GuPodMultipleCores, DualSocketHT, ExpectAllocThreeCores",
        "topo": "topoDualSocketHT",
        "count": 1,
        "assignments": {"fakePod": {"fakeContainer100": "1,5"}},
        "default": "0,2-4,6-11",
        "pod": ("fakePod", "fakeContainer3", "6000m", "6000m"),
        "error": "",
        "expect": "2-4,8-10",
    },
    {
        "desc": "GuPodMultipleCores, DualSocketNoHT, ExpectAllocOneSocket",
        "topo": "topoDualSocketNoHT",
        "count": 1,
        "assignments": {"fakePod": {"fakeContainer100": ""}},
        "default": "0-1,3-7",
        "pod": ("fakePod", "fakeContainer1", "4000m", "4000m"),
        "error": "",
        "expect": "4-7",
    },
    {
        "desc": "GuPodMultipleCores, DualSocketNoHT, ExpectAllocFourCores",
        "topo": "topoDualSocketNoHT",
        "count": 1,
        "assignments": {"fakePod": {"fakeContainer100": "4-5"}},
        "default": "0-1,3,6-7",
        "pod": ("fakePod", "fakeContainer1", "4000m", "4000m"),
        "error": "",
        "expect": "1,3,6-7",
    },
    {
        "desc": "GuPodMultipleCores, DualSocketHT, ExpectAllocOneSocketOneCore",
        "topo": "topoDualSocketHT",
        "count": 1,
        "assignments": {"fakePod": {"fakeContainer100": "2"}},
        "default": "0-1,3-11",
        "pod": ("fakePod", "fakeContainer3", "8000m", "8000m"),
        "error": "",
        "expect": "1,3-5,7,9-11",
    },
    {
        "desc": "NonGuPod, SingleSocketHT, NoAlloc",
        "topo": "topoSingleSocketHT",
        "count": 1,
        "assignments": {},
        "default": "0-7",
        "pod": ("fakePod", "fakeContainer1", "1000m", "2000m"),
        "error": "",
        "expect": None,
    },
    {
        "desc": "GuPodNonIntegerCore, SingleSocketHT, NoAlloc",
        "topo": "topoSingleSocketHT",
        "count": 1,
        "assignments": {},
        "default": "0-7",
        "pod": ("fakePod", "fakeContainer4", "977m", "977m"),
        "error": "",
        "expect": None,
    },
    {
        "desc": "GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocSock0",
        "topo": "topoQuadSocketFourWayHT",
        "count": 0,
        "assignments": {"fakePod": {"fakeContainer100": _s("3,11,4,5,6,7")}},
        "default": QUAD_ALL - _s("3,11,4,5,6,7"),
        "pod": ("fakePod", "fakeContainer5", "72000m", "72000m"),
        "error": "",
        "expect": QUAD_SOCK0,
    },
    {
        "desc": "GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocAllFullCoresFromThreeSockets",
        "topo": "topoQuadSocketFourWayHT",
        "count": 0,
        "assignments": {
            "fakePod": {"fakeContainer100": QUAD_ALL - _s("1,25,13,38,2,9,11,35,23,48,12,51,53,173,113,233,54,61")}
        },
        "default": _s("1,25,13,38,2,9,11,35,23,48,12,51,53,173,113,233,54,61"),
        "pod": ("fakePod", "fakeCcontainer5", "12000m", "12000m"),
        "error": "",
        "expect": _s("1,25,13,38,11,35,23,48,53,173,113,233"),
    },
    {
        "desc": "GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocAllSock1+FullCore",
        "topo": "topoQuadSocketFourWayHT",
        "count": 0,
        "assignments": {
            "fakePod": {"fakeContainer100": QUAD_ALL - (QUAD_SOCK1 | _s("10,34,22,47,53,173,61,181,108,228,115,235"))}
        },
        "default": QUAD_SOCK1 | _s("10,34,22,47,53,173,61,181,108,228,115,235"),
        "pod": ("fakePod", "fakeContainer5", "76000m", "76000m"),
        "error": "",
        "expect": QUAD_SOCK1 | _s("10,34,22,47"),
    },
]

# TestStaticPolicyAdd, defaultOptionsTestCases (no options).
ADD_DEFAULT_OPTIONS: list[dict[str, Any]] = [
    {
        "desc": "GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU",
        "topo": "topoSingleSocketHT",
        "count": 1,
        "assignments": {},
        "default": "0-7",
        "pod": ("fakePod", "fakeContainer2", "1000m", "1000m"),
        "error": "",
        "expect": "4",
    },
    {
        "desc": "GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocCPUs",
        "topo": "topoQuadSocketFourWayHT",
        "count": 0,
        "assignments": {"fakePod": {"fakeContainer100": QUAD_ALL - _s("10,11,53,37,55,67,52")}},
        "default": _s("10,11,53,67,52"),
        "pod": ("fakePod", "fakeContainer5", "5000m", "5000m"),
        "error": "",
        "expect": _s("10,11,53,67,52"),
    },
    {
        "desc": "GuPodSingleCore, SingleSocketHT, ExpectError",
        "topo": "topoSingleSocketHT",
        "count": 1,
        "assignments": {},
        "default": "0-7",
        "pod": ("fakePod", "fakeContainer2", "8000m", "8000m"),
        "error": "not enough cpus available to satisfy request: requested=8, available=7",
        "expect": None,
    },
    {
        "desc": "GuPodMultipleCores, SingleSocketHT, ExpectSameAllocation",
        "topo": "topoSingleSocketHT",
        "count": 1,
        "assignments": {"fakePod": {"fakeContainer3": "2-3,6-7"}},
        "default": "0-1,4-5",
        "pod": ("fakePod", "fakeContainer3", "4000m", "4000m"),
        "error": "",
        "expect": "2-3,6-7",
    },
    {
        "desc": "GuPodMultipleCores, DualSocketHT, NoAllocExpectError",
        "topo": "topoDualSocketHT",
        "count": 1,
        "assignments": {"fakePod": {"fakeContainer100": "1-3"}},
        "default": "0,4-11",
        "pod": ("fakePod", "fakeContainer5", "10000m", "10000m"),
        "error": "not enough cpus available to satisfy request: requested=10, available=8",
        "expect": None,
    },
    {
        "desc": "GuPodMultipleCores, SingleSocketHT, NoAllocExpectError",
        "topo": "topoSingleSocketHT",
        "count": 1,
        "assignments": {"fakePod": {"fakeContainer100": "1-6"}},
        "default": "0,7",
        "pod": ("fakePod", "fakeContainer5", "2000m", "2000m"),
        "error": "not enough cpus available to satisfy request: requested=2, available=1",
        "expect": None,
    },
    {
        "desc": "GuPodMultipleCores, topoQuadSocketFourWayHT, NoAlloc",
        "topo": "topoQuadSocketFourWayHT",
        "count": 0,
        "assignments": {"fakePod": {"fakeContainer100": QUAD_ALL - _s("10,11,53,37,55,67,52")}},
        "default": _s("10,11,53,37,55,67,52"),
        "pod": ("fakePod", "fakeContainer5", "76000m", "76000m"),
        "error": "not enough cpus available to satisfy request: requested=76, available=7",
        "expect": None,
    },
]

# TestStaticPolicyAdd, smtalignOptionTestCases (full-pcpus-only): the errors are
# SMTAlignmentError values, written here as their Error() text.
ADD_SMT_ALIGN: list[dict[str, Any]] = [
    {
        "desc": "GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU",
        "topo": "topoSingleSocketHT",
        "count": 1,
        "options": FULL_PCPUS,
        "assignments": {},
        "default": "0-7",
        "pod": ("fakePod", "fakeContainer2", "1000m", "1000m"),
        "error": "SMT Alignment Error: requested 1 cpus not multiple cpus per core = 2",
        "expect": None,
    },
    {
        "desc": "GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocOneCPUs",
        "topo": "topoQuadSocketFourWayHT",
        "count": 8,
        "options": FULL_PCPUS,
        "assignments": {},
        "default": QUAD_ALL,
        "pod": ("fakePod", "fakeContainer15", "15000m", "15000m"),
        "error": "SMT Alignment Error: requested 15 cpus not multiple cpus per core = 4",
        "expect": None,
    },
    {
        "desc": "GuPodManyCores, topoDualSocketHT, ExpectDoNotAllocPartialCPU",
        "topo": "topoDualSocketHT",
        "count": 2,
        "explicit": "1,6",
        "options": FULL_PCPUS,
        "assignments": {},
        "default": "0,2-5,7-11",
        "pod": ("fakePod", "fakeContainerBug113537_1", "10000m", "10000m"),
        "error": "SMT Alignment Error: not enough free physical CPUs: "
        "available physical CPUs = 8, requested CPUs = 10, CPUs per core = 2",
        "expect": None,
    },
    {
        "desc": "GuPodManyCores, topoDualSocketHT, AutoReserve, ExpectAllocAllCPUs",
        "topo": "topoDualSocketHT",
        "count": 2,
        "options": FULL_PCPUS,
        "assignments": {},
        "default": "1-5,7-11",
        "pod": ("fakePod", "fakeContainerBug113537_2", "10000m", "10000m"),
        "error": "",
        "expect": "1-5,7-11",
    },
    {
        "desc": "GuPodManyCores, topoDualSocketHT, ExpectAllocAllCPUs",
        "topo": "topoDualSocketHT",
        "count": 2,
        "explicit": "0,6",
        "options": FULL_PCPUS,
        "assignments": {},
        "default": "1-5,7-11",
        "pod": ("fakePod", "fakeContainerBug113537_2", "10000m", "10000m"),
        "error": "",
        "expect": "1-5,7-11",
    },
]

# TestStaticPolicyAdd, alignBySocketOptionTestCases (alpha options enabled); "hint" is the
# topology manager's NUMA affinity for the container.
ADD_ALIGN_BY_SOCKET: list[dict[str, Any]] = [
    {
        "desc": "Align by socket: true, cpu's within same socket of numa in hint are part of allocation",
        "topo": "topoDualSocketMultiNumaPerSocketHT",
        "count": 1,
        "options": {"align-by-socket": "true"},
        "assignments": {},
        "default": "2,11,21-22",
        "pod": ("fakePod", "fakeContainer2", "2000m", "2000m"),
        "hint": [0, 2],
        "error": "",
        "expect": "2,11",
    },
    {
        "desc": "Align by socket: false, cpu's are taken strictly from NUMA nodes in hint",
        "topo": "topoDualSocketMultiNumaPerSocketHT",
        "count": 1,
        "options": {"align-by-socket": "false"},
        "assignments": {},
        "default": "2,11,21-22",
        "pod": ("fakePod", "fakeContainer2", "2000m", "2000m"),
        "hint": [0, 2],
        "error": "",
        "expect": "2,21",
    },
]

# TestStaticPolicyAddWithResvList (explicit --reserved-cpus).
ADD_WITH_RESV_LIST: list[dict[str, Any]] = [
    {
        "desc": "GuPodSingleCore, SingleSocketHT, ExpectError",
        "topo": "topoSingleSocketHT",
        "count": 1,
        "explicit": "0",
        "assignments": {},
        "default": "0-7",
        "pod": ("fakePod", "fakeContainer2", "8000m", "8000m"),
        "error": "not enough cpus available to satisfy request: requested=8, available=7",
        "expect": None,
    },
    {
        "desc": "GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU",
        "topo": "topoSingleSocketHT",
        "count": 2,
        "explicit": "0-1",
        "assignments": {},
        "default": "0-7",
        "pod": ("fakePod", "fakeContainer2", "1000m", "1000m"),
        "error": "",
        "expect": "4",
    },
    {
        "desc": "GuPodMultipleCores, SingleSocketHT, ExpectAllocOneCore",
        "topo": "topoSingleSocketHT",
        "count": 2,
        "explicit": "0-1",
        "assignments": {"fakePod": {"fakeContainer100": "2-3,6-7"}},
        "default": "0-1,4-5",
        "pod": ("fakePod", "fakeContainer3", "2000m", "2000m"),
        "error": "",
        "expect": "4-5",
    },
]

# TestStaticPolicyReuseCPUs: makeMultiContainerPod(init, app) (uid "podUID"); every
# container is allocated in order, then "remove" is removed. Reserved: none (count 0).
REUSE_CPUS: list[dict[str, Any]] = [
    {
        "desc": "SingleSocketHT, DeAllocOneInitContainer",
        "topo": "topoSingleSocketHT",
        "init": [("4000m", "4000m", False)],
        "app": [("2000m", "2000m")],
        "assignments": {},
        "default": "0-7",
        "remove": "initContainer-0",
        "after_alloc": "2-3,6-7",
        "after_remove": "1-3,5-7",
    },
]

# TestStaticPolicyDoNotReuseCPUs: the init container is restartable (a sidecar).
DO_NOT_REUSE_CPUS: list[dict[str, Any]] = [
    {
        "desc": "SingleSocketHT, Don't reuse CPUs of a restartable init container",
        "topo": "topoSingleSocketHT",
        "init": [("4000m", "4000m", True)],
        "app": [("2000m", "2000m")],
        "assignments": {},
        "default": "0-7",
        "after_alloc": "3,7",
    },
]

# TestStaticPolicyRemove: RemoveContainer(pod, container) and the default set after it.
REMOVE: list[dict[str, Any]] = [
    {
        "desc": "SingleSocketHT, DeAllocOneContainer",
        "topo": "topoSingleSocketHT",
        "pod": "fakePod",
        "container": "fakeContainer1",
        "assignments": {"fakePod": {"fakeContainer1": "1-3"}},
        "default": "4-7",
        "expect": "1-7",
    },
    {
        "desc": "SingleSocketHT, DeAllocOneContainer, BeginEmpty",
        "topo": "topoSingleSocketHT",
        "pod": "fakePod",
        "container": "fakeContainer1",
        "assignments": {"fakePod": {"fakeContainer1": "1-3", "fakeContainer2": "4-7"}},
        "default": "",
        "expect": "1-3",
    },
    {
        "desc": "SingleSocketHT, DeAllocTwoContainer",
        "topo": "topoSingleSocketHT",
        "pod": "fakePod",
        "container": "fakeContainer1",
        "assignments": {"fakePod": {"fakeContainer1": "1,3,5", "fakeContainer2": "2,4"}},
        "default": "6-7",
        "expect": "1,3,5-7",
    },
    {
        "desc": "SingleSocketHT, NoDeAlloc",
        "topo": "topoSingleSocketHT",
        "pod": "fakePod",
        "container": "fakeContainer2",
        "assignments": {"fakePod": {"fakeContainer1": "1,3,5"}},
        "default": "2,4,6-7",
        "expect": "2,4,6-7",
    },
]

# TestTopologyAwareAllocateCPUs: allocateCPUs(n, NUMA mask, no reusable CPUs) with no
# reserved CPUs; "mask" None is a nil bitmask.
TOPOLOGY_AWARE_ALLOCATE: list[dict[str, Any]] = [
    {
        "desc": "Request 2 CPUs, No BitMask",
        "topo": "topoDualSocketHT",
        "assignments": {},
        "default": "0-11",
        "count": 2,
        "mask": None,
        "expect": "0,6",
    },
    {
        "desc": "Request 2 CPUs, BitMask on Socket 0",
        "topo": "topoDualSocketHT",
        "assignments": {},
        "default": "0-11",
        "count": 2,
        "mask": [0],
        "expect": "0,6",
    },
    {
        "desc": "Request 2 CPUs, BitMask on Socket 1",
        "topo": "topoDualSocketHT",
        "assignments": {},
        "default": "0-11",
        "count": 2,
        "mask": [1],
        "expect": "1,7",
    },
    {
        "desc": "Request 8 CPUs, BitMask on Socket 0",
        "topo": "topoDualSocketHT",
        "assignments": {},
        "default": "0-11",
        "count": 8,
        "mask": [0],
        "expect": "0-2,4,6-8,10",
    },
    {
        "desc": "Request 8 CPUs, BitMask on Socket 1",
        "topo": "topoDualSocketHT",
        "assignments": {},
        "default": "0-11",
        "count": 8,
        "mask": [1],
        "expect": "0-1,3,5-7,9,11",
    },
]

# TestStaticPolicyOptions: NewStaticPolicyOptions (the Go test only checks that an error
# happens, not its text).
STATIC_POLICY_OPTIONS: list[dict[str, Any]] = [
    {"desc": "nil args", "options": {}, "error": False, "expect": StaticPolicyOptions()},
    {"desc": "empty args", "options": {}, "error": False, "expect": StaticPolicyOptions()},
    {"desc": "bad single arg", "options": {"badValue1": ""}, "error": True, "expect": None},
    {"desc": "bad multiple arg", "options": {"badValue1": "", "badvalue2": "aaaa"}, "error": True, "expect": None},
    {
        "desc": "good arg",
        "options": {"full-pcpus-only": "true"},
        "error": False,
        "expect": StaticPolicyOptions(full_pcpus_only=True),
    },
    {"desc": "good arg, bad value", "options": {"full-pcpus-only": "enabled!"}, "error": True, "expect": None},
    {
        "desc": "bad arg intermixed",
        "options": {"full-pcpus-only": "1", "badvalue2": "lorem ipsum"},
        "error": True,
        "expect": None,
    },
]

# TestSMTAlignmentErrorText, the cases Allocate can produce: (requested, CPUs per core,
# available physical CPUs) fed to the full-pcpus-only check.
SMT_ERROR_TEXT: list[dict[str, Any]] = [
    {
        "desc": "base SMT alignment error",
        "requested": 15,
        "per_core": 4,
        "available": 0,
        "expect": "SMT Alignment Error: requested 15 cpus not multiple cpus per core = 4",
    },
    {
        "desc": "base SMT alignment error, no physical CPUs, explicit flag",
        "requested": 4,
        "per_core": 2,
        "available": 0,
        "expect": "SMT Alignment Error: not enough free physical CPUs: "
        "available physical CPUs = 0, requested CPUs = 4, CPUs per core = 2",
    },
]

# topology_hints_test.go TestPodGuaranteedCPUs: containers are (kind, cpu request = limit);
# every container also requests and limits 1G of memory (makeMultiContainerPodWithOptions).
POD_GUARANTEED_CPUS: list[dict[str, Any]] = [
    {
        "desc": "TestCase01: if requestedCPU == 0, Pod is not Guaranteed Qos",
        "containers": [("init", "0"), ("app", "0")],
        "expect": 0,
    },
    {
        "desc": "TestCase02: if requestedCPU == 0, Pod is not Guaranteed Qos",
        "containers": [("init", "0"), ("app", "2")],
        "expect": 0,
    },
    {
        "desc": "TestCase03: if requestedCPU == 0, Pod is not Guaranteed Qos",
        "containers": [("init", "2"), ("app", "0")],
        "expect": 0,
    },
    {"desc": "TestCase04: Guaranteed Pod requests 2 CPUs", "containers": [("init", "2"), ("app", "2")], "expect": 2},
    {"desc": "TestCase05: Guaranteed Pod requests 5 CPUs", "containers": [("init", "5"), ("app", "5")], "expect": 5},
    {
        "desc": "TestCase06: The number of CPUs requested By app is bigger than the number of CPUs requested by init",
        "containers": [("init", "2"), ("app", "5")],
        "expect": 5,
    },
    {
        "desc": "TestCase07: The number of CPUs requested By init is bigger than the number of CPUs requested by app",
        "containers": [("init", "5"), ("app", "2")],
        "expect": 5,
    },
    {
        "desc": "TestCase08: Sum of CPUs requested by multiple containers",
        "containers": [("init", "2"), ("init", "4"), ("app", "2"), ("app", "4")],
        "expect": 6,
    },
    {
        "desc": "TestCase09: restartable init container + regular container",
        "containers": [("sidecar", "1"), ("app", "1")],
        "expect": 2,
    },
    {
        "desc": "TestCase09: multiple restartable init containers",
        "containers": [("init", "5"), ("sidecar", "1"), ("sidecar", "2"), ("sidecar", "3"), ("app", "1")],
        "expect": 7,
    },
    {
        "desc": "TestCase11: multiple restartable and regular init containers",
        "containers": [
            ("init", "5"),
            ("sidecar", "1"),
            ("sidecar", "2"),
            ("init", "5"),
            ("sidecar", "3"),
            ("app", "1"),
        ],
        "expect": 8,
    },
    {
        "desc": "TestCase12: restartable init, regular init and regular container",
        "containers": [("sidecar", "10"), ("init", "200"), ("app", "100")],
        "expect": 210,
    },
]

# topology_hints_test.go returnTestCases(), used by TestGetTopologyHints (container scope)
# and TestGetPodTopologyHints (pod scope) on HINTS_MACHINE with no reserved CPUs. The pod is
# makePod("fakePod", "fakeContainer", n, n). Hints are (NUMA nodes, preferred); the Go test
# sorts both lists, so order does not count. An expected nil/empty list is an empty list:
# the kubelet returns an empty (non-nil) list, "no placement can satisfy this".
HINT_CASES: list[dict[str, Any]] = [
    {
        "desc": "Request 2 CPUs, 4 available on NUMA 0, 6 available on NUMA 1",
        "request": "2",
        "assignments": {},
        "default": "2-11",
        "expect": [([0], True), ([1], True), ([0, 1], False)],
    },
    {
        "desc": "Request 5 CPUs, 4 available on NUMA 0, 6 available on NUMA 1",
        "request": "5",
        "assignments": {},
        "default": "2-11",
        "expect": [([1], True), ([0, 1], False)],
    },
    {
        "desc": "Request 7 CPUs, 4 available on NUMA 0, 6 available on NUMA 1",
        "request": "7",
        "assignments": {},
        "default": "2-11",
        "expect": [([0, 1], True)],
    },
    {
        "desc": "Request 11 CPUs, 4 available on NUMA 0, 6 available on NUMA 1",
        "request": "11",
        "assignments": {},
        "default": "2-11",
        "expect": [],
    },
    {
        "desc": "Request 2 CPUs, 1 available on NUMA 0, 1 available on NUMA 1",
        "request": "2",
        "assignments": {},
        "default": "0,3",
        "expect": [([0, 1], False)],
    },
    {"desc": "Request more CPUs than available", "request": "5", "assignments": {}, "default": "0-3", "expect": []},
    {
        "desc": "Regenerate Single-Node NUMA Hints if already allocated 1/2 (0,6)",
        "request": "2",
        "assignments": {"fakePod": {"fakeContainer": "0,6"}},
        "default": "",
        "expect": [([0], True), ([0, 1], False)],
    },
    {
        "desc": "Regenerate Single-Node NUMA Hints if already allocated 1/2 (3,9)",
        "request": "2",
        "assignments": {"fakePod": {"fakeContainer": "3,9"}},
        "default": "",
        "expect": [([1], True), ([0, 1], False)],
    },
    {
        "desc": "Regenerate Cross-NUMA Hints if already allocated",
        "request": "11",
        "assignments": {"fakePod": {"fakeContainer": "0-10"}},
        "default": "",
        "expect": [([0, 1], True)],
    },
    {
        "desc": "Requested less than already allocated",
        "request": "2",
        "assignments": {"fakePod": {"fakeContainer": "0,3,6,9"}},
        "default": "",
        "expect": [],
    },
    {
        "desc": "Requested more than already allocated",
        "request": "11",
        "assignments": {"fakePod": {"fakeContainer": "0,3,6,9"}},
        "default": "",
        "expect": [],
    },
]

# TestGetPodTopologyHintsWithPolicyOptions (alpha options enabled, no reserved CPUs).
POD_HINTS_WITH_OPTIONS: list[dict[str, Any]] = [
    {
        "desc": "AlignBySocket:false, Preferred hints does not contains socket aligned hints",
        "topo": "topoDualSocketMultiNumaPerSocketHT",
        "options": {"align-by-socket": "false"},
        "request": "2",
        "assignments": {},
        "default": "2-3,11",
        "expect": [
            ([0], True),
            ([0, 1], False),
            ([0, 2], False),
            ([0, 3], False),
            ([0, 1, 2], False),
            ([0, 1, 3], False),
            ([0, 2, 3], False),
            ([0, 1, 2, 3], False),
        ],
    },
    {
        "desc": "AlignBySocket:true Preferred hints contains socket aligned hints",
        "topo": "topoDualSocketMultiNumaPerSocketHT",
        "options": {"align-by-socket": "true"},
        "request": "2",
        "assignments": {},
        "default": "2-3,11",
        "expect": [
            ([0], True),
            ([0, 1], True),
            ([0, 2], False),
            ([0, 3], False),
            ([0, 1, 2], False),
            ([0, 1, 3], False),
            ([0, 2, 3], False),
            ([0, 1, 2, 3], False),
        ],
    },
    {
        "desc": "AlignBySocket:true Preferred hints are spread across socket since 2 sockets are required",
        "topo": "topoDualSocketMultiNumaPerSocketHT",
        "options": {"align-by-socket": "true"},
        "request": "41",
        "assignments": {},
        "default": "0-28,40-57",
        "expect": [([0, 1, 2], True), ([0, 1, 2, 3], True)],
    },
]


def _masks(nodes: list[int]) -> list[list[int]]:
    """Every non-empty subset of ``nodes``, as a NUMA mask."""
    return [list(m) for k in range(1, len(nodes) + 1) for m in itertools.combinations(nodes, k)]


# Not an upstream table case: derived from upstream generateCPUTopologyHints and
# isHintSocketAligned (policy_static.go) for a machine with more than two NUMA nodes per
# socket, where "spans as few sockets as needed" and "covers whole sockets" differ. Request
# 2 CPUs with every CPU free on the AMD NPS=4 machine (4 NUMA nodes per socket): every mask
# fits; the narrowest is 1 node, i.e. 1 socket, so every mask inside one socket is preferred.
DERIVED_SOCKET_ALIGNED: list[dict[str, Any]] = [
    {
        "desc": "derived: align-by-socket, 4 NUMA nodes per socket, every mask inside one socket is preferred",
        "topo": "topoDualSocketMultiNumaPerSocketHTLarge",
        "options": {"align-by-socket": "true"},
        "request": "2",
        "assignments": {},
        "default": "0-255",
        "expect": [(m, m in _masks([0, 1, 2, 3]) + _masks([4, 5, 6, 7])) for m in _masks(list(range(8)))],
    },
]

# Upstream cases not ported, with the reason: they test the kubelet's state file (checkpoint)
# or machinery eventsrc does not have. A note of the ported table, not tests: none is run.
NOT_APPLICABLE: list[tuple[str, str, str]] = [
    ("TestStaticPolicyName", "static", "policy object naming; eventsrc has no policy object"),
    (
        "TestStaticPolicyStart",
        "non-corrupted state",
        "checks Start's validation of a state file; eventsrc derives the default set, it cannot be corrupted",
    ),
    (
        "TestStaticPolicyStart",
        "reserved cores 0 & 6 are not present in available cpuset (error)",
        "state-file validation error; the reserved-set choice of this case is ported in START_RESERVED",
    ),
    (
        "TestStaticPolicyStart",
        "some of reserved cores are present in available cpuset (StrictCPUReservationOption) (error)",
        "state-file validation error; the reserved-set choice of this case is ported in START_RESERVED",
    ),
    (
        "TestStaticPolicyStart",
        "assigned core 2 is still present in available cpuset",
        "state-file validation error: an assignment overlapping a stored default set cannot be represented",
    ),
    (
        "TestStaticPolicyStart",
        "assigned core 2 is still present in available cpuset (StrictCPUReservationOption)",
        "state-file validation error: an assignment overlapping a stored default set cannot be represented",
    ),
    (
        "TestStaticPolicyStart",
        "core 12 is not present in topology but is in state cpuset",
        "state-file validation error about a stored default set",
    ),
    (
        "TestStaticPolicyStart",
        "core 11 is present in topology but is not in state cpuset",
        "state-file validation error about a stored default set",
    ),
    (
        "TestStaticPolicyStartWithResvList",
        "reserved cores 0 & 1 are not present in available cpuset",
        "state-file validation error about a stored default set",
    ),
    (
        "TestStaticPolicyStartWithResvList",
        "reserved cores 0 & 1 are present in available cpuset with StrictCPUReservationOption enabled",
        "state-file validation error about a stored default set",
    ),
    (
        "TestStaticPolicyStartWithResvList",
        "inconsistency between numReservedCPUs and reserved",
        "NewStaticPolicy(numReservedCPUs=1, reservedCPUs=0-1) is an inconsistent call the kubelet's flags never make "
        "(--reserved-cpus overrides the kube/system-reserved CPU count); eventsrc's reserved_cpus takes the explicit "
        "list as overriding the count (--reserved-cpu-count applies only without --reserved-cpus), so the error "
        "'[cpumanager] unable to reserve the required amount of CPUs (size of 0-1 did not equal 1)' is not raised "
        "for an explicit list: a design decision, reported",
    ),
    (
        "TestStaticPolicyAddWithUncoreAlignment",
        "all 18 cases",
        "topologies (topoDualSocketSingleNumaPerSocketSMTUncore, topoSmallDualSocketSingleNumaPerSocketNoSMTUncore, "
        "...) are not transcribed in tests.support.kubelet_topologies; the uncore picking is covered by "
        "test_cpu_assignment.py",
    ),
    (
        "TestSMTAlignmentErrorText",
        "base SMT alignment error, no physical CPUs, missing flag",
        "formats a hand-built Go error value without CausedByPhysicalCPUs; Allocate never produces it",
    ),
]

# --------------------------------------------------------------------------- helpers

FILLER = "filler-pod"


def _cs(value: str | CPUSet | Iterable[int]) -> CPUSet:
    if isinstance(value, CPUSet):
        return value
    if isinstance(value, str):
        return parse(value)
    return CPUSet(value)


def _topo(name: str) -> CPUTopology:
    topo: CPUTopology = topologies.KUBELET_TEST_TOPOLOGIES[name]
    return topo


def _config(case: Mapping[str, Any], options: Mapping[str, str] | None = None) -> CPUManagerConfig:
    """NewStaticPolicy(topo, numReservedCPUs, reservedCPUs, options)."""
    topo = _topo(case["topo"])
    opts = parse_policy_options(dict(options if options is not None else case.get("options", {})), alpha_enabled=True)
    explicit = case.get("explicit")
    count = case.get("count", 0)
    if explicit is not None or count > 0:
        reserved = reserved_cpus(topo, count, _cs(explicit) if explicit is not None else None, opts)
    else:
        reserved = CPUSet()  # numReservedCPUs 0: take-by-topology of 0 CPUs is the empty set
    return CPUManagerConfig(policy="static", topology=topo, reserved=reserved, options=opts)


def _state(cfg: CPUManagerConfig, case: Mapping[str, Any]) -> dict[str, dict[str, CPUSet]]:
    """The case's assignments, plus a filler pod so that the derived shared pool is the
    kubelet's stored default set."""
    assignments = {
        uid: {name: _cs(cpus) for name, cpus in containers.items()} for uid, containers in case["assignments"].items()
    }
    default = _cs(case["default"])
    derived = shared_pool(cfg, assignments)
    assert default.is_subset_of(derived), f"default {default} holds CPUs the assignments hold (derived {derived})"
    rest = derived - default
    if rest:
        assert FILLER not in assignments
        assignments[FILLER] = {"filler": rest}
    assert shared_pool(cfg, assignments) == default
    return assignments


def _container(name: str, request: str, limit: str, kind: str = "app") -> ContainerSpec:
    """A container as makePod / makeMultiContainerPod make it (memory 1G requested and limited)."""
    return ContainerSpec(
        name=name, kind=kind, requests={"cpu": request, "memory": "1G"}, limits={"cpu": limit, "memory": "1G"}
    )


def _hints(hints: list[tuple[list[int], bool]] | None) -> list[tuple[tuple[int, ...], bool]] | None:
    return None if hints is None else sorted((tuple(nodes), preferred) for nodes, preferred in hints)


def _ids(cases: list[dict[str, Any]]) -> list[str]:
    return [c["desc"] for c in cases]


def _run_add(case: Mapping[str, Any], options: Mapping[str, str] | None = None) -> None:
    """runStaticPolicyTestCase: Allocate the pod's first container."""
    cfg = _config(case, options)
    assignments = _state(cfg, case)
    uid, name, request, limit = case["pod"]
    container = _container(name, request, limit)
    planner = CPUPlanner(cfg, assignments, uid, qos_class([container]))
    hint = case.get("hint")
    if case["error"]:
        with pytest.raises(TakeError) as err:
            planner.allocate(container, hint)
        assert str(err.value) == case["error"]
        if case["error"].startswith("SMT Alignment Error"):
            assert isinstance(err.value, SMTAlignmentError)
        assert planner.steps == []
        return
    step = planner.allocate(container, hint)
    if case["expect"] is None:
        assert step is None
        assert planner.steps == []
        return
    assert step is not None
    assert step.cpus == _cs(case["expect"])
    after = {uid_: dict(c) for uid_, c in assignments.items()}
    after.setdefault(uid, {})[name] = step.cpus
    assert not (step.cpus & shared_pool(cfg, after)), "exclusive CPUs must be disjoint from the shared pool"
    # plan_pod_cpus is the same call for a whole pod.
    steps = plan_pod_cpus(cfg, assignments, uid, qos_class([container]), [container], {name: hint})
    assert [s.cpus for s in steps] == [step.cpus]


def _pod(case: Mapping[str, Any]) -> list[ContainerSpec]:
    """makeMultiContainerPod / makeMultiContainerPodWithOptions."""
    out = [
        _container(f"initContainer-{i}", req, lim, "sidecar" if restartable else "init")
        for i, (req, lim, restartable) in enumerate(case["init"])
    ]
    out += [_container(f"appContainer-{i}", req, lim) for i, (req, lim) in enumerate(case["app"])]
    return out


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("case", START_RESERVED, ids=_ids(START_RESERVED))
def test_static_policy_start_reserved(case: dict[str, Any]) -> None:
    cfg = _config(case)
    assert cfg.reserved == _cs(case["reserved"])
    if case["pool"] is not None:
        assert shared_pool(cfg, {}) == _cs(case["pool"])


@pytest.mark.parametrize("options", [None, FULL_PCPUS], ids=["options=map[]", "options=map[full-pcpus-only:true]"])
@pytest.mark.parametrize("case", ADD_OPTIONS_INSENSITIVE, ids=_ids(ADD_OPTIONS_INSENSITIVE))
def test_static_policy_add_options_insensitive(case: dict[str, Any], options: dict[str, str] | None) -> None:
    _run_add(case, options or {})


@pytest.mark.parametrize("case", ADD_DEFAULT_OPTIONS, ids=_ids(ADD_DEFAULT_OPTIONS))
def test_static_policy_add_default_options(case: dict[str, Any]) -> None:
    _run_add(case)


@pytest.mark.parametrize("case", ADD_SMT_ALIGN, ids=_ids(ADD_SMT_ALIGN))
def test_static_policy_add_smt_align(case: dict[str, Any]) -> None:
    _run_add(case)


@pytest.mark.parametrize("case", ADD_ALIGN_BY_SOCKET, ids=_ids(ADD_ALIGN_BY_SOCKET))
def test_static_policy_add_align_by_socket(case: dict[str, Any]) -> None:
    _run_add(case)


@pytest.mark.parametrize("case", ADD_WITH_RESV_LIST, ids=_ids(ADD_WITH_RESV_LIST))
def test_static_policy_add_with_resv_list(case: dict[str, Any]) -> None:
    _run_add(case)


@pytest.mark.parametrize("case", REUSE_CPUS, ids=_ids(REUSE_CPUS))
def test_static_policy_reuse_cpus(case: dict[str, Any]) -> None:
    cfg = _config(case)
    assignments = _state(cfg, case)
    containers = _pod(case)
    steps = plan_pod_cpus(cfg, assignments, "podUID", qos_class(containers), containers)
    after: dict[str, dict[str, CPUSet]] = {**assignments, "podUID": {s.container: s.cpus for s in steps}}
    assert shared_pool(cfg, after) == _cs(case["after_alloc"])
    # RemoveContainer: the container's CPUs go back unless a sibling still holds them.
    del after["podUID"][case["remove"]]
    assert shared_pool(cfg, after) == _cs(case["after_remove"])


@pytest.mark.parametrize("case", DO_NOT_REUSE_CPUS, ids=_ids(DO_NOT_REUSE_CPUS))
def test_static_policy_do_not_reuse_cpus(case: dict[str, Any]) -> None:
    cfg = _config(case)
    assignments = _state(cfg, case)
    containers = _pod(case)
    steps = plan_pod_cpus(cfg, assignments, "podUID", qos_class(containers), containers)
    assert len(steps) == len(containers)
    after: dict[str, dict[str, CPUSet]] = {**assignments, "podUID": {s.container: s.cpus for s in steps}}
    assert shared_pool(cfg, after) == _cs(case["after_alloc"])


@pytest.mark.parametrize("case", REMOVE, ids=_ids(REMOVE))
def test_static_policy_remove(case: dict[str, Any]) -> None:
    cfg = _config(case)
    assignments = _state(cfg, case)
    assignments.get(case["pod"], {}).pop(case["container"], None)
    assert shared_pool(cfg, assignments) == _cs(case["expect"])
    assert case["container"] not in assignments.get(case["pod"], {})


@pytest.mark.parametrize("case", TOPOLOGY_AWARE_ALLOCATE, ids=_ids(TOPOLOGY_AWARE_ALLOCATE))
def test_topology_aware_allocate_cpus(case: dict[str, Any]) -> None:
    cfg = _config({**case, "count": 0})
    assignments = _state(cfg, case)
    got = allocate(cfg, shared_pool(cfg, assignments), CPUSet(), case["count"], case["mask"])
    assert got == _cs(case["expect"])


@pytest.mark.parametrize("case", STATIC_POLICY_OPTIONS, ids=_ids(STATIC_POLICY_OPTIONS))
def test_static_policy_options(case: dict[str, Any]) -> None:
    if case["error"]:
        with pytest.raises(PolicyOptionError):
            parse_policy_options(case["options"])
        return
    assert parse_policy_options(case["options"]) == case["expect"]


@pytest.mark.parametrize("case", SMT_ERROR_TEXT, ids=_ids(SMT_ERROR_TEXT))
def test_smt_alignment_error_text(case: dict[str, Any]) -> None:
    with pytest.raises(SMTAlignmentError) as err:
        check_smt_alignment(case["requested"], case["per_core"], case["available"])
    assert str(err.value) == case["expect"]


@pytest.mark.parametrize("case", POD_GUARANTEED_CPUS, ids=_ids(POD_GUARANTEED_CPUS))
def test_pod_guaranteed_cpus(case: dict[str, Any]) -> None:
    containers = [_container(f"{kind}-{i}", cpu, cpu, kind) for i, (kind, cpu) in enumerate(case["containers"])]
    cfg = CPUManagerConfig(
        policy="static", topology=_topo("topoDualSocketHT"), reserved=CPUSet(), options=StaticPolicyOptions()
    )
    planner = CPUPlanner(cfg, {}, "podUID", qos_class(containers))
    assert pod_cpu_request(planner, containers) == case["expect"]


def _hints_setup(
    case: Mapping[str, Any], topo: CPUTopology, options: Mapping[str, str]
) -> tuple[CPUPlanner, ContainerSpec]:
    opts = parse_policy_options(dict(options), alpha_enabled=True)
    cfg = CPUManagerConfig(policy="static", topology=topo, reserved=CPUSet(), options=opts)
    assignments = _state(cfg, case)
    container = _container("fakeContainer", case["request"], case["request"])
    return CPUPlanner(cfg, assignments, "fakePod", qos_class([container])), container


@pytest.mark.parametrize("case", HINT_CASES, ids=_ids(HINT_CASES))
def test_get_topology_hints(case: dict[str, Any]) -> None:
    planner, container = _hints_setup(case, discover(HINTS_MACHINE), {})
    assert _hints(planner.hints(container)) == _hints(case["expect"])


@pytest.mark.parametrize("case", HINT_CASES, ids=_ids(HINT_CASES))
def test_get_pod_topology_hints(case: dict[str, Any]) -> None:
    planner, container = _hints_setup(case, discover(HINTS_MACHINE), {})
    assert _hints(planner.pod_hints([container])) == _hints(case["expect"])


@pytest.mark.parametrize("case", POD_HINTS_WITH_OPTIONS, ids=_ids(POD_HINTS_WITH_OPTIONS))
def test_get_pod_topology_hints_with_policy_options(case: dict[str, Any]) -> None:
    planner, container = _hints_setup(case, _topo(case["topo"]), case["options"])
    assert _hints(planner.pod_hints([container])) == _hints(case["expect"])


@pytest.mark.parametrize("case", DERIVED_SOCKET_ALIGNED, ids=_ids(DERIVED_SOCKET_ALIGNED))
def test_derived_socket_aligned_hints(case: dict[str, Any]) -> None:
    planner, container = _hints_setup(case, _topo(case["topo"]), case["options"])
    assert len(case["expect"]) == 255 and sum(p for _, p in case["expect"]) == 30
    assert _hints(planner.hints(container)) == _hints(case["expect"])
    assert _hints(planner.pod_hints([container])) == _hints(case["expect"])
