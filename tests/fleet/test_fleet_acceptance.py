"""Issue 28's acceptance run: three daemons (three node names) with pods coming and going, shipping
to a three-server JetStream cluster, two sinks at once into one PostgreSQL. During the run each
daemon is SIGKILLed once, one NATS server is restarted and then all three, and a sink is SIGKILLed
while records flow. Afterwards the raw table holds each node's every record exactly once, and the
fleet's usage and device histories equal exactly the union of the nodes' own answers.

``EVENTSRC_FLEET_SECONDS`` (default 10; CI: 60) is how long pods come and go."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

from eventsrc.layout import Layout
from eventsrc.log.store import EventLog
from eventsrc.offline.render import iso
from tests.conftest import REPO, Daemon, run_cli
from tests.e2e.test_devices_e2e import Plugin
from tests.support.eventually import eventually
from tests.support.nats import NatsCluster
from tests.support.node_client import NodeClient
from tests.support.postgres import PostgresServer
from tests.support.rollup import kept_and_made

SECONDS = float(os.environ.get("EVENTSRC_FLEET_SECONDS", "10"))
TOPOLOGY = REPO / "examples" / "topology-256.json"
STATIC = ("--cpu-manager-policy", "static", "--reserved-cpu-count", "4", "--topology-file", str(TOPOLOGY))
RESOURCE = "example.com/dev"
DEVICES = 4


class Node:
    """One node: a daemon shipping to the cluster, a sample device plugin, a node API client."""

    def __init__(self, name: str, root: Path, urls: list[str]) -> None:
        self.name, self.root = name, root
        self.flags = (*STATIC, "--fleet-nats", ",".join(urls), "--fleet-replicas", "3", "--node-name", name)
        self.daemon = Daemon(root, *self.flags)
        self.plugin = Plugin(root, "--devices", str(DEVICES), "--numa-nodes", "1")
        self.plugin.wait_registered()
        self.client = NodeClient(root)
        self.live: list[str] = []
        self.admitted = 0
        self.n = 0

    def admit(self, rng: random.Random) -> None:
        """A Guaranteed pod of 1-2 exclusive CPUs and 0-2 devices in one of three namespaces."""
        self.n += 1
        pb = self.client.m.pb2
        uid = f"{self.name}-uid-{self.n}"
        limits = {"cpu": str(rng.randint(1, 2)), "memory": "1Gi"}
        if devices := rng.randint(0, 2):
            limits[RESOURCE] = str(devices)
        pod = pb.Pod(
            uid=uid,
            namespace=f"team-{rng.randint(1, 3)}",
            name=f"p{self.n}",
            containers=[pb.Container(name="main", kind="app", limits=limits, requests=limits)],
        )
        try:
            self.client.stub.Admit(pb.AdmitRequest(pod=pod), timeout=self.client.timeout)
        except grpc.RpcError:
            return  # refused (say, the plugin not registered again yet after a SIGKILL): recorded too
        self.live.append(uid)
        self.admitted += 1

    def remove_one(self, rng: random.Random) -> None:
        if self.live:
            self.client.remove(self.live.pop(rng.randrange(len(self.live))))

    def kill_and_restart(self) -> None:
        """SIGKILL, then the daemon again on the same log; the plugin registers again by itself."""
        self.client.close()
        self.daemon.stop(signal.SIGKILL)
        self.daemon = Daemon(self.root, *self.flags)
        self.client = NodeClient(self.root)

    def stop(self) -> None:
        self.client.close()
        self.plugin.stop()
        if self.daemon.proc.poll() is None:
            self.daemon.stop()

    def records(self) -> list[tuple[int, str]]:
        """(sequence, type) of every record of the node's own log, read as ``eventsrc log`` reads it."""
        with EventLog(Layout(self.root).log, readonly=True) as log:
            return [(r.seq, type(r.event).__name__) for r in log.records(1, log.last_seq())]


class Sink:
    def __init__(self, urls: list[str], dsn: str, log_path: Path) -> None:
        self.args = [sys.executable, "-m", "eventsrc", "fleet", "sink", "--nats", ",".join(urls), "--replicas", "3"]
        self.args += ["--postgres", dsn]
        self.log_path = log_path
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        with open(self.log_path, "a") as out:
            return subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT)

    def kill_and_restart(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc = self._start()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def exited(self) -> str | None:
        if self.proc.poll() is None:
            return None
        return f"a sink exited {self.proc.returncode}:\n{self.log_path.read_text()[-4000:]}"


@pytest.fixture
def roots() -> Iterator[list[Path]]:
    """Three daemon roots with short paths (unix sockets allow 107 bytes)."""
    made = [Path(tempfile.mkdtemp(prefix="es-", dir="/tmp")) for _ in range(3)]
    yield [d / "root" for d in made]
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def stored_seqs(dsn: str) -> dict[str, list[tuple[int, str]]]:
    """Each node's records in the raw table, in sequence order: (seq, type)."""
    out: dict[str, list[tuple[int, str]]] = {}
    with psycopg.connect(dsn) as conn:
        try:
            rows = conn.execute("SELECT node, seq, type FROM records ORDER BY node, seq").fetchall()
        except psycopg.errors.UndefinedTable:
            return {}
    for node, seq, kind in rows:
        out.setdefault(node, []).append((seq, kind))
    return out


def exact(text: str) -> Any:
    """JSON whose numbers are read exactly (seconds to the nanosecond)."""
    return json.loads(text, parse_float=Decimal)


#: the fields of a usage row that are its figures, not its group
FIGURES = ("seconds", "hours", "seconds_seen", "seconds_in_gaps")


def merged_usage(
    answers: dict[str, list[dict[str, Any]]], by: str
) -> list[tuple[tuple[str, ...], tuple[Decimal, Decimal]]]:
    """The union of the nodes' own ``audit usage --by BY`` answers, as the fleet's should be: the
    seconds of one group, and those inside the nodes' gaps, summed across nodes; by node and by
    device a group names its node first (by node, that node's answer by resource; by device, as
    two nodes' devices may share an id)."""
    sums: dict[tuple[str, ...], tuple[Decimal, Decimal]] = {}
    for node, rows in answers.items():
        for row in rows:
            group = tuple(str(v) for k, v in row.items() if k not in FIGURES)
            key = (node, *group) if by in ("node", "device") else group
            seconds, in_gaps = sums.get(key, (Decimal(0), Decimal(0)))
            sums[key] = (seconds + Decimal(row["seconds"]), in_gaps + Decimal(row["seconds_in_gaps"]))
    return sorted(sums.items())


def fleet_usage(rows: list[dict[str, Any]]) -> list[tuple[tuple[str, ...], tuple[Decimal, Decimal]]]:
    return sorted(
        (
            tuple(str(v) for k, v in r.items() if k not in FIGURES),
            (Decimal(r["seconds"]), Decimal(r["seconds_in_gaps"])),
        )
        for r in rows
    )


def test_three_nodes_two_sinks_kills_and_restarts_the_fleet_holds_the_union_exactly(
    roots: list[Path], tmp_path: Path, nats_cluster: NatsCluster, postgres_server: PostgresServer
) -> None:
    urls = nats_cluster.urls
    dsn = postgres_server.dsn
    nodes: list[Node] = []
    sinks: list[Sink] = []
    try:
        for i, root in enumerate(roots, 1):
            nodes.append(Node(f"node-{i}", root, urls))
        sinks = [Sink(urls, dsn, tmp_path / f"sink-{i}.log") for i in (1, 2)]

        def running() -> str | None:
            return next(filter(None, (s.exited() for s in sinks)), None)

        rng = random.Random(28)
        disruptions: list[tuple[float, str, Callable[[], None]]] = [
            # the sinks' kills early: what a killed sink fetched comes back after the ack wait (10 s)
            (0.05, "SIGKILL a sink", sinks[0].kill_and_restart),
            (0.15, "SIGKILL node-1", nodes[0].kill_and_restart),
            (0.25, "SIGKILL the other sink", sinks[1].kill_and_restart),
            (0.35, "SIGKILL node-2", nodes[1].kill_and_restart),
            (0.45, "restart nats-2", nats_cluster.servers[1].restart),
            (0.55, "SIGKILL node-3", nodes[2].kill_and_restart),
            (0.65, "restart every NATS server", lambda: restart_all(nats_cluster)),
        ]
        done: list[str] = []
        start = time.monotonic()
        while (elapsed := (time.monotonic() - start) / SECONDS) < 1 or disruptions:
            while disruptions and disruptions[0][0] <= elapsed:
                _, what, act = disruptions.pop(0)
                act()
                done.append(what)
            node = rng.choice(nodes)
            node.admit(rng)
            if len(node.live) > 3 or rng.random() < 0.3:
                node.remove_one(rng)
            assert running() is None, running()
        assert len(done) == 7
        assert all(n.admitted >= 3 for n in nodes), [n.admitted for n in nodes]

        # Everything the nodes logged reaches the raw table, each record once, no gap.
        def every_record_stored() -> bool:
            stored = stored_seqs(dsn)
            return all(stored.get(n.name) == n.records() for n in nodes)

        eventually(every_record_stored, "every node's every record in PostgreSQL", timeout=120, stop=running)
        with psycopg.connect(dsn) as conn:
            per_log = conn.execute(
                "SELECT node, count(DISTINCT log_id), count(*) FROM records GROUP BY node"
            ).fetchall()
            applied = dict(conn.execute("SELECT node, applied_seq FROM node_logs").fetchall())
        assert sorted(per_log) == sorted((n.name, 1, len(n.records())) for n in nodes)
        assert applied == {n.name: n.records()[-1][0] for n in nodes}

        last = max(
            json.loads(run_cli("log", "-o", "json", root=n.root).stdout.splitlines()[-1])["ts_ns"] for n in nodes
        )
        until = iso(last + 1)
        pg = ("--postgres", dsn)
        for by in ("namespace", "node", "resource", "pod", "device"):
            own = {
                n.name: exact(
                    run_cli(
                        "audit",
                        "usage",
                        "--by",
                        "resource" if by == "node" else by,
                        "--until",
                        until,
                        "-o",
                        "json",
                        root=n.root,
                        check=True,
                    ).stdout
                )
                for n in nodes
            }
            fleet = exact(run_cli("fleet", "usage", "--by", by, "--until", until, "-o", "json", *pg, check=True).stdout)
            assert fleet_usage(fleet) == merged_usage(own, by), by
            assert fleet, by
        kept, made = kept_and_made(dsn)  # what --by namespace|resource read, kept by sinks killed and restarted
        assert kept == made and made

        # Every device's history: the fleet's answer is the union of the nodes' own answers, one
        # per node (a device id is each node's own), each the node's answer naming its node.
        def without(answer: dict[str, Any], *fields: str) -> dict[str, Any]:
            return {k: v for k, v in answer.items() if k not in fields}

        held: set[str] = set()
        for i in range(DEVICES):
            device = f"dev-{i}"
            fleet = json.loads(
                run_cli("fleet", "audit", "device", RESOURCE, device, "-o", "json", *pg, check=True).stdout
            )
            assert [a["node"] for a in fleet] == [n.name for n in nodes], device
            for n, answer in zip(nodes, fleet, strict=True):
                own = json.loads(
                    run_cli("audit", "device", RESOURCE, device, "-o", "json", root=n.root, check=True).stdout
                )
                assert answer["log"] is None  # the fleet lacks none of the node's records
                assert without(answer, "node", "log_id", "log") == without(own, "log"), (n.name, device)
                held.update([n.name] if answer["holders"] else [])
        assert held == {n.name for n in nodes}  # something to compare: devices were held on every node
    finally:
        for s in sinks:
            s.stop()
        for n in nodes:
            n.stop()


def restart_all(cluster: NatsCluster) -> None:
    for server in cluster.servers:
        server.stop()
    # A JetStream cluster restarted whole elects its metadata leader again; under the suite's
    # load (three workers on two cores) that once took a member over 30 s.
    cluster.start(timeout=90)
