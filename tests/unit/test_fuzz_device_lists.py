"""Fuzzing the ListAndWatch handling in process: generated device lists (IDs empty, repeated,
with control characters or long; NUMA ids negative, huge or outside the machine; health
strings of any kind) go through the checks and the diff a plugin's list gets
(``check_device_list``, ``list_and_watch_events``), are recorded and applied as the daemon
does, and pods are admitted over the result under every topology policy.

What must hold whatever a plugin sends:

* nothing raises: the checks, the diff, the reducers, the admission's phases;
* every device recorded has a non-empty ID, named once per list;
* no device is held by two pods, and a pod is only given devices nobody holds;
* the topology manager is only ever handed hints over the machine's NUMA nodes.

``EVENTSRC_FUZZ_EXAMPLES`` sets the number of cases (default 300, a few seconds).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from eventsrc import events as ev
from eventsrc.core.admission import (
    AdmissionConfig,
    CallResults,
    Intent,
    PluginWanted,
    PodAdmission,
    PreferredAsk,
    Refused,
)
from eventsrc.core.cpu.assignment import StaticPolicyOptions
from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.core.cpu.static import CPUManagerConfig
from eventsrc.core.devices.holds import check_device_list, list_and_watch_events
from eventsrc.core.topology_manager import parse_topology_manager
from eventsrc.events import decode_record, encode_payload
from eventsrc.state.apply import apply
from eventsrc.state.lifecycles import parse_holder
from eventsrc.state.views import Views
from tests.unit.test_device_core import RecordingPolicy, machine_of

EXAMPLES = int(os.environ.get("EVENTSRC_FUZZ_EXAMPLES", "300"))
GPU = "example.com/gpu"

# --------------------------------------------------------------------------- what a plugin sends

POOL = ["", *(f"d{i}" for i in range(16))]  # small names, so that lists repeat them
ids = st.one_of(
    st.sampled_from(POOL),
    st.sampled_from(POOL),
    st.sampled_from(POOL),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=12),  # control and bidi characters
    st.text(alphabet="ab", min_size=200, max_size=1024),  # long (the shell cuts off past 1024 bytes)
)
numa_ids = st.one_of(
    st.integers(0, 3),
    st.integers(-2, 9),
    st.sampled_from([23, 63, 64, 65]),
    st.integers(-(1 << 63), (1 << 63) - 1),  # the protobuf field is an int64
)
healths = st.one_of(st.just("Healthy"), st.just("Healthy"), st.just("Unhealthy"), st.text(max_size=16))
devices = st.builds(ev.DeviceInfo, id=ids, health=healths, numa_nodes=st.lists(numa_ids, max_size=3))
device_lists = st.lists(devices, max_size=32)

MACHINES = {
    1: [0],
    2: [0, 1],
    4: [0, 1, 2, 3],
}
POLICIES = [
    ("none", "container"),
    ("best-effort", "container"),
    ("best-effort", "pod"),
    ("restricted", "container"),
    ("single-numa-node", "pod"),
    ("single-numa-node", "container"),
]


@dataclass(frozen=True)
class Pod:
    """What ``PodAdmission`` reads of a pod (``eventsrc.core.admission.Pod``)."""

    pod: ev.PodRef
    containers: list[ev.ContainerSpec]
    claims: list[Any] = field(default_factory=list)
    source: str = ""


def container(name: str, count: int, kind: str) -> ev.ContainerSpec:
    limits = {GPU: str(count)}
    return ev.ContainerSpec(name=name, kind=kind, requests=limits, limits=limits)


pods = st.lists(
    st.tuples(st.integers(1, 6) | st.integers(1, 24), st.sampled_from(["app", "app", "init"])), min_size=1, max_size=2
)


# --------------------------------------------------------------------------- the node


class Node:
    def __init__(self, numa_nodes: int, policy: str, scope: str) -> None:
        self.views = Views()
        self.machine = MACHINES[numa_nodes]
        topology = parse_topology_manager(policy, scope, {}, self.machine)
        self.policy = RecordingPolicy(topology.policy)
        cpus = CPUManagerConfig("none", machine_of(numa_nodes), CPUSet(), StaticPolicyOptions())
        self.config = AdmissionConfig(cpus, replace(topology, policy=self.policy), 30.0)
        self.record([ev.PluginRegistered(resource=GPU, endpoint="gpu.sock")])

    def record(self, events: list[ev.EventBase]) -> None:
        """Through the log's encoding and the reducers, as the daemon's committer applies them."""
        for e in events:
            seq = self.views.meta.last_seq + 1
            apply(self.views, decode_record(seq, encode_payload(e, seq, "cid")))

    def listed(self, update: list[ev.DeviceInfo]) -> None:
        """A ListAndWatch list, as the device manager records it."""
        known = {i: d for i, d in self.views.devices.devices.get(GPU, {}).items() if not d.removed}
        checked = check_device_list(update, self.machine)
        events = list_and_watch_events(GPU, known, update, self.machine)
        for e in events:
            if isinstance(e, ev.DevicesAdded):
                named = [d.id for d in e.devices]
                assert all(named) and len(named) == len(set(named)), named
                assert all(n >= 0 for d in e.devices for n in d.numa_nodes)
            if isinstance(e, ev.DeviceHealthChanged):
                assert e.device_id and all(n >= 0 for n in e.numa_nodes)
        self.record(events)
        for kind, found in (
            ("refused", checked.refused),
            ("duplicate", checked.duplicates),
            ("outside", checked.outside),
        ):
            if found:
                event(f"a list with a device {kind}")
        taken = {d.id for d in checked.devices}
        listed = {i for i, d in self.views.devices.devices.get(GPU, {}).items() if not d.removed}
        assert listed == taken  # the views hold the list as it was taken, no more

    def holders(self) -> dict[str, str]:
        return {i: d.holder for i, d in self.views.devices.devices.get(GPU, {}).items() if d.holder}

    def admit(self, uid: str, counts: list[tuple[int, str]], answer: Any) -> None:
        spec = Pod(
            pod=ev.PodRef(uid=uid, namespace="fuzz", name=uid),
            containers=[container(f"c{i}", n, kind) for i, (n, kind) in enumerate(counts)],
        )
        before = self.holders()
        core = PodAdmission(self.views, self.config, spec)
        assert core.known() is None
        find = core.find()
        try:
            question = next(find)
            while True:
                assert isinstance(question, PluginWanted)
                question = find.send(ev.PluginOptions(get_preferred_allocation_available=True))
        except StopIteration as stop:
            refused = stop.value
        if refused is not None:
            event("pod refused: no plugin")
            self.record([refused.event])
            return
        plan = core.plan()
        try:
            ask = next(plan)
            while True:
                assert isinstance(ask, PreferredAsk)
                ask = plan.send(answer(ask))
        except StopIteration as stop:
            decision = stop.value
        if isinstance(decision, Refused):
            event("pod refused")
            self.record([decision.event])
            return
        event("pod admitted")
        assert isinstance(decision, Intent)
        for e in decision.events:
            if isinstance(e, ev.DevicesReserved):
                assert all(i not in before for i in e.device_ids), (e.device_ids, before)
        self.record(decision.events)
        results = CallResults(
            allocated=[(c, ev.ContainerAllocation(envs={"N": str(len(c.device_ids))})) for c in decision.allocations]
        )
        settle = core.settle(results)
        try:
            batch = next(settle)
            while True:
                self.record(batch)
                batch = settle.send(None)
        except StopIteration:
            pass

    def check(self) -> None:
        table = self.views.devices.devices.get(GPU, {})
        assert all(table), "a device with an empty ID was recorded"
        given: dict[str, str] = {}  # device -> the pod that holds it (init containers hand theirs on)
        for uid, pod in self.views.pods.pods.items():
            for c in pod.containers.values():
                for device_id in set(c.devices.get(GPU, [])):
                    assert given.setdefault(device_id, uid) == uid, f"{device_id} held by {given[device_id]} and {uid}"
        for device_id, d in table.items():
            holder = parse_holder(d.holder)
            assert (holder.pod_uid if holder else None) == given.get(device_id), (device_id, d, given)
        assert {n for hint in self.policy.seen for n in hint.nodes() or []} <= set(self.machine)


def prefer(data: st.DataObject) -> Any:
    """A plugin's GetPreferredAllocation answer: any of its candidates, or names it made up."""

    def answer(ask: PreferredAsk) -> list[str]:
        picked = data.draw(st.lists(st.sampled_from(ask.available), max_size=ask.size + 1), label="preferred")
        return picked + data.draw(st.lists(ids, max_size=2), label="made up")

    return answer


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    numa_nodes=st.sampled_from(sorted(MACHINES)),
    policy=st.sampled_from(POLICIES),
    steps=st.lists(st.tuples(device_lists, st.none() | pods), min_size=1, max_size=4),
    data=st.data(),
)
def test_whatever_a_plugin_lists_the_devices_stay_named_single_held_and_aligned_on_the_machine(
    numa_nodes: int, policy: tuple[str, str], steps: list[tuple[list[ev.DeviceInfo], Any]], data: st.DataObject
) -> None:
    node = Node(numa_nodes, *policy)
    for i, (update, pod) in enumerate(steps):
        node.listed(update)
        node.check()
        if pod is not None:
            node.admit(f"pod-{i}", pod, prefer(data))
            node.check()
