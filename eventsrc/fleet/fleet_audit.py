"""``eventsrc fleet audit device|pod|claim``: each node's own ``audit`` answer, from PostgreSQL.

The sink keeps, for every record it applies, the keys the node's log indexes it under
(``log.index.keys_for``, the node's own pure function) in ``audit_index``. ``LogReader`` reads
one node's log through that table and ``records``, and is the ``Reader`` the node's own audit
queries (``offline.audit_queries``) take: so each node's answer here is the node's answer,
made by the same code from the same records, not a second implementation.

The fleet's answer is the union of the nodes' answers: one answer per node log (node name and
log id) whose index names the device, pod or claim, each as the node gives it, ordered by node
and log id. ``--node N`` keeps that node's. What the nodes' audits read is read first for every
node log at once (``prefetch``: a fixed number of queries, not a round of them per node), and
each node's audit runs over it (``Prefetched``), asking its ``LogReader`` only for what was not
read. Everything is read in one repeatable-read, read-only
transaction, so an answer never mixes two moments of the sinks' writing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
import psycopg

from eventsrc import events as ev
from eventsrc.errors import EventsrcError
from eventsrc.events import CorruptRecordError, decode_record
from eventsrc.log.index import claim_prefix, device_prefix, name_prefix, observation_prefix, pod_prefix
from eventsrc.offline.audit_queries import (
    ClaimHistory,
    DeviceTimeline,
    LogStart,
    NotInLogError,
    PodHistory,
    claim_history,
    device_timeline,
    pod_history,
)


class LogReader:
    """One node log's records as the sink applied them, read as the node's audit reads its log
    (``log.history.Reader``): the index from ``audit_index``, the records' bytes from ``records``
    (decoded and checked by the log's own ``decode_record``)."""

    def __init__(self, conn: psycopg.Connection[Any], node: str, log_id: str) -> None:
        self.conn, self.node, self.log_id = conn, node, log_id

    def index_seqs(self, prefix: bytes, from_seq: int = 1, until_seq: int | None = None) -> list[int]:
        query = "SELECT seq FROM audit_index WHERE key = %s AND node = %s AND log_id = %s AND seq >= %s"
        params: list[Any] = [prefix, self.node, self.log_id, from_seq]
        if until_seq is not None:
            query += " AND seq <= %s"
            params.append(until_seq)
        return [int(r[0]) for r in self.conn.execute(query + " ORDER BY seq", params)]

    def read_many(self, seqs: Iterable[int]) -> list[ev.Record | CorruptRecordError]:
        wanted = list(seqs)
        rows = self.conn.execute(
            "SELECT seq, data FROM records WHERE node = %s AND log_id = %s AND seq = ANY(%s)",
            (self.node, self.log_id, wanted),
        ).fetchall()
        data = {int(seq): bytes(value) for seq, value in rows}
        out: list[ev.Record | CorruptRecordError] = []
        for seq in wanted:
            if seq not in data:
                out.append(CorruptRecordError(seq, "missing"))
                continue
            try:
                out.append(decode_record(seq, data[seq]))
            except CorruptRecordError as err:
                out.append(err)
        return out


class Prefetched:
    """A node log's ``Reader`` over what one pass over every node log read (``prefetch``): the
    index sequences of the keys read, and the records. A key or record not read is asked of the
    node's ``LogReader`` (then kept), so the answer is the node's own whatever it reads."""

    def __init__(self, log: LogReader) -> None:
        self.log = log
        self.index: dict[bytes, list[int]] = {}
        self.records: dict[int, ev.Record | CorruptRecordError] = {}
        self.start: LogStart | None = None

    def index_seqs(self, prefix: bytes, from_seq: int = 1, until_seq: int | None = None) -> list[int]:
        if prefix not in self.index:
            self.index[prefix] = self.log.index_seqs(prefix)
        return [s for s in self.index[prefix] if s >= from_seq and (until_seq is None or s <= until_seq)]

    def read_many(self, seqs: Iterable[int]) -> list[ev.Record | CorruptRecordError]:
        wanted = list(seqs)
        if missing := [s for s in wanted if s not in self.records]:
            self.records.update(zip(missing, self.log.read_many(missing), strict=True))
        return [self.records[s] for s in wanted]


def _index(conn: psycopg.Connection[Any], logs: dict[tuple[str, str], Prefetched], keys: Iterable[bytes]) -> None:
    """One query: every node log's index sequences under ``keys`` (each key kept, found or not)."""
    keys = [k for k in dict.fromkeys(keys) if any(k not in p.index for p in logs.values())]
    if not keys or not logs:
        return
    nodes, ids = zip(*logs, strict=True)
    rows = conn.execute(
        "SELECT a.key, a.node, a.log_id, a.seq FROM audit_index a "
        "JOIN unnest(%s::text[], %s::text[]) AS l(node, log_id) ON a.node = l.node AND a.log_id = l.log_id "
        "WHERE a.key = ANY(%s) ORDER BY a.node, a.log_id, a.key, a.seq",
        (list(nodes), list(ids), keys),
    ).fetchall()
    found: dict[tuple[str, str, bytes], list[int]] = {}
    for key, node, log_id, seq in rows:
        found.setdefault((node, log_id, bytes(key)), []).append(int(seq))
    for (node, log_id), p in logs.items():
        for key in keys:
            p.index[key] = found.get((node, log_id, key), [])


def _records(conn: psycopg.Connection[Any], logs: dict[tuple[str, str], Prefetched]) -> None:
    """One query: every record the logs' index sequences name that is not read yet."""
    want = [
        (n, i, s) for (n, i), p in logs.items() for s in {s for ss in p.index.values() for s in ss} - p.records.keys()
    ]
    if not want:
        return
    nodes, ids, seqs = (list(x) for x in zip(*want, strict=True))
    rows = conn.execute(
        "SELECT r.node, r.log_id, r.seq, r.data FROM records r "
        "JOIN unnest(%s::text[], %s::text[], %s::bigint[]) AS w(node, log_id, seq) "
        "ON r.node = w.node AND r.log_id = w.log_id AND r.seq = w.seq",
        (nodes, ids, seqs),
    ).fetchall()
    for node, log_id, seq, data in rows:
        try:
            logs[(node, log_id)].records[int(seq)] = decode_record(int(seq), bytes(data))
        except CorruptRecordError as err:
            logs[(node, log_id)].records[int(seq)] = err
    for node, log_id, seq in want:  # named by the index and not stored: as LogReader says it
        logs[(node, log_id)].records.setdefault(seq, CorruptRecordError(seq, "missing"))


def _keys_named(p: Prefetched) -> set[bytes]:
    """The index keys of the pods the records read so far name (by uid, and by name where a
    record names one: a pod observed beside a kubelet is found by its name), which the audits
    read next to name a holder, and the gaps' key (``observation_prefix``)."""
    keys = {observation_prefix()}
    for r in p.records.values():
        if not isinstance(r, ev.Record):
            continue
        pod = getattr(r.event, "pod", None)
        ref = pod if isinstance(pod, ev.PodRef) else None
        uid = getattr(r.event, "pod_uid", "") or (ref.uid if ref is not None else "")
        if uid:
            keys.add(pod_prefix(uid))
        if ref is not None and ref.name:
            keys.add(name_prefix(ref.namespace, ref.name))
    return keys


def _starts(conn: psycopg.Connection[Any], logs: dict[tuple[str, str], Prefetched]) -> None:
    """One query: what each log lacks (``LogReader.log_start``)."""
    if not logs:
        return
    nodes, ids = zip(*logs, strict=True)
    skips: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for node, log_id, seq, follows in conn.execute(
        "SELECT r.node, r.log_id, r.seq, r.follows FROM records r JOIN node_logs l USING (node, log_id) "
        "JOIN unnest(%s::text[], %s::text[]) AS w(node, log_id) ON r.node = w.node AND r.log_id = w.log_id "
        "WHERE r.follows <> r.seq - 1 AND r.seq <= l.applied_seq ORDER BY r.node, r.log_id, r.seq",
        (list(nodes), list(ids)),
    ).fetchall():
        skips.setdefault((node, log_id), []).append((int(seq), int(follows)))
    for where, p in logs.items():
        p.start = _log_start(skips.get(where, []))


def _log_start(skips: list[tuple[int, int]]) -> LogStart | None:
    if not skips:
        return None
    missing = [f"records {follows + 1}..{seq - 1} (never shipped)" for seq, follows in skips]
    first = skips[0][0] if skips[0][1] == 0 else 1
    return LogStart(first_seq=first, live_first_seq=first, archive_segments=0, live_only=False, missing=missing)


def prefetch(conn: psycopg.Connection[Any], key: bytes, node: str = "") -> dict[tuple[str, str], Prefetched]:
    """Every node log whose index names ``key`` (``node``: only its), with what the node's audit
    of it reads, in a fixed number of queries whatever the number of logs: the logs and their
    index sequences under ``key``, those records, then twice the index and records of the pods
    they name (each holder's name) and of the gaps, then what each log lacks."""
    query = "SELECT DISTINCT node, log_id FROM audit_index WHERE key = %s"
    params: list[Any] = [key]
    if node:
        query += " AND node = %s"
        params.append(node)
    logs = {
        (n, i): Prefetched(LogReader(conn, n, i))
        for n, i in conn.execute(query + " ORDER BY node, log_id", params).fetchall()
    }
    _index(conn, logs, [key])
    _records(conn, logs)
    for _ in range(_ROUNDS):  # the pods named, then those their names' records name
        _index(conn, logs, sorted({k for p in logs.values() for k in _keys_named(p)}))
        _records(conn, logs)
    _starts(conn, logs)
    return logs


#: rounds of ``prefetch`` after the key's own: a holder named by uid or by name, then the pod
#: a name's records give
_ROUNDS = 2


Answer = DeviceTimeline | PodHistory | ClaimHistory


@dataclass
class NodeAnswer:
    node: str
    log_id: str
    answer: Answer


def answers(conn: psycopg.Connection[Any], what: str, args: Any) -> list[NodeAnswer]:
    """Each node log's own answer to ``audit device|pod|claim`` (``args`` as the command has
    them), in one read-only snapshot. NotInLogError when no node has one."""
    from eventsrc.offline.audit_queries import parse_point

    if what == "device":
        key, subject = device_prefix(args.resource, args.device_id), f"device {args.device_id} of {args.resource}"
        since, until = parse_point(args.since, "--since"), parse_point(args.until, "--until")
    elif what == "pod":
        if "/" in args.pod:
            key, subject = name_prefix(*args.pod.split("/", 1)), f"pod {args.pod}"
        else:
            key, subject = pod_prefix(args.pod), f"pod with uid {args.pod}"
    else:
        key, subject = claim_prefix(args.claim), f"claim with uid {args.claim}"

    def ask(log: Prefetched) -> Answer:
        if what == "device":
            return device_timeline(
                log, args.resource, args.device_id, since.ts_ns, until.ts_ns, since_seq=since.seq, until_seq=until.seq
            )
        if what == "pod":
            return pod_history(log, args.pod)
        return claim_history(log, args.claim)

    conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
    conn.set_read_only(True)
    out: list[NodeAnswer] = []
    try:
        with conn.transaction():
            for (node, log_id), log in prefetch(conn, key, args.node or "").items():
                try:
                    answer = ask(log)
                except NotInLogError:
                    continue  # named only by records that say nothing of it (as on the node)
                answer.log = log.start
                out.append(NodeAnswer(node, log_id, answer))
    except psycopg.errors.UndefinedTable:
        raise EventsrcError(
            "this database has no fleet audit tables: 'eventsrc fleet sink' makes them (schema version 2)"
        ) from None
    if not out:
        raise NotInLogError(f"no {subject} on " + (f"node {args.node}" if args.node else "any node"))
    return out


def answers_json(found: list[NodeAnswer]) -> bytes:
    """``fleet audit -o json``: an array of the nodes' answers, each the node's JSON object with
    ``node`` and ``log_id`` first."""
    out = [{"node": a.node, "log_id": a.log_id, **msgspec.to_builtins(a.answer)} for a in found]
    return msgspec.json.encode(out) + b"\n"
