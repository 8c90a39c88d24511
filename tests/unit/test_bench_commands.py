"""``eventsrc bench``: the operator's benches are eventsrc's, the developers' are eventsrc-testbed's,
found through the ``eventsrc.benches`` entry points when one runs (docs/adr/0014)."""

from __future__ import annotations

import importlib.metadata
import re

import pytest

from eventsrc.cli.bench import BENCH_ENTRY_POINTS, DEVELOPER_BENCHES
from eventsrc.cli.main import main

OPERATOR_BENCHES = ("log", "devices", "cpu", "audit", "usage", "idle")


def test_bench_help_lists_every_bench(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["bench", "--help"])
    assert done.value.code == 0
    listed = re.findall(r"^ {4}(\w+) ", capsys.readouterr().out, re.MULTILINE)
    assert listed == [*OPERATOR_BENCHES, *DEVELOPER_BENCHES]


def test_every_developer_bench_is_an_entry_point_of_testbed() -> None:
    found = importlib.metadata.entry_points(group=BENCH_ENTRY_POINTS)
    assert sorted(found.names) == sorted(DEVELOPER_BENCHES)
    for entry in found:
        assert entry.dist is not None and entry.dist.name == "eventsrc-testbed"
        assert callable(entry.load())


def test_a_developer_bench_without_testbed_says_in_one_line_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # eventsrc-testbed not installed, as eventsrc sees it: no entry point in the group
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **_: importlib.metadata.EntryPoints(()))
    assert main(["bench", "nri", "--pods", "1"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "eventsrc: error: bench nri is a developers' bench: install eventsrc-testbed beside eventsrc "
        "(in a clone: make .venv/.installed, or pip install -e ./testbed)"
    ]


def test_only_a_developer_bench_takes_arguments_eventsrc_does_not_know(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["bench", "log", "--pods", "1"])
    assert done.value.code == 2
    assert "unrecognized arguments: --pods 1" in capsys.readouterr().err
