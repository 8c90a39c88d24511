"""``eventsrc bench watch``: what readers of the node's history cost its decisions.

A daemon and the sample plugin under a temporary root; its log filled to ``--records``
records by admissions and removals. Then one-device admissions (each removed again), timed
from the client, in three phases: on the idle node (the ceiling every other figure is set
beside), while ``--watchers`` node API Watch streams replay the log from its first record
(a third read as fast as they can, a third one message every ``--slow-ms``, a third never
read), and after the watchers have gone. Beside each phase: the daemon's RSS (the peak while
the watchers run). The watchers run in a process of their own, each on its own connection.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from grpclib.client import Channel
from grpclib.exceptions import GRPCError, StreamTerminatedError

from eventsrc.bench.harness import (
    CPU,
    one_device_pod,
    pct,
    rss_bytes,
    start_daemon_and_plugin,
    stop,
    wait_ready,
)
from eventsrc.errors import EventsrcError
from eventsrc.gen.node.v1 import node_pb2 as pb
from eventsrc.gen.node.v1.node_grpc import NodeStub

KINDS = ("fast", "slow", "stalled")
#: the admission latency ratio the node must keep with the watchers running (issue 26, item 7)
GOAL_RATIO = 2.0
#: the daemon's RSS bound (docs/adr/0028)
RSS_BOUND = 100 * 1024 * 1024


# --------------------------------------------------------------------------- the watchers' process


def watchers_main() -> None:
    """The watchers (argv: the node API socket, the watchers, the slow readers' delay in ms;
    the kinds in turn). Prints ``open`` once every stream has its first message (the stalled ones: once
    asked); then each line read on stdin is answered with one line per kind: the kind, the
    records read, the streams ended by the daemon and the first ending's status."""
    api, n, slow_ms = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    read = dict.fromkeys(KINDS, 0)
    ended: dict[str, list[str]] = {k: [] for k in KINDS}
    opened = 0
    all_open = asyncio.Event()

    async def watcher(kind: str) -> None:
        nonlocal opened
        channel = Channel(path=api)
        try:
            async with NodeStub(channel).Watch.open() as stream:
                await stream.send_message(pb.WatchRequest(from_seq=1))
                if kind == "stalled":
                    opened += 1
                    if opened == n:
                        all_open.set()
                    await stream.recv_trailing_metadata()  # headers are not flow controlled: the daemon's verdict
                    ended[kind].append(f"{stream.trailing_metadata}")
                    return
                first = True
                while True:
                    msg = await stream.recv_message()
                    if msg is None:
                        ended[kind].append("ended")
                        return
                    read[kind] += 1
                    if first:
                        first = False
                        opened += 1
                        if opened == n:
                            all_open.set()
                    if kind == "slow":
                        await asyncio.sleep(slow_ms / 1000)
        except GRPCError as err:
            ended[kind].append(f"{err.status.name}: {err.message}")
        except StreamTerminatedError as err:
            ended[kind].append(f"terminated: {err}")
        finally:
            channel.close()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        tasks = [asyncio.create_task(watcher(KINDS[i % len(KINDS)])) for i in range(n)]
        await all_open.wait()
        print("open", flush=True)
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            for k in KINDS:
                first = ended[k][0] if ended[k] else ""
                print(k, read[k], len(ended[k]), first.replace("\n", " "), flush=True)
        for t in tasks:
            t.cancel()

    asyncio.run(main())


class Watchers:
    """The watchers' process."""

    def __init__(self, api: Path, n: int, slow_ms: float) -> None:
        code = "from testbed.benches.watch import watchers_main; watchers_main()"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(api), str(n), str(slow_ms)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def _pipes(self) -> tuple[IO[bytes], IO[bytes]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        return self.proc.stdin, self.proc.stdout

    def wait_open(self) -> None:
        _, out = self._pipes()
        if out.readline().strip() != b"open":
            raise EventsrcError("the watchers' process ended before its streams were open")

    def progress(self) -> dict[str, tuple[int, int, str]]:
        """Per kind: the records read, the streams the daemon ended, the first one's status."""
        inp, out = self._pipes()
        inp.write(b"?\n")
        inp.flush()
        got = {}
        for _ in KINDS:
            kind, records, ends, *status = out.readline().decode().rstrip("\n").split(" ", 3)
            got[kind] = (int(records), int(ends), " ".join(status))
        return got

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


# --------------------------------------------------------------------------- the daemon's side


class PeakRSS:
    """The daemon's RSS, read every 20 ms in a thread while it runs; the peak."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def close(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, rss_bytes(self.pid))


@dataclass
class Phase:
    name: str
    latencies: list[float]
    rss: int
    cpu: float  # the daemon's CPU over the phase, as a share of one core
    others: float = 0.0  # the watchers' process's

    def row(self, idle_p50: float) -> str:
        p50 = statistics.median(self.latencies)
        return (
            f"{self.name:<22} {p50 * 1e3:>9.2f} {pct(self.latencies, 0.9) * 1e3:>9.2f} "
            f"{max(self.latencies) * 1e3:>9.2f} {p50 / idle_p50:>7.2f} {self.rss / 2**20:>9.1f} "
            f"{self.cpu:>7.2f} {self.others:>9.2f}"
        )


async def _admit_remove(stub: NodeStub, n: int, start: int) -> list[float]:
    """``n`` one-device pods admitted and removed again, one at a time; each admission's latency."""
    out = []
    for i in range(start, start + n):
        pod = one_device_pod(i)
        t = time.perf_counter()
        try:
            await stub.Admit(pb.AdmitRequest(pod=pod), timeout=120)
        except GRPCError as err:
            raise EventsrcError(f"admitting pod {i} failed: {err.message or err.status.name}") from None
        out.append(time.perf_counter() - t)
        await stub.Remove(pb.RemoveRequest(pod=pb.PodSelector(uid=pod.uid)), timeout=120)
    return out


async def _fill(stub: NodeStub, records: int, out: IO[str]) -> int:
    """Admissions and removals until the log holds ``records`` records; the pods used."""
    i = 0
    while True:
        st = await stub.Status(pb.StatusRequest(), timeout=30)
        if st.last_seq >= records:
            return i
        out.write(f"\rfilling the log: {st.last_seq:,} of {records:,} records")
        out.flush()
        await _admit_remove(stub, 50, i)
        i += 50


def _caught_up(w: Watchers, total: int, timeout: float = 300) -> float | None:
    """Seconds until the fast watchers have read ``total`` records between them (the log from
    its first record, each), with no decision under way; None after ``timeout``."""
    t = time.perf_counter()
    while w.progress()["fast"][0] < total:
        if time.perf_counter() - t > timeout:
            return None
        time.sleep(0.1)
    return time.perf_counter() - t


def run_watch_bench(
    records: int, watchers: int, samples: int, slow_ms: float, workdir: Path | None, out: IO[str] = sys.stdout
) -> list[Phase]:
    with tempfile.TemporaryDirectory(prefix="eventsrc-bench-watch-", dir=workdir) as tmp_name:
        tmp = Path(tmp_name)
        root = tmp / "r"
        procs: list[subprocess.Popen[bytes]] = []
        try:
            start_daemon_and_plugin(tmp, root, 8, procs)
            daemon = procs[0]
            api = root / "eventsrc" / "api.sock"
            return asyncio.run(_phases(daemon, root, tmp, api, records, watchers, samples, slow_ms, out))
        finally:
            stop(procs)


async def _phases(
    daemon: subprocess.Popen[bytes],
    root: Path,
    tmp: Path,
    api: Path,
    records: int,
    watchers: int,
    samples: int,
    slow_ms: float,
    out: IO[str],
) -> list[Phase]:
    await wait_ready(root, daemon, tmp / "daemon.log")
    channel = Channel(path=str(api))
    stub = NodeStub(channel)
    try:
        used = await _fill(stub, records, out)
        last = (await stub.Status(pb.StatusRequest(), timeout=30)).last_seq
        out.write(f"\rthe log: {last:,} records{' ' * 30}\n")
        cpu = CPU(daemon.pid)
        idle = Phase("idle", await _admit_remove(stub, samples, used), rss_bytes(daemon.pid), cpu.share())
        used += samples
        peak = PeakRSS(daemon.pid)
        w = Watchers(api, watchers, slow_ms)
        try:
            t = time.perf_counter()
            w.wait_open()
            out.write(f"{watchers} watchers open in {time.perf_counter() - t:.1f} s\n")
            cpu.start()
            theirs = CPU(w.proc.pid)
            during = await _admit_remove(stub, samples, used)
            used += samples
            daemon_cpu, their_cpu = cpu.share(), theirs.share()
            seen = w.progress()
            caught_up = _caught_up(w, sum(1 for i in range(watchers) if i % len(KINDS) == 0) * last)
        finally:
            w.close()
        watching = Phase(f"{watchers} watchers", during, peak.close(), daemon_cpu, their_cpu)
        cpu.start()
        after_latencies = await _admit_remove(stub, samples, used)
        after = Phase("after they went", after_latencies, rss_bytes(daemon.pid), cpu.share())
    finally:
        channel.close()
    idle_p50 = statistics.median(idle.latencies)
    out.write(f"one-device admissions, {samples} per phase, each removed again; pid {os.getpid()}\n")
    out.write(
        f"{'phase':<22} {'p50 ms':>9} {'p90 ms':>9} {'max ms':>9} {'× idle':>7} {'RSS MiB':>9} {'CPU':>7} "
        f"{'watchers':>9}\n"
    )
    for phase in (idle, watching, after):
        out.write(phase.row(idle_p50) + "\n")
    out.write(f"\nwhile the admissions ran (the watchers' kinds in turn, from seq 1 of {last:,}):\n")
    for kind, (n, ends, status) in seen.items():
        told = f"; {ends} ended by the daemon, the first: {status}" if ends else ""
        out.write(f"  {kind:<8} {n:>10,} records read{told}\n")
    if caught_up is None:
        out.write("  the fast watchers had not read the whole log 300 s after the admissions ended\n")
    else:
        out.write(f"  the fast watchers had read the whole log {caught_up:.1f} s after the admissions ended\n")
    ratio = statistics.median(watching.latencies) / idle_p50
    verdict = "within" if ratio <= GOAL_RATIO else "OVER"
    out.write(
        f"\nadmission p50 with the watchers: {ratio:.2f}× the idle node's ({verdict} the goal of {GOAL_RATIO}×)\n"
    )
    rss_verdict = "under" if after.rss < RSS_BOUND else "OVER"
    out.write(
        f"RSS after the watchers went: {after.rss / 2**20:.1f} MiB ({rss_verdict} the bound of "
        f"{RSS_BOUND / 2**20:.0f} MiB); peak while they ran {watching.rss / 2**20:.1f} MiB\n"
    )
    return [idle, watching, after]
