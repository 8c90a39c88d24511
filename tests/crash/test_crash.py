"""SIGKILL a writing process at random moments; every acknowledged event must survive.

Rounds: EVENTSRC_CRASH_ROUNDS (default 20; raise it for a soak).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eventsrc.events import CorruptRecordError
from eventsrc.log.store import EventLog
from tests.conftest import env_rounds

WRITER = Path(__file__).parent.parent / "support" / "writer_proc.py"
ROUNDS = env_rounds("EVENTSRC_CRASH_ROUNDS", 20)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120 + 15 * ROUNDS)]


def run_and_kill(path: Path, writers: int, map_size: int, rng: random.Random) -> list[tuple[int, str]]:
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(path), "0", str(writers), str(map_size)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    lines: list[bytes] = []
    first = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            first.set()

    reader = threading.Thread(target=read)
    reader.start()
    if not first.wait(30):
        proc.kill()
        raise AssertionError(f"writer never acknowledged anything: {proc.stderr.read()!r}")  # type: ignore[union-attr]
    time.sleep(rng.uniform(0, 0.25))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader.join()
    acked = []
    for line in lines:
        if line.endswith(b"\n"):  # a torn last line was never a complete acknowledgement
            _, seq, uid = line.decode().split()
            acked.append((int(seq), uid))
    return acked


def test_every_acknowledged_event_survives_sigkill(tmp_path: Path) -> None:
    rng = random.Random(20261121)
    path = tmp_path / "log"
    all_acked: dict[int, str] = {}
    for round_ in range(ROUNDS):
        writers = rng.choice([1, 4, 64])
        # Small maps on some rounds, so that kills also land while the map grows.
        map_size = rng.choice([64 * 1024, 1 << 30])
        acked = run_and_kill(path, writers, map_size, rng)
        assert acked, f"round {round_}: nothing acknowledged"
        for seq, uid in acked:
            assert seq not in all_acked, f"sequence {seq} acknowledged twice"
            all_acked[seq] = uid
        log = EventLog(path, readonly=True)
        try:
            records = list(log.records())
        finally:
            log.close()
        corrupt = [r for r in records if isinstance(r, CorruptRecordError)]
        assert not corrupt, f"round {round_}: {corrupt}"
        on_disk = {r.seq: r.event.pod_uid for r in records}  # type: ignore[union-attr]
        assert sorted(on_disk) == list(range(1, len(on_disk) + 1)), "sequences are not contiguous"
        missing = {s: u for s, u in all_acked.items() if on_disk.get(s) != u}
        assert not missing, f"round {round_}: acknowledged but lost or changed: {sorted(missing.items())[:5]}"
