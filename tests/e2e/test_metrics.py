"""The metrics endpoint (--metrics-address): the kubelet's series with the kubelet's names,
labels and types, eventsrc's own, /healthz and /readyz; scraped as Prometheus does, over
HTTP, while the daemon admits pods with the sample device plugin and DRA driver."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import trio
from grpclib import GRPCError, Status
from prometheus_client.parser import text_string_to_metric_families

from eventsrc.gen.podresources.v1 import api_pb2 as pr
from eventsrc.obs.metrics import (
    DEFAULT_METRICS_ADDRESS,
    HealthApp,
    Metrics,
    MetricsAddressError,
    go_float,
    grpc_code,
    is_loopback,
    parse_address,
)
from tests.conftest import REPO, run_cli
from tests.e2e.test_devices_e2e import RESOURCE, Plugin
from tests.e2e.test_dra_e2e import DRIVER, Driver, claim_yaml, registered
from tests.e2e.test_dra_e2e import pod_yaml as claim_pod_yaml
from tests.support.eventually import eventually
from tests.support.grpcio_stubs import pod_resources_client, unix_target

STATIC = (
    "--cpu-manager-policy",
    "static",
    "--reserved-cpu-count",
    "4",
    "--topology-file",
    str(REPO / "examples" / "topology-256.json"),
)
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def metrics_address(root: Path) -> str:
    return json.loads((root / "eventsrc" / "status.json").read_text())["metrics_address"]  # type: ignore[no-any-return]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def scrape(address: str) -> tuple[str, dict[str, str], Samples]:
    """The exposition, each family's type, and every sample by (name, sorted labels). Read
    with curl when there is one (as an operator would), else urllib."""
    url = f"http://{address}/metrics"
    if shutil.which("curl"):
        text = subprocess.run(["curl", "-sSf", url], capture_output=True, text=True, check=True, timeout=10).stdout
    else:
        status, text = get(url)
        assert status == 200
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return text, types, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def device_pod(tmp: Path, name: str, devices: int, resource: str = RESOURCE) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, uid: uid-{name}}}\nspec:\n"
        "  containers:\n  - name: main\n    image: busybox\n"
        f"    resources:\n      limits: {{{resource}: {devices}, cpu: '2', memory: 1Gi}}\n"
    )
    return path


@pytest.fixture
def plugin(root: Path):  # type: ignore[no-untyped-def]
    started: list[Plugin] = []

    def start() -> Plugin:
        started.append(Plugin(root, "--devices", "4", "--numa-nodes", "2"))
        return started[-1]

    yield start
    for p in started:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()


def test_kubelet_series_during_device_admission(root: Path, tmp_path: Path, daemon_factory, plugin) -> None:  # type: ignore[no-untyped-def]
    daemon_factory("--metrics-address", "127.0.0.1:0", *STATIC)
    address = metrics_address(root)
    assert address.startswith("127.0.0.1:") and not address.endswith(":0")
    plugin().wait_registered()
    proc = run_cli("admit", "-f", str(device_pod(tmp_path, "a", 1)), "-o", "json", root=root)
    assert proc.returncode == 0, proc.stderr
    refused = run_cli("admit", "-f", str(device_pod(tmp_path, "b", 9)), root=root)
    assert refused.returncode == 1 and "requested number of devices unavailable" in refused.stderr
    unfit = run_cli("admit", "-f", str(device_pod(tmp_path, "c", 1, "example.com/nothing")), root=root)
    assert unfit.returncode == 1 and "Node didn't have enough resource: example.com/nothing" in unfit.stderr
    with grpc.insecure_channel(unix_target(root / "pod-resources" / "kubelet.sock")) as ch:
        client = pod_resources_client(ch)
        assert len(client.List(pr.ListPodResourcesRequest()).pod_resources) == 1
        client.GetAllocatableResources(pr.AllocatableResourcesRequest())
        with pytest.raises(grpc.RpcError):
            client.Get(pr.GetPodResourcesRequest(pod_name="nope", pod_namespace="default"))
    (root / "plugins" / "sample-example-com-dev" / "health.json").write_text(json.dumps({"dev-3": "Unhealthy"}))

    def health_transition_counted() -> tuple[str, dict[str, str], Samples] | None:
        scraped = scrape(address)
        counted = value(scraped[2], "eventsrc_device_health_transitions_total", resource_name=RESOURCE, to="Unhealthy")
        return scraped if counted else None

    text, types, samples = eventually(health_transition_counted, "the health transition counted")

    # The kubelet's names, labels and types (parsed as Prometheus parses them).
    assert types["kubelet_device_plugin_registration"] == "counter"
    assert value(samples, "kubelet_device_plugin_registration_total", resource_name=RESOURCE) == 1
    assert types["kubelet_device_plugin_alloc_duration_seconds"] == "histogram"
    assert value(samples, "kubelet_device_plugin_alloc_duration_seconds_count", resource_name=RESOURCE) == 1
    assert ("kubelet_device_plugin_alloc_duration_seconds_sum", (("resource_name", RESOURCE),)) in samples
    assert value(samples, "kubelet_device_plugin_alloc_duration_seconds_bucket", resource_name=RESOURCE, le="+Inf") == 1
    # The second pod was refused by the device planner: a topology manager admission error.
    # The third by the predicate, which runs after the topology manager admitted it: no error.
    assert value(samples, "kubelet_topology_manager_admission_requests_total") == 3
    assert value(samples, "kubelet_topology_manager_admission_errors_total") == 1
    assert types["kubelet_topology_manager_admission_duration_ms"] == "histogram"
    assert value(samples, "kubelet_topology_manager_admission_duration_ms_count") == 3
    # Each pod asked for 2 exclusive CPUs; the second and the third got them before their refusal.
    assert value(samples, "kubelet_cpu_manager_pinning_requests_total") == 3
    assert value(samples, "kubelet_cpu_manager_pinning_errors_total") == 0
    v1 = {"server_api_version": "v1"}
    assert types["kubelet_pod_resources_endpoint_requests_list"] == "counter"
    assert value(samples, "kubelet_pod_resources_endpoint_requests_total", **v1) == 3
    # (The parser keeps counters as OpenMetrics does, "_total" added; the text has none.)
    assert value(samples, "kubelet_pod_resources_endpoint_requests_list_total", **v1) == 1
    assert value(samples, "kubelet_pod_resources_endpoint_requests_get_allocatable_total", **v1) == 1
    assert value(samples, "kubelet_pod_resources_endpoint_requests_get_total", **v1) == 1
    assert value(samples, "kubelet_pod_resources_endpoint_errors_get_total", **v1) == 1
    assert 'kubelet_pod_resources_endpoint_requests_list{server_api_version="v1"} 1\n' in text
    # The exposition is Go's: the kubelet's spelling of names and numbers, no _created series.
    assert "# TYPE kubelet_pod_resources_endpoint_requests_list counter\n" in text
    assert "# TYPE kubelet_device_plugin_registration_total counter\n" in text
    # (Which bucket the one Allocate fell in depends on how long it took: only the spelling is checked.)
    assert f'kubelet_device_plugin_alloc_duration_seconds_bucket{{resource_name="{RESOURCE}",le="1"}} ' in text
    assert "_created" not in text and "dra_grpc_operations_duration_seconds" not in text
    # eventsrc's own.
    assert value(samples, "eventsrc_device_health_transitions_total", resource_name=RESOURCE, to="Unhealthy") == 1
    assert value(samples, "eventsrc_log_last_sequence") > 0
    assert value(samples, "eventsrc_log_bytes") > 0
    assert value(samples, "eventsrc_log_append_duration_seconds_count") > 0
    assert (
        value(samples, "eventsrc_log_commit_batch_records_sum")
        >= value(samples, "eventsrc_log_commit_batch_records_count")
        > 0
    )
    assert value(samples, "eventsrc_log_corrupt_records") == 0
    assert ("eventsrc_replay_duration_seconds", ()) in samples
    assert value(samples, "eventsrc_admissions_waiting_for_plugin") == 0
    # kube-state-metrics' way: one _info series per device held now, gone once released.
    held = [k for k in samples if k[0] == "eventsrc_device_allocation_info"]
    assert len(held) == 1 and samples[held[0]] == 1
    labels = dict(held[0][1])
    assert (labels["resource"], labels["namespace"], labels["pod"]) == (RESOURCE, "default", "a")
    assert labels["container"] and labels["device"]
    assert types["eventsrc_device_allocation_info"] == "gauge"
    run_cli("remove", "default/a", root=root, check=True)
    assert not [k for k in scrape(address)[2] if k[0] == "eventsrc_device_allocation_info"]

    assert get(f"http://{address}/healthz") == (200, "ok")
    assert get(f"http://{address}/readyz") == (200, "ok")
    assert get(f"http://{address}/nope")[0] == 404


@pytest.fixture
def driver(root: Path):  # type: ignore[no-untyped-def]
    d = Driver(root)
    yield d
    d.stop()


def test_dra_series_and_a_network_address(root: Path, tmp_path: Path, daemon_factory, driver) -> None:  # type: ignore[no-untyped-def]
    d = daemon_factory("--metrics-address", ":0")
    assert "the metrics endpoint is reachable from the network" in d.output()
    port = metrics_address(root).rpartition(":")[2]
    driver.start()
    eventually(lambda: registered(root), "the driver's registration")
    claim = claim_yaml(tmp_path, "solo", "c-solo", [("a", "u-a")])
    proc = run_cli("admit", "-f", str(claim_pod_yaml(tmp_path, "a", "u-a", "solo")), "-f", str(claim), root=root)
    assert proc.returncode == 0, proc.stderr
    run_cli("remove", "u-a", root=root, check=True)
    eventually(lambda: driver.prepared() == set(), "the driver to hold no claim")
    _, types, samples = scrape(f"127.0.0.1:{port}")
    assert types["dra_grpc_operations_duration_seconds"] == "histogram"
    for method in ("NodePrepareResources", "NodeUnprepareResources"):
        labels = {
            "driver_name": DRIVER,
            "grpc_status_code": "OK",
            "method_name": f"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/{method}",
        }
        assert value(samples, "dra_grpc_operations_duration_seconds_count", **labels) == 1, method
    # The pod-level operations, as the kubelet's DRA manager times them.
    assert types["dra_operations_duration_seconds"] == "histogram"
    for operation in ("PrepareResources", "UnprepareResources"):
        assert (
            value(samples, "dra_operations_duration_seconds_count", operation_name=operation, is_error="false") == 1
        ), operation
    # A DRA driver is no device plugin.
    assert not any(name == "kubelet_device_plugin_registration_total" for name, _ in samples)


def test_a_bad_or_busy_address_is_one_line(root: Path) -> None:
    assert DEFAULT_METRICS_ADDRESS in " ".join(run_cli("serve", "--help").stdout.split())
    bad = run_cli("serve", "--metrics-address", "localhost", root=root)
    assert bad.returncode == 1 and "expected HOST:PORT" in bad.stderr and "Traceback" not in bad.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = run_cli("serve", "--metrics-address", f"127.0.0.1:{taken.getsockname()[1]}", root=root)
    assert (
        busy.returncode == 1 and "cannot serve metrics on 127.0.0.1:" in busy.stderr and "Traceback" not in busy.stderr
    )


# ---------------------------------------------------------------------------- in process


def test_each_metrics_object_counts_alone() -> None:
    a, b = Metrics(), Metrics()
    a.cpu_pinning(failed=True)
    a.pod_resources_request("list")
    families = {f.name: f for f in text_string_to_metric_families(a.exposition().decode())}
    assert families["kubelet_cpu_manager_pinning_errors"].samples[0].value == 1
    assert b"kubelet_cpu_manager_pinning_errors_total 0\n" in b.exposition()
    assert b"pod_resources" not in b.exposition()  # a labelled series appears with its first child


def test_dra_call_names_the_status_as_grpc_go_does() -> None:
    m = Metrics()
    method = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
    with pytest.raises(GRPCError), m.dra_call("d", method):
        raise GRPCError(Status.UNAVAILABLE, "down")
    assert b'grpc_status_code="Unavailable"' in m.exposition()
    assert [
        grpc_code(e)
        for e in (
            None,
            GRPCError(Status.CANCELLED),
            GRPCError(Status.DEADLINE_EXCEEDED),
            trio.TooSlowError(),
            ConnectionRefusedError(),
            ValueError(),
        )
    ] == ["OK", "Canceled", "DeadlineExceeded", "DeadlineExceeded", "Unavailable", "Unknown"]


def test_dra_operation_is_an_error_when_a_driver_failed_a_claim_or_the_block_raised() -> None:
    from eventsrc import events as ev

    m = Metrics()
    claim = ev.ClaimRef(uid="c1")
    with m.dra_operation("PrepareResources") as outcome:
        outcome.append(ev.ClaimPrepared(claim=claim, driver="d"))
    with m.dra_operation("PrepareResources") as outcome:
        outcome += [
            ev.ClaimPrepared(claim=claim, driver="d"),
            ev.ClaimPrepareFailed(claim=claim, driver="d", reason="no"),
        ]
    with pytest.raises(RuntimeError), m.dra_operation("UnprepareResources"):
        raise RuntimeError("driver gone")
    text = m.exposition().decode()
    for operation, error, n in (
        ("PrepareResources", "false", 1),
        ("PrepareResources", "true", 1),
        ("UnprepareResources", "true", 1),
    ):
        assert (
            f'dra_operations_duration_seconds_count{{operation_name="{operation}",is_error="{error}"}} {n}\n' in text
        ), text


def test_topology_admission_counts_errors_and_milliseconds() -> None:
    m = Metrics()
    with m.topology_admission():
        pass
    with pytest.raises(RuntimeError), m.topology_admission():
        raise RuntimeError("refused")
    text = m.exposition().decode()
    assert "kubelet_topology_manager_admission_requests_total 2\n" in text
    assert "kubelet_topology_manager_admission_errors_total 1\n" in text
    assert 'kubelet_topology_manager_admission_duration_ms_bucket{le="0.05"}' in text  # ExponentialBuckets(.05, 2, 15)
    assert 'kubelet_topology_manager_admission_duration_ms_bucket{le="819.2"}' in text


def test_numbers_are_written_as_go_writes_them() -> None:
    assert [go_float(v) for v in (1.0, 0.0, 0.005, 10.0, 1e6, 4096000.0, 5.5e-07, 0.0001, float("inf"), -2.5)] == [
        "1",
        "0",
        "0.005",
        "10",
        "1e+06",
        "4.096e+06",
        "5.5e-07",
        "0.0001",
        "+Inf",
        "-2.5",
    ]


def test_addresses() -> None:
    assert parse_address("127.0.0.1:10266") == ("127.0.0.1", 10266)
    assert parse_address("[::1]:0") == ("::1", 0)
    assert parse_address(":9000") == ("", 9000)
    for bad in ("10266", "host:", "::1:80", "h:99999"):
        with pytest.raises(MetricsAddressError):
            parse_address(bad)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not any(is_loopback(h) for h in ("", "0.0.0.0", "::", "10.0.0.1", "node.example.com"))


async def _ask(app: HealthApp, method: str, path: str) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    await app({"type": "http", "method": method, "path": path}, receive, send)
    return sent[0]["status"], sent[1]["body"]


async def test_probes_say_why_not() -> None:
    state = {"live": "", "ready": "starting: the sockets are not served yet"}
    probe: Callable[[str], Callable[[], str]] = lambda k: lambda: state[k]  # noqa: E731
    app = HealthApp(Metrics(), live=probe("live"), ready=probe("ready"))
    assert await _ask(app, "GET", "/readyz") == (503, b"starting: the sockets are not served yet\n")
    assert await _ask(app, "GET", "/healthz") == (200, b"ok")
    state.update(ready="", live="committer stalled: 1 append(s) waiting, no commit for 61 s")
    assert await _ask(app, "GET", "/readyz") == (200, b"ok")
    assert (await _ask(app, "GET", "/healthz"))[0] == 500
    assert await _ask(app, "HEAD", "/metrics") == (200, b"")
    assert (await _ask(app, "POST", "/metrics"))[0] == 405


async def test_healthz_stays_200_with_a_warning_for_what_a_restart_would_not_mend() -> None:
    """Failing retention cuts (a full archive disk) need an operator, not a restart: /healthz
    is a liveness probe, so it stays 200 and says why after its "ok" (docs/operations.md)."""
    state = {"warn": ""}
    app = HealthApp(Metrics(), live=lambda: "", ready=lambda: "", warn=lambda: state["warn"])
    assert await _ask(app, "GET", "/healthz") == (200, b"ok")
    state["warn"] = "log retention cuts failing for 3 s (...)"
    assert await _ask(app, "GET", "/healthz") == (200, b"ok\nwarning: log retention cuts failing for 3 s (...)\n")
    assert await _ask(app, "GET", "/readyz") == (200, b"ok")
