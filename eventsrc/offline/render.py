"""How records and views look to people (one line per record; tables) and programs (JSON).

Strings from plugins, manifests and the log reach people only through this module, and never
raw: ``escape`` writes every control, format (bidi overrides and isolates, zero-width
characters), surrogate and line-separator character as an escape (``\\n``, ``\\x1b``,
``\\u202e``), so a value can neither split a line, forge one, move the cursor, colour the
terminal nor reorder what is shown. ``record_line``, ``pod_lines`` and ``text_lines`` escape
whole lines (the templates hold no such characters, so only values are changed); ``table``
escapes every cell and hands it to rich as plain text (no markup: ``[red]`` prints as
itself). JSON output (``record_json``, ``pod_json``) stays exact.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from eventsrc import events as ev
from eventsrc.events import CorruptRecordError, FutureRecordError, LogTrimmed, Record
from eventsrc.inputs.config import ByteSize
from eventsrc.obs.text import escape
from eventsrc.state.lifecycles import QUARANTINED
from eventsrc.state.views import Views


def text_lines(lines: Iterable[str]) -> str:
    """Lines for people, each escaped (a value holding a newline stays on its line), joined."""
    return "\n".join(escape(line) for line in lines)


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]], *, header: bool = True) -> Any:
    """A rich table whose every cell is escaped and plain text (never rich markup)."""
    from rich.table import Table
    from rich.text import Text

    out = Table(title=Text(escape(title)), show_header=header, title_justify="left")
    for col in columns:
        out.add_column(col)
    for row in rows:
        out.add_row(*(Text(escape(str(cell))) for cell in row))
    return out


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
    if isinstance(rec.event, LogTrimmed):
        return trimmed(rec.event)
    observed = observed_summary(rec.event)
    if observed is not None:
        return observed
    fields = msgspec.to_builtins(rec.event)
    fields.pop("type", None)
    return " ".join(f"{k}={short(v)}" for k, v in fields.items() if v not in ("", [], {}))


def _who(pod: ev.PodRef, container: str = "") -> str:
    named = f"{pod.namespace}/{pod.name}" + (f"/{container}" if container else "")
    return named + (f" ({pod.uid})" if pod.uid else "")


def _why(reason: str) -> str:
    return f" ({reason})" if reason else ""


def _claim_devices(devices: list[ev.ObservedClaimDevice]) -> str:
    return (
        ", ".join(
            f"{d.driver} {d.pool}/{d.device}" + (f" cdi {','.join(d.cdi_devices)}" if d.cdi_devices else "")
            for d in devices
        )
        or "no devices"
    )


def _allocatable(e: ev.KubeletAllocatableChanged) -> str:
    parts = [f"+{r} {','.join(d.id for d in devices)}" for r, devices in sorted(e.added.items())]
    parts += [f"-{r} {','.join(ids)}" for r, ids in sorted(e.removed.items())]
    if e.cpus_added:
        parts.append(f"+cpus {_cpus(e.cpus_added)}")
    if e.cpus_removed:
        parts.append(f"-cpus {_cpus(e.cpus_removed)}")
    return "allocatable: " + ("; ".join(parts) or "unchanged")


def observed_summary(e: object) -> str | None:
    """A fact observed beside a kubelet (``serve --beside-kubelet``) in words, marked "(kubelet)"
    (the kubelet decided it, not eventsrc); an observation gap or an unreadable checkpoint
    likewise. None for every other event. Not escaped (``record_line`` escapes the line)."""
    if isinstance(e, ev.KubeletPodObserved):
        return f"(kubelet) pod {_who(e.pod)} listed" + _why(e.source)
    if isinstance(e, ev.KubeletPodReleased):
        return f"(kubelet) pod {_who(e.pod)} released" + _why(e.reason)
    if isinstance(e, ev.KubeletDevicesObserved):
        numa = f" NUMA {','.join(map(str, e.numa_nodes))}" if e.numa_nodes else ""
        return f"(kubelet) {_who(e.pod, e.container)} holds {e.resource} {','.join(e.device_ids)}{numa}"
    if isinstance(e, ev.KubeletDevicesReleased):
        return f"(kubelet) {_who(e.pod, e.container)} let go of {e.resource} {','.join(e.device_ids)}" + _why(e.reason)
    if isinstance(e, ev.KubeletCPUsObserved):
        return f"(kubelet) {_who(e.pod, e.container)} exclusive cpus {_cpus(e.cpus)}"
    if isinstance(e, ev.KubeletCPUsReleased):
        return f"(kubelet) {_who(e.pod, e.container)} let go of cpus {_cpus(e.cpus)}" + _why(e.reason)
    if isinstance(e, ev.KubeletMemoryObserved):
        blocks = "; ".join(
            f"{m.memory_type} {m.size} bytes NUMA {','.join(map(str, m.numa_nodes)) or '-'}" for m in e.memory
        )
        return f"(kubelet) {_who(e.pod, e.container)} memory {blocks or 'none'}"
    if isinstance(e, ev.KubeletClaimObserved):
        claim = f"{e.claim.namespace}/{e.claim.name}"
        return f"(kubelet) {_who(e.pod, e.container)} uses claim {claim}: {_claim_devices(e.devices)}"
    if isinstance(e, ev.KubeletClaimReleased):
        claim = f"{e.claim.namespace}/{e.claim.name}"
        return f"(kubelet) {_who(e.pod, e.container)} let go of claim {claim}: {_claim_devices(e.devices)}" + _why(
            e.reason
        )
    if isinstance(e, ev.KubeletAllocatableChanged):
        return f"(kubelet) {_allocatable(e)}"
    if isinstance(e, ev.KubeletSharedPoolObserved):
        return f"(kubelet) shared pool {_cpus(e.cpus)}" + _why(", ".join(x for x in (e.policy, e.source) if x))
    if isinstance(e, ev.KubeletCPUsDisagreed):
        state = f"exclusive cpus {_cpus(e.checkpoint)}" if e.checkpoint else "no exclusive cpus"
        return (
            f"(kubelet) {_who(e.pod, e.container)} listed with cpus {_cpus(e.listed)}, its CPU manager's state "
            f"gives it {state}" + _why(e.source)
        )
    if isinstance(e, ev.KubeletCheckpointReadFailed):
        return f"(kubelet) checkpoint {e.path} not read: {e.reason}"
    if isinstance(e, ev.KubeletDoubleAllocationFound):
        what = f"exclusive cpus {','.join(e.ids)}" if e.resource == "cpu" else f"{e.resource} {','.join(e.ids)}"
        return f"(kubelet) {what} given to {' and '.join(e.holders)} at once (the kubelet's fault)"
    if isinstance(e, ev.ObservationGapFound):
        until = f"to {iso(e.until_ns)}" if e.until_ns else "(still open)"
        return f"not seen: {e.source} from {iso(e.since_ns)} {until}" + _why(e.reason)
    return None


def trimmed(e: LogTrimmed) -> str:
    """A retention cut in words (docs/adr/0018): which records left the live log, and to where."""
    first = e.base_seq - e.records + 1
    where = f"into archive segment {e.segment}" if e.segment else "without an archive (not kept)"
    reason = f" ({e.reason})" if e.reason else ""
    return f"records {first}..{e.base_seq} left the live log {where}{reason}; it starts at {e.base_seq + 1}"


def raw_body(item: FutureRecordError) -> str:
    """A newer record's body as key=value, as stored: this code cannot say what it means."""
    if isinstance(item.body, dict):
        return " ".join(f"{k}={short(v)}" for k, v in item.body.items())
    return short(item.body)


def record_line(item: Record | CorruptRecordError) -> str:
    """One record on one line, escaped."""
    return escape(_record_line(item))


def _record_line(item: Record | CorruptRecordError) -> str:
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


def views_tables(views: Views, start: str = "") -> list[Any]:
    """rich renderables: one table per view. ``start``: where the live log starts and what
    was read before it, after retention cuts."""
    m = views.meta
    corrupt = ", ".join(f"{s} ({r})" for s, r in sorted(m.corrupt.items())) if m.corrupt else "none"
    rows: list[tuple[str, object]] = [
        ("last sequence", m.last_seq),
        ("daemon", f"{'running' if m.running else 'stopped'} (boots {m.boots}, version {m.version or '-'})"),
        ("instance", m.instance_id or "-"),
        ("corrupt records", corrupt),
        ("quarantined pods", quarantined(views) or "none"),
    ]
    if start:
        rows.insert(1, ("history", start))
    meta = table("log", ("", ""), rows, header=False)
    plugins = table(
        "plugins",
        ("resource", "kind", "endpoint", "connected", "since seq"),
        [
            (p.resource, p.kind, p.endpoint, "yes" if p.connected else "no", p.registered_seq)
            for p in [*views.devices.plugins.values(), *views.claims.drivers.values()]
        ],
    )
    devices = table(
        "devices",
        ("resource", "device", "health", "numa", "holder", "hold", "since seq"),
        [
            (
                res,
                dev_id,
                d.health,
                ",".join(map(str, d.numa_nodes)) or "-",
                d.holder or "-",
                d.hold or "-",
                d.since_seq,
            )
            for res, devs in sorted(views.devices.devices.items())
            for dev_id, d in sorted(devs.items())
        ],
    )
    pod_rows: list[tuple[object, ...]] = []
    for uid, pod in views.pods.pods.items():
        if not pod.containers:
            pod_rows.append((f"{pod.namespace}/{pod.name}", uid, "-", "-", "-", "-"))
        for cname, c in pod.containers.items():
            devs = " ".join(f"{r}={','.join(ids)}" for r, ids in c.devices.items()) or "-"
            pod_rows.append((f"{pod.namespace}/{pod.name}", uid, cname, devs, _cpus(c.cpus), ",".join(c.claims) or "-"))
    pods = table("pods", ("pod", "uid", "container", "devices", "cpus", "claims"), pod_rows)
    cpus = table(
        "exclusive cpus",
        ("pod uid", "container", "cpus"),
        [
            (uid, cname, _cpus(ids))
            for uid, containers in views.cpus.assignments.items()
            for cname, ids in containers.items()
        ],
    )
    memory = table(
        "memory",
        ("pod uid", "container", "type", "bytes", "numa"),
        [
            (uid, cname, b.type, b.size, ",".join(map(str, b.numa_affinity)))
            for uid, containers in views.memory.assignments.items()
            for cname, blocks in containers.items()
            for b in blocks
        ],
    )
    claims = table(
        "claims",
        ("claim", "uid", "driver", "state", "pods", "error"),
        [
            (f"{c.namespace}/{c.name}", uid, c.driver, c.state, ",".join(c.pods) or "-", c.error or "-")
            for uid, c in views.claims.claims.items()
        ],
    )
    return [meta, plugins, devices, pods, cpus, *([memory] if views.memory.assignments else []), claims]


def quarantined(views: Views) -> str:
    """The pods whose records are in doubt (docs/adr/0005), each with the records to look at."""
    return "; ".join(
        f"{p.uid} ({p.namespace}/{p.name}): records {','.join(map(str, p.in_doubt))} in doubt, "
        f"since seq {p.quarantined_seq}"
        for p in views.pods.pods.values()
        if p.state == QUARANTINED
    )


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
    """What a pod holds, for people: each line escaped."""
    return [escape(line) for line in _pod_lines(info)]


def _pod_lines(info: Any) -> list[str]:
    lines = [
        f"pod {info.namespace}/{info.name}  uid {info.uid}  {info.state}"
        + (
            f"  (seq {info.removed_seq})"  # the removal's record, not the admission's
            if info.removed_seq
            else f"  (seq {info.admitted_seq})"
            if info.admitted_seq
            else ""
        )
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
        for m in c.memory:
            got.append(f"    {m.type}: {ByteSize(m.size)} on NUMA node {','.join(map(str, m.numa_nodes)) or '-'}")
        lines.append(
            f"  container {c.name} ({c.kind})"
            + ("" if got else ": nothing from the device, CPU, memory or DRA managers")
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
    rows = []
    for p in pods:
        for c in p.containers or [None]:
            devs = " ".join(f"{r.resource}={','.join(r.device_ids)}" for r in c.resources) if c else ""
            rows.append((f"{p.namespace}/{p.name}", p.uid, p.state, c.name if c else "-", devs or "-"))
    console().print(table(f"pods ({len(pods)})", ("pod", "uid", "state", "container", "devices"), rows))
    import sys

    for p in pods:
        if p.state == QUARANTINED:
            print(
                f"pod {escape(p.uid)} is quarantined: records {','.join(map(str, p.in_doubt)) or '?'} are in doubt "
                "and it keeps what it holds; removing the pod releases it (docs/operations.md)",
                file=sys.stderr,
            )


def console() -> Any:
    """A rich console; wide when the output is not a terminal (a pipe or a file), so that
    nothing is cut. It interprets no markup and no emoji codes in what it prints (cells are
    plain ``Text`` already; this covers any string printed through it) and highlights nothing."""
    import sys

    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 240, markup=False, emoji=False, highlight=False)
