"""The sink's writes (``eventsrc.fleet.sink.store``) against a real PostgreSQL: whatever the order
the records come in, however often, the rows are each record once and the node's own intervals."""

from __future__ import annotations

import random

import psycopg

from eventsrc import events as ev
from eventsrc.core.chargeback import intervals
from eventsrc.events import encode_payload
from eventsrc.fleet.sink import SCHEMA_VERSION, migrate, store
from tests.support.postgres import PostgresServer

POD = ev.PodRef(uid="u1", namespace="ml", name="train")
OTHER = ev.PodRef(uid="u2", namespace="web", name="api")


def node_log() -> list[tuple[int, int, ev._Event]]:
    """(seq, ts_ns, event): two pods hold CPUs and a device, one gives them back."""
    events: list[ev._Event] = [
        ev.PodAdmissionStarted(pod=POD),
        ev.CPUsAssigned(pod_uid="u1", container="main", cpus=[2, 3]),
        ev.DevicesReserved(pod_uid="u1", container="main", resource="gpu", device_ids=["g0"]),
        ev.DevicesAllocated(pod_uid="u1", container="main", resource="gpu", device_ids=["g0"]),
        ev.PodAdmitted(pod=POD),
        ev.PodAdmissionStarted(pod=OTHER),
        ev.CPUsAssigned(pod_uid="u2", container="main", cpus=[4]),
        ev.PodAdmitted(pod=OTHER),
        ev.DevicesReleased(pod_uid="u1", container="main", resource="gpu", device_ids=["g0"]),
        ev.CPUsReleased(pod_uid="u1", container="main", cpus=[2, 3]),
        ev.PodRemoved(pod_uid="u1"),
    ]
    return [(seq, 1_000_000_000 * seq + 7, e) for seq, e in enumerate(events, 1)]


def holds(dsn: str) -> list[tuple[str, str, str, int, int | None]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT resource, device, uid, start_ns, end_ns FROM holds ORDER BY 1, 2, 3, 4").fetchall()
    return [(r, d, u, s, e) for r, d, u, s, e in rows]


def test_records_in_any_order_and_twice_make_each_record_once_and_the_nodes_intervals(
    postgres_server: PostgresServer,
) -> None:
    log = node_log()
    values = {seq: encode_payload(e, ts, f"c{seq}") for seq, ts, e in log}
    shuffled = [*values.items(), *random.Random(7).sample(sorted(values.items()), 5)]  # some twice
    random.Random(11).shuffle(shuffled)
    with (
        psycopg.connect(postgres_server.dsn, autocommit=True) as first,
        psycopg.connect(postgres_server.dsn, autocommit=True) as second,
    ):
        assert migrate(first) == 0 and migrate(second) == SCHEMA_VERSION  # once
        for n, (seq, value) in enumerate(shuffled):
            store(first if n % 2 else second, "node-a", "log-1", seq, value)  # two sinks sharing the work
        stored = first.execute("SELECT seq, type FROM records ORDER BY seq").fetchall()
        applied = first.execute("SELECT applied_seq FROM node_logs").fetchall()
    assert stored == [(seq, type(e).__name__) for seq, _, e in log]
    assert applied == [(len(log),)]
    want = sorted(
        (c.hold.resource, c.hold.device, c.hold.uid, c.hold.start_ns, c.end_ns)
        for c in intervals((ts, e) for _, ts, e in log)
    )
    assert holds(postgres_server.dsn) == want
    assert any(end is None for *_, end in want) and any(end is not None for *_, end in want)
