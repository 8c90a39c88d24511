"""The real PostgreSQL harness itself: psycopg creates a table and reads it back, the server runs
as an unprivileged user on a unix socket only, keeps its data across a restart and a SIGKILL,
and leaves no process and no directory behind."""

from __future__ import annotations

import os

import psycopg

from testbed.servers import server_process
from tests.support.postgres import PostgresServer


def rows(dsn: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT node, seq FROM records ORDER BY seq").fetchall()


def owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return None


def test_a_table_is_created_written_and_read_back_and_survives_a_restart_and_a_kill(
    postgres_server: PostgresServer,
) -> None:
    server = postgres_server
    with psycopg.connect(server.dsn) as conn:
        conn.execute("CREATE TABLE records (node text NOT NULL, seq bigint NOT NULL, PRIMARY KEY (node, seq))")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO records VALUES (%s, %s)", [("node-a", 1), ("node-a", 2)])
        listen = conn.execute("SHOW listen_addresses").fetchone()
        version = conn.info.server_version
    assert rows(server.dsn) == [("node-a", 1), ("node-a", 2)]
    assert listen == ("",)  # the unix socket only
    assert version // 10000 == 15

    tree = server.process_tree()
    assert len(tree) > 1  # the postmaster and its auxiliary processes
    owners = {uid for uid in map(owner, tree) if uid is not None}  # a closed session's backend may be gone
    assert owner(tree[0]) is not None  # the postmaster
    assert owners == {server.data_dir.stat().st_uid}
    if os.geteuid() == 0:
        assert owners != {0}, "PostgreSQL runs as an unprivileged user"

    server.restart()
    assert rows(server.dsn) == [("node-a", 1), ("node-a", 2)]
    assert not any(map(server_process.alive, tree))

    tree = server.process_tree()
    server.kill()
    assert not any(map(server_process.alive, tree))
    server.start()
    assert rows(server.dsn) == [("node-a", 1), ("node-a", 2)]  # committed before the crash: recovered

    tree = server.process_tree()
    server.cleanup()
    assert not any(map(server_process.alive, [*tree, *server.pids]))
    assert len(server.pids) == 3
    assert not server.directory.exists()
