"""SIGKILL the daemon at random moments during a stream of admissions and removals.

After every restart: no device is held by two live containers, every admission the
client saw acknowledged (and did not see removed) is still there with the same devices,
and no reservation or admission is left dangling.

Rounds: EVENTSRC_DAEMON_CRASH_ROUNDS (default 5; CI runs 50).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import grpc
import pytest

from eventsrc.gen.node.v1 import node_pb2
from tests.conftest import env_rounds, run_cli
from tests.support.eventually import eventually
from tests.support.grpcio_stubs import stubs, unix_target

ROUNDS = env_rounds("EVENTSRC_DAEMON_CRASH_ROUNDS", 5)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120 + 20 * ROUNDS)]
RESOURCE = "example.com/dev"


def start_daemon(root: Path, log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "eventsrc", "--root-dir", str(root), "serve", "--admission-wait", "20"],
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    out.close()
    return proc


def wait_ready(root: Path, proc: subprocess.Popen[bytes], node: object) -> None:
    def ready() -> bool:
        try:
            return bool(node.Status(node_pb2.StatusRequest(), timeout=1).ready)  # type: ignore[attr-defined]
        except grpc.RpcError:
            return False

    eventually(
        ready,
        "the daemon to be ready",
        stop=lambda: None if proc.poll() is None else f"daemon exited with {proc.returncode}",
    )


def pod(n: int) -> node_pb2.Pod:
    return node_pb2.Pod(
        uid=str(uuid.uuid4()),
        namespace="default",
        name=f"p{n}",
        containers=[
            node_pb2.Container(
                name="main", kind="app", limits={RESOURCE: str(1 + n % 3)}, requests={RESOURCE: str(1 + n % 3)}
            )
        ],
    )


class Client:
    """Admits and removes pods in a thread, remembering what was acknowledged."""

    def __init__(self, root: Path, rng: random.Random) -> None:
        self.rng = rng
        self.channel = grpc.insecure_channel(unix_target(root / "eventsrc" / "api.sock"))
        self.node = stubs("node/v1/node.proto").NodeStub(self.channel)
        self.acked: dict[str, list[str]] = {}  # uid -> device ids, acknowledged admitted
        self.uncertain: set[str] = set()  # in flight when the daemon died
        self.ops = 0
        self.refused = 0
        self.stop = threading.Event()
        self.n = 0

    def run(self) -> None:
        while not self.stop.is_set():
            if self.acked and (len(self.acked) >= 3 or self.rng.random() < 0.4):
                uid = self.rng.choice(sorted(self.acked))
                try:
                    self.node.Remove(node_pb2.RemoveRequest(pod=node_pb2.PodSelector(uid=uid)), timeout=30)
                    del self.acked[uid]
                    self.ops += 1
                except grpc.RpcError:
                    # The daemon died with the removal in flight: it happened or it did not.
                    del self.acked[uid]
                    self.uncertain.add(uid)
                    return
            else:
                p = pod(self.n)
                self.n += 1
                try:
                    info = self.node.Admit(node_pb2.AdmitRequest(pod=p), timeout=30)
                    self.acked[p.uid] = sorted(
                        r for c in info.containers for res in c.resources for r in res.device_ids
                    )
                    self.ops += 1
                except grpc.RpcError as err:
                    if err.code() == grpc.StatusCode.FAILED_PRECONDITION:
                        self.refused += 1
                        self.ops += 1
                        continue
                    self.uncertain.add(p.uid)
                    return


def check(root: Path, client: Client, round_: int) -> None:
    state = json.loads(run_cli("state", "-o", "json", root=root, check=True).stdout)
    pods = state["pods"]["pods"]
    devices = state["devices"]["devices"].get(RESOURCE, {})
    # No admission or reservation left dangling.
    assert all(p["state"] == "admitted" for p in pods.values()), f"round {round_}: dangling admission"
    assert all(d["hold"] != "reserved" for d in devices.values()), f"round {round_}: dangling reservation"
    # No device held by two live containers; the two views agree.
    seen: dict[str, str] = {}
    for uid, p in pods.items():
        for cname, c in p["containers"].items():
            for device_id in c["devices"].get(RESOURCE, []):
                assert device_id not in seen, f"round {round_}: {device_id} held by {seen[device_id]} and {uid}/{cname}"
                seen[device_id] = f"{uid}/{cname}"
                assert devices[device_id]["holder"] == f"{uid}/{cname}"
    held = {i for i, d in devices.items() if d["holder"]}
    assert held == set(seen), f"round {round_}: devices held by nobody alive: {held - set(seen)}"
    # Every acknowledged admission is still there, with its devices.
    for uid, ids in client.acked.items():
        assert uid in pods, f"round {round_}: acknowledged pod {uid} lost"
        assert sorted(pods[uid]["containers"]["main"]["devices"][RESOURCE]) == ids
    # An admission in flight at the kill is there (complete) or gone (nothing held).
    for uid in client.uncertain:
        if uid in pods:
            client.acked[uid] = sorted(pods[uid]["containers"]["main"]["devices"][RESOURCE])
    client.uncertain.clear()


def test_sigkill_during_admissions_and_removals(tmp_path: Path) -> None:
    rng = random.Random(4242)
    root = tmp_path / "root"
    log = tmp_path / "daemon.log"
    proc = start_daemon(root, log)
    plugin = None
    client = Client(root, rng)
    try:
        wait_ready(root, proc, client.node)
        plugin = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "eventsrc",
                "--root-dir",
                str(root),
                "sample-plugin",
                "--devices",
                "8",
                "--numa-nodes",
                "2",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for round_ in range(ROUNDS):
            worker = threading.Thread(target=client.run)
            client.stop.clear()
            worker.start()
            time.sleep(rng.uniform(0.05, 0.5))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            client.stop.set()
            worker.join(60)
            assert not worker.is_alive()
            # The next start finishes what the killed one left, before it is ready.
            proc = start_daemon(root, log)
            wait_ready(root, proc, client.node)
            check(root, client, round_)
        assert client.ops >= 4 * ROUNDS, f"only {client.ops} acknowledged operations in {ROUNDS} rounds"
    finally:
        for p in (proc, plugin):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
