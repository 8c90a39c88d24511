"""``eventsrc bench scale|watch|soak|nri|fleet``: the developers' benches, as ``eventsrc bench``
runs them through the ``eventsrc.benches`` entry points (testbed/pyproject.toml).

eventsrc names these benches in its ``bench --help`` and hands each the rest of its command
line (``args.rest``); each parses it here, with its own flags, and runs. docs/adr/0014 says
which benches are an operator's (in eventsrc) and which a developer's (here), and why.
"""

from __future__ import annotations

import argparse
import sys

from eventsrc.cli.bench import at_least, stopped_by_sigterm_too, workdir
from eventsrc.cli.options import root_parent
from eventsrc.errors import EventsrcError


def parse(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The rest of ``eventsrc bench NAME``'s command line (``args.rest``), parsed by the bench's
    own ``parser`` into ``args`` (``--help`` prints the bench's flags and exits, a bad flag
    exits 2, as any command's)."""
    parser.parse_args(args.rest, namespace=args)
    args.root_dir = args.root_dir.absolute()  # when given after NAME, as main makes it when before


def scale_parser() -> argparse.ArgumentParser:
    b = argparse.ArgumentParser(
        prog="eventsrc bench scale",
        parents=[root_parent()],
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
    b.add_argument(
        "--memory-manager",
        action="store_true",
        help="instead, the memory manager's cost: Guaranteed one-device pods' admission p50 with the Static policy "
        "beside None (two daemons side by side on a described 2-NUMA machine, sampled in turn, each admission "
        "removed again), at --pods resident pods; prints both and the ratio",
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
    return b


def watch_parser() -> argparse.ArgumentParser:
    b = argparse.ArgumentParser(
        prog="eventsrc bench watch",
        parents=[root_parent()],
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
    return b


def soak_parser() -> argparse.ArgumentParser:
    b = argparse.ArgumentParser(
        prog="eventsrc bench soak",
        parents=[root_parent()],
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
    return b


def nri_parser() -> argparse.ArgumentParser:
    b = argparse.ArgumentParser(
        prog="eventsrc bench nri",
        parents=[root_parent()],
        description="Starts four containerds of its own (Debian's containerd 2.1, runc and a busybox image, "
        "fetched once into the tests' cache, $EVENTSRC_CONTAINERD_CACHE; needs root and a cgroup v1 cpuset "
        "controller): one with no NRI plugin (the ceiling), one with a minimal NRI plugin (answers every call at "
        "once, records nothing: the protocol's floor), one with 'eventsrc serve --nri-mode observe', one with "
        "'eventsrc serve --nri-mode enforce' (static CPU policy, CPU 0 reserved). Then starts --pods pods of one "
        "container through CRI in each of five modes (no plugin, the minimal plugin, observe, enforce with "
        "BestEffort pods, enforce with Guaranteed pods of one whole CPU), in --rounds rounds with the modes in "
        "turn so that drift hits each alike; each pod is stopped and removed before the next. Then times 200 "
        "synced appends of a Guaranteed admission's events on the same filesystem. Prints RunPodSandbox, "
        "CreateContainer (p50, p90) and StartContainer times, the whole pod start (the three in turn), what each "
        "mode adds over no plugin, and each eventsrc mode's distance from the two references beside its goals: "
        "observe adds at most the minimal plugin's + 0.5 ms to CreateContainer's median, enforce at most the "
        "minimal plugin's + one synced append + 1 ms, and no mode's added p90 is over twice its added median. "
        "The defaults take about a minute.",
    )
    b.add_argument("--pods", type=int, default=30, help="pods per mode (default %(default)s)")
    b.add_argument("--rounds", type=int, default=5, help="rounds the pods are spread over (default %(default)s)")
    b.add_argument("--keep", action="store_true", help="keep the bench's directory (containerd's and eventsrc's logs)")
    return b


def fleet_parser() -> argparse.ArgumentParser:
    b = argparse.ArgumentParser(
        prog="eventsrc bench fleet",
        parents=[root_parent()],
        description="Starts a nats-server with JetStream and a PostgreSQL 15 of its own (Debian 12's, fetched once "
        "into the tests' caches, $EVENTSRC_NATS_CACHE and $EVENTSRC_POSTGRES_CACHE; PostgreSQL runs as 'nobody' "
        "under root) and 'eventsrc fleet sink'. --nodes simulated nodes (real eventsrc logs of --records records "
        "each, the daemon's shipper each, in this process; not daemons) ship their whole logs at once: records/s "
        "per node and through the sink. Then each node appends records at --rate a second (default: half of what "
        "the sink took, shared by the nodes) for --paced-seconds: lag from a record's publish to its commit in "
        "PostgreSQL, p50 and p99. Then an outage: the sink is stopped, each node ships --catch-up-records more, "
        "and the sink started again stores them: its catch-up rate. "
        "Beside them, measured in the same run: JetStream's own publish rate for the same "
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
    b.add_argument(
        "--catch-up-records",
        type=int,
        default=2000,
        help="records each node ships while the sink is stopped; the sink started again stores them: its "
        "catch-up rate (default %(default)s)",
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
    return b


@stopped_by_sigterm_too
def bench_watch(args: argparse.Namespace) -> int:
    parse(watch_parser(), args)
    from testbed.benches.watch import run_watch_bench

    at_least(("--records", args.records, 1), ("--watchers", args.watchers, 3), ("--samples", args.samples, 1))
    if args.slow_ms < 0:
        raise EventsrcError("--slow-ms must not be negative")
    run_watch_bench(
        records=args.records,
        watchers=args.watchers,
        samples=args.samples,
        slow_ms=args.slow_ms,
        workdir=workdir(args),
    )
    return 0


@stopped_by_sigterm_too
def bench_scale(args: argparse.Namespace) -> int:
    parse(scale_parser(), args)
    from testbed.benches.scale import run_scale_bench

    if args.ratios:
        return _scale_ratios(args)
    if args.memory_manager:
        return _scale_memory(args)
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
        workdir=workdir(args),
        keep=args.keep,
    )
    return 0


@stopped_by_sigterm_too
def bench_soak(args: argparse.Namespace) -> int:
    parse(soak_parser(), args)
    from testbed.benches.soak import SoakOptions, run_soak

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
    result = run_soak(options, workdir=workdir(args), keep=args.keep)
    if result.failures:
        print(f"eventsrc: soak failed: {'; '.join(result.failures)}", file=sys.stderr)
        return 1
    return 0


@stopped_by_sigterm_too
def bench_nri(args: argparse.Namespace) -> int:
    parse(nri_parser(), args)
    from testbed.benches.container_starts import run_nri_bench

    at_least(("--pods", args.pods, 1), ("--rounds", args.rounds, 1))
    if args.rounds > args.pods:
        raise EventsrcError(
            f"--rounds ({args.rounds}) must be at most --pods ({args.pods}): a round starts a pod at least"
        )
    run_nri_bench(pods=args.pods, rounds=args.rounds, keep=args.keep)
    return 0


@stopped_by_sigterm_too
def bench_fleet(args: argparse.Namespace) -> int:
    parse(fleet_parser(), args)
    from testbed.benches.fleet_timing import Options, run_fleet_bench

    at_least(
        ("--nodes", args.nodes, 1),
        ("--records", args.records, 10),
        ("--repeats", args.repeats, 1),
        ("--catch-up-records", args.catch_up_records, 10),
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
        catch_up=args.catch_up_records,
        scale_nodes=args.scale_nodes,
        records_nodes=args.scale_records_nodes,
        days=args.days,
        pods_per_day=args.pods_per_day,
        runs=args.runs,
        keep=args.keep,
    )
    run_fleet_bench(options, workdir=workdir(args))
    return 0


def _scale_memory(args: argparse.Namespace) -> int:
    from testbed.benches.scale import run_memory_bench

    pods = 1000 if args.pods is None else args.pods
    devices = max(10_000, pods + 1) if args.devices is None else args.devices
    if min(pods, args.samples) < 1:
        raise EventsrcError("--pods and --samples must be at least 1")
    if devices <= pods:
        raise EventsrcError(f"--devices ({devices}) must be more than --pods ({pods}): each pod holds a device")
    run_memory_bench(devices=devices, pods=pods, samples=args.samples, workdir=workdir(args), keep=args.keep)
    return 0


def _scale_ratios(args: argparse.Namespace) -> int:
    from testbed.benches.scale import run_ratio_bench

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
        workdir=workdir(args),
        keep=args.keep,
    )
    return 0
