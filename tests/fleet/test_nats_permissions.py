"""Only a node publishes as that node (issue 34, item 2): docs/fleet.md's NATS configuration, as
written there, on a real nats-server. A node ships with its own user, its credentials cannot
publish under another node's subject nor purge the stream, a client without credentials cannot
connect, and the sink consumes with its own user."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest

from eventsrc.core.fleet_names import LOG, NODE
from eventsrc.inputs.secret_file import MAX_SECRET_BYTES, SecretFileError, read_secret
from tests.conftest import REPO, Daemon, run_cli
from tests.fleet.test_shipping import admit
from tests.fleet.test_sink import log_count, stored
from tests.support.nats import NatsServer, stream_messages
from tests.support.postgres import PostgresServer

STREAM = "EVENTSRC"
PASSWORDS = {"WORKER_1_PASSWORD": "w1-secret", "WORKER_2_PASSWORD": "w2-secret", "SINK_PASSWORD": "sink-secret"}
ADMIN = ("admin", "admin-secret")  # the test's own reader of the stream, added to the docs' users


def documented_config() -> str:
    """The ``authorization`` block of docs/fleet.md's "NATS permissions", as written there."""
    text = (REPO / "docs" / "fleet.md").read_text()
    section = text.split("## NATS permissions", 1)[1]
    found = re.search(r"```conf\n(.*?)```", section, re.S)
    assert found, "docs/fleet.md's NATS permissions section has no ```conf block"
    return found.group(1)


@pytest.fixture
def nats_with_users(nats_unavailable: str | None, tmp_path: Path) -> Iterator[NatsServer]:
    if nats_unavailable is not None:
        pytest.skip(nats_unavailable)
    variables = "".join(f'{name}: "{password}"\n' for name, password in PASSWORDS.items())
    block = documented_config().replace(
        "  users: [\n", f'  users: [\n    {{ user: {ADMIN[0]}, password: "{ADMIN[1]}" }}\n', 1
    )
    server = NatsServer(tmp_path / "nats", extra_config=variables + block)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def secret(tmp_path: Path, name: str, password: str) -> Path:
    path = tmp_path / name
    path.write_text(password + "\n")
    path.chmod(0o600)
    return path


def try_as(url: str, user: str, password: str, subject: str) -> list[str]:
    """What the server says to ``user`` publishing a record on ``subject`` and purging the
    stream: the errors its connection reports, and each attempt's outcome."""
    said: list[str] = []

    async def error(exc: Exception) -> None:
        said.append(str(exc))

    async def attempt() -> None:
        nc = await nats.connect(url, user=user, password=password, error_cb=error)
        try:
            js = nc.jetstream(timeout=1)  # a refused request is never answered: it times out
            headers = {NODE: "worker-2", "Nats-Msg-Id": "forged"}
            try:
                await js.publish(subject, b"hello", stream=STREAM, headers=headers, timeout=1)
                said.append("publish acknowledged")
            except (TimeoutError, nats.errors.Error, nats.js.errors.Error) as exc:
                said.append(f"publish failed: {type(exc).__name__}")
            try:
                await js.purge_stream(STREAM)
                said.append("purge done")
            except (TimeoutError, nats.errors.Error, nats.js.errors.Error) as exc:
                said.append(f"purge failed: {type(exc).__name__}")
            await nc.flush()
        finally:
            await nc.close()

    asyncio.run(attempt())
    return said


def connects_without_credentials(url: str) -> str:
    async def attempt() -> str:
        async def quiet(exc: Exception) -> None:
            pass

        try:
            nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=1, error_cb=quiet)
        except (nats.errors.Error, OSError) as exc:
            return f"refused: {exc}"
        await nc.close()
        return "connected"

    return asyncio.run(attempt())


def test_a_node_publishes_only_as_itself_and_the_sink_consumes(
    root: Path,
    tmp_path: Path,
    nats_with_users: NatsServer,
    postgres_server: PostgresServer,
    daemon_factory: type[Daemon],
) -> None:
    url = nats_with_users.url
    # worker-1 first: the stream is missing and its user may not make it: it says the server's
    # refusal and tries again
    node_password = secret(tmp_path, "worker-1-password", PASSWORDS["WORKER_1_PASSWORD"])
    daemon = daemon_factory(
        "--fleet-nats", url, "--node-name", "worker-1", "--fleet-nats-password-file", str(node_password)
    )
    admit(root, tmp_path, range(2))
    refused = 'the server refused: nats: permissions violation for publish to \\"$js.api.stream.create.eventsrc\\"'
    daemon.eventually(lambda: refused in daemon.output(), "the node to say it may not make the stream")
    assert stream_messages(url, STREAM, user=ADMIN[0], password=ADMIN[1]) == []  # no stream

    sink_password = secret(tmp_path, "sink-password", PASSWORDS["SINK_PASSWORD"])
    out = open(tmp_path / "sink.log", "w")  # noqa: SIM115
    sink = subprocess.Popen(
        [sys.executable, "-m", "eventsrc", "fleet", "sink", "--nats", url, "--postgres", postgres_server.dsn,
         "--nats-user", "eventsrc-sink", "--nats-password-file", str(sink_password)],
        stdout=out,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        # the sink, with its own user, makes the stream; worker-1 ships into it with its own
        # (no right to create, update, delete or purge it), and the sink stores every record
        daemon.eventually(lambda: stored(postgres_server.dsn) == log_count(root), "every record in PostgreSQL")
        messages = stream_messages(url, STREAM, user=ADMIN[0], password=ADMIN[1])
        assert len(messages) == log_count(root)
        assert {m.headers[NODE] for m in messages} == {"worker-1"}
        assert "fleet shipping connected" in daemon.output()

        # worker-1's credentials under worker-2's subject, and the sink's under worker-1's own:
        # refused by the server (as is a purge), nothing stored
        worker_1 = f"eventsrc.records.worker-1.{messages[0].headers[LOG]}"
        for user, password, subject in (
            ("worker-1", PASSWORDS["WORKER_1_PASSWORD"], "eventsrc.records.worker-2.0123456789abcdef"),
            ("eventsrc-sink", PASSWORDS["SINK_PASSWORD"], worker_1),
        ):
            said = [line.lower() for line in try_as(url, user, password, subject)]
            # the server's refusals, as nats-py tells them (lower case)
            assert f'nats: permissions violation for publish to "{subject.lower()}"' in said, (user, said)
            assert 'nats: permissions violation for publish to "$js.api.stream.purge.eventsrc"' in said, (user, said)
            assert "publish acknowledged" not in said and "purge done" not in said, (user, said)
        after = stream_messages(url, STREAM, user=ADMIN[0], password=ADMIN[1])
        assert after == messages  # nothing forged stored, nothing purged
        # and the fleet's answer is still the node's own
        node = run_cli("audit", "pod", "uid-0", "-o", "json", root=root, check=True)
        fleet = run_cli("fleet", "audit", "pod", "uid-0", "-o", "json", "--postgres", postgres_server.dsn, check=True)
        (answer,) = json.loads(fleet.stdout)
        assert answer.pop("node") == "worker-1" and answer.pop("log_id") == messages[0].headers[LOG]
        assert answer == json.loads(node.stdout)

        # no credentials: no connection
        assert connects_without_credentials(url).startswith("refused"), "a client without credentials connected"
        assert sink.poll() is None, (tmp_path / "sink.log").read_text()
    finally:
        sink.kill()
        sink.wait()
        out.close()


def test_a_bad_password_file_is_refused_in_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # never opened for writing: a blocking open would hang here
    empty = write(tmp_path / "empty", "\n")
    big = write(tmp_path / "big", "x" * (MAX_SECRET_BYTES + 1))
    two = write(tmp_path / "two", "a\nb\n")
    for path, why in ((tmp_path / "none", "No such file"), (fifo, "not a regular file"), (empty, "empty"),
                      (big, f"more than {MAX_SECRET_BYTES} bytes"), (tmp_path, "not a regular file"),
                      (two, "more than one line")):  # fmt: skip
        with pytest.raises(SecretFileError) as info:
            read_secret(path, "--fleet-nats-password-file")
        assert str(info.value).startswith(f"--fleet-nats-password-file {path}: {why}"), info.value
    assert read_secret(write(tmp_path / "ok", "s3cret\n"), "x") == "s3cret"


def test_a_bad_password_file_is_one_line_and_a_non_zero_exit(tmp_path: Path, root: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for argv in (
        ("serve", "--fleet-nats", "nats://127.0.0.1:1", "--node-name", "w-1", "--fleet-nats-password-file", str(fifo)),
        ("fleet", "sink", "--nats", "nats://127.0.0.1:1", "--nats-user", "s", "--nats-password-file", str(fifo)),
    ):  # fmt: skip
        proc = run_cli(*argv, root=root)
        assert proc.returncode != 0, argv
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and f"{fifo}: not a regular file" in lines[0], (argv, proc.stderr)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
