"""Export as JSON lines, and the node API's Watch: the history PodResources lacks."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import grpc

from eventsrc.gen.node.v1 import node_pb2 as pb
from eventsrc.layout import Layout
from eventsrc.log.store import EventLog
from tests.conftest import run_cli
from tests.node.test_history import T0, cut, flaps
from tests.support.grpcio_stubs import stubs, unix_target


def refused_pod(tmp_path: Path) -> Path:
    """A pod manifest asking for a resource no plugin offers: its admission is refused, and
    the refusal recorded (AdmissionRejected)."""
    pod = tmp_path / "p.yaml"
    pod.write_text(
        "kind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, resources: {limits: {example.com/x: 1}}}]}\n"
    )
    return pod


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
    assert run_cli("admit", "-f", str(refused_pod(tmp_path)), root=root).returncode == 1  # refused: recorded
    assert done.wait(20)
    channel.close()
    assert got[0].seq == 1 and got[0].type == "DaemonStarted"
    assert [e.seq for e in got] == list(range(1, len(got) + 1))
    rejected = got[-1]
    assert rejected.type == "AdmissionRejected"
    assert "example.com/x" in json.loads(rejected.event_json)["reason"]


def test_watch_before_a_trimmed_logs_start_starts_there_and_says_what_it_skipped(
    root: Path, tmp_path: Path, daemon_factory
) -> None:  # type: ignore[no-untyped-def]
    """A node whose retention cut its log at record 1600 (ADR 0018: a Watch asking for a
    sequence before the base starts at the base). Every distance below the base, the default
    from_seq 0 included, gets the live log's first record at once, marked with where the
    skipped records start; then new records as they come."""
    layout = Layout(root)
    layout.state.mkdir(parents=True)
    log = EventLog(layout.log)
    flaps(log, 2000)
    log.append([cut(log, layout.archive, 1600)], "trim", T0)
    log.close()
    daemon_factory("--log-retention-max-size", "1Gi", "--snapshot-every", "100")
    with EventLog(layout.log, readonly=True) as reader:
        assert reader.first_seq() == 1601
    channel = grpc.insecure_channel(unix_target(root / "eventsrc" / "api.sock"))
    node = stubs("node/v1/node.proto").NodeStub(channel)
    try:
        for from_seq in (1601, 1600, 1599, 1091, 1090, 1089, 1088, 600, 1, 0):
            call = node.Watch(pb.WatchRequest(from_seq=from_seq), timeout=20)
            first = next(call)
            call.cancel()
            assert (first.seq, first.type) == (1601, "DeviceHealthChanged"), from_seq
            assert first.skipped_from == (0 if from_seq == 1601 else max(from_seq, 1)), from_seq

        call = node.Watch(pb.WatchRequest(), timeout=30)  # from_seq 0: what follows, new records included
        with EventLog(layout.log, readonly=True) as reader:
            last = reader.last_seq()
        got = [next(call) for _ in range(last - 1600)]
        assert run_cli("admit", "-f", str(refused_pod(tmp_path)), root=root).returncode == 1  # refused: recorded
        while got[-1].type != "AdmissionRejected":
            got.append(next(call))
        call.cancel()
    finally:
        channel.close()
    assert [e.seq for e in got] == list(range(1601, 1601 + len(got)))
    assert [e.skipped_from for e in got] == [1] + [0] * (len(got) - 1)


def test_a_watcher_that_stops_reading_is_cut_off_and_told_where_to_go_on_while_others_read_on(
    root: Path, tmp_path: Path, daemon_factory
) -> None:  # type: ignore[no-untyped-def]
    """A history larger than a stream window (5,000 records). One watcher reads a record
    and stops; another reads the whole history meanwhile, and an admission is decided: the
    stalled one holds up neither. After --watch-stall-timeout the stalled stream is ended
    with RESOURCE_EXHAUSTED naming the seq to watch again from: the one after the last it
    was sent, so that nothing is lost between its two streams."""
    layout = Layout(root)
    layout.state.mkdir(parents=True)
    log = EventLog(layout.log)
    flaps(log, 5_000)
    log.close()
    d = daemon_factory("--watch-stall-timeout", "1s")
    # no window grown by bandwidth probes: the stream's window stays its initial 64 KiB
    channel = grpc.insecure_channel(unix_target(root / "eventsrc" / "api.sock"), options=[("grpc.http2.bdp_probe", 0)])
    node = stubs("node/v1/node.proto").NodeStub(channel)
    try:
        stalled = node.Watch(pb.WatchRequest(from_seq=1), timeout=120)
        assert next(stalled).seq == 1
        reader = node.Watch(pb.WatchRequest(from_seq=1), timeout=120)
        last = 0
        for e in reader:
            assert e.seq == last + 1
            last = e.seq
            if last == 5_000:
                break
        reader.cancel()
        assert run_cli("admit", "-f", str(refused_pod(tmp_path)), root=root).returncode == 1  # decided, recorded
        d.eventually(lambda: "watch stream cut off" in d.output(), "the stalled watcher to be cut off")
        seqs = [1]
        try:
            for e in stalled:
                seqs.append(e.seq)
            raise AssertionError("the stalled watcher's stream ended without a status")
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
            details = err.details()
    finally:
        channel.close()
    assert seqs == list(range(1, len(seqs) + 1))  # what it was sent, in order, before the end
    assert 1 < len(seqs) < 5_000  # its window's worth, not the whole history
    assert details.endswith(f"watch again from seq {len(seqs) + 1} to go on"), details
