"""``eventsrc bench usage``: ``audit usage`` on a year of history, beside ceilings from the same run.

Nothing here is a test: it prints numbers. The log is a year of pods (eventsrc's own and some
observed beside a kubelet) taking GPUs, NIC VFs, exclusive CPUs and DRA claim devices, written
with the log's batch append (``EventLog.commit``); the oldest part is cut into the archive by
the real retention steps (``log.cut_steps``). Then the usage index is built (its first use),
and each query is timed as the command runs it (open the index, bring it up to date, answer,
render), median of ``runs``. The ceilings: reading the index's group keys alone, and the same
answer from a scan of every record (``--scan``).
"""

from __future__ import annotations

import heapq
import io
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import lmdb

from eventsrc import events as ev
from eventsrc.core.chargeback import Window, window
from eventsrc.layout import Layout
from eventsrc.log import cut_steps as steps
from eventsrc.log.history import History
from eventsrc.log.store import EventLog, PendingAppend
from eventsrc.log.usage_index import UsageIndex
from eventsrc.offline.audit_queries import iso
from eventsrc.offline.usage import answer, render, scan_totals

GPU = "example.com/gpu"
NIC = "example.com/nic"
DRIVER = "gpu.dra.example.com"
SEC = 1_000_000_000
DAY = 86_400 * SEC
YEAR = 365 * DAY
T0 = 1_767_225_600 * SEC  # 2026-01-01T00:00:00Z
NAMESPACES = [f"team-{i:02d}" for i in range(20)]
GOAL_S = 1.0


def pods(seed: int, start_ns: int, gap_s: float, prefix: str = "") -> Iterator[tuple[int, list[ev._Event]]]:
    """(time, events at that time), in time order, for ever: pods arrive about every ``gap_s``
    seconds and hold what they took for 10 minutes to 12 hours. Deterministic. ``prefix`` starts
    the pods' uids and names (one per node of a fleet: a pod's uid is the fleet's only one)."""
    rnd = random.Random(seed)
    free_gpus = [f"gpu-{i}" for i in range(64)]
    free_vfs = [f"vf-{i}" for i in range(256)]
    free_cpus = list(range(4, 256))
    pending: list[tuple[int, int, list[ev._Event], list[Any]]] = []  # (end, n, releases, what returns)
    t, n = start_ns, 0
    while True:
        t += int(rnd.expovariate(1 / gap_s) * SEC) + 1
        while pending and pending[0][0] <= t:
            end, _, releases, back = heapq.heappop(pending)
            for pool, item in back:
                pool.append(item)
            yield end, releases
        n += 1
        ns = rnd.choice(NAMESPACES)
        ref = ev.PodRef(uid=f"uid-{prefix}{n:08d}", namespace=ns, name=f"job-{prefix}{n}")
        gpus = [free_gpus.pop() for _ in range(min(len(free_gpus), rnd.choice((0, 1, 1, 2))))]
        vf = [free_vfs.pop()] if free_vfs else []
        cpus = [free_cpus.pop() for _ in range(min(len(free_cpus), rnd.choice((0, 2, 4))))]
        back = [(free_gpus, g) for g in gpus] + [(free_vfs, v) for v in vf] + [(free_cpus, c) for c in cpus]
        end = t + int(rnd.uniform(600, 12 * 3600) * SEC)
        if n % 5:
            now, later = _own(ref, gpus, vf, cpus)
        else:
            now, later = _observed(ref, gpus, vf, cpus, f"{prefix}{n}")
        heapq.heappush(pending, (end, n, later, back))
        yield t, now


def _own(ref: ev.PodRef, gpus: list[str], vf: list[str], cpus: list[int]) -> tuple[list[ev._Event], list[ev._Event]]:
    uid = ref.uid
    now: list[ev._Event] = [ev.PodAdmissionStarted(pod=ref)]
    later: list[ev._Event] = []
    for resource, ids in ((GPU, gpus), (NIC, vf)):
        if ids:
            now.append(ev.DevicesAllocated(pod_uid=uid, container="main", resource=resource, device_ids=ids))
            later.append(ev.DevicesReleased(pod_uid=uid, container="main", resource=resource, device_ids=ids))
    if cpus:
        now.append(ev.CPUsAssigned(pod_uid=uid, container="main", cpus=cpus))
        later.append(ev.CPUsReleased(pod_uid=uid, container="main", cpus=cpus))
    now.append(ev.PodAdmitted(pod=ref))
    later.append(ev.PodRemoved(pod_uid=uid, reason="deleted"))
    return now, later


def _observed(
    ref: ev.PodRef, gpus: list[str], vf: list[str], cpus: list[int], n: str
) -> tuple[list[ev._Event], list[ev._Event]]:
    seen = ev.PodRef(uid="", namespace=ref.namespace, name=ref.name)
    now: list[ev._Event] = [ev.KubeletPodObserved(pod=seen)]
    if vf:
        now.append(ev.KubeletDevicesObserved(pod=seen, container="main", resource=NIC, device_ids=vf))
    if cpus:
        now.append(ev.KubeletCPUsObserved(pod=seen, container="main", cpus=cpus))
    if gpus:
        claim = ev.ClaimRef(uid=f"claim-{n}", namespace=ref.namespace, name=f"gpus-{n}")
        devices = [ev.ObservedClaimDevice(driver=DRIVER, pool="node-a", device=g) for g in gpus]
        now.append(ev.KubeletClaimObserved(pod=seen, container="main", claim=claim, devices=devices))
    return now, [ev.KubeletPodReleased(pod=seen, reason="gone")]


def build(path: Path, records: int, seed: int = 1) -> tuple[EventLog, int]:
    """A log of at least ``records`` records spanning about a year; its last record's time."""
    # how many records a pod makes: pods then arrive so that ``records`` span a year
    sample, arrived = 0, 0
    for _, events in pods(seed, T0, YEAR / SEC * 6 / records):
        sample += len(events)
        arrived += isinstance(events[0], (ev.PodAdmissionStarted, ev.KubeletPodObserved))
        if sample >= min(records, 20_000):
            break
    log = EventLog(path)
    batch: list[PendingAppend] = []
    done, last = 0, T0
    for t, events in pods(seed, T0, YEAR / SEC * (sample / arrived) / records):
        if done >= records:
            break
        last = t
        batch.append(PendingAppend(events, "bench", t))
        done += len(events)
        if len(batch) >= 2000:
            log.commit(batch)
            batch = []
    if batch:
        log.commit(batch)
    return log, last


def _cut(log: EventLog, archive: Path, upto: int, piece: int = 100_000) -> int:
    """Cut the log into the archive up to record ``upto`` through the real retention steps,
    a piece at a time (as the daemon does); the segments written."""
    n = 0
    while log.first_seq() <= upto:
        seq = min(upto, log.first_seq() + piece - 1)
        steps.commit(log, steps.prepare(log, archive, seq))
        while steps.delete_some(log, 4096)[0]:
            pass
        n += 1
    return n


def timed(fn: Callable[[], Any], runs: int) -> float:
    """Median seconds of ``runs`` calls (no warm-up: the first is as a new command's)."""
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _key_read(path: Path) -> None:
    """Ceiling: every key of the index's group table, read raw (what any answer reads at least)."""
    env = lmdb.open(str(path), max_dbs=4, readonly=True, lock=False)
    try:
        db = env.open_db(b"groups", create=False)
        with env.begin(db=db, buffers=True) as txn:
            for _ in txn.cursor().iternext(keys=True, values=False):
                pass
    finally:
        env.close()


def run_usage_bench(*, records: int, runs: int, workdir: Path | None = None, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    with tempfile.TemporaryDirectory(prefix="eventsrc-bench-usage-", dir=workdir) as tmp:
        layout = Layout(Path(tmp) / "root")
        layout.root.mkdir()
        layout.state.mkdir()
        out.write(
            f"eventsrc bench usage: {os.cpu_count()} cpus, Python {platform.python_version()}, in {layout.root}\n"
            f"every query figure is the median of {runs} runs\n\n"
        )
        t = time.perf_counter()
        log, last_ns = build(layout.log, records)
        n = log.last_seq()
        out.write(
            f"log: {n:,} records from {iso(T0)} to {iso(last_ns)}, written in {time.perf_counter() - t:.1f} s "
            f"({(layout.log / 'data.mdb').stat().st_size / 1e6:,.0f} MB)\n"
        )
        out.flush()
        t = time.perf_counter()
        segments = _cut(log, layout.archive, n // 2)
        took = time.perf_counter() - t
        out.write(f"retention: records 1..{n // 2:,} cut into {segments} archive segments in {took:.1f} s\n")
        out.flush()
        history = History(log, layout.archive)
        now = last_ns + SEC
        month = window(last_ns - 60 * DAY, last_ns - 30 * DAY, now)
        year = window(None, None, now)
        t = time.perf_counter()
        with UsageIndex(layout.usage) as index:
            update = index.catch_up(history)
        took = time.perf_counter() - t
        size = sum(f.stat().st_size for f in layout.usage.iterdir()) / 1e6
        out.write(
            f"usage index: built from {update.records:,} records (archive included) in {took:.1f} s, {size:,.0f} MB\n\n"
        )
        out.flush()
        _queries(history, layout, month, year, runs, out)
        _ceilings(history, layout, month, year, runs, out)
        _new_process(layout.root, month, out)
        log.close()


def _query(history: History, layout: Layout, by: str, w: Window) -> Callable[[], Any]:
    def run() -> None:
        rows, _ = answer(history, layout.usage, by, w, frozenset())
        render(rows, by, w, "json", io.StringIO())

    return run


def _queries(history: History, layout: Layout, month: Window, year: Window, runs: int, out: TextIO) -> None:
    out.write("audit usage, in process (open the index, bring it up to date, answer, JSON to a buffer)\n")
    for label, by, w in (
        ("--by namespace, a month", "namespace", month),
        ("--by namespace, the whole year", "namespace", year),
        ("--by device, the whole year", "device", year),
        ("--by resource, the whole year", "resource", year),
        ("--by pod, a month", "pod", month),
    ):
        rows, _ = answer(history, layout.usage, by, w, frozenset())
        med = timed(_query(history, layout, by, w), runs)
        verdict = "ok" if med < GOAL_S else "ABOVE GOAL"
        out.write(f"  {label:<34} {len(rows):>6} rows  median {med * 1000:9.1f} ms  (goal < 1 s: {verdict})\n")
        out.flush()


def _ceilings(history: History, layout: Layout, month: Window, year: Window, runs: int, out: TextIO) -> None:
    out.write("ceilings (same run)\n")
    med = timed(lambda: _key_read(layout.usage), runs)
    out.write(f"  read the index's group keys alone       median {med * 1000:9.1f} ms\n")
    t = time.perf_counter()
    rows, _ = scan_totals(history, "namespace", year, frozenset())
    with UsageIndex(layout.usage) as index:
        same = rows == index.totals("namespace", year)
    out.write(
        f"  --scan (every record, archive included), --by namespace, the whole year: "
        f"{time.perf_counter() - t:.1f} s (1 run; the same answer as the index: {'yes' if same else 'NO'})\n"
    )
    out.flush()


def _new_process(root: Path, month: Window, out: TextIO) -> None:
    """For scale: the whole command in a fresh interpreter (its start and imports included)."""
    cmd = [sys.executable, "-m", "eventsrc", "--root-dir", str(root), "audit", "usage", "-o", "json"]
    cmd += ["--since", iso(month.since_ns), "--until", iso(month.until_ns)]
    walls = []
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        walls.append(time.perf_counter() - t)
    out.write(
        f"  eventsrc audit usage --by namespace, a month (new process)  median "
        f"{statistics.median(walls) * 1000:9.1f} ms (3 runs; interpreter start included)\n"
    )
