"""The kubelet's resource-fit table tests, as data, against ``eventsrc.core.fit``.

``data/kubelet_fit.json`` holds every case of upstream's fit tables (its ``about`` names
the files and commits): ``fit_test.go``'s TestEnoughRequests, TestNotEnoughRequests,
TestStorageRequests and TestRestartableInitContainers, ``predicate_test.go``'s
TestGeneralPredicates and TestRemoveMissingExtendedResources, and the request aggregation
of component-helpers' ``helpers_test.go``. A fit case runs its pod through ``pod_requests``
and ``fits_request`` (``used`` the sum of the node's pods' requests, ``pods`` how many they
are) and must give upstream's InsufficientResource list, order included. No case has two
scalar resources failing at once, so Go's map order never decides an order here.

Cases marked ``differs`` are upstream behaviour eventsrc does not have; they are kept in the
data, not run, and counted (``DIFFERING``):

* 7 TestGeneralPredicates cases check the node's name, host ports and taints: eventsrc has
  no Node object.
* 14 cases use pod-level resources (``spec.resources``, PodLevelResources): pod_requests
  reads containers and overhead only. One of them also expects ``storage``, which
  pod_requests leaves out as the fit does not count it.
* 2 TestEnoughRequests cases hand an extended resource to DRA (DRAExtendedResource):
  eventsrc checks every extended resource against the allocatable.
* 1 case ignores resources by group (IgnoredResourceGroups): fits_request takes names only,
  and the kubelet passes neither.
* 1 case refuses a sidecar at PreFilter with the SidecarContainers gate off: eventsrc has
  no such gate.
* 6 cases read a raw pod whose containers have limits and no requests: a ContainerSpec is
  the pod after the API server's defaulting, where such a limit is the request too.
* 2 cases read the containers' status resources (UseStatusResources, in-place resize):
  eventsrc has none.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from eventsrc.core.fit import (
    fits_request,
    is_scalar_resource,
    pod_requests,
    quantity_integer,
    remove_missing_extended_resources,
)
from eventsrc.events import ContainerSpec

DATA = json.loads((Path(__file__).parent / "data" / "kubelet_fit.json").read_text())

#: How many cases differ, by the start of their reason.
DIFFERING = {
    "eventsrc has no Node object": 7,
    "eventsrc's pod_requests has no pod-level resources": 14,
    "eventsrc has no DRA-backed extended resources": 2,
    "eventsrc's fits_request takes ignored resource names only": 1,
    "eventsrc has no SidecarContainers feature gate": 1,
    "eventsrc's ContainerSpec is the pod as admitted": 6,
    "eventsrc has no container status resources": 2,
}
DIFFERING_TOTAL = 33

ALL = [*DATA["fit"], *DATA["requests"], *DATA["missing_extended"]]


def _run(cases: list[dict[str, Any]]) -> list[Any]:
    return [pytest.param(c, id=f"{c['source']}: {c['name']}") for c in cases if "differs" not in c]


def _containers(raw: list[dict[str, Any]]) -> list[ContainerSpec]:
    return [
        ContainerSpec(name=c["name"], kind=c["kind"], requests=c.get("requests", {}), limits=c.get("limits", {}))
        for c in raw
    ]


def _integers(quantities: dict[str, str]) -> dict[str, int]:
    return {name: quantity_integer(name, q) for name, q in quantities.items()}


def _fit(case: dict[str, Any]) -> list[dict[str, Any]]:
    request = pod_requests(_containers(case["pod"]["containers"]), case["pod"].get("overhead"))
    used: dict[str, int] = {}
    for pod in case["node_pods"]:
        for name, q in pod_requests(_containers(pod["containers"]), pod.get("overhead")).items():
            used[name] = used.get(name, 0) + q
    got = fits_request(request, len(case["node_pods"]), used, case["allocatable"], frozenset(case["ignored"]))
    return [asdict(i) for i in got]


@pytest.mark.parametrize("case", _run(DATA["fit"]))
def test_fit(case: dict[str, Any]) -> None:
    assert _fit(case) == case["want"]


@pytest.mark.parametrize("case", _run(DATA["requests"]))
def test_pod_requests(case: dict[str, Any]) -> None:
    overhead = None if "ExcludeOverhead" in case.get("options", []) else case.get("overhead")
    assert pod_requests(_containers(case["containers"]), overhead) == _integers(case["want_requests"])


@pytest.mark.parametrize("case", _run(DATA["missing_extended"]))
def test_remove_missing_extended_resources(case: dict[str, Any]) -> None:
    request = pod_requests(_containers(case["containers"]))
    got = remove_missing_extended_resources(request, case["allocatable"])
    assert got == _integers(case["want_requests"])


def test_differing_cases() -> None:
    reasons = Counter(
        next((start for start in DIFFERING if c["differs"].startswith(start)), c["differs"])
        for c in ALL
        if "differs" in c
    )
    assert dict(reasons) == DIFFERING
    assert sum(reasons.values()) == DIFFERING_TOTAL


def test_cases_are_whole() -> None:
    assert len(DATA["fit"]) == 72 and len(DATA["requests"]) == 40 and len(DATA["missing_extended"]) == 3
    assert len({(c["source"], c["name"], json.dumps(c, sort_keys=True)) for c in ALL}) == len(ALL)
    # At most one scalar resource fails per case: upstream's order (Go map order among the
    # scalar resources) is then the one order, and eventsrc's (by name) the same.
    assert all(sum(is_scalar_resource(w["resource"]) for w in c["want"]) <= 1 for c in DATA["fit"])


def test_the_kubelets_first_reason() -> None:
    """The kubelet refuses with the first failure: its reason and message."""
    case = next(c for c in DATA["fit"] if c["name"] == "not enough cpu and memory resource")
    request = pod_requests(_containers(case["pod"]["containers"]))
    used = pod_requests(_containers(case["node_pods"][0]["containers"]))
    first = fits_request(request, 1, used, case["allocatable"])[0]
    assert first.reason() == "OutOfcpu"
    assert first.message() == "Node didn't have enough resource: cpu, requested: 8, used: 5, capacity: 10"
