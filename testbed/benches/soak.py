"""``eventsrc bench soak``: a realistic node for a while, to see that what the daemon keeps
stops growing.

A daemon (``--snapshot-every`` small, and ``--log-retention-max-size`` when a size is given)
and the sample plugin (``--devices`` devices) run as their own processes under a temporary
root. For ``--minutes``, this process drives them as a busy node would:

* pods come and go: one-device pods admitted through the node API at ``--rate`` a second,
  and once ``--resident`` are held, the oldest removed before each new one (the plugin's
  Allocate included);
* one device flaps: ``dev-0``'s health flips every ``FLAP_PERIOD`` through the sample
  plugin's health file (the daemon coalesces it, ADR 0017);
* a PodResources consumer calls ``List`` every second;
* retention cuts the log at a small size, at snapshot boundaries (``--retention-max-size``;
  0 leaves retention off and the log grows).

Every ``--interval`` it prints a row: the live log on disk (the LMDB file ``data.mdb`` and
the snapshots), the archive (what retention moved out, which is meant to grow), the
daemon's RSS, the admissions of that interval and their p99, the PodResources calls' p99,
and the records appended. At the end the daemon is stopped with SIGTERM, ``eventsrc audit
verify`` checks the hash chain, and the verdict says whether the live log and the RSS
reached a plateau (``plateau`` below says exactly what that means) and whether the chain
holds. What the figures are (how fast) is never part of the verdict.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from grpclib import Status
from grpclib.client import Channel
from grpclib.exceptions import GRPCError, StreamTerminatedError

from eventsrc.bench.harness import (
    RESOURCE,
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
from eventsrc.gen.node.v1 import node_pb2 as pb
from eventsrc.gen.node.v1.node_grpc import NodeStub
from eventsrc.gen.podresources.v1 import api_pb2 as pr
from eventsrc.gen.podresources.v1.api_grpc import PodResourcesListerStub

RETENTION_FLAG = "--log-retention-max-size"
FLAPPING_DEVICE = "dev-0"
FLAP_PERIOD = 0.5  # the sample plugin reads its health file every 0.2 s
LIST_PERIOD = 1.0
MAX_INTERVAL = 10.0
MIN_SAMPLES = 12  # a short run's interval shrinks so that it still has this many rows

# The plateau (see ``plateau``): the first WARMUP_SHARE of the samples are left out, and
# the rest, split in two, must not rise by more than the slack from one half to the next.
WARMUP_SHARE = 1 / 3  # "the first third" in the legend
DISK_SLACK = (0.10, 256 * 1024)  # (share of the first half's maximum, floor in bytes)
RSS_SLACK = (0.05, 4 * 2**20)  # a Python process's allocator keeps some of what it freed


@dataclass(frozen=True)
class SoakOptions:
    minutes: float
    devices: int = 24
    resident: int = 16
    rate: float = 20.0  # admissions a second
    retention_max_size: str = "1Mi"  # "0": retention off
    snapshot_every: int = 1000
    interval: float | None = None  # None: MAX_INTERVAL, less for a short run (MIN_SAMPLES rows)

    @property
    def seconds(self) -> float:
        return self.minutes * 60

    @property
    def retention(self) -> bool:
        return not is_zero_size(self.retention_max_size)

    @property
    def period(self) -> float:
        """Seconds between two rows."""
        return self.interval if self.interval is not None else min(MAX_INTERVAL, self.seconds / MIN_SAMPLES)

    def serve_args(self) -> list[str]:
        args = ["--snapshot-every", str(self.snapshot_every)]
        if self.retention:
            args += [RETENTION_FLAG, self.retention_max_size]
        return args


def is_zero_size(size: str) -> bool:
    """Whether a size as serve takes it (``0``, ``512Ki``, ``10MB``...) is zero; serve itself
    says whether the rest is a size."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*[A-Za-z]*\s*", size)
    return m is not None and float(m.group(1)) == 0


def serve_has_retention() -> bool:
    """Whether this build's ``eventsrc serve`` takes ``--log-retention-max-size``."""
    proc = subprocess.run(
        [sys.executable, "-m", "eventsrc", "serve", "--help"], capture_output=True, text=True, timeout=60
    )
    return RETENTION_FLAG in proc.stdout


# --------------------------------------------------------------------------- the verdict


@dataclass(frozen=True)
class Plateau:
    """Whether a figure sampled over the run stopped growing: after the warm-up (the first
    ``WARMUP_SHARE`` of the samples), the maximum over the later half of the rest is at most
    the maximum over the earlier half plus the slack (``share`` of that maximum, at least
    ``floor``). A maximum rather than a last value, so one sample caught just before a cut
    or a collection neither hides a rise nor makes one."""

    holds: bool
    early_max: int
    late_max: int
    allowed: int  # the most late_max may be

    def describe(self, unit: Callable[[int], str]) -> str:
        return f"highest {unit(self.early_max)}, then {unit(self.late_max)}, allowed {unit(self.allowed)}"


def plateau(values: Sequence[int], share: float, floor: int) -> Plateau:
    """``values`` in time order (at least 3)."""
    if len(values) < 3:
        raise ValueError("a plateau needs at least 3 samples")
    warm = max(1, int(len(values) * WARMUP_SHARE))
    rest = values[warm:]
    half = len(rest) // 2
    early, late = max(rest[:half]), max(rest[half:])
    allowed = early + max(int(early * share), floor)
    return Plateau(late <= allowed, early, late, allowed)


def trend(samples: Sequence[Sample], value: Callable[[Sample], int]) -> float:
    """Bytes a minute: the least-squares slope of ``value`` after the warm-up. Printed beside
    the verdict and never part of it: over a short run it is mostly noise, over a long one it
    shows a slow rise that still fits within the plateau's slack."""
    rest = samples[max(1, int(len(samples) * WARMUP_SHARE)) :]
    if len(rest) < 2:
        return 0.0
    fit = statistics.linear_regression([s.elapsed for s in rest], [float(value(s)) for s in rest])
    return fit.slope * 60


# --------------------------------------------------------------------------- the load


@dataclass(frozen=True)
class Sample:
    elapsed: float
    log_bytes: int  # data.mdb
    snapshot_bytes: int
    archive_bytes: int
    rss: int
    admissions: int
    admission_p99: float
    refused: int
    lists: int
    list_p99: float
    records: int  # appended during the interval
    last_seq: int

    @property
    def live_bytes(self) -> int:
        return self.log_bytes + self.snapshot_bytes


@dataclass
class _Window:
    """What the load did since the last sample."""

    admissions: list[float] = field(default_factory=list)
    refused: int = 0
    lists: list[float] = field(default_factory=list)
    flips: int = 0

    def take(self) -> _Window:
        taken = _Window(self.admissions, self.refused, self.lists, self.flips)
        self.admissions, self.refused, self.lists, self.flips = [], 0, [], 0
        return taken


def _tree_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (0 when it does not exist); a file removed
    while it is walked is skipped."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(dirpath, name), follow_symlinks=False).st_size
    return total


class _Soak:
    def __init__(self, tmp: Path, options: SoakOptions, out: TextIO) -> None:
        self.tmp, self.root, self.options, self.out = tmp, tmp / "r", options, out
        self.state = self.root / "eventsrc"
        self.daemon_log = tmp / "daemon.log"
        self.health_file = (
            self.root / "plugins" / f"sample-{RESOURCE.replace('/', '-').replace('.', '-')}" / "health.json"
        )
        self.procs: list[subprocess.Popen[bytes]] = []
        self.window = _Window()
        self.samples: list[Sample] = []

    @property
    def daemon(self) -> subprocess.Popen[bytes]:
        return self.procs[0]

    def why_down(self) -> str:
        """Why the daemon stopped: its exit status and the last line it wrote."""
        lines = self.daemon_log.read_text(errors="replace").strip().splitlines() if self.daemon_log.exists() else []
        last = f": {lines[-1]}" if lines else ""
        return f"the daemon exited with status {self.daemon.returncode}{last} (see {self.daemon_log})"

    async def start(self) -> None:
        with open(self.daemon_log, "ab") as log:
            self.procs.append(start_daemon(self.root, log, self.options.serve_args()))
            try:
                await wait_ready(self.root, self.daemon, self.daemon_log)
            except EventsrcError:
                if self.daemon.poll() is not None:
                    raise EventsrcError(self.why_down()) from None
                raise
            self.procs.append(start_plugin(self.root, self.options.devices, log))
        await wait_devices(self.root, self.options.devices)

    # ------------------------------------------------------------------ the load's tasks

    async def churn(self, until: float) -> None:
        """Pods admitted at ``rate`` a second; the oldest removed first once ``resident`` are held.
        Paced from a schedule: a slow answer delays the next admission, never bunches them up."""
        channel = Channel(path=str(self.state / "api.sock"))
        stub = NodeStub(channel)
        held: collections.deque[str] = collections.deque()
        period = 1 / self.options.rate
        due = time.monotonic()
        i = 0
        try:
            while time.monotonic() < until:
                if len(held) >= self.options.resident:
                    await stub.Remove(pb.RemoveRequest(pod=pb.PodSelector(uid=held.popleft())), timeout=60)
                pod = one_device_pod(i)
                i += 1
                t = time.perf_counter()
                try:
                    await stub.Admit(pb.AdmitRequest(pod=pod), timeout=60)
                except GRPCError as err:
                    if err.status != Status.FAILED_PRECONDITION:
                        raise
                    self.window.refused += 1
                else:
                    self.window.admissions.append(time.perf_counter() - t)
                    held.append(pod.uid)
                due += period
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                due = max(due, time.monotonic() - period)
        finally:
            channel.close()

    async def flap(self, until: float) -> None:
        """``FLAPPING_DEVICE`` unhealthy, healthy, unhealthy... every ``FLAP_PERIOD``. Written
        whole and renamed, so the plugin never reads half a file."""
        tmp = self.health_file.with_name(".health.json.tmp")
        healthy = True
        while time.monotonic() < until:
            healthy = not healthy
            tmp.write_text(json.dumps({FLAPPING_DEVICE: "Healthy" if healthy else "Unhealthy"}))
            os.replace(tmp, self.health_file)
            self.window.flips += 1
            await asyncio.sleep(FLAP_PERIOD)

    async def poll_pod_resources(self, until: float) -> None:
        """PodResources ``List`` every ``LIST_PERIOD``, as a monitoring agent would."""
        channel = Channel(path=str(self.root / "pod-resources" / "kubelet.sock"))
        stub = PodResourcesListerStub(channel)
        try:
            while time.monotonic() < until:
                t = time.perf_counter()
                await stub.List(pr.ListPodResourcesRequest(), timeout=60)
                self.window.lists.append(time.perf_counter() - t)
                await asyncio.sleep(max(0.0, LIST_PERIOD - (time.perf_counter() - t)))
        finally:
            channel.close()

    async def sample_every(self, start: float, until: float) -> None:
        """A row at each ``period`` from ``start`` (the last one at ``until``)."""
        channel = Channel(path=str(self.state / "api.sock"))
        stub = NodeStub(channel)
        last_seq = (await stub.Status(pb.StatusRequest(), timeout=60)).last_seq
        n = 0
        try:
            while True:
                n += 1
                due = min(start + n * self.options.period, until)
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if self.daemon.poll() is not None:
                    raise EventsrcError(self.why_down())
                seq = (await stub.Status(pb.StatusRequest(), timeout=60)).last_seq
                self.record(time.monotonic() - start, seq - last_seq, seq)
                last_seq = seq
                if due >= until:
                    return
        finally:
            channel.close()

    def record(self, elapsed: float, records: int, last_seq: int) -> None:
        w = self.window.take()
        data = self.state / "log" / "data.mdb"
        s = Sample(
            elapsed=elapsed,
            log_bytes=data.stat().st_size,
            snapshot_bytes=_tree_bytes(self.state / "snapshots"),
            archive_bytes=_tree_bytes(self.state / "archive"),
            rss=rss_bytes(self.daemon.pid),
            admissions=len(w.admissions),
            admission_p99=pct(w.admissions, 0.99) if w.admissions else 0.0,
            refused=w.refused,
            lists=len(w.lists),
            list_p99=pct(w.lists, 0.99) if w.lists else 0.0,
            records=records,
            last_seq=last_seq,
        )
        self.samples.append(s)
        _row(self.out, s)

    async def drive(self) -> None:
        """The load for ``minutes``, a row every ``period``; the first failure ends it all."""
        start = time.monotonic()
        until = start + self.options.seconds
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.churn(until))
            tg.create_task(self.flap(until))
            tg.create_task(self.poll_pod_resources(until))
            tg.create_task(self.sample_every(start, until))

    def stop(self) -> int | None:
        """SIGTERM to the plugin, then the daemon (killed after 10 s); the daemon's exit status."""
        stop(self.procs)
        return self.daemon.returncode if self.procs else None


def audit_verify(root: Path) -> tuple[int, list[str], str]:
    """``eventsrc audit verify --root-dir ROOT`` as an operator runs it: its exit status, what
    it printed, and the last line of its stderr (the first problem when there is one)."""
    proc = subprocess.run(
        [sys.executable, "-m", "eventsrc", "audit", "verify", "--root-dir", str(root)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    err = proc.stderr.strip().splitlines()
    return proc.returncode, proc.stdout.splitlines(), err[-1] if err else ""


# --------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class SoakResult:
    samples: list[Sample]
    disk: Plateau  # the live log: data.mdb and the snapshots
    rss: Plateau
    refused: int
    daemon_exit: int | None
    verify_status: int  # audit verify's exit status: 0 when the chain holds
    verify_output: list[str]
    verify_error: str  # the last line of its stderr
    retention: bool

    @property
    def failures(self) -> list[str]:
        """What went wrong, one phrase each; empty when the soak passed."""
        out = []
        if not self.disk.holds:
            off = "; retention is off" if not self.retention else ""
            out.append(f"the live log kept growing: {self.disk.describe(_mib)}{off}")
        if not self.rss.holds:
            out.append(f"the daemon's RSS kept growing: {self.rss.describe(_mib)}")
        if self.verify_status != 0:
            out.append(f"audit verify exited {self.verify_status}: {self.verify_error or 'no message'}")
        if self.refused:
            out.append(f"{self.refused} admission(s) refused although a device was always free")
        if self.daemon_exit != 0:
            out.append(f"the daemon exited with status {self.daemon_exit} on SIGTERM")
        return out


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


_COLUMNS = (
    ("elapsed s", 10),
    ("live KiB", 11),
    ("snap KiB", 10),
    ("archive KiB", 13),
    ("RSS MiB", 9),
    ("admitted", 10),
    ("p99 ms", 9),
    ("List p99 ms", 13),
    ("records", 9),
    ("last seq", 11),
)


def _header(out: TextIO) -> None:
    out.write("".join(label.rjust(width) for label, width in _COLUMNS) + "\n")
    out.flush()


def _row(out: TextIO, s: Sample) -> None:
    w = [width for _, width in _COLUMNS]
    out.write(
        f"{s.elapsed:{w[0]}.1f}{s.live_bytes / 1024:{w[1]},.0f}{s.snapshot_bytes / 1024:{w[2]},.0f}"
        f"{s.archive_bytes / 1024:{w[3]},.0f}{s.rss / 2**20:{w[4]}.1f}{s.admissions:{w[5]},}"
        f"{s.admission_p99 * 1e3:{w[6]}.2f}{s.list_p99 * 1e3:{w[7]}.2f}{s.records:{w[8]},}{s.last_seq:{w[9]},}\n"
    )
    out.flush()


def run_soak(
    options: SoakOptions, *, out: TextIO | None = None, workdir: Path | None = None, keep: bool = False
) -> SoakResult:
    """The soak, its rows and verdict printed to ``out`` (stdout); its result. Its directory
    is removed afterwards unless ``keep``, or the soak failed (what to look at then)."""
    out = out or sys.stdout
    if options.retention and not serve_has_retention():
        raise EventsrcError(
            f"this build's 'eventsrc serve' has no {RETENTION_FLAG}; give --retention-max-size 0 to soak without "
            "retention"
        )
    tmp = Path(tempfile.mkdtemp(prefix="esk-", dir=workdir or "/tmp"))
    soak = _Soak(tmp, options, out)
    result: SoakResult | None = None
    try:
        result = _run(soak)
        return result
    finally:
        soak.stop()
        if keep or result is None or result.failures:
            with contextlib.suppress(OSError):  # stdout may be what failed
                out.write(f"kept: {tmp} (the daemon's output in {soak.daemon_log})\n")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _run(soak: _Soak) -> SoakResult:
    options, out = soak.options, soak.out
    try:
        asyncio.run(soak.start())
        retention = (
            f"retention at {options.retention_max_size} ({RETENTION_FLAG}), cut at snapshots every "
            f"{options.snapshot_every:,} records"
            if options.retention
            else f"retention off (the log grows); snapshots every {options.snapshot_every:,} records"
        )
        out.write(
            f"eventsrc bench soak: {os.cpu_count()} cpus, Python {sys.version.split()[0]}; {options.minutes:g} min; "
            f"daemon and sample plugin in their own processes, {options.devices} devices; one-device pods admitted "
            f"at {options.rate:g}/s through the node API, the oldest removed once {options.resident} are resident; "
            f"{FLAPPING_DEVICE} flapping every {FLAP_PERIOD:g} s; PodResources List every {LIST_PERIOD:g} s; "
            f"{retention}; a row every {options.period:g} s; in {soak.tmp}\n\n"
        )
        _header(out)
        asyncio.run(soak.drive())
        daemon_exit = soak.stop()
        verify = audit_verify(soak.root)
    except* GRPCError as group:
        err = group.exceptions[0]
        assert isinstance(err, GRPCError)
        raise EventsrcError(f"the daemon answered {err.status.name}: {err.message}; see {soak.daemon_log}") from None
    except* (StreamTerminatedError, ConnectionError) as group:
        raise EventsrcError(f"the daemon stopped answering ({group.exceptions[0]}); see {soak.daemon_log}") from None
    except* EventsrcError as group:
        raise group.exceptions[0] from None
    samples = soak.samples
    result = SoakResult(
        samples=samples,
        disk=plateau([s.live_bytes for s in samples], *DISK_SLACK),
        rss=plateau([s.rss for s in samples], *RSS_SLACK),
        refused=sum(s.refused for s in samples),
        daemon_exit=daemon_exit,
        verify_status=verify[0],
        verify_output=verify[1],
        verify_error=verify[2],
        retention=options.retention,
    )
    _verdict(out, result)
    return result


def _verdict(out: TextIO, r: SoakResult) -> None:
    out.write(
        "\n"
        "  live          the log's data.mdb and the snapshots (what the node keeps); snap: the snapshots alone\n"
        "  archive       what retention moved out of the live log (meant to grow)\n"
        "  admitted      admissions in the interval (after a removal once the node is full); p99: their latency\n"
        "  records       records appended in the interval (Status last_seq)\n"
        "  plateau       after the first third of the rows (warm-up), the highest value over the later half of "
        "the rest may exceed the highest over the earlier half by at most "
        f"{DISK_SLACK[0]:.0%} or {DISK_SLACK[1] // 1024} KiB (live log), {RSS_SLACK[0]:.0%} or "
        f"{RSS_SLACK[1] // 2**20} MiB (RSS), whichever is more\n\n"
    )
    archived = r.samples[-1].archive_bytes if r.samples else 0
    disk_trend = trend(r.samples, lambda s: s.live_bytes) / 2**20
    rss_trend = trend(r.samples, lambda s: s.rss) / 2**20
    out.write(
        f"live log plateau   {'yes' if r.disk.holds else 'NO '}  {r.disk.describe(_mib)}; "
        f"trend after warm-up {disk_trend:+.2f} MiB/min\n"
    )
    out.write(
        f"RSS plateau        {'yes' if r.rss.holds else 'NO '}  {r.rss.describe(_mib)}; "
        f"trend after warm-up {rss_trend:+.2f} MiB/min\n"
    )
    out.write(f"archive            {_mib(archived)} at the end\n")
    out.write("audit verify\n")
    for line in r.verify_output:
        out.write(f"    {line}\n")
    failures = r.failures
    out.write(f"verdict            {'PASS' if not failures else 'FAIL: ' + '; '.join(failures)}\n")
    out.flush()
