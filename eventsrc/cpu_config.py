"""The CPU manager's configuration from flags, files and sysfs (the shell around core.cpu_static)."""

from __future__ import annotations

from pathlib import Path

from eventsrc.core.cpu_assignment import parse_policy_options, validate_static_policy_options
from eventsrc.core.cpu_static import CPUManagerConfig, reserved_cpus
from eventsrc.core.cpuset import CPUSet
from eventsrc.core.topology import CPUTopology, decode_topology_file
from eventsrc.errors import EventsrcError


def parse_map(text: str, flag: str) -> dict[str, str]:
    """``k=v,k=v`` as the kubelet's map flags take it."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise EventsrcError(f"{flag}: {part!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def load_topology(topology_file: Path | None, sysfs_root: Path) -> CPUTopology:
    if topology_file is not None:
        try:
            data = topology_file.read_bytes()
        except OSError as exc:
            raise EventsrcError(f"--topology-file {topology_file}: {exc.strerror}") from None
        return decode_topology_file(data, str(topology_file))
    from eventsrc.plugins.sysfs_topology import discover_topology

    return discover_topology(sysfs_root)


def load_cpu_config(
    policy: str,
    options: str,
    reserved: str,
    reserved_count: int,
    topology: CPUTopology,
    feature_gates: dict[str, str] | None = None,
    topology_manager_policy: str = "none",
) -> CPUManagerConfig:
    gates = {k: v.lower() in ("1", "t", "true") for k, v in (feature_gates or {}).items()}
    opts = parse_policy_options(
        parse_map(options, "--cpu-manager-policy-options"),
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
