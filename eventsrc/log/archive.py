"""Archive segments: the records a retention cut takes out of the live log (docs/adr/0018).

A segment is one file, ``segment-<first>-<last>.zst`` under ``ROOT/eventsrc/archive/``:
a Zstandard frame (with its content checksum) holding length-prefixed msgpack items:

1. a header: ``SegmentHeader`` (format, log id, first and last sequence);
2. one item per record: ``[seq, value]``, where ``value`` is the record exactly as the log
   stored it (CRC, envelope, the link to its predecessor): the hash chain goes on inside;
3. a trailer: ``SegmentTrailer`` (record count, the first record's link, the last record's
   chain hash, a BLAKE2b digest over every value).

A segment is sealed: written to a temporary file, synced, made read-only and renamed, and
the log's ledger (in the LMDB ``meta`` database) names it with its range, its two chain
anchors and the SHA-256 of the file, in the same transaction that moves the live log's
base. ``verify_segment`` checks one file on its own; ``verify_archive`` checks that the
segments and the live log's base join into one chain from record 1, and names a segment
that is missing, altered, or not in the ledger.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import struct
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import msgspec
import zstandard

from eventsrc.events import chain_hash, prev_hash_of
from eventsrc.inputs.bounded_file import FileRefused, open_regular

SEGMENT_FORMAT = 1
LEVEL = 3  # zstd's default level: ~4x smaller records at hundreds of MB/s
_LEN = struct.Struct(">I")
_NAME = re.compile(r"^segment-(\d{20})-(\d{20})\.zst$")
MAX_ITEM = 64 << 20  # no record or header is this large; a longer length is damage


class SegmentHeader(msgspec.Struct, frozen=True, kw_only=True):
    format: int
    log_id: str
    first_seq: int
    last_seq: int


class SegmentTrailer(msgspec.Struct, frozen=True, kw_only=True):
    records: int
    first_link: bytes  # what the first record carries about its predecessor ("" for record 1)
    last_hash: bytes  # chain_hash of the last record: what the next record links to
    digest: bytes  # BLAKE2b-256 over every value, in order


class LedgerEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One range of records that left the live log, as the log's ``meta`` remembers it."""

    first: int
    last: int
    records: int
    first_link: bytes
    last_hash: bytes
    file: str  # the segment's name under the archive directory; "" when not archived
    size: int = 0
    sha256: str = ""


_enc = msgspec.msgpack.Encoder()
_header = msgspec.msgpack.Decoder(SegmentHeader)
_trailer = msgspec.msgpack.Decoder(SegmentTrailer)
_item = msgspec.msgpack.Decoder(tuple[int, bytes])
_entry = msgspec.msgpack.Decoder(LedgerEntry)


def encode_entry(entry: LedgerEntry) -> bytes:
    return _enc.encode(entry)


def decode_entry(data: bytes) -> LedgerEntry:
    return _entry.decode(data)


def segment_name(first: int, last: int) -> str:
    return f"segment-{first:020d}-{last:020d}.zst"


def parse_name(name: str) -> tuple[int, int] | None:
    m = _NAME.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def segment_files(archive: Path) -> list[tuple[int, int, Path]]:
    """(first, last, path) of every segment file under ``archive``, oldest first."""
    if not archive.is_dir():
        return []
    out = []
    for p in archive.iterdir():
        r = parse_name(p.name)
        if r is not None:
            out.append((r[0], r[1], p))
    return sorted(out)


def _put(w: IO[bytes], data: bytes) -> None:
    w.write(_LEN.pack(len(data)))
    w.write(data)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_segment(archive: Path, log_id: str, first: int, last: int, items: Iterator[tuple[int, bytes]]) -> LedgerEntry:
    """Write records ``first..last`` (``items``: (seq, stored value), in order) as a sealed
    segment; returns its ledger entry. The file appears only whole (rename after fsync)."""
    archive.mkdir(mode=0o750, parents=True, exist_ok=True)
    final = archive / segment_name(first, last)
    fd, name = tempfile.mkstemp(dir=archive, prefix=f".{final.name}.", suffix=".tmp")
    tmp = Path(name)
    count, first_link, last_hash = 0, b"", b""
    digest = hashlib.blake2b(digest_size=32)
    try:
        with os.fdopen(fd, "wb") as raw:
            cctx = zstandard.ZstdCompressor(level=LEVEL, write_checksum=True)
            with cctx.stream_writer(raw, closefd=False) as w:
                _put(
                    w, _enc.encode(SegmentHeader(format=SEGMENT_FORMAT, log_id=log_id, first_seq=first, last_seq=last))
                )
                for seq, value in items:
                    if count == 0:
                        first_link = prev_hash_of(value)
                    _put(w, _enc.encode((seq, value)))
                    digest.update(value)
                    last_hash = chain_hash(value)
                    count += 1
                _put(
                    w,
                    _enc.encode(
                        SegmentTrailer(
                            records=count, first_link=first_link, last_hash=last_hash, digest=digest.digest()
                        )
                    ),
                )
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp, 0o440)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(archive)
    return LedgerEntry(
        first=first,
        last=last,
        records=count,
        first_link=first_link,
        last_hash=last_hash,
        file=final.name,
        size=final.stat().st_size,
        sha256=_sha256(final),
    )


def _fsync_dir(path: Path) -> None:
    dirfd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dirfd)
    finally:
        os.close(dirfd)


def remove_temporaries(archive: Path) -> None:
    """Delete what an interrupted segment write left (the writer calls this at start)."""
    if archive.is_dir():
        for stale in archive.glob(".segment-*.tmp"):
            stale.unlink(missing_ok=True)


class SegmentError(Exception):
    """A segment that cannot be read to its end: the message says why."""


def _read_exact(r: IO[bytes], n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = r.read(n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def _items(path: Path) -> Iterator[bytes]:
    """The raw msgpack items of a segment file, in order. A path that is not a regular file
    is refused without opening it: a FIFO would block its reader until a writer came."""
    try:
        opened = open_regular(path, None, follow_links=True)
    except FileRefused as exc:
        raise SegmentError(str(exc) if str(exc).startswith("not a regular file") else f"unreadable ({exc})") from None
    if opened is None:
        raise SegmentError(f"unreadable ({os.strerror(errno.ENOENT)})")
    try:
        with (
            os.fdopen(opened[0], "rb") as f,
            zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=False) as r,
        ):
            while True:
                head = _read_exact(r, 4)
                if not head:
                    return
                if len(head) < 4:
                    raise SegmentError("truncated (an item's length is cut short)")
                (n,) = _LEN.unpack(head)
                if n > MAX_ITEM:
                    raise SegmentError(f"damaged (an item claims {n} bytes)")
                body = _read_exact(r, n)
                if len(body) < n:
                    raise SegmentError("truncated (an item is cut short)")
                yield body
    except zstandard.ZstdError as exc:
        raise SegmentError(f"not a whole Zstandard frame ({exc})") from None
    except OSError as exc:
        raise SegmentError(f"unreadable ({exc.strerror or exc})") from None


def read_header(path: Path) -> SegmentHeader:
    for body in _items(path):
        try:
            return _header.decode(body)
        except msgspec.MsgspecError as exc:
            raise SegmentError(f"damaged header ({exc})") from None
    raise SegmentError("empty")


def iter_records(path: Path) -> Iterator[tuple[int, bytes]]:
    """(seq, stored value) of every record in the segment, in order. Raises SegmentError
    when the file cannot be read to its end (what came before it was yielded)."""
    items = _items(path)
    next(items, None)  # the header
    pending: bytes | None = None
    for body in items:
        if pending is not None:
            try:
                yield _item.decode(pending)
            except msgspec.MsgspecError as exc:
                raise SegmentError(f"damaged record item ({exc})") from None
        pending = body
    # the last item is the trailer


@dataclass
class SegmentReport:
    path: Path
    header: SegmentHeader | None = None
    trailer: SegmentTrailer | None = None
    records: int = 0
    first_link: bytes = b""
    last_hash: bytes = b""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_segment(path: Path) -> SegmentReport:
    """Check one segment on its own: a whole frame, its header, every record's CRC and link
    to the one before, its sequence without a gap, and the trailer's count, anchors and
    digest against what was read."""
    rep = SegmentReport(path)
    digest = hashlib.blake2b(digest_size=32)
    prev: bytes | None = None
    expected = 0
    bodies: list[bytes] = []
    try:
        for i, body in enumerate(_items(path)):
            if i == 0:
                try:
                    rep.header = _header.decode(body)
                except msgspec.MsgspecError as exc:
                    rep.problems.append(f"damaged header ({exc})")
                    return rep
                expected = rep.header.first_seq
                continue
            bodies.append(body)
            if len(bodies) < 2:
                continue
            item = bodies.pop(0)
            try:
                seq, value = _item.decode(item)
            except msgspec.MsgspecError as exc:
                rep.problems.append(f"damaged record item after record {expected - 1} ({exc})")
                return rep
            if seq != expected:
                rep.problems.append(f"record {expected} is missing (the next is {seq})")
            expected = seq + 1
            crc_bad = len(value) < 5 or zlib.crc32(value[4:]) != int.from_bytes(value[:4], "big")
            if crc_bad:
                rep.problems.append(f"record {seq} was altered (checksum mismatch)")
            link = prev_hash_of(value)
            if prev is None:
                rep.first_link = link
            elif link != chain_hash(prev) and not crc_bad:  # a damaged record's link is named by its checksum
                rep.problems.append(f"record {seq - 1} was altered (record {seq}'s link to it does not match)")
            prev = value
            digest.update(value)
            rep.records += 1
    except SegmentError as exc:
        rep.problems.append(str(exc))
        return rep
    if rep.header is None:
        rep.problems.append("empty")
        return rep
    if not bodies:
        rep.problems.append("no trailer (the file was cut short)")
        return rep
    try:
        rep.trailer = _trailer.decode(bodies[0])
    except msgspec.MsgspecError as exc:
        rep.problems.append(f"damaged trailer ({exc})")
        return rep
    rep.last_hash = chain_hash(prev) if prev is not None else b""
    h, t = rep.header, rep.trailer
    if expected - 1 != h.last_seq:
        rep.problems.append(f"ends at record {expected - 1}, not at {h.last_seq} as its header says")
    if t.records != rep.records or t.digest != digest.digest():
        rep.problems.append(f"holds {rep.records} records that do not match its trailer ({t.records} records, digest)")
    if t.first_link != rep.first_link or t.last_hash != rep.last_hash:
        rep.problems.append("its trailer's chain anchors do not match its records")
    return rep


@dataclass(frozen=True)
class ArchiveFinding:
    what: str  # "missing", "altered", "gap", "unknown"; "pending" is no damage (a cut not finished)
    message: str


def verify_archive(
    archive: Path, ledger: list[LedgerEntry], base_seq: int, base_hash: bytes, log_id: str
) -> tuple[int, list[ArchiveFinding]]:
    """(segments checked, findings): every ledger entry's segment is there, unaltered, and
    whole; the entries join into one chain from record 1 to the live log's base; and no
    segment lies in the directory that the ledger does not name."""
    findings: list[ArchiveFinding] = []
    checked = 0
    named = {e.file for e in ledger if e.file}
    expected, link = 1, b""
    for e in sorted(ledger, key=lambda e: e.first):
        if e.first != expected:
            findings.append(ArchiveFinding("gap", f"records {expected}..{e.first - 1} are in no ledger entry"))
        elif expected > 1 and e.first_link != link:
            findings.append(
                ArchiveFinding("altered", f"records {e.first}..{e.last} do not link to record {e.first - 1}")
            )
        expected, link = e.last + 1, e.last_hash
        if not e.file:
            continue  # cut without an archive (logRetention.archive: false)
        path = archive / e.file
        if not path.exists():
            findings.append(
                ArchiveFinding("missing", f"archive segment {e.file} (records {e.first}..{e.last}) is missing")
            )
            continue
        checked += 1
        rep = verify_segment(path)
        for p in rep.problems:
            findings.append(ArchiveFinding("altered", f"archive segment {e.file}: {p}"))
        if rep.ok:
            h = rep.header
            assert h is not None
            if (h.first_seq, h.last_seq, rep.first_link, rep.last_hash) != (e.first, e.last, e.first_link, e.last_hash):
                findings.append(ArchiveFinding("altered", f"archive segment {e.file} is not the one the log archived"))
            elif h.log_id != log_id:
                findings.append(ArchiveFinding("altered", f"archive segment {e.file} belongs to another log"))
            elif e.sha256 and _sha256(path) != e.sha256:
                findings.append(
                    ArchiveFinding("altered", f"archive segment {e.file} was rewritten since it was sealed")
                )
    if base_seq and expected != base_seq + 1:
        findings.append(ArchiveFinding("gap", f"records {expected}..{base_seq} are in no ledger entry"))
    elif base_seq and link != base_hash:
        findings.append(
            ArchiveFinding("altered", f"the last archived record does not match the live log's base {base_seq}")
        )
    for first, _last, path in segment_files(archive):
        if path.name in named:
            continue
        if first == base_seq + 1:  # sealed by a cut that has not moved the base (yet)
            findings.append(
                ArchiveFinding(
                    "pending",
                    f"archive segment {path.name} is not in the ledger yet: a cut in progress, or one a crash "
                    "interrupted (the daemon's next start removes it; its records are still live)",
                )
            )
        else:
            findings.append(ArchiveFinding("unknown", f"archive segment {path.name} is not in the log's ledger"))
    return checked, findings
