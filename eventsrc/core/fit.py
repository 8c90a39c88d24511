"""The kubelet's resource fit: does a pod's request fit what the node has left?

The kubelet's predicate admit handler (``pkg/kubelet/lifecycle/predicate.go``) runs the
scheduler's ``noderesources.Fits`` against the node's allocatable and the requests of the
pods it runs already, and refuses with the first failure only: ``OutOfcpu``,
``OutOfmemory``, ``OutOfephemeral-storage``, ``OutOfpods`` or ``OutOf<resource>``, worded
``Node didn't have enough resource: cpu, requested: 1000, used: 200, capacity: 1000``.

Pure steps, in the kubelet's terms:

* ``pod_requests``: ``resource.PodRequests`` (component-helpers): app containers and
  restartable (sidecar) init containers add up; each plain init container needs its own
  request plus the sidecars started before it; the pod needs the larger of the two; the
  overhead is added. Then ``framework.Resource``'s integers: CPU in millicores, the rest in
  units, each rounded up.
* ``node_allocatable``: capacity minus ``--kube-reserved``, ``--system-reserved`` and the
  hard eviction thresholds, never below 0; pre-allocated hugepages taken off memory (the
  kubelet's node status setter).
* ``remove_missing_extended_resources``: the predicate handler's
  ``removeMissingExtendedResources``, before the fit: an extended resource the node's
  allocatable does not list (a cluster-level resource) is not checked.
* ``fits_request``: ``noderesources.fitsRequest``, in its order: pods, cpu, memory,
  ephemeral-storage, then the scalar resources (hugepages, extended resources). Go walks
  the scalar resources in map order; here they go by name, so that the first reason is
  the same on every run.

No I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from eventsrc.core.devices.names import is_extended_resource_name
from eventsrc.core.memory.machine import MEMORY, is_hugepage_resource
from eventsrc.core.resources import parse_quantity
from eventsrc.state.pods import RequestsIndex
from eventsrc.state.views import PodsView, index_beside

CPU = "cpu"
EPHEMERAL_STORAGE = "ephemeral-storage"
PODS = "pods"


def is_scalar_resource(name: str) -> bool:
    """``schedutil.IsScalarResourceName``: extended resources, hugepages, prefixed native
    resources (``IsPrefixedNativeResource``: the name contains ``kubernetes.io/``, as
    ``subdomain.kubernetes.io/something`` does too), attachable volumes."""
    return (
        is_extended_resource_name(name)
        or is_hugepage_resource(name)
        or "kubernetes.io/" in name
        or name.startswith("attachable-volumes-")
    )


def _counted(name: str) -> bool:
    return name in (CPU, MEMORY, EPHEMERAL_STORAGE) or is_scalar_resource(name)


class Container(Protocol):
    """A container as the fit reads it (``events.ContainerSpec``, ``state.views.ContainerView``)."""

    @property
    def kind(self) -> str: ...
    @property
    def requests(self) -> Mapping[str, str]: ...
    @property
    def limits(self) -> Mapping[str, str]: ...


def _container_requests(c: Container) -> dict[str, Fraction]:
    # The API server defaults a request to its limit where only the limit is given.
    return {name: parse_quantity(q) for name, q in {**c.limits, **c.requests}.items() if _counted(name)}


def _add(into: dict[str, Fraction], more: Mapping[str, Fraction]) -> None:
    for name, q in more.items():
        into[name] = into.get(name, Fraction(0)) + q


def _max(into: dict[str, Fraction], other: Mapping[str, Fraction]) -> None:
    for name, q in other.items():
        if q > into.get(name, Fraction(0)):
            into[name] = q


def _integer(name: str, q: Fraction) -> int:
    """``framework.Resource``'s integer of a quantity: millicores for CPU, else units; a
    fraction rounds up, as ``Quantity.MilliValue`` and ``Value`` do."""
    return math.ceil(q * 1000) if name == CPU else math.ceil(q)


def pod_requests(containers: Iterable[Container], overhead: Mapping[str, str] | None = None) -> dict[str, int]:
    """What the pod requests, per resource (``resource.PodRequests``), as the fit counts it;
    ``containers`` in admission order: init and sidecar containers in their order, then the
    app containers. Resources the fit does not count (``pods``, unknown names) are left out."""
    total: dict[str, Fraction] = {}
    sidecars: dict[str, Fraction] = {}
    inits: dict[str, Fraction] = {}
    for c in containers:
        own = _container_requests(c)
        if c.kind == "app":
            _add(total, own)
        elif c.kind == "sidecar":  # restartable: runs beside everything after it
            _add(total, own)
            _add(sidecars, own)
            _max(inits, sidecars)
        else:  # an init container runs beside the sidecars started before it
            need = dict(own)
            _add(need, sidecars)
            _max(inits, need)
    _max(total, inits)
    for name, q in (overhead or {}).items():
        if _counted(name):
            _add(total, {name: parse_quantity(q)})
    return {name: _integer(name, q) for name, q in total.items()}


def quantity_integer(name: str, text: str) -> int:
    """One quantity as the fit counts ``name``: millicores for CPU, else units."""
    return _integer(name, parse_quantity(text))


def node_allocatable(
    capacity: Mapping[str, int],
    reserved: Mapping[str, int],
    eviction: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """The node's allocatable: each capacity minus what is reserved for it (``kubeReserved``
    plus ``systemReserved``) and its hard eviction threshold, never below 0; then every
    hugepage size's capacity taken off memory (pre-allocated hugepages are no memory a pod
    can request). Integers as ``fits_request`` takes them."""
    eviction = eviction or {}
    out = {name: max(0, have - reserved.get(name, 0) - eviction.get(name, 0)) for name, have in capacity.items()}
    if MEMORY in out:
        for name, have in capacity.items():
            if is_hugepage_resource(name):
                out[MEMORY] = max(0, out[MEMORY] - have)
    return out


def remove_missing_extended_resources(request: Mapping[str, int], allocatable: Mapping[str, int]) -> dict[str, int]:
    """The kubelet's ``removeMissingExtendedResources``, run before the fit: an extended
    resource the node's allocatable does not list at all (a cluster-level resource, unknown
    to the node) is taken out of the request; one listed, even with 0, stays."""
    return {name: q for name, q in request.items() if not is_extended_resource_name(name) or name in allocatable}


@dataclass(frozen=True)
class Insufficient:
    """``InsufficientResourceError``: one resource the pod does not fit."""

    resource: str
    requested: int
    used: int
    capacity: int

    def reason(self) -> str:
        """The kubelet's reason: ``OutOfcpu``, ``OutOfmemory``, ... ``OutOf<resource>``."""
        return f"OutOf{self.resource}"

    def message(self) -> str:
        return (
            f"Node didn't have enough resource: {self.resource}, requested: {self.requested}, "
            f"used: {self.used}, capacity: {self.capacity}"
        )


def fits_request(
    request: Mapping[str, int],
    pods: int,
    used: Mapping[str, int],
    allocatable: Mapping[str, int],
    ignored: frozenset[str] = frozenset(),
) -> list[Insufficient]:
    """``noderesources.fitsRequest``: every resource the pod does not fit, in the scheduler's
    order (pods, cpu, memory, ephemeral-storage, then scalar resources by name). ``pods`` is
    how many pods the node runs besides this one; ``used`` the sum of their requests; a
    resource absent from ``allocatable`` has 0 of it. ``ignored`` extended resources are
    not checked."""
    out: list[Insufficient] = []
    allowed = allocatable.get(PODS, 0)
    if pods + 1 > allowed:
        out.append(Insufficient(PODS, 1, pods, allowed))
    if not any(request.values()):
        return out
    for name in (CPU, MEMORY, EPHEMERAL_STORAGE, *sorted(n for n in request if is_scalar_resource(n))):
        want = request.get(name, 0)
        if want == 0 or (name in ignored and is_extended_resource_name(name)):
            continue
        have, taken = allocatable.get(name, 0), used.get(name, 0)
        if want > have - taken:
            out.append(Insufficient(name, want, taken, have))
    return out


def node_usage(pods: PodsView, without: str) -> tuple[int, dict[str, int]]:
    """How many pods the node runs besides pod ``without``, and what they request, summed
    (the kubelet's ``OtherPods`` in its ``NodeInfo``): every pod the views hold, whatever its
    state. The sums are kept beside the pods (``state.pods.RequestsIndex``); the pods the
    reducers marked changed are counted again first, so a call costs what changed since the
    last one, not a pass over every pod."""
    index = index_beside(pods, pods.pods, RequestsIndex.build)
    for uid in index.changed:
        for name, n in index.per_pod.pop(uid, {}).items():
            index.total[name] -= n
        pod = pods.pods.get(uid)
        if pod is None:
            continue
        wants = index.per_pod[uid] = pod_requests(pod.containers.values())
        for name, n in wants.items():
            index.total[name] = index.total.get(name, 0) + n
    index.changed.clear()
    own = index.per_pod.get(without, {})
    others = len(index.per_pod) - (without in index.per_pod)
    return others, {name: n - own.get(name, 0) for name, n in index.total.items()}
