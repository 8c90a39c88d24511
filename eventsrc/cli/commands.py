"""The commands behind ``eventsrc``. Each returns the process exit status."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from rich.console import Console

from eventsrc.errors import EventsrcError
from eventsrc.events import CorruptRecordError, FutureRecordError, ignorable
from eventsrc.layout import Layout
from eventsrc.log.store import DirLock, EventLog

if TYPE_CHECKING:
    from eventsrc.inputs.config import Configuration


def effective_config(args: argparse.Namespace) -> Configuration:
    """The configuration serve runs with: --config FILE, then the flags given, then the
    defaults; its values checked (short of the machine). Sets ``args.layout`` to its root."""
    from eventsrc.inputs import config

    cfg = config.load(args.config) if args.config is not None else config.Configuration()
    overrides: dict[str, Any] = {}
    for name, flag in config.FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"), None)
        if value is None or (name == "rootDir" and args.root_dir_from == "default"):
            continue  # --root-dir, else EVENTSRC_ROOT_DIR, else the file's rootDir, else the default
        if name in ("cpuManagerPolicyOptions", "topologyManagerPolicyOptions"):
            value = config.parse_map(value, flag)
        elif name == "featureGates":
            value = config.parse_feature_gates(value, flag)
        elif isinstance(value, Path):
            value = str(value.absolute())
        elif name == "metricsAddress" and value is True:  # the flag without a value
            from eventsrc.obs.metrics import DEFAULT_METRICS_ADDRESS

            value = DEFAULT_METRICS_ADDRESS
        overrides[name] = value
    cfg = config.merge(cfg, overrides)
    if not cfg.root_dir:
        cfg = config.merge(cfg, {"rootDir": str(args.root_dir)})
    config.check(cfg)
    args.layout = Layout(Path(cfg.root_dir))
    return cfg


def serve(args: argparse.Namespace) -> int:
    import trio

    from eventsrc.core.topology_manager import parse_topology_manager
    from eventsrc.inputs import config
    from eventsrc.inputs.cpu_config import load_cpu_config, load_topology
    from eventsrc.node.daemon import serve as run
    from eventsrc.obs import logger as logs

    cfg = effective_config(args)
    machine = load_topology(Path(cfg.topology_file) if cfg.topology_file else None, Path(cfg.sysfs_root))
    cpus = load_cpu_config(
        cfg.cpu_manager_policy,
        cfg.cpu_manager_policy_options,
        cfg.reserved_system_cpus,
        cfg.reserved_cpu_count,
        machine,
        feature_gates=cfg.feature_gates,
        topology_manager_policy=cfg.topology_manager_policy,
    )
    topology = parse_topology_manager(
        cfg.topology_manager_policy,
        cfg.topology_manager_scope,
        cfg.topology_manager_policy_options,
        machine.cpu_details.numa_nodes().sorted_list(),
    )
    logs.setup(cfg.log_level, cfg.log_format)
    trio.run(
        lambda: run(
            args.layout,
            snapshot_every=cfg.snapshot_every,
            admission_wait=cfg.admission_wait.seconds,
            grace=cfg.plugin_grace_period.seconds,
            cpus=cpus,
            topology=topology,
            config=config.recorded(cfg),
            metrics_address=cfg.metrics_address or None,  # "": no metrics server
        )
    )
    return 0


def config_print(args: argparse.Namespace) -> int:
    from eventsrc.inputs import config

    fields = config.to_builtins(effective_config(args))
    if args.output == "json":
        print(json.dumps(fields, indent=2, ensure_ascii=False))
    else:
        import yaml

        sys.stdout.write(yaml.safe_dump(fields, sort_keys=False, allow_unicode=True, default_flow_style=False))
    return 0


def status(args: argparse.Namespace) -> int:
    from eventsrc.cli.client import call, unary
    from eventsrc.gen.node.v1 import node_pb2

    layout: Layout = args.layout
    info: dict[str, Any] = {"root_dir": str(layout.root), "ready": False}
    reason = ""
    try:
        st = call(layout, unary("Status", node_pb2.StatusRequest()), timeout=10)
        info.update(
            ready=st.ready,
            pid=st.pid,
            version=st.version,
            instance_id=st.instance_id,
            last_seq=st.last_seq,
            sockets=list(st.sockets),
        )
        if not st.ready:
            reason = f"eventsrc (pid {st.pid}) on {layout.root} is not ready yet"
    except EventsrcError as err:
        pid = DirLock.holder(layout.lock) if layout.root.is_dir() else None
        reason = f"eventsrc (pid {pid}) holds {layout.root} but is not ready yet" if pid else str(err)
        info["pid"] = pid
    if args.output == "json":
        print(json.dumps({**info, "reason": reason}))
    elif not reason:
        print(
            f"eventsrc is running and ready on {layout.root} (pid {info['pid']}, version {info['version']}, last sequence {info['last_seq']})"
        )
    if reason:
        print(f"eventsrc: {reason}", file=sys.stderr)
        return 1
    return 0


def admit(args: argparse.Namespace) -> int:
    import uuid

    from eventsrc.api.node import pod_to_proto
    from eventsrc.cli import render
    from eventsrc.cli.client import call, unary
    from eventsrc.gen.node.v1 import node_pb2
    from eventsrc.inputs.claim_manifest import check_claims, parse_claims, pod_claims
    from eventsrc.inputs.manifest import ManifestError, parse_pod

    def read(path: Path) -> bytes:
        try:
            return sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
        except OSError as exc:
            raise ManifestError(f"{path}: {exc.strerror}") from None

    # The first file is the pod; the others are the ResourceClaims it uses.
    pod_data = read(args.files[0])
    spec = parse_pod(pod_data, str(args.files[0]))
    claims = [c for path in args.files[1:] for c in parse_claims(read(path), str(path))]
    refs = pod_claims(pod_data, str(args.files[0]))
    claim_protos = []
    if refs or claims:
        bound = check_claims(spec.pod.uid, spec.pod.namespace, spec.pod.name, refs, claims)
        uid_of = {b.pod_claim.name: b.claim.uid for b in bound}
        containers = [
            msgspec.structs.replace(c, claims=[uid_of[n] for n in c.claims if n in uid_of]) for c in spec.containers
        ]
        spec = msgspec.structs.replace(spec, containers=containers)
        for b in bound:
            c = b.claim
            claim_protos.append(
                node_pb2.ResourceClaim(
                    uid=c.uid,
                    namespace=c.namespace,
                    name=c.name,
                    results=[
                        node_pb2.ClaimResult(request=r.request, driver=r.driver, pool=r.pool, device=r.device)
                        for r in c.results
                    ],
                    reserved_for=[
                        node_pb2.ClaimConsumer(resource=p.resource, name=p.name, uid=p.uid) for p in c.reserved_for
                    ],
                )
            )
    generated = not spec.pod.uid
    if generated:
        spec = msgspec.structs.replace(spec, pod=msgspec.structs.replace(spec.pod, uid=str(uuid.uuid4())))
        print(f"eventsrc: generated uid {spec.pod.uid} for {spec.pod.namespace}/{spec.pod.name}", file=sys.stderr)
    info = call(args.layout, unary("Admit", node_pb2.AdmitRequest(pod=pod_to_proto(spec), claims=claim_protos)))
    render.print_pod(info, args.output)
    return 0


def remove(args: argparse.Namespace) -> int:
    from eventsrc.cli import render
    from eventsrc.cli.client import call, unary
    from eventsrc.gen.node.v1 import node_pb2

    sel = node_pb2.PodSelector()
    if "/" in args.pod:
        sel.namespace, sel.name = args.pod.split("/", 1)
    else:
        sel.uid = args.pod
    info = call(args.layout, unary("Remove", node_pb2.RemoveRequest(pod=sel)))
    render.print_pod(info, args.output)
    return 0


def pods(args: argparse.Namespace) -> int:
    from eventsrc.cli import render
    from eventsrc.cli.client import call, unary
    from eventsrc.gen.node.v1 import node_pb2

    resp = call(args.layout, unary("ListPods", node_pb2.ListPodsRequest()))
    render.print_pods(list(resp.pods), args.output)
    return 0


def sample_plugin(args: argparse.Namespace) -> int:
    from eventsrc.core.devices.names import is_extended_resource_name
    from eventsrc.samples.device_plugin import main as run

    if not is_extended_resource_name(args.resource):
        raise EventsrcError(f"--resource {args.resource!r} is not an extended resource name (like example.com/dev)")
    if args.devices < 0 or args.numa_nodes < 0:
        raise EventsrcError("--devices and --numa-nodes must not be negative")
    return run(args)


def sample_dra_driver(args: argparse.Namespace) -> int:
    import re

    from eventsrc.samples.dra_driver import main as run

    # A driver name is a DNS subdomain (it names directories and sockets too).
    if len(args.driver) > 253 or not re.fullmatch(
        r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", args.driver
    ):
        raise EventsrcError(f"--driver {args.driver!r} is not a DNS subdomain (like gpu.example.com)")
    if args.devices_per_claim < 0:
        raise EventsrcError("--devices-per-claim must not be negative")
    return run(args)


def _open_reader(layout: Layout) -> EventLog:
    return EventLog(layout.require_log(), readonly=True)


def log(args: argparse.Namespace) -> int:
    from eventsrc.cli import render

    event_log = _open_reader(args.layout)
    corrupt: list[CorruptRecordError] = []
    as_json = args.output == "json"
    out = sys.stdout

    def show(item: Any) -> None:
        if isinstance(item, CorruptRecordError) and not ignorable(item):
            corrupt.append(item)
            print(f"eventsrc: error: {item}", file=sys.stderr)
        if as_json:
            out.write(json.dumps(render.record_json(item)) + "\n")
        else:
            out.write(render.record_line(item) + "\n")

    if not as_json:
        out.write(render.RECORD_HEADER + "\n")
    if args.follow:
        import trio

        from eventsrc.log.commit import follow

        async def tail() -> None:
            async for item in follow(event_log, args.from_seq):
                show(item)
                out.flush()

        with contextlib.suppress(KeyboardInterrupt):
            trio.run(tail)
    else:
        for item in event_log.records(args.from_seq, args.until_seq):
            show(item)
    out.flush()
    newer = [str(c.seq) for c in corrupt if isinstance(c, FutureRecordError)]
    bad = [str(c.seq) for c in corrupt if not isinstance(c, FutureRecordError)]
    if newer:
        print(
            f"eventsrc: error: record(s) {', '.join(newer)} were written by a newer eventsrc (shown raw; docs/adr/0010)",
            file=sys.stderr,
        )
    if bad:
        print(
            f"eventsrc: error: corrupt record(s) at sequence {', '.join(bad)}; every other record was printed",
            file=sys.stderr,
        )
    return 1 if corrupt else 0


def export(args: argparse.Namespace) -> int:
    if args.from_seq < 1:
        raise EventsrcError("--from must be at least 1")
    args.output = "json"
    return log(args)


def state(args: argparse.Namespace) -> int:
    from eventsrc.cli import render
    from eventsrc.log.snapshots import load_views

    event_log = _open_reader(args.layout)
    snapdir = args.layout.snapshots if args.use_snapshot else None
    with _progress("replaying", event_log.last_seq()) as advance:
        views, _info = load_views(event_log, snapdir, until_seq=args.until_seq, progress=advance)
    if args.output == "json":
        sys.stdout.write(msgspec.json.encode(views).decode() + "\n")
    else:
        console = render.console()
        for table in render.views_tables(views):
            console.print(table)
    if views.meta.corrupt:
        seqs = ", ".join(str(s) for s in sorted(views.meta.corrupt))
        print(
            f"eventsrc: error: corrupt record(s) at sequence {seqs}; the views hold every other record", file=sys.stderr
        )
        return 1
    return 0


@contextlib.contextmanager
def _progress(what: str, total: int) -> Iterator[Callable[[int], None] | None]:
    """A progress bar on stderr for long work, when a person is watching."""
    if total < 200_000 or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import Progress

    with Progress(transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task(what, total=total)
        yield lambda seq: bar.update(task, completed=seq)


def bench_log(args: argparse.Namespace) -> int:
    from eventsrc.bench import log as bench

    if args.events < 1 or args.writers < 1 or args.rounds < 1:
        raise EventsrcError("--events, --writers and --rounds must be at least 1")
    root = args.root_dir if "--root-dir" in " ".join(sys.argv) else None
    bench.run_log_bench(
        events=args.events,
        writers=args.writers,
        seconds=args.seconds,
        rounds=args.rounds,
        snapshot_every=args.snapshot_every,
        workdir=root,
    )
    return 0


def bench_devices(args: argparse.Namespace) -> int:
    from eventsrc.bench.devices import run_devices_bench

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


def cpu_topology(args: argparse.Namespace) -> int:
    from pathlib import Path

    from eventsrc.core.cpu.topology import decode_topology_file, encode_topology_file, summary_lines
    from eventsrc.inputs.sysfs_topology import discover_topology

    if args.topology_file is not None:
        name = str(args.topology_file)
        try:
            data = sys.stdin.buffer.read() if name == "-" else args.topology_file.read_bytes()
        except OSError as exc:
            raise EventsrcError(f"cannot read {name}: {exc.strerror or exc}") from None
        topo = decode_topology_file(data, name)
    else:
        topo = discover_topology(args.sysfs_root if args.sysfs_root is not None else Path("/"))
    if args.output == "json":
        sys.stdout.buffer.write(encode_topology_file(topo))
    else:
        print("\n".join(summary_lines(topo)))
    return 0


def cpu_take(args: argparse.Namespace) -> int:
    from eventsrc.core.cpu.assignment import (
        check_smt_alignment,
        parse_policy_options,
        take_by_topology,
    )
    from eventsrc.core.cpu.cpuset import parse as parse_cpuset
    from eventsrc.core.cpu.topology import TopologyError, decode_topology_file

    def bad(message: str) -> EventsrcError:
        err = EventsrcError(message)
        err.exit_code = 2
        return err

    name = str(args.topology_file)
    try:
        data = sys.stdin.buffer.read() if name == "-" else args.topology_file.read_bytes()
    except OSError as exc:
        raise bad(f"cannot read {name}: {exc.strerror or exc}") from None
    try:
        topo = decode_topology_file(data, name)
    except TopologyError as exc:
        raise bad(str(exc)) from None
    available = parse_cpuset(args.available)  # CPUSetParseError exits 2
    unknown = available - topo.cpu_details.cpus()
    if unknown:
        raise bad(f"--available: CPUs {unknown} are not in the topology")
    if args.count < 0:
        raise bad("--count must not be negative")
    options: dict[str, str] = {}
    for item in args.option:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise bad(f"--option {item!r}: expected NAME=VALUE")
        options[key] = value
    opts = parse_policy_options(options, alpha_enabled=True)  # PolicyOptionError exits 2
    if opts.full_pcpus_only and args.count > 0:
        check_smt_alignment(args.count, topo.cpus_per_core(), len(available))
    print(take_by_topology(topo, available, args.count, opts))
    return 0


def bench_cpu(args: argparse.Namespace) -> int:
    from eventsrc.bench.cpu import run_cpu_bench

    if args.repetitions < 1:
        raise EventsrcError("--repetitions must be at least 1")
    run_cpu_bench(repetitions=args.repetitions)
    return 0


def claims(args: argparse.Namespace) -> int:
    from eventsrc.cli import render
    from eventsrc.log.snapshots import load_views

    views, _ = load_views(_open_reader(args.layout), args.layout.snapshots)
    if args.output == "json":
        sys.stdout.write(msgspec.json.encode(views.claims).decode() + "\n")
        return 0
    from rich.table import Table

    table = Table(title=f"claims ({len(views.claims.claims)})", title_justify="left")
    for col in ("claim", "uid", "driver", "state", "pods", "cdi devices", "error"):
        table.add_column(col)
    for uid, c in sorted(views.claims.claims.items()):
        cdi = " ".join(i for d in c.devices for i in d.cdi_device_ids)
        table.add_row(
            f"{c.namespace}/{c.name}", uid, c.driver, c.state, ",".join(c.pods) or "-", cdi or "-", c.error or "-"
        )
    render.console().print(table)
    return 0


def replay(args: argparse.Namespace) -> int:
    from eventsrc.offline.replay import run

    if args.path is None:
        args.path = args.layout.root
    return run(args)


def import_kubelet(args: argparse.Namespace) -> int:
    import time
    import uuid

    from eventsrc.cli import render
    from eventsrc.errors import AlreadyRunningError
    from eventsrc.events import Record
    from eventsrc.log.snapshots import load_views
    from eventsrc.offline import kubelet_import as ki

    if args.device_checkpoint is None and args.cpu_state is None and args.dra_state is None:
        raise EventsrcError("nothing to import: give --device-checkpoint, --cpu-state and/or --dra-state")
    try:  # every checksum is verified before anything is written
        device = ki.read_device_checkpoint(args.device_checkpoint) if args.device_checkpoint else None
        cpu = ki.read_cpu_state(args.cpu_state) if args.cpu_state else None
        dra = ki.read_dra_state(args.dra_state) if args.dra_state else None
        events = ki.events_from(device, cpu, dra)  # also refuses what cannot be imported, before any write
    except ki.CheckpointError as err:
        raise ki.CheckpointError(f"{err}; nothing was imported") from None
    warnings = []
    if cpu is not None and not cpu.verified:
        warnings.append(f"{cpu.source}: checksum 0, accepted unverified (as the kubelet does)")
    layout: Layout = args.layout
    records: list[Record] = []
    cid = uuid.uuid4().hex
    if not args.dry_run:
        layout.create()
        lock = DirLock(layout.lock)
        try:
            lock.acquire()
        except AlreadyRunningError:
            pid = DirLock.holder(layout.lock)
            raise EventsrcError(
                f"eventsrc (pid {pid}) is running on {layout.root}: stop it before importing kubelet checkpoints; "
                "nothing was imported"
            ) from None
        try:
            with EventLog(layout.log) as event_log:
                views, _ = load_views(event_log, layout.snapshots)
                live = [u for u, p in views.pods.pods.items() if p.state in ("admitted", "admitting")]
                if live and not args.force:
                    raise EventsrcError(
                        f"the log under {layout.root} already has {len(live)} pod(s); importing would duplicate "
                        "or contradict them (use --force to import anyway); nothing was imported"
                    )
                if views.cpus.policy:  # the policy the import replaces, as PolicyConfigurationChanged.old
                    events = ki.events_from(device, cpu, dra, old_cpu_policy=views.cpus.policy)
                records = event_log.append(events, cid, time.time_ns())
        finally:
            lock.release()
    summary = ki.summarize(events)
    sources = [str(s.source) for s in (device, cpu, dra) if s is not None]
    if args.output == "json":
        out: dict[str, Any] = {
            "dry_run": args.dry_run,
            "root_dir": str(layout.root),
            "files": sources,
            "correlation_id": "" if args.dry_run else cid,
            "first_seq": records[0].seq if records else 0,
            "last_seq": records[-1].seq if records else 0,
            "summary": msgspec.to_builtins(summary),
            "warnings": warnings,
        }
        if args.dry_run:
            out["events"] = [{"type": type(e).__name__, "event": msgspec.to_builtins(e)} for e in events]
        print(json.dumps(out))
    else:
        for w in warnings:
            print(f"eventsrc: warning: {w}", file=sys.stderr)
        if args.dry_run:
            print(f"{'TYPE':<26}  EVENT")
            for e in events:
                print(f"{type(e).__name__:<26}  {render.record_summary(Record(0, 0, '', e.VERSION, e))}")  # type: ignore[arg-type]
        s = summary
        verb = "would import" if args.dry_run else f"imported into {layout.root}"
        print(
            f"{verb}: {s.pods} pods ({s.containers} containers), {s.resources} device resources with "
            f"{s.devices} healthy devices, {s.device_allocations} device allocations, {s.cpu_assignments} CPU "
            f"assignments (policy {s.cpu_policy or '-'}), {s.claims} claims; {s.events} events"
            + (f" (sequences {records[0].seq}-{records[-1].seq}, correlation id {cid})" if records else "")
        )
    return 0


def audit(args: argparse.Namespace) -> int:
    from eventsrc.offline import audit as queries

    # audit verify (the hash chain) is its own command; device, pod and claim are queries.
    return queries.run(args, _open_reader(args.layout))


def bench_audit(args: argparse.Namespace) -> int:
    from eventsrc.bench.audit import run_audit_bench

    if args.events < 1000 or args.runs < 1:
        raise EventsrcError("--events must be at least 1000 and --runs at least 1")
    root = args.root_dir if "--root-dir" in " ".join(sys.argv) else None
    run_audit_bench(events=args.events, runs=args.runs, workdir=root)
    return 0


def audit_verify(args: argparse.Namespace) -> int:
    from eventsrc.log.verify import verify

    checked, findings = verify(EventLog(args.layout.require_log(), readonly=True))
    if args.output == "json":
        print(json.dumps({"checked": checked, "findings": [f.__dict__ for f in findings]}))
    else:
        for f in findings:
            print(f"{f.seq:>8}  {f.what:<10} {f.message}")
        if not findings:
            print(f"{checked} records checked: the chain holds")
    if findings:
        print(f"eventsrc: error: {findings[0].message}", file=sys.stderr)
        return 1
    return 0


def backup(args: argparse.Namespace) -> int:
    from eventsrc.log.backup import backup as copy

    info = copy(args.layout, args.dest.absolute())
    if args.output == "json":
        print(
            json.dumps(
                {
                    "dest": str(info.dest),
                    "last_seq": info.last_seq,
                    "log_bytes": info.log_bytes,
                    "snapshots": [str(p) for p in info.snapshots],
                }
            )
        )
    else:
        print(
            f"backed up the log up to sequence {info.last_seq} ({info.log_bytes} bytes) and {len(info.snapshots)} "
            f"snapshot(s) to {info.dest}; read it with: eventsrc --root-dir {info.dest} log"
        )
    return 0
