"""Quantities and QoS classes, as Kubernetes computes them."""

from __future__ import annotations

from fractions import Fraction

import pytest

from eventsrc.core.resources import (
    QuantityError,
    exclusive_cpus,
    milli_cpus,
    parse_quantity,
    qos_class,
)
from eventsrc.events import ContainerSpec

QUANTITIES = [
    ("2", Fraction(2)),
    ("500m", Fraction(1, 2)),
    ("1.5", Fraction(3, 2)),
    ("1Gi", Fraction(2**30)),
    ("1G", Fraction(10**9)),
    ("128Mi", Fraction(128 * 2**20)),
    ("1e3", Fraction(1000)),
    ("0", Fraction(0)),
    (".5", Fraction(1, 2)),
]


@pytest.mark.parametrize(("text", "value"), QUANTITIES)
def test_parse_quantity(text: str, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["", "abc", "1.2.3", "1Xi", "--1"])
def test_bad_quantities(bad: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(bad)


def test_milli_cpus_round_up() -> None:
    assert milli_cpus("2") == 2000
    assert milli_cpus("250m") == 250
    assert milli_cpus("0.0001") == 1


def c(
    name: str = "c", requests: dict[str, str] | None = None, limits: dict[str, str] | None = None, kind: str = "app"
) -> ContainerSpec:
    return ContainerSpec(name=name, kind=kind, requests=requests or {}, limits=limits or {})


# (containers, expected QoS) — the cases of Kubernetes' TestGetPodQOS, as far as cpu and memory go.
QOS = [
    ([c()], "BestEffort"),
    ([c(limits={"example.com/dev": "1"})], "BestEffort"),
    ([c(limits={"cpu": "1", "memory": "1Gi"})], "Guaranteed"),
    ([c(requests={"cpu": "1", "memory": "1Gi"}, limits={"cpu": "1", "memory": "1Gi"})], "Guaranteed"),
    ([c(requests={"cpu": "500m"}, limits={"cpu": "1", "memory": "1Gi"})], "Burstable"),
    ([c(limits={"cpu": "1"})], "Burstable"),
    ([c(requests={"memory": "1Gi"})], "Burstable"),
    ([c("a", limits={"cpu": "1", "memory": "1Gi"}), c("b")], "Burstable"),
    (
        [c("a", limits={"cpu": "1", "memory": "1Gi"}), c("i", limits={"cpu": "2", "memory": "1Gi"}, kind="init")],
        "Guaranteed",
    ),
]


@pytest.mark.parametrize(("containers", "expected"), QOS)
def test_qos_class(containers: list[ContainerSpec], expected: str) -> None:
    assert qos_class(containers) == expected


def test_exclusive_cpus_only_for_whole_cpus_in_guaranteed_pods() -> None:
    whole = c(limits={"cpu": "2", "memory": "1Gi"})
    half = c(limits={"cpu": "1500m", "memory": "1Gi"})
    assert exclusive_cpus("Guaranteed", whole) == 2
    assert exclusive_cpus("Guaranteed", half) == 0
    assert exclusive_cpus("Burstable", whole) == 0
    assert exclusive_cpus("Guaranteed", c(limits={"memory": "1Gi"})) == 0
