"""What a fleet sink may take as a node's record (issue 34, ADR 0034): pure, no I/O.

A message on the stream is anybody's until checked. Two steps, both decisions over values:

``check_message``   one message alone: its headers parse and are in range (a sequence is a
                    positive bigint, as PostgreSQL stores it), the subject is the one its
                    headers name (``fleet_names.Node.subject``), the payload is a record as the
                    log stores it (``events.decode_record``: its CRC, its envelope) and the type
                    header is its type. It gives a ``Candidate`` or a ``Refusal`` (a reason).
``settle``          candidates against what is stored for the node's log: a record is the
                    node's when it links, by the hash chain (``prev_hash``, ADR 0009), to the
                    node's stored record before it. It gives what to store, what to refuse,
                    what waits (its predecessor is not stored yet) and which quarantined
                    payload the chain vouches for.

What the chain can and cannot tell:

* A record whose predecessor is stored is checked: its link is the stored record's hash, or
  it is refused ("does not link"). Two different records under one sequence: the first that
  links is the node's, a later one is refused as a conflict.
* A record whose predecessor is not stored yet waits (``Decision.wait``): it is not the node's
  record until the predecessor comes and it links to it.
* A log's first record (``follows`` 0, sequence 1) carries no link (b""). A record after a
  retention cut took records before they were shipped (``follows`` < seq - 1) links to a record
  that never reached the stream: its link cannot be checked, and it is stored unchecked
  (``Candidate.checked`` False), as is the first record of a log whose first records were cut
  before they were ever shipped. Its claim of a cut is checked: a stored record inside the gap
  it names refutes it (``stored`` must hold one, when there is one).
* A record written before the chain existed carries b"": it is taken when its predecessor carries
  b"" too (a log from before the chain), never after a record that is chained.
* A payload that is no record (its CRC fails) is refused; but a node's own log may hold a
  damaged record, which it ships as it is. When the node's next record links to exactly those
  bytes, the chain vouches for them: the quarantined payload is the node's (``Decision.vouched``)
  and is stored, named corrupt as the node's readers name it; but only in its place, after
  the node's stored record it names (its own link cannot be read): else it and its successor wait.
* A forger who may publish on the node's subject and who writes a record that links correctly
  cannot be told from the node by the chain: the first to arrive is stored. Per-node publish
  permissions on the NATS server are the defence (docs/fleet.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Final

from eventsrc.core.fleet_names import FOLLOWS, LOG, NODE, SEQ, TYPE, Node
from eventsrc.core.fleet_names import node_name_error as _node_name_error
from eventsrc.events import CorruptRecordError, FutureRecordError, Record, chain_hash, decode_record, prev_hash_of

#: the largest sequence (and time) a record may carry: PostgreSQL's bigint, as the log's keys
MAX_SEQ: Final = 2**63 - 1
#: a log id is what ``EventLog`` makes (32 hex digits) or, from another writer, a NATS token of
#: letters, digits, "-" and "_": at most this long
MAX_LOG_ID: Final = 64

#: the reasons' kinds: a metric's label, and the quarantine table's ``kind``
HEADERS: Final = "headers"
SUBJECT: Final = "subject"
PAYLOAD: Final = "payload"
TYPE_MISMATCH: Final = "type"
LINK: Final = "link"
CONFLICT: Final = "conflict"
DATABASE: Final = "database"
KINDS: Final = (HEADERS, SUBJECT, PAYLOAD, TYPE_MISMATCH, LINK, CONFLICT, DATABASE)


@dataclass(frozen=True)
class Candidate:
    """A message that is a record of ``node``'s log by its own account (not yet by the chain)."""

    node: Node
    seq: int
    follows: int
    data: bytes
    corrupt: bool = False  # the payload is no record (its CRC fails): it waits for a successor to vouch
    link: bytes = field(default=b"", compare=False)  # the hash of its predecessor it carries
    hash: bytes = field(default=b"", compare=False)  # what its successor must carry
    #: the record as ``check_message`` decoded it (None: not decoded here, or of a newer
    #: eventsrc), so that what is made of it later need not decode it again
    record: Record | None = field(default=None, compare=False, repr=False)

    @property
    def checked(self) -> bool:
        """Whether its link can be checked against a stored record: it follows the record before."""
        return self.follows == self.seq - 1 and self.follows > 0


@dataclass(frozen=True)
class Refusal:
    """Why a message is not a node's record. ``node``, ``log_id`` and ``seq`` as far as they
    could be read (text: a sequence out of range is kept as it came)."""

    kind: str
    reason: str
    node: str = ""
    log_id: str = ""
    seq: str = ""


@lru_cache(maxsize=4096)  # a fetch holds a few node logs' records, each checked alike
def _log_id_error(log_id: str) -> str:
    if not log_id or len(log_id) > MAX_LOG_ID or not all(c.isascii() and (c.isalnum() or c in "-_") for c in log_id):
        return f"log id {log_id[:80]!r} is not 1-{MAX_LOG_ID} letters, digits, '-' or '_'"
    return ""


def _number(text: str, what: str, low: int, high: int) -> int | str:
    """``text`` as a number in [low, high], or why not."""
    if not text.isascii() or not text.isdigit() or len(text) > len(str(high)):
        return f"{what} {text[:40]!r} is not a number of at most {len(str(high))} digits"
    value = int(text)
    if not low <= value <= high:
        return f"{what} {value} is out of range ({low}-{high})"
    return value


@lru_cache(maxsize=4096)
def node_name_error(name: str) -> str:
    """``fleet_names.node_name_error``, kept for the names a fetch repeats."""
    return _node_name_error(name)


def check_message(subject: str, headers: Mapping[str, str], data: bytes, prefix: str) -> Candidate | Refusal:
    """One message alone: a ``Candidate`` when it is a record of the node its subject and headers
    name, else a ``Refusal`` with the first reason found."""
    name, log_id, seq_text, follows_text = (headers.get(k, "") for k in (NODE, LOG, SEQ, FOLLOWS))
    if node_name_error(name):
        return Refusal(HEADERS, f"{NODE}: {node_name_error(name)}", log_id=log_id[:80], seq=seq_text[:40])
    if _log_id_error(log_id):
        return Refusal(HEADERS, f"{LOG}: {_log_id_error(log_id)}", name, seq=seq_text[:40])
    seq = _number(seq_text, SEQ, 1, MAX_SEQ)
    if isinstance(seq, str):
        return Refusal(HEADERS, seq, name, log_id, seq_text[:40])
    follows = _number(follows_text, FOLLOWS, 0, seq - 1)
    if isinstance(follows, str):
        return Refusal(HEADERS, follows, name, log_id, seq_text)
    node = Node(name, log_id)
    if subject != node.subject(prefix):
        return Refusal(
            SUBJECT,
            f"subject {subject[:300]!r} is not {node.subject(prefix)!r}, as its headers say",
            name,
            log_id,
            seq_text,
        )
    decoded: Record | None = None
    try:
        record = decode_record(seq, data)
    except FutureRecordError as exc:  # a newer eventsrc's record: intact, of a type it names
        kind, ts_ns = exc.type_name, exc.ts_ns
    except CorruptRecordError as exc:
        if headers.get(TYPE, ""):  # a node ships its damaged record with no type: it could not read one
            return Refusal(PAYLOAD, f"the payload is no record ({exc.reason})", name, log_id, seq_text)
        return candidate(node, seq, follows, data, corrupt=True)
    else:
        kind, ts_ns, decoded = record.type, record.ts_ns, record
    if headers.get(TYPE, "") != kind:
        return Refusal(
            TYPE_MISMATCH,
            f"{TYPE} {headers.get(TYPE, '')[:80]!r} is not the record's type {kind!r}",
            name,
            log_id,
            seq_text,
        )
    if not 0 <= ts_ns <= MAX_SEQ:
        return Refusal(PAYLOAD, f"the record's time {ts_ns} is out of range", name, log_id, seq_text)
    return candidate(node, seq, follows, data, record=decoded)


@dataclass(frozen=True)
class Stored:
    """What ``settle`` needs of one stored record: its hash, and the link it carries."""

    hash: bytes
    link: bytes


@dataclass
class Decision:
    """``settle``'s answer for one node log."""

    store: list[Candidate] = field(default_factory=list)  # in sequence order
    refuse: list[tuple[Candidate, Refusal]] = field(default_factory=list)
    wait: list[Candidate] = field(default_factory=list)
    vouched: list[Candidate] = field(default_factory=list)  # quarantined payloads now the node's (also in store)
    same: list[Candidate] = field(default_factory=list)  # already stored, byte for byte: nothing to do


def settle(
    candidates: Iterable[Candidate],
    stored: Mapping[int, Stored],
    quarantined: Iterable[Candidate] = (),
    *,
    empty: bool = False,
) -> Decision:
    """Decide ``candidates`` (one node log's, in the order they came: the first that links wins)
    against ``stored`` (sequence -> the stored record, at least those at the candidates' sequences
    and at the ones they follow, and for a candidate after a cut a stored one inside its gap when
    there is one) and ``quarantined`` (payloads refused earlier as no record, which
    a successor's link may vouch for). ``empty``: nothing of the log is stored yet (only then may a
    record that names no predecessor be its first shipped)."""
    known: dict[int, Stored] = dict(stored)
    out = Decision()
    damaged = [c for c in candidates if c.corrupt]
    pool: dict[int, list[Candidate]] = {}
    for q in (*quarantined, *damaged):
        pool.setdefault(q.seq, []).append(q)
    waiting = sorted((c for c in candidates if not c.corrupt), key=lambda c: c.seq)
    progress = True
    while progress:
        progress = False
        still: list[Candidate] = []
        for c in waiting:
            verdict = _verdict(c, known, pool, empty and not known)
            if verdict is None:
                still.append(c)
                continue
            progress = True
            if isinstance(verdict, Refusal):
                out.refuse.append((c, verdict))
                continue
            if verdict == SAME:
                out.same.append(c)
                continue
            if verdict == VOUCH:
                v = _vouched(c, pool)
                out.vouched.append(v)
                out.store.append(v)
                known[v.seq] = Stored(v.hash, v.link)
            out.store.append(c)
            known[c.seq] = Stored(c.hash, c.link)
        waiting = still
    out.store.sort(key=lambda c: c.seq)
    out.wait = waiting
    # a damaged payload no successor vouched for is refused: from the quarantine a later
    # successor can still vouch for it
    for c in damaged:
        if c not in out.vouched:
            out.refuse.append((c, Refusal(PAYLOAD, "the payload is no record (checksum mismatch)", *_where(c))))
    return out


STORE, VOUCH, SAME = "store", "vouch", "same"


def _where(c: Candidate) -> tuple[str, str, str]:
    return c.node.name, c.node.log_id, str(c.seq)


def _in_place(damaged: Candidate, known: Mapping[int, Stored], empty: bool) -> bool:
    """Whether a damaged payload (its own link unreadable) stands where the node's record would:
    after the node's stored record it names, or first in its log. Else a successor's vouching
    would let two forged messages jump a gap unchecked; it waits for the record before it."""
    if damaged.follows == 0:
        return damaged.seq == 1 or empty
    return damaged.follows in known and not any(damaged.follows < seq < damaged.seq for seq in known)


def _vouched(c: Candidate, pool: Mapping[int, list[Candidate]]) -> Candidate:
    """The damaged payload at the sequence ``c`` follows whose hash ``c`` carries."""
    return next(q for q in pool.get(c.follows, ()) if q.hash == c.link)


def _verdict(
    c: Candidate, known: Mapping[int, Stored], pool: Mapping[int, list[Candidate]], empty: bool
) -> Refusal | str | None:
    """STORE, VOUCH (store the damaged payload it vouches for first), SAME (stored already, byte
    for byte), a Refusal, or None (it waits for its predecessor)."""
    here = known.get(c.seq)
    if here is not None:
        if here.hash == c.hash:
            return SAME
        return Refusal(
            CONFLICT, f"another record is stored as the node's record {c.seq} (the first that linked)", *_where(c)
        )
    if c.follows == 0:  # the log's first record shipped: nothing before it on the stream
        if c.seq == 1 and c.link:
            return Refusal(LINK, "it is the log's first record but carries a link to a predecessor", *_where(c))
        if c.seq > 1 and not empty:
            return Refusal(LINK, "it names no predecessor, but records of the log are stored", *_where(c))
        return STORE
    before = known.get(c.follows)
    if before is None:
        damaged = next((q for q in pool.get(c.follows, ()) if q.hash == c.link), None)
        if c.checked and damaged is not None and _in_place(damaged, known, empty):
            return VOUCH
        return None
    if not c.checked:  # after records a cut took before they were shipped: its link cannot be checked
        inside = next((seq for seq in sorted(known) if c.follows < seq < c.seq), None)
        if inside is not None:  # but the cut can: the node shipped a record the cut would have taken
            return Refusal(
                LINK,
                f"it says records {c.follows + 1}-{c.seq - 1} were never shipped, but the node's record "
                f"{inside} is stored",
                *_where(c),
            )
        return STORE
    if c.link == before.hash or (not c.link and not before.link):  # chained, or both from before the chain
        return STORE
    return Refusal(
        LINK, f"it does not link to the node's stored record {c.follows} (its prev_hash differs)", *_where(c)
    )


def candidate(
    node: Node, seq: int, follows: int, data: bytes, corrupt: bool = False, record: Record | None = None
) -> Candidate:
    """A candidate as ``check_message`` makes it, for one that passed it before (kept waiting)."""
    return Candidate(node, seq, follows, data, corrupt, prev_hash_of(data), chain_hash(data), record)
