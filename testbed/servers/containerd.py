"""A real containerd (2.1, with NRI) of one's own: fetched once into a cache, started under a
directory, stopped and cleaned up by pid. ``eventsrc bench nri`` runs it (with a grpclib CRI
client), and so do the tests (``tests/support/containerd.py``, with their own grpcio one).

Nothing is installed system-wide. ``fetch()`` downloads Debian unstable's ``containerd`` and
Debian 12's ``runc`` and ``busybox-static`` through the private apt configuration of
``debian_packages`` (its own source list, lists and cache directories under the cache directory)
and unpacks them with ``dpkg -x``; it also builds a tiny OCI image (busybox-static and its applet
links) to import, so no image is ever pulled. The cache (env ``EVENTSRC_CONTAINERD_CACHE``, default
``/var/cache/eventsrc-tests/containerd``) is reused once complete, without network.

``ContainerdProcess(base)`` is one containerd with its own config, root, state, sockets and NRI
socket under ``base``: ``launch()`` starts it and returns at once (whoever calls CRI waits for
it to answer, then ``import_image()`` when CRI lacks ``IMAGE``); ``cleanup()`` stops it and
removes what it left, once its caller has removed its pods through CRI. Pods are host-network
(no CNI) with a cgroup parent under a prefix of this process's own (``cgroup_prefix``,
``/<label>-<pid>-<n>``), so cleanup knows which cgroup directories are its own. Only processes
it started are ever signalled, by pid: containerd itself, and as a last resort the shims
started by that containerd (found by its socket address) and processes left in its own pod
cgroups.
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
import tarfile
import tempfile
import time
from pathlib import Path

from testbed.servers.debian_packages import FetchError, Packages, Progress, Unpacked, one_line, run
from testbed.servers.server_process import Server, all_pids

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

CRI_NAMESPACE = "k8s.io"
CFS_PERIOD = 100_000
SOCKET_MAX = 100  # sun_path holds 107 bytes; keep a margin
#: where containerd 2.x's shims listen, whatever its state dir: sha256(address/namespace/id)
SHIM_SOCKETS = Path("/run/containerd/s")
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


class Fetched(Unpacked):
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


def _check_and_build_image(fetched: Fetched, progress: Progress) -> None:
    for binary in (fetched.containerd, fetched.runc, fetched.ctr):
        if not binary.exists():
            raise FetchError(f"{binary.relative_to(fetched.cache)} is not in the packages")
        run([binary, "--version"], f"{binary.name} --version", timeout=30)
    progress(f"building {IMAGE} from busybox-static {fetched.versions['busybox-static']}")
    build_image(fetched.busybox, fetched.image_tar)


ARCHIVE = Packages(
    Fetched,
    PACKAGES,
    version=STAMP_VERSION,
    default_cache=DEFAULT_CACHE,
    cache_env=CACHE_ENV,
    finish=_check_and_build_image,
)
#: fetch(cache=None, progress=...): the unpacked runtime in the cache, reused when complete (no
#: network), else fetched; FetchError (one line) when apt, dpkg or the fetched binaries fail.
fetch = ARCHIVE.fetch
#: fetch() once per process and cache directory: the result, or the one-line error.
fetched_or_error = ARCHIVE.fetched_or_error


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
# CRI, as the kubelet fills it


def kubelet_cpu(millis: int, period: int = CFS_PERIOD) -> tuple[int, int, int]:
    """(shares, quota, period) the kubelet derives from a CPU limit in millicores."""
    return max(2, millis * 1024 // 1000), max(1000, millis * period // 1000), period


# ---------------------------------------------------------------------------------------------
# containerd


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


_numbers = itertools.count()


class ContainerdProcess(Server):
    """One containerd (a ``Server`` named ``containerd``): its own config, root, state, sockets,
    NRI socket and log under ``base``, its pods' cgroups under ``cgroup_prefix``. What talks CRI
    to it is the caller's."""

    def __init__(
        self,
        base: Path,
        *,
        cdi_dir: Path | None = None,
        fetched: Fetched | None = None,
        log_level: str = "info",
        label: str = "eventsrc-test",
    ) -> None:
        self.base = Path(base)
        super().__init__("containerd", self.base / "containerd.log")
        self.cdi_dir = Path(cdi_dir) if cdi_dir is not None else self.base / "cdi"
        self._fetched = fetched
        self.log_level = log_level
        self.token = f"{label}-{os.getpid()}-{next(_numbers)}"
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

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def fetched(self) -> Fetched:
        if self._fetched is None:
            self._fetched = ARCHIVE.fetched()
        return self._fetched

    def pod_cgroup_parent(self, uid: str) -> str:
        """The cgroup parent to give pod ``uid``: under this containerd's prefix, so that
        ``cleanup`` knows it for its own."""
        return f"{self.cgroup_prefix}/pod{uid}"

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

    def launch(self) -> None:
        """Start containerd and return at once: its CRI answers a moment later (about 0.15 s).
        Raises FetchError when the runtime cannot be fetched."""
        self.base.mkdir(parents=True, exist_ok=True)
        self._write_config()
        # Its own session (spawn): a Ctrl-C in the terminal must not stop it before the pods are removed.
        self.spawn([self.fetched.containerd, "--config", self.config_path], env=self.env())

    def ctr(self, *args: str, timeout: float = 120) -> str:
        """Run ``ctr`` against this containerd in the k8s.io namespace; its stdout."""
        cmd = [str(self.fetched.ctr), "--address", self.address, "--namespace", CRI_NAMESPACE, *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=self.env(), timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} exited {proc.returncode}: {one_line(proc.stderr)}")
        return proc.stdout

    def import_image(self) -> None:
        """Import ``IMAGE`` (the cache's image tar) into this containerd; CRI sees it a moment later."""
        self.ctr("images", "import", "--platform", f"linux/{_go_arch()}", str(self.fetched.image_tar))

    def terminate(self, timeout: float = 20) -> None:
        """Stop containerd (SIGTERM, then SIGKILL after ``timeout``), leaving its pods' shims."""
        self.end(signal.SIGTERM, timeout)

    def cleanup(self, shim_wait: float = 10) -> list[str]:
        """Once its pods are removed through CRI: stop containerd, then make sure no shim of it
        is left (killed after ``shim_wait`` seconds: 0 when the pods could not be removed) and
        remove the pod cgroup directories it made. Idempotent; what could not be cleaned up
        cleanly, after cleaning up all it could, as lines."""
        self.terminate()
        problems = self._reap_shims(shim_wait) + self._remove_cgroups() + self._unmount()
        if self._own_socket_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        return problems

    def _unmount(self) -> list[str]:
        """Unmount what its pods left mounted under ``base`` (their rootfs and shm), deepest
        first: pods that could not be removed through CRI (containerd stopped first) keep them."""
        base = str(self.base.resolve())
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4].encode().decode("unicode_escape") for line in f]
        problems = []
        for point in sorted((p for p in points if p.startswith(base + "/")), key=len, reverse=True):
            proc = subprocess.run(["umount", point], capture_output=True, text=True)
            problems.append(f"{point} was left mounted" + ("; unmounted" if proc.returncode == 0 else ""))
        return problems

    # -- hygiene --------------------------------------------------------------------------------

    def shim_pids(self) -> list[int]:
        """Shims started by this containerd (their command line names its socket)."""
        return sorted(self._shims())

    def _shims(self) -> dict[int, list[bytes]]:
        """Shims started by this containerd: pid -> command line."""
        shims = {}
        for pid in all_pids():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and self.address.encode() in argv:
                shims[pid] = argv
        return shims

    def _reap_shims(self, timeout: float = 10) -> list[str]:
        deadline = time.monotonic() + timeout
        while (shims := self._shims()) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not shims:
            return []
        for pid, argv in shims.items():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            # The socket it listened on, under containerd's own directory whatever its state dir.
            flags = dict(zip(argv[1::2], argv[2::2], strict=False))
            name = os.path.join(self.address, flags.get(b"-namespace", b"").decode(), flags.get(b"-id", b"").decode())
            (SHIM_SOCKETS / hashlib.sha256(name.encode()).hexdigest()).unlink(missing_ok=True)
        return [f"shims {sorted(shims)} outlived their pods; killed"]

    def cgroup_dirs(self) -> list[Path]:
        """Its pods' cgroup directories under every mounted hierarchy, deepest first."""
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
        # Processes in a pod cgroup under its prefix: they belong to its pods.
        deadline = time.monotonic() + timeout
        while (pids := self._cgroup_pids(d)) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
