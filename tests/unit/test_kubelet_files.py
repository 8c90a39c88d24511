"""The kubelet's files are read safely (issue 34 item 4): opened without blocking, a regular file
only and no symbolic link, a size cap, every CPU range bounded before it is expanded, and a file
that did not change not read again. In-process, on real files of each kind."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from eventsrc.core.cpu.cpuset import MAX_CPUS, CPUSet, CPUSetParseError
from eventsrc.inputs import kubelet_checkpoints as ki
from eventsrc.node.beside import _read_checkpoints
from testbed.servers.kubelet_checkpoints import cpu_state


def refusal(path: Path) -> str:
    with pytest.raises(ki.CheckpointError) as exc:
        ki.read_cpu_state(path)
    return str(exc.value)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "cpu_manager_state"
    os.mkfifo(fifo)
    assert "not a regular file (a FIFO)" in refusal(fifo)


def test_a_link_to_a_device_a_directory_and_a_socket_are_refused(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to("/dev/zero")
    assert "is a symbolic link" in refusal(link)
    assert "not a regular file (a directory)" in refusal(tmp_path)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
        assert "No such device or address" in refusal(tmp_path / "sock")  # open(2) refuses a socket
    assert "No such file" in refusal(tmp_path / "none")


def test_a_sparse_file_of_two_gigabytes_is_refused_unread(tmp_path: Path) -> None:
    sparse = tmp_path / "kubelet_internal_checkpoint"
    with open(sparse, "wb") as f:
        f.truncate(2 << 30)  # no disk: a hole
    with pytest.raises(ki.CheckpointError, match="over the 4194304-byte cap"):
        ki.read_device_checkpoint(sparse)


def test_a_cpu_range_beyond_any_machine_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    with pytest.raises(CPUSetParseError, match="beyond any machine"):
        CPUSet.parse("0-999999999")
    with pytest.raises(CPUSetParseError, match="beyond any machine"):
        CPUSet.parse(f"0,{MAX_CPUS}")
    assert CPUSet.parse(f"0-{MAX_CPUS - 1}").size() == MAX_CPUS
    state = tmp_path / "cpu_manager_state"
    state.write_bytes(cpu_state("static", "0-999999999", {}))  # its checksum holds
    assert "beyond any machine" in refusal(state)


def test_a_file_that_did_not_change_is_not_read_again(tmp_path: Path) -> None:
    state = tmp_path / "cpu_manager_state"
    state.write_bytes(cpu_state("static", "0-3", {}))
    fifo = tmp_path / "kubelet_internal_checkpoint"
    os.mkfifo(fifo)
    paths = {ki.CPU_STATE: state, ki.DEVICE_CHECKPOINT: fifo, ki.DRA_STATE: tmp_path / "none"}
    first = _read_checkpoints(paths, {})
    assert isinstance(first[ki.CPU_STATE].result, ki.CPUCheckpoint)
    assert isinstance(first[ki.DEVICE_CHECKPOINT].result, ki.CheckpointError)
    assert first[ki.DRA_STATE].result is None
    again = _read_checkpoints(paths, first)
    assert again[ki.CPU_STATE] is first[ki.CPU_STATE]  # the same answer, not parsed again
    state.write_bytes(cpu_state("static", "0-2", {}))  # the kubelet writes it again
    changed = _read_checkpoints(paths, again)
    assert changed[ki.CPU_STATE] is not first[ki.CPU_STATE]
    assert changed[ki.CPU_STATE].result.default_cpu_set == "0-2"
