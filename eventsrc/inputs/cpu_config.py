"""The CPU manager's configuration from flags, files and sysfs (the shell around core.cpu_static)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from eventsrc.core.cpu.assignment import parse_policy_options, validate_static_policy_options
from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.core.cpu.static import CPUManagerConfig, reserved_cpus
from eventsrc.core.cpu.topology import CPUTopology, decode_topology_file
from eventsrc.errors import EventsrcError


def load_topology(topology_file: Path | None, sysfs_root: Path) -> CPUTopology:
    if topology_file is not None:
        try:
            data = topology_file.read_bytes()
        except OSError as exc:
            raise EventsrcError(f"--topology-file {topology_file}: {exc.strerror}") from None
        return decode_topology_file(data, str(topology_file))
    from eventsrc.inputs.sysfs_topology import discover_topology

    return discover_topology(sysfs_root)


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
