"""The kubelet's checkpoint files, written as the kubelet writes them (../shared/kubelet-api.md §5).

Checksums come from eventsrc's own rules where it has them (``eventsrc.inputs.kubelet_checkpoints``:
the device manager's and CPU manager's spew-FNV, DRA's CRC32), so a file written here is one
that ``parse_device_checkpoint``, ``parse_cpu_state`` and ``parse_dra_state`` verify. eventsrc
has no parser for the memory manager's file; its spew rendering is here
(``memory_checksum_text``), checked against the facts file's worked example.

The JSON is Go's ``encoding/json``: keys in struct order, map keys sorted as strings, no
spaces, ``<``, ``>`` and ``&`` escaped. Files are replaced as the kubelet's FileStore does
(``eventsrc.bench.scale.write_checkpoint``: a dot-named temporary file, then a rename). The
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

from eventsrc.bench.scale import write_checkpoint
from eventsrc.inputs import kubelet_checkpoints as ki

DEVICE_CHECKPOINT = "device-plugins/" + ki.DEVICE_CHECKPOINT  # under the kubelet root
CPU_STATE = ki.CPU_STATE
MEMORY_STATE = "memory_manager_state"
DRA_STATE = ki.DRA_STATE


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
    reg = {k: list(v) for k, v in registered.items()}
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


def cpu_state(policy: str, default_cpu_set: str, entries: Mapping[str, Mapping[str, str]]) -> bytes:
    """``cpu_manager_state`` (V2): the policy, the shared pool and pod uid -> container ->
    cpuset (``entries`` is left out when empty, as ``omitempty`` does)."""
    cp = ki.CPUCheckpoint(
        source=ki.CPU_STATE,
        version="v2",
        policy_name=policy,
        default_cpu_set=default_cpu_set,
        entries={pod: dict(containers) for pod, containers in entries.items()},
    )
    doc: dict[str, Any] = {"policyName": policy, "defaultCpuSet": default_cpu_set}
    if entries:
        doc["entries"] = _sorted_keys({pod: _sorted_keys(c) for pod, c in entries.items()})
    doc["checksum"] = ki.fnv32a(ki.cpu_checksum_text(cp))
    return go_json(doc)


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


def _spew_ints(items: Sequence[int]) -> str:
    return "[" + " ".join(str(i) for i in items) + "]"


def memory_checksum_text(state: MemoryState) -> str:
    """What the memory manager hashes: ``(*state.MemoryManagerCheckpoint){...}`` with the
    checksum field 0 (the facts file's example gives 3810358120 with these rules)."""
    nodes = {}
    for node, s in state.machine_state.items():
        tables = {
            name: f"<*>{{TotalMemSize:(uint64){t.total} SystemReserved:(uint64){t.system_reserved} "
            f"Allocatable:(uint64){t.allocatable} Reserved:(uint64){t.reserved} Free:(uint64){t.free}}}"
            for name, t in s.memory_map.items()
        }
        nodes[node] = (
            f"<*>{{NumberOfAssignments:(int){s.number_of_assignments} "
            f"MemoryMap:(map[v1.ResourceName]*state.MemoryTable){ki._spew_map(tables)} "
            f"Cells:([]int){_spew_ints(s.cells)}}}"
        )
    entries = {
        pod: ki._spew_map(
            {
                name: "["
                + " ".join(
                    f"{{NUMAAffinity:([]int){_spew_ints(b.numa_affinity)} Type:(v1.ResourceName){b.type} "
                    f"Size:(uint64){b.size}}}"
                    for b in blocks
                )
                + "]"
                for name, blocks in containers.items()
            }
        )
        for pod, containers in state.entries.items()
    }
    return (
        f"(*state.MemoryManagerCheckpoint){{PolicyName:(string){state.policy} "
        f"MachineState:(state.NUMANodeMap){ki._spew_map(nodes)} "
        f"Entries:(state.ContainerMemoryAssignments){ki._spew_map(entries)} Checksum:(checksum.Checksum)0}}"
    )


def memory_state(state: MemoryState) -> bytes:
    """``memory_manager_state`` in its released form."""
    doc: dict[str, Any] = {
        "policyName": state.policy,
        "machineState": _sorted_keys(
            {
                str(node): {
                    "numberOfAssignments": s.number_of_assignments,
                    "memoryMap": _sorted_keys(
                        {
                            name: {
                                "total": t.total,
                                "systemReserved": t.system_reserved,
                                "allocatable": t.allocatable,
                                "reserved": t.reserved,
                                "free": t.free,
                            }
                            for name, t in s.memory_map.items()
                        }
                    ),
                    "cells": list(s.cells),
                }
                for node, s in state.machine_state.items()
            }
        ),
    }
    if state.entries:
        doc["entries"] = _sorted_keys(
            {
                pod: _sorted_keys(
                    {
                        name: [{"numaAffinity": list(b.numa_affinity), "type": b.type, "size": b.size} for b in blocks]
                        for name, blocks in containers.items()
                    }
                )
                for pod, containers in state.entries.items()
            }
        )
    doc["checksum"] = ki.fnv32a(memory_checksum_text(state))
    return go_json(doc)


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
