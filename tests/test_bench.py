"""The benchmark's own measuring pieces (figures are never asserted: only that they are measured)."""

from __future__ import annotations

from pathlib import Path

from eventsrc.bench import prepare_cost, trio_wake_floor
from eventsrc.log.store import EventLog


def test_trio_wake_floor_measures_and_every_task_leaves() -> None:
    # Returns at all only if the waker and every writer left their loops.
    assert 0 < trio_wake_floor(8, 0.05) < 0.01


def test_prepare_cost_measures_without_writing(tmp_path: Path) -> None:
    assert 0 < prepare_cost(tmp_path / "log", 16, rounds=5) < 0.01
    with EventLog(tmp_path / "log", readonly=True) as log:
        assert log.last_seq() == 0  # prepared batches were abandoned, nothing written
