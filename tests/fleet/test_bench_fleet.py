"""``eventsrc bench fleet`` at a tiny size: its output has every part, and its numbers agree with
each other (every record reached PostgreSQL once, each is in one lag figure, the sink's holds are
the logs' own, the fleet's queries found what they asked for on the nodes loaded). No figure's
size is asserted."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.benches.fleet_timing import Options, run_fleet_bench

TINY = Options(
    nodes=2,
    records=30,
    paced_seconds=1,
    rate=10,
    repeats=1,
    ceiling_messages=20,
    catch_up=25,
    scale_nodes=2,
    days=1,
    runs=1,
    new_process=False,
)


def test_bench_fleet_at_a_tiny_size(
    nats_unavailable: str | None, postgres_unavailable: str | None, tmp_path: Path
) -> None:
    if why := nats_unavailable or postgres_unavailable:
        pytest.skip(why)
    out = io.StringIO()
    result = run_fleet_bench(TINY, workdir=tmp_path, out=out)
    text = out.getvalue()
    for part in (
        "ceiling, JetStream alone",
        "ceiling, PostgreSQL COPY",
        "\nflow:",
        "\nlag:",
        "\ncatch-up:",
        "\ncheck:",
        "\nqueries:",
    ):
        assert part in text
    assert "each once, no gap: yes" in text and "the logs' own intervals: yes" in text
    assert "summary" in text and "sink / COPY" in text and "node / this" in text

    f = result.flow
    assert f.once and f.holds_equal and f.holds > 0
    assert f.records >= 2 * TINY.records and f.paced_records > 0
    assert f.catch_up_records >= TINY.nodes * TINY.catch_up and f.catch_up_rate > 0
    assert f.stored == f.expected == f.records + f.paced_records + f.catch_up_records
    assert len(f.flow_lag) == f.records and len(f.paced_lag) == len(f.append_lag) == f.paced_records
    assert len(f.node_rates) == TINY.nodes and min(f.node_rates) > 0
    assert min(f.node_alone, f.js_one, f.js_window, f.copy_rate, f.insert_rate, f.sink_rate) > 0

    s = result.scale
    assert s.holds > 0 and s.pods > 0 and s.records > s.pods
    assert len(s.queries) == 9 and all(q.seconds > 0 for q in s.queries)
    assert all(q.rows > 0 for q in s.queries)  # fleet usage rows; fleet audit: an answer a node
    one, gpu, vf, pod = (q.rows for q in s.queries if q.label.startswith("fleet audit"))
    assert one == gpu == pod == 1  # a GPU's id is one node's
    assert 1 <= vf <= TINY.scale_nodes  # a VF's id: the nodes that held it
    assert s.records_nodes == TINY.scale_nodes and s.records_loaded == s.records and s.index_rows > s.records
    assert list(tmp_path.iterdir()) == []  # its directory is removed


def test_bench_fleet_without_its_servers_is_one_line_and_exit_1(tmp_path: Path) -> None:
    no_cache = tmp_path / "a-file"
    no_cache.write_text("")
    env = {**os.environ, "EVENTSRC_NATS_CACHE": str(no_cache / "nats")}  # a cache that cannot be made
    proc = subprocess.run(
        [sys.executable, "-m", "eventsrc", "bench", "fleet"], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"eventsrc: error: no servers to measure with: nats-server fetch failed: cannot create the cache "
        f"{no_cache / 'nats'}: Not a directory"
    ]
