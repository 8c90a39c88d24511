"""ResourceClaim manifests and the kubelet's admission checks of a pod's claims."""

from __future__ import annotations

import json

import pytest
import yaml
from msgspec.structs import replace

from eventsrc import events as ev
from eventsrc.inputs.claim_manifest import (
    BoundClaim,
    ClaimCheckError,
    ClaimResult,
    ClaimSpec,
    PodClaimRef,
    PodConsumer,
    check_claims,
    claim_problems,
    parse_claim,
    parse_claims,
    pod_claims,
)
from eventsrc.inputs.manifest import ManifestError, read_pod

POD_A = "5d0b3b8e-6a43-4b8e-9d5e-1c2f3a4b5c6d"
POD_B = "9f8e7d6c-5b4a-4321-8fed-cba987654321"

# kubectl get resourceclaim gpu-shared -o yaml (v1, Kubernetes 1.34), reserved for two pods.
SHARED_V1 = f"""\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  creationTimestamp: "2025-09-01T10:12:31Z"
  finalizers:
  - resource.kubernetes.io/delete-protection
  name: gpu-shared
  namespace: ml
  resourceVersion: "48213"
  uid: 0c5e2a7c-3f1d-4a8e-b7a1-2d9c8e6f4b10
spec:
  devices:
    requests:
    - exactly:
        allocationMode: ExactCount
        count: 2
        deviceClassName: gpu.example.com
      name: gpus
status:
  allocation:
    allocationTimestamp: "2025-09-01T10:12:33Z"
    devices:
      results:
      - device: gpu-0
        driver: gpu.example.com
        pool: node-1
        request: gpus
      - device: gpu-1
        driver: gpu.example.com
        pool: node-1
        request: gpus
    nodeSelector:
      nodeSelectorTerms:
      - matchFields:
        - key: metadata.name
          operator: In
          values:
          - node-1
  reservedFor:
  - name: trainer-a
    resource: pods
    uid: {POD_A}
  - name: trainer-b
    resource: pods
    uid: {POD_B}
"""

# kubectl get resourceclaim nic -o yaml (v1beta1, Kubernetes 1.32): two drivers.
NIC_V1BETA1 = f"""\
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaim
metadata:
  creationTimestamp: "2025-02-11T08:00:00Z"
  name: nic
  namespace: ml
  resourceVersion: "1207"
  uid: 7a1b2c3d-0000-4000-8000-00000000aaaa
spec:
  devices:
    requests:
    - allocationMode: ExactCount
      count: 1
      deviceClassName: nic.example.com
      name: nic
    - allocationMode: ExactCount
      count: 1
      deviceClassName: fpga.example.org
      name: fpga
status:
  allocation:
    devices:
      results:
      - device: eth-3
        driver: nic.example.com
        pool: node-1
        request: nic
      - adminAccess: false
        device: fpga-0
        driver: fpga.example.org
        pool: node-1-fpgas
        request: fpga
    nodeSelector:
      nodeSelectorTerms:
      - matchFields:
        - key: metadata.name
          operator: In
          values:
          - node-1
  reservedFor:
  - name: trainer-a
    resource: pods
    uid: {POD_A}
"""

# A claim the resourceclaim controller generated from a template for trainer-a.
GENERATED_V1 = f"""\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  annotations:
    resource.kubernetes.io/pod-claim-name: scratch
  creationTimestamp: "2025-09-01T10:12:30Z"
  generateName: trainer-a-scratch-
  name: trainer-a-scratch-x7k2p
  namespace: ml
  ownerReferences:
  - apiVersion: v1
    blockOwnerDeletion: true
    controller: true
    kind: Pod
    name: trainer-a
    uid: {POD_A}
  resourceVersion: "48210"
  uid: 3e4f5a6b-7c8d-4e9f-a0b1-c2d3e4f5a6b7
spec:
  devices:
    requests:
    - firstAvailable:
      - count: 1
        deviceClassName: big.gpu.example.com
        name: big
      - count: 1
        deviceClassName: gpu.example.com
        name: small
      name: gpu
status:
  allocation:
    devices:
      results:
      - device: gpu-7
        driver: gpu.example.com
        pool: node-1
        request: gpu/small
        shareID: 11111111-2222-4333-8444-555555555555
    nodeSelector:
      nodeSelectorTerms:
      - matchFields:
        - key: metadata.name
          operator: In
          values:
          - node-1
  reservedFor:
  - name: trainer-a
    resource: pods
    uid: {POD_A}
"""

POD_A_YAML = f"""\
apiVersion: v1
kind: Pod
metadata:
  name: trainer-a
  namespace: ml
  uid: {POD_A}
spec:
  initContainers:
  - name: fetch
    image: busybox
    resources:
      claims:
      - name: scratch
  containers:
  - name: train
    image: trainer
    resources:
      claims:
      - name: gpus
      - name: net
        request: nic
  - name: sidecar
    image: exporter
    resources:
      claims:
      - name: gpus
      - name: net
        request: fpga
      - name: net
  resourceClaims:
  - name: gpus
    resourceClaimName: gpu-shared
  - name: net
    resourceClaimName: nic
  - name: scratch
    resourceClaimTemplateName: scratch-gpu
status:
  phase: Pending
  resourceClaimStatuses:
  - name: scratch
    resourceClaimName: trainer-a-scratch-x7k2p
"""

POD_B_YAML = f"""\
apiVersion: v1
kind: Pod
metadata:
  name: trainer-b
  namespace: ml
  uid: {POD_B}
spec:
  containers:
  - name: train
    image: trainer
    resources:
      claims:
      - name: gpus
  resourceClaims:
  - name: gpus
    resourceClaimName: gpu-shared
"""


def _pod_claims(data: bytes, source: str = "pod") -> list[PodClaimRef]:
    return pod_claims(read_pod(data, source), source)


def _edit(text: str, change) -> bytes:  # type: ignore[no-untyped-def]
    obj = yaml.safe_load(text)
    change(obj)
    return yaml.safe_dump(obj).encode()


def _claim_error(data: bytes | str, match: str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    with pytest.raises(ManifestError, match=match) as info:
        parse_claim(raw, "claim.yaml")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("claim.yaml: ")
    assert info.value.exit_code == 2
    return msg


# --------------------------------------------------------------------------- claims


def test_v1_shared_claim() -> None:
    c = parse_claim(SHARED_V1.encode(), "gpu-shared.yaml")
    assert c == ClaimSpec(
        uid="0c5e2a7c-3f1d-4a8e-b7a1-2d9c8e6f4b10",
        namespace="ml",
        name="gpu-shared",
        results=[
            ClaimResult("gpus", "gpu.example.com", "node-1", "gpu-0"),
            ClaimResult("gpus", "gpu.example.com", "node-1", "gpu-1"),
        ],
        reserved_for=[
            PodConsumer("pods", "trainer-a", POD_A),
            PodConsumer("pods", "trainer-b", POD_B),
        ],
        api_version="resource.k8s.io/v1",
    )
    assert c.drivers() == ["gpu.example.com"]
    assert c.is_reserved_for(POD_A) and c.is_reserved_for(POD_B) and not c.is_reserved_for("x")
    assert c.ref() == ev.ClaimRef(uid=c.uid, namespace="ml", name="gpu-shared")
    assert c.key == "ml/gpu-shared"


def test_v1beta1_claim_two_drivers() -> None:
    c = parse_claim(NIC_V1BETA1.encode())
    assert c.api_version == "resource.k8s.io/v1beta1"
    assert c.drivers() == ["fpga.example.org", "nic.example.com"]
    assert c.results_for_driver("fpga.example.org") == [
        ClaimResult("fpga", "fpga.example.org", "node-1-fpgas", "fpga-0")
    ]
    assert [r.device for r in c.results_for_request("nic")] == ["eth-3"]


def test_generated_claim_share_id_subrequest_and_owner() -> None:
    c = parse_claim(GENERATED_V1.encode())
    assert c.results == [
        ClaimResult(
            "gpu/small",
            "gpu.example.com",
            "node-1",
            "gpu-7",
            "11111111-2222-4333-8444-555555555555",
        )
    ]
    assert c.owner_pod_uid == POD_A
    assert [r.device for r in c.results_for_request("gpu")] == ["gpu-7"]
    assert c.results_for_request("gp") == []


def test_json_v1beta2_and_defaults() -> None:
    obj = yaml.safe_load(SHARED_V1)
    obj["apiVersion"] = "resource.k8s.io/v1beta2"
    del obj["metadata"]["namespace"]
    obj["status"]["reservedFor"][0]["apiGroup"] = ""
    c = parse_claim(json.dumps(obj).encode())
    assert c.namespace == "default" and c.api_version == "resource.k8s.io/v1beta2"
    assert c.reserved_for[0] == PodConsumer("pods", "trainer-a", POD_A)


def test_allocated_without_devices_and_not_reserved() -> None:
    def change(o):  # type: ignore[no-untyped-def]
        o["status"]["allocation"] = {"nodeSelector": {}}
        del o["status"]["reservedFor"]

    c = parse_claim(_edit(SHARED_V1, change))
    assert c.results == [] and c.reserved_for == [] and c.drivers() == []


def test_list_and_multi_document() -> None:
    listed = {
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": ""},
        "items": [yaml.safe_load(SHARED_V1), yaml.safe_load(NIC_V1BETA1)],
    }
    assert [c.name for c in parse_claims(yaml.safe_dump(listed).encode())] == ["gpu-shared", "nic"]
    multi = (SHARED_V1 + "---\n" + GENERATED_V1).encode()
    assert [c.name for c in parse_claims(multi)] == ["gpu-shared", "trainer-a-scratch-x7k2p"]
    with pytest.raises(ManifestError, match=r"^claim.yaml: expected one ResourceClaim, found 2 documents$"):
        parse_claim(multi, "claim.yaml")
    listed["items"][1]["status"]["allocation"]["devices"]["results"][0]["pool"] = 7
    with pytest.raises(
        ManifestError,
        match=r"^c.yaml: items\[1\]: status.allocation.devices.results\[0\].pool: expected str, got int$",
    ):
        parse_claims(yaml.safe_dump(listed).encode(), "c.yaml")
    with pytest.raises(ManifestError, match="no ResourceClaim"):
        parse_claims(b"", "c.yaml")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda o: o.update(kind="Pod"), r"kind is 'Pod', expected 'ResourceClaim'$"),
        (
            lambda o: o.update(kind="ResourceClaimTemplate"),
            r"expected 'ResourceClaim' \(bring the claim generated",
        ),
        (lambda o: o.pop("kind"), r"kind is None, expected 'ResourceClaim'"),
        (
            lambda o: o.update(apiVersion="resource.k8s.io/v1alpha3"),
            r"apiVersion 'resource.k8s.io/v1alpha3' is not supported",
        ),
        (lambda o: o.pop("apiVersion"), r"^claim.yaml: apiVersion: required$"),
        (lambda o: o["metadata"].pop("name"), r"^claim.yaml: metadata.name: required$"),
        (
            lambda o: o["metadata"].pop("uid"),
            r"^claim.yaml: metadata.uid: required \(claim ml/gpu-shared",
        ),
        (
            lambda o: o.pop("status"),
            r"^claim.yaml: claim ml/gpu-shared is not allocated \(no status.allocation\)",
        ),
        (lambda o: o["status"].pop("allocation"), r"claim ml/gpu-shared is not allocated"),
        (
            lambda o: o["status"]["allocation"]["devices"]["results"][1].pop("driver"),
            r"^claim.yaml: status.allocation.devices.results\[1\].driver: required$",
        ),
        (
            lambda o: o["status"]["allocation"]["devices"]["results"][0].pop("pool"),
            r"^claim.yaml: status.allocation.devices.results\[0\].pool: required$",
        ),
        (
            lambda o: o["status"]["allocation"]["devices"]["results"][0].update(device=""),
            r"^claim.yaml: status.allocation.devices.results\[0\].device: required$",
        ),
        (
            lambda o: o["status"]["allocation"]["devices"]["results"][0].pop("request"),
            r"results\[0\].request: required$",
        ),
        (
            lambda o: o["status"]["allocation"]["devices"]["results"][0].update(device=3),
            r"^claim.yaml: status.allocation.devices.results\[0\].device: expected str, got int$",
        ),
        (
            lambda o: o["status"]["allocation"]["devices"].update(results={"a": 1}),
            r"^claim.yaml: status.allocation.devices.results: expected array, got object$",
        ),
        (
            lambda o: o["status"]["reservedFor"][1].pop("uid"),
            r"^claim.yaml: status.reservedFor\[1\].uid: required$",
        ),
        (
            lambda o: o["status"]["reservedFor"][0].update(name=["x"]),
            r"^claim.yaml: status.reservedFor\[0\].name: expected str, got array$",
        ),
        (lambda o: o.update(metadata="gpu"), r"^claim.yaml: metadata: expected object, got str$"),
    ],
)
def test_claim_errors(change, match) -> None:  # type: ignore[no-untyped-def]
    _claim_error(_edit(SHARED_V1, change), match)


def test_claim_not_yaml_or_object() -> None:
    _claim_error("kind: [unclosed", r"not valid YAML or JSON \(line")
    _claim_error("- a\n- b\n", r"expected a ResourceClaim object, got list$")


# --------------------------------------------------------------------------- pod side


def test_pod_claims() -> None:
    refs = _pod_claims(POD_A_YAML.encode(), "pod.yaml")
    assert refs == [
        PodClaimRef("gpus", "gpu-shared", ["train", "sidecar"]),
        # sidecar names the whole claim too, so only train is limited to a request.
        PodClaimRef("net", "nic", ["train", "sidecar"], requests={"train": ["nic"]}),
        PodClaimRef("scratch", "trainer-a-scratch-x7k2p", ["fetch"], template_name="scratch-gpu"),
    ]
    assert _pod_claims(b"kind: Pod\nspec:\n  containers:\n  - name: c\n") == []


def test_template_claim_needing_no_claim() -> None:
    def change(o):  # type: ignore[no-untyped-def]
        o["status"]["resourceClaimStatuses"][0]["resourceClaimName"] = None

    refs = _pod_claims(_edit(POD_A_YAML, change))
    assert refs[2] == PodClaimRef("scratch", "", ["fetch"], template_name="scratch-gpu")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            lambda o: o.pop("status"),
            r"^pod.yaml: claim scratch from template scratch-gpu has no generated name"
            r" in status.resourceClaimStatuses$",
        ),
        (
            lambda o: o["status"]["resourceClaimStatuses"][0].update(name="other"),
            r"claim scratch from template scratch-gpu has no generated name",
        ),
        (
            lambda o: o["spec"]["containers"][1]["resources"]["claims"].append({"name": "tpu"}),
            r"^pod.yaml: spec.containers\[1\].resources.claims\[3\].name: "
            r"container 'sidecar' uses claim 'tpu', which is not in spec.resourceClaims$",
        ),
        (
            lambda o: o["spec"]["initContainers"][0]["resources"]["claims"][0].pop("name"),
            r"^pod.yaml: spec.initContainers\[0\].resources.claims\[0\].name: required$",
        ),
        (
            lambda o: o["spec"]["resourceClaims"][0].pop("name"),
            r"^pod.yaml: spec.resourceClaims\[0\].name: required$",
        ),
        (
            lambda o: o["spec"]["resourceClaims"][1].update(name="gpus"),
            r"spec.resourceClaims\[1\].name: 'gpus' is used twice$",
        ),
        (
            lambda o: o["spec"]["resourceClaims"][0].update(resourceClaimTemplateName="t"),
            r"^pod.yaml: spec.resourceClaims\[0\]: "
            r"exactly one of resourceClaimName and resourceClaimTemplateName is required$",
        ),
        (lambda o: o["spec"]["resourceClaims"][0].pop("resourceClaimName"), r"exactly one of"),
        (
            lambda o: o["spec"]["resourceClaims"][0].update(resourceClaimName=5),
            r"^pod.yaml: Expected str, got int at spec.resourceClaims\[0\].resourceClaimName$",
        ),
        # The one Pod model refuses null where `eventsrc admit` always has; only the
        # status's resourceClaimName may be null (no claim was needed).
        (
            lambda o: o["spec"]["resourceClaims"][0].update(resourceClaimName=None),
            r"^pod.yaml: Expected str, got null at spec.resourceClaims\[0\].resourceClaimName$",
        ),
        (
            lambda o: o["spec"]["containers"][0].update(resources=None),
            r"^pod.yaml: Expected object, got null at spec.containers\[0\].resources$",
        ),
        (lambda o: o.update(kind="Deployment"), r"kind is 'Deployment', expected 'Pod'"),
    ],
)
def test_pod_claim_errors(change, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ManifestError, match=match) as info:
        _pod_claims(_edit(POD_A_YAML, change), "pod.yaml")
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- admission


def _all_claims() -> list[ClaimSpec]:
    return [parse_claim(t.encode()) for t in (SHARED_V1, NIC_V1BETA1, GENERATED_V1)]


def test_check_claims_ok_and_shared() -> None:
    claims = _all_claims()
    bound = check_claims(POD_A, "ml", "trainer-a", _pod_claims(POD_A_YAML.encode()), claims)
    assert [(b.pod_claim.name, b.claim.name) for b in bound] == [
        ("gpus", "gpu-shared"),
        ("net", "nic"),
        ("scratch", "trainer-a-scratch-x7k2p"),
    ]
    # The second pod sharing the claim brings only that claim.
    bound_b = check_claims(POD_B, "ml", "trainer-b", _pod_claims(POD_B_YAML.encode()), claims[:1])
    assert bound_b == [BoundClaim(PodClaimRef("gpus", "gpu-shared", ["train"]), claims[0])]
    assert bound_b[0].claim.uid == bound[0].claim.uid


def test_claim_needing_none_is_skipped() -> None:
    refs = [PodClaimRef("scratch", "", ["c"], template_name="t")]
    assert check_claims(POD_A, "ml", "trainer-a", refs, []) == []


def _problem(pod_uid: str, name: str, pod: str, claims: list[ClaimSpec]) -> str:
    with pytest.raises(ClaimCheckError) as info:
        check_claims(pod_uid, "ml", name, _pod_claims(pod.encode()), claims)
    assert info.value.exit_code == 1 and "\n" not in str(info.value)
    return str(info.value)


def test_pod_not_in_reserved_for() -> None:
    shared, nic, gen = _all_claims()
    msg = _problem(POD_B, "trainer-b", POD_B_YAML, [replace(shared, reserved_for=shared.reserved_for[:1])])
    assert msg == f"pod ml/trainer-b ({POD_B}) is not in the reservedFor of claim ml/gpu-shared"
    # Only pods count: a consumer of another resource with the same uid does not.
    other = [PodConsumer("workloads", "trainer-b", POD_B, "scheduling.example.com")]
    msg = _problem(POD_B, "trainer-b", POD_B_YAML, [replace(shared, reserved_for=other)])
    assert "is not in the reservedFor of claim ml/gpu-shared" in msg


def test_pod_references_claim_it_did_not_bring() -> None:
    shared, nic, gen = _all_claims()
    msg = _problem(POD_A, "trainer-a", POD_A_YAML, [shared, gen])
    assert msg == "pod references claim ml/nic it did not bring"
    # Same name in another namespace is not the pod's claim.
    elsewhere = replace(nic, namespace="other")
    _, problems = claim_problems(POD_A, "ml", "trainer-a", _pod_claims(POD_A_YAML.encode()), [shared, elsewhere, gen])
    assert problems == [
        "pod references claim ml/nic it did not bring",
        "claim other/nic was supplied but pod ml/trainer-a does not reference it",
    ]
    msg = _problem(POD_A, "trainer-a", POD_A_YAML, [shared, elsewhere, gen])
    assert msg == "pod references claim ml/nic it did not bring (and 1 more)"


def test_supplied_claim_not_referenced_and_twice() -> None:
    shared, nic, gen = _all_claims()
    msg = _problem(POD_B, "trainer-b", POD_B_YAML, [shared, nic])
    assert msg == "claim ml/nic was supplied but pod ml/trainer-b does not reference it"
    msg = _problem(POD_B, "trainer-b", POD_B_YAML, [shared, shared])
    assert msg == "claim ml/gpu-shared is supplied twice"


def test_generated_claim_of_another_pod() -> None:
    shared, nic, gen = _all_claims()
    pod_b_template = POD_B_YAML.replace("resourceClaimName: gpu-shared", "resourceClaimTemplateName: scratch-gpu")
    pod_b_template += (
        "status:\n  resourceClaimStatuses:\n  - name: gpus\n    resourceClaimName: trainer-a-scratch-x7k2p\n"
    )
    wide = replace(gen, reserved_for=[*gen.reserved_for, PodConsumer("pods", "trainer-b", POD_B)])
    msg = _problem(POD_B, "trainer-b", pod_b_template, [wide])
    assert msg == (
        f"claim ml/trainer-a-scratch-x7k2p was not generated for pod ml/trainer-b ({POD_B}): "
        "the pod is not its controlling owner"
    )


def test_pod_without_uid() -> None:
    shared, _, _ = _all_claims()
    msg = _problem("", "trainer-b", POD_B_YAML, [shared])
    assert msg == "pod ml/trainer-b has no metadata.uid: it cannot be matched to the reservedFor of its claims"
