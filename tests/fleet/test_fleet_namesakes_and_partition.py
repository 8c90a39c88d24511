"""Issue 34, item 7, tried on the real servers: two nodes started with one --node-name, and one
server of a three-server JetStream cluster partitioned away (SIGSTOP) while a node ships.
(NATS away while retention cuts: tests/fleet/test_shipping_away.py.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nats.errors
import psycopg
import pytest

from tests.conftest import Daemon, run_cli
from tests.fleet.test_shipping import admit, log_records, shipped
from tests.support.fleet_sink import sink_process
from tests.support.nats import NatsCluster, NatsServer
from tests.support.postgres import PostgresServer


@pytest.fixture
def second_root() -> Iterator[Path]:
    short = Path(tempfile.mkdtemp(prefix="es-", dir="/tmp"))
    yield short / "root"
    shutil.rmtree(short, ignore_errors=True)


def fleet(root: Path) -> dict[str, str]:
    status = json.loads(run_cli("status", "-o", "json", root=root, check=True).stdout)
    return dict(status["fleet"])


def stored(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        try:
            rows = conn.execute("SELECT log_id, count(*) FROM records WHERE node = 'twin' GROUP BY log_id").fetchall()
        except psycopg.errors.UndefinedTable:
            return {}
    return {log_id: int(n) for log_id, n in rows}


def test_two_nodes_given_one_name_are_kept_apart_and_said(
    root: Path,
    second_root: Path,
    tmp_path: Path,
    nats_server: NatsServer,
    postgres_server: PostgresServer,
    daemon_factory: type[Daemon],
) -> None:
    flags = ("--fleet-nats", nats_server.url, "--node-name", "twin")
    first = daemon_factory(*flags)
    admit(root, tmp_path, range(2))
    second = Daemon(second_root, *flags)
    try:
        admit(root, tmp_path, range(2, 4))  # the first node writes after the second began
        admit(second_root, tmp_path, range(10, 12))
        with sink_process(tmp_path, nats_server.url, postgres_server.dsn) as sink:
            want = sorted([len(log_records(root)), len(log_records(second_root))])
            first.eventually(lambda: sorted(stored(postgres_server.dsn).values()) == want, "both logs stored, apart")
            assert sink.alive()
        assert second.stop() == 0
        second = Daemon(second_root, *flags)  # at its connection it finds the first log writing after it began
        second.eventually(lambda: "another log ships under node name 'twin'" in fleet(second_root)["reason"], "said")
        assert fleet(second_root)["state"] == "connected"
        assert "another log ships under this node's name" in second.output()
        # each log's records are shipped, once and in order, on its own subject
        logs = {log_id for _, _, _, log_id in shipped(nats_server.url)}
        assert len(logs) == 2
        first.eventually(
            lambda: len(shipped(nats_server.url)) == sum(map(len, map(log_records, (root, second_root)))), "all"
        )
    finally:
        if second.proc.poll() is None:
            second.stop()


def in_stream(url: str) -> list[tuple[int, str]] | None:
    """(sequence, type) of every message on the stream, read through ``url``; None while the
    cluster cannot answer (a leader being elected: JetStream says 503)."""
    try:
        return [(s, k) for s, k, _, _ in shipped(url)]
    except (nats.errors.Error, TimeoutError):
        return None


def clients(server: NatsServer) -> int:
    """Client connections the server has now (its monitoring endpoint, /connz)."""
    with urllib.request.urlopen(f"{server.monitor_url}/connz", timeout=5) as answer:  # noqa: S310
        return int(json.loads(answer.read())["num_connections"])


def test_a_server_partitioned_away_while_a_node_ships_loses_and_doubles_nothing(
    root: Path, tmp_path: Path, nats_cluster: NatsCluster, daemon_factory: type[Daemon]
) -> None:
    urls = nats_cluster.urls
    daemon = daemon_factory("--fleet-nats", ",".join(urls), "--fleet-replicas", "3", "--node-name", "node-p")
    admit(root, tmp_path, range(3))
    daemon.eventually(lambda: [(s, k) for s, k, _, _ in shipped(urls[1])] == log_records(root), "shipped")
    stopped = next(s for s in nats_cluster.servers if clients(s))  # the one the node is connected to
    reader = next(s.url for s in nats_cluster.servers if s is not stopped)
    for pid in stopped.pids:
        os.kill(pid, signal.SIGSTOP)  # no answer, no close: as if the network went away
    try:
        admit(root, tmp_path, range(3, 8))
        daemon.eventually(
            lambda: in_stream(reader) == log_records(root),
            "every record shipped through the other servers, once and in order",
            timeout=90,
        )
    finally:
        for pid in stopped.pids:
            os.kill(pid, signal.SIGCONT)
    admit(root, tmp_path, range(8, 10))
    daemon.eventually(lambda: in_stream(reader) == log_records(root), "and after it")
    assert "fleet shipping disconnected" in daemon.output()  # it was connected to the server that went away
