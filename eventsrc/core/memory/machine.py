"""The memory manager's view of the machine, and the kubelet's ``--reserved-memory``.

Ported for behaviour from kubernetes/kubernetes ``pkg/kubelet/cm/memorymanager/memory_manager.go``
(``getTotalMemoryTypeReserved``, ``validateReservedMemory``, ``convertReserved``) and
``cliflag.ReservedMemoryVar`` (``pkg/util/flag/flags.go``). No I/O.

* ``MemoryMachine``: per NUMA node, the total bytes of ``memory`` and of each hugepage
  resource (pages x page size), what cadvisor's ``machineInfo.Topology`` gives the kubelet.
* ``MemoryReservation``: one ``reservedMemory`` entry of the KubeletConfiguration
  (``numaNode`` and ``limits``), or one ``N:type=quantity,...`` part of the flag. Its
  quantities are kept as written: the kubelet's validation message prints them in Go's
  canonical form, and the form depends on how they were written (``1Gi`` against ``1G``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from eventsrc.core.devices.names import go_quote
from eventsrc.core.resources import QuantityError, parse_quantity
from eventsrc.errors import EventsrcError

MEMORY = "memory"
HUGEPAGES_PREFIX = "hugepages-"

_INT = re.compile(r"^[+-]?\d+$")
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")
_INT64 = 2**63


class MemoryConfigError(EventsrcError, ValueError):
    """A memory-manager configuration or machine description the kubelet would refuse."""

    exit_code = 2


def is_hugepage_resource(name: str) -> bool:
    """``IsHugePageResourceName``."""
    return name.startswith(HUGEPAGES_PREFIX)


# --------------------------------------------------------------------------- Go quantity strings


def _quantity_format(text: str) -> str:
    """Which of Go's formats a quantity string parses into: binary, decimal or exponent."""
    t = text.strip()
    if t.endswith("i"):
        return "binary"
    if re.search(r"\d[eE][+-]?\d+$", t):
        return "exponent"
    return "decimal"


def go_quantity_string(value: Fraction, fmt: str) -> str:
    """``resource.Quantity.String()`` for ``value`` in ``fmt`` (canonical suffix, largest
    unit that keeps the number whole). Exact for whole numbers of bytes, which is all the
    memory manager ever prints."""
    if fmt == "binary" and value.denominator == 1 and abs(value) >= 1024:
        n = value.numerator
        k = 0
        while k < len(_BINARY_SUFFIXES) - 1 and n % 1024 == 0:
            n //= 1024
            k += 1
        return f"{n}{_BINARY_SUFFIXES[k]}"
    if value.denominator != 1:
        for scale, suffix in ((1000, "m"), (10**6, "u"), (10**9, "n")):
            scaled = value * scale
            if scaled.denominator == 1:
                return f"{scaled.numerator}{suffix}"
        return f"{-(-value.numerator * 10**9 // value.denominator)}n"  # Go rounds up to nano
    n = value.numerator
    k = 0
    while n != 0 and k < len(_DECIMAL_SUFFIXES) - 1 and n % 1000 == 0:
        n //= 1000
        k += 1
    if fmt == "exponent":
        return f"{n}e{3 * k}" if k else str(n)
    return f"{n}{_DECIMAL_SUFFIXES[k]}"


# --------------------------------------------------------------------------- the machine


@dataclass(frozen=True)
class MemoryMachine:
    """Per NUMA node id (ascending), the total bytes of each memory resource."""

    nodes: Mapping[int, Mapping[str, int]]

    def node_ids(self) -> list[int]:
        return sorted(self.nodes)


def _canonical_hugepage_name(name: str) -> str | None:
    """``hugepages-<page size>`` in the kubelet's form (``hugepages-2048Ki`` is
    ``hugepages-2Mi``), or None when the size is not a positive whole number of bytes."""
    try:
        size = parse_quantity(name[len(HUGEPAGES_PREFIX) :])
    except QuantityError:
        return None
    if size <= 0 or size.denominator != 1:
        return None
    return HUGEPAGES_PREFIX + go_quantity_string(size, "binary")


def hugepage_size(name: str) -> int:
    """The page size in bytes of a (valid) hugepage resource name."""
    return int(parse_quantity(name[len(HUGEPAGES_PREFIX) :]))


def _bytes(value: object, where: str) -> int:
    if isinstance(value, bool):
        raise MemoryConfigError(f"{where}: expected a number of bytes, got {value!r}")
    if isinstance(value, int):
        n = Fraction(value)
    elif isinstance(value, str):
        try:
            n = parse_quantity(value)
        except QuantityError:
            raise MemoryConfigError(f"{where}: expected a number of bytes, got {value!r}") from None
    else:
        raise MemoryConfigError(f"{where}: expected a number of bytes, got {value!r}")
    if n.denominator != 1:
        raise MemoryConfigError(f"{where}: {value!r} is not a whole number of bytes")
    if n < 0:
        raise MemoryConfigError(f"{where}: {value!r} is negative")
    return int(n)


def decode_memory_machine(mapping: object, source: str = "memory machine") -> MemoryMachine:
    """``{"0": {"memory": 17179869184, "hugepages-2Mi": 1073741824}, ...}`` as a
    MemoryMachine. Sizes are bytes (an int, or a quantity string such as ``"16Gi"``); every
    node gives its ``memory``; a hugepage total is a whole number of pages. Errors are one
    line, prefixed with ``source``."""
    if not isinstance(mapping, Mapping):
        raise MemoryConfigError(f"{source}: expected a mapping of NUMA node id to memory totals")
    nodes: dict[int, dict[str, int]] = {}
    for key, resources in mapping.items():
        text = str(key) if isinstance(key, int) and not isinstance(key, bool) else key
        if not isinstance(text, str) or not re.fullmatch(r"\d+", text):
            raise MemoryConfigError(f"{source}: NUMA node id {key!r} is not a non-negative integer")
        node = int(text)
        if node in nodes:
            raise MemoryConfigError(f"{source}: NUMA node {node} is given twice")
        if node >= 64:
            raise MemoryConfigError(f"{source}: NUMA node {node}: the kubelet's NUMA masks stop at node 63")
        if not isinstance(resources, Mapping):
            raise MemoryConfigError(f"{source}: NUMA node {node}: expected a mapping of resource to bytes")
        totals: dict[str, int] = {}
        for name, value in resources.items():
            where = f"{source}: NUMA node {node}: {name}"
            if name == MEMORY:
                canonical = MEMORY
            elif isinstance(name, str) and is_hugepage_resource(name):
                found = _canonical_hugepage_name(name)
                if found is None:
                    raise MemoryConfigError(f"{where}: not a hugepage size")
                canonical = found
            else:
                raise MemoryConfigError(
                    f"{source}: NUMA node {node}: unknown resource {name!r} (memory or hugepages-<size>)"
                )
            if canonical in totals:
                raise MemoryConfigError(f"{where}: given twice (as {canonical})")
            size = _bytes(value, where)
            if canonical != MEMORY and size % hugepage_size(canonical):
                raise MemoryConfigError(f"{where}: {size} bytes is not a whole number of {canonical} pages")
            totals[canonical] = size
        if MEMORY not in totals:
            raise MemoryConfigError(f"{source}: NUMA node {node}: no memory total")
        nodes[node] = totals
    return MemoryMachine({n: nodes[n] for n in sorted(nodes)})


# --------------------------------------------------------------------------- --reserved-memory


@dataclass(frozen=True)
class MemoryReservation:
    """``kubeletconfig.MemoryReservation``: memory reserved on one NUMA node, per resource,
    as quantity strings."""

    numa_node: int
    limits: Mapping[str, str]


_FLAG_FORMAT = "expected numaNodeID:type=quantity[,type=quantity...]"


def parse_reserved_memory_flag(values: Iterable[str]) -> list[MemoryReservation] | None:
    """``--reserved-memory``, each occurrence in order, as ``cliflag.ReservedMemoryVar.Set``
    takes it: ``0:memory=1Gi,hugepages-2Mi=1Gi;1:memory=2Gi``. Occurrences add up; an empty
    one forgets what came before (None: the flag's nil). The kubelet's messages."""
    result: list[MemoryReservation] | None = None
    for s in values:
        if s == "":
            result = None
            continue
        if result is None:
            result = []
        for reservation in s.split(";"):
            parts = reservation.split(":")
            if len(parts) != 2:
                raise MemoryConfigError(f"the reserved memory has incorrect format, {_FLAG_FORMAT}, got {reservation}")
            if not _INT.match(parts[0]) or not -(2**31) <= int(parts[0]) < 2**31:
                raise MemoryConfigError(
                    f"failed to convert the NUMA node ID, exptected integer, got {parts[0]}"  # sic, the kubelet's
                )
            limits: dict[str, str] = {}
            for item in parts[1].split(","):
                limit = item.split("=")
                if len(limit) != 2:
                    raise MemoryConfigError(
                        f"the reserved limit has incorrect value, expected type=quantatity, got {item}"  # sic
                    )
                name, quantity = limit
                if name != MEMORY and not is_hugepage_resource(name):
                    raise MemoryConfigError(f"memory type conversion error, unknown type: {go_quote(name)}")
                try:
                    parse_quantity(quantity)
                except QuantityError:
                    raise MemoryConfigError(
                        f"failed to parse the quantatity, expected quantatity, got {quantity}"  # sic
                    ) from None
                limits[name] = quantity
            result.append(MemoryReservation(int(parts[0]), limits))
    return result


def decode_reserved_memory(items: object, source: str = "reservedMemory") -> list[MemoryReservation]:
    """The KubeletConfiguration's ``reservedMemory``: a list of ``{numaNode: int, limits:
    {memory: "1Gi", hugepages-2Mi: "..."}}``. Errors are one line, prefixed with ``source``."""
    if not isinstance(items, Sequence) or isinstance(items, str):
        raise MemoryConfigError(f"{source}: expected a list of {{numaNode, limits}}")
    out: list[MemoryReservation] = []
    for i, item in enumerate(items):
        where = f"{source}[{i}]"
        if not isinstance(item, Mapping):
            raise MemoryConfigError(f"{where}: expected a mapping with numaNode and limits")
        unknown = sorted(set(item) - {"numaNode", "limits"})
        if unknown:
            raise MemoryConfigError(f"{where}: unknown field {unknown[0]!r}")
        node = item.get("numaNode")
        if isinstance(node, bool) or not isinstance(node, int) or not -(2**31) <= node < 2**31:
            raise MemoryConfigError(f"{where}.numaNode: expected an integer, got {node!r}")
        limits = item.get("limits", {})
        if not isinstance(limits, Mapping):
            raise MemoryConfigError(f"{where}.limits: expected a mapping of resource to quantity")
        parsed: dict[str, str] = {}
        for name, quantity in limits.items():
            if isinstance(quantity, int) and not isinstance(quantity, bool):
                quantity = str(quantity)
            if not isinstance(quantity, str):
                raise MemoryConfigError(f"{where}.limits.{name}: expected a quantity, got {quantity!r}")
            try:
                parse_quantity(quantity)
            except QuantityError as err:
                raise MemoryConfigError(f"{where}.limits.{name}: {err}") from None
            parsed[str(name)] = quantity
        out.append(MemoryReservation(node, parsed))
    return out


def _sum_quantities(texts: Sequence[str]) -> tuple[Fraction, str]:
    """Go's ``q.Add(total)`` fold of ``getTotalMemoryTypeReserved``: the sum, in the format of
    the last non-zero term (a zero receiver takes the other's format)."""
    total = Fraction(0)
    fmt = "decimal"
    for text in texts:
        value = parse_quantity(text)
        if value != 0:
            fmt = _quantity_format(text)
        total += value
    return total, fmt


def validate_reserved_memory(
    machine: MemoryMachine, node_allocatable_reservation: Mapping[str, str], reserved: Sequence[MemoryReservation]
) -> None:
    """``validateReservedMemory``: every reservation names a NUMA node of the machine, and per
    memory resource the reservations add up to exactly what Node Allocatable reserves
    (``node_allocatable_reservation``: systemReserved + kubeReserved + evictionHard, per
    resource, as quantity strings; resources other than memory and hugepages are ignored).
    Resources are checked in name order (the kubelet's is random)."""
    per_type: dict[str, list[str]] = {}
    for r in reserved:
        if r.numa_node not in machine.nodes:
            raise MemoryConfigError(
                f"the reserved memory configuration references a NUMA node {r.numa_node} "
                "that does not exist on this machine"
            )
        for name, quantity in r.limits.items():
            per_type.setdefault(name, []).append(quantity)
    types = set(per_type) | {n for n in node_allocatable_reservation if n == MEMORY or is_hugepage_resource(n)}
    for name in sorted(types):
        expected_text = node_allocatable_reservation.get(name)
        expected = parse_quantity(expected_text) if expected_text is not None else Fraction(0)
        expected_fmt = _quantity_format(expected_text) if expected_text is not None else "decimal"
        total, total_fmt = _sum_quantities(per_type.get(name, []))
        if total != expected:
            raise MemoryConfigError(
                f"the total amount {go_quote(go_quantity_string(total, total_fmt))} of type {go_quote(name)} "
                f"is not equal to the value {go_quote(go_quantity_string(expected, expected_fmt))} "
                "determined by Node Allocatable feature"
            )


def system_reserved_memory(machine: MemoryMachine, reserved: Sequence[MemoryReservation]) -> dict[int, dict[str, int]]:
    """``convertReserved``: bytes per NUMA node (every node of the machine, empty when
    nothing is reserved there) and resource. A node given twice keeps the later value of a
    resource, as in the kubelet."""
    out: dict[int, dict[str, int]] = {n: {} for n in machine.node_ids()}
    for r in reserved:
        for name, quantity in r.limits.items():
            value = parse_quantity(quantity)
            if value.denominator != 1 or not -_INT64 <= value < _INT64:
                raise MemoryConfigError("could not covert a variable of type Quantity to int64")  # sic
            out.setdefault(r.numa_node, {})[name] = int(value)
    return out


def get_system_reserved_memory(
    machine: MemoryMachine, node_allocatable_reservation: Mapping[str, str], reserved: Sequence[MemoryReservation]
) -> dict[int, dict[str, int]]:
    """``getSystemReservedMemory``: validate, then convert."""
    validate_reserved_memory(machine, node_allocatable_reservation, reserved)
    return system_reserved_memory(machine, reserved)
