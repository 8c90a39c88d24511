"""The shell beside a kubelet (``node/beside.py``) with a fake log and a fake kubelet: what a
look asks, what it records, what it keeps for the next look when a call fails, the gaps."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from eventsrc import events as ev
from eventsrc.gen.podresources.v1 import api_pb2 as pr
from eventsrc.node.beside import Beside, BesideOptions, KubeletUnavailable, runtime_gap_events, seen_pod, start_events
from eventsrc.state.apply import apply_all
from eventsrc.state.views import RuntimeContainerView, SandboxView, Views

GPU = "example.com/dev"


class FakeLog:
    def __init__(self) -> None:
        self.views = Views()
        self.batches: list[list[ev.EventBase]] = []
        self.now = 1_000

    async def record(self, events: list[ev.EventBase]) -> list[ev.Record]:
        self.batches.append(list(events))
        start = self.views.meta.last_seq
        records = [ev.Record(start + i, self.now, "c", 1, e) for i, e in enumerate(events, 1)]  # type: ignore[arg-type]
        apply_all(self.views, records)
        return records

    async def observe(self, observed: Callable[[], list[ev.EventBase]]) -> list[ev.Record]:
        events = observed()
        return await self.record(events) if events else []

    def types(self) -> list[str]:
        return [type(e).__name__ for batch in self.batches for e in batch]


def pod(name: str, *devices: str, ns: str = "default") -> pr.PodResources:
    return pr.PodResources(
        name=name,
        namespace=ns,
        containers=[
            pr.ContainerResources(
                name="main", devices=[pr.ContainerDevices(resource_name=GPU, device_ids=list(devices))]
            )
        ],
    )


class FakeKubelet:
    def __init__(self) -> None:
        self.pods: list[pr.PodResources] = []
        self.calls: list[str] = []
        self.get_served = True  # as the client knows it: False once Get said it is not served
        self.get_unimplemented = False
        self.fail: str = ""  # the method that fails

    async def _maybe_fail(self, method: str) -> None:
        self.calls.append(method)
        if self.fail == method:
            raise KubeletUnavailable(f"{method}: refused")

    async def list(self) -> list[pr.PodResources]:
        await self._maybe_fail("List")
        return list(self.pods)

    async def get(self, namespace: str, name: str) -> pr.PodResources | None:
        await self._maybe_fail("Get")
        if self.get_unimplemented:
            self.get_served = False
            raise NotImplementedError
        return next((p for p in self.pods if (p.namespace, p.name) == (namespace, name)), None)

    async def allocatable(self) -> pr.AllocatableResourcesResponse:
        await self._maybe_fail("GetAllocatableResources")
        return pr.AllocatableResourcesResponse(cpu_ids=[0, 1])

    def close(self) -> None:
        pass


@pytest.fixture
async def shell(tmp_path: Path) -> tuple[Beside, FakeLog, FakeKubelet]:
    log, kubelet = FakeLog(), FakeKubelet()
    beside = Beside(log, BesideOptions(kubelet_dir=tmp_path), clock=lambda: log.now)  # type: ignore[arg-type]
    beside.client = kubelet  # type: ignore[assignment]
    return beside, log, kubelet


async def test_a_first_look_lists_everything_and_records_what_it_saw(shell: Any) -> None:
    beside, log, kubelet = shell
    kubelet.pods = [pod("a", "d-1")]
    await beside.look()
    assert kubelet.calls == ["List", "GetAllocatableResources"]
    assert log.types() == ["KubeletPodObserved", "KubeletDevicesObserved", "KubeletAllocatableChanged"]


async def test_a_runtime_event_asks_get_for_its_pod_and_list_when_get_is_not_served(shell: Any) -> None:
    beside, log, kubelet = shell
    await beside.look()
    kubelet.pods, kubelet.calls = [pod("a", "d-1")], []
    started = ev.PodSandboxStarted(sandbox_id="s1", pod=ev.PodRef(uid="u", namespace="default", name="a"))
    beside.saw([ev.Record(9, 1, "c", 1, started)])
    await beside.look()
    assert kubelet.calls == ["Get"]
    assert "KubeletDevicesObserved" in log.types()
    kubelet.get_unimplemented, kubelet.calls = True, []
    beside.saw([ev.Record(10, 1, "c", 1, started)])
    await beside.look()
    assert kubelet.calls == ["Get", "List", "GetAllocatableResources"]
    kubelet.calls = []
    beside.saw([ev.Record(11, 1, "c", 1, started)])
    await beside.look()
    assert kubelet.calls == ["List", "GetAllocatableResources"]  # not asked again


async def test_a_failed_look_records_nothing_and_keeps_what_it_was_asked(shell: Any) -> None:
    beside, log, kubelet = shell
    kubelet.pods, kubelet.fail = [pod("a", "d-1")], "List"
    with pytest.raises(KubeletUnavailable):
        await beside.look()
    assert log.types() == []
    kubelet.fail, kubelet.calls = "", []
    await beside.look()  # the full look is still due
    assert kubelet.calls == ["List", "GetAllocatableResources"]


async def test_a_failed_allocatable_call_is_no_gap_and_the_pods_are_still_recorded(shell: Any) -> None:
    beside, log, kubelet = shell
    kubelet.pods, kubelet.fail = [pod("a", "d-1")], "GetAllocatableResources"
    await beside.look()
    # not the kubelet's gap: its pods are seen; but with no device checkpoint read either,
    # nothing shows what is allocatable, and that is a gap of its own (issue 35 item 3)
    assert log.types() == ["KubeletPodObserved", "KubeletDevicesObserved", "ObservationGapFound"]
    assert log.batches[-1][-1].source == "kubelet allocatable"  # type: ignore[attr-defined]


async def test_the_run_loop_opens_a_gap_once_and_closes_it_at_the_next_answer(shell: Any) -> None:
    beside, log, kubelet = shell
    kubelet.fail = "List"
    async with trio.open_nursery() as nursery:
        await nursery.start(beside.run)
        while "ObservationGapFound" not in log.types():
            await trio.sleep(0)
        log.now = 2_000
        kubelet.fail = ""
        beside.look_again()
        while log.types().count("ObservationGapFound") < 2:
            await trio.sleep(0)
        nursery.cancel_scope.cancel()
    opened, closed = [e for batch in log.batches for e in batch if isinstance(e, ev.ObservationGapFound)]
    assert (opened.source, opened.since_ns, opened.until_ns) == ("kubelet", 1_000, 0)
    assert (closed.source, closed.since_ns, closed.until_ns) == ("kubelet", 1_000, 2_000)
    assert not log.views.kubelet.gaps


async def test_a_kubelet_gap_starts_at_its_last_answer_not_at_the_look_that_found_it_gone(shell: Any) -> None:
    """Issue 35 item 4: the kubelet answered List at 1 s (and then GetAllocatableResources, at 3
    s); at 7 s a look finds it gone: the gap starts at 1 s, its last answer known, not at 7 s
    (the look that found it gone), nor at 3 s (when a kubelet without that method answered
    nothing: that call's failure is no answer about the pods)."""
    beside, log, kubelet = shell
    answer = kubelet.allocatable

    async def allocatable_later() -> pr.AllocatableResourcesResponse:
        log.now = 3_000
        return await answer()

    kubelet.allocatable = allocatable_later
    await beside.look()  # List answered at 1_000
    log.now, kubelet.fail = 7_000, "List"
    beside.look_again()  # as the resync or a runtime event asks
    async with trio.open_nursery() as nursery:
        await nursery.start(beside.run)
        while "ObservationGapFound" not in log.types():
            await trio.sleep(0)
        nursery.cancel_scope.cancel()
    (opened,) = [e for batch in log.batches for e in batch if isinstance(e, ev.ObservationGapFound)]
    assert (opened.source, opened.since_ns, opened.until_ns) == ("kubelet", 1_000, 0)


async def test_a_get_answer_with_another_pods_device_asks_for_the_whole_list(shell: Any) -> None:
    beside, log, kubelet = shell
    kubelet.pods = [pod("a", "d-1")]
    await beside.look()
    kubelet.pods, kubelet.calls = [pod("b", "d-1")], []
    started = ev.PodSandboxStarted(sandbox_id="s2", pod=ev.PodRef(uid="ub", namespace="default", name="b"))
    beside.saw([ev.Record(9, 1, "c", 1, started)])
    await beside.look()
    assert kubelet.calls == ["Get", "List", "GetAllocatableResources"]
    # a is gone from the list and b has its device: a released first, then b observed
    tail = log.types()[-4:]
    assert tail == ["KubeletDevicesReleased", "KubeletPodReleased", "KubeletPodObserved", "KubeletDevicesObserved"]


def test_the_start_records_the_time_eventsrc_was_not_running_and_closes_what_was_open() -> None:
    views = Views()
    views.kubelet.gaps["kubelet"] = 100
    events = start_events(views, 500, 900, runtime=True, stopped_cleanly=False)
    assert events == [
        ev.ObservationGapFound(source="kubelet", since_ns=100, until_ns=500),
        ev.ObservationGapFound(
            source="eventsrc",
            since_ns=500,
            until_ns=900,
            reason="eventsrc was not running (killed or crashed; from its last record)",
        ),
        ev.ObservationGapFound(source="runtime", since_ns=900, reason="the runtime is not connected yet"),
    ]
    assert start_events(Views(), None, 900, runtime=False, stopped_cleanly=True) == []


def test_runtime_gaps_follow_disconnections_and_connections() -> None:
    views = Views()
    down = ev.Record(5, 10, "c", 1, ev.RuntimeDisconnected(reason="gone"))
    up = ev.Record(6, 20, "c", 1, ev.RuntimeConnected(runtime="containerd"))
    assert runtime_gap_events(views, [down, up]) == [
        ev.ObservationGapFound(source="runtime", since_ns=10, reason="gone"),
        ev.ObservationGapFound(source="runtime", since_ns=10, until_ns=20),
    ]
    # an open gap not recorded yet is kept, and closed by a connection seen later
    pending = runtime_gap_events(views, [down])
    assert runtime_gap_events(views, [*pending, up])[-1] == ev.ObservationGapFound(
        source="runtime", since_ns=10, until_ns=20
    )


def test_a_pod_resources_answer_becomes_what_the_core_compares() -> None:
    p = pr.PodResources(
        name="a",
        namespace="ns",
        containers=[
            pr.ContainerResources(
                name="main",
                devices=[
                    pr.ContainerDevices(
                        resource_name=GPU, device_ids=["d-1"], topology=pr.TopologyInfo(nodes=[pr.NUMANode(ID=1)])
                    )
                ],
                cpu_ids=[3, 2],
                memory=[pr.ContainerMemory(memory_type="memory", size=5)],
                dynamic_resources=[
                    pr.DynamicResource(
                        claim_name="c",
                        claim_namespace="ns",
                        claim_resources=[
                            pr.ClaimResource(
                                driver_name="gpu.example.com",
                                pool_name="p",
                                device_name="g0",
                                cdi_devices=[pr.CDIDevice(name="k/v=1")],
                            )
                        ],
                    )
                ],
            )
        ],
    )
    seen = seen_pod(p)
    (c,) = seen.containers
    assert (seen.key, c.name, c.cpus) == ("ns/a", "main", (3, 2))
    assert c.devices[0].device_ids == ("d-1",) and c.devices[0].numa_nodes == (1,)
    assert c.memory == (ev.ObservedMemory(memory_type="memory", size=5),)
    (claim,) = c.claims
    assert (claim.namespace, claim.name) == ("ns", "c")
    assert claim.devices == (
        ev.ObservedClaimDevice(driver="gpu.example.com", pool="p", device="g0", cdi_devices=["k/v=1"]),
    )


async def test_with_a_synchronized_runtime_a_completed_pod_is_released(shell: Any) -> None:
    beside, log, kubelet = shell
    beside.options = BesideOptions(kubelet_dir=beside.options.kubelet_dir, runtime=True)
    beside.runtime_synchronized = lambda: True
    rt = log.views.runtime
    rt.sandboxes["s1"] = SandboxView(uid="ua", namespace="default", name="a", since_seq=1)
    rt.containers["k1"] = RuntimeContainerView(sandbox_id="s1", pod_uid="ua", name="main", state="running")
    kubelet.pods = [pod("a", "d-1")]
    await beside.look()
    assert log.views.kubelet.pods["default/a"].uid == "ua"
    kubelet.pods = []
    beside.look_again()
    await beside.look()
    assert "KubeletPodReleased" not in log.types()  # its container runs: an empty answer is no release
    rt.containers["k1"].state = "stopped"
    beside.look_again()
    await beside.look()
    assert log.types()[-1] == "KubeletPodReleased"
