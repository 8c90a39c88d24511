"""A node's log shipped to a real nats-server with JetStream (``serve --fleet-nats``): every
record once, in sequence order, across a SIGKILL of eventsrc and a time the server was away,
and nothing an admission waits for."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from eventsrc.core.fleet_names import LOG, NODE, SEQ, TYPE
from eventsrc.events import decode_record
from eventsrc.node.shipper import WINDOW
from tests.conftest import Daemon, run_cli
from tests.support.nats import NatsServer, stream_messages

STREAM = "EVENTSRC"


def log_records(root: Path) -> list[tuple[int, str]]:
    """(sequence, type) of every record of the node's own log."""
    out = run_cli("log", "--output", "json", root=root, check=True).stdout
    return [(r["seq"], r["type"]) for r in map(json.loads, out.splitlines())]


def shipped(url: str) -> list[tuple[int, str, str, str]]:
    """Every message of the stream, in the stream's order: (sequence, type, node, log id),
    each payload decoded as the log decodes a record and checked against its headers."""
    out = []
    for m in stream_messages(url, STREAM):
        seq = int(m.headers[SEQ])
        record = decode_record(seq, m.data)
        assert type(record.event).__name__ == m.headers[TYPE]
        out.append((seq, m.headers[TYPE], m.headers[NODE], m.headers[LOG]))
    return out


def admit(root: Path, tmp_path: Path, names: range) -> None:
    for i in names:
        manifest = tmp_path / f"p{i}.yaml"
        manifest.write_text(f"kind: Pod\nmetadata: {{name: p{i}, uid: uid-{i}}}\nspec: {{containers: [{{name: a}}]}}\n")
        run_cli("admit", "-f", str(manifest), root=root, check=True)


def all_shipped_once(root: Path, url: str) -> bool:
    ours = log_records(root)
    theirs = shipped(url)
    return [(seq, kind) for seq, kind, _, _ in theirs] == ours


def test_every_record_is_shipped_once_in_order_across_a_sigkill_and_a_server_away(
    root: Path, tmp_path: Path, nats_server: NatsServer, daemon_factory: type[Daemon]
) -> None:
    flags = ("--fleet-nats", nats_server.url, "--node-name", "node-a.example")
    daemon = daemon_factory(*flags)
    admit(root, tmp_path, range(3))
    daemon.eventually(lambda: all_shipped_once(root, nats_server.url), "every record shipped")
    (log_id,) = {log_id for _, _, _, log_id in shipped(nats_server.url)}
    assert {node for _, _, node, _ in shipped(nats_server.url)} == {"node-a.example"}

    before = len(shipped(nats_server.url))
    daemon.stop(signal.SIGKILL)  # shipping resumes from what the stream holds, not from 1
    daemon = daemon_factory(*flags)
    daemon.eventually(lambda: "fleet shipping connected" in daemon.output(), "shipping to connect")
    # from the stream's last, less the window sent again (a hole the run before may have left)
    assert f"from_seq={max(1, before + 1 - WINDOW)}" in daemon.output()
    admit(root, tmp_path, range(3, 5))
    daemon.eventually(lambda: all_shipped_once(root, nats_server.url), "every record shipped after the SIGKILL")

    nats_server.stop()  # away: admissions go on, nothing waits for the fleet
    admit(root, tmp_path, range(5, 8))
    nats_server.start()
    daemon.eventually(lambda: all_shipped_once(root, nats_server.url), "every record shipped once it came back")
    assert {log for _, _, _, log in shipped(nats_server.url)} == {log_id}


def test_a_bad_node_name_or_server_url_is_one_line(root: Path) -> None:
    bad_name = run_cli("serve", "--fleet-nats", "nats://127.0.0.1:1", "--node-name", "Node_A", root=root)
    assert bad_name.returncode != 0
    assert "is not a DNS-1123 subdomain" in bad_name.stderr and "Traceback" not in bad_name.stderr
    bad_url = run_cli("serve", "--fleet-nats", "http://x", root=root)
    assert bad_url.returncode != 0
    assert "is not a NATS server URL" in bad_url.stderr and len(bad_url.stderr.strip().splitlines()) == 1
