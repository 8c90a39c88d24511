"""``eventsrc bench nri``: what eventsrc, as the runtime's NRI plugin, adds to each container start.

Four containerds of its own (``testbed.servers.containerd``: Debian's containerd 2.1 with runc
and a tiny busybox image, from the tests' cache), alike but for their NRI plugin:

- none: the ceiling every other figure is set beside;
- the minimal NRI plugin (``testbed.benches.minimal_nri``: answers every call at once, records
  nothing, one call during CreateContainer as each eventsrc mode): the protocol's floor;
- ``eventsrc serve --nri-mode observe``;
- ``eventsrc serve --nri-mode enforce`` with the static CPU manager policy and CPU 0 reserved,
  so a Guaranteed container of one whole CPU gets CPU 1 for itself.

Pods of one container are started through CRI (grpclib, as a kubelet would call it) in five
modes: no plugin, the minimal plugin, observe, enforce with BestEffort pods and enforce with
Guaranteed pods. In each
of ``--rounds`` rounds every mode starts its share of ``--pods`` pods, one after another, the
modes' order turning from round to round, so that drift hits each mode alike. RunPodSandbox,
CreateContainer and StartContainer are timed from the client; the pod is then stopped and
removed (not timed), and in enforce mode the bench waits for eventsrc to release it, so every
pod meets the same node (the Guaranteed pods the same free CPU). The daemons log at ``info``,
as ``serve`` does by default.

Then the second reference: one synced append of the events a Guaranteed pod's admission
appended on the enforce node, ``SYNCED_APPENDS`` times into a log of its own beside the
daemons' (the same filesystem), timed one by one.

The goals (issue 37), each in the report with ok or ABOVE THE GOAL: observe adds to
CreateContainer's median at most the minimal plugin's addition + 0.5 ms; enforce at most the
minimal plugin's + one synced append's median + 1 ms; and no mode's added p90 is more than twice
its added median.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

from grpclib.client import Channel
from grpclib.exceptions import GRPCError, StreamTerminatedError

from eventsrc.bench.harness import pct, start_daemon, wait_ready
from eventsrc.errors import EventsrcError, first_line
from eventsrc.events import EventBase, Record
from eventsrc.gen.cri.v1 import api_pb2 as cri
from eventsrc.gen.cri.v1.api_grpc import ImageServiceStub, RuntimeServiceStub
from eventsrc.gen.node.v1 import node_pb2 as node_pb
from eventsrc.gen.node.v1.node_grpc import NodeStub
from eventsrc.layout import Layout
from eventsrc.log.store import EventLog
from testbed.servers.containerd import (
    IMAGE,
    PAUSE,
    ContainerdProcess,
    Fetched,
    fetched_or_error,
    kubelet_cpu,
    why_unavailable,
)

#: what eventsrc may add to CreateContainer's median beyond the references, in ms (issue 37)
OBSERVE_OVER_MINIMAL = 0.5
ENFORCE_OVER_MINIMAL_AND_SYNC = 1.0
#: how far a mode's added p90 may be from its added median (a factor)
P90_OVER_P50 = 2.0
#: synced appends timed for the second reference
SYNCED_APPENDS = 200
MINIMAL = "minimal"  # the node whose plugin is testbed.benches.minimal_nri
GUARANTEED_MEMORY = 64 << 20
NAMESPACE = "bench"
CALL_TIMEOUT = 60.0
READY_TIMEOUT = 60.0
SYNCED = b"synchronized with the runtime"
CALL_ERRORS = (GRPCError, StreamTerminatedError, OSError, asyncio.TimeoutError)
T = TypeVar("T")


@dataclass
class Node:
    """One containerd and, but for the ceiling, ``eventsrc serve`` as its NRI plugin."""

    name: str
    runtime: ContainerdProcess
    nri_mode: str = ""  # "" no plugin, MINIMAL the minimal plugin, else eventsrc's mode
    root: Path = Path()
    daemon_log: Path = Path()
    daemon: subprocess.Popen[bytes] | None = None
    channel: Channel | None = None
    pods_removed: bool = False  # at the end, through CRI

    @property
    def cri(self) -> RuntimeServiceStub:
        assert self.channel is not None
        return RuntimeServiceStub(self.channel)

    def stopped(self) -> str:
        """Why the node cannot go on ("" while it can)."""
        if why := self.runtime.exited():
            return f"{self.name}: {why.splitlines()[0]}; see {self.runtime.log_path}"
        if self.daemon is not None and self.daemon.poll() is not None:
            return f"{self.name}: eventsrc exited {self.daemon.returncode}; see {self.daemon_log}"
        return ""


@dataclass(frozen=True)
class Mode:
    label: str
    node: Node
    guaranteed: bool = False
    samples: list[tuple[float, float, float]] = field(default_factory=list)  # run, create, start (s)


# --------------------------------------------------------------------------- starting the nodes


def _serve_args(node: Node) -> list[str]:
    args = [
        "--nri-socket",
        str(node.runtime.nri_socket),
        "--nri-mode",
        node.nri_mode,
        "--container-runtime-endpoint",
        f"unix://{node.runtime.address}",
    ]
    if node.nri_mode == "enforce":
        args += ["--cpu-manager-policy", "static", "--reserved-cpus", "0"]
    return args


async def _until(condition: Callable[[], Awaitable[bool]], what: str, node: Node, timeout: float) -> None:
    """Until ``condition()`` is true; raises EventsrcError, saying ``what`` was waited for,
    after ``timeout`` seconds or as soon as the node stops."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if why := node.stopped():
            raise EventsrcError(why)
        if time.monotonic() > deadline:
            raise EventsrcError(f"{node.name}: waited {timeout:g} s for {what}")
        await asyncio.sleep(0.02)


async def _start_runtime(node: Node) -> None:
    """Until containerd's CRI answers and sees the image (imported when it lacks it)."""
    node.channel = Channel(path=node.runtime.address)
    images = ImageServiceStub(node.channel)

    async def answers() -> bool:
        try:
            await node.cri.Version(cri.VersionRequest(version="v1"), timeout=1)
        except CALL_ERRORS:
            return False
        return True

    async def has_image() -> bool:
        status = await images.ImageStatus(cri.ImageStatusRequest(image=cri.ImageSpec(image=IMAGE)), timeout=10)
        return status.HasField("image")

    await _until(answers, "containerd's CRI to answer", node, READY_TIMEOUT)
    if not await has_image():
        await asyncio.to_thread(node.runtime.import_image)
        await _until(has_image, f"CRI to see {IMAGE}", node, READY_TIMEOUT)


async def _start_plugin(node: Node) -> None:
    """``eventsrc serve`` (or the minimal plugin) on the node's NRI socket, until it has
    synchronized with the runtime."""
    with open(node.daemon_log, "ab") as log:
        if node.nri_mode == MINIMAL:
            argv = [sys.executable, "-m", "testbed.benches.minimal_nri", str(node.runtime.nri_socket)]
            node.daemon = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        else:
            node.daemon = start_daemon(node.root, log, _serve_args(node), log_level="info")
    if node.nri_mode != MINIMAL:
        await wait_ready(node.root, node.daemon, node.daemon_log, timeout=READY_TIMEOUT)
    said = b"synchronized" if node.nri_mode == MINIMAL else SYNCED

    async def synced() -> bool:
        return said in node.daemon_log.read_bytes()

    await _until(synced, "eventsrc to synchronize with the runtime over NRI", node, READY_TIMEOUT)


async def _start(node: Node) -> None:
    await _start_runtime(node)
    if node.nri_mode:
        await _start_plugin(node)


# --------------------------------------------------------------------------- one pod


def _pod_config(node: Node, i: int) -> cri.PodSandboxConfig:
    """A host-network pod (no CNI, no hostname) under the node's cgroup prefix."""
    uid = str(uuid.uuid4())
    return cri.PodSandboxConfig(
        metadata=cri.PodSandboxMetadata(name=f"p{i}", uid=uid, namespace=NAMESPACE, attempt=0),
        linux=cri.LinuxPodSandboxConfig(
            cgroup_parent=node.runtime.pod_cgroup_parent(uid),
            security_context=cri.LinuxSandboxSecurityContext(namespace_options=cri.NamespaceOption(network=cri.NODE)),
        ),
    )


def _container_config(guaranteed: bool) -> cri.ContainerConfig:
    """Container ``main`` with the cgroup values the kubelet gives a BestEffort container (the
    least CPU shares) or a Guaranteed one of one whole CPU and ``GUARANTEED_MEMORY``."""
    if guaranteed:
        shares, quota, period = kubelet_cpu(1000)
        resources = cri.LinuxContainerResources(
            cpu_shares=shares, cpu_quota=quota, cpu_period=period, memory_limit_in_bytes=GUARANTEED_MEMORY
        )
    else:
        resources = cri.LinuxContainerResources(cpu_shares=2)
    return cri.ContainerConfig(
        metadata=cri.ContainerMetadata(name="main", attempt=0),
        image=cri.ImageSpec(image=IMAGE),
        command=PAUSE,
        linux=cri.LinuxContainerConfig(
            resources=resources,
            security_context=cri.LinuxContainerSecurityContext(namespace_options=cri.NamespaceOption(network=cri.NODE)),
        ),
    )


async def _call(node: Node, what: str, call: Callable[..., Awaitable[T]], request: Any) -> T:
    """One CRI call; its failure is one line naming the node and the call."""
    try:
        return await call(request, timeout=CALL_TIMEOUT)
    except CALL_ERRORS as exc:
        why = node.stopped() or f"{node.name}: {what} failed: {_reason(exc)}"
        raise EventsrcError(why) from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, GRPCError):
        return f"{exc.status.name}: {exc.message}"
    return first_line(exc)


async def _one_pod(mode: Mode, i: int) -> None:
    """Start pod ``i`` of ``mode``, timed, then stop and remove it (and, with eventsrc enforcing,
    wait until it has released the pod)."""
    node = mode.node
    config = _pod_config(node, i)
    t0 = time.perf_counter()
    ran = await _call(node, "RunPodSandbox", node.cri.RunPodSandbox, cri.RunPodSandboxRequest(config=config))
    t1 = time.perf_counter()
    request = cri.CreateContainerRequest(
        pod_sandbox_id=ran.pod_sandbox_id, config=_container_config(mode.guaranteed), sandbox_config=config
    )
    created = await _call(node, "CreateContainer", node.cri.CreateContainer, request)
    t2 = time.perf_counter()
    await _call(
        node,
        "StartContainer",
        node.cri.StartContainer,
        cri.StartContainerRequest(container_id=created.container_id),
    )
    t3 = time.perf_counter()
    mode.samples.append((t1 - t0, t2 - t1, t3 - t2))
    await _remove_pod(node, ran.pod_sandbox_id)
    if node.nri_mode == "enforce":
        await _released(node, config.metadata.uid)


async def _remove_pod(node: Node, sandbox_id: str) -> None:
    await _call(node, "StopPodSandbox", node.cri.StopPodSandbox, cri.StopPodSandboxRequest(pod_sandbox_id=sandbox_id))
    await _call(
        node, "RemovePodSandbox", node.cri.RemovePodSandbox, cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id)
    )


async def _released(node: Node, uid: str) -> None:
    """Until eventsrc lists pod ``uid`` no more (its sandbox's removal released it)."""
    channel = Channel(path=str(node.root / "eventsrc" / "api.sock"))
    api = NodeStub(channel)

    async def gone() -> bool:
        listed = await api.ListPods(node_pb.ListPodsRequest(), timeout=10)
        return all(p.uid != uid for p in listed.pods)

    try:
        await _until(gone, f"eventsrc to release pod {uid}", node, 30)
    finally:
        channel.close()


async def _measure(modes: list[Mode], pods: int, rounds: int) -> None:
    for mode in modes:  # not timed: a containerd's first pod unpacks the image, eventsrc's first warms it
        await _one_pod(mode, -1)
        mode.samples.clear()
    for r in range(rounds):
        share = pods // rounds + (r < pods % rounds)
        turn = r % len(modes)
        for mode in modes[turn:] + modes[:turn]:
            for i in range(share):
                await _one_pod(mode, len(mode.samples) + i)


# --------------------------------------------------------------------------- the run


async def _bench(nodes: list[Node], modes: list[Mode], pods: int, rounds: int) -> None:
    """Start the nodes and measure; then, however that ended, remove every pod through CRI
    and close the channels."""
    try:
        for node in nodes:
            node.runtime.launch()
        await asyncio.gather(*(_start(node) for node in nodes))
        await _measure(modes, pods, rounds)
    finally:
        await asyncio.gather(*(_remove_all(node) for node in nodes))


async def _remove_all(node: Node) -> None:
    """Remove every pod of the node's containerd (they are all the bench's), through CRI."""
    if node.channel is None:
        node.pods_removed = not node.runtime.running()  # never called: no pod
        return
    try:
        if not node.runtime.running():
            return
        listed = await node.cri.ListPodSandbox(cri.ListPodSandboxRequest(), timeout=10)
        for pod in listed.items:
            await node.cri.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=pod.id), timeout=30)
            await node.cri.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=pod.id), timeout=30)
        node.pods_removed = True
    except CALL_ERRORS:
        pass
    finally:
        node.channel.close()


def _stop_nodes(nodes: list[Node]) -> list[str]:
    """Stop the daemons, then containerd, and clean up after it; what could not be."""
    for node in nodes:
        if node.daemon is not None and node.daemon.poll() is None:
            node.daemon.terminate()
            try:
                node.daemon.wait(10)
            except subprocess.TimeoutExpired:
                node.daemon.kill()
                node.daemon.wait()
    problems: list[str] = []
    for node in nodes:
        problems += [f"{node.name}: {p}" for p in node.runtime.cleanup(shim_wait=10 if node.pods_removed else 0)]
    return problems


def run_nri_bench(*, pods: int, rounds: int, keep: bool = False) -> None:
    """Raises EventsrcError (one line) when containerd cannot be had or a node fails."""
    if why := why_unavailable():
        raise EventsrcError(f"no containerd to measure with: {why}")
    if (os.cpu_count() or 1) < 2:
        raise EventsrcError("needs two CPUs: CPU 0 reserved, CPU 1 for the Guaranteed pods")
    fetched = fetched_or_error()
    assert isinstance(fetched, Fetched)
    out = sys.stdout
    tmp = Path(tempfile.mkdtemp(prefix="esn-", dir="/tmp"))
    nodes = [
        Node(name, ContainerdProcess(tmp / name, fetched=fetched, label="eventsrc-bench"), nri_mode)
        for name, nri_mode in (("ceiling", ""), (MINIMAL, MINIMAL), ("observe", "observe"), ("enforce", "enforce"))
    ]
    for node in nodes:
        node.root, node.daemon_log = tmp / node.name / "eventsrc", tmp / node.name / "eventsrc.log"
    ceiling, minimal, observe, enforce = nodes
    modes = [
        Mode("no plugin (ceiling)", ceiling),
        Mode("minimal NRI plugin", minimal),
        Mode("observe", observe),
        Mode("enforce, BestEffort", enforce),
        Mode("enforce, Guaranteed", enforce, guaranteed=True),
    ]
    try:
        out.write(
            f"eventsrc bench nri: {os.cpu_count()} cpus, Python {sys.version.split()[0]}, "
            f"containerd {fetched.versions.get('containerd', '?')}, runc {fetched.versions.get('runc', '?')}; "
            f"{pods} pods of one container per mode in {rounds} round(s), the modes in turn; "
            "timed from a CRI client, ms\n\n"
        )
        out.flush()
        asyncio.run(_bench(nodes, modes, pods, rounds))
        admission = _admission_events(enforce.root)
        synced = _synced_appends(tmp / "synced-appends", admission, SYNCED_APPENDS)
        _report(modes, Reference(len(admission), synced), out)
    finally:
        try:
            for problem in _stop_nodes(nodes):
                print(f"eventsrc: warning: cleanup: {problem}", file=sys.stderr)
        finally:
            if keep:
                out.write(f"\nkept: {tmp}\n")
            else:
                shutil.rmtree(tmp, ignore_errors=True)


def _admission_events(root: Path) -> list[EventBase]:
    """The events a Guaranteed pod's admission appended on the enforce node (one append: it
    calls nothing), read from its log: its request's records up to its PodAdmitted."""
    log = EventLog(Layout(root).log, readonly=True)
    try:
        by_request: dict[str, list[EventBase]] = {}
        for r in log.records():
            if isinstance(r, Record):
                by_request.setdefault(r.correlation_id, []).append(r.event)
    finally:
        log.close()
    for events in reversed(by_request.values()):
        kinds = [type(e).__name__ for e in events]
        if "PodAdmitted" in kinds and "CPUsAssigned" in kinds:
            return events[: kinds.index("PodAdmitted") + 1]
    raise EventsrcError(f"the enforce node's log at {root} holds no Guaranteed pod's admission")


def _synced_appends(where: Path, events: list[EventBase], n: int) -> list[float]:
    """Seconds each of ``n`` appends of ``events`` took, one after another, each synced, into a
    log of its own at ``where`` (on the daemons' filesystem)."""
    log = EventLog(where)
    took = []
    try:
        for i in range(n):
            t0 = time.perf_counter()
            log.append(events, f"bench-{i:016x}", time.time_ns())
            took.append(time.perf_counter() - t0)
    finally:
        log.close()
    return took


@dataclass(frozen=True)
class Reference:
    """The second reference: one synced append of an admission's ``events`` events, timed."""

    events: int
    samples: list[float]


def _report(modes: list[Mode], synced: Reference, out: TextIO) -> None:
    ms = 1000.0

    def figures(mode: Mode) -> tuple[float, float, float, float, float, float]:
        run = [s[0] for s in mode.samples]
        create = [s[1] for s in mode.samples]
        whole = [sum(s) for s in mode.samples]
        start = [s[2] for s in mode.samples]
        return (
            pct(run, 0.5) * ms,
            pct(create, 0.5) * ms,
            pct(create, 0.9) * ms,
            pct(start, 0.5) * ms,
            pct(whole, 0.5) * ms,
            pct(whole, 0.9) * ms,
        )

    base = figures(modes[0])
    out.write(
        f"{'mode':<22}{'pods':>5}{'run p50':>9}{'create p50':>12}{'p90':>8}{'start p50':>11}"
        f"{'pod p50':>10}{'p90':>8}{'+create':>10}{'p90':>7}{'+pod':>8}\n"
    )
    added: dict[str, tuple[float, float]] = {}
    for mode in modes:
        f = figures(mode)
        row = (
            f"{mode.label:<22}{len(mode.samples):>5}{f[0]:>9.2f}{f[1]:>12.2f}{f[2]:>8.2f}{f[3]:>11.2f}"
            f"{f[4]:>10.2f}{f[5]:>8.2f}"
        )
        if mode is modes[0]:
            out.write(f"{row}{'-':>10}{'-':>7}{'-':>8}\n")
            continue
        added[mode.label] = (f[1] - base[1], f[2] - base[2])
        out.write(f"{row}{f[1] - base[1]:>+10.2f}{f[2] - base[2]:>+7.2f}{f[4] - base[4]:>+8.2f}\n")
    sync_p50, sync_p90 = pct(synced.samples, 0.5) * ms, pct(synced.samples, 0.9) * ms
    out.write(
        f"\none synced append of an admission ({synced.events} events, {len(synced.samples)} times): "
        f"p50 {sync_p50:.2f}, p90 {sync_p90:.2f}\n"
    )
    floor = added[modes[1].label][0]
    out.write(f"the minimal plugin adds {floor:+.2f} to CreateContainer's median\n\n")
    for mode in modes[2:]:
        p50, p90 = added[mode.label]
        if mode.node.nri_mode == "observe":
            ceiling, over = floor + OBSERVE_OVER_MINIMAL, f"the minimal plugin's + {OBSERVE_OVER_MINIMAL:g}"
        else:
            ceiling = floor + sync_p50 + ENFORCE_OVER_MINIMAL_AND_SYNC
            over = f"the minimal plugin's + one synced append + {ENFORCE_OVER_MINIMAL_AND_SYNC:g}"
        out.write(
            f"{mode.label:<22} +create p50 {p50:+.2f}: {p50 - floor:+.2f} from the minimal plugin's"
            + (
                f", {p50 - floor - sync_p50:+.2f} from it and one synced append"
                if mode.node.nri_mode != "observe"
                else ""
            )
            + f"; goal <= {over} = {ceiling:.2f}: {_verdict(p50 <= ceiling)}; "
            f"+create p90 {p90:+.2f} <= {P90_OVER_P50:g} x p50: {_verdict(p90 <= P90_OVER_P50 * p50)}\n"
        )
    out.write(
        "\nrun: RunPodSandbox; create: CreateContainer; start: StartContainer; pod: the three in turn (the whole "
        "pod start).\n+create, p90, +pod: the mode's figure minus no plugin's (ms), in the same run.\n"
    )
    out.flush()


def _verdict(ok: bool) -> str:
    return "ok" if ok else "ABOVE THE GOAL"
