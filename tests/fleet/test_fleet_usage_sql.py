"""``fleet usage``'s totals, summed in SQL (``sink.usage_totals``), equal the node's own arithmetic
(``chargeback.totals``) over the same holds, for every ``--by``, with and without ``--resource``
(ADR 0031): random holds, open and closed, with U+0000 and backslashes in their text, on several
nodes and resources, stored in a real PostgreSQL as the sink stores them (``pg_text``), and
windows before, inside, after and across them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventsrc.core.chargeback import (
    HIDING,
    HOUR_NS,
    LONG_NS,
    Change,
    Hold,
    Row,
    Span,
    Window,
    hour_shares,
    merged,
    totals,
)
from eventsrc.fleet.nul_escape import pg_text
from eventsrc.fleet.queries import NODE_GROUPS, usage_totals
from eventsrc.fleet.tables import migrate, rebuild_usage_hours
from tests.support.postgres import PostgresServer

T0 = 1_794_960_000_000_000_000  # 2026-11-18T00:00:00Z
BYS = ("namespace", "node", "pod", "device", "resource")
TEXT = st.text(alphabet="ab\\\0\x01é", max_size=3)  # U+0000 and "\": escaped; é: sorted as Python does
RESOURCES = st.sampled_from(["cpu", "example.com/gpu", "r\\0", "r\0", "é"])


#: half an hour: the hour-scale cases fall on, around and across the rollup's hours
Q = HOUR_NS // 2


def at_hours(low: int, high: int) -> st.SearchStrategy[int]:
    """A time about ``low..high`` half hours after T0 (an hour's start included), to a few ns."""
    return st.tuples(st.integers(low, high), st.sampled_from([0, 0, -1, 1, -37, 53])).map(lambda t: t[0] * Q + t[1])


@st.composite
def holds(draw: st.DrawFn) -> tuple[str, Change]:
    """(node, a hold): from T0 + 0..100 ns, open or lasting 0..60 ns; or at the hours' scale, from
    0..8 half hours after T0, lasting 0..6 of them (``at_hours``), or about a week, around the
    longest the rollup takes; of 1 (a device, a CPU) or of some bytes (memory)."""
    scale = draw(st.sampled_from(["ns", "hours", "hours", "week"]))
    if scale == "ns":
        start = T0 + draw(st.integers(0, 100))
        length = draw(st.none() | st.integers(0, 60))
    else:
        start = T0 + max(0, draw(at_hours(0, 8)))
        length = draw(st.none() | at_hours(0, 6).map(lambda n: max(0, n)))
        if scale == "week" and length is not None:  # about as long as the rollup takes (``LONG_NS``)
            length = LONG_NS + draw(st.sampled_from([-1, 0, 1, Q]))
    amount = draw(st.sampled_from([1, 1, 3 << 30]))
    hold = Hold(draw(RESOURCES), draw(TEXT), draw(TEXT), draw(TEXT), draw(TEXT), start, amount)
    return draw(NODES), Change(hold, None if length is None else start + length)


NODES = st.sampled_from(["node-a", "node-b", "node-c"])
#: (node, a gap): of any source (the allocatable one hides nothing), open (until 0) or closed
GAPS = st.tuples(
    NODES,
    st.tuples(
        st.sampled_from(["eventsrc", "kubelet", "runtime", "kubelet allocatable"]),
        st.one_of(st.integers(0, 150), at_hours(0, 12).map(lambda t: max(0, t))).map(lambda t: T0 + t),
        st.none() | st.integers(0, 80) | at_hours(0, 4).map(lambda t: max(0, t)),
    ).map(lambda g: (g[0], g[1], 0 if g[2] is None else g[1] + g[2])),
)

#: windows from before the holds to after them, any of them inside, across or outside; at the
#: ns scale and at the hours' (whole hours inside them, or none, their ends on an hour or not)
WINDOWS = st.one_of(
    st.tuples(st.integers(-20, 180), st.integers(-20, 180)),
    st.tuples(at_hours(-1, 16), at_hours(-1, 16)),
).map(lambda w: Window(T0 + w[0], T0 + w[1]))


@pytest.fixture(scope="module")
def conn(postgres_unavailable: str | None) -> Iterator[psycopg.Connection[Any]]:
    """One PostgreSQL for the module, migrated as the sink migrates it."""
    if postgres_unavailable is not None:
        pytest.skip(postgres_unavailable)
    server = PostgresServer()
    try:
        server.start()
        with psycopg.connect(server.dsn, autocommit=True) as c:
            migrate(c)
            yield c
    finally:
        server.cleanup()


def store(conn: psycopg.Connection[Any], stored: list[tuple[str, Change]], gaps: list[tuple[str, Span]]) -> None:
    """The holds as the sink writes them: text through ``pg_text``; the gaps as it does (one row
    a node log's source and start); the hourly rollup made from the holds
    (``rebuild_usage_hours``), and equal to what the sink adds as the holds end
    (``chargeback.hour_shares``, the sink's own)."""
    conn.execute("TRUNCATE holds, gaps")
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO gaps (node, log_id, source, since_ns, until_ns) VALUES (%s, 'log', %s, %s, %s)",
            [(node, *gap) for node, gap in gaps],
        )
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO holds (node, log_id, resource, device, namespace, name, uid, start_ns, end_ns, amount) "
            "VALUES (%s, 'log', %s, %s, %s, %s, %s, %s, %s, %s)",
            [
                (
                    node,
                    *(pg_text(v) for v in (h.resource, h.device, h.namespace, h.name, h.uid)),
                    h.start_ns,
                    end,
                    h.amount,
                )
                for node, (h, end) in stored
            ],
        )
    rebuild_usage_hours(conn)
    kept = {(r, n, int(hour)): int(ns) for r, n, hour, ns in conn.execute("SELECT * FROM usage_hours")}
    added: dict[tuple[str, str, int], int] = {}
    for _, (h, end) in stored:
        for hour, ns in hour_shares(h.start_ns, end) if end is not None else ():
            key = (pg_text(h.resource), pg_text(h.namespace), hour)
            added[key] = added.get(key, 0) + ns * h.amount
    assert {k: v for k, v in kept.items() if v} == {k: v for k, v in added.items() if v}


def nodes_own(
    stored: list[tuple[str, Change]], gaps: list[tuple[str, Span]], by: str, w: Window, resources: frozenset[str]
) -> list[Row]:
    """The reference: each node's own ``audit usage`` rows (``chargeback.totals`` over its holds,
    with its gaps); ``--by node|device`` the node named first, else summed across the nodes."""
    per_node: dict[str, list[Change]] = {}
    for node, c in stored:
        per_node.setdefault(node, []).append(c)
    sums: dict[tuple[str, ...], tuple[int, int]] = {}
    for node, changes in per_node.items():
        hiding = merged([g for n, g in gaps if n == node and g[0] in HIDING], w)
        for row in totals(changes, NODE_GROUPS.get(by, by), w, resources, hiding):
            key = (node, *row.group) if by in NODE_GROUPS else row.group
            ns, gap_ns = sums.get(key, (0, 0))
            sums[key] = (ns + row.ns, gap_ns + row.gap_ns)
    return sorted(Row(k, ns, gap_ns) for k, (ns, gap_ns) in sums.items())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    stored=st.lists(holds(), max_size=25),
    gaps=st.lists(GAPS, max_size=6, unique_by=lambda g: (g[0], g[1][0], g[1][1])),
    windows=st.lists(WINDOWS, min_size=1, max_size=3),
    resources=st.frozensets(RESOURCES, max_size=2),
)
def test_the_sql_totals_are_chargeback_totals(
    conn: psycopg.Connection[Any],
    stored: list[tuple[str, Change]],
    gaps: list[tuple[str, Span]],
    windows: list[Window],
    resources: frozenset[str],
) -> None:
    """With each node's gaps: the seconds inside them are the node's own (``Gaps.covered``)."""
    store(conn, stored, gaps)
    for w in windows:
        for by in BYS:
            for only in (frozenset(), resources):
                assert usage_totals(conn, by, w, only) == nodes_own(stored, gaps, by, w, only), (by, w, only)


def test_a_total_beyond_a_bigint_is_exact(conn: psycopg.Connection[Any]) -> None:
    """Two holds of 2^62 ns each, inside one open gap: their sums (2^63) are no bigint; they
    are summed exactly."""
    long = 1 << 62
    stored = [("node-a", Change(Hold("cpu", str(i), "ns", "p", "u", 0), long)) for i in range(2)]
    gaps = [("node-a", ("eventsrc", 0, 0))]
    store(conn, stored, gaps)
    w = Window(0, long)
    assert usage_totals(conn, "resource", w, frozenset()) == [Row(("cpu",), 1 << 63, 1 << 63)]
    assert nodes_own(stored, gaps, "resource", w, frozenset()) == [Row(("cpu",), 1 << 63, 1 << 63)]
