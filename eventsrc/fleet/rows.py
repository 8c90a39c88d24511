"""The rows the sink makes of the nodes' messages, in one transaction a fetch (``store_many``):
each message checked (``core.shipped_records``) and stored once as its node's record, kept
apart with its reason (``quarantine``), or waiting for the record it follows (``pending``);
then, in each node log's order under a lock on its ``node_logs`` row, what the node's own pure
code derives from its records: the holds and gaps (``chargeback``), the audit index
(``log.index``) and the claim preparations."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec
import psycopg
from psycopg.types.json import Jsonb

from eventsrc.core.chargeback import Hold, Tracker, UsageState
from eventsrc.core.claim_preparations import PreparationChange, Preparations, PreparationsState
from eventsrc.core.fleet_names import DEFAULT_PREFIX, FOLLOWS, Node
from eventsrc.core.shipped_records import (
    PAYLOAD,
    Candidate,
    Refusal,
    Stored,
    candidate,
    check_message,
    settle,
)
from eventsrc.events import (
    CorruptRecordError,
    FutureRecordError,
    ObservationGapFound,
    Record,
    chain_hash,
    decode_record,
    prev_hash_of,
)
from eventsrc.fleet.nul_escape import _has_nul, escape_json, from_pg_text, pg_text
from eventsrc.log.index import keys_for
from eventsrc.offline.render import record_json

#: records a statement or a fetch takes at most
BATCH = 256

#: the payloads kept apart as no record that follow one of a fetch's records: a record waiting on
#: one of them may now be vouched for it (``shipped_records.settle``)
DAMAGED_AFTER = (
    f"SELECT seq FROM quarantine WHERE node = %s AND log_id = %s AND kind = '{PAYLOAD}' "
    f"AND headers->>'{FOLLOWS}' = ANY(%s)"
)

_state = msgspec.msgpack.Encoder()
_state_of = msgspec.msgpack.Decoder(UsageState)
_preparations_of = msgspec.msgpack.Decoder(PreparationsState)


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
        insert_rows(
            conn,
            f"INSERT INTO records ({RECORD_COLUMNS})",
            [record_row(node.name, node.log_id, c.seq, c.follows, c.data) for c in decision.store],
            " ON CONFLICT DO NOTHING",
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
    opened = _Opened(conn, node, log_id)
    for seq, data in chain:
        try:
            record = decode_record(seq, data)
        except CorruptRecordError:
            continue  # named corrupt in records; it changes nothing derived (as on the node)
        keys += index_rows(node, log_id, record)
        for hold, end_ns in tracker.feed(record.ts_ns, record.event) if tracker is not None else ():
            if end_ns is None:
                opened.add(hold)
            else:
                opened.flush()  # an end may be of a hold this chain opened: its row first
                _hold_ended(conn, node, log_id, hold, end_ns)
        if tracker is not None and tracker.rebound:
            opened.flush()
            for was, now in tracker.rebound:
                _rebind(conn, node, log_id, was, now)
        for change in preparations.feed(seq, record.ts_ns, record.event):
            _preparation(conn, node, log_id, change)
        if tracker is not None and isinstance(record.event, ObservationGapFound):
            _gap(conn, node, log_id, record.event)
    opened.flush()
    insert_rows(conn, "INSERT INTO audit_index (key, node, log_id, seq)", keys, " ON CONFLICT DO NOTHING")


#: rows a multi-row INSERT takes at most (its parameters stay far under PostgreSQL's 65,535)
ROWS_A_STATEMENT = 500


def insert_rows(conn: psycopg.Connection[Any], head: str, rows: Sequence[Sequence[Any]], tail: str = "") -> None:
    """``head VALUES (...), (...) tail``: the rows in as few statements as ``ROWS_A_STATEMENT``
    allows (one round trip each, where ``executemany`` makes one execution a row)."""
    for start in range(0, len(rows), ROWS_A_STATEMENT):
        part = rows[start : start + ROWS_A_STATEMENT]
        values = ", ".join(["(" + ", ".join(["%s"] * len(part[0])) + ")"] * len(part))
        conn.execute(f"{head} VALUES {values}{tail}", [v for row in part for v in row])


class _Opened:
    """The holds a chain opens, inserted together (``flush``) before anything that may read
    them: an end, a uid learned, the chain's end."""

    def __init__(self, conn: psycopg.Connection[Any], node: str, log_id: str) -> None:
        self.conn, self.node, self.log_id = conn, node, log_id
        self.rows: list[tuple[Any, ...]] = []

    def add(self, h: Hold) -> None:
        self.rows.append(
            (
                self.node,
                self.log_id,
                pg_text(h.resource),
                pg_text(h.device),
                pg_text(h.namespace),
                pg_text(h.name),
                pg_text(h.uid),
                h.start_ns,
                h.amount,
            )
        )

    def flush(self) -> None:
        if self.rows:
            head = "INSERT INTO holds (node, log_id, resource, device, namespace, name, uid, start_ns, amount)"
            insert_rows(self.conn, head, self.rows)
            self.rows = []


def _hold_ended(conn: psycopg.Connection[Any], node: str, log_id: str, hold: Hold, end_ns: int) -> None:
    """One of the open rows alike (two containers may hold alike) ends."""
    conn.execute(
        "UPDATE holds SET end_ns = %s WHERE id = (SELECT id FROM holds WHERE node = %s "
        "AND log_id = %s AND resource = %s AND device = %s AND uid = %s AND start_ns = %s "
        "AND end_ns IS NULL ORDER BY id LIMIT 1)",
        (end_ns, node, log_id, pg_text(hold.resource), pg_text(hold.device), pg_text(hold.uid), hold.start_ns),
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


def quarantine_one(conn: psycopg.Connection[Any], msg: Message, why: Refusal) -> Outcome:
    """One message kept apart, in a transaction of its own."""
    counts: dict[str, int] = {}
    with conn.transaction():
        _quarantine(conn, msg, why, counts)
    return Outcome(0, counts)
