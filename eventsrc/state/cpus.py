"""Exclusive CPU assignments and the CPU manager's policy configuration.

Beside the assignments, ``CPUIndex`` counts the containers holding each CPU, so that the
shared pool (every CPU but the assigned ones) is worked out without a pass over every pod.
Like the device index (``state.devices``), it is derived from the view alone, never in a
snapshot, built the first time it is asked for and kept by the reducers below.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from eventsrc import events as ev
from eventsrc.state.types import Handlers
from eventsrc.state.views import CPUsView, Views, index_beside, index_built


@dataclass
class CPUIndex:
    source: dict[str, dict[str, list[int]]] = field(compare=False, repr=False)
    # cpu -> how many containers hold it (each container's CPUs counted once)
    holders: dict[int, int] = field(default_factory=dict)

    @classmethod
    def build(cls, assignments: dict[str, dict[str, list[int]]]) -> CPUIndex:
        index = cls(assignments)
        for containers in assignments.values():
            for cpus in containers.values():
                index.count(cpus, 1)
        return index

    def count(self, cpus: Iterable[int], n: int) -> None:
        for cpu in set(cpus):
            self.holders[cpu] = self.holders.get(cpu, 0) + n
            if not self.holders[cpu]:
                del self.holders[cpu]

    def assigned(self, without_pod: str = "") -> set[int]:
        """Every CPU a container holds (``without_pod``: but those only that pod's hold)."""
        own: dict[int, int] = {}
        for cpus in self.source.get(without_pod, {}).values() if without_pod else ():
            for cpu in set(cpus):
                own[cpu] = own.get(cpu, 0) + 1
        return {cpu for cpu, n in self.holders.items() if n > own.get(cpu, 0)}


def index_of(view: CPUsView) -> CPUIndex:
    """The index of ``view``'s assignments, built the first time it is asked for."""
    return index_beside(view, view.assignments, CPUIndex.build)


def _indexed(v: Views, cpus: Iterable[int], n: int) -> None:
    index: CPUIndex | None = index_built(v.cpus, v.cpus.assignments)
    if index is not None:
        index.count(cpus, n)


def policy_changed(v: Views, seq: int, e: ev.PolicyConfigurationChanged) -> None:
    if e.manager == "cpu":
        v.cpus.policy = dict(e.new)


def cpus_assigned(v: Views, seq: int, e: ev.CPUsAssigned) -> None:
    pod = v.cpus.assignments.setdefault(e.pod_uid, {})
    _indexed(v, pod.get(e.container, ()), -1)
    pod[e.container] = list(e.cpus)
    _indexed(v, e.cpus, 1)


def cpus_released(v: Views, seq: int, e: ev.CPUsReleased) -> None:
    pod = v.cpus.assignments.get(e.pod_uid)
    if pod is None:
        return
    _indexed(v, pod.pop(e.container, ()), -1)
    if not pod:
        del v.cpus.assignments[e.pod_uid]


def shared_pool_changed(v: Views, seq: int, e: ev.SharedPoolChanged) -> None:
    v.cpus.shared = list(e.cpus)


HANDLERS: Handlers = {
    ev.SharedPoolChanged: shared_pool_changed,
    ev.PolicyConfigurationChanged: policy_changed,
    ev.CPUsAssigned: cpus_assigned,
    ev.CPUsReleased: cpus_released,
}
