"""``fleet usage`` in SQL: the holds' nanoseconds in a window and inside each node log's gaps,
summed by PostgreSQL with the nodes' own arithmetic (``chargeback``), grouped as ``audit usage``
groups them (ADR 0031; a property test holds the two equal)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from eventsrc.core.chargeback import FIELDS, HIDING, Row, Window
from eventsrc.fleet.nul_escape import from_pg_text, pg_text
from eventsrc.fleet.tables import HOLD_END

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
