"""The sink's writes (``eventsrc.fleet.rows.store``) against a real PostgreSQL: whatever the order
the records come in, however often, the rows are each record once and the node's own intervals."""

from __future__ import annotations

import random
import threading
from typing import Any

import psycopg
import pytest
import trio

from eventsrc import events as ev
from eventsrc.core.chargeback import intervals
from eventsrc.events import chain_hash, encode_payload
from eventsrc.fleet import rows as fleet_rows
from eventsrc.fleet.rows import Shipped, States, message_of, store, store_many
from eventsrc.fleet.sink import SinkMetrics, _Consumer
from eventsrc.fleet.tables import SCHEMA_VERSION, migrate
from tests.support.eventually import eventually_trio
from tests.support.postgres import PostgresServer
from tests.support.rollup import kept_and_made

POD = ev.PodRef(uid="u1", namespace="ml", name="train")
OTHER = ev.PodRef(uid="u2", namespace="web", name="api")
THIRD = ev.PodRef(uid="u3", namespace="batch", name="job")


def node_log() -> list[tuple[int, int, ev.EventBase]]:
    """(seq, ts_ns, event): two pods hold CPUs and a device, one gives them back."""
    events: list[ev.EventBase] = [
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
        # an init container and its app container on one CPU, from one instant: two holds alike
        ev.PodAdmissionStarted(pod=THIRD),
        ev.CPUsAssigned(pod_uid="u3", container="init", cpus=[5]),
        ev.CPUsAssigned(pod_uid="u3", container="main", cpus=[5]),
        ev.PodAdmitted(pod=THIRD),
        ev.CPUsReleased(pod_uid="u3", container="init", cpus=[5]),
    ]
    same_instant = {13, 14}
    return [(seq, 1_000_000_000 * (12 if seq in same_instant else seq) + 7, e) for seq, e in enumerate(events, 1)]


def open_first(row: tuple[str, str, str, int, int | None]) -> tuple[str, str, str, int, int]:
    return (*row[:4], -1 if row[4] is None else row[4])


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
            store(first if n % 2 else second, "node-a", "log-1", seq, seq - 1, value)  # two sinks sharing the work
        stored = first.execute("SELECT seq, type FROM records ORDER BY seq").fetchall()
        applied = first.execute("SELECT applied_seq FROM node_logs").fetchall()
    assert stored == [(seq, type(e).__name__) for seq, _, e in log]
    assert applied == [(len(log),)]
    want = sorted(
        (
            (c.hold.resource, c.hold.device, c.hold.uid, c.hold.start_ns, c.end_ns)
            for c in intervals((ts, e) for _, ts, e in log)
        ),
        key=open_first,
    )
    assert sorted(holds(postgres_server.dsn), key=open_first) == want
    assert any(end is None for *_, end in want) and any(end is not None for *_, end in want)
    kept, made = kept_and_made(postgres_server.dsn)
    assert kept == made and made  # the rollup the two connections kept is the holds'

    assert len([h for h in want if h[:3] == ("cpu", "5", "u3")]) == 2  # two holds alike, one ended: both kept


def test_records_cut_before_they_were_shipped_do_not_stop_the_rest(postgres_server: PostgresServer) -> None:
    """The shipper names the record each one follows: after records a retention cut took before
    they were shipped, the next follows the last one shipped, and the sink goes on from there."""
    log = node_log()
    values = {seq: encode_payload(e, ts, f"c{seq}") for seq, ts, e in log}
    with psycopg.connect(postgres_server.dsn, autocommit=True) as conn:
        migrate(conn)
        for seq in reversed(range(4, len(log) + 1)):  # 1..3 cut before shipping; the rest arrive backwards
            store(conn, "node-b", "log-2", seq, 0 if seq == 4 else seq - 1, values[seq])
        applied = conn.execute("SELECT applied_seq FROM node_logs WHERE node = 'node-b'").fetchone()
    assert applied == (len(log),)


def test_sinks_starting_together_make_the_schema_once(postgres_server: PostgresServer) -> None:
    failures: list[BaseException] = []

    def start() -> None:
        try:
            with psycopg.connect(postgres_server.dsn, autocommit=True) as conn:
                migrate(conn)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failures.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    with psycopg.connect(postgres_server.dsn) as conn:
        assert conn.execute("SELECT version FROM eventsrc_schema").fetchall() == [(SCHEMA_VERSION,)]


@pytest.mark.parametrize("snapshot_every", [1, 4, 256])
def test_two_sinks_storing_batches_at_once_make_the_same_rows(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch, snapshot_every: int
) -> None:
    """Each sink stores a fetch in one transaction (``store_many``); two at once, with the same
    messages of two nodes in other orders and batches, never deadlock and make the rows one
    sink makes record by record. Each keeps the trackers of the logs it applied (``States``):
    where the other applied since, it reads the state written every ``SNAPSHOT_EVERY`` records
    and replays what follows it."""
    monkeypatch.setattr(fleet_rows, "SNAPSHOT_EVERY", snapshot_every)
    log = node_log()
    messages = [
        Shipped(node, "log-1", seq, seq - 1, encode_payload(e, ts, f"c{seq}"))
        for node in ("n1", "n2")
        for seq, ts, e in log
    ]
    failures: list[BaseException] = []

    def sink(seed: int) -> None:
        order = random.Random(seed).sample(messages, len(messages))
        states = States()
        try:
            with psycopg.connect(postgres_server.dsn, autocommit=True) as conn:
                for start in range(0, len(order), 7):
                    store_many(conn, order[start : start + 7], states=states)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failures.append(exc)

    with psycopg.connect(postgres_server.dsn, autocommit=True) as conn:
        migrate(conn)
        conn.execute("TRUNCATE records, holds, node_logs, audit_index, pending, quarantine")
    threads = [threading.Thread(target=sink, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    want = sorted(
        (
            (c.hold.resource, c.hold.device, c.hold.uid, c.hold.start_ns, c.end_ns, c.hold.namespace, c.hold.name)
            for c in intervals((ts, e) for _, ts, e in log)
        ),
        key=repr,
    )
    with psycopg.connect(postgres_server.dsn) as conn:
        for node in ("n1", "n2"):
            rows = conn.execute(
                "SELECT resource, device, uid, start_ns, end_ns, namespace, name FROM holds WHERE node = %s", (node,)
            ).fetchall()
            assert sorted(rows, key=repr) == want, node
            assert conn.execute("SELECT count(*) FROM records WHERE node = %s", (node,)).fetchone() == (len(log),)
    kept, made = kept_and_made(postgres_server.dsn)
    assert kept == made and made


@pytest.mark.parametrize("snapshot_every", [1, 4, 256])
def test_a_sink_takes_up_a_log_from_its_written_state_and_what_the_other_applied_after_it(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch, snapshot_every: int
) -> None:
    """Two sinks in turn, a fetch each, on the same logs: each keeps the trackers of the logs it
    applied (``States``), and where the other applied since, it reads the state written at most
    ``SNAPSHOT_EVERY`` records back and replays the rest; the rows are the logs' own."""
    monkeypatch.setattr(fleet_rows, "SNAPSHOT_EVERY", snapshot_every)
    replays: list[int] = []
    replay = fleet_rows._replay

    def counted(*args: Any) -> None:
        replays.append(1)
        replay(*args)

    monkeypatch.setattr(fleet_rows, "_replay", counted)
    log = node_log()
    messages = [
        Shipped(node, "log-1", seq, seq - 1, encode_payload(e, ts, f"c{seq}"))
        for seq, ts, e in log
        for node in ("t1", "t2")
    ]
    sinks = [States(), States()]
    with psycopg.connect(postgres_server.dsn, autocommit=True) as conn:
        migrate(conn)
        for n, start in enumerate(range(0, len(messages), 5)):
            store_many(conn, messages[start : start + 5], states=sinks[n % 2])
        rows = conn.execute(
            "SELECT node, resource, device, uid, start_ns, end_ns, namespace, name FROM holds WHERE node LIKE 't_'"
        ).fetchall()
    want = [
        (node, c.hold.resource, c.hold.device, c.hold.uid, c.hold.start_ns, c.end_ns, c.hold.namespace, c.hold.name)
        for node in ("t1", "t2")
        for c in intervals((ts, e) for _, ts, e in log)
    ]
    assert sorted(rows, key=repr) == sorted(want, key=repr)
    assert (len(replays) > 0) == (snapshot_every > 1)
    kept, made = kept_and_made(postgres_server.dsn)
    assert kept == made and made


def test_a_damaged_record_is_vouched_for_only_in_its_place(postgres_server: PostgresServer) -> None:
    """A payload that is no record, and a record linking to it, both ahead of a gap: they wait
    (the damaged one's own link cannot be read, so nothing ties it to the node's chain) until the
    node's record before them is stored; then the chain vouches for the damaged one in its place."""
    values: list[bytes] = []
    for seq in range(1, 6):
        link = chain_hash(values[-1]) if values else b""
        values.append(encode_payload(ev.PodRemoved(pod_uid=f"u{seq}"), seq, f"c{seq}", link))
    damaged = b"\0\0\0\0" + values[3][4:]  # the node's record 4, its checksum broken
    values[4] = encode_payload(ev.PodRemoved(pod_uid="u5"), 5, "c5", chain_hash(damaged))
    shipped = {seq: Shipped("node-a", "log-1", seq, seq - 1, v) for seq, v in enumerate(values, 1)}
    with psycopg.connect(postgres_server.dsn, autocommit=True) as conn:
        migrate(conn)
        store_many(conn, [shipped[1], shipped[2]])
        store_many(conn, [shipped[4]._replace(data=damaged), shipped[5]])  # record 3 not yet shipped
        assert [r[0] for r in conn.execute("SELECT seq FROM records ORDER BY seq")] == [1, 2]
        store_many(conn, [shipped[3]])
        rows = conn.execute("SELECT seq, type FROM records ORDER BY seq").fetchall()
        assert rows == [(1, "PodRemoved"), (2, "PodRemoved"), (3, "PodRemoved"), (4, ""), (5, "PodRemoved")]
        assert conn.execute("SELECT count(*) FROM quarantine").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pending").fetchone() == (0,)
        assert conn.execute("SELECT applied_seq FROM node_logs").fetchone() == (5,)


async def test_a_database_that_refuses_a_message_and_then_its_quarantine_is_retried(
    postgres_server: PostgresServer,
) -> None:
    """A message the database refuses for its data (here a trigger's data exception) is
    quarantined alone; when the database refuses that too (INSERT revoked on the quarantine), the
    sink says so and tries again, and keeps the message once the privilege is back."""
    dsn = postgres_server.dsn
    with psycopg.connect(dsn, autocommit=True) as admin:
        migrate(admin)
        admin.execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = '22000'; END $$"
        )
        admin.execute("CREATE TRIGGER refuse BEFORE INSERT ON records FOR EACH ROW EXECUTE FUNCTION refuse()")
        admin.execute("CREATE ROLE quarantiner LOGIN")
        admin.execute("GRANT ALL ON ALL TABLES IN SCHEMA public TO quarantiner")
        admin.execute("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO quarantiner")
        admin.execute("REVOKE INSERT ON quarantine FROM quarantiner")
        role_dsn = dsn.replace("user=eventsrc", "user=quarantiner")
        metrics = SinkMetrics()
        consumer = _Consumer(
            [],
            role_dsn,
            "S",
            "eventsrc.records",
            1,
            psycopg.connect(role_dsn, autocommit=True),
            trio.TASK_STATUS_IGNORED,
            metrics,
        )
        value = encode_payload(ev.PodRemoved(pod_uid="u1"), 1, "c1")
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(consumer._store, [message_of(Shipped("node-a", "log-1", 1, 0, value))], ())
                await eventually_trio(
                    lambda: metrics.registry.get_sample_value("eventsrc_fleet_sink_database_failing") == 1,
                    "the quarantine's refusal said",
                )
                admin.execute("GRANT INSERT ON quarantine TO quarantiner")
        finally:
            consumer.close()
        kinds = admin.execute("SELECT kind, reason FROM quarantine").fetchall()
        assert [k for k, _ in kinds] == ["database"] and "refused" in kinds[0][1], kinds
        assert metrics.registry.get_sample_value("eventsrc_fleet_sink_database_failing") == 0


async def test_a_record_too_large_for_an_index_is_quarantined_not_retried_for_ever(
    postgres_server: PostgresServer,
) -> None:
    """A device id of kilobytes makes a ``holds`` index row larger than PostgreSQL's limit
    (54000, program limit exceeded): that is the message's, not the database's. It is
    quarantined (``database``) and the sink goes on; it used to be retried for ever."""
    dsn = postgres_server.dsn
    pod = ev.PodRef(uid="u1", namespace="n", name="p")
    big = "".join(f"{(i * 2654435761) % 2**32:08x}" for i in range(1200))  # 9,600 bytes, no compression
    events: list[ev.EventBase] = [
        ev.PodAdmissionStarted(pod=pod),
        ev.DevicesAllocated(pod_uid="u1", container="main", resource="gpu", device_ids=[big]),
        ev.PodAdmitted(pod=pod),
    ]
    values = [encode_payload(e, seq, f"c{seq}") for seq, e in enumerate(events, 1)]
    with psycopg.connect(dsn, autocommit=True) as admin:
        migrate(admin)
        metrics = SinkMetrics()
        consumer = _Consumer(
            [],
            dsn,
            "S",
            "eventsrc.records",
            1,
            psycopg.connect(dsn, autocommit=True),
            trio.TASK_STATUS_IGNORED,
            metrics,
        )
        batch = [message_of(Shipped("node-a", "log-1", seq, seq - 1, v)) for seq, v in enumerate(values, 1)]
        try:
            with trio.fail_after(30):  # a bound on a hang, not a measure
                await consumer._store(batch, ())
        finally:
            consumer.close()
        rows = admin.execute("SELECT kind, seq, reason FROM quarantine").fetchall()
        assert [(k, s) for k, s, _ in rows] == [("database", "2")] and "54000" in rows[0][2], rows
        assert admin.execute("SELECT seq FROM records").fetchall() == [(1,)]
        assert admin.execute("SELECT seq FROM pending").fetchall() == [(3,)]  # behind the record it lacks
