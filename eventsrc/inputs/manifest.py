"""Pod manifests as ``kubectl get pod -o yaml`` prints them, decoded and checked.

Only what the node's resource managers need is read (metadata, init containers with
their restart policy, containers, resources, resource claims); everything else in the
manifest is ignored. Errors name the field, in one line. Pure: bytes in, Struct out.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from msgspec import Struct

from eventsrc import events as ev
from eventsrc.core.devices.names import is_extended_resource_name
from eventsrc.core.resources import QuantityError, parse_quantity
from eventsrc.errors import EventsrcError

Quantity = str | int | float


class ManifestError(EventsrcError):
    exit_code = 2


class _Resources(Struct, rename="camel", frozen=True):
    limits: dict[str, Quantity] = {}
    requests: dict[str, Quantity] = {}
    claims: list[dict[str, Any]] = []


class _Container(Struct, rename="camel", frozen=True):
    name: str = ""
    restart_policy: str = ""
    resources: _Resources = _Resources()


class _ClaimSource(Struct, rename="camel", frozen=True):
    name: str = ""
    resource_claim_name: str = ""
    resource_claim_template_name: str = ""


class _Spec(Struct, rename="camel", frozen=True):
    containers: list[_Container] = []
    init_containers: list[_Container] = []
    resource_claims: list[_ClaimSource] = []


class _Metadata(Struct, frozen=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""


class _Pod(Struct):
    apiVersion: str = "v1"  # noqa: N815
    kind: str = "Pod"
    metadata: _Metadata = _Metadata()
    spec: _Spec = _Spec()


class PodClaim(Struct, frozen=True, kw_only=True):
    """A ResourceClaim the pod brings, as the scheduler allocated and reserved it."""

    ref: ev.ClaimRef
    driver: str
    devices: list[tuple[str, str, str, str]] = []  # (request, driver, pool, device)
    reserved_for: list[str] = []  # pod uids


class PodSpec(Struct, frozen=True, kw_only=True):
    """A pod as eventsrc admits it: its reference, its containers in admission order (their
    ``claims`` are ResourceClaim uids), and the claims it brings."""

    pod: ev.PodRef
    containers: list[ev.ContainerSpec]
    claims: list[PodClaim] = []


_WHOLE = re.compile(r"^[0-9]+$")


def _load(data: bytes, source: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise yaml_error(exc, source) from None


def yaml_error(exc: Exception, source: str) -> ManifestError:
    """A YAML parse error as one line naming the source and the line."""
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1})" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return ManifestError(f"{source}: not valid YAML or JSON{where}: {problem}")


def _quantity(value: Quantity) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _container(c: _Container, index: int, field: str, kind: str, source: str) -> ev.ContainerSpec:
    where = f"{source}: spec.{field}[{index}]"
    if not c.name:
        raise ManifestError(f"{where}.name: required")
    limits = {k: _quantity(v) for k, v in c.resources.limits.items()}
    requests = {k: _quantity(v) for k, v in c.resources.requests.items()}
    for field, values in (("requests", requests), ("limits", limits)):
        for name, value in values.items():
            try:
                parse_quantity(value)
            except QuantityError:
                raise ManifestError(f"{where}.resources.{field}[{name}]: {value!r} is not a quantity") from None
    for name, value in {**requests, **limits}.items():
        if is_extended_resource_name(name):
            if not _WHOLE.match(value):
                raise ManifestError(f"{where}.resources: {name} must be a whole number of devices, got {value!r}")
            if name in limits and name in requests and int(limits[name]) != int(requests[name]):
                raise ManifestError(f"{where}.resources.requests[{name}]: must be equal to {name} limit")
            # Extended resources cannot be overcommitted: requests default to limits.
            requests.setdefault(name, limits.get(name, value))
            limits.setdefault(name, requests[name])
    claims = [str(cl.get("name", "")) for cl in c.resources.claims]
    return ev.ContainerSpec(name=c.name, kind=kind, requests=requests, limits=limits, claims=claims)


def parse_pod(data: bytes, source: str = "pod") -> PodSpec:
    """Decode a Pod manifest (YAML or JSON). Raises ManifestError naming the field."""
    raw = _load(data, source)
    if not isinstance(raw, dict):
        raise ManifestError(f"{source}: expected a Pod object, got {type(raw).__name__}")
    try:
        pod = msgspec.convert(raw, _Pod, strict=False)
    except msgspec.ValidationError as exc:
        raise ManifestError(f"{source}: {exc}".replace(" - at `$.", " at ").replace("`", "")) from None
    if pod.kind != "Pod":
        raise ManifestError(f"{source}: kind is {pod.kind!r}, expected 'Pod'")
    if not pod.metadata.name:
        raise ManifestError(f"{source}: metadata.name: required")
    if not pod.spec.containers:
        raise ManifestError(f"{source}: spec.containers: a pod needs at least one container")
    containers = [
        _container(c, i, "initContainers", "sidecar" if c.restart_policy == "Always" else "init", source)
        for i, c in enumerate(pod.spec.init_containers)
    ] + [_container(c, i, "containers", "app", source) for i, c in enumerate(pod.spec.containers)]
    seen: set[str] = set()
    for c in containers:
        if c.name in seen:
            raise ManifestError(f"{source}: container name {c.name!r} is used twice")
        seen.add(c.name)
    ref = ev.PodRef(uid=pod.metadata.uid, namespace=pod.metadata.namespace or "default", name=pod.metadata.name)
    return PodSpec(pod=ref, containers=containers)


def device_requests(container: ev.ContainerSpec) -> dict[str, int]:
    """Extended resources the container asks for (limits, as the kubelet reads them)."""
    return {k: int(v) for k, v in container.limits.items() if is_extended_resource_name(k) and int(v) > 0}
