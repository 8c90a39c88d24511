"""The Kubernetes manifests under deploy/kubernetes and the image recipe deploy/image/Containerfile.

Every document of every YAML file is validated strictly (unknown fields are errors) against
the Kubernetes 1.37 API schemas that the ``kubernetes-validate`` package bundles (its 1.37.0
release carries schemas up to v1.37.0). Then the DaemonSet's security properties are checked
one by one: docs/kubelet-node.md explains each.
"""

from __future__ import annotations

import copy
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.servers.podman import pod_run

kubernetes_validate = pytest.importorskip("kubernetes_validate")

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((REPO / "deploy" / "kubernetes").glob("*.yaml"))
CONTAINERFILE = REPO / "deploy" / "image" / "Containerfile"
KUBERNETES = "1.37.0"
KUBELET = "/var/lib/kubelet"


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in MANIFESTS:
        for n, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                out.append((f"{path.name}#{n}", doc))
    return out


def validate(doc: dict[str, Any]) -> str:
    version: str = kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    return version


def daemonset() -> dict[str, Any]:
    (ds,) = [doc for _, doc in documents() if doc["kind"] == "DaemonSet"]
    return ds


def test_there_are_manifests() -> None:
    assert [p.name for p in MANIFESTS] == ["daemonset.yaml"]
    assert sorted(doc["kind"] for _, doc in documents()) == ["DaemonSet", "Namespace", "ServiceAccount"]


@pytest.mark.parametrize(("name", "doc"), documents(), ids=[name for name, _ in documents()])
def test_every_document_is_valid_for_kubernetes_1_37(name: str, doc: dict[str, Any]) -> None:
    assert validate(doc) == "1.37"


def test_a_misspelt_or_misplaced_field_fails_validation() -> None:
    ds = daemonset()
    misspelt = copy.deepcopy(ds)
    container = misspelt["spec"]["template"]["spec"]["containers"][0]
    container["securityContext"]["readOnlyRootFileSystem"] = container["securityContext"].pop("readOnlyRootFilesystem")
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFileSystem"):
        validate(misspelt)
    wrong_type = copy.deepcopy(ds)
    wrong_type["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["readOnly"] = True  # not a hostPath field
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(wrong_type)


def test_the_pod_is_not_privileged_and_keeps_no_capability() -> None:
    pod = daemonset()["spec"]["template"]["spec"]
    assert not pod.get("hostPID") and not pod.get("hostIPC") and not pod.get("hostNetwork")
    assert pod["automountServiceAccountToken"] is False
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"operator": "Exists"} in pod["tolerations"]  # every taint
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"]["drop"] == ["ALL"]
        # none added: uid 0 reads and connects to what it owns (docs/kubelet-node.md)
        assert sc["capabilities"].get("add", []) == []
        assert set(c["resources"]) == {"requests", "limits"}
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and "memory" in c["resources"]["limits"]


def host_mounts() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(host path, volume mount, container) for every hostPath volume mounted."""
    pod = daemonset()["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    return [
        (volumes[m["name"]]["hostPath"]["path"], m, c)
        for c in pod["containers"]
        for m in c["volumeMounts"]
        if "hostPath" in volumes[m["name"]]
    ]


def test_the_kubelet_is_mounted_read_only_and_only_eventsrcs_state_is_writable() -> None:
    mounts = {path: m for path, m, _ in host_mounts()}
    assert set(mounts) == {KUBELET, "/var/run/nri", "/var/lib/eventsrc"}
    kubelet = mounts[KUBELET]
    assert kubelet["mountPath"] == KUBELET  # the paths the kubelet's files name stay true
    assert kubelet["readOnly"] is True and kubelet["recursiveReadOnly"] == "Enabled"
    assert mounts["/var/run/nri"]["readOnly"] is True
    writable = [path for path, m in mounts.items() if not m.get("readOnly")]
    assert writable == ["/var/lib/eventsrc"]
    assert not [p for p in writable if p == KUBELET or p.startswith(KUBELET + "/")]


def test_the_arguments_name_the_mounted_paths_and_the_probes_the_metrics_port() -> None:
    (c,) = daemonset()["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    flag = {a: args[i + 1] for i, a in enumerate(args) if a.startswith("--") and i + 1 < len(args)}
    assert args[0] == "serve" and flag["--beside-kubelet"] == KUBELET and flag["--root-dir"] == "/var/lib/eventsrc"
    assert flag["--nri-socket"].startswith("/var/run/nri/") and flag["--nri-mode"] == "observe"
    port = int(flag["--metrics-address"].rsplit(":", 1)[1])
    assert c["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


def test_the_serve_flags_other_than_beside_kubelet_exist() -> None:
    proc = subprocess.run([sys.executable, "-m", "eventsrc", "serve", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (c,) = daemonset()["spec"]["template"]["spec"]["containers"]
    for flag in (a for a in c["args"] if a.startswith("--") and a != "--beside-kubelet"):
        assert re.search(rf"\[{re.escape(flag)}[ \]]", proc.stdout), flag


def test_the_image_recipe_builds_the_wheel_and_installs_it() -> None:
    text = CONTAINERFILE.read_text()
    # any Debian 12 base: Debian's image by default, the test's from Debian's archive (test_image.py)
    assert re.search(r"^ARG BASE=docker\.io/library/debian:bookworm-slim$", text, re.M)
    stages = re.findall(r"^FROM (\S+)", text, re.M)
    assert stages == ["${BASE}", "python", "python"]
    assert re.search(r"apt-get install -y --no-install-recommends python3 python3-venv", text)
    assert re.search(r"^RUN pip wheel --no-deps \. -w /dist$", text, re.M)
    assert re.search(r"^RUN pip install --no-input /tmp/dist/eventsrc-\*\.whl", text, re.M)
    assert "DEBIAN_FRONTEND=noninteractive" in text
    assert re.search(r'^ENTRYPOINT \["eventsrc"\]$', text, re.M)
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M)
    assert copied == ["pyproject.toml README.md", "eventsrc"]  # what the wheel is built from


@pytest.mark.skipif(
    importlib.util.find_spec("setuptools") is None,
    reason="building without isolation needs setuptools in this environment",
)
def test_the_wheel_the_recipe_installs_builds(tmp_path: Path) -> None:
    # the recipe's wheel stage, on a copy of what it copies (nothing is written to the repo)
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "eventsrc", src / "eventsrc", ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", ".", "-w", str(tmp_path)],
        cwd=src,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("eventsrc-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "eventsrc/cli/main.py" in names and "eventsrc/gen/podresources/v1/api_pb2.py" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "eventsrc = eventsrc.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_pod_flags_say_what_the_manifest_says() -> None:
    host = {"/var/lib/kubelet": Path("/k"), "/var/run/nri": Path("/n"), "/var/lib/eventsrc": Path("/s")}
    pod = pod_run(daemonset(), host, Path("/p/seccomp.json"))
    flags = pod.flags
    assert {"--pid=private", "--ipc=private", "--network=none", "--user=0:0"} <= set(flags)
    assert {"--security-opt=seccomp=/p/seccomp.json", "--security-opt=no-new-privileges", "--cap-drop=all"} <= set(
        flags
    )
    assert {"--read-only", "--read-only-tmpfs=false", "--cpu-shares=51", "--cpus=1", f"--memory={1 << 30}b"} <= set(
        flags
    )
    assert not [f for f in flags if f.startswith(("--cap-add", "--privileged"))]
    mounts = [f for f in flags if f.startswith("--mount=")]
    assert mounts == [
        "--mount=type=bind,source=/k,destination=/var/lib/kubelet,ro",
        "--mount=type=bind,source=/n,destination=/var/run/nri,ro",
        "--mount=type=bind,source=/s,destination=/var/lib/eventsrc",
        f"--mount=type=tmpfs,destination=/tmp,tmpfs-size={16 << 20}",
    ]
    assert pod.args[0] == "serve" and pod.grace_seconds == 60


def test_a_manifest_field_the_flags_do_not_translate_is_an_error() -> None:
    ds = daemonset()
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["procMount"] = "Unmasked"
    with pytest.raises(ValueError, match=re.escape("['procMount']")):
        pod_run(ds, {}, Path("/p"))
