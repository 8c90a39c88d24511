"""The fleet's tables in PostgreSQL and their versions (docs/fleet.md, "The schema's versions"):
each version's SQL (or a function run in the migration's transaction) in ``MIGRATIONS``, and
``migrate``, which brings a database to ``SCHEMA_VERSION`` once, whatever sinks start at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from eventsrc.core.chargeback import HOUR_NS, LONG_NS
from eventsrc.core.fleet_names import FOLLOWS
from eventsrc.core.shipped_records import (
    PAYLOAD,
)
from eventsrc.errors import EventsrcError
from eventsrc.fleet.rows import _backfill

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

#: Version 7: the record a node log's trackers' state as written is at (``rows.SNAPSHOT_EVERY``;
#: until now every fetch wrote it at the applied record)
_V7 = """
    ALTER TABLE node_logs ADD COLUMN state_seq bigint NOT NULL DEFAULT 0;
    UPDATE node_logs SET state_seq = applied_seq;
    """

#: a closed hold's place for the index ``holds_area`` (GiST, built in; open holds are few, and
#: ``holds_open`` has them): a box of its node log (a hash of it, on x) and its time (seconds, on
#: y). A window of time is found across the fleet (every x) or in one node log (its x); its holds
#: are then taken by their exact times and node log (a float8 has 0.24 µs steps at these times,
#: the hash collides)
HOLD_AREA = (
    "box(point(hashtext(node || ' ' || log_id), start_ns::float8 / 1e9::float8), "
    "point(hashtext(node || ' ' || log_id), coalesce(end_ns, 9223372036854775807)::float8 / 1e9::float8))"
)

#: Version 8: ``fleet usage``'s rollup (ADR 0046): each closed hold's nanoseconds (times its amount)
#: inside each hour, summed by resource, namespace and hour (``usage_hours``; the sink adds a
#: fetch's in its transaction), the holds by their place in time and node log (``HOLD_AREA``),
#: and the closed holds too long for the rollup (``chargeback.LONG_NS``)
_V8 = f"""
    CREATE TABLE usage_hours (
        resource text NOT NULL,
        namespace text NOT NULL,
        hour bigint NOT NULL,
        ns numeric NOT NULL,
        PRIMARY KEY (resource, namespace, hour)
    );
    CREATE INDEX holds_area ON holds USING gist (({HOLD_AREA})) WHERE end_ns IS NOT NULL;
    CREATE INDEX holds_long ON holds (end_ns) WHERE end_ns - start_ns > {LONG_NS};
    """


def _to_v8(conn: psycopg.Connection[Any]) -> None:
    conn.execute(_V8)
    rebuild_usage_hours(conn)


def rebuild_usage_hours(conn: psycopg.Connection[Any]) -> None:
    """``usage_hours`` made again from the closed holds (the migration; and a load that wrote
    ``holds`` directly), as the sink keeps it (``chargeback.hour_shares``)."""
    conn.execute("TRUNCATE usage_hours")
    conn.execute(
        "INSERT INTO usage_hours (resource, namespace, hour, ns) "
        "SELECT resource, namespace, hr, sum((least(end_ns::numeric, (hr + 1)::numeric * %(h)s) "
        "- greatest(start_ns::numeric, hr::numeric * %(h)s)) * amount) "
        "FROM holds CROSS JOIN LATERAL generate_series(start_ns / %(h)s, (end_ns - 1) / %(h)s) AS hr "
        "WHERE end_ns IS NOT NULL AND end_ns > start_ns AND end_ns - start_ns <= %(long)s GROUP BY 1, 2, 3",
        {"h": HOUR_NS, "long": LONG_NS},
    )


#: MIGRATIONS[v] takes the schema from version v to v + 1 (docs/fleet.md): SQL, or a function
#: that runs in the migration's transaction
MIGRATIONS: tuple[str | Callable[[psycopg.Connection[Any]], None], ...] = (
    _V1,
    _to_v2,
    _V3,
    _V4,
    _V5,
    _V6,
    _V7,
    _to_v8,
)
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
