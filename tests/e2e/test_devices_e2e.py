"""The daemon with the sample device plugin, as an operator meets them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from tests.support.eventually import eventually

RESOURCE = "example.com/dev"


def pod_yaml(tmp: Path, name: str, devices: int, resource: str = RESOURCE, uid: str = "") -> Path:
    path = tmp / f"{name}.yaml"
    meta = f"{{name: {name}, namespace: default{', uid: ' + uid if uid else ''}}}"
    path.write_text(
        f"apiVersion: v1\nkind: Pod\nmetadata: {meta}\nspec:\n  containers:\n  - name: main\n"
        f"    image: busybox\n    resources:\n      limits: {{{resource}: {devices}, cpu: 100m}}\n"
    )
    return path


class Plugin:
    def __init__(self, root: Path, *extra: str) -> None:
        self.root = root
        self.calls = root.parent / f"calls-{time.monotonic_ns()}.jsonl"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "eventsrc",
                "--root-dir",
                str(root),
                "sample-plugin",
                "--calls-log",
                str(self.calls),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_registered(self, timeout: float = 30) -> None:
        try:
            eventually(
                lambda: any(r["type"] == "PluginRegistered" for r in log_records(self.root)),
                "the sample plugin's registration",
                timeout=timeout,
                stop=lambda: None if self.proc.poll() is None else f"the sample plugin exited {self.proc.returncode}",
            )
        except AssertionError as err:
            if self.proc.poll() is None:
                self.proc.kill()
            raise AssertionError(f"{err}\n{self.proc.communicate()[0]}") from None

    def allocate_calls(self) -> list[list[str]]:
        if not self.calls.exists():
            return []
        return [
            c["device_ids"] for c in map(json.loads, self.calls.read_text().splitlines()) if c["method"] == "Allocate"
        ]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)


@pytest.fixture
def plugins(root: Path):  # type: ignore[no-untyped-def]
    started: list[Plugin] = []

    def start(*extra: str) -> Plugin:
        p = Plugin(root, *extra)
        started.append(p)
        return p

    yield start
    for p in started:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()


def log_records(root: Path, since: int = 1) -> list[dict[str, Any]]:
    out = run_cli("log", "-o", "json", "--from", str(since), root=root, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def admissions_waiting(root: Path) -> float:
    """The gauge of admissions waiting for a plugin (of a daemon run with --metrics-address)."""
    from tests.e2e.test_metrics import metrics_address, scrape, value

    return value(scrape(metrics_address(root))[2], "eventsrc_admissions_waiting_for_plugin")


def admit(root: Path, path: Path) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    proc = run_cli("admit", "-f", str(path), "-o", "json", root=root)
    return proc.returncode, json.loads(proc.stdout) if proc.returncode == 0 else {}, proc.stderr


def devices_of(info: dict) -> list[str]:  # type: ignore[type-arg]
    return [d for c in info["containers"] for r in c["resources"] for d in r["device_ids"]]


def test_pods_get_distinct_healthy_devices_and_the_plugin_saw_them(
    root: Path, tmp_path: Path, daemon_factory, plugins
) -> None:  # type: ignore[no-untyped-def]
    daemon_factory()
    plugin = plugins("--devices", "8", "--numa-nodes", "2")
    plugin.wait_registered()
    given: list[str] = []
    for i, n in enumerate([1, 2, 5]):
        rc, info, err = admit(root, pod_yaml(tmp_path, f"p{i}", n))
        assert rc == 0, err
        got = devices_of(info)
        assert len(got) == n and not set(got) & set(given)
        given += got
        assert plugin.allocate_calls()[-1] == got
        # NUMA packing: a pod's devices sit on as few NUMA nodes as the free ones allow.
        if n <= 4 and i == 0:
            assert all(int(d.split("-")[1]) < 4 for d in got) or all(int(d.split("-")[1]) >= 4 for d in got)
    assert sorted(given) == [f"dev-{i}" for i in range(8)]
    rc, _, err = admit(root, pod_yaml(tmp_path, "extra", 1))
    assert rc == 1 and "requested number of devices unavailable for example.com/dev. Requested: 1, Available: 0" in err
    assert "Traceback" not in err


def test_unhealthy_devices_are_never_given(root: Path, tmp_path: Path, daemon_factory, plugins) -> None:  # type: ignore[no-untyped-def]
    daemon_factory()
    plugin = plugins("--devices", "4", "--numa-nodes", "1")
    plugin.wait_registered()
    health = root / "plugins" / "sample-example-com-dev" / "health.json"
    health.write_text(json.dumps({"dev-1": "Unhealthy", "dev-2": "Unhealthy"}))

    def health_changes() -> list[dict[str, Any]]:
        changed = [r for r in log_records(root) if r["type"] == "DeviceHealthChanged"]
        return changed if len(changed) >= 2 else []

    changed = eventually(health_changes, "two health changes", timeout=10)
    assert {r["event"]["device_id"] for r in changed} == {"dev-1", "dev-2"}
    assert all(r["event"]["health"] == "Unhealthy" and r["ts_ns"] > 0 for r in changed)
    rc, info, err = admit(root, pod_yaml(tmp_path, "a", 2))
    assert rc == 0, err
    assert sorted(devices_of(info)) == ["dev-0", "dev-3"]
    rc, _, err = admit(root, pod_yaml(tmp_path, "b", 1))
    assert rc == 1 and "Available: 0" in err


def test_restart_while_the_plugin_is_away(root: Path, tmp_path: Path, daemon_factory, plugins) -> None:  # type: ignore[no-untyped-def]
    d = daemon_factory()
    plugin = plugins("--devices", "4", "--numa-nodes", "2")
    plugin.wait_registered()
    rc, info, err = admit(root, pod_yaml(tmp_path, "running", 2))
    assert rc == 0, err
    held = devices_of(info)
    plugin.stop()
    d.stop(signal.SIGKILL)

    d2 = daemon_factory("--admission-wait", "30", "--metrics-address", "127.0.0.1:0")
    # The running pod keeps its devices although its plugin is not there.
    pods = json.loads(run_cli("pods", "-o", "json", root=root, check=True).stdout)["pods"]
    assert [devices_of(p) for p in pods] == [held]
    # An admission issued now waits for the plugin instead of failing at once ...
    result: dict[str, object] = {}

    def admit_later() -> None:
        result["out"] = admit(root, pod_yaml(tmp_path, "waiting", 2))

    t = threading.Thread(target=admit_later)
    t.start()
    d2.eventually(lambda: admissions_waiting(root) == 1, "the admission to wait for the plugin")
    assert t.is_alive() and "out" not in result
    # ... and succeeds once the plugin is back.
    plugins("--devices", "4", "--numa-nodes", "2")
    t.join(40)
    rc, info, err = result["out"]  # type: ignore[misc]
    assert rc == 0, err
    assert sorted(devices_of(info)) == sorted({"dev-0", "dev-1", "dev-2", "dev-3"} - set(held))
    assert d2.proc.poll() is None


def test_admission_gives_up_after_the_wait(root: Path, tmp_path: Path, daemon_factory, plugins) -> None:  # type: ignore[no-untyped-def]
    d = daemon_factory()
    plugin = plugins("--devices", "2", "--numa-nodes", "1")
    plugin.wait_registered()
    plugin.stop()
    d.stop()
    daemon_factory("--admission-wait", "0.5")
    rc, _, err = admit(root, pod_yaml(tmp_path, "late", 1))
    assert rc == 1 and "did not register within 0.5 s" in err


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ("kind: Pod\nmetadata: {namespace: x}\nspec: {containers: [{name: a}]}\n", "metadata.name: required"),
        ("kind: Pod\nmetadata: {name: x}\nspec: {containers: []}\n", "at least one container"),
        ("kind: Service\nmetadata: {name: x}\n", "kind is 'Service'"),
        (
            "kind: Pod\nmetadata: {name: x}\n"
            "spec: {containers: [{name: a, resources: {limits: {example.com/dev: 0.5}}}]}\n",
            "whole number",
        ),
        ("kind: Pod\nmetadata: {name: x\nspec: [\n", "not valid YAML"),
        ("- 1\n- 2\n", "expected a Pod object"),
        (
            "kind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: a, resources: {limits: {cpu: lots}}}]}\n",
            "'lots' is not a quantity",
        ),
    ],
)
def test_malformed_manifests_are_one_clear_error(root: Path, tmp_path: Path, manifest: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(manifest)
    proc = run_cli("admit", "-f", str(path), root=root)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert message in proc.stderr and proc.stderr.count("\n") == 1


def test_unknown_resources_are_refused_and_the_daemon_stays_up(root: Path, tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d = daemon_factory()
    rc, _, err = admit(root, pod_yaml(tmp_path, "x", 1, resource="example.com/nothing"))
    assert rc == 1
    assert "Node didn't have enough resource: example.com/nothing, requested: 1, used: 0, capacity: 0" in err
    missing = run_cli("admit", "-f", str(tmp_path / "missing.yaml"), root=root)
    assert missing.returncode == 2 and "No such file" in missing.stderr
    assert run_cli("remove", "no-such-uid", root=root).returncode == 1
    assert run_cli("status", root=root).returncode == 0
    assert d.proc.poll() is None


def test_remove_releases_and_readmission_keeps(root: Path, tmp_path: Path, daemon_factory, plugins) -> None:  # type: ignore[no-untyped-def]
    daemon_factory()
    plugins("--devices", "2", "--numa-nodes", "1").wait_registered()
    path = pod_yaml(tmp_path, "web", 2, uid="11111111-2222-3333-4444-555555555555")
    rc, first, err = admit(root, path)
    assert rc == 0, err
    rc, again, err = admit(root, path)  # the same pod again: it keeps what it has
    assert rc == 0 and devices_of(again) == devices_of(first)
    removed = run_cli("remove", "default/web", "-o", "json", root=root, check=True)
    assert json.loads(removed.stdout)["state"] == "removed"
    records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root).stdout.splitlines()]
    released = [r["event"] for r in records if r["type"] == "DevicesReleased"]
    assert (
        released
        and released[-1]["reason"] == "pod removed"
        and sorted(released[-1]["device_ids"]) == ["dev-0", "dev-1"]
    )
    rc, _, err = admit(root, pod_yaml(tmp_path, "next", 2))
    assert rc == 0, err


def test_new_registration_replaces_the_endpoint_without_losing_devices(
    root: Path, tmp_path: Path, daemon_factory, plugins
) -> None:  # type: ignore[no-untyped-def]
    daemon_factory()
    first = plugins("--devices", "4", "--numa-nodes", "1", "--socket-name", "first.sock")
    first.wait_registered()
    rc, info, err = admit(root, pod_yaml(tmp_path, "held", 2))
    assert rc == 0, err
    before = len(run_cli("log", "-o", "json", root=root).stdout.splitlines())
    second = plugins("--devices", "4", "--numa-nodes", "1", "--socket-name", "second.sock")
    eventually(
        lambda: any(
            r["type"] == "PluginRegistered" and r["event"]["endpoint"] == "second.sock"
            for r in log_records(root, before + 1)
        ),
        "the second registration",
        timeout=20,
    )
    state = json.loads(run_cli("state", "-o", "json", root=root, check=True).stdout)
    assert state["devices"]["plugins"][RESOURCE]["endpoint"] == "second.sock"
    held = sorted(i for i, d in state["devices"]["devices"][RESOURCE].items() if d["holder"])
    assert held == sorted(devices_of(info))
    # An admission waits for the new endpoint's first list to be recorded, then records its
    # intent: what the list changed stands before that intent.
    rc, info2, err = admit(root, pod_yaml(tmp_path, "next", 2))
    assert rc == 0, err
    kinds = [r["type"] for r in log_records(root, before + 1)]
    # The same devices from the new endpoint: no device event, nothing released.
    assert kinds[: kinds.index("PodAdmissionStarted")] == ["PluginRegistered"], kinds
    assert not {"DevicesAdded", "DevicesRemoved", "DeviceHealthChanged", "DevicesReleased"} & set(kinds), kinds
    assert second.allocate_calls() == [devices_of(info2)] and first.allocate_calls() == [devices_of(info)]


def test_a_resource_is_dropped_after_the_grace_period(root: Path, tmp_path: Path, daemon_factory, plugins) -> None:  # type: ignore[no-untyped-def]
    daemon_factory("--plugin-grace", "0.5", "--admission-wait", "0.2")
    plugin = plugins("--devices", "2", "--numa-nodes", "1")
    plugin.wait_registered()
    rc, info, err = admit(root, pod_yaml(tmp_path, "keeps", 1))
    assert rc == 0, err
    plugin.stop()

    def dropped() -> list[str]:
        types = [r["type"] for r in log_records(root)]
        return types if "ResourceDropped" in types else []

    types = eventually(dropped, "the resource to be dropped", timeout=10)
    assert types[-2:] == ["PluginDisconnected", "ResourceDropped"]
    state = json.loads(run_cli("state", "-o", "json", root=root, check=True).stdout)
    assert RESOURCE not in state["devices"]["plugins"]
    # The running pod still holds its device; the free one is gone.
    assert list(state["devices"]["devices"][RESOURCE]) == devices_of(info)
    # A pod still holds a device of it: the kubelet's device manager refuses it as unregistered.
    rc, _, err = admit(root, pod_yaml(tmp_path, "late", 1))
    assert rc == 1 and "cannot allocate unregistered device example.com/dev" in err, err
    # Once none is held, it is no device plugin's: the predicate finds capacity 0.
    run_cli("remove", "default/keeps", root=root, check=True)
    rc, _, err = admit(root, pod_yaml(tmp_path, "later", 1))
    assert rc == 1 and "Node didn't have enough resource: example.com/dev, requested: 1, used: 0, capacity: 0" in err, (
        err
    )


def test_a_plugin_with_thousands_of_devices_is_recorded_in_bounded_records(
    root: Path, tmp_path: Path, daemon_factory, plugins
) -> None:  # type: ignore[no-untyped-def]
    # Over INLINE_DEVICES: the daemon takes and compares the list in a worker thread; over
    # DEVICES_PER_RECORD: the devices go in records of at most that many.
    from eventsrc.core.devices.holds import DEVICES_PER_RECORD
    from eventsrc.node.device_manager import INLINE_DEVICES

    n = max(INLINE_DEVICES, 2 * DEVICES_PER_RECORD) + 201
    daemon_factory()
    plugin = plugins("--devices", str(n), "--numa-nodes", "2")

    def added() -> list[dict[str, Any]]:
        return [r for r in log_records(root) if r["type"] == "DevicesAdded"]

    eventually(lambda: sum(len(r["event"]["devices"]) for r in added()) == n, f"{n} devices recorded", timeout=60)
    records = added()
    assert len(records) == -(-n // DEVICES_PER_RECORD)
    assert all(len(r["event"]["devices"]) <= DEVICES_PER_RECORD for r in records)
    ids = [d["id"] for r in records for d in r["event"]["devices"]]
    assert len(set(ids)) == n
    rc, info, err = admit(root, pod_yaml(tmp_path, "one", 1))
    assert rc == 0, err
    assert devices_of(info) == ["dev-0"] and plugin.allocate_calls() == [["dev-0"]]
