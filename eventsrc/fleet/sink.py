"""``eventsrc fleet sink``: the nodes' records from a JetStream stream into PostgreSQL.

    run_sink()           trio, with nats-py on trio-asyncio's loop and psycopg in a worker
                         thread
      migrate()          the schema, versioned (``MIGRATIONS``), under a lock so that
                         several sinks starting at once migrate it once
      a durable pull consumer shared by every sink (explicit acknowledgement); the messages
      of each fetch, in one transaction (``store_many``), then each acknowledged:
        records          the record, once: (node, log id, seq) is its key
        derived rows     made in the node's log order: under a row lock on the node's log
                         (``node_logs``: the sequence applied so far and the trackers'
                         state), the records that follow the applied sequence without a gap
                         are fed to the node's own pure code: ``chargeback.Tracker`` (the
                         holds), ``log.index.keys_for`` (the audit index ``fleet audit``
                         reads, ``fleet_audit``) and ``claim_preparations.Preparations``

A redelivered or replayed message changes nothing (the record is there; the sequence is
applied); a message ahead of a gap waits in ``records`` until the gap is filled, by whichever
sink stores the missing one. So the rows are the same whatever the sinks and the order.
PostgreSQL's text cannot hold U+0000: ``pg_text`` is how the derived rows' text holds it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import msgspec
import nats
import nats.errors
import psycopg
import trio
import trio_asyncio
from nats.js.api import ConsumerConfig
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from psycopg import sql
from psycopg.types.json import Jsonb

from eventsrc.core.backoff import Backoff
from eventsrc.core.chargeback import FIELDS, HIDING, Hold, Row, Tracker, UsageState, Window
from eventsrc.core.claim_preparations import PreparationChange, Preparations, PreparationsState
from eventsrc.core.fleet_names import DEFAULT_PREFIX, DEFAULT_STREAM, FOLLOWS, SEQ, Node
from eventsrc.core.shipped_records import (
    DATABASE,
    KINDS,
    PAYLOAD,
    Candidate,
    Refusal,
    Stored,
    candidate,
    check_message,
    settle,
)
from eventsrc.errors import EventsrcError, first_line
from eventsrc.events import (
    CorruptRecordError,
    FutureRecordError,
    ObservationGapFound,
    Record,
    chain_hash,
    decode_record,
    prev_hash_of,
)
from eventsrc.log.index import keys_for
from eventsrc.obs.logger import get_logger
from eventsrc.offline.render import record_json
from eventsrc.rpc.bridge import to_aio
from eventsrc.rpc.jetstream import BACKOFF_FIRST, BACKOFF_MAX, FAILURES, NatsAuth, connect, ensure_stream, said_refused

log = get_logger(__name__)

DURABLE = "eventsrc-sink"
BATCH = 256
FETCH_WAIT = 1.0
#: s: what a sink fetched and did not acknowledge (it was killed mid-batch) goes to a sink again
#: after this; a fetch's transaction takes far less
ACK_WAIT = 10.0

#: The first schema: the records, the node logs and the holds.
_V1 = """
    CREATE TABLE records (
        node text NOT NULL,
        log_id text NOT NULL,
        seq bigint NOT NULL,
        follows bigint NOT NULL,
        type text NOT NULL,
        ts_ns bigint NOT NULL,
        ts timestamptz NOT NULL,
        record jsonb NOT NULL,
        data bytea NOT NULL,
        PRIMARY KEY (node, log_id, seq)
    );
    CREATE TABLE node_logs (
        node text NOT NULL,
        log_id text NOT NULL,
        applied_seq bigint NOT NULL DEFAULT 0,
        tracker bytea,
        PRIMARY KEY (node, log_id)
    );
    CREATE TABLE holds (
        id bigserial PRIMARY KEY,
        node text NOT NULL,
        log_id text NOT NULL,
        resource text NOT NULL,
        device text NOT NULL,
        namespace text NOT NULL,
        name text NOT NULL,
        uid text NOT NULL,
        start_ns bigint NOT NULL,
        end_ns bigint
    );
    CREATE INDEX holds_open ON holds (node, log_id, resource, device) WHERE end_ns IS NULL;
    CREATE INDEX holds_by_device ON holds (resource, device, start_ns);
    CREATE INDEX holds_by_pod ON holds (uid, start_ns);
    """

#: Version 2: the node's audit index and the claim preparations (made from the records already
#: applied by ``_backfill``), the escape of U+0000 (docs/fleet.md "U+0000"), the records a node
#: never shipped.
_V2 = r"""
    CREATE TABLE audit_index (
        key bytea NOT NULL,
        node text NOT NULL,
        log_id text NOT NULL,
        seq bigint NOT NULL,
        PRIMARY KEY (key, node, log_id, seq)
    );
    CREATE TABLE claim_preparations (
        node text NOT NULL,
        log_id text NOT NULL,
        claim_uid text NOT NULL,
        namespace text NOT NULL,
        name text NOT NULL,
        driver text NOT NULL,
        pods text[] NOT NULL,
        start_seq bigint NOT NULL,
        start_ns bigint NOT NULL,
        end_seq bigint,
        end_ns bigint,
        PRIMARY KEY (node, log_id, start_seq, claim_uid)
    );
    CREATE INDEX claim_preparations_by_claim ON claim_preparations (claim_uid, start_ns);
    CREATE INDEX claim_preparations_by_driver ON claim_preparations (driver, start_ns);
    CREATE INDEX claim_preparations_by_pod ON claim_preparations USING gin (pods);
    CREATE INDEX records_skips ON records (node, log_id, seq) WHERE follows <> seq - 1;
    ALTER TABLE node_logs ADD COLUMN preparations bytea;
    ALTER TABLE records ADD COLUMN record_escaped boolean NOT NULL DEFAULT false;
    UPDATE holds SET resource = replace(resource, '\', '\\'), device = replace(device, '\', '\\'),
        namespace = replace(namespace, '\', '\\'), name = replace(name, '\', '\\'), uid = replace(uid, '\', '\\')
        WHERE strpos(resource || device || namespace || name || uid, '\') > 0;
    """


def _to_v2(conn: psycopg.Connection[Any]) -> None:
    conn.execute(_V2)
    for node, log_id, applied in conn.execute("SELECT node, log_id, applied_seq FROM node_logs").fetchall():
        _backfill(conn, node, log_id, applied)


#: Version 3: the holds by their end, an open one's end the largest bigint (``OPEN_END``): ``fleet
#: usage`` selects the holds that end after its window starts with it (ADR 0033).
HOLD_END = "coalesce(end_ns, 9223372036854775807)"  # an open hold's end: the largest bigint
_V3 = f"CREATE INDEX holds_by_end ON holds (({HOLD_END}))"

#: Version 4: what is not a node's record is kept apart (``quarantine``, with the reason), and what
#: may be one waits for its predecessor (``pending``) before it is stored (ADR 0034)
_V4 = """
    CREATE TABLE quarantine (
        id bigserial PRIMARY KEY,
        received timestamptz NOT NULL DEFAULT now(),
        kind text NOT NULL,
        reason text NOT NULL,
        subject text NOT NULL,
        node text NOT NULL,
        log_id text NOT NULL,
        seq text NOT NULL,
        headers jsonb NOT NULL,
        data bytea NOT NULL
    );
    CREATE INDEX quarantine_by_log ON quarantine (node, log_id, seq);
    CREATE TABLE pending (
        id bigserial PRIMARY KEY,
        node text NOT NULL,
        log_id text NOT NULL,
        seq bigint NOT NULL,
        follows bigint NOT NULL,
        hash bytea NOT NULL,
        subject text NOT NULL,
        headers jsonb NOT NULL,
        data bytea NOT NULL,
        UNIQUE (node, log_id, seq, hash)
    );
    """

#: Version 5: the waiting records by the one they follow (``WAITING_ON``)
#: and the payloads that were no record by the one they follow (``DAMAGED_AFTER``)
_V5 = f"""
    CREATE INDEX pending_by_follows ON pending (node, log_id, follows);
    CREATE INDEX quarantine_damaged ON quarantine (node, log_id, (headers->>'{FOLLOWS}')) WHERE kind = '{PAYLOAD}';
    """
#: the payloads kept apart as no record that follow one of a fetch's records: a record waiting on
#: one of them may now be vouched for it (``shipped_records.settle``)
DAMAGED_AFTER = (
    f"SELECT seq FROM quarantine WHERE node = %s AND log_id = %s AND kind = '{PAYLOAD}' "
    f"AND headers->>'{FOLLOWS}' = ANY(%s)"
)

#: Version 6: the times each node could not see (``ObservationGapFound``, by its source and its
#: start; ``until_ns`` 0 while open), from the records already applied: ``fleet usage`` gives the
#: seconds of holds inside them apart from those seen, as ``audit usage`` does (issue 35); and a
#: hold's amount (memory's bytes, ``Hold.amount``; 1 for a device or CPU)
_V6 = """
    ALTER TABLE holds ADD COLUMN amount bigint NOT NULL DEFAULT 1;
    CREATE TABLE gaps (
        node text NOT NULL,
        log_id text NOT NULL,
        source text NOT NULL,
        since_ns bigint NOT NULL,
        until_ns bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (node, log_id, source, since_ns)
    );
    INSERT INTO gaps (node, log_id, source, since_ns, until_ns)
        SELECT r.node, r.log_id, r.record->'event'->>'source', (r.record->'event'->>'since_ns')::bigint,
               coalesce((array_agg((r.record->'event'->>'until_ns')::bigint ORDER BY r.seq DESC)
                   FILTER (WHERE (r.record->'event'->>'until_ns')::bigint <> 0))[1], 0)
        FROM records r JOIN node_logs n ON n.node = r.node AND n.log_id = r.log_id
        WHERE r.type = 'ObservationGapFound' AND r.seq <= n.applied_seq AND NOT r.record_escaped
        GROUP BY 1, 2, 3, 4;
    """

#: MIGRATIONS[v] takes the schema from version v to v + 1 (docs/fleet.md): SQL, or a function
#: that runs in the migration's transaction
MIGRATIONS: tuple[str | Callable[[psycopg.Connection[Any]], None], ...] = (_V1, _to_v2, _V3, _V4, _V5, _V6)
SCHEMA_VERSION = len(MIGRATIONS)
MIGRATION_LOCK = 0x65766E74  # the advisory lock migrations take ("evnt")


def migrate(conn: psycopg.Connection[Any]) -> int:
    """Bring the schema to ``SCHEMA_VERSION`` (one sink at a time); the version it had."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))  # sinks starting at once: one migrates
        conn.execute("CREATE TABLE IF NOT EXISTS eventsrc_schema (version integer NOT NULL)")
        conn.execute("LOCK TABLE eventsrc_schema IN EXCLUSIVE MODE")
        row = conn.execute("SELECT version FROM eventsrc_schema").fetchone()
        if row is None:
            conn.execute("INSERT INTO eventsrc_schema (version) VALUES (0)")
        had = 0 if row is None else int(row[0])
        if had > SCHEMA_VERSION:
            raise EventsrcError(
                f"the database's eventsrc schema is version {had}, newer than this sink's {SCHEMA_VERSION}"
            )
        for version in range(had, SCHEMA_VERSION):
            step = MIGRATIONS[version]
            if isinstance(step, str):
                conn.execute(step)
            else:
                step(conn)
        conn.execute("UPDATE eventsrc_schema SET version = %s", (SCHEMA_VERSION,))
    return had


_state = msgspec.msgpack.Encoder()
_state_of = msgspec.msgpack.Decoder(UsageState)
_preparations_of = msgspec.msgpack.Decoder(PreparationsState)


# --------------------------------------------------------------------------- U+0000


def pg_text(value: str) -> str:
    """``value`` as the derived tables' text columns hold it: PostgreSQL's text cannot hold
    U+0000, so "\\" is written "\\\\" and U+0000 "\\0" (``from_pg_text`` undoes it)."""
    if "\\" not in value and "\0" not in value:
        return value
    return value.replace("\\", "\\\\").replace("\0", "\\0")


def from_pg_text(value: str) -> str:
    if "\\" not in value:
        return value
    out, i = [], 0
    while i < len(value):
        ch = value[i]
        if ch == "\\" and i + 1 < len(value):
            out.append("\0" if value[i + 1] == "0" else value[i + 1])
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\0" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def escape_json(value: Any) -> Any:
    """Every string of ``value`` (keys too) through ``pg_text``: a record's jsonb when it holds
    U+0000, which jsonb cannot hold (``records.record_escaped``)."""
    if isinstance(value, str):
        return pg_text(value)
    if isinstance(value, dict):
        return {pg_text(k): escape_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escape_json(v) for v in value]
    return value


# --------------------------------------------------------------------------- writing


class Shipped(NamedTuple):
    """One shipped record as a message carries it."""

    node: str
    log_id: str
    seq: int
    follows: int  # the record shipped before it on the node's subject
    data: bytes


class Message(NamedTuple):
    """A message of the stream as it came: nothing of it is trusted (``check_message``)."""

    subject: str
    headers: dict[str, str]
    data: bytes


def message_of(s: Shipped, prefix: str = DEFAULT_PREFIX) -> Message:
    """The message a node's shipper publishes for ``s`` (its type read from the record)."""
    node = Node(s.node, s.log_id)
    try:
        kind = decode_record(s.seq, s.data).type
    except FutureRecordError as exc:
        kind = exc.type_name
    except CorruptRecordError:
        kind = ""
    return Message(node.subject(prefix), node.headers(s.seq, kind, s.follows), s.data)


class Outcome(NamedTuple):
    """What one ``store_many`` did: records stored, and the refusals by kind."""

    stored: int
    quarantined: dict[str, int]


def store(conn: psycopg.Connection[Any], node: str, log_id: str, seq: int, follows: int, data: bytes) -> Outcome:
    """One shipped record, in one transaction (``store_many``)."""
    return store_many(conn, [Shipped(node, log_id, seq, follows, data)])


def store_many(
    conn: psycopg.Connection[Any], messages: Sequence[Shipped | Message], prefix: str = DEFAULT_PREFIX
) -> Outcome:
    """Messages, in one transaction: each checked (``shipped_records``): what is not a node's record
    is quarantined with the reason; a record that links to the node's stored one before it is
    stored, once; one whose predecessor is not stored yet waits (``pending``); then each node's
    derived rows are made up to its first gap.

    Node logs are taken in (node, log id) order, each under the lock on its ``node_logs`` row
    before anything of it is read, so two sinks storing the same messages never wait for each
    other in a cycle, and what one stores the other sees before it decides."""
    checked: list[tuple[Message, Candidate | Refusal]] = []
    for m in messages:
        msg = message_of(m, prefix) if isinstance(m, Shipped) else m
        checked.append((msg, check_message(msg.subject, msg.headers, msg.data, prefix)))
    by_log: dict[tuple[str, str], list[tuple[Message, Candidate]]] = {}
    quarantined: dict[str, int] = {}
    stored = 0
    with conn.transaction():
        for msg, verdict in checked:
            if isinstance(verdict, Refusal):
                _quarantine(conn, msg, verdict, quarantined)
            else:
                by_log.setdefault((verdict.node.name, verdict.node.log_id), []).append((msg, verdict))
        for (node, log_id), part in sorted(by_log.items()):
            stored += _settle(conn, Node(node, log_id), part, quarantined)
            _apply_following(conn, node, log_id)
    return Outcome(stored, quarantined)


def _quarantine(conn: psycopg.Connection[Any], msg: Message, why: Refusal, counts: dict[str, int]) -> None:
    conn.execute(
        "INSERT INTO quarantine (kind, reason, subject, node, log_id, seq, headers, data) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
        (
            why.kind,
            pg_text(why.reason),
            pg_text(msg.subject),
            pg_text(why.node),
            pg_text(why.log_id),
            pg_text(why.seq),
            Jsonb(escape_json(dict(msg.headers))),
            msg.data,
        ),
    )
    counts[why.kind] = counts.get(why.kind, 0) + 1


#: the records waiting in ``pending`` that a fetch's candidates (at ``seqs``, and the damaged
#: payloads that follow them) may settle: those
#: that follow one of them, and those that follow one of these, and so on. Not the others: a
#: forger's records far ahead of the log, however many, are not read again at every fetch.
WAITING_ON = """
    WITH RECURSIVE ready AS (
        SELECT id, seq, follows, data, subject, headers FROM pending
            WHERE node = %(node)s AND log_id = %(log_id)s AND follows = ANY(%(seqs)s)
        UNION
        SELECT p.id, p.seq, p.follows, p.data, p.subject, p.headers FROM pending p JOIN ready r
            ON p.node = %(node)s AND p.log_id = %(log_id)s AND p.follows = r.seq
    )
    SELECT id, seq, follows, data, subject, headers FROM ready ORDER BY id
    """


def _settle(
    conn: psycopg.Connection[Any], node: Node, part: list[tuple[Message, Candidate]], counts: dict[str, int]
) -> int:
    """Under the lock on the node log's row: ``part`` and the log's waiting records against what
    is stored (``shipped_records.settle``); the records stored."""
    conn.execute(
        "INSERT INTO node_logs (node, log_id) VALUES (%s, %s) ON CONFLICT DO NOTHING", (node.name, node.log_id)
    )
    conn.execute("SELECT 1 FROM node_logs WHERE node = %s AND log_id = %s FOR UPDATE", (node.name, node.log_id))
    where = (node.name, node.log_id)
    came: dict[Candidate, tuple[Message, int | None]] = {c: (m, None) for m, c in reversed(part)}  # the first kept
    seqs = {c.seq for _, c in part}
    seqs |= {int(s) for (s,) in conn.execute(DAMAGED_AFTER, (*where, [str(s) for s in seqs])).fetchall()}
    for pid, seq, follows, data, subject, headers in conn.execute(
        WAITING_ON, {"node": node.name, "log_id": node.log_id, "seqs": sorted(seqs)}
    ).fetchall():
        c = candidate(node, seq, follows, bytes(data))
        came[c] = (
            Message(from_pg_text(subject), {from_pg_text(k): from_pg_text(v) for k, v in headers.items()}, c.data),
            pid,
        )
    waiting = [c for c, (_, pid) in came.items() if pid is not None]
    candidates = [*waiting, *(c for _, c in part)]
    wanted = sorted({c.seq for c in candidates} | {c.follows for c in candidates if c.follows})
    stored = {
        seq: Stored(chain_hash(bytes(data)), prev_hash_of(bytes(data)))
        for seq, data in conn.execute(
            "SELECT seq, data FROM records WHERE node = %s AND log_id = %s AND seq = ANY(%s)", (*where, wanted)
        ).fetchall()
    }
    for c in candidates:  # after a cut it names: a stored record inside the gap refutes it
        if c.follows and not c.checked:
            inside = conn.execute(
                "SELECT seq, data FROM records WHERE node = %s AND log_id = %s AND seq > %s AND seq < %s "
                "ORDER BY seq LIMIT 1",
                (*where, c.follows, c.seq),
            ).fetchone()
            if inside is not None:
                stored[inside[0]] = Stored(chain_hash(bytes(inside[1])), prev_hash_of(bytes(inside[1])))
    missing = [str(c.follows) for c in candidates if c.follows and c.follows not in stored]
    damaged = (
        [
            candidate(node, int(seq), int(follows), bytes(data), corrupt=True)
            for seq, follows, data in conn.execute(
                "SELECT seq, headers->>%s, data FROM quarantine WHERE node = %s AND log_id = %s AND seq = ANY(%s) "
                "AND kind = %s",
                (FOLLOWS, *where, missing, PAYLOAD),
            ).fetchall()
        ]
        if missing
        else []
    )
    if before_damaged := [d.follows for d in damaged if d.follows and d.follows not in stored]:  # in place?
        for seq, data in conn.execute(
            "SELECT seq, data FROM records WHERE node = %s AND log_id = %s AND seq = ANY(%s)", (*where, before_damaged)
        ).fetchall():
            stored[seq] = Stored(chain_hash(bytes(data)), prev_hash_of(bytes(data)))
    empty = not stored and conn.execute(
        "SELECT NOT EXISTS (SELECT 1 FROM records WHERE node = %s AND log_id = %s)", where
    ).fetchone() == (True,)
    decision = settle(candidates, stored, damaged, empty=empty)
    done = [came[c][1] for c in (*decision.store, *decision.same, *(c for c, _ in decision.refuse)) if c in came]
    if done := [pid for pid in done if pid is not None]:
        conn.execute("DELETE FROM pending WHERE id = ANY(%s)", (done,))
    for c, why in decision.refuse:
        _quarantine(conn, came[c][0] if c in came else Message("", {}, c.data), why, counts)
    for c in decision.vouched:
        conn.execute(
            "DELETE FROM quarantine WHERE node = %s AND log_id = %s AND seq = %s AND kind = %s AND data = %s",
            (*where, str(c.seq), PAYLOAD, c.data),
        )
    if decision.store:
        with conn.cursor() as cur:
            cur.executemany(
                f"{INSERT_RECORD} ON CONFLICT DO NOTHING",
                [record_row(node.name, node.log_id, c.seq, c.follows, c.data) for c in decision.store],
            )
    for c in decision.wait:
        if came[c][1] is None:
            msg = came[c][0]
            conn.execute(
                "INSERT INTO pending (node, log_id, seq, follows, hash, subject, headers, data) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (*where, c.seq, c.follows, c.hash, pg_text(msg.subject), Jsonb(escape_json(dict(msg.headers))), c.data),
            )
    return len(decision.store)


def _apply_following(conn: psycopg.Connection[Any], node: str, log_id: str) -> None:
    """Under the lock on the node log's row (``_settle`` took it): the stored records that follow
    its applied one."""
    applied, state, prepared = conn.execute(
        "SELECT applied_seq, tracker, preparations FROM node_logs WHERE node = %s AND log_id = %s FOR UPDATE",
        (node, log_id),
    ).fetchone() or (0, None, None)
    following = conn.execute(
        "SELECT seq, follows, data FROM records WHERE node = %s AND log_id = %s AND seq > %s ORDER BY seq",
        (node, log_id, applied),
    ).fetchall()
    chain: list[tuple[int, bytes]] = []
    for next_seq, next_follows, next_data in following:
        if next_follows != (chain[-1][0] if chain else applied):
            break  # a gap: the records after it wait for it
        chain.append((next_seq, bytes(next_data)))
    if chain:
        _apply(conn, node, log_id, chain, state, prepared)


def _apply(
    conn: psycopg.Connection[Any],
    node: str,
    log_id: str,
    chain: list[tuple[int, bytes]],
    state: bytes | None,
    prepared: bytes | None,
) -> None:
    """The rows ``chain`` (the node's next records, in order) makes, then the applied sequence
    and the trackers' state."""
    tracker = Tracker(_state_of.decode(state) if state else None)
    preparations = Preparations(_preparations_of.decode(prepared) if prepared else None)
    _feed(conn, node, log_id, chain, tracker, preparations)
    conn.execute(
        "UPDATE node_logs SET applied_seq = %s, tracker = %s, preparations = %s WHERE node = %s AND log_id = %s",
        (chain[-1][0], _state.encode(tracker.state), _state.encode(preparations.state), node, log_id),
    )


def _feed(
    conn: psycopg.Connection[Any],
    node: str,
    log_id: str,
    chain: list[tuple[int, bytes]],
    tracker: Tracker | None,
    preparations: Preparations,
) -> None:
    """Feed ``chain`` to the node's own pure code: the index keys (``log.index.keys_for``), the
    usage ``Tracker`` (holds and gaps; None: not these, whose tables a later migration makes)
    and ``Preparations`` (claim preparations)."""
    keys: list[tuple[bytes, str, str, int]] = []
    for seq, data in chain:
        try:
            record = decode_record(seq, data)
        except CorruptRecordError:
            continue  # named corrupt in records; it changes nothing derived (as on the node)
        keys += index_rows(node, log_id, record)
        for hold, end_ns in tracker.feed(record.ts_ns, record.event) if tracker is not None else ():
            _hold(conn, node, log_id, hold, end_ns)
        for was, now in tracker.rebound if tracker is not None else ():
            _rebind(conn, node, log_id, was, now)
        for change in preparations.feed(seq, record.ts_ns, record.event):
            _preparation(conn, node, log_id, change)
        if tracker is not None and isinstance(record.event, ObservationGapFound):
            _gap(conn, node, log_id, record.event)
    if keys:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO audit_index (key, node, log_id, seq) VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING", keys
            )


def _hold(conn: psycopg.Connection[Any], node: str, log_id: str, hold: Hold, end_ns: int | None) -> None:
    resource, device, uid = pg_text(hold.resource), pg_text(hold.device), pg_text(hold.uid)
    if end_ns is not None:  # one of the open rows alike (two containers may hold alike)
        conn.execute(
            "UPDATE holds SET end_ns = %s WHERE id = (SELECT id FROM holds WHERE node = %s "
            "AND log_id = %s AND resource = %s AND device = %s AND uid = %s AND start_ns = %s "
            "AND end_ns IS NULL ORDER BY id LIMIT 1)",
            (end_ns, node, log_id, resource, device, uid, hold.start_ns),
        )
        return
    conn.execute(
        "INSERT INTO holds (node, log_id, resource, device, namespace, name, uid, start_ns, end_ns, amount) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, NULL, %s)",
        (node, log_id, resource, device, pg_text(hold.namespace), pg_text(hold.name), uid, hold.start_ns, hold.amount),
    )


def _rebind(conn: psycopg.Connection[Any], node: str, log_id: str, was: Hold, now: Hold) -> None:
    """An open hold's pod uid learned (``Tracker.rebound``): its row takes it."""
    conn.execute(
        "UPDATE holds SET uid = %s WHERE id = (SELECT id FROM holds WHERE node = %s AND log_id = %s "
        "AND resource = %s AND device = %s AND uid = %s AND start_ns = %s AND end_ns IS NULL ORDER BY id LIMIT 1)",
        (pg_text(now.uid), node, log_id, pg_text(was.resource), pg_text(was.device), pg_text(was.uid), was.start_ns),
    )


def _gap(conn: psycopg.Connection[Any], node: str, log_id: str, e: ObservationGapFound) -> None:
    """A gap opened, or closed (a later record of its source and start: ``chargeback.Blind``)."""
    conn.execute(
        "INSERT INTO gaps (node, log_id, source, since_ns, until_ns) VALUES (%s, %s, %s, %s, %s) "
        "ON CONFLICT (node, log_id, source, since_ns) DO UPDATE SET until_ns = "
        "CASE WHEN EXCLUDED.until_ns <> 0 THEN EXCLUDED.until_ns ELSE gaps.until_ns END",
        (node, log_id, pg_text(e.source), e.since_ns, e.until_ns),
    )


def _preparation(conn: psycopg.Connection[Any], node: str, log_id: str, change: PreparationChange) -> None:
    p = change.preparation
    conn.execute(
        "INSERT INTO claim_preparations (node, log_id, claim_uid, namespace, name, driver, pods, start_seq, "
        "start_ns, end_seq, end_ns) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
        "ON CONFLICT (node, log_id, start_seq, claim_uid) DO UPDATE SET namespace = EXCLUDED.namespace, "
        "name = EXCLUDED.name, driver = EXCLUDED.driver, pods = EXCLUDED.pods, end_seq = EXCLUDED.end_seq, "
        "end_ns = EXCLUDED.end_ns",
        (
            node,
            log_id,
            pg_text(p.claim_uid),
            pg_text(p.namespace),
            pg_text(p.name),
            pg_text(p.driver),
            [pg_text(u) for u in p.pods],
            p.start_seq,
            p.start_ns,
            change.end_seq,
            change.end_ns,
        ),
    )


def _backfill(conn: psycopg.Connection[Any], node: str, log_id: str, applied: int) -> None:
    """The rows of version 2 for the records a version 1 sink applied: the chain that ends at
    the applied sequence (each record names the one it follows), fed in order."""
    if applied == 0:
        return
    follows = dict(
        conn.execute(
            "SELECT seq, follows FROM records WHERE node = %s AND log_id = %s AND seq <= %s",
            (node, log_id, applied),
        ).fetchall()
    )
    chain, seq = [], applied
    while seq:
        chain.append(seq)
        seq = follows[seq]
    chain.reverse()
    preparations = Preparations()
    for start in range(0, len(chain), BATCH):
        rows = conn.execute(
            "SELECT seq, data FROM records WHERE node = %s AND log_id = %s AND seq = ANY(%s) ORDER BY seq",
            (node, log_id, chain[start : start + BATCH]),
        ).fetchall()
        _feed(conn, node, log_id, [(seq, bytes(data)) for seq, data in rows], None, preparations)
    conn.execute(
        "UPDATE node_logs SET preparations = %s WHERE node = %s AND log_id = %s",
        (_state.encode(preparations.state), node, log_id),
    )


#: the columns of a ``records`` row, in ``record_row``'s order
RECORD_COLUMNS = "node, log_id, seq, follows, type, ts_ns, ts, record, record_escaped, data"
INSERT_RECORD = f"INSERT INTO records ({RECORD_COLUMNS}) VALUES ({', '.join(['%s'] * 10)})"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def record_row(node: str, log_id: str, seq: int, follows: int, data: bytes) -> tuple[Any, ...]:
    """A ``records`` row (``RECORD_COLUMNS``) of one shipped record: decoded and checked by the
    log's own ``decode_record``; a corrupt one is named so; its JSON escaped when it holds U+0000."""
    try:
        record = decode_record(seq, data)
    except CorruptRecordError as exc:
        fields: dict[str, Any] = {"seq": seq, "corrupt": True, "reason": exc.reason}
        kind, ts_ns = "", 0
    else:
        fields, kind, ts_ns = record_json(record), record.type, record.ts_ns
    escaped = _has_nul(fields)
    ts = _EPOCH + dt.timedelta(microseconds=ts_ns // 1000)
    return (
        node,
        log_id,
        seq,
        follows,
        kind,
        ts_ns,
        ts,
        Jsonb(escape_json(fields) if escaped else fields),
        escaped,
        data,
    )


def index_rows(node: str, log_id: str, record: Record) -> list[tuple[bytes, str, str, int]]:
    """The ``audit_index`` rows (key, node, log_id, seq) of one record: each key the node's log
    indexes it under (``log.index.keys_for``), once."""
    return [(key, node, log_id, record.seq) for key in dict.fromkeys(keys_for(record.event))]


async def run_sink(
    servers: Sequence[str],
    dsn: str,
    stream: str = DEFAULT_STREAM,
    prefix: str = DEFAULT_PREFIX,
    *,
    replicas: int = 1,
    metrics: SinkMetrics | None = None,
    auth: NatsAuth | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Consume the stream into the database until cancelled, connected to NATS as ``auth``
    (None: no credentials). Raises EventsrcError when the
    database or the servers cannot be reached at the start. Once it has consumed, servers that
    go away, and a database that refuses or loses a fetch's transaction for any reason, are said
    once per reason and tried again with backoff (a sink is a Deployment: it waits for them, as
    the nodes do); what was fetched and not acknowledged is delivered again after ``ACK_WAIT``,
    to this sink or another, if this one is gone."""
    conn = await _connect_database(dsn)
    try:
        try:
            had = await trio.to_thread.run_sync(migrate, conn)
        except psycopg.Error as exc:
            raise EventsrcError(f"cannot make the fleet's tables: {first_line(exc)}") from None
        if had != SCHEMA_VERSION:
            log.info("fleet schema migrated", version_before=had, version=SCHEMA_VERSION)
    except BaseException:
        conn.close()
        raise
    consumer = _Consumer(servers, dsn, stream, prefix, replicas, conn, task_status, metrics or SinkMetrics(), auth)
    failed = ""  # raised once out of the loop (in it, it would come out as an exception group)
    try:
        async with trio_asyncio.open_loop():
            failed = await consumer.run()
    finally:
        consumer.close()
    if failed:
        raise EventsrcError(failed)


async def _connect_database(dsn: str) -> psycopg.Connection[Any]:
    try:
        return await trio.to_thread.run_sync(lambda: psycopg.connect(dsn, autocommit=True))
    except psycopg.Error as exc:
        raise EventsrcError(f"cannot connect to PostgreSQL: {first_line(exc)}") from None


#: what a session's start raises when the servers are away
CONNECTING_FAILURES: tuple[type[BaseException], ...] = (*FAILURES, EventsrcError)
#: the SQLSTATE classes of an error about the data stored, not the database: 22 data exception,
#: 23 integrity constraint violation, 54 program limit exceeded (an index row too large: a
#: device id of kilobytes). A fetch refused so is stored message by message, and the one the
#: database refuses alone is quarantined (kind "database"); anything else (privileges, a full
#: disk, a lost connection, a serialization failure) is the database's, retried.
DATA_CLASSES = ("22", "23", "54")


def database_reason(exc: BaseException) -> str:
    """One line for a database error: its SQLSTATE (when it has one) and its first line."""
    state = getattr(exc, "sqlstate", None) if isinstance(exc, psycopg.Error) else None
    return f"{state}: {first_line(exc)}" if state else first_line(exc)


class SinkMetrics:
    """The sink's series (``--metrics-address``): what it stored, what it quarantined and why,
    and the database's refusals."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.stored = Counter(
            "eventsrc_fleet_sink_records_stored", "Records stored as their node's.", registry=self.registry
        )
        self.quarantined = Counter(
            "eventsrc_fleet_sink_messages_quarantined",
            "Messages refused as a node's record and kept apart in the quarantine table, by kind of reason.",
            ["kind"],
            registry=self.registry,
        )
        for kind in KINDS:
            self.quarantined.labels(kind=kind)
        self.database_failures = Counter(
            "eventsrc_fleet_sink_store_failures",
            "Fetches whose transaction the database refused (retried with backoff).",
            registry=self.registry,
        )
        self.database_down = Gauge(
            "eventsrc_fleet_sink_database_failing", "1 while the database refuses the records.", registry=self.registry
        )

    def count(self, outcome: Outcome) -> None:
        self.stored.inc(outcome.stored)
        for kind, n in outcome.quarantined.items():
            self.quarantined.labels(kind=kind).inc(n)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Consumer:
    """The sink's sessions: one NATS connection each, again after the servers went away, with
    backoff; a database that refuses a fetch is retried with the fetch unacknowledged."""

    def __init__(
        self,
        servers: Sequence[str],
        dsn: str,
        stream: str,
        prefix: str,
        replicas: int,
        conn: psycopg.Connection[Any],
        task_status: trio.TaskStatus[None],
        metrics: SinkMetrics,
        auth: NatsAuth | None = None,
    ) -> None:
        self.servers, self.dsn, self.stream, self.prefix, self.replicas = servers, dsn, stream, prefix, replicas
        self.conn: psycopg.Connection[Any] | None = conn
        self.metrics = metrics
        self.auth = auth
        self._task_status: trio.TaskStatus[None] | None = task_status
        self._said = ""
        self._database_said = ""

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()

    async def run(self) -> str:
        """Consume until cancelled; the one-line reason when the first connection fails."""
        backoff = Backoff(BACKOFF_FIRST, BACKOFF_MAX)
        while True:
            try:
                nc = await connect(self.servers, auth=self.auth)
            except CONNECTING_FAILURES as exc:
                if self._task_status is not None:  # never consumed: the servers are not there
                    return f"cannot connect to NATS ({','.join(self.servers)}): {first_line(exc)}"
                self._say(first_line(exc))
            else:
                try:
                    await self._consume(nc)
                except FAILURES as exc:
                    self._say(first_line(exc))
                    backoff.reset()
            await trio.sleep(backoff.next())

    def _say(self, reason: str) -> None:
        if reason != self._said:
            log.warning("fleet sink disconnected; retrying", servers=",".join(self.servers), reason=reason)
            self._said = reason

    def _ready(self) -> None:
        if self._task_status is not None:
            self._task_status.started()
            self._task_status = None
        elif self._said:
            log.info("fleet sink connected again", servers=",".join(self.servers))
        self._said = ""

    async def _consume(self, nc: nats.NATS) -> None:
        """Store each fetch of the stream in one transaction, then acknowledge its messages,
        until cancelled or the connection closes."""
        try:
            js = nc.jetstream()
            with said_refused(nc):  # the sink's user lacks a right (docs/fleet.md, "NATS permissions")
                await to_aio(ensure_stream)(js, self.stream, self.prefix, self.replicas)  # before any node ships
                config = ConsumerConfig(ack_wait=ACK_WAIT)
                sub = await to_aio(js.pull_subscribe)(
                    f"{self.prefix}.>", durable=DURABLE, stream=self.stream, config=config
                )
            self._ready()
            while True:
                try:
                    messages = await to_aio(sub.fetch)(BATCH, timeout=FETCH_WAIT)
                except TimeoutError:  # nats-py's, or asyncio's from inside fetch: nothing came
                    if nc.is_closed:
                        raise nats.errors.ConnectionClosedError from None
                    continue
                batch = [Message(m.subject, dict(m.headers or {}), m.data) for m in messages]
                await self._store(batch, messages)
                for m in messages:  # each after the commit: a crash before redelivers what then changes nothing
                    await to_aio(m.ack)()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await to_aio(nc.close)()

    async def _store(self, batch: list[Message], messages: Sequence[Any]) -> None:
        """``batch`` stored (one transaction), or quarantined. A data error splits the fetch
        message by message (``_store_alone``)."""
        got = await self._until_taken(lambda conn: store_many(conn, batch, self.prefix), messages)
        if isinstance(got, str):
            await self._store_alone(batch, got, messages)
        else:
            self.metrics.count(got)

    async def _until_taken(
        self, work: Callable[[psycopg.Connection[Any]], Outcome], messages: Sequence[Any]
    ) -> Outcome | str:
        """``work``'s outcome once the database takes its transaction, or the database's reason
        when it refused it for its data (``DATA_CLASSES``). Until then, whatever else the database
        says, tried again with backoff, the messages kept this sink's (``in_progress``) and
        unacknowledged."""
        backoff = Backoff(BACKOFF_FIRST, BACKOFF_MAX)
        while True:
            try:
                if self.conn is None or self.conn.closed or self.conn.broken:
                    self.close()
                    self.conn = None
                    self.conn = await _connect_database(self.dsn)
                outcome = await trio.to_thread.run_sync(work, self.conn)
            except (psycopg.Error, EventsrcError) as exc:
                reason = database_reason(exc)
                if (getattr(exc, "sqlstate", None) or "")[:2] in DATA_CLASSES:
                    return reason
                self._database_failing(reason)
                for m in messages:
                    await to_aio(m.in_progress)()  # not delivered to another sink while this one waits
                await trio.sleep(backoff.next())
                continue
            self._database_back()
            return outcome

    async def _store_alone(self, batch: list[Message], reason: str, messages: Sequence[Any]) -> None:
        """Each message of a fetch the database refused for its data, in a transaction of its own;
        the one refused alone is quarantined with the database's reason (retried as a store is)."""
        if len(batch) > 1:
            for one in batch:
                await self._store([one], messages)
            return
        log.warning("the database refused a message; quarantined", subject=batch[0].subject[:300], reason=reason)
        why = Refusal(DATABASE, f"the database refused it: {reason}", seq=batch[0].headers.get(SEQ, "")[:40])
        got = await self._until_taken(lambda conn: quarantine_one(conn, batch[0], why), messages)
        if isinstance(got, str):  # not even its bytes and reason: nothing more can be kept of it
            log.warning(
                "the database refused to quarantine a message; dropped", subject=batch[0].subject[:300], reason=got
            )
        else:
            self.metrics.count(got)

    def _database_failing(self, reason: str) -> None:
        self.metrics.database_failures.inc()
        self.metrics.database_down.set(1)
        if reason != self._database_said:
            log.warning("the database refuses the records; retrying", reason=reason)
            self._database_said = reason

    def _database_back(self) -> None:
        self.metrics.database_down.set(0)
        if self._database_said:
            log.info("the database takes records again")
            self._database_said = ""


def quarantine_one(conn: psycopg.Connection[Any], msg: Message, why: Refusal) -> Outcome:
    """One message kept apart, in a transaction of its own."""
    counts: dict[str, int] = {}
    with conn.transaction():
        _quarantine(conn, msg, why, counts)
    return Outcome(0, counts)


# --------------------------------------------------------------------------- queries


#: a hold's overlap with the window [%(since)s, %(until)s], in nanoseconds: ``chargeback.overlap``
#: (an open hold counts to the window's end), in bigint arithmetic (exact)
OVERLAP = (
    "greatest(0, least(coalesce(end_ns, %(until)s::bigint), %(until)s::bigint) - greatest(start_ns, %(since)s::bigint))"
)


#: each node log's gaps that hide holds (``chargeback.HIDING``), clipped to the window (an open one
#: runs to its end) and merged where they overlap, per (node, log_id): ``chargeback.merged``
MERGED_GAPS = """
    clipped AS (
        SELECT node, log_id, greatest(since_ns, %(since)s::bigint) AS lo,
               least(CASE WHEN until_ns = 0 THEN %(until)s::bigint ELSE until_ns END, %(until)s::bigint) AS hi
        FROM gaps WHERE source = ANY(%(hiding)s)
    ),
    marked AS (
        SELECT node, log_id, lo, hi,
               CASE WHEN lo <= max(hi) OVER (PARTITION BY node, log_id ORDER BY lo, hi
                                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                    THEN 0 ELSE 1 END AS starts
        FROM clipped WHERE lo < hi
    ),
    islands AS (
        SELECT node, log_id, lo, hi,
               sum(starts) OVER (PARTITION BY node, log_id ORDER BY lo, hi ROWS UNBOUNDED PRECEDING) AS island
        FROM marked
    ),
    merged AS (SELECT node, log_id, min(lo) AS lo, max(hi) AS hi FROM islands GROUP BY node, log_id, island)
"""
#: a hold's nanoseconds inside the window and inside its node log's merged gaps: ``Gaps.covered``
IN_GAPS = (
    "coalesce((SELECT sum(greatest(0, least(m.hi, coalesce(h.end_ns, %(until)s::bigint), %(until)s::bigint)"
    " - greatest(m.lo, h.start_ns, %(since)s::bigint))) FROM merged m"
    " WHERE m.node = h.node AND m.log_id = h.log_id), 0)"
)


def usage_totals(conn: psycopg.Connection[Any], by: str, w: Window, resources: frozenset[str]) -> list[Row]:
    """``fleet usage``: nanoseconds per group inside the window, and those inside the node's
    gaps, summed in SQL with the node's own arithmetic (``OVERLAP``, ``IN_GAPS``; the sums
    numerics, exact), grouped by the group's columns (``FLEET_FIELDS`` or ``chargeback.FIELDS``);
    groups with none left out, sorted as ``chargeback.totals`` sorts (in Python, on the
    unescaped text: the rows after the aggregate are few). The holds that can overlap the
    window are picked by ``holds_by_end`` (and ``holds_by_device`` for ``--resource``). A
    property test holds it equal to ``chargeback.totals`` with each node's gaps
    (tests/fleet/test_fleet_usage_sql.py, ADR 0031)."""
    columns = FLEET_FIELDS.get(by) or FIELDS[by]
    group = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    where = f"h.start_ns < %(until)s::bigint AND {HOLD_END} > %(since)s::bigint"
    params: dict[str, Any] = {"since": w.since_ns, "until": w.until_ns, "hiding": sorted(HIDING)}
    if resources:
        where += " AND h.resource = ANY(%(resources)s)"
        params["resources"] = sorted(pg_text(r) for r in resources)
    query = sql.SQL(
        "WITH {gaps} SELECT {group}, sum(ns), sum(gap_ns) FROM ("
        "SELECT {held}, {overlap} * amount AS ns, {in_gaps} * amount AS gap_ns FROM holds h WHERE {where}"
        ") held GROUP BY {group} HAVING sum(ns) > 0"
    ).format(
        gaps=sql.SQL(MERGED_GAPS),
        group=group,
        held=sql.SQL(", ").join(sql.SQL("h.{}").format(sql.Identifier(c)) for c in columns),
        overlap=sql.SQL(OVERLAP),
        in_gaps=sql.SQL(IN_GAPS),
        where=sql.SQL(where),
    )
    rows = conn.execute(query, params).fetchall()
    u = from_pg_text
    return sorted(Row(tuple(u(v) for v in row[:-2]), int(row[-2]), int(row[-1])) for row in rows)


#: ``fleet usage --by`` groups that name the node first (two nodes' devices may share an id), and
#: the node's own ``audit usage --by`` that gives each node's part
NODE_GROUPS = {"node": "resource", "device": "device"}
#: the fields of ``fleet usage``'s rows, where they differ from ``audit usage``'s
FLEET_FIELDS = {by: ("node", *FIELDS[own]) for by, own in NODE_GROUPS.items()}
