"""Retention under load (docs/adr/0018): with a small ``maxSize`` the live log stays under
its bound plus one piece, the archive verifies, ``audit device`` answers across the cut,
and a deleted archive segment is named by ``audit verify``."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from eventsrc.layout import Layout
from eventsrc.log.store import EventLog
from tests.conftest import Daemon, run_cli
from tests.e2e.test_metrics import get, metrics_address, scrape, value
from tests.support.node_client import NodeClient

RESOURCE = "example.com/dev"
MAX_SIZE = 64 * 1024
PIECE = 50
pytestmark = pytest.mark.timeout(300)


def live_size(root: Path) -> tuple[int, int]:
    """(bytes the live records and their index take, live records)."""
    with EventLog(Layout(root).log, readonly=True) as log:
        return log.used_bytes(), log.last_seq() - log.first_seq() + 1


def test_a_daemon_under_load_keeps_its_log_bounded_and_its_history_verifiable(
    root: Path, daemon_factory: type[Daemon]
) -> None:
    daemon = daemon_factory("--snapshot-every", str(PIECE), "--log-retention-max-size", str(MAX_SIZE))
    plugin = subprocess.Popen(
        [sys.executable, "-m", "eventsrc", "--root-dir", str(root), "sample-plugin", "--devices", "4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        daemon.eventually(lambda: "DevicesAdded" in run_cli("log", root=root).stdout, "the plugin's devices")
        samples: list[tuple[int, int]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append(live_size(root))
                stop.wait(0.05)  # a sampling rate, not a synchronisation

        sampler = threading.Thread(target=sample)
        sampler.start()
        first_holder = ""
        with NodeClient(root) as client:
            try:
                for i in range(400):
                    info = client.admit(RESOURCE, name=f"p{i}")
                    if i == 0:
                        first_holder = info.uid
                        first_device = info.containers[0].resources[0].device_ids[0]
                    client.remove(info.uid)
            finally:
                stop.set()
                sampler.join()
        with EventLog(Layout(root).log, readonly=True) as log:
            base = log.base()
            assert base is not None and len(log.ledger()) >= 5, "the load never made the log cut itself"
            first_seq = log.first_seq()
        # The bound: the live records under maxSize, plus the piece recorded since the last cut.
        peak_bytes, peak_records = max(samples)
        per_record = peak_bytes / max(1, peak_records)
        assert peak_bytes <= MAX_SIZE + PIECE * per_record, (peak_bytes, peak_records, MAX_SIZE)
        print(f"live log peak {peak_bytes} bytes ({peak_records} records) under maxSize {MAX_SIZE} + one piece")

        verified = run_cli("audit", "verify", "-o", "json", root=root)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        report = json.loads(verified.stdout)
        assert report["segments"] >= 5 and report["archive_findings"] == [] and report["findings"] == []

        # The first pod's records left the live log long ago; the archive still answers.
        audit = run_cli("audit", "device", RESOURCE, first_device, "-o", "json", root=root)
        assert audit.returncode == 0, audit.stderr
        assert first_holder in audit.stdout
        live = run_cli("audit", "device", RESOURCE, first_device, "--live-only", "-o", "json", root=root)
        assert live.returncode in (0, 1), live.stderr  # 1: nothing in the live log for it
        assert first_holder not in live.stdout
        assert first_seq > 10

        # A segment deleted is named.
        segments = sorted(Layout(root).archive.glob("segment-*.zst"))
        victim = segments[len(segments) // 2]
        victim.unlink()
        broken = run_cli("audit", "verify", root=root)
        assert broken.returncode == 1
        assert f"archive segment {victim.name}" in broken.stdout and "missing" in broken.stdout
    finally:
        plugin.kill()
        plugin.wait()
        daemon.stop()


def test_a_failing_archive_is_said_once_and_shown_in_status_healthz_and_metrics(
    root: Path, daemon_factory: type[Daemon]
) -> None:
    """Issue 24, item 7: an archive that cannot be written was one ERROR line per attempt
    while ``status`` said "running and ready". Root ignores permissions: the archive
    directory is a regular file instead, which stops root as well."""
    daemon = daemon_factory(
        "--snapshot-every", "20", "--log-retention-max-size", "16Ki", "--metrics-address", "127.0.0.1:0"
    )
    address = metrics_address(root)
    archive = Layout(root).archive
    assert not archive.exists()  # made at the first cut
    archive.write_text("a file where the archive directory should be")

    def status() -> dict[str, Any]:
        return json.loads(run_cli("status", "-o", "json", root=root, check=True).stdout)  # type: ignore[no-any-return]

    with NodeClient(root) as client:

        def failing() -> bool:
            for _ in range(10):  # admissions go on while the cuts fail
                client.remove(client.admit("cpu").uid)
            return bool(status()["retention"]["failing"])

        daemon.eventually(failing, "the retention cuts to fail")
    # tried again with a pause that doubles (1 s, 2 s): three attempts, one line
    retention = daemon.eventually(
        lambda: (r := status()["retention"])["failed_attempts"] >= 3 and r, "three failed attempts"
    )
    assert retention["failing"] == f"File exists: {archive}" and retention["failures_total"] >= 3
    assert retention["live_bytes"] > retention["max_size_bytes"] == 16 * 1024
    assert retention["failing_since_unix_ns"] > 0 and retention["retry_seconds"] >= 2
    assert daemon.output().count("retention cut failed") == 1, daemon.output()
    text = run_cli("status", root=root)
    assert text.returncode == 0 and "running and ready" in text.stdout
    warning = text.stderr.splitlines()
    assert len(warning) == 1 and warning[0].startswith("eventsrc: warning: log retention cuts failing for ")
    assert f"File exists: {archive}; appends go on and the live log holds " in warning[0]
    _, _, samples = scrape(address)
    assert value(samples, "eventsrc_log_retention_failing") == 1
    assert value(samples, "eventsrc_log_retention_failures_total") >= 3
    code, body = get(f"http://{address}/healthz")
    assert code == 200 and body.startswith("ok\nwarning: log retention cuts failing for "), body

    archive.unlink()  # the operator makes room: the next attempt cuts, no load needed
    daemon.eventually(lambda: not status()["retention"]["failing"], "the cuts to recover", timeout=60)
    assert daemon.output().count("retention cuts recovered") == 1
    assert daemon.output().count("retention cut failed") == 1
    assert list(archive.glob("segment-*.zst"))
    text = run_cli("status", root=root)
    assert text.returncode == 0 and text.stderr == ""
    _, _, samples = scrape(address)
    assert value(samples, "eventsrc_log_retention_failing") == 0
    code, body = get(f"http://{address}/healthz")
    assert (code, body) == (200, "ok")
    daemon.stop()
