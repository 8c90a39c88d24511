"""``fleet usage`` in SQL: the holds' nanoseconds in a window and inside each node log's gaps,
summed by PostgreSQL with the nodes' own arithmetic (``chargeback``), grouped as ``audit usage``
groups them (ADR 0031; a property test holds the two equal)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from eventsrc.core.chargeback import FIELDS, HIDING, HOUR_NS, LONG_NS, Row, Window
from eventsrc.fleet.nul_escape import from_pg_text, pg_text
from eventsrc.fleet.tables import HOLD_AREA, HOLD_END

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
    """``fleet usage``'s rows: from the hourly rollup for the groups it keeps (``ROLLED``), else
    from every hold of the window (``held_totals``); the same answer either way (a property test
    holds both to ``chargeback.totals``)."""
    if by in ROLLED:
        return rolled_totals(conn, by, w, resources)
    return held_totals(conn, by, w, resources)


#: the ``--by`` groups ``usage_hours`` answers (their columns are among its own: resource, namespace)
ROLLED = frozenset({"namespace", "resource"})
#: the fleet-wide x of ``HOLD_AREA`` (every node log's hash)
_EVERY_LOG = "point(-2147483648, {t}), point(2147483647, {u})"
#: seconds a box of ``HOLD_AREA`` is widened by: more than a float8's step at these times
_MARGIN = "0.001"


def rolled_totals(conn: psycopg.Connection[Any], by: str, w: Window, resources: frozenset[str]) -> list[Row]:
    """``fleet usage --by namespace|resource`` without reading every hold of the window (ADR 0046):
    the whole hours inside it from ``usage_hours`` (the closed holds' nanoseconds by hour, the
    sink's), and by themselves: the closed holds that overlap the parts of an hour at its start
    and end (found by ``holds_area``), the closed ones too long for the rollup (``holds_long``),
    the open ones, and the seconds inside each node log's gaps (its holds in each merged gap,
    found by ``holds_area`` in that log). The nodes' own arithmetic, exact (numeric sums)."""
    since, until = w.since_ns, w.until_ns
    if until <= since:
        return []
    h1, h2 = -(-since // HOUR_NS), until // HOUR_NS  # the whole hours inside: [h1, h2)
    if h1 > h2:
        slices, hours = [(since, until)], None
    else:
        slices = [(a, b) for a, b in ((since, h1 * HOUR_NS), (h2 * HOUR_NS, until)) if a < b]
        hours = (h1, h2) if h1 < h2 else None
    params: dict[str, Any] = {
        "since": since,
        "until": until,
        "hiding": sorted(HIDING),
        "resources": sorted(pg_text(r) for r in resources),
    }
    only = " AND resource = ANY(%(resources)s)" if resources else ""
    parts: list[str] = []
    if hours is not None:
        params |= {"h1": hours[0], "h2": hours[1], "lo": hours[0] * HOUR_NS, "hi": hours[1] * HOUR_NS}
        parts.append(
            "SELECT resource, namespace, ns, 0::numeric AS gap_ns FROM usage_hours "
            f"WHERE hour >= %(h1)s AND hour < %(h2)s{only}"
        )
        parts.append(
            "SELECT resource, namespace, (least(end_ns, %(hi)s) - greatest(start_ns, %(lo)s))::numeric * amount, 0 "
            f"FROM holds WHERE end_ns IS NOT NULL AND end_ns - start_ns > {LONG_NS} AND start_ns < %(hi)s "
            f"AND end_ns > %(lo)s{only}"
        )
    for n, (a, b) in enumerate(slices):
        params |= {f"a{n}": a, f"b{n}": b}
        box = _EVERY_LOG.format(
            t=f"%(a{n})s::float8 / 1e9::float8 - {_MARGIN}", u=f"%(b{n})s::float8 / 1e9::float8 + {_MARGIN}"
        )
        parts.append(
            f"SELECT resource, namespace, (least(end_ns, %(b{n})s) - greatest(start_ns, %(a{n})s))::numeric * amount, "
            f"0 FROM holds WHERE {HOLD_AREA} && box({box}) AND end_ns IS NOT NULL "
            f"AND start_ns < %(b{n})s AND end_ns > %(a{n})s{only}"
        )
    parts.append(
        "SELECT resource, namespace, (%(until)s - greatest(start_ns, %(since)s))::numeric * amount, 0 "
        f"FROM holds WHERE end_ns IS NULL AND start_ns < %(until)s{only}"
    )
    x = "hashtext(g_node || ' ' || g_log)"
    in_gap = f"box(point({x}, lo::float8 / 1e9::float8 - {_MARGIN}), point({x}, hi::float8 / 1e9::float8 + {_MARGIN}))"
    gaps = "FROM (SELECT node AS g_node, log_id AS g_log, lo, hi FROM merged) m JOIN holds "
    gaps += "ON node = g_node AND log_id = g_log"
    # the closed holds in each merged gap of their node log (``holds_area``), then the open ones (``holds_open``)
    parts.append(
        "SELECT resource, namespace, 0, (least(hi, end_ns, %(until)s) - greatest(lo, start_ns, %(since)s))::numeric "
        f"* amount {gaps} AND {HOLD_AREA} && {in_gap} AND end_ns IS NOT NULL AND start_ns < hi AND end_ns > lo{only}"
    )
    parts.append(
        "SELECT resource, namespace, 0, (least(hi, %(until)s) - greatest(lo, start_ns, %(since)s))::numeric "
        f"* amount {gaps} AND end_ns IS NULL AND start_ns < hi{only}"
    )
    columns = FIELDS[by]
    group = ", ".join(columns)
    query = (
        f"WITH {MERGED_GAPS} SELECT {group}, sum(ns), sum(gap_ns) FROM ("
        + " UNION ALL ".join(parts)
        + f") t(resource, namespace, ns, gap_ns) GROUP BY {group} HAVING sum(ns) > 0"
    )
    rows = conn.execute(query, params).fetchall()  # type: ignore[call-overload]
    text = from_pg_text
    return sorted(Row(tuple(text(v) for v in row[:-2]), int(row[-2]), int(row[-1])) for row in rows)


def held_totals(conn: psycopg.Connection[Any], by: str, w: Window, resources: frozenset[str]) -> list[Row]:
    """``fleet usage`` from every hold of the window: nanoseconds per group inside it, and those
    inside the node's gaps, summed in SQL with the node's own arithmetic (``OVERLAP``, ``IN_GAPS``; the sums
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
        "SELECT {held}, ({overlap})::numeric * amount AS ns, ({in_gaps})::numeric * amount AS gap_ns "
        "FROM holds h WHERE {where}"
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
