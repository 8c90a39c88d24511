"""NUMA ids and device IDs a device plugin may send, against a daemon on a 2-node machine
(docs/security.md names each test next to its claim).

A grpcio plugin reports what no careful plugin would: a device on each of 24 NUMA ids, ids
the machine does not have, a negative id, an empty device ID, an ID listed twice. The
daemon takes what it can name and place, reports the rest in its log, aligns only on the
machine's NUMA nodes, and keeps answering while it admits.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.test_interop import RES, admit, pod_file
from tests.conftest import Daemon, run_cli
from tests.support.grpcio_plugin import UNHEALTHY, Dev, GrpcioPlugin


@pytest.fixture
def plugins() -> Iterator[list[GrpcioPlugin]]:
    started: list[GrpcioPlugin] = []
    yield started
    for p in started:
        p.stop()


@pytest.fixture
def two_nodes(tmp_path: Path) -> Path:
    """A machine of 4 CPUs on NUMA nodes 0 and 1 (--topology-file)."""
    cpus = [{"id": i, "core": i, "socket": i // 2, "numa": i // 2, "uncore": i // 2} for i in range(4)]
    path = tmp_path / "two-nodes.json"
    path.write_text(json.dumps({"cpus": cpus}))
    return path


def devices_in_state(root: Path) -> dict[str, Any]:
    state = json.loads(run_cli("state", "-o", "json", root=root, check=True).stdout)
    table: dict[str, Any] = state["devices"]["devices"].get(RES, {})
    return {i: d for i, d in table.items() if not d.get("removed")}


def start(plugins: list[GrpcioPlugin], daemon: Daemon, devices: list[Dev], listed: set[str]) -> GrpcioPlugin:
    plugin = GrpcioPlugin(daemon.root, RES, devices).start()
    plugins.append(plugin)
    ok, error = plugin.register()
    assert ok, error
    daemon.eventually(lambda: set(devices_in_state(daemon.root)) == listed, f"the devices {sorted(listed)} listed")
    return plugin


def log_lines(d: Daemon, msg: str) -> list[dict[str, Any]]:
    """The daemon's log lines (--log-format json) with message ``msg``."""
    lines = (json.loads(x) for x in d.output().splitlines() if x.startswith("{"))
    return [x for x in lines if x.get("msg") == msg]


OUTSIDE = "device on NUMA nodes this machine does not have, not used for alignment"


@pytest.mark.parametrize("policy", ["best-effort", "none"])
def test_a_device_on_each_of_24_numa_ids_neither_freezes_nor_misaligns(
    plugins: list[GrpcioPlugin], daemon_factory: Callable[..., Daemon], two_nodes: Path, tmp_path: Path, policy: str
) -> None:
    d = daemon_factory("--topology-file", str(two_nodes), "--topology-manager-policy", policy, "--log-format", "json")
    devices = [Dev(f"gpu-{i}", numa=i) for i in range(24)]
    start(plugins, d, devices, {x.id for x in devices})
    # Recorded as the plugin said them; the daemon's log names each id the machine lacks.
    assert {i: t["numa_nodes"] for i, t in devices_in_state(d.root).items()} == {f"gpu-{i}": [i] for i in range(24)}
    warned = d.eventually(lambda: log_lines(d, OUTSIDE) if len(log_lines(d, OUTSIDE)) == 22 else [], "22 warnings")
    assert {(w["resource"], w["device"], tuple(w["numa_ids"])) for w in warned} == {
        (RES, f"gpu-{i}", (i,)) for i in range(2, 24)
    }
    assert all(w["machine_numa_nodes"] == [0, 1] and w["level"] == "warning" for w in warned)

    # A 12-device pod is admitted while the daemon keeps answering.
    result: dict[str, Any] = {}
    admission = threading.Thread(target=lambda: result.update(ids=admit(d.root, tmp_path, "big", 12)))
    admission.start()
    answers: list[subprocess.CompletedProcess[str]] = []
    while not answers or admission.is_alive():  # status, again and again, until the pod is in
        answers.append(run_cli("status", root=d.root))
    admission.join()
    assert all(a.returncode == 0 for a in answers), [a.stderr for a in answers if a.returncode]
    assert "ids" in result
    got = result["ids"]
    assert len(set(got)) == 12
    # The two devices on the machine's nodes are the aligned ones: taken first.
    if policy == "best-effort":
        assert {"gpu-0", "gpu-1"} <= set(got)
    assert run_cli("status", root=d.root).returncode == 0
    assert d.proc.poll() is None


def test_bad_ids_are_refused_device_by_device_and_admissions_go_on(
    plugins: list[GrpcioPlugin], daemon_factory: Callable[..., Daemon], two_nodes: Path, tmp_path: Path
) -> None:
    d = daemon_factory(
        "--topology-file", str(two_nodes), "--topology-manager-policy", "single-numa-node", "--log-format", "json"
    )
    devices = [
        Dev("gpu-0", numa=0),
        Dev("gpu-1", numa=0),
        Dev("neg", numa=-1),
        Dev("", numa=1),
        Dev("twice", UNHEALTHY, numa=1),
        Dev("twice", numa=1),
        Dev("far", numa=64),
    ]
    start(plugins, d, devices, {"gpu-0", "gpu-1", "twice", "far"})
    table = devices_in_state(d.root)
    assert table["twice"]["health"] == "Healthy"  # the last listing
    assert table["far"]["numa_nodes"] == [64]
    added = [
        r
        for r in (json.loads(x) for x in run_cli("log", "-o", "json", root=d.root, check=True).stdout.splitlines())
        if r["type"] == "DevicesAdded"
    ]
    assert [x["id"] for r in added for x in r["event"]["devices"]] == ["gpu-0", "gpu-1", "twice", "far"]

    refused = d.eventually(lambda: log_lines(d, "device refused")[:2], "the refusals in the log")
    assert {(w["device"], w["reason"]) for w in refused} == {
        ("neg", "NUMA id -1 is negative"),
        ("", "the device has an empty ID"),
    }
    (twice,) = log_lines(d, "device listed more than once, the last listing taken")
    assert (twice["device"], twice["times"]) == ("twice", 2)
    (far,) = log_lines(d, OUTSIDE)
    assert (far["device"], far["numa_ids"]) == ("far", [64])
    # The count logged is the count recorded.
    assert [x["count"] for x in log_lines(d, "devices added")] == [4]

    # Every admission of the resource under a topology policy still works (never an internal error).
    for i in range(3):
        admit(d.root, tmp_path, f"p{i}", 1)  # admitted, with its one device
    proc = run_cli("admit", "-f", str(pod_file(tmp_path, "more", 2)), root=d.root)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "Internal" not in proc.stderr
    assert d.proc.poll() is None


def test_many_faults_in_one_list_are_told_in_a_bounded_number_of_lines(
    plugins: list[GrpcioPlugin], daemon_factory: Callable[..., Daemon], two_nodes: Path
) -> None:
    from eventsrc.node.device_manager import LOGGED_PER_KIND

    d = daemon_factory("--topology-file", str(two_nodes), "--log-format", "json")
    n = LOGGED_PER_KIND + 8
    devices = [Dev(f"far-{i}", numa=64) for i in range(n)]
    start(plugins, d, devices, {x.id for x in devices})
    more = d.eventually(lambda: log_lines(d, f"{OUTSIDE}: 8 more devices"), "the line saying how many more")
    assert [m["more"] for m in more] == [8]
    assert len(log_lines(d, OUTSIDE)) == LOGGED_PER_KIND  # then a line each, no more
    assert [x["count"] for x in log_lines(d, "devices added")] == [n]  # one line for the whole list
