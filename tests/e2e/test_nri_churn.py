"""A churn of pod sandboxes through a real containerd while containerd restarts and eventsrc is
SIGKILLed at random moments, in both NRI modes; once every sandbox is removed, nothing is held,
and the runtime, the cgroups, PodResources, the node API and the log's views agree. ``audit
verify`` and ``replay --check`` hold on the log it leaves. What a kill took (the observations
not yet written: docs/adr/0042) is recorded again from the next Synchronize, behind the gap
each start after a kill records.

Sizes (defaults in brackets): EVENTSRC_NRI_CHURN_SANDBOXES [20; CI 100] sandboxes,
EVENTSRC_NRI_CHURN_RESTARTS [2; CI 5] containerd restarts, EVENTSRC_NRI_CHURN_KILLS [3; CI 10] eventsrc
SIGKILLs, spread evenly over the churn; EVENTSRC_NRI_CHURN_SEED picks the pods' shapes and the
kill moments (printed, to run one again).
"""

from __future__ import annotations

import json
import os
import random
import threading
from pathlib import Path

import grpc
import pytest

from tests.conftest import Daemon, env_rounds, run_cli
from tests.e2e.test_nri_containerd import (
    ANNOTATION,
    MEM,
    RESOURCE,
    STATIC,
    Plugin,
    devices,
    pod_resources,
    pods,
    state,
    synced,
)
from tests.support.containerd import Containerd
from tests.support.eventually import eventually

SANDBOXES = env_rounds("EVENTSRC_NRI_CHURN_SANDBOXES", 20)
RESTARTS = env_rounds("EVENTSRC_NRI_CHURN_RESTARTS", 2)
KILLS = env_rounds("EVENTSRC_NRI_CHURN_KILLS", 3)
SEED = int(os.environ.get("EVENTSRC_NRI_CHURN_SEED", random.randrange(1 << 30)))
LIVE = 3  # sandboxes kept at once (4 devices, one exclusive CPU: some creations are refused)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300 + 2 * SANDBOXES + 20 * (RESTARTS + KILLS)),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs: one exclusive, one shared"),
]


def spread(count: int, over: int) -> set[int]:
    """``count`` steps of ``range(over)``, evenly apart (none at the first step)."""
    return {over * (k + 1) // (count + 1) for k in range(count)}


def shape(i: int, rng: random.Random) -> tuple[int, int, dict[str, str] | None]:
    """(milli-CPUs, memory limit, annotations) of sandbox ``i``: Guaranteed with a whole CPU,
    with or without a device, Burstable with a device, or Burstable alone."""
    device = {ANNOTATION: json.dumps({"app": {RESOURCE: 1}})}
    return rng.choice([(1000, MEM, None), (1000, MEM, device), (200, 0, device), (100, 0, None)])


def nothing_held(root: Path, rt: Containerd) -> str:
    """What is still held or listed anywhere ("" once nothing is)."""
    views = state(root)
    problems = []
    if rt.list_pods() or rt.list_containers():
        problems.append(f"containerd lists {len(rt.list_pods())} sandboxes, {len(rt.list_containers())} containers")
    if listed := pods(root):
        problems.append(f"the node API lists pods {sorted(listed)}")
    if listed_pr := [p.name for p in pod_resources(root)]:
        problems.append(f"PodResources lists {listed_pr}")
    if devices(root, free=True) != 4:
        problems.append(f"{devices(root, free=True)} of 4 devices free")
    if views["cpus"]["assignments"] or views["cpus"]["shared"] != [0, 1]:
        problems.append(f"CPUs: assigned {views['cpus']['assignments']}, shared pool {views['cpus']['shared']}")
    if views["runtime"]["sandboxes"] or views["runtime"]["containers"]:
        problems.append(f"the log's runtime view holds {views['runtime']}")
    if busy := [str(d) for d in rt.cgroup_dirs() if (d / "cgroup.procs").read_text().split()]:
        problems.append(f"processes left in cgroups {busy}")
    return "; ".join(problems)


@pytest.mark.parametrize("mode", ["enforce", "observe"])
def test_a_churn_with_containerd_restarts_and_eventsrc_kills_leaves_nothing_held(
    root: Path, tmp_path: Path, containerd_runtime: Containerd, daemon_factory: type[Daemon], mode: str
) -> None:
    print(f"EVENTSRC_NRI_CHURN_SEED={SEED}")
    rng = random.Random(SEED)
    rt = containerd_runtime
    flags = (
        *STATIC,
        "--nri-mode",
        mode,
        "--nri-socket",
        str(rt.nri_socket),
        "--container-runtime-endpoint",
        f"unix://{rt.address}",
        "--nri-annotation-namespaces",
        "default",
    )
    daemon = daemon_factory(*flags)
    synced(daemon, 1)
    plugin = Plugin(root, rt.cdi_dir, tmp_path / "plugin.log")
    restarts, kills = spread(RESTARTS, SANDBOXES), spread(KILLS, SANDBOXES)
    live: list[str] = []
    outcomes = {"running": 0, "refused": 0}

    def step(i: int) -> None:
        millis, memory, annotations = shape(i, rng)
        pod = rt.run_pod(f"churn-{i}", f"uid-churn-{i}", annotations=annotations)
        live.append(pod)
        try:
            cid = rt.create_container(pod, "app", cpu_millis=millis, memory_limit=memory)
            rt.start_container(cid)
            outcomes["running"] += 1
        except grpc.RpcError:  # refused (no device or CPU left), or eventsrc went in the middle
            outcomes["refused"] += 1
        while len(live) > LIVE:
            gone = live.pop(rng.randrange(len(live)))
            rt.stop_pod(gone)
            rt.remove_pod(gone)

    try:
        eventually(lambda: "registered" in plugin.log.read_text(), "the sample plugin to register")
        daemon.eventually(lambda: devices(root, free=True) == 4, "the daemon to list 4 devices")
        for i in range(SANDBOXES):
            if i in restarts:
                rt.restart()  # the pods live on: containerd recovers their sandboxes
            if i in kills:
                # SIGKILL at a random moment of this step's calls; the step goes on without it
                killer = threading.Timer(rng.uniform(0, 0.3), daemon.proc.kill)
                killer.start()
                step(i)
                killer.join()
                daemon.proc.wait()
                daemon = daemon_factory(*flags)
                continue
            step(i)
        while live:
            gone = live.pop()
            rt.stop_pod(gone)
            rt.remove_pod(gone)
        daemon.eventually(lambda: nothing_held(root, rt) == "", "nothing held anywhere", timeout=60)
    finally:
        plugin.stop()
    print(f"churn: {SANDBOXES} sandboxes, {outcomes}, {len(restarts)} restarts, {len(kills)} kills")
    assert outcomes["running"] > 0
    verify = run_cli("audit", "verify", root=root)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    check = run_cli("replay", "--check", root=root)
    assert check.returncode == 0, check.stdout + check.stderr
    log = run_cli("log", "--output", "json", root=root, check=True).stdout
    assert "gone from the runtime's listing" in log  # sandboxes that outlived a restart were seen go
    # Each start after a kill: DaemonStarted, the time eventsrc was away as a gap from its last
    # record, then the runtime's Synchronize records what it has (what the kill took included).
    records = [json.loads(line) for line in log.splitlines()]
    kinds = [r["type"] for r in records]
    gaps = [r for r in records if r["type"] == "ObservationGapFound" and r["event"]["source"] == "eventsrc"]
    assert [g["event"]["reason"] for g in gaps] == [
        "eventsrc was not running (killed or crashed; from its last record)"
    ] * len(kills)
    for g in gaps:
        after = kinds[kinds.index("ObservationGapFound", records.index(g)) :]
        assert "RuntimeConnected" in after and g["event"]["until_ns"] >= g["event"]["since_ns"] > 0
