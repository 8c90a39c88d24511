"""CPU sets: the upstream table tests, as data, then eventsrc's own checks.

Ported from kubernetes/kubernetes ``pkg/kubelet/cm/cpuset/cpuset_test.go`` (the package that
became k8s.io/utils/cpuset; the utils copy of the test is not in the stored index, and the
Parse and String tables are the ones utils keeps). Upstream ``NewCPUSet(1, 2)`` is written
``{1, 2}`` here; ``UnionAll`` is ``union(*sets)``; ``ToSlice`` is ``sorted_list``.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventsrc.core.cpu.cpuset import CPUSet, CPUSetParseError, parse

E: set[int] = set()  # upstream NewCPUSet()
A5 = {1, 2, 3, 4, 5}

# -- upstream tables ----------------------------------------------------------------------

SIZE = [(E, 0), ({5}, 1), (A5, 5)]
IS_EMPTY = [(E, True), ({5}, False), (A5, False)]
CONTAINS = [  # (set, must contain, must not contain)
    (E, [], [1, 2, 3, 4, 5]),
    ({5}, [5], [1, 2, 3, 4]),
    ({1, 2, 4, 5}, [1, 2, 4, 5], [0, 3, 6]),
]
EQUAL = [(E, E), ({5}, {5}), (A5, A5)]
NOT_EQUAL = [(E, {5}), ({5}, E), (E, A5), (A5, E), ({5}, A5), (A5, {5})]
SUBSET = [
    (E, E),
    ({5}, {5}),
    (A5, A5),  # a set is a subset of itself
    (E, {5}),
    (E, A5),  # the empty set is a subset of every set
    ({5}, A5),
    ({1, 2, 3}, A5),
    ({4, 5}, A5),
    ({2, 3}, A5),
]
NOT_SUBSET = [({5}, {6, 7, 8})]
UNION_ALL = [  # (s1, s2, s3, expected)
    (E, A5, {4, 5}, A5),
    (A5, E, {4}, A5),
    (A5, A5, {1, 5}, A5),
]
UNION = [
    (E, E, E),
    (E, {5}, {5}),
    ({5}, E, {5}),
    ({5}, {5}, {5}),
    (E, A5, A5),
    (A5, E, A5),
    (A5, A5, A5),
    ({5}, A5, A5),
    (A5, {5}, A5),
    ({1, 2}, {3, 4, 5}, A5),
    ({1, 2, 3}, {3, 4, 5}, A5),
]
INTERSECTION = [
    (E, E, E),
    (E, {5}, E),
    ({5}, E, E),
    ({5}, {5}, {5}),
    (E, A5, E),
    (A5, E, E),
    (A5, A5, A5),
    ({5}, A5, {5}),
    (A5, {5}, {5}),
    ({1, 2}, {3, 4, 5}, E),
    ({1, 2, 3}, {3, 4, 5}, {3}),
]
DIFFERENCE = [
    (E, E, E),
    (E, {5}, E),
    ({5}, E, {5}),
    ({5}, {5}, E),
    (E, A5, E),
    (A5, E, A5),
    (A5, A5, E),
    ({5}, A5, E),
    (A5, {5}, {1, 2, 3, 4}),
    ({1, 2}, {3, 4, 5}, {1, 2}),
    ({1, 2, 3}, {3, 4, 5}, {1, 2}),
]
TO_SLICE = [(E, []), ({5}, [5]), ([2, 3, 5, 1, 4], [1, 2, 3, 4, 5])]
STRING = [(E, ""), ({5}, "5"), (A5, "1-5"), ({1, 2, 3, 5, 6, 8}, "1-3,5-6,8")]
NEW_INT64_STRING = [(E, ""), ({5}, "5"), ([4, 3, 2, 1], "1-4"), ([1, 2, 3, 5, 6, 7, 8, 10], "1-3,5-8,10")]
PARSE_OK = [
    ("", E),
    ("5", {5}),
    ("1,2,3,4,5", A5),
    ("1-5", A5),
    ("1-2,3-5", A5),
    ("5,4,3,2,1", A5),  # range ordering
    ("3-6,1-5", {1, 2, 3, 4, 5, 6}),  # overlapping ranges
    ("3-3,5-5", {3, 5}),  # very short ranges
]
PARSE_BAD = [
    # non-numeric entries
    "nonnumeric",
    "non-numeric",
    "no,numbers",
    "0-a",
    "a-0",
    "0,a",
    "a,0",
    "1-2,a,3-5",
    # incomplete sequences
    "0,",
    "0,,",
    ",3",
    ",,3",
    "0,,3",
    # incomplete ranges and/or negative numbers
    "-1",
    "1-",
    "1,2-,3",
    "1,-2,3",
    "-1--2",
    "--1",
    "1--",
    # reversed ranges
    "3-0",
    "0--3",
]

UPSTREAM_CASES = (
    1  # TestCPUSetBuilder
    + len(SIZE)
    + len(IS_EMPTY)
    + len(CONTAINS)
    + len(EQUAL)
    + len(NOT_EQUAL)
    + len(SUBSET)
    + len(NOT_SUBSET)
    + len(UNION_ALL)
    + len(UNION)
    + len(INTERSECTION)
    + len(DIFFERENCE)
    + len(TO_SLICE)
    + len(STRING)
    + len(PARSE_OK)
    + len(PARSE_BAD)
    + len(NEW_INT64_STRING)
)


def test_upstream_case_count() -> None:
    assert UPSTREAM_CASES == 106


def test_builder() -> None:
    elems = [1, 2, 3, 4, 5]
    result = CPUSet(elems)
    assert all(result.contains(e) for e in elems)
    assert result.size() == len(elems)
    elems.append(6)  # the set does not follow its source
    assert not result.contains(6)


@pytest.mark.parametrize(("cpus", "expected"), SIZE)
def test_size(cpus: set[int], expected: int) -> None:
    assert CPUSet(cpus).size() == expected == len(CPUSet(cpus))


@pytest.mark.parametrize(("cpus", "expected"), IS_EMPTY)
def test_is_empty(cpus: set[int], expected: bool) -> None:
    assert CPUSet(cpus).is_empty() is expected


@pytest.mark.parametrize(("cpus", "yes", "no"), CONTAINS)
def test_contains(cpus: set[int], yes: list[int], no: list[int]) -> None:
    s = CPUSet(cpus)
    assert all(s.contains(c) and c in s for c in yes)
    assert not any(s.contains(c) or c in s for c in no)


@pytest.mark.parametrize(("s1", "s2"), EQUAL)
def test_equal(s1: set[int], s2: set[int]) -> None:
    assert CPUSet(s1).equals(CPUSet(s2))
    assert CPUSet(s1) == CPUSet(s2)
    assert hash(CPUSet(s1)) == hash(CPUSet(s2))


@pytest.mark.parametrize(("s1", "s2"), NOT_EQUAL)
def test_not_equal(s1: set[int], s2: set[int]) -> None:
    assert not CPUSet(s1).equals(CPUSet(s2))
    assert CPUSet(s1) != CPUSet(s2)


@pytest.mark.parametrize(("s1", "s2"), SUBSET)
def test_is_subset_of(s1: set[int], s2: set[int]) -> None:
    assert CPUSet(s1).is_subset_of(CPUSet(s2))


@pytest.mark.parametrize(("s1", "s2"), NOT_SUBSET)
def test_is_not_subset_of(s1: set[int], s2: set[int]) -> None:
    assert not CPUSet(s1).is_subset_of(CPUSet(s2))


@pytest.mark.parametrize(("s1", "s2", "s3", "expected"), UNION_ALL)
def test_union_all(s1: set[int], s2: set[int], s3: set[int], expected: set[int]) -> None:
    assert CPUSet(s1).union(CPUSet(s2), CPUSet(s3)) == CPUSet(expected)


@pytest.mark.parametrize(("s1", "s2", "expected"), UNION)
def test_union(s1: set[int], s2: set[int], expected: set[int]) -> None:
    assert CPUSet(s1).union(CPUSet(s2)) == CPUSet(expected) == CPUSet(s1) | CPUSet(s2)


@pytest.mark.parametrize(("s1", "s2", "expected"), INTERSECTION)
def test_intersection(s1: set[int], s2: set[int], expected: set[int]) -> None:
    assert CPUSet(s1).intersection(CPUSet(s2)) == CPUSet(expected) == CPUSet(s1) & CPUSet(s2)


@pytest.mark.parametrize(("s1", "s2", "expected"), DIFFERENCE)
def test_difference(s1: set[int], s2: set[int], expected: set[int]) -> None:
    assert CPUSet(s1).difference(CPUSet(s2)) == CPUSet(expected) == CPUSet(s1) - CPUSet(s2)


@pytest.mark.parametrize(("cpus", "expected"), TO_SLICE)
def test_to_slice(cpus: list[int], expected: list[int]) -> None:
    assert CPUSet(cpus).sorted_list() == expected
    assert list(CPUSet(cpus)) == expected  # iteration is ascending too


@pytest.mark.parametrize(("cpus", "expected"), [*STRING, *NEW_INT64_STRING])
def test_string(cpus: list[int], expected: str) -> None:
    assert str(CPUSet(cpus)) == expected


@pytest.mark.parametrize(("text", "expected"), PARSE_OK)
def test_parse(text: str, expected: set[int]) -> None:
    assert parse(text) == CPUSet(expected) == CPUSet.parse(text)


@pytest.mark.parametrize("text", PARSE_BAD)
def test_parse_refuses(text: str) -> None:
    with pytest.raises(CPUSetParseError):
        parse(text)


# -- eventsrc's own checks ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("1,,2", "element '': an empty number"),
        ("1-", "element '1-': an empty number"),
        ("-1", "element '-1': an empty number"),
        ("0-a", "element '0-a': 'a' is not a number"),
        ("3-1", "range '3-1' is reversed (3 > 1)"),
        ("0--3", "range '0--3' is reversed (0 > -3)"),
        (" 1", "element ' 1': ' 1' is not a number"),
        ("0-3\n", "'3\\n' is not a number"),
        ("99999999999999999999", "is out of range"),
    ],
)
def test_error_names_the_bad_element(text: str, fragment: str) -> None:
    with pytest.raises(CPUSetParseError) as info:
        parse(text)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message.replace("\\n", "")
    assert message.startswith(f"invalid CPU list {text!r}")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("+2", {2}),  # strconv.Atoi takes a sign
        ("01,002", {1, 2}),  # and leading zeros
        ("1-+3", {1, 2, 3}),
        ("0--0", {0}),  # "-0" is 0: a range 0..0
    ],
)
def test_go_atoi_quirks(text: str, expected: set[int]) -> None:
    assert parse(text) == CPUSet(expected)


def test_immutable_and_hashable() -> None:
    s = CPUSet([3, 1, 2])
    with pytest.raises(AttributeError):
        s._elems = frozenset()  # type: ignore[misc]
    assert {s: "x"}[CPUSet([1, 2, 3])] == "x"
    assert repr(s) == "CPUSet('1-3')"
    assert s.first(2) == CPUSet([1, 2]) and s.first(9) == s and s.first(0) == CPUSet()
    assert s.filter(lambda c: c % 2 == 1) == CPUSet([1, 3])
    assert CPUSet([1]) <= s and not s <= CPUSet([1])


@given(st.frozensets(st.integers(min_value=0, max_value=300)))
def test_string_round_trip(cpus: frozenset[int]) -> None:
    text = str(CPUSet(cpus))
    assert parse(text) == CPUSet(cpus)
    # canonical: ascending, no range of one, no two ranges that touch
    assert str(parse(text)) == text
