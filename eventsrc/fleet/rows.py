"""The rows the sink makes of the nodes' messages, in one transaction a fetch (``store_many``):
each message checked (``core.shipped_records``) and stored once as its node's record, kept
apart with its reason (``quarantine``), or waiting for the record it follows (``pending``);
then, in each node log's order under a lock on its ``node_logs`` row, what the node's own pure
code derives from its records: the holds and gaps (``chargeback``), the audit index
(``log.index``) and the claim preparations."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import msgspec
import psycopg
from psycopg.types.json import Jsonb

from eventsrc.core.chargeback import Hold, Tracker, UsageState, hour_shares
from eventsrc.core.claim_preparations import Preparations, PreparationsState
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
from eventsrc.errors import EventsrcError
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

#: records a fetch takes at most: the sink has two fetches unacknowledged at once (it fetches
#: one while it stores the other), within the 1,000 JetStream lets a consumer have by default
#: (``max_ack_pending``)
BATCH = 500

#: the payloads kept apart as no record that follow one of a fetch's records: a record waiting on
#: one of them may now be vouched for it (``shipped_records.settle``)
DAMAGED_AFTER = (
    f"SELECT seq FROM quarantine WHERE node = %s AND log_id = %s AND kind = '{PAYLOAD}' "
    f"AND headers->>'{FOLLOWS}' = ANY(%s)"
)

_state = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()
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
    conn: psycopg.Connection[Any],
    messages: Sequence[Shipped | Message],
    prefix: str = DEFAULT_PREFIX,
    states: States | None = None,
) -> Outcome:
    """Messages, in one transaction: each checked (``shipped_records``): what is not a node's record
    is quarantined with the reason; a record that links to the node's stored one before it is
    stored, once; one whose predecessor is not stored yet waits (``pending``); then each node's
    derived rows are made up to its first gap.

    The fetch's node logs are locked first, all at once in (node, log id) order (their
    ``node_logs`` rows), before anything of them is read, so two sinks storing the same messages
    never wait for each other in a cycle, and what one stores the other sees before it decides.
    Each step then reads or writes every node log of the fetch in one statement (a COPY for the
    records and the rows derived from them), however many node logs the fetch holds. ``states``:
    the trackers kept from the sink's fetches before (``States``); a log's is kept again once the
    transaction commits."""
    checked: list[tuple[Message, Candidate | Refusal]] = []
    for m in messages:
        msg = message_of(m, prefix) if isinstance(m, Shipped) else m
        checked.append((msg, check_message(msg.subject, msg.headers, msg.data, prefix)))
    by_log: dict[tuple[str, str], list[tuple[Message, Candidate]]] = {}
    quarantined: dict[str, int] = {}
    with conn.transaction():
        for msg, verdict in checked:
            if isinstance(verdict, Refusal):
                _quarantine(conn, msg, verdict, quarantined)
            else:
                by_log.setdefault((verdict.node.name, verdict.node.log_id), []).append((msg, verdict))
        if not by_log:
            return Outcome(0, quarantined)
        logs = _lock(conn, sorted(by_log))
        stored = _settle_all(conn, by_log, quarantined)
        applied = _apply_following(conn, logs, stored, states or States(0))
    if states is not None:  # committed: the trackers are the logs' as written, and kept
        for key, state in applied.items():
            states.put(key, state)
    return Outcome(len(stored), quarantined)


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


class _Log(NamedTuple):
    """A node log's ``node_logs`` row, locked: what is applied, and the record its trackers'
    state as written is at (``state_seq``: at most ``applied``)."""

    applied: int
    state_seq: int


def _lock(conn: psycopg.Connection[Any], keys: list[tuple[str, str]]) -> dict[tuple[str, str], _Log]:
    """The ``node_logs`` rows of ``keys`` (sorted), made where missing and locked in that order."""
    nodes, ids = [n for n, _ in keys], [i for _, i in keys]
    conn.execute(
        "INSERT INTO node_logs (node, log_id) SELECT * FROM unnest(%s::text[], %s::text[]) ON CONFLICT DO NOTHING",
        (nodes, ids),
    )
    rows = conn.execute(
        "SELECT n.node, n.log_id, n.applied_seq, n.state_seq FROM node_logs n "
        "JOIN unnest(%s::text[], %s::text[]) AS w(node, log_id) ON n.node = w.node AND n.log_id = w.log_id "
        "ORDER BY n.node, n.log_id FOR UPDATE OF n",
        (nodes, ids),
    ).fetchall()
    return {(node, log_id): _Log(int(applied), int(state_seq)) for node, log_id, applied, state_seq in rows}


#: records a node log's applied sequence may run ahead of its trackers' state as written
#: (``node_logs.state_seq``): the sink keeps the state between fetches (``States``) and writes
#: it this often; a sink without it reads it and replays the records after it
SNAPSHOT_EVERY = 256


class _State(NamedTuple):
    applied: int
    tracker: Tracker
    preparations: Preparations


class States:
    """The trackers of the node logs a sink applied last, as they are after each log's applied
    record, so a fetch need not read and write them (at most ``size`` logs, the least recently
    applied dropped). One whose log another sink applied since is not used: the sink reads the
    state as written and replays what follows it (``_trackers``)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._kept: dict[tuple[str, str], _State] = {}

    def get(self, key: tuple[str, str], applied: int) -> _State | None:
        kept = self._kept.pop(key, None)
        return kept if kept is not None and kept.applied == applied else None

    def put(self, key: tuple[str, str], state: _State) -> None:
        self._kept[key] = state
        while len(self._kept) > self.size:
            del self._kept[next(iter(self._kept))]


#: the payloads kept apart as no record that follow one of the fetch's candidates, every node log
#: at once: a record waiting on one of them may now be vouched for it (``shipped_records.settle``)
DAMAGED_AFTER = (
    "SELECT q.node, q.log_id, q.seq FROM quarantine q JOIN unnest(%s::text[], %s::text[], %s::text[]) "
    f"AS w(node, log_id, follows) ON q.node = w.node AND q.log_id = w.log_id AND q.headers->>'{FOLLOWS}' = w.follows "
    f"WHERE q.kind = '{PAYLOAD}'"
)

#: the records waiting in ``pending`` that the fetch's candidates (at ``seqs``, and the damaged
#: payloads that follow them) may settle, every node log at once: those that follow one of
#: them, and those that follow one of these, and so on. Not the others: a forger's records far
#: ahead of the log, however many, are not read again at every fetch.
WAITING_ON = """
    WITH RECURSIVE ready AS (
        SELECT p.id, p.node, p.log_id, p.seq, p.follows, p.data, p.subject, p.headers FROM pending p
            JOIN unnest(%(nodes)s::text[], %(ids)s::text[], %(seqs)s::bigint[]) AS w(node, log_id, seq)
            ON p.node = w.node AND p.log_id = w.log_id AND p.follows = w.seq
        UNION
        SELECT p.id, p.node, p.log_id, p.seq, p.follows, p.data, p.subject, p.headers FROM pending p JOIN ready r
            ON p.node = r.node AND p.log_id = r.log_id AND p.follows = r.seq
    )
    SELECT id, node, log_id, seq, follows, data, subject, headers FROM ready ORDER BY id
    """

#: the stored records at (node, log id, seq) triples, every node log at once
STORED_AT = (
    "SELECT r.node, r.log_id, r.seq, r.data FROM records r JOIN unnest(%s::text[], %s::text[], %s::bigint[]) "
    "AS w(node, log_id, seq) ON r.node = w.node AND r.log_id = w.log_id AND r.seq = w.seq"
)


def _triples(items: Sequence[tuple[str, str, Any]]) -> tuple[str, str, str]:
    """(node, log id, value) triples as three arrays (``pg_array``), for ``unnest``."""
    return pg_array([n for n, _, _ in items]), pg_array([i for _, i, _ in items]), pg_array([v for _, _, v in items])


def pg_array(values: Iterable[str | int | None]) -> str:
    """``values`` as PostgreSQL's array literal (each text quoted, its "\\" and '"' escaped;
    None as NULL), for a parameter cast to an array type: one string where psycopg would dump
    the list element by element in Python."""
    out = []
    for v in values:
        if v is None:
            out.append("NULL")
        elif isinstance(v, int):
            out.append(str(v))
        else:
            out.append('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(out) + "}"


def _stored(data: Any) -> Stored:
    value = bytes(data)
    return Stored(chain_hash(value), prev_hash_of(value))


def _settle_all(
    conn: psycopg.Connection[Any],
    by_log: dict[tuple[str, str], list[tuple[Message, Candidate]]],
    counts: dict[str, int],
) -> dict[tuple[str, str, int], Candidate]:
    """Under the locks on the node logs' rows: each log's candidates and waiting records against
    what is stored (``shipped_records.settle``), read for every log at once; the records stored
    ((node, log id, seq) -> the candidate)."""
    keys = sorted(by_log)
    came: dict[tuple[str, str], dict[Candidate, tuple[Message, int | None]]] = {
        k: {c: (m, None) for m, c in reversed(by_log[k])}
        for k in keys  # the first kept
    }
    seqs = {k: {c.seq for _, c in by_log[k]} for k in keys}
    have_waiting, have_damaged = _kept_apart(conn, keys)
    if asked := [(n, i, str(s)) for (n, i) in keys if (n, i) in have_damaged for s in sorted(seqs[(n, i)])]:
        for node, log_id, seq in conn.execute(DAMAGED_AFTER, _triples(asked)).fetchall():
            seqs[(node, log_id)].add(int(seq))
    nodes, ids, after = _triples([(n, i, s) for (n, i) in keys if (n, i) in have_waiting for s in sorted(seqs[(n, i)])])
    for pid, node, log_id, seq, follows, data, subject, headers in (
        conn.execute(WAITING_ON, {"nodes": nodes, "ids": ids, "seqs": after}).fetchall() if have_waiting else ()
    ):
        c = candidate(Node(node, log_id), seq, follows, bytes(data))
        came[(node, log_id)][c] = (
            Message(from_pg_text(subject), {from_pg_text(k): from_pg_text(v) for k, v in headers.items()}, c.data),
            pid,
        )
    candidates = {
        k: [*(c for c, (_, pid) in came[k].items() if pid is not None), *(c for _, c in by_log[k])] for k in keys
    }
    wanted = [
        (n, i, s)
        for (n, i) in keys
        for s in sorted({c.seq for c in candidates[(n, i)]} | {c.follows for c in candidates[(n, i)] if c.follows})
    ]
    stored: dict[tuple[str, str], dict[int, Stored]] = {k: {} for k in keys}
    for node, log_id, seq, data in conn.execute(STORED_AT, _triples(wanted)).fetchall():
        stored[(node, log_id)][int(seq)] = _stored(data)
    for (node, log_id), cs in candidates.items():  # after a cut it names: a stored record inside the gap refutes it
        for c in cs:
            if c.follows and not c.checked:
                inside = conn.execute(
                    "SELECT seq, data FROM records WHERE node = %s AND log_id = %s AND seq > %s AND seq < %s "
                    "ORDER BY seq LIMIT 1",
                    (node, log_id, c.follows, c.seq),
                ).fetchone()
                if inside is not None:
                    stored[(node, log_id)][int(inside[0])] = _stored(inside[1])
    empty = _empty(conn, [k for k in keys if not stored[k]])
    out: dict[tuple[str, str, int], Candidate] = {}
    store: list[Candidate] = []
    waits: list[tuple[Message, Candidate]] = []
    done: list[int] = []
    for k in keys:
        known = stored[k]
        damaged = _damaged(conn, k, candidates[k], known) if k in have_damaged else []
        decision = settle(candidates[k], known, damaged, empty=k in empty)
        done += [
            pid
            for c in (*decision.store, *decision.same, *(c for c, _ in decision.refuse))
            if c in came[k] and (pid := came[k][c][1]) is not None
        ]
        for c, why in decision.refuse:
            _quarantine(conn, came[k][c][0] if c in came[k] else Message("", {}, c.data), why, counts)
        for c in decision.vouched:
            conn.execute(
                "DELETE FROM quarantine WHERE node = %s AND log_id = %s AND seq = %s AND kind = %s AND data = %s",
                (*k, str(c.seq), PAYLOAD, c.data),
            )
        store += decision.store
        waits += [(came[k][c][0], c) for c in decision.wait if came[k][c][1] is None]
    if done:
        conn.execute("DELETE FROM pending WHERE id = ANY(%s)", (done,))
    if store:
        copy_rows(
            conn,
            "records",
            RECORD_COLUMNS,
            (record_row(c.node.name, c.node.log_id, c.seq, c.follows, c.data, c.record) for c in store),
        )
        out = {(c.node.name, c.node.log_id, c.seq): c for c in store}
    if waits:
        insert_rows(
            conn,
            "INSERT INTO pending (node, log_id, seq, follows, hash, subject, headers, data)",
            [
                (
                    c.node.name,
                    c.node.log_id,
                    c.seq,
                    c.follows,
                    c.hash,
                    pg_text(msg.subject),
                    Jsonb(escape_json(dict(msg.headers))),
                    c.data,
                )
                for msg, c in waits
            ],
            " ON CONFLICT DO NOTHING",
        )
    return out


def _kept_apart(
    conn: psycopg.Connection[Any], keys: list[tuple[str, str]]
) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """Of ``keys``, the node logs with records waiting in ``pending``, and those with payloads
    kept apart as no record (``PAYLOAD``): only theirs are looked for in those tables."""
    rows = conn.execute(
        "SELECT w.node, w.log_id, "
        "EXISTS (SELECT 1 FROM pending p WHERE p.node = w.node AND p.log_id = w.log_id), "
        f"EXISTS (SELECT 1 FROM quarantine q WHERE q.node = w.node AND q.log_id = w.log_id AND q.kind = '{PAYLOAD}') "
        "FROM unnest(%s::text[], %s::text[]) AS w(node, log_id)",
        (pg_array(n for n, _ in keys), pg_array(i for _, i in keys)),
    ).fetchall()
    return {(n, i) for n, i, w, _ in rows if w}, {(n, i) for n, i, _, d in rows if d}


def _empty(conn: psycopg.Connection[Any], keys: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """Of ``keys``, the node logs nothing of which is stored."""
    if not keys:
        return set()
    rows = conn.execute(
        "SELECT w.node, w.log_id FROM unnest(%s::text[], %s::text[]) AS w(node, log_id) "
        "WHERE NOT EXISTS (SELECT 1 FROM records r WHERE r.node = w.node AND r.log_id = w.log_id)",
        ([n for n, _ in keys], [i for _, i in keys]),
    ).fetchall()
    return {(n, i) for n, i in rows}


def _damaged(
    conn: psycopg.Connection[Any], key: tuple[str, str], candidates: list[Candidate], stored: dict[int, Stored]
) -> list[Candidate]:
    """The quarantined payloads at the sequences ``candidates`` follow that are not stored (a
    damaged record a successor may vouch for); ``stored`` takes the records they follow."""
    missing = [str(c.follows) for c in candidates if c.follows and c.follows not in stored]
    if not missing:
        return []
    node = Node(*key)
    damaged = [
        candidate(node, int(seq), int(follows), bytes(data), corrupt=True)
        for seq, follows, data in conn.execute(
            "SELECT seq, headers->>%s, data FROM quarantine WHERE node = %s AND log_id = %s AND seq = ANY(%s) "
            "AND kind = %s",
            (FOLLOWS, *key, missing, PAYLOAD),
        ).fetchall()
    ]
    if before_damaged := [d.follows for d in damaged if d.follows and d.follows not in stored]:  # in place?
        for seq, data in conn.execute(
            "SELECT seq, data FROM records WHERE node = %s AND log_id = %s AND seq = ANY(%s)", (*key, before_damaged)
        ).fetchall():
            stored[int(seq)] = _stored(data)
    return damaged


def _apply_following(
    conn: psycopg.Connection[Any],
    logs: dict[tuple[str, str], _Log],
    stored: dict[tuple[str, str, int], Candidate],
    states: States,
) -> dict[tuple[str, str], _State]:
    """Under the locks on the node logs' rows: each log's stored records that follow its applied
    one without a gap (read for every log at once; the bytes only of those not stored just now),
    fed to the node's own code; then the derived rows, and the logs' applied sequence (and their
    trackers' state, ``SNAPSHOT_EVERY`` records). The trackers after them, by log."""
    keys = sorted(logs)
    following: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for node, log_id, seq, follows in conn.execute(
        "SELECT r.node, r.log_id, r.seq, r.follows FROM records r "
        "JOIN unnest(%s::text[], %s::text[], %s::bigint[]) AS w(node, log_id, applied) "
        "ON r.node = w.node AND r.log_id = w.log_id AND r.seq > w.applied ORDER BY r.node, r.log_id, r.seq",
        _triples([(n, i, logs[(n, i)].applied) for n, i in keys]),
    ).fetchall():
        following.setdefault((node, log_id), []).append((int(seq), int(follows)))
    chains: dict[tuple[str, str], list[int]] = {}
    for k, rows in following.items():
        chain: list[int] = []
        for seq, follows in rows:
            if follows != (chain[-1] if chain else logs[k].applied):
                break  # a gap: the records after it wait for it
            chain.append(seq)
        if chain:
            chains[k] = chain
    if not chains:
        return {}
    data: dict[tuple[str, str, int], bytes] = {}
    if unread := [(n, i, s) for (n, i), chain in chains.items() for s in chain if (n, i, s) not in stored]:
        for node, log_id, seq, value in conn.execute(STORED_AT, _triples(unread)).fetchall():
            data[(node, log_id, int(seq))] = bytes(value)
    trackers, replayed = _trackers(conn, {k: logs[k] for k in chains}, states)
    derived = Derived()
    for k in sorted(chains):
        records: list[Record] = []
        for seq in chains[k]:
            c = stored.get((*k, seq))
            if c is not None and c.record is not None:
                records.append(c.record)
                continue
            try:
                records.append(decode_record(seq, c.data if c is not None else data[(*k, seq)]))
            except CorruptRecordError:
                continue  # named corrupt in records; it changes nothing derived (as on the node)
        derived.feed(*k, records, trackers[k].tracker, trackers[k].preparations)
    derived.write(conn)
    after = {k: _State(chains[k][-1], t.tracker, t.preparations) for k, t in trackers.items()}
    written = [k for k in sorted(chains) if k in replayed or after[k].applied - logs[k].state_seq >= SNAPSHOT_EVERY]
    with conn.cursor() as cur:  # one round trip each (psycopg pipelines executemany)
        cur.executemany(
            "UPDATE node_logs SET applied_seq = %s WHERE node = %s AND log_id = %s",
            [(after[k].applied, *k) for k in sorted(chains) if k not in written],
        )
        cur.executemany(
            "UPDATE node_logs SET applied_seq = %s, state_seq = %s, tracker = %s, preparations = %s "
            "WHERE node = %s AND log_id = %s",
            [
                (
                    after[k].applied,
                    after[k].applied,
                    _state.encode(after[k].tracker.state),
                    _state.encode(after[k].preparations.state),
                    *k,
                )
                for k in written
            ],
        )
    return after


def _trackers(
    conn: psycopg.Connection[Any], logs: dict[tuple[str, str], _Log], states: States
) -> tuple[dict[tuple[str, str], _State], set[tuple[str, str]]]:
    """Each log's trackers after its applied record: kept (``states``), or the state as written
    (at ``state_seq``) with the records of the log's chain after it replayed; and the logs
    replayed so."""
    out: dict[tuple[str, str], _State] = {}
    for k, log in logs.items():
        if (kept := states.get(k, log.applied)) is not None:
            out[k] = kept
    missing = sorted(k for k in logs if k not in out)
    if not missing:
        return out, set()
    for node, log_id, t, p in conn.execute(
        "SELECT n.node, n.log_id, n.tracker, n.preparations FROM node_logs n "
        "JOIN unnest(%s::text[], %s::text[]) AS w(node, log_id) ON n.node = w.node AND n.log_id = w.log_id",
        (pg_array(n for n, _ in missing), pg_array(i for _, i in missing)),
    ).fetchall():
        out[(node, log_id)] = _State(
            logs[(node, log_id)].state_seq,
            Tracker(_state_of.decode(bytes(t)) if t is not None else None),
            Preparations(_preparations_of.decode(bytes(p)) if p is not None else None),
        )
    behind = [k for k in missing if logs[k].state_seq < logs[k].applied]
    if behind:
        rows: dict[tuple[str, str], dict[int, tuple[int, bytes]]] = {}
        for node, log_id, seq, follows, value in conn.execute(
            "SELECT r.node, r.log_id, r.seq, r.follows, r.data FROM records r "
            "JOIN unnest(%s::text[], %s::text[], %s::bigint[], %s::bigint[]) AS w(node, log_id, after, upto) "
            "ON r.node = w.node AND r.log_id = w.log_id AND r.seq > w.after AND r.seq <= w.upto",
            (
                pg_array(n for n, _ in behind),
                pg_array(i for _, i in behind),
                pg_array(logs[k].state_seq for k in behind),
                pg_array(logs[k].applied for k in behind),
            ),
        ).fetchall():
            rows.setdefault((node, log_id), {})[int(seq)] = (int(follows), bytes(value))
        for k in behind:
            _replay(k, out[k], rows.get(k, {}), logs[k])
    return out, set(behind)


def _replay(key: tuple[str, str], state: _State, rows: dict[int, tuple[int, bytes]], log: _Log) -> None:
    """The records of the log's applied chain after ``log.state_seq`` (each names the one it
    follows, back from the applied one), fed to the trackers in order; what they derive was
    written when they were applied. EventsrcError when the stored chain does not lead there
    (records deleted by hand): the sink says so and tries again, as for any database refusal."""
    chain, seq = [], log.applied
    while seq > log.state_seq:
        chain.append(seq)
        if seq not in rows:
            raise EventsrcError(f"node {key[0]} log {key[1]}: record {seq} of its applied chain is not stored")
        seq = rows[seq][0]
    if seq != log.state_seq:
        raise EventsrcError(f"node {key[0]} log {key[1]}: its applied chain does not pass record {log.state_seq}")
    for seq in reversed(chain):
        try:
            record = decode_record(seq, rows[seq][1])
        except CorruptRecordError:
            continue
        state.tracker.feed(record.ts_ns, record.event)
        state.preparations.feed(record.seq, record.ts_ns, record.event)


class _Row:
    """A hold's row as a fetch leaves it: one stored before (``id``) or one it opens (None)."""

    __slots__ = ("changed", "end_ns", "hold", "id", "order", "uid")

    def __init__(self, row_id: int | None, hold: Hold, uid: str, order: tuple[int, int]) -> None:
        self.id, self.hold, self.uid = row_id, hold, uid  # uid: as stored (pg_text)
        self.order = order  # an UPDATE's ORDER BY id: those stored before by id, then those opened in order
        self.end_ns: int | None = None
        self.changed = False  # one stored before: ended or its uid learned in this fetch


#: a hold's row as an end or a uid learned finds it (``_hold_ended``): its node log, resource,
#: device, uid and start, the text as stored
HoldKey = tuple[str, str, str, str, str, int]


def _key(node: str, log_id: str, h: Hold, uid: str | None = None) -> HoldKey:
    return node, log_id, pg_text(h.resource), pg_text(h.device), pg_text(h.uid if uid is None else uid), h.start_ns


class Derived:
    """What records derive, fed in each node log's order (``feed``) and written together
    (``write``): audit index keys, holds opened and ended, uids learned, claim preparations,
    gaps. An end or a uid learned takes, as one ``UPDATE ... ORDER BY id LIMIT 1`` would, the
    first open row alike: those stored before (by id), then those the fetch opens (in order)."""

    def __init__(self) -> None:
        self.keys: list[tuple[bytes, str, str, int]] = []
        #: per node log, in order: ("open", hold, None), ("end", hold, end_ns), ("rebind", was, now)
        self.ops: dict[tuple[str, str], list[tuple[str, Hold, Any]]] = {}
        self.preparations: dict[tuple[str, str, int, str], tuple[Any, ...]] = {}
        self.gaps: dict[tuple[str, str, str, int], int] = {}
        #: (resource, namespace, hour) -> the nanoseconds (times the amount) the holds that
        #: ended hold inside that hour (``usage_hours``, ``fleet.queries``)
        self.hours: dict[tuple[str, str, int], int] = {}

    def feed(
        self, node: str, log_id: str, records: Sequence[Record], tracker: Tracker | None, preparations: Preparations
    ) -> None:
        """One node log's next records, in order (``tracker`` None: not the holds and gaps, whose
        tables a later migration makes)."""
        ops = self.ops.setdefault((node, log_id), [])
        for record in records:
            self.keys += index_rows(node, log_id, record)
            if tracker is not None:
                for hold, end_ns in tracker.feed(record.ts_ns, record.event):
                    ops.append(("open", hold, None) if end_ns is None else ("end", hold, end_ns))
                ops += (("rebind", was, now) for was, now in tracker.rebound)
                if isinstance(record.event, ObservationGapFound):
                    e = record.event
                    key = (node, log_id, pg_text(e.source), e.since_ns)
                    self.gaps[key] = e.until_ns or self.gaps.get(key, 0)
            for change in preparations.feed(record.seq, record.ts_ns, record.event):
                p = change.preparation
                self.preparations[(node, log_id, p.start_seq, pg_text(p.claim_uid))] = (
                    pg_text(p.namespace),
                    pg_text(p.name),
                    pg_text(p.driver),
                    [pg_text(u) for u in p.pods],
                    p.start_ns,
                    change.end_seq,
                    change.end_ns,
                )

    def write(self, conn: psycopg.Connection[Any]) -> None:
        """Every row, a statement (or a COPY) a table; ``usage_hours`` last, its rows in order (it
        is every sink's: after the node logs' locks, its rows' locks are taken in one order, so
        two sinks never wait for each other in a cycle)."""
        self._holds(conn)
        if self.keys:
            copy_rows(conn, "audit_index", "key, node, log_id, seq", self.keys)
        if self.preparations:
            insert_rows(
                conn,
                "INSERT INTO claim_preparations (node, log_id, start_seq, claim_uid, namespace, name, driver, pods, "
                "start_ns, end_seq, end_ns)",
                [(*k, *v) for k, v in self.preparations.items()],
                " ON CONFLICT (node, log_id, start_seq, claim_uid) DO UPDATE SET namespace = EXCLUDED.namespace, "
                "name = EXCLUDED.name, driver = EXCLUDED.driver, pods = EXCLUDED.pods, end_seq = EXCLUDED.end_seq, "
                "end_ns = EXCLUDED.end_ns",
            )
        if self.gaps:  # a gap opened, or closed (a later record of its source and start: ``chargeback.Blind``)
            insert_rows(
                conn,
                "INSERT INTO gaps (node, log_id, source, since_ns, until_ns)",
                [(*k, v) for k, v in self.gaps.items()],
                " ON CONFLICT (node, log_id, source, since_ns) DO UPDATE SET until_ns = "
                "CASE WHEN EXCLUDED.until_ns <> 0 THEN EXCLUDED.until_ns ELSE gaps.until_ns END",
            )
        if self.hours:
            keys = sorted(self.hours)
            conn.execute(
                "INSERT INTO usage_hours (resource, namespace, hour, ns) SELECT * FROM "
                "unnest(%s::text[], %s::text[], %s::bigint[], %s::numeric[]) ORDER BY 1, 2, 3 "
                "ON CONFLICT (resource, namespace, hour) DO UPDATE SET ns = usage_hours.ns + EXCLUDED.ns",
                (
                    pg_array(r for r, _, _ in keys),
                    pg_array(n for _, n, _ in keys),
                    pg_array(h for _, _, h in keys),
                    pg_array(self.hours[k] for k in keys),
                ),
            )

    def _holds(self, conn: psycopg.Connection[Any]) -> None:
        """The holds opened (one COPY), and the rows stored before that ended or learned their
        pod's uid (one UPDATE), found as ``Derived`` says."""
        asked: set[HoldKey] = set()
        for (node, log_id), ops in self.ops.items():
            for kind, hold, other in ops:
                if kind != "open":
                    asked.add(_key(node, log_id, hold))
                if kind == "rebind":
                    asked.add(_key(node, log_id, other))
        rows: dict[HoldKey, list[_Row]] = {}
        if asked:
            cols = [pg_array(col) for col in zip(*sorted(asked), strict=True)]
            found = conn.execute(
                "SELECT h.id, h.node, h.log_id, h.resource, h.device, h.uid, h.start_ns, h.namespace, h.amount "
                "FROM holds h "
                "JOIN unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[]) "
                "AS w(node, log_id, resource, device, uid, start_ns) ON h.node = w.node AND h.log_id = w.log_id "
                "AND h.resource = w.resource AND h.device = w.device AND h.uid = w.uid "
                "AND h.start_ns = w.start_ns WHERE h.end_ns IS NULL ORDER BY h.id",
                cols,
            ).fetchall()
            for row_id, node, log_id, resource, device, uid, start_ns, namespace, amount in found:
                key = (node, log_id, resource, device, uid, int(start_ns))
                hold = Hold(
                    from_pg_text(resource),
                    from_pg_text(device),
                    from_pg_text(namespace),
                    "",
                    from_pg_text(uid),
                    int(start_ns),
                    int(amount),
                )
                rows.setdefault(key, []).append(_Row(int(row_id), hold, uid, (0, int(row_id))))
        opened: list[tuple[str, str, _Row]] = []
        for (node, log_id), ops in self.ops.items():
            for kind, hold, other in ops:
                if kind == "open":
                    new = _Row(None, hold, pg_text(hold.uid), (1, len(opened)))
                    rows.setdefault(_key(node, log_id, hold), []).append(new)
                    opened.append((node, log_id, new))
                    continue
                alike = rows.get(_key(node, log_id, hold), [])
                row = next((r for r in alike if r.end_ns is None), None)
                if row is None:
                    continue  # no open row alike: as an UPDATE that matches none
                row.changed = True
                if kind == "end":
                    row.end_ns = other
                else:  # its pod's uid learned: the row moves to the key of its new uid
                    alike.remove(row)
                    row.uid = pg_text(other.uid)
                    rows.setdefault(_key(node, log_id, hold, other.uid), []).append(row)
                    rows[_key(node, log_id, hold, other.uid)].sort(key=lambda r: r.order)
        if opened:
            copy_rows(
                conn,
                "holds",
                "node, log_id, resource, device, namespace, name, uid, start_ns, end_ns, amount",
                [
                    (
                        node,
                        log_id,
                        pg_text(r.hold.resource),
                        pg_text(r.hold.device),
                        pg_text(r.hold.namespace),
                        pg_text(r.hold.name),
                        r.uid,
                        r.hold.start_ns,
                        r.end_ns,
                        r.hold.amount,
                    )
                    for node, log_id, r in opened
                ],
            )
        ended = [r for _, _, r in opened if r.end_ns is not None]
        ended += [r for rs in rows.values() for r in rs if r.id is not None and r.end_ns is not None]
        for r in ended:  # each closed hold's nanoseconds by hour, for ``usage_hours``
            assert r.end_ns is not None
            resource, namespace = pg_text(r.hold.resource), pg_text(r.hold.namespace)
            for hour, ns in hour_shares(r.hold.start_ns, r.end_ns):
                part = (resource, namespace, hour)
                self.hours[part] = self.hours.get(part, 0) + ns * r.hold.amount
        if before := sorted({r.id: r for rs in rows.values() for r in rs if r.id is not None and r.changed}.items()):
            conn.execute(
                "UPDATE holds h SET end_ns = v.end_ns, uid = v.uid "
                "FROM unnest(%s::bigint[], %s::bigint[], %s::text[]) AS v(id, end_ns, uid) WHERE h.id = v.id",
                (
                    pg_array(i for i, _ in before),
                    pg_array(r.end_ns for _, r in before),
                    pg_array(r.uid for _, r in before),
                ),
            )


#: rows a multi-row INSERT takes at most (its parameters stay far under PostgreSQL's 65,535)
ROWS_A_STATEMENT = 500


def insert_rows(conn: psycopg.Connection[Any], head: str, rows: Sequence[Sequence[Any]], tail: str = "") -> None:
    """``head VALUES (...), (...) tail``: the rows in as few statements as ``ROWS_A_STATEMENT``
    allows (one round trip each, where ``executemany`` makes one execution a row)."""
    for start in range(0, len(rows), ROWS_A_STATEMENT):
        part = rows[start : start + ROWS_A_STATEMENT]
        values = ", ".join(["(" + ", ".join(["%s"] * len(part[0])) + ")"] * len(part))
        conn.execute(f"{head} VALUES {values}{tail}", [v for row in part for v in row])


def copy_rows(conn: psycopg.Connection[Any], table: str, columns: str, rows: Iterable[Sequence[Any]]) -> None:
    """``rows`` into ``table`` (``columns``) with one COPY: for rows that cannot be there yet."""
    with conn.cursor() as cur, cur.copy(f"COPY {table} ({columns}) FROM STDIN") as cp:
        for row in rows:
            cp.write_row(row)


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
    derived = Derived()
    for start in range(0, len(chain), BATCH):
        rows = conn.execute(
            "SELECT seq, data FROM records WHERE node = %s AND log_id = %s AND seq = ANY(%s) ORDER BY seq",
            (node, log_id, chain[start : start + BATCH]),
        ).fetchall()
        records: list[Record] = []
        for seq, data in rows:
            try:
                records.append(decode_record(seq, bytes(data)))
            except CorruptRecordError:
                continue  # named corrupt in records; it changes nothing derived (as on the node)
        derived.feed(node, log_id, records, None, preparations)
    derived.write(conn)
    conn.execute(
        "UPDATE node_logs SET preparations = %s WHERE node = %s AND log_id = %s",
        (_state.encode(preparations.state), node, log_id),
    )


#: the columns of a ``records`` row, in ``record_row``'s order
RECORD_COLUMNS = "node, log_id, seq, follows, type, ts_ns, ts, record, record_escaped, data"
INSERT_RECORD = f"INSERT INTO records ({RECORD_COLUMNS}) VALUES ({', '.join(['%s'] * 10)})"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def record_row(
    node: str, log_id: str, seq: int, follows: int, data: bytes, record: Record | None = None
) -> tuple[Any, ...]:
    """A ``records`` row (``RECORD_COLUMNS``) of one shipped record: decoded and checked by the
    log's own ``decode_record`` (``record``: as it decoded it already); a corrupt one is named so;
    its JSON (text, for a jsonb column) escaped when it holds U+0000."""
    try:
        if record is None:
            record = decode_record(seq, data)
    except CorruptRecordError as exc:
        fields: dict[str, Any] = {"seq": seq, "corrupt": True, "reason": exc.reason}
        kind, ts_ns = "", 0
    else:
        fields, kind, ts_ns = record_json(record), record.type, record.ts_ns
    text = _json.encode(fields)
    escaped = b"\\u0000" in text and _has_nul(fields)  # how JSON writes U+0000 (or a text that reads so)
    if escaped:
        text = _json.encode(escape_json(fields))
    ts = _EPOCH + dt.timedelta(microseconds=ts_ns // 1000)
    return (node, log_id, seq, follows, kind, ts_ns, ts, text.decode(), escaped, data)


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
