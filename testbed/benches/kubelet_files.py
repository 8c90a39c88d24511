"""A daemon beside a kubelet directory whose device checkpoint is large and never changes: its
CPU (% of a core) and RSS over a run at a short resync (issue 34: the checkpoint used to be
parsed again at every look). A developer's bench, not part of the product.

    .venv/bin/python -m testbed.benches.kubelet_files --devices 1000000 --seconds 60 --resync 5s

It writes the checkpoint with one pod holding each device (as a kubelet with that many devices
would), starts ``python -m eventsrc serve --beside-kubelet DIR`` from the current directory's
checkout, and samples /proc/PID/stat and /proc/PID/status once a second."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eventsrc.inputs import kubelet_checkpoints as ki
from testbed.servers.kubelet_checkpoints import device_checkpoint


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=1_000_000)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--resync", default="5s")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="es-kf-", dir="/tmp"))
    try:
        kubelet = work / "kubelet"
        (kubelet / "device-plugins").mkdir(parents=True)
        ids = [f"d-{i}" for i in range(args.devices)]
        entries = [
            ki.PodDevicesEntry(
                pod_uid=f"uid-{i // 8}",
                container_name="main",
                resource_name="example.com/dev",
                device_ids={0: ids[i : i + 8]},
            )
            for i in range(0, len(ids), 8)
        ]
        data = device_checkpoint(entries, {"example.com/dev": ids})
        (kubelet / "device-plugins" / ki.DEVICE_CHECKPOINT).write_bytes(data)
        cmd = [
            sys.executable,
            "-m",
            "eventsrc",
            "--root-dir",
            str(work / "root"),
            "serve",
            "--beside-kubelet",
            str(kubelet),
            "--beside-kubelet-resync",
            args.resync,
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(5)  # start-up and the first look: not in the figures
            c0, t0, peak = cpu_s(proc.pid), time.monotonic(), 0
            while time.monotonic() - t0 < args.seconds:
                time.sleep(1)
                peak = max(peak, rss_kib(proc.pid))
            used = cpu_s(proc.pid) - c0
            print(
                f"checkpoint {len(data) / 2**20:.1f} MiB ({args.devices:,} devices), resync {args.resync}, "
                f"{args.seconds:.0f} s: CPU {100 * used / args.seconds:.1f} % of a core, RSS peak {peak / 1024:.0f} MiB"
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
