"""Structured logs: key=value text or JSON lines, the same keys, the request's cid."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventsrc.obs import logger as logs
from tests.conftest import run_cli

# ts=... level=... logger=... msg="..." then key=value pairs, values bare or JSON-quoted.
VALUE = r'(?:"(?:[^"\\]|\\.)*"|[^\s"=]+|)'
TEXT_LINE = re.compile(
    r"^ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=[a-z]+ logger=\S+"
    rf' msg="(?:[^"\\]|\\.)*"(?: [a-z_]+={VALUE})*$'
)


@pytest.fixture
def captured() -> Iterator[tuple[io.StringIO, logs.Logger]]:
    out = io.StringIO()
    root = logging.getLogger()
    level = root.level
    logs.setup("debug", "text", out)
    yield out, logs.get_logger("eventsrc.test")
    for h in [h for h in root.handlers if isinstance(h, logs._Handler)]:
        root.removeHandler(h)
    root.setLevel(level)


def test_text_is_key_value_quoted_when_needed(captured: tuple[io.StringIO, logs.Logger]) -> None:
    out, log = captured
    log.info("pod refused", pod="default/web", reason='no "gpu" left', count=3, ok=True, ids=["a", "b"], empty="")
    line = out.getvalue().rstrip("\n")
    assert TEXT_LINE.match(line), line
    assert (
        ' level=info logger=eventsrc.test msg="pod refused" pod=default/web'
        ' reason="no \\"gpu\\" left" count=3 ok=true ids=a,b empty=""' in line
    )
    assert "cid=" not in line


def test_text_values_with_bidi_or_line_separators_are_escaped(captured: tuple[io.StringIO, logs.Logger]) -> None:
    out, log = captured
    log.info("pod admitted", pod="a\u202eb\u2028c\nd")
    (line,) = out.getvalue().splitlines()
    assert "\u202e" not in line and "\u2028" not in line
    assert 'pod="a\\u202eb\\u2028c\\nd"' in line, line


def test_the_cid_of_the_request_comes_last(captured: tuple[io.StringIO, logs.Logger]) -> None:
    out, log = captured
    with logs.correlation("00000000000000ab"):
        log.warning("pod admitted", uid="u1")
        with logs.correlation("00000000000000cd"):
            log.info("inner")
        logging.getLogger("other.library").error("plain %s call", "logging")
    log.info("after")
    lines = out.getvalue().splitlines()
    assert lines[0].endswith('msg="pod admitted" uid=u1 cid=00000000000000ab')
    assert lines[1].endswith('msg="inner" cid=00000000000000cd')
    assert lines[2].endswith('level=error logger=other.library msg="plain logging call" cid=00000000000000ab')
    assert lines[3].endswith('msg="after"')
    assert all(TEXT_LINE.match(line) for line in lines), lines


def test_json_has_the_same_keys(captured: tuple[io.StringIO, logs.Logger]) -> None:
    out, log = captured
    with logs.correlation("00000000000000ab"):
        log.info("claim prepared", claim="ns/c", driver="gpu.example.com", devices=["d0"], seconds=0.25, old={"k": 1})
    text = out.getvalue().rstrip("\n")
    out.seek(0)
    out.truncate()
    logs.setup("debug", "json", out)
    with logs.correlation("00000000000000ab"):
        log.info("claim prepared", claim="ns/c", driver="gpu.example.com", devices=["d0"], seconds=0.25, old={"k": 1})
    obj = json.loads(out.getvalue())
    assert list(obj) == ["ts", "level", "logger", "msg", "claim", "driver", "devices", "seconds", "old", "cid"]
    assert [kv.split("=", 1)[0] for kv in re.findall(rf"[a-z_]+={VALUE}", text)] == list(obj)
    assert (
        obj["devices"] == ["d0"]
        and obj["seconds"] == 0.25
        and obj["old"] == {"k": 1}
        and obj["cid"] == "00000000000000ab"
    )


def test_a_traceback_only_with_exception(captured: tuple[io.StringIO, logs.Logger]) -> None:
    out, log = captured
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("unexpected", where="here")
    text = out.getvalue()
    assert (
        text.splitlines()[0].endswith('msg="unexpected" where=here')
        and "Traceback" in text
        and "RuntimeError: boom" in text
    )


def test_reserved_keys_are_not_overwritten(captured: tuple[io.StringIO, logs.Logger]) -> None:
    out, log = captured
    log.info("m", level="x", msg="y")
    assert out.getvalue().rstrip("\n").endswith('level=info logger=eventsrc.test msg="m" level_=x msg_=y')


# ---------------------------------------------------------------------------- the daemon's lines


def pod_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, uid: uid-{name}}}\n"
        "spec:\n  containers: [{name: c, image: x}]\n"
    )
    return path


def test_json_lines_carry_the_cid_of_an_admission(root: Path, tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("logFormat: json\n")
    d = daemon_factory("--config", str(cfg))
    admitted = json.loads(
        run_cli("admit", "-f", str(pod_file(tmp_path, "web")), "-o", "json", root=root, check=True).stdout
    )
    removed = json.loads(run_cli("remove", "uid-web", "-o", "json", root=root, check=True).stdout)
    refused = run_cli("remove", "uid-nope", root=root)
    assert refused.returncode != 0
    assert d.stop() == 0
    lines = [json.loads(line) for line in d.output().splitlines()]  # every line is one JSON object
    assert all(list(obj)[:4] == ["ts", "level", "logger", "msg"] for obj in lines)
    by_msg = {obj["msg"]: obj for obj in lines}
    for msg in ("daemon started", "ready", "stopping", "stopped"):
        assert by_msg[msg]["logger"] == "eventsrc.node.daemon"
    assert by_msg["pod admitted"]["cid"] == admitted["correlation_id"] and by_msg["pod admitted"]["uid"] == "uid-web"
    assert by_msg["pod removed"]["cid"] == removed["correlation_id"] != admitted["correlation_id"]
    assert "cid" not in by_msg["ready"]
    # The log line and the records of the request share the id.
    records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()]
    assert "PodAdmitted" in [r["type"] for r in records if r["correlation_id"] == admitted["correlation_id"]]


def test_every_record_of_a_request_carries_its_correlation_id(root: Path, tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    """Intent and outcome of a device admission, a refusal, a removal: each request's
    records all carry the id it answered with, and no record of another request does."""
    from tests.e2e.test_devices_e2e import RESOURCE, Plugin

    daemon_factory()
    plugin = Plugin(root, "--devices", "2", "--numa-nodes", "1")
    try:
        plugin.wait_registered()

        def pod(name: str, devices: int) -> Path:
            path = tmp_path / f"{name}.yaml"
            path.write_text(
                f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, uid: uid-{name}}}\nspec:\n"
                f"  containers:\n  - name: c\n    image: x\n    resources: {{limits: {{{RESOURCE}: {devices}}}}}\n"
            )
            return path

        admitted = json.loads(run_cli("admit", "-f", str(pod("dev", 1)), "-o", "json", root=root, check=True).stdout)
        assert run_cli("admit", "-f", str(pod("big", 5)), root=root).returncode == 1
        removed = json.loads(run_cli("remove", "uid-dev", "-o", "json", root=root, check=True).stdout)
    finally:
        plugin.proc.kill()
        plugin.proc.wait()
    records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()]
    by_cid: dict[str, list[str]] = {}
    for r in records:
        by_cid.setdefault(r["correlation_id"], []).append(r["type"])
    assert by_cid[admitted["correlation_id"]] == [
        "PodAdmissionStarted",
        "DevicesReserved",
        "DevicesAllocated",
        "PodAdmitted",
    ]
    assert "DevicesReleased" in by_cid[removed["correlation_id"]] and "PodRemoved" in by_cid[removed["correlation_id"]]
    refused = [cid for cid, types in by_cid.items() if "AdmissionRejected" in types]
    assert len(refused) == 1 and refused[0] not in (admitted["correlation_id"], removed["correlation_id"])


def test_text_lines_are_key_value(root: Path, tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    d = daemon_factory()
    admitted = json.loads(
        run_cli("admit", "-f", str(pod_file(tmp_path, "api")), "-o", "json", root=root, check=True).stdout
    )
    assert d.stop() == 0
    lines = d.output().splitlines()
    assert lines and all(TEXT_LINE.match(line) for line in lines), d.output()
    (line,) = [line for line in lines if 'msg="pod admitted"' in line]
    assert line.endswith(f"pod=default/api uid=uid-api cid={admitted['correlation_id']}")
    # The flag overrides a file's (or the default) format.
    d = daemon_factory("--log-format", "json")
    assert d.stop() == 0
    assert [json.loads(line)["msg"] for line in d.output().splitlines()][-1] == "stopped"
