"""Reading across versions (docs/adr/0010): what this eventsrc does with a log a newer one wrote.

The fixture is a log this version wrote, followed by records as a newer eventsrc would
write them: an event type this code does not know, a newer version of a known type, and
an unknown type the writer marked safe to ignore. Readers show them raw and go on; the
daemon refuses to write on the log until a version that reads them runs it.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import msgspec
import pytest

from eventsrc import events as ev
from eventsrc.events import FutureRecordError, chain_hash, decode_record
from eventsrc.layout import Layout
from eventsrc.log.store import EventLog, seq_key
from tests.conftest import run_cli

TS = 1_760_000_000_000_000_000

#: (type, version, body, skippable) as a newer eventsrc writes them.
UNKNOWN_TYPE = (
    "DevicesShared",
    1,
    {"resource": "example.com/dev", "device_ids": ["dev-0"], "pods": ["u1", "u2"]},
    False,
)
NEWER_VERSION = ("PodRemoved", ev.PodRemoved.VERSION + 1, {"pod": {"uid": "u1"}, "reason": "evicted"}, False)
SKIPPABLE = ("NodeNoteAdded", 1, {"note": "kernel upgraded", "blob": b"\x00\x01"}, True)


def raw_value(type_name: str, version: int, body: object, prev: bytes, skippable: bool = False, seq: int = 0) -> bytes:
    envelope: list[object] = [type_name, version, TS + seq, f"cid-future-{seq}", body, prev]
    if skippable:
        envelope.append(True)
    payload = msgspec.msgpack.encode(envelope)
    return struct.pack(">I", zlib.crc32(payload)) + payload


def write_log(root: Path, future: list[tuple[str, int, dict[str, object], bool]]) -> int:
    """A log with a device plugin's records, then ``future`` records (hash chain intact).
    Returns the last sequence."""
    layout = Layout(root)
    layout.create()
    with EventLog(layout.log) as log:
        log.append(
            [
                ev.DaemonStarted(boot_id="b", version="9.9.0", instance_id="i"),
                ev.PluginRegistered(resource="example.com/dev", endpoint="dev.sock"),
                ev.DevicesAdded(resource="example.com/dev", devices=[ev.DeviceInfo(id="dev-0", health="Healthy")]),
            ],
            "cid",
            TS,
        )
        seq = log.last_seq()
        with log.env.begin(write=True, db=log.events_db) as txn:
            prev = chain_hash(bytes(txn.get(seq_key(seq))))
            for type_name, version, body, skippable in future:
                seq += 1
                value = raw_value(type_name, version, body, prev, skippable, seq)
                txn.put(seq_key(seq), value, append=True)
                prev = chain_hash(value)
    return seq


def test_a_newer_record_is_kept_whole_and_named() -> None:
    for type_name, version, body, skippable in (UNKNOWN_TYPE, NEWER_VERSION, SKIPPABLE):
        with pytest.raises(FutureRecordError) as err:
            decode_record(7, raw_value(type_name, version, body, b"", skippable, 7))
        e = err.value
        assert (e.seq, e.type_name, e.version, e.body, e.skippable) == (7, type_name, version, body, skippable)
        assert e.correlation_id == "cid-future-7" and e.ts_ns == TS + 7
        assert "newer eventsrc" in str(e) and "corrupt" not in str(e)


def test_readers_show_newer_records_raw_and_go_on(root: Path) -> None:
    last = write_log(root, [UNKNOWN_TYPE, NEWER_VERSION, SKIPPABLE])
    proc = run_cli("log", root=root)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 + last  # the header, then every record
    assert "DevicesShared?" in lines[4] and "device_ids=[dev-0]" in lines[4] and "pods=[u1,u2]" in lines[4]
    assert "PodRemoved?" in lines[5] and "reason=evicted" in lines[5]
    assert "NodeNoteAdded?" in lines[6]
    assert "records 4, 5 were written by a newer eventsrc" in proc.stderr.replace("record(s)", "records")
    assert "corrupt" not in proc.stderr  # the skippable one is not an error either
    records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root).stdout.splitlines()]
    assert records[3] == {
        "seq": 4,
        "ts_ns": TS + 4,
        "time": records[3]["time"],
        "correlation_id": "cid-future-4",
        "type": "DevicesShared",
        "version": 1,
        "event": UNKNOWN_TYPE[2],
        "unreadable": True,
        "reason": records[3]["reason"],
    }
    assert records[5]["event"]["blob"] == "AAE="  # bytes, as base64

    state = run_cli("state", "-o", "json", root=root)
    assert state.returncode == 1  # the views miss what records 4 and 5 did
    views = json.loads(state.stdout)
    assert sorted(views["meta"]["corrupt"]) == ["4", "5"]
    assert "dev-0" in views["devices"]["devices"]["example.com/dev"]
    assert run_cli("audit", "verify", root=root).returncode == 0  # the chain is over the bytes: it holds
    assert run_cli("audit", "device", "example.com/dev", "dev-0", root=root).returncode == 0
    replay = run_cli("replay", "--step", root=root)
    assert replay.returncode in (0, 1)
    steps = {line.split()[0]: line for line in replay.stdout.splitlines() if line.strip()[:1].isdigit()}
    assert "DevicesShared?" in steps["4"] and "device_ids=[dev-0]" in steps["4"] and "not applied" in steps["4"]
    assert "PodRemoved?" in steps["5"] and "reason=evicted" in steps["5"]
    assert "CORRUPT" not in replay.stdout


def test_the_daemon_does_not_write_on_a_log_it_cannot_read(root: Path) -> None:
    last = write_log(root, [UNKNOWN_TYPE])
    proc = run_cli("serve", root=root, timeout=30)
    assert proc.returncode == 3, proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("eventsrc: error: 1 record(s) of the log were written by a newer eventsrc")
    assert "DevicesShared v1" in error and "9.9.0" in error
    with EventLog(Layout(root).log, readonly=True) as log:
        assert log.last_seq() == last  # nothing written: no DaemonStarted, no releases


def test_the_daemon_runs_past_a_record_it_may_ignore(root: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    write_log(root, [SKIPPABLE])
    daemon = daemon_factory()
    assert daemon.stop() == 0
    assert "newer eventsrc" not in daemon.output() and "level=ERROR" not in daemon.output()
    proc = run_cli("log", "-o", "json", root=root)
    assert proc.returncode == 0
    types = [json.loads(line)["type"] for line in proc.stdout.splitlines()]
    assert types[3] == "NodeNoteAdded" and types[4] == "DaemonStarted" and types[-1] == "DaemonStopped"
    assert "CorruptRecordFound" not in types


def test_a_newer_log_format_is_not_opened(root: Path) -> None:
    write_log(root, [])
    with EventLog(Layout(root).log) as log, log.env.begin(write=True, db=log.meta_db) as txn:
        txn.put(b"format", b"2")
    for args in (("log",), ("state",), ("serve",)):
        proc = run_cli(*args, root=root, timeout=30)
        assert proc.returncode == 3, (args, proc.stderr)
        assert "has format 2, newer than this eventsrc reads (format 1" in proc.stderr


def test_a_newer_index_stops_writers_and_audit_queries_only(root: Path) -> None:
    write_log(root, [])
    with EventLog(Layout(root).log) as log, log.env.begin(write=True, db=log.meta_db) as txn:
        txn.put(b"index_format", b"2")
    assert run_cli("log", root=root).returncode == 0
    assert run_cli("audit", "verify", root=root).returncode == 0
    for args in (("audit", "device", "example.com/dev", "dev-0"), ("serve",)):
        proc = run_cli(*args, root=root, timeout=30)
        assert proc.returncode == 3, (args, proc.stderr)
        assert "index" in proc.stderr
