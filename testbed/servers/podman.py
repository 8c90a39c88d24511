"""Debian 12's podman of one's own, to build ``deploy/image`` and run it as the DaemonSet runs its
pod: fetched once into a cache, its configuration, storage and state under a directory of the
test's, everything it made removed afterwards.

Nothing is installed system-wide. ``ARCHIVE.fetch()`` downloads podman, conmon, runc, the
containers-common configuration (the default seccomp profile) and the libraries podman needs
that a Debian 12 machine may lack, through ``debian_packages``' private apt configuration, and
unpacks them with ``dpkg -x``; it then makes the image's base from Debian's archive with
mmdebstrap (fetched the same way): a Debian 12 ``minbase`` root file system without manuals,
documentation and locales, as Debian's own ``bookworm-slim`` image is, written as a tarball into
the cache. No registry is ever asked for an image. The cache (env ``EVENTSRC_PODMAN_CACHE``,
default ``/var/cache/eventsrc-tests/podman``) is reused once complete, without network::

    python -m testbed.servers.podman fetch [--cache DIR]

``Podman(base)`` is podman with its own containers.conf, storage.conf, signature policy (a
``HOME`` of its own), storage, run directory and runc state under ``base``; ``cleanup()`` removes
its containers (the runtime signals their processes; as a last resort each is killed by the pid
podman recorded for it), its images, its mounts and its cgroups. Two things it cannot keep under
``base``: podman always keeps a blob-info cache in ``/var/lib/containers/cache`` as root (removed
afterwards when this podman made it and it holds nothing else), and ``/etc/containers`` is
never read (``CONTAINERS_CONF`` and friends name the files).

What this machine needs from podman, found by running it (docs/kubelet-node.md):

* runc, not crun: Debian 12's crun 1.8.1 refuses a hybrid cgroup hierarchy ("cgroups in hybrid
  mode not supported, drop all controllers from cgroupv2") and this kernel keeps ``hugetlb`` on
  its cgroup2 mount beside the v1 controllers; runc 1.1.5 runs.
* explicit rlimits: podman gives a container ``RLIMIT_NOFILE`` and ``RLIMIT_NPROC`` of 1048576
  unless told otherwise, and raising a hard limit needs ``CAP_SYS_RESOURCE``, which this
  machine's root does not have (``CapEff`` lacks bit 24), so runc fails with "error setting
  rlimit type 7: operation not permitted". The pod gets this process's own limits instead, as a
  container under containerd 2 gets containerd's; podman lowers its own ``RLIMIT_NPROC`` to 32768
  and a container cannot get more than the conmon that starts it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.servers.containerd import cgroup_mounts
from testbed.servers.debian_packages import MIRROR, Packages, Progress, Unpacked, one_line, run

DEFAULT_CACHE = Path("/var/cache/eventsrc-tests/podman")
CACHE_ENV = "EVENTSRC_PODMAN_CACHE"
SUITE = "bookworm"
PACKAGES = tuple(
    (name, SUITE)
    for name in (
        "podman",
        "conmon",
        "runc",
        "golang-github-containers-common",  # the default seccomp profile
        "golang-github-containers-image",  # the default signature policy
        "mmdebstrap",
        "patchelf",
        # the libraries of podman, conmon and runc, unpacked beside them (their RPATH)
        "libgpgme11",
        "libsubid4",
        "libassuan0",
        "libgpg-error0",
        "libdevmapper1.02.1",
        "libseccomp2",
        "libglib2.0-0",
    )
)
STAMP_VERSION = 1
BASE_TAR = "debian-bookworm-slim.tar"
#: the tag the cache's base tarball is imported as; deploy/image/Containerfile's BASE
BASE_IMAGE = "localhost/eventsrc-base/debian:bookworm-slim"
#: what Debian's bookworm-slim image leaves out, as dpkg path filters
SLIM = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
)
#: podman's own RLIMIT_NPROC (it sets it at its start): a container gets no more
PODMAN_NPROC = 32768
LABEL = "eventsrc-test-harness"
#: where a rootful podman keeps its blob-info cache, whatever its configuration says
BLOB_INFO_CACHE = Path("/var/lib/containers/cache/blob-info-cache-v1.boltdb")


class PodmanError(RuntimeError):
    """A podman command failed; ``str()`` is one line."""


# ---------------------------------------------------------------------------------------------
# Fetch


class Fetched(Unpacked):
    """A complete cache: podman and what it runs under ``root``, and the base tarball."""

    @property
    def podman(self) -> Path:
        return self.root / "usr/bin/podman"

    @property
    def conmon(self) -> Path:
        return self.root / "usr/bin/conmon"

    @property
    def runc(self) -> Path:
        return self.root / "usr/sbin/runc"

    @property
    def mmdebstrap(self) -> Path:
        return self.root / "usr/bin/mmdebstrap"

    @property
    def seccomp_profile(self) -> Path:
        return self.root / "usr/share/containers/seccomp.json"

    @property
    def policy(self) -> Path:
        return self.root / "etc/containers/policy.json"

    @property
    def libs(self) -> Path:
        return self.root / "usr/lib" / _multiarch()

    @property
    def base_tar(self) -> Path:
        return self.cache / BASE_TAR

    def required(self) -> list[Path]:
        return [self.podman, self.conmon, self.runc, self.seccomp_profile, self.policy, self.base_tar]

    def env(self) -> dict[str, str]:
        """podman's environment: its helpers (conmon, runc) first on PATH."""
        path = f"{self.root / 'usr/bin'}:{self.root / 'usr/sbin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        return {**os.environ, "PATH": path}


def _multiarch() -> str:
    try:
        out = subprocess.run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except OSError:
        pass
    return f"{os.uname().machine}-linux-gnu"


def make_base(fetched: Fetched, out: Path, progress: Progress = lambda _: None) -> None:
    """Write a Debian 12 minbase root file system, slimmed as Debian's ``bookworm-slim`` image is,
    to the tarball ``out`` with the cache's mmdebstrap (run as root: it chroots)."""
    partial = out.with_name("partial-" + out.name)  # mmdebstrap picks the format by the extension
    partial.unlink(missing_ok=True)
    progress(f"mmdebstrap {SUITE} (minbase, slim) from {MIRROR} into {out}")
    run(
        [
            "perl",
            fetched.mmdebstrap,
            "--quiet",
            "--mode=root",
            "--variant=minbase",
            # merged /usr with its symlinks and usr-is-merged, without usrmerge (and its perl)
            f"--hook-dir={fetched.root / 'usr/share/mmdebstrap/hooks/merged-usr'}",
            *(f"--dpkgopt={rule}" for rule in SLIM),
            SUITE,
            partial,
            MIRROR,
        ],
        "mmdebstrap",
        # its tar filter (mmtarfilter) is beside it; not podman's libraries: it runs apt and dpkg
        env={**os.environ, "PATH": f"{fetched.root / 'usr/bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"},
        timeout=900,
    )
    partial.replace(out)


def _check_and_make_base(fetched: Fetched, progress: Progress) -> None:
    # podman, conmon and runc find their libraries by their RPATH, not LD_LIBRARY_PATH: conmon
    # runs podman again to record a container's exit, with an environment of podman's making
    # (without that variable)
    for binary in (fetched.podman, fetched.conmon, fetched.runc):
        rpath = f"$ORIGIN/../lib/{fetched.libs.name}"
        run([fetched.root / "usr/bin/patchelf", "--force-rpath", "--set-rpath", rpath, binary], "patchelf")
    for binary in (fetched.podman, fetched.conmon, fetched.runc):
        run([binary, "--version"], f"{binary.name} --version", env=fetched.env(), timeout=30)
    make_base(fetched, fetched.base_tar, progress)


ARCHIVE = Packages(
    Fetched,
    PACKAGES,
    version=STAMP_VERSION,
    default_cache=DEFAULT_CACHE,
    cache_env=CACHE_ENV,
    finish=_check_and_make_base,
)


def why_unavailable(cache: Path | None = None) -> str | None:
    """One line saying why podman cannot be fetched or run here, or None."""
    if os.geteuid() != 0:
        return f"rootful podman needs root (euid {os.geteuid()})"
    outcome = ARCHIVE.fetched_or_error(cache)
    if isinstance(outcome, str):
        return f"fetch failed: {outcome}"
    return None


# ---------------------------------------------------------------------------------------------
# podman


_numbers = itertools.count()


def _toml(value: str | Path) -> str:
    return json.dumps(str(value))  # a TOML basic string is a JSON string for these paths


class Podman:
    """One podman configuration and storage under ``base``; every container it runs carries
    ``LABEL=<token>`` and its cgroups are under ``/<token>``."""

    def __init__(self, base: Path, fetched: Fetched, *, label: str = "eventsrc-image-test") -> None:
        self.base = Path(base)
        self.fetched = fetched
        self.token = f"{label}-{os.getpid()}-{next(_numbers)}"
        self.cgroup_parent = f"/{self.token}"
        self.conf = self.base / "containers.conf"
        self.storage_conf = self.base / "storage.conf"
        self.home = self.base / "home"
        self._containers: dict[str, dict[str, int]] = {}  # name -> the pids podman recorded
        self._made_blob_info_cache = not BLOB_INFO_CACHE.parents[1].exists()
        self._write_config()

    def _write_config(self) -> None:
        b, f = self.base, self.fetched
        for d in ("storage", "run", "tmp", "volumes", "networks", "runc", "home/.config/containers"):
            (b / d).mkdir(parents=True, exist_ok=True)
        # runc's state under base too (its default is /run/runc): podman's --runtime-flag reaches
        # neither the exit command conmon runs nor the RUN steps of a build, so runc is this script
        runc = b / "runc.sh"
        runc.write_text(f'#!/bin/sh\nexec {shlex.quote(str(f.runc))} --root {shlex.quote(str(b / "runc"))} "$@"\n')
        runc.chmod(0o755)
        self.conf.write_text(
            "[containers]\n"
            f"seccomp_profile = {_toml(f.seccomp_profile)}\n"
            "[network]\n"
            f"network_config_dir = {_toml(b / 'networks')}\n"
            "[engine]\n"
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            f"events_logfile_path = {_toml(b / 'events.log')}\n"
            f"conmon_path = [{_toml(f.conmon)}]\n"
            'runtime = "runc"\n'
            f"tmp_dir = {_toml(b / 'tmp')}\n"
            f"volume_path = {_toml(b / 'volumes')}\n"
            f"static_dir = {_toml(b / 'storage/libpod')}\n"
            "[engine.runtimes]\n"
            f"runc = [{_toml(runc)}]\n"
        )
        self.storage_conf.write_text(
            f'[storage]\ndriver = "overlay"\ngraphroot = {_toml(b / "storage")}\nrunroot = {_toml(b / "run")}\n'
        )
        # containers/image reads the signature policy from $HOME before /etc/containers
        shutil.copy(f.policy, self.home / ".config/containers/policy.json")

    def env(self) -> dict[str, str]:
        return {
            **self.fetched.env(),
            "HOME": str(self.home),
            "CONTAINERS_CONF": str(self.conf),
            "CONTAINERS_STORAGE_CONF": str(self.storage_conf),
            "CONTAINERS_REGISTRIES_CONF": str(self.fetched.root / "etc/containers/registries.conf"),
        }

    def argv(self, *args: str | os.PathLike[str]) -> list[str]:
        return [str(self.fetched.podman), *map(str, args)]

    def __call__(self, *args: str | os.PathLike[str], timeout: float = 120) -> str:
        """podman ``args``' stdout; ``PodmanError`` (one line) when it fails."""
        try:
            proc = subprocess.run(self.argv(*args), capture_output=True, text=True, env=self.env(), timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise PodmanError(f"podman {args[0]}: no answer in {timeout:g} s") from e
        if proc.returncode != 0:
            raise PodmanError(f"podman {args[0]} exited {proc.returncode}: {one_line(proc.stderr + proc.stdout)}")
        return proc.stdout

    def probe(self) -> str | None:
        """Why podman cannot run a container here (one line), or None: the base imported and
        ``true`` run in it, with the pod's rlimits and without a network."""
        try:
            self.import_base()
            self(
                "run",
                "--rm",
                "--pull=never",
                "--network=none",
                f"--cgroup-parent={self.cgroup_parent}",
                *self.rlimits(),
                BASE_IMAGE,
                "true",
            )
        except PodmanError as e:
            return str(e)
        return None

    def import_base(self) -> None:
        """The cache's base tarball as ``BASE_IMAGE`` (once)."""
        if not self._has_image(BASE_IMAGE):
            self("import", "--quiet", self.fetched.base_tar, BASE_IMAGE)

    def _has_image(self, name: str) -> bool:
        proc = subprocess.run(self.argv("image", "exists", name), env=self.env(), capture_output=True)
        return proc.returncode == 0

    def build(
        self,
        context: Path,
        containerfile: Path,
        tag: str,
        *,
        build_args: Mapping[str, str] = {},
        volumes: Iterable[str] = (),
        log: Path,
        timeout: float = 900,
    ) -> None:
        """``podman build`` with the host's network (RUN steps fetch from Debian and PyPI), never
        pulling: FROM names a local image. Its output goes to ``log``; ``PodmanError`` with its
        last error line when it fails."""
        argv = self.argv(
            "build",
            "--pull=never",
            "--network=host",
            # RUN steps run in this cgroup itself (no child of it), so one apart from the pod's
            f"--cgroup-parent={self.cgroup_parent}-build",
            "--file",
            containerfile,
            "--tag",
            tag,
            *(f"--build-arg={k}={v}" for k, v in build_args.items()),
            *(f"--volume={v}" for v in volumes),
            context,
        )
        with open(log, "w") as out:
            try:
                proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env(), timeout=timeout)
            except subprocess.TimeoutExpired as e:
                raise PodmanError(f"podman build: no end in {timeout:g} s (its output: {log})") from e
        if proc.returncode != 0:
            raise PodmanError(f"podman build exited {proc.returncode}: {one_line(log.read_text())} (its output: {log})")

    @staticmethod
    def rlimits() -> list[str]:
        """This process's open-files limits for the pod, and its process limit capped at
        podman's own (the module's docstring says why they must be given)."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], PODMAN_NPROC)
        return [f"--ulimit=nofile={soft}:{hard}", f"--ulimit=nproc={nproc}:{nproc}"]

    def run_detached(self, name: str, image: str, flags: Sequence[str], args: Sequence[str]) -> None:
        """Start container ``name`` from ``image`` with ``flags`` and ``args``, and return once
        it runs (``podman run -d``)."""
        self._containers[name] = {}
        self(
            "run",
            "--detach",
            "--pull=never",
            f"--name={name}",
            f"--label={LABEL}={self.token}",
            f"--cgroup-parent={self.cgroup_parent}",
            *self.rlimits(),
            *flags,
            image,
            *args,
        )
        state = self.inspect(name)["State"]
        self._containers[name] = {"conmon": int(state["ConmonPid"]), "init": int(state["Pid"])}

    def inspect(self, name: str) -> dict[str, Any]:
        (info,) = json.loads(self("container", "inspect", name))
        return dict(info)

    def running(self, name: str) -> bool:
        try:
            return bool(self.inspect(name)["State"]["Running"])
        except PodmanError:
            return False

    def exec(self, name: str, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``podman exec name cmd``: its exit code, stdout and stderr (no check)."""
        return subprocess.run(
            self.argv("exec", name, *cmd), capture_output=True, text=True, env=self.env(), timeout=timeout
        )

    def logs(self, name: str) -> str:
        proc = subprocess.run(self.argv("logs", name), capture_output=True, text=True, env=self.env(), timeout=30)
        return proc.stdout + proc.stderr

    def stop(self, name: str, timeout: int) -> int:
        """SIGTERM, then SIGKILL after ``timeout`` s, as the kubelet ends a pod; its exit code."""
        self("stop", f"--time={timeout}", name, timeout=timeout + 60)
        return int(self.inspect(name)["State"]["ExitCode"])

    # -- cleanup ----------------------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        """Remove its containers and images, then what they left (processes, by the pids podman
        recorded; mounts under ``base``; its cgroups), then ``base``. What was left, as lines."""
        problems: list[str] = []
        for name in self._containers:
            with contextlib.suppress(PodmanError):
                self("rm", "--force", "--time=0", name)
        with contextlib.suppress(PodmanError):
            self("rmi", "--all", "--force")
        for name, pids in self._containers.items():
            for what, pid in pids.items():
                if _alive(pid) and self._started(pid, what):
                    problems.append(f"{name}'s {what} (pid {pid}) outlived its removal; killed")
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        problems += self._unmount() + self._remove_cgroups()
        shutil.rmtree(self.base, ignore_errors=True)
        top = BLOB_INFO_CACHE.parents[1]
        if self._made_blob_info_cache and {p for p in top.rglob("*")} <= {BLOB_INFO_CACHE, BLOB_INFO_CACHE.parent}:
            shutil.rmtree(top, ignore_errors=True)  # made by this podman, holding nothing else
        return problems

    def _started(self, pid: int, what: str) -> bool:
        """Whether ``pid`` is still the process podman recorded (not a pid reused since): conmon's
        command line names ``base``; the container's init is in a cgroup under ``cgroup_parent``."""
        try:
            if what == "conmon":
                return str(self.base).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
            return f"{self.cgroup_parent}/".encode() in Path(f"/proc/{pid}/cgroup").read_bytes()
        except OSError:
            return False

    def _unmount(self) -> list[str]:
        base = str(self.base.resolve())
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4].encode().decode("unicode_escape") for line in f]
        problems = []
        for point in sorted((p for p in points if p == base or p.startswith(base + "/")), key=len, reverse=True):
            done = subprocess.run(["umount", point], capture_output=True).returncode == 0
            problems.append(f"{point} was left mounted" + ("; unmounted" if done else ""))
        return problems

    def _remove_cgroups(self) -> list[str]:
        problems = []
        tops = [
            point / parent.lstrip("/")
            for point in sorted({point for point, _ in cgroup_mounts()})
            for parent in (self.cgroup_parent, f"{self.cgroup_parent}-build")
        ]
        for top in (top for top in tops if top.is_dir()):
            for d in sorted((Path(p) for p, _, _ in os.walk(top)), key=lambda p: len(p.parts), reverse=True):
                try:
                    d.rmdir()
                except OSError as e:
                    problems.append(f"rmdir {d}: {e.strerror}")
        return problems


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


# ---------------------------------------------------------------------------------------------
# The DaemonSet's pod as podman flags


@dataclass(frozen=True)
class PodRun:
    """How to run a DaemonSet's one container with podman: the flags, the image's arguments and
    the grace period."""

    flags: list[str]
    args: list[str]
    grace_seconds: int


#: pod and container fields that say nothing about how the container runs on the node
#: (scheduling, the API server, probes the test makes itself, metadata)
SCHEDULING = {
    "serviceAccountName",
    "automountServiceAccountToken",
    "enableServiceLinks",
    "priorityClassName",
    "tolerations",
}
NOT_RUNTIME = {"name", "image", "imagePullPolicy", "ports", "startupProbe", "livenessProbe", "readinessProbe"}

_SUFFIX = {"m": 0.001, "": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 1e3, "M": 1e6, "G": 1e9}


def quantity(text: str | int) -> float:
    """A Kubernetes quantity (``50m``, ``1``, ``128Mi``, ``1Gi``) as a number."""
    s = str(text)
    number = s.rstrip("mKiMGk")
    return float(number) * _SUFFIX[s[len(number) :]]


def _unknown(where: str, doc: Mapping[str, Any], known: set[str]) -> None:
    if extra := set(doc) - known:
        raise ValueError(f"{where}: {sorted(extra)} not translated to podman (testbed/servers/podman.py)")


def pod_run(daemonset: Mapping[str, Any], host_paths: Mapping[str, Path], seccomp_profile: Path) -> PodRun:
    """The DaemonSet's pod as podman flags: its namespaces, user, seccomp profile, capabilities,
    read-only root, resources and volumes, each hostPath volume bound from ``host_paths`` (the
    manifest's host path -> this test's directory). A field this does not translate is a
    ``ValueError``: a change to the manifest cannot pass unseen."""
    pod = daemonset["spec"]["template"]["spec"]
    _unknown(
        "pod",
        pod,
        SCHEDULING
        | {"hostPID", "hostIPC", "hostNetwork", "terminationGracePeriodSeconds", "securityContext"}
        | {"containers", "volumes"},
    )
    (container,) = pod["containers"]
    _unknown("container", container, NOT_RUNTIME | {"args", "resources", "securityContext", "volumeMounts"})
    # the pod's own namespaces; without CNI here, its network namespace has only loopback
    flags = [
        "--pid=" + ("host" if pod.get("hostPID") else "private"),
        "--ipc=" + ("host" if pod.get("hostIPC") else "private"),
        "--network=" + ("host" if pod.get("hostNetwork") else "none"),
    ]
    psc = pod.get("securityContext", {})
    _unknown("pod securityContext", psc, {"runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile"})
    if "runAsUser" in psc:
        flags.append(f"--user={psc['runAsUser']}:{psc.get('runAsGroup', psc['runAsUser'])}")
    seccomp = psc.get("seccompProfile", {}).get("type")
    if seccomp == "RuntimeDefault":
        flags.append(f"--security-opt=seccomp={seccomp_profile}")
    elif seccomp is not None:
        raise ValueError(f"seccompProfile {seccomp} not translated")
    csc = container.get("securityContext", {})
    _unknown(
        "container securityContext",
        csc,
        {"privileged", "allowPrivilegeEscalation", "readOnlyRootFilesystem", "capabilities"},
    )
    if csc.get("privileged"):
        flags.append("--privileged")
    if csc.get("allowPrivilegeEscalation") is False:
        flags.append("--security-opt=no-new-privileges")
    if csc.get("readOnlyRootFilesystem"):
        flags += ["--read-only", "--read-only-tmpfs=false"]  # no tmpfs the pod does not have
    caps = csc.get("capabilities", {})
    _unknown("capabilities", caps, {"drop", "add"})
    flags += [f"--cap-drop={c.lower()}" for c in caps.get("drop", [])]
    flags += [f"--cap-add={c.lower()}" for c in caps.get("add", [])]
    resources = container.get("resources", {})
    _unknown("resources", resources, {"requests", "limits"})
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    _unknown("requests", requests, {"cpu", "memory"})
    _unknown("limits", limits, {"cpu", "memory"})
    if "cpu" in requests:  # the kubelet's shares: millicores * 1024 / 1000, at least 2
        flags.append(f"--cpu-shares={max(2, round(quantity(requests['cpu']) * 1000) * 1024 // 1000)}")
    if "cpu" in limits:
        flags.append(f"--cpus={quantity(limits['cpu']):g}")
    if "memory" in limits:
        flags.append(f"--memory={int(quantity(limits['memory']))}b")
    flags += _mounts(pod["volumes"], container.get("volumeMounts", []), host_paths)
    return PodRun(flags, [str(a) for a in container.get("args", [])], int(pod.get("terminationGracePeriodSeconds", 30)))


def _mounts(volumes: list[dict[str, Any]], mounts: list[dict[str, Any]], host_paths: Mapping[str, Path]) -> list[str]:
    by_name = {v["name"]: v for v in volumes}
    flags = []
    for m in mounts:
        _unknown("volumeMount", m, {"name", "mountPath", "readOnly", "recursiveReadOnly"})
        volume = by_name[m["name"]]
        _unknown(f"volume {m['name']}", volume, {"name", "hostPath", "emptyDir"})
        if "hostPath" in volume:
            # recursiveReadOnly: podman 4.3 has no "rro"; the caller checks that nothing is
            # mounted below such a source, so that read-only is read-only all the way down
            ro = ",ro" if m.get("readOnly") else ""
            source = host_paths[volume["hostPath"]["path"]]
            flags.append(f"--mount=type=bind,source={source},destination={m['mountPath']}{ro}")
        else:
            empty = volume["emptyDir"]
            _unknown("emptyDir", empty, {"medium", "sizeLimit"})
            if empty.get("medium") != "Memory":
                raise ValueError(f"emptyDir {m['name']} on disk not translated")
            size = f",tmpfs-size={int(quantity(empty['sizeLimit']))}" if "sizeLimit" in empty else ""
            flags.append(f"--mount=type=tmpfs,destination={m['mountPath']}{size}")
    return flags


# ---------------------------------------------------------------------------------------------
# python -m testbed.servers.podman fetch


def main(argv: Iterable[str] | None = None) -> int:
    return ARCHIVE.command("python -m testbed.servers.podman", argv)


if __name__ == "__main__":
    sys.exit(main())
