"""What the container runtime did (NRI events), as audit and replay show it.

(a) ``audit pod`` lists a pod's sandboxes and containers: ids, names, cpusets, devices,
    device ids, CDI devices, with the times each was created, started, updated, stopped,
    removed; ``audit device`` the containers that ran with the device. Read through the index.
(b) ``replay --step`` explains each runtime event on one line.
(c) ``replay --check`` flags a container eventsrc adjusted onto CPUs its pod does not hold
    (``container-not-held``), and not one that matches or one the runtime placed itself.
(d) What came from the runtime is escaped in text, exact in JSON.

Logs are built with EventLog.append under a kubelet root, as the daemon writes them.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from eventsrc import events as ev
from eventsrc.layout import Layout
from eventsrc.log.store import EventLog
from eventsrc.offline import audit_queries, audit_render
from tests.conftest import run_cli

RES = "example.com/dev"
CDI = "example.com/dev=dev-0"
T0 = dt.datetime(2026, 11, 21, 23, 0, tzinfo=dt.UTC)
Batch = tuple[str, int, list[ev.EventBase]]  # correlation id, seconds after T0, events

SANDBOX = "5f0c1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f"
CONTAINER = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"


def ts(seconds: int) -> int:
    return int((T0 + dt.timedelta(seconds=seconds)).timestamp()) * 1_000_000_000


def time_of(seconds: int) -> str:
    return audit_queries.iso(ts(seconds))


def write_log(root: Path, batches: list[Batch]) -> dict[str, ev.Record]:
    """A log under kubelet root ``root`` with ``batches`` appended; event type -> its last record."""
    out: dict[str, ev.Record] = {}
    with EventLog(Layout(root).log) as log:
        for cid, seconds, events in batches:
            for rec in log.append(events, cid, ts(seconds)):
                out[rec.type] = rec
    return out


def ref(name: str) -> ev.PodRef:
    return ev.PodRef(uid=f"uid-{name}", namespace="default", name=name)


def admitted_with_cpus(name: str, cpus: list[int], seconds: int) -> list[Batch]:
    spec = [ev.ContainerSpec(name="main", requests={"cpu": "1"}, limits={"cpu": "1"})]
    return [
        (
            f"adm-{name}",
            seconds,
            [
                ev.PodAdmissionStarted(pod=ref(name), containers=spec),
                ev.CPUsAssigned(pod_uid=f"uid-{name}", container="main", cpus=cpus),
                ev.PodAdmitted(pod=ref(name), containers=spec, qos_class="Guaranteed"),
            ],
        )
    ]


def created(name: str, cpus: list[int], *, adjusted: bool = True, cid: str = "", **more: Any) -> ev.ContainerCreated:
    return ev.ContainerCreated(
        container_id=cid or f"c-{name}",
        sandbox_id=more.pop("sandbox_id", f"sb-{name}"),
        pod_uid=f"uid-{name}",
        name=more.pop("container", "main"),
        cpus=cpus,
        mems=[0],
        adjusted=adjusted,
        **more,
    )


def lifecycle(container_name: str = "main") -> list[Batch]:
    """Pod a, admitted with dev-0 and CPU 1, run by the runtime from its sandbox's start to
    its removal; every runtime event type once."""
    spec = [ev.ContainerSpec(name=container_name, requests={RES: "1", "cpu": "1"}, limits={RES: "1", "cpu": "1"})]
    uid = "uid-a"
    return [
        (
            "boot",
            0,
            [
                ev.DaemonStarted(boot_id="b", version="0.1.0", instance_id="inst-1"),
                ev.PluginRegistered(resource=RES, endpoint="dev.sock"),
                ev.DevicesAdded(
                    resource=RES,
                    devices=[ev.DeviceInfo(id="dev-0", health="Healthy"), ev.DeviceInfo(id="dev-1", health="Healthy")],
                ),
            ],
        ),
        ("nri", 1, [ev.RuntimeConnected(runtime="containerd", runtime_version="2.1.0", plugin="10-eventsrc")]),
        ("sb", 2, [ev.PodSandboxStarted(sandbox_id=SANDBOX, pod=ref("a"))]),
        (
            "adm-a",
            3,
            [
                ev.PodAdmissionStarted(pod=ref("a"), containers=spec),
                ev.DevicesReserved(pod_uid=uid, container=container_name, resource=RES, device_ids=["dev-0"]),
                ev.CPUsAssigned(pod_uid=uid, container=container_name, cpus=[1]),
            ],
        ),
        (
            "adm-a",
            4,
            [
                ev.DevicesAllocated(pod_uid=uid, container=container_name, resource=RES, device_ids=["dev-0"]),
                ev.PodAdmitted(pod=ref("a"), containers=spec, qos_class="Guaranteed"),
                ev.ContainerCreated(
                    container_id=CONTAINER,
                    sandbox_id=SANDBOX,
                    pod_uid=uid,
                    name=container_name,
                    cgroups_path="/kubepods/pod-a/ctr",
                    cpus=[1],
                    mems=[0],
                    devices=["/dev/x0"],
                    device_ids={RES: ["dev-0"]},
                    cdi_devices=[CDI],
                    envs=["DEV"],
                    adjusted=True,
                ),
            ],
        ),
        ("start", 5, [ev.ContainerStarted(container_id=CONTAINER, pod_uid=uid)]),
        (
            "pool",
            6,
            [
                ev.ContainerCPUsUpdated(
                    container_id=CONTAINER, pod_uid=uid, cpus=[1], mems=[0, 1], reason="mems widened"
                )
            ],
        ),
        ("stop", 7, [ev.ContainerStopped(container_id=CONTAINER, pod_uid=uid, exit_code=0)]),
        ("rm", 8, [ev.ContainerRemoved(container_id=CONTAINER, pod_uid=uid, reason="removed by the runtime")]),
        ("rm-sb", 9, [ev.PodSandboxRemoved(sandbox_id=SANDBOX, pod_uid=uid, reason="RemovePodSandbox")]),
        ("nri", 10, [ev.RuntimeDisconnected(reason="connection closed")]),
    ]


@pytest.fixture
def lifecycle_log(tmp_path: Path) -> tuple[Path, dict[str, ev.Record]]:
    root = tmp_path / "root"
    return root, write_log(root, lifecycle())


def reader(root: Path) -> EventLog:
    return EventLog(Layout(root).log, readonly=True)


def at(rec: ev.Record) -> dict[str, Any]:
    return {"seq": rec.seq, "ts_ns": rec.ts_ns, "time": audit_queries.iso(rec.ts_ns)}


# --------------------------------------------------------------------------- (a) audit


def test_audit_pod_shows_its_sandbox_and_containers_with_times(
    lifecycle_log: tuple[Path, dict[str, ev.Record]],
) -> None:
    root, r = lifecycle_log
    with reader(root) as log:
        h = json.loads(audit_render.to_json(audit_queries.pod_history(log, "uid-a")))
    assert h["sandboxes"] == [
        {
            "id": SANDBOX,
            "started": at(r["PodSandboxStarted"]),
            "removed": at(r["PodSandboxRemoved"]),
            "reason": "RemovePodSandbox",
        }
    ]
    (c,) = h["containers"]
    assert c == {
        "id": CONTAINER,
        "name": "main",
        "sandbox_id": SANDBOX,
        "cgroups_path": "/kubepods/pod-a/ctr",
        "cpus": [1],
        "mems": [0],
        "devices": ["/dev/x0"],
        "device_ids": {RES: ["dev-0"]},
        "cdi_devices": [CDI],
        "envs": ["DEV"],
        "adjusted": True,
        "created": at(r["ContainerCreated"]),
        "started": at(r["ContainerStarted"]),
        "cpus_updated": [{"at": at(r["ContainerCPUsUpdated"]), "cpus": [1], "mems": [0, 1], "reason": "mems widened"}],
        "stopped": at(r["ContainerStopped"]),
        "exit_code": 0,
        "removed": at(r["ContainerRemoved"]),
        "reason": "removed by the runtime",
    }
    # The runtime's records are in the pod's history too.
    types = [x["type"] for x in h["events"]]
    for t in ("PodSandboxStarted", "ContainerCreated", "ContainerStarted", "ContainerCPUsUpdated"):
        assert t in types, t
    assert types[-1] == "PodSandboxRemoved"

    text = run_cli("audit", "pod", "uid-a", root=root, check=True).stdout
    seq = {k: v.seq for k, v in r.items()}
    for expected in (
        "sandboxes (1)",
        f"  {SANDBOX}: started {time_of(2)} (seq {seq['PodSandboxStarted']}); "
        f"removed {time_of(9)} (seq {seq['PodSandboxRemoved']}): RemovePodSandbox",
        "containers (1)",
        f"  main {CONTAINER}: removed, in sandbox {SANDBOX}; set by eventsrc",
        "    cpus 1, mems 0",
        "    devices: /dev/x0",
        f"    device ids: {RES} dev-0",
        f"    cdi: {CDI}",
        "    envs: DEV",
        "    cgroups: /kubepods/pod-a/ctr",
        f"    created  {time_of(4)} (seq {seq['ContainerCreated']})",
        f"    started  {time_of(5)} (seq {seq['ContainerStarted']})",
        f"    cpuset   {time_of(6)} (seq {seq['ContainerCPUsUpdated']}): cpus 1, mems 0-1 (mems widened)",
        f"    stopped  {time_of(7)} (seq {seq['ContainerStopped']}), exit code 0",
        f"    removed  {time_of(8)} (seq {seq['ContainerRemoved']}): removed by the runtime",
    ):
        assert expected in text.splitlines(), (expected, text)


def test_audit_pod_of_a_pod_the_runtime_ran_alone(tmp_path: Path) -> None:
    """Observe mode: no admission records, only the runtime's. NAMESPACE/NAME finds it through
    its sandbox; an unknown exit code and a container still running say so."""
    root = tmp_path / "root"
    write_log(
        root,
        [
            ("sb", 1, [ev.PodSandboxStarted(sandbox_id="sb-o", pod=ref("o"))]),
            ("c", 2, [created("o", [0, 1, 2, 3], adjusted=False, sandbox_id="sb-o")]),
            ("c", 3, [ev.ContainerStarted(container_id="c-o", pod_uid="uid-o")]),
            ("c2", 4, [created("o", [0, 1], adjusted=False, sandbox_id="sb-o", cid="c-o2", container="side")]),
            ("c2", 5, [ev.ContainerStopped(container_id="c-o2", pod_uid="uid-o")]),
        ],
    )
    text = run_cli("audit", "pod", "default/o", root=root, check=True).stdout
    lines = text.splitlines()
    assert "pod default/o  uid uid-o" in lines
    assert "default/o is pod uid-o" in lines
    assert "  main c-o: running, in sandbox sb-o; as the runtime applied it" in lines
    assert "    cpus 0-3, mems 0" in lines
    assert "  side c-o2: stopped, in sandbox sb-o; as the runtime applied it" in lines
    assert any(x.startswith("    stopped  ") and x.endswith(", exit code unknown") for x in lines), text
    assert f"  sb-o: started {time_of(1)} (seq 1); not removed" in lines


def test_audit_device_lists_the_containers_that_ran_with_it(lifecycle_log: tuple[Path, dict[str, ev.Record]]) -> None:
    root, r = lifecycle_log
    with reader(root) as log:
        t = json.loads(audit_render.to_json(audit_queries.device_timeline(log, RES, "dev-0")))
        (run,) = t["containers"]
        assert run["pod"] == {"uid": "uid-a", "namespace": "default", "name": "a"}
        c = run["container"]
        assert (c["id"], c["name"], c["device_ids"]) == (CONTAINER, "main", {RES: ["dev-0"]})
        assert (c["created"], c["started"], c["stopped"], c["removed"]) == (
            at(r["ContainerCreated"]),
            at(r["ContainerStarted"]),
            at(r["ContainerStopped"]),
            at(r["ContainerRemoved"]),
        )
        # Another device of the resource: no container ran with it.
        assert audit_queries.device_timeline(log, RES, "dev-1").containers == []
        # A window after the container stopped leaves it out; one up to its start shows it
        # as it was then (not yet stopped).
        after = audit_queries.device_timeline(log, RES, "dev-0", since_seq=r["ContainerRemoved"].seq)
        assert after.containers == []
        then = audit_queries.device_timeline(log, RES, "dev-0", until_seq=r["ContainerStarted"].seq)
        (early,) = then.containers
        assert early.container.started is not None and early.container.stopped is None

    text = run_cli("audit", "device", RES, "dev-0", root=root, check=True).stdout
    lines = text.splitlines()
    assert "containers the runtime ran with it (1)" in lines
    assert f"  default/a (uid-a) main {CONTAINER}: {RES} dev-0" in lines
    seq = {k: v.seq for k, v in r.items()}
    assert (
        f"    created {time_of(4)} (seq {seq['ContainerCreated']}); "
        f"started {time_of(5)} (seq {seq['ContainerStarted']}); "
        f"stopped {time_of(7)} (seq {seq['ContainerStopped']}) (exit code 0); "
        f"removed {time_of(8)} (seq {seq['ContainerRemoved']}): removed by the runtime"
    ) in lines
    out = json.loads(run_cli("audit", "device", RES, "dev-0", "-o", "json", root=root, check=True).stdout)
    assert [x["container"]["id"] for x in out["containers"]] == [CONTAINER]


def test_runtime_answers_come_from_the_index(
    lifecycle_log: tuple[Path, dict[str, ev.Record]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, r = lifecycle_log

    def no_scan(*args: object, **kwargs: object) -> None:
        raise AssertionError("an audit query scanned the log")

    for name in ("records", "raw_chunks", "read"):
        monkeypatch.setattr(EventLog, name, no_scan)
    with reader(root) as log:
        assert [c.id for c in audit_queries.pod_history(log, "default/a").containers] == [CONTAINER]
        assert [x.container.id for x in audit_queries.device_timeline(log, RES, "dev-0").containers] == [CONTAINER]


# --------------------------------------------------------------------------- (b) replay --step


def test_step_explains_each_runtime_event(lifecycle_log: tuple[Path, dict[str, ev.Record]]) -> None:
    root, r = lifecycle_log
    proc = run_cli("replay", str(root), "--step")
    assert proc.returncode == 0, proc.stderr
    by_seq = {int(line.split()[0]): line for line in proc.stdout.splitlines()}
    short_sb, short_c = SANDBOX[:12], CONTAINER[:12]
    label = f"container main {short_c} of default/a"
    expected = {
        "RuntimeConnected": "runtime: none -> containerd 2.1.0 connected (enforce)",
        "PodSandboxStarted": f"sandbox {short_sb} of default/a: none -> running",
        "ContainerCreated": f"{label}: none -> created (set by eventsrc): cpus 1, mems 0; "
        f"devices {RES} dev-0, nodes /dev/x0, cdi {CDI}",
        "ContainerStarted": f"{label}: created -> running",
        "ContainerCPUsUpdated": f"cpuset of {label}: cpus 1, mems 0 -> cpus 1, mems 0-1 (mems widened)",
        "ContainerStopped": f"{label}: running -> stopped (exit code 0)",
        "ContainerRemoved": f"{label}: stopped (exit code 0) -> removed (removed by the runtime)",
        "PodSandboxRemoved": f"sandbox {short_sb} of default/a: running -> removed (RemovePodSandbox)",
        "RuntimeDisconnected": "runtime: containerd 2.1.0 connected (enforce) -> containerd 2.1.0 disconnected "
        "(connection closed)",
    }
    for type_, text in expected.items():
        line = by_seq[r[type_].seq]
        assert type_ in line and line.endswith(f"  {text}"), (type_, line)

    # A sandbox removed with a container still in it: the container goes with it. A restart
    # without RuntimeDisconnected (a crash): the new run is not connected until it registers.
    root2 = root.parent / "root2"
    write_log(
        root2,
        [
            ("nri", 1, [ev.RuntimeConnected(runtime="containerd", runtime_version="2.1.0", mode="observe")]),
            ("sb", 2, [ev.PodSandboxStarted(sandbox_id="sb-x", pod=ref("x"))]),
            ("c", 3, [created("x", [0], adjusted=False)]),
            ("rm", 4, [ev.PodSandboxRemoved(sandbox_id="sb-x", pod_uid="uid-x")]),
            ("boot", 5, [ev.DaemonStarted(boot_id="b2", version="0.1.0", instance_id="inst-2")]),
        ],
    )
    lines = run_cli("replay", str(root2), "--step", check=True).stdout.splitlines()
    assert lines[2].endswith(
        "  container main c-x of default/x: none -> created (as the runtime applied it): cpus 0, mems 0; devices none"
    )
    assert lines[3].endswith(
        "  sandbox sb-x of default/x: running -> removed; container main c-x of default/x: created -> removed"
    )
    assert lines[4].endswith("; runtime: containerd 2.1.0 connected (observe) -> containerd 2.1.0 disconnected")

    out = run_cli("replay", str(root), "--step", "-o", "json", check=True).stdout.splitlines()
    created_json = next(json.loads(x) for x in out if json.loads(x)["type"] == "ContainerCreated")
    assert created_json["changes"] == [
        {
            "what": label,
            "before": "none",
            "after": f"created (set by eventsrc): cpus 1, mems 0; devices {RES} dev-0, nodes /dev/x0, cdi {CDI}",
        }
    ]


# --------------------------------------------------------------------------- (c) replay --check


def check(root: Path, batches: list[Batch]) -> tuple[int, dict[str, Any], dict[str, ev.Record]]:
    records = write_log(root, batches)
    proc = run_cli("replay", str(root), "--check", "-o", "json")
    return proc.returncode, json.loads(proc.stdout), records


def test_check_flags_a_container_on_cpus_its_pod_does_not_hold(tmp_path: Path) -> None:
    runtime: list[Batch] = [("sb", 2, [ev.PodSandboxStarted(sandbox_id="sb-b", pod=ref("b"))])]
    base = [*admitted_with_cpus("b", [1], 1), *runtime]

    rc, out, recs = check(tmp_path / "bad", [*base, ("c", 3, [created("b", [0, 1])])])
    assert rc == 1
    v = out["violation"]
    assert (v["rule"], v["seq"], v["correlation_id"]) == ("container-not-held", recs["ContainerCreated"].seq, "c")
    assert v["message"] == "container main (c-b) of default/b runs on CPUs [0, 1] but its pod holds [1]"
    assert v["invariant"] == "a container eventsrc adjusted runs only with the CPUs and devices its pod holds"
    text = run_cli("replay", str(tmp_path / "bad"), "--check").stdout
    assert f"invariant broken at seq {recs['ContainerCreated'].seq}: container-not-held" in text

    rc, out, _ = check(tmp_path / "good", [*base, ("c", 3, [created("b", [1])])])
    assert (rc, out["ok"]) == (0, True), out

    # What the runtime applied on its own (observe mode) answers to its kubelet, not to this rule.
    rc, out, _ = check(tmp_path / "observed", [*base, ("c", 3, [created("b", [0, 1], adjusted=False)])])
    assert (rc, out["ok"]) == (0, True), out

    # A cpuset update that moves a matching container off its pod's CPUs is flagged at the update.
    rc, out, recs = check(
        tmp_path / "updated",
        [
            *base,
            ("c", 3, [created("b", [1])]),
            ("u", 4, [ev.ContainerCPUsUpdated(container_id="c-b", pod_uid="uid-b", cpus=[0, 1], mems=[0])]),
        ],
    )
    assert rc == 1 and out["violation"]["rule"] == "container-not-held"
    assert out["violation"]["seq"] == recs["ContainerCPUsUpdated"].seq


def test_check_passes_the_full_runtime_lifecycle(lifecycle_log: tuple[Path, dict[str, ev.Record]]) -> None:
    root, _ = lifecycle_log
    proc = run_cli("replay", str(root), "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no invariant broken" in proc.stdout


# --------------------------------------------------------------------------- (d) escaping


def test_runtime_strings_are_escaped_in_text_and_exact_in_json(tmp_path: Path) -> None:
    root = tmp_path / "root"
    bad = "ma\x1b[31min\nFAKE"
    records = write_log(
        root,
        [
            *admitted_with_cpus("e", [1], 1),
            ("sb", 2, [ev.PodSandboxStarted(sandbox_id="sb-e\u202e", pod=ref("e"))]),
            (
                "c",
                3,
                [
                    created(
                        "e",
                        [0, 1],
                        container=bad,
                        cid="c-e\x07",
                        cdi_devices=["vendor.com/x=\x1b]0;t\x07"],
                        devices=["/dev/\tx"],
                        device_ids={RES: ["dev-\x1b"]},
                    )
                ],
            ),
        ],
    )
    # Its name is not its pod's container's, so --check quotes it for a device its pod does not hold.
    for args, shown in (
        (["audit", "pod", "uid-e"], "ma\\x1b[31min\\nFAKE c-e\\x07"),
        (["replay", str(root), "--step"], "container ma\\x1b[31min\\nFAKE c-e\\x07 of default/e"),
        (["replay", str(root), "--check"], "container ma\\x1b[31min\\nFAKE (c-e\\x07) of default/e runs with"),
    ):
        out = run_cli(*args, root=root).stdout
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out and "\t" not in out, args
        assert "\nFAKE" not in out, args
        assert shown in out, (args, out)
    text = run_cli("audit", "pod", "uid-e", root=root, check=True).stdout
    assert "  sb-e\\u202e: started" in text
    assert "    cdi: vendor.com/x=\\x1b]0;t\\x07" in text
    assert "    devices: /dev/\\tx" in text
    assert f"    device ids: {RES} dev-\\x1b" in text
    h = json.loads(run_cli("audit", "pod", "uid-e", "-o", "json", root=root, check=True).stdout)
    (c,) = h["containers"]
    assert (c["name"], c["id"], c["cdi_devices"]) == (bad, "c-e\x07", ["vendor.com/x=\x1b]0;t\x07"])
    made = records["ContainerCreated"].event
    assert isinstance(made, ev.ContainerCreated) and made.name == bad
