"""How fleet shipping fares, and what a resume decides (issue 28, ADR 0032). Pure: the shipper
(``eventsrc.node.shipper``) reads the stream, the log and the clock; this decides.

* ``resume_from``: the sequence acknowledged, from the stream's last message on the node's
  subject and, within one run of the daemon, the shipper's own count of what was
  acknowledged without a gap: the lower of the two, so that a publish that failed inside the
  window while a later one was stored is sent again (a duplicate the stream drops); at a run's
  first connection, a window before the stream's last.
* ``divergence``: whether the stream's last record is the log's record at that sequence,
  byte for byte; a log restored from a backup behind the stream lacks it or holds another.
* ``trouble``: what /healthz and ``eventsrc status`` say while shipping is disconnected or
  diverged (the node itself is fine: shipping is not its job).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

import msgspec

from eventsrc.core.fleet_names import SEQ
from eventsrc.events import CorruptRecordError, FutureRecordError, chain_hash, decode_record, prev_hash_of

State = Literal["connecting", "connected", "disconnected", "diverged"]

CONNECTING: Final = "connecting"
CONNECTED: Final = "connected"
DISCONNECTED: Final = "disconnected"
DIVERGED: Final = "diverged"


class ShippingReport(msgspec.Struct, frozen=True, kw_only=True):
    """The shipper's figures at the time of asking (the shell reads them)."""

    state: State
    #: why it is disconnected or diverged; while connected, the last message found on this log's
    #: subject that is not its record (another publisher: docs/fleet.md), or ""
    reason: str = ""
    shipped_seq: int = 0  # every record up to it is acknowledged by JetStream
    last_seq: int = 0  # the log's last record
    oldest_unshipped_ns: int = 0  # the time of record shipped_seq + 1 (0: none unshipped)

    @property
    def lag_records(self) -> int:
        return max(0, self.last_seq - self.shipped_seq)

    def lag_seconds(self, now_ns: int) -> float:
        """Seconds since the oldest record not yet acknowledged was written (0: none)."""
        if not self.lag_records or not self.oldest_unshipped_ns:
            return 0.0
        return max(0, now_ns - self.oldest_unshipped_ns) / 1e9


def resume_from(stream_last: int, acknowledged: int | None, window: int) -> int:
    """The last sequence to count as shipped on a (re)connection: the stream's, or the
    shipper's own contiguous count (``acknowledged``) when it is lower. The stream may hold
    records after a hole a failed publish left. Before the run's first connection
    (``acknowledged`` None) nothing says whether the run before ended inside a failed window of
    ``window`` publishes, so the window before the stream's last is sent again: the stream
    drops those it holds (its duplicate window) and stores the one a hole lacks."""
    if acknowledged is None:
        return max(0, stream_last - window)
    return min(stream_last, acknowledged)


#: how many messages on a log's subject a resume looks back through for the log's own record
WALK: Final = 64


@dataclass(frozen=True)
class Seen:
    """One message on this log's subject, as a resume sees it (newest first)."""

    seq: int | None  # the record its headers name; None: they name no record of this log
    data: bytes
    ours: bytes | None  # the log's record at ``seq`` (None: the log does not hold it)
    ours_before: bytes | None  # the log's record at ``seq - 1``


@dataclass(frozen=True)
class Resume:
    """What a resume found on the stream: ``diverged`` (a reason: nothing is shipped), else the
    last sequence of the log the stream holds (``stream_last``) and, when messages after it on
    the subject are not the log's (another publisher), what they are (``forged``)."""

    stream_last: int = 0
    diverged: str = ""
    forged: str = ""


def judge(walk: list[Seen], log_last: int, complete: bool) -> Resume:
    """Decide a resume from the messages on the log's subject, newest first, up to and with the
    first that is the log's own record (or all of them: ``complete``, the subject's first reached;
    else ``WALK`` of them). A message is the log's own when it is byte for byte the log's record
    at its sequence (or the log cut that record and cannot compare). Messages after the log's
    own are a fork when one of them is a record that links to the log's own record before it and
    differs from the log's (a log restored behind the stream; or a forger who read the stream and
    wrote a linked record: the chain cannot tell): ``diverged``. Else they are not the log's at
    all (no record, or no link to it): ``forged``, and shipping goes on from the log's own."""
    newest = walk[0] if walk else None
    for i, m in enumerate(walk):
        if m.seq is not None and (m.data == m.ours or (m.ours is None and m.seq <= log_last)):
            after = walk[:i]
            return _after_own(after, m.seq, log_last, newest)
    return _after_own(walk, 0, log_last, newest, found=complete)


def _after_own(after: list[Seen], own: int, log_last: int, newest: Seen | None, found: bool = True) -> Resume:
    for m in after:
        if m.seq is not None and _links_to_ours(m) and newest is not None and newest.seq is not None:
            return Resume(diverged=divergence(newest.seq, log_last, newest.data, newest.ours))
    if not after:
        return Resume(own)
    what = _why_not_ours(after[0])
    if not found:
        what += f"; none of the last {len(after)} messages on the subject is the log's own, so all is sent again"
    return Resume(own, forged=what)


def _links_to_ours(m: Seen) -> bool:
    """``m`` is an intact record, other than the log's own, that links to the log's record before it."""
    if m.ours_before is None or m.data == m.ours or m.seq is None:
        return False
    try:
        decode_record(m.seq, m.data)
    except FutureRecordError:
        pass
    except CorruptRecordError:
        return False
    return prev_hash_of(m.data) == chain_hash(m.ours_before)


def _why_not_ours(m: Seen) -> str:
    if m.seq is None:
        return "the stream's last message on this log's subject has headers of no record of this log"
    try:
        decode_record(m.seq, m.data)
    except FutureRecordError:
        pass
    except CorruptRecordError as exc:
        return f"the stream's last message on this log's subject, record {m.seq}, is no record ({exc.reason})"
    return f"the stream's record {m.seq} of this log is not the log's and does not link to the log's record {m.seq - 1}"


def record_time(headers: Mapping[str, str], data: bytes) -> int:
    """The time of the record a message carries (0: it is no record, or its headers name none)."""
    seq = headers.get(SEQ, "")
    if not seq.isascii() or not seq.isdigit() or len(seq) > 19:
        return 0
    try:
        return decode_record(int(seq), data).ts_ns
    except FutureRecordError as exc:
        return exc.ts_ns
    except CorruptRecordError:
        return 0


def namesakes(name: str, first_ns: int, others: list[tuple[str, int]]) -> str:
    """What to say of ``others`` ((log id, the time of its last record on the stream)), the other
    logs shipped under this node's ``name``, given the time of this log's first record: a log that
    wrote after this one began is another node given the same name ("" when none did: a log
    lost and started again stops before its successor begins)."""
    if not first_ns:
        return ""
    alive = sorted(log_id for log_id, last_ns in others if last_ns > first_ns)
    if not alive:
        return ""
    logs = ", ".join(alive[:3]) + (f" and {len(alive) - 3} more" if len(alive) > 3 else "")
    return (
        f"another log ships under node name {name!r} and wrote after this log began ({logs}): two nodes "
        "given one name? The fleet keeps the logs apart, but sums them under one node"
    )


def divergence(seq: int, log_last: int, in_stream: bytes, in_log: bytes | None) -> str:
    """Why the stream's last record ``seq`` of this log (``in_stream``, its payload) is not
    the log's (``in_log``: its stored value; None when the log cut it without an archive,
    and it cannot be compared), or "" when it is."""
    if seq > log_last:
        # the same words however the log grows meanwhile: said once
        return f"the stream holds record {seq} of this log, past the log's end (a log restored from a backup?)"
    if in_log is not None and in_log != in_stream:
        return f"the stream's record {seq} of this log differs from the log's (a log restored from a backup?)"
    return ""


def trouble(state: str, reason: str, lag_records: int) -> str:
    """One line for /healthz's warning and ``eventsrc status`` ("" while connected)."""
    if state == DISCONNECTED:
        return f"fleet shipping is disconnected ({reason}); {lag_records} records not shipped yet"
    if state == DIVERGED:
        return f"fleet shipping stopped: the stream and the log diverged ({reason})"
    if reason:  # connected, with something to say: another publisher's messages, another log of this name
        return f"fleet shipping: {reason}"
    return ""
