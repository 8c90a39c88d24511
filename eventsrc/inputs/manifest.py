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
from eventsrc.core.devices.names import DNS1123_LABEL, is_dns1123_subdomain, is_extended_resource_name
from eventsrc.core.resources import QuantityError, parse_quantity
from eventsrc.errors import BadRequest

Quantity = str | int | float


class ManifestError(BadRequest):
    """A manifest or a pod that cannot be admitted as it is written; the message names the field."""

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
    #: ``events.FROM_RUNTIME`` for a pod read from the container runtime's facts (NRI)
    source: str = ""


_WHOLE = re.compile(r"^[0-9]+$")
_DNS1123_LABEL = re.compile(DNS1123_LABEL)


def is_dns1123_label(value: str) -> bool:
    """apimachinery IsDNS1123Label: at most 63 lowercase letters, digits and '-', alphanumeric at both ends."""
    return len(value) <= 63 and _DNS1123_LABEL.fullmatch(value) is not None


def decode(data: bytes, source: str, *, documents: bool = False) -> Any:
    """A YAML or JSON manifest as Python values (with ``documents``, the list of its non-empty
    documents). Raises ManifestError in one line: not YAML or JSON, text that is not Unicode,
    or nesting too deep to read.

    JSON is read as JSON first: PyYAML leaves the two halves of an escaped surrogate pair
    (``"\\ud83d\\ude00"``, ``json.dumps``' default for 😀) apart; msgspec joins them.
    """
    import yaml

    try:
        if data.lstrip()[:1] in (b"{", b"["):
            try:
                doc = msgspec.json.decode(data)
                return ([] if doc is None else [doc]) if documents else doc
            except (msgspec.DecodeError, UnicodeDecodeError):
                pass  # YAML's flow style, or broken JSON or UTF-8: YAML says what is wrong and where
        try:
            loaded = [d for d in yaml.safe_load_all(data) if d is not None] if documents else yaml.safe_load(data)
        except yaml.YAMLError as exc:
            raise yaml_error(exc, source) from None
        return _joined(loaded, source)
    except RecursionError:
        raise ManifestError(f"{source}: nested too deeply to read") from None


def _joined(value: Any, source: str) -> Any:
    """``value`` with the surrogate pairs in its strings joined; a lone surrogate is refused."""
    if isinstance(value, str):
        try:
            return value.encode("utf-16", "surrogatepass").decode("utf-16")
        except UnicodeDecodeError:
            raise ManifestError(f"{source}: {value!r} is not text (an escaped surrogate without its pair)") from None
    if isinstance(value, list):
        return [_joined(v, source) for v in value]
    if isinstance(value, dict):
        return {_joined(k, source): _joined(v, source) for k, v in value.items()}
    return value


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


def _container(c: ContainerManifest, index: int, field: str, kind: str) -> tuple[str, ev.ContainerSpec]:
    """The container as decoded (quantities as strings), with its field path; checked by ``checked_pod``."""
    limits = {k: _quantity(v) for k, v in c.resources.limits.items()}
    requests = {k: _quantity(v) for k, v in c.resources.requests.items()}
    claims = [cl.name for cl in c.resources.claims]
    spec = ev.ContainerSpec(name=c.name, kind=kind, requests=requests, limits=limits, claims=claims)
    return f"spec.{field}[{index}]", spec


# --------------------------------------------------------------------------- the checks of a pod
# One validation of a pod, for the CLI's manifests (``pod_spec``) and the node API's requests
# (``eventsrc.api.node.pod_from_proto``) alike: the same input is refused the same way by both,
# naming the field (exit 2 in the CLI, INVALID_ARGUMENT from the node API).

# A uid's form is not validated by Kubernetes: the apiserver sets it (a UUID). The kubelet makes
# it a path component (pods/<uid>/...), and `eventsrc remove` must tell it from NAMESPACE/NAME,
# so eventsrc takes what is safe in both: letters, digits, '-', '_' and '.', starting with a
# letter or digit, at most 128 characters (a UUID has 36).
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_UID_LENGTH = 128
KINDS = ("init", "sidecar", "app")


def uid_problem(uid: str) -> str | None:
    """Why ``uid`` is not a pod uid eventsrc takes, or None."""
    if not uid:
        return "required"
    if _UID.fullmatch(uid) is None:
        return (
            f"{uid!r} is not a uid: 1 to {MAX_UID_LENGTH} letters, digits, '-', '_' or '.', "
            "starting with a letter or a digit"
        )
    return None


def namespace_problem(namespace: str) -> str | None:
    """apimachinery ValidateNamespaceName: a DNS-1123 label (at most 63 characters)."""
    if not is_dns1123_label(namespace):
        return f"{namespace!r} is not a namespace: a DNS-1123 label (lowercase letters, digits and '-', at most 63)"
    return None


def name_problem(name: str) -> str | None:
    """apimachinery ValidatePodName: a DNS-1123 subdomain (at most 253 characters)."""
    if not name:
        return "required"
    if not is_dns1123_subdomain(name):
        return f"{name!r} is not a pod name: a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most 253)"
    return None


def _check_container(where: str, c: ev.ContainerSpec) -> ev.ContainerSpec:
    """``c`` checked as the apiserver checks a container (its name, a DNS-1123 label; its
    quantities; extended resources as whole numbers, with a limit, requests equal to limits),
    with the requests of extended resources defaulted to their limits."""
    if not c.name:
        raise ManifestError(f"{where}.name: required")
    if not is_dns1123_label(c.name):
        raise ManifestError(
            f"{where}.name: {c.name!r} is not a container name: a DNS-1123 label "
            "(lowercase letters, digits and '-', at most 63)"
        )
    if c.kind not in KINDS:
        raise ManifestError(f"{where}.kind: must be init, sidecar or app, got {c.kind!r}")
    requests, limits = dict(c.requests), dict(c.limits)
    for field, values in (("requests", requests), ("limits", limits)):
        for name, value in values.items():
            try:
                parse_quantity(value)
            except QuantityError:
                raise ManifestError(f"{where}.resources.{field}[{name}]: {value!r} is not a quantity") from None
    for field, values in (("requests", requests), ("limits", limits)):
        for name, value in values.items():
            if is_extended_resource_name(name) and not _WHOLE.match(value):
                raise ManifestError(
                    f"{where}.resources.{field}[{name}]: must be a whole number of devices, got {value!r}"
                )
    for name in requests:
        # The apiserver's rule for resources that cannot be overcommitted.
        if is_extended_resource_name(name) and name not in limits:
            raise ManifestError(f"{where}.resources.limits[{name}]: required (a device request needs its limit)")
    for name, value in limits.items():
        if is_extended_resource_name(name):
            if name in requests and int(requests[name]) != int(value):
                raise ManifestError(f"{where}.resources.requests[{name}]: must be equal to {name} limit")
            requests.setdefault(name, value)  # requests default to limits
    return ev.ContainerSpec(name=c.name, kind=c.kind, requests=requests, limits=limits, claims=list(c.claims))


def checked_pod(
    ref: ev.PodRef, containers: list[tuple[str, ev.ContainerSpec]], *, meta: str, containers_field: str
) -> PodSpec:
    """The pod, checked: ``ref``'s fields (the uid only when given: the CLI generates a
    missing one) under ``meta`` ("metadata", "pod"), and each container under its field path,
    in admission order. The namespace defaults to "default". Raises ManifestError naming the field."""
    namespace = ref.namespace or "default"
    for field, problem in (
        ("name", name_problem(ref.name)),
        ("namespace", namespace_problem(namespace)),
        ("uid", uid_problem(ref.uid) if ref.uid else None),
    ):
        if problem is not None:
            raise ManifestError(f"{meta}.{field}: {problem}")
    if not containers:
        raise ManifestError(f"{containers_field}: a pod needs at least one container")
    checked = [_check_container(where, c) for where, c in containers]
    seen: set[str] = set()
    for (where, _), c in zip(containers, checked, strict=True):
        if c.name in seen:
            raise ManifestError(f"{where}.name: container name {c.name!r} is used twice")
        seen.add(c.name)
    return PodSpec(pod=ev.PodRef(uid=ref.uid, namespace=namespace, name=ref.name), containers=checked)


def read_pod(data: bytes, source: str = "pod") -> PodManifest:
    """Decode a Pod manifest (YAML or JSON, one document). Raises ManifestError naming the field."""
    raw = decode(data, source)
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
    containers = [
        _container(c, i, "initContainers", "sidecar" if c.restart_policy == "Always" else "init")
        for i, c in enumerate(pod.spec.init_containers)
    ] + [_container(c, i, "containers", "app") for i, c in enumerate(pod.spec.containers)]
    if not pod.spec.containers:
        containers = []  # init containers alone do not make a pod
    ref = ev.PodRef(uid=pod.metadata.uid, namespace=pod.metadata.namespace, name=pod.metadata.name)
    try:
        return checked_pod(ref, containers, meta="metadata", containers_field="spec.containers")
    except ManifestError as err:
        raise ManifestError(f"{source}: {err}") from None


def parse_pod(data: bytes, source: str = "pod") -> PodSpec:
    """Decode and check a Pod manifest (YAML or JSON). Raises ManifestError naming the field."""
    return pod_spec(read_pod(data, source), source)
