from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from eventsrc.layout import Layout
from tests.support.eventually import eventually

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def run_cli(
    *args: str, root: Path | None = None, check: bool = False, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "eventsrc"]
    if root is not None:
        cmd += ["--root-dir", str(root)]
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd + list(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def ready(root: Path, pid: int) -> bool:
    """Whether the daemon ``pid`` says in its status file that it is ready: it writes that once
    every socket is served. No new interpreter per look (``eventsrc status`` is tested in
    tests/e2e/test_cli.py), and no connection to a socket whose connections a test counts."""
    try:
        status = json.loads(Layout(root).status.read_text())
    except (OSError, ValueError):
        return False
    return bool(status.get("ready")) and status.get("pid") == pid


class Daemon:
    """``eventsrc serve`` in a subprocess, ready when ``eventsrc status`` says so."""

    def __init__(self, root: Path, *extra: str, preexec_fn: Callable[[], None] | None = None) -> None:
        self.root = root
        self.log_path = root.parent / f"daemon-{time.monotonic_ns()}.log"
        self._out = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eventsrc", "--root-dir", str(root), "serve", *extra],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec_fn,
        )
        self.eventually(lambda: ready(root, self.proc.pid), "the daemon to be ready")

    def exited(self) -> str | None:
        """Why waiting on this daemon is pointless (it has exited), or None."""
        if self.proc.poll() is None:
            return None
        return f"daemon exited {self.proc.returncode}:\n{self.output()}"

    def eventually(self, condition: Callable[[], T], what: str, timeout: float = 30.0) -> T:
        """``eventually``, failing at once if this daemon exits, with its output on failure."""
        return eventually(condition, what, timeout=timeout, stop=self.exited, context=self.output)

    def output(self) -> str:
        if not self._out.closed:
            self._out.flush()
        return self.log_path.read_text()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=30)
        self._out.close()
        return rc


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary directory with a short path (unix sockets allow 107 bytes; pytest's, under
    xdist, come near that before a socket's own name)."""
    short = Path(tempfile.mkdtemp(prefix="es-", dir="/tmp"))
    yield short
    shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes: keep the root short (pytest's are not).
    short = Path(tempfile.mkdtemp(prefix="es-", dir="/tmp"))
    (tmp_path / "root").symlink_to(short)
    yield short / "root"
    shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def daemon_factory(root: Path) -> Iterator[type[Daemon]]:
    started: list[Daemon] = []

    class Factory(Daemon):
        def __init__(self, *extra: str, preexec_fn: Callable[[], None] | None = None) -> None:
            super().__init__(root, *extra, preexec_fn=preexec_fn)
            started.append(self)

    yield Factory
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


def env_rounds(name: str, default: int) -> int:
    return int(os.environ.get(name, default))
