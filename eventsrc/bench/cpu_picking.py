"""``eventsrc bench cpu``: how long the kubelet's CPU picking takes in this port.

The machine is a large server, where picking costs the most (examples/topology-256.json):
2 sockets, 4 NUMA nodes, 64 cores per socket, 2 threads per core (256 CPUs), one uncore
cache per NUMA node. Half of it is already taken:
a pseudo-random half drawn with a fixed seed (so partly used cores, NUMA nodes and sockets
are everywhere, which is where the sorting does the most work), and, as a second state, every
other physical core taken (what a run of 2-CPU Guaranteed pods leaves behind). Each take is
the static policy's picking (``take_by_topology``) of 1, 4, 16 and 64 CPUs from that free
set, repeated; the figures are the median and p99 of single calls, beside the goal.
"""

from __future__ import annotations

import functools
import os
import random
import statistics
import sys
import time
from collections.abc import Callable

from eventsrc.core.cpu.assignment import StaticPolicyOptions, take_by_topology
from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.core.cpu.topology import CPUTopology, synthetic

GOAL_SECONDS = 0.001
SIZES = (1, 4, 16, 64)
SEED = 4


def machine() -> CPUTopology:
    return synthetic(sockets=2, numa_per_socket=2, cores_per_numa=32, threads_per_core=2)


def random_half(topology: CPUTopology, seed: int = SEED) -> CPUSet:
    """A fixed pseudo-random half of the CPUs, left free."""
    cpus = topology.cpu_details.cpus().sorted_list()
    return CPUSet(random.Random(seed).sample(cpus, len(cpus) // 2))


def every_other_core(topology: CPUTopology) -> CPUSet:
    """The threads of every other physical core (by core id), left free."""
    cores = topology.cpu_details.cores().sorted_list()
    return topology.cpu_details.cpus_in_cores(*cores[1::2])


def _time(fn: Callable[[], object], repetitions: int) -> list[float]:
    for _ in range(min(50, repetitions)):  # warm up (the topology index is built on first use)
        fn()
    out: list[float] = []
    clock = time.perf_counter
    for _ in range(repetitions):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def _p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))]


def run_cpu_bench(*, repetitions: int = 2000) -> bool:
    """Print the figures; return whether every median met the goal."""
    out = sys.stdout
    topo = machine()
    states = (("random half free (seed 4)", random_half(topo)), ("every other core free", every_other_core(topo)))
    option_sets = (
        ("packed (default)", StaticPolicyOptions()),
        ("distribute-cpus-across-numa", StaticPolicyOptions(distribute_cpus_across_numa=True)),
        ("prefer-align-cpus-by-uncorecache", StaticPolicyOptions(prefer_align_cpus_by_uncorecache=True)),
    )
    out.write(
        f"eventsrc bench cpu: {os.cpu_count()} cpus, Python {sys.version.split()[0]}; take_by_topology on "
        f"2 sockets x 2 NUMA nodes x 32 cores x 2 threads = {topo.num_cpus} CPUs, 128 of them free; "
        f"{repetitions} calls per figure\n"
    )
    out.write(f"goal: < {GOAL_SECONDS * 1e3:g} ms median for every size\n")
    all_ok = True
    for state_name, free in states:
        out.write(f"\n{state_name}\n")
        for opt_name, opts in option_sets:
            out.write(f"  {opt_name}\n")
            for n in SIZES:
                times = _time(functools.partial(take_by_topology, topo, free, n, opts), repetitions)
                med = statistics.median(times)
                ok = med < GOAL_SECONDS
                all_ok = all_ok and ok
                out.write(
                    f"    take {n:3d}: median {med * 1e3:6.3f} ms   p99 {_p99(times) * 1e3:6.3f} ms   "
                    f"{'ok' if ok else 'ABOVE GOAL'}\n"
                )
    out.write(f"\n{'every median under the goal' if all_ok else 'SOME MEDIANS ABOVE THE GOAL'}\n")
    out.flush()
    return all_ok
