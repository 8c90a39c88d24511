"""The kubelet's take-by-topology CPU picking, ported exactly.

Source: kubernetes/kubernetes ``pkg/kubelet/cm/cpumanager/cpu_assignment.go`` (the
``cpuAccumulator``, ``takeByTopologyNUMAPacked``, ``takeByTopologyNUMADistributed``),
``policy_options.go`` (the option names, their parsing and their validation) and the static
policy's ``takeByTopology`` wrapper in ``policy_static.go``. Every order and tie-break is the
kubelet's:

- every list of NUMA nodes / sockets / cores / uncore caches is sorted by the number of their
  still-free CPUs, then by id (the Go comparator is a total order, so Go's unstable
  ``sort.Slice`` gives one answer, and so does Python's ``sorted``);
- NUMA-first when ``NumSockets >= NumNUMANodes``, sockets-first otherwise;
- whole units are judged against the *declared* sizes where the kubelet does so
  (``CPUsPerSocket``, ``CPUsPerCore``, ``CPUsPerUncore``: integer divisions of the declared
  totals, 0 when the divisor is 0), against the unit's own CPUs for NUMA nodes and uncore caches;
- taking a whole unit takes the unit's CPUs from the *full* topology;
- the distributed algorithm's ``iterateCombinations`` reuses the backing array of its partial
  Go slices, so a combination saved as "best" can be overwritten by later iterations before it
  is used; ``_GoSlice`` reproduces Go's ``append`` growth so that this happens here exactly as
  it does in the kubelet.

Internally CPU sets are Python ints used as bit masks (bit *i* = CPU *i*): a take on a
256-CPU machine is a few hundred popcounts. The public functions take and return the
project's ``CPUSet``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

import msgspec

from eventsrc.errors import EventsrcError

CPUSortingStrategy = Literal["packed", "spread"]
PACKED: CPUSortingStrategy = "packed"
SPREAD: CPUSortingStrategy = "spread"


class TakeError(EventsrcError):
    """The kubelet's take-by-topology failed; the message is the kubelet's."""


class PolicyOptionError(EventsrcError):
    """A CPU manager policy option the kubelet refuses; the message is the kubelet's."""

    exit_code = 2


# --------------------------------------------------------------------------- policy options

FULL_PCPUS_ONLY = "full-pcpus-only"
DISTRIBUTE_CPUS_ACROSS_NUMA = "distribute-cpus-across-numa"
ALIGN_BY_SOCKET = "align-by-socket"
DISTRIBUTE_CPUS_ACROSS_CORES = "distribute-cpus-across-cores"
STRICT_CPU_RESERVATION = "strict-cpu-reservation"
PREFER_ALIGN_CPUS_BY_UNCORECACHE = "prefer-align-cpus-by-uncorecache"

# Maturity as in policy_options.go @ 7ed31812.
ALPHA_OPTIONS = frozenset({ALIGN_BY_SOCKET, DISTRIBUTE_CPUS_ACROSS_CORES})
BETA_OPTIONS = frozenset({STRICT_CPU_RESERVATION, DISTRIBUTE_CPUS_ACROSS_NUMA, PREFER_ALIGN_CPUS_BY_UNCORECACHE})
STABLE_OPTIONS = frozenset({FULL_PCPUS_ONLY})
ALL_OPTIONS = ALPHA_OPTIONS | BETA_OPTIONS | STABLE_OPTIONS


class StaticPolicyOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The static policy's options, one field per kubelet option name (dashes as underscores)."""

    full_pcpus_only: bool = False
    distribute_cpus_across_numa: bool = False
    align_by_socket: bool = False
    distribute_cpus_across_cores: bool = False
    strict_cpu_reservation: bool = False
    prefer_align_cpus_by_uncorecache: bool = False

    def to_map(self) -> dict[str, str]:
        """The options that are on, as the kubelet's ``--cpu-manager-policy-options`` map."""
        return {name: "true" for name in sorted(ALL_OPTIONS) if getattr(self, name.replace("-", "_"))}

    @property
    def sorting_strategy(self) -> CPUSortingStrategy:
        return SPREAD if self.distribute_cpus_across_cores else PACKED


_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def _parse_go_bool(value: str) -> bool:
    """Go's ``strconv.ParseBool``."""
    if value in _GO_TRUE:
        return True
    if value in _GO_FALSE:
        return False
    raise ValueError(f'strconv.ParseBool: parsing "{value}": invalid syntax')


def check_policy_option_available(option: str, *, alpha_enabled: bool = False, beta_enabled: bool = True) -> None:
    """The kubelet's ``CheckPolicyOptionAvailable``; the gates default to the kubelet's defaults
    (``CPUManagerPolicyAlphaOptions`` off, ``CPUManagerPolicyBetaOptions`` on)."""
    if option not in ALL_OPTIONS:
        raise PolicyOptionError(f'unknown CPU Manager Policy option: "{option}"')
    if option in ALPHA_OPTIONS and not alpha_enabled:
        raise PolicyOptionError(f'CPU Manager Policy Alpha-level Options not enabled, but option "{option}" provided')
    if option in BETA_OPTIONS and not beta_enabled:
        raise PolicyOptionError(f'CPU Manager Policy Beta-level Options not enabled, but option "{option}" provided')


def parse_policy_options(
    policy_options: Mapping[str, str], *, alpha_enabled: bool = False, beta_enabled: bool = True
) -> StaticPolicyOptions:
    """The kubelet's ``NewStaticPolicyOptions``: names, values and incompatible pairs.

    Options are checked in the mapping's order (the kubelet walks a Go map, in random order;
    with several bad options it may name any of them).
    """
    values: dict[str, bool] = {}
    for name, value in policy_options.items():
        check_policy_option_available(name, alpha_enabled=alpha_enabled, beta_enabled=beta_enabled)
        try:
            values[name.replace("-", "_")] = _parse_go_bool(value)
        except ValueError as e:
            raise PolicyOptionError(f'bad value for option "{name}": {e}') from None
    opts = StaticPolicyOptions(**values)
    pairs = (
        (opts.full_pcpus_only and opts.distribute_cpus_across_cores, FULL_PCPUS_ONLY, DISTRIBUTE_CPUS_ACROSS_CORES),
        (
            opts.distribute_cpus_across_numa and opts.distribute_cpus_across_cores,
            DISTRIBUTE_CPUS_ACROSS_NUMA,
            DISTRIBUTE_CPUS_ACROSS_CORES,
        ),
        (
            opts.prefer_align_cpus_by_uncorecache and opts.distribute_cpus_across_cores,
            PREFER_ALIGN_CPUS_BY_UNCORECACHE,
            DISTRIBUTE_CPUS_ACROSS_CORES,
        ),
        (
            opts.prefer_align_cpus_by_uncorecache and opts.distribute_cpus_across_numa,
            PREFER_ALIGN_CPUS_BY_UNCORECACHE,
            DISTRIBUTE_CPUS_ACROSS_NUMA,
        ),
    )
    for bad, a, b in pairs:
        if bad:
            raise PolicyOptionError(f"static policy options {a} and {b} can not be used at the same time")
    return opts


def validate_static_policy_options(
    opts: StaticPolicyOptions, topology: Any, topology_manager_policy: str = "none"
) -> None:
    """The kubelet's ``ValidateStaticPolicyOptions`` (the machine- and topology-manager checks)."""
    if opts.align_by_socket:
        if topology_manager_policy == "single-numa-node":
            raise PolicyOptionError(
                "Topolgy manager single-numa-node policy is incompatible with CPUManager align-by-socket policy option"
            )
        idx = _index(topology)
        if idx.num_sockets > idx.num_numa_nodes:
            raise PolicyOptionError(
                "Align by socket is not compatible with hardware where number of sockets are more than number of NUMA"
            )


# --------------------------------------------------------------------------- bit helpers


def _bits(mask: int) -> Iterator[int]:
    """The set bits of ``mask``, ascending."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _mask(cpus: Iterable[int]) -> int:
    m = 0
    for c in cpus:
        m |= 1 << c
    return m


def _to_cpuset(mask: int) -> Any:
    from eventsrc.core.cpu.cpuset import CPUSet

    return CPUSet(_bits(mask))


# --------------------------------------------------------------------------- topology index


class _Index:
    """Everything the accumulator needs from a topology, precomputed as bit masks.

    ``unit -> mask`` maps give a unit's CPUs in the full topology; the ``*_in_*`` maps list,
    for a parent unit, its child units with the CPUs they share (a child is "in" the parent
    in the free view when a free CPU lies in that intersection, as CPUDetails computes it).
    """

    def __init__(self, topology: Any) -> None:
        self.num_cpus: int = topology.num_cpus
        self.num_cores: int = topology.num_cores
        self.num_sockets: int = topology.num_sockets
        self.num_numa_nodes: int = topology.num_numa_nodes
        self.num_uncore_cache: int = topology.num_uncore_cache
        details = topology.cpu_details
        self.cpus_per_core = self.num_cpus // self.num_cores if self.num_cores else 0
        self.cpus_per_socket = self.num_cpus // self.num_sockets if self.num_sockets else 0
        self.cpus_per_uncore = self.num_cpus // self.num_uncore_cache if self.num_uncore_cache else 0
        core: dict[int, int] = {}
        socket: dict[int, int] = {}
        numa: dict[int, int] = {}
        uncore: dict[int, int] = {}
        pairs: dict[str, dict[tuple[int, int], int]] = {
            k: {} for k in ("socket_numa", "numa_socket", "socket_core", "numa_core", "numa_uncore", "uncore_core")
        }
        all_mask = 0
        for cpu in sorted(details):
            info = details[cpu]
            bit = 1 << cpu
            all_mask |= bit
            c, s, n, u = info.core_id, info.socket_id, info.numa_node_id, info.uncore_cache_id
            core[c] = core.get(c, 0) | bit
            socket[s] = socket.get(s, 0) | bit
            numa[n] = numa.get(n, 0) | bit
            uncore[u] = uncore.get(u, 0) | bit
            for name, key in (
                ("socket_numa", (s, n)),
                ("numa_socket", (n, s)),
                ("socket_core", (s, c)),
                ("numa_core", (n, c)),
                ("numa_uncore", (n, u)),
                ("uncore_core", (u, c)),
            ):
                d = pairs[name]
                d[key] = d.get(key, 0) | bit
        self.all_mask = all_mask
        self.core_mask = core
        self.socket_mask = socket
        self.numa_mask = numa
        self.uncore_mask = uncore
        self.core_size = {k: v.bit_count() for k, v in core.items()}
        self.numa_size = {k: v.bit_count() for k, v in numa.items()}
        self.uncore_size = {k: v.bit_count() for k, v in uncore.items()}
        self.socket_size = {k: v.bit_count() for k, v in socket.items()}

        def children(name: str) -> dict[int, tuple[tuple[int, int], ...]]:
            out: dict[int, list[tuple[int, int]]] = {}
            for (parent, child), m in sorted(pairs[name].items()):
                out.setdefault(parent, []).append((child, m))
            return {k: tuple(v) for k, v in out.items()}

        self.numas_in_socket = children("socket_numa")
        self.sockets_in_numa = children("numa_socket")
        self.cores_in_socket = children("socket_core")
        self.cores_in_numa = children("numa_core")
        self.uncores_in_numa = children("numa_uncore")
        self.cores_in_uncore = children("uncore_core")
        # sockets-first when a socket holds several NUMA nodes (cpuAccumulator's choice)
        self.numa_first = self.num_sockets >= self.num_numa_nodes


_INDEXES: dict[int, tuple[Any, _Index]] = {}
_INDEXES_MAX = 32


def _index(topology: Any) -> _Index:
    """The index of ``topology``, built once per topology object (topologies are immutable)."""
    hit = _INDEXES.get(id(topology))
    if hit is not None and hit[0] is topology:
        return hit[1]
    idx = _Index(topology)
    if len(_INDEXES) >= _INDEXES_MAX:
        _INDEXES.pop(next(iter(_INDEXES)))
    _INDEXES[id(topology)] = (topology, idx)  # the strong reference keeps id() unique
    return idx


# --------------------------------------------------------------------------- the accumulator


class CPUAccumulator:
    """The kubelet's ``cpuAccumulator``. ``free`` is ``details`` (the CPUs still free), as a mask."""

    __slots__ = ("topo", "free", "need", "result", "strategy")

    def __init__(self, idx: _Index, available: int, num_cpus: int, strategy: CPUSortingStrategy = PACKED) -> None:
        self.topo = idx
        self.free = available & idx.all_mask  # KeepOnly: CPUs unknown to the topology vanish
        self.need = num_cpus
        self.result = 0
        self.strategy = strategy

    @classmethod
    def new(
        cls, topology: Any, available: Iterable[int], num_cpus: int, strategy: CPUSortingStrategy = PACKED
    ) -> CPUAccumulator:
        return cls(_index(topology), _mask(available), num_cpus, strategy)

    # --- the generic sort: free CPUs in the unit, then id

    def _sorted(self, ids: Iterable[int], masks: Mapping[int, int]) -> list[int]:
        free = self.free
        return sorted(ids, key=lambda i: ((masks[i] & free).bit_count(), i))

    def _children(self, parent: int, table: Mapping[int, tuple[tuple[int, int], ...]]) -> list[int]:
        free = self.free
        return [child for child, m in table.get(parent, ()) if m & free]

    def _units(self, masks: Mapping[int, int]) -> list[int]:
        free = self.free
        return [u for u, m in masks.items() if m & free]

    # --- numaFirst / socketsFirst

    def sort_available_numa_nodes(self) -> list[int]:
        t = self.topo
        if t.numa_first:
            return self._sorted(self._units(t.numa_mask), t.numa_mask)
        out: list[int] = []
        for s in self.sort_available_sockets():
            out += self._sorted(self._children(s, t.numas_in_socket), t.numa_mask)
        return out

    def sort_available_sockets(self) -> list[int]:
        t = self.topo
        if not t.numa_first:
            return self._sorted(self._units(t.socket_mask), t.socket_mask)
        out: list[int] = []
        for n in self.sort_available_numa_nodes():
            out += self._sorted(self._children(n, t.sockets_in_numa), t.socket_mask)
        return out

    def sort_available_cores(self) -> list[int]:
        t = self.topo
        out: list[int] = []
        if t.numa_first:
            for s in self.sort_available_sockets():
                out += self._sorted(self._children(s, t.cores_in_socket), t.core_mask)
        else:
            for n in self.sort_available_numa_nodes():
                out += self._sorted(self._children(n, t.cores_in_numa), t.core_mask)
        return out

    def sort_available_uncore_caches(self) -> list[int]:
        t = self.topo
        out: list[int] = []
        for n in self.sort_available_numa_nodes():
            out += self._sorted(self._children(n, t.uncores_in_numa), t.uncore_mask)
        return out

    def sort_available_cpus_packed(self) -> list[int]:
        free, masks = self.free, self.topo.core_mask
        out: list[int] = []
        for c in self.sort_available_cores():
            out += _bits(masks[c] & free)
        return out

    def sort_available_cpus_spread(self) -> list[int]:
        free, masks = self.free, self.topo.socket_mask
        out: list[int] = []
        for s in self.sort_available_sockets():
            out += _bits(masks[s] & free)
        return out

    # --- "free" units

    def is_numa_node_free(self, numa: int) -> bool:
        m = self.topo.numa_mask[numa]
        return (m & self.free).bit_count() == self.topo.numa_size[numa]

    def is_socket_free(self, socket: int) -> bool:
        return (self.topo.socket_mask[socket] & self.free).bit_count() == self.topo.cpus_per_socket

    def is_uncore_cache_free(self, uncore: int) -> bool:
        m = self.topo.uncore_mask[uncore]
        return (m & self.free).bit_count() == self.topo.uncore_size[uncore]

    def is_core_free(self, core: int) -> bool:
        return (self.topo.core_mask[core] & self.free).bit_count() == self.topo.cpus_per_core

    def free_numa_nodes(self) -> list[int]:
        return [n for n in self.sort_available_numa_nodes() if self.is_numa_node_free(n)]

    def free_sockets(self) -> list[int]:
        return [s for s in self.sort_available_sockets() if self.is_socket_free(s)]

    def free_uncore_cache(self) -> list[int]:
        return [u for u in self.sort_available_uncore_caches() if self.is_uncore_cache_free(u)]

    def free_cores(self) -> list[int]:
        return [c for c in self.sort_available_cores() if self.is_core_free(c)]

    def free_cpus(self) -> list[int]:
        return self.sort_available_cpus_packed() if self.strategy == PACKED else self.sort_available_cpus_spread()

    # --- state

    def take(self, cpus: int) -> None:
        self.result |= cpus
        self.free &= ~self.result
        self.need -= cpus.bit_count()

    def needs_at_least(self, n: int) -> bool:
        return self.need >= n

    def is_satisfied(self) -> bool:
        return self.need < 1

    def is_failed(self) -> bool:
        return self.need > self.free.bit_count()

    # --- taking

    def take_full_numa_nodes(self) -> None:
        for n in self.free_numa_nodes():
            cpus = self.topo.numa_mask[n]
            if not self.needs_at_least(cpus.bit_count()):
                continue
            self.take(cpus)

    def take_full_sockets(self) -> None:
        for s in self.free_sockets():
            cpus = self.topo.socket_mask[s]
            if not self.needs_at_least(cpus.bit_count()):
                continue
            self.take(cpus)

    def take_full_first_level(self) -> None:
        if self.topo.numa_first:
            self.take_full_numa_nodes()
        else:
            self.take_full_sockets()

    def take_full_second_level(self) -> None:
        if self.topo.numa_first:
            self.take_full_sockets()
        else:
            self.take_full_numa_nodes()

    def take_full_uncore(self) -> None:
        for u in self.free_uncore_cache():
            cpus = self.topo.uncore_mask[u]
            if not self.needs_at_least(cpus.bit_count()):
                continue
            self.take(cpus)

    def take_partial_uncore(self, uncore: int) -> None:
        t = self.topo
        cpc = t.cpus_per_core
        num_cores_needed = (self.need + cpc - 1) // cpc
        # CoresNeededInUncoreCache: the free cores of the cache by id, the first N of them
        cores = sorted({c for c, m in t.cores_in_uncore.get(uncore, ()) if m & self.free})[:num_cores_needed]
        free_cpus = 0
        for c in cores:
            free_cpus |= t.core_mask[c] & self.free
        if self.need % 2 != 0 and cpc > 1:
            listed = list(_bits(free_cpus))
            if len(listed) > self.need:
                listed = listed[: len(listed) - 1]
            free_cpus = _mask(listed)
        if self.need != free_cpus.bit_count():
            return
        self.take(free_cpus)

    def take_uncore_cache(self) -> None:
        per_uncore = self.topo.cpus_per_uncore
        for u in self.sort_available_uncore_caches():
            if self.needs_at_least(per_uncore):
                self.take_full_uncore()
            if self.is_satisfied():
                return
            self.take_partial_uncore(u)
            if self.is_satisfied():
                return

    def take_full_cores(self) -> None:
        for c in self.free_cores():
            cpus = self.topo.core_mask[c]
            if not self.needs_at_least(cpus.bit_count()):
                continue
            self.take(cpus)

    def take_remaining_cpus(self) -> None:
        for cpu in self.free_cpus():
            self.take(1 << cpu)
            if self.is_satisfied():
                return

    def range_numa_nodes_needed_to_satisfy(self, cpu_group_size: int) -> tuple[int, int]:
        t = self.topo
        num_numa_nodes = len(t.numa_mask)
        num_numa_nodes_available = len(self._units(t.numa_mask))
        num_cpus = t.all_mask.bit_count()
        num_cpu_groups = (num_cpus - 1) // cpu_group_size + 1
        groups_per_numa = (num_cpu_groups - 1) // num_numa_nodes + 1
        groups_needed = (self.need - 1) // cpu_group_size + 1
        min_numas = (groups_needed - 1) // groups_per_numa + 1
        max_numas = min(groups_needed, num_numa_nodes_available)
        return min_numas, max_numas


# --------------------------------------------------------------------------- Go helpers


def _go_round(x: float) -> float:
    """Go's ``math.Round``: half away from zero."""
    t = float(math.trunc(x))
    if abs(x - t) >= 0.5:
        t += math.copysign(1.0, x)
    return t


def _standard_deviation(xs: list[int]) -> float:
    m = _go_round(sum(float(x) for x in xs) / len(xs) * 1000) / 1000
    s = 0.0
    for x in xs:
        s += (float(x) - m) * (float(x) - m)
    return _go_round(math.sqrt(s / len(xs)) * 1000) / 1000


class _GoSlice:
    """A Go ``[]int`` header: a backing array shared between slices, a length and a capacity."""

    __slots__ = ("arr", "length")

    def __init__(self, arr: list[int], length: int) -> None:
        self.arr = arr
        self.length = length

    def append(self, x: int) -> _GoSlice:
        if self.length < len(self.arr):  # room left: write in place, sharing the array
            self.arr[self.length] = x
            return _GoSlice(self.arr, self.length + 1)
        cap = len(self.arr)
        new_len = self.length + 1
        new_cap = new_len if new_len > 2 * cap else 2 * cap  # growslice for small slices
        arr = self.arr[: self.length] + [x] + [0] * (new_cap - new_len)
        return _GoSlice(arr, new_len)

    def values(self) -> list[int]:
        return self.arr[: self.length]


_CONTINUE, _BREAK = 0, 1


def _iterate_combinations(n: list[int], k: int, f: Callable[[_GoSlice], int]) -> None:
    """``iterateCombinations`` with Go's slice aliasing (see the module docstring)."""
    if k < 1:
        return

    def helper(k: int, start: int, accum: _GoSlice) -> int:
        if k == 0:
            return f(accum)
        for i in range(start, len(n) - k + 1):
            if helper(k - 1, i + 1, accum.append(n[i])) == _BREAK:
                return _BREAK
        return _CONTINUE

    helper(k, 0, _GoSlice([], 0))


# --------------------------------------------------------------------------- the algorithms


def _take_packed(idx: _Index, available: int, num_cpus: int, strategy: CPUSortingStrategy, prefer_uncore: bool) -> int:
    acc = CPUAccumulator(idx, available, num_cpus, strategy)
    if acc.is_satisfied():
        return acc.result
    if acc.is_failed():
        raise TakeError(
            f"not enough cpus available to satisfy request: requested={num_cpus}, available={available.bit_count()}"
        )
    acc.take_full_first_level()
    if acc.is_satisfied():
        return acc.result
    acc.take_full_second_level()
    if acc.is_satisfied():
        return acc.result
    if prefer_uncore:
        acc.take_uncore_cache()
        if acc.is_satisfied():
            return acc.result
    if strategy != SPREAD:
        acc.take_full_cores()
        if acc.is_satisfied():
            return acc.result
    acc.take_remaining_cpus()
    if acc.is_satisfied():
        return acc.result
    raise TakeError("failed to allocate cpus")


def _take_packed_ignoring_error(idx: _Index, available: int, n: int, strategy: CPUSortingStrategy) -> int:
    # the kubelet ignores the error of these inner calls and takes the (empty) result
    try:
        return _take_packed(idx, available, n, strategy, False)
    except TakeError:
        return 0


def _best_numa_combination(
    numas: list[int], free_in: dict[int, int], k: int, num_cpus: int, g: int
) -> tuple[_GoSlice | None, _GoSlice | None]:
    """One ``k`` of the distributed search: the best NUMA combination and its remainder subset,
    as the (possibly since overwritten) Go slices the kubelet keeps."""
    best: dict[str, Any] = {"balance": math.inf, "remainder": None, "combo": None}

    def visit(combo_slice: _GoSlice) -> int:
        if best["balance"] == 0:
            return _BREAK
        combo = combo_slice.values()
        if sum(free_in[n] for n in combo) < num_cpus:
            return _CONTINUE
        if sum(free_in[n] // g for n in combo) * g < num_cpus:
            return _CONTINUE
        distribution = (num_cpus // len(combo) // g) * g
        for n in combo:
            if free_in[n] < distribution:
                return _CONTINUE
        after = dict(free_in)
        for n in combo:
            after[n] -= distribution
        remainder = num_cpus - distribution * len(combo)
        remainder_combo = [n for n in combo if after[n] >= g]

        local: dict[str, Any] = {"balance": math.inf, "remainder": None}
        if remainder == 0:
            local["balance"] = _standard_deviation(list(after.values()))
            local["remainder"] = None

        for kk in range(len(remainder_combo), 0, -1):
            if remainder <= 0:
                break

            def visit_subset(subset_slice: _GoSlice) -> int:
                subset = subset_slice.values()
                left = remainder
                avail = dict(after)
                if sum(avail[n] for n in subset) < left:
                    return _CONTINUE
                while left > 0:
                    before = left
                    for n in subset:
                        if left == 0:
                            break
                        if avail[n] < g:
                            continue
                        avail[n] -= g
                        left -= g
                    if left == before:  # the kubelet would spin here forever; never seen
                        return _CONTINUE
                balance = _standard_deviation(list(avail.values()))
                if balance < local["balance"]:
                    local["balance"] = balance
                    local["remainder"] = subset_slice
                return _CONTINUE

            _iterate_combinations(remainder_combo, kk, visit_subset)

        if local["balance"] < best["balance"]:
            best["balance"] = local["balance"]
            best["remainder"] = local["remainder"]
            best["combo"] = combo_slice
        return _CONTINUE

    _iterate_combinations(numas, k, visit)
    return best["combo"], best["remainder"]


def _take_distributed(
    idx: _Index, available: int, num_cpus: int, cpu_group_size: int, strategy: CPUSortingStrategy
) -> int:
    g = cpu_group_size
    if num_cpus % g != 0:
        return _take_packed(idx, available, num_cpus, strategy, False)

    acc = CPUAccumulator(idx, available, num_cpus, strategy)
    if acc.is_satisfied():
        return acc.result
    if acc.is_failed():
        raise TakeError(
            f"not enough cpus available to satisfy request: requested={num_cpus}, available={available.bit_count()}"
        )

    numas = acc.sort_available_numa_nodes()
    numa_mask = idx.numa_mask
    min_numas, max_numas = acc.range_numa_nodes_needed_to_satisfy(g)

    for k in range(min_numas, max_numas + 1):
        free_in = {n: (numa_mask[n] & acc.free).bit_count() for n in numas}
        combo_slice, remainder_slice = _best_numa_combination(numas, free_in, k, num_cpus, g)
        if combo_slice is None:
            continue

        # read the saved slices now, after any later iteration wrote into their arrays
        best_combo = combo_slice.values()
        best_remainder = remainder_slice.values() if remainder_slice is not None else []
        distribution = (num_cpus // len(best_combo) // g) * g
        for n in best_combo:
            acc.take(_take_packed_ignoring_error(idx, numa_mask[n] & acc.free, distribution, strategy))
        remainder = num_cpus - distribution * len(best_combo)
        while remainder > 0:
            before = remainder
            for n in best_remainder:
                if remainder == 0:
                    break
                if (numa_mask[n] & acc.free).bit_count() < g:
                    continue
                acc.take(_take_packed_ignoring_error(idx, numa_mask[n] & acc.free, g, strategy))
                remainder -= g
            if remainder == before:  # the kubelet would spin here forever; never seen
                break
        if acc.need > 0:
            raise TakeError(f"accounting error, not enough CPUs allocated, remaining: {acc.need}")
        if acc.need < 0:
            raise TakeError(f"accounting error, too many CPUs allocated, remaining: {acc.need}")
        return acc.result

    return _take_packed(idx, available, num_cpus, strategy, False)


# --------------------------------------------------------------------------- public API


def take_by_topology_numa_packed(
    topology: Any,
    available: Iterable[int],
    num_cpus: int,
    strategy: CPUSortingStrategy = PACKED,
    prefer_align_by_uncore_cache: bool = False,
) -> Any:
    """``takeByTopologyNUMAPacked``. Raises ``TakeError`` where the kubelet fails."""
    return _to_cpuset(
        _take_packed(_index(topology), _mask(available), num_cpus, strategy, prefer_align_by_uncore_cache)
    )


def take_by_topology_numa_distributed(
    topology: Any,
    available: Iterable[int],
    num_cpus: int,
    cpu_group_size: int,
    strategy: CPUSortingStrategy = PACKED,
) -> Any:
    """``takeByTopologyNUMADistributed``. Raises ``TakeError`` where the kubelet fails."""
    return _to_cpuset(_take_distributed(_index(topology), _mask(available), num_cpus, cpu_group_size, strategy))


def take_by_topology(
    topology: Any, available: Iterable[int], num_cpus: int, options: StaticPolicyOptions | None = None
) -> Any:
    """The static policy's ``takeByTopology``: the picking it does for these options.

    distribute-cpus-across-numa → the distributed algorithm, in groups of CPUsPerCore with
    full-pcpus-only, else of 1; otherwise the packed one. distribute-cpus-across-cores picks
    the spread sorting; prefer-align-cpus-by-uncorecache the uncore step (packed only).
    align-by-socket and strict-cpu-reservation do not change the picking itself (they change
    which CPUs the policy offers it).
    """
    opts = options or StaticPolicyOptions()
    idx = _index(topology)
    strategy = opts.sorting_strategy
    if opts.distribute_cpus_across_numa:
        group = idx.cpus_per_core if opts.full_pcpus_only else 1
        mask = _take_distributed(idx, _mask(available), num_cpus, group, strategy)
    else:
        mask = _take_packed(idx, _mask(available), num_cpus, strategy, opts.prefer_align_cpus_by_uncorecache)
    return _to_cpuset(mask)


class SMTAlignmentError(TakeError):
    """The static policy's ``SMTAlignmentError`` (full-pcpus-only)."""


def check_smt_alignment(num_cpus: int, cpus_per_core: int, available_physical_cpus: int) -> None:
    """The static policy's full-pcpus-only checks in ``Allocate``, in its order.

    ``available_physical_cpus`` is the size of the shared pool minus every CPU of a core that
    holds a reserved CPU (``GetAvailablePhysicalCPUs``).
    """
    if cpus_per_core and num_cpus % cpus_per_core != 0:
        raise SMTAlignmentError(
            f"SMT Alignment Error: requested {num_cpus} cpus not multiple cpus per core = {cpus_per_core}"
        )
    if num_cpus > available_physical_cpus:
        raise SMTAlignmentError(
            "SMT Alignment Error: not enough free physical CPUs: "
            f"available physical CPUs = {available_physical_cpus}, requested CPUs = {num_cpus}, "
            f"CPUs per core = {cpus_per_core}"
        )
