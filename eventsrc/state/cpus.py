"""Exclusive CPU assignments and the CPU manager's policy configuration."""

from __future__ import annotations

from eventsrc import events as ev
from eventsrc.state.types import Handlers
from eventsrc.state.views import Views


def policy_changed(v: Views, seq: int, e: ev.PolicyConfigurationChanged) -> None:
    if e.manager == "cpu":
        v.cpus.policy = dict(e.new)


def cpus_assigned(v: Views, seq: int, e: ev.CPUsAssigned) -> None:
    v.cpus.assignments.setdefault(e.pod_uid, {})[e.container] = list(e.cpus)


def cpus_released(v: Views, seq: int, e: ev.CPUsReleased) -> None:
    pod = v.cpus.assignments.get(e.pod_uid)
    if pod is None:
        return
    pod.pop(e.container, None)
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
