"""Damage to the log's files, as an unlucky operator meets it (docs/adr/0005, docs/security.md):
a corrupt record that may be a pod's, a truncated data file, a log lost next to the history
that proves it existed, and a log file deleted while the daemon runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from eventsrc import events as ev
from eventsrc.log.store import EventLog
from tests.conftest import REPO, run_cli
from tests.e2e.test_cli import flip_marker
from tests.e2e.test_devices_e2e import admit, devices_of, log_records, pod_yaml
from tests.e2e.test_devices_e2e import plugins as plugins  # a fixture
from tests.e2e.test_metrics import get, metrics_address

DAMAGED = 4  # DamagedLogError: deploy/eventsrc.service's RestartPreventExitStatus


def one_line(proc, *needles: str) -> None:  # type: ignore[no-untyped-def]
    """A refusal: one line on stderr naming what was checked, a non-zero exit, no signal."""
    assert proc.returncode == DAMAGED, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def plain_pod(tmp: Path, name: str) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, uid: uid-{name}}}\n"
        "spec:\n  containers:\n"
        "  - name: main\n    image: busybox\n    resources:\n      limits: {cpu: 100m}\n"
    )
    return path


def readable_records(root: Path, since: int = 1) -> list[dict]:  # type: ignore[type-arg]
    """The records `eventsrc log` can read (it exits 1 when some are corrupt)."""
    proc = run_cli("log", "-o", "json", "--from", str(since), root=root)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr
    return [r for r in map(json.loads, proc.stdout.splitlines()) if not r.get("corrupt")]


def log_dir(root: Path) -> Path:
    return root / "eventsrc" / "log"


def test_a_running_pod_whose_admission_record_is_corrupt_keeps_its_devices(
    root: Path, tmp_path: Path, daemon_factory, plugins
) -> None:  # type: ignore[no-untyped-def]
    d = daemon_factory()
    plugin = plugins("--devices", "2")
    plugin.wait_registered()
    rc, info, err = admit(root, pod_yaml(tmp_path, "first", 2, uid="uid-first"))
    assert rc == 0, err
    held = sorted(devices_of(info))
    (admitted,) = [r["seq"] for r in log_records(root) if r["type"] == "PodAdmitted"]
    plugin.stop()
    assert d.stop() == 0
    shutil.rmtree(root / "eventsrc" / "snapshots")
    assert flip_marker(log_dir(root) / "data.mdb", b"PodAdmitted") >= 1

    d = daemon_factory()
    plugins("--devices", "2")
    d.eventually(
        lambda: [r["type"] for r in readable_records(root, admitted + 1)].count("PluginRegistered") == 1,
        "the plugin to register again",
    )
    # Never released on a guess: the pod is quarantined, holding both devices.
    rc, _, err = admit(root, pod_yaml(tmp_path, "second", 1, uid="uid-second"))
    assert rc == 1 and "requested number of devices unavailable" in err, err
    records = readable_records(root, admitted + 1)
    assert not [r for r in records if r["type"] in ("DevicesReleased", "AdmissionRejected") and "first" in str(r)]
    (q,) = [r for r in records if r["type"] == "PodQuarantined"]
    assert q["event"]["pod"]["uid"] == "uid-first" and q["event"]["corrupt_seqs"] == [admitted]
    # Visible: the daemon's log (with the sequence), `pods`, `state`.
    d.eventually(lambda: "pod quarantined" in d.output(), "the daemon's log to name the quarantine")
    line = next(x for x in d.output().splitlines() if "pod quarantined" in x)
    assert "uid=uid-first" in line and f"corrupt_seqs={admitted}" in line
    pods = run_cli("pods", root=root, check=True)
    assert "quarantined" in pods.stdout and "uid-first is quarantined" in pods.stderr
    assert f"uid-first is quarantined: records {admitted} are in doubt" in pods.stderr, pods.stderr
    listed = json.loads(run_cli("pods", "-o", "json", root=root, check=True).stdout)["pods"]
    assert [p["in_doubt"] for p in listed if p["uid"] == "uid-first"] == [[str(admitted)]], listed  # int64 as JSON
    state = run_cli("state", root=root)
    assert state.returncode == 1 and f"uid-first (default/first): records {admitted} in doubt" in state.stdout
    devices = json.loads(run_cli("state", "-o", "json", root=root).stdout)["devices"]["devices"]["example.com/dev"]
    assert sorted(k for k, v in devices.items() if v["holder"].startswith("uid-first/")) == held

    # The operator resolves it by removing the pod: recorded, and its devices go to the next pod.
    assert run_cli("remove", "uid-first", root=root).returncode == 0
    (removed,) = [r for r in readable_records(root, admitted + 1) if r["type"] == "PodRemoved"]
    assert "quarantined" in removed["event"]["reason"]
    rc, info, err = admit(root, pod_yaml(tmp_path, "second", 1, uid="uid-second"))
    assert rc == 0 and devices_of(info)[0] in held, err


def _log_with_records(root: Path, n: int = 3000) -> Path:
    log = EventLog(log_dir(root))
    for i in range(0, n, 500):
        log.append([ev.PodRemoved(pod_uid=f"pod-{j}", reason="x" * 64) for j in range(i, i + 500)], f"c{i}", 1)
    log.close()
    return log_dir(root) / "data.mdb"


def test_a_truncated_data_file_is_one_line_and_exit_4_never_a_signal(root: Path) -> None:
    data = _log_with_records(root)
    size = data.stat().st_size
    with open(data, "r+b") as f:
        f.truncate(size // 2)
    for args in (["state"], ["audit", "verify"], ["log"], ["serve"], ["replay", "--check"]):
        proc = run_cli(*args, root=root, timeout=30)
        one_line(proc, str(data), f"{size // 2} bytes", "truncated")
    # Not LMDB at all (both meta pages gone): the same.
    with open(data, "r+b") as f:
        f.write(b"\0" * 8192)
    one_line(run_cli("serve", root=root, timeout=30), str(data), "meta page")


def test_the_unit_does_not_restart_into_a_damaged_log() -> None:
    unit = (REPO / "deploy" / "eventsrc.service").read_text()
    (line,) = [x for x in unit.splitlines() if x.startswith("RestartPreventExitStatus=")]
    assert str(DAMAGED) in line.split("=")[1].split()


def test_a_lost_log_next_to_its_history_is_refused_unless_accepted(root: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d = daemon_factory()
    assert d.stop() == 0
    data = log_dir(root) / "data.mdb"
    assert list((root / "eventsrc" / "snapshots").glob("snapshot-*"))
    data.unlink()
    one_line(run_cli("serve", root=root, timeout=30), f"{data} is missing", "snapshot", "--accept-empty-log")
    assert not data.exists()  # nothing was created over it
    data.write_bytes(b"")
    one_line(run_cli("serve", root=root, timeout=30), f"{data} is empty")
    # Snapshots gone too: LMDB's lock file still shows a daemon opened the log here.
    shutil.rmtree(root / "eventsrc" / "snapshots")
    data.unlink()
    one_line(run_cli("serve", root=root, timeout=30), "lock.mdb")

    d = daemon_factory("--accept-empty-log")
    assert d.stop() == 0
    started = [r for r in log_records(root) if r["type"] == "DaemonStarted"]
    assert len(started) == 1 and "lock.mdb" in started[0]["event"]["fresh_start"]
    assert "starting a new history over a lost log" in d.output()
    # A log with records starts as always.
    d = daemon_factory()
    assert d.stop() == 0


def test_a_log_file_deleted_while_the_daemon_runs_stops_acknowledging(
    root: Path, tmp_path: Path, daemon_factory
) -> None:  # type: ignore[no-untyped-def]
    d = daemon_factory("--metrics-address", "127.0.0.1:0")
    address = metrics_address(root)
    assert get(f"http://{address}/healthz") == (200, "ok")
    rc, _, err = admit(root, plain_pod(tmp_path, "before"))
    assert rc == 0, err
    (log_dir(root) / "data.mdb").unlink()
    rc, _, err = admit(root, plain_pod(tmp_path, "after"))
    assert rc != 0 and "data.mdb was deleted while the daemon ran" in err, err
    assert len(err.strip().splitlines()) == 1
    status, body = get(f"http://{address}/healthz")
    assert status == 500 and "was deleted" in body
    assert "event log file lost" in d.output()


def test_background_records_that_fail_after_the_log_is_lost_leave_the_daemon_up(
    root: Path, daemon_factory, plugins
) -> None:  # type: ignore[no-untyped-def]
    """A plugin going away is recorded by a background task, which no caller waits for: when
    the log refuses the append, the daemon logs it and serves on (unhealthy), not ends."""
    d = daemon_factory()
    plugin = plugins("--devices", "2")
    plugin.wait_registered()
    (log_dir(root) / "data.mdb").unlink()
    plugin.stop()
    d.eventually(lambda: "recording failed" in d.output(), "the failed PluginDisconnected to be logged")
    assert d.exited() is None
    status = run_cli("status", root=root)
    assert d.exited() is None, status.stderr


def test_a_log_that_lost_its_newest_records_is_refused(root: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    """A data.mdb swapped for an older copy of itself (or whose newest transaction a damaged
    meta page dropped) ends before the snapshot taken of it."""
    assert daemon_factory().stop() == 0
    data = log_dir(root) / "data.mdb"
    older = root.parent / "older.mdb"
    shutil.copyfile(data, older)
    assert daemon_factory().stop() == 0
    shutil.copyfile(older, data)
    one_line(run_cli("serve", root=root, timeout=30), f"{data} ends at record", "snapshot", "lost")
    d = daemon_factory("--accept-empty-log")
    assert d.stop() == 0
    started = [r for r in readable_records(root) if r["type"] == "DaemonStarted"]
    assert "ends at record" in started[-1]["event"]["fresh_start"]


def test_a_snapshot_with_a_byte_that_is_not_utf8_is_ignored(root: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    """Found by test_fuzz_damage.py: msgspec raises UnicodeDecodeError (not a DecodeError)
    for a string field that is not UTF-8; the snapshot is a cache and is ignored."""
    assert daemon_factory().stop() == 0
    (snap,) = (root / "eventsrc" / "snapshots").glob("snapshot-*")
    log_id = EventLog(log_dir(root), readonly=True).log_id().encode()
    data = snap.read_bytes()
    assert data.count(log_id) == 1
    snap.write_bytes(data.replace(log_id, b"\xe5" + log_id[1:]))
    state = run_cli("state", root=root)
    assert state.returncode == 0 and "Traceback" not in state.stderr, state.stderr
    d = daemon_factory()
    assert "snapshot ignored" in d.output() and d.stop() == 0
