"""``eventsrc bench``: this machine's figures beside raw ceilings measured in the same run (a
command, never a test).

The operator's benches are here: what eventsrc costs and gives on this node, from eventsrc's own
code and the node's disk and CPUs. The developers' benches (``DEVELOPER_BENCHES``) are
eventsrc-testbed's, which eventsrc never imports: ``eventsrc bench NAME`` finds one through the
``eventsrc.benches`` entry points when it runs, and hands it the rest of its command line
(docs/adr/0014).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from eventsrc.cli.options import Parents, Subparsers
from eventsrc.errors import EventsrcError

#: The developers' benches, in the order ``eventsrc bench --help`` lists them, with the line it
#: says for each. Their flags and code are eventsrc-testbed's (testbed/benches/commands.py).
DEVELOPER_BENCHES = {
    "scale": "how the daemon's costs grow with the pods it holds, beside the kubelet's checkpoint",
    "watch": "what readers of the node's history cost its admissions",
    "soak": "a busy node for N minutes: do the log on disk and the daemon's RSS level off?",
    "nri": "what eventsrc as the runtime's NRI plugin adds to each container start",
    "fleet": "the fleet's path: nodes to JetStream to the sink to PostgreSQL, and the fleet's queries",
}
#: the entry point group where eventsrc-testbed names the function that runs each of them
BENCH_ENTRY_POINTS = "eventsrc.benches"
INSTALL_TESTBED = (
    "install eventsrc-testbed beside eventsrc (in a clone: make .venv/.installed, or pip install -e ./testbed)"
)


def add_parser(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "bench",
        parents=[parents.root],
        help="measure this machine (a command, not a test)",
        description="Benchmarks. Each prints its figures next to a raw ceiling measured in the same run. "
        f"{', '.join(DEVELOPER_BENCHES)} are developers' benches, run by eventsrc-testbed (testbed/ in a clone).",
    )
    bsub = p.add_subparsers(dest="bench", metavar="WHAT", required=True)
    b = bsub.add_parser(
        "log",
        parents=[parents.root],
        help="append, group commit, replay and restart figures",
        description="Durable appends/s (1 and N writers), full replay rate and restart time on a "
        "large log, peak RSS; with the raw LMDB iteration rate and a bare file's syncs/s. "
        "Works in a temporary directory unless --root-dir is given.",
    )
    b.add_argument("--events", type=int, default=1_000_000, help="size of the replay log (default %(default)s)")
    b.add_argument("--writers", type=int, default=64, help="concurrent writers (default %(default)s)")
    b.add_argument(
        "--seconds", type=float, default=2.0, help="duration of each append measurement (default %(default)s)"
    )
    b.add_argument("--rounds", type=int, default=3, help="rounds per figure; medians are printed (default %(default)s)")
    b.add_argument(
        "--snapshot-every", type=int, default=10_000, metavar="N", help="snapshot interval the restart figure assumes"
    )
    b.set_defaults(func=bench_log)
    b = bsub.add_parser(
        "devices",
        parents=[parents.root],
        help="one-device admissions through the node API, with 1 and N clients",
        description="Starts a daemon and the sample plugin in a temporary root and measures one-device admissions "
        "through the node API (the plugin's Allocate included): admissions/s and p50/p99 latency with 1 and with "
        "N concurrent clients, beside a bare gRPC round trip to the same plugin and one durable LMDB commit.",
    )
    b.add_argument("--devices", type=int, default=256, help="devices of the sample plugin (default %(default)s)")
    b.add_argument("--clients", type=int, default=32, help="concurrent clients (default %(default)s)")
    b.add_argument(
        "--admissions", type=int, default=256, help="admissions per round with N clients (default %(default)s)"
    )
    b.add_argument("--rounds", type=int, default=3, help="rounds; medians are printed (default %(default)s)")
    b.add_argument("--rtt-calls", type=int, default=1000, help="round trips measured per round (default %(default)s)")
    b.set_defaults(func=bench_devices)
    b = bsub.add_parser(
        "cpu",
        parents=[parents.root],
        help="time of the kubelet's CPU picking on a 256-CPU machine",
        description="Median and p99 time of a take of 1, 4, 16 and 64 CPUs (the static policy's take-by-topology) "
        "on a simulated 2-socket, 4-NUMA-node, 128-core, 2-thread machine with half of its CPUs taken, "
        "beside the goal of under 1 ms median.",
    )
    b.add_argument("--repetitions", type=int, default=2000, help="calls per figure (default %(default)s)")
    b.set_defaults(func=bench_cpu)
    b = bsub.add_parser(
        "audit",
        parents=[parents.root],
        help="time of audit queries on a 1,000,000-event log",
        description="Builds a log with the 'bench log' workload (through the log's commit, so the index is "
        "written as the daemon writes it), then times 'audit device' for a busy device and 'audit pod' for a pod: "
        "median and p99 over --runs, beside one LMDB point lookup and a raw index range read measured in the "
        "same run; goal under 100 ms. Works in a temporary directory unless --root-dir is given.",
    )
    b.add_argument("--events", type=int, default=1_000_000, help="size of the log (default %(default)s)")
    b.add_argument("--runs", type=int, default=200, help="timed runs per figure (default %(default)s)")
    b.set_defaults(func=bench_audit)
    b = bsub.add_parser(
        "usage",
        parents=[parents.root],
        help="time of 'audit usage' on a year of history (1,000,000 records)",
        description="Writes a log of --records records spanning a year (pods of 20 namespaces taking GPUs, NIC VFs, "
        "exclusive CPUs and DRA claim devices, a fifth of them observed beside a kubelet) with the log's batch "
        "append as the daemon writes it (its usage feeder run every 5,000 records), cuts its older half into the "
        "archive through the real retention steps, times the first 'audit usage' in a new process, then each "
        "query (--by namespace over a month and the whole year, --by device, --by resource, --by pod over a "
        "month): median of --runs in process and of 3 new processes, with each process's peak RSS (the feeds', "
        "the queries', and a build from scratch), beside reading the index's keys alone, the same answer from a "
        "scan of every record and the RSS of an idle interpreter, measured in the same run; goals under 1 s and "
        "100 MB. Works in a temporary directory unless --root-dir is given.",
    )
    b.add_argument("--records", type=int, default=1_000_000, help="size of the log (default %(default)s)")
    b.add_argument("--runs", type=int, default=5, help="timed runs per query (default %(default)s)")
    b.set_defaults(func=bench_usage)
    b = bsub.add_parser(
        "idle",
        parents=[parents.root],
        help="CPU of a daemon with nothing to do",
        description="Starts a daemon with no plugin in a temporary root and, once it is ready, measures its CPU "
        "(every thread, as a share of one core) and the wakeups of its trio thread, beside the goal of under "
        "0.5 % of a core.",
    )
    b.add_argument("--seconds", type=float, default=60.0, help="length of a round (default %(default)s)")
    b.add_argument("--rounds", type=int, default=1, help="rounds; medians are printed (default %(default)s)")
    b.add_argument(
        "--beside-kubelet",
        action="store_true",
        help="run the daemon beside a kubelet directory (serve --beside-kubelet) with no kubelet in it",
    )
    b.set_defaults(func=bench_idle)
    for name, help in DEVELOPER_BENCHES.items():
        # No flags of its own here: what follows NAME is the bench's, parsed by eventsrc-testbed
        # (--help included); main hands it over as args.rest.
        b = bsub.add_parser(name, help=f"{help} (eventsrc-testbed)", add_help=False)
        b.set_defaults(func=run_developer_bench, takes_the_rest=True)


def workdir(args: argparse.Namespace) -> Path | None:
    """--root-dir when it was given on the command line (not from the environment), else None:
    a temporary directory. The benchmark works in a new directory inside it, so it must exist."""
    if "--root-dir" not in " ".join(sys.argv):
        return None
    root: Path = args.root_dir
    if not root.exists():
        raise EventsrcError(f"root directory {root} does not exist")
    if not root.is_dir():
        raise EventsrcError(f"root directory {root} is not a directory")
    return root


def at_least(*checks: tuple[str, int, int]) -> None:
    """Each (flag, value, least): any value below its least is one error naming every bound,
    "--events must be at least 1000 and --runs at least 1"."""
    if any(value < least for _, value, least in checks):
        raise EventsrcError(
            " and ".join(f"{flag} {'must be ' * (i == 0)}at least {least}" for i, (flag, _, least) in enumerate(checks))
        )


#: seconds a bench stopped by SIGTERM has to stop what it started before it exits anyway
STOP_GRACE = 20.0


def _signal_children(sig: int) -> None:
    """``sig`` to each process this one started that still runs (the kernel's list of them)."""
    try:
        children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
    except OSError:
        return
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), sig)


def _stop_now() -> None:
    _signal_children(signal.SIGKILL)
    os._exit(130)


def stopped_by_sigterm_too(bench: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``bench``, stopped by SIGTERM as by Ctrl-C: it stops the daemon, plugin and probe it
    started and removes its temporary directory (under ``timeout`` or a CI job's end, a
    SIGTERM that killed it outright would leave them running). The SIGTERM is passed on as
    a SIGINT, so that whoever handles Ctrl-C at that moment (trio's run, asyncio's, or
    Python's default) stops the bench its own safe way; a second SIGTERM does not cut the
    stopping short."""

    @functools.wraps(bench)
    def run(args: argparse.Namespace) -> int:
        stopping = threading.Event()

        def interrupt(signum: int, frame: FrameType | None) -> None:
            stopping.set()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            # The children first, by pid: one forked a moment ago may not be in the bench's
            # own list yet. And the bench is gone within STOP_GRACE seconds whatever its
            # stopping meets, its children killed.
            _signal_children(signal.SIGTERM)
            deadline = threading.Timer(STOP_GRACE, _stop_now)
            deadline.daemon = True  # a bench that stopped in time exits at once
            deadline.start()
            signal.raise_signal(signal.SIGINT)

        previous = signal.signal(signal.SIGTERM, interrupt)
        try:
            return bench(args)
        except EventsrcError:
            if stopping.is_set():  # its daemon, stopped above, ended what it was doing: it was stopped
                raise KeyboardInterrupt from None
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)

    return run


@stopped_by_sigterm_too
def bench_log(args: argparse.Namespace) -> int:
    from eventsrc.bench import log as bench

    if args.events < 1 or args.writers < 1 or args.rounds < 1:
        raise EventsrcError("--events, --writers and --rounds must be at least 1")
    bench.run_log_bench(
        events=args.events,
        writers=args.writers,
        seconds=args.seconds,
        rounds=args.rounds,
        snapshot_every=args.snapshot_every,
        workdir=workdir(args),
    )
    return 0


@stopped_by_sigterm_too
def bench_devices(args: argparse.Namespace) -> int:
    from eventsrc.bench.device_admissions import run_devices_bench

    if min(args.devices, args.clients, args.admissions, args.rounds, args.rtt_calls) < 1:
        raise EventsrcError("--devices, --clients, --admissions, --rounds and --rtt-calls must be at least 1")
    run_devices_bench(
        devices=args.devices,
        clients=args.clients,
        admissions=args.admissions,
        rounds=args.rounds,
        rtt_calls=args.rtt_calls,
    )
    return 0


@stopped_by_sigterm_too
def bench_cpu(args: argparse.Namespace) -> int:
    from eventsrc.bench.cpu_picking import run_cpu_bench

    if args.repetitions < 1:
        raise EventsrcError("--repetitions must be at least 1")
    run_cpu_bench(repetitions=args.repetitions)
    return 0


@stopped_by_sigterm_too
def bench_audit(args: argparse.Namespace) -> int:
    from eventsrc.bench.audit_timing import run_audit_bench

    at_least(("--events", args.events, 1000), ("--runs", args.runs, 1))
    run_audit_bench(events=args.events, runs=args.runs, workdir=workdir(args))
    return 0


@stopped_by_sigterm_too
def bench_usage(args: argparse.Namespace) -> int:
    from eventsrc.bench.usage_timing import run_usage_bench

    at_least(("--records", args.records, 100), ("--runs", args.runs, 1))
    run_usage_bench(records=args.records, runs=args.runs, workdir=workdir(args))
    return 0


@stopped_by_sigterm_too
def bench_idle(args: argparse.Namespace) -> int:
    from eventsrc.bench.idle import run_idle_bench

    if args.seconds <= 0 or args.rounds < 1:
        raise EventsrcError("--seconds must be above 0 and --rounds at least 1")
    run_idle_bench(seconds=args.seconds, rounds=args.rounds, beside=args.beside_kubelet)
    return 0


def run_developer_bench(args: argparse.Namespace) -> int:
    """The developers' bench ``args.bench``, run by the function eventsrc-testbed names for it
    in the ``eventsrc.benches`` entry points (a lookup in the installed packages' metadata, not
    an import of testbed by eventsrc); one line saying what to install when it is not there."""
    from importlib.metadata import entry_points

    found = entry_points(group=BENCH_ENTRY_POINTS, name=args.bench)
    if not found:
        raise EventsrcError(f"bench {args.bench} is a developers' bench: {INSTALL_TESTBED}")
    bench: Callable[[argparse.Namespace], int] = next(iter(found)).load()
    return int(bench(args))
