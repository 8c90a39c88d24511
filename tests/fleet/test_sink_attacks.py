"""Issue 34: nothing another publisher or the database does stops the fleet's sink or rewrites a
node's history. A real node ships to a real nats-server; ``eventsrc fleet sink`` writes into a
real PostgreSQL; an attacker publishes on the node's subject, the database refuses INSERT and
its disk fills. The sink never exits, every hostile message is quarantined with its reason, the
node's own records are stored once each, and ``fleet usage`` and ``fleet audit`` are the node's own
answers."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import nats
import psycopg
import pytest

from eventsrc import events as ev
from eventsrc.core.fleet_names import DEFAULT_STREAM, FOLLOWS, LOG, MSG_ID, NODE, SEQ, TYPE, Node
from eventsrc.events import encode_payload
from eventsrc.offline.render import iso
from tests.conftest import Daemon, run_cli
from tests.e2e.test_devices_e2e import Plugin
from tests.fleet.test_sink import STATIC, log_count
from tests.support.eventually import eventually
from tests.support.fleet_sink import Sink, sink_process
from tests.support.nats import NatsServer
from tests.support.postgres import PostgresServer

NODE_NAME = "node-a"
RESOURCE = "example.com/dev"


def admit(root: Path, tmp_path: Path, name: str, cpus: int) -> None:
    """A Guaranteed pod with ``cpus`` exclusive CPUs and one of the sample plugin's devices."""
    manifest = tmp_path / f"{name}.yaml"
    limits = f"{{cpu: '{cpus}', memory: 1Gi, {RESOURCE}: '1'}}"
    manifest.write_text(
        f"kind: Pod\nmetadata: {{name: {name}, namespace: team-{cpus}, uid: uid-{name}}}\nspec:\n"
        f"  containers:\n  - name: main\n    resources:\n      limits: {limits}\n"
    )
    run_cli("admit", "-f", str(manifest), root=root, check=True)


def registrations(root: Path) -> int:
    rows = run_cli("log", "--output", "json", root=root, check=True).stdout.splitlines()
    return sum(json.loads(r)["type"] == "PluginRegistered" for r in rows)


@pytest.fixture
def plugin(root: Path) -> Iterator[Plugin]:
    """The sample device plugin (4 devices), started once the test's daemon is."""
    started: list[Plugin] = []

    class Started(Plugin):
        def __init__(self) -> None:
            super().__init__(root, "--devices", "4", "--numa-nodes", "1")
            started.append(self)

    yield Started  # type: ignore[misc]
    for p in started:
        p.stop()


def stored_seqs(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        try:
            return [r[0] for r in conn.execute("SELECT seq FROM records WHERE node = %s ORDER BY seq", (NODE_NAME,))]
        except psycopg.errors.UndefinedTable:
            return []


def all_stored(root: Path, dsn: str) -> bool:
    return stored_seqs(dsn) == list(range(1, log_count(root) + 1))


def quarantined(dsn: str) -> list[tuple[str, str, str]]:
    with psycopg.connect(dsn) as conn:
        return [(k, s, r) for k, s, r in conn.execute("SELECT kind, seq, reason FROM quarantine ORDER BY id")]


def publish(url: str, subject: str, data: bytes, headers: dict[str, str]) -> None:
    async def go() -> None:
        nc = await nats.connect(url)
        try:
            await nc.jetstream().publish(subject, data, stream=DEFAULT_STREAM, headers=headers)
        finally:
            await nc.close()

    asyncio.run(go())


def same_answers(root: Path, dsn: str, pods: tuple[str, ...] = ("uid-a", "uid-b")) -> None:
    """``fleet usage``, ``fleet audit pod`` and ``fleet audit device`` are the node's own answers."""
    last = json.loads(run_cli("log", "--output", "json", root=root).stdout.splitlines()[-1])
    until = iso(last["ts_ns"] + 1)
    for by in ("pod", "namespace", "resource"):
        node = run_cli("audit", "usage", "--by", by, "--until", until, "-o", "json", root=root, check=True)
        fleet = run_cli("fleet", "usage", "--by", by, "--until", until, "-o", "json", "--postgres", dsn, check=True)
        assert json.loads(fleet.stdout) == json.loads(node.stdout), by
        assert json.loads(node.stdout), by
    for pod in pods:
        node = run_cli("audit", "pod", pod, "-o", "json", root=root, check=True)
        fleet = run_cli("fleet", "audit", "pod", pod, "-o", "json", "--postgres", dsn, check=True)
        (answer,) = json.loads(fleet.stdout)
        assert answer.pop("node") == NODE_NAME and answer.pop("log_id")
        assert answer == json.loads(node.stdout), pod
    held = 0
    for dev in ("dev-0", "dev-1", "dev-2", "dev-3"):
        own = json.loads(run_cli("audit", "device", RESOURCE, dev, "-o", "json", root=root, check=True).stdout)
        fleet_answer = run_cli("fleet", "audit", "device", RESOURCE, dev, "-o", "json", "--postgres", dsn, check=True)
        (answer,) = json.loads(fleet_answer.stdout)
        assert answer["log"] is None  # the fleet lacks none of the node's records
        assert {k: v for k, v in answer.items() if k not in ("node", "log_id", "log")} == {
            k: v for k, v in own.items() if k != "log"
        }, dev
        held += bool(own["holders"])
    assert held  # something to compare


def test_hostile_messages_are_quarantined_and_the_nodes_own_records_are_stored(
    root: Path,
    tmp_path: Path,
    nats_server: NatsServer,
    postgres_server: PostgresServer,
    daemon_factory: type[Daemon],
    plugin: type[Plugin],
) -> None:
    dsn = postgres_server.dsn
    flags = (*STATIC, "--fleet-nats", nats_server.url, "--node-name", NODE_NAME)
    daemon = daemon_factory(*flags)
    plugin().wait_registered()
    admit(root, tmp_path, "a", 2)
    with sink_process(tmp_path, nats_server.url, dsn) as sink:
        daemon.eventually(lambda: all_stored(root, dsn), "the node's records in PostgreSQL")
        node = Node(NODE_NAME, stored_log_id(dsn))
        subject = node.subject()
        last = log_count(root)
        real = {NODE: node.name, LOG: node.log_id, TYPE: "PodAdmitted", FOLLOWS: str(last)}
        # a sequence beyond a bigint: it used to kill every sink in turn
        publish(nats_server.url, subject, b"hello", {**real, SEQ: "99999999999999999999", MSG_ID: "big"})
        # the headers name another node than the subject
        publish(nats_server.url, subject, b"hello", {**real, NODE: "node-b", SEQ: str(last + 1), MSG_ID: "b"})
        daemon.stop()
        daemon.eventually(lambda: all_stored(root, dsn), "the node's records up to its stop")
        last = log_count(root)
        # under the node's next sequence, before the node: a payload that is no record, then a
        # well-formed record that does not link to the node's, under the id the node used to use
        nxt = {**real, SEQ: str(last + 1), FOLLOWS: str(last)}
        publish(nats_server.url, subject, b"hello", {**nxt, MSG_ID: f"{node.name}:{node.log_id}:{last + 1}:x"})
        forged = encode_payload(ev.PodAdmitted(pod=ev.PodRef(uid="evil", namespace="x", name="y")), 1, "", b"f" * 16)
        publish(nats_server.url, subject, forged, {**nxt, MSG_ID: f"{node.name}:{node.log_id}:{last + 1}"})
        # the same sequence, saying the node's last two records were cut before they were shipped
        # (its link then cannot be checked); but they are stored: the cut is false
        cut = encode_payload(ev.PodAdmitted(pod=ev.PodRef(uid="evil", namespace="x", name="z")), 1, "", b"c" * 16)
        publish(nats_server.url, subject, cut, {**nxt, FOLLOWS: str(last - 2), MSG_ID: "cut"})
        before = registrations(root)
        daemon = daemon_factory(*flags)  # its stream's last message on its subject is the forgery
        daemon.eventually(lambda: registrations(root) > before, "the plugin registered again")
        admit(root, tmp_path, "b", 3)
        daemon.eventually(lambda: all_stored(root, dsn), "the node's own records stored after the forgeries")
        kinds = sorted(k for k, _, _ in eventually(lambda: len(quarantined(dsn)) >= 5 and quarantined(dsn), "5"))
        assert kinds == ["headers", "link", "link", "payload", "subject"], "\n".join(map(str, quarantined(dsn)))
        assert any("were never shipped" in reason for _, _, reason in quarantined(dsn)), quarantined(dsn)
        assert sink.alive(), sink.output()
        status = json.loads(run_cli("status", "-o", "json", root=root, check=True).stdout)
        assert status["fleet"]["state"] == "connected", status["fleet"]
        assert "does not link to the log's record" in status["fleet"]["reason"], status["fleet"]
        metrics = sink.metrics()
        for kind in kinds:
            n = kinds.count(kind)
            assert f'eventsrc_fleet_sink_messages_quarantined_total{{kind="{kind}"}} {n}.0' in metrics, metrics
        with psycopg.connect(dsn) as conn:
            applied = conn.execute("SELECT applied_seq FROM node_logs WHERE node = %s", (NODE_NAME,)).fetchone()
        assert applied == (log_count(root),)
        same_answers(root, dsn)


def stored_log_id(dsn: str) -> str:
    """The node's log id, as the sink stored it (the daemon holds its log open)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT log_id FROM records WHERE node = %s LIMIT 1", (NODE_NAME,)).fetchone()
    assert row is not None
    return str(row[0])


def sink_role(dsn: str) -> str:
    """A role of its own for the sink (privileges can be taken from it), and its DSN."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE ROLE sinker LOGIN")
        conn.execute("GRANT CREATE ON SCHEMA public TO sinker")
    return dsn.replace("user=eventsrc", "user=sinker")


def said(sink: Sink, words: str) -> bool:
    assert sink.alive(), sink.output()
    return words in sink.output()


def test_a_revoked_insert_is_said_once_retried_and_everything_arrives_after_the_grant(
    root: Path,
    tmp_path: Path,
    nats_server: NatsServer,
    postgres_server: PostgresServer,
    daemon_factory: type[Daemon],
    plugin: type[Plugin],
) -> None:
    dsn = postgres_server.dsn
    assert "user=eventsrc" in dsn
    sink_dsn = sink_role(dsn)
    daemon = daemon_factory(*STATIC, "--fleet-nats", nats_server.url, "--node-name", NODE_NAME)
    plugin().wait_registered()
    admit(root, tmp_path, "a", 2)
    with sink_process(tmp_path, nats_server.url, sink_dsn) as sink:
        daemon.eventually(lambda: all_stored(root, dsn), "the node's records in PostgreSQL")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("REVOKE INSERT ON records FROM sinker")
        admit(root, tmp_path, "b", 3)
        eventually(lambda: said(sink, "the database refuses the records"), "the refusal said")
        assert "eventsrc_fleet_sink_database_failing 1.0" in sink.metrics()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("GRANT INSERT ON records TO sinker")
        daemon.eventually(lambda: all_stored(root, dsn), "every record after the GRANT")
        eventually(lambda: said(sink, "the database takes records again"), "the recovery said")
        assert sink.output().count("the database refuses the records") == 1, sink.output()  # once per reason
        assert "Traceback" not in sink.output()
        same_answers(root, dsn)


@contextlib.contextmanager
def small_disk(path: Path, owner: int) -> Iterator[Path]:
    path.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8M", "tmpfs", str(path)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a small tmpfs here: {exc}")
    try:
        (path / "space").mkdir()
        os.chown(path / "space", owner, -1)
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> None:
    """Fill the file system ``path`` is on to its last byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 16, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)


@pytest.mark.skipif(os.geteuid() != 0, reason="a small disk to fill needs root (mount -t tmpfs)")
def test_a_full_disk_is_said_and_retried_and_the_sink_carries_on_once_there_is_room(
    root: Path,
    tmp_path: Path,
    nats_server: NatsServer,
    postgres_server: PostgresServer,
    daemon_factory: type[Daemon],
    plugin: type[Plugin],
) -> None:
    dsn = postgres_server.dsn
    owner = os.stat(postgres_server.directory).st_uid
    daemon = daemon_factory(*STATIC, "--fleet-nats", nats_server.url, "--node-name", NODE_NAME)
    plugin().wait_registered()
    admit(root, tmp_path, "a", 2)
    with small_disk(Path(f"/tmp/es-disk-{os.getpid()}-{id(tmp_path)}"), owner) as disk:
        with sink_process(tmp_path, nats_server.url, dsn) as sink:
            daemon.eventually(lambda: all_stored(root, dsn), "the node's records in PostgreSQL")
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"CREATE TABLESPACE small LOCATION '{disk / 'space'}'")
                conn.execute("ALTER TABLE records SET TABLESPACE small")
            fill(disk / "filler")
            for n in range(3):  # more than a page of records
                admit(root, tmp_path, f"p{n}", 1)
                run_cli("remove", f"uid-p{n}", root=root, check=True)
                if said(sink, "the database refuses the records"):
                    break
            eventually(lambda: said(sink, "the database refuses the records"), "the full disk said")
            assert not all_stored(root, dsn)
            (disk / "filler").unlink()
            daemon.eventually(lambda: all_stored(root, dsn), "every record once there is room")
            eventually(lambda: said(sink, "the database takes records again"), "the recovery said")
            assert "Traceback" not in sink.output()
            same_answers(root, dsn, ("uid-a", "uid-p0"))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE records SET TABLESPACE pg_default")
            conn.execute("DROP TABLESPACE small")
