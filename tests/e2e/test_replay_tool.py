"""tools/replay: read-only replay of a copied log."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
SCRIPT = REPO / "tools" / "replay" / "replay.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_replays_a_copied_log_without_writing_to_it(tmp_path: Path) -> None:
    copy = tmp_path / "from-another-node"
    shutil.copytree(REPO / "tests" / "fixtures" / "log-v1", copy)
    before = hashlib.sha256((copy / "data.mdb").read_bytes()).hexdigest()
    (copy).chmod(0o555)  # even a read-only directory is enough
    try:
        proc = run(str(copy), "--until", "4", "-o", "json")
    finally:
        copy.chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    views = json.loads(proc.stdout)
    assert views["meta"]["last_seq"] == 4
    assert views["devices"]["devices"]["example.com/gpu"]["gpu-0"]["health"] == "Unhealthy"
    assert sorted(p.name for p in copy.iterdir()) == ["data.mdb"]
    assert hashlib.sha256((copy / "data.mdb").read_bytes()).hexdigest() == before


def test_missing_log_is_one_line(tmp_path: Path) -> None:
    proc = run(str(tmp_path))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "no eventsrc log" in proc.stderr
