"""``eventsrc bench``: this machine's figures beside raw ceilings measured in the same run (a
command, never a test)."""

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


def add_parser(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "bench",
        parents=[parents.root],
        help="measure this machine (a command, not a test)",
        description="Benchmarks. Each prints its figures next to a raw ceiling measured in the same run.",
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
        "scale",
        parents=[parents.root],
        help="how the daemon's costs grow with the pods it holds, beside the kubelet's checkpoint",
        description="Starts a daemon and the sample plugin with --devices devices and admits one-device pods "
        "through the node API, one at a time, up to --pods resident pods. At 10, 100, 1,000 and 10,000 pods (those "
        "up to --pods, and --pods) prints admission p50/p99, the daemon's RSS and CPU per admission, log bytes per "
        "pod, PodResources List latency and the longest loop stall seen (a client's worst Status round trip, and "
        "the daemon's own longest loop step, with how much of it was the loop's CPU, and its longest piece of work), "
        "beside what the "
        "kubelet's device manager pays per change to persist the same state (whole-state JSON checkpoint, temporary "
        "file, fsync, rename) on the same disk. Then the restart time after SIGKILL at --pods pods, and a "
        "retention cut of every whole piece of the log: its duration, its longest writer pause and loop stall. "
        "A second table: ListPods and GetAllocatableResources latency, and the listings' sizes, at each size. "
        "The defaults take about a minute; the full run is --pods 10000 (a few minutes). "
        "Works in a temporary directory (in --root-dir when given).",
    )
    b.add_argument(
        "--devices",
        type=int,
        default=None,
        help="devices of the sample plugin (default: the larger of 10,000 and --pods)",
    )
    b.add_argument("--pods", type=int, default=None, help="resident pods to reach (default 1000, with --ratios too)")
    b.add_argument(
        "--samples", type=int, default=100, help="admissions per size for the percentiles (default %(default)s)"
    )
    b.add_argument(
        "--ratios",
        action="store_true",
        help="instead, the admission cost ratios: one-device admission p50 with --small-devices and with "
        "--devices devices (default 10,000) at --base-pods resident pods, and with --devices devices at --pods "
        "resident pods (three daemons side by side, sampled in turn, each admission removed again); prints the "
        "figures and the two ratios",
    )
    b.add_argument("--small-devices", type=int, default=8, help="with --ratios: the few devices (default %(default)s)")
    b.add_argument(
        "--base-pods", type=int, default=10, help="with --ratios: the few resident pods (default %(default)s)"
    )
    b.add_argument(
        "--repeats",
        type=int,
        default=11,
        help="List, ListPods and GetAllocatableResources calls and checkpoint writes per size; medians are printed "
        "(default %(default)s)",
    )
    b.add_argument("--keep", action="store_true", help="keep the bench's directory (the daemon's log and output)")
    b.set_defaults(func=bench_scale)
    b = bsub.add_parser(
        "watch",
        parents=[parents.root],
        help="what readers of the node's history cost its admissions",
        description="Starts a daemon and the sample plugin, fills its log to --records records, then times "
        "one-device admissions (each removed again) on the idle node, while --watchers node API Watch streams "
        "replay the log from its first record (a third reading as fast as they can, a third one message every "
        "--slow-ms, a third never reading; each on its own connection, in a process of their own), and after "
        "they have gone. Prints admission p50/p90/max beside the idle node's (the goal: within 2x while the "
        "watchers run) and the daemon's RSS (peak while they run; after, under the 100 MiB bound), and what "
        "each kind of watcher read. The defaults take about a minute. Works in a temporary directory (in "
        "--root-dir when given).",
    )
    b.add_argument("--records", type=int, default=7500, help="records in the log (default %(default)s)")
    b.add_argument("--watchers", type=int, default=100, help="Watch streams (default %(default)s)")
    b.add_argument("--samples", type=int, default=50, help="admissions per phase (default %(default)s)")
    b.add_argument(
        "--slow-ms", type=float, default=10.0, help="the slow watchers' pause per message (default %(default)s)"
    )
    b.set_defaults(func=bench_watch)
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
    b = bsub.add_parser(
        "soak",
        parents=[parents.root],
        help="a busy node for N minutes: do the log on disk and the daemon's RSS level off?",
        description="Starts a daemon (small --snapshot-every, retention at --retention-max-size) and the sample "
        "plugin in a temporary root, and for --minutes drives them as a busy node: one-device pods admitted at --rate "
        "a second through the node API, the oldest removed once --resident are held; one device flapping between "
        "healthy and unhealthy; PodResources List every second. Every --interval it prints the live log on disk "
        "(data.mdb and snapshots), the archive, the daemon's RSS, the admissions and their p99, List's p99 and the "
        "records appended. At the end it stops the daemon, runs 'eventsrc audit verify' and prints the verdict: "
        "the live log and the RSS reached a plateau (after the first third of the run, the later half's highest "
        "value at most 10 % or 256 KiB (live log), 5 % or 4 MiB (RSS), whichever is more, above the earlier "
        "half's) and the hash chain holds. Exit 0 when all "
        "hold, else 1 with the reason. How fast anything is is never part of the verdict. "
        "Works in a temporary directory (in --root-dir when given).",
    )
    b.add_argument("--minutes", type=float, default=10.0, help="length of the run (default %(default)s)")
    b.add_argument("--devices", type=int, default=24, help="devices of the sample plugin (default %(default)s)")
    b.add_argument(
        "--resident", type=int, default=16, help="pods held at once, fewer than --devices (default %(default)s)"
    )
    b.add_argument("--rate", type=float, default=20.0, help="admissions a second (default %(default)s)")
    b.add_argument(
        "--retention-max-size",
        default="1Mi",
        metavar="SIZE",
        help="serve's --log-retention-max-size (e.g. 512Ki, 4Mi); 0 leaves retention off (default %(default)s)",
    )
    b.add_argument(
        "--snapshot-every",
        type=int,
        default=1000,
        metavar="N",
        help="serve's --snapshot-every: retention cuts at snapshots (default %(default)s)",
    )
    b.add_argument(
        "--interval",
        type=float,
        default=None,
        metavar="S",
        help="seconds between rows (default 10, less for a run under 2 minutes: at least 12 rows)",
    )
    b.add_argument(
        "--keep", action="store_true", help="keep the bench's directory, as when the soak fails (the daemon's output)"
    )
    b.set_defaults(func=bench_soak)
    b = bsub.add_parser(
        "nri",
        parents=[parents.root],
        help="what eventsrc as the runtime's NRI plugin adds to each container start",
        description="Starts three containerds of its own (Debian's containerd 2.1, runc and a busybox image, "
        "fetched once into the tests' cache, $EVENTSRC_CONTAINERD_CACHE; needs root and a cgroup v1 cpuset "
        "controller): one with no NRI plugin (the ceiling), one with 'eventsrc serve --nri-mode observe', one "
        "with 'eventsrc serve --nri-mode enforce' (static CPU policy, CPU 0 reserved). Then starts --pods pods of "
        "one container through CRI in each of four modes (no plugin, observe, enforce with BestEffort pods, "
        "enforce with Guaranteed pods of one whole CPU), in --rounds rounds with the modes in turn so that "
        "drift hits each alike; each pod is stopped and removed before the next. Prints RunPodSandbox, "
        "CreateContainer (p50, p90) and StartContainer times, the whole pod start (the three in turn), and the "
        "milliseconds each mode adds over no plugin (medians), beside the goals: observe adds at most 1 ms to "
        "CreateContainer, enforce at most 3 ms. The defaults take about a minute.",
    )
    b.add_argument("--pods", type=int, default=30, help="pods per mode (default %(default)s)")
    b.add_argument("--rounds", type=int, default=5, help="rounds the pods are spread over (default %(default)s)")
    b.add_argument("--keep", action="store_true", help="keep the bench's directory (containerd's and eventsrc's logs)")
    b.set_defaults(func=bench_nri)
    b = bsub.add_parser(
        "fleet",
        parents=[parents.root],
        help="the fleet's path: nodes to JetStream to the sink to PostgreSQL, and the fleet's queries",
        description="Starts a nats-server with JetStream and a PostgreSQL 15 of its own (Debian 12's, fetched once "
        "into the tests' caches, $EVENTSRC_NATS_CACHE and $EVENTSRC_POSTGRES_CACHE; PostgreSQL runs as 'nobody' "
        "under root) and 'eventsrc fleet sink'. --nodes simulated nodes (real eventsrc logs of --records records "
        "each, the daemon's shipper each, in this process; not daemons) ship their whole logs at once: records/s "
        "per node and through the sink. Then each node appends records at --rate a second (default: half of what "
        "the sink took, shared by the nodes) for --paced-seconds: lag from a record's publish to its commit in "
        "PostgreSQL, p50 and p99. Beside them, measured in the same run: JetStream's own publish rate for the same "
        "messages (one at a time, and 256 in flight) and PostgreSQL's own COPY rate for the same rows (the "
        "ceilings), and the ratios. Checks that every record reached PostgreSQL once and that the sink's holds are "
        "the logs' own intervals. Then the fleet's queries as the commands answer them (fleet usage for each --by; "
        "fleet audit device, on one node and on every node; fleet audit pod) at --scale-nodes nodes x --days days "
        "of --pods-per-day pods a node a day, the tables loaded directly (COPY of the rows the sink's own code "
        "makes, not through JetStream and the sink): holds of every node, records and audit_index of "
        "--scale-records-nodes of them, spread evenly. "
        "The defaults take about 4 minutes; the full scale, --scale-nodes 1000, about 9 minutes in all. "
        "Works in a temporary directory (in --root-dir when given; PostgreSQL's own under /tmp, for its "
        "socket's short path).",
    )
    b.add_argument("--nodes", type=int, default=20, help="simulated nodes shipping (default %(default)s)")
    b.add_argument("--records", type=int, default=200, help="records in each node's log (default %(default)s)")
    b.add_argument(
        "--paced-seconds", type=float, default=20.0, help="length of the lag measurement (default %(default)s)"
    )
    b.add_argument(
        "--rate",
        type=float,
        default=None,
        help="records/s each node appends while the lag is measured (default: half the sink's rate, shared)",
    )
    b.add_argument("--repeats", type=int, default=3, help="runs of each ceiling; medians (default %(default)s)")
    b.add_argument(
        "--ceiling-messages",
        type=int,
        default=2000,
        help="messages JetStream's ceiling publishes, at most (default %(default)s)",
    )
    b.add_argument(
        "--scale-nodes", type=int, default=100, help="nodes of the queries' history (default %(default)s; full: 1000)"
    )
    b.add_argument(
        "--scale-records-nodes",
        type=int,
        default=100,
        help="of --scale-nodes, the nodes (spread evenly) whose records and audit index are loaded for fleet "
        "audit (default %(default)s)",
    )
    b.add_argument("--days", type=int, default=30, help="days of the queries' history (default %(default)s)")
    b.add_argument(
        "--pods-per-day", type=float, default=48.0, help="pods a node a day (default %(default)s: one every 30 min)"
    )
    b.add_argument("--runs", type=int, default=5, help="runs of each query; medians (default %(default)s)")
    b.add_argument(
        "--keep", action="store_true", help="keep the bench's directory (the sink's output, the nodes' logs)"
    )
    b.set_defaults(func=bench_fleet)


def _workdir(args: argparse.Namespace) -> Path | None:
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


def _at_least(*checks: tuple[str, int, int]) -> None:
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


def _stopped_by_sigterm_too(bench: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
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


@_stopped_by_sigterm_too
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
        workdir=_workdir(args),
    )
    return 0


@_stopped_by_sigterm_too
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


@_stopped_by_sigterm_too
def bench_cpu(args: argparse.Namespace) -> int:
    from eventsrc.bench.cpu_picking import run_cpu_bench

    if args.repetitions < 1:
        raise EventsrcError("--repetitions must be at least 1")
    run_cpu_bench(repetitions=args.repetitions)
    return 0


@_stopped_by_sigterm_too
def bench_audit(args: argparse.Namespace) -> int:
    from eventsrc.bench.audit_timing import run_audit_bench

    _at_least(("--events", args.events, 1000), ("--runs", args.runs, 1))
    run_audit_bench(events=args.events, runs=args.runs, workdir=_workdir(args))
    return 0


@_stopped_by_sigterm_too
def bench_usage(args: argparse.Namespace) -> int:
    from eventsrc.bench.usage_timing import run_usage_bench

    _at_least(("--records", args.records, 100), ("--runs", args.runs, 1))
    run_usage_bench(records=args.records, runs=args.runs, workdir=_workdir(args))
    return 0


@_stopped_by_sigterm_too
def bench_watch(args: argparse.Namespace) -> int:
    from eventsrc.bench.watch import run_watch_bench

    _at_least(("--records", args.records, 1), ("--watchers", args.watchers, 3), ("--samples", args.samples, 1))
    if args.slow_ms < 0:
        raise EventsrcError("--slow-ms must not be negative")
    run_watch_bench(
        records=args.records,
        watchers=args.watchers,
        samples=args.samples,
        slow_ms=args.slow_ms,
        workdir=_workdir(args),
    )
    return 0


@_stopped_by_sigterm_too
def bench_idle(args: argparse.Namespace) -> int:
    from eventsrc.bench.idle import run_idle_bench

    if args.seconds <= 0 or args.rounds < 1:
        raise EventsrcError("--seconds must be above 0 and --rounds at least 1")
    run_idle_bench(seconds=args.seconds, rounds=args.rounds, beside=args.beside_kubelet)
    return 0


@_stopped_by_sigterm_too
def bench_scale(args: argparse.Namespace) -> int:
    from eventsrc.bench.scale import run_scale_bench

    if args.ratios:
        return _bench_scale_ratios(args)
    args.pods = 1000 if args.pods is None else args.pods
    devices = max(10_000, args.pods) if args.devices is None else args.devices  # the bound: ADR 0028
    if min(args.pods, args.samples, args.repeats) < 1:
        raise EventsrcError("--pods, --samples and --repeats must be at least 1")
    if devices < args.pods:
        raise EventsrcError(f"--devices ({devices}) must be at least --pods ({args.pods}): each pod holds a device")
    run_scale_bench(
        devices=devices,
        pods=args.pods,
        samples=args.samples,
        repeats=args.repeats,
        workdir=_workdir(args),
        keep=args.keep,
    )
    return 0


@_stopped_by_sigterm_too
def bench_soak(args: argparse.Namespace) -> int:
    from eventsrc.bench.soak import SoakOptions, run_soak

    if args.minutes <= 0 or args.rate <= 0 or (args.interval is not None and args.interval <= 0):
        raise EventsrcError("--minutes, --rate and --interval must be above 0")
    if min(args.resident, args.snapshot_every) < 1:
        raise EventsrcError("--resident and --snapshot-every must be at least 1")
    if args.devices <= args.resident:
        raise EventsrcError(
            f"--devices ({args.devices}) must be more than --resident ({args.resident}): one device flaps"
        )
    options = SoakOptions(
        minutes=args.minutes,
        devices=args.devices,
        resident=args.resident,
        rate=args.rate,
        retention_max_size=args.retention_max_size,
        snapshot_every=args.snapshot_every,
        interval=args.interval,
    )
    if options.seconds / options.period < 3:
        raise EventsrcError("--interval leaves fewer than 3 rows: the plateau cannot be judged")
    result = run_soak(options, workdir=_workdir(args), keep=args.keep)
    if result.failures:
        print(f"eventsrc: soak failed: {'; '.join(result.failures)}", file=sys.stderr)
        return 1
    return 0


@_stopped_by_sigterm_too
def bench_nri(args: argparse.Namespace) -> int:
    from eventsrc.bench.container_starts import run_nri_bench

    _at_least(("--pods", args.pods, 1), ("--rounds", args.rounds, 1))
    if args.rounds > args.pods:
        raise EventsrcError(
            f"--rounds ({args.rounds}) must be at most --pods ({args.pods}): a round starts a pod at least"
        )
    run_nri_bench(pods=args.pods, rounds=args.rounds, keep=args.keep)
    return 0


@_stopped_by_sigterm_too
def bench_fleet(args: argparse.Namespace) -> int:
    from eventsrc.bench.fleet_timing import Options, run_fleet_bench

    _at_least(
        ("--nodes", args.nodes, 1),
        ("--records", args.records, 10),
        ("--repeats", args.repeats, 1),
        ("--ceiling-messages", args.ceiling_messages, 10),
        ("--scale-nodes", args.scale_nodes, 1),
        ("--scale-records-nodes", args.scale_records_nodes, 1),
        ("--days", args.days, 1),
        ("--runs", args.runs, 1),
    )
    if args.paced_seconds <= 0 or args.pods_per_day <= 0 or (args.rate is not None and args.rate <= 0):
        raise EventsrcError("--paced-seconds, --pods-per-day and --rate must be above 0")
    options = Options(
        nodes=args.nodes,
        records=args.records,
        paced_seconds=args.paced_seconds,
        rate=args.rate,
        repeats=args.repeats,
        ceiling_messages=args.ceiling_messages,
        scale_nodes=args.scale_nodes,
        records_nodes=args.scale_records_nodes,
        days=args.days,
        pods_per_day=args.pods_per_day,
        runs=args.runs,
        keep=args.keep,
    )
    run_fleet_bench(options, workdir=_workdir(args))
    return 0


def _bench_scale_ratios(args: argparse.Namespace) -> int:
    from eventsrc.bench.scale import run_ratio_bench

    pods = 1000 if args.pods is None else args.pods  # the bound: ADR 0028
    devices = 10_000 if args.devices is None else args.devices
    if min(args.small_devices, args.base_pods, args.samples) < 1:
        raise EventsrcError("--small-devices, --base-pods and --samples must be at least 1")
    if pods < args.base_pods:
        raise EventsrcError(f"--pods ({pods}) must be at least --base-pods ({args.base_pods})")
    if devices <= pods - args.base_pods:
        raise EventsrcError(
            f"--devices ({devices}) must be more than --pods - --base-pods ({pods - args.base_pods}): "
            "the residents past --base-pods hold a device each, and the measured pod one more"
        )
    run_ratio_bench(
        small_devices=args.small_devices,
        devices=devices,
        base_pods=args.base_pods,
        pods=pods,
        samples=args.samples,
        workdir=_workdir(args),
        keep=args.keep,
    )
    return 0
