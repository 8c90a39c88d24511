"""The core of eventsrc beside a kubelet: a kubelet's answer against what the log says."""

from __future__ import annotations

from eventsrc import events as ev
from eventsrc.core.kubelet_observations import (
    NOT_LISTED,
    NOT_LISTED_NOR_RUNNING,
    SANDBOX_GONE,
    CPUManager,
    Identities,
    Look,
    SeenClaim,
    SeenContainer,
    SeenDevices,
    SeenPod,
    allocatable_changes,
    cpu_disagreements,
    identities,
    missing,
    observe,
    release_gone,
    taken_from_another,
)
from eventsrc.events import Record
from eventsrc.state.apply import apply_all
from eventsrc.state.views import RuntimeContainerView, SandboxView, Views

GPU = "example.com/dev"


def pod(name: str, *containers: SeenContainer, ns: str = "default") -> SeenPod:
    return SeenPod(namespace=ns, name=name, containers=containers)


def gpu(*ids: str) -> tuple[SeenDevices, ...]:
    return (SeenDevices(resource=GPU, device_ids=ids, numa_nodes=(0,)),)


def cpu_state(exclusive: dict[tuple[str, str], set[int]], shared: set[int] = frozenset()) -> CPUManager:  # type: ignore[assignment]
    return CPUManager(
        exclusive={k: frozenset(v) for k, v in exclusive.items()}, shared=frozenset(shared), source="cpu_manager_state"
    )


def fold(views: Views, events: list[ev.EventBase]) -> Views:
    start = views.meta.last_seq
    return apply_all(views, [Record(start + i, i, "c", 1, e) for i, e in enumerate(events, 1)])  # type: ignore[arg-type]


def with_sandbox(views: Views, uid: str, name: str, sandbox: str = "s1", ns: str = "default") -> Views:
    """The runtime runs a sandbox of the pod, with one container running in it."""
    views.runtime.sandboxes[sandbox] = SandboxView(uid=uid, namespace=ns, name=name, since_seq=1)
    views.runtime.containers[f"c-{sandbox}"] = RuntimeContainerView(
        sandbox_id=sandbox, pod_uid=uid, name="main", state="running"
    )
    return views


def test_a_new_pod_is_observed_with_each_container_s_devices_cpus_memory_and_claims() -> None:
    claim = SeenClaim(
        namespace="default",
        name="c",
        devices=(ev.ObservedClaimDevice(driver="gpu.example.com", pool="p", device="g0", cdi_devices=["x/y=1"]),),
    )
    memory = (ev.ObservedMemory(memory_type="memory", size=1 << 30, numa_nodes=[0]),)
    look = Look(
        pods=(pod("a", SeenContainer(name="main", devices=gpu("d-1"), cpus=(3, 2), memory=memory, claims=(claim,))),),
        complete=True,
    )
    ids = Identities(checkpoint={("main", GPU, "d-1"): "uid-a"}, cpus=cpu_state({("uid-a", "main"): {2, 3}}))
    events = observe(Views().kubelet, look, ids)
    ref = ev.PodRef(uid="uid-a", namespace="default", name="a")
    assert events == [
        ev.KubeletPodObserved(pod=ref, source="List"),
        ev.KubeletDevicesObserved(pod=ref, container="main", resource=GPU, device_ids=["d-1"], numa_nodes=[0]),
        ev.KubeletCPUsObserved(pod=ref, container="main", cpus=[2, 3]),
        ev.KubeletMemoryObserved(pod=ref, container="main", memory=list(memory)),
        ev.KubeletClaimObserved(
            pod=ref,
            container="main",
            claim=ev.ClaimRef(uid="", namespace="default", name="c"),
            devices=list(claim.devices),
        ),
    ]
    views = fold(Views(), events)
    # the same answer again: nothing new
    assert observe(views.kubelet, look, ids) == []


def test_a_device_moved_from_pod_a_to_pod_b_is_released_before_it_is_observed_again() -> None:
    views = fold(
        Views(),
        observe(
            Views().kubelet,
            Look(pods=(pod("a", SeenContainer(name="m", devices=gpu("d-1"))),), complete=True),
            Identities(),
        ),
    )
    look = Look(pods=(pod("b", SeenContainer(name="m", devices=gpu("d-1"))),), complete=True)
    # without the runtime's view, one answer without it is not enough (a restarting kubelet's may be
    # partial), unless it lists one of its devices for another pod
    other = Look(pods=(pod("c", SeenContainer(name="m", devices=gpu("d-9"))),), complete=True)
    assert release_gone(views.kubelet, other, None) == []
    assert release_gone(views.kubelet, other, None, missing_before=missing(views.kubelet, other)) != []
    gone = release_gone(views.kubelet, look, None)
    assert [type(e).__name__ for e in gone] == ["KubeletDevicesReleased", "KubeletPodReleased"]
    assert gone[0].reason == NOT_LISTED  # type: ignore[attr-defined]
    views = fold(views, gone)
    held = observe(views.kubelet, look, Identities())
    views = fold(views, held)
    assert list(views.kubelet.pods) == ["default/b"]
    assert views.kubelet.pods["default/b"].containers["m"].devices == {GPU: ["d-1"]}


def test_an_empty_answer_of_a_restarted_kubelet_releases_nothing_while_the_runtime_runs_the_pod() -> None:
    views = with_sandbox(Views(), "uid-a", "a")
    ids = identities(views.runtime, {})
    views = fold(
        views,
        observe(views.kubelet, Look(pods=(pod("a", SeenContainer(name="m", devices=gpu("d-1"))),), complete=True), ids),
    )
    assert views.kubelet.pods["default/a"].uid == "uid-a"
    empty = Look(pods=(), complete=True)
    assert release_gone(views.kubelet, empty, views.runtime) == []
    # without the runtime's view, an empty answer is what a restarted kubelet says too
    assert release_gone(views.kubelet, empty, None) == []
    assert release_gone(views.kubelet, empty, None, missing_before=missing(views.kubelet, empty)) == []
    # the pod completed: its sandbox stays, its containers stopped; the kubelet does not list it: gone
    for c in views.runtime.containers.values():
        c.state = "stopped"
    gone = release_gone(views.kubelet, empty, views.runtime)
    assert gone[-1] == ev.KubeletPodReleased(
        pod=ev.PodRef(uid="uid-a", namespace="default", name="a"), reason=NOT_LISTED_NOR_RUNNING
    )


def test_a_removed_sandbox_releases_its_pod_even_while_the_kubelet_lists_it() -> None:
    views = with_sandbox(Views(), "uid-a", "a")
    look = Look(pods=(pod("a", SeenContainer(name="m", devices=gpu("d-1"), cpus=(1,))),), complete=True)
    views = fold(views, observe(views.kubelet, look, identities(views.runtime, {}, cpu_state({("uid-a", "m"): {1}}))))
    gone = release_gone(views.kubelet, look, views.runtime, removed_uids={"uid-a"})
    assert [type(e).__name__ for e in gone] == ["KubeletDevicesReleased", "KubeletCPUsReleased", "KubeletPodReleased"]
    assert all(e.reason == SANDBOX_GONE for e in gone)  # type: ignore[attr-defined]
    views.runtime.sandboxes.clear()
    views = fold(views, gone)
    # the kubelet's late answer still lists it: with no sandbox of it, it is not observed again
    assert observe(views.kubelet, look, identities(views.runtime, {})) == []


def test_a_partial_get_answer_releases_no_pod_it_does_not_name() -> None:
    views = fold(
        Views(),
        observe(
            Views().kubelet,
            Look(pods=(pod("a", SeenContainer(name="m", devices=gpu("d-1"))),), complete=True),
            Identities(),
        ),
    )
    got = Look(
        pods=(pod("b", SeenContainer(name="m", devices=gpu("d-2"))),),
        complete=False,
        asked=frozenset({"default/b"}),
        source="Get",
    )
    assert release_gone(views.kubelet, got, None) == []
    assert [type(e).__name__ for e in observe(views.kubelet, got, Identities())] == [
        "KubeletPodObserved",
        "KubeletDevicesObserved",
    ]


def test_a_changed_cpu_set_is_observed_whole_and_an_emptied_one_released() -> None:
    def look(*cpus: int) -> Look:
        return Look(pods=(pod("a", SeenContainer(name="m", cpus=cpus)),), complete=True)

    ref = ev.PodRef(uid="uid-a", namespace="default", name="a")
    views = fold(Views(), observe(Views().kubelet, look(1, 2), Identities(cpus=cpu_state({("uid-a", "m"): {1, 2}}))))
    assert views.kubelet.pods["default/a"].uid == "uid-a"  # the CPU manager's state named it
    changed = observe(views.kubelet, look(2, 3), Identities(cpus=cpu_state({("uid-a", "m"): {2, 3}})))
    assert changed == [ev.KubeletCPUsObserved(pod=ref, container="m", cpus=[2, 3])]
    views = fold(views, changed)
    emptied = observe(views.kubelet, look(), Identities(cpus=cpu_state({})))
    assert emptied == [ev.KubeletCPUsReleased(pod=ref, container="m", cpus=[2, 3], reason=NOT_LISTED)]


def test_exclusive_cpus_are_what_the_cpu_manager_s_state_gives_the_container() -> None:
    """Issue 35 item 1: a kubelet before 1.21 lists a container's whole cpuset, the shared pool
    included. Only what the CPU manager's state gives the container is exclusive; without the
    state, nothing is; a listing the state does not explain is a disagreement."""
    state = cpu_state({("uid-g", "main"): {1}}, shared={0, 2, 3})
    look = Look(
        pods=(
            pod("g", SeenContainer(name="main", cpus=(1,))),  # Guaranteed: its exclusive CPU
            pod("be", SeenContainer(name="main", cpus=(0, 2, 3))),  # BestEffort: the shared pool
            pod("small", SeenContainer(name="main", cpus=(0, 1, 2, 3))),  # a stale cpuset: all of them
        ),
        complete=True,
    )
    events = observe(Views().kubelet, look, Identities(cpus=state))
    cpus = [(e.pod.name, e.pod.uid, e.cpus) for e in events if isinstance(e, ev.KubeletCPUsObserved)]
    assert cpus == [("g", "uid-g", [1])]  # uid-g: named by the state (the only entry of exactly those CPUs)
    views = fold(Views(), events)
    assert cpu_disagreements(views.kubelet, look, Identities(cpus=state)) == [
        ev.KubeletCPUsDisagreed(
            pod=ev.PodRef(uid="", namespace="default", name="small"), container="main", listed=[0, 1, 2, 3],
            checkpoint=[], source="cpu_manager_state",
        )
    ]  # fmt: skip
    # without the CPU manager's state, nothing listed is known to be exclusive
    assert not [e for e in observe(Views().kubelet, look, Identities()) if isinstance(e, ev.KubeletCPUsObserved)]
    assert cpu_disagreements(Views().kubelet, look, Identities()) == []
    # a state whose entry differs from what the kubelet lists: only the CPUs both give count
    other = cpu_state({("uid-g", "main"): {1, 2}}, shared={0, 3})
    ids = Identities(checkpoint={}, sandboxes={"default/g": "uid-g"}, cpus=other)
    assert [e for e in observe(Views().kubelet, look, ids) if isinstance(e, ev.KubeletCPUsObserved)] == [
        ev.KubeletCPUsObserved(pod=ev.PodRef(uid="uid-g", namespace="default", name="g"), container="main", cpus=[1])
    ]
    assert [d.pod.name for d in cpu_disagreements(Views().kubelet, look, ids)] == ["be", "g", "small"]
    # the none policy gives nothing exclusively: a 1.20 kubelet lists every CPU, its file no pool
    none = CPUManager(policy="none", source="cpu_manager_state")
    assert cpu_disagreements(Views().kubelet, look, Identities(cpus=none)) == []


def test_a_new_pod_under_a_reused_name_releases_the_old_one_first() -> None:
    views = with_sandbox(Views(), "uid-1", "a")
    look = Look(pods=(pod("a", SeenContainer(name="m", devices=gpu("d-1"))),), complete=True)
    views = fold(views, observe(views.kubelet, look, identities(views.runtime, {})))
    views.runtime.sandboxes.clear()
    views = with_sandbox(views, "uid-2", "a", sandbox="s2")
    events = observe(views.kubelet, look, identities(views.runtime, {}))
    names = [(type(e).__name__, e.pod.uid) for e in events]  # type: ignore[attr-defined]
    assert names == [
        ("KubeletDevicesReleased", "uid-1"),
        ("KubeletPodReleased", "uid-1"),
        ("KubeletPodObserved", "uid-2"),
        ("KubeletDevicesObserved", "uid-2"),
    ]


def test_allocatable_changes_say_devices_appearing_and_leaving() -> None:
    views = Views()
    first = allocatable_changes(views.kubelet, {GPU: {"d-1": (0,), "d-2": (1,)}}, [0, 1])
    assert first == [
        ev.KubeletAllocatableChanged(
            added={
                GPU: [
                    ev.DeviceInfo(id="d-1", health="Healthy", numa_nodes=[0]),
                    ev.DeviceInfo(id="d-2", health="Healthy", numa_nodes=[1]),
                ]
            },
            cpus_added=[0, 1],
        )
    ]
    views = fold(views, first)
    assert allocatable_changes(views.kubelet, {GPU: {"d-1": (0,), "d-2": (1,)}}, [0, 1]) == []
    second = allocatable_changes(views.kubelet, {GPU: {"d-1": (0,)}}, [0, 1])
    assert second == [ev.KubeletAllocatableChanged(removed={GPU: ["d-2"]})]


def test_the_device_checkpoint_names_a_uid_only_when_it_names_one_for_every_device_and_no_other_pod_has_it() -> None:
    look = Look(pods=(pod("b", SeenContainer(name="main", devices=gpu("d-1", "d-2"))),), complete=True)
    one = Identities(checkpoint={("main", GPU, "d-1"): "uid-b", ("main", GPU, "d-2"): "uid-b"})
    assert observe(Views().kubelet, look, one)[0].pod.uid == "uid-b"  # type: ignore[attr-defined]
    # the checkpoint still names the previous holder of d-1: no uid rather than a wrong one
    two = Identities(checkpoint={("main", GPU, "d-1"): "uid-a", ("main", GPU, "d-2"): "uid-b"})
    assert observe(Views().kubelet, look, two)[0].pod.uid == ""  # type: ignore[attr-defined]
    views = fold(Views(), [ev.KubeletPodObserved(pod=ev.PodRef(uid="uid-b", namespace="default", name="a"))])
    assert observe(views.kubelet, look, one)[0].pod.uid == ""  # type: ignore[attr-defined]


def test_a_device_the_kubelet_lists_for_two_pods_names_neither_uid_from_the_checkpoint() -> None:
    """The checkpoint's one entry for the device names one of the two holders: neither gets it
    (two observed pods with one uid would merge them in every answer built on the uid)."""
    look = Look(
        pods=(
            pod("a", SeenContainer(name="main", devices=gpu("d-1"))),
            pod("b", SeenContainer(name="main", devices=gpu("d-1"))),
        ),
        complete=True,
    )
    ids = Identities(checkpoint={("main", GPU, "d-1"): "uid-b"})
    seen = [e.pod.uid for e in observe(Views().kubelet, look, ids) if isinstance(e, ev.KubeletPodObserved)]
    assert seen == ["", ""]


def test_a_get_answer_with_a_device_another_pod_holds_asks_for_the_whole_list() -> None:
    views = fold(
        Views(),
        observe(
            Views().kubelet,
            Look(pods=(pod("a", SeenContainer(name="m", devices=gpu("d-1"))),), complete=True),
            Identities(),
        ),
    )
    got = Look(pods=(pod("b", SeenContainer(name="m", devices=gpu("d-1"))),), complete=False, source="Get")
    assert taken_from_another(views.kubelet, got)
    assert not taken_from_another(
        views.kubelet, Look(pods=(pod("a", SeenContainer(name="m", devices=gpu("d-1"))),), complete=False)
    )


def test_an_event_of_another_pod_under_the_name_does_not_merge_into_it() -> None:
    old = ev.PodRef(uid="uid-1", namespace="default", name="a")
    new = ev.PodRef(uid="uid-2", namespace="default", name="a")
    views = fold(Views(), [ev.KubeletDevicesObserved(pod=old, container="m", resource=GPU, device_ids=["d-1"])])
    views = fold(views, [ev.KubeletDevicesObserved(pod=new, container="m", resource=GPU, device_ids=["d-2"])])
    views = fold(views, [ev.KubeletPodReleased(pod=new)])
    assert views.kubelet.pods["default/a"].containers["m"].devices == {GPU: ["d-1"]}
    views = fold(views, [ev.KubeletPodObserved(pod=new)])
    assert views.kubelet.pods["default/a"].uid == "uid-2" and not views.kubelet.pods["default/a"].containers
