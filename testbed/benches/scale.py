"""``eventsrc bench scale``: how the daemon's costs grow with the pods it holds.

A daemon and the sample plugin (``--devices`` devices) run as their own processes under a
temporary root; this process admits one-device pods through the node API, one at a time
(the plugin's Allocate included), until ``--pods`` pods are resident, none removed. At 10,
100, 1,000 and 10,000 pods (those up to ``--pods``, and ``--pods`` itself) it prints:

* admission p50/p99: the last ``--samples`` admissions before that size (no further back
  than the previous size);
* the daemon's RSS then (VmRSS, and its anonymous part, RssAnon) and its CPU per admission over those admissions (its
  process CPU clock, every thread; the probe's share, measured on the idle daemon first,
  taken off);
* log bytes per pod: the growth of the log's ``data.mdb`` since the previous size, over the
  pods admitted since;
* PodResources ``List`` p50 over ``--repeats`` calls (every pod in each answer);
* in a second table after the first: the node API's ``ListPods`` (every pod in each
  answer: its first call and its p50 over ``--repeats``), List's and ListPods' p50 with
  their answers left undecoded (the daemon's part without the client's parsing),
  PodResources ``GetAllocatableResources`` p50, the two listings' sizes, the longest stall
  while these calls ran, and the daemon's RSS after them (its listings' caches filled);
* the longest loop stall as a client sees it: the worst round trip of a node API ``Status``
  call sent every 10 ms by another process for the whole span (its scheduling on this
  machine included); and as the daemon measures it (``eventsrc.obs.loop``): the longest
  step of its loop that ended in the span, and how many took 10 ms or more;
* beside them, measured in the same run on the same disk: what the kubelet's device
  manager pays to persist the same state on each change (its whole checkpoint,
  ``kubelet_internal_checkpoint``: PodDeviceEntries, RegisteredDevices, Checksum, as JSON,
  to a temporary file in the log's directory, fsync, rename), median of ``--repeats``
  changes, and that file's size. The checksum (go-spew text, FNV-1a) is computed outside
  the timing, so the figure is a floor of the kubelet's cost.

Then the daemon is SIGKILLed at ``--pods`` pods and started again: the time until Status
says ready, beside its first start on an empty log. Last, it is stopped and started with
``--log-retention-max-size`` below its live log, so that it cuts at once every whole piece
(``--snapshot-every`` records) it holds: the cut's duration and its longest writer pause, as
the daemon's ``log cut`` line says them, and the worst Status round trip while it cut.

``--ratios`` measures instead whether one admission costs the same whatever the number of
devices and pods (``run_ratio_bench``): the one-device admission p50 with 8 and with 6,000
devices at 10 resident pods, and with 6,000 devices at 5,000 resident pods, and the ratios.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

from grpclib.client import Channel
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError, StreamTerminatedError

from eventsrc.bench.harness import (
    CPU,
    RESOURCE,
    cpu_seconds,
    one_device_pod,
    pct,
    rss_bytes,
    start_daemon,
    start_plugin,
    stop,
    wait_devices,
    wait_ready,
)
from eventsrc.errors import EventsrcError
from eventsrc.gen.deviceplugin.v1beta1 import api_pb2 as dp
from eventsrc.gen.node.v1 import node_pb2 as pb
from eventsrc.gen.node.v1.node_grpc import NodeStub
from eventsrc.gen.podresources.v1 import api_pb2 as pr
from eventsrc.gen.podresources.v1.api_grpc import PodResourcesListerStub
from eventsrc.inputs.kubelet_checkpoints import DeviceCheckpoint, PodDevicesEntry, device_checksum_text, fnv32a
from testbed.servers.kubelet_checkpoints import write_checkpoint

SIZES = (10, 100, 1_000, 10_000)
PROBE_PERIOD = 0.010
LIST_INTERVAL = 0.011  # PodResources allows 100 calls a second
CHECKPOINT = "kubelet_internal_checkpoint"


def sizes(pods: int) -> list[int]:
    """The sizes a row is printed at: the decades up to ``pods``, and ``pods``."""
    return [s for s in SIZES if s < pods] + [pods]


# --------------------------------------------------------------------------- the kubelet's checkpoint


@dataclass(frozen=True)
class Held:
    """One admitted pod's device, as the kubelet's device manager would checkpoint it."""

    pod_uid: str
    container: str
    device: str
    numa: int
    alloc_resp: bytes  # the plugin's ContainerAllocateResponse, marshalled


def held(info: pb.PodInfo, numa: dict[str, int]) -> Held:
    """What ``info`` (an Admit answer for a one-device pod) holds."""
    c = info.containers[0]
    r = next(r for r in c.resources if r.resource == RESOURCE)
    resp = dp.ContainerAllocateResponse(
        envs=dict(r.envs),
        mounts=[
            dp.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only) for m in r.mounts
        ],
        devices=[
            dp.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in r.devices
        ],
        annotations=dict(r.annotations),
        cdi_devices=[dp.CDIDevice(name=n) for n in r.cdi_devices],
    )
    device = r.device_ids[0]
    return Held(info.uid, c.name, device, numa.get(device, -1), resp.SerializeToString(deterministic=True))


def checkpoint_checksum(entries: list[Held], registered: list[str]) -> int:
    """The device manager's checksum of that state: FNV-1a-32 of go-spew's rendering of
    its ``checkpointData`` (the rules of ``eventsrc import-kubelet``, which verifies it)."""
    cp = DeviceCheckpoint(
        source=CHECKPOINT,
        version="v2",
        entries=[
            PodDevicesEntry(
                pod_uid=h.pod_uid,
                container_name=h.container,
                resource_name=RESOURCE,
                device_ids={h.numa: [h.device]},
                alloc_resp=h.alloc_resp,
            )
            for h in entries
        ],
        registered_devices={RESOURCE: registered},
        checksum=0,
    )
    return fnv32a(device_checksum_text(cp))


def checkpoint_json(entries: Iterable[Held], registered: list[str], checksum: int) -> bytes:
    """The checkpoint file as the kubelet writes it (Go's encoding/json of the structs:
    field names as keys, ``[]byte`` as base64)."""
    data = {
        "PodDeviceEntries": [
            {
                "PodUID": h.pod_uid,
                "ContainerName": h.container,
                "ResourceName": RESOURCE,
                "DeviceIDs": {str(h.numa): [h.device]},
                "AllocResp": base64.b64encode(h.alloc_resp).decode(),
            }
            for h in entries
        ],
        "RegisteredDevices": {RESOURCE: registered},
    }
    return json.dumps({"Data": data, "Checksum": checksum}, separators=(",", ":")).encode()


def checkpoint_per_change(
    directory: Path, entries: list[Held], registered: list[str], changes: int
) -> tuple[float, int]:
    """Median seconds of a change persisted the kubelet's way (the whole state encoded and
    written, with the checksum computed beforehand), and the file's size."""
    checksum = checkpoint_checksum(entries, registered)
    times = []
    size = 0
    for _ in range(changes):
        t = time.perf_counter()
        content = checkpoint_json(entries, registered, checksum)
        write_checkpoint(directory, content)
        times.append(time.perf_counter() - t)
        size = len(content)
    (directory / CHECKPOINT).unlink()
    return statistics.median(times), size


# --------------------------------------------------------------------------- the stall probe


def probe_main() -> None:
    """A separate process (``python -c``; argv: the node API socket, the period): Status
    every period; each line read on stdin is answered with the worst and median round
    trip since the previous line, and the number of calls (an unanswered call counts as
    its time until it failed). Ends at the end of stdin."""
    import threading

    api, period = sys.argv[1], float(sys.argv[2])
    lock = threading.Lock()
    seen: list[float] = []

    def answer() -> None:
        for _ in sys.stdin:
            with lock:
                worst = max(seen, default=0.0)
                median = statistics.median(seen) if seen else 0.0
                sys.stdout.write(f"{worst!r} {median!r} {len(seen)}\n")
                sys.stdout.flush()
                seen.clear()
        os._exit(0)

    async def probe() -> None:
        channel = Channel(path=api)
        stub = NodeStub(channel)
        due = time.perf_counter()
        while True:
            t = time.perf_counter()
            try:
                await stub.Status(pb.StatusRequest(), timeout=60)
            except Exception:  # noqa: BLE001 - counted as its time; the bench sees the daemon's state itself
                await asyncio.sleep(period)
            lat = time.perf_counter() - t
            with lock:
                seen.append(lat)
            due += period
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                due = time.perf_counter()

    threading.Thread(target=answer, daemon=True).start()
    asyncio.run(probe())


class Probe:
    """The stall probe's process."""

    def __init__(self, api: Path) -> None:
        code = "from testbed.benches.scale import probe_main; probe_main()"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(api), str(PROBE_PERIOD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def read(self) -> tuple[float, float, int]:
        """(worst, median) round trip in seconds since the last read, and how many calls."""
        stdin, stdout = self._pipes()
        stdin.write(b"\n")
        stdin.flush()
        line = stdout.readline().split()
        if len(line) != 3:
            raise EventsrcError("the stall probe ended unexpectedly")
        return float(line[0]), float(line[1]), int(line[2])

    def _pipes(self) -> tuple[IO[bytes], IO[bytes]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        return self.proc.stdin, self.proc.stdout

    def close(self) -> None:
        stdin, _ = self._pipes()
        try:
            stdin.close()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


# --------------------------------------------------------------------------- the run


@dataclass
class Row:
    pods: int
    samples: int
    p50: float
    p99: float
    rss: int
    cpu: float
    log_bytes: float
    list_first: float
    list_p50: float
    stall: float
    probe_p50: float
    checkpoint: float
    checkpoint_bytes: int
    list_bytes: int
    list_pods_first: float
    list_pods_p50: float
    list_pods_bytes: int
    allocatable_p50: float
    list_raw_p50: float
    list_pods_raw_p50: float
    listings_stall: float
    rss_after: int
    hold: Hold
    listings_hold: Hold
    anon: int
    anon_after: int


@dataclass(frozen=True)
class Hold:
    """The longest step of the daemon's loop in a span, as the daemon measured it
    (``eventsrc.obs.loop``): its wall seconds, its task, the CPU seconds of the loop's thread
    and of the whole daemon in it; the step with the most CPU of the loop's thread (the
    loop's longest work) and its task; whether every long step of the span was still in the
    daemon's ring (else the figures are floors); how many steps took 10 ms or more of wall
    time and of the loop thread's CPU."""

    seconds: float
    task: str
    cpu: float
    process_cpu: float
    work: float
    work_task: str
    whole: bool
    over_10ms: int
    work_over_10ms: int

    def text(self) -> str:
        return self._ms(self.seconds)

    def work_text(self) -> str:
        return self._ms(self.work)

    def _ms(self, seconds: float) -> str:
        return f"{seconds * 1e3:.1f}" + ("" if self.whole else "+")

    def told(self) -> str:
        """What the longest step was made of, in words."""
        other = max(self.process_cpu - self.cpu, 0.0)
        waited = max(self.seconds - max(self.process_cpu, self.cpu), 0.0)
        return (
            f"{self.cpu * 1e3:.1f} ms of it the loop's own work (its thread's CPU), {other * 1e3:.1f} ms the "
            f"daemon's other threads ran, {waited * 1e3:.1f} ms no thread of the daemon ran (it waited for a core)"
        )


def _longer(a: Hold, b: Hold) -> Hold:
    """The longer of two spans' holds and works, with both spans' steps of 10 ms or more."""
    top = max(a, b, key=lambda h: h.seconds)
    busiest = max(a, b, key=lambda h: h.work)
    return Hold(
        top.seconds,
        top.task,
        top.cpu,
        top.process_cpu,
        busiest.work,
        busiest.work_task,
        a.whole and b.whole,
        a.over_10ms + b.over_10ms,
        a.work_over_10ms + b.work_over_10ms,
    )


class HoldSpan:
    """A span of the daemon's life whose longest loop step is asked for at its end."""

    def __init__(self, since_ns: int, status: pb.StatusResponse) -> None:
        self.since_ns = since_ns
        self.long_steps = status.loop.long_steps
        self.over = status.loop.over_10ms
        self.work_over = status.loop.cpu_over_10ms

    @classmethod
    async def start(cls, stub: NodeStub) -> HoldSpan:
        since = time.monotonic_ns()
        return cls(since, await stub.Status(pb.StatusRequest(), timeout=60))

    async def end(self, stub: NodeStub) -> Hold:
        st = await stub.Status(pb.StatusRequest(loop_holds_since_ns=self.since_ns), timeout=60)
        steps = list(st.loop.recent)
        top = max(steps, key=lambda h: h.seconds, default=pb.LoopHold())
        busiest = max(steps, key=lambda h: h.cpu_seconds, default=pb.LoopHold())
        return Hold(
            top.seconds,
            top.task,
            top.cpu_seconds,
            top.process_cpu_seconds,
            busiest.cpu_seconds,
            busiest.task,
            st.loop.long_steps - self.long_steps <= len(steps),
            st.loop.over_10ms - self.over,
            st.loop.cpu_over_10ms - self.work_over,
        )


class _Progress:
    """Admissions so far, on stderr when it is a terminal (at most every 0.5 s)."""

    def __init__(self, pods: int) -> None:
        self.pods = pods
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def show(self, n: int, what: str = "admitting") -> None:
        if self.tty and (time.monotonic() - self.last > 0.5 or n == self.pods):
            self.last = time.monotonic()
            sys.stderr.write(f"\r  {what}: {n:,}/{self.pods:,} pods ")
            sys.stderr.flush()

    def clear(self) -> None:
        if self.tty:
            sys.stderr.write("\r" + " " * 60 + "\r")
            sys.stderr.flush()


class _Bench:
    def __init__(self, tmp: Path, devices: int, pods: int, samples: int, repeats: int, out: TextIO) -> None:
        self.tmp, self.root = tmp, tmp / "r"
        self.devices, self.pods, self.samples, self.repeats = devices, pods, samples, repeats
        self.out = out
        self.api = self.root / "eventsrc" / "api.sock"
        self.log_dir = self.root / "eventsrc" / "log"
        self.daemon_log = tmp / "daemon.log"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.probe: Probe | None = None
        self.numa: dict[str, int] = {}
        self.held: list[Held] = []
        self.progress = _Progress(pods)

    @property
    def daemon(self) -> subprocess.Popen[bytes]:
        return self.procs[0]

    async def start(self) -> float:
        """The daemon (timed until ready) and the plugin; the daemon's start time."""
        with open(self.daemon_log, "ab") as log:
            t = time.perf_counter()
            self.procs.append(start_daemon(self.root, log))
            await wait_ready(self.root, self.daemon, self.daemon_log)
            first_start = time.perf_counter() - t
            self.procs.append(start_plugin(self.root, self.devices, log))
        self.numa = await wait_devices(self.root, self.devices)
        return first_start

    def start_probe(self, seconds: float = 1.0) -> tuple[float, float, float]:
        """The stall probe started on the idle daemon: what it costs the daemon (CPU seconds
        per second, beside the idle daemon without it), and its worst and median round trip there."""
        time.sleep(0.5)  # the plugin's registration settles
        cpu = CPU(self.daemon.pid)
        time.sleep(seconds)
        idle = cpu.share()
        self.probe = Probe(self.api)
        time.sleep(0.3)  # its interpreter starts
        self.probe.read()
        cpu.start()
        time.sleep(seconds)
        probed = cpu.share()
        worst, median, _ = self.probe.read()
        return max(probed - idle, 0.0), worst, median

    async def admit(self, stub: NodeStub, n: int) -> list[float]:
        """``n`` more pods, one at a time; each admission's latency."""
        out = []
        for _ in range(n):
            i = len(self.held)
            pod = one_device_pod(i)
            t = time.perf_counter()
            try:
                info = await stub.Admit(pb.AdmitRequest(pod=pod), timeout=60)
            except GRPCError as err:
                raise EventsrcError(f"admitting pod {i + 1} failed: {err.message or err.status.name}") from None
            out.append(time.perf_counter() - t)
            self.held.append(held(info, self.numa))
            self.progress.show(len(self.held))
        return out

    async def pod_resources_latencies(self, size: int) -> tuple[list[float], list[float], int]:
        """``--repeats`` PodResources List calls and as many GetAllocatableResources: their
        latencies, and the size of List's answer."""
        channel = Channel(path=str(self.root / "pod-resources" / "kubelet.sock"))
        stub = PodResourcesListerStub(channel)
        lists, allocatable, size_bytes = [], [], 0
        try:
            for _ in range(self.repeats):
                t = time.perf_counter()
                resp = await stub.List(pr.ListPodResourcesRequest(), timeout=60)
                lists.append(time.perf_counter() - t)
                await self._rate_limited(t)
                if len(resp.pod_resources) != size:
                    raise EventsrcError(f"PodResources List answered {len(resp.pod_resources)} pods, not {size}")
                size_bytes = resp.ByteSize()
            for _ in range(self.repeats):
                t = time.perf_counter()
                await stub.GetAllocatableResources(pr.AllocatableResourcesRequest(), timeout=60)
                allocatable.append(time.perf_counter() - t)
                await self._rate_limited(t)
        finally:
            channel.close()
        return lists, allocatable, size_bytes

    @staticmethod
    async def _rate_limited(started: float) -> None:
        """The kubelet's rate limit, which the daemon keeps: 100 calls/s (burst 10)."""
        await asyncio.sleep(max(0.0, LIST_INTERVAL - (time.perf_counter() - started)))

    async def undecoded_latencies(self, list_bytes: int, pods_bytes: int) -> tuple[list[float], list[float]]:
        """``--repeats`` List calls and as many ListPods whose answers this process does not
        decode (``_Undecoded``): the daemon's part of a call, without the client's parsing."""
        pod_resources = Channel(path=str(self.root / "pod-resources" / "kubelet.sock"), codec=_Undecoded())
        api = Channel(path=str(self.api), codec=_Undecoded())
        lists, pods = [], []
        try:
            for _ in range(self.repeats):
                t = time.perf_counter()
                got: Any = await PodResourcesListerStub(pod_resources).List(pr.ListPodResourcesRequest(), timeout=60)
                lists.append(time.perf_counter() - t)
                await self._rate_limited(t)
                if len(got) != list_bytes:
                    raise EventsrcError(f"PodResources List answered {len(got):,} bytes, not {list_bytes:,}")
            for _ in range(self.repeats):
                t = time.perf_counter()
                got = await NodeStub(api).ListPods(pb.ListPodsRequest(), timeout=60)
                pods.append(time.perf_counter() - t)
                if len(got) != pods_bytes:
                    raise EventsrcError(f"ListPods answered {len(got):,} bytes, not {pods_bytes:,}")
        finally:
            pod_resources.close()
            api.close()
        return lists, pods

    async def list_pods_latencies(self, stub: NodeStub, size: int) -> tuple[list[float], int]:
        """``--repeats`` node API ListPods calls: their latencies, and the answer's size."""
        out, size_bytes = [], 0
        for _ in range(self.repeats):
            t = time.perf_counter()
            resp = await stub.ListPods(pb.ListPodsRequest(), timeout=60)
            out.append(time.perf_counter() - t)
            if len(resp.pods) != size:
                raise EventsrcError(f"ListPods answered {len(resp.pods)} pods, not {size}")
            size_bytes = resp.ByteSize()
        return out, size_bytes

    async def grow(self, probe_cpu: float) -> list[Row]:
        """Admit up to each size in turn; a row printed at each."""
        assert self.probe is not None
        rows = []
        data = self.log_dir / "data.mdb"
        registered = sorted(self.numa, key=lambda d: (len(d), d))
        channel = Channel(path=str(self.api))
        stub = NodeStub(channel)
        try:
            prev, log_before = 0, data.stat().st_size
            span = await HoldSpan.start(stub)
            self.probe.read()  # the span starts here
            for size in sizes(self.pods):
                window = min(self.samples, size - prev)
                await self.admit(stub, size - window - len(self.held))
                c, t = cpu_seconds(self.daemon.pid), time.perf_counter()
                lat = await self.admit(stub, window)
                cpu = (cpu_seconds(self.daemon.pid) - c - probe_cpu * (time.perf_counter() - t)) / window
                rss, anon = rss_bytes(self.daemon.pid), rss_bytes(self.daemon.pid, "RssAnon")
                hold = await span.end(stub)
                log_after = data.stat().st_size
                log_bytes = (log_after - log_before) / (size - prev)
                self.progress.show(size, "PodResources List at")
                admissions_stall, probe_p50, _ = self.probe.read()
                span = await HoldSpan.start(stub)
                lists, allocatable, list_bytes = await self.pod_resources_latencies(size)
                pods_lat, pods_bytes = await self.list_pods_latencies(stub, size)
                raw_lists, raw_pods = await self.undecoded_latencies(list_bytes, pods_bytes)
                listings_stall, _, _ = self.probe.read()
                listings_hold = await span.end(stub)
                rss_after, anon_after = rss_bytes(self.daemon.pid), rss_bytes(self.daemon.pid, "RssAnon")
                self.progress.show(size, "kubelet checkpoint at")
                ckpt, ckpt_bytes = checkpoint_per_change(self.log_dir, self.held, registered, self.repeats)
                span = await HoldSpan.start(stub)
                self.probe.read()  # not the daemon's doing: the next span starts here
                self.progress.clear()
                row = Row(
                    size,
                    len(lat),
                    pct(lat, 0.5),
                    pct(lat, 0.99),
                    rss,
                    cpu,
                    log_bytes,
                    lists[0],
                    statistics.median(lists),
                    max(admissions_stall, listings_stall),
                    probe_p50,
                    ckpt,
                    ckpt_bytes,
                    list_bytes,
                    pods_lat[0],
                    statistics.median(pods_lat),
                    pods_bytes,
                    statistics.median(allocatable),
                    statistics.median(raw_lists),
                    statistics.median(raw_pods),
                    listings_stall,
                    rss_after,
                    _longer(hold, listings_hold),
                    listings_hold,
                    anon,
                    anon_after,
                )
                _row(self.out, row)
                rows.append(row)
                prev, log_before = size, data.stat().st_size
        finally:
            channel.close()
        return rows

    async def restart(self) -> tuple[float, pb.StatusResponse, int]:
        """SIGKILL the daemon, start it again: seconds until ready, its Status, its pods."""
        if self.probe is not None:
            self.probe.close()
            self.probe = None
        self.daemon.kill()
        self.daemon.wait()
        with open(self.daemon_log, "ab") as log:
            t = time.perf_counter()
            self.procs[0] = start_daemon(self.root, log)
            st = await wait_ready(self.root, self.daemon, self.daemon_log)
            seconds = time.perf_counter() - t
        channel = Channel(path=str(self.api))
        try:
            pods = await NodeStub(channel).ListPods(pb.ListPodsRequest(), timeout=60)
        finally:
            channel.close()
        return seconds, st, len(pods.pods)

    async def retention_cut(self) -> CutFigures:
        """Stop the daemon (SIGTERM) and start it again with retention below its live log:
        the figures of the cut it makes at once. The stall probe runs from before the start
        (its calls fail until the socket is there); its worst round trip is taken from ready,
        when the retention task starts, until the cut's line."""
        if self.probe is not None:
            self.probe.close()
        stop(self.procs[:1])
        self.probe = Probe(self.api)
        cut_log = self.tmp / "cut.log"
        args = ["--log-level", "info", "--log-format", "json", "--log-retention-max-size", CUT_MAX_SIZE]
        with open(cut_log, "ab") as log:
            self.procs[0] = start_daemon(self.root, log, args)
        await wait_ready(self.root, self.daemon, cut_log)
        channel = Channel(path=str(self.api))
        stub = NodeStub(channel)
        span = await HoldSpan.start(stub)
        self.probe.read()  # the start, and the calls before the socket was there
        deadline = time.monotonic() + CUT_TIMEOUT
        while (line := _log_line(cut_log, "log cut", "retention cut failed")) is None:
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise EventsrcError(f"the daemon made no retention cut; see {cut_log}")
            await asyncio.sleep(0.05)
        stall, _, _ = self.probe.read()
        try:
            hold = await span.end(stub)
        finally:
            channel.close()
        if line["msg"] != "log cut":
            raise EventsrcError(f"the retention cut failed: {line.get('reason')}; see {cut_log}")
        return CutFigures(
            records=int(line["records"]),
            seconds=float(line["seconds"]),
            prepare=float(line["prepare_seconds"]),
            writer_pause=float(line["longest_pause_ms"]) / 1e3,
            stall=stall,
            hold=hold,
        )

    def close(self) -> None:
        if self.probe is not None:
            self.probe.close()
        stop(self.procs)


class _Undecoded(ProtoCodec):
    """grpclib's codec, except that answers are handed over as the bytes that came."""

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data


#: serve's --log-retention-max-size for the cut: below any live log, so every whole piece goes
CUT_MAX_SIZE = "4Ki"
#: a piece: serve's default --snapshot-every (a cut takes whole pieces)
CUT_PIECE = 10_000
CUT_TIMEOUT = 300.0


@dataclass(frozen=True)
class CutFigures:
    records: int
    seconds: float  # the whole cut, as the daemon says
    prepare: float  # its first step (the views at the cut, the sealed segment)
    writer_pause: float  # the longest transaction that held the log's writer
    stall: float  # the worst Status round trip meanwhile
    hold: Hold  # the daemon's longest loop step meanwhile


def _log_line(path: Path, *messages: str) -> dict[str, Any] | None:
    """The first JSON line of the daemon's log at ``path`` whose ``msg`` is one of ``messages``."""
    with open(path, "rb") as f:
        for raw in f:
            if raw.startswith(b"{"):
                with contextlib.suppress(ValueError):
                    line = json.loads(raw)
                    if line.get("msg") in messages:
                        return dict(line)
    return None


# (group, label, width) of each column; the rows are formatted to the same widths.
_COLUMNS = (
    ("", "pods", 8),
    ("admission", "samples", 9),
    ("admission", "p50 ms", 8),
    ("admission", "p99 ms", 8),
    ("daemon", "RSS MB", 8),
    ("daemon", "anon MB", 9),
    ("daemon", "CPU/adm ms", 12),
    ("log", "bytes/pod", 11),
    ("PodResources List", "first ms", 10),
    ("PodResources List", "p50 ms", 8),
    ("longest", "stall ms", 10),
    ("longest", "hold ms", 9),
    ("longest", "its CPU", 9),
    ("longest", "work ms", 9),
    (">=10ms", "hold", 6),
    (">=10ms", "work", 6),
    ("", "|", 3),
    ("kubelet-style checkpoint", "per change ms", 14),
    ("kubelet-style checkpoint", "bytes", 12),
)


def _header(out: TextIO) -> None:
    groups = ""
    for group, cols in itertools.groupby(_COLUMNS, key=lambda c: c[0]):
        width = sum(c[2] for c in cols)
        groups += (group + " ").rjust(width) if group != "kubelet-style checkpoint" else ("  " + group).ljust(width)
    labels = "".join(label.rjust(width) for _, label, width in _COLUMNS)
    out.write(groups.rstrip() + "\n" + labels + "\n")


def _row(out: TextIO, r: Row) -> None:
    w = [width for _, _, width in _COLUMNS]
    out.write(
        f"{r.pods:{w[0]},}{r.samples:{w[1]}}{r.p50 * 1e3:{w[2]}.2f}{r.p99 * 1e3:{w[3]}.2f}{r.rss / 2**20:{w[4]}.1f}"
        f"{r.anon / 2**20:{w[5]}.1f}{r.cpu * 1e3:{w[6]}.2f}{r.log_bytes:{w[7]},.0f}{r.list_first * 1e3:{w[8]}.2f}"
        f"{r.list_p50 * 1e3:{w[9]}.2f}{r.stall * 1e3:{w[10]}.1f}{r.hold.text():>{w[11]}}{r.hold.cpu * 1e3:{w[12]}.1f}"
        f"{r.hold.work_text():>{w[13]}}{r.hold.over_10ms:{w[14]}}{r.hold.work_over_10ms:{w[15]}}"
        f"{'|':>{w[16]}}{r.checkpoint * 1e3:{w[17]}.2f}{r.checkpoint_bytes:{w[18]},}\n"
    )
    out.flush()


def run_scale_bench(
    *, devices: int, pods: int, samples: int, repeats: int, workdir: Path | None = None, keep: bool = False
) -> None:
    out = sys.stdout
    tmp = Path(tempfile.mkdtemp(prefix="ess-", dir=workdir or "/tmp"))
    bench = _Bench(tmp, devices, pods, samples, repeats, out)
    t_run = time.perf_counter()
    try:
        first_start = asyncio.run(bench.start())
        out.write(
            f"eventsrc bench scale: {os.cpu_count()} cpus, Python {sys.version.split()[0]}; daemon and sample "
            f"plugin in their own processes; {devices:,} devices on 2 NUMA nodes; one-device pods admitted one at "
            f"a time through the node API (Allocate included) up to {pods:,}, none removed; in {tmp}\n\n"
        )
        out.flush()
        probe_cpu, idle_worst, idle_p50 = bench.start_probe()
        _header(out)
        rows = asyncio.run(bench.grow(probe_cpu))
        _legend(out, samples, repeats, probe_cpu, rows, idle_worst, idle_p50)
        _listings(out, rows, repeats)
        restart, st, back = asyncio.run(bench.restart())
        label = f"restart after SIGKILL at {pods:,} pods"
        out.write(
            f"\n{label:<42}{restart:7.3f} s until Status says ready "
            f"(log at sequence {st.last_seq:,}; {back:,} pods back; the first start, on an empty log, "
            f"took {first_start:.3f} s; Python's start and imports included in both)\n"
        )
        label = f"retention cut at {pods:,} pods"
        if st.last_seq < CUT_PIECE:
            out.write(f"{label:<42}    n/a (the log holds no whole piece of {CUT_PIECE:,} records to cut)\n")
        else:
            cut = asyncio.run(bench.retention_cut())
            out.write(
                f"{label:<42}{cut.seconds:7.3f} s for {cut.records:,} records (its first step, the views at the "
                f"cut and the sealed segment, {cut.prepare:.3f} s); the longest transaction holding the log's "
                f"writer {cut.writer_pause * 1e3:.1f} ms; the longest Status round trip meanwhile "
                f"{cut.stall * 1e3:.1f} ms, the daemon's longest loop step {cut.hold.text()} ms "
                f"({cut.hold.over_10ms} of 10 ms or more; {cut.hold.told()}), its longest work "
                f"{cut.hold.work_text()} ms ({cut.hold.work_over_10ms} of 10 ms or more) "
                f"(serve --log-retention-max-size {CUT_MAX_SIZE}, "
                "after a clean stop)\n"
            )
        out.write(f"\nwhole run: {time.perf_counter() - t_run:.1f} s\n")
    except GRPCError as err:
        raise EventsrcError(f"the daemon answered {err.status.name}: {err.message}; see {bench.daemon_log}") from None
    except BrokenPipeError:
        raise  # our stdout, closed: the command's own handling
    except (StreamTerminatedError, ConnectionError) as err:
        raise EventsrcError(f"the daemon stopped answering ({err}); see {bench.daemon_log}") from None
    finally:
        bench.close()
        if keep:
            with contextlib.suppress(OSError):  # stdout may be what failed
                out.write(f"kept: {tmp} (the daemon's output in {bench.daemon_log})\n")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _legend(
    out: TextIO, samples: int, repeats: int, probe_cpu: float, rows: list[Row], idle_worst: float, idle_p50: float
) -> None:
    probe = statistics.median(r.probe_p50 for r in rows) if rows else 0.0
    out.write(
        "\n"
        f"  admission      latency of the last {samples} admissions before that size (fewer at 10 pods and "
        "wherever the previous size is nearer)\n"
        "  RSS            the daemon's VmRSS at that size; anon: its anonymous part (RssAnon), what the daemon "
        "holds; the rest is mapped files: the log's LMDB map (every page an append touched) and the libraries, "
        "page cache the kernel can reclaim\n"
        "  CPU/adm        the daemon's CPU (every thread) over those admissions, per admission; the stall probe's "
        f"share ({probe_cpu * 1e3:.1f} ms/s, measured on the idle daemon) taken off\n"
        "  bytes/pod      growth of the log's data.mdb since the previous size, per pod admitted since\n"
        f"  List           PodResources List with every pod in its answer: the first call after the admissions, "
        f"and the median of {repeats} (the daemon keeps its answer from one List to the next while nothing changed)\n"
        "  stall          what a client sees: the worst node API Status round trip, sent every "
        f"{PROBE_PERIOD * 1e3:.0f} ms by another process since the previous size (its own scheduling on this "
        f"machine included; a typical one took {probe * 1e3:.2f} ms; on the idle daemon, before any pod, the worst "
        f"of 1 s took {idle_worst * 1e3:.1f} ms, a typical one {idle_p50 * 1e3:.2f} ms)\n"
        "  hold           the daemon's own figure (eventsrc.obs.loop): the longest step of its loop since the "
        "previous size, admissions and listings, one trio task step or asyncio callback that nobody else could "
        "interrupt (collections, GIL waits and this machine's scheduling of the daemon included; '+': more long "
        "steps than the daemon keeps, a floor); its CPU: how much of that step the loop's thread spent on the CPU "
        "(the rest it waited: for the GIL or for a core)\n"
        "  work           the most CPU time the loop's thread spent in one step since the previous size: the "
        "longest piece of the loop's own work, whatever the machine's load\n"
        "  >=10ms         how many steps since the previous size held the loop 10 ms or more (hold), and how many "
        "were 10 ms or more of the loop's own work (work)\n"
        "  checkpoint     what the kubelet's device manager pays per change to persist the same state: its whole "
        f"{CHECKPOINT} (the pods' entries and the registered devices) as JSON to a temporary file in the "
        f"log's directory, fsync, rename; median of {repeats}; the checksum (go-spew + FNV) not timed, so a floor\n"
    )


# (group, label, width), as _COLUMNS
_LISTING_COLUMNS = (
    ("", "pods", 8),
    ("ListPods", "first ms", 10),
    ("ListPods", "p50 ms", 8),
    ("ListPods", "KB", 7),
    ("undecoded p50", "List ms", 9),
    ("undecoded p50", "ListPods ms", 13),
    ("", "List KB", 9),
    ("GetAllocatable", "p50 ms", 16),
    ("listings", "stall ms", 10),
    ("listings", "hold ms", 9),
    ("listings", "work ms", 9),
    ("after them", "RSS MB", 12),
    ("after them", "anon MB", 9),
)


def _listings(out: TextIO, rows: list[Row], repeats: int) -> None:
    """The other listings at each size, in a table of their own (the first one's columns stay)."""
    groups = "".join(
        (group + " ").rjust(sum(c[2] for c in cols))
        for group, cols in itertools.groupby(_LISTING_COLUMNS, key=lambda c: c[0])
    )
    labels = "".join(label.rjust(width) for _, label, width in _LISTING_COLUMNS)
    out.write("\n" + groups.rstrip() + "\n" + labels + "\n")
    w = [width for _, _, width in _LISTING_COLUMNS]
    for r in rows:
        out.write(
            f"{r.pods:{w[0]},}{r.list_pods_first * 1e3:{w[1]}.2f}{r.list_pods_p50 * 1e3:{w[2]}.2f}"
            f"{r.list_pods_bytes / 1e3:{w[3]},.0f}{r.list_raw_p50 * 1e3:{w[4]}.2f}{r.list_pods_raw_p50 * 1e3:{w[5]}.2f}"
            f"{r.list_bytes / 1e3:{w[6]},.0f}{r.allocatable_p50 * 1e3:{w[7]}.2f}{r.listings_stall * 1e3:{w[8]}.1f}"
            f"{r.listings_hold.text():>{w[9]}}{r.listings_hold.work_text():>{w[10]}}"
            f"{r.rss_after / 2**20:{w[11]}.1f}{r.anon_after / 2**20:{w[12]}.1f}\n"
        )
    out.write(
        "\n"
        "  ListPods       the node API's ListPods with every pod in its answer: the first call at that size (after "
        f"List's), and the median of {repeats}, the answer decoded as for List above; its size as encoded\n"
        f"  undecoded      List and ListPods again, the median of {repeats}, their answers not decoded by the bench "
        "(the daemon's part and the transfer, without the client's parsing)\n"
        f"  GetAllocatable PodResources GetAllocatableResources, the median of {repeats} (every device of the "
        "plugin in the answer)\n"
        "  listings stall the worst Status round trip while these calls and List's ran (the stall column above "
        "includes it)\n"
        "  listings hold  the daemon's longest loop step while they ran, and its longest work (the columns above "
        "include them)\n"
        "  RSS            the daemon's VmRSS after them (the listings' caches filled at that size), and its "
        "anonymous part\n"
    )
    worst = max(rows, key=lambda r: r.hold.seconds, default=None)
    if worst is not None and worst.hold.task:
        out.write(
            f"  the longest hold, {worst.hold.text()} ms at {worst.pods:,} pods, was a step of {worst.hold.task!r}: "
            f"{worst.hold.told()}\n"
        )
    busiest = max(rows, key=lambda r: r.hold.work, default=None)
    if busiest is not None and busiest.hold.work_task:
        out.write(
            f"  the longest work, {busiest.hold.work_text()} ms at {busiest.pods:,} pods, was a step of "
            f"{busiest.hold.work_task!r}\n"
        )
    out.flush()


# --------------------------------------------------------------------------- admission cost ratios (issue 15 item 2)


def empty_pod(i: int) -> pb.Pod:
    """Resident number ``i`` that holds nothing: one app container with no device."""
    return pb.Pod(
        uid=str(uuid.uuid4()), namespace="bench", name=f"r{i}", containers=[pb.Container(name="main", kind="app")]
    )


@dataclass(frozen=True)
class RatioRow:
    devices: int
    resident: int
    samples: int
    p50: float
    p99: float
    cpu_admit: float
    cpu_remove: float


class _RatioDaemon:
    """A daemon and the sample plugin with ``devices`` devices, under a root of their own,
    with ``resident`` pods to admit before the samples."""

    def __init__(
        self,
        tmp: Path,
        name: str,
        devices: int,
        resident: int,
        base_pods: int,
        serve_args: Sequence[str] = (),
        pod: Callable[[int], pb.Pod] = one_device_pod,
    ) -> None:
        self.root = tmp / name
        self.devices, self.target, self.base_pods = devices, resident, base_pods
        self.serve_args, self.pod = list(serve_args), pod
        self.daemon_log = tmp / f"{name}.log"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.resident = 0
        self.serial = 0
        self.channel: Channel | None = None
        self.lat: list[float] = []
        self.cpu_admit = self.cpu_remove = 0.0

    @property
    def stub(self) -> NodeStub:
        if self.channel is None:
            self.channel = Channel(path=str(self.root / "eventsrc" / "api.sock"))
        return NodeStub(self.channel)

    async def start(self) -> None:
        with open(self.daemon_log, "ab") as log:
            self.procs.append(start_daemon(self.root, log, self.serve_args))
            await wait_ready(self.root, self.procs[0], self.daemon_log)
            self.procs.append(start_plugin(self.root, self.devices, log))
        await wait_devices(self.root, self.devices)

    async def _admit(self, pod: pb.Pod) -> None:
        try:
            await self.stub.Admit(pb.AdmitRequest(pod=pod), timeout=60)
        except GRPCError as err:
            raise EventsrcError(f"admitting pod {pod.name} failed: {err.message or err.status.name}") from None

    async def reside(self, progress: _Progress) -> None:
        """Admit the residents: the first ``base_pods`` hold nothing, the rest a device each."""
        while self.resident < self.target:
            i = self.resident
            await self._admit(empty_pod(i) if i < self.base_pods else self.pod(i))
            self.resident += 1
            progress.show(self.resident, f"residents ({self.devices:,} devices)")
        progress.clear()

    async def sample(self, *, measured: bool) -> None:
        """One one-device admission, removed again (the free devices and the residents stay
        as they are); its latency and the daemon's CPU kept when ``measured``."""
        self.serial += 1
        pod = self.pod(1_000_000 + self.serial)
        pid = self.procs[0].pid
        c, t = cpu_seconds(pid), time.perf_counter()
        await self._admit(pod)
        took, c2 = time.perf_counter() - t, cpu_seconds(pid)
        await self.stub.Remove(pb.RemoveRequest(pod=pb.PodSelector(uid=pod.uid)), timeout=60)
        if measured:
            self.lat.append(took)
            self.cpu_admit += c2 - c
            self.cpu_remove += cpu_seconds(pid) - c2

    def row(self) -> RatioRow:
        n = len(self.lat)
        return RatioRow(
            self.devices,
            self.resident,
            n,
            pct(self.lat, 0.5),
            pct(self.lat, 0.99),
            self.cpu_admit / n,
            self.cpu_remove / n,
        )

    def close_channel(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def close(self) -> None:
        stop(self.procs)


def _side_by_side(
    daemons: list[_RatioDaemon], progress: _Progress, warmup: int, samples: int, tmp: Path, keep: bool
) -> None:
    """Start ``daemons`` and admit their residents, then take their samples in turn
    (``warmup`` unmeasured first); stop them, and remove ``tmp`` unless ``keep``."""

    async def run() -> None:
        try:
            for d in daemons:
                await d.start()
                await d.reside(progress)
            for k in range(warmup + samples):
                for d in daemons:
                    await d.sample(measured=k >= warmup)
        finally:
            for d in daemons:
                d.close_channel()

    try:
        asyncio.run(run())
    except GRPCError as err:
        raise EventsrcError(f"the daemon answered {err.status.name}: {err.message}; see {tmp}") from None
    except (StreamTerminatedError, ConnectionError) as err:
        raise EventsrcError(f"the daemon stopped answering ({err}); see {tmp}") from None
    finally:
        for d in daemons:
            d.close()
        if keep:
            with contextlib.suppress(OSError):
                sys.stdout.write(f"kept: {tmp}\n")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run_ratio_bench(
    *,
    small_devices: int,
    devices: int,
    base_pods: int,
    pods: int,
    samples: int,
    warmup: int = 20,
    workdir: Path | None = None,
    keep: bool = False,
) -> tuple[float, float]:
    """Issue 15 item 2's figures: one-device admission p50 with ``small_devices`` and with
    ``devices`` devices at ``base_pods`` resident pods, and with ``devices`` devices at
    ``pods`` resident pods; printed with the two ratios, which are returned.

    Three daemons run side by side, one per figure, and their samples are taken in turn, so
    that whatever else the machine does weighs on the three alike. The first ``base_pods``
    residents hold nothing (so that a few devices can host them); the rest hold one device
    each. Each measured pod is removed again before the next."""
    out = sys.stdout
    tmp = Path(tempfile.mkdtemp(prefix="ess-ratio-", dir=workdir or "/tmp"))
    configs = [(small_devices, base_pods), (devices, base_pods), (devices, pods)]
    daemons = [_RatioDaemon(tmp, f"r{k}", n, resident, base_pods) for k, (n, resident) in enumerate(configs)]
    out.write(
        f"eventsrc bench scale --ratios: {os.cpu_count()} cpus, Python {sys.version.split()[0]}; three daemons, "
        f"each with the sample plugin, in their own processes (devices on 2 NUMA nodes); one-device pods admitted "
        f"one at a time through the node API (Allocate included), each removed again before the next, the three "
        f"daemons in turn; in {tmp}\n\n"
    )
    out.flush()

    _side_by_side(daemons, _Progress(pods), warmup, samples, tmp, keep)
    small, base, grown = (d.row() for d in daemons)
    out.write(f"{'devices':>8}{'resident':>10}{'samples':>9}{'p50 ms':>9}{'p99 ms':>9}{'CPU/adm ms':>12}")
    out.write(f"{'CPU/remove ms':>15}\n")
    for row in (small, base, grown):
        out.write(
            f"{row.devices:8,}{row.resident:10,}{row.samples:9}{row.p50 * 1e3:9.2f}{row.p99 * 1e3:9.2f}"
            f"{row.cpu_admit * 1e3:12.2f}{row.cpu_remove * 1e3:15.2f}\n"
        )
    by_devices, by_pods = base.p50 / small.p50, grown.p50 / base.p50
    out.write(
        f"\np50 ratio, {devices:,} / {small_devices:,} devices at {base_pods:,} resident pods: {by_devices:.2f} "
        f"(goal <= 1.2)\np50 ratio, {pods:,} / {base_pods:,} resident pods with {devices:,} devices: {by_pods:.2f} "
        f"(goal <= 1.2)\n\n"
        f"  resident   pods admitted before the samples: the first {base_pods:,} hold nothing (so that "
        f"{small_devices:,} devices can host them), the rest one device each\n"
        f"  p50/p99    latency of {samples} one-device admissions through the node API, after {warmup} unmeasured\n"
        "  CPU        the daemon's CPU (every thread) per admission, and per removal after it\n"
    )
    out.flush()
    return by_devices, by_pods


#: The machine of ``run_memory_bench``: 16 CPUs and 512Gi on each of 2 NUMA nodes.
_MEMORY_MACHINE = {
    "cpus": [{"id": i, "core": i, "socket": 0, "numa": i // 8, "uncore": i // 8} for i in range(16)],
    "memory": {"0": {"memory": "512Gi"}, "1": {"memory": "512Gi"}},
}


def guaranteed_pod(i: int) -> pb.Pod:
    """Pod number ``i``, Guaranteed: 1m of CPU (the shared pool), 1Mi of memory, one device."""
    res = {RESOURCE: "1", "cpu": "1m", "memory": "1Mi"}
    return pb.Pod(
        uid=str(uuid.uuid4()),
        namespace="bench",
        name=f"g{i}",
        containers=[pb.Container(name="main", kind="app", limits=res, requests=res)],
    )


def run_memory_bench(
    *, devices: int, pods: int, samples: int, warmup: int = 20, workdir: Path | None = None, keep: bool = False
) -> float:
    """Issue 38's figure: the admission p50 of a Guaranteed one-device pod (1Mi of memory)
    with the memory manager's Static policy, beside the same without it (None), at ``pods``
    resident pods of the same kind; printed with the ratio, which is returned. Two daemons side
    by side on the same described machine (2 NUMA nodes, the topology manager best-effort),
    sampled in turn; each measured pod is removed again."""
    out = sys.stdout
    tmp = Path(tempfile.mkdtemp(prefix="ess-memory-", dir=workdir or "/tmp"))
    machine = tmp / "machine.json"
    machine.write_text(json.dumps(_MEMORY_MACHINE))
    common = ("--topology-file", str(machine), "--topology-manager-policy", "best-effort")
    static = ("--memory-manager-policy", "Static", "--reserved-memory", "0:memory=100Mi")
    daemons = [
        _RatioDaemon(tmp, "off", devices, pods, 0, common, guaranteed_pod),
        _RatioDaemon(tmp, "on", devices, pods, 0, (*common, *static), guaranteed_pod),
    ]
    out.write(
        f"eventsrc bench scale --memory-manager: {os.cpu_count()} cpus, Python {sys.version.split()[0]}; two daemons, "
        f"memory manager None and Static, each with the sample plugin ({devices:,} devices on 2 NUMA nodes), on a "
        f"described machine of 2 NUMA nodes, the topology manager best-effort; Guaranteed one-device pods (1m of CPU, "
        f"1Mi) admitted one at a time through the node API, each removed again, the two daemons in turn; in {tmp}\n\n"
    )
    out.flush()

    _side_by_side(daemons, _Progress(pods), warmup, samples, tmp, keep)
    off, on = (d.row() for d in daemons)
    out.write(f"{'memory manager':>15}{'resident':>10}{'samples':>9}{'p50 ms':>9}{'p99 ms':>9}{'CPU/adm ms':>12}\n")
    for name, row in (("None", off), ("Static", on)):
        out.write(
            f"{name:>15}{row.resident:10,}{row.samples:9}{row.p50 * 1e3:9.2f}{row.p99 * 1e3:9.2f}"
            f"{row.cpu_admit * 1e3:12.2f}\n"
        )
    ratio = on.p50 / off.p50
    out.write(f"\np50 ratio, Static / None at {pods:,} resident pods: {ratio:.2f} (goal <= 1.2)\n")
    return ratio
