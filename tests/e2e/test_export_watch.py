"""Export as JSON lines, and the node API's Watch: the history PodResources lacks."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import grpc

from eventsrc.gen.node.v1 import node_pb2 as pb
from tests.conftest import run_cli
from tests.support.grpcio_stubs import stubs, unix_target


def test_export_is_resumable_jsonl(root: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d = daemon_factory()
    d.stop()
    lines = run_cli("export", root=root, check=True).stdout.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert all({"seq", "ts_ns", "type", "correlation_id", "event"} <= r.keys() for r in records)
    # A consumer that saw up to sequence 2 resumes from 3.
    rest = [
        json.loads(line)["seq"] for line in run_cli("export", "--from", "3", root=root, check=True).stdout.splitlines()
    ]
    assert rest == [r["seq"] for r in records[2:]]
    assert run_cli("export", "--from", "0", root=root).returncode == 1


def test_watch_streams_history_then_new_records(root: Path, tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    daemon_factory()
    got: list[pb.WatchEvent] = []
    done = threading.Event()
    channel = grpc.insecure_channel(unix_target(root / "eventsrc" / "api.sock"))
    node = stubs("node/v1/node.proto").NodeStub(channel)

    def watch() -> None:
        try:
            for ev in node.Watch(pb.WatchRequest(from_seq=1), timeout=20):
                got.append(ev)
                if any(e.type == "AdmissionRejected" for e in got):
                    done.set()
                    return
        except grpc.RpcError:
            done.set()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    pod = tmp_path / "p.yaml"
    pod.write_text(
        "kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, resources: {limits: {example.com/x: 1}}}]}\n"
    )
    assert run_cli("admit", "-f", str(pod), root=root).returncode == 1  # refused: recorded
    assert done.wait(20)
    channel.close()
    assert got[0].seq == 1 and got[0].type == "DaemonStarted"
    assert [e.seq for e in got] == list(range(1, len(got) + 1))
    rejected = got[-1]
    assert rejected.type == "AdmissionRejected"
    assert "example.com/x" in json.loads(rejected.event_json)["reason"]
