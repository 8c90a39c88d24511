"""The DRA manager with the sample DRA driver: claims prepared once, unprepared with their
last pod, pending while the driver is away, refused when they should be."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from eventsrc.gen.podresources.v1 import api_pb2 as pr
from tests.conftest import run_cli
from tests.support.eventually import eventually
from tests.support.grpcio_stubs import pod_resources_client, unix_target

DRIVER = "gpu.example.com"


def claim_yaml(tmp: Path, name: str, uid: str, pods: list[tuple[str, str]], device: str = "gpu-0") -> Path:
    reserved = "".join(f"  - resource: pods\n    name: {n}\n    uid: {u}\n" for n, u in pods)
    path = tmp / f"claim-{name}.yaml"
    path.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\n"
        f"metadata:\n  name: {name}\n  namespace: default\n  uid: {uid}\n"
        "spec:\n  devices:\n    requests:\n    - name: gpu\n      exactly: {deviceClassName: gpu.example.com}\n"
        f"status:\n  allocation:\n    devices:\n      results:\n      - request: gpu\n        driver: {DRIVER}\n"
        f"        pool: node-a\n        device: {device}\n  reservedFor:\n{reserved}"
    )
    return path


def pod_yaml(tmp: Path, name: str, uid: str, claim: str) -> Path:
    path = tmp / f"pod-{name}.yaml"
    path.write_text(
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, uid: {uid}}}\nspec:\n"
        f"  resourceClaims:\n  - name: gpu\n    resourceClaimName: {claim}\n"
        "  containers:\n  - name: main\n    resources:\n      claims:\n      - name: gpu\n"
    )
    return path


class Driver:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / "plugins" / DRIVER
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eventsrc", "--root-dir", str(self.root), "sample-dra-driver", "--driver", DRIVER],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def prepared(self) -> set[str]:
        try:
            return set(json.loads((self.dir / "state.json").read_text())["prepared"])
        except FileNotFoundError:
            return set()

    def control(self, **settings: object) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "control.json").write_text(json.dumps(settings))


@pytest.fixture
def driver(root: Path):  # type: ignore[no-untyped-def]
    d = Driver(root)
    yield d
    d.stop()


def registered(root: Path) -> bool:
    return any(
        json.loads(line)["type"] == "PluginRegistered"
        for line in run_cli("log", "-o", "json", root=root).stdout.splitlines()
    )


def claims_view(root: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(run_cli("claims", "-o", "json", root=root, check=True).stdout)["claims"]  # type: ignore[no-any-return]


def admit(root: Path, *paths: Path) -> subprocess.CompletedProcess[str]:
    args = [a for p in paths for a in ("-f", str(p))]
    return run_cli("admit", *args, "-o", "json", root=root)


def test_single_and_shared_claims(root: Path, tmp_path: Path, daemon_factory, driver) -> None:  # type: ignore[no-untyped-def]
    daemon_factory()
    driver.start()
    eventually(lambda: registered(root), "the driver's registration")
    solo = claim_yaml(tmp_path, "solo", "c-solo", [("a", "u-a")])
    proc = admit(root, pod_yaml(tmp_path, "a", "u-a", "solo"), solo)
    assert proc.returncode == 0, proc.stderr
    cdi = json.loads(proc.stdout)["containers"][0]["claim_cdi_devices"]
    assert cdi and all(c.startswith(f"{DRIVER}/") for c in cdi)
    assert driver.prepared() == {"c-solo"}
    with grpc.insecure_channel(unix_target(root / "pod-resources" / "kubelet.sock")) as ch:
        listed = pod_resources_client(ch).List(pr.ListPodResourcesRequest())
    dyn = listed.pod_resources[0].containers[0].dynamic_resources[0]
    assert (dyn.claim_name, dyn.claim_namespace) == ("solo", "default")
    assert [d.name for r in dyn.claim_resources for d in r.cdi_devices] == cdi
    assert dyn.claim_resources[0].driver_name == DRIVER

    shared = claim_yaml(tmp_path, "shared", "c-shared", [("b", "u-b"), ("c", "u-c")], device="gpu-1")
    assert admit(root, pod_yaml(tmp_path, "b", "u-b", "shared"), shared).returncode == 0
    assert admit(root, pod_yaml(tmp_path, "c", "u-c", "shared"), shared).returncode == 0
    records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root).stdout.splitlines()]
    assert [r["event"]["claim"]["uid"] for r in records if r["type"] == "ClaimPrepareStarted"] == ["c-solo", "c-shared"]
    assert claims_view(root)["c-shared"]["pods"] == ["u-b", "u-c"]
    # Removing one of the two pods keeps the shared claim; the last one unprepares it.
    run_cli("remove", "u-b", root=root, check=True)
    assert driver.prepared() == {"c-solo", "c-shared"}
    run_cli("remove", "u-c", root=root, check=True)
    eventually(lambda: driver.prepared() == {"c-solo"}, "the driver to hold c-solo alone")
    eventually(lambda: "c-shared" not in claims_view(root), "c-shared to leave the claims view")
    run_cli("remove", "u-a", root=root, check=True)
    eventually(lambda: driver.prepared() == set(), "the driver to hold no claim")


def test_driver_down_during_unprepare_keeps_the_claim_pending(
    root: Path, tmp_path: Path, daemon_factory, driver
) -> None:  # type: ignore[no-untyped-def]
    daemon_factory()
    driver.start()
    eventually(lambda: registered(root), "the driver's registration")
    assert (
        admit(
            root, pod_yaml(tmp_path, "a", "u-a", "solo"), claim_yaml(tmp_path, "solo", "c-solo", [("a", "u-a")])
        ).returncode
        == 0
    )
    driver.control(down=True)
    run_cli("remove", "u-a", root=root, check=True)
    eventually(
        lambda: claims_view(root).get("c-solo", {}).get("state") == "unprepare-failed", "c-solo's unprepare to fail"
    )
    assert driver.prepared() == {"c-solo"}
    table = run_cli("claims", root=root, check=True).stdout
    assert "unprepare-failed" in table and "UNAVAILABLE" in table
    driver.control(down=False)
    eventually(lambda: driver.prepared() == set(), "the driver to hold no claim", timeout=40)
    eventually(lambda: "c-solo" not in claims_view(root), "c-solo to leave the claims view")


def test_bad_claims_are_clear_errors_and_nothing_is_lost(root: Path, tmp_path: Path, daemon_factory, driver) -> None:  # type: ignore[no-untyped-def]
    d = daemon_factory()
    driver.start()
    eventually(lambda: registered(root), "the driver's registration")
    pod = pod_yaml(tmp_path, "a", "u-a", "solo")
    # The pod is not in the claim's reservedFor.
    proc = admit(root, pod, claim_yaml(tmp_path, "solo", "c-solo", [("other", "u-other")]))
    assert proc.returncode == 1 and "is not in the reservedFor of claim default/solo" in proc.stderr
    # The pod references a claim it did not bring.
    proc = admit(root, pod)
    assert proc.returncode == 1 and "it did not bring" in proc.stderr
    # A claim that is not allocated.
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: solo, namespace: default, uid: x}\n"
    )
    proc = admit(root, pod, bad)
    assert proc.returncode == 2 and "is not allocated" in proc.stderr and "Traceback" not in proc.stderr
    # The driver answers with a per-claim error, or leaves the claim out: refused, nothing held.
    good = claim_yaml(tmp_path, "solo", "c-solo", [("a", "u-a")])
    driver.control(fail_prepare=["c-solo"])
    proc = admit(root, pod, good)
    assert proc.returncode == 1 and "failed for claim default/solo" in proc.stderr
    driver.control(omit=["c-solo"])
    proc = admit(root, pod, good)
    assert proc.returncode == 1 and "did not answer for claim default/solo" in proc.stderr
    state = json.loads(run_cli("state", "-o", "json", root=root, check=True).stdout)
    assert state["pods"]["pods"] == {}
    assert driver.prepared() == set()
    # What the failed prepares may have left is unprepared once the driver answers again.
    driver.control()
    eventually(lambda: claims_view(root) == {}, "an empty claims view", timeout=40)
    # And then it works.
    proc = admit(root, pod, good)
    assert proc.returncode == 0, proc.stderr
    assert driver.prepared() == {"c-solo"}
    assert d.proc.poll() is None


def test_an_older_driver_is_spoken_to_in_v1beta1(root: Path, tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    daemon_factory()
    old = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eventsrc",
            "--root-dir",
            str(root),
            "sample-dra-driver",
            "--driver",
            DRIVER,
            "--versions",
            "v1beta1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        eventually(lambda: registered(root), "the driver's registration")
        records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root).stdout.splitlines()]
        assert [r["event"]["api_version"] for r in records if r["type"] == "PluginRegistered"] == ["v1beta1.DRAPlugin"]
        proc = admit(
            root, pod_yaml(tmp_path, "a", "u-a", "solo"), claim_yaml(tmp_path, "solo", "c-solo", [("a", "u-a")])
        )
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["containers"][0]["claim_cdi_devices"]
    finally:
        old.terminate()
        old.wait(10)
