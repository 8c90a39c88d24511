"""A stand-in for the daemon's recorder (``eventsrc.node.interfaces.Recorder``) in-process: real
views, each append applied to them as the daemon's committer does, no log."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import trio

from eventsrc import events as ev
from eventsrc.obs.logger import current_correlation_id
from eventsrc.obs.metrics import Metrics
from eventsrc.state.apply import apply_all
from eventsrc.state.views import Views

T = TypeVar("T", bound=ev.EventBase)


class FakeRecorder:
    """Views after every record, as the daemon's recorder keeps them. ``delay`` (mock seconds)
    stands for the fsync: a record that came after an answer would show as missing when the
    fake runtime reads that answer."""

    def __init__(self, *events: ev.EventBase, delay: float = 0.0, observe_delay: float = 0.0) -> None:
        self._views = Views()
        self.records: list[ev.Record] = []
        self.appends: list[list[ev.EventBase]] = []  # each decision's events, setup's excepted
        self.observations: list[list[ev.EventBase]] = []  # each observation's events
        self.delay = delay
        self.observe_delay = observe_delay  # mock seconds an observation's projection takes
        self._metrics = Metrics()
        if events:
            self._apply(events, "setup")

    @property
    def views(self) -> Views:
        return self._views

    @property
    def metrics(self) -> Metrics:
        return self._metrics

    def _apply(self, events: Sequence[ev.EventBase], cid: str) -> list[ev.Record]:
        start = len(self.records) + 1
        records = [
            ev.Record(seq=seq, ts_ns=seq, correlation_id=cid, version=1, event=e)  # type: ignore[arg-type]
            for seq, e in enumerate(events, start)
        ]
        apply_all(self._views, records)
        self.records += records
        return records

    async def record(self, events: Sequence[ev.EventBase], correlation_id: str | None = None) -> list[ev.Record]:
        if self.delay:
            await trio.sleep(self.delay)
        else:
            await trio.lowlevel.checkpoint()
        self.appends.append(list(events))
        return self._apply(events, correlation_id or "test")

    async def observe(self, observed: Callable[[], Sequence[ev.EventBase]]) -> list[ev.Record]:
        """As the committer's: in the views at once, nothing waited for (but ``observe_delay``)."""
        if self.observe_delay:
            await trio.sleep(self.observe_delay)
        events = observed()
        if not events:
            return []
        self.observations.append(list(events))
        return self._apply(events, current_correlation_id() or "test")

    def of(self, kind: type[T]) -> list[T]:
        return [r.event for r in self.records if isinstance(r.event, kind)]

    def kinds(self) -> list[str]:
        return [type(r.event).__name__ for r in self.records]
