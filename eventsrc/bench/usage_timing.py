"""``eventsrc bench usage``: ``audit usage`` on a year of history, beside ceilings from the same run.

Nothing here is a test: it prints numbers. The log is a year of pods (eventsrc's own and some
observed beside a kubelet) taking GPUs, NIC VFs, exclusive CPUs and DRA claim devices, written
with the log's batch append (``EventLog.commit``) as the daemon writes it: its usage keeper's
rule starts the feeder process (``eventsrc.log.usage_feeder``) every ``FEED_RECORDS`` records,
so the index is as current as a daemon keeps it (docs/adr/0040). The oldest part is then cut
into the archive by the real retention steps (``log.cut_steps``). The first query is the
command in a new process, as a user runs it; then each query is timed in process (open the
index, bring it up to date, answer, render), median of ``runs``, and once more in new
processes. Peak RSS is each process's own (``wait4``): the feeders', the queries', and a
build from scratch (the index deleted, as on a daemon's first start beside a log an older
eventsrc wrote). The ceilings: reading the index's group keys alone, the same answer from a
scan of every record (``--scan``), and the RSS of an interpreter that imports the command
and does nothing.
"""

from __future__ import annotations

import heapq
import io
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import lmdb

from eventsrc import events as ev
from eventsrc.core.chargeback import Window, window
from eventsrc.layout import Layout
from eventsrc.log import cut_steps as steps
from eventsrc.log import usage_feeder
from eventsrc.log.history import History
from eventsrc.log.store import EventLog, PendingAppend
from eventsrc.log.usage_index import UsageIndex, kept
from eventsrc.node.usage_keeper import FEED_RECORDS
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
GOAL_RSS_MB = 100.0


def pods(
    seed: int, start_ns: int, gap_s: float, prefix: str = "", gpu_prefix: str = ""
) -> Iterator[tuple[int, list[ev.EventBase]]]:
    """(time, events at that time), in time order, for ever: pods arrive about every ``gap_s``
    seconds and hold what they took for 10 minutes to 12 hours. Deterministic. ``prefix`` starts
    the pods' uids and names (one per node of a fleet: a pod's uid is the fleet's only one);
    ``gpu_prefix`` the GPUs' ids (one per node: a GPU's UUID is the fleet's only one; its NIC's
    VFs are named alike on every node, as PCI addresses are)."""
    rnd = random.Random(seed)
    free_gpus = [f"{gpu_prefix}gpu-{i}" for i in range(64)]
    free_vfs = [f"vf-{i}" for i in range(256)]
    free_cpus = list(range(4, 256))
    pending: list[tuple[int, int, list[ev.EventBase], list[Any]]] = []  # (end, n, releases, what returns)
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


def _own(
    ref: ev.PodRef, gpus: list[str], vf: list[str], cpus: list[int]
) -> tuple[list[ev.EventBase], list[ev.EventBase]]:
    uid = ref.uid
    now: list[ev.EventBase] = [ev.PodAdmissionStarted(pod=ref)]
    later: list[ev.EventBase] = []
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
) -> tuple[list[ev.EventBase], list[ev.EventBase]]:
    seen = ev.PodRef(uid="", namespace=ref.namespace, name=ref.name)
    now: list[ev.EventBase] = [ev.KubeletPodObserved(pod=seen)]
    if vf:
        now.append(ev.KubeletDevicesObserved(pod=seen, container="main", resource=NIC, device_ids=vf))
    if cpus:
        now.append(ev.KubeletCPUsObserved(pod=seen, container="main", cpus=cpus))
    if gpus:
        claim = ev.ClaimRef(uid=f"claim-{n}", namespace=ref.namespace, name=f"gpus-{n}")
        devices = [ev.ObservedClaimDevice(driver=DRIVER, pool="node-a", device=g) for g in gpus]
        now.append(ev.KubeletClaimObserved(pod=seen, container="main", claim=claim, devices=devices))
    return now, [ev.KubeletPodReleased(pod=seen, reason="gone")]


@dataclass
class Run:
    """A process run to its end: wall seconds and peak RSS (its own, from ``wait4``)."""

    seconds: float
    rss_mb: float
    out: bytes = b""


#: Runs a command and writes its peak RSS (kB) and exit status to a file. The bench's own
#: process is large, and a child's ``ru_maxrss`` counts the pages it shared with the parent
#: that forked it until its exec: so the command is started from this small interpreter.
_PROBE = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{usage.ru_maxrss} {os.waitstatus_to_exitcode(status)}")
"""


def run_process(argv: list[str]) -> Run:
    """Run ``argv`` to its end, with its own peak RSS (``_PROBE``); raises RuntimeError when it
    fails."""
    with tempfile.NamedTemporaryFile() as said, tempfile.NamedTemporaryFile(mode="r") as probed:
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", _PROBE, probed.name, *argv],
            stdin=subprocess.DEVNULL,
            stdout=said,
            stderr=subprocess.STDOUT,
            check=True,
        )
        seconds = time.perf_counter() - t
        rss_kb, status = (int(x) for x in probed.read().split())
        said.seek(0)
        out = said.read()
    if status:
        raise RuntimeError(f"{' '.join(argv[1:4])} failed ({status}): {out.decode(errors='replace')[-500:]}")
    return Run(seconds, rss_kb / 1024, out)


def build(path: Path, records: int, seed: int = 1, feed: Callable[[], None] | None = None) -> tuple[EventLog, int]:
    """A log of at least ``records`` records spanning about a year; its last record's time.
    ``feed`` is called each time the usage keeper would start its feeder (every
    ``FEED_RECORDS`` records, as the daemon's ``UsageKeeper.maybe_due``)."""
    # how many records a pod makes: pods then arrive so that ``records`` span a year
    sample, arrived = 0, 0
    for _, events in pods(seed, T0, YEAR / SEC * 6 / records):
        sample += len(events)
        arrived += isinstance(events[0], (ev.PodAdmissionStarted, ev.KubeletPodObserved))
        if sample >= min(records, 20_000):
            break
    log = EventLog(path)
    batch: list[PendingAppend] = []
    done, last, fed = 0, T0, 0
    for t, events in pods(seed, T0, YEAR / SEC * (sample / arrived) / records):
        if done >= records:
            break
        last = t
        batch.append(PendingAppend(events, "bench", t))
        done += len(events)
        if len(batch) >= 200:  # the committer's batches are smaller still: a feed is due within one
            log.commit(batch)
            batch = []
            if feed is not None and log.last_seq() - fed >= FEED_RECORDS:
                fed = log.last_seq()
                feed()
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
            f"every in-process query figure is the median of {runs} runs; peak RSS is each process's own\n\n"
        )
        feeder = usage_feeder.argv(layout.log, layout.archive, layout.usage)
        feeds: list[Run] = []
        t = time.perf_counter()
        log, last_ns = build(layout.log, records, feed=lambda: feeds.append(run_process(feeder)))
        n = log.last_seq()
        out.write(
            f"log: {n:,} records from {iso(T0)} to {iso(last_ns)}, written in {time.perf_counter() - t:.1f} s "
            f"({(layout.log / 'data.mdb').stat().st_size / 1e6:,.0f} MB) as the daemon writes it: "
            f"its feeder run every {FEED_RECORDS:,} records\n"
        )
        if feeds:
            out.write(
                f"  feeder: {len(feeds)} runs, median {statistics.median(f.seconds for f in feeds):.2f} s "
                f"(interpreter start included), peak RSS {_rss(max(f.rss_mb for f in feeds))}\n"
            )
        out.flush()
        t = time.perf_counter()
        segments = _cut(log, layout.archive, n // 2)
        took = time.perf_counter() - t
        out.write(f"retention: records 1..{n // 2:,} cut into {segments} archive segments in {took:.1f} s\n\n")
        out.flush()
        history = History(log, layout.archive)
        now = last_ns + SEC
        month = window(last_ns - 60 * DAY, last_ns - 30 * DAY, now)
        year = window(None, None, now)
        with UsageIndex(layout.usage) as index:
            behind = n - index.fed_seq()
        first = _command(layout.root, "namespace", month)
        out.write(
            f"first query, the index as the daemon left it ({behind:,} records behind): audit usage --by namespace, "
            f"a month, new process: {first.seconds * 1000:.1f} ms {_verdict(first.seconds)}, "
            f"peak RSS {_rss(first.rss_mb)}\n\n"
        )
        out.flush()
        _queries(history, layout, month, year, runs, out)
        _new_processes(layout.root, month, year, out)
        _from_scratch(layout, feeder, out)
        _ceilings(history, layout, month, year, runs, out)
        log.close()


def _verdict(seconds: float) -> str:
    return f"(goal < {GOAL_S:g} s: {'ok' if seconds < GOAL_S else 'ABOVE GOAL'})"


def _rss(mb: float) -> str:
    return f"{mb:.1f} MB (goal < {GOAL_RSS_MB:g} MB: {'ok' if mb < GOAL_RSS_MB else 'ABOVE GOAL'})"


def _command(root: Path, by: str, w: Window) -> Run:
    """``eventsrc audit usage`` in a new process, as a user runs it."""
    cmd = [sys.executable, "-m", "eventsrc", "--root-dir", str(root), "audit", "usage", "--by", by, "-o", "json"]
    return run_process(cmd + ["--since", iso(w.since_ns), "--until", iso(w.until_ns)])


def _query(history: History, layout: Layout, by: str, w: Window) -> Callable[[], Any]:
    def run() -> None:
        rows, _ = answer(kept(history), layout.usage, by, w, frozenset())
        render(rows, by, w, "json", io.StringIO())

    return run


def _queries(history: History, layout: Layout, month: Window, year: Window, runs: int, out: TextIO) -> None:
    out.write("audit usage, in process (open the index, bring it up to date, answer, JSON to a buffer)\n")
    for label, by, w in _asked(month, year):
        rows, _ = answer(kept(history), layout.usage, by, w, frozenset())
        med = timed(_query(history, layout, by, w), runs)
        out.write(f"  {label:<34} {len(rows):>6} rows  median {med * 1000:9.1f} ms  {_verdict(med)}\n")
        out.flush()


def _asked(month: Window, year: Window) -> list[tuple[str, str, Window]]:
    return [
        ("--by namespace, a month", "namespace", month),
        ("--by namespace, the whole year", "namespace", year),
        ("--by device, the whole year", "device", year),
        ("--by resource, the whole year", "resource", year),
        ("--by pod, a month", "pod", month),
    ]


def _new_processes(root: Path, month: Window, year: Window, out: TextIO) -> None:
    """The whole command in a fresh interpreter (its start and imports included), 3 runs each."""
    out.write("audit usage, new processes (median of 3 runs; interpreter start included; the highest peak RSS)\n")
    for label, by, w in _asked(month, year):
        got = [_command(root, by, w) for _ in range(3)]
        med = statistics.median(g.seconds for g in got)
        out.write(
            f"  {label:<34} median {med * 1000:9.1f} ms {_verdict(med)}  peak RSS {_rss(max(g.rss_mb for g in got))}\n"
        )
        out.flush()


def _from_scratch(layout: Layout, feeder: list[str], out: TextIO) -> None:
    """The index deleted and built again by the feeder: a daemon's first start beside a year
    of history an older eventsrc wrote (or a deleted index)."""
    shutil.rmtree(layout.usage)
    done = run_process(feeder)
    size = sum(f.stat().st_size for f in layout.usage.iterdir()) / 1e6
    out.write(
        f"usage index built from scratch by the feeder (archive included): {done.seconds:.1f} s, {size:,.0f} MB, "
        f"peak RSS {_rss(done.rss_mb)}\n"
    )
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
    bare = run_process([sys.executable, "-c", "import eventsrc.cli.main, eventsrc.offline.usage"])
    out.write(f"  an interpreter that imports the command and does nothing: peak RSS {bare.rss_mb:.1f} MB\n")
    out.flush()
