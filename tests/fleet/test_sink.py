"""A node ships to a real nats-server, ``eventsrc fleet sink`` writes into a real PostgreSQL, and
``eventsrc fleet usage`` and ``fleet audit pod`` answer exactly as the node's own ``audit usage`` and
``audit pod`` do."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg

from eventsrc.offline.render import iso
from tests.conftest import REPO, Daemon, run_cli
from tests.support.fleet_sink import sink_process
from tests.support.nats import NatsServer
from tests.support.postgres import PostgresServer

TOPOLOGY = REPO / "examples" / "topology-256.json"
STATIC = ("--cpu-manager-policy", "static", "--reserved-cpu-count", "4", "--topology-file", str(TOPOLOGY))


def admit(root: Path, tmp_path: Path, name: str, cpus: int) -> None:
    manifest = tmp_path / f"{name}.yaml"
    manifest.write_text(
        f"kind: Pod\nmetadata: {{name: {name}, namespace: team-{cpus}, uid: uid-{name}}}\nspec:\n"
        f"  containers:\n  - name: main\n    resources:\n      limits: {{cpu: '{cpus}', memory: 1Gi}}\n"
    )
    run_cli("admit", "-f", str(manifest), root=root, check=True)


def stored(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        try:
            row = conn.execute("SELECT count(*) FROM records").fetchone()
        except psycopg.errors.UndefinedTable:
            return 0
        return int(row[0]) if row else 0


def log_count(root: Path) -> int:
    return len(run_cli("log", "--output", "json", root=root, check=True).stdout.splitlines())


def test_the_fleets_usage_is_the_nodes_own(
    root: Path,
    tmp_path: Path,
    nats_server: NatsServer,
    postgres_server: PostgresServer,
    daemon_factory: type[Daemon],
) -> None:
    daemon = daemon_factory(*STATIC, "--fleet-nats", nats_server.url, "--node-name", "node-a")
    admit(root, tmp_path, "a", 2)
    admit(root, tmp_path, "b", 3)
    run_cli("remove", "uid-a", root=root, check=True)
    admit(root, tmp_path, "c", 1)
    with sink_process(tmp_path, nats_server.url, postgres_server.dsn):
        daemon.eventually(lambda: stored(postgres_server.dsn) == log_count(root), "every record in PostgreSQL")
        until = iso(json.loads(run_cli("log", "--output", "json", root=root).stdout.splitlines()[-1])["ts_ns"] + 1)
        for by in ("pod", "namespace", "device", "resource"):
            node = run_cli("audit", "usage", "--by", by, "--until", until, "-o", "json", root=root, check=True)
            fleet = run_cli(
                "fleet",
                "usage",
                "--by",
                by,
                "--until",
                until,
                "-o",
                "json",
                "--postgres",
                postgres_server.dsn,
                check=True,
            )
            named = [{"node": "node-a", **row} for row in json.loads(node.stdout)]  # a device is a node's
            assert json.loads(fleet.stdout) == (named if by == "device" else json.loads(node.stdout)), by
            assert json.loads(node.stdout), by  # something to compare: exclusive CPUs were held
        for pod in ("uid-a", "team-3/b"):  # one removed, one still holding its CPUs
            node = run_cli("audit", "pod", pod, "-o", "json", root=root, check=True)
            fleet = run_cli("fleet", "audit", "pod", pod, "-o", "json", "--postgres", postgres_server.dsn, check=True)
            (answer,) = json.loads(fleet.stdout)
            assert answer.pop("node") == "node-a" and answer.pop("log_id")
            assert answer == json.loads(node.stdout), pod
        with psycopg.connect(postgres_server.dsn) as conn:
            seqs = [r[0] for r in conn.execute("SELECT seq FROM records WHERE node = 'node-a' ORDER BY seq")]
            applied = conn.execute("SELECT applied_seq FROM node_logs WHERE node = 'node-a'").fetchone()
        assert seqs == list(range(1, len(seqs) + 1))  # each record once, no gap
        assert applied is not None and applied[0] == len(seqs)


def test_an_unreachable_database_or_server_is_one_line(tmp_path: Path) -> None:
    dsn = f"host={tmp_path} dbname=none connect_timeout=2"
    for proc in (
        run_cli("fleet", "usage", "--postgres", dsn),
        run_cli("fleet", "sink", "--nats", "nats://127.0.0.1:1", "--postgres", dsn),
    ):
        assert proc.returncode != 0
        assert proc.stderr.startswith("eventsrc: ") and "cannot connect to PostgreSQL" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_sink_whose_servers_are_away_says_so_in_one_line(postgres_server: PostgresServer) -> None:
    proc = run_cli("fleet", "sink", "--nats", "nats://127.0.0.1:1", "--postgres", postgres_server.dsn)
    assert proc.returncode != 0
    assert (
        proc.stderr.strip().splitlines()[-1].startswith("eventsrc: error: cannot connect to NATS (nats://127.0.0.1:1)")
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    usage = run_cli("fleet", "usage", "--postgres", postgres_server.dsn, "-o", "json")
    assert usage.returncode == 0 and json.loads(usage.stdout) == []  # the sink made the tables, empty
