"""A writing subprocess for tests: appends events and prints each acknowledged one.

    python tests/support/writer_proc.py LOG_DIR COUNT [WRITERS] [MAP_SIZE]

Every line ``ACK <seq> <pod_uid>`` is printed (and flushed) only after the append that
carried it has returned, i.e. after its durable commit. COUNT 0 means forever.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

from eventsrc import events as ev
from eventsrc.log.commit import GroupCommitter
from eventsrc.log.store import EventLog


async def main(path: Path, count: int, writers: int, map_size: int) -> None:
    log = EventLog(path, map_size=map_size)
    committer = GroupCommitter(log)
    out = sys.stdout
    token = os.getpid()
    sent = 0

    async def writer(w: int) -> None:
        nonlocal sent
        i = 0
        while count == 0 or sent < count:
            sent += 1
            uid = f"{token}-{w}-{i}"
            i += 1
            # Some appends carry several events (one correlation id, one unit).
            events = [ev.PodRemoved(pod_uid=uid, reason="x" * (i % 50))] * (1 + i % 3)
            recs = await committer.append(events)
            out.write("".join(f"ACK {r.seq} {uid}\n" for r in recs))
            out.flush()

    async with trio.open_nursery() as nursery:
        await nursery.start(committer.run)
        async with trio.open_nursery() as inner:
            for w in range(writers):
                inner.start_soon(writer, w)
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    args = sys.argv[1:]
    trio.run(
        main,
        Path(args[0]),
        int(args[1]),
        int(args[2]) if len(args) > 2 else 1,
        int(args[3]) if len(args) > 3 else 1 << 30,
    )
