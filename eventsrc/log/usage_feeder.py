"""The usage index fed in a process of its own, which the daemon starts as its log grows
(``eventsrc.node.usage_keeper``; docs/adr/0040), so that ``audit usage`` finds the index
current: the replay through the tracker holds the GIL for all of it, which a worker thread
would take from the daemon's loop, and the pages it maps would count in the daemon's memory.

``python -m eventsrc.log.usage_feeder LOG_DIR ARCHIVE|- USAGE_DIR`` opens the log read-only
(a fresh interpreter: an LMDB environment must not be used across a fork), brings the index
up to date (``UsageIndex.catch_up``: a chunk of records a write transaction, each through a
mapping of its own) and writes one line saying what it did: ``<how> <records> <seconds>``.
On failure, exit status 1 and the reason on stdout. It runs at a lower priority (nice 10):
nothing waits for it, and the daemon's loop shares the node's cores with it. The index is
derived data, under a lock of its own: a feeder left running by a killed daemon only
finishes its catch-up, and a query waits for it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lmdb

from eventsrc.errors import EventsrcError
from eventsrc.log.usage_index import UsageIndex, reading

#: the worker's exit status when the index cannot be fed (its reason on stdout)
FAILED = 1
NICENESS = 10


def argv(log_dir: Path, archive: Path | None, usage_dir: Path) -> list[str]:
    """The worker's command line."""
    return [sys.executable, "-m", __name__, str(log_dir), str(archive) if archive else "-", str(usage_dir)]


def main(args: list[str]) -> int:
    log_dir, archive, usage_dir = Path(args[0]), None if args[1] == "-" else Path(args[1]), Path(args[2])
    os.nice(NICENESS)
    try:
        with UsageIndex(usage_dir) as index:
            update = index.catch_up(lambda: reading(log_dir, archive))
    except (EventsrcError, lmdb.Error, OSError) as err:
        print(str(err).splitlines()[0] if str(err) else type(err).__name__)
        return FAILED
    print(f"{update.how} {update.records} {update.seconds:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
