"""How the audit answers look: lines for people (``device_lines``, ``pod_lines``,
``claim_lines``) and JSON for programs (``to_json``), and ``run``, the command that asks
``eventsrc.offline.audit_queries`` and prints the answer.

Lines go out through ``offline.render.text_lines``, which escapes each one; JSON is the
answer's value, encoded as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import Struct

from eventsrc import events as ev
from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.obs.text import escape
from eventsrc.offline.audit_queries import (
    At,
    ClaimHistory,
    DeviceTimeline,
    Gap,
    LogStart,
    NotInLogError,
    ObservedPod,
    PodHistory,
    PodName,
    RuntimeContainer,
    Sandbox,
    UsageError,
    claim_history,
    device_timeline,
    log_start,
    parse_point,
    pod_history,
)
from eventsrc.state.kubelet import claim_device_id

if TYPE_CHECKING:
    from eventsrc.log.history import Reader


def to_json(answer: Struct) -> bytes:
    return msgspec.json.encode(answer)


def _when(a: At | None, none: str = "-") -> str:
    return f"{a.time} (seq {a.seq})" if a is not None else none


def _pod(p: PodName) -> str:
    return f"{p.namespace}/{p.name} ({p.uid})" if p.name else f"? ({p.uid})"


def column_lines(header: list[str], rows: list[list[str]]) -> list[str]:
    """``header`` and ``rows`` as lines, each column as wide as its widest cell."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    return [
        "  " + "  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]
    ]


def device_lines(t: DeviceTimeline) -> list[str]:
    head = (
        f"device {t.resource} {t.device_id}: {t.health or '?'}"
        + (f", NUMA {','.join(map(str, t.numa_nodes))}" if t.numa_nodes else "")
        + ("" if t.listed else ", not listed")
    )
    lines = [head]
    if t.since or t.until:
        lines.append(f"window: since {_point(t.since)}, until {_point(t.until)}")
    lines.append(f"listing and health ({len(t.changes)})")
    if t.changes:
        rows = [
            [str(c.at.seq), c.at.time, c.what, c.health, ",".join(map(str, c.numa_nodes)) or "-", c.reason or "-"]
            for c in t.changes
        ]
        lines += column_lines(["SEQ", "TIME", "WHAT", "HEALTH", "NUMA", "REASON"], rows)
    lines.append(f"holders ({len(t.holders)})")
    if t.holders:
        rows = [
            [
                f"{h.pod.namespace}/{h.pod.name}" if h.pod.name else "?",
                h.pod.uid or "?",
                h.container + (" (kubelet)" if h.decided_by == "kubelet" else ""),
                _when(h.start, "(before the log)"),
                _when(h.end, "still held"),
                (f"{h.released_by}: {h.reason}" if h.reason else h.released_by) if h.end else "-",
            ]
            for h in t.holders
        ]
        lines += column_lines(["POD", "UID", "CONTAINER", "FROM", "UNTIL", "WHY RELEASED"], rows)
    for h in t.holders:
        if h.container_ids:
            lines.append(f"  container ids of {_pod(h.pod)} {h.container}:")
            lines += [f"    {escape(c.id)}: {_container_times(c)}" for c in h.container_ids]
    lines.append(f"containers the runtime ran with it ({len(t.containers)})")
    for run in t.containers:
        c = run.container
        ids = ",".join(c.device_ids.get(t.resource, []))
        lines.append(f"  {_pod(run.pod)} {escape(c.name) or '?'} {escape(c.id)}: {t.resource} {escape(ids)}")
        lines.append(f"    {_container_times(c)}")
    if t.findings:  # only beside a kubelet that erred (docs/adr/0038)
        lines.append(f"found about the kubelet ({len(t.findings)})")
    for f in t.findings:
        holders = " and ".join(escape(h) for h in f.holders)
        lines.append(f"  seq {f.at.seq} {f.at.time}: the kubelet gave it to {holders} at once")
    return lines + gap_lines(t.gaps)


def gap_lines(gaps: list[Gap]) -> list[str]:
    """The times eventsrc could not see what it records, over the history shown."""
    lines = [f"not seen ({len(gaps)})"]
    for g in gaps:
        until = f"to {g.until}" if g.until_ns else "until now (still open)"
        lines.append(f"  not seen: {g.source} from {g.since} {until}" + (f" ({g.reason})" if g.reason else ""))
    return lines


def _point(a: At | None) -> str:
    if a is None:
        return "-"
    return a.time if a.time else f"seq {a.seq}"


def pod_lines(h: PodHistory) -> list[str]:
    lines = [f"pod {h.namespace}/{h.name}  uid {h.uid}"]
    if h.resolved:
        lines.append(h.resolved + (f"; older: {', '.join(h.other_uids)}" if h.other_uids else ""))
    lines.append("asked for")
    for a in h.asked:
        lines.append(f"  {_when(a.at)} {a.type}")
        for c in a.containers:
            req = " ".join(f"{k}={v}" for k, v in sorted(c.requests.items())) or "-"
            lim = " ".join(f"{k}={v}" for k, v in sorted(c.limits.items())) or "-"
            lines.append(
                f"    container {c.name} ({c.kind}): requests {req}; limits {lim}"
                + (f"; claims {','.join(c.claims)}" if c.claims else "")
            )
    for ad in h.admitted:
        lines.append(
            f"admitted {_when(ad.at)}"
            + (f", QoS {ad.qos_class}" if ad.qos_class else "")
            + (f": container {ad.container}" if ad.container else "")
        )
    for rf in h.refused:
        lines.append(
            f"refused {_when(rf.at)}: {rf.reason}"
            + (f" (container {rf.container})" if rf.container else "")
            + (f" (topology hint {rf.topology_hint})" if rf.topology_hint else "")
        )
    lines.append(f"devices ({len(h.devices)})")
    for g in h.devices:
        lines.append(f"  {g.container}: {g.resource} {','.join(g.device_ids)}")
        if g.reserved:
            lines.append(
                f"    reserved  {_when(g.reserved)}"
                + (f" chosen by {g.choice}" if g.choice else "")
                + (f" ({g.note})" if g.note else "")
            )
        if g.allocated:
            lines.append(f"    allocated {_when(g.allocated)}")
            if g.response is not None:
                lines += [f"      {x}" for x in _response_lines(g.response)]
        if g.failed:
            lines.append(f"    failed    {_when(g.failed)}: {g.reason}")
        lines.append(
            f"    released  {_when(g.released)}: {g.reason}"
            if g.released
            else ("    still held" if not g.failed else "")
        )
    lines = [x for x in lines if x]
    lines.append(f"exclusive cpus ({len(h.cpus)})")
    for cg in h.cpus:
        lines.append(
            f"  {cg.container}: {','.join(map(str, cg.cpus))} assigned {_when(cg.assigned)}; "
            + (f"released {_when(cg.released)}: {cg.reason}" if cg.released else "still held")
        )
    if h.memory:
        lines.append(f"memory ({len(h.memory)})")
        for mg in h.memory:
            blocks = "; ".join(f"{b.type} {b.size} bytes NUMA {','.join(map(str, b.numa_affinity))}" for b in mg.blocks)
            lines.append(
                f"  {mg.container}: {blocks or 'none'} assigned {_when(mg.assigned)}; "
                + (f"released {_when(mg.released)}: {mg.reason}" if mg.released else "still held")
            )
    lines.append(f"claims ({len(h.claims)})")
    for u in h.claims:
        lines.append(
            f"  {u.namespace}/{u.name} ({u.uid}) driver {u.driver or '?'}, {u.state or '?'}; "
            f"referenced {_when(u.referenced)}; "
            + (f"let go {_when(u.unreferenced)}" if u.unreferenced else "still referenced")
        )
        if u.cdi_devices:
            lines.append(f"    cdi: {' '.join(u.cdi_devices)}")
        if u.error:
            lines.append(f"    error: {u.error}")
    lines += runtime_lines(h.sandboxes, h.containers)
    for rm in h.removed:
        lines.append(f"removed {_when(rm.at)}" + (f": {rm.reason}" if rm.reason else ""))
    if h.observed is not None:
        lines += observed_lines(h.observed)
    lines += gap_lines(h.gaps)
    lines.append(f"records ({len(h.events)})")
    lines += column_lines(
        ["SEQ", "TIME", "TYPE", "EVENT"], [[str(x.at.seq), x.at.time, x.type, x.summary] for x in h.events]
    )
    return lines


def observed_lines(p: ObservedPod) -> list[str]:
    """What the kubelet decided for the pod, as observed beside it (each line says so)."""
    uid = {"kubelet": "", "runtime": " (uid from the runtime's sandbox)", "": " (uid unknown)"}.get(p.uid_from, "")
    lines = [f"decided by the kubelet (observed){uid}: listed {_when(p.observed)}"]
    for c in p.containers:
        lines.append(f"  container {escape(c.name)} (kubelet)")
        for d in c.devices:
            lines.append(
                f"    devices {escape(d.resource)} {escape(','.join(d.device_ids))}: observed {_when(d.observed)}; "
                + (
                    f"released {_when(d.released)}" + (f": {escape(d.reason)}" if d.reason else "")
                    if d.released
                    else "still held"
                )
            )
        for u in c.cpus:
            lines.append(
                f"    exclusive cpus {cpu_list(u.cpus)}: from {_when(u.at)}; "
                + (
                    f"until {_when(u.until)}" + (f": {escape(u.reason)}" if u.reason else "")
                    if u.until
                    else "still held"
                )
            )
        for m in c.memory:
            blocks = ", ".join(
                f"{escape(b.memory_type)} {b.size} bytes NUMA {cpu_list(b.numa_nodes)}" for b in m.memory
            )
            lines.append(f"    memory {_when(m.at)}: {blocks or 'none'}")
        for cl in c.claims:
            devices = " ".join(
                f"{escape(d.driver)} {escape(claim_device_id(d))}"
                + (f" cdi {escape(','.join(d.cdi_devices))}" if d.cdi_devices else "")
                for d in cl.devices
            )
            lines.append(
                f"    claim {escape(cl.claim.namespace)}/{escape(cl.claim.name)}: {devices or 'no devices'}; "
                f"observed {_when(cl.observed)}; "
                + (
                    f"released {_when(cl.released)}" + (f": {escape(cl.reason)}" if cl.reason else "")
                    if cl.released
                    else "still held"
                )
            )
        for x in c.container_ids:
            lines.append(f"    container id {escape(x.id)}: {_container_times(x)}")
    lines.append(
        f"released by the kubelet {_when(p.released)}" + (f": {escape(p.reason)}" if p.reason else "")
        if p.released
        else "not released by the kubelet"
    )
    return lines


def cpu_list(ids: list[int]) -> str:
    """Kubelet list format: 0-3,8 ("none" when empty)."""
    return str(CPUSet(ids)) or "none"


def _cpuset(cpus: list[int], mems: list[int]) -> str:
    return f"cpus {cpu_list(cpus)}, mems {cpu_list(mems)}"


def _exit(c: RuntimeContainer) -> str:
    return f"exit code {c.exit_code}" if c.exit_code != -1 else "exit code unknown"


def _container_times(c: RuntimeContainer) -> str:
    """When the container was created, started, stopped and removed, on one line."""
    parts = [f"created {_when(c.created, '(before the log)')}"]
    if c.started:
        parts.append(f"started {_when(c.started)}")
    if c.stopped:
        parts.append(f"stopped {_when(c.stopped)} ({_exit(c)})")
    if c.removed:
        parts.append(f"removed {_when(c.removed)}" + (f": {escape(c.reason)}" if c.reason else ""))
    else:
        parts.append("not removed")
    return "; ".join(parts)


def runtime_lines(sandboxes: list[Sandbox], containers: list[RuntimeContainer]) -> list[str]:
    """The pod's sandboxes and containers as the runtime ran them (values escaped)."""
    lines = [f"sandboxes ({len(sandboxes)})"]
    for sb in sandboxes:
        lines.append(
            f"  {escape(sb.id)}: started {_when(sb.started, '(before the log)')}; "
            + (
                f"removed {_when(sb.removed)}" + (f": {escape(sb.reason)}" if sb.reason else "")
                if sb.removed
                else "not removed"
            )
        )
    lines.append(f"containers ({len(containers)})")
    for c in containers:
        lines.append(
            f"  {escape(c.name) or '?'} {escape(c.id)}: {c.state}"
            + (f", in sandbox {escape(c.sandbox_id)}" if c.sandbox_id else "")
            + ("; set by eventsrc" if c.adjusted else "; as the runtime applied it" if c.created else "")
        )
        if c.created:
            lines.append(f"    {_cpuset(c.cpus, c.mems)}")
        if c.devices:
            lines.append("    devices: " + " ".join(escape(d) for d in c.devices))
        for resource, ids in sorted(c.device_ids.items()):
            lines.append(f"    device ids: {escape(resource)} {escape(','.join(ids))}")
        if c.cdi_devices:
            lines.append("    cdi: " + " ".join(escape(n) for n in c.cdi_devices))
        if c.envs:
            lines.append("    envs: " + " ".join(escape(n) for n in c.envs))
        if c.cgroups_path:
            lines.append(f"    cgroups: {escape(c.cgroups_path)}")
        lines.append(f"    created  {_when(c.created, '(before the log)')}")
        if c.started:
            lines.append(f"    started  {_when(c.started)}")
        for u in c.cpus_updated:
            lines.append(
                f"    cpuset   {_when(u.at)}: {_cpuset(u.cpus, u.mems)}"
                + (f" ({escape(u.reason)})" if u.reason else "")
            )
        if c.stopped:
            lines.append(f"    stopped  {_when(c.stopped)}, {_exit(c)}")
        if c.removed:
            lines.append(f"    removed  {_when(c.removed)}" + (f": {escape(c.reason)}" if c.reason else ""))
    return lines


def _response_lines(r: ev.ContainerAllocation) -> list[str]:
    out: list[str] = []
    if r.envs:
        out.append("envs: " + " ".join(f"{k}={v}" for k, v in sorted(r.envs.items())))
    out += [f"mount: {m.host_path} -> {m.container_path}{' (ro)' if m.read_only else ''}" for m in r.mounts]
    out += [f"device: {d.host_path} -> {d.container_path} ({d.permissions or '-'})" for d in r.devices]
    if r.annotations:
        out.append("annotations: " + " ".join(f"{k}={v}" for k, v in sorted(r.annotations.items())))
    if r.cdi_devices:
        out.append("cdi: " + " ".join(r.cdi_devices))
    return out


def claim_lines(c: ClaimHistory) -> list[str]:
    lines = [f"claim {c.namespace}/{c.name}  uid {c.uid}  driver {c.driver or '?'}  {c.state or '?'}"]
    if c.cdi_devices:
        lines.append("cdi devices: " + " ".join(c.cdi_devices))
    lines.append(f"lifecycle ({len(c.lifecycle)})")
    rows = [
        [
            str(s.at.seq),
            s.at.time,
            s.type,
            s.state,
            (f"pod {s.pod_uid}" if s.pod_uid else "")
            + " ".join(i for d in s.devices for i in d.cdi_device_ids)
            + (s.reason or ""),
        ]
        for s in c.lifecycle
    ]
    if rows:
        lines += column_lines(["SEQ", "TIME", "STEP", "STATE", "DETAIL"], rows)
    lines.append(f"pods ({len(c.pods)})")
    for p in c.pods:
        lines.append(
            f"  {_pod(p.pod)}: referenced {_when(p.referenced)}; "
            + (f"let go {_when(p.unreferenced)}" if p.unreferenced else "still referenced")
        )
    lines.append(f"errors ({len(c.errors)})")
    for s in c.errors:
        lines.append(f"  {_when(s.at)} {s.type}: {s.reason}")
    return lines


# --------------------------------------------------------------------------- command


def start_line(start: LogStart) -> str:
    """The answer's line saying what it read."""
    live = start.live_first_seq
    if start.live_only:
        return f"the live log starts at record {live}: records 1..{live - 1} were not read (--live-only)"
    if start.archive_segments == 0:
        return f"the live log starts at record {live}: records 1..{live - 1} are not in the archive, not read"
    segs = f"{start.archive_segments} archive segment{'s' if start.archive_segments != 1 else ''}"
    lacking = f" (lacking {'; '.join(start.missing)})" if start.missing else ""
    return f"the live log starts at record {live}: records before it read from {segs}{lacking}"


def run(args: Any, log: Reader) -> int:
    """``eventsrc audit device|pod|claim``: print the answer; 1 when records were corrupt.
    ``log`` is a ``History`` (the command) or the live log alone (the bench)."""
    import sys

    from eventsrc.log.history import History

    start = log_start(log) if isinstance(log, History) else None
    try:
        answer, lines = _answer(args, log)
    except NotInLogError as err:
        if start is None:
            raise
        raise NotInLogError(f"{err} ({start_line(start)})") from None
    if start is not None:
        answer.log = start
        lines.insert(1, start_line(start))
    if args.output == "json":
        sys.stdout.buffer.write(to_json(answer) + b"\n")
    else:
        from eventsrc.offline.render import text_lines

        sys.stdout.write(text_lines(lines) + "\n")
    sys.stdout.flush()
    if answer.corrupt:
        seqs = ", ".join(str(s) for s in sorted(set(answer.corrupt)))
        print(
            f"eventsrc: error: corrupt record(s) at sequence {seqs}; the answer holds every other record",
            file=sys.stderr,
        )
        return 1
    return 0


def _answer(args: Any, log: Reader) -> tuple[DeviceTimeline | PodHistory | ClaimHistory, list[str]]:
    what = args.audit
    if what == "device":
        since, until = parse_point(args.since, "--since"), parse_point(args.until, "--until")
        timeline = device_timeline(
            log, args.resource, args.device_id, since.ts_ns, until.ts_ns, since_seq=since.seq, until_seq=until.seq
        )
        return timeline, device_lines(timeline)
    if what == "pod":
        history = pod_history(log, args.pod)
        return history, pod_lines(history)
    if what == "claim":
        claim = claim_history(log, args.claim)
        return claim, claim_lines(claim)
    raise UsageError(f"unknown audit query {what!r}")
