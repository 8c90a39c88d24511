"""The benchmarks run and print their figures. What the figures are (how fast anything is) is
never asserted: only that each was measured and printed. `bench devices` is in test_cli.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from eventsrc.bench.log import prepare_cost, trio_wake_floor
from eventsrc.log.store import EventLog
from tests.conftest import run_cli
from tests.support.eventually import eventually

NUMBER = r"[\d,]+(?:\.\d+)?"


def figures(out: str, *labels: str, lead: str = "") -> None:
    """Each label is followed by a figure (after ``lead``, a pattern)."""
    for label in labels:
        assert re.search(re.escape(label) + rf"\s+{lead}{NUMBER}", out), (label, out)


def test_trio_wake_floor_measures_and_every_task_leaves() -> None:
    assert trio_wake_floor(8, 0.05) > 0
    # It returns only once the waker and every writer have left their loops, whichever
    # of them trio runs first after the stop: many short runs, in a process that may hang.
    code = (
        "from eventsrc.bench.log import trio_wake_floor\nfor _ in range(60): trio_wake_floor(4, 0.002)\nprint('done')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.stdout.strip() == "done", proc.stderr


def test_prepare_cost_measures_without_writing(tmp_path: Path) -> None:
    assert prepare_cost(tmp_path / "log", 16, rounds=5) > 0
    with EventLog(tmp_path / "log", readonly=True) as log:
        assert log.last_seq() == 0  # prepared batches were abandoned, nothing written


def test_bench_log_prints_its_figures(tmp_path: Path) -> None:
    proc = run_cli(
        "bench", "log", "--events", "2000", "--writers", "4", "--seconds", "0.2", "--rounds", "1", root=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    figures(
        proc.stdout,
        "bare file write+fdatasync",
        "bare LMDB durable commit (1 put)",
        "1 writer",
        "4 writers",
        "LMDB iteration, no decoding (ceiling)",
        "full replay into all projections",
        "restart: open + snapshot + tail",
        "peak RSS",
    )
    assert "replay (2,000 events)" in proc.stdout


def test_bench_cpu_prints_its_figures() -> None:
    proc = run_cli("bench", "cpu", "--repetitions", "5")
    assert proc.returncode == 0, proc.stderr
    medians = re.findall(rf"take\s+(\d+): median\s+{NUMBER} ms\s+p99\s+{NUMBER} ms", proc.stdout)
    assert {int(n) for n in medians} == {1, 4, 16, 64}, proc.stdout


def test_bench_audit_prints_its_figures(tmp_path: Path) -> None:
    proc = run_cli("bench", "audit", "--events", "1000", "--runs", "2", root=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    figures(
        proc.stdout,
        "one point lookup (events db)",
        "audit device example.com/nic vf-0",
        "audit pod (-o json)",
        "eventsrc audit pod (new process)",
        lead=r"median\s+",
    )


def test_bench_idle_prints_its_figures() -> None:
    proc = run_cli("bench", "idle", "--seconds", "0.2", "--rounds", "2", timeout=120)
    assert proc.returncode == 0, proc.stderr
    figures(proc.stdout, "daemon CPU, every thread", "wakeups of its trio thread")
    assert "(goal < 0.5 %: " in proc.stdout


@pytest.mark.parametrize("command", ["log", "audit"])
def test_bench_in_a_missing_root_dir_is_one_line(tmp_path: Path, command: str) -> None:
    proc = run_cli("bench", command, root=tmp_path / "nowhere")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"eventsrc: error: root directory {tmp_path / 'nowhere'} does not exist"]
    assert proc.stdout == ""
    assert not (tmp_path / "nowhere").exists()


def test_bench_in_a_root_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    proc = run_cli("bench", "log", root=tmp_path / "file")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"eventsrc: error: root directory {tmp_path / 'file'} is not a directory"]


def test_bench_scale_prints_its_figures() -> None:
    """A tiny `eventsrc bench scale`: a row at 10 pods and at --pods, each with every figure,
    under their labels; the restart after SIGKILL; no retention cut (no whole piece to cut)."""
    proc = run_cli("bench", "scale", "--devices", "24", "--pods", "20", "--samples", "5", "--repeats", "2", timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for label in (
        "admission",
        "samples",
        "p50 ms",
        "p99 ms",
        "RSS MB",
        "anon MB",
        "CPU/adm ms",
        "bytes/pod",
        "PodResources List",
        "first ms",
        "stall ms",
        "hold ms",
        "its CPU",
        "work ms",
        ">=10ms",
        "kubelet-style checkpoint",
        "per change ms",
        "bytes",
    ):
        assert label in out, (label, out)
    figure = rf"\s+-?{NUMBER}"
    for pods in (10, 20):
        # ... stall, the daemon's longest loop step ('+': a floor) and its CPU, the longest work ('+': a floor),
        # the steps of 10 ms or more of each | checkpoint
        row = rf"^\s+{pods}\s+5{figure * 9}\s+{NUMBER}\+?{figure}\s+{NUMBER}\+?\s+\d+\s+\d+\s+\|{figure * 2}$"
        assert re.search(row, out, re.M), (pods, out)
    assert re.search(rf"restart after SIGKILL at 20 pods\s+{NUMBER} s until Status says ready", out), out
    assert "20 pods back" in out
    assert re.search(r"retention cut at 20 pods\s+n/a \(the log holds no whole piece", out), out


def test_bench_scale_memory_manager_prints_both_and_the_ratio() -> None:
    """A tiny `eventsrc bench scale --memory-manager`: a row per policy and the ratio line."""
    proc = run_cli(
        "bench", "scale", "--memory-manager", "--devices", "12", "--pods", "5", "--samples", "3", timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip().startswith(("None ", "Static "))]
    assert [r[0] for r in rows] == ["None", "Static"] and all(r[1:3] == ["5", "3"] for r in rows)
    assert re.search(r"^p50 ratio, Static / None at 5 resident pods: \d+\.\d\d \(goal <= 1\.2\)$", proc.stdout, re.M)
    bad = run_cli("bench", "scale", "--memory-manager", "--devices", "5", "--pods", "5")
    assert bad.returncode == 1 and bad.stderr.splitlines() == [
        "eventsrc: error: --devices (5) must be more than --pods (5): each pod holds a device"
    ]


def test_bench_scale_needs_a_device_per_pod() -> None:
    proc = run_cli("bench", "scale", "--devices", "16", "--pods", "20")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "eventsrc: error: --devices (16) must be at least --pods (20): each pod holds a device"
    ]
    assert proc.stdout == ""


def test_the_checkpoint_the_scale_bench_writes_is_one_the_kubelet_reads(tmp_path: Path) -> None:
    """Its per-change ceiling writes the device manager's own file: the checkpoint parser
    of `eventsrc import-kubelet` (which verifies the checksum as the kubelet does) reads it back."""
    from eventsrc.inputs.kubelet_checkpoints import parse_device_checkpoint
    from testbed.benches.scale import CHECKPOINT, RESOURCE, Held, checkpoint_checksum, checkpoint_json
    from testbed.servers.kubelet_checkpoints import write_checkpoint

    entries = [Held(f"uid-{i}", "main", f"dev-{i}", i % 2, bytes([10, 3, i, 255])) for i in range(3)]
    registered = [f"dev-{i}" for i in range(5)]
    write_checkpoint(tmp_path, checkpoint_json(entries, registered, checkpoint_checksum(entries, registered)))
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT]  # the temporary file renamed over it
    cp = parse_device_checkpoint((tmp_path / CHECKPOINT).read_bytes())
    assert cp.registered_devices == {RESOURCE: registered}
    assert cp.entries is not None
    assert [(e.pod_uid, e.container_name, e.resource_name, e.device_ids, e.alloc_resp) for e in cp.entries] == [
        (h.pod_uid, "main", RESOURCE, {h.numa: [h.device]}, h.alloc_resp) for h in entries
    ]


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill(bench: subprocess.Popen[str] | subprocess.Popen[bytes], started: list[int]) -> None:
    """The bench, and what it started that still runs: only what this test's bench started, by pid."""
    bench.kill()
    bench.wait()
    for pid in started:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_bench_stopped_by_sigterm_stops_what_it_started(tmp_path: Path) -> None:
    """As with Ctrl-C: SIGTERM (``timeout``, a CI job's end) stops the bench's daemon too."""
    bench = subprocess.Popen(
        [sys.executable, "-m", "eventsrc", "bench", "idle", "--seconds", "600"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    started: list[int] = []
    try:
        started = eventually(lambda: _children(bench.pid), "the bench's daemon")
        bench.terminate()
        assert bench.wait(timeout=60) == 130, bench.stderr.read() if bench.stderr else ""
        assert not [pid for pid in started if _alive(pid)]
    finally:
        _kill(bench, started)


def test_bench_watch_prints_its_figures() -> None:
    proc = run_cli("bench", "watch", "--records", "300", "--watchers", "6", "--samples", "5", timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for phase in ("idle", "6 watchers", "after they went"):
        assert re.search(rf"^{phase} +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$", out, re.M), out
    # every kind was opened, and those that read, read from the first record on
    read = {
        m[1]: int(m[2].replace(",", "")) for m in re.finditer(r"^  (fast|slow|stalled) +([0-9,]+) records", out, re.M)
    }
    assert read.keys() == {"fast", "slow", "stalled"} and read["fast"] > 0 and read["stalled"] == 0, out
    assert "admission p50 with the watchers:" in out and "RSS after the watchers went:" in out, out


def test_bench_nri_prints_its_figures(containerd_unavailable: str | None) -> None:
    """A tiny `eventsrc bench nri` against real containerds: a row per mode with every figure and
    what each adds over no plugin; the two references (the minimal plugin, one synced append);
    and each eventsrc mode's distance from them, with its goals."""
    if containerd_unavailable is not None:
        pytest.skip(containerd_unavailable)
    proc = run_cli("bench", "nri", "--pods", "3", "--rounds", "1", timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "3 pods of one container per mode in 1 round(s)" in out, out
    figure = rf"\s+{NUMBER}"
    six = rf"\s+3{figure * 6}"
    assert re.search(rf"^no plugin \(ceiling\){six}\s+-\s+-\s+-$", out, re.M), out
    added = rf"\s+[+-]{NUMBER}" * 3
    for mode in ("minimal NRI plugin", "observe", "enforce, BestEffort", "enforce, Guaranteed"):
        assert re.search(rf"^{re.escape(mode)}{six}{added}$", out, re.M), (mode, out)
    sync = rf"^one synced append of an admission \(\d+ events, 200 times\): p50 {NUMBER}, p90 {NUMBER}$"
    assert re.search(sync, out, re.M), out
    assert re.search(rf"^the minimal plugin adds [+-]{NUMBER} to CreateContainer's median$", out, re.M), out
    verdict = "(ok|ABOVE THE GOAL)"
    goals = {
        "observe": r"the minimal plugin's \+ 0\.5",
        "enforce, BestEffort": r"the minimal plugin's \+ one synced append \+ 1",
        "enforce, Guaranteed": r"the minimal plugin's \+ one synced append \+ 1",
    }
    for mode, goal in goals.items():
        row = rf"^{re.escape(mode)}\s+\+create p50 [+-]{NUMBER}: .*; goal <= {goal} = [+-]?{NUMBER}: {verdict}; "
        assert re.search(rf"{row}\+create p90 [+-]{NUMBER} <= 2 x p50: {verdict}$", out, re.M), (mode, out)
    assert proc.stderr == "", proc.stderr  # nothing left behind to warn about


def test_bench_nri_without_containerd_is_one_line(tmp_path: Path) -> None:
    """Where containerd cannot be had (here: its cache cannot be made), one line says why."""
    env = {**os.environ, "EVENTSRC_CONTAINERD_CACHE": "/proc/no-such-dir/containerd"}
    proc = subprocess.run(
        [sys.executable, "-m", "eventsrc", "bench", "nri", "--pods", "1", "--rounds", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert line.startswith("eventsrc: error: no containerd to measure with: "), line
    assert proc.stdout == ""


def test_bench_nri_rounds_need_pods() -> None:
    proc = run_cli("bench", "nri", "--pods", "2", "--rounds", "3")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "eventsrc: error: --rounds (3) must be at most --pods (2): a round starts a pod at least"
    ]


def test_bench_nri_stopped_by_sigterm_leaves_nothing(containerd_unavailable: str | None) -> None:
    """SIGTERM stops containerd before its pods could be removed through CRI: the bench still
    leaves no process, no mount, no cgroup and no directory of its own."""
    if containerd_unavailable is not None:
        pytest.skip(containerd_unavailable)
    bench = subprocess.Popen(
        [sys.executable, "-m", "eventsrc", "bench", "nri", "--pods", "30", "--rounds", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started: list[int] = []
    try:
        # its four containerds and three NRI plugins (the minimal one, two daemons), then a pod or two under way
        started = eventually(lambda: [] if len(kids := _children(bench.pid)) < 7 else kids, "the bench's nodes")
        config = Path(f"/proc/{started[0]}/cmdline").read_bytes().split(b"\0")
        workdir = Path(next(a.decode() for a in config if a.endswith(b".toml"))).parent.parent
        eventually(lambda: any(workdir.name in line for line in Path("/proc/mounts").read_text().splitlines()), "a pod")
        bench.terminate()
        _, err = bench.communicate(timeout=60)
        assert bench.returncode == 130, err
        assert not [pid for pid in started if _alive(pid)]
        assert not workdir.exists()
        assert workdir.name not in Path("/proc/mounts").read_text()
        assert not [d for d in Path("/sys/fs/cgroup").glob(f"*/eventsrc-bench-{bench.pid}-*")]
    finally:
        _kill(bench, started)
