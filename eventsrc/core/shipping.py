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

from typing import Final, Literal

import msgspec

State = Literal["connecting", "connected", "disconnected", "diverged"]

CONNECTING: Final = "connecting"
CONNECTED: Final = "connected"
DISCONNECTED: Final = "disconnected"
DIVERGED: Final = "diverged"


class ShippingReport(msgspec.Struct, frozen=True, kw_only=True):
    """The shipper's figures at the time of asking (the shell reads them)."""

    state: State
    reason: str = ""  # why it is disconnected or diverged; "" while connected
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
    return ""
