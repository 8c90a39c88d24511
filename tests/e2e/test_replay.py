"""eventsrc replay: the views at a point, every change, and the invariants checked at every event."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eventsrc import events as ev
from eventsrc.log.store import EventLog
from tests.conftest import REPO, run_cli
from tests.support.eventually import eventually

RES = "example.com/dev"
T0 = dt.datetime(2026, 11, 21, 23, 0, tzinfo=dt.UTC)
Batch = tuple[str, float, list[ev.EventBase]]  # correlation id, seconds after T0, events


def ts(seconds: float) -> int:
    return int((T0 + dt.timedelta(seconds=seconds)).timestamp()) * 1_000_000_000


def write_log(path: Path, batches: list[Batch]) -> list[ev.Record]:
    """A log in ``path`` (a kubelet root's eventsrc/log) with ``batches`` appended in order."""
    out: list[ev.Record] = []
    with EventLog(path / "eventsrc" / "log") as log:
        for cid, seconds, events in batches:
            out += log.append(events, cid, ts(seconds))
    return out


def replay(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("replay", str(path), *args)


def pod(name: str, *containers: tuple[str, str]) -> ev.PodAdmissionStarted:
    specs = [ev.ContainerSpec(name=c, kind=kind) for c, kind in containers or [("main", "app")]]
    return ev.PodAdmissionStarted(pod=ev.PodRef(uid=f"uid-{name}", namespace="default", name=name), containers=specs)


def admitted(name: str) -> ev.PodAdmitted:
    return ev.PodAdmitted(pod=ev.PodRef(uid=f"uid-{name}", namespace="default", name=name))


def reserved(name: str, ids: list[str], container: str = "main") -> ev.DevicesReserved:
    return ev.DevicesReserved(pod_uid=f"uid-{name}", container=container, resource=RES, device_ids=ids)


def allocated(name: str, ids: list[str], container: str = "main") -> ev.DevicesAllocated:
    return ev.DevicesAllocated(pod_uid=f"uid-{name}", container=container, resource=RES, device_ids=ids)


def cpus(name: str, ids: list[int], container: str = "main") -> ev.CPUsAssigned:
    return ev.CPUsAssigned(pod_uid=f"uid-{name}", container=container, cpus=ids)


BOOT: list[Batch] = [
    (
        "boot",
        0,
        [
            ev.DaemonStarted(boot_id="b", version="0.1.0", instance_id="inst-1"),
            ev.PluginRegistered(resource=RES, endpoint="sample.sock"),
            ev.DevicesAdded(resource=RES, devices=[ev.DeviceInfo(id=f"dev-{i}", health="Healthy") for i in range(4)]),
        ],
    ),
]


def admission(name: str, seconds: float, ids: list[str], cid: str = "") -> list[Batch]:
    cid = cid or f"adm-{name}"
    return [
        (cid, seconds, [pod(name), reserved(name, ids)]),
        (cid, seconds + 1, [allocated(name, ids), admitted(name)]),
    ]


def scenario() -> list[Batch]:
    """Normal traffic around a deliberately broken event: pod b is given dev-1, which the
    live pod a holds."""
    return [
        *BOOT,
        *admission("a", 60, ["dev-1"]),  # seqs 4-7
        ("adm-b", 120, [pod("b"), reserved("b", ["dev-2"])]),  # 8-9
        ("lw", 121, [ev.DeviceHealthChanged(resource=RES, device_id="dev-0", health="Healthy", numa_nodes=[0])]),  # 10
        ("adm-b", 122, [allocated("b", ["dev-2", "dev-1"]), admitted("b")]),  # 11 (the fault), 12
        *admission("c", 180, ["dev-3"]),  # 13-16
        (
            "rm-c",
            240,
            [
                ev.DevicesReleased(
                    pod_uid="uid-c", container="main", resource=RES, device_ids=["dev-3"], reason="pod removed"
                ),
                ev.PodRemoved(pod_uid="uid-c", reason="pod removed"),
            ],
        ),  # 17-18
    ]


# --------------------------------------------------------------------------- --check


def test_check_names_the_event_that_gave_a_device_to_two_pods(root: Path) -> None:
    records = write_log(root, scenario())
    fault = next(r for r in records if isinstance(r.event, ev.DevicesAllocated) and r.event.pod_uid == "uid-b")
    assert fault.seq == 11
    proc = replay(root, "--check")
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert out.splitlines()[0].startswith("invariant broken at seq 11: device-double-held")
    assert "dev-1 example.com/dev allocated to default/b/main while allocated to default/a/main" in out
    # Every event of its correlation id, with its sequence; nothing of the others.
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("events with correlation id adm-b (4):"))
    listed = lines[start + 2 :]  # after the header
    assert [int(line[2:].split()[0]) for line in listed] == [8, 9, 11, 12]
    assert [line[:2] for line in listed] == ["  ", "  ", "> ", "  "]
    assert all("adm-b" in line for line in listed)

    proc = replay(root, "--check", "-o", "json")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    assert report["violation"]["rule"] == "device-double-held" and report["violation"]["seq"] == 11
    assert report["event"]["type"] == "DevicesAllocated"
    assert [r["seq"] for r in report["correlated"]] == [8, 9, 11, 12]
    assert {r["correlation_id"] for r in report["correlated"]} == {"adm-b"}

    # Up to just before the fault, the log is sound.
    proc = replay(root, "--check", "--until", "10")
    assert proc.returncode == 0 and proc.stdout.strip() == "no invariant broken in 10 events"
    # The tool says the same.
    tool = subprocess.run(
        [sys.executable, str(REPO / "tools" / "replay" / "replay.py"), str(root / "eventsrc" / "log"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert tool.returncode == 1 and tool.stdout.startswith("invariant broken at seq 11: device-double-held")


def pod_yaml(tmp: Path, name: str, limits: str) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, uid: uid-{name}}}\nspec:\n"
        f"  containers:\n  - name: main\n    image: busybox\n    resources:\n      limits: {{{limits}}}\n"
    )
    return path


def test_a_log_written_by_the_daemon_passes_the_check(root: Path, tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    topology = REPO / "examples" / "topology-256.json"
    d = daemon_factory("--cpu-manager-policy", "static", "--reserved-cpu-count", "4", "--topology-file", str(topology))
    plugin = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eventsrc",
            "--root-dir",
            str(root),
            "sample-plugin",
            "--devices",
            "4",
            "--numa-nodes",
            "2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        eventually(
            lambda: "PluginRegistered" in run_cli("log", root=root).stdout,
            "the sample plugin's registration",
            stop=lambda: None if plugin.poll() is None else f"the sample plugin exited {plugin.returncode}",
        )
        for name, limits in [
            ("gpu", f"{RES}: 2, cpu: '4', memory: 1Gi"),
            ("burst", f"{RES}: 1, cpu: 500m"),
            ("more", "cpu: '2', memory: 1Gi"),
        ]:
            proc = run_cli("admit", "-f", str(pod_yaml(tmp_path, name, limits)), root=root)
            assert proc.returncode == 0, proc.stderr
        assert run_cli("admit", "-f", str(pod_yaml(tmp_path, "toomany", f"{RES}: 4")), root=root).returncode == 1
        # An init container hands its device and CPUs on to the app container.
        init = tmp_path / "init.yaml"
        init.write_text(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: init, namespace: default, uid: uid-init}\nspec:\n"
            f"  initContainers:\n  - name: setup\n    resources:\n      limits: {{{RES}: 1, cpu: '2', memory: 1Gi}}\n"
            f"  containers:\n  - name: main\n    resources:\n      limits: {{{RES}: 1, cpu: '2', memory: 1Gi}}\n"
        )
        proc = run_cli("admit", "-f", str(init), root=root)
        assert proc.returncode == 0, proc.stderr
        for name in ("gpu", "more", "init"):
            assert run_cli("remove", f"uid-{name}", root=root).returncode == 0
        # While the daemon runs (the replay takes no lock) and after it stopped.
        live = replay(root, "--check")
        assert live.returncode == 0, live.stdout + live.stderr
    finally:
        plugin.terminate()
        plugin.wait(10)
    d.stop()
    proc = replay(root, "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    n = len(run_cli("log", "-o", "json", root=root).stdout.splitlines())
    assert proc.stdout.strip() == f"no invariant broken in {n} events"
    types = [json.loads(line)["type"] for line in run_cli("log", "-o", "json", root=root).stdout.splitlines()]
    assert {"DevicesAllocated", "CPUsAssigned", "SharedPoolChanged", "AdmissionRejected", "DevicesReleased"} <= set(
        types
    )
    step = replay(root, "--step")
    assert step.returncode == 0 and len(step.stdout.splitlines()) == n


# --------------------------------------------------------------------------- --step


def test_step_prints_one_line_per_event_with_its_change(root: Path) -> None:
    records = write_log(
        root,
        [
            *scenario()[:3],
            (
                "cpu",
                90,
                [
                    ev.SharedPoolChanged(cpus=list(range(8))),
                    cpus("a", [2, 3]),
                    ev.SharedPoolChanged(cpus=[0, 1, 4, 5, 6, 7], reason="exclusive CPUs for pod uid-a"),
                ],
            ),
        ],
    )
    proc = replay(root, "--step")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == len(records)
    by_seq = {int(line.split()[0]): line for line in lines}
    assert by_seq[1].split()[2] == "DaemonStarted" and "daemon: stopped -> running" in by_seq[1]
    assert "plugin example.com/dev: none -> connected at sample.sock" in by_seq[2]
    assert "dev-0,dev-1,dev-2,dev-3 example.com/dev: absent -> free" in by_seq[3]
    assert "pod default/a: none -> admitting" in by_seq[4]
    assert "dev-1 example.com/dev: free -> reserved by default/a/main" in by_seq[5]
    assert "dev-1 example.com/dev: reserved by default/a/main -> allocated to default/a/main" in by_seq[6]
    assert "pod default/a: admitting -> admitted" in by_seq[7]
    assert "exclusive cpus of default/a/main: none -> 2-3" in by_seq[9]
    assert "shared pool: 0-7 -> 0-1,4-7 (exclusive CPUs for pod uid-a)" in by_seq[10]

    proc = replay(root, "--step", "--from", "5", "-o", "json")
    items = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [i["seq"] for i in items] == list(range(5, len(records) + 1))
    assert items[0]["changes"] == [
        {"what": "dev-1 example.com/dev", "before": "free", "after": "reserved by default/a/main"}
    ]
    assert items[0]["type"] == "DevicesReserved" and items[0]["correlation_id"] == "adm-a"


# --------------------------------------------------------------------------- --until


def test_until_seq_and_until_time_give_the_views_at_that_point(root: Path) -> None:
    write_log(root, scenario())

    def views(*args: str) -> dict:  # type: ignore[type-arg]
        proc = replay(root, *args, "-o", "json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)  # type: ignore[no-any-return]

    v = views("--until", "5")
    assert v["meta"]["last_seq"] == 5
    assert v["devices"]["devices"][RES]["dev-1"]["holder"] == "uid-a/main"
    assert v["devices"]["devices"][RES]["dev-1"]["hold"] == "reserved"
    assert v["pods"]["pods"]["uid-a"]["state"] == "admitting"
    # 23:02:30: after pod b's intent (23:02:00), before its health event (23:02:01).
    v = views("--until", "2026-11-21T23:02:00.500Z")
    assert v["meta"]["last_seq"] == 9
    assert v["pods"]["pods"]["uid-b"]["state"] == "admitting"
    assert v["devices"]["devices"][RES]["dev-2"]["holder"] == "uid-b/main"
    v = views("--until", "2026-11-21T23:03:30+00:00")
    assert v["meta"]["last_seq"] == 16 and "uid-c" in v["pods"]["pods"]
    assert views("--until", "2026-11-21T22:00:00Z")["meta"]["last_seq"] == 0
    assert views()["meta"]["last_seq"] == 18
    # Tables for people.
    proc = replay(root, "--until", "7")
    assert proc.returncode == 0 and "uid-a/main" in proc.stdout and "allocated" in proc.stdout


# --------------------------------------------------------------------------- the other invariants


def check(root: Path, batches: list[Batch], *args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    write_log(root, batches)
    proc = replay(root, "--check", "-o", "json", *args)
    assert "Traceback" not in proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_allocating_an_unhealthy_device(root: Path) -> None:
    rc, out = check(
        root,
        [
            *BOOT,
            ("lw", 10, [ev.DeviceHealthChanged(resource=RES, device_id="dev-2", health="Unhealthy")]),
            *admission("a", 60, ["dev-1"]),
            *admission("b", 70, ["dev-2"]),  # seq 9-12
        ],
    )
    assert rc == 1
    assert out["violation"]["rule"] == "unhealthy-device-allocated" and out["violation"]["seq"] == 10
    assert "dev-2" in out["violation"]["message"] and "Unhealthy" in out["violation"]["message"]


def kubelet_gave(name: str, ids: list[str]) -> ev.KubeletDevicesObserved:
    return ev.KubeletDevicesObserved(
        pod=ev.PodRef(uid="", namespace="default", name=name), container="main", resource=RES, device_ids=ids
    )


def test_a_kubelets_double_allocation_is_a_finding_apart_from_eventsrcs_invariants(root: Path) -> None:
    """Findings about the kubelet are printed and the check goes on: exit 5 when they are all it
    found, 1 (the invariant's status) when eventsrc broke one of its own after them."""
    observed: list[Batch] = [
        ("k1", 20, [kubelet_gave("x", ["dev-1"])]),
        ("k2", 21, [kubelet_gave("y", ["dev-1"])]),  # seq 5: the kubelet lists dev-1 for x and y
    ]
    write_log(root, [*BOOT, *observed])
    proc = replay(root, "--check", "-o", "json")
    *found, summary = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert [(f["finding"]["rule"], f["finding"]["seq"]) for f in found] == [("kubelet-device-in-two-pods", 5)]
    assert summary == {"ok": False, "events": 5, "findings": 1}
    text = replay(root, "--check")
    assert text.returncode == 5 and "finding about the kubelet at seq 5" in text.stdout
    # eventsrc's own double grant after it: the invariant's status, whatever the kubelet did
    shutil.rmtree(root)
    write_log(root, [*BOOT, *observed, *admission("a", 60, ["dev-2"]), *admission("b", 70, ["dev-2"])])
    proc = replay(root, "--check", "-o", "json")
    *found, broken = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 1
    assert [f["finding"]["rule"] for f in found] == ["kubelet-device-in-two-pods"]
    assert broken["violation"]["rule"] == "device-double-held"


def test_an_exclusive_cpu_the_kubelet_lists_for_two_pods_fails_the_check(root: Path) -> None:
    """Issue 35: a planted log beside a kubelet where two pods hold one exclusive CPU (no finding
    recorded in it): the check finds it (exit 5), but not a CPU of the shared pool."""

    def kubelet_cpus(name: str, cpus: list[int]) -> ev.KubeletCPUsObserved:
        return ev.KubeletCPUsObserved(
            pod=ev.PodRef(uid=f"uid-{name}", namespace="default", name=name), container="main", cpus=cpus
        )

    pool = ("k0", 19, [ev.KubeletSharedPoolObserved(cpus=[0], policy="static", source="cpu_manager_state")])
    write_log(root, [*BOOT, pool, ("k1", 20, [kubelet_cpus("x", [1])]), ("k2", 21, [kubelet_cpus("y", [1, 2])])])
    proc = replay(root, "--check", "-o", "json")
    *found, summary = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert [(f["finding"]["rule"], f["finding"]["seq"]) for f in found] == [("kubelet-cpu-in-two-pods", 6)]
    assert summary == {"ok": False, "events": 6, "findings": 1}
    shutil.rmtree(root)
    rc, out = check(root, [*BOOT, pool, ("k1", 20, [kubelet_cpus("x", [0])]), ("k2", 21, [kubelet_cpus("y", [0])])])
    assert rc == 0 and out["ok"]


def test_an_init_container_hands_its_device_and_cpus_on(root: Path) -> None:
    rc, out = check(
        root,
        [
            *BOOT,
            (
                "a",
                10,
                [
                    ev.PolicyConfigurationChanged(manager="cpu", new={"policy": "static", "reserved": "0-1"}),
                    pod("a", ("setup", "init"), ("main", "app")),
                    reserved("a", ["dev-0"], "setup"),
                    reserved("a", ["dev-0"], "main"),
                    cpus("a", [2, 3], "setup"),
                    cpus("a", [2, 3], "main"),
                ],
            ),
            ("a", 11, [allocated("a", ["dev-0"], "setup"), allocated("a", ["dev-0"], "main"), admitted("a")]),
        ],
    )
    assert rc == 0 and out == {"ok": True, "events": 12}


def test_reserved_cpus_given_exclusively(root: Path) -> None:
    rc, out = check(
        root,
        [
            *BOOT,
            (
                "cfg",
                1,
                [ev.PolicyConfigurationChanged(manager="cpu", new={"policy": "static", "reserved": "0-1,128-129"})],
            ),
            ("a", 10, [pod("a"), cpus("a", [2, 3])]),
            ("b", 20, [pod("b"), cpus("b", [129, 130])]),  # seq 7, 8
        ],
    )
    assert rc == 1
    assert out["violation"]["rule"] == "reserved-cpu-exclusive" and out["violation"]["seq"] == 8
    assert "129" in out["violation"]["message"]


def test_a_cpu_exclusive_to_two_pods(root: Path) -> None:
    rc, out = check(
        root,
        [
            *BOOT,
            ("a", 10, [pod("a"), cpus("a", [2, 3]), admitted("a")]),
            ("b", 20, [pod("b"), cpus("b", [3, 4]), admitted("b")]),  # seq 7-9
        ],
    )
    assert rc == 1
    assert out["violation"]["rule"] == "cpu-double-exclusive" and out["violation"]["seq"] == 8
    assert "default/a/main" in out["violation"]["message"] and "default/b/main" in out["violation"]["message"]
    assert [r["seq"] for r in out["correlated"]] == [7, 8, 9]


def test_exclusive_cpus_left_in_the_shared_pool(root: Path) -> None:
    rc, out = check(
        root,
        [
            *BOOT,
            ("start", 1, [ev.SharedPoolChanged(cpus=list(range(8)))]),
            # In the daemon a CPUsAssigned is followed by its SharedPoolChanged: sound.
            ("a", 10, [pod("a"), cpus("a", [2, 3]), ev.SharedPoolChanged(cpus=[0, 1, 4, 5, 6, 7]), admitted("a")]),
            ("b", 20, [pod("b"), cpus("b", [4]), admitted("b")]),  # seq 9-11: the pool keeps 4
            ("c", 30, [pod("c")]),
        ],
    )
    assert rc == 1
    assert out["violation"]["rule"] == "exclusive-in-shared-pool" and out["violation"]["seq"] == 10
    assert out["violation"]["detected_seq"] == 11
    # Stopping between a CPUsAssigned and its SharedPoolChanged is no violation.
    proc = replay(root, "--check", "--until", "6")
    assert proc.returncode == 0 and proc.stdout.strip() == "no invariant broken in 6 events", proc.stdout
    # A pool change that takes back an exclusive CPU is blamed itself.
    rc, out = check(
        root.parent / "other",
        [
            *BOOT,
            ("a", 10, [pod("a"), cpus("a", [2, 3]), ev.SharedPoolChanged(cpus=[0, 1, 4, 5, 6, 7]), admitted("a")]),
            ("x", 20, [ev.SharedPoolChanged(cpus=[0, 1, 3, 4, 5, 6, 7])]),  # seq 8
        ],
    )
    assert rc == 1 and out["violation"]["seq"] == 8 and out["violation"]["rule"] == "exclusive-in-shared-pool"


def claim_batches(unprepare_first: bool) -> list[Batch]:
    ref = ev.ClaimRef(uid="claim-1", namespace="default", name="gpu")
    admit: Batch = (
        "a",
        10,
        [
            pod("a"),
            ev.PodReferenceAdded(claim_uid="claim-1", pod_uid="uid-a"),
            ev.ClaimPrepareStarted(claim=ref, driver="gpu.example.com", pod_uid="uid-a"),
        ],
    )
    done: Batch = ("a", 11, [ev.ClaimPrepared(claim=ref, driver="gpu.example.com"), admitted("a")])
    if unprepare_first:
        # The driver is told to unprepare while pod a still runs.
        remove: Batch = (
            "rm",
            20,
            [
                ev.ClaimUnprepareStarted(claim=ref, driver="gpu.example.com"),
                ev.PodReferenceRemoved(claim_uid="claim-1", pod_uid="uid-a"),
                ev.PodRemoved(pod_uid="uid-a"),
            ],
        )
    else:
        remove = (
            "rm",
            20,
            [
                ev.PodReferenceRemoved(claim_uid="claim-1", pod_uid="uid-a"),
                ev.ClaimUnprepareStarted(claim=ref, driver="gpu.example.com"),
                ev.PodRemoved(pod_uid="uid-a"),
            ],
        )
    return [*BOOT, admit, done, remove, ("rm", 21, [ev.ClaimUnprepared(claim=ref, driver="gpu.example.com")])]


def test_a_claim_unprepared_under_a_live_pod(root: Path) -> None:
    rc, out = check(root / "ok", claim_batches(unprepare_first=False))
    assert rc == 0, out
    rc, out = check(root / "bad", claim_batches(unprepare_first=True))
    assert rc == 1
    assert out["violation"]["rule"] == "claim-unprepared-under-live-pod" and out["violation"]["seq"] == 9
    assert "default/gpu" in out["violation"]["message"] and "default/a" in out["violation"]["message"]
    assert [r["seq"] for r in out["correlated"]] == [9, 10, 11, 12]


def test_a_reservation_left_without_an_outcome(root: Path) -> None:
    # Counted in sequence order (tests/unit/test_time_rules.py has the clock steps).
    batches: list[Batch] = [
        *BOOT,
        ("a", 10, [pod("a"), reserved("a", ["dev-0"])]),  # seq 4, 5: never an outcome
        *admission("b", 60, ["dev-1"]),  # 6-9: one later admission's outcome
        ("lw", 200, [ev.DeviceHealthChanged(resource=RES, device_id="dev-3", health="Unhealthy")]),  # seq 10
        ("lw", 201, [ev.DeviceHealthChanged(resource=RES, device_id="dev-3", health="Healthy")]),
    ]
    rc, out = check(root, batches, "--reservation-window", "0")
    assert rc == 1
    v = out["violation"]
    assert v["rule"] == "dangling-reservation" and v["seq"] == 5 and v["detected_seq"] == 9
    assert "no outcome while 1 later admissions had theirs (window 0)" in v["message"]
    assert [r["seq"] for r in out["correlated"]] == [4, 5]
    # A wider window: sound; and the daemon's restart that finishes it is too.
    proc = replay(root, "--check", "--reservation-window", "1")
    assert proc.returncode == 0, proc.stdout
    rc, out = check(
        root.parent / "restart",
        [
            *BOOT,
            ("a", 10, [pod("a"), reserved("a", ["dev-0"])]),
            (
                "boot2",
                4000,
                [
                    ev.DaemonStarted(boot_id="b", version="0.1.0", instance_id="inst-2"),
                    ev.DevicesReleased(pod_uid="uid-a", container="main", resource=RES, device_ids=["dev-0"]),
                    ev.AdmissionRejected(pod=ev.PodRef(uid="uid-a", namespace="default", name="a"), reason="restart"),
                ],
            ),
        ],
    )
    assert rc == 0, out


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--until", "yesterday"], 2, "--until 'yesterday': expected a sequence number or an RFC 3339 time"),
        (["--from", "0", "--step"], 2, "--from must be at least 1"),
        (["--reservation-window", "-1", "--check"], 2, "--reservation-window must not be negative"),
    ],
)
def test_bad_arguments_are_one_line(root: Path, args: list[str], code: int, message: str) -> None:
    write_log(root, BOOT)
    proc = replay(root, *args)
    assert proc.returncode == code
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"eventsrc: error: {message}"), proc.stderr
    tool = subprocess.run(
        [sys.executable, str(REPO / "tools" / "replay" / "replay.py"), str(root), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = tool.stderr.strip().splitlines()
    assert tool.returncode == code and len(lines) == 1 and lines[0].startswith(f"replay: error: {message}")


def test_missing_log_and_unknown_option_are_one_line(tmp_path: Path) -> None:
    proc = replay(tmp_path / "nowhere", "--check")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"eventsrc: error: no eventsrc log at {tmp_path / 'nowhere'} "
        "(looked for eventsrc/log/data.mdb, log/data.mdb, data.mdb)"
    ]
    assert not (tmp_path / "nowhere").exists()
    tool = subprocess.run(
        [sys.executable, str(REPO / "tools" / "replay" / "replay.py"), str(tmp_path), "--bogus"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert tool.returncode == 2 and len(tool.stderr.strip().splitlines()) == 1 and "--bogus" in tool.stderr
    # --root-dir is the default PATH of eventsrc replay.
    proc = run_cli("replay", root=tmp_path)
    assert proc.returncode == 1 and "no eventsrc log at" in proc.stderr
