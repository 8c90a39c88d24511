"""The daemon keeps the usage index current (docs/adr/0040): when the log has grown by
``FEED_RECORDS`` since the last feed (``maybe_due``, from the commit path), or
``FEED_SECONDS`` after it when anything was appended since, it starts the feeder
(``eventsrc.log.usage_feeder``) in a process of its own and waits for it to end, in this
task; nothing else waits for it. The admission path only compares two numbers.

A feed that fails (a full disk, an unwritable state directory) is tried again after a pause
that doubles up to ``RETRY_MAX_SECONDS``, said once when feeding starts to fail or fails for
another reason, and once when it recovers. ``audit usage`` still catches up whatever the
index lacks, so a failing feeder costs only the first query's time. Cancelling the task (the
daemon stops) ends the feeder (trio's ``run_process``): the index is left at a chunk's end.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import trio

from eventsrc.core.backoff import Backoff
from eventsrc.layout import Layout
from eventsrc.log import usage_feeder
from eventsrc.obs.logger import get_logger

log = get_logger(__name__)

#: records appended since the last feed that start the next one: what a query catches up at
#: most by itself (about 0.2 s of its time at 5,000; docs/performance.md)
FEED_RECORDS = 5_000
#: a quieter log is fed this long after its last feed, when anything was appended since
FEED_SECONDS = 300.0
RETRY_FIRST_SECONDS = 10.0
RETRY_MAX_SECONDS = 600.0


class UsageKeeper:
    def __init__(self, layout: Layout, last_seq: Callable[[], int]) -> None:
        self.argv = usage_feeder.argv(layout.log, layout.archive, layout.usage)
        self.last_seq = last_seq
        self.every_records, self.every_seconds = FEED_RECORDS, FEED_SECONDS  # seams for the tests
        self.backoff = Backoff(RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS)
        #: the log's last record when the last feed that succeeded began (0: none this run)
        self.fed = 0
        self.feeds = 0  # feeds that succeeded this run
        self.failing = ""  # why the last feed failed ("" when it did not)
        self._due = trio.Event()

    def maybe_due(self, last_seq: int) -> None:
        """Called after each commit: wake the task once ``every_records`` were appended."""
        if last_seq - self.fed >= self.every_records:
            self._due.set()

    async def run(self) -> None:
        """Feed when due, for ever; cancelled with the daemon."""
        while True:
            with trio.move_on_after(self.every_seconds):
                await self._due.wait()
            self._due = trio.Event()
            target = self.last_seq()
            if target <= self.fed:
                continue
            reason = await self.feed()
            self._said(reason)
            if reason:
                await trio.sleep(self.backoff.next())
                continue
            self.backoff.reset()
            self.fed = target
            self.feeds += 1

    async def feed(self) -> str:
        """Run the feeder once; "" when it fed, else why not."""
        done = await trio.run_process(
            self.argv, stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, check=False
        )
        said = done.stdout.decode(errors="replace").strip()
        if done.returncode == 0:
            how, records, seconds = (said.split() + ["", "", ""])[:3]
            if how in ("built", "rebuilt"):
                log.info("usage index built", how=how, records=records, seconds=seconds)
            return ""
        if done.returncode == usage_feeder.FAILED and said:
            return said
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        return f"the usage index's feeder ended with status {done.returncode}" + (f": {lines[-1]}" if lines else "")

    def _said(self, reason: str) -> None:
        """Once when feeding starts to fail or fails for another reason, once when it recovers."""
        if reason and reason != self.failing:
            log.warning("cannot feed the usage index; audit usage catches up by itself", reason=reason)
        elif not reason and self.failing:
            log.info("usage index fed again")
        self.failing = reason
