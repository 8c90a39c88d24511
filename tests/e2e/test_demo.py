"""The demo (`make run` -> scripts/run.sh) tells its whole story on a fresh root and exits 0."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]  # the demo itself is bounded at 300 s


def test_the_demo_runs_the_whole_story(root: Path) -> None:
    env = {**os.environ, "ROOT_DIR": str(root), "EVENTSRC": str(Path(sys.executable).parent / "eventsrc")}
    env.pop("KEEP_RUNNING", None)
    env.pop("RUN_SECONDS", None)
    proc = subprocess.run(
        [str(REPO / "scripts" / "run.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # A Guaranteed pod's CPUs, device and memory on one NUMA node (examples/topology-2numa.json:
    # CPUs 0-3 on node 0; the sample plugin's dev-i on node i*2//9).
    aligned = out[out.index("$ eventsrc admit -f examples/aligned.yaml") :]
    cpus = re.search(r"^ +cpus: (\d+)-(\d+) \(exclusive\)$", aligned, re.M)
    device = re.search(r"^ +example.com/dev: dev-(\d+)$", aligned, re.M)
    memory = re.search(r"^ +memory: 1Gi on NUMA node (\d)$", aligned, re.M)
    assert cpus and device and memory, aligned[:800]
    nodes = {int(cpus[1]) // 4, int(cpus[2]) // 4, int(device[1]) * 2 // 9, int(memory[1])}
    assert len(nodes) == 1, aligned[:800]
    # The refusal, with the kubelet's reason.
    assert "requested number of devices unavailable for example.com/dev. Requested: 4, Available: 2" in out
    # The claim prepared by the sample DRA driver.
    assert "claims (cdi): gpu.example.com/device=inference-gpu-0" in out
    # The SIGKILL and the restart; the pods kept their devices.
    assert re.search(r"^\$ kill -9 \d+$", out, re.M)
    assert len(re.findall(r"^eventsrc is running and ready on ", out, re.M)) == 2
    pods = out[out.index("$ eventsrc pods") : out.index("$ eventsrc audit")]
    assert (
        "ml/train" in pods and "default/greedy" in pods and "default/inference" in pods and "default/web " not in pods
    )
    # The audit of a device that moved from web to greedy.
    audit = re.search(r"^\$ eventsrc audit device example.com/dev (dev-\d+)$", out, re.M)
    assert audit, out
    trail = out[audit.end() :]
    assert "holders (2)" in trail
    assert re.search(r"default/web .* DevicesReleased: pod removed", trail)
    assert re.search(r"default/greedy .* still held", trail)
    # The replay of what just happened, one event a line, ending with the restart.
    steps = out[out.index("$ eventsrc replay --step") :]
    assert re.search(r"DevicesReleased +.*allocated to default/web/nginx -> free", steps)
    assert re.search(r"DevicesAllocated +.*-> allocated to default/greedy/main", steps)
    assert re.search(r"DaemonStarted +daemon: running .* -> running", steps)  # the previous run never stopped
    assert re.search(r"PluginDisconnected +.*\(the daemon restarted\)", steps)
    assert "DaemonStopped" in out.splitlines()[-2]  # then a clean stop
