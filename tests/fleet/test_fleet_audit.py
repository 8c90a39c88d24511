"""``eventsrc fleet audit`` against a real PostgreSQL: for every device, pod and claim of three
node logs, each node's answer from the fleet equals the node's own ``audit`` answer on the same
log, exactly; the fleet's answer is their union, one per node, and ``--node`` keeps one. The
sink's version 2 rows (the audit index, claim preparations) are the same whatever the delivery
order and however often, a version 1 database migrates and goes on, and U+0000 is stored.

Logs are written with EventLog.append, as the daemon writes them; the sink's rows are made by
``store`` from the log's own bytes, as a shipped message carries them.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
from psycopg.types.json import Jsonb

from eventsrc import events as ev
from eventsrc.core.chargeback import Row, Tracker, Window, intervals, merged, observe, totals
from eventsrc.core.claim_preparations import preparations
from eventsrc.events import decode_record
from eventsrc.fleet.fleet_audit import answers
from eventsrc.fleet.nul_escape import escape_json, from_pg_text, pg_text
from eventsrc.fleet.queries import usage_totals
from eventsrc.fleet.rows import store
from eventsrc.fleet.tables import MIGRATIONS, migrate
from eventsrc.layout import Layout
from eventsrc.log.store import EventLog
from eventsrc.offline import audit_queries
from eventsrc.offline.audit_render import device_lines, to_json
from eventsrc.offline.render import record_json, text_lines
from tests.conftest import run_cli
from tests.node.test_audit_kubelet import STEPS as KUBELET_STEPS
from tests.node.test_audit_kubelet import ts as kubelet_ts
from tests.node.test_audit_runtime import RES, lifecycle
from tests.node.test_audit_runtime import ts as runtime_ts
from tests.support.postgres import PostgresServer

DRIVER = "gpu.example.com"
NUL_DEVICE = "dev\0x"  # a plugin's device id may hold U+0000 (and a backslash)
SLASH_DEVICE = "dev\\0y"
C1 = ev.ClaimRef(uid="claim-1", namespace="default", name="shared")
C2 = ev.ClaimRef(uid="claim-2", namespace="default", name="solo")
PREPARED = [ev.PreparedDevice(request_names=["gpu"], pool_name="p", device_name="gpu-0", cdi_device_ids=["g=0"])]


def ref(name: str) -> ev.PodRef:
    return ev.PodRef(uid=f"uid-{name}", namespace="default", name=name)


def own_steps() -> list[tuple[int, list[ev.EventBase]]]:
    """Node a's own story after the runtime's: a health change, a claim prepared for one pod and
    shared by a second, then unprepared; a claim still prepared; devices whose ids hold U+0000
    and a backslash."""
    d = "uid-d"
    return [
        (11, [ev.DeviceHealthChanged(resource=RES, device_id="dev-1", health="Unhealthy")]),
        (
            12,
            [
                ev.PodAdmissionStarted(pod=ref("b")),
                ev.PodReferenceAdded(claim_uid=C1.uid, pod_uid="uid-b"),
                ev.ClaimPrepareStarted(claim=C1, driver=DRIVER, pod_uid="uid-b"),
            ],
        ),
        (13, [ev.ClaimPrepared(claim=C1, driver=DRIVER, devices=PREPARED), ev.PodAdmitted(pod=ref("b"))]),
        (14, [ev.PodAdmissionStarted(pod=ref("c")), ev.PodReferenceAdded(claim_uid=C1.uid, pod_uid="uid-c")]),
        (15, [ev.PodAdmitted(pod=ref("c"))]),
        (16, [ev.PodReferenceRemoved(claim_uid=C1.uid, pod_uid="uid-b"), ev.PodRemoved(pod_uid="uid-b")]),
        (17, [ev.PodReferenceRemoved(claim_uid=C1.uid, pod_uid="uid-c"), ev.PodRemoved(pod_uid="uid-c")]),
        (18, [ev.ClaimUnprepareStarted(claim=C1, driver=DRIVER)]),
        (19, [ev.ClaimUnprepared(claim=C1, driver=DRIVER)]),
        (
            20,
            [
                ev.DevicesAdded(
                    resource=RES,
                    devices=[
                        ev.DeviceInfo(id=NUL_DEVICE, health="Healthy"),
                        ev.DeviceInfo(id=SLASH_DEVICE, health="Healthy"),
                    ],
                ),
                ev.PodAdmissionStarted(pod=ref("d")),
                ev.DevicesReserved(pod_uid=d, container="main", resource=RES, device_ids=[NUL_DEVICE, SLASH_DEVICE]),
                ev.DevicesAllocated(pod_uid=d, container="main", resource=RES, device_ids=[NUL_DEVICE, SLASH_DEVICE]),
                ev.PodReferenceAdded(claim_uid=C2.uid, pod_uid=d),
                ev.ClaimPrepareStarted(claim=C2, driver=DRIVER, pod_uid=d),
                ev.ClaimPrepared(claim=C2, driver=DRIVER),
                ev.PodAdmitted(pod=ref("d")),
            ],
        ),
    ]


def write(root: Path, batches: list[tuple[int, list[ev.EventBase]]]) -> None:
    with EventLog(Layout(root).log) as log:
        for n, (ts_ns, events) in enumerate(batches):
            log.append(events, f"cid-{n}", ts_ns)


def node_a() -> list[tuple[int, list[ev.EventBase]]]:
    return [(runtime_ts(s), events) for _, s, events in lifecycle()] + [(runtime_ts(s), e) for s, e in own_steps()]


def node_b() -> list[tuple[int, list[ev.EventBase]]]:
    return [(kubelet_ts(n), events) for n, events in enumerate(KUBELET_STEPS)]


def node_c() -> list[tuple[int, list[ev.EventBase]]]:
    return [(runtime_ts(s + 100), events) for _, s, events in lifecycle()]  # dev-0 again, on another node


NODES = {"node-a": node_a, "node-b": node_b, "node-c": node_c}


def raw(root: Path) -> list[tuple[int, bytes]]:
    """The log's records as the shipper sends them: (seq, the bytes the log holds)."""
    with EventLog(Layout(root).log, readonly=True) as log:
        return [(int.from_bytes(k, "big"), bytes(v)) for chunk in log.raw_chunks(1) for k, v in chunk]


def node_index(root: Path) -> set[tuple[bytes, int]]:
    """The node's own index: (prefix, seq) for each key its log wrote."""
    with EventLog(Layout(root).log, readonly=True) as log, log.env.begin(db=log.index_db) as txn:
        return {(bytes(k[:-8]), int.from_bytes(k[-8:], "big")) for k in txn.cursor().iternext(values=False)}


@pytest.fixture(scope="module")
def server(postgres_unavailable: str | None) -> Iterator[PostgresServer]:
    """One PostgreSQL for the module (each test has a database of its own): a server's start
    costs seconds, a database's a fraction of one."""
    if postgres_unavailable is not None:
        pytest.skip(postgres_unavailable)
    started = PostgresServer()
    try:
        started.start()
        yield started
    finally:
        started.cleanup()


@pytest.fixture
def dsn(server: PostgresServer, request: pytest.FixtureRequest) -> str:
    name = "t_" + request.node.name.removeprefix("test_")[:40]
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server.dsn.replace("dbname=postgres", f"dbname={name}")


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for node, batches in NODES.items():
        out[node] = tmp_path_factory.mktemp(node)
        write(out[node], batches())
    return out


def ship(dsn: str, roots: dict[str, Path], seed: int) -> None:
    """Every record of every node, shuffled, some twice, through two sinks' connections."""
    messages = [(node, seq, value) for node, root in roots.items() for seq, value in raw(root)]
    messages += random.Random(seed).sample(messages, 12)
    random.Random(seed + 1).shuffle(messages)
    with psycopg.connect(dsn, autocommit=True) as one, psycopg.connect(dsn, autocommit=True) as two:
        migrate(one)
        for n, (node, seq, value) in enumerate(messages):
            store(one if n % 2 else two, node, f"log-{node}", seq, seq - 1, value)


def ask(dsn: str, what: str, node: str = "", **fields: Any) -> dict[str, bytes]:
    args = argparse.Namespace(node=node, since=None, until=None, **fields)
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {a.node: to_json(a.answer) for a in answers(conn, what, args)}


def subjects(index: set[tuple[bytes, int]]) -> list[tuple[str, dict[str, str]]]:
    """Every device, pod (by uid and by name) and claim the node's index names."""
    out = []
    for prefix in sorted({p for p, _ in index}):
        kind, rest = prefix.decode()[0], prefix.decode()[2:-1]  # "<kind>\0<what>\0"
        if kind == "d":  # a resource name holds no U+0000; a device id may
            resource, device_id = rest.split("\0", 1)
            out.append(("device", {"resource": resource, "device_id": device_id}))
        elif kind in ("p", "n"):
            out.append(("pod", {"pod": rest}))
        elif kind == "c":
            out.append(("claim", {"claim": rest}))
    return out


def nodes_answer(root: Path, what: str, f: dict[str, str]) -> bytes:
    with EventLog(Layout(root).log, readonly=True) as log:
        if what == "device":
            return to_json(audit_queries.device_timeline(log, f["resource"], f["device_id"]))
        if what == "pod":
            return to_json(audit_queries.pod_history(log, f["pod"]))
        return to_json(audit_queries.claim_history(log, f["claim"]))


def fleet_rows(dsn: str, node: str) -> tuple[set[tuple[bytes, int]], list[tuple[Any, ...]]]:
    with psycopg.connect(dsn) as conn:
        index = {
            (bytes(k), int(s))
            for k, s in conn.execute("SELECT key, seq FROM audit_index WHERE node = %s", (node,)).fetchall()
        }
        preps = conn.execute(
            "SELECT claim_uid, namespace, name, driver, pods, start_seq, start_ns, end_seq, end_ns "
            "FROM claim_preparations WHERE node = %s ORDER BY start_seq, claim_uid",
            (node,),
        ).fetchall()
    return index, preps


def expected_preparations(root: Path) -> list[tuple[Any, ...]]:
    """The preparations the node's own tracker makes of its records (the fleet's must be these)."""
    with EventLog(Layout(root).log, readonly=True) as log:
        recs = [(r.seq, r.ts_ns, r.event) for r in log.records() if isinstance(r, ev.Record)]
    return sorted(
        (p.claim_uid, p.namespace, p.name, p.driver, list(p.pods), p.start_seq, p.start_ns, end_seq, end_ns)
        for p, end_seq, end_ns in preparations(recs)
    )


def test_each_nodes_answer_from_the_fleet_is_its_own(dsn: str, roots: dict[str, Path]) -> None:
    ship(dsn, roots, seed=3)
    asked = 0
    for node, root in roots.items():
        index = node_index(root)
        rows, preps = fleet_rows(dsn, node)
        assert rows == index, node  # the node's own index, each key once, whatever the order
        assert sorted(tuple(r) for r in preps) == expected_preparations(root), node
        for what, f in subjects(index):
            fleet = ask(dsn, what, **f)
            assert json.loads(fleet[node]) == json.loads(nodes_answer(root, what, f)), (node, what, f)
            assert ask(dsn, what, node=node, **f).keys() == {node}
            asked += 1
    assert asked >= 20  # devices, pods by uid and by name, claims, on three nodes
    # the union: dev-0 is a device of every node (a device id is a node's own)
    assert set(ask(dsn, "device", resource=RES, device_id="dev-0")) == set(NODES)
    # the claim shared by b and c, prepared once for both, then unprepared; the other still prepared
    with EventLog(Layout(roots["node-a"]).log, readonly=True) as log:
        seq = {type(r.event).__name__ + getattr(getattr(r.event, "claim", None), "uid", ""): r for r in log.records()}
    c1, c2 = seq["ClaimPreparedclaim-1"], seq["ClaimPreparedclaim-2"]
    _, preps = fleet_rows(dsn, "node-a")
    assert [tuple(p) for p in preps] == [
        ("claim-1", "default", "shared", DRIVER, ["uid-b", "uid-c"], c1.seq, c1.ts_ns,
         seq["ClaimUnpreparedclaim-1"].seq, seq["ClaimUnpreparedclaim-1"].ts_ns),
        ("claim-2", "default", "solo", DRIVER, ["uid-d"], c2.seq, c2.ts_ns, None, None),
    ]  # fmt: skip


class Counted:
    """A connection that counts the statements it is given (``answers`` reads through it)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn, self.statements = conn, 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self.statements += 1
        return self.conn.execute(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def test_the_fleets_answer_takes_the_same_queries_for_every_node_as_for_one(dsn: str, roots: dict[str, Path]) -> None:
    """Issue 39 item 1: the nodes' audits read what they need in one pass over every node log
    (``fleet_audit.prefetch``), not a round of queries per node: a device every node has, and
    a device of one node, take at most the statements ``prefetch`` makes: the logs, the key's
    index and records, twice the named pods' index and records, what each log lacks."""
    ship(dsn, roots, seed=7)

    def statements(node: str, what: str, **f: Any) -> tuple[int, int]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            counted = Counted(conn)
            found = answers(counted, what, argparse.Namespace(node=node, since=None, until=None, **f))  # type: ignore[arg-type]
            return len(found), counted.statements

    every = statements("", "device", resource=RES, device_id="dev-0")
    one = statements("node-a", "device", resource=RES, device_id="dev-0")
    assert every[0] == len(NODES) and one[0] == 1
    assert every[1] <= 8 and one[1] <= 8, (every, one)
    assert statements("", "pod", pod="uid-a")[1] <= 8


class Captured(Counted):
    """A connection that keeps each statement it is given, with its parameters."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        super().__init__(conn)
        self.seen: list[tuple[Any, Any]] = []

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self.seen.append((args[0], args[1] if len(args) > 1 else kwargs.get("params")))
        return super().execute(*args, **kwargs)


#: the tables that grow with the fleet's history: every read of them must be able to use an index
LARGE = ("holds", "records", "audit_index")


def _unindexed(plan: dict[str, Any], leading: dict[str, str], partial: frozenset[str] = frozenset()) -> list[str]:
    """The scans of a large table in an EXPLAIN (FORMAT JSON) plan tree that no index narrows:
    sequential, or an index read whole, without a condition on its leading column (what the
    planner picks when no index fits and sequential scans are priced out; ``leading``: index
    name -> its leading column, "" for an expression), unless the index is partial (``partial``:
    its predicate narrows it, as the open holds' index holds only the open ones). A bitmap heap
    scan's conditions are its index scans'."""
    out = []
    index = plan.get("Index Name", "")
    if plan.get("Relation Name") in LARGE or index in leading:
        kind, cond = plan["Node Type"], plan.get("Index Cond", "")
        first = leading.get(index, "")
        narrowed = (bool(cond) and (not first or first in cond)) or index in partial
        if kind == "Seq Scan" or (kind != "Bitmap Heap Scan" and not narrowed):
            out.append(f"{kind} on {plan.get('Relation Name') or index}")
    for child in plan.get("Plans", []):
        out += _unindexed(child, leading, partial)
    return out


def test_every_fleet_query_can_use_an_index_on_the_large_tables(dsn: str, roots: dict[str, Path]) -> None:
    """Issue 39 item 3: the plans of `fleet audit device|pod` and `fleet usage` (each --by, a
    resource, a window): with sequential scans priced out (``enable_seqscan = off``), every scan
    of `holds`, `records` or `audit_index` is narrowed by an index condition, so each has an
    index it can use (on a small load the planner would rightly scan; at a fleet's size it must
    not have to)."""
    from eventsrc.core.chargeback import Window
    from eventsrc.fleet.queries import usage_totals

    ship(dsn, roots, seed=11)
    with psycopg.connect(dsn, autocommit=True) as conn:
        captured = Captured(conn)
        for what, f in [("device", {"resource": RES, "device_id": "dev-0"}), ("pod", {"pod": "uid-a"})]:
            answers(captured, what, argparse.Namespace(node="", since=None, until=None, **f))  # type: ignore[arg-type]
        conn.set_read_only(False)
        w = Window(0, 2**62)
        for by in ("namespace", "pod", "device", "resource", "node"):
            usage_totals(captured, by, w, frozenset())  # type: ignore[arg-type]
        usage_totals(captured, "namespace", w, frozenset({RES}))  # type: ignore[arg-type]
        for part in (Window(10**9 + 7, 2**62 - 3), Window(10**9 + 7, 10**9 + 11)):  # parts of an hour at each end
            usage_totals(captured, "resource", part, frozenset())  # type: ignore[arg-type]
        conn.execute("SET enable_seqscan = off")
        leading = {
            str(name): str(column or "")
            for name, column in conn.execute(
                "SELECT i.indexrelid::regclass::text, a.attname FROM pg_index i "
                "LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] "
                "WHERE i.indrelid::regclass::text = ANY(%s)",
                (list(LARGE),),
            ).fetchall()
        }
        partial = frozenset(
            str(name)
            for (name,) in conn.execute(
                "SELECT indexrelid::regclass::text FROM pg_index WHERE indpred IS NOT NULL "
                "AND indrelid::regclass::text = ANY(%s)",
                (list(LARGE),),
            ).fetchall()
        )
        sequential = []
        for query, params in captured.seen:
            text = query.as_string(conn) if isinstance(query, psycopg.sql.Composable) else query
            if not text.lstrip().upper().startswith(("SELECT", "WITH")):
                continue
            ((plan,),) = conn.execute(f"EXPLAIN (FORMAT JSON) {text}", params).fetchone()  # type: ignore[misc]
            sequential += [(scan, text[:100]) for scan in _unindexed(plan["Plan"], leading, partial)]
    assert len(captured.seen) >= 10
    assert sequential == []


def test_fleet_audit_prints_each_nodes_answer_with_its_node(dsn: str, roots: dict[str, Path]) -> None:
    """The command: JSON, the nodes' answers as the node prints each (``audit_render``: its JSON
    and its lines) with its node first; ``--node``; nothing found is one line."""
    ship(dsn, roots, seed=5)
    pg = ("--postgres", dsn)
    union = json.loads(run_cli("fleet", "audit", "device", RES, "dev-0", "-o", "json", *pg, check=True).stdout)
    assert [(a.pop("node"), a.pop("log_id")) for a in union] == [(n, f"log-{n}") for n in sorted(NODES)]
    f = {"resource": RES, "device_id": "dev-0"}
    assert union == [json.loads(nodes_answer(roots[n], "device", f)) for n in sorted(NODES)]
    table = run_cli("fleet", "audit", "device", RES, "dev-0", "--node", "node-c", *pg, check=True).stdout
    with EventLog(Layout(roots["node-c"]).log, readonly=True) as log:
        node_table = text_lines(device_lines(audit_queries.device_timeline(log, RES, "dev-0"))) + "\n"
    assert table == "node node-c (log log-node-c)\n" + node_table
    proc = run_cli("fleet", "audit", "pod", "uid-a", "--node", "node-b", *pg)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["eventsrc: error: no pod with uid uid-a on node node-b"]
    with pytest.raises(audit_queries.NotInLogError, match="^no device dev-9 of example.com/dev on any node$"):
        ask(dsn, "device", resource=RES, device_id="dev-9")


def test_nul_and_backslash_are_stored_and_answered_exactly(dsn: str, roots: dict[str, Path]) -> None:
    for text in ("", "a", "\0", "\\", "\\0", "a\\\0b\\\\0", "\0\0\\"):
        assert from_pg_text(pg_text(text)) == text and "\0" not in pg_text(text)
    ship(dsn, roots, seed=9)
    every: dict[str, list[ev.Record]] = {}
    for node, root in roots.items():
        with EventLog(Layout(root).log, readonly=True) as log:
            every[node] = [r for r in log.records() if isinstance(r, ev.Record)]
    recs = every["node-a"]
    added = next(r for r in recs if isinstance(r.event, ev.DevicesAdded) and r.event.devices[0].id == NUL_DEVICE)
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT record, record_escaped, data FROM records WHERE node = 'node-a' AND seq = %s", (added.seq,)
        ).fetchone()
        plain = conn.execute("SELECT count(*) FROM records WHERE record_escaped").fetchone()
        until = max(r.ts_ns for rs in every.values() for r in rs) + 1
        fleet = usage_totals(conn, "device", Window(0, until), frozenset({RES}))
    assert row is not None and row[1] is True and plain == (3,)  # listed, reserved, allocated
    assert row[0] == escape_json(record_json(added)) and decode_record(added.seq, bytes(row[2])) == added
    assert row[0]["event"]["devices"][0]["id"] == "dev\\0x"  # the documented escape
    w = Window(0, until)
    node_usage = []  # the nodes' union: each node's rows by device (with its gaps), naming the node
    for name, rs in every.items():
        holds, blind = observe((r.ts_ns, r.event) for r in rs)
        node_usage += [
            Row((name, *row.group), row.ns, row.gap_ns)
            for row in totals(holds, "device", w, frozenset({RES}), merged(blind.listed(), w))
        ]
    node_usage.sort()
    assert any(r.gap_ns for r in node_usage)  # node b's gaps
    assert fleet == node_usage and {NUL_DEVICE, SLASH_DEVICE} <= {r.group[2] for r in fleet}
    for device in (NUL_DEVICE, SLASH_DEVICE):
        f = {"resource": RES, "device_id": device}
        assert ask(dsn, "device", **f)["node-a"] == nodes_answer(roots["node-a"], "device", f)


def v1_database(dsn: str, node: str, log_id: str, records: list[tuple[int, bytes]]) -> None:
    """A database as the version 1 sink left it, having applied ``records``: its tables, the
    records, the applied sequence with the Tracker's state, and the holds, unescaped."""
    tracker = Tracker()
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE eventsrc_schema (version integer NOT NULL)")
        conn.execute("INSERT INTO eventsrc_schema VALUES (1)")
        assert isinstance(MIGRATIONS[0], str)
        conn.execute(MIGRATIONS[0])
        for seq, data in records:
            r = decode_record(seq, data)
            conn.execute(
                "INSERT INTO records VALUES (%s, %s, %s, %s, %s, %s, to_timestamp(%s::numeric / 1e6), %s, %s)",
                (node, log_id, seq, seq - 1, r.type, r.ts_ns, r.ts_ns // 1000, Jsonb(record_json(r)), data),
            )
            for hold, end in tracker.feed(r.ts_ns, r.event):
                if end is None:
                    conn.execute(
                        "INSERT INTO holds (node, log_id, resource, device, namespace, name, uid, start_ns) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                        (node, log_id, hold.resource, hold.device, hold.namespace, hold.name, hold.uid, hold.start_ns),
                    )
                else:
                    conn.execute(
                        "UPDATE holds SET end_ns = %s WHERE resource = %s AND device = %s AND end_ns IS NULL",
                        (end, hold.resource, hold.device),
                    )
        from eventsrc.fleet.rows import _state

        conn.execute(
            "INSERT INTO node_logs VALUES (%s, %s, %s, %s)",
            (node, log_id, records[-1][0], _state.encode(tracker.state)),
        )


def test_a_version_1_database_migrates_and_goes_on(tmp_path: Path, dsn: str) -> None:
    """A claim prepared before the migration is unprepared after it; a device id with a backslash
    held before it keeps its name; the index covers the records of both sides; a gap opened
    before it and closed after it, and one closed before it, count in ``fleet usage`` as the
    node's own (schema 6 made them from the records applied)."""
    opened = ev.ObservationGapFound(source="kubelet", since_ns=runtime_ts(0) + 5, reason="socket missing")
    held = [
        ev.ObservationGapFound(source="eventsrc", since_ns=runtime_ts(0) - 10**9, until_ns=runtime_ts(0) + 2),
        opened,
        ev.PodAdmissionStarted(pod=ref("d")),
        ev.DevicesAdded(resource=RES, devices=[ev.DeviceInfo(id=SLASH_DEVICE, health="Healthy")]),
        ev.DevicesReserved(pod_uid="uid-d", container="main", resource=RES, device_ids=[SLASH_DEVICE]),
        ev.DevicesAllocated(pod_uid="uid-d", container="main", resource=RES, device_ids=[SLASH_DEVICE]),
        ev.PodAdmitted(pod=ref("d")),
    ]
    batches = [(runtime_ts(0), held)] + [(runtime_ts(s), e) for s, e in own_steps()[1:9]]  # claim-1's story
    batches.append((runtime_ts(20), [msgspec.structs.replace(opened, until_ns=runtime_ts(0) + 9)]))
    root = tmp_path / "node"
    write(root, batches)
    records = raw(root)
    prepared = next(s for s, v in records if decode_record(s, v).type == "ClaimPrepared")
    before = [(s, v) for s, v in records if s <= prepared]
    v1_database(dsn, "node-v", "log-v", before)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert migrate(conn) == 1
        assert conn.execute("SELECT version FROM eventsrc_schema").fetchall() == [(len(MIGRATIONS),)]
        assert conn.execute("SELECT device FROM holds").fetchall() == [(pg_text(SLASH_DEVICE),)]
        migrated = conn.execute("SELECT source, since_ns, until_ns FROM gaps ORDER BY 1").fetchall()
        for seq, value in reversed(records[len(before) :]):  # the rest, backwards
            store(conn, "node-v", "log-v", seq, seq - 1, value)
        applied = conn.execute("SELECT applied_seq FROM node_logs").fetchone()
        gaps = conn.execute("SELECT source, since_ns, until_ns FROM gaps ORDER BY 1").fetchall()
        recs = [decode_record(s, v) for s, v in records]
        until = recs[-1].ts_ns + 1
        usage = usage_totals(conn, "pod", Window(0, until), frozenset())
    assert applied == (records[-1][0],)
    assert migrated == [("eventsrc", runtime_ts(0) - 10**9, runtime_ts(0) + 2), ("kubelet", runtime_ts(0) + 5, 0)]
    holds, blind = observe((r.ts_ns, r.event) for r in recs)
    assert [tuple(g) for g in gaps] == blind.listed()
    own = totals(holds, "pod", Window(0, until), gaps=merged(blind.listed(), Window(0, until)))
    assert usage == own and own[0].gap_ns == 2 + (9 - 5)  # ns inside the two gaps while d held
    index, preps = fleet_rows(dsn, "node-v")
    assert index == node_index(root)
    assert sorted(tuple(r) for r in preps) == expected_preparations(root)
    assert [p[7] for p in preps] == [next(s for s, v in records if decode_record(s, v).type == "ClaimUnprepared")]
    f = {"resource": RES, "device_id": SLASH_DEVICE}
    assert ask(dsn, "device", **f) == {"node-v": nodes_answer(root, "device", f)}


def test_records_never_shipped_are_named_in_the_answer(dsn: str, roots: dict[str, Path]) -> None:
    """A log whose first records a retention cut took before they were shipped: each node's
    answer says which records the fleet lacks, in JSON (``log``) and in the table."""
    records = raw(roots["node-c"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        for seq, value in records[3:]:
            store(conn, "node-c", "log-c", seq, 0 if seq == 4 else seq - 1, value)
    answer = json.loads(ask(dsn, "pod", pod="uid-a")["node-c"])
    assert answer["log"] == {
        "first_seq": 4,
        "live_first_seq": 4,
        "archive_segments": 0,
        "live_only": False,
        "missing": ["records 1..3 (never shipped)"],
    }
    table = run_cli("fleet", "audit", "pod", "uid-a", "--postgres", dsn, check=True).stdout
    assert table.splitlines()[2] == "the fleet lacks records 1..3 (never shipped)"


def test_a_pod_whose_uid_is_learned_is_one_pod_in_the_fleets_usage(dsn: str, tmp_path: Path) -> None:
    """Issue 35: a pod the kubelet listed before its uid was known holds a device and a CPU;
    its uid is learned (``KubeletPodObserved``), a CPU is added, it goes: the fleet's holds and
    ``fleet usage --by pod`` are the node's own, one row per resource under the uid."""
    nameless, named = ev.PodRef(uid="", namespace="ml", name="train"), ev.PodRef(uid="u1", namespace="ml", name="train")
    write(
        tmp_path,
        [
            (
                kubelet_ts(0),
                [ev.KubeletPodObserved(pod=nameless), ev.KubeletCPUsObserved(pod=nameless, container="c", cpus=[1])],
            ),
            (
                kubelet_ts(1),
                [ev.KubeletDevicesObserved(pod=nameless, container="c", resource=RES, device_ids=["dev-0"])],
            ),
            (kubelet_ts(2), [ev.KubeletPodObserved(pod=named)]),
            (kubelet_ts(3), [ev.KubeletCPUsObserved(pod=named, container="c", cpus=[1, 2])]),
            (kubelet_ts(4), [ev.KubeletPodReleased(pod=named)]),
        ],
    )
    records = raw(tmp_path)
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        for seq, value in records:
            store(conn, "node-u", "log-u", seq, seq - 1, value)
        rows = conn.execute("SELECT uid, resource, device, start_ns, end_ns FROM holds ORDER BY id").fetchall()
        usage = usage_totals(conn, "pod", Window(0, kubelet_ts(5)), frozenset())
    recs = [decode_record(s, v) for s, v in records]
    own = intervals((r.ts_ns, r.event) for r in recs)
    assert sorted(tuple(r) for r in rows) == sorted((h.uid, h.resource, h.device, h.start_ns, e) for h, e in own)
    assert {r[0] for r in rows} == {"u1"}
    assert usage == totals(own, "pod", Window(0, kubelet_ts(5))) and [r.group[2] for r in usage] == ["u1", "u1"]
