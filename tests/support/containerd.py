"""A real containerd (2.1, with NRI) for the tests: fetched once, started per test, cleaned up.

Nothing is installed system-wide. ``fetch()`` downloads Debian unstable's ``containerd`` and
Debian 12's ``runc`` and ``busybox-static`` through a private apt configuration (its own source
list, lists and cache directories under the cache directory) and unpacks them with ``dpkg -x``;
it also builds a tiny OCI image (busybox-static and its applet links) to import, so no image is
ever pulled. The cache (env ``EVENTSRC_CONTAINERD_CACHE``, default
``/var/cache/eventsrc-tests/containerd``) is reused once complete, without network::

    python -m tests.support.containerd fetch [--cache DIR]

``Containerd(base)`` runs one containerd with its own config, root, state, sockets and NRI
socket under ``base``; its CRI methods (``run_pod``, ``create_container``, ``exec_sync``,
``cpuset``...) go through grpcio with the project's vendored CRI proto::

    rt = Containerd(tmp_path, cdi_dir=tmp_path / "cdi")
    rt.start()
    pod = rt.run_pod("web", uid="1234")
    cid = rt.create_container(pod, "app", cpu_millis=500)
    rt.start_container(cid)
    rt.cpus_allowed(cid)            # "0-1"
    rt.stop()                       # removes its pods through CRI, stops containerd, rmdirs cgroups

Pods are host-network (no CNI) with a cgroup parent under a prefix of this harness
(``/eventsrc-test-<pid>-<n>``), so cleanup knows which cgroup directories are its own. Only
processes this harness started are ever signalled, by pid: containerd itself, and as a last
resort the shims started by that containerd (found by its socket address) and processes left in
its own pod cgroups.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tests.support import debian_archive, processes
from tests.support.debian_archive import FetchError

DEFAULT_CACHE = Path("/var/cache/eventsrc-tests/containerd")
CACHE_ENV = "EVENTSRC_CONTAINERD_CACHE"
# (package, suite): containerd 2.1 with NRI from unstable; runc and busybox from the machine's own Debian 12.
PACKAGES = (("containerd", "unstable"), ("runc", "bookworm"), ("busybox-static", "bookworm"))
STAMP_VERSION = 1

IMAGE = "localhost/eventsrc-test/busybox:1"
# A pause-like process: sleeps until SIGTERM, then exits 0 (PID 1 gets the signal because it traps it).
PAUSE = ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait; done"]
IMAGE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# What the image links to busybox when ``busybox --list-full`` cannot be run on the host.
FALLBACK_APPLETS = (
    "sh",
    "cat",
    "sleep",
    "grep",
    "ls",
    "env",
    "test",
    "[",
    "echo",
    "true",
    "false",
    "ps",
    "id",
    "mkdir",
    "rm",
    "head",
    "tail",
    "wc",
    "nproc",
    "taskset",
    "printf",
    "sed",
    "awk",
    "cut",
    "tr",
    "sort",
    "uniq",
    "find",
    "xargs",
    "kill",
    "pidof",
    "date",
    "stat",
    "readlink",
    "touch",
    "chmod",
    "ln",
    "cp",
    "mv",
)

HARNESS_LABEL = "eventsrc-test-harness"
CRI_NAMESPACE = "k8s.io"
CFS_PERIOD = 100_000
SOCKET_MAX = 100  # sun_path holds 107 bytes; keep a margin
_GO_ARCH = {
    "amd64": "amd64",
    "arm64": "arm64",
    "i386": "386",
    "ppc64el": "ppc64le",
    "s390x": "s390x",
    "riscv64": "riscv64",
    "armhf": "arm",
    "armel": "arm",
}


# ---------------------------------------------------------------------------------------------
# Fetch


class Fetched(debian_archive.Unpacked):
    """A complete cache: the unpacked packages under ``root`` and the image tar."""

    @property
    def image_tar(self) -> Path:
        return self.cache / "image.tar"

    @property
    def bin_dirs(self) -> list[Path]:
        return [self.root / "usr/bin", self.root / "usr/sbin", self.root / "bin"]

    @property
    def containerd(self) -> Path:
        return self.root / "usr/bin/containerd"

    @property
    def ctr(self) -> Path:
        return self.root / "usr/bin/ctr"

    @property
    def runc(self) -> Path:
        return self.root / "usr/sbin/runc"

    @property
    def busybox(self) -> Path:
        return self.root / "bin/busybox"

    def required(self) -> list[Path]:
        return [
            self.containerd,
            self.root / "usr/bin/containerd-shim-runc-v2",
            self.ctr,
            self.runc,
            self.busybox,
            self.image_tar,
        ]


def _check_and_build_image(fetched: Fetched, progress: Callable[[str], None]) -> None:
    for binary in (fetched.containerd, fetched.runc, fetched.ctr):
        if not binary.exists():
            raise FetchError(f"{binary.relative_to(fetched.cache)} is not in the packages")
        debian_archive.run([binary, "--version"], f"{binary.name} --version", timeout=30)
    progress(f"building {IMAGE} from busybox-static {fetched.versions['busybox-static']}")
    build_image(fetched.busybox, fetched.image_tar)


ARCHIVE = debian_archive.Packages(
    Fetched,
    PACKAGES,
    version=STAMP_VERSION,
    default_cache=DEFAULT_CACHE,
    cache_env=CACHE_ENV,
    finish=_check_and_build_image,
)
cache_dir = ARCHIVE.cache_dir
fetch = ARCHIVE.fetch  # fetch(cache=None, progress=...): the unpacked runtime; FetchError (one line)
fetched_or_error = ARCHIVE.fetched_or_error  # fetch() once per process: the result or the one-line error


# ---------------------------------------------------------------------------------------------
# Availability


def cgroup_mounts() -> list[tuple[Path, frozenset[str]]]:
    """Mounted cgroup hierarchies: (mount point, super options such as ``cpuset`` or
    ``name=systemd``; empty for cgroup2)."""
    mounts: list[tuple[Path, frozenset[str]]] = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) < 5 or len(rfields) < 3 or rfields[0] not in ("cgroup", "cgroup2"):
                continue
            point = Path(fields[4].encode().decode("unicode_escape"))
            options = frozenset(rfields[2].split(",")) if rfields[0] == "cgroup" else frozenset()
            mounts.append((point, options))
    return mounts


def cpuset_mount() -> Path | None:
    """Where the cgroup v1 cpuset controller is mounted, if it is."""
    return next((point for point, options in cgroup_mounts() if "cpuset" in options), None)


def why_unavailable(cache: Path | None = None) -> str | None:
    """One line saying why a real containerd cannot be run here, or None."""
    if os.geteuid() != 0:
        return f"a real containerd needs root (euid {os.geteuid()})"
    if cpuset_mount() is None:
        return "no cgroup v1 cpuset controller mounted"
    outcome = fetched_or_error(cache)
    if isinstance(outcome, str):
        return f"fetch failed: {outcome}"
    return None


# ---------------------------------------------------------------------------------------------
# The image


def _tar_info(name: str, kind: bytes, *, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, link
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info


def _applets(busybox: Path) -> list[str]:
    """Paths (relative, e.g. ``bin/sh``) to link to busybox: its own list when it runs here."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        proc = subprocess.run([busybox, "--list-full"], capture_output=True, text=True, timeout=10)
        if proc.returncode == 0 and proc.stdout.strip():
            return sorted({p.strip().lstrip("/") for p in proc.stdout.split() if p.strip()} - {"bin/busybox"})
    return [f"bin/{name}" for name in FALLBACK_APPLETS]


def _layer(busybox: Path) -> bytes:
    buf = io.BytesIO()
    files = {
        "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\n",
        "etc/group": b"root:x:0:\n",
    }
    applets = _applets(busybox)
    dirs = {"bin", "dev", "etc", "proc", "root", "run", "sys", "tmp", "var", "usr"}
    dirs |= {str(Path(p).parent) for p in applets}
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(dirs):
            tar.addfile(_tar_info(d + "/", tarfile.DIRTYPE, mode=0o1777 if d == "tmp" else 0o755))
        data = busybox.read_bytes()
        tar.addfile(_tar_info("bin/busybox", tarfile.REGTYPE, mode=0o755, size=len(data)), io.BytesIO(data))
        for name, content in sorted(files.items()):
            tar.addfile(_tar_info(name, tarfile.REGTYPE, mode=0o644, size=len(content)), io.BytesIO(content))
        for applet in applets:
            tar.addfile(_tar_info(applet, tarfile.SYMTYPE, mode=0o777, link="/bin/busybox"))
    return buf.getvalue()


def _go_arch() -> str:
    try:
        deb_arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True).stdout.strip()
    except OSError:
        deb_arch = ""
    return _GO_ARCH.get(deb_arch, {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine))


def build_image(busybox: Path, out: Path, name: str = IMAGE) -> None:
    """Write an OCI image-layout tar to ``out``: one uncompressed layer (busybox and its applet
    links), ``PAUSE`` as its command, named ``name`` for ``ctr images import``."""
    arch = _go_arch()
    layer = _layer(busybox)
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": arch,
            "os": "linux",
            "config": {"Env": [f"PATH={IMAGE_PATH}"], "Cmd": PAUSE, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        },
        sort_keys=True,
    ).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": len(config),
            },
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": len(layer)}
            ],
        },
        sort_keys=True,
    ).encode()
    manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest,
                    "size": len(manifest),
                    "platform": {"architecture": arch, "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rpartition(":")[2],
                    },
                }
            ],
        },
        sort_keys=True,
    ).encode()
    entries = [
        ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
        ("index.json", index),
        *(
            (f"blobs/sha256/{d.removeprefix('sha256:')}", blob)
            for d, blob in ((layer_digest, layer), (config_digest, config), (manifest_digest, manifest))
        ),
    ]
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs/", "blobs/sha256/"):
            tar.addfile(_tar_info(d, tarfile.DIRTYPE, mode=0o755))
        for path, blob in entries:
            tar.addfile(_tar_info(path, tarfile.REGTYPE, mode=0o644, size=len(blob)), io.BytesIO(blob))
    tmp.replace(out)


# ---------------------------------------------------------------------------------------------
# CRI client


def _cri() -> Any:
    from tests.support.grpcio_stubs import stubs

    return stubs("cri/v1/api.proto")


def kubelet_cpu(millis: int, period: int = CFS_PERIOD) -> tuple[int, int, int]:
    """(shares, quota, period) the kubelet derives from a CPU limit in millicores."""
    return max(2, millis * 1024 // 1000), max(1000, millis * period // 1000), period


class CriClient:
    """Synchronous CRI calls (grpcio) to one containerd. Every pod and container it makes
    carries ``HARNESS_LABEL=<token>``, which ``remove_all`` and the listings select on;
    gRPC errors (``grpc.RpcError``) reach the caller."""

    def __init__(self, address: str, token: str, cgroup_prefix: str, pod_configs: dict[str, Any]) -> None:
        import grpc

        self.address = address
        self.token = token
        self.cgroup_prefix = cgroup_prefix
        self._pod_configs = pod_configs  # pod id -> PodSandboxConfig (kept by the harness across restarts)
        # Short reconnect backoff: a channel made before containerd listens (start, restart)
        # would otherwise wait grpc's default first backoff of 1 s.
        self.channel = grpc.insecure_channel(
            f"unix://{address}",
            options=[
                ("grpc.initial_reconnect_backoff_ms", 20),
                ("grpc.min_reconnect_backoff_ms", 20),
                ("grpc.max_reconnect_backoff_ms", 200),
            ],
        )
        cri = _cri()
        self.pb = cri.pb2
        self.runtime = cri.RuntimeServiceStub(self.channel)
        self.images = cri.ImageServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    @property
    def _labels(self) -> dict[str, str]:
        return {HARNESS_LABEL: self.token}

    def version(self, timeout: float = 5) -> Any:
        return self.runtime.Version(self.pb.VersionRequest(version="v1"), timeout=timeout)

    def image_present(self, image: str = IMAGE) -> bool:
        return self.images.ImageStatus(
            self.pb.ImageStatusRequest(image=self.pb.ImageSpec(image=image)), timeout=10
        ).HasField("image")

    def pod_cgroup_parent(self, uid: str) -> str:
        return f"{self.cgroup_prefix}/pod{uid}"

    def run_pod(
        self, name: str, uid: str, namespace: str = "default", annotations: dict[str, str] | None = None
    ) -> str:
        """A running host-network pod (no hostname, no CNI) under this harness's cgroup prefix."""
        pb = self.pb
        config = pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace=namespace, attempt=0),
            labels=self._labels,
            annotations=annotations or {},
            linux=pb.LinuxPodSandboxConfig(
                cgroup_parent=self.pod_cgroup_parent(uid),
                security_context=pb.LinuxSandboxSecurityContext(namespace_options=pb.NamespaceOption(network=pb.NODE)),
            ),
        )
        pod_id: str = self.runtime.RunPodSandbox(pb.RunPodSandboxRequest(config=config), timeout=60).pod_sandbox_id
        self._pod_configs[pod_id] = config
        return pod_id

    def create_container(
        self,
        pod_id: str,
        name: str,
        *,
        cpu_millis: int | None = None,
        memory_limit: int | None = None,
        annotations: dict[str, str] | None = None,
        command: Sequence[str] | None = None,
        envs: dict[str, str | bytes] | None = None,
        image: str = IMAGE,
    ) -> str:
        """A created container; ``cpu_millis`` is a CPU limit set as the kubelet does (shares, quota,
        period), ``memory_limit`` bytes. ``command`` defaults to a sleep loop that exits on SIGTERM."""
        pb = self.pb
        resources = pb.LinuxContainerResources()
        if cpu_millis is not None:
            resources.cpu_shares, resources.cpu_quota, resources.cpu_period = kubelet_cpu(cpu_millis)
        if memory_limit is not None:
            resources.memory_limit_in_bytes = memory_limit
        config = pb.ContainerConfig(
            metadata=pb.ContainerMetadata(name=name, attempt=0),
            image=pb.ImageSpec(image=image),
            command=list(command) if command is not None else PAUSE,
            # CRI 0.36's KeyValue.value is bytes (a string on the wire all the same).
            envs=[pb.KeyValue(key=k, value=v.encode() if isinstance(v, str) else v) for k, v in (envs or {}).items()],
            labels=self._labels,
            annotations=annotations or {},
            linux=pb.LinuxContainerConfig(
                resources=resources,
                security_context=pb.LinuxContainerSecurityContext(
                    namespace_options=pb.NamespaceOption(network=pb.NODE)
                ),
            ),
        )
        request = pb.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=config, sandbox_config=self._pod_configs.get(pod_id)
        )
        container_id: str = self.runtime.CreateContainer(request, timeout=60).container_id
        return container_id

    def start_container(self, cid: str) -> None:
        self.runtime.StartContainer(self.pb.StartContainerRequest(container_id=cid), timeout=60)

    def stop_container(self, cid: str, timeout: int = 2) -> None:
        self.runtime.StopContainer(
            self.pb.StopContainerRequest(container_id=cid, timeout=timeout), timeout=timeout + 60
        )

    def remove_container(self, cid: str) -> None:
        self.runtime.RemoveContainer(self.pb.RemoveContainerRequest(container_id=cid), timeout=60)

    def stop_pod(self, pod_id: str) -> None:
        self.runtime.StopPodSandbox(self.pb.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)

    def remove_pod(self, pod_id: str) -> None:
        self.runtime.RemovePodSandbox(self.pb.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
        self._pod_configs.pop(pod_id, None)

    def exec_sync(self, cid: str, cmd: Sequence[str], timeout: int = 5) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of ``cmd`` run in the container."""
        got = self.runtime.ExecSync(
            self.pb.ExecSyncRequest(container_id=cid, cmd=list(cmd), timeout=timeout), timeout=timeout + 30
        )
        return got.exit_code, got.stdout.decode(errors="replace"), got.stderr.decode(errors="replace")

    def container_status(self, cid: str, verbose: bool = True) -> Any:
        """The ContainerStatusResponse (``.status``, and ``.info["info"]`` JSON when verbose)."""
        return self.runtime.ContainerStatus(
            self.pb.ContainerStatusRequest(container_id=cid, verbose=verbose), timeout=30
        )

    def runtime_spec(self, cid: str) -> dict[str, Any]:
        """The container's OCI runtime spec, as containerd reports it."""
        spec: dict[str, Any] = json.loads(self.container_status(cid).info["info"])["runtimeSpec"]
        return spec

    def cgroups_path(self, cid: str) -> str:
        """The container's cgroup path (cgroupfs: a path under each controller's mount)."""
        path: str = self.runtime_spec(cid)["linux"]["cgroupsPath"]
        return path

    def cpuset(self, cid: str) -> str:
        """``cpuset.cpus`` of the container's cgroup, read on the host."""
        mount = cpuset_mount() or Path("/sys/fs/cgroup/cpuset")
        return (mount / self.cgroups_path(cid).lstrip("/") / "cpuset.cpus").read_text().strip()

    def cpus_allowed(self, cid: str) -> str:
        """``Cpus_allowed_list`` of a process in the container, as it sees it."""
        rc, out, err = self.exec_sync(cid, ["grep", "Cpus_allowed_list", "/proc/self/status"])
        if rc != 0:
            raise AssertionError(f"grep Cpus_allowed_list in {cid} exited {rc}: {err.strip()}")
        return out.partition(":")[2].strip()

    def list_pods(self) -> list[Any]:
        filt = self.pb.PodSandboxFilter(label_selector=self._labels)
        return list(self.runtime.ListPodSandbox(self.pb.ListPodSandboxRequest(filter=filt), timeout=30).items)

    def list_containers(self) -> list[Any]:
        filt = self.pb.ContainerFilter(label_selector=self._labels)
        return list(self.runtime.ListContainers(self.pb.ListContainersRequest(filter=filt), timeout=30).containers)

    def remove_all(self) -> None:
        """Stop and remove every pod (with its containers) and container this harness made."""
        for pod in self.list_pods():
            self.stop_pod(pod.id)
            self.remove_pod(pod.id)
        for container in self.list_containers():
            with contextlib.suppress(Exception):
                self.stop_container(container.id, timeout=0)
            self.remove_container(container.id)


# ---------------------------------------------------------------------------------------------
# containerd


CONFIG = """\
version = 3
root = {root}
state = {state}
temp = {temp}

[grpc]
  address = {grpc}

[ttrpc]
  address = {ttrpc}

[debug]
  level = {log_level}

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = {opt}

  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = {verifiers}

  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = {nri}
    plugin_path = {nri_plugins}
    plugin_config_path = {nri_conf}

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = {image}

  [plugins.'io.containerd.cri.v1.runtime']
    enable_cdi = true
    cdi_spec_dirs = [{cdi}]
    restrict_oom_score_adj = true
    disable_apparmor = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = {runc}
          Root = {runc_root}
          SystemdCgroup = false
"""


def _toml(value: str | Path) -> str:
    return json.dumps(str(value))  # a TOML basic string is a JSON string for these paths


_harness_numbers = itertools.count()


class Containerd(processes.Server):
    """One containerd (its own config, root, state, sockets, NRI socket and log under ``base``)
    and a CRI client to it. The CRI methods of ``CriClient`` are callable on it directly."""

    def __init__(
        self, base: Path, *, cdi_dir: Path | None = None, fetched: Fetched | None = None, log_level: str = "info"
    ) -> None:
        self.base = Path(base)
        super().__init__("containerd", self.base / "containerd.log")
        self.cdi_dir = Path(cdi_dir) if cdi_dir is not None else self.base / "cdi"
        self._fetched = fetched
        self.log_level = log_level
        self.token = f"eventsrc-test-{os.getpid()}-{next(_harness_numbers)}"
        self.cgroup_prefix = f"/{self.token}"
        self.config_path = self.base / "containerd.toml"
        # Sockets need short paths: under base when short enough, else in a short directory of /tmp.
        if len(str(self.base / "containerd.sock.ttrpc")) <= SOCKET_MAX:
            self.socket_dir = self.base
            self._own_socket_dir = False
        else:
            self.socket_dir = Path(tempfile.mkdtemp(prefix="ctrd-", dir="/tmp"))
            self._own_socket_dir = True
        self.address = str(self.socket_dir / "containerd.sock")
        self.nri_socket = self.socket_dir / "nri.sock"
        self._pod_configs: dict[str, Any] = {}
        self._cri: CriClient | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def fetched(self) -> Fetched:
        if self._fetched is None:
            self._fetched = ARCHIVE.fetched()
        return self._fetched

    @property
    def cri(self) -> CriClient:
        if self._cri is None:
            raise RuntimeError("containerd is not started")
        return self._cri

    def __getattr__(self, name: str) -> Any:
        # The CRI methods (run_pod, create_container, ...) on the harness itself.
        if name.startswith("_") or not hasattr(CriClient, name):
            raise AttributeError(name)
        return getattr(self.cri, name)

    def _write_config(self) -> None:
        f = self.fetched
        dirs = {
            name: self.base / name for name in ("root", "state", "tmp", "opt", "verifiers", "nri-plugins", "nri-conf")
        }
        for d in [*dirs.values(), self.cdi_dir]:
            d.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(
            CONFIG.format(
                root=_toml(dirs["root"]),
                state=_toml(dirs["state"]),
                temp=_toml(dirs["tmp"]),
                grpc=_toml(self.address),
                ttrpc=_toml(self.address + ".ttrpc"),
                log_level=_toml(self.log_level),
                opt=_toml(dirs["opt"]),
                verifiers=_toml(dirs["verifiers"]),
                nri=_toml(self.nri_socket),
                nri_plugins=_toml(dirs["nri-plugins"]),
                nri_conf=_toml(dirs["nri-conf"]),
                image=_toml(IMAGE),
                cdi=_toml(self.cdi_dir),
                runc=_toml(f.runc),
                runc_root=_toml(dirs["state"] / "runc"),
            )
        )

    def env(self) -> dict[str, str]:
        path = ":".join([*(str(d) for d in self.fetched.bin_dirs), os.environ.get("PATH", "/usr/bin:/bin")])
        return {**os.environ, "PATH": path}

    def start(self, timeout: float = 30) -> None:
        """Start containerd, wait until CRI answers, and import the image if its root lacks it."""
        if self.running():
            return
        self.base.mkdir(parents=True, exist_ok=True)
        self._write_config()
        # Its own session (spawn): a Ctrl-C in the terminal must not stop it before the pods are removed.
        self.spawn([self.fetched.containerd, "--config", self.config_path], env=self.env())
        self._cri = CriClient(self.address, self.token, self.cgroup_prefix, self._pod_configs)
        try:
            self._wait(self._answers, "containerd's CRI to answer Version", timeout)
            if not self._image_present():
                self._import_image()
                self._wait(self._image_present, f"CRI to see {IMAGE}", timeout)
        except BaseException:
            self._terminate()
            raise

    def _wait(self, condition: Callable[[], Any], what: str, timeout: float) -> Any:
        from tests.support.eventually import eventually

        return eventually(condition, what, timeout=timeout, interval=0.02, stop=self.exited, context=self.log_tail)

    def _answers(self) -> bool:
        import grpc

        try:
            self.cri.version(timeout=1)
        except grpc.RpcError:
            return False
        return True

    def _image_present(self) -> bool:
        return self.cri.image_present(IMAGE)

    def ctr(self, *args: str, timeout: float = 120) -> str:
        """Run ``ctr`` against this containerd in the k8s.io namespace; its stdout."""
        cmd = [str(self.fetched.ctr), "--address", self.address, "--namespace", CRI_NAMESPACE, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=self.env(), timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} exited {proc.returncode}: {debian_archive.one_line(proc.stderr)}")
        return proc.stdout

    def _import_image(self) -> None:
        self.ctr("images", "import", "--platform", f"linux/{_go_arch()}", str(self.fetched.image_tar))

    def restart(self, timeout: float = 30) -> None:
        """Stop containerd without touching its pods (their shims live on), and start it again."""
        self._terminate()
        self.start(timeout=timeout)

    def stop(self) -> None:
        """Remove this harness's pods and containers through CRI, stop containerd, then make sure
        no shim of it is left and remove the pod cgroup directories it made. Idempotent; raises
        at the end if something could not be cleaned up (after cleaning up all it could)."""
        problems: list[str] = []
        if self.running():
            try:
                self.cri.remove_all()
            except Exception as e:  # still stop containerd and clean up
                problems.append(f"removing pods through CRI: {e!r}")
        self._terminate()
        problems += self._reap_shims()
        problems += self._remove_cgroups()
        if self._own_socket_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        if problems:
            raise RuntimeError("containerd harness cleanup: " + "; ".join(problems))

    def _terminate(self, timeout: float = 20) -> None:
        if self._cri is not None:
            self._cri.close()
            self._cri = None
        self.end(signal.SIGTERM, timeout)

    # -- hygiene --------------------------------------------------------------------------------

    def shim_pids(self) -> list[int]:
        """Shims started by this containerd (their command line names its socket)."""
        pids = []
        for pid in processes.all_pids():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and self.address.encode() in argv:
                pids.append(pid)
        return pids

    def _reap_shims(self, timeout: float = 10) -> list[str]:
        deadline = time.monotonic() + timeout
        while (pids := self.shim_pids()) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not pids:
            return []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return [f"shims {pids} outlived their pods; killed"]

    def cgroup_dirs(self) -> list[Path]:
        """This harness's cgroup directories under every mounted hierarchy, deepest first."""
        found: list[Path] = []
        for point in sorted({point for point, _ in cgroup_mounts()}):
            top = point / self.cgroup_prefix.lstrip("/")
            if top.is_dir():
                found += [Path(d) for d, _, _ in os.walk(top)]
        return sorted(found, key=lambda p: len(p.parts), reverse=True)

    def _remove_cgroups(self, timeout: float = 10) -> list[str]:
        problems: list[str] = []
        for d in self.cgroup_dirs():
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno != errno.EBUSY:
                    problems.append(f"rmdir {d}: {e.strerror}")
                    continue
                problems.append(f"processes were left in {d}; killed")
                self._empty_cgroup(d, timeout)
                try:
                    d.rmdir()
                except OSError as e2:
                    problems.append(f"rmdir {d}: {e2.strerror}")
        return problems

    @staticmethod
    def _cgroup_pids(d: Path) -> list[int]:
        try:
            return [int(p) for p in (d / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def _empty_cgroup(self, d: Path, timeout: float) -> None:
        # Processes in a pod cgroup of this harness: they belong to pods it made.
        deadline = time.monotonic() + timeout
        while (pids := self._cgroup_pids(d)) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# python -m tests.support.containerd fetch


def main(argv: Iterable[str] | None = None) -> int:
    return ARCHIVE.command("python -m tests.support.containerd", argv)


if __name__ == "__main__":
    sys.exit(main())
