"""The command line and the daemon, as a user meets them: subprocesses, exit codes, stderr."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from eventsrc import events as ev
from eventsrc.log.store import EventLog
from tests.conftest import run_cli

COMMANDS = [["serve"], ["status"], ["log"], ["state"], ["bench"], ["bench", "log"], ["bench", "nri"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=" ".join)
def test_every_command_has_help(cmd: list[str]) -> None:
    proc = run_cli(*cmd, "--help")
    assert proc.returncode == 0
    assert "usage: eventsrc" in proc.stdout
    assert "--root-dir" in proc.stdout


def test_module_and_top_level_help() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    for cmd in ("serve", "status", "log", "state", "bench"):
        assert cmd in proc.stdout


def one_clean_error(proc, *needles: str) -> None:  # type: ignore[no-untyped-def]
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("eventsrc")]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], proc.stderr


def test_missing_directory_is_one_clear_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    one_clean_error(run_cli("log", root=missing), "does not exist")
    one_clean_error(run_cli("state", root=missing), "does not exist")
    one_clean_error(run_cli("status", root=missing), "does not exist")
    one_clean_error(run_cli("serve", root=tmp_path / "a" / "b" / "c"), "does not exist")
    (tmp_path / "empty").mkdir()
    one_clean_error(run_cli("log", root=tmp_path / "empty"), "no event log")


def test_bad_arguments_exit_non_zero_without_traceback(root: Path) -> None:
    proc = run_cli("log", "--from", "abc", root=root)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "invalid int value" in proc.stderr


def test_serve_status_stop_restart(root: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d = daemon_factory()
    assert run_cli("status", root=root).returncode == 0
    status = json.loads(run_cli("status", "-o", "json", root=root, check=True).stdout)
    loop = status["loop"]
    assert loop["steps"] > 0 and loop["longest_seconds"] > 0 and loop["long_steps"] >= loop["over_10ms"]
    assert loop["cpu_over_10ms"] <= loop["long_steps"]
    for sub in ("device-plugins", "plugins_registry", "plugins", "pod-resources", "eventsrc"):
        assert (root / sub).is_dir()
    second = run_cli("serve", root=root)
    one_clean_error(second, "already running")
    assert d.stop(signal.SIGTERM) == 0
    one_clean_error(run_cli("status", root=root), "eventsrc is not running")
    proc = run_cli("log", "-o", "json", root=root, check=True)
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    # The first start also records the CPU manager's configuration and the shared pool.
    assert [r["type"] for r in records] == [
        "DaemonStarted",
        "PolicyConfigurationChanged",
        "SharedPoolChanged",
        "DaemonStopped",
    ]
    records = [r for r in records if r["type"].startswith("Daemon")]
    assert records[1]["event"]["reason"] == "SIGTERM"
    assert records[0]["correlation_id"] != records[1]["correlation_id"]
    assert list((root / "eventsrc" / "snapshots").glob("snapshot-*"))

    d2 = daemon_factory()
    assert d2.stop(signal.SIGINT) == 0
    assert 'msg="views rebuilt" snapshot_seq=4' in d2.output()
    state = json.loads(run_cli("state", "-o", "json", root=root, check=True).stdout)
    # The same configuration again: nothing new to record.
    assert state["meta"]["boots"] == 2 and state["meta"]["running"] is False and state["meta"]["last_seq"] == 6

    # SIGKILL: no stopped event, no snapshot; the next start notices and carries on.
    d3 = daemon_factory()
    d3.proc.kill()
    d3.proc.wait()
    d4 = daemon_factory()
    assert d4.stop() == 0
    assert "previous run did not stop cleanly" in d4.output()
    types = [
        json.loads(line)["type"] for line in run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()
    ]
    daemon_types = [t for t in types if t.startswith("Daemon")]
    assert daemon_types == ["DaemonStarted", "DaemonStopped"] * 2 + ["DaemonStarted", "DaemonStarted", "DaemonStopped"]
    assert types.count("PolicyConfigurationChanged") == 1


def test_log_table_and_ranges(root: Path) -> None:
    log = EventLog(root / "eventsrc" / "log")
    log.append([ev.PodRemoved(pod_uid=f"pod-{i}") for i in range(1, 11)], "corr-1", 1_700_000_000_000_000_000)
    log.close()
    proc = run_cli("log", "--from", "3", "--until", "5", root=root, check=True)
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["SEQ", "TIME", "TYPE"]
    assert [line.split()[0] for line in lines[1:]] == ["3", "4", "5"]
    assert "pod_uid=pod-3" in lines[1] and "2023-11-14T22:13:20" in lines[1]


def flip_marker(data_mdb: Path, marker: bytes) -> int:
    """Flip one byte inside every copy of ``marker`` in the LMDB file (old page copies too)."""
    data = bytearray(data_mdb.read_bytes())
    count = 0
    at = data.find(marker)
    while at != -1:
        data[at + len(marker) // 2] ^= 0x20
        count += 1
        at = data.find(marker, at + 1)
    data_mdb.write_bytes(bytes(data))
    return count


def test_one_flipped_byte_is_named_and_nothing_else_is_lost(root: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    log = EventLog(root / "eventsrc" / "log")
    uids = [f"pod-{i}" for i in range(1, 201)]
    uids[116] = "pod-FLIPME-marker-117"
    for i in range(0, 200, 20):  # several transactions, several pages
        log.append([ev.PodRemoved(pod_uid=u) for u in uids[i : i + 20]], f"c{i}", 1)
    log.close()
    assert flip_marker(root / "eventsrc" / "log" / "data.mdb", b"FLIPME-marker") >= 1

    proc = run_cli("log", "-o", "json", root=root)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "record 117 is corrupt: checksum mismatch" in proc.stderr
    assert "corrupt record(s) at sequence 117" in proc.stderr
    items = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [i["seq"] for i in items] == list(range(1, 201))
    assert items[116] == {"seq": 117, "corrupt": True, "reason": "checksum mismatch"}
    assert [i["event"]["pod_uid"] for i in items if not i.get("corrupt")] == uids[:116] + uids[117:]

    table = run_cli("log", root=root)
    assert table.returncode == 1 and "CORRUPT" in table.stdout and "117" in table.stderr

    proc = run_cli("state", "-o", "json", root=root)
    assert proc.returncode == 1 and "corrupt record(s) at sequence 117" in proc.stderr
    state = json.loads(proc.stdout)
    assert state["meta"]["corrupt"] == {"117": "checksum mismatch"} and state["meta"]["last_seq"] == 200

    # The daemon does not crash-loop: it starts, names the record in its log, records it.
    d = daemon_factory()
    assert run_cli("status", root=root).returncode == 0
    loop = json.loads(run_cli("status", "-o", "json", root=root, check=True).stdout)["loop"]
    assert loop["steps"] > 0 and loop["longest_seconds"] > 0 and loop["long_steps"] >= loop["over_10ms"]
    assert d.stop() == 0
    assert "seq=117" in d.output() and 'msg="corrupt record' in d.output()
    found = [json.loads(line) for line in run_cli("log", "-o", "json", "--from", "201", root=root).stdout.splitlines()]
    assert [f["event"]["seq"] for f in found if f["type"] == "CorruptRecordFound"] == [117]
    # Restarted again: still named, not recorded twice.
    d = daemon_factory()
    d.stop()
    found = [json.loads(line) for line in run_cli("log", "-o", "json", "--from", "201", root=root).stdout.splitlines()]
    assert [f["type"] for f in found].count("CorruptRecordFound") == 1
    table = run_cli("state", root=root)
    assert "117 (checksum mismatch)" in table.stdout


def test_bench_devices_prints_its_figures_and_where_the_time_goes() -> None:
    """A tiny run of `eventsrc bench devices`: every figure is printed, next to the floors
    and the per-process CPU split (not a timing assertion: only that they were measured)."""
    import re

    proc = run_cli(
        "bench",
        "devices",
        "--rounds",
        "1",
        "--devices",
        "16",
        "--clients",
        "4",
        "--admissions",
        "8",
        "--rtt-calls",
        "20",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout

    def us(label: str) -> int:
        m = re.search(re.escape(label) + r"\s+(-?\d+) us", out)
        assert m, (label, out)
        return int(m.group(1))

    assert us("bare gRPC round trip to the plugin (p50)") > 0
    client, plugin, daemon = us("bench client (grpclib)"), us("sample plugin"), us("daemon")
    assert client > 0 and plugin > 0 and daemon > 0
    assert abs(us("sum") - (client + plugin + daemon)) <= 2  # each figure is rounded
    assert "a bare node API call costs it" in out
    assert re.search(r"1 client\s+p50\s+\d+ us", out) and re.search(r"4 clients\s+p50\s+\d+ us", out)


def test_a_snapshot_that_cannot_be_written_does_not_stop_the_daemon(root: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    """Snapshots are a cache: a disk that refuses one (here the directory is a file) is
    logged, and the daemon goes on serving and stops cleanly."""
    (root / "eventsrc").mkdir(parents=True)
    (root / "eventsrc" / "snapshots").write_text("not a directory")
    d = daemon_factory("--snapshot-every", "1")  # a snapshot due after every commit
    assert run_cli("status", root=root).returncode == 0
    assert d.stop(signal.SIGTERM) == 0
    assert "snapshot not written" in d.output()
    types = [
        json.loads(line)["type"] for line in run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()
    ]
    assert types[-1] == "DaemonStopped"


# --------------------------------------------------------------------------- bad input, one line


def test_json_with_escaped_surrogate_pairs_is_read_as_json(root: Path, tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    # json.dumps writes 😀 as "\ud83d\ude00" (ensure_ascii): valid JSON, one character.
    manifest = {
        "kind": "Pod",
        "metadata": {"name": "smiley", "namespace": "default", "uid": "u-1", "annotations": {"mood": "😀"}},
        "spec": {"containers": [{"name": "app", "image": "registry/😀:1"}]},
    }
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(manifest))
    assert "\\ud83d\\ude00" in path.read_text()
    daemon_factory()
    proc = run_cli("admit", "-f", str(path), "-o", "json", root=root)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["name"] == "smiley"

    manifest["metadata"]["name"] = "😀"  # type: ignore[index]
    path.write_text(json.dumps(manifest))
    proc = run_cli("admit", "-f", str(path), root=root)
    one_clean_error(proc, "metadata.name: '😀' is not a pod name")
    assert proc.returncode == 2

    path.write_text(json.dumps(manifest).replace("\\ude00", ""))  # half a pair: not text
    proc = run_cli("admit", "-f", str(path), root=root)
    one_clean_error(proc, "'\\ud83d' is not text (an escaped surrogate without its pair)")
    assert proc.returncode == 2


@pytest.mark.parametrize(
    "text",
    [
        '{"kind": "Pod", "spec": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "[" * 100_000 + "]" * 100_000,
        "kind: Pod\nspec: " + "[" * 100_000 + "]" * 100_000 + "\n",
    ],
    ids=["json-object", "json-list", "yaml-flow"],
)
def test_a_manifest_nested_too_deeply_is_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "deep"
    path.write_text(text)
    good = tmp_path / "pod.yaml"
    good.write_text("kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a}]}\n")
    for files in (["-f", str(path)], ["-f", str(good), "-f", str(path)]):  # as the pod, as a claim
        proc = run_cli("admit", *files, root=tmp_path / "nowhere")
        one_clean_error(proc, f"{path}: nested too deeply to read")
        assert proc.returncode == 2


def _serve_read_only(root: Path) -> subprocess.CompletedProcess[str]:
    """``eventsrc serve`` with ``root`` bind-mounted read-only, in a mount namespace of its own."""
    script = (
        f"mount --bind {root} {root} && mount -o remount,bind,ro {root} && "
        f"exec {sys.executable} -m eventsrc --root-dir {root} serve"
    )
    try:
        return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("no unshare(1) here to mount a read-only root")


@pytest.mark.parametrize("history", [False, True], ids=["new-root", "root-with-a-history"])
def test_serve_on_a_read_only_root_is_one_line_and_exit_1(root: Path, daemon_factory, history: bool) -> None:  # type: ignore[no-untyped-def]
    # Exit 1: the environment is at fault, not the input (that is exit 2).
    root.mkdir(parents=True)
    if history:
        assert daemon_factory().stop() == 0
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr!r}")
    proc = _serve_read_only(root)
    one_clean_error(proc, "Read-only file system")
    assert proc.returncode == 1
