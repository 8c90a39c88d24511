"""U+0000 in the fleet's tables: PostgreSQL's text cannot hold it (docs/fleet.md "U+0000").
``pg_text`` is how the derived rows' text holds it, ``from_pg_text`` undoes it, and
``escape_json`` how a record's JSON holds it."""

from __future__ import annotations

from typing import Any


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
