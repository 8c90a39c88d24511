"""A real containerd (2.1, with NRI) for the tests: fetched once, started per test, cleaned up.

Fetching into the cache, the image, starting and stopping containerd by pid and cleaning up its
shims and cgroups are ``testbed.servers.containerd``'s (``eventsrc bench nri`` runs it too); this
module adds the tests' own CRI client, with grpcio and the project's vendored CRI proto,
independent of the daemon's grpclib. The cache is reused once complete, without network::

    python -m tests.support.containerd fetch [--cache DIR]

``Containerd(base)`` runs one containerd with its own config, root, state, sockets and NRI
socket under ``base``; its CRI methods (``run_pod``, ``create_container``, ``exec_sync``,
``cpuset``...) are the grpcio client's::

    rt = Containerd(tmp_path, cdi_dir=tmp_path / "cdi")
    rt.start()
    pod = rt.run_pod("web", uid="1234")
    cid = rt.create_container(pod, "app", cpu_millis=500)
    rt.start_container(cid)
    rt.cpus_allowed(cid)            # "0-1"
    rt.stop()                       # removes its pods through CRI, stops containerd, rmdirs cgroups

Every pod and container it makes carries ``HARNESS_LABEL=<token>``; its pods' cgroup parents are
under ``/eventsrc-test-<pid>-<n>``.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from testbed.servers.containerd import (
    ARCHIVE,
    CFS_PERIOD,
    IMAGE,
    PAUSE,
    ContainerdProcess,
    cgroup_mounts,
    cpuset_mount,
    kubelet_cpu,
    why_unavailable,
)

__all__ = ["CFS_PERIOD", "Containerd", "cgroup_mounts", "why_unavailable"]

HARNESS_LABEL = "eventsrc-test-harness"


# ---------------------------------------------------------------------------------------------
# CRI client


def _cri() -> Any:
    from tests.support.grpcio_stubs import stubs

    return stubs("cri/v1/api.proto")


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


class Containerd(ContainerdProcess):
    """One containerd (``ContainerdProcess``) and a grpcio CRI client to it. The CRI methods of
    ``CriClient`` are callable on it directly."""

    def __init__(self, base: Path, **kwargs: Any) -> None:
        super().__init__(base, **kwargs)
        self._pod_configs: dict[str, Any] = {}
        self._cri: CriClient | None = None

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

    def start(self, timeout: float = 30) -> None:
        """Start containerd, wait until CRI answers, and import the image if its root lacks it."""
        if self.running():
            return
        self.launch()
        self._cri = CriClient(self.address, self.token, self.cgroup_prefix, self._pod_configs)
        try:
            self._wait(self._answers, "containerd's CRI to answer Version", timeout)
            if not self._image_present():
                self.import_image()
                self._wait(self._image_present, f"CRI to see {IMAGE}", timeout)
        except BaseException:
            self.terminate()
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

    def restart(self, timeout: float = 30) -> None:
        """Stop containerd without touching its pods (their shims live on), and start it again."""
        self.terminate()
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
        problems += self.cleanup()
        if problems:
            raise RuntimeError("containerd harness cleanup: " + "; ".join(problems))

    def terminate(self, timeout: float = 20) -> None:
        if self._cri is not None:
            self._cri.close()
            self._cri = None
        super().terminate(timeout)


# ---------------------------------------------------------------------------------------------
# python -m tests.support.containerd fetch


def main(argv: Iterable[str] | None = None) -> int:
    return ARCHIVE.command("python -m tests.support.containerd", argv)


if __name__ == "__main__":
    sys.exit(main())
