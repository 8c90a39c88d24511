"""Generated pods thrown at the node API of one running daemon with a grpcio device plugin
(property-based, hypothesis), spoken to with grpcio.

Each case is a few Admit and Remove calls, some at once, with uids and names drawn from small
pools (so that retries, another pod under a known uid and two pods of one name happen),
containers with duplicates and empty names, device counts as arbitrary strings, requests that
differ from limits, text with control, bidi and non-ASCII characters. Every answer is OK,
INVALID_ARGUMENT (a bad pod), FAILED_PRECONDITION (a refusal) or NOT_FOUND (removing a pod
that is not there), never UNKNOWN or INTERNAL; after each case no device is held by two live
pods; at the end the daemon still serves and ``replay --check`` finds nothing wrong.

``EVENTSRC_FUZZ_EXAMPLES`` sets the number of cases (default 200, a few seconds).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from eventsrc.gen.node.v1 import node_pb2 as npb
from tests.conftest import Daemon, run_cli
from tests.support.grpcio_plugin import Dev, GrpcioPlugin
from tests.support.grpcio_stubs import stubs, unix_target

EXAMPLES = int(os.environ.get("EVENTSRC_FUZZ_EXAMPLES", "200"))
GPU = "example.com/gpu"
ANSWERS = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
}


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[Daemon, Any]]:
    short = Path(tempfile.mkdtemp(prefix="es-", dir="/tmp"))  # unix socket paths are short
    daemon = Daemon(short / "root")
    plugin = GrpcioPlugin(daemon.root, GPU, [Dev(f"gpu-{i}", numa=i // 4) for i in range(8)]).start()
    try:
        ok, error = plugin.register()
        assert ok, error
        daemon.eventually(lambda: len(_state(daemon.root)["devices"]["devices"].get(GPU, {})) == 8, "the devices")
        with grpc.insecure_channel(unix_target(daemon.root / "eventsrc" / "api.sock")) as channel:
            yield daemon, stubs("node/v1/node.proto").NodeStub(channel)
    finally:
        daemon.stop()
        plugin.stop()
        shutil.rmtree(short, ignore_errors=True)


def _state(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(run_cli("state", "-o", "json", root=root, check=True).stdout)
    return out


TEXT = st.one_of(
    st.sampled_from(["p", "q", "default", "ns", "a.b", "job/1", "team/a", "P", "", "x" * 64]),
    st.sampled_from(["\n", "\x00", "\x1b[31m", "\u202e", "😀", "é", "/", " "]).map(lambda c: "p" + c),
    st.text(max_size=6),
)
COUNT = st.one_of(
    st.sampled_from(["0", "1", "2", "3", "9", "-1", "0.5", "1k", "1e1", "", "01", "99999999999999999999"]),
    st.text(max_size=5),
)


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` nine times in ten, so that many cases reach admission; else ``bad``."""
    return st.integers(0, 9).flatmap(lambda i: bad if i == 0 else good)


@st.composite
def containers(draw: st.DrawFn) -> list[npb.Container]:
    out = []
    for _ in range(draw(mostly(st.integers(1, 3), st.just(0)))):
        n = draw(mostly(st.sampled_from(["0", "1", "1", "2", "3"]), COUNT))
        resource = draw(mostly(st.just(GPU), st.sampled_from(["example.com/none", "cpu"])))
        limits = draw(mostly(st.just({resource: n}), st.just({})))
        requests = draw(mostly(st.just(dict(limits)), st.sampled_from([{}, {resource: draw(COUNT)}])))
        name = draw(mostly(st.sampled_from(["app", "side", "init", "main"]), TEXT))
        kind = draw(mostly(st.sampled_from(["app", "app", "init", "sidecar"]), st.sampled_from(["", "job", "App"])))
        out.append(npb.Container(name=name, kind=kind, requests=requests, limits=limits))
    return out


@st.composite
def pods(draw: st.DrawFn) -> npb.Pod:
    return npb.Pod(
        uid=draw(mostly(st.sampled_from(["uid-1", "uid-2", "uid-3", "uid-4"]), TEXT)),
        namespace=draw(mostly(st.sampled_from(["ns", "ns", ""]), TEXT)),
        name=draw(mostly(st.sampled_from(["p", "p", "q"]), TEXT)),
        containers=draw(containers()),
    )


def removals() -> st.SearchStrategy[npb.PodSelector]:
    return st.one_of(
        st.builds(npb.PodSelector, uid=mostly(st.sampled_from(["uid-1", "uid-2", "uid-3", "uid-4"]), TEXT)),
        st.builds(npb.PodSelector, namespace=st.sampled_from(["ns", ""]), name=st.sampled_from(["p", "q"])),
    )


CALLS = st.lists(st.one_of(pods(), removals()), min_size=1, max_size=6)


def _code(f: Future[Any]) -> tuple[grpc.StatusCode, str]:
    try:
        f.result(timeout=60)
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


def held_twice(node: Any) -> dict[str, list[str]]:
    """Devices that two live pods hold (by the node API's list of pods)."""
    holders: dict[str, set[str]] = {}
    for p in node.ListPods(npb.ListPodsRequest(), timeout=30).pods:
        for c in p.containers:
            for r in c.resources:
                for d in r.device_ids:
                    holders.setdefault(f"{r.resource} {d}", set()).add(p.uid)
    return {d: sorted(uids) for d, uids in holders.items() if len(uids) > 1}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(CALLS)
def test_generated_calls_are_answered_and_no_device_is_held_twice(node: tuple[Daemon, Any], calls: list[Any]) -> None:
    _, api = node
    futures = [
        api.Admit.future(npb.AdmitRequest(pod=c), timeout=60)
        if isinstance(c, npb.Pod)
        else api.Remove.future(npb.RemoveRequest(pod=c), timeout=60)
        for c in calls
    ]  # at once: the daemon sees them concurrently
    for call, f in zip(calls, futures, strict=True):
        code, details = _code(f)
        event(f"{'Admit' if isinstance(call, npb.Pod) else 'Remove'} {code.name}")
        assert code in ANSWERS, (code, details, call)
        assert "\n" not in details
    assert held_twice(api) == {}


def test_after_the_cases_the_daemon_serves_and_its_log_checks(node: tuple[Daemon, Any]) -> None:
    daemon, api = node
    assert daemon.exited() is None
    assert api.Status(npb.StatusRequest(), timeout=10).ready
    proc = run_cli("replay", "--check", root=daemon.root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The devices view says the same as the pods: a device held is held by a live pod's container.
    live = {p.uid: p for p in api.ListPods(npb.ListPodsRequest(), timeout=30).pods}
    for device_id, d in _state(daemon.root)["devices"]["devices"][GPU].items():
        if d["holder"]:
            uid, container = d["holder"].split("/", 1)
            assert uid in live, (device_id, d)
            held = {i for c in live[uid].containers for r in c.resources for i in r.device_ids}
            assert device_id in held, (device_id, d)
