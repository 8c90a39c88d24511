"""``eventsrc audit verify``: find the first record that was altered, removed or reordered.

Every record carries the hash of its predecessor's stored value (``chain_hash``). Records
written before the chain existed are covered by the anchor the log keeps in ``meta``: a
digest over their chain hashes, taken when the log was upgraded. What can be told apart:

* a changed byte with the checksum left alone: the record's CRC fails;
* a record changed and its CRC recomputed: the next record's link no longer matches;
* a record removed: a gap in the sequence numbers;
* two records swapped: both links break, and each points at the other's predecessor.

After a retention cut (docs/adr/0018) the live log starts after its base: the first live
record must link to the base's hash, and the archive's segments are checked on their own
(``eventsrc.log.archive.verify_archive``).
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass

from eventsrc.events import chain_hash, prev_hash_of
from eventsrc.log.store import EventLog, key_seq


@dataclass(frozen=True)
class Finding:
    seq: int
    what: str  # "altered", "removed", "reordered", "anchor"
    message: str


#: gaps up to this long name each record missing; a longer one is named once, as a range
MAX_NAMED_GAP = 1000


def verify(log: EventLog) -> tuple[int, list[Finding]]:
    """(records checked, findings in log order)."""
    base = log.base()
    anchor = log._meta(b"chain_anchor")
    anchor_seq = int.from_bytes(anchor[:8], "big") if anchor else 0
    if base is not None and anchor_seq <= base.seq:
        anchor, anchor_seq = None, 0  # the records it covers left the live log (the archive checks them)
    digest = hashlib.blake2b(digest_size=16)
    findings: list[Finding] = []
    window: dict[int, bytes] = {}  # the last three values, for telling swaps apart
    pending: int | None = None  # a broken link, decided when the next record is seen
    swapped_at: int | None = None  # records swapped-1 and swapped were found swapped
    expected = log.first_seq()
    checked = 0
    for chunk in log.raw_chunks(expected, strict=True):  # a cut meanwhile: LogCutWhileReadingError
        for k, v in chunk:
            seq = key_seq(k)
            value = bytes(v)
            checked += 1
            if seq != expected:
                if seq - expected <= MAX_NAMED_GAP:
                    for missing in range(expected, seq):
                        findings.append(
                            Finding(missing, "removed", f"record {missing} was removed (the sequence jumps to {seq})")
                        )
                else:  # a key damaged into a huge sequence: one finding, not one per number skipped
                    findings.append(
                        Finding(
                            expected,
                            "removed",
                            f"records {expected} to {seq - 1} were removed (the sequence jumps to {seq})",
                        )
                    )
                window.clear()
                pending = None
            expected = seq + 1
            crc_bad = len(value) < 5 or zlib.crc32(value[4:]) != int.from_bytes(value[:4], "big")
            if crc_bad:
                findings.append(Finding(seq, "altered", f"record {seq} was altered (checksum mismatch)"))
            if seq <= anchor_seq:
                digest.update(chain_hash(value))
            link = prev_hash_of(value)
            if base is not None and seq == base.seq + 1 and link != base.hash:
                findings.append(
                    Finding(seq, "anchor", f"record {seq} does not link to the live log's base (record {base.seq})")
                )
            broken = seq > anchor_seq and (seq - 1) in window and link != chain_hash(window[seq - 1])
            if broken and swapped_at == seq - 1 and (seq - 2) in window and link == chain_hash(window[seq - 2]):
                broken = False  # it follows the record that was moved before its neighbour
            if broken and (crc_bad or (seq - 1, "altered") in {(f.seq, f.what) for f in findings[-2:]}):
                broken = False  # already named: the damage is in this record or the one before
            swapped_at = None
            if (
                broken
                and pending == seq - 1
                and (seq - 2) in window
                and prev_hash_of(value) == chain_hash(window[seq - 2])
            ):
                findings.append(Finding(seq - 1, "reordered", f"records {seq - 1} and {seq} were swapped"))
                pending = None
                swapped_at = seq
            else:
                if pending is not None:
                    findings.append(_altered(pending))
                pending = seq if broken else None
            window[seq] = value
            window.pop(seq - 3, None)
    if pending is not None:
        findings.append(_altered(pending))
    if anchor and anchor_seq and digest.digest() != anchor[8:]:
        findings.append(
            Finding(
                anchor_seq, "anchor", f"a record written before the hash chain (1..{anchor_seq}) was altered or removed"
            )
        )
    findings.sort(key=lambda f: f.seq)
    return checked, findings


def _altered(broken_at: int) -> Finding:
    n = broken_at - 1
    return Finding(n, "altered", f"record {n} was altered (record {broken_at}'s link to it does not match)")
