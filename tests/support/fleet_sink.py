"""``eventsrc fleet sink`` as a process for the fleet tests: its output in a file, its metrics on
a free loopback port, killed by its pid when the test ends."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sink:
    """``eventsrc fleet sink`` as a process, its output in a file."""

    def __init__(self, tmp_path: Path, nats_url: str, dsn: str) -> None:
        self.port = free_port()
        self.out_path = tmp_path / "sink.log"
        self.out = open(self.out_path, "w")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "eventsrc",
                "fleet",
                "sink",
                "--nats",
                nats_url,
                "--postgres",
                dsn,
                "--metrics-address",
                f"127.0.0.1:{self.port}",
            ],
            stdout=self.out,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def metrics(self) -> str:
        assert self.alive(), self.output()
        assert "serving metrics" in self.output(), self.output()
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as answer:  # noqa: S310
            return str(answer.read().decode())

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.out.close()


@contextlib.contextmanager
def sink_process(tmp_path: Path, nats_url: str, dsn: str) -> Iterator[Sink]:
    sink = Sink(tmp_path, nats_url, dsn)
    try:
        yield sink
    finally:
        sink.stop()
