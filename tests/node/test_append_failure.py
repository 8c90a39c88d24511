"""A failed append (a full disk, say) is answered to its caller and logged by the daemon."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from eventsrc import events as ev
from eventsrc.errors import EventsrcError
from eventsrc.log.commit import GroupCommitter
from eventsrc.log.store import EventLog


def test_a_failed_append_is_logged_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def disk_full(self: EventLog, *args: object) -> None:
        raise EventsrcError(f"cannot append to the event log at {self.path}: No space left on device")

    async def main() -> None:
        with EventLog(tmp_path) as log:
            committer = GroupCommitter(log)
            async with trio.open_nursery() as nursery:
                await nursery.start(committer.run)
                monkeypatch.setattr(EventLog, "write", disk_full)
                with pytest.raises(EventsrcError, match="No space left on device"):
                    await committer.append([ev.PodRemoved(pod_uid="uid-a")], "cid-full")
                nursery.cancel_scope.cancel()

    with caplog.at_level(logging.WARNING, logger="eventsrc.log.commit"):
        trio.run(main)
    (record,) = [r for r in caplog.records if r.getMessage() == "append failed"]
    assert record.levelno == logging.WARNING
    fields = getattr(record, "fields", {})
    assert "No space left on device" in fields["reason"]
    assert fields["events"] == ["PodRemoved"] and fields["cid"] == "cid-full"
