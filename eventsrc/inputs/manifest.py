"""Pod manifests as ``kubectl get pod -o yaml`` prints them, decoded and checked.

Only what the node's resource managers need is read (metadata, init containers with
their restart policy, containers, resources, resource claims and the claims generated for
the pod); everything else in the manifest is ignored. There is one model of a Pod manifest
(``PodManifest``): ``pod_spec`` turns it into the pod eventsrc admits, and
``claim_manifest.pod_claims`` reads the ResourceClaims it references from it. Errors name
the field, in one line. Pure: bytes in, Struct out.
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


# --------------------------------------------------------------------------- the manifest
# One model of a Pod manifest, read by the resource managers (parse_pod) and by the DRA
# manager (claim_manifest.pod_claims). A field the manifest leaves out takes the default
# here; a field given as null is refused, except where Kubernetes itself writes null.


class ContainerClaim(Struct, frozen=True):
    """An entry of a container's ``resources.claims``: a pod claim, or one of its requests."""

    name: str = ""
    request: str | None = None


class ContainerResources(Struct, frozen=True):
    limits: dict[str, Quantity] = {}
    requests: dict[str, Quantity] = {}
    claims: list[ContainerClaim] = []


class ContainerManifest(Struct, rename="camel", frozen=True):
    name: str = ""
    restart_policy: str = ""
    resources: ContainerResources = ContainerResources()


class PodClaimSource(Struct, rename="camel", frozen=True):
    """An entry of ``spec.resourceClaims``: a ResourceClaim by name, or a template."""

    name: str = ""
    resource_claim_name: str = ""
    resource_claim_template_name: str = ""


class PodManifestSpec(Struct, rename="camel", frozen=True):
    containers: list[ContainerManifest] = []
    init_containers: list[ContainerManifest] = []
    resource_claims: list[PodClaimSource] = []


class ClaimStatusEntry(Struct, rename="camel", frozen=True):
    """An entry of ``status.resourceClaimStatuses``: the claim generated from a template, or
    null when none was needed."""

    name: str = ""
    resource_claim_name: str | None = None


class PodManifestStatus(Struct, rename="camel", frozen=True):
    resource_claim_statuses: list[ClaimStatusEntry] | None = None


class PodMetadata(Struct, frozen=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""


class PodManifest(Struct, frozen=True):
    """A Pod manifest as decoded, before the checks that make it a PodSpec."""

    apiVersion: str = "v1"  # noqa: N815
    kind: str = "Pod"
    metadata: PodMetadata = PodMetadata()
    spec: PodManifestSpec = PodManifestSpec()
    status: PodManifestStatus | None = None


# --------------------------------------------------------------------------- what eventsrc admits


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


def _container(c: ContainerManifest, index: int, field: str, kind: str, source: str) -> ev.ContainerSpec:
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
    claims = [cl.name for cl in c.resources.claims]
    return ev.ContainerSpec(name=c.name, kind=kind, requests=requests, limits=limits, claims=claims)


def read_pod(data: bytes, source: str = "pod") -> PodManifest:
    """Decode a Pod manifest (YAML or JSON, one document). Raises ManifestError naming the field."""
    raw = _load(data, source)
    if not isinstance(raw, dict):
        raise ManifestError(f"{source}: expected a Pod object, got {type(raw).__name__}")
    try:
        pod = msgspec.convert(raw, PodManifest, strict=False)
    except msgspec.ValidationError as exc:
        raise ManifestError(f"{source}: {exc}".replace(" - at `$.", " at ").replace("`", "")) from None
    if pod.kind != "Pod":
        raise ManifestError(f"{source}: kind is {pod.kind!r}, expected 'Pod'")
    return pod


def pod_spec(pod: PodManifest, source: str = "pod") -> PodSpec:
    """The pod as eventsrc admits it (without its claims). Raises ManifestError naming the field."""
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


def parse_pod(data: bytes, source: str = "pod") -> PodSpec:
    """Decode and check a Pod manifest (YAML or JSON). Raises ManifestError naming the field."""
    return pod_spec(read_pod(data, source), source)
