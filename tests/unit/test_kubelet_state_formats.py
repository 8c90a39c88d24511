"""The CPU and memory managers' checkpoints in every format a kubelet from 1.20 to 1.37 writes
(issue 35 items 1 and 9): the kubelet's own test cases as data (what it accepts, eventsrc
accepts; what it refuses, eventsrc refuses), its checksum literals, each era's file written by
the stand-in's writers and read back to one answer, and the bounds on what a file may say."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from eventsrc.inputs import kubelet_checkpoints as ki
from eventsrc.node.beside import _read_checkpoints
from testbed.servers import kubelet_checkpoints as kc

_C = TypeVar("_C", ki.CPUCheckpoint, ki.MemoryCheckpoint)

# --------------------------------------------------------------------------- CPU manager

_V3_KEYS = '"entries":{"pod1":{"container1":"5-6","container2":"3-4"}},"podEntries":{"pod2":{"cpuSet":"7-9"}}'
_DATA = json.dumps('{"policyName":"static","defaultCPUSet":"1-3","entries":{"pod":{"container1":"4-6"}}}')
_DATA_NONE = json.dumps('{"policyName":"none","defaultCPUSet":"4-6"}')
_V3_STATIC = f'"policyName":"static","defaultCPUSet":"1-2",{_V3_KEYS}'

# (case, file, the format it is read as or None when refused, what the refusal says)
CPU_CASES = [
    # pkg/kubelet/cm/cpumanager/state/state_checkpoint_test.go (1.20-1.37), checksums as written there
    ("v2 default cpu set", '{"policyName":"none","defaultCPUSet":"4-6","entries":{},"checksum":354655845}', "v2", ""),
    (
        "v2 valid",
        '{"policyName":"none","defaultCPUSet":"1-3","entries":{"pod":{"container1":"4-6","container2":"1-3"}},'
        '"checksum":3610638499}',
        "v2",
        "",
    ),
    (
        "v2 migration (1.36's test: hashed as v3, empty pod entries left out)",
        '{"policyName":"static","defaultCPUSet":"7-9","entries":{"pod":{"container1":"4-6","container2":"1-3"}},'
        '"checksum":1942532442}',
        "v3",
        "",
    ),
    ("v1 checksum", '{"policyName":"none","defaultCPUSet":"1-3","checksum":1694838852}', "v1", ""),
    (
        "v1 migration",
        '{"policyName":"static","defaultCPUSet":"7-9","entries":{"containerID1":"4-6","containerID2":"1-3"},'
        '"checksum":2026311253}',
        "v1",
        "",
    ),
    ("v3 static", f'{{{_V3_STATIC},"checksum":2284712151}}', "v3", ""),
    (
        "v3 none",
        '{"policyName":"none","defaultCPUSet":"1-3","entries":{"pod1":{"container1":"4-6","container2":"1-3"}},'
        '"podEntries":{"pod2":{"cpuSet":"7-9"}},"checksum":751755688}',
        "v3",
        "",
    ),
    ("corrupted", '{"policyName":"none","defaultCPUSet":"4-6","entries":{},"checksum":1337}', None, "corrupted"),
    ("without data section", '{"checksum":1234}', None, "corrupted"),
    ("invalid JSON", "{", None, "not valid JSON"),
    (
        "v3 checksum changed",
        f'{{{_V3_STATIC},"checksum":2284712150}}',
        None,
        "corrupted",
    ),
    # 1.37 does not fall back from a file with data or dataChecksum, and checks dataChecksum only:
    # the {data, checksum} form of 1.37's development (the kubelet's test literals) is refused
    ("data without dataChecksum", f'{{"data":{_DATA},"checksum":1420829534}}', None, "checksum is 0"),
    (
        "data, no checksum at all",
        f'{{"data":{_DATA_NONE}}}',
        None,
        "corrupted",
    ),
    ("dataChecksum without data", '{"policyName":"none","checksum":0,"dataChecksum":1234}', None, "no data string"),
    ("data not JSON", '{"data":"{","dataChecksum":1234}', None, "not valid JSON"),
]


@pytest.mark.parametrize(("case", "content", "version", "refusal"), CPU_CASES, ids=[c[0] for c in CPU_CASES])
def test_cpu_state_accepted_and_refused_as_the_kubelet_does(
    case: str, content: str, version: str | None, refusal: str
) -> None:
    read = _read_or_refused(ki.parse_cpu_state, content, refusal)
    assert (read and read.version) == version


def _read_or_refused(parse: Callable[[str, str], _C], content: str, refusal: str) -> _C | None:
    """What ``parse`` reads, or None when it refuses with ``refusal``: one line naming the file."""
    if not refusal:
        return parse(content, "state")
    with pytest.raises(ki.CheckpointError, match=refusal) as info:
        parse(content, "state")
    assert str(info.value).startswith("state: ") and "\n" not in str(info.value)
    return None


def test_cpu_v3_literal_gives_the_one_answer() -> None:
    cp = ki.parse_cpu_state(CPU_CASES[5][1])
    assert (cp.version, cp.verified, cp.policy_name, cp.shared) == ("v3", True, "static", [1, 2])
    assert cp.containers == {("pod1", "container1"): [5, 6], ("pod1", "container2"): [3, 4]}
    assert cp.pods == {"pod2": [7, 8, 9]} and cp.container_ids == {} and cp.pod_uids_known


def test_a_v1_file_says_no_pod_uid() -> None:
    cp = ki.parse_cpu_state(CPU_CASES[4][1])
    assert not cp.pod_uids_known and cp.containers == {} and cp.pods == {}
    assert cp.container_ids == {"containerID1": [4, 5, 6], "containerID2": [1, 2, 3]}


def test_a_zero_checksum_is_unverified_only_where_the_kubelet_allows_it() -> None:
    # v2 (and v1) with checksum 0: accepted unverified; v3 has no such exemption, so a v3 file with
    # checksum 0 is read as v2 (1.37's fallback), and its pod entries are not trusted
    v2 = ki.parse_cpu_state('{"policyName":"none","defaultCpuSet":"0-3","checksum":0}')
    assert (v2.version, v2.verified) == ("v2", False)
    v3 = ki.parse_cpu_state(f'{{{_V3_STATIC},"checksum":0}}')
    assert (v3.version, v3.verified, v3.pods) == ("v2", False, {})


POD = "0f6e5d1c-0000-4000-8000-00000000a001"
ERA = [
    ("1.18-1.35 v2", {"version": "v2"}),
    ("1.36 gate off: v2 hashed as CPUManagerCheckpointV2", {"version": "v2", "type_name": "CPUManagerCheckpointV2"}),
    ("1.36 gate on: v3", {"version": "v3", "pod_entries": {POD: "1-3"}}),
    ("1.37: v3 hashed as CPUManagerCheckpointV3", {"version": "v3", "type_name": "CPUManagerCheckpointV3"}),
    ("1.37: v4", {"version": "v4", "pod_entries": {POD: "1-3"}}),
]


@pytest.mark.parametrize(("era", "how"), ERA, ids=[e[0] for e in ERA])
def test_each_eras_cpu_file_reads_back_to_one_answer(era: str, how: dict) -> None:  # type: ignore[type-arg]
    content = kc.cpu_state("static", "0,4-7", {POD: {"app": "1-2", "init": "1-3"}}, **how)
    cp = ki.parse_cpu_state(content)
    assert (cp.version, cp.verified, cp.policy_name, cp.shared) == (how["version"], True, "static", [0, 4, 5, 6, 7])
    assert cp.containers == {(POD, "app"): [1, 2], (POD, "init"): [1, 2, 3]}
    assert cp.pods == {k: [1, 2, 3] for k in how.get("pod_entries", {})}


def test_v1_reads_back_keyed_by_container_id() -> None:
    cp = ki.parse_cpu_state(kc.cpu_state("static", "0", {"c0ffee": "1-2"}, version="v1"))
    assert (cp.version, cp.container_ids, cp.pod_uids_known) == ("v1", {"c0ffee": [1, 2]}, False)


def test_v4_legacy_keys_are_what_older_kubelets_read() -> None:
    content = kc.cpu_state("static", "0", {POD: {"app": "1"}}, version="v4", pod_entries={POD: "1-2"})
    doc = json.loads(content)
    assert doc["checksum"] == 0 and doc["dataChecksum"] == ki.data_checksum(doc["data"])
    legacy = {k: v for k, v in doc.items() if k not in ("data", "dataChecksum")}
    old = ki.parse_cpu_state(json.dumps(legacy))  # a 1.20-1.36 kubelet: v2 unverified (pod entries lost)
    assert (old.version, old.verified, old.containers, old.pods) == ("v2", False, {(POD, "app"): [1]}, {})
    # 1.37 trusts data alone: the legacy keys may say anything
    doc["policyName"], doc["checksum"] = "other", 1234
    assert ki.parse_cpu_state(json.dumps(doc)).policy_name == "static"
    doc["data"] = doc["data"].replace('"1"', '"2"')
    with pytest.raises(ki.ChecksumMismatchError, match="data string"):
        ki.parse_cpu_state(json.dumps(doc))


# --------------------------------------------------------------------------- memory manager

_MACHINE = (
    '"machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":512,'
    '"allocatable":1536,"reserved":512,"free":1024}},"cells":[]}}'
)
_ENTRIES = '"entries":{"pod":{"container1":[{"numaAffinity":[0],"type":"memory","size":512}]}}'
_PODS = '"podEntries":{"pod":{"memoryBlocks":[{"numaAffinity":[0],"type":"memory","size":512}]}}'
_BAD_LEGACY = (
    '"policyName":"other","machineState":{"0":{"numberOfAssignments":5,"memoryMap":{"memory":{"total":1024,'
    '"systemReserved":256,"allocatable":768,"reserved":256,"free":512}},"cells":[]}},'
    '"entries":{"pod":{"containerX":[{"numaAffinity":[0],"type":"memory","size":128}]}},"checksum":1234'
)


def _data(*parts: str) -> str:
    return json.dumps("{" + ",".join(parts) + "}")


_STATIC = '"policyName":"static"'
_D1 = _data(_STATIC, _MACHINE, _ENTRIES)
_D_PODS = _data(_STATIC, _MACHINE, _ENTRIES, _PODS)
_D_UNKNOWN = _data('"unknownField":"value"', _STATIC, _MACHINE, _ENTRIES)
_V1 = f'"policyName":"static",{_MACHINE},{_ENTRIES}'


MEMORY_CASES = [
    # pkg/kubelet/cm/memorymanager/state/state_checkpoint_test.go (1.21-1.37), checksums as written there
    ("v1", f'{{{_V1},"checksum":4215593881}}', "v1", ""),
    ("v1 checksum zeroed", f'{{{_V1},"checksum":0}}', "v1", ""),
    ("v1 invalid checksum", f'{{{_V1},"checksum":101010}}', None, "corrupted"),
    ("v2", f'{{{_V1},{_PODS},"checksum":1278640530}}', "v2", ""),
    (
        "v2 checksum zeroed: read as v1",
        f'{{{_V1},{_PODS},"checksum":0}}',
        "v1",
        "",
    ),
    (
        "v2 invalid checksum",
        f'{{{_V1},{_PODS},"checksum":101010}}',
        None,
        "corrupted",
    ),
    (
        "v3, its v1 keys corrupted",
        f'{{{_BAD_LEGACY},"data":{_D1},"dataChecksum":1849615440}}',
        "v3",
        "",
    ),
    (
        "v3 with pod entries",
        f'{{{_BAD_LEGACY},"data":{_D_PODS},"dataChecksum":637296054}}',
        "v3",
        "",
    ),
    (
        "v3 unknown fields in data",
        f'{{{_BAD_LEGACY},"data":{_D_UNKNOWN},"dataChecksum":2100279793}}',
        "v3",
        "",
    ),
    (
        "without data section",
        f'{{{_V1},"checksum":4215593881,"dataChecksum":1234}}',
        None,
        "no data string",
    ),
    (
        "without dataChecksum section",
        f'{{{_V1},"checksum":4215593881,"data":{_D1}}}',
        None,
        "checksum is 0",
    ),
    (
        "invalid dataChecksum",
        f'{{{_BAD_LEGACY},"data":{_D1},"dataChecksum":1234}}',
        None,
        "corrupted",
    ),
    ("invalid data JSON", f'{{{_BAD_LEGACY},"data":"{{","dataChecksum":1234}}', None, "not valid JSON"),
    ("invalid JSON", "{", None, "not valid JSON"),
]


@pytest.mark.parametrize(("case", "content", "version", "refusal"), MEMORY_CASES, ids=[c[0] for c in MEMORY_CASES])
def test_memory_state_accepted_and_refused_as_the_kubelet_does(
    case: str, content: str, version: str | None, refusal: str
) -> None:
    cp = _read_or_refused(ki.parse_memory_state, content, refusal)
    if cp is None:
        return
    block = ki.MemoryBlock(numa_affinity=[0], type="memory", size=512)
    table = ki.MemoryTable(total=2048, system_reserved=512, allocatable=1536, reserved=512, free=1024)
    assert (cp.version, cp.policy_name) == (version, "static")
    assert cp.containers == {("pod", "container1"): [block]}
    assert cp.machine_state == {0: ki.NUMANodeState(number_of_assignments=0, memory_map={"memory": table}, cells=[])}
    assert cp.pods == ({"pod": [block]} if _PODS in content.replace("\\", "") and version != "v1" else {})


def _memory(era: str) -> kc.MemoryState:
    return kc.MemoryState(
        "Static",
        {
            0: kc.NUMANodeState(1, {"memory": kc.MemoryTable(4096, 1024, 1024)}, [0]),
            1: kc.NUMANodeState(1, {"hugepages-2Mi": kc.MemoryTable(1 << 30, 0, 1 << 21)}, [1]),
        },
        {POD: {"app": [kc.MemoryBlock([0], "memory", 1024), kc.MemoryBlock([1], "hugepages-2Mi", 1 << 21)]}},
    )


MEMORY_ERA = [
    ("1.21-1.35 v1", {"version": "v1"}),
    (
        "1.36 gate off: v1 hashed as MemoryManagerCheckpointV1",
        {"version": "v1", "type_name": "MemoryManagerCheckpointV1"},
    ),
    ("1.36 gate on: v2", {"version": "v2", "pod_entries": {POD: [kc.MemoryBlock([0], "memory", 2048)]}}),
    ("1.37: v3", {"version": "v3", "pod_entries": {POD: [kc.MemoryBlock([0], "memory", 2048)]}}),
]


@pytest.mark.parametrize(("era", "how"), MEMORY_ERA, ids=[e[0] for e in MEMORY_ERA])
def test_each_eras_memory_file_reads_back_to_one_answer(era: str, how: dict) -> None:  # type: ignore[type-arg]
    cp = ki.parse_memory_state(kc.memory_state(_memory(era), **how))
    assert (cp.version, cp.policy_name, sorted(cp.machine_state)) == (how["version"], "Static", [0, 1])
    assert cp.machine_state[1].memory_map == {
        "hugepages-2Mi": ki.MemoryTable(
            total=1 << 30, system_reserved=0, allocatable=1 << 30, reserved=1 << 21, free=(1 << 30) - (1 << 21)
        )
    }
    assert [(b.type, b.size, b.numa_affinity) for b in cp.containers[(POD, "app")]] == [
        ("memory", 1024, [0]),
        ("hugepages-2Mi", 1 << 21, [1]),
    ]
    assert {p: [b.size for b in bs] for p, bs in cp.pods.items()} == {p: [2048] for p in how.get("pod_entries", {})}


def test_v3s_own_v1_keys_carry_a_checksum_older_kubelets_verify() -> None:
    doc = json.loads(kc.memory_state(_memory("1.37"), version="v3"))
    legacy = {k: v for k, v in doc.items() if k not in ("data", "dataChecksum")}
    old = ki.parse_memory_state(json.dumps(legacy))
    assert (old.version, old.verified, list(old.containers)) == ("v1", True, [(POD, "app")])


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (('"0":{', '"1024":{'), "NUMA node id from 0 to 1023"),
        (('"0":{', '"-1":{'), "NUMA node id"),
        (('"0":{', '"x":{'), "NUMA node id"),
        (('"cells":[0]', '"cells":[5000]'), "cells"),
        (('"numaAffinity":[0]', '"numaAffinity":[1024]'), "numaAffinity"),
        (('"size":1024', '"size":18446744073709551616'), "unsigned 64-bit"),
        (('"size":1024', '"size":-1'), "unsigned 64-bit"),
        (('"size":1024', '"size":1024.0'), "unsigned 64-bit"),
        (('"total":4096', '"total":"4096"'), "unsigned 64-bit"),
        (('"numberOfAssignments":1', '"numberOfAssignments":true'), "64-bit integer"),
    ],
)
def test_sizes_and_numa_ids_are_range_checked(change: tuple[str, str], refusal: str) -> None:
    content = kc.memory_state(_memory("1.35")).decode()
    assert change[0] in content
    with pytest.raises(ki.CheckpointError, match=refusal):
        ki.parse_memory_state(content.replace(*change, 1), "memory_manager_state")


def test_a_memory_file_over_the_cap_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "memory_manager_state"
    with open(path, "wb") as f:
        f.truncate(ki.MAX_CHECKPOINT_BYTES + 1)
    with pytest.raises(ki.CheckpointError, match="over the 4194304-byte cap"):
        ki.read_memory_state(path)


def test_beside_reads_the_memory_file_with_the_parser(tmp_path: Path) -> None:
    path = kc.write(tmp_path, kc.MEMORY_STATE, kc.memory_state(_memory("1.37"), version="v3"))
    paths = {kc.MEMORY_STATE: path}
    read = _read_checkpoints(paths, {})[kc.MEMORY_STATE].result
    assert isinstance(read, ki.MemoryCheckpoint) and read.version == "v3" and (POD, "app") in read.containers
    path.write_bytes(path.read_bytes().replace(b'"dataChecksum":', b'"dataChecksum":1'))
    refused = _read_checkpoints(paths, {})[kc.MEMORY_STATE].result
    assert isinstance(refused, ki.ChecksumMismatchError) and str(refused).startswith(f"{path}: checkpoint is corrupted")
