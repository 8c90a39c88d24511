"""The real-containerd harness itself: a host-network pod and a container with a CPU limit run,
exec works, the cpuset is seen alike inside and on the host, cleanup leaves nothing, and NRI
listens on the configured socket."""

from __future__ import annotations

import stat
from pathlib import Path

from tests.support.containerd import CFS_PERIOD, Containerd, cgroup_mounts
from tests.support.eventually import eventually


def _mount(controller: str) -> Path:
    return next(point for point, options in cgroup_mounts() if controller in options)


def _listening(socket: Path) -> bool:
    with open("/proc/net/unix") as f:
        return any(line.split()[-1] == str(socket) for line in f.readlines()[1:] if len(line.split()) > 7)


def test_a_pod_and_a_container_run_and_leave_nothing_behind(containerd_runtime: Containerd) -> None:
    rt = containerd_runtime
    pod = rt.run_pod("smoke", uid="smoke-uid-1")
    cid = rt.create_container(pod, "app", cpu_millis=1000)
    rt.start_container(cid)

    all_cpus = Path("/sys/devices/system/cpu/online").read_text().strip()
    assert rt.cpus_allowed(cid) == rt.cpuset(cid) == all_cpus
    cgroup = rt.cgroups_path(cid)
    assert cgroup.startswith(rt.cri.pod_cgroup_parent("smoke-uid-1") + "/")
    cpu = _mount("cpu") / cgroup.lstrip("/")
    assert (cpu / "cpu.shares").read_text().strip() == "1024"
    assert (cpu / "cpu.cfs_quota_us").read_text().strip() == str(CFS_PERIOD)

    assert rt.exec_sync(cid, ["sh", "-c", "echo out; echo err >&2"]) == (0, "out\n", "err\n")
    assert rt.exec_sync(cid, ["sh", "-c", "exit 3"])[0] == 3

    assert "created NRI interface" in rt.log_text()
    assert stat.S_ISSOCK(rt.nri_socket.stat().st_mode)
    assert _listening(rt.nri_socket)
    assert str(rt.nri_socket) in rt.config_path.read_text()

    rt.stop_container(cid)
    rt.remove_container(cid)
    assert rt.list_containers() == []
    rt.stop_pod(pod)
    rt.remove_pod(pod)
    assert rt.list_pods() == []
    eventually(lambda: not rt.shim_pids(), "the pod's shim to exit", timeout=10)
    assert rt.cgroup_dirs(), "the runtime leaves the pod's cgroup directories for the harness"

    rt.stop()
    assert rt.cgroup_dirs() == []
    assert not rt.running()


def test_pods_outlive_a_restart_and_stop_removes_them(containerd_runtime: Containerd) -> None:
    rt = containerd_runtime
    pod = rt.run_pod("survivor", uid="smoke-uid-2")
    cid = rt.create_container(pod, "app", cpu_millis=500, envs={"GREETING": "hi"})
    rt.start_container(cid)
    shims = rt.shim_pids()
    assert shims

    rt.restart()
    assert rt.shim_pids() == shims
    assert [c.id for c in rt.list_containers()] == [cid]
    assert rt.exec_sync(cid, ["sh", "-c", "echo $GREETING"]) == (0, "hi\n", "")

    rt.stop()
    assert rt.shim_pids() == []
    assert rt.cgroup_dirs() == []
