"""eventsrc as an NRI plugin of a real containerd (Debian unstable's 2.1.9 with Debian 12's runc,
fetched and started by ``tests/support/containerd.py``), pods and containers driven through CRI
with grpcio. Skipped, with one line saying why, where the runtime cannot be had (not root, no
package archive); as root on a machine of this kind, they run.

The node here has two CPUs: the static policy with CPU 0 reserved gives CPU 1 to a Guaranteed
one-CPU container; the shared pool is 0-1, and 0 while CPU 1 is taken.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from eventsrc.gen.podresources.v1 import api_pb2 as pr
from tests.conftest import Daemon, run_cli
from tests.support.containerd import Containerd
from tests.support.eventually import eventually
from tests.support.grpcio_stubs import pod_resources_client, unix_target

RESOURCE = "example.com/dev"
ANNOTATION = "eventsrc.dev/resources"
MEM = 64 << 20
# CPU 0 reserved (100m of cpu kept back, rounded up to one CPU, as the kubelet does): 1900m allocatable
STATIC = ("--cpu-manager-policy", "static", "--system-reserved", "cpu=100m")

pytestmark = pytest.mark.skipif(
    len(__import__("os").sched_getaffinity(0)) < 2, reason="needs two CPUs: one exclusive, one shared"
)


class Plugin:
    """``eventsrc sample-plugin`` in a subprocess, killed by its pid afterwards."""

    def __init__(self, root: Path, cdi_dir: Path, log: Path) -> None:
        self.log = log
        self.out = open(log, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eventsrc", "--root-dir", str(root), "sample-plugin"]
            + ["--devices", "4", "--numa-nodes", "1", "--cdi-dir", str(cdi_dir)],
            stdout=self.out,
            stderr=subprocess.STDOUT,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.out.close()


@pytest.fixture
def node(
    root: Path, tmp_path: Path, containerd_runtime: Containerd, daemon_factory: type[Daemon]
) -> Iterator[Callable[..., Any]]:
    """Start eventsrc (and, on request, the sample plugin) beside the harness's containerd."""
    plugins: list[Plugin] = []

    def start(*extra: str, plugin: bool = True) -> Daemon:
        daemon = daemon_factory(*STATIC, "--nri-socket", str(containerd_runtime.nri_socket), *extra)
        synced(daemon, 1)
        if plugin and not plugins:
            p = Plugin(root, containerd_runtime.cdi_dir, tmp_path / "plugin.log")
            plugins.append(p)
            eventually(lambda: "registered" in p.log.read_text(), "the sample plugin to register")
            daemon.eventually(lambda: devices(root, free=True) == 4, "the daemon to list 4 devices")
        return daemon

    yield start
    for p in plugins:
        p.stop()


def synced(daemon: Daemon, times: int) -> None:
    daemon.eventually(
        lambda: daemon.output().count("synchronized with the runtime") >= times,
        f"registration {times} with the runtime (Synchronize)",
    )


def state(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(run_cli("state", "--output", "json", root=root, check=True).stdout)
    return out


def devices(root: Path, free: bool) -> int:
    held = state(root)["devices"]["devices"].get(RESOURCE, {})
    return sum(1 for d in held.values() if (d["holder"] == "") == free and d["health"] == "Healthy")


def pods(root: Path) -> dict[str, Any]:
    """``eventsrc pods`` (the node API's ListPods), by uid."""
    listed = json.loads(run_cli("pods", "--output", "json", root=root, check=True).stdout)
    return {p["uid"]: p for p in listed["pods"]}


def held(root: Path, uid: str) -> Any:
    """What the log's views say container ``app`` of pod ``uid`` holds."""
    return state(root)["pods"]["pods"][uid]["containers"]["app"]


def pod_resources(root: Path) -> list[Any]:
    with grpc.insecure_channel(unix_target(root / "pod-resources" / "kubelet.sock")) as ch:
        return list(pod_resources_client(ch).List(pr.ListPodResourcesRequest()).pod_resources)


def run_container(rt: Containerd, name: str, uid: str, *, cpu_millis: int, devices: int = 0, **kw: Any) -> str:
    annotations = {ANNOTATION: json.dumps({"app": {RESOURCE: devices}})} if devices else None
    pod = rt.run_pod(name, uid, annotations=annotations)
    cid = rt.create_container(pod, "app", cpu_millis=cpu_millis, memory_limit=MEM, **kw)
    rt.start_container(cid)
    return cid


def sandbox_of(rt: Containerd, uid: str) -> str:
    return next(p.id for p in rt.list_pods() if p.metadata.uid == uid)


def remove_pod(rt: Containerd, uid: str) -> None:
    pod = sandbox_of(rt, uid)
    rt.stop_pod(pod)
    rt.remove_pod(pod)


def env_in(rt: Containerd, cid: str) -> dict[str, str]:
    rc, out, err = rt.exec_sync(cid, ["env"])
    assert rc == 0, err
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def follows(rt: Containerd, cid: str, cpus: str, daemon: Daemon) -> None:
    daemon.eventually(lambda: rt.cpus_allowed(cid) == cpus, f"container {cid[:12]} to run on CPUs {cpus}")


def admit(root: Path, tmp_path: Path, uid: str, name: str, namespace: str = "default") -> None:
    """Admit pod NAMESPACE/NAME (uid ``uid``) through the node API: one CPU and one device."""
    manifest = tmp_path / f"{uid}.yaml"
    manifest.write_text(
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {namespace}, uid: {uid}}}\nspec:\n"
        "  containers:\n  - name: app\n    image: busybox\n    resources:\n"
        f"      limits: {{cpu: '1', memory: 64Mi, {RESOURCE}: 1}}\n"
    )
    run_cli("admit", "-f", str(manifest), root=root, check=True)


def assert_exclusive_with_its_device(rt: Containerd, cid: str) -> str:
    """CPU 1 alone; the plugin's Allocate envs, its device node and its CDI device resolved."""
    assert rt.cpus_allowed(cid) == "1"
    assert rt.cpuset(cid) == "1"
    env = env_in(rt, cid)
    device = env["SAMPLE_DEVICES"]
    assert env["SAMPLE_RESOURCE"] == RESOURCE
    rc, _, err = rt.exec_sync(cid, ["test", "-c", f"/dev/{device}"])
    assert rc == 0, f"device node /dev/{device} missing: {err}"
    assert env[f"SAMPLE_CDI_{device.upper().replace('-', '_')}"] == device  # containerd resolved the CDI name
    return device


def test_an_admitted_pod_gets_its_cpus_and_device_and_the_shared_pool_follows(
    root: Path, tmp_path: Path, containerd_runtime: Containerd, node: Callable[..., Daemon]
) -> None:
    rt = containerd_runtime
    daemon = node()
    shared = run_container(rt, "shared", "uid-shared", cpu_millis=500)
    assert rt.cpus_allowed(shared) == "0-1"

    admit(root, tmp_path, "uid-gpu", "gpu")
    cid = run_container(rt, "gpu", "uid-gpu", cpu_millis=1000)
    device = assert_exclusive_with_its_device(rt, cid)
    assert "uid-gpu" in pods(root)
    assert held(root, "uid-gpu")["devices"] == {RESOURCE: [device]}
    follows(rt, shared, "0", daemon)

    audit = run_cli("audit", "pod", "uid-gpu", root=root, check=True).stdout
    assert cid in audit and "cpus 1" in audit and device in audit and f"{RESOURCE}={device}" in audit

    remove_pod(rt, "uid-gpu")
    follows(rt, shared, "0-1", daemon)
    assert "uid-gpu" not in pods(root)
    assert "uid-gpu" not in {p.name for p in pod_resources(root)}
    assert devices(root, free=True) == 4
    log = run_cli("log", "--output", "json", root=root, check=True).stdout
    assert '"pod sandbox removed"' in log and "ContainerCPUsUpdated" in log


def test_a_pod_never_admitted_is_admitted_from_cri_and_a_bad_annotation_fails_only_its_container(
    root: Path, containerd_runtime: Containerd, node: Callable[..., Daemon]
) -> None:
    rt = containerd_runtime
    daemon = node("--nri-annotation-namespaces", "default")
    cid = run_container(rt, "annotated", "uid-annotated", cpu_millis=1000, devices=1)
    assert_exclusive_with_its_device(rt, cid)
    assert state(root)["pods"]["pods"]["uid-annotated"]["qos_class"] == "Guaranteed"

    bad = rt.run_pod("bad", "uid-bad", annotations={ANNOTATION: '{"app": {"example.com/dev": "one"}}'})
    with pytest.raises(grpc.RpcError) as refused:
        rt.create_container(bad, "app", cpu_millis=1000, memory_limit=MEM)
    assert f"annotation {ANNOTATION}" in refused.value.details()
    assert "uid-bad" not in pods(root)
    assert run_cli("status", root=root).returncode == 0 and daemon.exited() is None

    # not enough devices: the kubelet's reason, recorded as a refusal
    too_many = rt.run_pod("greedy", "uid-greedy", annotations={ANNOTATION: json.dumps({"app": {RESOURCE: 9}})})
    with pytest.raises(grpc.RpcError) as refused:
        rt.create_container(too_many, "app", cpu_millis=500)
    assert "Requested: 9" in refused.value.details(), refused.value.details()
    assert "AdmissionRejected" in run_cli("log", "--output", "json", root=root, check=True).stdout


def exited(rt: Containerd, cid: str) -> bool:
    """The runtime reports the container exited (the kubelet creates the next container then)."""
    return bool(rt.container_status(cid, verbose=False).status.state == rt.cri.pb.CONTAINER_EXITED)


def test_a_never_admitted_pod_is_admitted_container_by_container_as_the_kubelet_would(
    root: Path, containerd_runtime: Containerd, node: Callable[..., Daemon]
) -> None:
    """Issue 27: an init container of 1 CPU, then `main` of 1 CPU, then `sidecar` of 500m,
    created as the kubelet creates them (the next once the init container has exited)."""
    rt = containerd_runtime
    daemon = node(plugin=False)
    # 400m: with the pod's 1,500m (main and sidecar) all of the node's 1,900m allocatable
    shared = run_container(rt, "shared", "uid-shared", cpu_millis=400)
    pod = rt.run_pod("multi", "uid-multi")
    # The init container waits to be told to exit, so that what it runs on is read inside it.
    wait = ["/bin/sh", "-c", "while [ ! -e /tmp/exit ]; do sleep 0.05; done"]
    init = rt.create_container(pod, "init", cpu_millis=1000, memory_limit=MEM, command=wait)
    rt.start_container(init)
    assert rt.cpus_allowed(init) == "1"
    follows(rt, shared, "0", daemon)
    assert rt.exec_sync(init, ["touch", "/tmp/exit"])[0] == 0
    eventually(lambda: exited(rt, init), "the init container to exit")

    main = rt.create_container(pod, "main", cpu_millis=1000, memory_limit=MEM)
    rt.start_container(main)
    assert rt.cpus_allowed(main) == "1"  # the init container's CPU, reused as the kubelet reuses it
    sidecar = rt.create_container(pod, "sidecar", cpu_millis=500, memory_limit=MEM)
    rt.start_container(sidecar)
    assert rt.cpus_allowed(sidecar) == "0"  # the shared pool
    assert rt.cpus_allowed(shared) == "0"

    listed = {p.name: p for p in pod_resources(root)}["multi"]
    assert {c.name: list(c.cpu_ids) for c in listed.containers} == {"main": [1], "sidecar": []}
    held_now = state(root)["pods"]["pods"]["uid-multi"]
    assert {n: (c["kind"], c["cpus"]) for n, c in held_now["containers"].items()} == {
        "init": ("init", [1]),
        "main": ("app", [1]),
        "sidecar": ("app", []),
    }
    audit = run_cli("audit", "pod", "uid-multi", root=root, check=True).stdout
    assert all(c in audit for c in (init, main, sidecar)), audit
    assert "ContainerAdmissionStarted" in audit and "ContainerAdmitted" in audit

    remove_pod(rt, "uid-multi")
    follows(rt, shared, "0-1", daemon)
    assert "uid-multi" not in pods(root)
    assert state(root)["cpus"]["shared"] == [0, 1]
    check = run_cli("replay", "--check", root=root)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_sigkill_between_two_containers_creations_is_put_right_at_synchronize(
    root: Path, containerd_runtime: Containerd, node: Callable[..., Daemon]
) -> None:
    """The init container exits and `main` is created while eventsrc is away (unadjusted);
    the next start's Synchronize records the exit and grows the pod by `main`, which then gets
    the init container's CPU."""
    rt = containerd_runtime
    daemon = node(plugin=False)
    pod = rt.run_pod("multi", "uid-multi")
    init = rt.create_container(pod, "init", cpu_millis=1000, memory_limit=MEM, command=["true"])
    rt.start_container(init)
    eventually(lambda: exited(rt, init), "the init container to exit")
    daemon.stop(signal.SIGKILL)
    main = rt.create_container(pod, "main", cpu_millis=1000, memory_limit=MEM)
    rt.start_container(main)
    assert rt.cpus_allowed(main) == "0-1"  # created unadjusted

    again = node(plugin=False)
    follows(rt, main, "1", again)
    held_now = state(root)["pods"]["pods"]["uid-multi"]
    assert {n: (c["kind"], c["cpus"]) for n, c in held_now["containers"].items()} == {
        "init": ("init", [1]),
        "main": ("app", [1]),
    }
    check = run_cli("replay", "--check", root=root)
    assert check.returncode == 0, check.stdout + check.stderr


def test_sigkill_while_the_runtime_goes_on_then_synchronize_puts_things_right(
    root: Path, containerd_runtime: Containerd, node: Callable[..., Daemon]
) -> None:
    rt = containerd_runtime
    daemon = node(plugin=False)
    shared = run_container(rt, "shared", "uid-shared", cpu_millis=500)
    excl = run_container(rt, "excl", "uid-excl", cpu_millis=1000)
    assert rt.cpus_allowed(excl) == "1"
    follows(rt, shared, "0", daemon)

    daemon.stop(signal.SIGKILL)
    remove_pod(rt, "uid-excl")  # its sandbox vanishes while eventsrc is away
    late = run_container(rt, "late", "uid-late", cpu_millis=1000)  # created unadjusted
    assert rt.cpus_allowed(late) == "0-1"

    again = node(plugin=False)
    # What was checked: the pod whose sandbox vanished was released, the container created
    # meanwhile was recorded and admitted (Guaranteed: CPU 1), and the shared pool followed.
    follows(rt, late, "1", again)
    follows(rt, shared, "0", again)
    listed = pods(root)
    assert "uid-excl" not in listed and "uid-late" in listed
    assert held(root, "uid-late")["cpus"] == [1]
    audit = run_cli("audit", "pod", "uid-late", root=root, check=True).stdout
    assert late in audit
    check = run_cli("replay", "--check", root=root)
    assert check.returncode == 0, check.stdout + check.stderr


def test_containerd_restarts_and_eventsrc_registers_again(
    root: Path, containerd_runtime: Containerd, node: Callable[..., Daemon]
) -> None:
    rt = containerd_runtime
    daemon = node(plugin=False)
    rt.restart()
    synced(daemon, 2)
    cid = run_container(rt, "after", "uid-after", cpu_millis=1000)
    assert rt.cpus_allowed(cid) == "1"
    assert "uid-after" in pods(root)


def test_observe_mode_records_what_the_runtime_applied_and_adjusts_nothing(
    root: Path, containerd_runtime: Containerd, node: Callable[..., Daemon]
) -> None:
    rt = containerd_runtime
    daemon = node("--nri-mode", "observe")
    cid = run_container(rt, "watched", "uid-watched", cpu_millis=1000, devices=1)
    assert rt.cpus_allowed(cid) == "0-1"
    assert "SAMPLE_DEVICES" not in env_in(rt, cid)
    assert "uid-watched" not in pods(root)  # nothing admitted

    # The runtime changes the cpuset itself (as a kubelet's CPU manager would, through CRI).
    pb = rt.cri.pb
    rt.cri.runtime.UpdateContainerResources(
        pb.UpdateContainerResourcesRequest(container_id=cid, linux=pb.LinuxContainerResources(cpuset_cpus="1")),
        timeout=30,
    )
    rt.stop_container(cid)
    remove_pod(rt, "uid-watched")

    def history() -> list[str]:
        out = run_cli("log", "--output", "json", root=root, check=True).stdout
        return [json.loads(line)["type"] for line in out.splitlines()]

    want = ["PodSandboxStarted", "ContainerCreated", "ContainerStarted", "ContainerCPUsUpdated", "ContainerStopped"]
    got = daemon.eventually(lambda: [t for t in history() if t in {*want, "PodSandboxRemoved"}], "the lifecycle")
    daemon.eventually(lambda: "PodSandboxRemoved" in history(), "the sandbox removal")
    assert [t for t in history() if t in want] == want, got
    audit = run_cli("audit", "pod", "uid-watched", root=root, check=True).stdout
    assert cid in audit and "cpus 1" in audit


def test_a_pod_that_lived_across_a_containerd_restart_is_released_when_its_sandbox_is_removed(
    root: Path, containerd_runtime: Containerd, node: Callable[..., Daemon]
) -> None:
    """containerd sends no RemovePodSandbox for the sandboxes it recovered at its start: their
    removal is seen in its CRI listing, and the pod is released as on any removal."""
    rt = containerd_runtime
    daemon = node("--container-runtime-endpoint", f"unix://{rt.address}", "--nri-annotation-namespaces", "default")
    shared = run_container(rt, "shared", "uid-shared", cpu_millis=500)
    cid = run_container(rt, "survivor", "uid-survivor", cpu_millis=1000, devices=1)
    assert_exclusive_with_its_device(rt, cid)
    follows(rt, shared, "0", daemon)

    rt.restart()
    synced(daemon, 2)
    remove_pod(rt, "uid-survivor")
    daemon.eventually(lambda: "uid-survivor" not in pods(root), "the pod to be released")
    assert devices(root, free=True) == 4
    assert "uid-survivor" not in {p.name for p in pod_resources(root)}
    follows(rt, shared, "0-1", daemon)  # the shared pool has its CPU back
    log = run_cli("log", "--output", "json", root=root, check=True).stdout
    assert "gone from the runtime's listing" in log and '"pod sandbox removed"' in log
    check = run_cli("replay", "--check", root=root)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_pod_author_asks_for_devices_by_annotation_only_in_a_namespace_the_node_names(
    root: Path, tmp_path: Path, containerd_runtime: Containerd, node: Callable[..., Daemon]
) -> None:
    rt = containerd_runtime
    daemon = node("--nri-annotation-namespaces", "trusted")
    greedy = rt.run_pod("greedy", "uid-greedy", annotations={ANNOTATION: json.dumps({"app": {RESOURCE: 4}})})
    with pytest.raises(grpc.RpcError) as refused:
        rt.create_container(greedy, "app", cpu_millis=100)
    reason = refused.value.details()
    assert f"annotation {ANNOTATION}" in reason and "--nri-annotation-namespaces" in reason, reason
    assert "uid-greedy" not in pods(root) and devices(root, free=True) == 4

    # CPUs from cgroup values are decided as before: a Guaranteed pod there gets CPU 1.
    plain = run_container(rt, "plain", "uid-plain", cpu_millis=1000)
    assert rt.cpus_allowed(plain) == "1"
    remove_pod(rt, "uid-plain")
    daemon.eventually(lambda: "uid-plain" not in pods(root), "the plain pod's release")

    twice = rt.run_pod(
        "twice",
        "uid-twice",
        namespace="trusted",
        annotations={ANNOTATION: '{"app": {"example.com/dev": 1}, "app": {"example.com/dev": 4}}'},
    )
    with pytest.raises(grpc.RpcError) as refused:
        rt.create_container(twice, "app", cpu_millis=100)
    assert "appears twice" in refused.value.details(), refused.value.details()

    pod = rt.run_pod(
        "asks", "uid-asks", namespace="trusted", annotations={ANNOTATION: json.dumps({"app": {RESOURCE: 1}})}
    )
    cid = rt.create_container(pod, "app", cpu_millis=100)
    rt.start_container(cid)
    assert "SAMPLE_DEVICES" in env_in(rt, cid)
    # What the scheduler placed is not starved: a node-API pod still gets its device.
    admit(root, tmp_path, "uid-placed", "placed")
    assert devices(root, free=True) == 2


def test_a_sandbox_with_an_admitted_pods_uid_and_another_name_is_refused(
    root: Path, tmp_path: Path, containerd_runtime: Containerd, node: Callable[..., Daemon]
) -> None:
    rt = containerd_runtime
    daemon = node()
    admit(root, tmp_path, "uid-real", "real", namespace="ns-a")
    imposter = rt.run_pod("imposter", "uid-real", namespace="ns-b")
    with pytest.raises(grpc.RpcError) as refused:
        rt.create_container(imposter, "app", cpu_millis=1000, memory_limit=MEM)
    assert "pod ns-a/real's, not ns-b/imposter's" in refused.value.details(), refused.value.details()
    # Its removal, before the real pod's sandbox ran, does not release the real pod.
    rt.stop_pod(imposter)
    rt.remove_pod(imposter)
    daemon.eventually(
        lambda: (
            imposter in run_cli("log", "--output", "json", root=root, check=True).stdout.split("PodSandboxRemoved")[-1]
        ),
        "the impostor's removal to be recorded",
    )
    # No release owed (the views), none made (the log read after them): wrong either way before.
    assert "uid-real" not in state(root)["runtime"]["gone"]
    assert "PodRemoved" not in run_cli("log", "--output", "json", root=root, check=True).stdout
    assert "uid-real" in pods(root) and devices(root, free=True) == 3

    pod = rt.run_pod("real", "uid-real", namespace="ns-a")
    cid = rt.create_container(pod, "app", cpu_millis=1000, memory_limit=MEM)
    rt.start_container(cid)
    assert_exclusive_with_its_device(rt, cid)
    check = run_cli("replay", "--check", root=root)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_memory_manager_sets_the_containers_memory_nodes(
    root: Path, containerd_runtime: Containerd, node: Callable[..., Daemon]
) -> None:
    """Issue 38: with the Static memory manager (and no CPU manager, so that no cpuset comes
    from CPUs), a Guaranteed container's memory block is decided at its creation, and its
    ``cpuset.mems`` is the block's NUMA nodes, set through NRI (this machine has one node)."""
    rt = containerd_runtime
    daemon = node(
        *("--cpu-manager-policy", "none", "--memory-manager-policy", "Static", "--reserved-memory", "0:memory=100Mi"),
        plugin=False,
    )
    cid = run_container(rt, "mem", "uid-mem", cpu_millis=1000)
    (listed,) = [p for p in pod_resources(root) if p.name == "mem"]
    blocks = [(m.memory_type, m.size, [n.ID for n in m.topology.nodes]) for m in listed.containers[0].memory]
    assert blocks == [("memory", MEM, [0])]
    assert rt.runtime_spec(cid)["linux"]["resources"]["cpu"]["mems"] == "0"

    def created() -> list[Any]:
        log = [json.loads(line) for line in run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()]
        return [r["event"] for r in log if r["type"] == "ContainerCreated" and r["event"]["container_id"] == cid]

    # an observation: in the log within the group commit's wait
    assert [e["mems"] for e in daemon.eventually(created, "the container's creation in the log")] == [[0]]


def test_a_container_that_does_not_fit_fails_its_creation_with_the_kubelets_words(
    root: Path, containerd_runtime: Containerd, node: Callable[..., Daemon]
) -> None:
    """Issue 38 item 1 in enforce mode: the node has 1,900m of CPU for pods (100m kept back);
    a second 1-CPU pod read from CRI (Burstable: no memory limit, so no CPU manager decision
    comes first) does not fit beside the first, and its container's creation fails with
    OutOfcpu, recorded as the kubelet would word it."""
    rt = containerd_runtime
    daemon = node(plugin=False)
    run_container(rt, "first", "uid-first", cpu_millis=1000)
    second = rt.run_pod("second", "uid-second")
    with pytest.raises(grpc.RpcError) as refused:
        rt.create_container(second, "app", cpu_millis=1000)
    words = "Node didn't have enough resource: cpu, requested: 1000, used: 1000, capacity: 1900"
    assert f"OutOfcpu: {words}" in refused.value.details()
    assert "uid-second" not in pods(root)

    def rejected() -> list[Any]:
        log = [json.loads(line) for line in run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()]
        return [r["event"] for r in log if r["type"] == "AdmissionRejected"]

    (e,) = daemon.eventually(rejected, "the refusal in the log")
    assert (e["pod"]["uid"], e["kubelet_reason"], e["reason"]) == ("uid-second", "OutOfcpu", words)
