"""Discover the CPU topology from sysfs, as cadvisor gathers it for the kubelet.

This is the I/O half; ``eventsrc.core.cpu.topology.discover`` (the kubelet's ``Discover``) does
the rest. Read under ``root`` (``/`` on a real machine, a fake tree in tests):

- online CPUs: ``sys/devices/system/cpu/online`` (every ``cpuN`` directory when absent);
- per CPU: ``cpuN/topology/core_id`` and ``physical_package_id``, and the L3 cache id
  (``cpuN/cache/index*/id`` of the index whose ``level`` is 3) as the uncore cache;
- NUMA nodes: ``sys/devices/system/node/nodeN/cpulist``. Without NUMA nodes, each socket
  stands as its own node (cadvisor does the same).

As cadvisor does, threads are grouped into cores by (NUMA node, socket, ``core_id``);
``core_id`` repeats across sockets, and ``discover`` then names each core by its lowest CPU.
Every error is one line naming the file.
"""

from __future__ import annotations

import re
from pathlib import Path

from eventsrc.core.cpu.cpuset import CPUSet, CPUSetParseError, parse
from eventsrc.core.cpu.topology import Core, CPUTopology, MachineInfo, Node, discover
from eventsrc.errors import EventsrcError

_CPU_DIR = re.compile(r"cpu([0-9]+)")
_NODE_DIR = re.compile(r"node([0-9]+)")
_INDEX_DIR = re.compile(r"index[0-9]+")


class SysfsError(EventsrcError):
    """sysfs is missing, unreadable or says something that makes no sense."""


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise SysfsError(f"cannot read {path}: no such file") from None
    except OSError as exc:
        raise SysfsError(f"cannot read {path}: {exc.strerror or exc}") from None


def _read_int(path: Path) -> int:
    text = _read(path)
    try:
        return int(text)
    except ValueError:
        raise SysfsError(f"{path}: expected an integer, found {text!r}") from None


def _read_cpulist(path: Path) -> CPUSet:
    try:
        return parse(_read(path))
    except CPUSetParseError as err:
        raise SysfsError(f"{path}: {err}") from None


def numbered_dirs(parent: Path, pattern: re.Pattern[str]) -> dict[int, Path]:
    """The directories of ``parent`` whose names ``pattern`` matches, by the number it captures."""
    try:
        entries = list(parent.iterdir())
    except OSError as exc:
        raise SysfsError(f"cannot list {parent}: {exc.strerror or exc}") from None
    out: dict[int, Path] = {}
    for entry in entries:
        m = pattern.fullmatch(entry.name)
        if m and entry.is_dir():
            out[int(m.group(1))] = entry
    return out


def _l3_cache_id(cpu_dir: Path) -> int | None:
    cache = cpu_dir / "cache"
    if not cache.is_dir():
        return None
    for index in sorted(p for p in cache.iterdir() if _INDEX_DIR.fullmatch(p.name)):
        level = index / "level"
        if level.is_file() and _read(level) == "3":
            ident = index / "id"
            # Old kernels have no cache ids: then there is no uncore information.
            return _read_int(ident) if ident.is_file() else None
    return None


def read_machine_info(root: Path) -> MachineInfo:
    """The facts cadvisor would report for the machine whose sysfs is under ``root``."""
    cpu_root = root / "sys" / "devices" / "system" / "cpu"
    if not cpu_root.is_dir():
        raise SysfsError(f"{cpu_root} is not a directory: no sysfs there (give --sysfs-root or --topology-file)")
    cpu_dirs = numbered_dirs(cpu_root, _CPU_DIR)
    online_file = cpu_root / "online"
    online = _read_cpulist(online_file) if online_file.exists() else CPUSet(cpu_dirs)
    if online.is_empty():
        raise SysfsError(f"{online_file}: no CPU is online")

    socket_of: dict[int, int] = {}
    core_of: dict[int, int] = {}
    l3_of: dict[int, int | None] = {}
    for cpu in online:
        cpu_dir = cpu_dirs.get(cpu)
        if cpu_dir is None:
            raise SysfsError(f"CPU {cpu} is online ({online_file}) but {cpu_root / f'cpu{cpu}'} does not exist")
        core_of[cpu] = _read_int(cpu_dir / "topology" / "core_id")
        socket_of[cpu] = _read_int(cpu_dir / "topology" / "physical_package_id")
        l3_of[cpu] = _l3_cache_id(cpu_dir)

    node_root = root / "sys" / "devices" / "system" / "node"
    node_dirs = numbered_dirs(node_root, _NODE_DIR) if node_root.is_dir() else {}
    members: dict[int, CPUSet] = {}
    if node_dirs:
        for node_id, node_dir in sorted(node_dirs.items()):
            members[node_id] = _read_cpulist(node_dir / "cpulist") & online
    else:
        for socket in sorted(set(socket_of.values())):
            members[socket] = CPUSet(c for c in online if socket_of[c] == socket)
    placed = CPUSet().union(*members.values())
    if placed != online:
        missing = online - placed
        raise SysfsError(f"online CPUs {missing} are in no NUMA node's cpulist under {node_root}")

    nodes: list[Node] = []
    for node_id, cpus in sorted(members.items()):
        groups: dict[tuple[int, int], list[int]] = {}
        for cpu in cpus:
            groups.setdefault((socket_of[cpu], core_of[cpu]), []).append(cpu)
        cores = []
        for (socket, core_id), threads in sorted(groups.items()):
            l3 = l3_of[threads[0]]
            cores.append(
                Core(id=core_id, socket_id=socket, threads=tuple(threads), uncore_caches=() if l3 is None else (l3,))
            )
        nodes.append(Node(id=node_id, cores=tuple(cores)))
    return MachineInfo(num_cores=online.size(), num_sockets=len(set(socket_of.values())), topology=tuple(nodes))


def discover_topology(root: Path = Path("/")) -> CPUTopology:
    """The kubelet's view of the CPUs of the machine whose sysfs is under ``root``."""
    return discover(read_machine_info(root))
