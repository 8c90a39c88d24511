"""``eventsrc bench audit``: audit query times on a large log, next to raw ceilings.

Nothing here is a test: it prints numbers. The log is built with ``eventsrc bench log``'s
workload through ``EventLog.commit``, so its index is written as the daemon writes it.
Each figure is the median and p99 of ``runs`` timed calls; the ceilings (one LMDB point
lookup, a raw range read of the same index prefix) are measured in the same run.
"""

from __future__ import annotations

import io
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from argparse import Namespace
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any, TextIO

import lmdb

from eventsrc.bench.log import NIC, build_log
from eventsrc.layout import Layout
from eventsrc.log.index import device_prefix, pod_prefix
from eventsrc.log.store import EventLog, seq_key
from eventsrc.offline import audit_queries, audit_render

GOAL_S = 0.100


def timed(fn: Callable[[], Any], runs: int) -> tuple[float, float]:
    """(median, p99) seconds of ``runs`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))]


def _ms(x: float) -> str:
    return f"{x * 1000:9.3f} ms"


def run_audit_bench(*, events: int, runs: int, workdir: Path | None = None) -> None:
    out = sys.stdout
    with tempfile.TemporaryDirectory(prefix="eventsrc-bench-audit-", dir=workdir) as tmp:
        root = Path(tmp) / "root"
        d = Layout(root).log
        v = lmdb.version()
        out.write(
            f"eventsrc bench audit: {os.cpu_count()} cpus, Python {platform.python_version()}, "
            f"lmdb {v[0]}.{v[1]}.{v[2]}, in {d}\n"
            f"every figure is the median and p99 of {runs} runs\n\n"
        )
        _build(d, events, out)
        device = "vf-0"  # the workload's NIC VFs go round: each is held by 1/64 of the pods
        pod_i = events // 30  # well inside the log: admitted, then released and removed
        pod = f"pod-{pod_i:08d}"
        log = EventLog(d, readonly=True)
        try:
            dev_seqs = log.index_seqs(device_prefix(NIC, device))
            pod_seqs = log.index_seqs(pod_prefix(pod))
            timeline = audit_queries.device_timeline(log, NIC, device)
            audit_queries.pod_history(log, pod)  # warm and check it answers
            out.write(
                f"device {NIC} {device}: {len(dev_seqs):,} indexed records, {len(timeline.holders):,} holders; "
                f"pod {pod} (default/job-{pod_i}): {len(pod_seqs)} indexed records\n\n"
            )
            _ceilings(log, events, device, dev_seqs, runs, out)
            _queries(log, device, pod_i, runs, out)
        finally:
            log.close()
        _whole_command(d, device, pod, runs, out)
        _new_process(root, device, pod, out)


def _build(d: Path, events: int, out: TextIO) -> None:
    """Write the 'bench log' workload's log of ``events`` events (with its index) into ``d``."""
    t0 = time.perf_counter()

    def progress(done: int) -> None:
        if sys.stderr.isatty():
            sys.stderr.write(f"\r  building log: {done:,}/{events:,}")
            sys.stderr.flush()

    writer = build_log(d, events, progress)
    if sys.stderr.isatty():
        sys.stderr.write("\r" + " " * 60 + "\r")
    size = writer.disk_bytes()
    writer.close()
    out.write(
        f"log: {events:,} events, built (with its index) in {time.perf_counter() - t0:.1f} s, "
        f"{size / 1e6:,.0f} MB on disk\n"
    )


def _ceilings(log: EventLog, events: int, device: str, dev_seqs: list[int], runs: int, out: TextIO) -> None:
    """What raw LMDB does in the same run: a point lookup, the device's index range, its records."""
    index_db = log.env.open_db(b"index", create=False)
    mid = seq_key(events // 2)
    prefix = device_prefix(NIC, device)

    def point_lookup() -> None:
        with log.env.begin(db=log.events_db) as txn:
            txn.get(mid)

    def raw_range() -> None:
        n = 0
        with log.env.begin(db=index_db, buffers=True) as txn:
            cur = txn.cursor()
            if cur.set_range(prefix):
                for k in cur.iternext(keys=True, values=False):
                    if bytes(k[: len(prefix)]) != prefix:
                        break
                    n += 1

    out.write("ceilings (raw LMDB, same run)\n")
    med, p99 = timed(point_lookup, runs)
    out.write(f"  one point lookup (events db)            median {_ms(med)}  p99 {_ms(p99)}\n")
    med, p99 = timed(raw_range, runs)
    out.write(f"  raw index range read, {len(dev_seqs):,} keys         median {_ms(med)}  p99 {_ms(p99)}\n")
    med, p99 = timed(lambda: log.read_many(dev_seqs), runs)
    out.write(f"  read + decode those {len(dev_seqs):,} records       median {_ms(med)}  p99 {_ms(p99)}\n")
    out.flush()


def _queries(log: EventLog, device: str, pod_i: int, runs: int, out: TextIO) -> None:
    """The audit queries in process, on the open log, against the goal."""
    pod = f"pod-{pod_i:08d}"
    out.write("audit queries (in process, log open)\n")
    rows: list[tuple[str, Callable[[], Any]]] = [
        (f"audit device {NIC} {device}", lambda: audit_queries.device_timeline(log, NIC, device)),
        (f"audit pod {pod}", lambda: audit_queries.pod_history(log, pod)),
        (f"audit pod default/job-{pod_i}", lambda: audit_queries.pod_history(log, f"default/job-{pod_i}")),
    ]
    for name, fn in rows:
        med, p99 = timed(fn, runs)
        verdict = "ok" if p99 < GOAL_S else ("p99 ABOVE GOAL" if med < GOAL_S else "ABOVE GOAL")
        out.write(f"  {name:<40} median {_ms(med)}  p99 {_ms(p99)}  (goal < 100 ms: {verdict})\n")
    out.flush()


def _whole_command(d: Path, device: str, pod: str, runs: int, out: TextIO) -> None:
    """The command's work in process: open read-only, query, JSON to a buffer."""
    out.write("whole command, in process (open read-only + query + JSON to a buffer)\n")
    for argv in (
        Namespace(audit="device", resource=NIC, device_id=device, since=None, until=None, output="json"),
        Namespace(audit="pod", pod=pod, output="json"),
    ):

        def command(argv: Namespace = argv) -> None:
            with EventLog(d, readonly=True) as reader, redirect_stdout(io.TextIOWrapper(io.BytesIO())):
                audit_render.run(argv, reader)

        med, p99 = timed(command, runs)
        label = f"audit {argv.audit} (-o json)"
        out.write(f"  {label:<40} median {_ms(med)}  p99 {_ms(p99)}\n")
    out.flush()


def _new_process(root: Path, device: str, pod: str, out: TextIO) -> None:
    """For scale: the whole command in a fresh interpreter, where Python's start and imports dominate."""
    cli = [sys.executable, "-m", "eventsrc", "--root-dir", str(root), "audit"]
    for what in (["device", NIC, device], ["pod", pod]):
        walls = []
        for _ in range(5):
            t = time.perf_counter()
            subprocess.run([*cli, *what, "-o", "json"], capture_output=True, check=True)
            walls.append(time.perf_counter() - t)
        label = f"eventsrc audit {what[0]} (new process)"
        out.write(f"  {label:<40} median {_ms(statistics.median(walls))}  (5 runs; interpreter start included)\n")
    t_start = statistics.median(_startup() for _ in range(5))
    out.write(f"  {'python -m eventsrc --version':<40} median {_ms(t_start)}  (interpreter start and imports alone)\n")


def _startup() -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "eventsrc", "--version"], capture_output=True, check=True)
    return time.perf_counter() - t
