"""SIGKILL the daemon at random points of claim prepare and unprepare while pods come and go.

After every recovery the driver's prepared set equals exactly the claims that live pods use:
nothing leaks, nothing is unprepared under a live pod.

Rounds: EVENTSRC_DRA_CRASH_ROUNDS (default 5; CI runs 50).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import grpc
import pytest

from eventsrc.gen.node.v1 import node_pb2 as pb
from tests.conftest import env_rounds, run_cli
from tests.crash.test_device_crash import start_daemon, wait_ready
from tests.support.eventually import eventually
from tests.support.grpcio_stubs import stubs, unix_target

ROUNDS = env_rounds("EVENTSRC_DRA_CRASH_ROUNDS", 5)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120 + 20 * ROUNDS)]
DRIVER = "gpu.example.com"
SHARED = "c-shared"


def claim(uid: str, name: str, pods: list[str]) -> pb.ResourceClaim:
    return pb.ResourceClaim(
        uid=uid,
        namespace="default",
        name=name,
        results=[pb.ClaimResult(request="gpu", driver=DRIVER, pool="node-a", device=f"dev-{name}")],
        reserved_for=[pb.ClaimConsumer(resource="pods", name=p, uid=p) for p in pods],
    )


class Client:
    def __init__(self, root: Path, rng: random.Random) -> None:
        self.rng = rng
        self.node = stubs("node/v1/node.proto").NodeStub(
            grpc.insecure_channel(unix_target(root / "eventsrc" / "api.sock"))
        )
        self.live: set[str] = set()
        self.stop = threading.Event()
        self.ops = 0
        self.n = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                if self.live and (len(self.live) >= 4 or self.rng.random() < 0.4):
                    uid = self.rng.choice(sorted(self.live))
                    self.node.Remove(pb.RemoveRequest(pod=pb.PodSelector(uid=uid)), timeout=30)
                    self.live.discard(uid)
                else:
                    self.n += 1
                    uid = f"pod-{self.n}"
                    # Every other pod also shares one claim with the others.
                    own = claim(f"c-{uid}", f"claim-{uid}", [uid])
                    claims = [own] + (
                        [claim(SHARED, "shared", [f"pod-{i}" for i in range(1, 10_000)])] if self.n % 2 else []
                    )
                    pod = pb.Pod(
                        uid=uid,
                        namespace="default",
                        name=uid,
                        containers=[pb.Container(name="main", kind="app", claims=[c.uid for c in claims])],
                    )
                    self.node.Admit(pb.AdmitRequest(pod=pod, claims=claims), timeout=30)
                    self.live.add(uid)
                self.ops += 1
            except grpc.RpcError:
                return  # the daemon died mid-call: that pod's fate is read from the log after restart


def check(root: Path, driver_state: Path, round_: int) -> None:
    last: dict[str, set[str]] = {}

    def recovered() -> bool:
        views = json.loads(run_cli("state", "-o", "json", root=root, check=True).stdout)
        admitted = {u for u, p in views["pods"]["pods"].items() if p["state"] == "admitted"}
        needed = {
            c for u in admitted for cont in views["pods"]["pods"][u]["containers"].values() for c in cont["claims"]
        }
        try:
            prepared = set(json.loads(driver_state.read_text())["prepared"])
        except (FileNotFoundError, ValueError):
            prepared = set()
        # Nothing is ever unprepared under a live pod ...
        assert needed <= prepared, f"round {round_}: {sorted(needed - prepared)} unprepared under live pods"
        last.update(prepared=prepared, needed=needed)
        # ... and, once recovered, nothing else stays prepared.
        return prepared == needed

    eventually(
        recovered,
        f"round {round_}: the driver to hold exactly the claims of live pods",
        interval=0.1,
        context=lambda: f"driver has {sorted(last['prepared'])}, live pods use {sorted(last['needed'])}",
    )


def worked(client: Client, ops: int, worker: threading.Thread) -> bool:
    """Whether ``client`` has made ``ops`` operations (or stopped: the daemon died under it)."""
    return client.ops >= ops or not worker.is_alive()


def test_sigkill_during_claim_prepare_and_unprepare(tmp_path: Path) -> None:
    rng = random.Random(555)
    root = Path(tempfile.mkdtemp(prefix="es-", dir="/tmp")) / "r"
    log = tmp_path / "daemon.log"
    proc = start_daemon(root, log)
    driver = None
    client = Client(root, rng)
    try:
        wait_ready(root, proc, client.node)
        driver = subprocess.Popen(
            [sys.executable, "-m", "eventsrc", "--root-dir", str(root), "sample-dra-driver", "--driver", DRIVER],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        state = root / "plugins" / DRIVER / "state.json"
        for round_ in range(ROUNDS):
            client.stop.clear()
            worker = threading.Thread(target=client.run)
            worker.start()
            done = client.ops
            # two operations in every round whatever the machine's load, then the SIGKILL at a
            # random point of what follows (mid-prepare, mid-unprepare, between)
            eventually(partial(worked, client, done + 2, worker), "two operations", timeout=60)
            time.sleep(rng.uniform(0.0, 0.45))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            client.stop.set()
            worker.join(60)
            proc = start_daemon(root, log)
            wait_ready(root, proc, client.node)
            check(root, state, round_)
            views = json.loads(run_cli("state", "-o", "json", root=root, check=True).stdout)
            client.live = {u for u, p in views["pods"]["pods"].items() if p["state"] == "admitted"}
        assert client.ops >= 2 * ROUNDS, f"only {client.ops} operations in {ROUNDS} rounds"
    finally:
        for p in (proc, driver):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
