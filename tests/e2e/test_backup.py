"""``eventsrc backup``: a consistent copy while the daemon admits and removes pods."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from tests.conftest import run_cli
from tests.e2e.test_devices_e2e import plugins, pod_yaml  # noqa: F401  # plugins: the fixture


def records(root: Path) -> list[dict]:  # type: ignore[type-arg]
    proc = run_cli("log", "-o", "json", root=root)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_backup_while_admitting_is_a_prefix_with_its_chain(root: Path, tmp_path: Path, daemon_factory, plugins) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    daemon_factory("--snapshot-every", "20")
    plugins("--devices", "4").wait_registered()
    stop = threading.Event()
    admitted = []

    def churn() -> None:
        i = 0
        while not stop.is_set():
            uid = f"uid-{i}"
            if run_cli("admit", "-f", str(pod_yaml(tmp_path, f"p{i}", 1, uid=uid)), root=root).returncode == 0:
                admitted.append(uid)
                if len(admitted) > 2:  # keep two pods running; never run out of devices
                    run_cli("remove", admitted[-3], root=root, check=True)
            i += 1

    worker = threading.Thread(target=churn)
    worker.start()
    backups = []
    try:
        for n in range(3):
            while len(admitted) < 3 * (n + 1):
                assert worker.is_alive()
                threading.Event().wait(0.05)
            dest = root.parent / f"bk{n}"
            proc = run_cli("backup", str(dest), "-o", "json", root=root)
            assert proc.returncode == 0, proc.stderr
            backups.append((dest, json.loads(proc.stdout)))
    finally:
        stop.set()
        worker.join(60)
    live = records(root)
    for dest, info in backups:
        copied = records(dest)
        # A prefix of the live log, whole: contiguous sequences, every record as written.
        assert [r["seq"] for r in copied] == list(range(1, info["last_seq"] + 1))
        assert copied == live[: len(copied)]
        verify = run_cli("audit", "verify", root=dest)
        assert verify.returncode == 0 and "the chain holds" in verify.stdout, verify.stdout + verify.stderr
        assert run_cli("state", root=dest).returncode == 0
        assert run_cli("audit", "device", "example.com/dev", "dev-0", root=dest).returncode == 0
        # Snapshots come along only when the copy reaches them.
        for snap in info["snapshots"]:
            assert int(Path(snap).name.split("-")[1].split(".")[0]) <= info["last_seq"]
    assert backups[-1][1]["last_seq"] > backups[0][1]["last_seq"]


def test_backup_needs_an_empty_destination_and_a_log(root: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    missing = run_cli("backup", str(root.parent / "bk"), root=root)
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    daemon_factory()
    (root.parent / "full").mkdir()
    (root.parent / "full" / "x").write_text("x")
    proc = run_cli("backup", str(root.parent / "full"), root=root)
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        == f"eventsrc: error: backup destination {root.parent / 'full'} must be a new or empty directory"
    )
