"""One admission per pod uid at a time, seen from a grpcio client of the node API.

A grpcio device plugin holds its Allocate answer until the test lets it go, so that Admit
calls for the same uid are sure to arrive while the first one waits for the plugin (as a
client retrying a slow admission does).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest

from eventsrc.gen.node.v1 import node_pb2 as npb
from tests.conftest import Daemon, run_cli
from tests.support.grpcio_plugin import Dev, GrpcioPlugin
from tests.support.grpcio_stubs import stubs, unix_target

RES = "example.com/gpu"


class HeldPlugin(GrpcioPlugin):
    """A grpcio plugin whose GetPreferredAllocation (asked before the admission's intent is
    recorded) or Allocate (after it) waits for the test: ``entered`` is set when it is called,
    and it answers once ``release`` is."""

    def __init__(self, *args: Any, held: str = "Allocate", **kw: Any) -> None:
        super().__init__(*args, get_preferred_allocation_available=True, **kw)
        self.held = held
        self.entered = threading.Event()
        self.release = threading.Event()

    def _record(self, method: str, **fields: Any) -> None:
        super()._record(method, **fields)  # each call is recorded on the servicer's thread, before its answer
        if method == self.held:
            self.entered.set()
            assert self.release.wait(30), f"the test never released {method}"

    def stop(self) -> None:
        self.release.set()
        super().stop()


@pytest.fixture(params=["GetPreferredAllocation", "Allocate"])
def held(
    request: pytest.FixtureRequest, root: Path, daemon_factory: type[Daemon]
) -> Iterator[tuple[Daemon, HeldPlugin, Any]]:
    daemon = daemon_factory()
    plugin = HeldPlugin(root, RES, [Dev(f"gpu-{i}", numa=0) for i in range(4)], held=request.param).start()
    try:
        ok, error = plugin.register()
        assert ok, error
        daemon.eventually(lambda: len(state(root)["devices"]["devices"].get(RES, {})) == 4, "the plugin's devices")
        with grpc.insecure_channel(unix_target(root / "eventsrc" / "api.sock")) as channel:
            yield daemon, plugin, stubs("node/v1/node.proto").NodeStub(channel)
    finally:
        plugin.stop()


def state(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(run_cli("state", "-o", "json", root=root, check=True).stdout)
    return out


def records(root: Path, type_: str) -> list[dict[str, Any]]:
    proc = run_cli("log", "-o", "json", root=root, check=True)
    return [r for r in map(json.loads, proc.stdout.splitlines()) if r["type"] == type_]


def pod(uid: str = "uid-1", name: str = "trainer", namespace: str = "ml", gpus: str = "2") -> npb.Pod:
    return npb.Pod(
        uid=uid,
        namespace=namespace,
        name=name,
        containers=[npb.Container(name="app", kind="app", requests={RES: gpus}, limits={RES: gpus})],
    )


def answers(futures: list[Future[Any]]) -> list[Any]:
    out = []
    for f in futures:
        try:
            out.append(f.result(timeout=60))
        except grpc.RpcError as err:
            out.append((err.code(), err.details()))
    return out


def test_concurrent_admits_of_one_uid_make_one_admission_and_get_its_answer(
    root: Path, held: tuple[Daemon, HeldPlugin, Any]
) -> None:
    daemon, plugin, node = held
    first = node.Admit.future(npb.AdmitRequest(pod=pod()), timeout=60)
    assert plugin.entered.wait(30), f"the first admission never called {plugin.held}"
    others = [node.Admit.future(npb.AdmitRequest(pod=pod()), timeout=60) for _ in range(2)]
    # The others reach the daemon while the first is held by the plugin: they wait for it
    # (and say so); as they once did, they would queue for the admission lock each to admit
    # the pod again, or be refused while it was admitting.
    daemon.eventually(
        lambda: (
            daemon.output().count("pod admission waits for the one under way") == 2 or any(f.done() for f in others)
        ),
        "the other two calls to reach the daemon",
    )
    assert not any(f.done() for f in others)
    plugin.release.set()
    got = answers([first, *others])
    assert all(isinstance(a, npb.PodInfo) for a in got), got
    assert got[1:] == [got[0], got[0]]  # the same answer, correlation id included
    assert len(records(root, "PodAdmissionStarted")) == 1
    assert len(records(root, "PodAdmitted")) == 1
    assert len(plugin.calls("Allocate")) == 1
    assert len(plugin.calls("GetPreferredAllocation")) == 1
    (info,) = node.ListPods(npb.ListPodsRequest(), timeout=10).pods
    assert (info.namespace, info.name) == ("ml", "trainer")
    devices = state(root)["devices"]["devices"][RES]
    assert sorted(d["hold"] for d in devices.values()) == ["", "", "allocated", "allocated"]
    check = run_cli("replay", "--check", root=root)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_concurrent_admit_of_another_pod_under_the_uid_is_refused_at_once(
    root: Path, held: tuple[Daemon, HeldPlugin, Any]
) -> None:
    _, plugin, node = held
    first = node.Admit.future(npb.AdmitRequest(pod=pod()), timeout=60)
    assert plugin.entered.wait(30)
    with pytest.raises(grpc.RpcError) as err:  # answered while the first one is still held
        node.Admit(npb.AdmitRequest(pod=pod(name="other")), timeout=20)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.details() == "uid uid-1 is pod ml/trainer, not ml/other"
    plugin.release.set()
    assert first.result(timeout=60).name == "trainer"
    assert len(records(root, "PodAdmissionStarted")) == 1


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"name": "other"}, "uid uid-1 is pod ml/trainer, not ml/other"),
        ({"namespace": "other"}, "uid uid-1 is pod ml/trainer, not other/trainer"),
        ({"gpus": "1"}, 'pod "uid-1" container "app" changed request for resource "example.com/gpu" from 2 to 1'),
    ],
)
def test_another_pod_under_an_admitted_uid_is_refused_with_the_reason(
    root: Path, held: tuple[Daemon, HeldPlugin, Any], change: dict[str, str], reason: str
) -> None:
    _, plugin, node = held
    plugin.release.set()
    admitted = node.Admit(npb.AdmitRequest(pod=pod()), timeout=60)
    again = node.Admit(npb.AdmitRequest(pod=pod()), timeout=60)  # a retry: the pod as it is
    assert (again.uid, again.name, again.admitted_seq) == (admitted.uid, admitted.name, admitted.admitted_seq)
    with pytest.raises(grpc.RpcError) as err:
        node.Admit(npb.AdmitRequest(pod=pod(**change)), timeout=60)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.details() == reason
    (info,) = node.ListPods(npb.ListPodsRequest(), timeout=10).pods
    assert (info.namespace, info.name) == ("ml", "trainer")
    assert len(records(root, "PodAdmissionStarted")) == 1


def test_concurrent_removals_of_one_pod_release_its_devices_once(
    root: Path, held: tuple[Daemon, HeldPlugin, Any]
) -> None:
    _, plugin, node = held
    plugin.release.set()
    node.Admit(npb.AdmitRequest(pod=pod()), timeout=60)
    by_uid, by_name = npb.PodSelector(uid="uid-1"), npb.PodSelector(namespace="ml", name="trainer")
    futures = [node.Remove.future(npb.RemoveRequest(pod=sel), timeout=60) for sel in (by_uid, by_name, by_uid)]
    got = answers(futures)
    assert sum(isinstance(a, npb.PodInfo) for a in got) == 1, got
    assert sorted(a[0].name for a in got if isinstance(a, tuple)) == ["NOT_FOUND", "NOT_FOUND"], got
    assert len(records(root, "PodRemoved")) == 1
    assert len(records(root, "DevicesReleased")) == 1
    check = run_cli("replay", "--check", root=root)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_remove_while_the_pod_is_admitted_is_refused_and_the_admission_goes_on(
    root: Path, held: tuple[Daemon, HeldPlugin, Any]
) -> None:
    """Held at GetPreferredAllocation the pod is not in the views yet, at Allocate it is
    "admitting": either way a Remove is refused as the Admitter promises, not NotFound."""
    _, plugin, node = held
    first = node.Admit.future(npb.AdmitRequest(pod=pod()), timeout=60)
    assert plugin.entered.wait(30), f"the admission never called {plugin.held}"
    with pytest.raises(grpc.RpcError) as refused:
        node.Remove(npb.RemoveRequest(pod=npb.PodSelector(uid="uid-1")), timeout=30)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value.details()
    assert "being admitted" in (refused.value.details() or "")
    plugin.release.set()
    (got,) = answers([first])
    assert isinstance(got, npb.PodInfo) and got.state == "admitted", got
    assert len(records(root, "PodRemoved")) == 0
