"""SIGKILL the daemon again and again while retention cuts its log under load: no
acknowledged admission or removal is lost, the chain stays whole across archive and live
log, and every interrupted cut is undone or finished by the next start (docs/adr/0018).

Kills: EVENTSRC_RETENTION_KILLS (default 6; CI runs 30).
"""

from __future__ import annotations

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

from eventsrc.layout import Layout
from eventsrc.log.archive import segment_files
from eventsrc.log.store import EventLog
from tests.conftest import Daemon, env_rounds, run_cli
from tests.support.node_client import NodeClient

KILLS = env_rounds("EVENTSRC_RETENTION_KILLS", 6)
RESOURCE = "example.com/dev"
SERVE = ("--snapshot-every", "20", "--log-retention-max-size", "40Ki", "--plugin-grace", "600")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120 + 20 * KILLS)]


class Load:
    """Admit and remove one-device pods until the daemon goes; what it acknowledged."""

    def __init__(self, root: Path, seed: int, admitted: set[str]) -> None:
        self.client = NodeClient(root, timeout=10)
        self.rng = random.Random(seed)
        self.admitted = sorted(admitted)  # acknowledged, not removed (as far as acknowledged)
        self.removed: list[str] = []  # acknowledged removals
        self.in_flight = ""  # the pod of the request the kill cut short: either outcome is right
        self.acks = 0
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        try:
            while True:
                if len(self.admitted) >= 5 or (self.admitted and self.rng.random() < 0.4):
                    self.in_flight = self.admitted.pop(0)
                    self.client.remove(self.in_flight)
                    self.removed.append(self.in_flight)
                else:
                    self.in_flight = str(uuid.uuid4())
                    self.client.admit(RESOURCE, uid=self.in_flight)
                    self.admitted.append(self.in_flight)
                self.in_flight = ""
                self.acks += 1
        except grpc.RpcError:
            return  # the daemon was killed: the request in flight was never acknowledged

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(30)
        self.client.close()


def interrupted(root: Path) -> list[str]:
    """What the kill left of a cut in progress (read with the daemon down)."""
    layout = Layout(root)
    found = []
    if list(layout.archive.glob(".segment-*.tmp")):
        found.append("segment being written")
    with EventLog(layout.log, readonly=True) as log:
        named = {e.file for e in log.ledger()}
        base = log.base()
        if any(p.name not in named for _f, _l, p in segment_files(layout.archive)):
            found.append("segment sealed, base not moved")
        if base is not None and 0 < log.oldest_stored() <= base.seq:
            found.append("base moved, records not all deleted")
    return found


def test_sigkill_during_retention_cuts_loses_nothing_acknowledged(root: Path) -> None:
    rng = random.Random(20261124)
    plugin: subprocess.Popen[bytes] | None = None
    admitted: set[str] = set()
    removed: set[str] = set()
    uncertain: set[str] = set()
    in_cut: dict[str, int] = {}
    cuts_seen = 0
    daemon: Daemon | None = None
    try:
        for kill in range(KILLS):
            daemon = Daemon(root, *SERVE)
            if plugin is None:  # once the daemon made its directories; it registers again after each kill
                plugin = subprocess.Popen(
                    [sys.executable, "-m", "eventsrc", "--root-dir", str(root), "sample-plugin", "--devices", "8"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                daemon.eventually(lambda: "DevicesAdded" in run_cli("log", root=root).stdout, "the plugin's devices")
            check_acknowledged(root, admitted, removed, kill)
            # what the kill left of a cut is undone or finished by this start
            daemon.eventually(lambda: not interrupted(root), "the interrupted cut to be undone or finished")
            removed |= settle(root, uncertain)
            uncertain = set()
            with Load(root, rng.randrange(1 << 30), admitted) as load:
                # let it work: some acknowledgements, then a kill at a random moment
                daemon.eventually(lambda: load.acks >= 3 or not load.thread.is_alive(), "admissions")
                time.sleep(rng.uniform(0.0, 0.4))  # where the kill lands (as tests/crash/test_crash.py)
                daemon.proc.send_signal(signal.SIGKILL)
                daemon.proc.wait()
            assert load.acks >= 3, daemon.output()
            admitted = set(load.admitted)
            removed |= set(load.removed)
            if load.in_flight:
                uncertain.add(load.in_flight)
                admitted.discard(load.in_flight)
            for what in interrupted(root):
                in_cut[what] = in_cut.get(what, 0) + 1
            cuts_seen = daemon.output().count("log cut")
        daemon = Daemon(root, *SERVE)
        check_acknowledged(root, admitted, removed, KILLS)
        verify = run_cli("audit", "verify", root=root)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        with EventLog(Layout(root).log, readonly=True) as log:
            assert log.base() is not None, "no cut happened: the test did not test retention"
            assert len(log.ledger()) >= KILLS, "fewer cuts than kills"
        print(f"{KILLS} kills; kills that landed inside a cut: {in_cut or 'none'}; cuts in the last run: {cuts_seen}")
        daemon.stop()
        daemon = None
    finally:
        if daemon is not None and daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait()
        if plugin is not None:
            plugin.kill()
            plugin.wait()


def settle(root: Path, uncertain: set[str]) -> set[str]:
    """Remove the pods whose last request a kill cut short (they may hold a device)."""
    with NodeClient(root) as client:
        for uid in uncertain:
            try:
                client.remove(uid)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise
    return uncertain


def check_acknowledged(root: Path, admitted: set[str], removed: set[str], kill: int) -> None:
    """Every acknowledged admission still admitted, every acknowledged removal still gone."""
    with NodeClient(root) as client:
        for uid in admitted:
            info = _state(client, uid)
            assert info == "admitted", f"after kill {kill}: acknowledged pod {uid} is {info}"
        for uid in removed:
            assert _state(client, uid) in ("gone", "removed"), f"after kill {kill}: removed pod {uid} came back"


def _state(client: NodeClient, uid: str) -> str:
    try:
        return str(client.get(uid).state)
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            return "gone"
        raise
