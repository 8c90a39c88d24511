"""The hash chain: audit verify names the first record altered, removed or reordered."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import lmdb
import pytest

from eventsrc import events as ev
from eventsrc.log.store import EventLog
from eventsrc.log.verify import verify
from tests.conftest import run_cli


def fresh(tmp_path: Path, n: int = 20) -> EventLog:
    log = EventLog(tmp_path / "log")
    for i in range(1, n + 1):  # one append per record: several transactions
        log.append([ev.PodRemoved(pod_uid=f"pod-{i}", reason="x")], f"c{i}", 1000 + i)
    return log


def edit(log: EventLog, fn) -> None:  # type: ignore[no-untyped-def]
    with log.env.begin(write=True, db=log.events_db) as txn:
        fn(txn)


def key(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def test_an_untouched_log_verifies(tmp_path: Path) -> None:
    checked, findings = verify(fresh(tmp_path))
    assert checked == 20 and findings == []


def test_a_flipped_byte(tmp_path: Path) -> None:
    log = fresh(tmp_path)

    def flip(txn: lmdb.Transaction) -> None:
        v = bytearray(txn.get(key(7)))
        v[-3] ^= 0x01
        txn.put(key(7), bytes(v))

    edit(log, flip)
    _, findings = verify(log)
    assert findings[0].seq == 7 and findings[0].what == "altered" and "checksum" in findings[0].message


def test_an_altered_record_with_its_checksum_recomputed(tmp_path: Path) -> None:
    log = fresh(tmp_path)

    def forge(txn: lmdb.Transaction) -> None:
        v = bytearray(txn.get(key(9)))
        payload = bytes(v[4:]).replace(b"pod-9", b"pod-X")
        txn.put(key(9), struct.pack(">I", zlib.crc32(payload)) + payload)

    edit(log, forge)
    _, findings = verify(log)
    assert [(f.seq, f.what) for f in findings] == [(9, "altered")]
    assert "link" in findings[0].message


def test_a_removed_record(tmp_path: Path) -> None:
    log = fresh(tmp_path)
    edit(log, lambda txn: txn.delete(key(12)))
    _, findings = verify(log)
    assert findings[0].seq == 12 and findings[0].what == "removed"


def test_a_key_damaged_into_a_huge_sequence_is_one_finding_not_a_loop(tmp_path: Path) -> None:
    log = fresh(tmp_path)

    def damage(txn) -> None:  # type: ignore[no-untyped-def]
        value = txn.get(key(20))
        txn.delete(key(20))
        txn.put(key(1 << 62), value)

    edit(log, damage)
    checked, findings = verify(log)
    assert checked == 20
    assert [(f.seq, f.what) for f in findings][:1] == [(20, "removed")]
    assert f"records 20 to {(1 << 62) - 1} were removed" in findings[0].message


def test_two_swapped_records(tmp_path: Path) -> None:
    log = fresh(tmp_path)

    def swap(txn: lmdb.Transaction) -> None:
        a, b = txn.get(key(5)), txn.get(key(6))
        txn.put(key(5), b)
        txn.put(key(6), a)

    edit(log, swap)
    _, findings = verify(log)
    assert [(f.seq, f.what) for f in findings] == [(5, "reordered")]
    assert findings[0].message == "records 5 and 6 were swapped"


@pytest.mark.parametrize("case", ["flip", "remove", "swap"])
def test_the_cli_names_it(root: Path, case: str) -> None:
    log = EventLog(root / "eventsrc" / "log")
    for i in range(1, 11):
        log.append([ev.PodRemoved(pod_uid=f"pod-{i}")], f"c{i}", 1000 + i)
    if case == "flip":

        def change(txn: lmdb.Transaction) -> None:
            v = bytearray(txn.get(key(4)))
            v[-2] ^= 0x10
            txn.put(key(4), bytes(v))
    elif case == "remove":

        def change(txn: lmdb.Transaction) -> None:
            txn.delete(key(4))
    else:

        def change(txn: lmdb.Transaction) -> None:
            a, b = txn.get(key(4)), txn.get(key(5))
            txn.put(key(4), b)
            txn.put(key(5), a)

    edit(log, change)
    log.close()
    proc = run_cli("audit", "verify", root=root)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "record 4" in proc.stdout + proc.stderr or "records 4 and 5" in proc.stdout + proc.stderr


def test_a_log_from_before_the_chain_is_upgraded_not_rejected(tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "old"
    shutil.copytree(Path(__file__).parent.parent / "fixtures" / "log-v1", copy)
    log = EventLog(copy)  # the writer upgrades it: index built, pre-chain records anchored
    log.append([ev.PodRemoved(pod_uid="after")], "c", 1)
    checked, findings = verify(log)
    assert checked == 9 and findings == []
    assert log.index_seqs(b"p\0uid-old-pod\0") == [6, 7]

    def forge(txn: lmdb.Transaction) -> None:  # a pre-chain record changed, CRC recomputed
        v = bytearray(txn.get(key(2)))
        payload = bytes(v[4:]).replace(b"gpu.sock", b"gpX.sock")
        txn.put(key(2), struct.pack(">I", zlib.crc32(payload)) + payload)

    edit(log, forge)
    _, findings = verify(log)
    assert [f.what for f in findings] == ["anchor"]


def test_the_chain_link_of_a_damaged_value_is_unreadable_not_an_error() -> None:
    """Found by tests/e2e/test_fuzz_damage.py: a flipped byte that leaves a string field of the
    envelope not UTF-8 made `audit verify` die with UnicodeDecodeError."""
    value = ev.encode_payload(ev.PodRemoved(pod_uid="p"), 1, "corr", b"")
    at = value.index(b"corr")
    damaged = value[:at] + b"\x86" + value[at + 1 :]
    assert ev.prev_hash_of(damaged) == b""
