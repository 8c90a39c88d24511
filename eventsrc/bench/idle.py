"""``eventsrc bench idle``: what a daemon with nothing to do costs.

``eventsrc serve`` runs as its own process under a temporary root, with no plugin, no
client and no NRI runtime. Once ``eventsrc status`` says it is ready (and a second more,
for the start to settle), its CPU time (every thread, read from the process's CPU clock:
exact, unlike /proc's ticks) and the wakeups of its trio thread (context switches, from
/proc) are measured over ``--seconds``, for ``--rounds`` rounds; the figures are medians,
beside the goal of under 0.5 % of a core (issue 15): nothing in an idle daemon polls (the
plugin watcher waits on inotify, docs/adr/0016), so what remains is its safety rescan.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eventsrc.bench.harness import cpu_seconds, start_daemon, stop, wait_ready
from eventsrc.errors import EventsrcError

GOAL_PERCENT = 0.5  # of one core
SETTLE_SECONDS = 1.0


def _switches(pid: int) -> int:
    """Context switches of ``pid``'s main thread (where trio runs): each is a wakeup."""
    n = 0
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        for line in f:
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                n += int(line.split()[1])
    return n


def run_idle_bench(*, seconds: float, rounds: int, beside: bool = False) -> None:
    """``beside``: the daemon runs beside a kubelet directory with no kubelet in it (its socket
    missing: the gap is recorded once, and asked about again at doubling intervals up to the
    resync, with inotify waiting for the socket to come)."""
    out = sys.stdout
    tmp = Path(tempfile.mkdtemp(prefix="esi-", dir="/tmp"))
    root, log = tmp / "r", tmp / "daemon.log"
    started: list[subprocess.Popen[bytes]] = []
    try:  # from the start: a SIGTERM as soon as the daemon is forked stops it too
        extra: list[str] = []
        if beside:
            (tmp / "kubelet").mkdir()
            extra = ["--beside-kubelet", str(tmp / "kubelet")]
        with open(log, "wb") as f:
            started.append(start_daemon(root, f, extra))
        daemon = started[0]
        asyncio.run(wait_ready(root, daemon, log, timeout=60))  # no process per look: only the daemon is a child
        what = "beside a kubelet directory with no kubelet" if beside else "with no plugin, client or runtime"
        out.write(
            f"eventsrc bench idle: {os.cpu_count()} cpus, Python {sys.version.split()[0]}; a daemon {what}, "
            f"ready; {rounds} round(s) of {seconds:g} s, medians\n\n"
        )
        time.sleep(SETTLE_SECONDS)
        cpu, wakeups = [], []
        for _ in range(rounds):
            c0, w0, t0 = cpu_seconds(daemon.pid), _switches(daemon.pid), time.monotonic()
            time.sleep(seconds)
            c1, w1, t1 = cpu_seconds(daemon.pid), _switches(daemon.pid), time.monotonic()
            if daemon.poll() is not None:
                raise EventsrcError(f"the daemon exited while measured; see {log}")
            cpu.append(100 * (c1 - c0) / (t1 - t0))
            wakeups.append((w1 - w0) / (t1 - t0))
        pct = statistics.median(cpu)
        verdict = "ok" if pct < GOAL_PERCENT else "ABOVE THE GOAL"
        out.write(
            f"  daemon CPU, every thread            {pct:8.4f} % of a core   (goal < {GOAL_PERCENT:g} %: {verdict})\n"
        )
        out.write(f"  wakeups of its trio thread          {statistics.median(wakeups):8.2f} /s\n")
    finally:
        stop(started)
        shutil.rmtree(tmp, ignore_errors=True)
