"""How records and views look to people (one line per record; tables) and programs (JSON)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgspec

from eventsrc.events import CorruptRecordError, FutureRecordError, Record
from eventsrc.state.views import Views


def iso(ts_ns: int) -> str:
    return dt.datetime.fromtimestamp(ts_ns / 1e9, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def short(value: Any) -> str:
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{" + ",".join(f"{k}={short(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(short(v) for v in value) + "]"
    return str(value)


def record_summary(rec: Record) -> str:
    fields = msgspec.to_builtins(rec.event)
    fields.pop("type", None)
    return " ".join(f"{k}={short(v)}" for k, v in fields.items() if v not in ("", [], {}))


def raw_body(item: FutureRecordError) -> str:
    """A newer record's body as key=value, as stored: this code cannot say what it means."""
    if isinstance(item.body, dict):
        return " ".join(f"{k}={short(v)}" for k, v in item.body.items())
    return short(item.body)


def record_line(item: Record | CorruptRecordError) -> str:
    if isinstance(item, FutureRecordError):  # shown raw: this code cannot say what it means
        return (
            f"{item.seq:>8}  {iso(item.ts_ns)}  {item.type_name + '?':<26}  {item.correlation_id[-8:]}  "
            f"{raw_body(item)}  (v{item.version}, from a newer eventsrc)"
        )
    if isinstance(item, CorruptRecordError):
        return f"{item.seq:>8}  {'?':<27}  {'CORRUPT':<26}  {'':8}  {item.reason}"
    return f"{item.seq:>8}  {iso(item.ts_ns)}  {item.type:<26}  {item.correlation_id[-8:]}  {record_summary(item)}"


RECORD_HEADER = f"{'SEQ':>8}  {'TIME':<27}  {'TYPE':<26}  {'CORR':<8}  EVENT"


def record_json(item: Record | CorruptRecordError) -> dict[str, Any]:
    if isinstance(item, FutureRecordError):
        return {
            "seq": item.seq,
            "ts_ns": item.ts_ns,
            "time": iso(item.ts_ns),
            "correlation_id": item.correlation_id,
            "type": item.type_name,
            "version": item.version,
            "event": msgspec.to_builtins(item.body),
            "unreadable": True,
            "reason": item.reason,
        }
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
            f"{claim.namespace}/{claim.name}",
            uid,
            claim.driver,
            claim.state,
            ",".join(claim.pods) or "-",
            claim.error or "-",
        )
    out.append(claims)
    return out


def _cpus(ids: list[int]) -> str:
    """Kubelet list format: 0-3,8,10-11 ("-" when empty)."""
    from eventsrc.core.cpu.cpuset import CPUSet

    return str(CPUSet(ids)) or "-"


def pod_json(info: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    out: dict[str, Any] = MessageToDict(
        info, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return out


def pod_lines(info: Any) -> list[str]:
    lines = [
        f"pod {info.namespace}/{info.name}  uid {info.uid}  {info.state}"
        + (f"  (seq {info.admitted_seq})" if info.admitted_seq else "")
    ]
    for c in info.containers:
        got = []
        for r in c.resources:
            got.append(f"    {r.resource}: {', '.join(r.device_ids)}")
            if r.envs:
                got.append("      envs: " + " ".join(f"{k}={v}" for k, v in sorted(r.envs.items())))
            for m in r.mounts:
                got.append(f"      mount: {m.host_path} -> {m.container_path}{' (ro)' if m.read_only else ''}")
            for d in r.devices:
                got.append(f"      device: {d.host_path} -> {d.container_path} ({d.permissions or '-'})")
            if r.annotations:
                got.append("      annotations: " + " ".join(f"{k}={v}" for k, v in sorted(r.annotations.items())))
            if r.cdi_devices:
                got.append("      cdi: " + " ".join(r.cdi_devices))
        if c.claim_cdi_devices:
            got.append("    claims (cdi): " + " ".join(c.claim_cdi_devices))
        if c.cpu_ids:
            got.append(f"    cpus: {_cpus(list(c.cpu_ids))} ({'exclusive' if c.exclusive_cpus else 'shared pool'})")
        lines.append(
            f"  container {c.name} ({c.kind})" + ("" if got else ": nothing from the device, CPU or DRA managers")
        )
        lines.extend(got)
    return lines


def print_pod(info: Any, output: str) -> None:
    import json

    if output == "json":
        print(json.dumps(pod_json(info)))
    else:
        print("\n".join(pod_lines(info)))


def print_pods(pods: list[Any], output: str) -> None:
    import json

    if output == "json":
        print(json.dumps({"pods": [pod_json(p) for p in pods]}))
        return
    from rich.table import Table

    table = Table(title=f"pods ({len(pods)})", title_justify="left")
    for col in ("pod", "uid", "state", "container", "devices"):
        table.add_column(col)
    for p in pods:
        for c in p.containers or [None]:
            devs = " ".join(f"{r.resource}={','.join(r.device_ids)}" for r in c.resources) if c else ""
            table.add_row(f"{p.namespace}/{p.name}", p.uid, p.state, c.name if c else "-", devs or "-")
    console().print(table)


def console() -> Any:
    """A rich console; wide when the output is not a terminal (a pipe or a file), so that
    nothing is cut."""
    import sys

    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 240)
