"""The kubelet's checkpoint files, written as the kubelet writes them (../shared/kubelet-api.md §5).

Checksums come from eventsrc's own rules (``eventsrc.inputs.kubelet_checkpoints``: the device,
CPU and memory managers' spew-FNV, the data strings' dataChecksum, DRA's CRC32), so a file written
here is one that the ``parse_*`` functions verify; tests/unit/test_kubelet_state_formats.py pins
those rules to the kubelet's own test literals. The CPU and memory files are written in each
format a kubelet writes (``version``), so that a stand-in kubelet can play each era.

The JSON is Go's ``encoding/json``: keys in struct order, map keys sorted as strings, no
spaces, ``<``, ``>`` and ``&`` escaped. Files are replaced as the kubelet's FileStore does
(``write_checkpoint``: a dot-named temporary file, then a rename). The
damage helpers leave what a torn write, a stray writer or a crash mid-write would leave.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from eventsrc.inputs import kubelet_checkpoints as ki

DEVICE_CHECKPOINT = "device-plugins/" + ki.DEVICE_CHECKPOINT  # under the kubelet root
CPU_STATE = ki.CPU_STATE
MEMORY_STATE = ki.MEMORY_STATE
DRA_STATE = ki.DRA_STATE


def write_checkpoint(directory: Path, content: bytes, name: str = ki.DEVICE_CHECKPOINT) -> None:
    """The kubelet's FileStore write of ``directory/name``: a temporary file named with a
    leading dot and the name in the same directory, written, fsynced, renamed over it."""
    tmp = directory / f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, directory / name)


def go_json(value: Any) -> bytes:
    """``value`` as Go's ``json.Marshal`` writes it (dicts keep the order given)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char in "&<>\u2028\u2029":
        text = text.replace(char, f"\\u{ord(char):04x}")
    return text.encode()


def _sorted_keys(m: Mapping[Any, Any]) -> dict[str, Any]:
    return {k: m[k] for k in sorted(m)}


# --------------------------------------------------------------------------- device manager


def device_checkpoint(entries: Sequence[ki.PodDevicesEntry] | None, registered: Mapping[str, Sequence[str]]) -> bytes:
    """``kubelet_internal_checkpoint`` (V2) holding ``entries`` (None: the kubelet's
    ``"PodDeviceEntries":null`` when nothing is allocated) and the healthy devices of each
    resource."""
    reg: dict[str, list[str] | None] = {k: list(v) for k, v in registered.items()}
    cp = ki.DeviceCheckpoint(
        source=ki.DEVICE_CHECKPOINT,
        version="v2",
        entries=None if entries is None else list(entries),
        registered_devices=reg,
        checksum=0,
    )
    data = {
        "PodDeviceEntries": None
        if entries is None
        else [
            {
                "PodUID": e.pod_uid,
                "ContainerName": e.container_name,
                "ResourceName": e.resource_name,
                "DeviceIDs": None
                if e.device_ids is None
                else _sorted_keys({str(node): ids for node, ids in e.device_ids.items()}),
                "AllocResp": None if e.alloc_resp is None else base64.b64encode(e.alloc_resp).decode(),
            }
            for e in entries
        ],
        "RegisteredDevices": _sorted_keys(reg),
    }
    return go_json({"Data": data, "Checksum": ki.fnv32a(ki.device_checksum_text(cp))})


# --------------------------------------------------------------------------- CPU manager


def _cpu_body(policy: str, default: str, entries: Mapping[str, Any], pods: Mapping[str, str] | None) -> dict[str, Any]:
    """policyName, defaultCpuSet, then entries and podEntries, left out when empty (omitempty)."""
    doc: dict[str, Any] = {"policyName": policy, "defaultCpuSet": default}
    if entries:
        doc["entries"] = _sorted_keys({k: _sorted_keys(v) if isinstance(v, Mapping) else v for k, v in entries.items()})
    if pods:
        doc["podEntries"] = _sorted_keys({pod: {"cpuSet": cpus} if cpus else {} for pod, cpus in pods.items()})
    return doc


def cpu_state(
    policy: str,
    default_cpu_set: str,
    entries: Mapping[str, Any],
    *,
    version: str = "v2",
    pod_entries: Mapping[str, str] | None = None,
    type_name: str = "CPUManagerCheckpoint",
) -> bytes:
    """``cpu_manager_state`` as a kubelet writes it in ``version``:

    * ``v1``: ``entries`` maps container ids to cpusets (kubelets before 1.18);
    * ``v2``: pod uid -> container -> cpuset (1.18-1.36; 1.36 with PodLevelResourceManagers off
      hashes it as ``CPUManagerCheckpointV2``: ``type_name``);
    * ``v3``: v2 and ``pod_entries``, pod uid -> cpuset (1.36 with the gate on);
    * ``v4``: the v3 keys with checksum 0, then ``data`` and its ``dataChecksum`` (1.37).
    """
    pods = dict(pod_entries or {})
    body = _cpu_body(policy, default_cpu_set, entries, pods if version in ("v3", "v4") else None)
    if version == "v4":
        data = go_json(body).decode()
        return go_json(body | {"checksum": 0, "data": data, "dataChecksum": ki.data_checksum(data)})
    cp = ki.CPUCheckpoint(
        source=ki.CPU_STATE,
        version=version,
        policy_name=policy,
        default_cpu_set=default_cpu_set,
        entries={pod: dict(c) for pod, c in entries.items()} if version != "v1" else None,
        container_entries=dict(entries) if version == "v1" else None,
        pod_entries=pods,
    )
    return go_json(body | {"checksum": ki.fnv32a(ki.cpu_checksum_text(cp, type_name))})


# --------------------------------------------------------------------------- memory manager


@dataclass(frozen=True)
class MemoryTable:
    """One resource (``memory``, ``hugepages-2Mi``) on one NUMA node, in bytes."""

    total: int
    system_reserved: int = 0
    reserved: int = 0

    @property
    def allocatable(self) -> int:
        return self.total - self.system_reserved

    @property
    def free(self) -> int:
        return self.allocatable - self.reserved


@dataclass(frozen=True)
class NUMANodeState:
    number_of_assignments: int
    memory_map: Mapping[str, MemoryTable]
    cells: Sequence[int]


@dataclass(frozen=True)
class MemoryBlock:
    """A container's memory of one type, on these NUMA nodes."""

    numa_affinity: Sequence[int]
    type: str
    size: int


@dataclass(frozen=True)
class MemoryState:
    policy: str  # "None" or "Static"
    machine_state: Mapping[int, NUMANodeState] = field(default_factory=dict)
    entries: Mapping[str, Mapping[str, Sequence[MemoryBlock]]] = field(default_factory=dict)


def _memory(state: MemoryState, version: str, pods: Mapping[str, Sequence[MemoryBlock]]) -> ki.MemoryCheckpoint:
    """``state`` as the module's MemoryCheckpoint (what its checksums render)."""

    def blocks(items: Sequence[MemoryBlock]) -> list[ki.MemoryBlock]:
        return [ki.MemoryBlock(numa_affinity=list(b.numa_affinity), type=b.type, size=b.size) for b in items]

    def table(t: MemoryTable) -> ki.MemoryTable:  # the same names, derived ones included
        return ki.MemoryTable(**{name: getattr(t, name) for name in ki.MemoryTable.__struct_fields__})

    machine = {
        node: ki.NUMANodeState(
            number_of_assignments=s.number_of_assignments,
            memory_map={name: table(t) for name, t in s.memory_map.items()},
            cells=list(s.cells),
        )
        for node, s in state.machine_state.items()
    }
    return ki.MemoryCheckpoint(
        source=ki.MEMORY_STATE,
        version=version,
        policy_name=state.policy,
        machine_state=machine,
        entries={pod: {n: blocks(b) for n, b in named.items()} for pod, named in state.entries.items()},
        pod_entries={pod: blocks(b) for pod, b in pods.items()},
    )


def _memory_body(cp: ki.MemoryCheckpoint, with_pods: bool) -> dict[str, Any]:
    """policyName, machineState, then entries and podEntries, left out when empty (omitempty)."""

    def blocks(items: list[ki.MemoryBlock] | None) -> list[dict[str, Any]]:
        return [{"numaAffinity": b.numa_affinity, "type": b.type, "size": b.size} for b in items or []]

    def table(t: ki.MemoryTable) -> dict[str, int]:
        return {
            "total": t.total,
            "systemReserved": t.system_reserved,
            "allocatable": t.allocatable,
            "reserved": t.reserved,
            "free": t.free,
        }

    nodes = {
        str(node): {
            "numberOfAssignments": s.number_of_assignments,
            "memoryMap": _sorted_keys({name: table(t) for name, t in (s.memory_map or {}).items()}),
            "cells": s.cells,
        }
        for node, s in sorted(cp.machine_state.items())
    }
    doc: dict[str, Any] = {"policyName": cp.policy_name, "machineState": _sorted_keys(nodes)}
    if cp.entries:
        doc["entries"] = _sorted_keys(
            {pod: _sorted_keys({n: blocks(b) for n, b in (named or {}).items()}) for pod, named in cp.entries.items()}
        )
    if with_pods and cp.pod_entries:
        doc["podEntries"] = _sorted_keys({pod: {"memoryBlocks": blocks(b)} for pod, b in cp.pod_entries.items()})
    return doc


def memory_state(
    state: MemoryState,
    *,
    version: str = "v1",
    pod_entries: Mapping[str, Sequence[MemoryBlock]] | None = None,
    type_name: str = "MemoryManagerCheckpoint",
) -> bytes:
    """``memory_manager_state`` as a kubelet writes it in ``version``:

    * ``v1``: policy, machine state and container entries (1.21-1.36; 1.36 with
      PodLevelResourceManagers off hashes it as ``MemoryManagerCheckpointV1``: ``type_name``);
    * ``v2``: v1 and ``pod_entries``, pod uid -> blocks (1.36 with the gate on);
    * ``v3``: the v1 keys with their own v1 checksum, then ``data`` (pod entries too) and its
      ``dataChecksum`` (1.37).
    """
    cp = _memory(state, version, pod_entries or {})
    if version == "v3":
        data = go_json(_memory_body(cp, with_pods=True)).decode()
        legacy = msgspec.structs.replace(cp, version="v1")
        newest = {"checksum": ki.fnv32a(ki.memory_checksum_text(legacy, type_name))}
        return go_json(
            _memory_body(cp, with_pods=False) | newest | {"data": data, "dataChecksum": ki.data_checksum(data)}
        )
    body = _memory_body(cp, with_pods=version == "v2")
    return go_json(body | {"checksum": ki.fnv32a(ki.memory_checksum_text(cp, type_name))})


# --------------------------------------------------------------------------- DRA manager


def dra_state(claims: Sequence[ki.DRAClaim], share_ids: bool = True) -> bytes:
    """``dra_manager_state`` (the CRC32 form). ``share_ids``: the 1.35+ kubelet writes every
    device's ``ShareID`` (``null`` when unset); older ones have no such key."""

    def device(d: ki.DRADevice) -> dict[str, Any]:
        out: dict[str, Any] = {"PoolName": d.pool_name, "DeviceName": d.device_name}
        if share_ids:
            out["ShareID"] = d.share_id
        out["RequestNames"] = d.request_names
        out["CDIDeviceIDs"] = d.cdi_device_ids
        return out

    inner = {
        "kind": ki.DRA_KIND,
        "apiVersion": ki.DRA_API_VERSION,
        "Entries": [
            {
                "ClaimUID": c.claim_uid,
                "ClaimName": c.claim_name,
                "Namespace": c.namespace,
                "PodUIDs": {uid: {} for uid in sorted(c.pod_uids)},
                "DriverState": _sorted_keys(
                    {driver: {"Devices": [device(d) for d in devices]} for driver, devices in c.driver_state.items()}
                ),
            }
            for c in claims
        ],
    }
    data = go_json(inner).decode()
    return go_json({"Data": data, "Checksum": ki.crc32(data)})


# --------------------------------------------------------------------------- files


def write(root: Path, name: str, content: bytes) -> Path:
    """Replace ``root/name`` (e.g. ``DEVICE_CHECKPOINT``) as the kubelet does; the directory
    is made (0700, as the kubelet's store makes it) when missing."""
    path = root / name
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_checkpoint(path.parent, content, path.name)
    return path


def write_torn(path: Path, content: bytes, keep: float = 0.5) -> None:
    """``path`` holding only the first ``keep`` of ``content`` (at least one byte short of
    it): a write torn mid-way, as a writer that does not rename would leave it."""
    cut = min(len(content) - 1, max(0, int(len(content) * keep)))
    path.write_bytes(content[:cut])


def write_garbage(path: Path, content: bytes = b"\x00\x17\xffnot a checkpoint\n") -> None:
    """``path`` holding bytes that are not JSON at all."""
    path.write_bytes(content)


def leave_temp(path: Path, content: bytes, keep: float = 0.5) -> Path:
    """The dot-named temporary file a kubelet that died mid-write leaves beside ``path``
    (which keeps its old content): readers must pass it over."""
    tmp = path.parent / f".{path.name}{os.getpid()}"
    write_torn(tmp, content, keep)
    return tmp
