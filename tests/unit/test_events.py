"""The event schema: round trips, checksums, versions and upcasting, the JSON Schema file."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pytest

from eventsrc import events as ev
from eventsrc.codegen.schema import SCHEMA_PATH, generate
from eventsrc.events import EVENT_TYPES, CorruptRecordError, decode_record, encode_payload, upcast
from eventsrc.log.store import EventLog
from eventsrc.state.apply import rebuild

FIXTURES = Path(__file__).parent.parent / "fixtures"


def sample(cls: type) -> object:
    """An instance of every event type, built from its required fields."""
    values = {
        str: "x",
        int: 7,
        bool: True,
    }
    kwargs = {}
    for f in msgspec.structs.fields(cls):
        if f.required:
            t = f.type
            if t in values:
                kwargs[f.name] = values[t]
            elif t == ev.PodRef:
                kwargs[f.name] = ev.PodRef(uid="u")
            elif t == ev.ClaimRef:
                kwargs[f.name] = ev.ClaimRef(uid="c")
            elif t == ev.ContainerSpec:
                kwargs[f.name] = ev.ContainerSpec(name="c", kind="init", requests={"cpu": "1"})
            elif t == list[str]:
                kwargs[f.name] = ["a", "b"]
            elif t == list[int]:
                kwargs[f.name] = [1, 2]
            elif t == list[ev.DeviceInfo]:
                kwargs[f.name] = [ev.DeviceInfo(id="d", health="Healthy", numa_nodes=[0])]
            elif t == list[ev.MemoryBlock]:
                kwargs[f.name] = [ev.MemoryBlock(numa_affinity=[0, 1], type="hugepages-2Mi", size=4 << 20)]
            elif t == dict[str, dict[str, int]]:
                kwargs[f.name] = {"0": {"memory": 1 << 30}}
            else:
                raise AssertionError(f"no sample for {cls.__name__}.{f.name}: {t}")
    return cls(**kwargs)


@pytest.mark.parametrize("name", sorted(EVENT_TYPES))
def test_every_event_round_trips(name: str) -> None:
    event = sample(EVENT_TYPES[name])
    value = encode_payload(event, 123, "cid")  # type: ignore[arg-type]
    rec = decode_record(9, value)
    assert rec.event == event
    assert (rec.seq, rec.ts_ns, rec.correlation_id, rec.version) == (9, 123, "cid", EVENT_TYPES[name].VERSION)


def test_every_event_name_is_past_tense_and_unique() -> None:
    assert len(EVENT_TYPES) >= 26
    for name in EVENT_TYPES:
        assert name.endswith(("ed", "Found")), name


def test_flipped_byte_is_caught_by_the_checksum() -> None:
    value = bytearray(encode_payload(ev.DevicesRemoved(resource="r", device_ids=["a"]), 1, "c"))
    for i in range(len(value)):
        broken = bytearray(value)
        broken[i] ^= 0x01
        with pytest.raises(CorruptRecordError) as err:
            decode_record(5, bytes(broken))
        assert err.value.seq == 5
        assert "record 5" in str(err.value)


def test_truncated_and_unknown_records_are_named() -> None:
    with pytest.raises(CorruptRecordError, match="too short"):
        decode_record(1, b"\x00\x01")
    payload = msgspec.msgpack.encode(["NoSuchEvent", 1, 1, "c", {}])
    import struct
    import zlib

    with pytest.raises(CorruptRecordError, match="unknown event type"):
        decode_record(2, struct.pack(">I", zlib.crc32(payload)) + payload)
    payload = msgspec.msgpack.encode(["PodRemoved", 99, 1, "c", {"pod_uid": "u"}])
    with pytest.raises(CorruptRecordError, match="newer"):
        decode_record(3, struct.pack(">I", zlib.crc32(payload)) + payload)


def test_upcaster_chain_runs_every_step() -> None:
    assert upcast("DeviceHealthChanged", 1, {"resource": "r", "device_id": "d", "healthy": True}) == {
        "resource": "r",
        "device_id": "d",
        "health": "Healthy",
        "numa_nodes": [],
    }
    assert upcast("DeviceHealthChanged", 2, {"resource": "r", "device_id": "d", "health": "Unhealthy", "numa_node": 3})[
        "numa_nodes"
    ] == [3]


def test_additive_field_is_read_by_older_and_newer_code() -> None:
    # A newer writer added a field: today's code ignores it. An older writer lacked one
    # with a default: today's code fills it.
    payload = msgspec.msgpack.encode(["PodRemoved", 1, 1, "c", {"pod_uid": "u", "reason": "r", "added_later": 5}])
    import struct
    import zlib

    rec = decode_record(1, struct.pack(">I", zlib.crc32(payload)) + payload)
    assert rec.event == ev.PodRemoved(pod_uid="u", reason="r")
    payload = msgspec.msgpack.encode(["PodRemoved", 1, 1, "c", {"pod_uid": "u"}])
    rec = decode_record(1, struct.pack(">I", zlib.crc32(payload)) + payload)
    assert rec.event == ev.PodRemoved(pod_uid="u", reason="")


def test_reads_a_log_written_by_an_older_version(tmp_path: Path) -> None:
    copy = tmp_path / "log"
    shutil.copytree(FIXTURES / "log-v1", copy)
    log = EventLog(copy, readonly=True)
    records = list(log.records())
    assert [r.seq for r in records] == list(range(1, 9))
    assert all(not isinstance(r, CorruptRecordError) for r in records)
    by_seq = {r.seq: r for r in records}  # type: ignore[union-attr]
    assert by_seq[4].event == ev.DeviceHealthChanged(
        resource="example.com/gpu", device_id="gpu-0", health="Unhealthy", numa_nodes=[]
    )
    assert by_seq[4].version == 1
    assert by_seq[5].event == ev.DeviceHealthChanged(
        resource="example.com/gpu", device_id="gpu-1", health="Healthy", numa_nodes=[1]
    )
    assert by_seq[6].event == ev.PodAdmitted(pod=ev.PodRef(uid="uid-old-pod", namespace="default", name="legacy"))
    assert by_seq[1].event.instance_id == ""  # type: ignore[union-attr]
    views = rebuild(log.records())
    gpus = views.devices.devices["example.com/gpu"]
    assert gpus["gpu-0"].health == "Unhealthy"
    assert gpus["gpu-1"].numa_nodes == [1]
    assert gpus["gpu-1"].holder == "uid-old-pod/main"
    assert views.pods.pods["uid-old-pod"].containers["main"].allocations["example.com/gpu"].envs == {"GPU": "1"}
    assert not views.meta.running and views.meta.boots == 1


def test_json_schema_file_matches_the_code() -> None:
    assert SCHEMA_PATH.read_text() == generate(), (
        "schemas/events.schema.json is stale: run 'python -m eventsrc.codegen.schema --write'"
    )


def test_json_schema_validates_log_output() -> None:
    import json

    schema = json.loads(generate())
    assert set(schema["properties"]["type"]["enum"]) == set(EVENT_TYPES)
    for name, cls in EVENT_TYPES.items():
        assert schema["$defs"][name]["x-eventsrc-version"] == cls.VERSION
