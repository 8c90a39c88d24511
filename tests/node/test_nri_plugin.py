"""NRIPlugin (eventsrc.node.nri) in-process, against a fake runtime on a real unix socket.

The fake runtime listens where the plugin connects (``NRIOptions.socket``) and speaks the
wire by hand: mux frames and ttrpc headers packed and unpacked with ``struct``, ttrpc's
Request/Response/Status and NRI's messages read with protobuf; nothing of eventsrc.rpc.ttrpc
checks itself. It answers RegisterPlugin on conn 2 (the plugin calls the runtime) and calls
Configure, Synchronize, CreateContainer, StateChange on conn 1 (the runtime calls the plugin),
as containerd does.

The recorder applies events to real Views; admission is faked (it records what a test says,
refuses, or never returns). Every test runs on trio's MockClock with autojump: nothing sleeps
to synchronise (the fake reads what the plugin wrote; wait_all_tasks_blocked says when the
plugin has nothing left to do), backoffs and timeouts pass at once, and a hang fails fast at
the mock-time deadline of ``running`` instead of at pytest's timeout.
"""

from __future__ import annotations

import json
import os
import socket as stdlib_socket
import struct
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
import trio.testing
from google.protobuf.message import Message

from eventsrc import events as ev
from eventsrc.core.cpu.assignment import StaticPolicyOptions
from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.core.cpu.static import CPUManagerConfig
from eventsrc.core.cpu.topology import Core, MachineInfo, discover
from eventsrc.core.cpu.topology import Node as NUMANode
from eventsrc.errors import AdmissionRefused
from eventsrc.gen.nri.v1alpha1 import api_pb2 as nri
from eventsrc.gen.ttrpc import request_pb2, status_pb2
from eventsrc.inputs.manifest import PodSpec
from eventsrc.node.nri import NRIOptions, NRIPlugin
from eventsrc.state.views import PodView
from tests.support.recorder import FakeRecorder

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME = "nri.pkg.api.v1alpha1.Runtime"
REQUEST, RESPONSE = 1, 2
MAX = 4 << 20
DEV = "example.com/dev"
E = nri.Event

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


def bit(event: int) -> int:
    return 1 << (event - 1)


def cpu_list(text: str) -> list[int]:
    """A cpuset string ("0-1,3") as a list, read here rather than with eventsrc's parser."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


# ------------------------------------------------------------------ the daemon's side, faked


Decide = Callable[[PodSpec], list[ev.EventBase]]


def admitted(spec: PodSpec) -> list[ev.EventBase]:
    """A plain admission: nothing exclusive, no devices."""
    return [
        ev.PodAdmissionStarted(pod=spec.pod, containers=spec.containers),
        ev.PodAdmitted(pod=spec.pod, containers=spec.containers),
    ]


@dataclass
class FakeAdmission:
    """Admission as the plugin calls it: ``decide`` gives what to record, or ``refuse`` a reason,
    or ``hang`` never returns."""

    recorder: FakeRecorder
    decide: Decide = admitted
    refuse: str = ""
    hang: bool = False
    specs: list[PodSpec] = field(default_factory=list)
    removed: list[tuple[str, str]] = field(default_factory=list)

    async def admit(self, spec: PodSpec) -> tuple[PodView, str]:
        self.specs.append(spec)
        if self.hang:
            await trio.sleep_forever()
        if self.refuse:
            raise AdmissionRefused(self.refuse)
        await self.recorder.record(self.decide(spec))
        return self.recorder.views.pods.pods[spec.pod.uid], "admitted"

    async def remove(self, uid: str, reason: str = "pod removed") -> tuple[PodView, str, int]:
        self.removed.append((uid, reason))
        pod = self.recorder.views.pods.pods[uid]
        records = await self.recorder.record([ev.PodRemoved(pod_uid=uid, reason=reason)])
        return pod, "removed", records[-1].seq


# ------------------------------------------------------------------ the runtime's side, by hand


def frame(conn: int, stream_id: int, kind: int, payload: bytes) -> bytes:
    """One ttrpc message in one mux frame."""
    body = struct.pack(">IIBB", len(payload), stream_id, kind, 0) + payload
    return struct.pack(">II", conn, len(body)) + body


@dataclass
class Received:
    conn: int
    stream_id: int
    kind: int
    payload: bytes


class RuntimeConn:
    """One connection of the fake runtime: it calls the plugin on conn 1 (odd, increasing
    stream ids) and serves the plugin's calls on conn 2. Requests of the plugin that come
    while a call waits for its answer are kept for ``plugin_request``."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.raw = bytearray()
        self.conns = {1: bytearray(), 2: bytearray()}
        self.next_id = 1
        self.requests: list[tuple[int, request_pb2.Request]] = []

    async def _fill(self, n: int) -> None:
        while len(self.raw) < n:
            data = await self.stream.receive_some()
            if not data:
                raise EOFError(f"the plugin closed the socket with {len(self.raw)} bytes of a frame")
            self.raw += data

    async def receive(self) -> Received:
        """The next whole ttrpc message the plugin wrote, on either connection."""
        while True:
            for conn, buf in self.conns.items():
                if len(buf) >= 10:
                    length, stream_id, kind, _flags = struct.unpack(">IIBB", buf[:10])
                    if len(buf) >= 10 + length:
                        payload = bytes(buf[10 : 10 + length])
                        del buf[: 10 + length]
                        return Received(conn, stream_id, kind, payload)
            await self._fill(8)
            conn, n = struct.unpack(">II", self.raw[:8])
            assert conn in (1, 2), conn
            assert n <= MAX + 10, n
            await self._fill(8 + n)
            self.conns[conn] += self.raw[8 : 8 + n]
            del self.raw[: 8 + n]

    def _keep(self, got: Received) -> None:
        assert (got.conn, got.kind) == (2, REQUEST), got
        self.requests.append((got.stream_id, request_pb2.Request.FromString(got.payload)))

    async def call(self, method: str, message: Message, timeout_nano: int = 0) -> request_pb2.Response:
        """Call the plugin on conn 1 and wait for the answer."""
        stream_id, self.next_id = self.next_id, self.next_id + 2
        payload = message.SerializeToString()
        request = request_pb2.Request(service=PLUGIN, method=method, payload=payload, timeout_nano=timeout_nano)
        await self.stream.send_all(frame(1, stream_id, REQUEST, request.SerializeToString()))
        while True:
            got = await self.receive()
            if got.conn == 1:
                assert (got.stream_id, got.kind) == (stream_id, RESPONSE), got
                return request_pb2.Response.FromString(got.payload)
            self._keep(got)

    async def plugin_request(self) -> tuple[int, request_pb2.Request]:
        """The plugin's next call on conn 2: (stream id, request)."""
        while not self.requests:
            self._keep(await self.receive())
        return self.requests.pop(0)

    async def answer(self, stream_id: int, message: Message, code: int = 0, text: str = "") -> None:
        payload = message.SerializeToString()
        body = request_pb2.Response(status=status_pb2.Status(code=code, message=text), payload=payload)
        await self.stream.send_all(frame(2, stream_id, RESPONSE, body.SerializeToString()))

    # -------------------------------------------------------------- NRI, as containerd plays it

    async def register(self) -> nri.RegisterPluginRequest:
        stream_id, request = await self.plugin_request()
        assert (request.service, request.method) == (RUNTIME, "RegisterPlugin"), request
        await self.answer(stream_id, nri.Empty())
        return nri.RegisterPluginRequest.FromString(request.payload)

    async def configure(self, request_timeout: int = 2000) -> nri.ConfigureResponse:
        req = nri.ConfigureRequest(runtime_name="fake", runtime_version="1.0", request_timeout=request_timeout)
        resp = await self.call("Configure", req)
        assert resp.status.code == 0, resp.status
        return nri.ConfigureResponse.FromString(resp.payload)

    async def synchronize(
        self, pods: Sequence[nri.PodSandbox] = (), containers: Sequence[nri.Container] = (), more: bool = False
    ) -> nri.SynchronizeResponse:
        resp = await self.call("Synchronize", nri.SynchronizeRequest(pods=pods, containers=containers, more=more))
        assert resp.status.code == 0, resp.status
        return nri.SynchronizeResponse.FromString(resp.payload)

    async def start(self, pods: Sequence[nri.PodSandbox] = (), containers: Sequence[nri.Container] = ()) -> None:
        """RegisterPlugin, Configure, Synchronize: the plugin is up."""
        await self.register()
        await self.configure()
        await self.synchronize(pods, containers)

    async def create(self, pod: nri.PodSandbox, container: nri.Container) -> request_pb2.Response:
        """CreateContainer within the runtime's request timeout, as containerd sends it."""
        req = nri.CreateContainerRequest(pod=pod, container=container)
        return await self.call("CreateContainer", req, timeout_nano=2_000_000_000)

    async def state_change(self, event: nri.Event, pod: nri.PodSandbox, container: nri.Container | None = None) -> None:
        req = nri.StateChangeEvent(event=event, pod=pod, container=container)
        resp = await self.call("StateChange", req)
        assert resp.status.code == 0, resp.status


class Runtime:
    """The runtime's NRI socket: a listening unix socket; each accept is one connection."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock: trio.socket.SocketType | None = None

    def listen(self) -> None:
        # bound with the stdlib socket: trio binds a unix socket in a thread, and a thread's
        # wait looks idle to the autojump clock, which would jump to the deadline meanwhile
        sock = stdlib_socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
        sock.bind(str(self.path))
        sock.listen(4)
        self.sock = trio.socket.from_stdlib_socket(sock)

    async def accept(self) -> RuntimeConn:
        assert self.sock is not None
        conn, _ = await self.sock.accept()
        return RuntimeConn(trio.SocketStream(conn))

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


@pytest.fixture
def socket_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="nri") as tmp:  # short: a unix socket path has 107 bytes
        yield Path(tmp) / "nri.sock"


@asynccontextmanager
async def running(plugin: NRIPlugin, runtime: Runtime | None = None) -> AsyncIterator[trio.Nursery]:
    """The plugin running (after the runtime listens, when one is given) for the body; a
    hang fails at the mock-time deadline."""
    try:
        with trio.fail_after(600):
            if runtime is not None:
                runtime.listen()
            async with trio.open_nursery() as nursery:
                await nursery.start(plugin.run)
                yield nursery
                nursery.cancel_scope.cancel()
    finally:
        if runtime is not None:
            runtime.close()


def sandbox(sid: str, uid: str, name: str = "", annotations: dict[str, str] | None = None) -> nri.PodSandbox:
    return nri.PodSandbox(id=sid, uid=uid, namespace="default", name=name or uid, annotations=annotations or {})


def container(
    cid: str,
    sid: str,
    name: str,
    state: nri.ContainerState = nri.CONTAINER_CREATED,
    cpus: str = "",
    whole_cpus: int = 0,
    mems: str = "",
) -> nri.Container:
    """A container as CRI carries it; ``whole_cpus`` makes it Guaranteed with that many CPUs."""
    cpu = nri.LinuxCPU(cpus=cpus, mems=mems)
    memory = nri.LinuxMemory()
    if whole_cpus:
        cpu.shares.value = 1024 * whole_cpus
        cpu.quota.value = 100_000 * whole_cpus
        cpu.period.value = 100_000
        memory.limit.value = 64 << 20
    linux = nri.LinuxContainer(resources=nri.LinuxResources(cpu=cpu, memory=memory), cgroups_path=f"/kubepods/{cid}")
    return nri.Container(id=cid, pod_sandbox_id=sid, name=name, state=state, linux=linux)


def a_shared_container_recorded_earlier() -> list[ev.EventBase]:
    """An admitted pod u0 whose container "shared" runs on the whole shared pool, CPUs 0-3."""
    u0 = ev.PodRef(uid="u0", namespace="default", name="u0")
    return [
        ev.SharedPoolChanged(cpus=[0, 1, 2, 3]),
        ev.PodAdmissionStarted(pod=u0, containers=[ev.ContainerSpec(name="c")]),
        ev.PodAdmitted(pod=u0, containers=[ev.ContainerSpec(name="c")]),
        ev.PodSandboxStarted(sandbox_id="s0", pod=ev.PodRef(uid="u0", namespace="default", name="u0")),
        ev.ContainerCreated(
            container_id="shared", sandbox_id="s0", pod_uid="u0", name="c", cpus=[0, 1, 2, 3], mems=[0, 1]
        ),
        ev.ContainerStarted(container_id="shared", pod_uid="u0"),
    ]


SHARED_POD = sandbox("s0", "u0")
SHARED_CONTAINER = container("shared", "s0", "c", state=nri.CONTAINER_RUNNING, cpus="0-3", mems="0-1")


# ------------------------------------------------------------------ registration


@pytest.mark.parametrize(("mode", "index"), [("enforce", "10"), ("observe", "42")])
async def test_the_plugin_registers_and_configure_answers_the_events_its_mode_needs(
    autojump_clock: trio.testing.MockClock, socket_path: Path, mode: str, index: str
) -> None:
    recorder = FakeRecorder()
    plugin = NRIPlugin(
        recorder, FakeAdmission(recorder), STATIC, NRIOptions(socket=socket_path, index=index, mode=mode)
    )
    runtime = Runtime(socket_path)
    async with running(plugin, runtime):
        conn = await runtime.accept()
        registered = await conn.register()
        assert (registered.plugin_name, registered.plugin_idx) == ("eventsrc", index)
        assert recorder.records == []  # nothing until the runtime configures the plugin

        events = (await conn.configure()).events
        if mode == "enforce":
            wanted = (
                E.RUN_POD_SANDBOX,
                E.REMOVE_POD_SANDBOX,
                E.CREATE_CONTAINER,
                E.START_CONTAINER,
                E.STOP_CONTAINER,
                E.REMOVE_CONTAINER,
            )
            assert events == sum(bit(e) for e in wanted)
        else:
            assert events & bit(E.POST_CREATE_CONTAINER)
            assert not events & bit(E.CREATE_CONTAINER)
            assert events & bit(E.RUN_POD_SANDBOX) and events & bit(E.REMOVE_POD_SANDBOX)

        assert recorder.of(ev.RuntimeConnected) == [
            ev.RuntimeConnected(runtime="fake", runtime_version="1.0", plugin=f"{index}-eventsrc", mode=mode)
        ]
        assert recorder.views.runtime.connected
        assert plugin.registrations == 1


# ------------------------------------------------------------------ Synchronize


async def test_a_chunked_synchronize_is_answered_more_then_settled_with_both_chunks(
    autojump_clock: trio.testing.MockClock, socket_path: Path
) -> None:
    recorder = FakeRecorder()
    admission = FakeAdmission(recorder)
    plugin = NRIPlugin(
        recorder, admission, STATIC, NRIOptions(socket=socket_path, annotation_namespaces=frozenset({"default"}))
    )
    runtime = Runtime(socket_path)
    async with running(plugin, runtime):
        conn = await runtime.accept()
        await conn.register()
        await conn.configure()
        before = len(recorder.records)

        first = await conn.synchronize(
            [sandbox("s1", "u1")],
            [container("k1", "s1", "one", state=nri.CONTAINER_RUNNING, cpus="0-1")],
            more=True,
        )
        assert first.more and list(first.update) == []
        assert len(recorder.records) == before  # nothing settled on half the runtime's state

        last = await conn.synchronize(
            [sandbox("s2", "u2")], [container("k2", "s2", "two", state=nri.CONTAINER_RUNNING, cpus="2-3")]
        )
        assert not last.more and list(last.update) == []
        started = recorder.of(ev.PodSandboxStarted)
        assert sorted((e.sandbox_id, e.pod.uid) for e in started) == [("s1", "u1"), ("s2", "u2")]
        created = recorder.of(ev.ContainerCreated)
        assert sorted((e.container_id, e.pod_uid, e.name, e.cpus, e.adjusted) for e in created) == [
            ("k1", "u1", "one", [0, 1], False),
            ("k2", "u2", "two", [2, 3], False),
        ]
        assert sorted(recorder.views.runtime.containers) == ["k1", "k2"]
        await plugin.wait_connected()

        # enforce mode: the containers of pods eventsrc never saw are admitted, from both chunks
        await trio.testing.wait_all_tasks_blocked()
        assert sorted((s.pod.uid, [c.name for c in s.containers]) for s in admission.specs) == [
            ("u1", ["one"]),
            ("u2", ["two"]),
        ]


# ------------------------------------------------------------------ CreateContainer


async def test_a_slow_admission_is_answered_deadline_exceeded_within_the_runtimes_timeout(
    autojump_clock: trio.testing.MockClock, socket_path: Path
) -> None:
    recorder = FakeRecorder()
    admission = FakeAdmission(recorder, hang=True)
    plugin = NRIPlugin(
        recorder, admission, STATIC, NRIOptions(socket=socket_path, annotation_namespaces=frozenset({"default"}))
    )
    runtime = Runtime(socket_path)
    async with running(plugin, runtime):
        conn = await runtime.accept()
        await conn.register()
        await conn.configure(request_timeout=2000)
        await conn.synchronize()

        sent = trio.current_time()
        resp = await conn.create(sandbox("s1", "u1"), container("k1", "s1", "app", whole_cpus=1))
        answered = trio.current_time() - sent  # mock time: where the plugin's own deadline is

        assert resp.status.code == 4  # DeadlineExceeded
        assert "did not finish in time" in resp.status.message  # the plugin's answer, not ttrpc's
        assert answered < 2.0  # before the runtime gives up on the request
        assert [s.pod.uid for s in admission.specs] == ["u1"]
        assert recorder.of(ev.ContainerCreated) == []


async def test_a_refused_admission_is_answered_unknown_with_the_reason_and_nothing_created(
    autojump_clock: trio.testing.MockClock, socket_path: Path
) -> None:
    recorder = FakeRecorder()
    admission = FakeAdmission(recorder, refuse="not enough devices")
    plugin = NRIPlugin(
        recorder, admission, STATIC, NRIOptions(socket=socket_path, annotation_namespaces=frozenset({"default"}))
    )
    runtime = Runtime(socket_path)
    async with running(plugin, runtime):
        conn = await runtime.accept()
        await conn.start()
        annotations = {"eventsrc.dev/resources": json.dumps({"app": {DEV: 2}})}
        resp = await conn.create(sandbox("s1", "u1", annotations=annotations), container("k1", "s1", "app"))

        assert resp.status.code == 2  # Unknown, as containerd reports a plugin's failure
        assert status_pb2.Status.DESCRIPTOR.fields_by_name["message"].number == 2
        assert "not enough devices" in resp.status.message
        assert resp.payload == b""
        assert admission.specs[0].containers[0].requests == {DEV: "2"}  # from the annotation
        assert recorder.of(ev.ContainerCreated) == []
        assert "k1" not in recorder.views.runtime.containers


def admit_with_cpu_2_and_a_device(spec: PodSpec) -> list[ev.EventBase]:
    """What admission records for a Guaranteed 1-CPU container with one device: CPU 2 taken
    from the shared pool, dev-1 allocated with its env, node and CDI device."""
    (app,) = spec.containers
    assert app.requests == {"cpu": "1000m", "memory": str(64 << 20), DEV: "1"}, app
    uid = spec.pod.uid
    response = ev.ContainerAllocation(
        envs={"SAMPLE_DEVICES": "dev-1"},
        devices=[ev.DeviceSpec(container_path="/dev/dev-1", host_path="/dev/null")],
        cdi_devices=[f"{DEV}=dev-1"],
    )
    return [
        ev.PodAdmissionStarted(pod=spec.pod, containers=spec.containers),
        ev.DevicesReserved(pod_uid=uid, container=app.name, resource=DEV, device_ids=["dev-1"]),
        ev.CPUsAssigned(pod_uid=uid, container=app.name, cpus=[2]),
        ev.SharedPoolChanged(cpus=[0, 1, 3]),
        ev.DevicesAllocated(pod_uid=uid, container=app.name, resource=DEV, device_ids=["dev-1"], response=response),
        ev.PodAdmitted(pod=spec.pod, containers=spec.containers),
    ]


async def test_a_container_is_answered_once_its_admission_is_recorded_and_observed_before_the_answer(
    autojump_clock: trio.testing.MockClock, socket_path: Path
) -> None:
    recorder = FakeRecorder(*a_shared_container_recorded_earlier(), delay=0.1)
    admission = FakeAdmission(recorder, decide=admit_with_cpu_2_and_a_device)
    plugin = NRIPlugin(
        recorder, admission, STATIC, NRIOptions(socket=socket_path, annotation_namespaces=frozenset({"default"}))
    )
    runtime = Runtime(socket_path)
    async with running(plugin, runtime):
        conn = await runtime.accept()
        await conn.start([SHARED_POD], [SHARED_CONTAINER])
        assert recorder.of(ev.ContainerCPUsUpdated) == []  # the shared container was where it must be

        annotations = {"eventsrc.dev/resources": json.dumps({"app": {DEV: 1}})}
        pod = sandbox("s1", "u1", annotations=annotations)
        created = container("k1", "s1", "app", cpus="0-3", whole_cpus=1)
        resp = await conn.create(pod, created)

        # the fake runtime looks at the views the moment the answer arrives: the intent is a
        # decision (appended, durable first); what the runtime makes of the answer is an
        # observation, in the views before the answer and appended with the next decision
        views = recorder.views
        assert views.pods.pods["u1"].state == "admitted" and views.cpus.assignments["u1"]["app"] == [2]
        assert "k1" in views.runtime.containers
        observed = [type(e).__name__ for e in recorder.observations[-1]]
        assert observed[-2:] == ["ContainerCreated", "ContainerCPUsUpdated"]
        assert not any(isinstance(e, ev.ContainerCreated) for append in recorder.appends for e in append)
        # the runtime's next news of the container is observed after it, before its own answer
        await conn.state_change(E.START_CONTAINER, pod, created)
        assert recorder.kinds()[-3:] == ["ContainerCreated", "ContainerCPUsUpdated", "ContainerStarted"]
        k1 = views.runtime.containers.get("k1")
        assert k1 is not None, recorder.kinds()
        assert (k1.pod_uid, k1.cpus, k1.mems, k1.adjusted) == ("u1", [2], [1], True)
        assert k1.device_ids == {DEV: ["dev-1"]} and k1.cdi_devices == [f"{DEV}=dev-1"]
        assert "/dev/dev-1" in k1.devices
        assert "s1" in views.runtime.sandboxes
        assert views.runtime.containers["shared"].cpus == [0, 1, 3]
        assert ev.ContainerCPUsUpdated(
            container_id="shared", pod_uid="u0", cpus=[0, 1, 3], mems=[0, 1], reason="the shared pool followed"
        ) in recorder.of(ev.ContainerCPUsUpdated)

        assert resp.status.code == 0, resp.status
        answer = nri.CreateContainerResponse.FromString(resp.payload)
        adjust = answer.adjust
        assert cpu_list(adjust.linux.resources.cpu.cpus) == views.cpus.assignments["u1"]["app"] == [2]
        assert cpu_list(adjust.linux.resources.cpu.mems) == [1]  # CPU 2's NUMA node
        assert {(kv.key, kv.value) for kv in adjust.env} == {("SAMPLE_DEVICES", "dev-1")}
        assert [d.name for d in adjust.CDI_devices] == [f"{DEV}=dev-1"]
        null = os.stat("/dev/null")
        assert [(d.path, d.type, d.major, d.minor) for d in adjust.linux.devices] == [
            ("/dev/dev-1", "c", os.major(null.st_rdev), os.minor(null.st_rdev))
        ]
        assert [(u.container_id, cpu_list(u.linux.resources.cpu.cpus), u.ignore_failure) for u in answer.update] == [
            ("shared", [0, 1, 3], True)
        ]


# ------------------------------------------------------------------ StateChange and StopContainer


async def test_state_changes_are_recorded_and_a_removed_sandbox_releases_its_pod(
    autojump_clock: trio.testing.MockClock, socket_path: Path
) -> None:
    recorder = FakeRecorder()
    admission = FakeAdmission(recorder)
    plugin = NRIPlugin(
        recorder, admission, STATIC, NRIOptions(socket=socket_path, annotation_namespaces=frozenset({"default"}))
    )
    runtime = Runtime(socket_path)
    async with running(plugin, runtime):
        conn = await runtime.accept()
        await conn.start()
        pod = sandbox("s1", "u1")
        k1 = container("k1", "s1", "app")
        await conn.state_change(E.RUN_POD_SANDBOX, pod)
        assert "s1" in recorder.views.runtime.sandboxes
        resp = await conn.create(pod, k1)
        assert resp.status.code == 0, resp.status
        await conn.state_change(E.START_CONTAINER, pod, k1)
        assert recorder.views.runtime.containers["k1"].state == "running"
        stop = await conn.call("StopContainer", nri.StopContainerRequest(pod=pod, container=k1))
        assert stop.status.code == 0, stop.status
        assert recorder.views.runtime.containers["k1"].state == "stopped"
        await conn.state_change(E.REMOVE_CONTAINER, pod, k1)
        assert "k1" not in recorder.views.runtime.containers
        assert admission.removed == []

        await conn.state_change(E.REMOVE_POD_SANDBOX, pod)
        assert "s1" not in recorder.views.runtime.sandboxes
        # the release is owed in the log from the answer on, and made beside the handler
        await trio.testing.wait_all_tasks_blocked()
        assert admission.removed == [("u1", "pod sandbox removed")]
        assert recorder.views.runtime.gone == {}
        assert "u1" not in recorder.views.pods.pods


async def test_observe_mode_answers_first_observes_after_in_order_and_before_the_answer_once_drained(
    autojump_clock: trio.testing.MockClock, socket_path: Path
) -> None:
    """Observe mode: eventsrc decides nothing, so each StateChange and StopContainer is answered
    at once and observed after (projected onto the views, docs/adr/0042), one at a time in the
    order of the answers, each from the views the earlier ones left (a PostUpdate that changed
    nothing records nothing); no answer waits for an append. Once the daemon stops (``drain``),
    what was queued is observed, and each observation after is observed before its answer."""
    recorder = FakeRecorder(delay=0.1, observe_delay=0.1)  # mock seconds an append, a projection take
    plugin = NRIPlugin(recorder, FakeAdmission(recorder), STATIC, NRIOptions(socket=socket_path, mode="observe"))
    runtime = Runtime(socket_path)
    async with running(plugin, runtime):
        conn = await runtime.accept()
        await conn.start()
        await plugin.wait_connected()
        pod = sandbox("s1", "u1")
        k1 = container("k1", "s1", "app", cpus="0-3", mems="0-1")
        sent = trio.current_time()
        await conn.state_change(E.RUN_POD_SANDBOX, pod)
        await conn.state_change(E.POST_CREATE_CONTAINER, pod, k1)
        await conn.state_change(E.START_CONTAINER, pod, k1)
        await conn.state_change(E.POST_UPDATE_CONTAINER, pod, k1)  # the cpuset it was created with
        stop = await conn.call("StopContainer", nri.StopContainerRequest(pod=pod, container=k1))
        assert stop.status.code == 0, stop.status
        assert trio.current_time() - sent < 0.1  # five answers before the first projection could land
        assert recorder.kinds() == ["RuntimeConnected"]

        await trio.sleep(1)  # mock time: they land one after another
        assert recorder.appends == []  # observations: no decision's append
        assert recorder.kinds() == [
            "RuntimeConnected",
            "PodSandboxStarted",
            "ContainerCreated",
            "ContainerStarted",
            "ContainerStopped",
        ]
        assert recorder.views.runtime.containers["k1"].state == "stopped"
        cids = [r.correlation_id for r in recorder.records[1:]]
        assert len(set(cids)) == 4 and "test" not in cids  # each its request's

        await conn.state_change(E.REMOVE_CONTAINER, pod, k1)
        assert recorder.kinds()[-1] == "ContainerStopped"
        await plugin.drain()  # the daemon stops: what is queued is observed first
        assert recorder.kinds()[-1] == "ContainerRemoved"
        await conn.state_change(E.REMOVE_POD_SANDBOX, pod)
        assert recorder.kinds()[-1] == "PodSandboxRemoved"  # observed before the answer now
        assert "s1" not in recorder.views.runtime.sandboxes


# ------------------------------------------------------------------ reconnecting


async def test_a_closed_connection_is_recorded_and_the_plugin_registers_again(
    autojump_clock: trio.testing.MockClock, socket_path: Path
) -> None:
    recorder = FakeRecorder()
    plugin = NRIPlugin(
        recorder,
        FakeAdmission(recorder),
        STATIC,
        NRIOptions(socket=socket_path, annotation_namespaces=frozenset({"default"})),
    )
    runtime = Runtime(socket_path)
    async with running(plugin, runtime):
        first = await runtime.accept()
        await first.start()
        await plugin.wait_connected()
        await first.stream.aclose()  # the runtime goes (a restart, say)

        second = await runtime.accept()
        registered = await second.register()
        assert (registered.plugin_name, registered.plugin_idx) == ("eventsrc", "10")
        assert recorder.kinds() == ["RuntimeConnected", "RuntimeDisconnected"]
        assert not recorder.views.runtime.connected

        await second.configure()
        await second.synchronize()
        assert recorder.kinds() == ["RuntimeConnected", "RuntimeDisconnected", "RuntimeConnected"]
        assert recorder.views.runtime.connected
        assert plugin.registrations == 2


async def test_a_connection_closed_between_configure_and_synchronize_is_recorded_as_gone(
    autojump_clock: trio.testing.MockClock, socket_path: Path
) -> None:
    recorder = FakeRecorder()
    plugin = NRIPlugin(
        recorder,
        FakeAdmission(recorder),
        STATIC,
        NRIOptions(socket=socket_path, annotation_namespaces=frozenset({"default"})),
    )
    runtime = Runtime(socket_path)
    async with running(plugin, runtime):
        first = await runtime.accept()
        await first.register()
        await first.configure()
        assert recorder.views.runtime.connected
        await first.stream.aclose()  # before Synchronize: RuntimeConnected is on the record

        second = await runtime.accept()
        await second.register()
        assert recorder.kinds() == ["RuntimeConnected", "RuntimeDisconnected"]
        assert not recorder.views.runtime.connected  # the log does not say connected while it is not


async def test_a_socket_that_appears_later_is_connected_to_once_it_listens(
    autojump_clock: trio.testing.MockClock, socket_path: Path
) -> None:
    recorder = FakeRecorder()
    plugin = NRIPlugin(
        recorder,
        FakeAdmission(recorder),
        STATIC,
        NRIOptions(socket=socket_path, annotation_namespaces=frozenset({"default"})),
    )
    runtime = Runtime(socket_path)
    async with running(plugin):
        assert not socket_path.exists()
        await trio.sleep(30)  # mock time: the runtime comes up half a minute later; the backoff runs meanwhile
        await trio.testing.wait_all_tasks_blocked()
        assert recorder.records == []  # never up: nothing to say went away
        try:
            runtime.listen()
            conn = await runtime.accept()
            registered = await conn.register()
            assert registered.plugin_name == "eventsrc"
            await conn.configure()
            await conn.synchronize()
            await plugin.wait_connected()
            assert recorder.kinds() == ["RuntimeConnected"]
        finally:
            runtime.close()


# ------------------------------------------------------------------ the shared pool follows


@pytest.mark.parametrize("fails", [False, True])
async def test_the_shared_pool_follows_a_kick_with_update_containers(
    autojump_clock: trio.testing.MockClock, socket_path: Path, fails: bool
) -> None:
    recorder = FakeRecorder(*a_shared_container_recorded_earlier())
    plugin = NRIPlugin(
        recorder,
        FakeAdmission(recorder),
        STATIC,
        NRIOptions(socket=socket_path, annotation_namespaces=frozenset({"default"})),
    )
    runtime = Runtime(socket_path)
    async with running(plugin, runtime):
        conn = await runtime.accept()
        await conn.start([SHARED_POD], [SHARED_CONTAINER])
        await plugin.wait_connected()

        # CPU 3 taken outside any CreateContainer (a node-API admission): the pool is 0-2 now
        await recorder.record(
            [ev.CPUsAssigned(pod_uid="u9", container="app", cpus=[3]), ev.SharedPoolChanged(cpus=[0, 1, 2])]
        )
        before = len(recorder.records)
        plugin.kick()

        stream_id, request = await conn.plugin_request()
        assert (request.service, request.method) == (RUNTIME, "UpdateContainers")
        asked = nri.UpdateContainersRequest.FromString(request.payload)
        assert [
            (u.container_id, cpu_list(u.linux.resources.cpu.cpus), cpu_list(u.linux.resources.cpu.mems))
            for u in asked.update
        ] == [("shared", [0, 1, 2], [0, 1])]

        failed = [nri.ContainerUpdate(container_id="shared")] if fails else []
        await conn.answer(stream_id, nri.UpdateContainersResponse(failed=failed))
        await trio.testing.wait_all_tasks_blocked()

        if fails:
            assert len(recorder.records) == before  # the runtime did not apply it: nothing to record
            assert recorder.views.runtime.containers["shared"].cpus == [0, 1, 2, 3]
        else:
            assert [r.event for r in recorder.records[before:]] == [
                ev.ContainerCPUsUpdated(
                    container_id="shared", pod_uid="u0", cpus=[0, 1, 2], mems=[0, 1], reason="the shared pool followed"
                )
            ]
            assert recorder.views.runtime.containers["shared"].cpus == [0, 1, 2]
