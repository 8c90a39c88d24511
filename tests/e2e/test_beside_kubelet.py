"""eventsrc beside a stock kubelet (``serve --beside-kubelet``): the kubelet's side is played by
the grpcio stand-in (``tests/support/kubelet.py``), containers come from a real containerd
through CRI (NRI observe), as in test_nri_containerd.py. Each test asserts what the audit
answers against what it did, and that nothing under the kubelet's directory changed."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from eventsrc.offline.audit_queries import iso
from testbed.servers.kubelet_checkpoints import CPU_STATE, cpu_state, write, write_garbage, write_torn
from tests.conftest import Daemon, run_cli
from tests.e2e.test_metrics import metrics_address, scrape
from tests.support.containerd import Containerd
from tests.support.kubelet import Container, Device, StandInKubelet

RESOURCE = "example.com/dev"
MEM = 64 << 20


def tree(d: Path) -> dict[str, tuple[int, int, int, int]]:
    """Everything under ``d``: mode, size, mtime and inode of each entry (not its atime, which
    a reader changes)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(d):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(d))] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino)
    return out


@pytest.fixture
def kubelet(short_tmp: Path) -> Iterator[StandInKubelet]:
    with StandInKubelet(short_tmp / "kubelet") as k:
        k.set_allocatable(devices=[Device(RESOURCE, f"d-{i}", (0,)) for i in (1, 2)], cpus=[0, 1])
        yield k


def records(root: Path) -> list[dict[str, Any]]:
    out = run_cli("log", "-o", "json", root=root, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def of_type(root: Path, *types: str) -> list[dict[str, Any]]:
    return [r for r in records(root) if r["type"] in types]


def audit_device(root: Path, device: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(
        run_cli("audit", "device", RESOURCE, device, "-o", "json", root=root, check=True).stdout
    )
    return out


def holds(root: Path, device: str) -> list[tuple[str, str, str, bool]]:
    """Who held ``device``, as ``audit device`` says; none while the log has not the device yet
    (what eventsrc observes is written within ``observationsWait``: docs/adr/0042)."""
    proc = run_cli("audit", "device", RESOURCE, device, "-o", "json", root=root)
    if proc.returncode != 0 and f"no device {device} of {RESOURCE} in the log" in proc.stderr:
        return []
    assert proc.returncode == 0, proc.stderr
    return [
        (f"{h['pod']['namespace']}/{h['pod']['name']}", h["container"], h["decided_by"], h["still_held"])
        for h in json.loads(proc.stdout)["holders"]
    ]


def check_holds(root: Path) -> None:
    proc = run_cli("replay", "--check", root=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def beside(daemon_factory: type[Daemon], kubelet: StandInKubelet, *extra: str) -> Daemon:
    return daemon_factory("--beside-kubelet", str(kubelet.root), *extra)


def test_a_device_handed_from_one_pod_to_another_is_audited_with_both_holders(
    kubelet: StandInKubelet, root: Path, containerd_runtime: Containerd, daemon_factory: type[Daemon]
) -> None:
    rt = containerd_runtime
    kubelet.write_checkpoints()
    before = tree(kubelet.root)
    daemon = beside(
        daemon_factory,
        kubelet,
        "--nri-socket",
        str(rt.nri_socket),
        "--container-runtime-endpoint",
        f"unix://{rt.address}",
    )
    daemon.eventually(lambda: of_type(root, "RuntimeConnected"), "NRI to connect")

    kubelet.set_pod(
        "team-a", "trainer", [Container("main", devices=[Device(RESOURCE, "d-1", (0,))], cpus=[1])], uid="uid-a"
    )
    a = rt.run_pod("trainer", "uid-a", namespace="team-a")
    ca = rt.create_container(a, "main", cpu_millis=1000, memory_limit=MEM)
    rt.start_container(ca)
    daemon.eventually(lambda: holds(root, "d-1") == [("team-a/trainer", "main", "kubelet", True)], "pod A's hold")

    # pod A completes: its container stops, its sandbox stays (until the pod is deleted); the
    # kubelet no longer lists it (terminated) and gives d-1 to pod B
    rt.stop_container(ca)
    kubelet.set_pod(
        "team-a", "trainer", [Container("main", devices=[Device(RESOURCE, "d-1", (0,))])], uid="uid-a", active=False
    )
    kubelet.set_pod("team-b", "server", [Container("web", devices=[Device(RESOURCE, "d-1", (0,))])], uid="uid-b")
    b = rt.run_pod("server", "uid-b", namespace="team-b")
    cb = rt.create_container(b, "web", cpu_millis=100, memory_limit=MEM)
    rt.start_container(cb)
    want = [("team-a/trainer", "main", "kubelet", False), ("team-b/server", "web", "kubelet", True)]
    daemon.eventually(lambda: holds(root, "d-1") == want, "pod B's hold")

    answer = audit_device(root, "d-1")
    assert answer["listed"] and answer["health"] == "Healthy"  # allocatable, as GetAllocatableResources says
    first, second = answer["holders"]
    assert first["pod"]["uid"] == "uid-a" and second["pod"]["uid"] == "uid-b"
    assert [c["id"] for c in first["container_ids"]] == [ca]
    assert [c["id"] for c in second["container_ids"]] == [cb]
    assert first["start"]["ts_ns"] < first["end"]["ts_ns"] <= second["start"]["ts_ns"]
    assert second["end"] is None
    assert "runs none of its containers" in first["reason"]
    table = run_cli("audit", "device", RESOURCE, "d-1", root=root, check=True).stdout
    assert "team-a/trainer" in table and "team-b/server" in table and "(kubelet)" in table and ca in table

    # the node API is read-only, and answers with what was observed
    refused = run_cli("admit", "-f", str(Path(__file__).parents[2] / "examples" / "web.yaml"), root=root)
    assert refused.returncode != 0 and "beside a kubelet" in refused.stderr
    refused = run_cli("remove", "team-b/server", root=root)
    assert refused.returncode != 0 and "beside a kubelet" in refused.stderr
    listed = json.loads(run_cli("pods", "-o", "json", root=root, check=True).stdout)["pods"]
    assert [(p["namespace"], p["name"], p["state"]) for p in listed] == [("team-b", "server", "observed")]

    daemon.stop()
    check_holds(root)
    for sandbox in (a, b):
        rt.stop_pod(sandbox)
        rt.remove_pod(sandbox)
    assert tree(kubelet.root) == before


def test_a_restarting_kubelet_releases_nothing_and_its_absence_is_a_gap(
    kubelet: StandInKubelet, root: Path, containerd_runtime: Containerd, daemon_factory: type[Daemon]
) -> None:
    rt = containerd_runtime
    daemon = beside(daemon_factory, kubelet, "--nri-socket", str(rt.nri_socket), "--beside-kubelet-resync", "1s")
    kubelet.set_pod("default", "p", [Container("main", devices=[Device(RESOURCE, "d-2", (0,))])], uid="uid-p")
    p = rt.run_pod("p", "uid-p")
    c = rt.create_container(p, "main", cpu_millis=100, memory_limit=MEM)
    rt.start_container(c)
    daemon.eventually(lambda: holds(root, "d-2") == [("default/p", "main", "kubelet", True)], "the hold")

    with kubelet.restarting():  # empty answers for a while, the pod's container still runs
        looked = kubelet.calls["List"]
        daemon.eventually(lambda: kubelet.calls["List"] >= looked + 2, "two looks at the restarted kubelet")
    assert holds(root, "d-2") == [("default/p", "main", "kubelet", True)]
    assert not of_type(root, "KubeletPodReleased")

    answered = kubelet.calls["List"]
    daemon.eventually(lambda: kubelet.calls["List"] > answered, "an answer")  # a good answer, then it stops
    kubelet_gaps = lambda: [g for g in of_type(root, "ObservationGapFound") if g["event"]["source"] == "kubelet"]  # noqa: E731
    before = len(kubelet_gaps())
    kubelet.stop()  # its socket gone
    stopped_ns = time.time_ns()  # an answer sent before the stop may be read after it began
    gap = daemon.eventually(lambda: kubelet_gaps()[before:], "the gap")[0]
    assert gap["event"]["since_ns"] <= stopped_ns  # from its last good answer, not from the look that found it gone
    kubelet.start()
    closed = lambda: [  # noqa: E731
        g for g in of_type(root, "ObservationGapFound") if g["event"]["source"] == "kubelet" and g["event"]["until_ns"]
    ]
    daemon.eventually(closed, "the gap closed by the next answer")
    gaps = audit_device(root, "d-2")["gaps"]
    assert any(g["source"] == "kubelet" and g["until_ns"] for g in gaps)
    assert holds(root, "d-2") == [("default/p", "main", "kubelet", True)]

    # gone for real: the runtime removes the sandbox while the kubelet no longer lists it
    kubelet.remove_pod("default", "p")
    rt.stop_pod(p)
    rt.remove_pod(p)
    daemon.eventually(lambda: holds(root, "d-2") == [("default/p", "main", "kubelet", False)], "the release")
    daemon.stop()
    check_holds(root)


def test_a_sigkill_loses_nothing_and_the_restart_says_what_it_did_not_see(
    kubelet: StandInKubelet, root: Path, daemon_factory: type[Daemon]
) -> None:
    kubelet.set_pod("default", "a", [Container("main", devices=[Device(RESOURCE, "d-1")], cpus=[1])], uid="uid-a")
    kubelet.write_checkpoints()
    daemon = beside(daemon_factory, kubelet)
    daemon.eventually(lambda: holds(root, "d-1") == [("default/a", "main", "kubelet", True)], "the hold")
    assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
    # meanwhile: a leaves, b comes with d-1
    kubelet.remove_pod("default", "a")
    kubelet.set_pod("default", "b", [Container("main", devices=[Device(RESOURCE, "d-1")])], uid="uid-b")
    kubelet.write_checkpoints()
    # without NRI, a pod the kubelet stops listing is released at the second look without it
    daemon = beside(daemon_factory, kubelet, "--metrics-address", "127.0.0.1:0", "--beside-kubelet-resync", "1s")
    want = [("default/a", "main", "kubelet", False), ("default/b", "main", "kubelet", True)]
    daemon.eventually(lambda: holds(root, "d-1") == want, "the differences recorded after the restart")
    _, _, samples = scrape(metrics_address(root))
    info = {labels for name, labels in samples if name == "eventsrc_device_allocation_info"}
    assert info == {
        (("container", "main"), ("device", "d-1"), ("namespace", "default"), ("pod", "b"), ("resource", RESOURCE))
    }
    gaps = [g["event"] for g in of_type(root, "ObservationGapFound") if g["event"]["source"] == "eventsrc"]
    assert len(gaps) == 1 and "killed" in gaps[0]["reason"]
    answer = audit_device(root, "d-1")
    a, b = answer["holders"]
    # the release is recorded after the gap: when it happened is not known more closely
    assert gaps[0]["since_ns"] <= a["end"]["ts_ns"] and gaps[0]["until_ns"] <= a["end"]["ts_ns"]
    assert any(g["source"] == "eventsrc" for g in answer["gaps"])
    daemon.stop()  # a clean stop this time: the next start says so
    daemon = beside(daemon_factory, kubelet)
    daemon.stop()
    gaps = [g["event"] for g in of_type(root, "ObservationGapFound") if g["event"]["source"] == "eventsrc"]
    assert len(gaps) == 2 and gaps[1]["reason"] == "eventsrc was not running (stopped)"
    check_holds(root)
    usage_equals_the_recorded_holds(root)


def usage_equals_the_recorded_holds(root: Path) -> None:
    """``audit usage --by pod`` in a window that clips pod a's hold and ends while pod b still
    holds d-1 equals, to the nanosecond, what the records' times say; and the seconds eventsrc
    was killed, pod a removed meanwhile, are given as inside a gap, not as seen (issue 35)."""
    (a_start,) = [r["ts_ns"] for r in of_type(root, "KubeletDevicesObserved") if r["event"]["pod"]["name"] == "a"]
    (a_end,) = [r["ts_ns"] for r in of_type(root, "KubeletDevicesReleased") if r["event"]["pod"]["name"] == "a"]
    (b_start,) = [r["ts_ns"] for r in of_type(root, "KubeletDevicesObserved") if r["event"]["pod"]["name"] == "b"]
    killed = [g["event"] for g in of_type(root, "ObservationGapFound") if g["event"]["source"] == "eventsrc"][0]
    assert a_start <= killed["since_ns"] < killed["until_ns"] <= a_end  # the kill, inside a's hold
    ms = 10**6  # iso() goes through a float: whole milliseconds print exactly
    until = of_type(root, "DaemonStopped")[-1]["ts_ns"] // ms * ms
    seconds = lambda ns: Decimal(ns) / 10**9  # noqa: E731
    for since in ((a_start + (a_end - a_start) // 2) // ms * ms, a_start // ms * ms):
        assert since < a_end <= b_start < until
        out = run_cli(
            "audit", "usage", "--by", "pod", "--resource", RESOURCE, "--since", iso(since), "--until", iso(until),
            "-o", "json", root=root, check=True,
        ).stdout  # fmt: skip
        rows = {(r["name"], r["resource"]): r for r in json.loads(out, parse_float=Decimal)}
        a_from = max(since, a_start)
        a_gap, b_gap = in_gaps(root, a_from, a_end), in_gaps(root, b_start, until)
        assert {k: (r["seconds"], r["seconds_in_gaps"], r["seconds_seen"]) for k, r in rows.items()} == {
            # clipped by --since; the kill's seconds inside it not seen
            ("a", RESOURCE): (seconds(a_end - a_from), seconds(a_gap), seconds(a_end - a_from - a_gap)),
            # still held: counted up to --until
            ("b", RESOURCE): (seconds(until - b_start), seconds(b_gap), seconds(until - b_start - b_gap)),
        }
    assert a_gap >= killed["until_ns"] - killed["since_ns"] > 0  # from a's start: the whole kill at least


def in_gaps(root: Path, lo: int, hi: int) -> int:
    """Nanoseconds of [lo, hi] inside any gap of eventsrc, the kubelet or the runtime the log
    records (one still open: up to ``hi``), each counted once."""
    ends: dict[tuple[str, int], int] = {}
    for g in of_type(root, "ObservationGapFound"):
        e = g["event"]
        if e["source"] in ("eventsrc", "kubelet", "runtime"):
            key = (e["source"], e["since_ns"])
            ends[key] = e.get("until_ns") or ends.get(key, 0)
    spans = [(max(lo, since), min(hi, until or hi)) for (_, since), until in ends.items()]
    return _union(spans)


def _union(spans: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for a, b in sorted(s for s in spans if s[0] < s[1]):
        if reach is None or a > reach:
            total, reach = total + b - a, b
        elif b > reach:
            total, reach = total + b - reach, b
    return total


def test_an_unreadable_checkpoint_is_recorded_and_never_stops_the_daemon(
    kubelet: StandInKubelet, root: Path, daemon_factory: type[Daemon]
) -> None:
    kubelet.set_pod("default", "a", [Container("main", devices=[Device(RESOURCE, "d-1")], cpus=[1])], uid="uid-a")
    kubelet.write_checkpoints()
    cpu_state = kubelet.root / "cpu_manager_state"
    devices = kubelet.root / "device-plugins" / "kubelet_internal_checkpoint"
    write_garbage(cpu_state)
    write_torn(devices, devices.read_bytes())  # a write torn mid-way
    daemon = beside(daemon_factory, kubelet)
    failed = lambda: of_type(root, "KubeletCheckpointReadFailed")  # noqa: E731
    daemon.eventually(lambda: len(failed()) == 2, "both unreadable files recorded")
    assert {r["event"]["path"] for r in failed()} == {str(cpu_state), str(devices)}
    # PodResources is still read: the hold is recorded (with no uid: the device checkpoint is not read)
    daemon.eventually(lambda: holds(root, "d-1") == [("default/a", "main", "kubelet", True)], "the hold")
    kubelet.write_checkpoints()  # the kubelet writes them whole again: read, and the gaps closed
    daemon.eventually(lambda: of_type(root, "KubeletSharedPoolObserved"), "the shared pool")
    closed = lambda: [g for g in of_type(root, "ObservationGapFound") if g["event"]["until_ns"]]  # noqa: E731
    daemon.eventually(lambda: len(closed()) == 2, "the two checkpoint gaps closed")
    assert {g["event"]["source"] for g in closed()} == {f"checkpoint {cpu_state}", f"checkpoint {devices}"}
    # what was not read is in the audit of what it overlaps
    text = run_cli("audit", "device", RESOURCE, "d-1", root=root, check=True).stdout
    assert f"checkpoint {cpu_state}" in text and "not seen" in text
    assert daemon.exited() is None
    daemon.stop()
    check_holds(root)


def test_root_inside_the_kubelet_directory_and_enforce_are_refused(kubelet: StandInKubelet) -> None:
    inside = run_cli("serve", "--beside-kubelet", str(kubelet.root), root=kubelet.root / "eventsrc-state")
    assert inside.returncode != 0 and "inside the kubelet's directory" in inside.stderr
    assert len(inside.stderr.strip().splitlines()) == 1
    assert not (kubelet.root / "eventsrc-state").exists()
    enforce = run_cli(
        "serve", "--beside-kubelet", str(kubelet.root), "--nri-socket", "/run/nri.sock", "--nri-mode", "enforce",
        root=kubelet.root.parent / "own",
    )  # fmt: skip
    assert enforce.returncode != 0 and "observe" in enforce.stderr


def test_hostile_checkpoint_files_are_refused_recorded_and_neither_blind_nor_hold_the_daemon(
    kubelet: StandInKubelet, root: Path, daemon_factory: type[Daemon]
) -> None:
    """Issue 34: a FIFO in the place of cpu_manager_state, the device checkpoint a link to
    /dev/zero, a 2 GB sparse dra_manager_state and a memory_manager_state whose CPU list names a
    billion CPUs: each refused unread or unexpanded, recorded once, a gap; PodResources still
    observed; SIGTERM stops the daemon."""
    kubelet.set_pod("default", "a", [Container("main", devices=[Device(RESOURCE, "d-1")], cpus=[1])], uid="uid-a")
    kubelet.write_checkpoints()
    cpu_state = kubelet.root / "cpu_manager_state"
    devices = kubelet.root / "device-plugins" / "kubelet_internal_checkpoint"
    dra = kubelet.root / "dra_manager_state"
    for p in (cpu_state, devices, dra):
        p.unlink()
    os.mkfifo(cpu_state)
    devices.symlink_to("/dev/zero")
    with open(dra, "wb") as f:
        f.truncate(2 << 30)
    daemon = beside(daemon_factory, kubelet, "--beside-kubelet-resync", "1s")  # a look each second
    failed = lambda: {r["event"]["path"]: r["event"]["reason"] for r in of_type(root, "KubeletCheckpointReadFailed")}  # noqa: E731
    daemon.eventually(lambda: len(failed()) == 3, "the three files refused")
    reasons = failed()
    assert "not a regular file (a FIFO)" in reasons[str(cpu_state)]
    assert "symbolic link" in reasons[str(devices)]
    assert "cap" in reasons[str(dra)]
    daemon.eventually(lambda: holds(root, "d-1") == [("default/a", "main", "kubelet", True)], "the hold")
    kubelet.set_pod("default", "b", [Container("main", devices=[Device(RESOURCE, "d-2")], cpus=[0])], uid="uid-b")
    daemon.eventually(lambda: holds(root, "d-2") == [("default/b", "main", "kubelet", True)], "a later hold seen")
    assert len(of_type(root, "KubeletCheckpointReadFailed")) == 3  # once each, not once per look
    assert daemon.exited() is None
    assert daemon.stop() == 0  # whatever a read of those files does, SIGTERM stops it


def test_a_device_the_kubelet_gives_two_pods_is_a_finding_about_the_kubelet(
    kubelet: StandInKubelet, root: Path, daemon_factory: type[Daemon]
) -> None:
    for ns, name in (("team-a", "a"), ("team-b", "b")):  # the kubelet lists d-1 and cpu 1 for both
        kubelet.set_pod(ns, name, [Container("main", devices=[Device(RESOURCE, "d-1", (0,))], cpus=[1])])
    kubelet.write_checkpoints()
    daemon = beside(daemon_factory, kubelet)
    found = lambda: of_type(root, "KubeletDoubleAllocationFound")  # noqa: E731
    daemon.eventually(lambda: len(found()) == 2, "the double allocation recorded as a finding")
    said = {(f["event"]["resource"], tuple(f["event"]["ids"]), tuple(f["event"]["holders"])) for f in found()}
    both = ("team-a/a/main", "team-b/b/main")
    assert said == {(RESOURCE, ("d-1",), both), ("cpu", ("1",), both)}
    daemon.eventually(lambda: "the kubelet gave one resource to two pods at once" in daemon.output(), "the warning")
    text = run_cli("audit", "device", RESOURCE, "d-1", root=root, check=True).stdout
    assert "found about the kubelet (1)" in text and "the kubelet gave it to team-a/a/main and team-b/b/main" in text
    finding = audit_device(root, "d-1")["findings"]
    assert [f["holders"] for f in finding] == [list(both)]
    assert daemon.exited() is None
    daemon.stop()
    # eventsrc wrote this log and kept its invariants: replay --check says the kubelet's fault apart
    proc = run_cli("replay", "--check", root=root)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "finding about the kubelet" in proc.stdout and "invariant broken at" not in proc.stdout
    assert "kubelet-device-in-two-pods" in proc.stdout and "kubelet-cpu-in-two-pods" in proc.stdout
    answer = json.loads(run_cli("replay", "--check", "-o", "json", root=root).stdout.splitlines()[-1])
    assert answer["findings"] == 2 and not answer["ok"]


def test_a_kubelet_without_allocatable_shows_its_registered_devices_from_its_checkpoint(
    short_tmp: Path, root: Path, daemon_factory: type[Daemon]
) -> None:
    """Issue 35 item 3: a kubelet before 1.21 has no GetAllocatableResources. Until its device
    checkpoint is read, nothing shows what is allocatable (a gap); then the checkpoint's
    RegisteredDevices are recorded as such, and a device no pod ever held is answered."""
    with StandInKubelet(short_tmp / "kubelet", minor=20) as k:
        k.set_allocatable(devices=[Device(RESOURCE, f"d-{i}", (0,)) for i in (1, 2)], cpus=[0, 1])
        daemon = beside(daemon_factory, k, "--beside-kubelet-resync", "1s")

        def gaps() -> list[dict[str, Any]]:
            return [g for g in of_type(root, "ObservationGapFound") if g["event"]["source"] == "kubelet allocatable"]

        daemon.eventually(gaps, "nothing shows allocatable: a gap")
        assert run_cli("audit", "device", RESOURCE, "d-1", root=root).returncode != 0  # nothing known of it yet
        k.write_checkpoints()
        (change,) = daemon.eventually(lambda: of_type(root, "KubeletAllocatableChanged"), "the registered devices")
        assert change["event"]["source"].endswith("kubelet_internal_checkpoint (RegisteredDevices)")
        assert sorted(d["id"] for d in change["event"]["added"][RESOURCE]) == ["d-1", "d-2"]
        daemon.eventually(lambda: len(gaps()) == 2 and gaps()[1]["event"]["until_ns"], "the gap closed")
        answer = run_cli("audit", "device", RESOURCE, "d-1", root=root, check=True)  # exit 0: it is known
        assert "RegisteredDevices" in answer.stdout and "not listed" not in answer.stdout, answer.stdout
        assert audit_device(root, "d-1")["holders"] == []
        daemon.stop()


def test_the_shared_pool_a_120_kubelet_lists_is_not_taken_for_exclusive_cpus(
    short_tmp: Path, root: Path, daemon_factory: type[Daemon]
) -> None:
    """Issue 35 item 1 (in part): a kubelet before 1.21 lists a container's whole cpuset, the
    shared pool included, in cpu_ids. A CPU in the CPU manager's shared pool (its checkpoint's
    default set) is not an exclusive CPU: a Guaranteed pod's CPU is recorded, a BestEffort pod's
    shared pool is not, and no usage is charged for it."""
    with StandInKubelet(short_tmp / "kubelet", minor=20) as k:
        k.set_allocatable(devices=[Device(RESOURCE, f"d-{i}", (0,)) for i in (1, 2)], cpus=[0, 1, 2, 3])
        k.set_pod("default", "g", [Container("main", devices=[Device(RESOURCE, "d-1")], cpus=[1])], uid="uid-g")
        k.set_pod("default", "be", [Container("main")], uid="uid-be")
        k.write_checkpoints()
        daemon = beside(daemon_factory, k, "--beside-kubelet-resync", "1s")
        daemon.eventually(lambda: holds(root, "d-1") == [("default/g", "main", "kubelet", True)], "the hold")
        observed = {
            (r["event"]["pod"]["name"], tuple(r["event"]["cpus"])) for r in of_type(root, "KubeletCPUsObserved")
        }
        assert observed == {("g", (1,))}  # be's cpu_ids (0, 2, 3: the shared pool) are not exclusive
        usage = json.loads(run_cli("audit", "usage", "--by", "pod", "-o", "json", root=root, check=True).stdout)
        assert {(row["name"], row["resource"]) for row in usage} == {("g", "cpu"), ("g", RESOURCE)}
        daemon.stop()
    check_holds(root)


def test_cpus_the_kubelet_lists_and_its_cpu_manager_does_not_give_are_a_disagreement(
    short_tmp: Path, root: Path, daemon_factory: type[Daemon]
) -> None:
    """Issue 35 item 1: a CPU counts as a container's exclusive CPU only when the CPU manager's
    state gives it to the container. A kubelet that lists CPU 1 for a container its state gives
    nothing: no exclusive CPU recorded, and, once it lasts, the disagreement as a fact."""
    with StandInKubelet(short_tmp / "kubelet", minor=30) as k:
        k.set_allocatable(devices=[Device(RESOURCE, "d-1", (0,))], cpus=[0, 1, 2, 3])
        k.set_pod("default", "g", [Container("main", devices=[Device(RESOURCE, "d-1")], cpus=[1])], uid="uid-g")
        k.write_checkpoints()
        write(k.root, CPU_STATE, cpu_state("static", "0,2-3", {}))  # the state gives uid-g nothing
        daemon = beside(daemon_factory, k, "--beside-kubelet-resync", "1s")
        (found,) = daemon.eventually(lambda: of_type(root, "KubeletCPUsDisagreed"), "the disagreement")
        assert (found["event"]["pod"]["uid"], found["event"]["listed"], found["event"]["checkpoint"]) == (
            "uid-g",
            [1],
            [],
        )
        assert found["event"]["source"].endswith("cpu_manager_state")
        assert of_type(root, "KubeletCPUsObserved") == []
        assert (
            "listed with cpus 1, its CPU manager's state gives it no exclusive cpus"
            in run_cli("log", root=root, check=True).stdout
        )
        daemon.stop()
    check_holds(root)
