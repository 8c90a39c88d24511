"""The benchmark's own measuring pieces (figures are never asserted: only that they are measured)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from eventsrc.bench.log import prepare_cost, trio_wake_floor
from eventsrc.log.store import EventLog


def test_trio_wake_floor_measures_and_every_task_leaves() -> None:
    assert 0 < trio_wake_floor(8, 0.05) < 0.01
    # It returns only once the waker and every writer have left their loops, whichever
    # of them trio runs first after the stop: many short runs, in a process that may hang.
    code = (
        "from eventsrc.bench.log import trio_wake_floor\nfor _ in range(60): trio_wake_floor(4, 0.002)\nprint('done')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.stdout.strip() == "done", proc.stderr


def test_prepare_cost_measures_without_writing(tmp_path: Path) -> None:
    assert 0 < prepare_cost(tmp_path / "log", 16, rounds=5) < 0.01
    with EventLog(tmp_path / "log", readonly=True) as log:
        assert log.last_seq() == 0  # prepared batches were abandoned, nothing written
