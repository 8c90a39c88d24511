"""The fleet's hourly rollup as the sinks kept it, against the same made again from ``holds``."""

from __future__ import annotations

from typing import Any

import psycopg

from eventsrc.fleet.tables import rebuild_usage_hours


def kept_and_made(dsn: str) -> tuple[list[Any], list[Any]]:
    """``usage_hours`` as the sinks left it, and as ``rebuild_usage_hours`` makes it from the holds
    (which it then is): each sorted, rows of no nanoseconds left out."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        kept = sorted(conn.execute("SELECT * FROM usage_hours WHERE ns <> 0").fetchall())
        rebuild_usage_hours(conn)
        made = sorted(conn.execute("SELECT * FROM usage_hours WHERE ns <> 0").fetchall())
    return kept, made
