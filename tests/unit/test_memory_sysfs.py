"""eventsrc.inputs.sysfs_memory on fake sysfs trees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eventsrc.inputs.sysfs_memory import SysfsMemoryError, read_memory_machine

GI = 2**30


def node(root: Path, n: int, kb: int, pages: dict[int, int]) -> Path:
    d = root / "sys" / "devices" / "system" / "node" / f"node{n}"
    d.mkdir(parents=True)
    (d / "meminfo").write_text(f"Node {n} MemTotal:       {kb} kB\nNode {n} MemFree:        1 kB\n")
    for size, count in pages.items():
        h = d / "hugepages" / f"hugepages-{size}kB"
        h.mkdir(parents=True)
        (h / "nr_hugepages").write_text(f"{count}\n")
    return d


def test_reads_memory_and_hugepages(tmp_path: Path) -> None:
    node(tmp_path, 0, 16 * 1024 * 1024, {2048: 512, 1048576: 2})
    node(tmp_path, 1, 8 * 1024 * 1024, {2048: 0})
    (tmp_path / "sys" / "devices" / "system" / "node" / "possible").write_text("0-1\n")
    m = read_memory_machine(tmp_path)
    assert m.nodes == {
        0: {"memory": 16 * GI, "hugepages-2Mi": GI, "hugepages-1Gi": 2 * GI},
        1: {"memory": 8 * GI, "hugepages-2Mi": 0},
    }


def test_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(SysfsMemoryError, match="cannot list"):
        read_memory_machine(tmp_path)
    d = node(tmp_path, 0, 1024, {2048: 1})
    (d / "meminfo").write_text("Node 1 MemTotal: 1 kB\n")
    with pytest.raises(SysfsMemoryError, match=r"meminfo: no 'Node 0 MemTotal: <n> kB' line"):
        read_memory_machine(tmp_path)
    (d / "meminfo").unlink()
    os.mkfifo(d / "meminfo")
    with pytest.raises(SysfsMemoryError, match=r"cannot read .*meminfo: "):
        read_memory_machine(tmp_path)
    (d / "meminfo").unlink()
    (d / "meminfo").write_text("Node 0 MemTotal: 4096 kB\n")
    (d / "hugepages" / "hugepages-2048kB" / "nr_hugepages").write_text("x\n")
    with pytest.raises(SysfsMemoryError, match="expected a number of pages, found 'x'"):
        read_memory_machine(tmp_path)
