"""The NRI decisions (``eventsrc.core.runtime_decisions``) and the annotation (``inputs.runtime_annotations``),
in-process: views built by applying records, no runtime."""

from __future__ import annotations

import pytest

from eventsrc import events as ev
from eventsrc.core.cpu.assignment import StaticPolicyOptions
from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.core.cpu.static import CPUManagerConfig
from eventsrc.core.cpu.topology import Core, MachineInfo, discover
from eventsrc.core.cpu.topology import Node as NUMANode
from eventsrc.core.resources import exclusive_cpus, qos_class
from eventsrc.core.runtime_decisions import (
    POST_CREATE_CONTAINER,
    POST_UPDATE_CONTAINER,
    REMOVE_CONTAINER,
    REMOVE_POD_SANDBOX,
    RUN_POD_SANDBOX,
    START_CONTAINER,
    Admission,
    ContainerFacts,
    SandboxFacts,
    admission_for,
    container_not_held,
    container_spec,
    created_event,
    devices_shared,
    milli_from_cgroups,
    not_its_pod,
    owed_releases,
    placement,
    pool_updates,
    reconcile,
    state_events,
    vanished,
)
from eventsrc.inputs.manifest import ManifestError
from eventsrc.inputs.runtime_annotations import device_requests
from eventsrc.state.apply import apply_all
from eventsrc.state.views import Views

MACHINE = discover(
    MachineInfo(
        num_cores=4,
        num_sockets=2,
        topology=(
            NUMANode(0, tuple(Core(i, 0, (i,)) for i in range(2))),
            NUMANode(1, tuple(Core(i, 1, (2 + i,)) for i in range(2))),
        ),
    )
)
STATIC = CPUManagerConfig("static", MACHINE, CPUSet([0]), StaticPolicyOptions())
NONE = CPUManagerConfig("none", MACHINE, CPUSet(), StaticPolicyOptions())
DEV = "example.com/dev"


def views_of(*events: ev.EventBase) -> Views:
    return apply_all(
        Views(), [ev.Record(seq=i, ts_ns=i, correlation_id="c", version=1, event=e) for i, e in enumerate(events, 1)]
    )  # type: ignore[arg-type]


def facts(cid: str = "k1", name: str = "app", sandbox: str = "s1", **kw: object) -> ContainerFacts:
    return ContainerFacts(id=cid, sandbox_id=sandbox, name=name, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("shares", "quota", "period", "want"),
    [
        (1024, 100_000, 100_000, (1000, 1000)),  # 1 CPU, Guaranteed
        (2048, 200_000, 100_000, (2000, 2000)),
        (512, 0, 0, (500, 0)),  # a request, no limit
        (102, 10_000, 100_000, (100, 100)),  # 100m: 102 shares round back to 100
        (2, 0, 0, (0, 0)),  # BestEffort: the kubelet's minimum shares
        (1024, 50_000, 50_000, (1000, 1000)),  # another period
    ],
)
def test_the_kubelets_cgroup_arithmetic_is_undone(shares: int, quota: int, period: int, want: tuple[int, int]) -> None:
    assert milli_from_cgroups(shares, quota, period) == want


def test_a_guaranteed_whole_cpu_container_reads_as_guaranteed_with_exclusive_cpus() -> None:
    spec = container_spec(facts(shares=1024, quota=100_000, period=100_000, memory_limit=64 << 20), {DEV: 1})
    assert spec.requests == {"cpu": "1000m", "memory": str(64 << 20), DEV: "1"}
    assert spec.limits == {"cpu": "1000m", "memory": str(64 << 20), DEV: "1"}
    assert qos_class([spec]) == "Guaranteed"
    assert exclusive_cpus("Guaranteed", spec) == 1


@pytest.mark.parametrize(
    ("kw", "qos"),
    [
        ({"shares": 1024, "quota": 100_000, "period": 100_000}, "Burstable"),  # no memory limit
        ({"shares": 512, "quota": 100_000, "period": 100_000, "memory_limit": 1 << 20}, "Burstable"),
        ({"shares": 2}, "BestEffort"),
    ],
)
def test_other_cgroup_values_read_as_the_kubelet_would_class_them(kw: dict[str, int], qos: str) -> None:
    assert qos_class([container_spec(facts(**kw), {})]) == qos


def admitted_pod() -> list[ev.EventBase]:
    alloc = ev.ContainerAllocation(
        envs={"SAMPLE_DEVICES": "dev-1"},
        devices=[ev.DeviceSpec(container_path="/dev/dev-1", host_path="/dev/null")],
        cdi_devices=[f"{DEV}=dev-1"],
    )
    return [
        ev.SharedPoolChanged(cpus=[0, 1, 2, 3]),
        ev.PodAdmissionStarted(pod=ev.PodRef(uid="u1"), containers=[ev.ContainerSpec(name="app")]),
        ev.DevicesReserved(pod_uid="u1", container="app", resource=DEV, device_ids=["dev-1"]),
        ev.CPUsAssigned(pod_uid="u1", container="app", cpus=[2]),
        ev.SharedPoolChanged(cpus=[0, 1, 3]),
        ev.DevicesAllocated(pod_uid="u1", container="app", resource=DEV, device_ids=["dev-1"], response=alloc),
        ev.PodAdmitted(pod=ev.PodRef(uid="u1"), containers=[ev.ContainerSpec(name="app")]),
    ]


def test_an_admitted_container_gets_its_cpus_their_numa_node_and_its_allocation() -> None:
    got = placement(views_of(*admitted_pod()), STATIC, "u1", "app")
    assert (got.cpus, got.mems) == ([2], [1])
    assert got.allocation.envs == {"SAMPLE_DEVICES": "dev-1"}
    assert got.allocation.cdi_devices == [f"{DEV}=dev-1"]
    assert got.device_ids == {DEV: ["dev-1"]}


def test_another_container_gets_the_shared_pool_and_the_none_policy_sets_no_cpuset() -> None:
    views = views_of(*admitted_pod())
    shared = placement(views, STATIC, "u1", "sidecar")
    assert (shared.cpus, shared.mems, shared.allocation.envs) == ([0, 1, 3], [0, 1], {})
    assert placement(views, NONE, "u1", "app").cpus is None


def test_the_shared_pool_follows_and_exclusive_containers_stay() -> None:
    views = views_of(
        ev.SharedPoolChanged(cpus=[0, 1, 2, 3]),
        ev.ContainerCreated(container_id="shared", sandbox_id="s0", pod_uid="u0", name="c", cpus=[0, 1, 2, 3]),
        *admitted_pod(),
        ev.ContainerCreated(container_id="excl", sandbox_id="s1", pod_uid="u1", name="app", cpus=[2], adjusted=True),
    )
    updates = pool_updates(views, STATIC)
    assert [(u.container_id, u.cpus, u.mems) for u in updates] == [("shared", [0, 1, 3], [0, 1])]
    assert pool_updates(views, NONE) == []


def test_a_container_running_on_cpus_its_pod_does_not_hold_is_flagged() -> None:
    base = admitted_pod()
    good = views_of(
        *base,
        ev.ContainerCreated(
            container_id="k",
            sandbox_id="s",
            pod_uid="u1",
            name="app",
            cpus=[2],
            device_ids={DEV: ["dev-1"]},
            adjusted=True,
        ),
    )
    assert container_not_held(good, "k") == []
    bad = views_of(
        *base,
        ev.ContainerCreated(
            container_id="k",
            sandbox_id="s",
            pod_uid="u1",
            name="app",
            cpus=[0, 1],
            device_ids={DEV: ["dev-0"]},
            adjusted=True,
        ),
    )
    assert container_not_held(bad, "k") == [
        "runs on CPUs [0, 1] but its pod holds [2]",
        f"runs with {DEV} devices ['dev-0'] but its pod holds ['dev-1']",
    ]
    observed = views_of(
        *base, ev.ContainerCreated(container_id="k", sandbox_id="s", pod_uid="u1", name="app", cpus=[0, 1])
    )
    assert container_not_held(observed, "k") == []


def test_synchronize_releases_only_pods_whose_recorded_sandbox_vanished() -> None:
    views = views_of(
        *admitted_pod(),
        ev.PodSandboxStarted(sandbox_id="s1", pod=ev.PodRef(uid="u1")),
        ev.ContainerCreated(container_id="k1", sandbox_id="s1", pod_uid="u1", name="app", cpus=[2], adjusted=True),
        ev.PodAdmitted(pod=ev.PodRef(uid="u9")),  # admitted through the node API, never run: kept
    )
    running = facts("k2", sandbox="s2", state="running", cpus=[0, 1, 2, 3])
    s2 = SandboxFacts(id="s2", uid="u2")
    found = reconcile(views, [s2], [running])
    assert [type(e).__name__ for e in found.events] == [
        "ContainerRemoved",
        "PodSandboxRemoved",
        "PodSandboxStarted",
        "ContainerCreated",
    ]
    assert found.unadmitted == [(s2, running)]
    assert found.events[-1] == created_event(running, "u2", adjusted=False)
    assert owed_releases(views) == []
    after = views_of(
        *admitted_pod(),
        ev.PodAdmitted(pod=ev.PodRef(uid="u9")),
        ev.PodSandboxStarted(sandbox_id="s1", pod=ev.PodRef(uid="u1")),
        *found.events,
    )
    assert owed_releases(after) == ["u1"]  # u9 never ran: kept
    released = views_of(
        *admitted_pod(),
        ev.PodSandboxStarted(sandbox_id="s1", pod=ev.PodRef(uid="u1")),
        ev.PodSandboxRemoved(sandbox_id="s1", pod_uid="u1"),
        ev.PodRemoved(pod_uid="u1"),
    )
    assert owed_releases(released) == []


def test_a_cpuset_the_runtime_reports_otherwise_is_recorded_and_put_right() -> None:
    views = views_of(
        *admitted_pod(),
        ev.PodSandboxStarted(sandbox_id="s1", pod=ev.PodRef(uid="u1")),
        ev.ContainerCreated(container_id="k1", sandbox_id="s1", pod_uid="u1", name="app", cpus=[2], adjusted=True),
    )
    # created unadjusted: eventsrc was killed between recording and answering
    now = facts("k1", sandbox="s1", state="running", cpus=[])
    found = reconcile(views, [SandboxFacts(id="s1", uid="u1")], [now])
    assert [type(e).__name__ for e in found.events] == ["ContainerStarted", "ContainerCPUsUpdated"]
    fixed = views_of(
        *admitted_pod(),
        ev.PodSandboxStarted(sandbox_id="s1", pod=ev.PodRef(uid="u1")),
        ev.ContainerCreated(container_id="k1", sandbox_id="s1", pod_uid="u1", name="app", cpus=[2], adjusted=True),
        *found.events,
    )
    assert [(u.container_id, u.cpus) for u in pool_updates(fixed, STATIC)] == [("k1", [2])]


def test_synchronize_with_nothing_changed_asks_nothing() -> None:
    views = views_of(
        ev.PodSandboxStarted(sandbox_id="s1", pod=ev.PodRef(uid="u1")),
        ev.ContainerCreated(container_id="k1", sandbox_id="s1", pod_uid="u1", name="app"),
        ev.ContainerStarted(container_id="k1"),
    )
    found = reconcile(views, [SandboxFacts(id="s1", uid="u1")], [facts("k1", state="running")])
    assert found.events == []
    assert found.unadmitted == [(SandboxFacts(id="s1", uid="u1"), facts("k1", state="running"))]  # never admitted


def test_the_annotation_is_read_and_bad_values_are_one_line_naming_it() -> None:
    key = "eventsrc.dev/resources"
    ok = frozenset({"team-a"})
    assert device_requests({}, "default", frozenset()) == {}
    assert device_requests({key: '{"app": {"example.com/dev": 2}}'}, "team-a", ok) == {"app": {DEV: 2}}
    for bad in (
        "not json",
        '{"app": {"cpu": 1}}',
        '{"app": {"example.com/dev": -1}}',
        '{"app": ["x"]}',
        "[]",
        "x" * 70_000,
        '{"app": {"example.com/dev": 1}, "app": {"example.com/dev": 4}}',
        '{"app": {"example.com/dev": 4, "example.com/dev": 1}}',
    ):
        with pytest.raises(ManifestError) as err:
            device_requests({key: bad}, "team-a", ok)
        assert str(err.value).startswith(f"annotation {key}: ") and "\n" not in str(err.value)


def test_the_annotation_is_refused_outside_the_namespaces_the_node_names() -> None:
    key = "eventsrc.dev/resources"
    for namespace, allowed in (("default", frozenset()), ("team-b", frozenset({"team-a"}))):
        with pytest.raises(ManifestError) as err:
            device_requests({key: '{"app": {"example.com/dev": 4}}'}, namespace, allowed)
        assert "--nri-annotation-namespaces" in str(err.value) and repr(namespace) in str(err.value)
    with pytest.raises(ManifestError, match="appears twice"):
        device_requests({key: '{"app": {}, "app": {}}'}, "team-a", frozenset({"team-a"}))


def real_pod() -> list[ev.EventBase]:
    """Pod u1 is default/real, admitted with dev-1 and CPU 2 (``admitted_pod``)."""
    ref, app = ev.PodRef(uid="u1", namespace="default", name="real"), [ev.ContainerSpec(name="app")]
    first, _, *rest, _ = admitted_pod()
    return [first, ev.PodAdmissionStarted(pod=ref, containers=app), *rest, ev.PodAdmitted(pod=ref, containers=app)]


def test_a_sandbox_carrying_an_admitted_pods_uid_under_another_name_is_not_that_pod() -> None:
    views = views_of(*real_pod())
    pod = views.pods.pods["u1"]
    assert not_its_pod(pod, "default", "real") == ""
    assert not_its_pod(pod, "ns-b", "real") == "its uid u1 is pod default/real's, not ns-b/real's"
    assert not_its_pod(pod, "default", "imposter") != ""

    # The imposter's removal owes no release of the real pod, and its start cancels none.
    imposter = ev.PodSandboxStarted(sandbox_id="s-imp", pod=ev.PodRef(uid="u1", namespace="ns-b", name="imposter"))
    assert owed_releases(views_of(*real_pod(), imposter, ev.PodSandboxRemoved(sandbox_id="s-imp", pod_uid="u1"))) == []
    real = ev.PodSandboxStarted(sandbox_id="s-real", pod=ev.PodRef(uid="u1", namespace="default", name="real"))
    gone = views_of(*real_pod(), real, ev.PodSandboxRemoved(sandbox_id="s-real", pod_uid="u1"), imposter)
    assert owed_releases(gone) == ["u1"]
    # A second report of one removal (NRI's and the listing's) owes nothing new.
    twice = views_of(
        *real_pod(),
        real,
        ev.PodSandboxRemoved(sandbox_id="s-real", pod_uid="u1"),
        ev.PodRemoved(pod_uid="u1"),
        ev.PodAdmissionStarted(pod=ev.PodRef(uid="u1", namespace="default", name="real"), containers=[]),
        ev.PodAdmitted(pod=ev.PodRef(uid="u1", namespace="default", name="real"), containers=[]),
        ev.PodSandboxRemoved(sandbox_id="s-real", pod_uid="u1"),
    )
    assert owed_releases(twice) == []

    # A container of the imposter's sandbox is given the shared pool, never u1's exclusive CPU.
    shared = views_of(
        ev.SharedPoolChanged(cpus=[0, 1, 2, 3]),
        *real_pod(),
        imposter,
        ev.ContainerCreated(container_id="k-imp", sandbox_id="s-imp", pod_uid="u1", name="app", cpus=[2]),
    )
    assert [(u.container_id, u.cpus) for u in pool_updates(shared, STATIC)] == [("k-imp", [0, 1, 3])]


def test_sandboxes_a_synchronize_listed_are_gone_when_the_runtimes_listing_lacks_them() -> None:
    views = views_of(
        ev.PodSandboxStarted(sandbox_id="s1", pod=ev.PodRef(uid="u1")),
        ev.PodSandboxStarted(sandbox_id="s2", pod=ev.PodRef(uid="u2")),
        ev.PodSandboxStarted(sandbox_id="s3", pod=ev.PodRef(uid="u3")),  # run after the listing: not judged
    )
    gone = vanished(views, {"s1", "s2", "s9"}, present={"s2", "s3"})
    assert gone == [ev.PodSandboxRemoved(sandbox_id="s1", pod_uid="u1", reason="gone from the runtime's listing")]
    assert vanished(views, {"s1", "s2"}, present={"s1", "s2"}) == []


def test_a_device_in_two_running_containers_is_flagged_and_one_handed_on_from_a_stopped_one_is_not() -> None:
    def created(cid: str, uid: str, devices: list[str]) -> ev.ContainerCreated:
        return ev.ContainerCreated(
            container_id=cid, sandbox_id=f"s-{uid}", pod_uid=uid, name="app", device_ids={DEV: devices}, adjusted=True
        )

    two = views_of(
        created("k1", "u1", ["dev-1"]),
        ev.ContainerStarted(container_id="k1"),
        created("k2", "u2", ["dev-1", "dev-2"]),
        ev.ContainerStarted(container_id="k2"),
    )
    assert devices_shared(two, "k2") == [f"{DEV} device dev-1 also runs in container app (k1) of pod u1"]
    handed_on = views_of(
        created("init", "u1", ["dev-1"]),
        ev.ContainerStarted(container_id="init"),
        ev.ContainerStopped(container_id="init"),
        created("k1", "u1", ["dev-1"]),
        ev.ContainerStarted(container_id="k1"),
    )
    assert devices_shared(handed_on, "k1") == []


def test_synchronize_records_every_stop_before_any_start() -> None:
    """The app container (id "a") started while eventsrc was away, after its init container
    (id "z") stopped and handed its device on: the stop is recorded first, so no record shows
    the device in two running containers."""

    def created(cid: str, name: str) -> ev.ContainerCreated:
        return ev.ContainerCreated(
            container_id=cid, sandbox_id="s1", pod_uid="u1", name=name, device_ids={DEV: ["dev-1"]}, adjusted=True
        )

    base = [
        ev.PodSandboxStarted(sandbox_id="s1", pod=ev.PodRef(uid="u1")),
        created("z", "init"),
        ev.ContainerStarted(container_id="z"),
        created("a", "app"),
    ]
    running = [
        facts("a", sandbox="s1", name="app", state="running"),
        facts("z", sandbox="s1", name="init", state="stopped"),
    ]
    found = reconcile(views_of(*base), [SandboxFacts(id="s1", uid="u1")], running)
    assert [type(e).__name__ for e in found.events] == ["ContainerStopped", "ContainerStarted"]
    assert devices_shared(views_of(*base, *found.events), "a") == []


def test_a_pod_moved_from_the_kubelet_has_no_name_and_is_known_by_its_uid() -> None:
    """``import-kubelet`` records pods without namespace or name (no checkpoint keeps them):
    any sandbox of their uid is theirs, and its removal owes their release."""
    imported = [ev.PodAdmitted(pod=ev.PodRef(uid="u1"), containers=[ev.ContainerSpec(name="app")])]
    assert not_its_pod(views_of(*imported).pods.pods["u1"], "default", "web") == ""
    sandbox = ev.PodSandboxStarted(sandbox_id="s1", pod=ev.PodRef(uid="u1", namespace="default", name="web"))
    assert owed_releases(views_of(*imported, sandbox, ev.PodSandboxRemoved(sandbox_id="s1", pod_uid="u1"))) == ["u1"]


def test_a_cri_listing_is_the_nri_runtimes_only_when_name_and_version_agree() -> None:
    from eventsrc.node.cri import same_runtime, socket_path

    assert same_runtime(("containerd", "v2.1.9"), ("containerd", "2.1.9"))
    assert same_runtime(("CRI-O", "1.31.0"), ("cri-o", "1.31.0"))
    assert not same_runtime(("containerd", "v1.7.24"), ("containerd", "2.1.9"))  # another containerd
    assert not same_runtime(("cri-o", "1.31.0"), ("containerd", "1.31.0"))
    assert socket_path("", "containerd") == "/run/containerd/containerd.sock"
    assert (
        socket_path("unix:///run/k3s/containerd/containerd.sock", "containerd") == "/run/k3s/containerd/containerd.sock"
    )
    assert socket_path("", "some-runtime") == ""


def test_whether_a_container_needs_an_admission_is_decided_once() -> None:
    """The NRI plugin's question for both modes (``admission_for``): refuse a sandbox that is not
    the pod its uid names; admit a pod not admitted yet; an admitted pod grows by a container its
    admission (read from the runtime) lacks, and keeps its admission for one it has."""
    sandbox = SandboxFacts(id="s1", uid="u1", namespace="default", name="real")
    assert admission_for(Views(), sandbox, "app") == Admission(admit=True)
    admitting = views_of(ev.PodAdmissionStarted(pod=ev.PodRef(uid="u1", namespace="default", name="real")))
    assert admission_for(admitting, sandbox, "app") == Admission(admit=True)
    admitted = views_of(*real_pod())
    assert admission_for(admitted, sandbox, "app") == Admission()
    imposter = SandboxFacts(id="s2", uid="u1", namespace="ns-b", name="real")
    assert admission_for(admitted, imposter, "app").refused == "its uid u1 is pod default/real's, not ns-b/real's"
    ref = ev.PodRef(uid="u1", namespace="default", name="real")
    spec = ev.ContainerSpec(name="app")
    from_runtime = views_of(
        ev.PodAdmissionStarted(pod=ref, containers=[spec], source=ev.FROM_RUNTIME),
        ev.PodAdmitted(pod=ref, containers=[spec]),
    )
    assert admission_for(from_runtime, sandbox, "app") == Admission()
    assert admission_for(from_runtime, sandbox, "sidecar") == Admission(admit=True, grows=True)


def test_the_runtimes_state_changes_as_records() -> None:
    """``state_events``: what each NRI StateChange records, against the views; a cpuset update
    that changes nothing records nothing."""
    sandbox = SandboxFacts(id="s1", uid="u1", namespace="default", name="real")
    k = facts(cpus=[1], mems=[0])
    assert state_events(Views(), RUN_POD_SANDBOX, sandbox, None) == [
        ev.PodSandboxStarted(sandbox_id="s1", pod=ev.PodRef(uid="u1", namespace="default", name="real"))
    ]
    assert state_events(Views(), REMOVE_POD_SANDBOX, sandbox, None) == [
        ev.PodSandboxRemoved(sandbox_id="s1", pod_uid="u1", reason="removed by the runtime")
    ]
    assert state_events(Views(), POST_CREATE_CONTAINER, sandbox, k) == [created_event(k, "u1", adjusted=False)]
    assert state_events(Views(), START_CONTAINER, sandbox, k) == [ev.ContainerStarted(container_id="k1", pod_uid="u1")]
    assert state_events(Views(), REMOVE_CONTAINER, sandbox, k) == [ev.ContainerRemoved(container_id="k1", pod_uid="u1")]
    created = views_of(created_event(k, "u1", adjusted=False))
    assert state_events(created, POST_UPDATE_CONTAINER, sandbox, k) == []
    moved = facts(cpus=[2, 3], mems=[1])
    assert state_events(created, POST_UPDATE_CONTAINER, sandbox, moved) == [
        ev.ContainerCPUsUpdated(container_id="k1", pod_uid="u1", cpus=[2, 3], mems=[1], reason="updated by the runtime")
    ]
    assert state_events(Views(), "UNKNOWN", sandbox, k) == []
