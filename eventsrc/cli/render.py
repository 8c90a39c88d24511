"""How records and views look to people (one line per record; tables) and programs (JSON)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec

from eventsrc.events import CorruptRecordError, Record
from eventsrc.state.views import Views


def iso(ts_ns: int) -> str:
    return dt.datetime.fromtimestamp(ts_ns / 1e9, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _short(value: Any) -> str:
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{" + ",".join(f"{k}={_short(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_short(v) for v in value) + "]"
    return str(value)


def record_summary(rec: Record) -> str:
    fields = msgspec.to_builtins(rec.event)
    fields.pop("type", None)
    return " ".join(f"{k}={_short(v)}" for k, v in fields.items() if v not in ("", [], {}))


def record_line(item: Record | CorruptRecordError) -> str:
    if isinstance(item, CorruptRecordError):
        return f"{item.seq:>8}  {'?':<27}  {'CORRUPT':<26}  {'':8}  {item.reason}"
    return f"{item.seq:>8}  {iso(item.ts_ns)}  {item.type:<26}  {item.correlation_id[-8:]}  {record_summary(item)}"


RECORD_HEADER = f"{'SEQ':>8}  {'TIME':<27}  {'TYPE':<26}  {'CORR':<8}  EVENT"


def record_json(item: Record | CorruptRecordError) -> dict[str, Any]:
    if isinstance(item, CorruptRecordError):
        return {"seq": item.seq, "corrupt": True, "reason": item.reason}
    return {
        "seq": item.seq,
        "ts_ns": item.ts_ns,
        "time": iso(item.ts_ns),
        "correlation_id": item.correlation_id,
        "type": item.type,
        "version": item.version,
        "event": msgspec.to_builtins(item.event),
    }


def views_json(views: Views) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(views)
    return out


def views_tables(views: Views) -> list[Any]:
    """rich renderables: one table per view."""
    from rich.table import Table

    m = views.meta
    out: list[Any] = []
    meta = Table(title="log", show_header=False, title_justify="left")
    meta.add_row("last sequence", str(m.last_seq))
    meta.add_row("daemon", f"{'running' if m.running else 'stopped'} (boots {m.boots}, version {m.version or '-'})")
    meta.add_row("instance", m.instance_id or "-")
    meta.add_row(
        "corrupt records",
        ", ".join(f"{s} ({r})" for s, r in sorted(m.corrupt.items())) if m.corrupt else "none",
    )
    out.append(meta)

    plugins = Table(title="plugins", title_justify="left")
    for col in ("resource", "kind", "endpoint", "connected", "since seq"):
        plugins.add_column(col)
    for p in [*views.devices.plugins.values(), *views.claims.drivers.values()]:
        plugins.add_row(p.resource, p.kind, p.endpoint, "yes" if p.connected else "no", str(p.registered_seq))
    out.append(plugins)

    devices = Table(title="devices", title_justify="left")
    for col in ("resource", "device", "health", "numa", "holder", "hold", "since seq"):
        devices.add_column(col)
    for res, table in sorted(views.devices.devices.items()):
        for dev_id, d in sorted(table.items()):
            numa = ",".join(map(str, d.numa_nodes)) or "-"
            devices.add_row(res, dev_id, d.health, numa, d.holder or "-", d.hold or "-", str(d.since_seq))
    out.append(devices)

    pods = Table(title="pods", title_justify="left")
    for col in ("pod", "uid", "container", "devices", "cpus", "claims"):
        pods.add_column(col)
    for uid, pod in views.pods.pods.items():
        if not pod.containers:
            pods.add_row(f"{pod.namespace}/{pod.name}", uid, "-", "-", "-", "-")
        for cname, c in pod.containers.items():
            devs = " ".join(f"{r}={','.join(ids)}" for r, ids in c.devices.items()) or "-"
            pods.add_row(f"{pod.namespace}/{pod.name}", uid, cname, devs, _cpus(c.cpus), ",".join(c.claims) or "-")
    out.append(pods)

    cpus = Table(title="exclusive cpus", title_justify="left")
    for col in ("pod uid", "container", "cpus"):
        cpus.add_column(col)
    for uid, containers in views.cpus.assignments.items():
        for cname, ids in containers.items():
            cpus.add_row(uid, cname, _cpus(ids))
    out.append(cpus)

    claims = Table(title="claims", title_justify="left")
    for col in ("claim", "uid", "driver", "state", "pods", "error"):
        claims.add_column(col)
    for uid, claim in views.claims.claims.items():
        claims.add_row(
            f"{claim.namespace}/{claim.name}", uid, claim.driver, claim.state, ",".join(claim.pods) or "-", claim.error or "-"
        )
    out.append(claims)
    return out


def _cpus(ids: list[int]) -> str:
    """Kubelet list format: 0-3,8,10-11."""
    if not ids:
        return "-"
    s = sorted(set(ids))
    parts: list[str] = []
    start = prev = s[0]
    for x in s[1:]:
        if x == prev + 1:
            prev = x
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = x
    parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)
