"""Issue 35's scenario beside a kubelet of each era people run (the stand-in plays each as data,
``tests/support/kubelet.py`` ``ERAS``), without NRI: a Guaranteed pod with CPU 1 and a device,
a BestEffort pod, a 200m pod with a device; the first removed; the kubelet restarted; eventsrc
SIGKILLed while a pod goes. What the log then says must hold for every era:

* the Guaranteed pod's memory, from PodResources (1.22 on) or the memory manager's file (1.21);
* no exclusive CPU for the BestEffort or the 200m pod (a 1.20 kubelet lists their cpuset, the
  shared pool, in ``cpu_ids``), CPU 1 for the Guaranteed pod, and no disagreement recorded;
* one usage row per pod and resource, under the pod's uid;
* a registered device answered by ``audit device`` before any pod held it;
* the kubelet's gap starting at its last good answer, not at the look that found it gone (the
  kubelet leaves its socket, as a stopping kubelet does);
* the time eventsrc was killed recorded as a gap that the killed pod's release follows, and
  its usage row giving the seconds of its hold inside the gaps (the kill, the kubelet's
  restart) apart from those seen.
"""

from __future__ import annotations

import json
import signal
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from eventsrc.offline.audit_queries import iso
from tests.conftest import Daemon, run_cli
from tests.e2e.test_beside_kubelet import in_gaps
from tests.support.kubelet import ERAS, Container, Device, Memory, StandInKubelet

RESOURCE = "example.com/resource"
MIB, GIB = 1 << 20, 1 << 30
MS = 10**6  # iso() goes through a float: whole milliseconds print exactly
#: ns between the stand-in sending an answer and eventsrc reading it, at most (a loaded machine)
READ_SLACK = 300 * MS


def seconds(ns: int) -> Decimal:
    return Decimal(ns) / 10**9


def records(root: Path, *types: str) -> list[dict[str, Any]]:
    out = run_cli("log", "-o", "json", root=root, check=True).stdout
    return [r for line in out.splitlines() if line.strip() and (r := json.loads(line))["type"] in types]


def audit_device(root: Path, device: str) -> dict[str, Any]:
    answer: dict[str, Any] = json.loads(
        run_cli("audit", "device", RESOURCE, device, "-o", "json", root=root, check=True).stdout
    )
    return answer


def holders(root: Path, device: str) -> list[tuple[str, bool]]:
    return [(h["pod"]["name"], h["still_held"]) for h in audit_device(root, device)["holders"]]


def gap_records(root: Path, source: str) -> list[dict[str, Any]]:
    return [g for g in records(root, "ObservationGapFound") if g["event"]["source"] == source]


def gaps(root: Path, source: str) -> list[dict[str, Any]]:
    return [g["event"] for g in gap_records(root, source)]


@pytest.mark.parametrize("era", ["1.20", "1.21", "1.26", "1.30", "1.36", "1.37"])
def test_the_scenario_beside_a_kubelet_of_each_era(
    era: str, short_tmp: Path, root: Path, daemon_factory: type[Daemon]
) -> None:
    minor = int(era.split(".")[1])
    with StandInKubelet(short_tmp / "kubelet", minor=minor) as k:
        assert k.era in ERAS.values()
        k.set_allocatable(
            devices=[Device(RESOURCE, d, (0,)) for d in ("Dev-1", "Dev-2")], cpus=[0, 1], memory=[Memory("memory", GIB)]
        )
        k.write_checkpoints()
        args = ("--beside-kubelet", str(k.root), "--beside-kubelet-resync", "1s")
        daemon = daemon_factory(*args)

        # a registered device no pod ever held is known (GetAllocatableResources, or the device
        # checkpoint's RegisteredDevices where the kubelet has none or its gate is off)
        daemon.eventually(lambda: run_cli("audit", "device", RESOURCE, "Dev-1", root=root).returncode == 0, "Dev-1")
        assert audit_device(root, "Dev-1")["holders"] == []

        held = Container(
            "main", devices=[Device(RESOURCE, "Dev-1", (0,))], cpus=[1], memory=[Memory("memory", MIB, (0,))]
        )
        k.set_pod("default", "guaranteed", [held])
        k.set_pod("default", "besteffort", [Container("main")])
        k.set_pod("default", "small", [Container("main", devices=[Device(RESOURCE, "Dev-2", (0,))])])
        k.write_checkpoints()
        daemon.eventually(lambda: holders(root, "Dev-2") == [("small", True)], "small's device")
        daemon.eventually(lambda: holders(root, "Dev-1") == [("guaranteed", True)], "guaranteed's device")
        daemon.eventually(lambda: records(root, "KubeletCPUsObserved"), "guaranteed's CPU")
        with_memory = bool(k.era.memory or k.era.memory_state)
        if with_memory:  # PodResources lists it (1.22), or its file says it (1.21)
            (memory,) = daemon.eventually(lambda: records(root, "KubeletMemoryObserved"), "guaranteed's memory")
            assert memory["event"]["memory"] == [{"memory_type": "memory", "size": MIB, "numa_nodes": [0]}]

        k.remove_pod("default", "guaranteed")
        k.write_checkpoints()
        daemon.eventually(lambda: holders(root, "Dev-1") == [("guaranteed", False)], "guaranteed's release")

        # the kubelet stops, leaving its socket as a stopping kubelet does: eventsrc finds it gone
        # at a later look and dates the gap from the last answer it read (of the last two: the
        # stop may cut the last), not from that look
        answered = k.calls["List"]
        daemon.eventually(lambda: k.calls["List"] >= answered + 2, "two answers")
        k.stop(remove_socket=False)
        (found,) = daemon.eventually(lambda: gap_records(root, "kubelet"), "the kubelet's gap")
        since, sent = found["event"]["since_ns"], k.listed_at[-2:]  # the stand-in's last two answers
        assert sent[0] <= since <= sent[1] + READ_SLACK, (sent, found)  # the rule: test_beside_shell
        k.start()
        daemon.eventually(lambda: any(g["until_ns"] for g in gaps(root, "kubelet")), "the kubelet's gap closed")

        # eventsrc is killed while small goes
        assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
        k.remove_pod("default", "small")
        k.write_checkpoints()
        daemon = daemon_factory(*args)
        daemon.eventually(lambda: holders(root, "Dev-2") == [("small", False)], "small's release after the restart")
        daemon.stop()

    (killed,) = gaps(root, "eventsrc")
    (released,) = [r for r in records(root, "KubeletDevicesReleased") if r["event"]["pod"]["name"] == "small"]
    assert killed["since_ns"] < killed["until_ns"] <= released["ts_ns"]  # known gone only after the gap
    cpus = {(r["event"]["pod"]["name"], tuple(r["event"]["cpus"])) for r in records(root, "KubeletCPUsObserved")}
    assert cpus == {("guaranteed", (1,))}
    assert records(root, "KubeletCPUsDisagreed") == []
    until = records(root, "DaemonStopped")[-1]["ts_ns"] // MS * MS
    out = run_cli("audit", "usage", "--by", "pod", "--until", iso(until), "-o", "json", root=root, check=True).stdout
    usage = json.loads(out, parse_float=Decimal)
    rows = sorted((r["name"], r["uid"] != "", r["resource"]) for r in usage)
    memory = [("guaranteed", True, "memory")] if with_memory else []
    assert rows == [("guaranteed", True, "cpu"), ("guaranteed", True, RESOURCE), *memory, ("small", True, RESOURCE)]
    if with_memory:  # byte-hours: its 1 MiB, from when it was seen until the pod was released
        (seen,) = records(root, "KubeletMemoryObserved")
        (gone,) = [r for r in records(root, "KubeletPodReleased") if r["event"]["pod"]["name"] == "guaranteed"]
        (row,) = [r for r in usage if r["resource"] == "memory"]
        assert (row["seconds"], row["measure"]) == (seconds(MIB * (gone["ts_ns"] - seen["ts_ns"])), "byte-seconds")
    # small's hold: through the kubelet's restart and eventsrc's kill, both not seen
    (held,) = [r["ts_ns"] for r in records(root, "KubeletDevicesObserved") if r["event"]["pod"]["name"] == "small"]
    (row,) = [r for r in usage if r["name"] == "small"]
    unseen = in_gaps(root, held, released["ts_ns"])
    assert unseen >= killed["until_ns"] - killed["since_ns"] > 0
    assert (row["seconds"], row["seconds_in_gaps"]) == (seconds(released["ts_ns"] - held), seconds(unseen))
    proc = run_cli("replay", "--check", root=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
