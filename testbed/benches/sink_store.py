"""The sink's store of in-order fetches (``sink.store_many``), timed on a PostgreSQL of its own.

Each fetch is 256 chained records, 64 of each of 4 node logs, each following the one stored in
the fetch before: the common path, where every record is checked against its stored
predecessor (ADR 0034). Prints the median and p90 of a fetch's transaction and the records/s at
the median. Run: ``.venv/bin/python -m testbed.benches.sink_store
[FETCHES [WAITING]]`` (default 40, 0); WAITING: that many records waiting in ``pending`` for
node-0 far ahead of its log (what a forger can publish), before the first fetch. The same script
at an older commit gives the "before"."""

from __future__ import annotations

import sys
import time

import psycopg

from eventsrc import events as ev
from eventsrc.events import chain_hash, encode_payload
from eventsrc.fleet.rows import Shipped, store_many
from eventsrc.fleet.tables import migrate
from testbed.servers.postgres_server import PostgresServer

NODES, PER_NODE = 4, 64


def node_log(records: int) -> list[bytes]:
    """A log's records, each linked to the one before: pods admitted and removed in turn."""
    out, link = [], b""
    for seq in range(1, records + 1):
        event: ev.EventBase = (
            ev.PodAdmitted(pod=ev.PodRef(uid=f"u{seq}", namespace="ns", name=f"p{seq}"))
            if seq % 2
            else ev.PodRemoved(pod_uid=f"u{seq - 1}")
        )
        value = encode_payload(event, 10**9 * seq, f"c{seq}", link)
        out.append(value)
        link = chain_hash(value)
    return out


def main(fetches: int, waiting: int) -> None:
    logs = {f"node-{n}": node_log(fetches * PER_NODE) for n in range(NODES)}
    server = PostgresServer()
    server.start()
    try:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            migrate(conn)
            conn.execute(  # far ahead, each following one that never comes
                "INSERT INTO pending (node, log_id, seq, follows, hash, subject, headers, data) SELECT 'node-0', "
                "'log-1', 10000000 + 2 * i, 10000000 + 2 * i - 1, int8send(i), 's', '{}', int8send(i) "
                "FROM generate_series(1, %s) AS i",
                (waiting,),
            )
            conn.execute("ANALYZE pending")  # as autovacuum would, after so many rows
            times = []
            for f in range(fetches):
                seqs = range(f * PER_NODE + 1, (f + 1) * PER_NODE + 1)
                batch = [Shipped(node, "log-1", s, s - 1, values[s - 1]) for node, values in logs.items() for s in seqs]
                start = time.perf_counter()
                store_many(conn, batch)
                times.append(time.perf_counter() - start)
            count = conn.execute("SELECT count(*) FROM records").fetchone()
    finally:
        server.cleanup()
    times.sort()
    median, p90 = times[len(times) // 2], times[int(len(times) * 0.9)]
    print(
        f"records={count[0] if count else 0} fetch median={median * 1000:.1f} ms p90={p90 * 1000:.1f} ms "
        f"records/s={NODES * PER_NODE / median:.0f}"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40, int(sys.argv[2]) if len(sys.argv) > 2 else 0)
