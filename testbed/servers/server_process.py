"""Server processes a harness starts, looks at and ends by pid (never by name: other tests, other
benchmarks and other people's servers run on the same machine). ``eventsrc bench nri``'s
containerd is one, ``eventsrc bench fleet``'s nats-server and PostgreSQL are others, and so are the
tests' (which run the same harnesses).

Waiting for a server is polling a condition (``eventually``), failing at once when the server has
exited (``eventually_up``); what ran out of time is a ``WaitedTooLong``, an AssertionError to a
test and an EventsrcError to a command."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from eventsrc.errors import EventsrcError

START_MARK = "--- starting"
T = TypeVar("T")


class WaitedTooLong(EventsrcError, AssertionError):
    """A condition that did not hold in time, or whose server exited meanwhile: a failure to a
    test (AssertionError) and a one-line error to a command (its first line)."""


def timed_out(what: str, timeout: float, last: object, context: Callable[[], str] | None) -> WaitedTooLong:
    message = f"waited {timeout:g} s for {what}; the condition last gave {last!r}"
    return WaitedTooLong(message + (f"\n{context()}" if context is not None else ""))


def eventually(
    condition: Callable[[], T],
    what: str,
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    stop: Callable[[], str | None] | None = None,
    context: Callable[[], str] | None = None,
) -> T:
    """Call ``condition`` every ``interval`` seconds until it returns something truthy, and
    return that. Fails after ``timeout`` seconds, or as soon as ``stop`` gives a reason to stop
    waiting (a process the condition depends on has exited); ``context`` adds what helps to
    understand a failure (a daemon's output)."""
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        if stop is not None and (reason := stop()) is not None:
            raise WaitedTooLong(f"stopped waiting for {what}: {reason}")
        if time.monotonic() > deadline:
            raise timed_out(what, timeout, got, context)
        time.sleep(interval)


def eventually_up(server: Server, condition: Callable[[], object], what: str, timeout: float) -> None:
    """Poll ``condition`` until it holds; fail at once if ``server`` exits, with its log, and stop
    the server when failing (a start that did not come up leaves nothing running)."""
    try:
        eventually(condition, what, timeout=timeout, interval=0.02, stop=server.exited, context=server.log_tail)
    except BaseException:
        server.stop()
        raise


def all_pids() -> Iterator[int]:
    """Every process's pid, as /proc lists them."""
    return (int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit())


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...), or None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie waiting for its parent)."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    return [
        child for child in all_pids() if (stat := _stat(child)) is not None and stat[0] != "Z" and int(stat[1]) == pid
    ]


def end(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 20) -> int:
    """Send ``sig`` to ``proc`` (by its pid) and reap it; SIGKILL when it has not exited within
    ``timeout`` seconds. Its exit status (negative for a signal)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)
    return proc.returncode


class Server:
    """A server process a harness starts (``proc``), its output appended to ``log_path``: whether
    it runs, why it exited, its log, and every pid it was started with (``pids``)."""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.pids: list[int] = []  # every process started as this server, for a test to check

    def spawn(self, argv: Sequence[str | os.PathLike[str]], **popen: Any) -> None:
        """Start ``argv`` in a session of its own (a Ctrl-C in the terminal is for pytest or the
        benchmark: the harness stops its server), its stdout and stderr appended to the log."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"{START_MARK} {self.name} ({time.strftime('%H:%M:%S')})\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [str(a) for a in argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                **popen,
            )
        self.pids.append(self.proc.pid)

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def running(self) -> bool:
        return self.pid is not None

    def exited(self) -> str | None:
        """Why waiting on the server is pointless (it has exited), or None."""
        if self.proc is None:
            return f"{self.name} is not started"
        if self.proc.poll() is None:
            return None
        return f"{self.name} exited {self.proc.returncode}:\n{self.log_tail()}"

    def stop(self) -> None:
        """Stop the server (a subclass says how; SIGTERM here)."""
        self.end()

    def end(self, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        """``sig`` to the server by its pid, then wait (SIGKILL after ``timeout`` s). Idempotent."""
        if self.proc is not None:
            end(self.proc, sig, timeout)

    def log_text(self) -> str:
        """The server's log (stdout and stderr) since this harness first started it."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def this_start_log(self) -> str:
        """The log since the server was last started."""
        return self.log_text().rpartition(START_MARK)[2]

    def log_tail(self, lines: int = 40) -> str:
        return f"{self.name} log (tail):\n" + "\n".join(self.log_text().splitlines()[-lines:])
