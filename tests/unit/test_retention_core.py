"""Where the live log is cut (eventsrc.core.retention_policy) and how sizes are read (ByteSize)."""

from __future__ import annotations

import pytest

from eventsrc.core.retention_policy import (
    CutHealth,
    Retention,
    RetentionReport,
    after_attempt,
    age_cut,
    boundaries,
    plan_cut,
    retry_delay,
    size_cut,
    trouble,
)
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


def test_failing_cuts_are_said_when_they_start_change_reason_and_recover() -> None:
    h, said = after_attempt(CutHealth(), "", now_ns=5)
    assert (h, said) == (CutHealth(), "")
    h, said = after_attempt(h, "No space left on device: /a", now_ns=10)
    assert said == "failing" and (h.since_ns, h.in_a_row, h.failures) == (10, 1, 1)
    h, said = after_attempt(h, "No space left on device: /a", now_ns=20)
    assert said == "" and (h.since_ns, h.in_a_row, h.failures) == (10, 2, 2)
    # differing only in its numbers: the same trouble (a cut that takes one more piece)
    h, said = after_attempt(h, "cannot cut the log at 40: it starts at 1", now_ns=30)
    assert said == "reason changed" and h.reason == "cannot cut the log at 40: it starts at 1"
    h, said = after_attempt(h, "cannot cut the log at 60: it starts at 1", now_ns=40)
    assert said == "" and h.in_a_row == 4
    h, said = after_attempt(h, "", now_ns=50)
    assert said == "recovered" and h == CutHealth(failures=4) and not h.failing
    h, said = after_attempt(h, "Permission denied: /a", now_ns=60)
    assert said == "failing" and (h.since_ns, h.in_a_row, h.failures) == (60, 1, 5)


def test_the_pause_after_failed_cuts_doubles_up_to_a_minute() -> None:
    assert [retry_delay(n) for n in range(9)] == [0, 1, 2, 4, 8, 16, 32, 60, 60]
    assert retry_delay(10_000) == 60  # no overflow however long it fails
    assert retry_delay(3, first=0.5, cap=1.5) == 1.5


def test_what_status_and_healthz_say_of_retention() -> None:
    policy = Retention(max_size=1000)
    fine = RetentionReport(policy=policy, health=CutHealth(failures=3), live_bytes=900)
    assert trouble(fine, now_ns=10**9) == ""
    failing = RetentionReport(
        policy=policy,
        health=CutHealth(reason="File exists: /x/archive", since_ns=10**9, in_a_row=3, failures=3),
        retry_seconds=4.0,
        live_bytes=5000,
    )
    assert trouble(failing, now_ns=13 * 10**9) == (
        "log retention cuts failing for 12 s (3 attempt(s) in a row, the next 4 s after the last): "
        "File exists: /x/archive; appends go on and the live log holds 5000 bytes, bound 1000"
    )
    late = RetentionReport(
        policy=Retention(max_age_ns=1), health=CutHealth(), live_bytes=5, cut_seconds=31.2, late=True
    )
    assert trouble(late, now_ns=0) == (
        "a log retention cut has run for 31 s and lags behind the log; appends go on without it and "
        "the live log holds 5 bytes"
    )


def test_with_fleet_shipping_an_age_cut_waits_for_what_jetstream_acknowledged_and_a_size_cut_does_not() -> None:
    def plan(policy: Retention, shipped: int | None) -> int:
        # 35 records of 100 bytes, every boundary older than the cutoff
        old = {10: 1, 20: 2, 30: 3}
        return plan_cut(
            policy, base=0, last=35, piece=10, used_bytes=3500, boundary_ts=old, now_ns=100, shipped=shipped
        )

    aged = Retention(max_age_ns=10)
    assert plan(aged, None) == 30  # no shipping configured
    assert plan(aged, 25) == 20  # not past what was acknowledged
    assert plan(aged, 9) == 0  # not a whole piece acknowledged
    # over its size bound, the live log is cut all the same: the archive keeps what is not shipped
    assert plan(Retention(max_age_ns=10, max_size=1000), 0) == 30
    assert plan(Retention(max_size=3000), 0) == 10
