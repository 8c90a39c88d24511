"""ResourceClaims brought with a pod, decoded and checked as the kubelet would at admission.

There is no API server here: ``eventsrc admit -f pod.yaml -f claim.yaml ...`` brings the
pod's ResourceClaims as ``kubectl get resourceclaim -o yaml`` prints them, allocated by the
scheduler (``status.allocation.devices.results``) and reserved for the pod
(``status.reservedFor``). This module decodes them (``resource.k8s.io`` v1, v1beta2 and
v1beta1: the fields read here are the same in all three), reads which claims a pod
references (``spec.resourceClaims``, ``status.resourceClaimStatuses`` for claims generated
from templates, and each container's ``resources.claims``) from the pod as
``manifest.read_pod`` decoded it, and checks the two against each other. Only what the DRA
manager needs is read; everything else is ignored.

Malformed manifests raise ``ManifestError`` (exit code 2) naming the field, in one line.
A pod and claims that are well formed but do not fit together raise ``ClaimCheckError``
(exit code 1). Pure: bytes in, Structs out.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from msgspec import Struct

from eventsrc import events as ev
from eventsrc.errors import EventsrcError
from eventsrc.inputs.manifest import ManifestError, PodManifest, decode

API_VERSIONS = ("resource.k8s.io/v1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1")


class ClaimCheckError(EventsrcError):
    """The pod and the claims it brought do not fit together (kubelet admission checks)."""

    exit_code = 1


# --------------------------------------------------------------------------- results


class ClaimResult(Struct, frozen=True):
    """One allocated device: ``status.allocation.devices.results[i]``.

    ``request`` is the request name in the claim's spec; for a device chosen from a
    ``firstAvailable`` list it is ``<request>/<subrequest>``. ``share_id`` is set only for
    devices allocated with consumable capacity (v1, Kubernetes 1.34+).
    """

    request: str
    driver: str
    pool: str
    device: str
    share_id: str = ""

    def matches_request(self, request: str) -> bool:
        """True if a container reference to ``request`` covers this device."""
        return self.request == request or self.request.startswith(request + "/")


class PodConsumer(Struct, frozen=True):
    """One entry of ``status.reservedFor``."""

    resource: str
    name: str
    uid: str
    api_group: str = ""

    @property
    def is_pod(self) -> bool:
        return self.resource == "pods" and self.api_group == ""


class ClaimSpec(Struct, frozen=True):
    """An allocated ResourceClaim as the DRA manager uses it.

    ``owner_pod_uid`` is the uid of the claim's controlling owner when that owner is a Pod
    (claims generated from a ResourceClaimTemplate); "" otherwise.
    """

    uid: str
    namespace: str
    name: str
    results: list[ClaimResult]
    reserved_for: list[PodConsumer]
    api_version: str = "resource.k8s.io/v1"
    owner_pod_uid: str = ""

    def drivers(self) -> list[str]:
        """The drivers of the allocated devices, sorted, each once."""
        return sorted({r.driver for r in self.results})

    def results_for_driver(self, driver: str) -> list[ClaimResult]:
        return [r for r in self.results if r.driver == driver]

    def results_for_request(self, request: str) -> list[ClaimResult]:
        """The devices a container gets when it names ``request`` in ``resources.claims``."""
        return [r for r in self.results if r.matches_request(request)]

    def is_reserved_for(self, pod_uid: str) -> bool:
        return bool(pod_uid) and any(c.is_pod and c.uid == pod_uid for c in self.reserved_for)

    def ref(self) -> ev.ClaimRef:
        return ev.ClaimRef(uid=self.uid, namespace=self.namespace, name=self.name)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


# --------------------------------------------------------------------------- wire shapes


class _Result(Struct, rename="camel", frozen=True):
    request: str = ""
    driver: str = ""
    pool: str = ""
    device: str = ""
    share_id: str | None = msgspec.field(default=None, name="shareID")


class _DeviceAllocation(Struct, frozen=True):
    results: list[_Result] | None = None


class _Allocation(Struct, frozen=True):
    devices: _DeviceAllocation | None = None


class _Consumer(Struct, rename="camel", frozen=True):
    api_group: str | None = None
    resource: str = ""
    name: str = ""
    uid: str = ""


class _ClaimStatus(Struct, rename="camel", frozen=True):
    allocation: _Allocation | None = None
    reserved_for: list[_Consumer] | None = None


class _OwnerReference(Struct, frozen=True):
    apiVersion: str = ""  # noqa: N815
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


class _ClaimMetadata(Struct, rename="camel", frozen=True):
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    owner_references: list[_OwnerReference] | None = None


class _Claim(Struct, frozen=True):
    metadata: _ClaimMetadata = _ClaimMetadata()
    status: _ClaimStatus | None = None


# --------------------------------------------------------------------------- decoding


_MSGSPEC_PATH = re.compile(r"^(?P<msg>.*?) - at `\$\.?(?P<path>[^`]*)`$")


def _where(source: str, field: str) -> str:
    return f"{source}: {field}" if field else source


def _convert(raw: Any, typ: type[Any], source: str, prefix: str = "") -> Any:
    try:
        return msgspec.convert(raw, typ, strict=False)
    except msgspec.ValidationError as exc:
        text = str(exc)
        m = _MSGSPEC_PATH.match(text)
        msg, path = (m["msg"], m["path"]) if m else (text, "")
        msg = msg.replace("`", "").replace(" | null", "")
        msg = msg[:1].lower() + msg[1:]
        field = ".".join(p for p in (prefix, path) if p).replace(".[", "[")
        raise ManifestError(f"{_where(source, field)}: {msg}") from None


def _load_all(data: bytes, source: str) -> list[Any]:
    docs: list[Any] = decode(data, source, documents=True)
    return docs


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _claim_from_object(raw: Any, source: str) -> ClaimSpec:
    if not isinstance(raw, dict):
        raise ManifestError(f"{source}: expected a ResourceClaim object, got {_type_name(raw)}")
    kind = raw.get("kind")
    if kind != "ResourceClaim":
        hint = ""
        if kind == "ResourceClaimTemplate":
            hint = " (bring the claim generated from the template, named in the pod's status.resourceClaimStatuses)"
        raise ManifestError(f"{source}: kind is {kind!r}, expected 'ResourceClaim'{hint}")
    api_version = raw.get("apiVersion")
    if api_version is None:
        raise ManifestError(f"{source}: apiVersion: required")
    if api_version not in API_VERSIONS:
        raise ManifestError(
            f"{source}: apiVersion {api_version!r} is not supported (expected one of {', '.join(API_VERSIONS)})"
        )
    claim: _Claim = _convert(raw, _Claim, source)
    meta = claim.metadata
    if not meta.name:
        raise ManifestError(f"{source}: metadata.name: required")
    namespace = meta.namespace or "default"
    key = f"{namespace}/{meta.name}"
    if not meta.uid:
        raise ManifestError(
            f"{source}: metadata.uid: required (claim {key}: a claim allocated by the scheduler always has one)"
        )
    status = claim.status
    if status is None or status.allocation is None:
        raise ManifestError(
            f"{source}: claim {key} is not allocated (no status.allocation): "
            "the scheduler allocates a claim before its pod reaches a node"
        )
    results: list[ClaimResult] = []
    devices = status.allocation.devices
    for i, r in enumerate((devices.results if devices else None) or []):
        where = f"{source}: status.allocation.devices.results[{i}]"
        for field in ("request", "driver", "pool", "device"):
            if not getattr(r, field):
                raise ManifestError(f"{where}.{field}: required")
        results.append(ClaimResult(r.request, r.driver, r.pool, r.device, r.share_id or ""))
    reserved: list[PodConsumer] = []
    for i, c in enumerate(status.reserved_for or []):
        where = f"{source}: status.reservedFor[{i}]"
        for field in ("resource", "name", "uid"):
            if not getattr(c, field):
                raise ManifestError(f"{where}.{field}: required")
        reserved.append(PodConsumer(c.resource, c.name, c.uid, c.api_group or ""))
    owner = next(
        (o.uid for o in meta.owner_references or [] if o.controller and o.kind == "Pod" and o.apiVersion == "v1"),
        "",
    )
    return ClaimSpec(
        uid=meta.uid,
        namespace=namespace,
        name=meta.name,
        results=results,
        reserved_for=reserved,
        api_version=api_version,
        owner_pod_uid=owner,
    )


def parse_claim(data: bytes, source: str = "claim") -> ClaimSpec:
    """Decode one ResourceClaim manifest (YAML or JSON). Raises ManifestError naming the field."""
    docs = _load_all(data, source)
    if len(docs) != 1:
        raise ManifestError(f"{source}: expected one ResourceClaim, found {len(docs)} documents")
    return _claim_from_object(docs[0], source)


def parse_claims(data: bytes, source: str = "claim") -> list[ClaimSpec]:
    """Decode every ResourceClaim in a file: one object, several YAML documents, or a
    ``kind: List`` (what ``kubectl get resourceclaim -o yaml`` prints without a name)."""
    docs = _load_all(data, source)
    if not docs:
        raise ManifestError(f"{source}: no ResourceClaim in the file")
    claims: list[ClaimSpec] = []
    for d, doc in enumerate(docs):
        where = f"{source}[{d}]" if len(docs) > 1 else source
        if isinstance(doc, dict) and doc.get("kind") == "List":
            items = doc.get("items")
            if not isinstance(items, list):
                raise ManifestError(f"{where}: items: expected a list, got {_type_name(items)}")
            claims += [_claim_from_object(it, f"{where}: items[{i}]") for i, it in enumerate(items)]
        else:
            claims.append(_claim_from_object(doc, where))
    return claims


# --------------------------------------------------------------------------- pod side


class PodClaimRef(Struct, frozen=True):
    """One entry of the pod's ``spec.resourceClaims`` and who uses it.

    ``claim_name`` is the ResourceClaim's name: ``resourceClaimName``, or for a template
    claim the name generated into ``status.resourceClaimStatuses``; it is "" when that
    status says no claim was needed (``resourceClaimName: null``), as the kubelet skips
    those. ``containers`` are the containers that list it in ``resources.claims``
    (admission order: init containers first). ``requests`` maps a container to the request
    names it limits itself to; a container absent from it uses every request.
    """

    name: str
    claim_name: str
    containers: list[str] = []
    template_name: str = ""
    requests: dict[str, list[str]] = {}


def pod_claims(pod: PodManifest, source: str = "pod") -> list[PodClaimRef]:
    """The pod's claim entries, in ``spec.resourceClaims`` order. Raises ManifestError."""
    entries = _claim_entries(pod, source)
    names = {e[0] for e in entries}
    users: dict[str, list[str]] = {n: [] for n in names}
    requests: dict[str, dict[str, list[str]]] = {n: {} for n in names}
    whole: dict[str, set[str]] = {n: set() for n in names}  # containers using every request
    for field, containers in (
        ("initContainers", pod.spec.init_containers),
        ("containers", pod.spec.containers),
    ):
        for ci, c in enumerate(containers):
            for ri, ref in enumerate(c.resources.claims):
                where = f"{source}: spec.{field}[{ci}].resources.claims[{ri}]"
                if not ref.name:
                    raise ManifestError(f"{where}.name: required")
                if ref.name not in names:
                    raise ManifestError(
                        f"{where}.name: container {c.name!r} uses claim {ref.name!r}, "
                        "which is not in spec.resourceClaims"
                    )
                if c.name not in users[ref.name]:
                    users[ref.name].append(c.name)
                if ref.request:
                    reqs = requests[ref.name].setdefault(c.name, [])
                    if ref.request not in reqs:
                        reqs.append(ref.request)
                else:
                    whole[ref.name].add(c.name)
    out = []
    for name, claim_name, template in entries:
        # A container that also names the claim without a request uses all of it.
        limited = {c: r for c, r in requests[name].items() if c not in whole[name]}
        out.append(PodClaimRef(name, claim_name, users[name], template, limited))
    return out


def _claim_entries(pod: PodManifest, source: str) -> list[tuple[str, str, str]]:
    """``spec.resourceClaims`` as (pod claim name, claim name, template name), the names of
    claims generated from templates taken from ``status.resourceClaimStatuses``."""
    generated: dict[str, str | None] = {}
    for i, st in enumerate((pod.status.resource_claim_statuses if pod.status else None) or []):
        if not st.name:
            raise ManifestError(f"{source}: status.resourceClaimStatuses[{i}].name: required")
        generated[st.name] = st.resource_claim_name

    entries: list[tuple[str, str, str]] = []
    for i, src in enumerate(pod.spec.resource_claims):
        where = f"{source}: spec.resourceClaims[{i}]"
        if not src.name:
            raise ManifestError(f"{where}.name: required")
        if any(e[0] == src.name for e in entries):
            raise ManifestError(f"{where}.name: {src.name!r} is used twice")
        direct, template = src.resource_claim_name, src.resource_claim_template_name
        if bool(direct) == bool(template):
            raise ManifestError(f"{where}: exactly one of resourceClaimName and resourceClaimTemplateName is required")
        if direct:
            entries.append((src.name, direct, ""))
            continue
        if src.name not in generated:
            raise ManifestError(
                f"{source}: claim {src.name} from template {template} has no generated name "
                "in status.resourceClaimStatuses"
            )
        entries.append((src.name, generated[src.name] or "", template))
    return entries


# --------------------------------------------------------------------------- admission


class BoundClaim(Struct, frozen=True):
    """A pod claim entry and the ResourceClaim that satisfies it."""

    pod_claim: PodClaimRef
    claim: ClaimSpec


def claim_problems(
    pod_uid: str,
    pod_namespace: str,
    pod_name: str,
    pod_claims: list[PodClaimRef],
    claims: list[ClaimSpec],
) -> tuple[list[BoundClaim], list[str]]:
    """Match the pod's claim entries to the claims it brought; return the matches and
    every problem found (one line each), in a stable order."""
    pod_key = f"{pod_namespace}/{pod_name}"
    problems: list[str] = []
    by_key: dict[str, ClaimSpec] = {}
    for c in claims:
        if c.key in by_key:
            problems.append(f"claim {c.key} is supplied twice")
        by_key.setdefault(c.key, c)
    if not pod_uid and any(p.claim_name for p in pod_claims):
        problems.append(f"pod {pod_key} has no metadata.uid: it cannot be matched to the reservedFor of its claims")
    bound: list[BoundClaim] = []
    used: set[str] = set()
    for p in pod_claims:
        if not p.claim_name:
            continue  # the template's status says no claim is needed
        key = f"{pod_namespace}/{p.claim_name}"
        claim = by_key.get(key)
        if claim is None:
            problems.append(f"pod references claim {key} it did not bring")
            continue
        used.add(key)
        if not pod_uid:
            continue
        if p.template_name and claim.owner_pod_uid != pod_uid:
            problems.append(
                f"claim {key} was not generated for pod {pod_key} ({pod_uid}): the pod is not its controlling owner"
            )
            continue
        if not claim.is_reserved_for(pod_uid):
            problems.append(f"pod {pod_key} ({pod_uid}) is not in the reservedFor of claim {key}")
            continue
        bound.append(BoundClaim(p, claim))
    for c in claims:
        if c.key not in used:
            problems.append(f"claim {c.key} was supplied but pod {pod_key} does not reference it")
            used.add(c.key)
    return bound, problems


def check_claims(
    pod_uid: str,
    pod_namespace: str,
    pod_name: str,
    pod_claims: list[PodClaimRef],
    claims: list[ClaimSpec],
) -> list[BoundClaim]:
    """The kubelet's admission checks of a pod's claims. Returns the pod's claim entries
    bound to their ResourceClaims (entries that need no claim are left out); raises
    ClaimCheckError with the first problem (and how many more) otherwise."""
    bound, problems = claim_problems(pod_uid, pod_namespace, pod_name, pod_claims, claims)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ClaimCheckError(f"{problems[0]}{more}")
    return bound
