"""The container runtime as NRI reported it: sandboxes and containers, with what each got."""

from __future__ import annotations

from eventsrc import events as ev
from eventsrc.state.types import Handlers
from eventsrc.state.views import RuntimeContainerView, SandboxView, Views


def connected(v: Views, seq: int, e: ev.RuntimeConnected) -> None:
    r = v.runtime
    r.connected = True
    r.runtime = f"{e.runtime} {e.runtime_version}".strip()
    r.mode = e.mode


def disconnected(v: Views, seq: int, e: ev.RuntimeDisconnected) -> None:
    v.runtime.connected = False


def daemon_started(v: Views, seq: int, e: ev.DaemonStarted) -> None:
    v.runtime.connected = False  # a new run registers again


def _is_pod(v: Views, sandbox: SandboxView) -> bool:
    """The sandbox is the pod its uid names in the pods view: same namespace and name (a
    sandbox carrying another pod's uid neither owes nor cancels that pod's release), or a pod
    recorded without them (``core.runtime_decisions.not_its_pod``)."""
    pod = v.pods.pods.get(sandbox.uid)
    return pod is not None and (pod.namespace, pod.name) in ((sandbox.namespace, sandbox.name), ("", ""))


def sandbox_started(v: Views, seq: int, e: ev.PodSandboxStarted) -> None:
    p = e.pod
    sandbox = SandboxView(uid=p.uid, namespace=p.namespace, name=p.name, since_seq=seq)
    v.runtime.sandboxes[e.sandbox_id] = sandbox
    if _is_pod(v, sandbox):
        v.runtime.gone.pop(p.uid, None)


def sandbox_removed(v: Views, seq: int, e: ev.PodSandboxRemoved) -> None:
    """A release is owed when the last recorded sandbox of the pod goes; a sandbox the log never
    saw start (a second report of one removal) or of another pod's identity owes nothing."""
    rt = v.runtime
    removed = rt.sandboxes.pop(e.sandbox_id, None)
    for cid in [cid for cid, c in rt.containers.items() if c.sandbox_id == e.sandbox_id]:
        del rt.containers[cid]
    if removed is None or not _is_pod(v, removed):
        return
    if not any(s.uid == e.pod_uid and _is_pod(v, s) for s in rt.sandboxes.values()):
        rt.gone[e.pod_uid] = seq


def pod_removed(v: Views, seq: int, e: ev.PodRemoved | ev.AdmissionRejected) -> None:
    uid = e.pod_uid if isinstance(e, ev.PodRemoved) else e.pod.uid
    if uid in v.pods.pods:  # one container refused (state.pods ran first): the pod's release is still owed
        return
    v.runtime.gone.pop(uid, None)


def container_created(v: Views, seq: int, e: ev.ContainerCreated) -> None:
    v.runtime.containers[e.container_id] = RuntimeContainerView(
        sandbox_id=e.sandbox_id,
        pod_uid=e.pod_uid,
        name=e.name,
        cgroups_path=e.cgroups_path,
        cpus=list(e.cpus),
        mems=list(e.mems),
        devices=list(e.devices),
        device_ids={r: list(ids) for r, ids in e.device_ids.items()},
        cdi_devices=list(e.cdi_devices),
        adjusted=e.adjusted,
        created_seq=seq,
    )


def container_started(v: Views, seq: int, e: ev.ContainerStarted) -> None:
    c = v.runtime.containers.get(e.container_id)
    if c is not None:
        c.state = "running"


def container_stopped(v: Views, seq: int, e: ev.ContainerStopped) -> None:
    c = v.runtime.containers.get(e.container_id)
    if c is not None:
        c.state = "stopped"
        c.exit_code = e.exit_code


def container_removed(v: Views, seq: int, e: ev.ContainerRemoved) -> None:
    v.runtime.containers.pop(e.container_id, None)


def container_cpus_updated(v: Views, seq: int, e: ev.ContainerCPUsUpdated) -> None:
    c = v.runtime.containers.get(e.container_id)
    if c is not None:
        c.cpus = list(e.cpus)
        c.mems = list(e.mems)


HANDLERS: Handlers = {
    ev.RuntimeConnected: connected,
    ev.RuntimeDisconnected: disconnected,
    ev.DaemonStarted: daemon_started,
    ev.PodSandboxStarted: sandbox_started,
    ev.PodSandboxRemoved: sandbox_removed,
    ev.PodRemoved: pod_removed,
    ev.AdmissionRejected: pod_removed,
    ev.ContainerCreated: container_created,
    ev.ContainerStarted: container_started,
    ev.ContainerStopped: container_stopped,
    ev.ContainerRemoved: container_removed,
    ev.ContainerCPUsUpdated: container_cpus_updated,
}
