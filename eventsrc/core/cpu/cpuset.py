"""CPU sets in the kubelet's list format (``0-3,8,10-11``), as k8s.io/utils/cpuset has them.

A ``CPUSet`` is immutable and hashable; it iterates in ascending order and prints in the
canonical Linux list form (sorted, runs collapsed into ranges, the empty set as ``""``).
``parse`` accepts exactly what upstream ``cpuset.Parse`` accepts: elements split on ``,``,
each either a number or ``start-end`` (split on the first ``-``), every number as Go's
``strconv.Atoi`` reads it (optional sign, ASCII digits, 64-bit), ``end >= start``. So
``"1,,2"``, ``"1-"``, ``"-1"``, ``" 1"`` and ``"3-1"`` fail, and ``"3-3"`` and ``"+2"`` parse.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

from eventsrc.errors import EventsrcError

_GO_INT = re.compile(r"[+-]?[0-9]+")
_INT64_MAX = (1 << 63) - 1


class CPUSetParseError(EventsrcError, ValueError):
    """A CPU list that the kubelet would refuse. The message names the bad element."""

    exit_code = 2


class CPUSet:
    """An immutable set of logical CPU ids."""

    __slots__ = ("_elems", "_sorted")

    _elems: frozenset[int]
    _sorted: tuple[int, ...]

    def __init__(self, cpus: Iterable[int] = ()) -> None:
        elems = cpus._elems if isinstance(cpus, CPUSet) else frozenset(cpus)
        object.__setattr__(self, "_elems", elems)
        object.__setattr__(self, "_sorted", tuple(sorted(elems)))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("CPUSet is immutable")

    @classmethod
    def parse(cls, text: str) -> CPUSet:
        return parse(text)

    # -- queries -------------------------------------------------------------------------

    def size(self) -> int:
        return len(self._elems)

    def is_empty(self) -> bool:
        return not self._elems

    def contains(self, cpu: int) -> bool:
        return cpu in self._elems

    def equals(self, other: CPUSet) -> bool:
        return self._elems == other._elems

    def is_subset_of(self, other: CPUSet) -> bool:
        return self._elems <= other._elems

    def sorted_list(self) -> list[int]:
        """The CPUs, ascending (upstream ``List``)."""
        return list(self._sorted)

    def unsorted_list(self) -> list[int]:
        return list(self._elems)

    def as_frozenset(self) -> frozenset[int]:
        return self._elems

    def first(self, n: int) -> CPUSet:
        """The ``n`` lowest CPUs (all of them when there are fewer)."""
        return CPUSet(self._sorted[: max(n, 0)])

    # -- algebra (each returns a new set) ------------------------------------------------

    def union(self, *others: CPUSet) -> CPUSet:
        return CPUSet(self._elems.union(*(o._elems for o in others)))

    def intersection(self, other: CPUSet) -> CPUSet:
        return CPUSet(self._elems & other._elems)

    def difference(self, other: CPUSet) -> CPUSet:
        return CPUSet(self._elems - other._elems)

    def filter(self, predicate: Callable[[int], bool]) -> CPUSet:
        return CPUSet(c for c in self._elems if predicate(c))

    def __or__(self, other: CPUSet) -> CPUSet:
        return self.union(other)

    def __and__(self, other: CPUSet) -> CPUSet:
        return self.intersection(other)

    def __sub__(self, other: CPUSet) -> CPUSet:
        return self.difference(other)

    def __le__(self, other: CPUSet) -> bool:
        return self.is_subset_of(other)

    # -- protocol ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._elems)

    def __bool__(self) -> bool:
        return bool(self._elems)

    def __iter__(self) -> Iterator[int]:
        return iter(self._sorted)

    def __contains__(self, cpu: object) -> bool:
        return cpu in self._elems

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CPUSet):
            return self._elems == other._elems
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._elems)

    def __str__(self) -> str:
        return format_list(self._sorted)

    def __repr__(self) -> str:
        return f"CPUSet({str(self)!r})"


def format_list(ascending: Iterable[int]) -> str:
    """Sorted CPU ids in canonical list form: runs of consecutive ids become ``a-b``."""
    parts: list[str] = []
    start = prev = None
    for cpu in ascending:
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def _atoi(text: str, whole: str, element: str) -> int:
    if not _GO_INT.fullmatch(text):
        what = "an empty number" if text == "" else f"{text[:40]!r} is not a number"
        raise CPUSetParseError(f"invalid CPU list {_short(whole)}: element {element[:40]!r}: {what}")
    value = int(text)
    if abs(value) > _INT64_MAX:
        raise CPUSetParseError(f"invalid CPU list {_short(whole)}: element {element[:40]!r}: {text} is out of range")
    return value


#: No CPU id reaches this: Linux's NR_CPUS is at most 8192 on every architecture it builds for
#: (x86's MAXSMP is 8192). A list naming one is refused before any range is expanded, so that a
#: file or message saying "0-999999999" cannot make a set of a billion ids (issue 34).
MAX_CPUS = 8192


def parse(text: str) -> CPUSet:
    """Parse a Linux CPU list exactly as k8s.io/utils/cpuset ``Parse`` does, but refuse an id of
    ``MAX_CPUS`` or more (no machine has it) before expanding anything."""
    if text == "":
        return CPUSet()
    cpus: set[int] = set()
    for element in text.split(","):
        start_text, dash, end_text = element.partition("-")
        if not dash:
            cpus.add(_bounded(_atoi(element, text, element), text))
            continue
        start = _atoi(start_text, text, element)
        end = _bounded(_atoi(end_text, text, element), text)
        if start > end:
            raise CPUSetParseError(
                f"invalid CPU list {_short(text)}: range {element[:40]!r} is reversed ({start} > {end})"
            )
        cpus.update(range(start, end + 1))
    return CPUSet(cpus)


def _short(text: str) -> str:
    return repr(text) if len(text) <= 80 else f"{text[:80]!r}..."


def _bounded(cpu: int, text: str) -> int:
    if cpu >= MAX_CPUS:
        raise CPUSetParseError(
            f"invalid CPU list {_short(text)}: CPU {cpu} is beyond any machine's (at most {MAX_CPUS})"
        )
    return cpu
