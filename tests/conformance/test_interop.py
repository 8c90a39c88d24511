"""Interop: grpcio (Google's C-core gRPC) as the peer of the daemon's grpclib, on real sockets.

A device plugin written with grpcio (tests/support/grpcio_plugin.py) registers with a daemon
started by ``daemon_factory()``; pods are admitted with the CLI; PodResources is read with
grpcio's client.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.conftest import Daemon, run_cli
from tests.support.grpcio_plugin import UNHEALTHY, Dev, GrpcioPlugin
from tests.support.grpcio_stubs import pod_resources, pod_resources_client, unix_target

RES = "example.com/gpu"
prpb = pod_resources().pb2


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def plugins() -> Iterator[list[GrpcioPlugin]]:
    """Plugins a test started; stopped at the end (list this fixture before daemon_factory so
    the daemon is killed first and does not see its plugins go away)."""
    started: list[GrpcioPlugin] = []
    yield started
    for p in started:
        p.stop()


def gpus(n: int = 8, numa_nodes: int = 2) -> list[Dev]:
    return [Dev(f"gpu-{i}", numa=(i * numa_nodes) // n) for i in range(n)]


def num(device_id: str) -> int:
    return int(device_id.rsplit("-", 1)[1])


def wait_for(what: str, probe: Callable[[], Any], daemon: Daemon, timeout: float = 10.0) -> Any:
    """Poll ``probe`` until it returns something truthy; fail early if the daemon died."""
    return daemon.eventually(probe, what, timeout=timeout)


def events(root: Path, type_: str | None = None) -> list[dict[str, Any]]:
    proc = run_cli("log", "-o", "json", root=root, check=True)
    recs = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return [r for r in recs if type_ is None or r["type"] == type_]


def state(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(run_cli("state", "-o", "json", root=root, check=True).stdout)
    return out


def start_plugin(plugins: list[GrpcioPlugin], daemon: Daemon, devices: list[Dev], **kw: Any) -> GrpcioPlugin:
    """Start a grpcio plugin, register it and wait until the daemon has its devices."""
    plugin = GrpcioPlugin(daemon.root, kw.pop("resource", RES), devices, **kw).start()
    plugins.append(plugin)
    ok, error = plugin.register()
    assert ok, error
    want = {d.id for d in devices}
    wait_for(
        "the plugin's devices in the state",
        lambda: set(state(daemon.root)["devices"]["devices"].get(plugin.resource, {})) == want,
        daemon,
    )
    return plugin


def pod_file(tmp_path: Path, name: str, count: int, namespace: str = "default", resource: str = RES) -> Path:
    path = tmp_path / f"{namespace}-{name}.yaml"
    path.write_text(
        f"""apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {namespace}
  uid: {uuid.uuid4()}
spec:
  containers:
  - name: app
    image: busybox
    resources:
      limits:
        {resource}: {count}
"""
    )
    return path


def admit(root: Path, tmp_path: Path, name: str, count: int, namespace: str = "default") -> list[str]:
    """Admit a pod asking ``count`` devices; the device IDs the CLI reports for it."""
    proc = run_cli("admit", "-f", str(pod_file(tmp_path, name, count, namespace)), "-o", "json", root=root)
    assert proc.returncode == 0, proc.stderr
    pod = json.loads(proc.stdout)
    assert pod["state"] == "admitted"
    (container,) = pod["containers"]
    (res,) = container["resources"]
    assert res["resource"] == RES
    ids: list[str] = res["device_ids"]
    assert len(ids) == count
    return ids


def refused(root: Path, tmp_path: Path, name: str, count: int) -> str:
    proc = run_cli("admit", "-f", str(pod_file(tmp_path, name, count)), "-o", "json", root=root)
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr
    return proc.stderr


def rejections(root: Path, pod_name: str) -> list[str]:
    return [e["event"]["reason"] for e in events(root, "AdmissionRejected") if e["event"]["pod"]["name"] == pod_name]


def check_grouped_by_numa(devices: Any, numa_of: dict[str, int]) -> set[str]:
    """ContainerDevices entries as the kubelet lists them: one per device and NUMA node, one
    device id each, topology set to the device's node; the IDs they carry."""
    seen: set[str] = set()
    for cd in devices:
        assert cd.resource_name == RES
        assert cd.HasField("topology")
        (node,) = [n.ID for n in cd.topology.nodes]
        (i,) = cd.device_ids
        assert numa_of[i] == node, f"{i} is on NUMA {numa_of[i]}, listed under {node}"
        assert i not in seen, f"{i} listed twice"
        seen.add(i)
    return seen


def podresources_channel(root: Path) -> grpc.Channel:
    return grpc.insecure_channel(unix_target(root / "pod-resources" / "kubelet.sock"))


# --------------------------------------------------------------------------- 1. allocation, PodResources


def test_allocation_and_pod_resources(
    plugins: list[GrpcioPlugin], daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    daemon = daemon_factory()
    root = daemon.root
    devs = gpus(8, 2)
    numa_of = {d.id: d.numa for d in devs}
    plugin = start_plugin(plugins, daemon, devs)
    assert [c.method for c in plugin.calls()][:2] == ["GetDevicePluginOptions", "ListAndWatch"]

    got: dict[tuple[str, str], list[str]] = {}
    got[("default", "p1")] = admit(root, tmp_path, "p1", 1)
    got[("team-a", "p2")] = admit(root, tmp_path, "p2", 2, namespace="team-a")
    got[("default", "p3")] = admit(root, tmp_path, "p3", 3)

    # 6 of 8 are taken: 3 more is too many.
    err = refused(root, tmp_path, "too-big", 3)
    reason = f"requested number of devices unavailable for {RES}. Requested: 3, Available: 2"
    assert reason in err
    assert any(reason in r for r in rejections(root, "too-big")), events(root, "AdmissionRejected")

    got[("default", "p4")] = admit(root, tmp_path, "p4", 2)

    all_ids = [i for ids in got.values() for i in ids]
    assert sorted(all_ids, key=num) == [d.id for d in devs]  # distinct, and all 8 used
    allocs = [c.fields["device_ids"] for c in plugin.calls("Allocate")]
    assert [sorted(a) for a in allocs] == [sorted(ids) for ids in got.values()]

    with podresources_channel(root) as channel:
        client = pod_resources_client(channel)
        listed = client.List(prpb.ListPodResourcesRequest(), timeout=10)
        by_pod = {(p.namespace, p.name): p for p in listed.pod_resources}
        assert set(by_pod) == set(got)
        for key, ids in got.items():
            (container,) = by_pod[key].containers
            assert container.name == "app"
            assert check_grouped_by_numa(container.devices, numa_of) == set(ids)
            assert sum(len(cd.device_ids) for cd in container.devices) == len(ids)

        alloc = client.GetAllocatableResources(prpb.AllocatableResourcesRequest(), timeout=10)
        assert check_grouped_by_numa(alloc.devices, numa_of) == {d.id for d in devs}

        one = client.Get(prpb.GetPodResourcesRequest(pod_name="p2", pod_namespace="team-a"), timeout=10)
        assert one.pod_resources == by_pod[("team-a", "p2")]

        for name, namespace in [("nope", "default"), ("p2", "default")]:
            with pytest.raises(grpc.RpcError) as info:
                client.Get(prpb.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace), timeout=10)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND


# --------------------------------------------------------------------------- 2. health


def test_unhealthy_device_is_never_given(
    plugins: list[GrpcioPlugin], daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    daemon = daemon_factory()
    root = daemon.root
    devs = gpus(4, 2)
    plugin = start_plugin(plugins, daemon, devs)

    before = time.time_ns()
    plugin.set_health("gpu-1", UNHEALTHY)
    (change,) = wait_for("a DeviceHealthChanged event", lambda: events(root, "DeviceHealthChanged"), daemon)
    after = time.time_ns()
    assert change["event"]["resource"] == RES
    assert change["event"]["device_id"] == "gpu-1"
    assert change["event"]["health"] == UNHEALTHY
    assert change["event"]["numa_nodes"] == [0]
    assert before <= change["ts_ns"] <= after
    assert change["time"]

    given: list[str] = []
    for k in range(3):
        given += admit(root, tmp_path, f"p{k}", 1)
    assert sorted(given) == ["gpu-0", "gpu-2", "gpu-3"]
    err = refused(root, tmp_path, "one-more", 1)
    assert f"requested number of devices unavailable for {RES}. Requested: 1, Available: 0" in err
    assert all("gpu-1" not in c.fields["device_ids"] for c in plugin.calls("Allocate"))

    with podresources_channel(root) as channel:
        alloc = pod_resources_client(channel).GetAllocatableResources(prpb.AllocatableResourcesRequest(), timeout=10)
    assert sorted(i for cd in alloc.devices for i in cd.device_ids) == ["gpu-0", "gpu-2", "gpu-3"]


# --------------------------------------------------------------------------- 3. bad registrations


BAD_REGISTRATIONS = [
    pytest.param({"version": "v1alpha"}, 'requested API version "v1alpha" is not supported by kubelet', id="version"),
    pytest.param({"resource_name": "gpu"}, 'the ResourceName "gpu" is invalid', id="resource-name"),
    pytest.param({"endpoint": "../evil.sock"}, "plain file name", id="endpoint-dotdot"),
    pytest.param({"endpoint": "sub/dir.sock"}, "plain file name", id="endpoint-subdir"),
    pytest.param({"endpoint": "nobody.sock"}, "cannot dial", id="endpoint-missing"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_REGISTRATIONS)
def test_bad_registration_is_refused(
    plugins: list[GrpcioPlugin], daemon_factory: type[Daemon], bad: dict[str, str], message: str
) -> None:
    daemon = daemon_factory()
    root = daemon.root
    plugin = GrpcioPlugin(root, RES, gpus(2, 1)).start()
    plugins.append(plugin)

    ok, error = plugin.register(**bad)
    assert not ok
    if "version" in bad:
        assert error.startswith(message), error
    else:
        assert message in error, error

    (rejected,) = events(root, "PluginRegistrationRejected")
    assert rejected["event"]["reason"] == error
    assert rejected["event"]["resource"] == bad.get("resource_name", RES)
    assert rejected["event"]["endpoint"] == bad.get("endpoint", plugin.socket_name)
    assert rejected["event"]["api_version"] == bad.get("version", "v1beta1")
    assert events(root, "PluginRegistered") == []
    assert [c.method for c in plugin.calls()] == []  # never dialled
    assert RES not in state(root)["devices"]["plugins"]

    status = run_cli("status", root=root)
    assert status.returncode == 0, status.stderr
    ok, error = plugin.register()  # and a correct registration still works
    assert ok, error


# --------------------------------------------------------------------------- 4. GetPreferredAllocation


def highest_free(available: list[str], must_include: list[str], size: int) -> list[str]:
    rest = sorted((i for i in available if i not in must_include), key=num, reverse=True)
    return must_include + rest[: size - len(must_include)]


def test_preferred_allocation_is_followed(
    plugins: list[GrpcioPlugin], daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    daemon = daemon_factory()
    root = daemon.root
    devs = [Dev(d.id, UNHEALTHY if d.id == "gpu-3" else d.health, d.numa) for d in gpus(8, 1)]
    plugin = start_plugin(plugins, daemon, devs, get_preferred_allocation_available=True, preference=highest_free)

    assert sorted(admit(root, tmp_path, "p1", 2)) == ["gpu-6", "gpu-7"]
    assert sorted(admit(root, tmp_path, "p2", 3), key=num) == ["gpu-2", "gpu-4", "gpu-5"]

    asked = [c.fields for c in plugin.calls("GetPreferredAllocation")]
    assert len(asked) == 2
    assert sorted(asked[0]["available"], key=num) == ["gpu-0", "gpu-1", "gpu-2", "gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    assert sorted(asked[1]["available"], key=num) == ["gpu-0", "gpu-1", "gpu-2", "gpu-4", "gpu-5"]
    assert [a["must_include"] for a in asked] == [[], []]
    assert [a["allocation_size"] for a in asked] == [2, 3]
    reserved = events(root, "DevicesReserved")
    assert [r["event"]["choice"] for r in reserved] == ["plugin", "plugin"]


def test_failing_preferred_allocation_falls_back(
    plugins: list[GrpcioPlugin], daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    daemon = daemon_factory()
    root = daemon.root
    plugin = start_plugin(plugins, daemon, gpus(4, 2), get_preferred_allocation_available=True, preference=highest_free)
    plugin.preferred_error = (grpc.StatusCode.UNAVAILABLE, "preference engine down")

    ids = admit(root, tmp_path, "p1", 1)
    assert len(plugin.calls("GetPreferredAllocation")) == 1
    assert [c.fields["device_ids"] for c in plugin.calls("Allocate")] == [ids]
    (reserved,) = events(root, "DevicesReserved")
    assert reserved["event"]["device_ids"] == ids
    assert reserved["event"]["choice"] == "daemon"
    assert "GetPreferredAllocation failed" in reserved["event"]["note"]


# --------------------------------------------------------------------------- 5. PreStartContainer, failing Allocate


def test_pre_start_container_gets_the_allocated_ids(
    plugins: list[GrpcioPlugin], daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    daemon = daemon_factory()
    root = daemon.root
    plugin = start_plugin(plugins, daemon, gpus(4, 2), pre_start_required=True)

    ids = admit(root, tmp_path, "p1", 2)
    calls = [c for c in plugin.calls() if c.method in ("Allocate", "PreStartContainer")]
    assert [c.method for c in calls] == ["Allocate", "PreStartContainer"]
    assert sorted(calls[0].fields["device_ids"]) == sorted(ids)
    assert sorted(calls[1].fields["device_ids"]) == sorted(ids)


def test_failing_allocate_refuses_and_holds_nothing(
    plugins: list[GrpcioPlugin], daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    daemon = daemon_factory()
    root = daemon.root
    plugin = start_plugin(plugins, daemon, gpus(2, 1), pre_start_required=True)
    plugin.allocate_error = (grpc.StatusCode.FAILED_PRECONDITION, "device firmware is wedged")

    err = refused(root, tmp_path, "p1", 2)
    assert "device firmware is wedged" in err
    (reason,) = rejections(root, "p1")
    assert "device firmware is wedged" in reason
    (failed,) = plugin.calls("Allocate")
    assert sorted(failed.fields["device_ids"]) == ["gpu-0", "gpu-1"]
    assert plugin.calls("PreStartContainer") == []

    table = state(root)["devices"]["devices"][RES]
    assert {i: (d["holder"], d["hold"]) for i, d in table.items()} == {"gpu-0": ("", ""), "gpu-1": ("", "")}
    with podresources_channel(root) as channel:
        listed = pod_resources_client(channel).List(prpb.ListPodResourcesRequest(), timeout=10)
    assert list(listed.pod_resources) == []

    plugin.allocate_error = None
    assert sorted(admit(root, tmp_path, "p2", 2)) == ["gpu-0", "gpu-1"]


# --------------------------------------------------------------------------- 6. PodResources rate limit


def test_pod_resources_rate_limit(daemon_factory: type[Daemon]) -> None:
    daemon = daemon_factory()
    burst, qps, calls = 10, 100.0, 40
    with podresources_channel(daemon.root) as channel:
        client = pod_resources_client(channel)
        grpc.channel_ready_future(channel).result(timeout=10)
        start = time.monotonic()
        pending = [client.List.future(prpb.ListPodResourcesRequest(), timeout=10) for _ in range(calls)]
        ok, limited = 0, 0
        for f in pending:
            try:
                f.result()
                ok += 1
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                assert err.details() == "rejected by rate limit"
                limited += 1
        elapsed = time.monotonic() - start
        assert ok + limited == calls
        assert ok >= burst
        assert ok <= burst + math.ceil(elapsed * qps) + 1, (ok, elapsed)
        assert limited >= 1

        def served() -> bool:
            try:
                client.List(prpb.ListPodResourcesRequest(), timeout=10)
            except grpc.RpcError as err:
                assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                return False
            return True

        wait_for("a call served once tokens come back", served, daemon)


# --------------------------------------------------------------------------- a plugin that goes away


def test_plugin_going_away_is_recorded(plugins: list[GrpcioPlugin], daemon_factory: type[Daemon]) -> None:
    daemon = daemon_factory()
    root = daemon.root
    plugin = start_plugin(plugins, daemon, gpus(2, 1))
    plugin.stop()
    (gone,) = wait_for("a PluginDisconnected event", lambda: events(root, "PluginDisconnected"), daemon)
    assert gone["event"]["resource"] == RES
    assert run_cli("status", root=root).returncode == 0
    assert state(root)["devices"]["plugins"][RES]["connected"] is False
    with podresources_channel(root) as channel:
        alloc = pod_resources_client(channel).GetAllocatableResources(prpb.AllocatableResourcesRequest(), timeout=10)
    assert list(alloc.devices) == []  # capacity kept for the grace period, allocatable 0
