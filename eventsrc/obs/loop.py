"""How long the daemon's loop is held: every trio task step timed, the long ones kept.

The daemon is one thread running one trio loop; grpclib's handlers run on trio-asyncio's
loop, one trio task that passes through a trio checkpoint between two asyncio callbacks.
So one task step is one piece of work that nobody else can interrupt: a trio task's run
up to its next checkpoint, or one asyncio callback (a handler's step, a connection's
``data_received``). Whatever else lands in it counts too: a garbage collection, a wait
for the GIL held by another thread. The longest step is the longest time the daemon
answered nobody, measured where it happens instead of guessed from a client's round
trips (which include the client's own scheduling).

``LoopHolds`` is a trio Instrument (``trio.lowlevel.add_instrument``): three clock reads
at a step's start and one at its end, a comparison, and, for a step of at least
``KEEP_SECONDS``, three more reads and a line in a ring of the latest ``KEEP`` long steps
with the monotonic time it ended (CLOCK_MONOTONIC, the same clock in every process of the
machine: ``eventsrc bench scale`` finds the longest step of a span from another process).
The node API's Status carries it.

A step's wall time is not all work. Each step also records the CPU time of the loop's
thread (CLOCK_THREAD_CPUTIME_ID) and of the whole process over it, so a long step tells
what it was: the loop's own work (its thread's CPU), a wait for the GIL while another of
the daemon's threads ran Python (the process's CPU beyond the thread's), or a wait for a
core while the machine ran other processes (the rest). Work is what a request costs the
loop; the rest is the machine. The clock reads cost about 1.5 µs a step on this machine.
"""

from __future__ import annotations

import time
from collections import deque
from typing import NamedTuple

import trio

#: Steps at least this long are kept with their end time and task's name.
KEEP_SECONDS = 0.004
#: How many of the latest long steps are kept.
KEEP = 1024
#: The goal of issue 15 item 3: no request holds the loop longer than about this.
OVER_SECONDS = 0.010

_clock = time.perf_counter
_thread_cpu = time.thread_time
_process_cpu = time.process_time
_now_ns = time.monotonic_ns


class Step(NamedTuple):
    """One kept step: when it ended (monotonic ns), its wall seconds, the loop thread's CPU
    seconds in it, the CPU seconds of every thread of the process in it, its task's name."""

    end_ns: int
    seconds: float
    cpu: float
    process_cpu: float
    task: str


class LoopHolds(trio.abc.Instrument):
    """The loop's task steps: how many, the longest by wall time and by the loop thread's
    CPU time, how many reached ``OVER_SECONDS`` of each, and the latest ones of at least
    ``KEEP_SECONDS`` (wall) as ``Step``s."""

    def __init__(self) -> None:
        self.steps = 0
        self.longest = 0.0
        self.longest_task = ""
        self.over = 0
        self.longest_cpu = 0.0  # the most CPU the loop's thread spent in one step
        self.longest_cpu_task = ""
        self.cpu_over = 0  # steps whose CPU reached OVER_SECONDS
        self.kept = 0  # steps of at least KEEP_SECONDS, ever (the ring holds the latest KEEP)
        self.recent: deque[Step] = deque(maxlen=KEEP)
        self._started = 0.0
        self._cpu_started = 0.0
        self._process_started = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._process_started = _process_cpu()
        self._cpu_started = _thread_cpu()
        self._started = _clock()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        held = _clock()
        started, self._started = self._started, 0.0
        if not started:  # added in the middle of this step: its start is unknown
            return
        held -= started
        self.steps += 1
        if held > self.longest:
            self.longest, self.longest_task = held, task.name
        if held < KEEP_SECONDS:  # so was its CPU: no need to read it
            return
        cpu = _thread_cpu() - self._cpu_started
        process_cpu = _process_cpu() - self._process_started
        self.recent.append(Step(_now_ns(), held, cpu, process_cpu, task.name))
        self.kept += 1
        if held >= OVER_SECONDS:
            self.over += 1
        if cpu > self.longest_cpu:
            self.longest_cpu, self.longest_cpu_task = cpu, task.name
        if cpu >= OVER_SECONDS:
            self.cpu_over += 1

    def since(self, since_ns: int) -> list[Step]:
        """The kept steps that ended after ``since_ns``, oldest first."""
        return [step for step in self.recent if step.end_ns > since_ns]
