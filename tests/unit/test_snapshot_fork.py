"""Snapshots written by a forked child (``log.snapshots.fork_snapshot``): the views as they
were at the fork, whatever the parent applies meanwhile."""

from __future__ import annotations

from pathlib import Path

from eventsrc.log.snapshots import fork_snapshot, load_views, snapshot_path, wait_snapshot
from eventsrc.log.store import EventLog
from eventsrc.state.apply import apply_all
from eventsrc.state.views import Views


def _log(tmp_path: Path, n: int) -> EventLog:
    from eventsrc.bench.log import workload

    log = EventLog(tmp_path / "log")
    log.append(list(workload(n)), "c", 1)
    return log


def test_the_snapshot_holds_the_views_at_the_fork(tmp_path: Path) -> None:
    log = _log(tmp_path, 3000)
    snapdir = tmp_path / "snapshots"
    views = apply_all(Views(), log.records(1, 2000))
    at_fork = apply_all(Views(), log.records(1, 2000))
    pid = fork_snapshot(snapdir, views, log.log_id())
    apply_all(views, log.records(2001, 3000))  # the parent goes on at once
    assert wait_snapshot(pid) == ""
    assert snapshot_path(snapdir, 2000).exists()
    loaded, info = load_views(log, snapdir, until_seq=2000)
    assert info.snapshot_seq == 2000 and info.tail_records == 0
    assert loaded == at_fork != views


def test_a_snapshot_that_cannot_be_written_is_reported(tmp_path: Path) -> None:
    log = _log(tmp_path, 10)
    snapdir = tmp_path / "snapshots"
    snapdir.write_text("not a directory")
    views = apply_all(Views(), log.records(1, 10))
    assert "could not be written" in wait_snapshot(fork_snapshot(snapdir, views, log.log_id()))
