"""The daemon's use of glibc's allocator: its arenas capped, and the memory it holds free
given back once a burst of large answers is over (docs/adr/0020).

A listing at 10,000 pods is a 3.3 MB message, and grpclib, h2 and asyncio copy it about
seven times on its way out (the gRPC prefix, the DATA frame, h2's outbound buffer, the
transport's). Each copy is a block of its own size. Given fresh pages each time (glibc's
mmap threshold fixed low), every copy faults in 800 pages, about 2.7 ms on this machine's
VM: a ListPods took 20-24 ms, most of it page faults, in one step of the loop. Taken from
the heap (glibc's own threshold, which moves up to the largest block freed), the pages are
already there: 6-9 ms. The heap then keeps what the last answers freed, 14-17 MB at
10,000 pods; ``HeapTrimmer`` gives it back with ``malloc_trim`` once no large answer was
sent for ``QUIET_SECONDS``, in a worker thread (ctypes lets go of the GIL). A poller that
calls more often than that keeps its pages warm; one that calls less often pays the faults,
as every call did before.
"""

from __future__ import annotations

import ctypes
from collections.abc import Awaitable, Callable

import trio

#: malloc arenas (glibc's M_ARENA_MAX; its default is 8 per core): the worker threads (the
#: log's commits, long device lists, retention) share two instead of holding one each.
ARENA_MAX = 2

#: An answer at least this long makes the heap worth trimming once the daemon is quiet
#: (a List or ListPods of about 3,000 pods, a GetAllocatableResources of 20,000 devices).
LARGE_BYTES = 1 << 20

#: Seconds without a large answer before the heap is trimmed.
QUIET_SECONDS = 2.0


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.mallopt  # noqa: B018  (glibc's, or nothing to tune)
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def tune_malloc() -> None:
    """glibc's arenas capped at ``ARENA_MAX``; its mmap threshold left to move (see the
    module's docstring). Not glibc: nothing to do."""
    libc = _libc()
    if libc is None:
        return
    m_arena_max = -8  # malloc.h
    libc.mallopt(ctypes.c_int(m_arena_max), ctypes.c_int(ARENA_MAX))


def malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``: every arena's free pages given back to the system, the
    heap's middle included (None: not glibc)."""
    libc = _libc()
    if libc is None:
        return None
    trim = libc.malloc_trim
    return lambda: trim(ctypes.c_size_t(0))


class HeapTrimmer:
    """Trims the heap once the daemon has been quiet for ``quiet`` seconds after a response
    message of ``LARGE_BYTES`` or more (``sent``, handed to the servers' codecs). Nothing runs
    while no large answer is sent: an idle daemon never wakes for it."""

    def __init__(
        self,
        trim: Callable[[], object] | None,
        quiet: float = QUIET_SECONDS,
        in_thread: Callable[[Callable[[], object]], Awaitable[object]] = trio.to_thread.run_sync,
    ) -> None:
        self._trim = trim
        self._quiet = quiet
        self._in_thread = in_thread
        self._wanted = trio.Event()
        self.trims = 0  # trims done (Status' heap_trims)

    def sent(self, nbytes: int) -> None:
        """An answer of ``nbytes`` went out (called on the loop's thread)."""
        if nbytes >= LARGE_BYTES:
            self.want()

    def want(self) -> None:
        """Trim once quiet, whatever was sent (after the start-up's rebuild)."""
        if self._trim is not None:
            self._wanted.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        trim = self._trim
        if trim is None:
            return
        while True:
            await self._wanted.wait()
            while self._wanted.is_set():  # until ``quiet`` seconds pass with no large answer
                self._wanted = trio.Event()
                await trio.sleep(self._quiet)
            await self._in_thread(trim)
            self.trims += 1
