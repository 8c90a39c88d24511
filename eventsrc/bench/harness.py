"""What the benchmarks that drive a real daemon share: ``eventsrc serve`` and the sample
device plugin started as their own processes under a temporary root, one-device pods,
the processes' CPU time and RSS, percentiles."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from grpclib.client import Channel

from eventsrc.errors import EventsrcError
from eventsrc.gen.node.v1 import node_pb2 as pb
from eventsrc.gen.node.v1.node_grpc import NodeStub
from eventsrc.gen.podresources.v1 import api_pb2 as pr
from eventsrc.gen.podresources.v1.api_grpc import PodResourcesListerStub

RESOURCE = "example.com/bench"


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank, from below)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def one_device_pod(i: int) -> pb.Pod:
    """Pod number ``i``: one app container asking for one device of ``RESOURCE``."""
    return pb.Pod(
        uid=str(uuid.uuid4()),
        namespace="bench",
        name=f"p{i}",
        containers=[pb.Container(name="main", kind="app", limits={RESOURCE: "1"}, requests={RESOURCE: "1"})],
    )


def cpu_seconds(pid: int) -> float:
    """CPU time (all threads) a process has used so far: its POSIX CPU clock, as
    ``clock_getcpuclockid(pid)`` would name it on Linux (exact, unlike /proc's ticks)."""
    return time.clock_gettime(((~pid) << 3) | 2)  # CPUCLOCK_SCHED of the whole process


class CPU:
    """The CPU a process used since the last look, as a share of one core."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start()

    def start(self) -> None:
        self.c, self.t = cpu_seconds(self.pid), time.perf_counter()

    def share(self) -> float:
        return (cpu_seconds(self.pid) - self.c) / (time.perf_counter() - self.t)


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """Resident set size of ``pid`` now (VmRSS in /proc/<pid>/status), or another of its
    lines in kB (``RssAnon``: the anonymous part; ``RssFile``: mapped files, the log's
    LMDB map and the libraries, pages the kernel can reclaim)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    return 0


#: Pods a bench's daemon runs at most: more than any bench admits.
BENCH_MAX_PODS = 1_000_000


def start_daemon(
    root: Path, log: BinaryIO, extra_args: Sequence[str] = (), log_level: str = "warning"
) -> subprocess.Popen[bytes]:
    """``eventsrc serve`` on ``root`` (with ``extra_args``, serve's own flags), its output to
    ``log``; returns at once. A bench holds more pods than a kubelet's 110 (``--max-pods``,
    unless ``extra_args`` say otherwise: the last one given counts)."""
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "eventsrc", "--log-level", log_level, "--root-dir", str(root), "serve"),
            *("--max-pods", str(BENCH_MAX_PODS), *extra_args),
        ],
        stdout=log,
        stderr=log,
    )


def wait_plugin_socket(root: Path, daemon: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    """Until the daemon's device plugin registration socket exists."""
    deadline = time.monotonic() + timeout
    while not (root / "device-plugins" / "kubelet.sock").exists():
        if time.monotonic() > deadline or daemon.poll() is not None:
            raise EventsrcError(f"the daemon did not start; see {log}")
        time.sleep(0.05)


async def wait_ready(root: Path, daemon: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> pb.StatusResponse:
    """Until the daemon's node API answers Status with ready (asked every 10 ms); its answer."""
    deadline = time.monotonic() + timeout
    api = root / "eventsrc" / "api.sock"
    while True:
        if daemon.poll() is not None:
            raise EventsrcError(f"the daemon exited before it was ready; see {log}")
        if time.monotonic() > deadline:
            raise EventsrcError(f"the daemon was not ready within {timeout:g} s; see {log}")
        if api.exists():
            channel = Channel(path=str(api))
            try:
                st = await NodeStub(channel).Status(pb.StatusRequest(), timeout=2)
                if st.ready:
                    return st
            except Exception:  # noqa: BLE001 - not up yet
                pass
            finally:
                channel.close()
        await asyncio.sleep(0.01)


def start_plugin(root: Path, devices: int, log: BinaryIO) -> subprocess.Popen[bytes]:
    """The sample plugin with ``devices`` devices of ``RESOURCE`` on 2 NUMA nodes (socket ``bench.sock``)."""
    return subprocess.Popen(
        [sys.executable, "-m", "eventsrc", "--root-dir", str(root), "sample-plugin"]
        + ["--resource", RESOURCE, "--devices", str(devices), "--numa-nodes", "2", "--socket-name", "bench.sock"],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )


async def wait_devices(root: Path, n: int, timeout: float = 60) -> dict[str, int]:
    """Until ``n`` devices are allocatable (PodResources GetAllocatableResources); each
    device's NUMA node (-1: none)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        channel = Channel(path=str(root / "pod-resources" / "kubelet.sock"))
        try:
            resp = await PodResourcesListerStub(channel).GetAllocatableResources(
                pr.AllocatableResourcesRequest(), timeout=2
            )
            if sum(len(d.device_ids) for d in resp.devices) >= n:
                return {
                    i: (d.topology.nodes[0].ID if d.topology.nodes else -1) for d in resp.devices for i in d.device_ids
                }
        except Exception:  # noqa: BLE001 - not up yet
            pass
        finally:
            channel.close()
        await asyncio.sleep(0.1)
    raise EventsrcError(f"the sample plugin's {n} devices did not show up within {timeout:g} s")


def start_daemon_and_plugin(tmp: Path, root: Path, devices: int, procs: list[subprocess.Popen[bytes]]) -> None:
    """``eventsrc serve`` and the sample plugin under ``root``, appended to ``procs`` as they
    start (their output in ``tmp/daemon.log``); returns once the plugin's devices are allocatable."""
    log_path = tmp / "daemon.log"
    log = open(log_path, "ab")  # noqa: SIM115 - the children write to it until they end
    procs.append(start_daemon(root, log))
    wait_plugin_socket(root, procs[0], log_path)
    procs.append(start_plugin(root, devices, log))
    asyncio.run(wait_devices(root, devices))


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate each process still running, last started first (killed after 10 s)."""
    for p in reversed(procs):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
