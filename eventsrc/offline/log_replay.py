"""Replay an eventsrc log, read-only: the views at a point, every event with its change,
or a check of the invariants at every event.

    eventsrc replay [PATH] [--until SEQ|TIME] [--from SEQ] [--step] [--check] [-o table|json]
    tools/replay/replay.py PATH ...

PATH is a kubelet root (with eventsrc/log/ inside), the log directory itself, or a
directory holding a copied data.mdb (taken from another machine, say). The log is opened
read-only and without LMDB's lock file, so nothing is ever written to what is read.
Uses only eventsrc.log, eventsrc.state and eventsrc.core: never the daemon.

After retention cuts (docs/adr/0018) the replay starts at record 1 through the archive
segments in ``archive/`` beside the log directory (``eventsrc.log.history``), when they are
there and none is missing; with ``--live-only``, or when the archive lacks a range, it starts
from the views the log keeps at its base.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

from eventsrc.errors import EventsrcError

if TYPE_CHECKING:
    from eventsrc.core.invariants import Checker, Violation
    from eventsrc.events import CorruptRecordError, Record
    from eventsrc.log.history import History
    from eventsrc.offline.audit_queries import Point
    from eventsrc.state.views import DeviceView, RuntimeContainerView, Views

# The heavy modules (lmdb, msgspec, the projections) are imported where they are used:
# ``eventsrc`` builds this command's parser on every run.

T = TypeVar("T")

#: --reservation-window's default, as eventsrc.core.invariants has it.
DEFAULT_RESERVATION_WINDOW = 1000

#: ``--check``'s exit status when it found only what a kubelet beside eventsrc got wrong
#: (``eventsrc.core.invariants.FINDINGS``): 0 nothing found, 1 an invariant eventsrc keeps is
#: broken (or a record is corrupt), 2 a usage error, 3 and 4 a log eventsrc cannot read (newer,
#: damaged). Its own number, so that a health check can tell the kubelet's fault from eventsrc's.
FINDINGS_EXIT = 5

#: Replays shorter than this show no progress bar.
PROGRESS_MIN = 20_000


class UsageError(EventsrcError):
    exit_code = 2


def find_log(path: Path) -> Path:
    for candidate in (path / "eventsrc" / "log", path / "log", path):
        if (candidate / "data.mdb").is_file():
            return candidate
    if path.name == "data.mdb" and path.is_file():
        return path.parent
    raise EventsrcError(f"no eventsrc log at {path} (looked for eventsrc/log/data.mdb, log/data.mdb, data.mdb)")


# --------------------------------------------------------------------------- arguments


def parse_until(text: str | None) -> Point:
    """``SEQ`` (digits) or an RFC 3339 time, read as ``audit --until`` reads it."""
    from eventsrc.offline.audit_queries import parse_point

    return parse_point(text, "--until")


def add_arguments(p: argparse.ArgumentParser, path_required: bool = True) -> None:
    path_help = "kubelet root, log directory, or directory with a copied data.mdb"
    if path_required:
        p.add_argument("path", type=Path, help=path_help)
    else:
        p.add_argument("path", type=Path, nargs="?", default=None, help=path_help + " (default: --root-dir)")
    p.add_argument(
        "--until",
        default=None,
        metavar="SEQ|TIME",
        help="stop after record SEQ; or TIME (RFC 3339, e.g. 2026-11-21T23:40:00Z): the records stamped at or "
        "before TIME, in sequence order (a record stamped later is left out, even before one stamped earlier)",
    )
    p.add_argument(
        "--from",
        dest="from_seq",
        type=int,
        default=1,
        metavar="SEQ",
        help="with --step or --check: the first event shown or checked (default 1)",
    )
    p.add_argument(
        "--step", action="store_true", help="print every event with the change it made to the views, one line each"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="evaluate the invariants at every event; stop at the first that breaks one "
        "and print it with the events sharing its correlation id (exit 1). Beside a kubelet, what the kubelet "
        f"got wrong (a device or exclusive CPU it gave two pods at once) is a finding, not a broken invariant: "
        f"each is printed and the check goes on (exit {FINDINGS_EXIT} when findings are all it found). "
        "Exit 0: nothing found",
    )
    p.add_argument(
        "--reservation-window",
        type=int,
        default=DEFAULT_RESERVATION_WINDOW,
        metavar="ADMISSIONS",
        help="with --check: how many later admissions of the same daemon instance may get their outcome "
        "while a reservation has none, before it counts as dangling (default %(default)d; a restart that "
        "does not finish it counts at once). Counted in sequence order, never by the records' clock",
    )
    p.add_argument(
        "--live-only",
        action="store_true",
        help="replay only the live log, from the views at its base (by default, after retention cuts, from record 1 "
        "through the archive segments beside the log)",
    )
    p.add_argument(
        "-o", "--output", choices=["table", "json"], default="table", help="output format (default %(default)s)"
    )


# --------------------------------------------------------------------------- reading


class _Source(Protocol):
    def records(self, from_seq: int = 1, until_seq: int | None = None) -> Iterator[Record | CorruptRecordError]: ...


def _records(source: _Source, until: Point, from_seq: int = 1) -> Iterator[Record | CorruptRecordError]:
    """The records from ``from_seq`` up to ``until``, in sequence order. With a time: every
    record stamped at or before it, as ``audit --until`` filters. Stamps are the wall clock of
    each batch and may step back: a record stamped later than TIME is left out, and those after
    it still count."""
    for item in source.records(from_seq, until.seq):
        if until.ts_ns is not None and not isinstance(item, Exception) and item.ts_ns > until.ts_ns:
            continue
        yield item


@contextlib.contextmanager
def _progress(total: int, show: bool) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr for long replays, when a person is watching."""
    if not show or total < PROGRESS_MIN or not sys.stderr.isatty():
        yield lambda seq: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task("replaying", total=total)
        step = max(total // 200, 1)

        def advance(seq: int) -> None:
            if seq % step == 0:
                bar.update(task, completed=seq)

        yield advance


# --------------------------------------------------------------------------- --step


@dataclass(frozen=True)
class Change:
    what: str
    before: str
    after: str
    #: devices of one resource are shown together: (resource, device id)
    device: tuple[str, str] | None = None


Probe = tuple[str, Callable[[], str], "tuple[str, str] | None"]


def _device_state(views: Views, d: DeviceView | None) -> str:
    from eventsrc.core.invariants import who
    from eventsrc.state.lifecycles import DEVICE_ABSENT, FREE, RESERVED, parse_holder

    if d is None:
        return DEVICE_ABSENT
    holder = parse_holder(d.holder)
    if holder is None:
        state = FREE
    elif d.hold == RESERVED:
        state = f"reserved by {who(views, *holder)}"
    else:
        state = f"allocated to {who(views, *holder)}"
    if d.removed:
        return f"{state}, not listed"
    return state if d.health == "Healthy" else f"{state} ({d.health})"


def _cpus(ids: Iterable[int]) -> str:
    from eventsrc.core.cpu.cpuset import CPUSet

    s = str(CPUSet(ids))
    return s or "none"


def _short_id(runtime_id: str) -> str:
    """A runtime's id as crictl shows it (its first 12 characters)."""
    return runtime_id[:12]


def _pod_label(views: Views, pod_uid: str) -> str:
    """The pod's namespace/name from its admission, else from its sandbox, else its uid."""
    from eventsrc.core.invariants import who

    label = who(views, pod_uid)
    if label == pod_uid:
        sb = next((s for s in views.runtime.sandboxes.values() if s.uid == pod_uid and s.name), None)
        if sb is not None:
            label = f"{sb.namespace}/{sb.name}"
    return label


def _container_state(c: RuntimeContainerView | None, gone: str) -> str:
    if c is None:
        return gone
    if c.state == "stopped":
        return f"stopped (exit code {c.exit_code})" if c.exit_code != -1 else "stopped (exit code unknown)"
    return c.state


def _container_devices(c: RuntimeContainerView) -> str:
    parts = [f"{r} {_ids(ids)}" for r, ids in sorted(c.device_ids.items())]
    if c.devices:
        parts.append("nodes " + _ids(c.devices))
    if c.cdi_devices:
        parts.append("cdi " + _ids(c.cdi_devices))
    return ", ".join(parts) or "none"


def _probes(views: Views, rec: Record) -> list[Probe]:
    """What ``rec`` may change, each with a function giving its state now (called before
    and after the event is applied). Names are taken before, while the pod is known."""
    probes = _Probes(views, rec.event)
    probes.collect()
    return probes.out


class _Probes:
    """The probes of one event: one builder per kind of thing an event changes, and
    ``collect``, which says which things each event type changes."""

    def __init__(self, views: Views, event: Any) -> None:
        self.views = views
        self.e = event
        self.out: list[Probe] = []

    def device(self, resource: str, device_id: str) -> None:
        views = self.views

        def state() -> str:
            return _device_state(views, views.devices.devices.get(resource, {}).get(device_id))

        self.out.append((f"{device_id} {resource}", state, (resource, device_id)))

    def numa(self, resource: str, device_id: str) -> None:
        views = self.views

        def state() -> str:
            d = views.devices.devices.get(resource, {}).get(device_id)
            return ",".join(map(str, d.numa_nodes)) or "none" if d is not None else "none"

        self.out.append((f"NUMA nodes of {device_id} {resource}", state, None))

    def pod(self, ref_uid: str, name: str) -> None:
        from eventsrc import events as ev
        from eventsrc.state.lifecycles import POD_ABSENT

        views, e = self.views, self.e

        def state() -> str:
            p = views.pods.pods.get(ref_uid)
            if p is not None:
                return p.state
            if isinstance(e, ev.AdmissionRejected) and ref_uid in views.pods.rejected:
                return f"rejected ({views.pods.rejected[ref_uid]})"
            return "removed" if isinstance(e, ev.PodRemoved) else POD_ABSENT

        self.out.append((f"pod {name}", state, None))

    def cpus(self, pod_uid: str, container: str) -> None:
        from eventsrc.core.invariants import who

        views = self.views

        def state() -> str:
            return _cpus(views.cpus.assignments.get(pod_uid, {}).get(container, []))

        self.out.append((f"exclusive cpus of {who(views, pod_uid, container)}", state, None))

    def memory(self, pod_uid: str, container: str) -> None:
        from eventsrc.core.invariants import who

        views = self.views

        def state() -> str:
            blocks = views.memory.assignments.get(pod_uid, {}).get(container, [])
            return "; ".join(f"{b.type} {b.size} NUMA {','.join(map(str, b.numa_affinity))}" for b in blocks) or "-"

        self.out.append((f"memory of {who(views, pod_uid, container)}", state, None))

    def machine(self) -> None:
        from eventsrc.offline.render import short

        views = self.views

        def state() -> str:
            nodes = views.memory.machine
            return " ".join(f"{n}:{short(sizes)}" for n, sizes in sorted(nodes.items())) or "-"

        self.out.append(("memory machine", state, None))

    def claim(self, uid: str, namespace: str = "", name: str = "") -> None:
        from eventsrc.core.invariants import who
        from eventsrc.state.lifecycles import CLAIM, CLAIM_ABSENT, PREPARE_FAILED, UNPREPARE_FAILED

        views = self.views
        known = views.claims.claims.get(uid)
        if not name and known is not None:
            namespace, name = known.namespace, known.name
        label = f"{namespace}/{name}" if name else uid

        def state() -> str:
            c = views.claims.claims.get(uid)
            if c is None:
                return CLAIM_ABSENT
            pods = f" for {', '.join(who(views, p) for p in c.pods)}" if c.pods else ""
            error = f" ({c.error})" if c.error and c.state in (PREPARE_FAILED, UNPREPARE_FAILED) else ""
            return f"{CLAIM.label(c.state)}{error}{pods}"

        self.out.append((f"claim {label}", state, None))

    def plugin(self, resource: str, kind: str) -> None:
        views = self.views

        def state() -> str:
            table = views.claims.drivers if kind == "DRAPlugin" else views.devices.plugins
            p = table.get(resource)
            if p is None:
                return "none"
            return f"connected at {p.endpoint}" if p.connected else "disconnected"

        label = "DRA driver" if kind == "DRAPlugin" else "plugin"
        self.out.append((f"{label} {resource}", state, None))

    def runtime(self) -> None:
        r = self.views.runtime

        def state() -> str:
            if not r.runtime and not r.connected:
                return "none"
            return f"{r.runtime or '?'} connected ({r.mode})" if r.connected else f"{r.runtime or '?'} disconnected"

        self.out.append(("runtime", state, None))

    def sandbox(self, sandbox_id: str, pod_uid: str, pod_label: str = "") -> None:
        from eventsrc import events as ev

        views, e = self.views, self.e
        pod_label = pod_label or _pod_label(views, pod_uid)

        def state() -> str:
            if sandbox_id in views.runtime.sandboxes:
                return "running"
            return "removed" if isinstance(e, ev.PodSandboxRemoved) else "none"

        self.out.append((f"sandbox {_short_id(sandbox_id)} of {pod_label}", state, None))

    def container(self, container_id: str, pod_uid: str, name: str = "", *, what: str = "state") -> None:
        """The container's ``state``, its ``cpuset``, or (``created``) all it was created with,
        labelled with its name and pod."""
        from eventsrc import events as ev

        views, e = self.views, self.e
        known = views.runtime.containers.get(container_id)
        name = name or (known.name if known is not None else "")
        pod_uid = pod_uid or (known.pod_uid if known is not None else "")
        label = f"container {name + ' ' if name else ''}{_short_id(container_id)} of {_pod_label(views, pod_uid)}"
        gone = "removed" if isinstance(e, (ev.ContainerRemoved, ev.PodSandboxRemoved)) else "none"

        def state() -> str:
            return _container_state(views.runtime.containers.get(container_id), gone)

        def cpuset() -> str:
            c = views.runtime.containers.get(container_id)
            return f"cpus {_cpus(c.cpus)}, mems {_cpus(c.mems)}" if c is not None else "none"

        def created() -> str:
            c = views.runtime.containers.get(container_id)
            if c is None:
                return gone
            how = "set by eventsrc" if c.adjusted else "as the runtime applied it"
            return f"{c.state} ({how}): {cpuset()}; devices {_container_devices(c)}"

        if what == "state":
            self.out.append((label, state, None))
        elif what == "cpuset":
            self.out.append((f"cpuset of {label}", cpuset, None))
        else:
            self.out.append((label, created, None))

    def node(self) -> bool:
        """The daemon, a corrupt record's report, the configuration and the CPU policy;
        False when the event changes none of them."""
        from eventsrc import events as ev
        from eventsrc.offline.render import short

        views, e = self.views, self.e
        if isinstance(e, (ev.DaemonStarted, ev.DaemonStopped)):
            m = views.meta
            self.out.append(
                (
                    "daemon",
                    lambda: f"running (instance {m.instance_id[:8]}, version {m.version})" if m.running else "stopped",
                    None,
                )
            )
            self.runtime()  # a new run registers with the runtime again
        elif isinstance(e, ev.CorruptRecordFound):
            self.out.append(
                (
                    f"record {e.seq}",
                    lambda: "reported corrupt" if e.seq in views.meta.corrupt_reported else "not reported",
                    None,
                )
            )
        elif isinstance(e, ev.ConfigurationChanged):
            self.out.append(
                (
                    "configuration",
                    lambda: " ".join(f"{k}={short(views.meta.config.get(k))}" for k in e.changed) or "-",
                    None,
                )
            )
        elif isinstance(e, ev.PolicyConfigurationChanged):
            if e.manager == "cpu":
                self.out.append(
                    (
                        "cpu policy",
                        lambda: " ".join(f"{k}={short(v)}" for k, v in views.cpus.policy.items()) or "none",
                        None,
                    )
                )
        else:
            return False
        return True

    def collect(self) -> None:
        from eventsrc import events as ev
        from eventsrc.core.invariants import who
        from eventsrc.state.lifecycles import DRIVER_EVENTS

        views, e = self.views, self.e
        if self.node():
            return
        if isinstance(e, (ev.PluginRegistered, ev.PluginDisconnected)):
            self.plugin(e.resource, e.kind)
        elif isinstance(e, ev.DevicesAdded):
            for d in e.devices:
                self.device(e.resource, d.id)
        elif isinstance(
            e, (ev.DevicesRemoved, ev.DevicesReserved, ev.DevicesAllocated, ev.AllocationFailed, ev.DevicesReleased)
        ):
            for device_id in e.device_ids:
                self.device(e.resource, device_id)
        elif isinstance(e, ev.ResourceDropped):
            self.plugin(e.resource, "DevicePlugin")
            for device_id in views.devices.devices.get(e.resource, {}):
                self.device(e.resource, device_id)
        elif isinstance(e, ev.DeviceHealthChanged):
            self.device(e.resource, e.device_id)
            self.numa(e.resource, e.device_id)
        elif isinstance(
            e,
            (
                ev.PodAdmissionStarted,
                ev.ContainerAdmissionStarted,
                ev.ContainerAdmitted,
                ev.PodAdmitted,
                ev.AdmissionRejected,
            ),
        ):
            self.pod(e.pod.uid, f"{e.pod.namespace}/{e.pod.name}" if e.pod.name else e.pod.uid)
        elif isinstance(e, ev.PodRemoved):
            self.pod(e.pod_uid, who(views, e.pod_uid))
        elif isinstance(e, (ev.CPUsAssigned, ev.CPUsReleased)):
            self.cpus(e.pod_uid, e.container)
        elif isinstance(e, (ev.MemoryAssigned, ev.MemoryReleased)):
            self.memory(e.pod_uid, e.container)
        elif isinstance(e, ev.MemoryMachineChanged):
            self.machine()
        elif isinstance(e, ev.SharedPoolChanged):
            self.out.append(("shared pool", lambda: _cpus(views.cpus.shared), None))
        elif isinstance(e, DRIVER_EVENTS):
            self.claim(e.claim.uid, e.claim.namespace, e.claim.name)
        elif isinstance(e, (ev.PodReferenceAdded, ev.PodReferenceRemoved)):
            self.claim(e.claim_uid)
        elif isinstance(e, (ev.RuntimeConnected, ev.RuntimeDisconnected)):
            self.runtime()
        elif isinstance(e, ev.PodSandboxStarted):
            self.sandbox(e.sandbox_id, e.pod.uid, f"{e.pod.namespace}/{e.pod.name}" if e.pod.name else "")
        elif isinstance(e, ev.PodSandboxRemoved):
            self.sandbox(e.sandbox_id, e.pod_uid)
            for cid, c in views.runtime.containers.items():  # removed with it
                if c.sandbox_id == e.sandbox_id:
                    self.container(cid, c.pod_uid, c.name)
        elif isinstance(e, ev.ContainerCreated):
            self.container(e.container_id, e.pod_uid, e.name, what="created")
        elif isinstance(e, (ev.ContainerStarted, ev.ContainerStopped, ev.ContainerRemoved)):
            self.container(e.container_id, e.pod_uid)
        elif isinstance(e, ev.ContainerCPUsUpdated):
            self.container(e.container_id, e.pod_uid, what="cpuset")


def step(views: Views, item: Record | CorruptRecordError) -> list[Change]:
    """Apply ``item`` to ``views`` and return what it changed."""
    from eventsrc.state.apply import apply

    return _tracked(views, item, lambda: apply(views, item))[1]


def _tracked(views: Views, item: Record | CorruptRecordError, do: Callable[[], T]) -> tuple[T, list[Change]]:
    """Run ``do`` (which applies ``item`` to ``views``) and return its result and what changed."""
    if isinstance(item, Exception):
        return do(), []
    probes = _probes(views, item)
    before = [state() for _, state, _ in probes]
    result = do()
    return result, [
        Change(what, b, a, device)
        for (what, state, device), b in zip(probes, before, strict=True)
        if (a := state()) != b
    ]


def _ids(ids: list[str], limit: int = 8) -> str:
    if len(ids) <= limit:
        return ",".join(ids)
    return ",".join(ids[:limit]) + f",… (+{len(ids) - limit})"


def change_text(rec: Record, changes: list[Change]) -> str:
    """The changes of one event as one readable line."""
    from eventsrc.events import LogTrimmed

    if isinstance(rec.event, LogTrimmed):  # no change to the views: the history moved
        from eventsrc.offline.render import trimmed

        return "log trimmed: " + trimmed(rec.event)
    from eventsrc.offline.render import observed_summary

    observed = observed_summary(rec.event)
    if observed is not None:  # the kubelet's decision (or a gap): its own view, not eventsrc's
        return observed
    if not changes:
        from eventsrc.offline.render import record_summary

        summary = record_summary(rec)
        return "no change to the views" + (f" ({summary})" if summary else "")
    parts: list[str] = []
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for c in changes:
        if c.device is None:
            parts.append(f"{c.what}: {c.before} -> {c.after}")
            continue
        key = (c.device[0], c.before, c.after)
        if key not in grouped:
            grouped[key] = []
            parts.append("")  # placeholder, filled below in order
            grouped[key].append(str(len(parts) - 1))
        grouped[key].append(c.device[1])
    for (resource, before, after), (index, *ids) in grouped.items():
        parts[int(index)] = f"{_ids(ids)} {resource}: {before} -> {after}"
    reason = getattr(rec.event, "reason", "")
    text = "; ".join(parts)
    return f"{text} ({reason})" if reason and reason not in text else text


def step_line(item: Record | CorruptRecordError, changes: list[Change]) -> str:
    """One event and what it changed, on one line, escaped (``render.escape``)."""
    from eventsrc.offline.render import escape

    return escape(_step_line(item, changes))


def _step_line(item: Record | CorruptRecordError, changes: list[Change]) -> str:
    from eventsrc.events import FutureRecordError
    from eventsrc.offline.render import iso, raw_body

    if isinstance(item, FutureRecordError):  # shown raw: this code cannot say what it changed
        head = f"{item.seq:>8}  {iso(item.ts_ns)}  {item.type_name + '?':<26}"
        return f"{head}  {raw_body(item)} (v{item.version}, from a newer eventsrc; not applied)"
    if isinstance(item, Exception):
        return f"{item.seq:>8}  {'?':<27}  {'CORRUPT':<26}  {item.reason}"
    return f"{item.seq:>8}  {iso(item.ts_ns)}  {item.type:<26}  {change_text(item, changes)}"


def step_json(item: Record | CorruptRecordError, changes: list[Change]) -> dict[str, Any]:
    from eventsrc.offline.render import record_json

    out = record_json(item)
    if not isinstance(item, Exception):
        out["changes"] = [{"what": c.what, "before": c.before, "after": c.after} for c in changes]
        out["summary"] = change_text(item, changes)
    return out


# --------------------------------------------------------------------------- --check

#: The rules checked here beside ``eventsrc.core.invariants.RULES``: the runtime's, whose
#: decisions are ``eventsrc.core.runtime_decisions.container_not_held`` and ``devices_shared``.
RUNTIME_RULES: dict[str, str] = {
    "container-not-held": "a container eventsrc adjusted runs only with the CPUs and devices its pod holds",
    "device-in-two-containers": "no device runs in two running containers",
}


def rule_text(rule: str) -> str:
    from eventsrc.core.invariants import FINDINGS, RULES

    return RULES.get(rule) or FINDINGS.get(rule) or RUNTIME_RULES.get(rule, "")


def feed(checker: Checker, item: Record | CorruptRecordError) -> list[Violation]:
    """``checker.feed``, and the runtime's rules (judged on the views with the event applied):
    ``container-not-held`` at each ContainerCreated or ContainerCPUsUpdated,
    ``device-in-two-containers`` at each ContainerStarted."""
    from eventsrc import events as ev
    from eventsrc.core.runtime_decisions import container_not_held, devices_shared

    out = checker.feed(item)
    if isinstance(item, Exception):
        return out
    e, views = item.event, checker.views
    if isinstance(e, (ev.ContainerCreated, ev.ContainerCPUsUpdated)):
        cid = e.container_id
        out += _violation(checker, item, cid, "container-not-held", container_not_held(views, cid))
    elif isinstance(e, ev.ContainerStarted):
        cid = e.container_id
        out += _violation(checker, item, cid, "device-in-two-containers", devices_shared(views, cid))
    return out


def _violation(checker: Checker, item: Record, container_id: str, rule: str, reasons: list[str]) -> list[Violation]:
    from eventsrc.core.invariants import Violation

    if not reasons:
        return []
    c = checker.views.runtime.containers[container_id]
    message = f"container {c.name} ({container_id}) of {_pod_label(checker.views, c.pod_uid)} " + "; ".join(reasons)
    return [Violation(rule, message, item.seq, item.correlation_id, item.seq)]


def correlated(log: History, correlation_id: str) -> list[Record]:
    """Every record of the log with ``correlation_id``, in order."""
    if not correlation_id:
        return []
    return [r for r in log.records(1) if not isinstance(r, Exception) and r.correlation_id == correlation_id]


def print_violation(v: Violation, related: list[Record], output: str) -> None:
    from eventsrc.offline.render import RECORD_HEADER, record_json, record_line, text_lines

    culprit = next((r for r in related if r.seq == v.seq), None)
    kind = "finding" if v.finding else "violation"
    if output == "json":
        print(
            json.dumps(
                {
                    "ok": False,
                    kind: {
                        "rule": v.rule,
                        "invariant": rule_text(v.rule),
                        "message": v.message,
                        "seq": v.seq,
                        "detected_seq": v.detected_seq,
                        "correlation_id": v.correlation_id,
                    },
                    "event": record_json(culprit) if culprit is not None else None,
                    "correlated": [record_json(r) for r in related],
                }
            )
        )
        return
    head = "finding about the kubelet" if v.finding else "invariant broken"
    lines = [f"{head} at seq {v.seq}: {v.rule} ({rule_text(v.rule)})", f"  {v.message}"]
    if v.detected_seq != v.seq:
        lines.append(f"  seen after seq {v.detected_seq}")
    if culprit is not None:
        lines += ["event:", "  " + record_line(culprit)]
    lines.append(f"events with correlation id {v.correlation_id or '-'} ({len(related)}):")
    lines.append("  " + RECORD_HEADER)
    lines += [("> " if r.seq == v.seq else "  ") + record_line(r) for r in related]
    print(text_lines(lines))


# --------------------------------------------------------------------------- commands


def run(args: argparse.Namespace) -> int:
    """The replay, from parsed arguments (``eventsrc replay`` and tools/replay share it)."""
    from eventsrc.log.history import History, archive_dir_of
    from eventsrc.log.store import EventLog
    from eventsrc.offline.render import escape

    until = parse_until(args.until)
    if args.from_seq < 1:
        raise UsageError("--from must be at least 1")
    if args.reservation_window < 0:
        raise UsageError("--reservation-window must not be negative")
    path = args.path
    if path is None:
        root = getattr(args, "root_dir", None)
        if root is None:
            raise UsageError("no PATH given")
        path = Path(root)
    log_dir = find_log(path)
    log = EventLog(log_dir, readonly=True, lock=False)
    try:
        history = History(log, archive_dir_of(log_dir), live_only=getattr(args, "live_only", False))
        prog = getattr(args, "prog", "eventsrc")
        # Where the live log starts: in the views' table when there is one, else on stderr.
        tabled = not (args.step or args.check or args.output == "json")
        for note in ("" if tabled else history.start_note(), history.missing_note()):
            if note:
                print(f"{prog}: {escape(note)}", file=sys.stderr)
        views = history.start_views(until.seq, until.ts_ns)
        total = until.seq if until.seq is not None else log.last_seq()
        if args.check:
            return _check(history, views, until, args, total)
        if args.step:
            return _step(history, views, until, args, total)
        return _views(history, views, until, args, total)
    finally:
        log.close()


def _corrupt_note(views: Views, prog: str) -> int:
    if views.meta.corrupt:
        seqs = ", ".join(map(str, sorted(views.meta.corrupt)))
        print(f"{prog}: corrupt record(s) at sequence {seqs}", file=sys.stderr)
        return 1
    return 0


def _views(history: History, views: Views, until: Point, args: argparse.Namespace, total: int) -> int:
    import msgspec

    from eventsrc.state.apply import apply

    with _progress(total, True) as advance:
        for item in _records(history, until, views.meta.last_seq + 1):
            apply(views, item)
            advance(item.seq)
    if args.output == "json":
        print(msgspec.json.encode(views).decode())
    else:
        from eventsrc.offline.render import console, views_tables

        out = console()
        for table in views_tables(views, history.start_note()):
            out.print(table)
    return _corrupt_note(views, getattr(args, "prog", "eventsrc"))


def _step(history: History, views: Views, until: Point, args: argparse.Namespace, total: int) -> int:
    as_json = args.output == "json"
    write = sys.stdout.write
    with _progress(total, not sys.stdout.isatty()) as advance:
        for item in _records(history, until, views.meta.last_seq + 1):
            changes = step(views, item)
            advance(item.seq)
            if item.seq < args.from_seq:
                continue
            if as_json:
                write(json.dumps(step_json(item, changes)) + "\n")
            else:
                write(step_line(item, changes) + "\n")
    sys.stdout.flush()
    return _corrupt_note(views, getattr(args, "prog", "eventsrc"))


def _group_complete(log: History, checker: Checker) -> bool:
    """Whether the replay's last run of records sharing a correlation id ends with it
    (false when --until stopped inside it)."""
    if not checker.group:
        return True
    last = checker.group[-1]
    after = next(iter(log.records(last.seq + 1, last.seq + 1)), None)
    return after is None or isinstance(after, Exception) or after.correlation_id != last.correlation_id


def _check(log: History, views: Views, until: Point, args: argparse.Namespace, total: int) -> int:
    from eventsrc.core.invariants import Checker

    # From the base's views the checker knows nothing of admissions under way at the base.
    checker = Checker(views=views, reservation_window=args.reservation_window)
    as_json = args.output == "json"
    found: Violation | None = None
    findings = 0  # what the kubelet got wrong: printed as seen, and the check goes on
    with _progress(total, not (args.step and sys.stdout.isatty())) as advance:
        for item in _records(log, until, views.meta.last_seq + 1):
            if args.step:
                # --step with --check: each line, and the check stops after the guilty one.
                violations, changes = _tracked(checker.views, item, functools.partial(feed, checker, item))
                if item.seq >= args.from_seq:
                    line = json.dumps(step_json(item, changes)) if as_json else step_line(item, changes)
                    sys.stdout.write(line + "\n")
            else:
                violations = feed(checker, item)
            advance(item.seq)
            findings += _print_findings(log, violations, args)
            found = next((v for v in violations if v.seq >= args.from_seq and not v.finding), None)
            if found is not None:
                break
        else:
            violations = checker.finish(_group_complete(log, checker))
            findings += _print_findings(log, violations, args)
            found = next((v for v in violations if v.seq >= args.from_seq and not v.finding), None)
    if found is not None:
        print_violation(found, correlated(log, found.correlation_id), args.output)
        return 1
    if as_json:
        summary: dict[str, Any] = {"ok": not findings, "events": checker.events}
        print(json.dumps(summary | ({"findings": findings} if findings else {})))
    else:
        kubelet = f"; {findings} finding(s) about the kubelet" if findings else ""
        print(f"no invariant broken in {checker.events} events{kubelet}")
    corrupt = _corrupt_note(checker.views, getattr(args, "prog", "eventsrc"))
    return corrupt or (FINDINGS_EXIT if findings else 0)


def _print_findings(log: History, violations: list[Violation], args: argparse.Namespace) -> int:
    """Each finding about the kubelet among ``violations`` printed; how many."""
    shown = [v for v in violations if v.finding and v.seq >= args.from_seq]
    for v in shown:
        print_violation(v, correlated(log, v.correlation_id), args.output)
    return len(shown)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="replay", description=(__doc__ or "").split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    args.prog = "replay"
    try:
        return run(args)
    except EventsrcError as err:
        from eventsrc.offline.render import escape

        print(f"replay: error: {escape(str(err))}", file=sys.stderr)
        return err.exit_code
    except BrokenPipeError:
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
