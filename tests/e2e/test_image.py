"""deploy/image built and run as deploy/kubernetes/daemonset.yaml runs its pod (issue 36 item 7).

Debian 12's podman (``testbed/servers/podman.py``: fetched into a cache, nothing installed) imports
a Debian 12 base made from Debian's archive with mmdebstrap, builds the Containerfile on it (its
RUN steps fetch from Debian and PyPI; no registry is asked for an image) and runs the image with
the pod's namespaces, user, seccomp profile, capabilities, read-only root, resources and
mounts, all read from the manifest. Beside it: the stand-in kubelet and a real containerd with
NRI, whose sockets reach the pod only through the manifest's mounts. The test then asks the
daemon inside the pod, with ``podman exec``, what it recorded of a device the kubelet gave.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from eventsrc.layout import Layout
from testbed.servers.podman import ARCHIVE, BASE_IMAGE, Podman, pod_run, why_unavailable
from tests.conftest import run_cli
from tests.e2e.test_beside_kubelet import tree
from tests.support.containerd import Containerd
from tests.support.eventually import eventually
from tests.support.kubelet import Container, Device, StandInKubelet

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "deploy" / "image" / "Containerfile"
MANIFEST = REPO / "deploy" / "kubernetes" / "daemonset.yaml"
IMAGE = "localhost/eventsrc:test"
RESOURCE = "example.com/dev"
STATE = "/var/lib/eventsrc"  # --root-dir in the manifest
MEM = 64 << 20


def daemonset() -> dict[str, Any]:
    (ds,) = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] == "DaemonSet"]
    return dict(ds)


def build_ca() -> tuple[dict[str, str], list[str]]:
    """The CA bundle pip trusts here, mounted for the build and named with PIP_CERT (a proxy
    that re-signs TLS needs it; elsewhere it is the public CAs)."""
    host = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt"
    if not Path(host).is_file():
        return {}, []
    return {"PIP_CERT": "/run/build-ca.crt"}, [f"{host}:/run/build-ca.crt:ro"]


@pytest.fixture
def podman(short_tmp: Path, containerd_unavailable: str | None) -> Iterator[Podman]:
    """A podman of its own that can run a container here; everything it made removed afterwards."""
    if containerd_unavailable is not None:
        pytest.skip(containerd_unavailable)
    if (why := why_unavailable()) is not None:
        pytest.skip(why)
    pm = Podman(short_tmp / "podman", ARCHIVE.fetched())
    try:
        if (why := pm.probe()) is not None:
            pytest.skip(f"rootful podman cannot run a container here: {why}")
        yield pm
    finally:
        problems = pm.cleanup()
        assert not problems, problems


def in_pod(pm: Podman, name: str, *cmd: str) -> str:
    proc = pm.exec(name, *cmd)
    assert proc.returncode == 0, f"{cmd} in the pod exited {proc.returncode}: {proc.stderr.strip()}"
    return proc.stdout


def audit_device(pm: Podman, name: str, device: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(
        in_pod(pm, name, "eventsrc", "audit", "device", RESOURCE, device, "-o", "json", "--root-dir", STATE)
    )
    return out


def holds(pm: Podman, name: str, device: str) -> list[tuple[str, str, str, bool]]:
    """Who held ``device``; none while the log has not the device yet (what eventsrc observes
    is written within ``observationsWait``: docs/adr/0042)."""
    proc = pm.exec(name, "eventsrc", "audit", "device", RESOURCE, device, "-o", "json", "--root-dir", STATE)
    if proc.returncode != 0 and f"no device {device} of {RESOURCE} in the log" in proc.stderr:
        return []
    assert proc.returncode == 0, f"audit device in the pod exited {proc.returncode}: {proc.stderr.strip()}"
    return [
        (f"{h['pod']['namespace']}/{h['pod']['name']}", h["container"], h["decided_by"], h["still_held"])
        for h in json.loads(proc.stdout)["holders"]
    ]


def mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4].encode().decode("unicode_escape") for line in f]


@pytest.mark.slow  # about 40 s with the cache filled: podman builds the image from Debian and PyPI
def test_the_image_runs_as_the_daemonset_runs_its_pod_and_audits_a_device_from_inside(
    podman: Podman, short_tmp: Path, tmp_path: Path
) -> None:
    started = time.monotonic()
    ca_args, ca_volumes = build_ca()
    podman.build(
        REPO,
        CONTAINERFILE,
        IMAGE,
        build_args={"BASE": BASE_IMAGE, **ca_args},
        volumes=ca_volumes,
        log=tmp_path / "build.log",
    )
    built = time.monotonic()

    kubelet = StandInKubelet(short_tmp / "kubelet")
    nri, state = short_tmp / "nri", short_tmp / "state"
    nri.mkdir()
    state.mkdir()  # DirectoryOrCreate
    rt = Containerd(short_tmp / "ctrd", cdi_dir=short_tmp / "cdi")
    rt.nri_socket = nri / "nri.sock"  # alone in the directory the pod mounts, as /var/run/nri is
    name = f"eventsrc-{podman.token}"
    try:
        rt.start()
        kubelet.set_allocatable(devices=[Device(RESOURCE, f"d-{i}", (0,)) for i in (1, 2)], cpus=[0, 1])
        kubelet.write_checkpoints()
        before = tree(kubelet.root)
        # podman has no recursive read-only bind: nothing is mounted below the kubelet's root
        # here, so the read-only mount is read-only all the way down as recursiveReadOnly asks
        assert not [p for p in mount_points() if p.startswith(str(kubelet.root.resolve()) + "/")]
        ds = daemonset()
        pod = pod_run(
            ds,
            {"/var/lib/kubelet": kubelet.root, "/var/run/nri": nri, STATE: state},
            podman.fetched.seccomp_profile,
        )
        assert pod.args[pod.args.index("--root-dir") + 1] == STATE
        podman.run_detached(name, IMAGE, pod.flags, pod.args)

        def pod_exited() -> str | None:
            return None if podman.running(name) else f"the pod exited:\n{podman.logs(name)}"

        def ready() -> bool:
            try:
                return bool(json.loads(Layout(state).status.read_text()).get("ready"))
            except (OSError, ValueError):
                return False

        eventually(
            ready, "the daemon in the pod to be ready", timeout=60, stop=pod_exited, context=lambda: podman.logs(name)
        )
        in_pod(podman, name, "eventsrc", "status", "--root-dir", STATE)  # exit 0: running and ready
        port = int(pod.args[pod.args.index("--metrics-address") + 1].rpartition(":")[2])
        for path in ("/healthz", "/readyz"):  # the probes' paths, on the pod's own loopback
            got = in_pod(
                podman, name, "python3", "-c",
                f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}{path}').read().decode())",
            )  # fmt: skip
            assert got.strip() == "ok", (path, got)

        # what the pod runs with, as the daemon (pid 1 of the pod) sees it
        status = dict(
            line.split(":\t", 1) for line in in_pod(podman, name, "cat", "/proc/1/status").splitlines() if ":\t" in line
        )
        assert {k: status[k].strip() for k in ("CapPrm", "CapEff", "CapBnd", "CapAmb")} == dict.fromkeys(
            ("CapPrm", "CapEff", "CapBnd", "CapAmb"), "0000000000000000"
        )
        assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2"  # no-new-privs; filtered
        assert status["Uid"].split()[:2] == ["0", "0"] and status["Gid"].split()[:2] == ["0", "0"]
        for path in ("/opt/eventsrc/probe", "/var/lib/kubelet/probe", "/var/run/nri/probe"):
            refused = podman.exec(name, "touch", path)
            assert refused.returncode != 0 and "Read-only file system" in refused.stderr, (path, refused.stderr)
        in_pod(podman, name, "touch", f"{STATE}/probe", "/tmp/probe")
        (state / "probe").unlink()

        eventually(
            lambda: "RuntimeConnected" in in_pod(podman, name, "eventsrc", "log", "-o", "json", "--root-dir", STATE),
            "the daemon in the pod to connect to containerd's NRI socket",
            timeout=60,
            interval=0.5,
            stop=pod_exited,
        )
        kubelet.set_pod(
            "team-a", "trainer", [Container("main", devices=[Device(RESOURCE, "d-1", (0,))], cpus=[1])], uid="uid-a"
        )
        sandbox = rt.run_pod("trainer", "uid-a", namespace="team-a")
        cid = rt.create_container(sandbox, "main", cpu_millis=1000, memory_limit=MEM)
        rt.start_container(cid)
        want = [("team-a/trainer", "main", "kubelet", True)]
        eventually(
            lambda: holds(podman, name, "d-1") == want, "the hold, audited in the pod", interval=0.5, stop=pod_exited
        )
        answer = audit_device(podman, name, "d-1")
        assert answer["listed"] and answer["health"] == "Healthy"
        (holder,) = answer["holders"]
        assert holder["pod"]["uid"] == "uid-a" and [c["id"] for c in holder["container_ids"]] == [cid]
        table = in_pod(podman, name, "eventsrc", "audit", "device", RESOURCE, "d-1", "--root-dir", STATE)
        assert "team-a/trainer" in table and cid in table

        # the kubelet's SIGTERM and grace period: the daemon records that it stopped and exits 0
        assert podman.stop(name, pod.grace_seconds) == 0
        stopped = run_cli("log", "-o", "json", root=state, check=True).stdout
        assert json.loads(stopped.splitlines()[-1])["type"] == "DaemonStopped"
        assert tree(kubelet.root) == before
    finally:
        try:
            rt.stop()
        finally:
            kubelet.close()
    print(f"build {built - started:.1f} s, the pod and the audit {time.monotonic() - built:.1f} s")
