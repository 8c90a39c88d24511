"""Facts observed beside a kubelet (``serve --beside-kubelet``), as audit, log and replay show them.

(a) ``audit device`` lists the kubelet's holders of a device (and of a DRA claim's device) with
    namespace/name/uid, container, the runtime's container ids whose lives overlap the hold, from
    and to, labelled "(kubelet)" in text and ``decided_by`` in JSON; a pod the kubelet named
    without a uid takes it from the runtime's sandbox of that name; a name reused is two pods.
(b) ``audit pod`` shows an observed pod's containers, devices, CPUs, memory, claims and release.
(c) Both show the observation gaps that overlap what they list (an open one up to now).
(d) ``log`` and ``replay --step`` say each observed event in words, "(kubelet)", escaped.

Logs are built with EventLog.append, as the daemon writes them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventsrc import events as ev
from eventsrc.layout import Layout
from eventsrc.log.store import EventLog
from eventsrc.offline import audit_queries, audit_render
from eventsrc.offline.log_replay import step, step_line
from eventsrc.offline.render import record_line
from eventsrc.state.views import Views

RES = "example.com/dev"
DRIVER = "gpu.example.com"
T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
SEC = 1_000_000_000
CLAIM = ev.ClaimRef(uid="claim-1", namespace="default", name="gpu")
GPU = ev.ObservedClaimDevice(driver=DRIVER, pool="node-a", device="gpu-0", cdi_devices=["gpu.example.com/gpu=gpu-0"])


def ts(n: int) -> int:
    return T0 + n * SEC


def web(uid: str = "") -> ev.PodRef:
    return ev.PodRef(uid=uid, namespace="default", name="web")


def created(cid: str, sandbox: str, uid: str) -> ev.ContainerCreated:
    return ev.ContainerCreated(container_id=cid, sandbox_id=sandbox, pod_uid=uid, name="main", cpus=[2, 3], mems=[0])


STEPS: list[list[ev.EventBase]] = [
    # 0: the kubelet lists web (no uid yet) with dev-0
    [
        ev.KubeletPodObserved(pod=web(), source="List"),
        ev.KubeletDevicesObserved(pod=web(), container="main", resource=RES, device_ids=["dev-0"], numa_nodes=[0]),
    ],
    [ev.PodSandboxStarted(sandbox_id="sb-1", pod=web("uid-1"))],  # 1
    [created("c-1", "sb-1", "uid-1"), ev.ContainerStarted(container_id="c-1", pod_uid="uid-1")],  # 2
    [ev.ContainerStopped(container_id="c-1", pod_uid="uid-1", exit_code=1)],  # 3: restarted as c-2
    [created("c-2", "sb-1", "uid-1"), ev.ContainerStarted(container_id="c-2", pod_uid="uid-1")],  # 4
    [  # 5
        ev.KubeletCPUsObserved(pod=web(), container="main", cpus=[3, 2]),
        ev.KubeletMemoryObserved(
            pod=web(), container="main", memory=[ev.ObservedMemory(memory_type="memory", size=1 << 30)]
        ),
        ev.KubeletClaimObserved(pod=web(), container="main", claim=CLAIM, devices=[GPU]),
    ],
    [ev.ObservationGapFound(source="kubelet", since_ns=ts(6), reason="socket missing")],  # 6
    [ev.ObservationGapFound(source="kubelet", since_ns=ts(6), until_ns=ts(7), reason="socket missing")],  # 7
    [  # 8: web goes
        ev.KubeletDevicesReleased(pod=web(), container="main", resource=RES, device_ids=["dev-0"], reason="pod gone"),
        ev.KubeletCPUsReleased(pod=web(), container="main", cpus=[2, 3], reason="pod gone"),
        ev.KubeletClaimReleased(pod=web(), container="main", claim=CLAIM, devices=[GPU], reason="pod gone"),
        ev.ContainerStopped(container_id="c-2", pod_uid="uid-1", exit_code=0),
        ev.PodSandboxRemoved(sandbox_id="sb-1", pod_uid="uid-1"),
        ev.KubeletPodReleased(pod=web(), reason="not listed"),
    ],
    [  # 9: a new pod with the same name gets dev-0
        ev.KubeletPodObserved(pod=web("uid-2")),
        ev.KubeletDevicesObserved(pod=web("uid-2"), container="main", resource=RES, device_ids=["dev-0"]),
        ev.PodSandboxStarted(sandbox_id="sb-2", pod=web("uid-2")),
        created("c-3", "sb-2", "uid-2"),
    ],
    [ev.ObservationGapFound(source="runtime", since_ns=ts(10), reason="NRI disconnected")],  # 10: still open
    [ev.KubeletPodObserved(pod=ev.PodRef(uid="", namespace="default", name="lonely"))],  # 11: no sandbox, ever
]


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    root = tmp_path / "kubelet"
    with EventLog(Layout(root).log) as w:
        for n, events in enumerate(STEPS):
            w.append(events, f"cid-{n}", ts(n))
    with EventLog(Layout(root).log, readonly=True) as r:
        yield r


def test_audit_device_names_the_kubelets_holders_with_their_container_ids(log: EventLog) -> None:
    t = audit_queries.device_timeline(log, RES, "dev-0")
    assert [(h.decided_by, h.pod.uid, h.container, h.still_held) for h in t.holders] == [
        ("kubelet", "uid-1", "main", False),  # its uid from the runtime's sandbox of that name
        ("kubelet", "uid-2", "main", True),  # the name reused: another pod
    ]
    first, second = t.holders
    assert (first.pod.namespace, first.pod.name) == ("default", "web")
    assert first.start is not None and first.start.ts_ns == ts(0)
    assert first.end is not None and first.end.ts_ns == ts(8)
    assert (first.released_by, first.reason) == ("KubeletDevicesReleased", "pod gone")
    # restarted: both ids, each with its times
    assert [(c.id, c.stopped is not None) for c in first.container_ids] == [("c-1", True), ("c-2", True)]
    assert [c.id for c in second.container_ids] == ["c-3"]
    assert [(g.source, g.until_ns) for g in t.gaps] == [("kubelet", ts(7)), ("runtime", 0)]

    text = "\n".join(audit_render.device_lines(t))
    assert "main (kubelet)" in text
    assert "c-1: created" in text and "c-2: created" in text
    assert f"not seen: kubelet from {audit_queries.iso(ts(6))} to {audit_queries.iso(ts(7))} (socket missing)" in text
    assert f"not seen: runtime from {audit_queries.iso(ts(10))} until now (still open) (NRI disconnected)" in text
    holders = json.loads(audit_render.to_json(t))["holders"]
    assert [h["decided_by"] for h in holders] == ["kubelet", "kubelet"]


def test_audit_device_of_a_claim_and_in_a_window(log: EventLog) -> None:
    t = audit_queries.device_timeline(log, DRIVER, "node-a/gpu-0")
    assert [(h.pod.uid, h.container, h.note, h.released_by) for h in t.holders] == [
        ("uid-1", "main", "claim default/gpu", "KubeletClaimReleased")
    ]
    late = audit_queries.device_timeline(log, RES, "dev-0", since_ns=ts(9))
    assert [h.pod.uid for h in late.holders] == ["uid-2"]
    assert [g.source for g in late.gaps] == ["runtime"]  # the kubelet's gap closed before the window


def test_audit_pod_shows_what_the_kubelet_gave_and_its_release(log: EventLog) -> None:
    newest = audit_queries.pod_history(log, "default/web")
    assert (newest.uid, newest.other_uids) == ("uid-2", ["uid-1"])
    h = audit_queries.pod_history(log, "uid-1")
    assert (h.namespace, h.name) == ("default", "web")
    o = h.observed
    assert o is not None and o.uid_from == "runtime"
    assert o.released is not None and o.released.ts_ns == ts(8) and o.reason == "not listed"
    (c,) = o.containers
    assert [(d.resource, d.device_ids, d.reason) for d in c.devices] == [(RES, ["dev-0"], "pod gone")]
    assert [(u.cpus, u.until is not None) for u in c.cpus] == [([2, 3], True)]
    assert [m.memory[0].size for m in c.memory] == [1 << 30]
    assert [(u.claim.name, u.released is not None) for u in c.claims] == [("gpu", True)]
    assert [x.id for x in c.container_ids] == ["c-1", "c-2"]
    assert [g.source for g in h.gaps] == ["kubelet"]  # the runtime's began after the pod was gone
    text = "\n".join(audit_render.pod_lines(h))
    assert "decided by the kubelet (observed) (uid from the runtime's sandbox)" in text
    assert "exclusive cpus 2-3" in text and "claim default/gpu: gpu.example.com node-a/gpu-0" in text
    assert "released by the kubelet" in text
    assert json.loads(audit_render.to_json(h))["observed"]["decided_by"] == "kubelet"

    lonely = audit_queries.pod_history(log, "default/lonely")
    assert lonely.uid == "" and lonely.observed is not None and "uid unknown" in lonely.resolved
    assert [g.source for g in lonely.gaps] == ["runtime"]  # still listed: an open gap counts


def test_log_and_step_lines_say_kubelet_and_escape() -> None:
    evil = ev.PodRef(uid="", namespace="default", name="x\x1b[31m")
    events: list[ev.EventBase] = [e for batch in STEPS for e in batch] + [
        ev.KubeletDevicesObserved(pod=evil, container="c\n2", resource=RES, device_ids=["dev-\u202e1"]),
        ev.KubeletAllocatableChanged(added={RES: [ev.DeviceInfo(id="dev-9", health="Healthy")]}, cpus_removed=[5]),
        ev.KubeletSharedPoolObserved(cpus=[0, 1], policy="static", source="cpu_manager_state"),
        ev.KubeletCheckpointReadFailed(path="/var/lib/kubelet/cpu_manager_state", reason="checksum mismatch"),
    ]
    views = Views()
    lines = []
    for i, e in enumerate(events, 1):
        rec = ev.Record(seq=i, ts_ns=ts(i), correlation_id="c", version=1, event=e)
        lines.append((type(e), record_line(rec), step_line(rec, step(views, rec))))
    for kind, line, stepped in lines:
        if kind.__name__.startswith("Kubelet"):
            assert "(kubelet)" in line and "(kubelet)" in stepped, line
        assert "\x1b" not in line + stepped and "\n" not in line + stepped and "\u202e" not in line + stepped
    said = {kind.__name__: line for kind, line, _ in lines}  # the last of each type
    assert any("(kubelet) default/web/main (uid-2) holds example.com/dev dev-0" in x for _, x, _ in lines)
    assert "(kubelet) default/x\\x1b[31m/c\\n2 holds example.com/dev dev-\\u202e1" in said["KubeletDevicesObserved"]
    assert "allocatable: +example.com/dev dev-9; -cpus 5" in said["KubeletAllocatableChanged"]
    assert (
        "checkpoint /var/lib/kubelet/cpu_manager_state not read: checksum mismatch"
        in said["KubeletCheckpointReadFailed"]
    )
    assert "not seen: runtime from" in said["ObservationGapFound"] and "(still open)" in said["ObservationGapFound"]
