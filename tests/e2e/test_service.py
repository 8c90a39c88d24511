"""Running as a service: the systemd unit in deploy/ and the daemon's sd_notify."""

from __future__ import annotations

import configparser
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventsrc.errors import DamagedLogError, NewerLogError
from eventsrc.layout import DEFAULT_ROOT
from eventsrc.obs import systemd
from tests.conftest import REPO, run_cli

UNIT = REPO / "deploy" / "eventsrc.service"


def unit() -> configparser.ConfigParser:
    # systemd units are ini files; a key may repeat (strict=False), % is not interpolation.
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read(UNIT)
    return parser


def test_the_unit_runs_the_daemon_as_the_docs_say() -> None:
    service = unit()["Service"]
    assert service["Type"] == "notify"  # READY=1 comes from eventsrc.obs.systemd
    assert service["KillSignal"] == "SIGTERM"
    assert service["Restart"] == "always"
    assert service["RestartPreventExitStatus"] == f"{NewerLogError.exit_code} {DamagedLogError.exit_code}"
    assert service["ProtectSystem"] == "strict"
    assert str(DEFAULT_ROOT) in service["ReadWritePaths"].split()
    assert service["NoNewPrivileges"] == "yes" and service["PrivateTmp"] == "yes"
    assert unit()["Install"]["WantedBy"] == "multi-user.target"


def test_execstart_is_the_console_script_with_flags_serve_accepts() -> None:
    argv = shlex.split(unit()["Service"]["ExecStart"])
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert Path(argv[0]).name in scripts
    assert argv[1] == "serve"
    help_text = run_cli("serve", "--help", check=True).stdout
    flags = [a.split("=")[0] for a in argv[2:] if a.startswith("--")]
    assert flags, argv
    for flag in flags:
        assert f"{flag} " in help_text or f"{flag}\n" in help_text, f"'eventsrc serve' has no {flag}"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    # The console script of this checkout in place of /usr/local/bin/eventsrc, which
    # systemd-analyze checks for; everything else as shipped.
    exe = Path(sys.executable).parent / "eventsrc"
    text = UNIT.read_text().replace("/usr/local/bin/eventsrc", str(exe))
    (tmp_path / "eventsrc.service").write_text(text)
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "eventsrc.service")], capture_output=True, text=True, timeout=60
    )
    # It exits 0 on settings it ignores, so its complaints count too.
    assert proc.returncode == 0 and "eventsrc.service" not in proc.stderr, proc.stderr


@pytest.fixture
def notify_socket() -> Iterator[socket.socket]:
    """A datagram socket standing in for systemd's, at a short path."""
    d = tempfile.mkdtemp(prefix="es-n-", dir="/tmp")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(f"{d}/notify")
    sock.settimeout(30)
    yield sock
    sock.close()
    shutil.rmtree(d, ignore_errors=True)


def test_notify_sends_one_datagram(notify_socket: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", notify_socket.getsockname())
    assert systemd.notify("READY=1\nSTATUS=x")
    assert notify_socket.recv(4096) == b"READY=1\nSTATUS=x"


def test_notify_abstract_address_and_no_listener(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"eventsrc-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd.notify("READY=1")
        assert sock.recv(64) == b"READY=1"
    assert not systemd.notify("READY=1")  # nobody listens any more: a warning, never an error
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not systemd.notify("READY=1")


def test_the_daemon_says_ready_then_stopping(
    notify_socket: socket.socket,
    monkeypatch: pytest.MonkeyPatch,
    daemon_factory,  # type: ignore[no-untyped-def]
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", notify_socket.getsockname())
    daemon = daemon_factory()  # ready: 'eventsrc status' exits 0
    ready = dict(line.split("=", 1) for line in notify_socket.recv(4096).decode().splitlines())
    assert ready["READY"] == "1"
    assert ready["MAINPID"] == str(daemon.proc.pid)
    assert daemon.stop() == 0
    assert notify_socket.recv(4096) == b"STOPPING=1"
