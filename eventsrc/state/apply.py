"""``apply(views, record)``: the one way the views change.

Each domain module exports ``HANDLERS`` (event type -> reducer). A reducer takes the
views, the record's sequence and the event, and changes only those views. Every
reducer is total: any sequence of events, even a nonsensical one, leaves the views in
a defined state and never raises. That is what lets a snapshot plus a tail equal a full
replay, and lets a replay go on past a corrupt record.
"""

from __future__ import annotations

from collections.abc import Iterable

from eventsrc import events as ev
from eventsrc.events import CorruptRecordError, Record, ignorable
from eventsrc.state import claim_lifecycle, cpus, devices, kubelet, memory, pods, runtime
from eventsrc.state.lifecycles import Step
from eventsrc.state.types import Handlers, Reducer
from eventsrc.state.views import Views


def _meta_started(v: Views, seq: int, e: ev.DaemonStarted) -> None:
    m = v.meta
    m.boot_id = e.boot_id
    m.instance_id = e.instance_id
    m.version = e.version
    m.running = True
    m.boots += 1
    m.started_seq = seq
    m.config = dict(e.config)


def _meta_configured(v: Views, seq: int, e: ev.ConfigurationChanged) -> None:
    v.meta.config = dict(e.new)


def _meta_stopped(v: Views, seq: int, e: ev.DaemonStopped) -> None:
    v.meta.running = False
    v.meta.stopped_seq = seq


def _meta_corrupt(v: Views, seq: int, e: ev.CorruptRecordFound) -> None:
    v.meta.corrupt[e.seq] = e.reason
    if e.seq not in v.meta.corrupt_reported:
        v.meta.corrupt_reported.append(e.seq)


def _combine(*tables: Handlers) -> dict[type, tuple[Reducer, ...]]:
    out: dict[type, list[Reducer]] = {}
    for table in tables:
        for t, fn in table.items():
            out.setdefault(t, []).append(fn)
    return {t: tuple(fns) for t, fns in out.items()}


_META: Handlers = {
    ev.DaemonStarted: _meta_started,
    ev.DaemonStopped: _meta_stopped,
    ev.ConfigurationChanged: _meta_configured,
    ev.CorruptRecordFound: _meta_corrupt,
}

HANDLERS: dict[type, tuple[Reducer, ...]] = _combine(
    _META,
    devices.HANDLERS,
    pods.HANDLERS,
    cpus.HANDLERS,
    memory.HANDLERS,
    claim_lifecycle.HANDLERS,
    runtime.HANDLERS,
    kubelet.HANDLERS,
)


def lifecycle_steps(views: Views, event: ev.EventBase) -> list[Step]:
    """The lifecycle steps (pod, device hold, claim) ``event`` makes in ``views``, each with
    the state it arrives in and whether that state's row of its table expects it."""
    return [*pods.steps(views, event), *devices.steps(views, event), *claim_lifecycle.steps(views, event)]


def apply(views: Views, item: Record | CorruptRecordError) -> Views:
    """Fold one record (or a corrupt one, by naming it) into ``views``; returns ``views``."""
    if isinstance(item, CorruptRecordError):
        # A newer eventsrc's record that it declared safe to ignore changes nothing here.
        if not ignorable(item):
            views.meta.corrupt[item.seq] = item.reason
        views.meta.last_seq = max(views.meta.last_seq, item.seq)
        return views
    event = item.event
    seq = item.seq
    for fn in HANDLERS.get(type(event), ()):
        fn(views, seq, event)
    views.meta.last_seq = seq
    return views


def apply_all(views: Views, items: Iterable[Record | CorruptRecordError]) -> Views:
    handlers = HANDLERS
    meta = views.meta
    for item in items:
        if isinstance(item, CorruptRecordError):
            apply(views, item)
            continue
        event = item.event
        seq = item.seq
        for fn in handlers.get(type(event), ()):
            fn(views, seq, event)
        meta.last_seq = seq
    return views


def rebuild(items: Iterable[Record | CorruptRecordError]) -> Views:
    """The views of a whole log, from nothing."""
    return apply_all(Views(), items)
