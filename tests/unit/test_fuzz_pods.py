"""Generated pods thrown at the CLI's manifest parser and at the node API's reading of a pod,
in-process (property-based, hypothesis).

Whatever comes in, the parser answers a PodSpec or a ManifestError (one line, naming the
source), never another exception; a pod either accepts is accepted by the other, the same;
and what is accepted keeps the rules (names as Kubernetes has them, whole device counts with
requests equal to limits, no container name twice).

``EVENTSRC_FUZZ_EXAMPLES`` sets the number of cases per test (default 300, a few seconds).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventsrc.api.node import pod_from_proto, pod_to_proto
from eventsrc.core.devices.names import is_dns1123_subdomain, is_extended_resource_name
from eventsrc.errors import AdmissionRefused, BadRequest
from eventsrc.gen.node.v1 import node_pb2 as npb
from eventsrc.inputs.claim_manifest import parse_claims
from eventsrc.inputs.manifest import ManifestError, PodSpec, is_dns1123_label, parse_pod

EXAMPLES = int(os.environ.get("EVENTSRC_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
GPU = "example.com/gpu"

# Text a hostile or careless author writes: control and bidi characters, non-ASCII letters,
# slashes, and now and then something that is valid.
NASTY = st.sampled_from(["", "/", "\n", "\x00", "\x1b[31m", "\u202e", "😀", "é", ".", "-", "A", " ", "\ud83d"])
TEXT = st.one_of(
    st.sampled_from(["default", "ns", "team-a", "p", "app", "uid-1", "job/1", "team/a", "a" * 64, "a.b"]),
    st.lists(st.one_of(NASTY, st.text(max_size=4)), max_size=4).map("".join),
    st.text(max_size=12),
)
QUANTITY = st.one_of(
    st.sampled_from(["1", "2", "0", "-1", "0.5", "1k", "1e1", "1Gi", "500m", "", "lots", " 1", "1 ", "+1", "01"]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.booleans(),
    st.none(),
)
RESOURCE = st.one_of(st.sampled_from([GPU, "cpu", "memory", "example.com/nic", "example.com/😀", "", "/x"]), TEXT)
RESOURCES = st.dictionaries(RESOURCE, QUANTITY, max_size=3)


@st.composite
def containers(draw: st.DrawFn) -> list[dict[str, Any]]:
    names = st.one_of(st.sampled_from(["app", "app", "init", "", "App"]), TEXT)
    out = []
    for _ in range(draw(st.integers(0, 3))):
        resources: dict[str, Any] = {}
        limits = draw(RESOURCES)
        if limits or draw(st.booleans()):
            resources["limits"] = limits
        requests = draw(st.one_of(RESOURCES, st.just(limits)))  # now and then equal to the limits
        if requests or draw(st.booleans()):
            resources["requests"] = requests
        out.append({"name": draw(names), "resources": resources})
    return out


@st.composite
def manifests(draw: st.DrawFn) -> dict[str, Any]:
    metadata = {k: draw(TEXT) for k in ("name", "namespace", "uid") if draw(st.booleans())}
    spec = {"containers": draw(containers())}
    if draw(st.booleans()):
        spec["initContainers"] = [
            {**c, "restartPolicy": draw(st.sampled_from(["Always", "Never", ""]))} for c in draw(containers())
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def encodings(manifest: dict[str, Any]) -> st.SearchStrategy[bytes]:
    def dumped(how: str) -> bytes:
        if how == "yaml":
            return yaml.safe_dump(manifest, allow_unicode=True).encode("utf-8", "surrogatepass")
        return json.dumps(manifest, ensure_ascii=how == "json-ascii").encode("utf-8", "surrogatepass")

    return st.sampled_from(["json-ascii", "json-utf8", "yaml"]).map(dumped)


def _whole(value: str) -> bool:
    return re.fullmatch(r"[0-9]+", value) is not None


def check_accepted(spec: PodSpec) -> None:
    """What the shared validation promises of every pod it lets through."""
    assert is_dns1123_subdomain(spec.pod.name)
    assert is_dns1123_label(spec.pod.namespace)
    assert "/" not in spec.pod.uid
    assert spec.containers
    names = [c.name for c in spec.containers]
    assert len(names) == len(set(names)) and all(is_dns1123_label(n) for n in names)
    for c in spec.containers:
        for resource, value in {**c.requests, **c.limits}.items():
            if is_extended_resource_name(resource):
                assert _whole(value), (resource, value)
                assert c.requests.get(resource) == c.limits.get(resource), c


def outcome(data: bytes) -> PodSpec | ManifestError:
    try:
        return parse_pod(data, "pod.yaml")
    except ManifestError as err:
        return err


@FUZZ
@given(st.data())
def test_a_generated_manifest_is_a_pod_or_one_line_naming_the_field(data: st.DataObject) -> None:
    manifest = data.draw(manifests())
    got = outcome(data.draw(encodings(manifest)))
    if isinstance(got, ManifestError):
        message = str(got)
        assert message.startswith("pod.yaml: ") and "\n" not in message, message
        message.encode("utf-8")  # printable as it is: no lone surrogate in it
        assert got.exit_code == 2
        return
    check_accepted(got)
    if not got.pod.uid:
        return  # the CLI generates one before sending it
    # The node API reads the pod the CLI sends exactly as the CLI read it.
    assert pod_from_proto(pod_to_proto(got)) == got


@FUZZ
@given(st.binary(max_size=300) | st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_any_bytes_are_a_pod_a_claim_or_one_line(data: bytes) -> None:
    got = outcome(data)
    if isinstance(got, PodSpec):
        check_accepted(got)
    else:
        assert "\n" not in str(got)
    try:
        parse_claims(data, "claim.yaml")
    except ManifestError as err:
        assert "\n" not in str(err)


PROTO_TEXT = st.one_of(TEXT.filter(lambda t: "\ud83d" not in t), st.sampled_from(["p", "ns", "uid-1"]))
PROTO_QUANTITY = st.one_of(QUANTITY.map(str), st.sampled_from(["1", "2", "0"]))


@st.composite
def proto_pods(draw: st.DrawFn) -> npb.Pod:
    out = []
    for _ in range(draw(st.integers(0, 3))):
        limits = draw(st.dictionaries(RESOURCE.filter(lambda t: "\ud83d" not in t), PROTO_QUANTITY, max_size=3))
        requests = draw(st.one_of(st.just(limits), st.dictionaries(st.just(GPU), PROTO_QUANTITY, max_size=1)))
        kind = draw(st.sampled_from(["app", "init", "sidecar", "", "App"]))
        out.append(npb.Container(name=draw(PROTO_TEXT), kind=kind, requests=requests, limits=limits))
    return npb.Pod(uid=draw(PROTO_TEXT), namespace=draw(PROTO_TEXT), name=draw(PROTO_TEXT), containers=out)


@FUZZ
@given(proto_pods())
def test_a_generated_node_api_pod_is_a_pod_or_a_bad_request(pod: npb.Pod) -> None:
    try:
        spec = pod_from_proto(pod)
    except BadRequest as err:
        assert str(err).startswith("pod."), str(err)
        return
    except AdmissionRefused:
        return
    check_accepted(spec)
    assert pod_from_proto(pod_to_proto(spec)) == spec  # read twice, the same
