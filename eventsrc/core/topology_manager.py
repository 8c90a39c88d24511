"""The kubelet's topology manager as pure functions: hints, merge, policies, options, scopes.

Ported from kubernetes/kubernetes ``pkg/kubelet/cm/topologymanager`` (``bitmask/bitmask.go``,
``policy.go``, ``policy_none.go``, ``policy_best_effort.go``, ``policy_restricted.go``,
``policy_single_numa_node.go``, ``policy_options.go``, ``numa_info.go``, ``scope*.go``,
``topology_manager.go``) and the topology-manager checks of the kubelet's configuration
validation (``pkg/kubelet/apis/config/validation/validation.go``). No I/O, no clock.

Representation
--------------
* A NUMA affinity is an ``int`` bitmask (bit *n* = NUMA node *n*, nodes 0..63 as in
  ``bitmask.go``); ``None`` is the kubelet's nil mask ("no preference"). ``0`` is an
  empty, non-nil mask: the two are different, as in Go.
* Provider output is ``Mapping[resource, Sequence[TopologyHint] | None] | None``: a provider
  that returned a nil or empty map, a resource whose list is nil, a resource whose list is
  empty, exactly the four cases ``filterProvidersHints`` tells apart. Resources are taken in
  the mapping's order (Go iterates a map in random order; the merge's result does not
  depend on it except through ties that the kubelet's own tests never exercise).

The merge
---------
``HintMerger`` walks the cross product of the per-resource lists in list order, merges each
permutation by AND-ing its non-nil masks into the all-NUMA mask (preferred only when every
hint is preferred and every non-nil mask is the same), and keeps the best with
``HintMerger.compare``, including ``bestNonPreferredAffinityCount`` and the
``prefer-closest-numa-nodes`` tie-break (ignored by single-numa-node). When no permutation
gives a non-empty mask the result is ``{all NUMA nodes, not preferred}``.

Options
-------
``prefer-closest-numa-nodes`` (bool, Go ``strconv.ParseBool``) and ``max-allowable-numa-nodes``
(int, Go ``strconv.Atoi``, at least 8, default 8) are both stable options in current upstream,
so there is no feature-gate check here. Like the kubelet's ``NewManager``, the ``none`` policy
short-circuits: its options are not parsed and the machine's NUMA count is not checked.

Scopes
------
One admission path, the one the daemon runs (``admit_and_allocate``, below): the container
scope merges once per container (init containers then app containers, in the order given)
and stops at the first rejection; the pod scope merges the pod-level hints once and gives
every container the same hint; the none scope merges nothing. A rejection is a
``TopologyAffinityError`` (the kubelet's reason) with its message, ``Resources cannot be
allocated with Topology locality``, the merged hint and the container.

Hint providers
--------------
``HintProvider`` is the kubelet's interface of the same name: a resource manager (the CPU
manager, the device manager) gives hints for a container or for the whole pod, and allocates
a container's resources with the hint the scope merged for it. ``admit_and_allocate`` is a
scope's ``Admit`` with its ``allocateAlignedResources``: container by container, the hint,
then every provider's allocation, in the providers' order. Allocation may need a question
answered (the device manager asks a plugin for its preferred allocation): ``allocate`` is a
generator that yields the question and receives the answer, and ``admit_and_allocate``
passes both through.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from eventsrc.core.devices.names import go_quote
from eventsrc.errors import EventsrcError
from eventsrc.events import ContainerSpec

# --------------------------------------------------------------------------- names and messages

POLICY_NONE = "none"
POLICY_BEST_EFFORT = "best-effort"
POLICY_RESTRICTED = "restricted"
POLICY_SINGLE_NUMA_NODE = "single-numa-node"
POLICIES = (POLICY_NONE, POLICY_BEST_EFFORT, POLICY_RESTRICTED, POLICY_SINGLE_NUMA_NODE)

SCOPE_CONTAINER = "container"
SCOPE_POD = "pod"
SCOPE_NONE = "none"  # the kubelet's noneScope, used whenever the policy is "none"

PREFER_CLOSEST_NUMA_NODES = "prefer-closest-numa-nodes"
MAX_ALLOWABLE_NUMA_NODES = "max-allowable-numa-nodes"
STABLE_OPTIONS = frozenset({PREFER_CLOSEST_NUMA_NODES, MAX_ALLOWABLE_NUMA_NODES})

DEFAULT_MAX_ALLOWABLE_NUMA_NODES = 8

TOPOLOGY_AFFINITY_MESSAGE = "Resources cannot be allocated with Topology locality"

_BITMASK_BITS = 64


class TopologyManagerError(EventsrcError, ValueError):
    """A topology-manager configuration the kubelet would refuse; the kubelet's message."""

    exit_code = 2


# --------------------------------------------------------------------------- bitmask.go


def mask_of(nodes: Iterable[int]) -> int:
    """``bitmask.NewBitMask(nodes...)``; a bit outside 0-63 is the kubelet's error."""
    mask = 0
    for n in nodes:
        if n < 0 or n >= _BITMASK_BITS:
            raise TopologyManagerError("bit number must be in range 0-63")
        mask |= 1 << n
    return mask


def mask_bits(mask: int) -> list[int]:
    """``GetBits``: the set bits, ascending."""
    return [i for i in range(_BITMASK_BITS) if mask >> i & 1]


def mask_count(mask: int) -> int:
    return mask.bit_count()


def mask_is_narrower_than(a: int, b: int) -> bool:
    """``IsNarrowerThan``: fewer bits set; with equal counts, the smaller integer value."""
    if mask_count(a) == mask_count(b):
        return a < b
    return mask_count(a) < mask_count(b)


def mask_string(mask: int) -> str:
    """``bitMask.String``: binary, zero-padded to an even width (quirk included)."""
    grouping = 2
    for shift in range(_BITMASK_BITS - grouping, 0, -grouping):
        if mask > (1 << shift):
            return format(mask, f"0{shift + grouping}b")
    return format(mask, f"0{grouping}b")


# --------------------------------------------------------------------------- hints


@dataclass(frozen=True)
class TopologyHint:
    """A NUMA affinity (``None`` = nil, no preference) and whether it is preferred."""

    affinity: int | None
    preferred: bool

    @classmethod
    def of(cls, nodes: Iterable[int] | None, preferred: bool) -> TopologyHint:
        return cls(None if nodes is None else mask_of(nodes), preferred)

    def nodes(self) -> list[int] | None:
        return None if self.affinity is None else mask_bits(self.affinity)

    def is_narrower_than(self, other: TopologyHint) -> bool:
        """The masks' ``IsNarrowerThan``; both must be non-nil, as in Go."""
        assert self.affinity is not None and other.affinity is not None
        return mask_is_narrower_than(self.affinity, other.affinity)

    def is_equal(self, other: TopologyHint) -> bool:
        """``TopologyHint.IsEqual``."""
        return self.preferred == other.preferred and self.affinity == other.affinity

    def less_than(self, other: TopologyHint) -> bool:
        """``TopologyHint.LessThan``: preferred first, then the narrower mask."""
        if self.preferred != other.preferred:
            return self.preferred
        return self.is_narrower_than(other)

    def __str__(self) -> str:
        mask = "<nil>" if self.affinity is None else mask_string(self.affinity)
        return f"{{{mask} {'true' if self.preferred else 'false'}}}"


ProviderHints = Mapping[str, Sequence[TopologyHint] | None] | None
"""One hint provider's answer: resource -> hints (``None`` = nil list); ``None`` = nil map."""


def filter_providers_hints(providers_hints: Sequence[ProviderHints]) -> list[list[TopologyHint]]:
    """``filterProvidersHints``: one list per resource, with the kubelet's defaults."""
    all_hints: list[list[TopologyHint]] = []
    for hints in providers_hints:
        if not hints:  # nil or empty map: no preference for any resource
            all_hints.append([TopologyHint(None, True)])
            continue
        for resource in hints:
            resource_hints = hints[resource]
            if resource_hints is None:  # no preference for this resource
                all_hints.append([TopologyHint(None, True)])
            elif len(resource_hints) == 0:  # no possible placement
                all_hints.append([TopologyHint(None, False)])
            else:
                all_hints.append(list(resource_hints))
    return all_hints


def filter_single_numa_hints(all_resources_hints: Sequence[Sequence[TopologyHint]]) -> list[list[TopologyHint]]:
    """``filterSingleNumaHints``: keep preferred hints that are nil or on exactly one node."""
    filtered_all: list[list[TopologyHint]] = []
    for resource_hints in all_resources_hints:
        filtered: list[TopologyHint] = []
        for hint in resource_hints:
            if hint.affinity is None and hint.preferred:
                filtered.append(hint)
            if hint.affinity is not None and mask_count(hint.affinity) == 1 and hint.preferred:
                filtered.append(hint)
        filtered_all.append(filtered)
    return filtered_all


# --------------------------------------------------------------------------- numa_info.go


@dataclass(frozen=True)
class NUMAInfo:
    """The machine's NUMA node ids and, for prefer-closest, the distance rows.

    ``distances[a][b]`` is the distance from node ``a`` to node ``b``: the row is indexed by
    node id, as ``NUMADistances`` is (the sysfs ``distance`` file, in node order).
    """

    nodes: tuple[int, ...] = ()
    distances: Mapping[int, Sequence[int]] = field(default_factory=dict)

    def default_affinity_mask(self) -> int:
        return mask_of(self.nodes)

    def narrowest(self, m1: int, m2: int) -> int:
        return m1 if mask_is_narrower_than(m1, m2) else m2

    def calculate_average_for(self, mask: int) -> float:
        """``NUMADistances.CalculateAverageFor``: mean over all ordered pairs, self included."""
        if mask_count(mask) == 0:
            return 0.0
        count = 0.0
        total = 0.0
        bits = mask_bits(mask)
        for node1 in bits:
            for node2 in bits:
                total += float(self.distances[node1][node2])
                count += 1
        return total / count

    def closest(self, m1: int, m2: int) -> int:
        """``NUMAInfo.Closest``: narrower; else nearer on average; else the lower mask."""
        if mask_count(m1) != mask_count(m2):
            return self.narrowest(m1, m2)
        d1 = self.calculate_average_for(m1)
        d2 = self.calculate_average_for(m2)
        if d1 == d2:
            return m1 if m1 < m2 else m2
        return m1 if d1 < d2 else m2


# --------------------------------------------------------------------------- policy_options.go


@dataclass(frozen=True)
class PolicyOptions:
    prefer_closest_numa: bool = False
    max_allowable_numa_nodes: int = DEFAULT_MAX_ALLOWABLE_NUMA_NODES


_GO_BOOLS = {
    **dict.fromkeys(("1", "t", "T", "TRUE", "true", "True"), True),
    **dict.fromkeys(("0", "f", "F", "FALSE", "false", "False"), False),
}
_GO_INT = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _go_parse_bool(value: str) -> bool:
    if value not in _GO_BOOLS:
        raise ValueError(f"strconv.ParseBool: parsing {go_quote(value)}: invalid syntax")
    return _GO_BOOLS[value]


def _go_atoi(value: str) -> int:
    if not _GO_INT.fullmatch(value):
        raise ValueError(f"strconv.Atoi: parsing {go_quote(value)}: invalid syntax")
    n = int(value)
    if not _INT64_MIN <= n <= _INT64_MAX:
        raise ValueError(f"strconv.Atoi: parsing {go_quote(value)}: value out of range")
    return n


def check_policy_option_available(option: str) -> None:
    """``CheckPolicyOptionAvailable``; every known option is stable, so only the name counts."""
    if option not in STABLE_OPTIONS:
        raise TopologyManagerError(f"unknown Topology Manager Policy option: {go_quote(option)}")


def new_policy_options(policy_options: Mapping[str, str] | None) -> PolicyOptions:
    """``NewPolicyOptions``: the options, checked in the order given."""
    prefer_closest = False
    max_allowable = DEFAULT_MAX_ALLOWABLE_NUMA_NODES
    for name, value in (policy_options or {}).items():
        check_policy_option_available(name)
        if name == PREFER_CLOSEST_NUMA_NODES:
            try:
                prefer_closest = _go_parse_bool(value)
            except ValueError as e:
                raise TopologyManagerError(f"bad value for option {go_quote(name)}: {e}") from None
        elif name == MAX_ALLOWABLE_NUMA_NODES:
            try:
                n = _go_atoi(value)
            except ValueError as e:
                raise TopologyManagerError(
                    f"unable to convert policy option to integer {go_quote(name)}: {e}"
                ) from None
            if n < DEFAULT_MAX_ALLOWABLE_NUMA_NODES:
                raise TopologyManagerError(
                    f"the minimum value of {go_quote(name)} should not be less than {DEFAULT_MAX_ALLOWABLE_NUMA_NODES}"
                )
            # Above 8 the kubelet only logs a warning; admission may get slow.
            max_allowable = n
    return PolicyOptions(prefer_closest_numa=prefer_closest, max_allowable_numa_nodes=max_allowable)


# --------------------------------------------------------------------------- policy.go


def merge_permutation(default_affinity: int, permutation: Sequence[TopologyHint]) -> TopologyHint:
    """``mergePermutation``: AND of the non-nil masks; preferred if all are, on one mask."""
    preferred = True
    affinities: list[int] = []
    for hint in permutation:
        if hint.affinity is not None:
            affinities.append(hint.affinity)
            if hint.affinity != affinities[0]:
                preferred = False
        if not hint.preferred:
            preferred = False
    merged = default_affinity
    for a in affinities:
        merged &= a
    return TopologyHint(merged, preferred)


def _narrowest_hint(hints: Sequence[TopologyHint]) -> TopologyHint | None:
    narrowest: TopologyHint | None = None
    for hint in hints:
        if hint.affinity is None:
            continue
        if narrowest is None:
            narrowest = hint
        assert narrowest.affinity is not None
        if mask_is_narrower_than(hint.affinity, narrowest.affinity):
            narrowest = hint
    return narrowest


def max_of_min_affinity_counts(filtered_hints: Sequence[Sequence[TopologyHint]]) -> int:
    """``maxOfMinAffinityCounts``: the bestNonPreferredAffinityCount."""
    result = 0
    for resource_hints in filtered_hints:
        narrowest = _narrowest_hint(resource_hints)
        if narrowest is None:
            continue
        assert narrowest.affinity is not None
        result = max(result, mask_count(narrowest.affinity))
    return result


class HintMerger:
    """``HintMerger``: picks the best merged hint over every permutation."""

    def __init__(
        self,
        numa_info: NUMAInfo,
        hints: Sequence[Sequence[TopologyHint]],
        policy_name: str,
        opts: PolicyOptions,
    ) -> None:
        self.numa_info = numa_info
        self.hints = hints
        self.best_non_preferred_affinity_count = max_of_min_affinity_counts(hints)
        self._closest = policy_name != POLICY_SINGLE_NUMA_NODE and opts.prefer_closest_numa

    def compare_numa_affinity_masks(self, current: TopologyHint, candidate: TopologyHint) -> TopologyHint:
        """Returns ``current`` or ``candidate`` itself (identity matters in the tests)."""
        assert current.affinity is not None and candidate.affinity is not None
        if candidate.affinity == current.affinity:
            return current
        if self._closest:
            best = self.numa_info.closest(current.affinity, candidate.affinity)
        else:
            best = self.numa_info.narrowest(current.affinity, candidate.affinity)
        return current if best == current.affinity else candidate

    def compare(self, current: TopologyHint | None, candidate: TopologyHint) -> TopologyHint | None:
        """``HintMerger.compare``, case for case."""
        assert candidate.affinity is not None
        if mask_count(candidate.affinity) == 0:
            return current
        if current is None:
            return candidate
        if not current.preferred and candidate.preferred:
            return candidate
        if current.preferred and not candidate.preferred:
            return current
        if current.preferred and candidate.preferred:
            return self.compare_numa_affinity_masks(current, candidate)
        # Both non-preferred: get as close as possible to (not above) the best count.
        assert current.affinity is not None
        best = self.best_non_preferred_affinity_count
        cur_n = mask_count(current.affinity)
        cand_n = mask_count(candidate.affinity)
        if cur_n > best:  # case 1
            return self.compare_numa_affinity_masks(current, candidate)
        if cur_n == best:  # case 2
            if cand_n != best:
                return current
            return self.compare_numa_affinity_masks(current, candidate)
        if cand_n > best:  # case 3a
            return current
        if cand_n == best:  # case 3b
            return candidate
        if cand_n > cur_n:  # case 3ca
            return candidate
        if cand_n < cur_n:  # case 3cb
            return current
        return self.compare_numa_affinity_masks(current, candidate)  # case 3cc

    def merge(self) -> TopologyHint:
        default_affinity = self.numa_info.default_affinity_mask()
        best: TopologyHint | None = None
        # itertools.product walks the lists as the kubelet's recursion does (last fastest);
        # no lists: one empty permutation; an empty list: no permutation at all.
        for permutation in itertools.product(*self.hints):
            best = self.compare(best, merge_permutation(default_affinity, permutation))
        if best is None:
            best = TopologyHint(default_affinity, False)
        return best


# --------------------------------------------------------------------------- policies


class Policy:
    """A topology-manager policy: ``merge`` returns the merged hint and the admit decision."""

    name = ""

    def can_admit(self, hint: TopologyHint) -> bool:
        raise NotImplementedError

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        raise NotImplementedError


class NonePolicy(Policy):
    name = POLICY_NONE

    def can_admit(self, hint: TopologyHint) -> bool:
        return True

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        return TopologyHint(None, False), True


class BestEffortPolicy(Policy):
    name = POLICY_BEST_EFFORT

    def __init__(self, numa_info: NUMAInfo, opts: PolicyOptions | None = None) -> None:
        self.numa_info = numa_info
        self.opts = opts or PolicyOptions()

    def can_admit(self, hint: TopologyHint) -> bool:
        return True

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        filtered = filter_providers_hints(providers_hints)
        best = HintMerger(self.numa_info, filtered, self.name, self.opts).merge()
        return best, self.can_admit(best)


class RestrictedPolicy(BestEffortPolicy):
    name = POLICY_RESTRICTED

    def can_admit(self, hint: TopologyHint) -> bool:
        return hint.preferred


class SingleNumaNodePolicy(Policy):
    name = POLICY_SINGLE_NUMA_NODE

    def __init__(self, numa_info: NUMAInfo, opts: PolicyOptions | None = None) -> None:
        self.numa_info = numa_info
        self.opts = opts or PolicyOptions()

    def can_admit(self, hint: TopologyHint) -> bool:
        return hint.preferred

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        filtered = filter_providers_hints(providers_hints)
        single = filter_single_numa_hints(filtered)
        best = HintMerger(self.numa_info, single, self.name, self.opts).merge()
        if best.affinity == self.numa_info.default_affinity_mask():
            best = TopologyHint(None, best.preferred)
        return best, self.can_admit(best)


# --------------------------------------------------------------------------- scopes


# --------------------------------------------------------------------------- hint providers

Ask = TypeVar("Ask")  # what a provider's allocation asks the shell (yields)
Answer = TypeVar("Answer")  # and the answer it is given (receives)
_Ask_co = TypeVar("_Ask_co", covariant=True)
_Answer_contra = TypeVar("_Answer_contra", contravariant=True)


class HintProvider(Protocol[_Ask_co, _Answer_contra]):
    """``topologymanager.HintProvider``: one resource manager, for one pod."""

    def topology_hints(self, container: ContainerSpec) -> ProviderHints:
        """``GetTopologyHints``: the container's hints per resource, given what the
        containers before it were allocated."""
        ...

    def pod_topology_hints(self, containers: list[ContainerSpec]) -> ProviderHints:
        """``GetPodTopologyHints``: the pod's hints per resource (the pod scope)."""
        ...

    def allocate(self, container: ContainerSpec, hint: TopologyHint) -> Generator[_Ask_co, _Answer_contra, None]:
        """``Allocate``: the container's resources, within ``hint`` (the merged hint the scope
        stored for it). Raises an exception whose message is the kubelet's reason to refuse
        the pod."""
        ...


class TopologyAffinityError(Exception):
    """The policy refused a merged hint: the kubelet's ``TopologyAffinityError``, with the
    hint and the container whose merge it was ("" for the pod scope's one merge)."""

    def __init__(self, hint: TopologyHint, container: str) -> None:
        super().__init__(TOPOLOGY_AFFINITY_MESSAGE)
        self.hint = hint
        self.container = container


def _merged(policy: Policy, providers_hints: Sequence[ProviderHints], container: str) -> TopologyHint:
    best, admit = policy.merge(providers_hints)
    if not admit:
        raise TopologyAffinityError(best, container)
    return best


def admit_and_allocate(
    manager: TopologyManager, containers: list[ContainerSpec], providers: Sequence[HintProvider[Ask, Answer]]
) -> Generator[Ask, Answer, None]:
    """A scope's ``Admit`` with ``allocateAlignedResources``, over ``containers`` in admission
    order (init containers first).

    Each container's hint is, in the container scope, the merge of every provider's
    ``topology_hints`` for it, asked after the containers before it were allocated; in the
    pod scope, the one merge of the providers' ``pod_topology_hints``, before any container;
    in the none scope, ``{nil, false}`` (nothing merged). Every provider then allocates the
    container with that hint, in the providers' order. Raises TopologyAffinityError when the
    policy refuses a merge; what a provider's ``allocate`` raises goes through.
    """
    pod_hint = TopologyHint(None, False)  # the none scope's, for every container
    if manager.scope == SCOPE_POD:
        pod_hint = _merged(manager.policy, [p.pod_topology_hints(containers) for p in providers], "")
    for c in containers:
        hint = pod_hint
        if manager.scope == SCOPE_CONTAINER:
            hint = _merged(manager.policy, [p.topology_hints(c) for p in providers], c.name)
        for p in providers:
            yield from p.allocate(c, hint)


# --------------------------------------------------------------------------- topology_manager.go


@dataclass(frozen=True)
class TopologyManager:
    """A configured topology manager: a policy and a scope (``none`` with the none policy)."""

    policy: Policy
    scope: str
    options: PolicyOptions
    numa_info: NUMAInfo


def new_numa_info(
    numa_nodes: Sequence[int], distances: Mapping[int, Sequence[int]] | None, opts: PolicyOptions
) -> NUMAInfo:
    """``NewNUMAInfo``: distances are only needed (and then required) for prefer-closest."""
    rows: dict[int, Sequence[int]] = {}
    if opts.prefer_closest_numa:
        for node in numa_nodes:
            row = None if distances is None else distances.get(node)
            if row is None:
                raise TopologyManagerError("cannot discover NUMA topology: error getting NUMA distances from cadvisor")
            if len(row) <= max(numa_nodes):  # eventsrc's own check: Go would index out of range
                raise TopologyManagerError(
                    f"NUMA distance row of node {node} has {len(row)} entries; "
                    f"it needs one per node id up to {max(numa_nodes)}"
                )
            rows[node] = tuple(row)
    return NUMAInfo(nodes=tuple(numa_nodes), distances=rows)


def new_manager(
    numa_nodes: Sequence[int],
    policy: str,
    scope: str,
    options: Mapping[str, str] | None = None,
    distances: Mapping[int, Sequence[int]] | None = None,
) -> TopologyManager:
    """``topologymanager.NewManager``, with its messages and its order of checks."""
    if policy == POLICY_NONE:  # the kubelet short-circuits: scope and options are not looked at
        return TopologyManager(NonePolicy(), SCOPE_NONE, PolicyOptions(), NUMAInfo(tuple(numa_nodes)))
    opts = new_policy_options(options)
    numa_info = new_numa_info(numa_nodes, distances, opts)
    if len(numa_info.nodes) > opts.max_allowable_numa_nodes:
        raise TopologyManagerError(f"unsupported on machines with more than {opts.max_allowable_numa_nodes} NUMA Nodes")
    chosen: Policy
    if policy == POLICY_BEST_EFFORT:
        chosen = BestEffortPolicy(numa_info, opts)
    elif policy == POLICY_RESTRICTED:
        chosen = RestrictedPolicy(numa_info, opts)
    elif policy == POLICY_SINGLE_NUMA_NODE:
        chosen = SingleNumaNodePolicy(numa_info, opts)
    else:
        raise TopologyManagerError(f"unknown policy: {go_quote(policy)}")
    if scope not in (SCOPE_CONTAINER, SCOPE_POD):
        raise TopologyManagerError(f"unknown scope: {go_quote(scope)}")
    return TopologyManager(chosen, scope, opts, numa_info)


def validate_config(policy: str, scope: str) -> None:
    """The kubelet's configuration validation of ``--topology-manager-policy`` / ``-scope``."""
    if policy not in POLICIES:
        listed = " ".join(go_quote(p) for p in POLICIES)
        raise TopologyManagerError(
            f"invalid configuration: topologyManagerPolicy (--topology-manager-policy) "
            f"{go_quote(policy)} must be one of: [{listed}]"
        )
    if scope not in (SCOPE_CONTAINER, SCOPE_POD):
        raise TopologyManagerError(
            f"invalid configuration: topologyManagerScope (--topology-manager-scope) "
            f"{go_quote(scope)} must be one of: {go_quote(SCOPE_CONTAINER)}, or {go_quote(SCOPE_POD)}"
        )


def parse_topology_manager(
    policy: str,
    scope: str,
    options: Mapping[str, str] | None,
    numa_nodes: Sequence[int],
    distances: Mapping[int, Sequence[int]] | None = None,
) -> TopologyManager:
    """What the kubelet does with its flags: validate the configuration, then ``NewManager``.

    Raises ``TopologyManagerError`` with the kubelet's one-line message.
    """
    validate_config(policy, scope)
    return new_manager(numa_nodes, policy, scope, options, distances)
