"""Read the kubelet's checkpoint files and turn them into the events that reproduce them.

A node moves from the kubelet's managers to eventsrc without draining: ``eventsrc
import-kubelet`` reads

* the device manager's ``/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint``,
* the CPU manager's ``/var/lib/kubelet/cpu_manager_state``,
* the DRA manager's ``dra_manager_state``,

verifies each checksum exactly as the kubelet does (a mismatch is an error naming the
file and both checksums: report, never guess), and returns events for the log.

The checksum schemes (``../shared/kubelet-api.md`` section 5):

* **spew-FNV** (device, CPU and memory managers): FNV-1a-32 of go-spew's ``%#v`` rendering of
  the *parsed Go struct* (sorted map keys, no methods), so the text is rebuilt here from
  the parsed values, with Go's type names and field order. The rendering depends on how
  Go's ``encoding/json`` fills the struct: a missing key keeps the value the kubelet put
  there before unmarshalling (an empty map or slice), ``null`` sets it to nil (``<nil>``).
* **CRC32** (DRA, current): CRC-32/IEEE of the exact bytes of the ``Data`` string.
* **data string** (CPU v4, memory v3): spew-FNV of the Go string, i.e. FNV-1a-32 of
  ``"(string)" + data``, stored as ``dataChecksum``.

Formats read (which kubelet writes which: docs/kubelet-node.md):

=====================  ==============================================================
device checkpoint      V2 (``DeviceIDs`` per NUMA node, 1.20+), with or without the
                       ``BootID`` outside ``Data``; V1 (flat ``DeviceIDs``, <= 1.19).
cpu_manager_state      v1 (entries by container id), v2 (pod -> container -> cpuset),
                       v3 (v2 + ``podEntries``, 1.36), v4 (``data`` + ``dataChecksum``, 1.37):
                       one answer for all (``CPUCheckpoint.shared/containers/pods``).
memory_manager_state   v1 (1.21+), v2 (v1 + ``podEntries``, 1.36), v3 (``data`` +
                       ``dataChecksum``, 1.37): ``MemoryCheckpoint``.
dra_manager_state      the CRC32 form (``{"Data": "<json>", "Checksum": crc}``), with or
                       without ``ShareID``.
=====================  ==============================================================

Refused with a clear message: the old spew-FNV DRA form (``version``/``entries`` with
``ResourceHandles``), whose checksum rules are not established.

Nothing here does I/O apart from the ``read_*`` helpers that read one file.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import re
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from msgspec import Struct

from eventsrc import events as ev
from eventsrc.core.cpu.cpuset import CPUSet, CPUSetParseError
from eventsrc.errors import EventsrcError
from eventsrc.inputs import bounded_file
from eventsrc.inputs.bounded_file import FileKey

__all__ = [
    "CPUCheckpoint",
    "CheckpointError",
    "ChecksumMismatchError",
    "DRACheckpoint",
    "DeviceCheckpoint",
    "ImportSummary",
    "MemoryBlock",
    "MemoryCheckpoint",
    "MemoryTable",
    "NUMANodeState",
    "events_from",
    "parse_cpu_state",
    "parse_device_checkpoint",
    "parse_dra_state",
    "parse_memory_state",
    "summarize",
]

DEVICE_CHECKPOINT = "kubelet_internal_checkpoint"
CPU_STATE = "cpu_manager_state"
MEMORY_STATE = "memory_manager_state"
DRA_STATE = "dra_manager_state"
DRA_KIND = "DRACheckpoint"
DRA_API_VERSION = "checkpoint.dra.kubelet.k8s.io/v1"
IMPORT_REASON = "imported from the kubelet's checkpoint"


class CheckpointError(EventsrcError):
    """A checkpoint file that cannot be read or imported. The message names the file."""


class ChecksumMismatchError(CheckpointError):
    def __init__(self, source: str, stored: int, computed: int, scheme: str) -> None:
        super().__init__(
            f"{source}: checkpoint is corrupted: the file's checksum is {stored} but its content "
            f"gives {computed} ({scheme})"
        )
        self.source = source
        self.stored = stored
        self.computed = computed


# --------------------------------------------------------------------------- checksums


def fnv32a(text: str) -> int:
    """FNV-1a, 32 bits, over the UTF-8 bytes of ``text`` (Go's ``hash/fnv.New32a``)."""
    h = 0x811C9DC5
    for b in text.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def crc32(data: str) -> int:
    """CRC-32/IEEE of the UTF-8 bytes of ``data`` (Go's ``hash/crc32.ChecksumIEEE``)."""
    return zlib.crc32(data.encode()) & 0xFFFFFFFF


# go-spew renderings of the values that occur in checkpoints. ``None`` is Go's nil.


def _spew_strings(items: list[str] | None) -> str:
    return "<nil>" if items is None else "[" + " ".join(items) + "]"


def _spew_bytes(data: bytes | None) -> str:
    return "<nil>" if data is None else "[" + " ".join(str(b) for b in data) + "]"


def _spew_map(m: Mapping[Any, str] | None) -> str:
    """``m`` maps keys (already sorted as Go sorts them: give ints for int keys) to the
    rendered values."""
    if m is None:
        return "<nil>"
    return "map[" + " ".join(f"{k}:{m[k]}" for k in sorted(m)) + "]"


# --------------------------------------------------------------------------- JSON helpers


def _decode_json(data: bytes | str, source: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{source}: not valid JSON: {exc}") from None


def _field(obj: Mapping[str, Any], name: str, default: Any = ...) -> Any:
    """Go's encoding/json key matching: the exact name first, then case-insensitively."""
    if name in obj:
        return obj[name]
    lower = name.lower()
    for k, v in obj.items():
        if k.lower() == lower:
            return v
    return default


def _has(obj: Mapping[str, Any], name: str) -> bool:
    return _field(obj, name, _MISSING) is not _MISSING


_MISSING = object()


def _object(value: Any, what: str, source: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CheckpointError(f"{source}: {what} must be a JSON object, not {type(value).__name__}")
    return value


def _string(value: Any, what: str, source: str) -> str:
    if value is None:
        return ""  # Go: null leaves a string empty
    if not isinstance(value, str):
        raise CheckpointError(f"{source}: {what} must be a string, not {type(value).__name__}")
    return value


def _strings(value: Any, what: str, source: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise CheckpointError(f"{source}: {what} must be a list of strings")
    return list(value)


def _uint(value: Any, what: str, source: str, bits: int = 64) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < (1 << bits):
        raise CheckpointError(f"{source}: {what} must be an unsigned {bits}-bit integer, not {value!r}")
    return value


def _cpuset(text: str, what: str, source: str) -> CPUSet:
    try:
        return CPUSet.parse(text)
    except CPUSetParseError as exc:
        raise CheckpointError(f"{source}: could not parse {what} {text!r}: {exc}") from None


# --------------------------------------------------------------------------- device manager


class PodDevicesEntry(Struct, frozen=True, kw_only=True):
    pod_uid: str
    container_name: str
    resource_name: str
    # NUMA node -> device ids (-1: no topology). V1 files have one list, kept under ``None``
    # in ``flat_device_ids``; ``None`` here is a JSON null (Go nil).
    device_ids: dict[int, list[str] | None] | None = None
    flat_device_ids: list[str] | None = None
    alloc_resp: bytes | None = None

    def all_device_ids(self) -> list[str]:
        ids: list[str] = list(self.flat_device_ids or [])
        for node in sorted(self.device_ids or {}):
            ids.extend((self.device_ids or {})[node] or [])
        return sorted(set(ids))

    def numa_of(self) -> dict[str, list[int]]:
        """Device id -> the NUMA nodes this entry places it on (none for -1 and for V1)."""
        out: dict[str, list[int]] = {}
        for node, ids in sorted((self.device_ids or {}).items()):
            for i in ids or []:
                nodes = out.setdefault(i, [])
                if node >= 0 and node not in nodes:
                    nodes.append(node)
        return out


class DeviceCheckpoint(Struct, frozen=True, kw_only=True):
    source: str
    version: str  # "v2" or "v1"
    entries: list[PodDevicesEntry] | None  # None: "PodDeviceEntries": null
    registered_devices: dict[str, list[str] | None] | None
    checksum: int
    boot_id: str = ""


def device_checksum_text(cp: DeviceCheckpoint) -> str:
    """The text the kubelet hashes: ``Data`` as a value of type ``checkpoint.checkpointData``
    (V1 files: ``checkpointDataV1``/``PodDevicesEntryV1`` renamed to those names)."""
    if cp.entries is None:
        entries = "<nil>"
    else:
        parts = []
        for e in cp.entries:
            if cp.version == "v1":
                ids = f"([]string){_spew_strings(e.flat_device_ids)}"
            else:
                per_numa = None if e.device_ids is None else {k: _spew_strings(v) for k, v in e.device_ids.items()}
                ids = f"(checkpoint.DevicesPerNUMA){_spew_map(per_numa)}"
            parts.append(
                f"{{PodUID:(string){e.pod_uid} ContainerName:(string){e.container_name} "
                f"ResourceName:(string){e.resource_name} DeviceIDs:{ids} "
                f"AllocResp:([]uint8){_spew_bytes(e.alloc_resp)}}}"
            )
        entries = "[" + " ".join(parts) + "]"
    reg = None if cp.registered_devices is None else {k: _spew_strings(v) for k, v in cp.registered_devices.items()}
    return (
        f"(checkpoint.checkpointData){{PodDeviceEntries:([]checkpoint.PodDevicesEntry){entries} "
        f"RegisteredDevices:(map[string][]string){_spew_map(reg)}}}"
    )


def parse_device_checkpoint(data: bytes | str, source: str = DEVICE_CHECKPOINT) -> DeviceCheckpoint:
    """Parse and verify the device manager's checkpoint (V2 or V1, with or without BootID)."""
    top = _object(_decode_json(data, source), "the checkpoint", source)
    body = _field(top, "Data", None)
    # The kubelet unmarshals into checkpoint.New(make([]PodDevicesEntry, 0),
    # make(map[string][]string)): a missing key keeps those empty values, null makes them nil.
    raw_entries = _field(body, "PodDeviceEntries", []) if isinstance(body, dict) else []
    raw_registered = _field(body, "RegisteredDevices", {}) if isinstance(body, dict) else {}
    if body is not None and not isinstance(body, dict):
        raise CheckpointError(f"{source}: Data must be a JSON object")
    entries: list[PodDevicesEntry] | None = None
    versions: set[str] = set()
    if raw_entries is not None:
        if not isinstance(raw_entries, list):
            raise CheckpointError(f"{source}: Data.PodDeviceEntries must be a list")
        entries = [
            _device_entry(raw, f"Data.PodDeviceEntries[{n}]", source, versions) for n, raw in enumerate(raw_entries)
        ]
    if len(versions) > 1:
        raise CheckpointError(f"{source}: mixes V1 (flat) and V2 (per NUMA node) DeviceIDs")
    registered: dict[str, list[str] | None] | None = None
    if raw_registered is not None:
        registered = {
            k: _strings(v, f"Data.RegisteredDevices[{k}]", source)
            for k, v in _object(raw_registered, "Data.RegisteredDevices", source).items()
        }
    cp = DeviceCheckpoint(
        source=source,
        version=versions.pop() if versions else "v2",  # without entries both render alike
        entries=entries,
        registered_devices=registered,
        checksum=_uint(_field(top, "Checksum", 0), "Checksum", source),
        boot_id=_string(_field(top, "BootID", ""), "BootID", source),
    )
    computed = fnv32a(device_checksum_text(cp))
    if computed != cp.checksum:
        raise ChecksumMismatchError(
            source, cp.checksum, computed, f"spew-FNV-32a of the {cp.version.upper()} checkpointData"
        )
    return cp


def _device_entry(raw: Any, where: str, source: str, versions: set[str]) -> PodDevicesEntry:
    """One PodDeviceEntries item; adds the checkpoint version its DeviceIDs have to ``versions``."""
    e = _object(raw, where, source)
    ids = _field(e, "DeviceIDs", None)
    per_numa: dict[int, list[str] | None] | None = None
    flat: list[str] | None = None
    if isinstance(ids, list):
        versions.add("v1")
        flat = _strings(ids, f"{where}.DeviceIDs", source)
    elif isinstance(ids, dict):
        versions.add("v2")
        per_numa = _per_numa_ids(ids, where, source)
    elif ids is not None:
        raise CheckpointError(f"{source}: {where}.DeviceIDs must be a map of NUMA node to device ids")
    resp = _field(e, "AllocResp", None)
    alloc: bytes | None = None
    if resp is not None:
        try:
            alloc = base64.b64decode(_string(resp, f"{where}.AllocResp", source), validate=True)
        except binascii.Error as exc:
            raise CheckpointError(f"{source}: {where}.AllocResp is not base64: {exc}") from None
    return PodDevicesEntry(
        pod_uid=_string(_field(e, "PodUID", ""), f"{where}.PodUID", source),
        container_name=_string(_field(e, "ContainerName", ""), f"{where}.ContainerName", source),
        resource_name=_string(_field(e, "ResourceName", ""), f"{where}.ResourceName", source),
        device_ids=per_numa,
        flat_device_ids=flat,
        alloc_resp=alloc,
    )


def _per_numa_ids(ids: dict[str, Any], where: str, source: str) -> dict[int, list[str] | None]:
    """V2 DeviceIDs: device ids by NUMA node (the JSON keys are the nodes' numbers)."""
    per_numa: dict[int, list[str] | None] = {}
    for key, value in ids.items():
        try:
            node = int(key, 10)
        except ValueError:
            raise CheckpointError(f"{source}: {where}.DeviceIDs has a key that is not a NUMA node: {key!r}") from None
        per_numa[node] = _strings(value, f"{where}.DeviceIDs[{key}]", source)
    return per_numa


# --------------------------------------------------------------------------- CPU and memory managers
#
# Which kubelet writes and reads which format (docs/kubelet-node.md has the table):
#
# * cpu_manager_state. v1: entries by container id (before 1.18; read up to 1.36). v2: entries by
#   pod uid and container name (1.18-1.36, and 1.36 with PodLevelResourceManagers off). v3: v2 plus
#   podEntries (1.36 with the gate on). v4: a ``data`` string with its ``dataChecksum``, beside the
#   v3 keys with ``checksum`` 0 so that older kubelets read them unverified (1.37, always).
# * memory_manager_state. v1 (1.21-1.36); v2: v1 plus podEntries (1.36 with the gate on); v3: a
#   ``data`` string with its ``dataChecksum``, beside the v1 keys and their own checksum (1.37).
#
# Reading follows the newest kubelet's order: a file with a ``data`` string or a ``dataChecksum``
# is the newest format and is verified as such, with no fallback; any other file is read as the
# first older format whose checksum holds. A spew-FNV checksum is accepted under either type name
# a kubelet renders it with (1.36 and 1.37 hash some formats under their own "...V2"/"...V3"
# name, the others under the legacy one); a checksum of 0 is accepted unverified where the
# kubelet accepts it (cpu v1 and v2, memory v1).

#: A NUMA node id beyond this is refused (Linux's own limit is 1024 nodes).
MAX_NUMA_NODES = 1024

_CPU_NAMES = {
    "v1": ("CPUManagerCheckpoint",),
    "v2": ("CPUManagerCheckpoint", "CPUManagerCheckpointV2"),
    "v3": ("CPUManagerCheckpoint", "CPUManagerCheckpointV3"),
}
_MEMORY_NAMES = {
    "v1": ("MemoryManagerCheckpoint", "MemoryManagerCheckpointV1"),
    "v2": ("MemoryManagerCheckpoint", "MemoryManagerCheckpointV2"),
}


def data_checksum(data: str) -> int:
    """The ``dataChecksum`` of a ``data`` string (cpu v4, memory v3): spew-FNV of the Go string."""
    return fnv32a("(string)" + data)


def _spew_ints(items: list[int] | None) -> str:
    return "<nil>" if items is None else "[" + " ".join(map(str, items)) + "]"


def _newest(top: dict[str, Any], source: str) -> tuple[str, int, dict[str, Any]] | None:
    """The ``data`` string, its ``dataChecksum`` and what it holds, for a file in the newest
    format (None: not one). As the kubelet, ``data`` is decoded before the checksum is checked,
    and a file that has either is never read as an older format."""
    text = _string(_field(top, "data", ""), "data", source)
    stored = _uint(_field(top, "dataChecksum", 0), "dataChecksum", source)
    if not text and not stored:
        return None
    if not text:
        raise CheckpointError(f"{source}: it has a dataChecksum but no data string")
    body = _object(_decode_json(text, f"{source}: data"), "data", source)
    if data_checksum(text) != stored:
        raise ChecksumMismatchError(source, stored, data_checksum(text), "spew-FNV-32a of the data string")
    return text, stored, body


_C = TypeVar("_C", "CPUCheckpoint", "MemoryCheckpoint")


def _first_verified(
    source: str,
    stored: int,
    readings: list[_C],
    text: Callable[[_C, str], str],
    names: Mapping[str, tuple[str, ...]],
    zero_unverified: frozenset[str],
    pod_entries: bool,
) -> tuple[_C, bool]:
    """The first reading whose checksum is ``stored`` under one of the type names the kubelet
    hashes its format with, or whose checksum of 0 the kubelet accepts unverified; and whether it
    was verified. ChecksumMismatchError when none holds: it gives what the newest reading with (or,
    when the file has no ``pod_entries``, without) pod entries would have."""
    computed: dict[str, int] = {}
    for reading in readings:
        if stored == 0 and reading.version in zero_unverified:
            return reading, False
        sums = [fnv32a(text(reading, name)) for name in names[reading.version]]
        if stored in sums:
            return reading, True
        computed[reading.version] = sums[0]
    if not computed:
        raise CheckpointError(f"{source}: its entries fit no format the kubelet writes")
    own = [r.version for r in readings if r.version in computed and (r.pod_entries is not None) == pod_entries]
    own = own or list(computed)
    tried = ", ".join(f"{sum_} read as {version}" for version, sum_ in computed.items())
    raise ChecksumMismatchError(source, stored, computed[own[0]], f"spew-FNV-32a; {tried}")


# ----------------------------------------------------------------- CPU manager


# ----------------------------------------------------------------- CPU manager


class CPUCheckpoint(Struct, frozen=True, kw_only=True):
    """``cpu_manager_state``: the fields as written (which its checksum covers), then the one
    answer it gives whatever its format (``shared``, ``containers``, ``container_ids``, ``pods``)."""

    source: str
    version: str  # the format it was read and verified as: "v1", "v2", "v3" or "v4"
    policy_name: str  # "none" or "static", as written
    default_cpu_set: str
    # v2+: pod uid -> container name -> cpuset (None: "entries": null)
    entries: dict[str, dict[str, str] | None] | None = None
    # v1: container id -> cpuset
    container_entries: dict[str, str] | None = None
    # v3, v4: pod uid -> the pod's cpuset (None: "podEntries": null)
    pod_entries: dict[str, str] | None = None
    checksum: int = 0  # v4: the dataChecksum
    verified: bool = True  # False: a checksum of 0, accepted unverified as the kubelet does
    data: str = ""  # v4: the data string verified
    #: the shared pool (defaultCpuSet)
    shared: list[int] = []
    #: (pod uid, container name) -> the CPUs the CPU manager gave the container. Without a
    #: ``pods`` entry for its pod these are its exclusive CPUs; with one, they lie within the
    #: pod's, and may be the pod's shared pool, which several of its containers hold alike.
    containers: dict[tuple[str, str], list[int]] = {}
    #: v1 only: container id -> CPUs. A v1 file does not say which pod a container is in.
    container_ids: dict[str, list[int]] = {}
    #: pod uid -> the pod's exclusive CPUs (pod-level resources: v3, v4)
    pods: dict[str, list[int]] = {}

    @property
    def pod_uids_known(self) -> bool:
        """False for a v1 file: its entries name containers by their runtime id only."""
        return self.version != "v1"


def cpu_checksum_text(cp: CPUCheckpoint, name: str = "CPUManagerCheckpoint") -> str:
    """What the kubelet hashes for a v1, v2 or v3 file: ``(*state.NAME){...}`` with the checksum
    field 0. v3's pod entries are Go ``cpuset.CPUSet`` values, rendered field by field."""
    if cp.version == "v1":
        entries = f"(map[string]string){_spew_map(cp.container_entries)}"
    else:
        rendered = None if cp.entries is None else {p: _spew_map(c) for p, c in cp.entries.items()}
        entries = f"(map[string]map[string]string){_spew_map(rendered)}"
    pods = ""
    if cp.version == "v3":
        sets = None
        if cp.pod_entries is not None:
            sets = {
                pod: "{CPUSet:(cpuset.CPUSet){elems:(map[int]struct {})"
                + _spew_map(dict.fromkeys(CPUSet.parse(text).sorted_list(), "{}"))
                + "}}"
                for pod, text in cp.pod_entries.items()
            }
        pods = f" PodEntries:(state.PodCPUAssignments){_spew_map(sets)}"
    return (
        f"(*state.{name}){{PolicyName:(string){cp.policy_name} DefaultCPUSet:(string){cp.default_cpu_set} "
        f"Entries:{entries}{pods} Checksum:(checksum.Checksum)0}}"
    )


def _pod_containers(raw: Any, what: str, source: str) -> dict[str, dict[str, str] | None] | None:
    """v2+ entries: pod uid -> container name -> cpuset."""
    if raw is None:
        return None
    out: dict[str, dict[str, str] | None] = {}
    for pod, named in _object(raw, what, source).items():
        where = f"{what}[{pod}]"
        out[pod] = (
            None
            if named is None
            else {n: _string(c, f"{where}[{n}]", source) for n, c in _object(named, where, source).items()}
        )
    return out


def _container_ids(raw: Any, what: str, source: str) -> dict[str, str] | None:
    """v1 entries: container id -> cpuset."""
    if raw is None:
        return None
    return {cid: _string(c, f"{what}[{cid}]", source) for cid, c in _object(raw, what, source).items()}


def _pod_cpusets(raw: Any, what: str, source: str) -> dict[str, str] | None:
    """v3+ podEntries: pod uid -> {"cpuSet": cpuset}, each of which must parse (the kubelet
    parses it as it decodes the file)."""
    if raw is None:
        return None
    out: dict[str, str] = {}
    for pod, entry in _object(raw, what, source).items():
        where = f"{what}[{pod}]"
        out[pod] = _string(_field(_object(entry, where, source), "cpuSet", ""), f"{where}.cpuSet", source)
        _cpuset(out[pod], f"the cpuset of pod {pod!r}", source)
    return out


def _cpu_fields(obj: dict[str, Any], where: str, source: str) -> dict[str, Any]:
    return {
        "source": source,
        "policy_name": _string(_field(obj, "policyName", ""), f"{where}policyName", source),
        "default_cpu_set": _string(_field(obj, "defaultCpuSet", ""), f"{where}defaultCpuSet", source),
    }


def _cpu_readings(top: dict[str, Any], checksum: int, source: str) -> list[CPUCheckpoint]:
    """The readings of an older-format file that its shape allows, newest first."""
    fields = _cpu_fields(top, "", source) | {"checksum": checksum}
    # new*Checkpoint() starts with empty maps: a missing key keeps one, null makes it nil
    raw = _field(top, "entries", {})
    out: list[CPUCheckpoint] = []
    with contextlib.suppress(CheckpointError):
        entries = _pod_containers(raw, "entries", source)
        with contextlib.suppress(CheckpointError):
            pods = _pod_cpusets(_field(top, "podEntries", {}), "podEntries", source)
            out.append(CPUCheckpoint(version="v3", entries=entries, pod_entries=pods, **fields))
        out.append(CPUCheckpoint(version="v2", entries=entries, **fields))
    with contextlib.suppress(CheckpointError):
        out.append(CPUCheckpoint(version="v1", container_entries=_container_ids(raw, "entries", source), **fields))
    return out


def _cpu_answer(cp: CPUCheckpoint) -> CPUCheckpoint:
    """``cp`` with its one answer; a cpuset that does not parse (or is beyond any machine) is refused."""
    src = cp.source
    containers = {
        (pod, name): _cpuset(text, f"the cpuset of container {name!r} in pod {pod!r}", src).sorted_list()
        for pod, named in (cp.entries or {}).items()
        for name, text in (named or {}).items()
    }
    ids = {
        cid: _cpuset(text, f"the cpuset of container id {cid!r}", src).sorted_list()
        for cid, text in (cp.container_entries or {}).items()
    }
    pods = {
        p: _cpuset(text, f"the cpuset of pod {p!r}", src).sorted_list() for p, text in (cp.pod_entries or {}).items()
    }
    shared = _cpuset(cp.default_cpu_set, "the default cpu set", src).sorted_list()
    return msgspec.structs.replace(cp, shared=shared, containers=containers, container_ids=ids, pods=pods)


def parse_cpu_state(data: bytes | str, source: str = CPU_STATE) -> CPUCheckpoint:
    """Parse and verify ``cpu_manager_state`` in any format a kubelet from 1.20 to 1.37 writes
    (v1 to v4, see above), and give its one answer."""
    top = _object(_decode_json(data, source), "the checkpoint", source)
    newest = _newest(top, source)
    if newest is not None:
        # the kubelet decodes the v3 keys beside data too; they are not verified (checksum 0)
        _pod_containers(_field(top, "entries", {}), "entries", source)
        _pod_cpusets(_field(top, "podEntries", {}), "podEntries", source)
        text, stored, body = newest
        cp = CPUCheckpoint(
            version="v4",
            entries=_pod_containers(_field(body, "entries", {}), "data.entries", source),
            pod_entries=_pod_cpusets(_field(body, "podEntries", {}), "data.podEntries", source),
            checksum=stored,
            data=text,
            **_cpu_fields(body, "data.", source),
        )
        return _cpu_answer(cp)
    stored = _uint(_field(top, "checksum", 0), "checksum", source)
    readings = _cpu_readings(top, stored, source)
    zero_ok = frozenset({"v1", "v2"})
    cp, verified = _first_verified(
        source, stored, readings, cpu_checksum_text, _CPU_NAMES, zero_ok, _has(top, "podEntries")
    )
    return _cpu_answer(msgspec.structs.replace(cp, verified=verified))


# ----------------------------------------------------------------- memory manager


class MemoryTable(Struct, frozen=True, kw_only=True):
    """One resource (``memory``, ``hugepages-2Mi``...) on one NUMA node, in bytes."""

    total: int
    system_reserved: int
    allocatable: int
    reserved: int
    free: int


class NUMANodeState(Struct, frozen=True, kw_only=True):
    number_of_assignments: int
    memory_map: dict[str, MemoryTable] | None  # resource -> its table (None: "memoryMap": null)
    cells: list[int] | None  # the NUMA nodes this one is grouped with (None: "cells": null)


class MemoryBlock(Struct, frozen=True, kw_only=True):
    """Memory of one type given to a container (or a pod), on these NUMA nodes."""

    numa_affinity: list[int] | None
    type: str  # "memory", "hugepages-1Gi"...
    size: int  # bytes


class MemoryCheckpoint(Struct, frozen=True, kw_only=True):
    """``memory_manager_state``: the fields as written (which its checksum covers), then the one
    answer it gives whatever its format (``containers``, ``pods``)."""

    source: str
    version: str  # the format it was read and verified as: "v1", "v2" or "v3"
    policy_name: str  # "None" or "Static", as written
    machine_state: dict[int, NUMANodeState]  # NUMA node -> its memory
    # pod uid -> container name -> its blocks (None: "entries": null)
    entries: dict[str, dict[str, list[MemoryBlock] | None] | None] | None = None
    # v2, v3: pod uid -> the pod's blocks (None: "podEntries": null)
    pod_entries: dict[str, list[MemoryBlock] | None] | None = None
    checksum: int = 0  # v3: the dataChecksum
    verified: bool = True  # False: a v1 checksum of 0, accepted unverified as the kubelet does
    data: str = ""  # v3: the data string verified
    #: (pod uid, container name) -> the container's memory blocks
    containers: dict[tuple[str, str], list[MemoryBlock]] = {}
    #: pod uid -> the pod's memory blocks (pod-level resources: v2, v3)
    pods: dict[str, list[MemoryBlock]] = {}


def _spew_blocks(blocks: list[MemoryBlock] | None) -> str:
    if blocks is None:
        return "<nil>"
    rendered = (
        f"{{NUMAAffinity:([]int){_spew_ints(b.numa_affinity)} Type:(v1.ResourceName){b.type} Size:(uint64){b.size}}}"
        for b in blocks
    )
    return "[" + " ".join(rendered) + "]"


def _spew_node(s: NUMANodeState) -> str:
    tables = None
    if s.memory_map is not None:
        tables = {
            kind: f"<*>{{TotalMemSize:(uint64){t.total} SystemReserved:(uint64){t.system_reserved} "
            f"Allocatable:(uint64){t.allocatable} Reserved:(uint64){t.reserved} Free:(uint64){t.free}}}"
            for kind, t in s.memory_map.items()
        }
    return (
        f"<*>{{NumberOfAssignments:(int){s.number_of_assignments} "
        f"MemoryMap:(map[v1.ResourceName]*state.MemoryTable){_spew_map(tables)} Cells:([]int){_spew_ints(s.cells)}}}"
    )


def memory_checksum_text(cp: MemoryCheckpoint, name: str = "MemoryManagerCheckpoint") -> str:
    """What the kubelet hashes for a v1 or v2 file (and for v3's own v1 keys, as v1):
    ``(*state.NAME){...}`` with the checksum field 0."""
    entries = None
    if cp.entries is not None:
        entries = {
            pod: _spew_map(None if named is None else {n: _spew_blocks(b) for n, b in named.items()})
            for pod, named in cp.entries.items()
        }
    pods = ""
    if cp.version == "v2":
        rendered = None
        if cp.pod_entries is not None:
            rendered = {p: f"{{MemoryBlocks:([]state.Block){_spew_blocks(b)}}}" for p, b in cp.pod_entries.items()}
        pods = f" PodEntries:(state.PodMemoryAssignments){_spew_map(rendered)}"
    nodes = {node: _spew_node(s) for node, s in cp.machine_state.items()}
    return (
        f"(*state.{name}){{PolicyName:(string){cp.policy_name} MachineState:(state.NUMANodeMap){_spew_map(nodes)} "
        f"Entries:(state.ContainerMemoryAssignments){_spew_map(entries)}{pods} Checksum:(checksum.Checksum)0}}"
    )


def _numa_id(value: Any, what: str, source: str) -> int:
    """A NUMA node id: a JSON integer, or a map key in decimal (as Go's strconv.ParseInt reads it)."""
    if isinstance(value, str) and re.fullmatch(r"[+-]?[0-9]{1,19}", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_NUMA_NODES:
        raise CheckpointError(f"{source}: {what} must be a NUMA node id from 0 to {MAX_NUMA_NODES - 1}, not {value!r}")
    return value


_T = TypeVar("_T")


def _list(value: Any, what: str, source: str, item: Callable[[Any, str, str], _T]) -> list[_T] | None:
    """A JSON list (None: null), each item read by ``item(value, where, source)``."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise CheckpointError(f"{source}: {what} must be a list, not {type(value).__name__}")
    return [item(v, f"{what}[{n}]", source) for n, v in enumerate(value)]


def _int64(value: Any, what: str, source: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not -(1 << 63) <= value < (1 << 63):
        raise CheckpointError(f"{source}: {what} must be a 64-bit integer, not {value!r}")
    return value


def _block(raw: Any, where: str, source: str) -> MemoryBlock:
    b = _object(raw, where, source)
    return MemoryBlock(
        numa_affinity=_list(_field(b, "numaAffinity", None), f"{where}.numaAffinity", source, _numa_id),
        type=_string(_field(b, "type", ""), f"{where}.type", source),
        size=_uint(_field(b, "size", 0), f"{where}.size", source),
    )


_TABLE_FIELDS = (
    ("total", "total"),
    ("system_reserved", "systemReserved"),
    ("allocatable", "allocatable"),
    ("reserved", "reserved"),
    ("free", "free"),
)


def _machine_state(raw: Any, what: str, source: str) -> dict[int, NUMANodeState]:
    out: dict[int, NUMANodeState] = {}
    for key, value in _object({} if raw is None else raw, what, source).items():
        node = _numa_id(key, f"a key of {what}", source)
        if node in out:
            raise CheckpointError(f"{source}: {what} names NUMA node {node} twice")
        where = f"{what}[{key}]"
        s = _object(value, where, source)
        tables = _field(s, "memoryMap", None)
        memory_map = None
        if tables is not None:
            memory_map = {}
            for kind, t in _object(tables, f"{where}.memoryMap", source).items():
                tw = f"{where}.memoryMap[{kind}]"
                t = _object(t, tw, source)
                memory_map[kind] = MemoryTable(
                    **{f: _uint(_field(t, k, 0), f"{tw}.{k}", source) for f, k in _TABLE_FIELDS}
                )
        out[node] = NUMANodeState(
            number_of_assignments=_int64(_field(s, "numberOfAssignments", 0), f"{where}.numberOfAssignments", source),
            memory_map=memory_map,
            cells=_list(_field(s, "cells", None), f"{where}.cells", source, _numa_id),
        )
    return out


def _memory_entries(raw: Any, what: str, source: str) -> dict[str, dict[str, list[MemoryBlock] | None] | None] | None:
    if raw is None:
        return None
    out: dict[str, dict[str, list[MemoryBlock] | None] | None] = {}
    for pod, named in _object(raw, what, source).items():
        where = f"{what}[{pod}]"
        out[pod] = (
            None
            if named is None
            else {n: _list(b, f"{where}[{n}]", source, _block) for n, b in _object(named, where, source).items()}
        )
    return out


def _memory_pods(raw: Any, what: str, source: str) -> dict[str, list[MemoryBlock] | None] | None:
    if raw is None:
        return None
    out: dict[str, list[MemoryBlock] | None] = {}
    for pod, entry in _object(raw, what, source).items():
        where = f"{what}[{pod}]"
        blocks = _field(_object(entry, where, source), "memoryBlocks", None)
        out[pod] = _list(blocks, f"{where}.memoryBlocks", source, _block)
    return out


def _memory_fields(obj: dict[str, Any], where: str, source: str) -> dict[str, Any]:
    """What every format has (v1's keys, and v3's data): newMemoryManagerCheckpoint*() start with
    empty maps, so a missing key keeps one."""
    return {
        "source": source,
        "policy_name": _string(_field(obj, "policyName", ""), f"{where}policyName", source),
        "machine_state": _machine_state(_field(obj, "machineState", {}), f"{where}machineState", source),
        "entries": _memory_entries(_field(obj, "entries", {}), f"{where}entries", source),
    }


def _memory_answer(cp: MemoryCheckpoint) -> MemoryCheckpoint:
    containers = {
        (pod, name): list(blocks or [])
        for pod, named in (cp.entries or {}).items()
        for name, blocks in (named or {}).items()
    }
    pods = {pod: list(blocks or []) for pod, blocks in (cp.pod_entries or {}).items()}
    return msgspec.structs.replace(cp, containers=containers, pods=pods)


def parse_memory_state(data: bytes | str, source: str = MEMORY_STATE) -> MemoryCheckpoint:
    """Parse and verify ``memory_manager_state`` in any format a kubelet from 1.21 to 1.37 writes
    (v1 to v3, see above), and give its one answer. NUMA node ids and sizes are range-checked."""
    top = _object(_decode_json(data, source), "the checkpoint", source)
    legacy = _memory_fields(top, "", source)  # the kubelet decodes these whatever the format
    newest = _newest(top, source)
    if newest is not None:
        text, stored, body = newest
        pods = _memory_pods(_field(body, "podEntries", {}), "data.podEntries", source)
        fields = _memory_fields(body, "data.", source)
        return _memory_answer(MemoryCheckpoint(version="v3", pod_entries=pods, checksum=stored, data=text, **fields))
    stored = _uint(_field(top, "checksum", 0), "checksum", source)
    readings = []
    with contextlib.suppress(CheckpointError):
        pods = _memory_pods(_field(top, "podEntries", {}), "podEntries", source)
        readings.append(MemoryCheckpoint(version="v2", pod_entries=pods, checksum=stored, **legacy))
    readings.append(MemoryCheckpoint(version="v1", checksum=stored, **legacy))
    zero_ok = frozenset({"v1"})
    cp, verified = _first_verified(
        source, stored, readings, memory_checksum_text, _MEMORY_NAMES, zero_ok, _has(top, "podEntries")
    )
    return _memory_answer(msgspec.structs.replace(cp, verified=verified))


# --------------------------------------------------------------------------- DRA manager


class DRADevice(Struct, frozen=True, kw_only=True):
    pool_name: str = ""
    device_name: str = ""
    share_id: str | None = None
    request_names: list[str] | None = None
    cdi_device_ids: list[str] | None = None


class DRAClaim(Struct, frozen=True, kw_only=True):
    claim_uid: str
    claim_name: str = ""
    namespace: str = ""
    pod_uids: list[str] = []
    # driver name -> its devices
    driver_state: dict[str, list[DRADevice]] = {}


class DRACheckpoint(Struct, frozen=True, kw_only=True):
    source: str
    entries: list[DRAClaim]
    checksum: int


def parse_dra_state(data: bytes | str, source: str = DRA_STATE) -> DRACheckpoint:
    """Parse and verify ``dra_manager_state`` in its CRC32 form."""
    top = _object(_decode_json(data, source), "the checkpoint", source)
    if _has(top, "version") or (_has(top, "entries") and not _has(top, "Data")):
        raise CheckpointError(
            f"{source}: this is the old DRA checkpoint format (version/entries, a spew-FNV checksum over "
            "alpha-API resource handles); its checksum rules are not known to eventsrc, so it cannot be "
            "verified and is not imported"
        )
    inner = _string(_field(top, "Data", ""), "Data", source)
    stored = _uint(_field(top, "Checksum", 0), "Checksum", source, bits=32)
    computed = crc32(inner)
    if computed != stored:
        raise ChecksumMismatchError(source, stored, computed, "CRC-32/IEEE of the Data string")
    body = _object(_decode_json(inner, f"{source}: Data"), "Data", source)
    kind = _field(body, "kind", "")
    api = _field(body, "apiVersion", "")
    if kind != DRA_KIND or api != DRA_API_VERSION:
        raise CheckpointError(
            f"{source}: Data is kind {kind!r} apiVersion {api!r}; expected {DRA_KIND!r} {DRA_API_VERSION!r}"
        )
    claims = []
    for n, raw in enumerate(_field(body, "Entries", None) or []):
        where = f"Data.Entries[{n}]"
        e = _object(raw, where, source)
        drivers: dict[str, list[DRADevice]] = {}
        for driver, state in (_object(_field(e, "DriverState", None) or {}, f"{where}.DriverState", source)).items():
            devices = []
            for m, d in enumerate(
                _field(_object(state, f"{where}.DriverState[{driver}]", source), "Devices", None) or []
            ):
                dw = f"{where}.DriverState[{driver}].Devices[{m}]"
                d = _object(d, dw, source)
                share = _field(d, "ShareID", None)
                devices.append(
                    DRADevice(
                        pool_name=_string(_field(d, "PoolName", ""), f"{dw}.PoolName", source),
                        device_name=_string(_field(d, "DeviceName", ""), f"{dw}.DeviceName", source),
                        share_id=None if share is None else _string(share, f"{dw}.ShareID", source),
                        request_names=_strings(_field(d, "RequestNames", None), f"{dw}.RequestNames", source),
                        cdi_device_ids=_strings(_field(d, "CDIDeviceIDs", None), f"{dw}.CDIDeviceIDs", source),
                    )
                )
            drivers[driver] = devices
        pods = _field(e, "PodUIDs", None) or {}
        claims.append(
            DRAClaim(
                claim_uid=_string(_field(e, "ClaimUID", ""), f"{where}.ClaimUID", source),
                claim_name=_string(_field(e, "ClaimName", ""), f"{where}.ClaimName", source),
                namespace=_string(_field(e, "Namespace", ""), f"{where}.Namespace", source),
                pod_uids=sorted(_object(pods, f"{where}.PodUIDs", source)),
                driver_state=drivers,
            )
        )
    return DRACheckpoint(source=source, entries=claims, checksum=stored)


# --------------------------------------------------------------------------- files


#: The most a kubelet checkpoint file may hold. The kubelet's are kilobytes (a pod's devices and
#: CPUs are a line each): 4 MiB holds some 20,000 device assignments. A larger file is refused
#: unread, so that a file nobody should have written there cannot take the daemon's memory.
MAX_CHECKPOINT_BYTES = 4 << 20


def open_regular(path: Path, cap: int = MAX_CHECKPOINT_BYTES) -> tuple[int, FileKey] | None:
    """``path`` opened for reading, and its key, or None when it is not there (``bounded_file``):
    no symbolic link is followed (the kubelet writes its checkpoints in place, by rename; a link
    could lead to a device or to anything on the host). CheckpointError names what is refused."""
    try:
        return bounded_file.open_regular(path, cap)
    except bounded_file.FileRefused as exc:
        raise CheckpointError(f"{path}: {exc}") from None


def read_open(fd: int, path: Path, cap: int = MAX_CHECKPOINT_BYTES) -> bytes:
    """At most ``cap`` bytes of the open file ``fd`` (closed here)."""
    try:
        return bounded_file.read_open(fd, cap)
    except bounded_file.FileRefused as exc:
        raise CheckpointError(f"{path}: {exc}") from None


def _read(path: Path) -> bytes:
    try:
        return bounded_file.read_regular(path, MAX_CHECKPOINT_BYTES)
    except bounded_file.FileRefused as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from None


def read_device_checkpoint(path: Path) -> DeviceCheckpoint:
    return parse_device_checkpoint(_read(path), str(path))


def read_cpu_state(path: Path) -> CPUCheckpoint:
    return parse_cpu_state(_read(path), str(path))


def read_memory_state(path: Path) -> MemoryCheckpoint:
    return parse_memory_state(_read(path), str(path))


def read_dra_state(path: Path) -> DRACheckpoint:
    return parse_dra_state(_read(path), str(path))


# --------------------------------------------------------------------------- events


def _allocation(entry: PodDevicesEntry, source: str) -> ev.ContainerAllocation:
    """The plugin's ContainerAllocateResponse, stored proto-encoded in the checkpoint."""
    from google.protobuf.message import DecodeError

    from eventsrc.gen.deviceplugin.v1beta1 import api_pb2 as pb
    from eventsrc.inputs.allocations import allocation_from_proto

    resp = pb.ContainerAllocateResponse()
    try:
        resp.ParseFromString(entry.alloc_resp or b"")
    except DecodeError as exc:
        raise CheckpointError(
            f"{source}: the AllocResp of pod {entry.pod_uid} container {entry.container_name} "
            f"resource {entry.resource_name} is not a ContainerAllocateResponse: {exc}"
        ) from None
    return allocation_from_proto(resp)


class _Pod:
    def __init__(self) -> None:
        self.containers: dict[str, dict[str, str]] = {}  # name -> inferred requests (= limits)
        self.exclusive_cpus = False


def events_from(
    device: DeviceCheckpoint | None = None,
    cpu: CPUCheckpoint | None = None,
    dra: DRACheckpoint | None = None,
    *,
    old_cpu_policy: Mapping[str, Any] | None = None,
) -> list[ev.EventBase]:
    """The events that reproduce the checkpoints' state, in the order a log would have them.

    What the checkpoints say, and what is assumed:

    * **Pods.** No checkpoint records a pod's namespace or name (only its uid), nor a
      container's kind: every pod is admitted with an empty namespace and name, every
      container as an app container. A pod's containers are the ones the device and CPU
      checkpoints name (a pod only the DRA state knows gets no containers). Requests are
      inferred where the kubelet's rules fix them: a container holding N devices of a
      resource requested (and was limited to) N of it; a container with N exclusive CPUs
      under the static policy was in a Guaranteed pod with an integer request of N CPUs.
      Which container uses which claim is not recorded: containers get no claims.
    * **Devices.** ``RegisteredDevices`` holds each resource's *healthy* device ids at write
      time: they are added as Healthy, with the NUMA nodes an allocation entry places them
      on (others' topology is unknown until the plugin lists them again). A held device
      missing from that list was unhealthy or gone: it is not added, only held (health
      Unknown). Each registered resource gets a PluginRegistered (the endpoint is not
      recorded: left empty) followed by a PluginDisconnected, which is the kubelet's own
      state after a restart: a stopped endpoint that the plugin must register again within
      the grace period.
    * **Allocations.** One DevicesAllocated per (pod, container, resource), with the
      plugin's decoded ``AllocResp``. V1 device checkpoints carry no NUMA nodes.
    * **CPUs.** PolicyConfigurationChanged(manager="cpu") with the policy name, one
      CPUsAssigned per container, and (static policy) SharedPoolChanged with
      ``defaultCpuSet``. The reserved CPUs are not in the file (they are in the shared
      pool); the daemon records its own configuration when it starts. V1 files key their
      entries by container id, which only the container runtime can map to pods: such a
      file with entries is refused.
    * **Claims.** PodReferenceAdded per (claim, pod) and ClaimPrepared with the devices and
      CDI ids. A claim prepared by several drivers cannot be represented (eventsrc keeps one
      driver per claim) and is refused.
    """
    pods: dict[str, _Pod] = {}
    out: list[ev.EventBase] = []
    cpu_assignments: list[ev.CPUsAssigned] = []
    if cpu is not None:  # the policy first: it frames the assignments
        out.append(_cpu_policy_changed(cpu, old_cpu_policy))
        cpu_assignments = _cpu_assignments(cpu, pods)
    allocations: list[ev.DevicesAllocated] = []
    if device is not None:  # resources and their devices, then who holds what
        out += _device_resources(device)
        allocations = _device_allocations(device, pods)
    claims = _claim_events(dra, pods) if dra is not None else []
    out += _pods_admitted(pods)  # pods before what they hold: the views attach holdings to known pods only
    out += allocations
    out += cpu_assignments
    if cpu is not None and cpu.policy_name == "static":
        out.append(ev.SharedPoolChanged(cpus=list(cpu.shared), reason=f"{IMPORT_REASON} ({cpu.source})"))
    out += claims
    return out


def _cpu_policy_changed(cpu: CPUCheckpoint, old_cpu_policy: Mapping[str, Any] | None) -> ev.PolicyConfigurationChanged:
    if cpu.version == "v1" and cpu.container_entries:
        raise CheckpointError(
            f"{cpu.source}: a V1 CPU manager checkpoint keys its {len(cpu.container_entries)} entries by "
            "container id, which only the container runtime can map to pods; start a kubelet (1.18 or newer) "
            "once to rewrite it in the V2 format, then import that"
        )
    new = {"policy": cpu.policy_name, "imported_from": cpu.source, "default_cpu_set": cpu.default_cpu_set}
    return ev.PolicyConfigurationChanged(manager="cpu", old=dict(old_cpu_policy or {}), new=new)


def _cpu_assignments(cpu: CPUCheckpoint, pods: dict[str, _Pod]) -> list[ev.CPUsAssigned]:
    """One CPUsAssigned per container; the containers (and exclusive CPU requests) go to ``pods``."""
    out: list[ev.CPUsAssigned] = []
    for (uid, name), cpus in sorted(cpu.containers.items()):
        p = pods.setdefault(uid, _Pod())
        requests = p.containers.setdefault(name, {})
        if cpu.policy_name == "static" and cpus:
            requests["cpu"] = str(len(cpus))
            p.exclusive_cpus = True
        out.append(ev.CPUsAssigned(pod_uid=uid, container=name, cpus=list(cpus)))
    return out


def _device_resources(device: DeviceCheckpoint) -> list[ev.EventBase]:
    """Each registered resource: registered, its healthy devices added, then disconnected."""
    numa: dict[str, dict[str, list[int]]] = {}
    for e in device.entries or []:
        for i, nodes in e.numa_of().items():
            numa.setdefault(e.resource_name, {})[i] = nodes
    out: list[ev.EventBase] = []
    for resource, ids in sorted((device.registered_devices or {}).items()):
        out.append(ev.PluginRegistered(resource=resource, endpoint=""))
        listed = sorted(set(ids or []))
        if listed:
            known = numa.get(resource, {})
            devices = [ev.DeviceInfo(id=i, health="Healthy", numa_nodes=known.get(i, [])) for i in listed]
            out.append(ev.DevicesAdded(resource=resource, devices=devices))
        reason = f"{IMPORT_REASON}: the plugin must register again"
        out.append(ev.PluginDisconnected(resource=resource, endpoint="", reason=reason))
    return out


def _device_allocations(device: DeviceCheckpoint, pods: dict[str, _Pod]) -> list[ev.DevicesAllocated]:
    """One DevicesAllocated per (pod, container, resource); the device requests go to ``pods``."""
    out: list[ev.DevicesAllocated] = []
    seen: set[tuple[str, str, str]] = set()
    for e in device.entries or []:
        key = (e.pod_uid, e.container_name, e.resource_name)
        if key in seen:
            raise CheckpointError(
                f"{device.source}: two entries for pod {e.pod_uid} container {e.container_name} "
                f"resource {e.resource_name}"
            )
        seen.add(key)
        ids = e.all_device_ids()
        requests = pods.setdefault(e.pod_uid, _Pod()).containers.setdefault(e.container_name, {})
        requests[e.resource_name] = str(len(ids))
        response = _allocation(e, device.source)
        out.append(
            ev.DevicesAllocated(
                pod_uid=e.pod_uid,
                container=e.container_name,
                resource=e.resource_name,
                device_ids=ids,
                response=response,
            )
        )
    return out


def _claim_events(dra: DRACheckpoint, pods: dict[str, _Pod]) -> list[ev.EventBase]:
    """PodReferenceAdded per (claim, pod) and ClaimPrepared per claim; the pods go to ``pods``."""
    out: list[ev.EventBase] = []
    for c in dra.entries:
        if len(c.driver_state) > 1:
            raise CheckpointError(
                f"{dra.source}: claim {c.namespace}/{c.claim_name} ({c.claim_uid}) was prepared by "
                f"{len(c.driver_state)} drivers ({', '.join(sorted(c.driver_state))}); eventsrc keeps one "
                "driver per claim and cannot import it"
            )
        for uid in c.pod_uids:
            pods.setdefault(uid, _Pod())
            out.append(ev.PodReferenceAdded(claim_uid=c.claim_uid, pod_uid=uid))
        driver, devices = next(iter(c.driver_state.items()), ("", []))
        prepared = [
            ev.PreparedDevice(
                request_names=list(d.request_names or []),
                pool_name=d.pool_name,
                device_name=d.device_name,
                cdi_device_ids=list(d.cdi_device_ids or []),
            )
            for d in devices
        ]
        claim = ev.ClaimRef(uid=c.claim_uid, namespace=c.namespace, name=c.claim_name)
        out.append(ev.ClaimPrepared(claim=claim, driver=driver, devices=prepared))
    return out


def _pods_admitted(pods: dict[str, _Pod]) -> list[ev.EventBase]:
    out: list[ev.EventBase] = []
    for uid, p in sorted(pods.items()):
        specs = [
            ev.ContainerSpec(name=name, kind="app", requests=dict(req), limits=dict(req))
            for name, req in sorted(p.containers.items())
        ]
        qos = "Guaranteed" if p.exclusive_cpus else ""
        out.append(ev.PodAdmitted(pod=ev.PodRef(uid=uid), containers=specs, qos_class=qos))
    return out


class ImportSummary(Struct, kw_only=True):
    events: int = 0
    pods: int = 0
    containers: int = 0
    resources: int = 0
    devices: int = 0
    device_allocations: int = 0
    cpu_assignments: int = 0
    cpu_policy: str = ""
    claims: int = 0


def summarize(events: Iterable[ev.EventBase]) -> ImportSummary:
    s = ImportSummary()
    for e in events:
        s.events += 1
        if isinstance(e, ev.PodAdmitted):
            s.pods += 1
            s.containers += len(e.containers)
        elif isinstance(e, ev.PluginRegistered):
            s.resources += 1
        elif isinstance(e, ev.DevicesAdded):
            s.devices += len(e.devices)
        elif isinstance(e, ev.DevicesAllocated):
            s.device_allocations += 1
        elif isinstance(e, ev.CPUsAssigned):
            s.cpu_assignments += 1
        elif isinstance(e, ev.PolicyConfigurationChanged):
            s.cpu_policy = str(e.new.get("policy", ""))
        elif isinstance(e, ev.ClaimPrepared):
            s.claims += 1
    return s
