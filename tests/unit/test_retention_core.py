"""Where the live log is cut (eventsrc.core.retention) and how sizes are read (ByteSize)."""

from __future__ import annotations

import pytest

from eventsrc.core.retention import Retention, age_cut, boundaries, plan_cut, size_cut
from eventsrc.inputs.config import ByteSize


def test_boundaries_are_the_multiples_of_the_piece_after_the_base() -> None:
    assert boundaries(0, 35, 10) == [10, 20, 30]
    assert boundaries(7, 35, 10) == [10, 20, 30]  # a base off the grid (the piece changed)
    assert boundaries(30, 35, 10) == []
    assert boundaries(0, 0, 10) == []


def test_a_size_cut_takes_the_fewest_whole_pieces_that_bring_the_log_under_the_bound() -> None:
    # 100 live records of 100 bytes: 10,000 bytes, bound 7,500: 25 records must go -> 30
    assert size_cut(0, 100, 10, 10_000, 7_500) == 30
    assert size_cut(0, 100, 10, 10_000, 10_000) == 0  # fits
    assert size_cut(0, 100, 10, 10_000, 1) == 100  # the newest piece too, never a split one
    assert size_cut(0, 105, 10, 10_500, 1) == 100
    assert size_cut(0, 100, 10, 10_000, 0) == 0  # no bound


def test_an_age_cut_takes_every_piece_older_than_the_cutoff() -> None:
    ts = {10: 100, 20: 200, 30: 300}
    assert age_cut(ts, max_age_ns=150, now_ns=400) == 20  # cutoff 250
    assert age_cut(ts, max_age_ns=1_000, now_ns=400) == 0
    assert age_cut(ts, max_age_ns=0, now_ns=400) == 0


def test_the_larger_cut_wins_and_one_cut_is_bounded() -> None:
    policy = Retention(max_size=7_500, max_age_ns=150)
    kw = {"base": 0, "last": 100, "piece": 10, "used_bytes": 10_000, "now_ns": 400}
    assert plan_cut(policy, boundary_ts={10: 100, 20: 200}, **kw) == 30
    assert plan_cut(policy, boundary_ts={b: 0 for b in range(10, 101, 10)}, **kw) == 100
    assert plan_cut(policy, boundary_ts={b: 0 for b in range(10, 101, 10)}, max_records=25, **kw) == 20
    assert plan_cut(policy, boundary_ts={}, max_records=5, **kw) == 10  # at least one piece
    assert plan_cut(Retention(), boundary_ts={}, **kw) == 0


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("0", 0),
        ("4096", 4096),
        ("512Mi", 512 << 20),
        ("1G", 10**9),
        ("10MB", 10**7),
        ("1.5Ki", 1536),
        ("2GiB", 2 << 30),
    ],
)
def test_sizes_with_the_usual_suffixes(text: str, n: int) -> None:
    assert ByteSize.parse(text).n == n


@pytest.mark.parametrize("text", ["foo", "-1", "1x", "", "9" * 400, "99999999999999999999999", "1 Mi B"])
def test_a_bad_or_huge_size_is_one_value_error(text: str) -> None:
    with pytest.raises(ValueError) as err:
        ByteSize.parse(text)
    assert len(str(err.value)) < 120
