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
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec


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
) -> int:
    """The sequence the live log should be cut at (the new base), or 0 for no cut. With
    ``max_records``, one cut takes at most that many records (at least one piece): a long
    log is cut in several steps, each of bounded memory and time."""
    cut = max(
        size_cut(base, last, piece, used_bytes, policy.max_size),
        age_cut(boundary_ts, policy.max_age_ns, now_ns),
    )
    if max_records and cut - base > max_records:
        fitting = [b for b in boundaries(base, cut, piece) if b - base <= max_records]
        cut = fitting[-1] if fitting else boundaries(base, cut, piece)[0]
    return cut if cut > base else 0
