"""A retention cut's first step (``cut_steps.prepare``) in a process of its own, so that the
daemon's interpreter never waits for it: the replay up to the cut and msgspec's encoding of
the views hold the GIL (the encoding for all of it, 25-60 ms at 10,000 pods), and a worker
thread stalled the daemon's loop as long.

``python -m eventsrc.log.cut_worker LOG_DIR ARCHIVE|- SEQ PARENT_PID`` opens the log read-only
(a fresh interpreter: an LMDB environment must not be used across a fork), prepares the cut
and writes it to stdout as one msgpack ``Result``; on failure, exit status 1 and the reason
on stdout. The daemon gives it a memfd for stdout (``answer_file``) and maps it once the
worker has ended (``read``): the views at the cut (16 MB at 10,000 pods) are used where the
worker wrote them, never joined, copied or decoded while the daemon's GIL is held (a fresh
16 MB copy faults its pages in: 10 ms or more each). It changes nothing the log or a reader
uses: the segment it seals is one the ledger does not name yet, which a start deletes if the
base never moves (``undo_unfinished``).

It dies with the daemon (Linux's parent-death signal), so that a killed daemon's worker
cannot seal a segment after the next start has cleaned the archive. The parent-death signal
follows the thread that started the worker: the daemon starts it from its main thread.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import subprocess
import sys
from pathlib import Path

import msgspec

from eventsrc.errors import EventsrcError
from eventsrc.log.archive import LedgerEntry
from eventsrc.log.cut_steps import Prepared, failure_reason, prepare
from eventsrc.log.store import Base, EventLog

#: the worker's exit status when the cut cannot be prepared (its reason on stdout)
FAILED = 1
_PR_SET_PDEATHSIG = 1


class Result(msgspec.Struct, frozen=True, kw_only=True):
    base: Base
    entry: LedgerEntry
    seconds: float
    views: memoryview  # decoded as a view into the mapped answer, not a copy


def argv(log_dir: Path, archive: Path | None, seq: int) -> list[str]:
    """The worker's command line, for a cut of the log at ``log_dir`` at ``seq`` (the caller's pid as its parent)."""
    return [sys.executable, "-m", __name__, str(log_dir), str(archive) if archive else "-", str(seq), str(os.getpid())]


def start(log_dir: Path, archive: Path | None, seq: int, stdout: int) -> subprocess.Popen[bytes]:
    """Start the worker, its stdout to the descriptor ``stdout``; returns at once. Call it from
    the thread that lives as long as the process (see the module's docstring)."""
    return subprocess.Popen(argv(log_dir, archive, seq), stdin=subprocess.DEVNULL, stdout=stdout, close_fds=True)


def answer_file() -> int:
    """A descriptor for the worker's stdout: an anonymous file in memory (memfd), gone
    with its last descriptor and mapping, so a crash leaves nothing behind."""
    return os.memfd_create("eventsrc-cut-answer", os.MFD_CLOEXEC)


def read(status: int, fd: int) -> Prepared:
    """What the worker that ended with ``status`` wrote to ``fd`` (``answer_file``): the
    prepared cut, its views a view into the mapped file, or EventsrcError saying why not.
    ``fd`` can be closed once this returns; the mapping lives as long as the views."""
    size = os.fstat(fd).st_size
    out: bytes | mmap.mmap = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else b""
    if status == 0:
        try:
            r = msgspec.msgpack.decode(out, type=Result)
        except msgspec.MsgspecError as exc:
            raise EventsrcError(f"the retention cut's worker answered garbage ({exc})") from None
        return Prepared(r.base, r.views, r.entry, r.seconds)
    if status == FAILED:
        raise EventsrcError(bytes(out).decode(errors="replace").strip() or "the retention cut's worker failed")
    raise EventsrcError(f"the retention cut's worker failed (exit status {status})")


def _die_with(parent: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the signal was asked for
        os._exit(FAILED)


def main(args: list[str]) -> int:
    log_dir, archive, seq, parent = Path(args[0]), args[1], int(args[2]), int(args[3])
    _die_with(parent)
    out = sys.stdout.buffer
    try:
        log = EventLog(log_dir, readonly=True)
        try:
            p = prepare(log, None if archive == "-" else Path(archive), seq)
        finally:
            log.close()
    except (EventsrcError, OSError) as err:
        out.write(failure_reason(err).encode())
        return FAILED
    out.write(msgspec.msgpack.encode(Result(base=p.base, entry=p.entry, seconds=p.seconds, views=memoryview(p.views))))
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
