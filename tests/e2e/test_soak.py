"""The soak (`eventsrc bench soak`) as a test: a busy node for EVENTSRC_SOAK_MINUTES (default
1) minutes, run once for the module. What it asserts is that the live log and the daemon's
RSS level off and that the hash chain holds at the end, never how fast anything was.

The live log can only level off where retention cuts it: where this build's serve has no
--log-retention-max-size, the soak runs without retention and that test is skipped saying so
(it runs as soon as serve has the flag)."""

from __future__ import annotations

import io
import os

import pytest

from testbed.benches.soak import RETENTION_FLAG, SoakOptions, SoakResult, plateau, run_soak, serve_has_retention
from tests.conftest import run_cli

MINUTES = float(os.environ.get("EVENTSRC_SOAK_MINUTES", "1"))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(MINUTES * 60) + 300)]


@pytest.fixture(scope="module")
def retention() -> bool:
    return serve_has_retention()


@pytest.fixture(scope="module")
def soak(retention: bool, tmp_path_factory: pytest.TempPathFactory) -> tuple[SoakResult, str]:
    """The soak's result and what it printed. Retention small enough to cut well within the
    warm-up of a one-minute run (about 50 KiB of log a second at this load)."""
    options = SoakOptions(
        minutes=MINUTES,
        devices=24,
        resident=16,
        rate=20,
        retention_max_size="512Ki" if retention else "0",
        snapshot_every=500,
    )
    out = io.StringIO()
    result = run_soak(options, out=out, workdir=tmp_path_factory.mktemp("soak"))
    return result, out.getvalue()


def test_the_node_was_busy(soak: tuple[SoakResult, str]) -> None:
    """Pods came and went (more admitted than can be resident), in every interval, and nothing
    was refused though a device was always free."""
    result, out = soak
    assert len(result.samples) >= 12, out
    assert all(s.admissions > 0 and s.lists > 0 and s.records > 0 for s in result.samples), out
    assert sum(s.admissions for s in result.samples) > 16, out
    assert result.refused == 0, out


def test_the_daemons_rss_levels_off(soak: tuple[SoakResult, str]) -> None:
    result, out = soak
    assert result.rss.holds, out


def test_the_chain_holds_and_the_daemon_stopped_cleanly(soak: tuple[SoakResult, str]) -> None:
    result, out = soak
    assert result.verify_status == 0, out
    assert any("the chain holds" in line for line in result.verify_output), out
    assert result.daemon_exit == 0, out


def test_the_live_log_levels_off_where_retention_cuts_it(soak: tuple[SoakResult, str], retention: bool) -> None:
    if not retention:
        pytest.skip(f"this build's 'eventsrc serve' has no {RETENTION_FLAG} yet: the log grows without retention")
    result, out = soak
    assert result.retention
    assert result.samples[-1].archive_bytes > 0, out  # retention did cut (the archive is on by default)
    assert result.disk.holds, out
    assert result.failures == [], out


def test_plateau_leaves_out_the_warm_up_and_allows_the_slack() -> None:
    # Growth during the first third is warm-up; after it, the later half's highest value
    # against the earlier half's, with the larger of the share and the floor as slack.
    assert plateau([1, 50, 100, 100, 100, 100], 0.10, 0).holds
    assert plateau([100, 100, 100, 100, 110, 100], 0.10, 0).holds
    assert not plateau([100, 100, 100, 100, 111, 100], 0.10, 0).holds
    assert plateau([100, 100, 100, 100, 130, 100], 0.10, 30).holds
    grows = plateau(list(range(100, 112)), 0.0, 2)
    assert (grows.holds, grows.early_max, grows.late_max, grows.allowed) == (False, 107, 111, 109)
    # A saw-tooth (a size cut back at each snapshot) is level when each half holds a tooth.
    assert plateau([10, 20, 30, 10, 20, 30, 10, 20, 30, 10, 20, 30], 0.0, 0).holds


def test_soak_options_are_checked_in_one_line() -> None:
    proc = run_cli("bench", "soak", "--minutes", "1", "--devices", "16", "--resident", "16")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "eventsrc: error: --devices (16) must be more than --resident (16): one device flaps"
    ]
    assert proc.stdout == ""
    proc = run_cli("bench", "soak", "--minutes", "1", "--interval", "30")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "eventsrc: error: --interval leaves fewer than 3 rows: the plateau cannot be judged"
    ]


def test_trend_is_the_slope_after_the_warm_up_per_minute() -> None:
    from testbed.benches.soak import Sample, trend

    def at(t: float, rss: int) -> Sample:
        return Sample(t, 0, 0, 0, rss, 0, 0.0, 0, 0, 0.0, 0, 0)

    # A steep warm-up, then 1,000 bytes a second.
    samples = [at(0, 0), at(10, 10**6), at(20, 10**6 + 10_000), at(30, 10**6 + 20_000), at(40, 10**6 + 30_000)]
    assert trend(samples, lambda s: s.rss) == pytest.approx(60_000)
