"""Per-NUMA memory from sysfs, as cadvisor gathers it for the kubelet's ``machineInfo``.

Read under ``root`` (``/`` on a real machine, a fake tree in tests), for every
``sys/devices/system/node/nodeN``:

- ``meminfo``: the ``Node N MemTotal: X kB`` line gives the node's memory;
- ``hugepages/hugepages-<size>kB/nr_hugepages``: the pages of each size, so the node's
  ``hugepages-<size>`` total is pages x size (a size without pages counts 0 bytes, as
  cadvisor reports it).

Regular files only, each read whole under a small cap (``bounded_file``). Every error is
one line naming the file. The result goes through ``decode_memory_machine``.
"""

from __future__ import annotations

import re
from pathlib import Path

from eventsrc.core.memory.machine import MemoryMachine, decode_memory_machine
from eventsrc.inputs.bounded_file import FileRefused, read_regular
from eventsrc.inputs.sysfs_topology import SysfsError, numbered_dirs

_NODE_DIR = re.compile(r"node([0-9]+)")
_HUGEPAGES_DIR = re.compile(r"hugepages-([0-9]+)kB")
_CAP = 64 * 1024  # meminfo is a few kB


class SysfsMemoryError(SysfsError):
    """sysfs is missing, unreadable or says something that makes no sense (its memory)."""


def _read(path: Path) -> str:
    try:
        return read_regular(path, _CAP).decode("ascii", "replace")
    except FileRefused as why:
        raise SysfsMemoryError(f"cannot read {path}: {why}") from None


def _numbered_dirs(parent: Path, pattern: re.Pattern[str]) -> dict[int, Path]:
    try:
        return numbered_dirs(parent, pattern)
    except SysfsError as err:
        raise SysfsMemoryError(str(err)) from None


def _mem_total(path: Path, node: int) -> int:
    m = re.search(rf"^Node {node} MemTotal:\s+([0-9]+) kB$", _read(path), re.MULTILINE)
    if m is None:
        raise SysfsMemoryError(f"{path}: no 'Node {node} MemTotal: <n> kB' line")
    return int(m.group(1)) * 1024


def read_memory_machine(root: Path = Path("/")) -> MemoryMachine:
    """Every NUMA node's memory and hugepage totals, in bytes."""
    base = root / "sys" / "devices" / "system" / "node"
    nodes = _numbered_dirs(base, _NODE_DIR)
    if not nodes:
        raise SysfsMemoryError(f"{base}: no NUMA node directories")
    mapping: dict[str, dict[str, int]] = {}
    for node, path in sorted(nodes.items()):
        totals = {"memory": _mem_total(path / "meminfo", node)}
        hugepages = path / "hugepages"
        if hugepages.is_dir():
            for size_kb, d in sorted(_numbered_dirs(hugepages, _HUGEPAGES_DIR).items()):
                text = _read(d / "nr_hugepages").strip()
                if not text.isdigit():
                    raise SysfsMemoryError(f"{d / 'nr_hugepages'}: expected a number of pages, found {text!r}")
                totals[f"hugepages-{size_kb}Ki"] = int(text) * size_kb * 1024
        mapping[str(node)] = totals
    return decode_memory_machine(mapping, str(base))
