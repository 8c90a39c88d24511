"""Strings from plugins, manifests and the log reach a terminal escaped (``render.escape``):
a value never splits a line of human output, forges one, moves the cursor, colours the
terminal, reorders text (bidi controls) or is read as rich markup. JSON output stays exact."""

from __future__ import annotations

import json
import re
from pathlib import Path

from eventsrc import events as ev
from eventsrc.offline.render import escape
from tests.conftest import Daemon, run_cli
from tests.e2e.test_replay import BOOT, RES, write_log
from tests.support.grpcio_plugin import Dev, GrpcioPlugin

HEALTH = "Sick\n\x1b[31m"
#: pod names as a log written before names were checked may hold them
NAMES = ["esc\x1b[2Jx", "nul\x00x", "rlo\u202egpj.exe", "two\nlines", "[red]markup[/red]", "zw\u200bsp\u2028ls"]
#: nothing of this may reach a terminal raw
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def clean(text: str) -> str:
    """``text`` with no control, bidi or separator character (newlines between lines aside)."""
    found = RAW.findall(text)
    assert not found, f"raw {found!r} in:\n{text}"
    return text


def record_rows(stdout: str) -> list[str]:
    """The lines of ``eventsrc log`` (or ``replay --step``) after the header: each a record."""
    lines = [line for line in stdout.splitlines() if not line.lstrip().startswith("SEQ")]
    for line in lines:
        assert re.match(r"^\s*\d+  ", line), f"a line that is not a record: {line!r}"
    return lines


def test_escape_is_one_line_and_leaves_the_rest() -> None:
    assert escape("Sick\n\x1b[31m") == "Sick\\n\\x1b[31m"
    assert escape("a\u202eb\u2066c\x00\t\r") == "a\\u202eb\\u2066c\\x00\\t\\r"
    assert escape("\ud83d") == "\\ud83d"  # a lone surrogate: printable only escaped
    assert escape("plain ascii, ümlaut, 日本, [red]") == "plain ascii, ümlaut, 日本, [red]"


def test_a_plugin_health_string_cannot_forge_lines(daemon_factory: type[Daemon], tmp_path: Path) -> None:
    daemon = daemon_factory()
    plugin = GrpcioPlugin(daemon.root, RES, [Dev("gpu-0", health=HEALTH), Dev("gpu-1")]).start()
    try:
        ok, error = plugin.register()
        assert ok, error

        def listed() -> bool:
            out = run_cli("log", "-o", "json", root=daemon.root, check=True).stdout
            return any(json.loads(line)["type"] == "DevicesAdded" for line in out.splitlines())

        daemon.eventually(listed, "the plugin's devices in the log")
        root = daemon.root
        # JSON: exact.
        added = [
            json.loads(line)
            for line in run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()
            if json.loads(line)["type"] == "DevicesAdded"
        ]
        assert [d["health"] for d in added[0]["event"]["devices"]] == [HEALTH, "Healthy"]
        # The log's table: one line per record, the health escaped on its record's line.
        rows = record_rows(clean(run_cli("log", root=root, check=True).stdout))
        (row,) = [r for r in rows if "DevicesAdded" in r]
        assert "health=Sick\\n\\x1b[31m" in row
        # replay --step and the views: escaped too.
        step = record_rows(clean(run_cli("replay", str(root), "--step", check=True).stdout))
        assert len(step) == len(rows)
        state = clean(run_cli("state", root=root, check=True).stdout)
        assert "Sick\\n\\x1b[31m" in state
        audit = clean(run_cli("audit", "device", RES, "gpu-0", root=root, check=True).stdout)
        assert "Sick\\n\\x1b[31m" in audit
    finally:
        plugin.stop()


def hostile_pods() -> list[tuple[str, float, list[ev.EventBase]]]:
    batches = []
    for i, name in enumerate(NAMES):
        ref = ev.PodRef(uid=f"uid-{i}", namespace="default", name=name)
        batches.append(
            (f"adm-{i}", 10 + i, [ev.PodAdmissionStarted(pod=ref, containers=[ev.ContainerSpec(name="main")])])
        )
        batches.append((f"adm-{i}", 10 + i, [ev.PodAdmitted(pod=ref)]))
    return batches


def test_pod_names_reach_the_terminal_escaped(root: Path, daemon_factory: type[Daemon]) -> None:
    write_log(root, [*BOOT, *hostile_pods()])
    daemon_factory()
    # JSON: exact.
    pods = json.loads(run_cli("pods", "-o", "json", root=root, check=True).stdout)["pods"]
    assert sorted(p["name"] for p in pods) == sorted(NAMES)
    # The table: every name escaped, on one line, and "[red]" as itself (no rich markup).
    table = clean(run_cli("pods", root=root, check=True).stdout)
    for i, name in enumerate(NAMES):
        (line,) = [line for line in table.splitlines() if f"uid-{i} " in line]
        assert f"default/{escape(name)}" in line, line
    assert "[red]markup[/red]" in table
    for args in (["state"], ["log"], ["audit", "pod", "uid-1"]):
        out = clean(run_cli(*args, root=root, check=True).stdout)
        assert escape(NAMES[1]) in out
    rows = record_rows(clean(run_cli("log", root=root, check=True).stdout))
    assert len(rows) == len(json.loads(f"[{','.join(run_cli('export', root=root).stdout.splitlines())}]"))
    # An error that quotes what the user typed: one escaped line on stderr.
    proc = run_cli("remove", "gone\x1b[2J\u202e", root=root)
    assert proc.returncode != 0
    assert len(clean(proc.stderr).splitlines()) == 1 and "\\x1b[2J\\u202e" in proc.stderr
