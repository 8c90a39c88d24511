"""The kubelet's topology-manager table tests, run against ``eventsrc.core.topology_manager``.

Transcribed from kubernetes/kubernetes ``pkg/kubelet/cm/topologymanager``: ``bitmask/bitmask_test.go``,
``policy_test.go`` (commonPolicyMergeTestCases, the best-effort and single-numa-node
mergeTestCases, mergeTestCasesNoPolicies, mergeTestCasesClosestNUMA, TestMaxOfMinAffinityCounts,
TestCompareHintsNarrowest and the NUMA distance tables), ``policy_best_effort_test.go``,
``policy_restricted_test.go``, ``policy_single_numa_node_test.go``, ``policy_none_test.go``,
``numa_info_test.go`` (TestCalculateAvgDistanceFor, TestClosest), ``policy_options_test.go``,
``topology_manager_test.go`` (TestNewManager, TestManagerScope, TestAdmit),
``scope_container_test.go``, and the two topology-manager rows of the kubelet's configuration
validation_test.go. Cases the kubelet's tests do not have are in ``EVENTSRC_*`` tables.

Notation: a hint is ``(nodes, preferred)`` with ``nodes`` a list of NUMA ids, ``None`` for the
kubelet's nil mask, or ``ALL`` for ``NewTestBitMask(numaNodes...)``. A provider is a dict
resource -> list of hints (``None`` = nil list), or ``None`` for a nil map.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from eventsrc.core.topology_manager import (
    TOPOLOGY_AFFINITY_MESSAGE,
    BestEffortPolicy,
    HintMerger,
    NonePolicy,
    NUMAInfo,
    Policy,
    PolicyOptions,
    ProviderHints,
    RestrictedPolicy,
    SingleNumaNodePolicy,
    TopologyAffinityError,
    TopologyHint,
    TopologyManager,
    TopologyManagerError,
    admit_and_allocate,
    check_policy_option_available,
    filter_providers_hints,
    filter_single_numa_hints,
    mask_bits,
    mask_count,
    mask_is_narrower_than,
    mask_of,
    mask_string,
    max_of_min_affinity_counts,
    new_manager,
    new_policy_options,
    parse_topology_manager,
)
from eventsrc.events import ContainerSpec

T, F = True, False
ALL = "ALL"

# ============================================================================ bitmask_test.go

NEW_BITMASK = [  # TestNewEmptyiBitMask + TestNewBitMask: (bits, String())
    ([], "00"),
    ([0], "01"),
    ([1], "10"),
    ([0, 1], "11"),
]
ADD_OUT_OF_RANGE = [[-1, 64]]  # TestAdd "bits outside range 0-63": NewBitMask/Add errors
AND = [  # TestAnd: masks, result
    ([[0, 1], [0, 1]], "11"),
    ([[0, 1], [1]], "10"),
    ([[0], [0, 1]], "01"),
    ([[0, 1], [0, 1], [1]], "10"),
    ([[0], [0], [1], [0, 1]], "00"),
    ([[0, 1, 2, 3], [1, 2, 3], [2, 3], [3]], "1000"),
]
OR = [  # TestOr
    ([[0], []], "01"),
    ([[1], [1]], "10"),
    ([[0], [1]], "11"),
    ([[0, 1], [0, 1]], "11"),
    ([[0], [1], [0, 1]], "11"),
    ([[3], [2], [1], [0]], "1111"),
]
FILL = "1111111111111111111111111111111111111111111111111111111111111111"  # TestFill (3 cases)
IS_EQUAL = [  # TestIsEqual
    ([], [], True),
    ([], [0], False),
    ([0], [0], True),
    ([0], [1], False),
    ([0, 1], [0, 1], True),
]
COUNT = [([], 0), ([0], 1), ([0, 1], 2)]  # TestCount
GET_BITS = [([], []), ([0], [0]), ([0, 1], [0, 1])]  # TestGetBits
IS_NARROWER_THAN = [  # TestIsNarrowerThan: first, second, first narrower
    ([0], [0, 1], True),
    ([0, 1], [0], False),
    ([0], [1], True),
    ([1], [0], False),
]

# ============================================================================ policy_test.go
# commonPolicyMergeTestCases: run by every merging policy.

COMMON_MERGE: list[dict[str, Any]] = [
    {
        "name": "Two providers, 1 hint each, same mask, both preferred 1/2",
        "hp": [{"resource1": [([0], T)]}, {"resource2": [([0], T)]}],
        "expected": ([0], T),
    },
    {
        "name": "Two providers, 1 hint each, same mask, both preferred 2/2",
        "hp": [{"resource1": [([1], T)]}, {"resource2": [([1], T)]}],
        "expected": ([1], T),
    },
    {
        "name": "Two providers, 1 no hints, 1 single hint preferred 1/2",
        "hp": [None, {"resource": [([0], T)]}],
        "expected": ([0], T),
    },
    {
        "name": "Two providers, 1 no hints, 1 single hint preferred 2/2",
        "hp": [None, {"resource": [([1], T)]}],
        "expected": ([1], T),
    },
    {
        "name": "Two providers, 1 with 2 hints, 1 with single hint matching 1/2",
        "hp": [{"resource1": [([0], T), ([1], T)]}, {"resource2": [([0], T)]}],
        "expected": ([0], T),
    },
    {
        "name": "Two providers, 1 with 2 hints, 1 with single hint matching 2/2",
        "hp": [{"resource1": [([0], T), ([1], T)]}, {"resource2": [([1], T)]}],
        "expected": ([1], T),
    },
    {
        "name": "Two providers, both with 2 hints, matching narrower preferred hint from both",
        "hp": [{"resource1": [([0], T), ([1], T)]}, {"resource2": [([0], T), ([0, 1], F)]}],
        "expected": ([0], T),
    },
    {
        "name": "Ensure less narrow preferred hints are chosen over narrower non-preferred hints",
        "hp": [{"resource1": [([1], T), ([0, 1], F)]}, {"resource2": [([0], T), ([1], T), ([0, 1], F)]}],
        "expected": ([1], T),
    },
    {
        "name": "Multiple resources, same provider",
        "hp": [{"resource1": [([1], T), ([0, 1], F)], "resource2": [([0], T), ([1], T), ([0, 1], F)]}],
        "expected": ([1], T),
    },
]

# bestEffortPolicy.mergeTestCases (restricted embeds best-effort: the same cases).
BEST_EFFORT_MERGE: list[dict[str, Any]] = [
    {
        "name": "Two providers, 2 hints each, same mask (some with different bits), same preferred",
        "hp": [{"resource1": [([0, 1], T), ([0, 2], T)]}, {"resource2": [([0, 1], T), ([0, 2], T)]}],
        "expected": ([0, 1], T),
    },
    {"name": "TopologyHint not set", "hp": [], "expected": (ALL, T)},
    {"name": "HintProvider returns empty non-nil map[string][]TopologyHint", "hp": [{}], "expected": (ALL, T)},
    {
        "name": "HintProvider returns -nil map[string][]TopologyHint from provider",
        "hp": [{"resource": None}],
        "expected": (ALL, T),
    },
    {
        "name": "HintProvider returns empty non-nil map[string][]TopologyHint from provider",
        "hp": [{"resource": []}],
        "expected": (ALL, F),
    },
    {
        "name": "Single TopologyHint with Preferred as true and NUMANodeAffinity as nil",
        "hp": [{"resource": [(None, T)]}],
        "expected": (ALL, T),
    },
    {
        "name": "Single TopologyHint with Preferred as false and NUMANodeAffinity as nil",
        "hp": [{"resource": [(None, F)]}],
        "expected": (ALL, F),
    },
    {
        "name": "Two providers, 1 hint each, no common mask",
        "hp": [{"resource1": [([0], T)]}, {"resource2": [([1], T)]}],
        "expected": (ALL, F),
    },
    {
        "name": "Two providers, 1 hint each, same mask, 1 preferred, 1 not 1/2",
        "hp": [{"resource1": [([0], T)]}, {"resource2": [([0], F)]}],
        "expected": ([0], F),
    },
    {
        "name": "Two providers, 1 hint each, same mask, 1 preferred, 1 not 2/2",
        "hp": [{"resource1": [([1], T)]}, {"resource2": [([1], F)]}],
        "expected": ([1], F),
    },
    {
        "name": "Two providers, 1 hint each, 1 wider mask, both preferred 1/2",
        "hp": [{"resource1": [([0], T)]}, {"resource2": [([0, 1], T)]}],
        "expected": ([0], F),
    },
    {
        "name": "Two providers, 1 with 2 hints, 1 with single non-preferred hint matching",
        "hp": [{"resource1": [([0], T), ([1], T)]}, {"resource2": [([0, 1], F)]}],
        "expected": ([0], F),
    },
    {
        "name": "Two providers, 1 hint each, 1 wider mask, both preferred 2/2",
        "hp": [{"resource1": [([1], T)]}, {"resource2": [([0, 1], T)]}],
        "expected": ([1], F),
    },
    {
        "name": "bestNonPreferredAffinityCount (1)",
        "hp": [{"resource1": [([0, 1, 2, 3], F), ([0, 1], F)]}, {"resource2": [([0, 1], F)]}],
        "expected": ([0, 1], F),
    },
    {
        "name": "bestNonPreferredAffinityCount (2)",
        "hp": [{"resource1": [([0, 1, 2, 3], F), ([0, 1], F)]}, {"resource2": [([0, 3], F)]}],
        "expected": ([0, 3], F),
    },
    {
        "name": "bestNonPreferredAffinityCount (3)",
        "hp": [{"resource1": [([0, 1, 2, 3], F), ([0, 1], F)]}, {"resource2": [([1, 2], F)]}],
        "expected": ([1, 2], F),
    },
    {
        "name": "bestNonPreferredAffinityCount (4)",
        "hp": [{"resource1": [([0, 1, 2, 3], F), ([0, 1], F)]}, {"resource2": [([2, 3], F)]}],
        "expected": ([2, 3], F),
    },
]

_BNPAC_5_HP = [{"resource1": [([0, 1, 2, 3], F), ([0, 1], F)]}, {"resource2": [([1, 2], F), ([2, 3], F)]}]
_BNPAC_6_HP = [
    {"resource1": [([0, 1, 2, 3], F), ([0, 1], F)]},
    {"resource2": [([1, 2, 3], F), ([1, 2], F), ([1, 3], F), ([2, 3], F)]},
]

# bestEffortPolicy.mergeTestCasesNoPolicies (without prefer-closest-numa-nodes).
BEST_EFFORT_MERGE_NO_POLICIES: list[dict[str, Any]] = [
    {"name": "bestNonPreferredAffinityCount (5)", "hp": _BNPAC_5_HP, "expected": ([1, 2], F)},
    {"name": "bestNonPreferredAffinityCount (6)", "hp": _BNPAC_6_HP, "expected": ([1, 2], F)},
]

# bestEffortPolicy.mergeTestCasesClosestNUMA (with prefer-closest-numa-nodes, 8 nodes).
BEST_EFFORT_MERGE_CLOSEST_NUMA: list[dict[str, Any]] = [
    {
        "name": "Two providers, 2 hints each, same mask (some with different bits), same preferred",
        "hp": [{"resource1": [([0, 4], T), ([0, 2], T)]}, {"resource2": [([0, 4], T), ([0, 2], T)]}],
        "expected": ([0, 2], T),
    },
    {
        "name": "Two providers, 2 hints each, different mask",
        "hp": [{"resource1": [([4], T), ([0, 2], T)]}, {"resource2": [([4], T), ([0, 2], T)]}],
        "expected": ([4], T),
    },
    {"name": "bestNonPreferredAffinityCount (5)", "hp": _BNPAC_5_HP, "expected": ([2, 3], F)},
    {"name": "bestNonPreferredAffinityCount (6)", "hp": _BNPAC_6_HP, "expected": ([2, 3], F)},
]

# singleNumaNodePolicy.mergeTestCases.
SINGLE_NUMA_NODE_MERGE: list[dict[str, Any]] = [
    {"name": "TopologyHint not set", "hp": [], "expected": (None, T)},
    {"name": "HintProvider returns empty non-nil map[string][]TopologyHint", "hp": [{}], "expected": (None, T)},
    {
        "name": "HintProvider returns -nil map[string][]TopologyHint from provider",
        "hp": [{"resource": None}],
        "expected": (None, T),
    },
    {
        "name": "HintProvider returns empty non-nil map[string][]TopologyHint from provider",
        "hp": [{"resource": []}],
        "expected": (None, F),
    },
    {
        "name": "Single TopologyHint with Preferred as true and NUMANodeAffinity as nil",
        "hp": [{"resource": [(None, T)]}],
        "expected": (None, T),
    },
    {
        "name": "Single TopologyHint with Preferred as false and NUMANodeAffinity as nil",
        "hp": [{"resource": [(None, F)]}],
        "expected": (None, F),
    },
    {
        "name": "Two providers, 1 hint each, no common mask",
        "hp": [{"resource1": [([0], T)]}, {"resource2": [([1], T)]}],
        "expected": (None, F),
    },
    {
        "name": "Two providers, 1 hint each, same mask, 1 preferred, 1 not 1/2",
        "hp": [{"resource1": [([0], T)]}, {"resource2": [([0], F)]}],
        "expected": (None, F),
    },
    {
        "name": "Two providers, 1 hint each, same mask, 1 preferred, 1 not 2/2",
        "hp": [{"resource1": [([1], T)]}, {"resource2": [([1], F)]}],
        "expected": (None, F),
    },
    {
        "name": "Two providers, 1 with 2 hints, 1 with single non-preferred hint matching",
        "hp": [{"resource1": [([0], T), ([1], T)]}, {"resource2": [([0, 1], F)]}],
        "expected": (None, F),
    },
    {
        "name": "Single NUMA hint generation",
        "hp": [{"resource1": [([0, 1], T)], "resource2": [([0], T), ([1], T), ([0, 1], F)]}],
        "expected": (None, F),
    },
    {
        "name": "One no-preference provider",
        "hp": [{"resource1": [([0], T), ([1], T), ([0, 1], F)]}, None],
        "expected": ([0], T),
    },
]

# TestMaxOfMinAffinityCounts: resources' hints (all preferred), expected count.
MAX_OF_MIN_AFFINITY_COUNTS = [
    ([], 0),
    ([[[]]], 0),
    ([[[0]]], 1),
    ([[[0, 1]]], 2),
    ([[[0, 1], [0, 1, 2]]], 2),
    ([[[0, 1], [0, 1, 2]], [[0, 1, 2]]], 3),
    ([[[0, 1], [0, 1, 2]], [[0, 1, 2], [0, 1, 2, 3]]], 3),
]

# TestCompareHintsNarrowest: name, bestNonPreferredAffinityCount, current, candidate, winner.
COMPARE_HINTS_NARROWEST = [
    ("candidate.NUMANodeAffinity.Count() == 0 (1)", -1, None, ([], F), "current"),
    ("candidate.NUMANodeAffinity.Count() == 0 (2)", -1, ([], T), ([], F), "current"),
    ("current == nil (1)", -1, None, ([0], T), "candidate"),
    ("current == nil (2)", -1, None, ([0], F), "candidate"),
    ("!current.Preferred && candidate.Preferred", -1, ([0], F), ([0], T), "candidate"),
    ("current.Preferred && !candidate.Preferred", -1, ([0], T), ([0], F), "current"),
    ("current.Preferred && candidate.Preferred (1)", -1, ([0], T), ([0], T), "current"),
    ("current.Preferred && candidate.Preferred (2)", -1, ([0, 1], T), ([0], T), "candidate"),
    ("current.Preferred && candidate.Preferred (3)", -1, ([0], T), ([0, 1], T), "current"),
    ("!current.Preferred && !candidate.Preferred (1.1)", 1, ([0, 1], F), ([0, 1], F), "current"),
    ("!current.Preferred && !candidate.Preferred (1.2)", 1, ([1, 2], F), ([0, 1], F), "candidate"),
    ("!current.Preferred && !candidate.Preferred (1.3)", 1, ([0, 1], F), ([1, 2], F), "current"),
    ("!current.Preferred && !candidate.Preferred (2.1)", 2, ([0, 1], F), ([0], F), "current"),
    ("!current.Preferred && !candidate.Preferred (2.2)", 2, ([0, 1], F), ([0, 1], F), "current"),
    ("!current.Preferred && !candidate.Preferred (2.3)", 2, ([1, 2], F), ([0, 1], F), "candidate"),
    ("!current.Preferred && !candidate.Preferred (2.4)", 2, ([0, 1], F), ([1, 2], F), "current"),
    ("!current.Preferred && !candidate.Preferred (3a)", 2, ([0], F), ([0, 1, 2], F), "current"),
    ("!current.Preferred && !candidate.Preferred (3b)", 2, ([0], F), ([0, 1], F), "candidate"),
    ("!current.Preferred && !candidate.Preferred (3ca.1)", 3, ([0], F), ([0, 1], F), "candidate"),
    ("!current.Preferred && !candidate.Preferred (3ca.2)", 3, ([0], F), ([1, 2], F), "candidate"),
    ("!current.Preferred && !candidate.Preferred (3ca.3)", 4, ([0, 1], F), ([1, 2, 3], F), "candidate"),
    ("!current.Preferred && !candidate.Preferred (3cb)", 4, ([1, 2, 3], F), ([0, 1], F), "current"),
    ("!current.Preferred && !candidate.Preferred (3cc.1)", 4, ([0, 1, 2], F), ([0, 1, 2], F), "current"),
    ("!current.Preferred && !candidate.Preferred (3cc.2)", 4, ([0, 1, 2], F), ([1, 2, 3], F), "current"),
    ("!current.Preferred && !candidate.Preferred (3cc.3)", 4, ([1, 2, 3], F), ([0, 1, 2], F), "candidate"),
]

# commonNUMAInfoTwoNodes / FourNodes / EightNodes.
DISTANCES_TWO_NODES = {0: [10, 11], 1: [11, 10]}
DISTANCES_FOUR_NODES = {
    0: [10, 11, 12, 12],
    1: [11, 10, 12, 12],
    2: [12, 12, 10, 11],
    3: [12, 12, 11, 10],
}
DISTANCES_EIGHT_NODES = {
    0: [10, 11, 12, 12, 30, 30, 30, 30],
    1: [11, 10, 12, 12, 30, 30, 30, 30],
    2: [12, 12, 10, 11, 30, 30, 30, 30],
    3: [12, 12, 11, 10, 30, 30, 30, 30],
    4: [30, 30, 30, 30, 10, 11, 12, 12],
    5: [30, 30, 30, 30, 11, 10, 12, 12],
    6: [30, 30, 30, 30, 12, 12, 10, 11],
    7: [30, 30, 30, 30, 12, 12, 13, 10],
}

# ============================================================================ numa_info_test.go

# TestCalculateAvgDistanceFor: name, bits, distance rows, expected average.
_ROWS4 = [[10, 11, 12, 12], [11, 10, 12, 12], [12, 12, 10, 11], [12, 12, 11, 10]]
AVG_DISTANCE = [
    ("1 NUMA node", [0], [[10]], 10.0),
    ("2 NUMA node, 1 set in bitmask", [0], [[10, 11], [11, 10]], 10.0),
    ("2 NUMA node, 2 set in bitmask", [0, 1], [[10, 11], [11, 10]], 10.5),
    ("4 NUMA node, 2 set in bitmask", [0, 2], _ROWS4, 11.0),
    ("4 NUMA node, 3 set in bitmask", [0, 2, 3], _ROWS4, 11.11111111111111),
    ("0 NUMA node, 0 set in bitmask", [], [], 0.0),
]
_EQ3 = [[10, 10, 10]] * 3
_EQ4 = [[10, 10, 10, 10]] * 4
# TestClosest: name, current, candidate, winner, distance rows (the test calls Closest(candidate, current)).
CLOSEST = [
    ("current and candidate length is not the same, current narrower", [0], [0, 2], "current", []),
    (
        "current and candidate length is the same, distance is the same, current more lower bits set",
        [0, 1],
        [0, 2],
        "current",
        _EQ3,
    ),
    (
        "current and candidate length is the same, distance is the same, candidate more lower bits set",
        [0, 3],
        [0, 2],
        "candidate",
        _EQ4,
    ),
    (
        "current and candidate length is the same, candidate average distance is smaller",
        [0, 3],
        [0, 1],
        "candidate",
        _ROWS4,
    ),
    (
        "current and candidate length is the same, current average distance is smaller",
        [2, 3],
        [0, 3],
        "current",
        _ROWS4,
    ),
]

# ============================================================================ policy_single_numa_node_test.go

FILTER_SINGLE_NUMA_HINTS: list[dict[str, Any]] = [  # TestPolicySingleNumaNodeFilterHints
    {"name": "filter empty resources", "all": [], "expected": []},
    {
        "name": "filter hints with nil socket mask 1/2",
        "all": [[(None, F)], [(None, T)]],
        "expected": [[], [(None, T)]],
    },
    {
        "name": "filter hints with nil socket mask 2/2",
        "all": [[([0], T), (None, F)], [([1], T), (None, T)]],
        "expected": [[([0], T)], [([1], T), (None, T)]],
    },
    {
        "name": "filter hints with empty resource socket mask",
        "all": [[([1], T), ([0], T), (None, F)], []],
        "expected": [[([1], T), ([0], T)], []],
    },
    {
        "name": "filter hints with wide sockemask",
        "all": [
            [([0], T), ([1], T), ([1, 2], F), ([0, 1, 2], F), (None, F)],
            [([1, 2], F), ([0, 1, 2], F), ([0, 2], F), ([3], F)],
            [([1, 2], F), ([0, 1, 2], F), ([0, 2], F)],
        ],
        "expected": [[([0], T), ([1], T)], [], []],
    },
]

# TestPolicy*CanAdmitPodResult: policy, hint, admit.
CAN_ADMIT = [
    ("none", (None, F), True),
    ("none", (None, T), True),
    ("best-effort", (None, F), True),
    ("best-effort", (None, T), True),
    ("restricted", (None, F), False),
    ("restricted", (None, T), True),
    ("single-numa-node", (None, F), False),
]

# TestPolicyNoneMerge: providers hints -> {nil, false} (TopologyHint{}), admitted.
NONE_MERGE = [
    ("merged empty providers hints", []),
    ("merge with a single provider with a single preferred resource", [{"resource": [([0, 1], T)]}]),
    ("merge with a single provider with a single non-preferred resource", [{"resource": [([0, 1], F)]}]),
]

# ============================================================================ policy_options_test.go
# TestNewTopologyManagerOptions, the cases that need no feature gate (both options are stable
# upstream now; the fancy alpha/beta placeholder options only exist in the Go test).

NEW_OPTIONS: list[dict[str, Any]] = [
    {
        "name": "return TopologyManagerOptions with PreferClosestNUMA set to true",
        "options": {"prefer-closest-numa-nodes": "true", "max-allowable-numa-nodes": "8"},
        "expected": PolicyOptions(prefer_closest_numa=True, max_allowable_numa_nodes=8),
    },
    {
        "name": "return TopologyManagerOptions with MaxAllowableNUMANodes set to 12",
        "options": {"max-allowable-numa-nodes": "12"},
        "expected": PolicyOptions(max_allowable_numa_nodes=12),
    },
    {
        "name": "return empty TopologyManagerOptions",
        "options": {},
        "expected": PolicyOptions(max_allowable_numa_nodes=8),
    },
    {
        "name": "fail to parse options with error PreferClosestNUMANodes",
        "options": {"prefer-closest-numa-nodes": "not a boolean"},
        "error": "bad value for option",
    },
    {
        "name": "fail to parse options with error MaxAllowableNUMANodes",
        "options": {"max-allowable-numa-nodes": "can't parse to int"},
        "error": "unable to convert policy option to integer",
    },
]
POLICY_DEFAULTS_AVAILABLE = [  # TestPolicyDefaultsAvailable
    ("this-option-does-not-exist", False),
    ("prefer-closest-numa-nodes", True),
    ("max-allowable-numa-nodes", True),
]

# Not in the kubelet's tests: the whole messages, checked against policy_options.go's format strings.
EVENTSRC_OPTION_ERRORS = [
    (
        {"prefer-closest-numa-nodes": "not a boolean"},
        'bad value for option "prefer-closest-numa-nodes": strconv.ParseBool: parsing "not a boolean": invalid syntax',
    ),
    (
        {"max-allowable-numa-nodes": "can't parse to int"},
        'unable to convert policy option to integer "max-allowable-numa-nodes": '
        'strconv.Atoi: parsing "can\'t parse to int": invalid syntax',
    ),
    (
        {"max-allowable-numa-nodes": "7"},
        'the minimum value of "max-allowable-numa-nodes" should not be less than 8',
    ),
    ({"unknown-option": "true"}, 'unknown Topology Manager Policy option: "unknown-option"'),
]

# ============================================================================ topology_manager_test.go
# TestNewManager: NewManager(topology, policy, "container", options); error is a substring.
_NINE_NODES = list(range(9))
NEW_MANAGER: list[dict[str, Any]] = [
    {"name": "Policy is set to none", "policy": "none", "expected_policy": "none"},
    {"name": "Policy is set to best-effort", "policy": "best-effort", "expected_policy": "best-effort"},
    {"name": "Policy is set to restricted", "policy": "restricted", "expected_policy": "restricted"},
    {"name": "Policy is set to single-numa-node", "policy": "single-numa-node", "expected_policy": "single-numa-node"},
    {"name": "Policy is set to unknown", "policy": "unknown", "error": 'unknown policy: "unknown"'},
    {
        "name": "Unknown policy name best-effort policy",
        "policy": "best-effort",
        "options": {"unknown-option": "true"},
        "error": "unknown Topology Manager Policy option:",
    },
    {
        "name": "Unknown policy name restricted policy",
        "policy": "restricted",
        "options": {"unknown-option": "true"},
        "error": "unknown Topology Manager Policy option:",
    },
    {
        "name": "can't get NUMA distances",
        "policy": "best-effort",
        "options": {"prefer-closest-numa-nodes": "true"},
        "nodes": [0],
        "error": "error getting NUMA distances from cadvisor",
    },
    {
        "name": "more than 8 NUMA nodes",
        "policy": "best-effort",
        "nodes": _NINE_NODES,
        "error": "unsupported on machines with more than 8 NUMA Nodes",
    },
]
MANAGER_SCOPE = [  # TestManagerScope: NewManager(nil, "best-effort", scope, nil)
    ("container", "container", None),
    ("pod", "pod", None),
    ("unknown", None, 'unknown scope: "unknown"'),
]

# Not in the kubelet's tests: max-allowable-numa-nodes beyond 8 (policy, nodes, options, error).
EVENTSRC_MAX_ALLOWABLE = [
    ("best-effort", 9, {"max-allowable-numa-nodes": "9"}, None),
    ("single-numa-node", 12, {"max-allowable-numa-nodes": "12"}, None),
    ("restricted", 13, {"max-allowable-numa-nodes": "12"}, "unsupported on machines with more than 12 NUMA Nodes"),
    ("none", 16, {}, None),  # NewManager short-circuits the none policy
    ("best-effort", 8, {}, None),
]

# TestAdmit: a pod with one container, NUMA nodes [0, 1]; both scopes must agree.
ADMIT: list[dict[str, Any]] = [
    {"name": "QOSClass set as BestEffort. None Policy. No Hints.", "policy": "none", "hp": [], "admit": True},
    {"name": "QOSClass set as Guaranteed. None Policy. No Hints.", "policy": "none", "hp": [], "admit": True},
    {
        "name": "QOSClass set as BestEffort. single-numa-node Policy. No Hints.",
        "policy": "single-numa-node",
        "hp": [None],
        "admit": True,
    },
    {
        "name": "QOSClass set as BestEffort. Restricted Policy. No Hints.",
        "policy": "restricted",
        "hp": [None],
        "admit": True,
    },
    {
        "name": "QOSClass set as Guaranteed. BestEffort Policy. Preferred Affinity.",
        "policy": "best-effort",
        "hp": [{"resource": [([0], T), ([0, 1], F)]}],
        "admit": True,
    },
    {
        "name": "QOSClass set as Guaranteed. BestEffort Policy. More than one Preferred Affinity.",
        "policy": "best-effort",
        "hp": [{"resource": [([0], T), ([1], T), ([0, 1], F)]}],
        "admit": True,
    },
    {
        "name": "QOSClass set as Burstable. BestEffort Policy. More than one Preferred Affinity.",
        "policy": "best-effort",
        "hp": [{"resource": [([0], T), ([1], T), ([0, 1], F)]}],
        "admit": True,
    },
    {
        "name": "QOSClass set as Guaranteed. BestEffort Policy. No Preferred Affinity.",
        "policy": "best-effort",
        "hp": [{"resource": [([0, 1], F)]}],
        "admit": True,
    },
    {
        "name": "QOSClass set as Guaranteed. Restricted Policy. Preferred Affinity.",
        "policy": "restricted",
        "hp": [{"resource": [([0], T), ([0, 1], F)]}],
        "admit": True,
    },
    {
        "name": "QOSClass set as Burstable. Restricted Policy. Preferred Affinity.",
        "policy": "restricted",
        "hp": [{"resource": [([0], T), ([0, 1], F)]}],
        "admit": True,
    },
    {
        "name": "QOSClass set as Guaranteed. Restricted Policy. More than one Preferred affinity.",
        "policy": "restricted",
        "hp": [{"resource": [([0], T), ([1], T), ([0, 1], F)]}],
        "admit": True,
    },
    {
        "name": "QOSClass set as Burstable. Restricted Policy. More than one Preferred affinity.",
        "policy": "restricted",
        "hp": [{"resource": [([0], T), ([1], T), ([0, 1], F)]}],
        "admit": True,
    },
    {
        "name": "QOSClass set as Guaranteed. Restricted Policy. No Preferred affinity.",
        "policy": "restricted",
        "hp": [{"resource": [([0, 1], F)]}],
        "admit": False,
    },
    {
        "name": "QOSClass set as Burstable. Restricted Policy. No Preferred affinity.",
        "policy": "restricted",
        "hp": [{"resource": [([0, 1], F)]}],
        "admit": False,
    },
]

# ============================================================================ scope_container_test.go
# TestContainerCalculateAffinity / TestContainerAccumulateProvidersHints: the providers' answers
# reach the policy's Merge exactly as given, provider by provider. ``{}`` is an empty map,
# ``None`` a nil map; ``((), F)`` is the zero TopologyHint{} ({nil, false}).
_ZERO = (None, F)
SCOPE_PASS_THROUGH: list[dict[str, Any]] = [
    {"name": "No hint providers", "hp": []},
    {"name": "HintProvider returns empty non-nil map[string][]TopologyHint", "hp": [{}]},
    {"name": "HintProvider returns -nil map[string][]TopologyHint from provider", "hp": [{"resource": None}]},
    {
        "name": "Assorted HintProviders",
        "hp": [
            {"resource-1/A": [([0], T), ([0, 1], F)], "resource-1/B": [([1], T), ([1, 2], F)]},
            {"resource-2/A": [([2], T), ([3, 4], F)], "resource-2/B": [([2], T), ([3, 4], F)]},
            {"resource-3": None},
        ],
    },
    {"name": "2 HintProviders with 1 resource returns hints", "hp": [{"resource1": [_ZERO]}, {"resource2": [_ZERO]}]},
    {"name": "2 HintProviders 1 with 1 resource 1 with nil hints", "hp": [{"resource1": [_ZERO]}, None]},
    {"name": "2 HintProviders 1 with 1 resource 1 empty hints", "hp": [{"resource1": [_ZERO]}, {}]},
    {"name": "HintProvider with 2 resources returns hints", "hp": [{"resource1": [_ZERO], "resource2": [_ZERO]}]},
]

# ============================================================================ config validation_test.go
CONFIG_VALIDATION = [
    (
        "invalid-policy",
        "container",
        'invalid configuration: topologyManagerPolicy (--topology-manager-policy) "invalid-policy" '
        'must be one of: ["none" "best-effort" "restricted" "single-numa-node"]',
    ),
    (
        "none",
        "invalid-scope",
        'invalid configuration: topologyManagerScope (--topology-manager-scope) "invalid-scope" '
        'must be one of: "container", or "pod"',
    ),
]

# ============================================================================ eventsrc's own: filterProvidersHints
# policy.go has no table of its own for it; these follow its four branches, in order.
EVENTSRC_FILTER_PROVIDERS_HINTS: list[dict[str, Any]] = [
    {"name": "no providers", "hp": [], "expected": []},
    {"name": "nil map", "hp": [None], "expected": [[(None, T)]]},
    {"name": "empty map", "hp": [{}], "expected": [[(None, T)]]},
    {"name": "nil list", "hp": [{"r": None}], "expected": [[(None, T)]]},
    {"name": "empty list", "hp": [{"r": []}], "expected": [[(None, F)]]},
    {
        "name": "one list per resource, providers then resources in order",
        "hp": [{"a": [([0], T)], "b": None}, None, {"c": [], "d": [([1], F), (None, T)]}],
        "expected": [[([0], T)], [(None, T)], [(None, T)], [(None, F)], [([1], F), (None, T)]],
    },
]


# ============================================================================ helpers


def hint(spec: tuple[Any, bool], numa_nodes: list[int] | None = None) -> TopologyHint:
    nodes, preferred = spec
    if nodes == ALL:
        assert numa_nodes is not None
        nodes = numa_nodes
    return TopologyHint.of(nodes, preferred)


def providers(hp: list[Any]) -> list[ProviderHints]:
    out: list[ProviderHints] = []
    for p in hp:
        if p is None:
            out.append(None)
        else:
            out.append({r: None if hs is None else [hint(h) for h in hs] for r, hs in p.items()})
    return out


def numa_info(distances: dict[int, list[int]]) -> NUMAInfo:
    return NUMAInfo(nodes=tuple(sorted(distances)), distances=distances)


def run_merge(policy: Policy, case: dict[str, Any], numa_nodes: list[int]) -> None:
    actual, _ = policy.merge(providers(case["hp"]))
    assert actual == hint(case["expected"], numa_nodes), f"{case['name']}: got {actual}"


def ids(case: dict[str, Any]) -> str:
    return str(case["name"])


# ============================================================================ bitmask tests


@pytest.mark.parametrize(("bits", "expected"), NEW_BITMASK)
def test_new_bitmask(bits: list[int], expected: str) -> None:
    assert mask_string(mask_of(bits)) == expected


@pytest.mark.parametrize("bits", ADD_OUT_OF_RANGE)
def test_add_out_of_range(bits: list[int]) -> None:
    with pytest.raises(TopologyManagerError, match="bit number must be in range 0-63"):
        mask_of(bits)


@pytest.mark.parametrize(("masks", "expected"), AND)
def test_and(masks: list[list[int]], expected: str) -> None:
    result = mask_of(masks[0])
    for m in masks:
        result &= mask_of(m)
    assert mask_string(result) == expected


@pytest.mark.parametrize(("masks", "expected"), OR)
def test_or(masks: list[list[int]], expected: str) -> None:
    result = mask_of(masks[0])
    for m in masks:
        result |= mask_of(m)
    assert mask_string(result) == expected


@pytest.mark.parametrize("bits", [[], [0], [0, 1]])
def test_fill(bits: list[int]) -> None:
    assert mask_of(bits) | ((1 << 64) - 1) == (1 << 64) - 1
    assert mask_string((1 << 64) - 1) == FILL


@pytest.mark.parametrize(("first", "second", "equal"), IS_EQUAL)
def test_is_equal(first: list[int], second: list[int], equal: bool) -> None:
    assert (mask_of(first) == mask_of(second)) is equal


@pytest.mark.parametrize(("bits", "count"), COUNT)
def test_count(bits: list[int], count: int) -> None:
    assert mask_count(mask_of(bits)) == count


@pytest.mark.parametrize(("bits", "expected"), GET_BITS)
def test_get_bits(bits: list[int], expected: list[int]) -> None:
    assert mask_bits(mask_of(bits)) == expected


@pytest.mark.parametrize(("first", "second", "narrower"), IS_NARROWER_THAN)
def test_is_narrower_than(first: list[int], second: list[int], narrower: bool) -> None:
    assert mask_is_narrower_than(mask_of(first), mask_of(second)) is narrower
    assert TopologyHint.of(first, True).is_narrower_than(TopologyHint.of(second, True)) is narrower


# ============================================================================ merge tests

FOUR = list(DISTANCES_FOUR_NODES)
EIGHT = list(DISTANCES_EIGHT_NODES)


@pytest.mark.parametrize("case", COMMON_MERGE + BEST_EFFORT_MERGE + BEST_EFFORT_MERGE_NO_POLICIES, ids=ids)
def test_policy_best_effort_merge(case: dict[str, Any]) -> None:
    run_merge(BestEffortPolicy(numa_info(DISTANCES_FOUR_NODES)), case, FOUR)


@pytest.mark.parametrize("case", COMMON_MERGE + BEST_EFFORT_MERGE + BEST_EFFORT_MERGE_CLOSEST_NUMA, ids=ids)
def test_policy_best_effort_merge_closest_numa(case: dict[str, Any]) -> None:
    policy = BestEffortPolicy(numa_info(DISTANCES_EIGHT_NODES), PolicyOptions(prefer_closest_numa=True))
    run_merge(policy, case, EIGHT)


@pytest.mark.parametrize("case", COMMON_MERGE + BEST_EFFORT_MERGE + BEST_EFFORT_MERGE_NO_POLICIES, ids=ids)
def test_policy_restricted_merge(case: dict[str, Any]) -> None:
    run_merge(RestrictedPolicy(numa_info(DISTANCES_FOUR_NODES)), case, FOUR)


@pytest.mark.parametrize("case", COMMON_MERGE + BEST_EFFORT_MERGE + BEST_EFFORT_MERGE_CLOSEST_NUMA, ids=ids)
def test_policy_restricted_merge_closest_numa(case: dict[str, Any]) -> None:
    policy = RestrictedPolicy(numa_info(DISTANCES_EIGHT_NODES), PolicyOptions(prefer_closest_numa=True))
    run_merge(policy, case, EIGHT)


@pytest.mark.parametrize("case", COMMON_MERGE + SINGLE_NUMA_NODE_MERGE, ids=ids)
def test_policy_single_numa_node_merge(case: dict[str, Any]) -> None:
    run_merge(SingleNumaNodePolicy(numa_info(DISTANCES_FOUR_NODES)), case, FOUR)


def test_policy_names() -> None:  # TestPolicyNoneName, TestPolicyRestrictedName
    assert NonePolicy().name == "none"
    assert RestrictedPolicy(numa_info(DISTANCES_TWO_NODES)).name == "restricted"


@pytest.mark.parametrize(("policy_name", "spec", "expected"), CAN_ADMIT)
def test_can_admit_pod_result(policy_name: str, spec: tuple[Any, bool], expected: bool) -> None:
    info = numa_info(DISTANCES_TWO_NODES)
    policy: Policy = {
        "none": NonePolicy(),
        "best-effort": BestEffortPolicy(info),
        "restricted": RestrictedPolicy(info),
        "single-numa-node": SingleNumaNodePolicy(info),
    }[policy_name]
    assert policy.can_admit(hint(spec)) is expected


@pytest.mark.parametrize(("name", "hp"), NONE_MERGE)
def test_policy_none_merge(name: str, hp: list[Any]) -> None:
    result, admit = NonePolicy().merge(providers(hp))
    assert result.is_equal(TopologyHint(None, False)) and admit


@pytest.mark.parametrize("case", FILTER_SINGLE_NUMA_HINTS, ids=ids)
def test_filter_single_numa_hints(case: dict[str, Any]) -> None:
    actual = filter_single_numa_hints([[hint(h) for h in r] for r in case["all"]])
    assert actual == [[hint(h) for h in r] for r in case["expected"]]


@pytest.mark.parametrize("case", EVENTSRC_FILTER_PROVIDERS_HINTS, ids=ids)
def test_filter_providers_hints(case: dict[str, Any]) -> None:
    actual = filter_providers_hints(providers(case["hp"]))
    assert actual == [[hint(h) for h in r] for r in case["expected"]]


@pytest.mark.parametrize(("resources", "expected"), MAX_OF_MIN_AFFINITY_COUNTS)
def test_max_of_min_affinity_counts(resources: list[list[list[int]]], expected: int) -> None:
    hints = [[TopologyHint.of(nodes, True) for nodes in r] for r in resources]
    assert max_of_min_affinity_counts(hints) == expected


@pytest.mark.parametrize(("name", "best", "current", "candidate", "winner"), COMPARE_HINTS_NARROWEST)
def test_compare_hints_narrowest(
    name: str, best: int, current: tuple[Any, bool] | None, candidate: tuple[Any, bool], winner: str
) -> None:
    merger = HintMerger(NUMAInfo(), [], "best-effort", PolicyOptions())
    merger.best_non_preferred_affinity_count = best
    cur = None if current is None else hint(current)
    cand = hint(candidate)
    result = merger.compare(cur, cand)
    assert result is (cur if winner == "current" else cand)


# ============================================================================ numa_info tests


@pytest.mark.parametrize(("name", "bits", "rows", "expected"), AVG_DISTANCE)
def test_calculate_avg_distance_for(name: str, bits: list[int], rows: list[list[int]], expected: float) -> None:
    info = NUMAInfo(nodes=tuple(bits), distances=dict(enumerate(rows)))
    assert info.calculate_average_for(mask_of(bits)) == expected


@pytest.mark.parametrize(("name", "current", "candidate", "winner", "rows"), CLOSEST)
def test_closest(name: str, current: list[int], candidate: list[int], winner: str, rows: list[list[int]]) -> None:
    info = NUMAInfo(distances=dict(enumerate(rows)))
    result = info.closest(mask_of(candidate), mask_of(current))
    assert result == mask_of(current if winner == "current" else candidate)


# ============================================================================ options and manager


@pytest.mark.parametrize("case", NEW_OPTIONS, ids=ids)
def test_new_topology_manager_options(case: dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(TopologyManagerError) as exc:
            new_policy_options(case["options"])
        assert case["error"] in str(exc.value)
    else:
        assert new_policy_options(case["options"]) == case["expected"]


@pytest.mark.parametrize(("option", "available"), POLICY_DEFAULTS_AVAILABLE)
def test_policy_defaults_available(option: str, available: bool) -> None:
    if available:
        check_policy_option_available(option)
    else:
        with pytest.raises(TopologyManagerError):
            check_policy_option_available(option)


@pytest.mark.parametrize(("options", "message"), EVENTSRC_OPTION_ERRORS)
def test_option_error_messages(options: dict[str, str], message: str) -> None:
    with pytest.raises(TopologyManagerError) as exc:
        new_policy_options(options)
    assert str(exc.value) == message


@pytest.mark.parametrize("case", NEW_MANAGER, ids=ids)
def test_new_manager(case: dict[str, Any]) -> None:
    nodes = case.get("nodes", [])
    if "error" in case:
        with pytest.raises(TopologyManagerError) as exc:
            new_manager(nodes, case["policy"], "container", case.get("options"))
        assert case["error"] in str(exc.value)
    else:
        manager = new_manager(nodes, case["policy"], "container", case.get("options"))
        assert manager.policy.name == case["expected_policy"]


@pytest.mark.parametrize(("scope", "expected", "error"), MANAGER_SCOPE)
def test_manager_scope(scope: str, expected: str | None, error: str | None) -> None:
    if error:
        with pytest.raises(TopologyManagerError) as exc:
            new_manager([], "best-effort", scope)
        assert error in str(exc.value)
    else:
        assert new_manager([], "best-effort", scope).scope == expected


@pytest.mark.parametrize(("policy", "count", "options", "error"), EVENTSRC_MAX_ALLOWABLE)
def test_max_allowable_numa_nodes(policy: str, count: int, options: dict[str, str], error: str | None) -> None:
    nodes = list(range(count))
    if error:
        with pytest.raises(TopologyManagerError) as exc:
            parse_topology_manager(policy, "container", options, nodes)
        assert str(exc.value) == error
    else:
        assert parse_topology_manager(policy, "container", options, nodes).policy.name == policy


@pytest.mark.parametrize(("policy", "scope", "message"), CONFIG_VALIDATION)
def test_config_validation(policy: str, scope: str, message: str) -> None:
    with pytest.raises(TopologyManagerError) as exc:
        parse_topology_manager(policy, scope, {}, [0, 1])
    assert str(exc.value) == message


def test_prefer_closest_needs_distances_and_uses_them() -> None:
    with pytest.raises(TopologyManagerError) as exc:
        parse_topology_manager("best-effort", "pod", {"prefer-closest-numa-nodes": "true"}, [0, 1])
    assert str(exc.value) == "cannot discover NUMA topology: error getting NUMA distances from cadvisor"
    # The 8-node example of kubelet-cpu-algorithms.md 8.4: [1,2] by default, [2,3] when closest.
    hp = providers(_BNPAC_5_HP)
    plain = parse_topology_manager("best-effort", "pod", {}, EIGHT)
    closest = parse_topology_manager(
        "best-effort", "pod", {"prefer-closest-numa-nodes": "true"}, EIGHT, DISTANCES_EIGHT_NODES
    )
    assert plain.policy.merge(hp)[0] == TopologyHint.of([1, 2], False)
    assert closest.policy.merge(hp)[0] == TopologyHint.of([2, 3], False)


# ============================================================================ scopes


class Fixed:
    """A hint provider with fixed hints (per container, and "pod" for the pod scope) that
    notes the hint each container is allocated with, and asks nothing."""

    def __init__(self, hints: dict[str, ProviderHints], given: dict[str, TopologyHint]) -> None:
        self.hints, self.given = hints, given

    def topology_hints(self, container: ContainerSpec) -> ProviderHints:
        return self.hints.get(container.name)

    def pod_topology_hints(self, containers: list[ContainerSpec]) -> ProviderHints:
        return self.hints.get("pod")

    def allocate(self, container: ContainerSpec, hint: TopologyHint) -> Generator[None, None, None]:
        self.given[container.name] = hint
        yield from ()


def admit(
    manager: TopologyManager, names: list[str], hints: list[dict[str, ProviderHints]]
) -> tuple[dict[str, TopologyHint], TopologyAffinityError | None]:
    """The one admission path the daemon runs (``admit_and_allocate``), over containers
    ``names`` with one provider per entry of ``hints``: the hint each container was allocated
    with, and the refusal, if any."""
    given: dict[str, TopologyHint] = {}
    containers = [ContainerSpec(name=n) for n in names]
    try:
        for _ in admit_and_allocate(manager, containers, [Fixed(h, given) for h in hints]):
            pass
    except TopologyAffinityError as refused:
        return given, refused
    return given, None


def per_container(name: str, hp: list[ProviderHints]) -> list[dict[str, ProviderHints]]:
    return [{name: h} for h in hp]


@pytest.mark.parametrize("case", ADMIT, ids=ids)
def test_admit(case: dict[str, Any]) -> None:
    nodes = list(DISTANCES_TWO_NODES)
    manager = {scope: parse_topology_manager(case["policy"], scope, {}, nodes) for scope in ("container", "pod")}
    hp = providers(case["hp"])
    for given, refused in (
        admit(manager["container"], ["c"], per_container("c", hp)),
        admit(manager["pod"], ["c"], per_container("pod", hp)),
    ):
        assert (refused is None) is case["admit"]
        if refused is not None:
            assert str(refused) == TOPOLOGY_AFFINITY_MESSAGE
            assert refused.hint == TopologyHint.of([0, 1], False)
            assert given == {}


class RecordingPolicy(NonePolicy):
    """The Go tests' mockPolicy: remembers what Merge was given."""

    def __init__(self) -> None:
        self.seen: list[list[ProviderHints]] = []

    def merge(self, providers_hints: Any) -> tuple[TopologyHint, bool]:
        self.seen.append(providers_hints)
        return TopologyHint(None, False), True


@pytest.mark.parametrize("case", SCOPE_PASS_THROUGH, ids=ids)
def test_container_scope_passes_provider_hints(case: dict[str, Any]) -> None:
    policy = RecordingPolicy()
    manager = TopologyManager(policy, "container", PolicyOptions(), numa_info(DISTANCES_TWO_NODES))
    admit(manager, ["c"], per_container("c", providers(case["hp"])))
    assert policy.seen == [providers(case["hp"])]


def test_container_scope_stops_at_first_rejection() -> None:
    manager = parse_topology_manager("restricted", "container", {}, list(DISTANCES_TWO_NODES))
    ok = {"cpu": [TopologyHint.of([1], True), TopologyHint.of([0, 1], False)]}
    bad = {"cpu": [TopologyHint.of([0, 1], False)]}
    given, refused = admit(manager, ["init", "app", "late"], [{"init": ok, "app": bad, "late": ok}])
    assert refused is not None and refused.container == "app"
    assert given == {"init": TopologyHint.of([1], True)}
    assert refused.hint == TopologyHint.of([0, 1], False)


def test_pod_scope_gives_every_container_the_same_hint() -> None:
    manager = parse_topology_manager("single-numa-node", "pod", {}, list(DISTANCES_TWO_NODES))
    hp = providers([{"cpu": [([1], T), ([0, 1], F)]}, {"gpu": [([1], T)]}])
    given, refused = admit(manager, ["init", "a", "b"], per_container("pod", hp))
    assert refused is None
    assert given == dict.fromkeys(["init", "a", "b"], TopologyHint.of([1], True))


def test_none_policy_scope() -> None:
    manager = parse_topology_manager("none", "pod", {"unknown-option": "x"}, list(range(16)))
    given, refused = admit(manager, ["a"], per_container("pod", providers([{"r": []}])))
    assert manager.scope == "none" and refused is None and given == {"a": TopologyHint(None, False)}


# ============================================================================ hint providers (eventsrc's)


class Provider:
    """A hint provider that notes every call; its allocation asks one question and notes the
    answer."""

    def __init__(self, name: str, log: list[tuple[str, ...]], hints: dict[str, ProviderHints]) -> None:
        self.name, self.log, self.hints = name, log, hints

    def topology_hints(self, container: ContainerSpec) -> ProviderHints:
        self.log.append((self.name, "hints", container.name))
        return self.hints.get(container.name)

    def pod_topology_hints(self, containers: list[ContainerSpec]) -> ProviderHints:
        self.log.append((self.name, "pod hints"))
        return self.hints.get("pod")

    def allocate(self, container: ContainerSpec, hint: TopologyHint) -> Generator[str, str, None]:
        answer = yield f"{self.name} {container.name}"
        self.log.append((self.name, "allocate", container.name, str(hint), answer))


def walk(scope: str, policy: str, hints: dict[str, ProviderHints]) -> tuple[list[tuple[str, ...]], object]:
    """admit_and_allocate over an init and an app container with providers a and b; each
    question is answered with itself, upper-cased."""
    log: list[tuple[str, ...]] = []
    manager = parse_topology_manager(policy, scope, {}, [0, 1])
    containers = [ContainerSpec(name="init", kind="init"), ContainerSpec(name="app")]
    gen = admit_and_allocate(manager, containers, [Provider("a", log, hints), Provider("b", log, {})])
    try:
        question = next(gen)
        while True:
            log.append(("asked", question))
            question = gen.send(question.upper())
    except StopIteration:
        return log, None
    except TopologyAffinityError as refused:
        return log, (refused.container, str(refused.hint))


ON_1 = {"cpu": [TopologyHint.of([1], True)]}


def test_the_container_scope_asks_each_container_s_hints_after_the_containers_before_it_are_allocated() -> None:
    log, refused = walk("container", "best-effort", {"init": ON_1, "app": ON_1})
    assert refused is None
    assert log == [
        *[("a", "hints", "init"), ("b", "hints", "init")],
        *[("asked", "a init"), ("a", "allocate", "init", "{10 true}", "A INIT")],
        *[("asked", "b init"), ("b", "allocate", "init", "{10 true}", "B INIT")],
        *[("a", "hints", "app"), ("b", "hints", "app")],
        *[("asked", "a app"), ("a", "allocate", "app", "{10 true}", "A APP")],
        *[("asked", "b app"), ("b", "allocate", "app", "{10 true}", "B APP")],
    ]


def test_the_pod_scope_merges_once_before_any_allocation_and_the_none_scope_never() -> None:
    pod, _ = walk("pod", "single-numa-node", {"pod": ON_1})
    assert pod[:2] == [("a", "pod hints"), ("b", "pod hints")]
    assert [e[3] for e in pod[2:] if e[1] == "allocate"] == ["{10 true}"] * 4
    none, _ = walk("container", "none", {"init": ON_1, "app": ON_1})
    assert [e[1] for e in none if e[0] != "asked"] == ["allocate"] * 4
    assert {e[3] for e in none if e[0] != "asked"} == {"{<nil> false}"}


def test_a_refused_merge_names_its_container_and_allocates_nothing_more() -> None:
    log, refused = walk("container", "restricted", {"init": ON_1, "app": {"cpu": []}})
    assert refused == ("app", "{11 false}")
    assert [e for e in log if e[1] == "allocate"] == [
        ("a", "allocate", "init", "{10 true}", "A INIT"),
        ("b", "allocate", "init", "{10 true}", "B INIT"),
    ]
    assert log[-2:] == [("a", "hints", "app"), ("b", "hints", "app")]
    _, refused = walk("pod", "restricted", {"pod": {"cpu": []}})
    assert refused == ("", "{11 false}")
