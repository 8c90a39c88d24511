"""The device manager's pure decisions: resource names and registration checks
(eventsrc.core.devices.names), ListAndWatch diffs and what a restart must finish
(eventsrc.core.devices.holds). Tables first, tests below.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from eventsrc import events as ev
from eventsrc.core.admission import AdmissionConfig, Intent, PluginWanted, PodAdmission, Refused
from eventsrc.core.cpu.assignment import StaticPolicyOptions
from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.core.cpu.static import CPUManagerConfig
from eventsrc.core.cpu.topology import Core, MachineInfo, discover
from eventsrc.core.cpu.topology import Node as CPUNode
from eventsrc.core.devices.choice import MAX_EXACT_PACKING_NODES, _count_per_set
from eventsrc.core.devices.holds import (
    DEVICES_PER_RECORD,
    check_device_list,
    list_and_watch_events,
    restart_events,
)
from eventsrc.core.devices.names import (
    endpoint_error,
    is_extended_resource_name,
    registration_error,
)
from eventsrc.core.topology_manager import Policy, ProviderHints, TopologyHint, parse_topology_manager
from eventsrc.events import Record, decode_record, encode_payload
from eventsrc.inputs.manifest import PodSpec
from eventsrc.state.apply import apply, rebuild
from eventsrc.state.views import Views

# ============================================================= is_extended_resource_name
# apimachinery/kubelet IsExtendedResourceName: has a "/", does not contain "kubernetes.io/",
# does not start with "requests.", and "requests." + name is a qualified name (a DNS-1123
# subdomain prefix of at most 253 characters, a 1-63 character name part).


def _domain(*label_lengths: int) -> str:
    return ".".join("a" * n for n in label_lengths)


EXTENDED_RESOURCE_NAMES: list[tuple[str, bool]] = [
    ("example.com/gpu", True),
    ("vendor.example.com/a_b.c-1", True),
    ("nvidia.com/gpu", True),
    ("a/b", True),
    ("example.com/GPU", True),  # the name part may be upper case
    ("example.com/kubernetes.io", True),  # only "kubernetes.io/" is reserved
    ("example.com/" + "a" * 63, True),
    (_domain(61, 60, 60, 60) + "/x", True),  # "requests." + 244 = 253 characters
    ("gpu", False),
    ("", False),
    ("kubernetes.io/gpu", False),
    ("example.kubernetes.io/x", False),
    ("requests.example.com/x", False),
    ("Example.com/gpu", False),  # upper case domain
    ("exa_mple.com/gpu", False),
    ("example.com/", False),  # empty name part
    ("/gpu", False),
    ("example.com/-bad", False),
    ("example.com/bad-", False),
    ("example.com/g pu", False),
    ("a/b/c", False),
    ("example.com/" + "a" * 64, False),
    (_domain(61, 61, 60, 60) + "/x", False),  # "requests." + 245 = 254 characters
    ("example.com/gpu\n", False),  # Go's $ is the end of the text, not before a newline
    ("example.com\n/gpu", False),
]

# ==================================================================== registration_error
# The kubelet's Register: the version first, then the name; fmt's %q quoting.

V1BETA1_ONLY = ' is not supported by kubelet. Supported version is ["v1beta1"]'
REGISTRATIONS: list[tuple[str, str, str]] = [
    ("v1beta1", "example.com/gpu", ""),
    ("v1alpha", "example.com/gpu", 'requested API version "v1alpha"' + V1BETA1_ONLY),
    ("", "example.com/gpu", 'requested API version ""' + V1BETA1_ONLY),
    ("v1alpha", "gpu", 'requested API version "v1alpha"' + V1BETA1_ONLY),  # the version is checked first
    ("v1\n", "example.com/gpu", 'requested API version "v1\\n"' + V1BETA1_ONLY),
    ("v1beta1", "gpu", 'the ResourceName "gpu" is invalid'),
    ("v1beta1", "kubernetes.io/gpu", 'the ResourceName "kubernetes.io/gpu" is invalid'),
    ("v1beta1", "", 'the ResourceName "" is invalid'),
    ("v1beta1", 'example.com/a"b', 'the ResourceName "example.com/a\\"b" is invalid'),
    ("v1beta1", "example.com/a\\b\t", 'the ResourceName "example.com/a\\\\b\\t" is invalid'),
]

# ======================================================================== endpoint_error
# eventsrc's rule: a plain file name inside the device-plugin directory.

ENDPOINTS: list[tuple[str, bool]] = [
    ("plugin.sock", True),
    ("nvidia-gpu.sock", True),
    ("", False),
    ("a/b", False),
    ("/var/lib/kubelet/device-plugins/x.sock", False),
    ("../x", False),
    ("..", False),
    (".", False),
    ("a\\b", False),
    ("a\x00b", False),
    ("kubelet.sock", False),
]

# ================================================================= list_and_watch_events
# ``before``: the log so far; ``update``: the plugin's whole list; ``expected``: the events;
# ``after``: every device of the resource once they are applied, as
# id -> (health, numa nodes, holder, removed).

GPU = "example.com/gpu"
NIC = "example.com/nic"
POD = ev.PodRef(uid="u1", namespace="ns", name="web")
NOT_LISTED = "not in the plugin's list"


def dev(device_id: str, health: str = "Healthy", numa: list[int] | None = None) -> ev.DeviceInfo:
    return ev.DeviceInfo(id=device_id, health=health, numa_nodes=numa or [])


LISTED = [
    ev.PluginRegistered(resource=GPU, endpoint="gpu.sock"),
    ev.DevicesAdded(resource=GPU, devices=[dev("d0", numa=[0]), dev("d1", numa=[1])]),
]
D1_HELD = [
    *LISTED,
    ev.PodAdmitted(pod=POD, containers=[ev.ContainerSpec(name="c", requests={GPU: "1"})]),
    ev.DevicesAllocated(pod_uid="u1", container="c", resource=GPU, device_ids=["d1"]),
]

LIST_AND_WATCH: list[dict[str, Any]] = [
    {
        "id": "the first list adds every device",
        "before": [ev.PluginRegistered(resource=GPU, endpoint="gpu.sock")],
        "update": [dev("d0", numa=[0]), dev("d1", "Unhealthy")],
        "expected": [ev.DevicesAdded(resource=GPU, devices=[dev("d0", numa=[0]), dev("d1", "Unhealthy")])],
        "after": {"d0": ("Healthy", [0], "", False), "d1": ("Unhealthy", [], "", False)},
    },
    {
        "id": "the same list changes nothing",
        "before": LISTED,
        "update": [dev("d1", numa=[1]), dev("d0", numa=[0])],
        "expected": [],
        "after": {"d0": ("Healthy", [0], "", False), "d1": ("Healthy", [1], "", False)},
    },
    {
        "id": "a device becomes unhealthy",
        "before": LISTED,
        "update": [dev("d0", numa=[0]), dev("d1", "Unhealthy", [1])],
        "expected": [ev.DeviceHealthChanged(resource=GPU, device_id="d1", health="Unhealthy", numa_nodes=[1])],
        "after": {"d0": ("Healthy", [0], "", False), "d1": ("Unhealthy", [1], "", False)},
    },
    {
        "id": "a device moves to another NUMA node",
        "before": LISTED,
        "update": [dev("d0", numa=[0, 1]), dev("d1", numa=[1])],
        "expected": [ev.DeviceHealthChanged(resource=GPU, device_id="d0", health="Healthy", numa_nodes=[0, 1])],
        "after": {"d0": ("Healthy", [0, 1], "", False), "d1": ("Healthy", [1], "", False)},
    },
    {
        "id": "a device loses its topology",
        "before": LISTED,
        "update": [dev("d0"), dev("d1", numa=[1])],
        "expected": [ev.DeviceHealthChanged(resource=GPU, device_id="d0", health="Healthy", numa_nodes=[])],
        "after": {"d0": ("Healthy", [], "", False), "d1": ("Healthy", [1], "", False)},
    },
    {
        "id": "added, changed and removed in one message",
        "before": LISTED,
        "update": [dev("d1", "Unhealthy", [1]), dev("d2", numa=[1])],
        "expected": [
            ev.DevicesAdded(resource=GPU, devices=[dev("d2", numa=[1])]),
            ev.DeviceHealthChanged(resource=GPU, device_id="d1", health="Unhealthy", numa_nodes=[1]),
            ev.DevicesRemoved(resource=GPU, device_ids=["d0"], reason=NOT_LISTED),
        ],
        "after": {"d1": ("Unhealthy", [1], "", False), "d2": ("Healthy", [1], "", False)},
    },
    {
        "id": "an empty list removes every free device",
        "before": LISTED,
        "update": [],
        "expected": [ev.DevicesRemoved(resource=GPU, device_ids=["d0", "d1"], reason=NOT_LISTED)],
        "after": {},
    },
    {
        "id": "a held device that vanishes stays with its holder, unhealthy",
        "before": D1_HELD,
        "update": [dev("d0", numa=[0])],
        "expected": [ev.DevicesRemoved(resource=GPU, device_ids=["d1"], reason=NOT_LISTED)],
        "after": {"d0": ("Healthy", [0], "", False), "d1": ("Unhealthy", [1], "u1/c", True)},
    },
    {
        "id": "a vanished held device that comes back is listed again, still held",
        "before": [*D1_HELD, ev.DevicesRemoved(resource=GPU, device_ids=["d1"], reason=NOT_LISTED)],
        "update": [dev("d0", numa=[0]), dev("d1", numa=[1])],
        "expected": [ev.DevicesAdded(resource=GPU, devices=[dev("d1", numa=[1])])],
        "after": {"d0": ("Healthy", [0], "", False), "d1": ("Healthy", [1], "u1/c", False)},
    },
    {
        "id": "a vanished held device that comes back unhealthy is listed again",
        "before": [*D1_HELD, ev.DevicesRemoved(resource=GPU, device_ids=["d1"], reason=NOT_LISTED)],
        "update": [dev("d0", numa=[0]), dev("d1", "Unhealthy", [1])],
        "expected": [ev.DevicesAdded(resource=GPU, devices=[dev("d1", "Unhealthy", [1])])],
        "after": {"d0": ("Healthy", [0], "", False), "d1": ("Unhealthy", [1], "u1/c", False)},
    },
    {
        "id": "a device held before it was listed (health unknown) gets its health",
        "before": [
            ev.PodAdmitted(pod=POD, containers=[ev.ContainerSpec(name="c", requests={GPU: "1"})]),
            ev.DevicesAllocated(pod_uid="u1", container="c", resource=GPU, device_ids=["d1"]),
        ],
        "update": [dev("d1", numa=[1])],
        "expected": [ev.DeviceHealthChanged(resource=GPU, device_id="d1", health="Healthy", numa_nodes=[1])],
        "after": {"d1": ("Healthy", [1], "u1/c", False)},
    },
    {
        "id": "another resource's devices are not this one's",
        "before": [*LISTED, ev.DevicesAdded(resource=NIC, devices=[dev("d0")])],
        "update": [dev("d0", numa=[0]), dev("d1", numa=[1])],
        "expected": [],
        "after": {"d0": ("Healthy", [0], "", False), "d1": ("Healthy", [1], "", False)},
    },
    # What a plugin's list may hold that the daemon does not take as it is (docs/security.md).
    {
        "id": "an ID listed twice is one device: the last listing, in its place",
        "before": [ev.PluginRegistered(resource=GPU, endpoint="gpu.sock")],
        "update": [dev("d0", numa=[0]), dev("d1"), dev("d0", "Unhealthy", [1])],
        "expected": [ev.DevicesAdded(resource=GPU, devices=[dev("d1"), dev("d0", "Unhealthy", [1])])],
        "after": {"d0": ("Unhealthy", [1], "", False), "d1": ("Healthy", [], "", False)},
    },
    {
        "id": "a device with an empty ID is refused, the others taken",
        "before": [ev.PluginRegistered(resource=GPU, endpoint="gpu.sock")],
        "update": [dev(""), dev("d0", numa=[0]), dev("", "Unhealthy", [1])],
        "expected": [ev.DevicesAdded(resource=GPU, devices=[dev("d0", numa=[0])])],
        "after": {"d0": ("Healthy", [0], "", False)},
    },
    {
        "id": "a device on a negative NUMA id is refused, the others taken",
        "before": [ev.PluginRegistered(resource=GPU, endpoint="gpu.sock")],
        "update": [dev("d0", numa=[-1]), dev("d1", numa=[1]), dev("d2", numa=[0, -5])],
        "expected": [ev.DevicesAdded(resource=GPU, devices=[dev("d1", numa=[1])])],
        "after": {"d1": ("Healthy", [1], "", False)},
    },
    {
        "id": "a known device listed on a negative NUMA id is removed with the reason",
        "before": LISTED,
        "update": [dev("d0", numa=[-1]), dev("d1", numa=[1])],
        "expected": [ev.DevicesRemoved(resource=GPU, device_ids=["d0"], reason="refused: NUMA id -1 is negative")],
        "after": {"d1": ("Healthy", [1], "", False)},
    },
    {
        "id": "a held device listed on a negative NUMA id stays with its holder",
        "before": D1_HELD,
        "update": [dev("d0", numa=[0]), dev("d1", numa=[-1])],
        "expected": [ev.DevicesRemoved(resource=GPU, device_ids=["d1"], reason="refused: NUMA id -1 is negative")],
        "after": {"d0": ("Healthy", [0], "", False), "d1": ("Unhealthy", [1], "u1/c", True)},
    },
    {
        "id": "NUMA ids past the machine's and past 63 are recorded as the plugin said them",
        "before": [ev.PluginRegistered(resource=GPU, endpoint="gpu.sock")],
        "update": [dev("d0", numa=[23]), dev("d1", numa=[64, 1 << 40])],
        "expected": [ev.DevicesAdded(resource=GPU, devices=[dev("d0", numa=[23]), dev("d1", numa=[64, 1 << 40])])],
        "after": {"d0": ("Healthy", [23], "", False), "d1": ("Healthy", [64, 1 << 40], "", False)},
    },
]

# ===================================================================== check_device_list
# What a list held that is not taken as it is, for the daemon's log, on a 2-node machine.

CHECKS: list[dict[str, Any]] = [
    {"id": "a good list", "update": [dev("d0", numa=[0]), dev("d1", numa=[0, 1]), dev("d2")], "found": ({}, {}, {})},
    {
        "id": "duplicates, counted as listed",
        "update": [dev("d0"), dev("d0"), dev("d1"), dev("d0", "Unhealthy")],
        "found": ({}, {"d0": 3}, {}),
    },
    {"id": "empty IDs", "update": [dev(""), dev("", numa=[0])], "found": ({"": "the device has an empty ID"}, {}, {})},
    {
        "id": "negative NUMA ids, the lowest named",
        "update": [dev("d0", numa=[0, -3, -1])],
        "found": ({"d0": "NUMA id -3 is negative"}, {}, {}),
    },
    {
        "id": "a refused listing followed by a good one: the last counts",
        "update": [dev("d0", numa=[-1]), dev("d0", numa=[1])],
        "found": ({}, {"d0": 2}, {}),
    },
    {
        "id": "NUMA ids the machine does not have",
        "update": [dev("d0", numa=[0, 23]), dev("d1", numa=[64, 2, 64]), dev("d2", numa=[1])],
        "found": ({}, {}, {"d0": [23], "d1": [2, 64]}),
    },
]

# ======================================================================== restart_events
# ``before``: the log of the previous run; ``expected``: what the start records.

RESTARTED = "the daemon restarted during the admission"
NEVER_ADMITTED = "held by a pod that was never admitted"
ADMITTING = [
    *LISTED,
    ev.DevicesAdded(resource=GPU, devices=[dev("d2", numa=[1])]),
    ev.PodAdmissionStarted(
        pod=POD,
        containers=[
            ev.ContainerSpec(name="main", requests={GPU: "2"}),
            ev.ContainerSpec(name="side", kind="sidecar", requests={GPU: "1"}),
        ],
    ),
    ev.DevicesReserved(pod_uid="u1", container="side", resource=GPU, device_ids=["d2"]),
    ev.DevicesReserved(pod_uid="u1", container="main", resource=GPU, device_ids=["d1", "d0"]),
    ev.CPUsAssigned(pod_uid="u1", container="main", cpus=[2, 3]),
]

RESTARTS: list[dict[str, Any]] = [
    {"id": "an empty log: nothing to finish", "before": [], "expected": []},
    {
        "id": "a pod caught admitting gives its devices and CPUs back and is refused",
        "before": ADMITTING,
        "expected": [
            ev.DevicesReleased(pod_uid="u1", container="main", resource=GPU, device_ids=["d0", "d1"], reason=RESTARTED),
            ev.DevicesReleased(pod_uid="u1", container="side", resource=GPU, device_ids=["d2"], reason=RESTARTED),
            ev.CPUsReleased(pod_uid="u1", container="main", cpus=[2, 3], reason=RESTARTED),
            ev.AdmissionRejected(pod=POD, reason=RESTARTED),
            ev.PluginDisconnected(
                resource=GPU, endpoint="gpu.sock", kind="DevicePlugin", reason="the daemon restarted"
            ),
        ],
    },
    {
        "id": "a pod caught admitting before it held anything is refused",
        "before": [ev.PodAdmissionStarted(pod=POD, containers=[ev.ContainerSpec(name="c")])],
        "expected": [ev.AdmissionRejected(pod=POD, reason=RESTARTED)],
    },
    {
        "id": "an admitted pod keeps its devices; a disconnected plugin is left alone",
        "before": [
            *D1_HELD,
            ev.PluginRegistered(resource=NIC, endpoint="nic.sock"),
            ev.PluginDisconnected(resource=NIC, endpoint="nic.sock"),
        ],
        "expected": [
            ev.PluginDisconnected(resource=GPU, endpoint="gpu.sock", kind="DevicePlugin", reason="the daemon restarted")
        ],
    },
    {
        "id": "every connected plugin must register again",
        "before": [
            ev.PluginRegistered(resource=GPU, endpoint="gpu.sock"),
            ev.PluginRegistered(resource=NIC, endpoint="nic.sock"),
        ],
        "expected": [
            ev.PluginDisconnected(
                resource=GPU, endpoint="gpu.sock", kind="DevicePlugin", reason="the daemon restarted"
            ),
            ev.PluginDisconnected(
                resource=NIC, endpoint="nic.sock", kind="DevicePlugin", reason="the daemon restarted"
            ),
        ],
    },
    {
        "id": "a refusal recorded before the crash is not repeated",
        "before": [*ADMITTING[:4], ev.AdmissionRejected(pod=POD, reason="no")],
        "expected": [
            ev.PluginDisconnected(resource=GPU, endpoint="gpu.sock", kind="DevicePlugin", reason="the daemon restarted")
        ],
    },
    {
        "id": "devices held by a pod the views never admitted are released",
        "before": [
            ev.DevicesAdded(resource=GPU, devices=[dev("d0"), dev("d1")]),
            ev.DevicesReserved(pod_uid="ghost", container="c", resource=GPU, device_ids=["d1", "d0"]),
        ],
        "expected": [
            ev.DevicesReleased(
                pod_uid="ghost", container="c", resource=GPU, device_ids=["d0", "d1"], reason=NEVER_ADMITTED
            )
        ],
    },
]


# =========================================================================== helpers


def as_records(evs: list[ev.EventBase], start: int = 1) -> list[Record]:
    return [decode_record(i, encode_payload(e, 1000 + i, f"c{i // 3}")) for i, e in enumerate(evs, start=start)]


def record(views: Views, evs: list[ev.EventBase]) -> Views:
    for r in as_records(evs, start=views.meta.last_seq + 1):
        apply(views, r)
    return views


def known_to_the_shell(views: Views, resource: str) -> dict[str, Any]:
    # What plugins/device_plugins.py passes: the resource's devices still in the plugin's list.
    return {k: d for k, d in views.devices.devices.get(resource, {}).items() if not d.removed}


# =========================================================================== tests


@pytest.mark.parametrize(
    ("name", "valid"), EXTENDED_RESOURCE_NAMES, ids=[repr(n)[:40] for n, _ in EXTENDED_RESOURCE_NAMES]
)
def test_is_extended_resource_name(name: str, valid: bool) -> None:
    assert is_extended_resource_name(name) is valid


@pytest.mark.parametrize(("version", "resource", "message"), REGISTRATIONS)
def test_registration_error(version: str, resource: str, message: str) -> None:
    assert registration_error(version, resource) == message


@pytest.mark.parametrize(("endpoint", "ok"), ENDPOINTS, ids=[repr(e) for e, _ in ENDPOINTS])
def test_endpoint_error(endpoint: str, ok: bool) -> None:
    error = endpoint_error(endpoint)
    assert (error == "") is ok
    assert "\n" not in error


@pytest.mark.parametrize("case", LIST_AND_WATCH, ids=lambda c: c["id"])
def test_list_and_watch_events(case: dict[str, Any]) -> None:
    views = rebuild(as_records(case["before"]))
    others = {r: t for r, t in views.devices.devices.items() if r != GPU}
    events = list_and_watch_events(GPU, known_to_the_shell(views, GPU), case["update"])
    assert events == case["expected"]

    record(views, events)
    table = views.devices.devices.get(GPU, {})
    after = {i: (d.health, d.numa_nodes, d.holder, d.removed) for i, d in table.items()}
    assert after == case["after"]
    assert {r: t for r, t in views.devices.devices.items() if r != GPU} == others
    # The views now match the list: the same message again changes nothing.
    assert list_and_watch_events(GPU, known_to_the_shell(views, GPU), case["update"]) == []


@pytest.mark.parametrize("case", CHECKS, ids=lambda c: c["id"])
def test_check_device_list(case: dict[str, Any]) -> None:
    checked = check_device_list(case["update"], [0, 1])
    assert (checked.refused, checked.duplicates, checked.outside) == case["found"]
    ids = [d.id for d in checked.devices]
    assert all(ids) and len(ids) == len(set(ids))
    # What is recorded is what was taken, with the count the log line gives.
    events = list_and_watch_events(GPU, {}, case["update"], [0, 1])
    assert [d for e in events if isinstance(e, ev.DevicesAdded) for d in e.devices] == checked.devices


@pytest.mark.parametrize("case", RESTARTS, ids=lambda c: c["id"])
def test_restart_events(case: dict[str, Any]) -> None:
    views = rebuild(as_records(case["before"]))
    events = restart_events(views)
    assert events == case["expected"]

    record(views, events)
    assert all(p.state != "admitting" for p in views.pods.pods.values())
    assert not any(p.connected for p in views.devices.plugins.values())
    for table in views.devices.devices.values():
        for d in table.values():
            assert not d.holder or d.holder.split("/", 1)[0] in views.pods.pods
    assert all(uid in views.pods.pods for uid in views.cpus.assignments if views.cpus.assignments[uid])
    for e in events:
        if isinstance(e, ev.AdmissionRejected):
            assert views.pods.rejected[e.pod.uid] == RESTARTED
    # Everything is finished: a second start has nothing left to do.
    assert restart_events(views) == []


# ================================================= NUMA ids at admission (eventsrc.core.admission)
# A plugin names NUMA ids; the machine has its own (the CPU topology's). Hints are masks over
# the machine's nodes only, and a device on an id the machine lacks counts as having no
# topology: a plugin cannot widen the set of masks walked, nor break a mask with a bad id.


def machine_of(nodes: int) -> Any:
    """Two CPUs on each of ``nodes`` NUMA nodes."""
    return discover(
        MachineInfo(
            num_cores=2 * nodes,
            num_sockets=nodes,
            topology=tuple(CPUNode(n, tuple(Core(2 * n + i, n, (2 * n + i,)) for i in range(2))) for n in range(nodes)),
        )
    )


MACHINE_2 = machine_of(2)


class RecordingPolicy(Policy):
    """A policy that keeps every provider hint it was asked to merge."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.seen: list[TopologyHint] = []

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        for provider in providers_hints:
            for hints in (provider or {}).values():
                self.seen += hints or []
        return self.inner.merge(providers_hints)


def numa_admission(
    devices: list[ev.DeviceInfo], request: int, policy: str, scope: str = "container", machine: Any = MACHINE_2
) -> tuple[Any, RecordingPolicy]:
    """Plan a pod asking ``request`` devices on ``machine``; (plan's result, the policy)."""
    views = record(
        Views(),
        [ev.PluginRegistered(resource=GPU, endpoint="gpu.sock"), ev.DevicesAdded(resource=GPU, devices=devices)],
    )
    tm = parse_topology_manager(policy, scope, {}, machine.cpu_details.numa_nodes().sorted_list())
    recording = RecordingPolicy(tm.policy)
    cfg = AdmissionConfig(
        CPUManagerConfig("none", machine, CPUSet(), StaticPolicyOptions()),
        dataclasses.replace(tm, policy=recording),
        30.0,
    )
    limits = {GPU: str(request)}
    spec = PodSpec(pod=POD, containers=[ev.ContainerSpec(name="c", requests=limits, limits=limits)], claims=[])
    core = PodAdmission(views, cfg, spec)
    find = core.find()
    question = next(find)
    assert question == PluginWanted(GPU)
    with pytest.raises(StopIteration):
        find.send(ev.PluginOptions())
    plan = core.plan()
    try:
        ask = next(plan)
        raise AssertionError(f"the plugin was asked {ask} though it offers no preference")
    except StopIteration as stop:
        return stop.value, recording


def hinted_nodes(policy: RecordingPolicy) -> set[int]:
    return {n for h in policy.seen for n in h.nodes() or []}


@pytest.mark.parametrize("scope", ["container", "pod"])
def test_a_device_on_a_numa_id_the_machine_lacks_is_not_aligned(scope: str) -> None:
    devices = [dev("d0", numa=[0]), dev("d1", numa=[1]), dev("d23", numa=[23])]
    result, policy = numa_admission(devices, 1, "best-effort", scope)
    assert isinstance(result, Intent), result
    assert policy.seen and hinted_nodes(policy) <= {0, 1}
    # Three devices could hold two: d23 has no topology, so the hints are those of d0 and d1.
    result, policy = numa_admission(devices, 3, "best-effort", scope)
    assert isinstance(result, Intent), result
    assert hinted_nodes(policy) <= {0, 1}
    (reserved,) = [e for e in result.events if isinstance(e, ev.DevicesReserved)]
    assert sorted(reserved.device_ids) == ["d0", "d1", "d23"]


def test_devices_only_on_numa_ids_the_machine_lacks_have_no_preference() -> None:
    result, policy = numa_admission([dev("d5", numa=[5]), dev("d7", numa=[7, 0])], 1, "single-numa-node")
    assert isinstance(result, Intent), result  # no preference (nil hints) is admitted everywhere
    assert hinted_nodes(policy) <= {0, 1}


@pytest.mark.parametrize("numa", [[-1], [64], [1 << 40], [0, -1]], ids=str)
@pytest.mark.parametrize("policy", ["best-effort", "restricted", "single-numa-node", "none"])
def test_a_bad_numa_id_in_the_log_never_breaks_an_admission(numa: list[int], policy: str) -> None:
    # ListAndWatch refuses negative ids now, but a log written before may hold them.
    devices = [dev("bad", numa=numa), dev("d0", numa=[0]), dev("e0", numa=[0]), dev("d1", numa=[1])]
    result, seen = numa_admission(devices, 2, policy)
    assert isinstance(result, Intent), result
    assert hinted_nodes(seen) <= {0, 1}


@pytest.mark.timeout(120)  # the walk over every subset of 24 ids would take hours
@pytest.mark.parametrize(
    ("policy", "scope"),
    [("best-effort", "container"), ("best-effort", "pod"), ("restricted", "container"), ("none", "container")],
)
def test_devices_on_24_numa_ids_on_a_2_node_machine(policy: str, scope: str) -> None:
    devices = [dev(f"d{i}", numa=[i]) for i in range(24)]
    result, seen = numa_admission(devices, 12, policy, scope)
    assert hinted_nodes(seen) <= {0, 1}
    if policy == "restricted":  # two aligned devices cannot hold twelve: no preferred hint
        assert isinstance(result, Refused), result
    else:
        assert isinstance(result, Intent), result
        (reserved,) = [e for e in result.events if isinstance(e, ev.DevicesReserved)]
        assert len(set(reserved.device_ids)) == 12


def test_the_none_policy_packs_greedily_past_ten_numa_nodes() -> None:
    # No hints under none (the kubelet's noneScope), but the packing order looks for few nodes:
    # exactly up to MAX_EXACT_PACKING_NODES, past that the nodes with the most devices first.
    machine = machine_of(MAX_EXACT_PACKING_NODES + 2)
    devices = [dev(f"d{i}", numa=[i % 12]) for i in range(36)] + [dev(f"x{i}", numa=[5]) for i in range(2)]
    result, seen = numa_admission(devices, 7, "none", machine=machine)
    assert isinstance(result, Intent), result
    assert not seen.seen
    (reserved,) = [e for e in result.events if isinstance(e, ev.DevicesReserved)]
    nodes = {n for i in reserved.device_ids for n in next(d.numa_nodes for d in devices if d.id == i)}
    assert nodes == {5, 0}  # node 5 holds 5 devices, node 0 (the lowest of those with 3) the rest


def test_devices_are_counted_per_set_of_nodes_however_a_plugin_repeats_them() -> None:
    # A plugin may list a node 64 times or in any order: the masks walk over sets, at most
    # 2**n - 1 of them on n nodes, not over every way of writing one.
    lists = [[0] * k for k in range(1, 65)] + [[1, 0], [0, 1, 1], [1, 0, 0, 1]]
    assert _count_per_set(lists) == {(0,): 64, (0, 1): 3}


def test_a_long_list_is_recorded_a_bounded_number_of_devices_to_a_record() -> None:
    n = 2 * DEVICES_PER_RECORD + 201
    update = [ev.DeviceInfo(id=f"dev-{i}", health="Healthy", numa_nodes=[i % 2]) for i in range(n)]
    views = rebuild(as_records([ev.PluginRegistered(resource=GPU, endpoint="gpu.sock")]))
    events = list_and_watch_events(GPU, known_to_the_shell(views, GPU), update)
    assert [type(e) for e in events] == [ev.DevicesAdded] * 3
    assert [len(e.devices) for e in events] == [DEVICES_PER_RECORD, DEVICES_PER_RECORD, 201]  # type: ignore[attr-defined]
    assert [d for e in events for d in e.devices] == update  # type: ignore[attr-defined]  # the list's order
    record(views, events)
    assert list(views.devices.devices[GPU]) == [d.id for d in update]
    gone = list_and_watch_events(GPU, known_to_the_shell(views, GPU), update[:100])
    assert [type(e) for e in gone] == [ev.DevicesRemoved] * 3
    assert [i for e in gone for i in e.device_ids] == [d.id for d in update[100:]]  # type: ignore[attr-defined]
    assert max(len(e.device_ids) for e in gone) == DEVICES_PER_RECORD  # type: ignore[attr-defined]


def test_a_list_pass_is_recorded_in_appends_of_bounded_size_in_its_order() -> None:
    from eventsrc.node.device_manager import list_appends

    def health(i: int) -> ev.DeviceHealthChanged:
        return ev.DeviceHealthChanged(resource=GPU, device_id=f"h{i}", health="Unhealthy")

    added = [ev.DevicesAdded(resource=GPU, devices=[ev.DeviceInfo(id=f"a{i}", health="Healthy")]) for i in range(2)]
    removed = ev.DevicesRemoved(resource=GPU, device_ids=["r0"], reason="not in the plugin's list")
    many = [health(i) for i in range(DEVICES_PER_RECORD + 1)]
    events: list[ev.EventBase] = [health(-1), *added, removed, *many]
    appends = list(list_appends(events))
    assert [e for a in appends for e in a] == events
    assert [len(a) for a in appends] == [1, 1, 1, 1, DEVICES_PER_RECORD, 1]
    assert appends[1] == [added[0]] and appends[3] == [removed]
    assert list(list_appends([])) == []
