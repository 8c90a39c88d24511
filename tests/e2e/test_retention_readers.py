"""The offline readers after retention cuts (docs/operations.md, "Reading a trimmed log"):
``audit``, ``replay``, ``log``, ``export``, ``state`` and ``backup`` read the archive by
default, ``--live-only`` the live log alone, and a missing segment is one line on stderr.

The log is written directly (no daemon): ``tests.node.test_history.held_then_cut`` holds
dev-0 for pod ``default/hold`` in records 3..6, cuts at 10 and 20 into two segments, and
records dev-0 turning unhealthy at 23."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from eventsrc.layout import Layout
from eventsrc.log.archive import segment_name
from eventsrc.log.store import EventLog
from eventsrc.state.apply import rebuild
from tests.conftest import run_cli
from tests.node.test_history import RES, T0, cut, flaps, held_then_cut, whole


@pytest.fixture
def cut_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "root"
    layout = Layout(root)
    layout.state.mkdir(parents=True)
    held_then_cut(layout.log, layout.archive).close()
    yield root


def test_audit_device_answers_across_the_cut(cut_root: Path) -> None:
    out = run_cli("audit", "device", RES, "dev-0", root=cut_root, check=True).stdout
    assert "default/hold" in out and "still held" in out
    assert "the live log starts at record 21: records before it read from 2 archive segments" in out
    got = json.loads(run_cli("audit", "device", RES, "dev-0", "-o", "json", root=cut_root, check=True).stdout)
    assert [(h["pod"]["name"], h["still_held"]) for h in got["holders"]] == [("hold", True)]
    assert got["log"] == {
        "first_seq": 1,
        "live_first_seq": 21,
        "archive_segments": 2,
        "live_only": False,
        "missing": [],
    }


def test_audit_live_only_reads_from_the_base_and_says_so(cut_root: Path) -> None:
    out = run_cli("audit", "device", RES, "dev-0", "--live-only", root=cut_root, check=True).stdout
    assert "holders (0)" in out and "default/hold" not in out
    assert "the live log starts at record 21: records 1..20 were not read (--live-only)" in out
    # a pod whose records all left the live log: not in it, and the error says where it starts
    proc = run_cli("audit", "pod", "default/hold", "--live-only", root=cut_root)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "live log starts at record 21" in proc.stderr
    assert "default/hold is pod uid-hold" in run_cli("audit", "pod", "default/hold", root=cut_root, check=True).stdout


def test_a_missing_segment_is_one_line_and_the_rest_is_read(cut_root: Path) -> None:
    (Layout(cut_root).archive / segment_name(11, 20)).unlink()
    proc = run_cli("audit", "device", RES, "dev-0", root=cut_root, check=True)
    assert "default/hold" in proc.stdout
    assert proc.stderr == (
        f"eventsrc: warning: the archive lacks records 11..20 (segment {segment_name(11, 20)} is missing): "
        "reading what is there\n"
    )
    proc = run_cli("export", root=cut_root, check=True)
    assert [json.loads(line)["seq"] for line in proc.stdout.splitlines()] == [*range(1, 11), 21, 22, 23]
    assert "records 11..20" in proc.stderr


def test_export_and_log_include_the_archive(cut_root: Path) -> None:
    proc = run_cli("export", "--from", "1", root=cut_root, check=True)
    lines = [json.loads(line) for line in proc.stdout.splitlines()]  # stdout stays JSON lines
    assert [r["seq"] for r in lines] == list(range(1, 24))
    assert "the live log starts at record 21" in proc.stderr
    resumed = run_cli("export", "--from", "9", "--until", "12", root=cut_root, check=True).stdout
    assert [json.loads(line)["seq"] for line in resumed.splitlines()] == [9, 10, 11, 12]
    live = run_cli("export", "--live-only", root=cut_root, check=True)
    assert [json.loads(line)["seq"] for line in live.stdout.splitlines()] == [21, 22, 23]
    assert "records 1..20 are not read (--live-only)" in live.stderr
    proc = run_cli("log", root=cut_root, check=True)
    assert "records 1..20 are read from 2 archive segments" in proc.stderr
    rows = proc.stdout.splitlines()
    assert rows[1].split()[0] == "1" and len(rows) == 24
    assert f"records 1..10 left the live log into archive segment {segment_name(1, 10)} (test)" in proc.stdout


def test_state_rebuilds_the_whole_history(cut_root: Path, tmp_path: Path) -> None:
    full = whole(tmp_path / "whole")
    at5 = run_cli("state", "--until", "5", "-o", "json", root=cut_root, check=True)
    assert json.loads(at5.stdout)["devices"] == json.loads(msgspec.json.encode(rebuild(full.records(1, 5))))["devices"]
    assert "the live log starts at record 21" in at5.stderr
    now = json.loads(run_cli("state", "-o", "json", root=cut_root, check=True).stdout)
    live = json.loads(run_cli("state", "--live-only", "-o", "json", root=cut_root, check=True).stdout)
    assert now["devices"] == live["devices"] and now["pods"] == live["pods"]
    assert "uid-hold" in now["pods"]["pods"]
    table = run_cli("state", root=cut_root, check=True).stdout
    assert "records 1..20 are read from 2 archive" in table.replace("\n", " ").replace("│", " ").replace("  ", " ")
    proc = run_cli("state", "--until", "5", "--live-only", root=cut_root)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == (
        "eventsrc: error: record 5 is before the live log's start (record 21): it is in the archive; "
        "read it without --live-only\n"
    )


def test_replay_from_record_one_through_the_archive(cut_root: Path) -> None:
    proc = run_cli("replay", "--step", root=cut_root, check=True)
    steps = proc.stdout.splitlines()
    assert [int(line.split()[0]) for line in steps] == list(range(1, 24))
    assert f"log trimmed: records 11..20 left the live log into archive segment {segment_name(11, 20)}" in steps[21]
    assert "allocated to default/hold/main" in steps[22]
    assert "the live log starts at record 21" in proc.stderr
    check = run_cli("replay", "--check", root=cut_root, check=True).stdout
    assert check == "no invariant broken in 23 events\n"
    live = run_cli("replay", "--check", "--live-only", root=cut_root, check=True).stdout
    assert live == "no invariant broken in 3 events\n"
    # --live-only starts from the base's views: the holder is known without its records
    step = run_cli("replay", "--step", "--live-only", root=cut_root, check=True).stdout.splitlines()
    assert [int(line.split()[0]) for line in step] == [21, 22, 23]
    assert "allocated to default/hold/main" in step[2]
    proc = run_cli("replay", "--until", "5", "--live-only", root=cut_root)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "without --live-only" in proc.stderr


def test_replay_check_catches_a_broken_rule_in_the_archive(tmp_path: Path) -> None:
    """An invariant broken by archived records is found by default, not with --live-only."""
    from eventsrc import events as ev
    from eventsrc.log import cut_steps as steps
    from eventsrc.log.store import EventLog

    root = tmp_path / "root"
    layout = Layout(root)
    layout.state.mkdir(parents=True)
    log = EventLog(layout.log)
    bad = ev.PodRef(uid="uid-bad", namespace="default", name="bad")
    spec = [ev.ContainerSpec(name="main", requests={RES: "1"}, limits={RES: "1"})]
    for i, e in enumerate(
        [
            ev.DevicesAdded(resource=RES, devices=[ev.DeviceInfo(id="dev-0", health="Unhealthy")]),
            ev.PodAdmissionStarted(pod=bad, containers=spec),
            # an unhealthy device reserved: the rule broken, in what will be archived
            ev.DevicesReserved(pod_uid="uid-bad", container="main", resource=RES, device_ids=["dev-0"]),
            ev.DevicesAllocated(pod_uid="uid-bad", container="main", resource=RES, device_ids=["dev-0"]),
            ev.PodAdmitted(pod=bad, containers=spec),
            *(ev.PluginRegistered(resource=f"r{i}", endpoint="x.sock") for i in range(3)),
        ],
        start=1,
    ):
        log.append([e], f"c{i}", i)
    steps.commit(log, steps.prepare(log, layout.archive, 5))
    log.close()
    found = run_cli("replay", "--check", root=root)
    assert found.returncode == 1 and "invariant broken at seq 3: unhealthy-device-allocated" in found.stdout
    assert run_cli("replay", "--check", "--live-only", root=root, check=True).stdout.startswith("no invariant broken")


def test_backup_copies_the_archive(cut_root: Path, tmp_path: Path) -> None:
    dest = tmp_path / "backup"
    out = run_cli("backup", str(dest), "-o", "json", root=cut_root, check=True).stdout
    info = json.loads(out)
    assert sorted(Path(p).name for p in info["segments"]) == [segment_name(1, 10), segment_name(11, 20)]
    assert info["missing_segments"] == []
    verify = run_cli("audit", "verify", root=dest, check=True).stdout
    assert "2 archive segments checked: records 1..20 chain into the live log" in verify
    assert "default/hold" in run_cli("audit", "device", RES, "dev-0", root=dest, check=True).stdout


def test_backup_names_a_segment_it_could_not_copy(cut_root: Path, tmp_path: Path) -> None:
    (Layout(cut_root).archive / segment_name(1, 10)).unlink()
    proc = run_cli("backup", str(tmp_path / "backup"), root=cut_root)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and segment_name(1, 10) in proc.stderr
    assert (Layout(tmp_path / "backup").archive / segment_name(11, 20)).is_file()


@pytest.mark.parametrize("archive", [True, False], ids=["archive", "no archive"])
def test_export_follow_behind_a_cut_reads_the_archive_or_stops_at_the_first_record_it_lacks(
    tmp_path: Path, archive: bool
) -> None:
    """A consumer that stalls while the log is cut: ``export --follow`` (stopped by SIGSTOP,
    as a stalled pipe would stop it) then gets every record from the archive, or, when the
    cut kept none, stops with one line naming the first record it lacks."""
    layout = Layout(tmp_path / "root")
    layout.state.mkdir(parents=True)
    log = EventLog(layout.log)
    flaps(log, 30)
    cmd = [sys.executable, "-m", "eventsrc", "--root-dir", str(layout.root), "export", "--follow"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        seqs = [json.loads(proc.stdout.readline())["seq"] for _ in range(30)]
        os.kill(proc.pid, signal.SIGSTOP)  # it has read 1..30; it reads nothing more until SIGCONT
        flaps(log, 20)  # 31..50
        log.append([cut(log, layout.archive if archive else None, 45)], "trim", T0)  # 51
        os.kill(proc.pid, signal.SIGCONT)
        if archive:
            while seqs[-1] < 51:  # up to the LogTrimmed, whatever came before it
                seqs.append(json.loads(proc.stdout.readline())["seq"])
            assert seqs == list(range(1, 52))
        else:
            rest, err = proc.communicate(timeout=60)
            assert proc.returncode == 1 and rest == "", rest
            assert err == (
                "eventsrc: error: records 31..45 left the live log before they were read, and the archive lacks "
                "records 1..45 (cut without an archive): stopped before record 31\n"
            )
    finally:
        proc.kill()
        proc.wait()
        log.close()


@pytest.mark.parametrize(
    "command",
    [
        ("audit", "device", RES, "dev-0"),
        ("audit", "verify"),
        ("replay", "--check"),
        ("export",),
        ("log",),
        ("state",),
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_a_fifo_in_place_of_a_segment_is_refused_not_opened(cut_root: Path, command: tuple[str, ...]) -> None:
    """A FIFO would block whoever opens it until a writer came: each reader refuses it in
    one line, as it refuses a directory (a hang fails the test at run_cli's timeout)."""
    segment = Layout(cut_root).archive / segment_name(1, 10)
    segment.unlink()
    os.mkfifo(segment)
    proc = run_cli(*command, root=cut_root, timeout=20)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    said = proc.stdout if command == ("audit", "verify") else proc.stderr
    assert f"archive segment {segment_name(1, 10)}" in said and "not a regular file (a FIFO)" in said, said
    if command != ("audit", "verify"):
        errors = [line for line in proc.stderr.splitlines() if line.startswith("eventsrc: error: ")]
        assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
