"""The node API checks a pod as the CLI checks a manifest: one validation
(``eventsrc.inputs.manifest.checked_pod``), every bad request INVALID_ARGUMENT naming the
field, never an internal error; and pods stay removable by the CLI.

Spoken to with grpcio (an implementation independent of the daemon's grpclib), one daemon for
the module (no plugin: a bad request must be refused before any resource is looked at).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from eventsrc.gen.node.v1 import node_pb2 as npb
from eventsrc.inputs.manifest import ManifestError, parse_pod
from tests.conftest import Daemon, run_cli
from tests.support.grpcio_stubs import stubs, unix_target

RES = "example.com/gpu"


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    short = Path(tempfile.mkdtemp(prefix="es-", dir="/tmp"))  # unix socket paths are short
    d = Daemon(short / "root")
    yield d
    d.stop()
    shutil.rmtree(short, ignore_errors=True)


@pytest.fixture(scope="module")
def node(daemon: Daemon) -> Iterator[Any]:
    with grpc.insecure_channel(unix_target(daemon.root / "eventsrc" / "api.sock")) as channel:
        yield stubs("node/v1/node.proto").NodeStub(channel)


def container(name: str = "app", kind: str = "app", **resources: dict[str, str]) -> npb.Container:
    return npb.Container(
        name=name, kind=kind, requests=resources.get("requests", {}), limits=resources.get("limits", {})
    )


def gpus(n: str, name: str = "app") -> npb.Container:
    return container(name, limits={RES: n}, requests={RES: n})


def pod(uid: str = "uid-1", namespace: str = "ns", name: str = "p", containers: list[Any] | None = None) -> npb.Pod:
    return npb.Pod(
        uid=uid, namespace=namespace, name=name, containers=[gpus("1")] if containers is None else containers
    )


WHOLE = "must be a whole number of devices"
# (the pod, the field named, what is said of it): the same input as a manifest, through the
# CLI's parser, names the same field under spec.* and says the same.
BAD = [
    pytest.param(
        pod(containers=[gpus("0.5")]), "pod.containers[0].resources.requests[example.com/gpu]", WHOLE, id="0.5"
    ),
    pytest.param(pod(containers=[gpus("1k")]), "pod.containers[0].resources.requests[example.com/gpu]", WHOLE, id="1k"),
    pytest.param(
        pod(containers=[gpus("1e1")]), "pod.containers[0].resources.requests[example.com/gpu]", WHOLE, id="1e1"
    ),
    pytest.param(pod(containers=[gpus("-1")]), "pod.containers[0].resources.requests[example.com/gpu]", WHOLE, id="-1"),
    pytest.param(
        pod(containers=[gpus("lots")]),
        "pod.containers[0].resources.requests[example.com/gpu]",
        "'lots' is not a quantity",
        id="not-a-quantity",
    ),
    pytest.param(
        pod(containers=[container(limits={"cpu": "1", RES: "2"}, requests={RES: "1"})]),
        "pod.containers[0].resources.requests[example.com/gpu]",
        "must be equal to example.com/gpu limit",
        id="requests-not-limits",
    ),
    pytest.param(
        pod(containers=[container(requests={RES: "1"})]),
        "pod.containers[0].resources.limits[example.com/gpu]",
        "required (a device request needs its limit)",
        id="request-without-limit",
    ),
    pytest.param(
        pod(containers=[gpus("1", "app"), gpus("1", "app")]),
        "pod.containers[1].name",
        "container name 'app' is used twice",
        id="duplicate-container",
    ),
    pytest.param(pod(containers=[gpus("1", "")]), "pod.containers[0].name", "required", id="empty-container-name"),
    pytest.param(
        pod(containers=[gpus("1", "App_1")]),
        "pod.containers[0].name",
        "'App_1' is not a container name",
        id="bad-container",
    ),
    pytest.param(
        pod(containers=[container(kind="daemon")]),
        "pod.containers[0].kind",
        "must be init, sidecar or app, got 'daemon'",
        id="kind",
    ),
    pytest.param(pod(containers=[]), "pod.containers", "a pod needs at least one container", id="no-containers"),
    pytest.param(pod(uid=""), "pod.uid", "required", id="no-uid"),
    pytest.param(pod(uid="job/1"), "pod.uid", "'job/1' is not a uid", id="uid-slash"),
    pytest.param(pod(uid="a" * 129), "pod.uid", "is not a uid", id="uid-long"),
    pytest.param(pod(uid="uid\n1"), "pod.uid", "is not a uid", id="uid-newline"),
    pytest.param(pod(namespace="team/a"), "pod.namespace", "'team/a' is not a namespace", id="namespace-slash"),
    pytest.param(pod(namespace="Team"), "pod.namespace", "'Team' is not a namespace", id="namespace-upper"),
    pytest.param(pod(namespace="a" * 64), "pod.namespace", "is not a namespace", id="namespace-long"),
    pytest.param(pod(name=""), "pod.name", "required", id="no-name"),
    pytest.param(pod(name="a/b"), "pod.name", "'a/b' is not a pod name", id="name-slash"),
    pytest.param(pod(name="p\u202e"), "pod.name", "is not a pod name", id="name-bidi"),
]


@pytest.mark.parametrize(("bad", "field", "said"), BAD)
def test_a_bad_pod_is_invalid_argument_naming_the_field(node: Any, bad: npb.Pod, field: str, said: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        node.Admit(npb.AdmitRequest(pod=bad), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert err.value.details().startswith(f"{field}: "), err.value.details()
    assert said in err.value.details()
    assert not node.ListPods(npb.ListPodsRequest(), timeout=10).pods


def manifest(p: npb.Pod) -> bytes:
    """``p`` as a Pod manifest (JSON), its containers all app containers."""
    import json

    containers = [
        {"name": c.name, "resources": {"requests": dict(c.requests), "limits": dict(c.limits)}} for c in p.containers
    ]
    meta = {"uid": p.uid, "namespace": p.namespace, "name": p.name}
    return json.dumps({"kind": "Pod", "metadata": meta, "spec": {"containers": containers}}).encode()


@pytest.mark.parametrize(("bad", "field", "said"), [b for b in BAD if b.id not in ("kind", "no-uid")])
def test_the_cli_refuses_the_same_pod_naming_the_same_field(bad: npb.Pod, field: str, said: str) -> None:
    with pytest.raises(ManifestError) as err:
        parse_pod(manifest(bad), "pod.json")
    cli_field = field.replace("pod.uid", "metadata.uid").replace("pod.namespace", "metadata.namespace")
    cli_field = cli_field.replace("pod.name", "metadata.name").replace("pod.containers", "spec.containers")
    assert str(err.value).startswith(f"pod.json: {cli_field}: "), str(err.value)
    assert said in str(err.value)
    assert err.value.exit_code == 2


def test_a_good_pod_is_normalised_alike_by_both(node: Any) -> None:
    # A device limit without a request gets its request (the apiserver's defaulting), both ways.
    p = pod(uid="uid-norm", containers=[container(limits={"cpu": "500m", RES: "0"})])
    info = node.Admit(npb.AdmitRequest(pod=p), timeout=10)
    assert info.state == "admitted"
    spec = parse_pod(manifest(p))
    assert spec.containers[0].requests == {RES: "0"}
    node.Remove(npb.RemoveRequest(pod=npb.PodSelector(uid="uid-norm")), timeout=10)


# --------------------------------------------------------------------------- remove


def test_remove_by_uid_or_by_namespace_and_name_and_an_ambiguous_name_is_refused(daemon: Daemon, node: Any) -> None:
    root = daemon.root
    # A pod deleted and created again under its name has a new uid; the kubelet may hold both
    # for a while, and so does eventsrc. Its name then says neither.
    for uid in ("uid-a", "uid-b"):
        node.Admit(npb.AdmitRequest(pod=pod(uid=uid, namespace="team-a", name="job", containers=[container()])))
    proc = run_cli("remove", "team-a/job", root=root)
    assert proc.returncode == 1, proc.stdout
    assert proc.stderr == ("eventsrc: error: 2 pods are team-a/job: uid-a (admitted), uid-b (admitted); give the uid\n")
    proc = run_cli("remove", "--uid", "uid-a", "-o", "json", root=root)
    assert proc.returncode == 0, proc.stderr
    assert '"uid-a"' in proc.stdout
    proc = run_cli("remove", "team-a/job", "-o", "json", root=root)  # no longer ambiguous
    assert proc.returncode == 0, proc.stderr
    assert '"uid-b"' in proc.stdout
    assert not node.ListPods(npb.ListPodsRequest(), timeout=10).pods


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["a/b/c"], "'a/b/c' is neither NAMESPACE/NAME nor a uid; give --uid UID for a uid with '/'"),
        (["/job"], "'/job': give NAMESPACE/NAME, or --uid UID"),
        (["ns/"], "'ns/': give NAMESPACE/NAME, or --uid UID"),
    ],
)
def test_remove_refuses_an_argument_it_cannot_read(daemon: Daemon, args: list[str], said: str) -> None:
    proc = run_cli("remove", *args, root=daemon.root)
    assert (proc.returncode, proc.stderr) == (2, f"eventsrc: error: {said}\n")


def test_remove_takes_a_uid_or_a_name_not_both(daemon: Daemon) -> None:
    proc = run_cli("remove", "ns/p", "--uid", "u", root=daemon.root)
    assert proc.returncode == 2 and "not allowed with" in proc.stderr
    proc = run_cli("remove", root=daemon.root)
    assert proc.returncode == 2 and "one of the arguments" in proc.stderr
