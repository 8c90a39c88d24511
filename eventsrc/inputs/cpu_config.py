"""The CPU and memory managers' configuration from flags, files and sysfs (the shell around
core.cpu.static and core.memory)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import msgspec

from eventsrc.core.cpu.assignment import parse_policy_options, validate_static_policy_options
from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.core.cpu.static import CPUManagerConfig, reserved_cpus
from eventsrc.core.cpu.topology import CPUTopology, decode_topology_file
from eventsrc.core.memory.machine import (
    MemoryMachine,
    decode_memory_machine,
    decode_reserved_memory,
    get_system_reserved_memory,
)
from eventsrc.core.memory.manager import MemoryManagerConfig
from eventsrc.core.memory.static_policy import POLICY_STATIC, initial_machine_state
from eventsrc.errors import EventsrcError
from eventsrc.inputs.config import ReservedMemory
from eventsrc.inputs.sysfs_memory import SysfsMemoryError, read_memory_machine


def load_topology(topology_file: Path | None, sysfs_root: Path) -> CPUTopology:
    if topology_file is not None:
        try:
            data = topology_file.read_bytes()
        except OSError as exc:
            raise EventsrcError(f"--topology-file {topology_file}: {exc.strerror}") from None
        return decode_topology_file(data, str(topology_file))
    from eventsrc.inputs.sysfs_topology import discover_topology

    return discover_topology(sysfs_root)


class _MemoryOnly(msgspec.Struct):
    memory: dict[str, dict[str, int | str]] | None = None


def load_memory_machine(topology_file: Path | None, sysfs_root: Path, required: bool) -> MemoryMachine | None:
    """The memory and hugepages per NUMA node: the topology file's ``memory`` when a file is
    given, else sysfs. None when it is not known (a file without it, a sysfs without NUMA
    nodes): the fit then does not check memory. ``required`` (the Static policy): not
    knowing it is the error."""
    if topology_file is None:
        try:
            return read_memory_machine(sysfs_root)
        except SysfsMemoryError:
            if required:
                raise
            return None
    source = f"--topology-file {topology_file}"
    try:
        parsed = msgspec.json.decode(topology_file.read_bytes(), type=_MemoryOnly)
    except OSError as exc:
        raise EventsrcError(f"{source}: {exc.strerror}") from None
    except (msgspec.ValidationError, msgspec.DecodeError) as err:
        raise EventsrcError(f"{source}: {err}") from None
    if parsed.memory is None:
        if required:
            raise EventsrcError(f'{source}: no "memory" per NUMA node, which the Static memory manager needs')
        return None
    return decode_memory_machine(parsed.memory, f"{source}: memory")


def load_memory_config(
    policy: str, machine: MemoryMachine | None, reserved: Sequence[ReservedMemory], node_reserved: str
) -> MemoryManagerConfig:
    """The memory manager as the kubelet's ``NewManager`` sets it up: with Static, the
    ``--reserved-memory`` checked against what the node keeps back of memory
    (``node_reserved``), and the machine state with nothing assigned."""
    if policy != POLICY_STATIC or machine is None:
        return MemoryManagerConfig(policy)
    reservations = decode_reserved_memory(msgspec.to_builtins(reserved), "reservedMemory")
    kept = get_system_reserved_memory(machine, {"memory": node_reserved}, reservations)
    return MemoryManagerConfig(policy, machine, kept, initial_machine_state(machine, kept))


def load_cpu_config(
    policy: str,
    options: Mapping[str, str],
    reserved: str,
    reserved_count: int,
    topology: CPUTopology,
    feature_gates: Mapping[str, bool] | None = None,
    topology_manager_policy: str = "none",
) -> CPUManagerConfig:
    gates = feature_gates or {}
    opts = parse_policy_options(
        options,
        alpha_enabled=gates.get("CPUManagerPolicyAlphaOptions", False),
        beta_enabled=gates.get("CPUManagerPolicyBetaOptions", True),
    )
    explicit = CPUSet.parse(reserved) if reserved else None
    if policy == "static":
        validate_static_policy_options(opts, topology, topology_manager_policy)
        chosen = reserved_cpus(topology, reserved_count, explicit, opts)
    elif policy == "none":
        chosen = explicit or CPUSet()
    else:
        raise EventsrcError(f'unknown policy: "{policy}"')
    return CPUManagerConfig(policy=policy, topology=topology, reserved=chosen, options=opts)
