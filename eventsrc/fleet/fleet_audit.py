"""``eventsrc fleet audit device|pod|claim``: each node's own ``audit`` answer, from PostgreSQL.

The sink keeps, for every record it applies, the keys the node's log indexes it under
(``log.index.keys_for``, the node's own pure function) in ``audit_index``. ``LogReader`` reads
one node's log through that table and ``records``, and is the ``Reader`` the node's own audit
queries (``offline.audit_queries``) take: so each node's answer here is the node's answer,
made by the same code from the same records, not a second implementation.

The fleet's answer is the union of the nodes' answers: one answer per node log (node name and
log id) whose index names the device, pod or claim, each as the node gives it, ordered by node
and log id. ``--node N`` keeps that node's. Everything is read in one repeatable-read, read-only
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
from eventsrc.log.index import claim_prefix, device_prefix, name_prefix, pod_prefix
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

    def log_start(self) -> LogStart | None:
        """What the fleet lacks of this log (None: every record from 1 to the applied one): the
        records a node never shipped (cut by retention first), found where a record follows
        one that is not the one before it."""
        skips = self.conn.execute(
            "SELECT r.seq, r.follows FROM records r JOIN node_logs l USING (node, log_id) "
            "WHERE r.node = %s AND r.log_id = %s AND r.follows <> r.seq - 1 AND r.seq <= l.applied_seq ORDER BY r.seq",
            (self.node, self.log_id),
        ).fetchall()
        if not skips:
            return None
        missing = [f"records {follows + 1}..{seq - 1} (never shipped)" for seq, follows in skips]
        first = int(skips[0][0]) if skips[0][1] == 0 else 1
        return LogStart(first_seq=first, live_first_seq=first, archive_segments=0, live_only=False, missing=missing)


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

    def ask(log: LogReader) -> Answer:
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
            query = "SELECT DISTINCT node, log_id FROM audit_index WHERE key = %s"
            params: list[Any] = [key]
            if args.node:
                query += " AND node = %s"
                params.append(args.node)
            for node, log_id in conn.execute(query + " ORDER BY node, log_id", params).fetchall():
                log = LogReader(conn, node, log_id)
                try:
                    answer = ask(log)
                except NotInLogError:
                    continue  # named only by records that say nothing of it (as on the node)
                answer.log = log.log_start()
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
