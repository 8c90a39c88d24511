"""Where the live log is cut (docs/adr/0018). Pure: the shell measures, this decides.

The live log holds records ``base+1 .. last``; everything up to ``base`` is summed up by
the base views (and kept, unless the archive is off, in sealed archive segments). A cut
moves the base forward to a *piece boundary*: a sequence that is a multiple of ``piece``
(the snapshot interval), so segments cover whole pieces and every cut leaves a log whose
first record starts a piece.

* ``maxSize``: when the live records take more than ``max_size`` bytes, cut the fewest
  whole pieces that bring them under it (bytes per record taken as the live average).
  Between two checks the log grows by at most one piece, hence "under the bound plus one
  piece".
* ``maxAge``: cut every whole piece whose last record is older than ``now - max_age``.

The larger of the two cuts wins; 0 is "no cut".

With fleet shipping configured (``shipped``: every record up to it is acknowledged by
JetStream), the age cut stops at the last boundary at or before ``shipped``: a record the
fleet has not acknowledged stays live. The size cut does not wait: the live log keeps its
bound, the archive keeps what it takes, and the shipper reads it from there (ADR 0032).

A cut that fails (a full or unwritable archive) is tried again after a pause that doubles
with each failure in a row (``retry_delay``), and said once per change (``after_attempt``):
when cutting starts to fail, when its reason changes, and when it recovers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Literal

import msgspec

from eventsrc.core.backoff import delay

#: after a failed cut the next attempt waits this long, doubled for each failure in a row up
#: to the cap: a full archive costs one attempt a minute, and its repair is seen within one
RETRY_FIRST_SECONDS = 1.0
RETRY_MAX_SECONDS = 60.0


class Retention(msgspec.Struct, frozen=True, kw_only=True):
    """What the daemon keeps: 0 is "no limit" for either bound."""

    max_age_ns: int = 0
    max_size: int = 0
    archive: bool = True

    @property
    def enabled(self) -> bool:
        return self.max_age_ns > 0 or self.max_size > 0


def boundaries(base: int, last: int, piece: int) -> list[int]:
    """The piece boundaries a cut may stop at: multiples of ``piece`` in ``(base, last]``."""
    if piece < 1 or last <= base:
        return []
    first = (base // piece + 1) * piece
    return list(range(first, last + 1, piece))


def size_cut(base: int, last: int, piece: int, used_bytes: int, max_size: int) -> int:
    """The first boundary that leaves the live records under ``max_size`` bytes, or the last
    boundary when none does (the newest piece is never split); 0 when they fit already."""
    live = last - base
    if max_size <= 0 or live <= 0 or used_bytes <= max_size:
        return 0
    candidates = boundaries(base, last, piece)
    if not candidates:
        return 0
    # records to drop, at the live average size, rounded up
    drop = -((max_size - used_bytes) * live // used_bytes)
    for c in candidates:
        if c - base >= drop:
            return c
    return candidates[-1]


def age_cut(boundary_ts: Mapping[int, int], max_age_ns: int, now_ns: int) -> int:
    """The newest boundary whose record was written before ``now - max_age``; 0 when none.
    ``boundary_ts`` maps each boundary to its record's timestamp."""
    if max_age_ns <= 0:
        return 0
    cutoff = now_ns - max_age_ns
    old = [seq for seq, ts in boundary_ts.items() if ts < cutoff]
    return max(old, default=0)


def plan_cut(
    policy: Retention,
    *,
    base: int,
    last: int,
    piece: int,
    used_bytes: int,
    boundary_ts: Mapping[int, int],
    now_ns: int,
    max_records: int = 0,
    shipped: int | None = None,
) -> int:
    """The sequence the live log should be cut at (the new base), or 0 for no cut. With
    ``max_records``, one cut takes at most that many records (at least one piece): a long
    log is cut in several steps, each of bounded memory and time. ``shipped`` (None: no
    fleet shipping): what JetStream acknowledged, which an age cut does not pass."""
    aged = age_cut(boundary_ts, policy.max_age_ns, now_ns)
    if shipped is not None and piece >= 1:
        aged = min(aged, shipped // piece * piece)
    cut = max(size_cut(base, last, piece, used_bytes, policy.max_size), aged)
    if max_records and cut - base > max_records:
        fitting = [b for b in boundaries(base, cut, piece) if b - base <= max_records]
        cut = fitting[-1] if fitting else boundaries(base, cut, piece)[0]
    return cut if cut > base else 0


class CutHealth(msgspec.Struct, frozen=True, kw_only=True):
    """How the cuts fare. ``reason`` is why the latest attempt failed, "" while they succeed."""

    reason: str = ""
    since_ns: int = 0  # when cutting began to fail (the shell's clock); 0 while it does not
    in_a_row: int = 0  # failed attempts in a row
    failures: int = 0  # failed attempts since the start

    @property
    def failing(self) -> bool:
        return bool(self.reason)


#: what an attempt changed, for the shell to say once: "" is nothing new
Change = Literal["", "failing", "reason changed", "recovered"]


def _kind(reason: str) -> str:
    return re.sub(r"\d+", "#", reason)  # "cannot cut the log at 40" and "... at 60" are one trouble


def after_attempt(health: CutHealth, reason: str, now_ns: int) -> tuple[CutHealth, Change]:
    """The health after an attempt that failed with ``reason`` ("" when it succeeded), and what
    changed: a reason that differs from the previous one only in its numbers is the same."""
    if not reason:
        if not health.failing:
            return health, ""
        return CutHealth(failures=health.failures), "recovered"
    change: Change = (
        "failing" if not health.failing else "" if _kind(reason) == _kind(health.reason) else "reason changed"
    )
    after = CutHealth(
        reason=reason,
        since_ns=health.since_ns or now_ns,
        in_a_row=health.in_a_row + 1,
        failures=health.failures + 1,
    )
    return after, change


def retry_delay(in_a_row: int, first: float = RETRY_FIRST_SECONDS, cap: float = RETRY_MAX_SECONDS) -> float:
    """Seconds to wait before the next attempt after ``in_a_row`` failures (0 after none)."""
    return delay(in_a_row, first, cap)


class RetentionReport(msgspec.Struct, frozen=True, kw_only=True):
    """What ``eventsrc status`` says of retention: the shell's figures at the time of asking."""

    policy: Retention
    health: CutHealth
    retry_seconds: float = 0.0  # while failing, the pause before the next attempt
    live_bytes: int = 0  # what the live records took at the latest look
    cut_seconds: float = 0.0  # how long the attempt under way has run (0: none)
    late: bool = False  # appends stopped waiting for the attempt under way (it lagged too long)
    appends_waiting: int = 0  # appends waiting for a lagging cut


def trouble(report: RetentionReport, now_ns: int) -> str:
    """What needs an operator, in one line ("" for nothing): cuts that fail, or a cut so late
    that appends stopped waiting for it. Either way the live log grows past its bound."""
    live = f"the live log holds {report.live_bytes} bytes"
    if report.policy.max_size:
        live += f", bound {report.policy.max_size}"
    health = report.health
    if health.failing:
        for_s = max(0, now_ns - health.since_ns) // 1_000_000_000
        return (
            f"log retention cuts failing for {for_s} s ({health.in_a_row} attempt(s) in a row, the next "
            f"{report.retry_seconds:g} s after the last): {health.reason}; appends go on and {live}"
        )
    if report.late:
        return (
            f"a log retention cut has run for {report.cut_seconds:.0f} s and lags behind the log; "
            f"appends go on without it and {live}"
        )
    return ""
