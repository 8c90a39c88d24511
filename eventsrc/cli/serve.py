"""``eventsrc serve`` (the daemon) and ``eventsrc config print`` (the configuration it would run
with): the configuration flags, and how the file, the flags and the defaults make one
configuration."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eventsrc.cli.options import Parents, Subparsers
from eventsrc.layout import BESIDE_ROOT, DEFAULT_ROOT, Layout

if TYPE_CHECKING:
    from eventsrc.errors import EventsrcError
    from eventsrc.inputs.config import Configuration
    from eventsrc.node.shipper import FleetOptions


def add_parser(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "serve",
        parents=[parents.root, parents.logging],
        help="run the daemon",
        description="Run the daemon under --root-dir until SIGTERM or SIGINT. It rebuilds its "
        "views from the log (newest snapshot plus the tail), records that it started, and "
        "on a signal records that it stopped and writes a snapshot. Its configuration comes from "
        "--config FILE, then the flags given here (a flag overrides the file), then the defaults; "
        "'eventsrc config print' shows the result.",
    )
    serve_flags(p)
    p.set_defaults(func=serve)

    p = sub.add_parser(
        "config",
        parents=[parents.root],
        help="the daemon's configuration (no daemon needed)",
        description="The daemon's configuration, as 'eventsrc serve' would take it.",
    )
    csub = p.add_subparsers(dest="config_command", metavar="WHAT", required=True)
    c = csub.add_parser(
        "print",
        parents=[parents.root, parents.logging],
        help="print the effective configuration: file, flags, defaults",
        description="Print the configuration 'eventsrc serve' would run with, given the same --config FILE "
        "and flags: every field, by its name in the file (a flag overrides the file; the rest are the "
        "defaults). The output is a valid configuration file. Checks the values as serve does, short of "
        "the machine's topology; starts nothing.",
    )
    serve_flags(c)
    c.add_argument(
        "-o", "--output", choices=["yaml", "json"], default="yaml", help="output format (default %(default)s)"
    )
    c.set_defaults(func=config_print)


def _duration(text: str) -> Any:
    from eventsrc.inputs.config import parse_seconds_or_duration

    try:
        return parse_seconds_or_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def serve_flags(p: argparse.ArgumentParser) -> None:
    """The daemon's configuration flags (serve, config print). Every default is None: a flag
    overrides the config file only when given; the defaults are eventsrc.inputs.config's."""
    _daemon_flags(p)
    cpu = _cpu_manager_flags(p)
    _topology_manager_flags(p)
    _allocatable_flags(p)
    _nri_flags(p)
    _fleet_flags(p)
    _retention_flags(p)
    _beside_flags(p)
    cpu.add_argument(
        "--feature-gates",
        default=None,
        metavar="K=V,...",
        help="CPUManagerPolicyAlphaOptions=true enables the alpha policy options "
        "(align-by-socket, distribute-cpus-across-cores)",
    )


def _daemon_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="the configuration file (YAML, or TOML when FILE ends in .toml); see examples/eventsrc-config.yaml",
    )
    p.add_argument(
        "--snapshot-every", type=int, default=None, metavar="N", help="write a snapshot every N records (default 10000)"
    )
    p.add_argument(
        "--admission-wait",
        type=_duration,
        default=None,
        metavar="SECONDS|DURATION",
        help="how long an admission waits for a known plugin that has not registered (again) yet (default 30s)",
    )
    p.add_argument(
        "--observations-wait",
        type=_duration,
        default=None,
        metavar="SECONDS|DURATION",
        help="how long what eventsrc observes (the runtime's news, the kubelet's decisions) may wait in memory "
        "to be written with others, when no decision takes it along sooner; what a power loss can take back "
        "(default 100ms, at most 1s; 0 writes each at once, still after its answer; docs/adr/0042)",
    )
    p.add_argument(
        "--watch-stall-timeout",
        type=_duration,
        default=None,
        metavar="SECONDS|DURATION",
        help="end a node API Watch stream whose client has read nothing for this long with its stream's window "
        "full (RESOURCE_EXHAUSTED, saying the seq to watch again from; default 30s)",
    )
    p.add_argument(
        "--plugin-grace",
        type=_duration,
        default=None,
        metavar="SECONDS|DURATION",
        help="how long a resource is kept after its plugin went away, before it is dropped (default 5m)",
    )
    p.add_argument(
        "--metrics-address",
        nargs="?",
        const=True,
        default=None,
        metavar="HOST:PORT",
        help="serve /metrics, /healthz and /readyz over HTTP there (127.0.0.1:10266 when given without a value; "
        "port 0 picks one; default: no server)",
    )
    p.add_argument(
        "--accept-empty-log",
        action="store_const",
        const=True,
        default=None,
        help="start a new, empty history although the log is missing or empty next to snapshots or the lock "
        "file of an older one (without it, serve refuses, exit 4); the start records what was lost",
    )


def _size(text: str) -> Any:
    from eventsrc.inputs.config import ByteSize

    try:
        return ByteSize.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _retention_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "log retention (docs/adr/0018; default: keep every record)",
        "Records older than a cut leave the live log in whole pieces of --snapshot-every records; the views "
        "never change because of it. Unless --no-log-retention-archive, they are first written to sealed "
        "archive segments under ROOT/eventsrc/archive, which 'audit', 'replay', 'export' and 'audit verify' read.",
    )
    g.add_argument(
        "--log-retention-max-age",
        type=_duration,
        default=None,
        metavar="DURATION",
        help='cut pieces whose records are all older than this (a Go duration, e.g. "720h"; default 0: no limit)',
    )
    g.add_argument(
        "--log-retention-max-size",
        type=_size,
        default=None,
        metavar="SIZE",
        help='cut the oldest pieces while the live records take more than SIZE bytes ("512Mi", "2G"; default 0: '
        "no limit); the live log stays under SIZE plus one piece",
    )
    g.add_argument(
        "--log-retention-archive",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write what a cut takes out to sealed archive segments first (default: yes); with "
        "--no-log-retention-archive it is gone",
    )


def _beside_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("beside a kubelet (docs/kubelet-node.md)")
    g.add_argument(
        "--beside-kubelet",
        nargs="?",
        const=Path("/var/lib/kubelet"),
        type=Path,
        default=None,
        metavar="DIR",
        help="record what the kubelet running with DIR (default /var/lib/kubelet) decides, from its PodResources "
        "socket and checkpoint files, and decide nothing: no plugin or PodResources socket is served, nothing "
        "under DIR is written; the node API is read-only; --root-dir defaults to /var/lib/eventsrc and may not "
        "be inside DIR; with --nri-socket, NRI observes only",
    )
    g.add_argument(
        "--beside-kubelet-resync",
        type=_duration,
        default=None,
        metavar="SECONDS|DURATION",
        help="beside a kubelet: look at all of it this often besides on each runtime event and checkpoint file "
        "change (default 60s)",
    )


def _fleet_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "the fleet (docs/fleet.md; default: off)",
        "Every record of the log, in sequence order, to a NATS JetStream stream, from where the stream says "
        "it has them; nothing on the admission path waits for it.",
    )
    g.add_argument("--fleet-nats", default=None, metavar="URL,...", help="NATS servers to ship to (nats://host:port)")
    g.add_argument(
        "--fleet-stream",
        default=None,
        metavar="NAME",
        help="the JetStream stream (default EVENTSRC; created if missing)",
    )
    g.add_argument(
        "--fleet-replicas",
        default=None,
        type=int,
        metavar="N",
        help="the stream's replicas when this node creates it: 3 in a three-server JetStream cluster "
        "(default 1; an existing stream keeps its own)",
    )
    g.add_argument(
        "--node-name",
        default=None,
        metavar="NAME",
        help="this node's name in the fleet, a Kubernetes node name (default: the host name; an empty name is refused)",
    )
    g.add_argument(
        "--fleet-nats-user",
        default=None,
        metavar="NAME",
        help="the NATS user this node connects as (default with a password file: the node's name)",
    )
    g.add_argument(
        "--fleet-nats-password-file",
        default=None,
        type=Path,
        metavar="FILE",
        help="the file holding the NATS user's password (docs/fleet.md, 'NATS permissions'; default: no credentials)",
    )


def _nri_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("container runtime (NRI; docs/nri.md)")
    g.add_argument(
        "--nri-socket",
        type=Path,
        default=None,
        metavar="PATH",
        help="connect to the runtime's NRI socket as plugin 'eventsrc' (usually /var/run/nri/nri.sock; default: none), "
        "and connect again whenever the runtime restarts",
    )
    g.add_argument(
        "--nri-plugin-index",
        default=None,
        metavar="NN",
        help="the plugin's two-digit index: the runtime calls plugins in ascending index order (default 10)",
    )
    g.add_argument(
        "--nri-mode",
        choices=["enforce", "observe"],
        default=None,
        help="enforce (default): containers get the CPUs and devices eventsrc decided, pods the runtime creates "
        "are admitted; observe: record what the runtime applied, change nothing",
    )
    g.add_argument(
        "--nri-annotation-namespaces",
        default=None,
        metavar="NS,...",
        help="namespaces whose pods may ask for devices with the eventsrc.dev/resources annotation (default: "
        "none); anywhere else the annotation fails the container's creation: a pod's author writes it, outside "
        "the scheduler's and ResourceQuota's count",
    )
    g.add_argument(
        "--container-runtime-endpoint",
        default=None,
        metavar="unix:///PATH",
        help="the runtime's CRI socket, listed to see sandboxes removed without an NRI event (containerd sends "
        "none for those it recovered at a restart); default: the kubelet's for the runtime NRI names "
        "(unix:///run/containerd/containerd.sock, unix:///var/run/crio/crio.sock)",
    )


def _cpu_manager_flags(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    cpu = p.add_argument_group("CPU manager (the kubelet's flags)")
    cpu.add_argument("--cpu-manager-policy", choices=["none", "static"], default=None, help="none (default) or static")
    cpu.add_argument(
        "--cpu-manager-policy-options",
        default=None,
        metavar="K=V,...",
        help="static policy options, e.g. full-pcpus-only=true,distribute-cpus-across-numa=true",
    )
    cpu.add_argument(
        "--reserved-cpus",
        default=None,
        metavar="CPUSET",
        help="CPUs reserved for the system, in list form (e.g. 0-1,32-33)",
    )
    cpu.add_argument(
        "--reserved-cpu-count",
        type=int,
        default=None,
        metavar="N",
        help="reserve N CPUs, chosen as the kubelet chooses them (kube-reserved + system-reserved cpu), "
        "when --reserved-cpus is not given",
    )
    cpu.add_argument(
        "--topology-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="read the CPU topology from FILE (JSON, as 'eventsrc cpu topology -o json' prints it) instead of sysfs",
    )
    cpu.add_argument(
        "--sysfs-root",
        type=Path,
        default=None,
        metavar="DIR",
        help="root of the sysfs tree to discover the CPU topology from (default /)",
    )
    return cpu


def _topology_manager_flags(p: argparse.ArgumentParser) -> None:
    tm = p.add_argument_group("topology manager (the kubelet's flags)")
    tm.add_argument(
        "--topology-manager-policy",
        default=None,
        metavar="POLICY",
        help="none (default), best-effort, restricted or single-numa-node",
    )
    tm.add_argument("--topology-manager-scope", default=None, metavar="SCOPE", help="container (default) or pod")
    tm.add_argument(
        "--topology-manager-policy-options",
        default=None,
        metavar="K=V,...",
        help="prefer-closest-numa-nodes=true, max-allowable-numa-nodes=N",
    )


def _allocatable_flags(p: argparse.ArgumentParser) -> None:
    node = p.add_argument_group(
        "node allocatable (the kubelet's flags): a pod whose requests do not fit what is left is refused, "
        "OutOfcpu, OutOfmemory, ..."
    )
    node.add_argument(
        "--system-reserved",
        default=None,
        metavar="R=Q,...",
        help="kept back for the system, e.g. cpu=500m,memory=1Gi,ephemeral-storage=1Gi (default none)",
    )
    node.add_argument(
        "--kube-reserved", default=None, metavar="R=Q,...", help="kept back for Kubernetes, as --system-reserved"
    )
    node.add_argument(
        "--eviction-hard",
        default=None,
        metavar="SIGNAL<Q,...",
        help="hard eviction thresholds, also kept back: memory.available (from memory) and nodefs.available "
        "(from ephemeral-storage, a quantity or a percentage); default memory.available<100Mi,nodefs.available<10%%",
    )
    node.add_argument(
        "--max-pods", type=int, default=None, metavar="N", help="pods the node runs at most (default 110)"
    )
    mem = p.add_argument_group("memory manager (the kubelet's flags)")
    mem.add_argument(
        "--memory-manager-policy",
        choices=["None", "Static"],
        default=None,
        help="None (default) or Static: Guaranteed pods' memory and hugepages on NUMA nodes, aligned by the "
        "topology manager with their CPUs and devices",
    )
    mem.add_argument(
        "--reserved-memory",
        action="append",
        default=None,
        metavar="N:memory=Q[,hugepages-2Mi=Q][;...]",
        help="memory kept back per NUMA node, e.g. 0:memory=1Gi (repeatable); with Static, its memory must add "
        "up to --kube-reserved + --system-reserved + the memory.available eviction threshold, as the kubelet checks",
    )


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
        if name in ("cpuManagerPolicyOptions", "topologyManagerPolicyOptions", "systemReserved", "kubeReserved"):
            value = config.parse_map(value, flag)
        elif name == "evictionHard":
            value = config.parse_thresholds(value, flag)
        elif name == "reservedMemory":
            value = config.parse_reserved_memory(value)
        elif name == "featureGates":
            value = config.parse_feature_gates(value, flag)
        elif name in ("nriAnnotationNamespaces", "fleet.nats"):
            value = config.parse_list(value)
        elif isinstance(value, Path):
            value = str(value.absolute())
        elif name == "metricsAddress" and value is True:  # the flag without a value
            from eventsrc.obs.metrics import DEFAULT_METRICS_ADDRESS

            value = DEFAULT_METRICS_ADDRESS
        overrides[name] = value
    cfg = config.merge(cfg, overrides)
    given = "nriMode" in overrides or (args.config is not None and "nriMode" in config.fields_set(args.config))
    if cfg.beside_kubelet and not given:
        cfg = config.merge(cfg, {"nriMode": "observe"})  # the kubelet decides: NRI only observes
    if not cfg.root_dir:
        if args.root_dir_from == "default":  # not the readers' fallback: a daemon's root is chosen by its mode
            root = BESIDE_ROOT if cfg.beside_kubelet else DEFAULT_ROOT
        else:
            root = args.root_dir
        cfg = config.merge(cfg, {"rootDir": str(root)})
    config.check(cfg)
    args.layout = Layout(Path(cfg.root_dir))
    return cfg


def serve(args: argparse.Namespace) -> int:
    import trio

    from eventsrc.core.cpu.cpuset import CPUSet
    from eventsrc.core.retention_policy import Retention
    from eventsrc.core.topology_manager import parse_topology_manager
    from eventsrc.inputs import config
    from eventsrc.inputs.cpu_config import load_cpu_config, load_memory_config, load_memory_machine, load_topology
    from eventsrc.inputs.node_allocatable import (
        filesystem_bytes,
        load_allocatable,
        memory_capacity,
        reserved_cpu_count,
    )
    from eventsrc.node.beside import BesideOptions
    from eventsrc.node.daemon import serve as run
    from eventsrc.node.nri import NRIOptions
    from eventsrc.obs import logger as logs

    cfg = effective_config(args)
    machine = load_topology(Path(cfg.topology_file) if cfg.topology_file else None, Path(cfg.sysfs_root))
    cpus = load_cpu_config(
        cfg.cpu_manager_policy,
        cfg.cpu_manager_policy_options,
        cfg.reserved_system_cpus,
        cfg.reserved_cpu_count or reserved_cpu_count(cfg.system_reserved, cfg.kube_reserved),
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
    memory_machine = load_memory_machine(
        Path(cfg.topology_file) if cfg.topology_file else None,
        Path(cfg.sysfs_root),
        required=cfg.memory_manager_policy == "Static" and not cfg.beside_kubelet,
    )
    node = load_allocatable(
        topology=machine,
        reserved_cpus=CPUSet.parse(cfg.reserved_system_cpus) if cfg.reserved_system_cpus else CPUSet(),
        reserved_cpu_count=cfg.reserved_cpu_count,
        system_reserved=cfg.system_reserved,
        kube_reserved=cfg.kube_reserved,
        eviction_hard=cfg.eviction_hard,
        max_pods=cfg.max_pods,
        memory=memory_capacity(memory_machine) if memory_machine is not None else None,
        storage=filesystem_bytes(args.layout.root) if not cfg.beside_kubelet else None,
    )
    memory = load_memory_config(cfg.memory_manager_policy, memory_machine, cfg.reserved_memory, node.reserved_memory)
    logs.setup(cfg.log_level, cfg.log_format)
    try:
        trio.run(
            lambda: run(
                args.layout,
                snapshot_every=cfg.snapshot_every,
                admission_wait=cfg.admission_wait.seconds,
                watch_stall=cfg.watch_stall_timeout.seconds,
                observations_wait=cfg.observations_wait.seconds,
                grace=cfg.plugin_grace_period.seconds,
                cpus=cpus,
                topology=topology,
                config=config.recorded(cfg),
                metrics_address=cfg.metrics_address or None,  # "": no metrics server
                accept_empty_log=cfg.accept_empty_log,
                nri=NRIOptions(
                    Path(cfg.nri_socket),
                    cfg.nri_plugin_index,
                    cfg.nri_mode,
                    annotation_namespaces=frozenset(cfg.nri_annotation_namespaces),
                    runtime_endpoint=cfg.container_runtime_endpoint,
                )
                if cfg.nri_socket
                else None,
                retention=Retention(
                    max_age_ns=cfg.log_retention.max_age.ns,
                    max_size=cfg.log_retention.max_size.n,
                    archive=cfg.log_retention.archive,
                ),
                beside=BesideOptions(
                    Path(cfg.beside_kubelet), cfg.beside_kubelet_resync.seconds, runtime=bool(cfg.nri_socket)
                )
                if cfg.beside_kubelet
                else None,
                fleet=_fleet(cfg),
                allocatable=node.allocatable,
                memory=memory,
            )
        )
    except BaseExceptionGroup as group:
        if (worded := worded_error(group)) is None:
            raise
        raise worded from None
    return 0


def worded_error(group: BaseExceptionGroup[BaseException]) -> EventsrcError | None:
    """The one line a daemon that stopped on errors says: the log failing under the views
    (``ViewsAheadError``), else the first error, when every error is one eventsrc words (a log
    that refuses the start's first append); None when any is not (a bug: its traceback)."""
    from eventsrc.errors import EventsrcError
    from eventsrc.log.commit import ViewsAheadError

    stopped: BaseExceptionGroup[EventsrcError] | None = group.subgroup(ViewsAheadError)
    if stopped is None:
        stopped, rest = group.split(EventsrcError)
        if stopped is None or rest is not None:
            return None
    return _first(stopped)


def _first(group: BaseExceptionGroup[EventsrcError]) -> EventsrcError:
    inner = group.exceptions[0]
    return _first(inner) if isinstance(inner, BaseExceptionGroup) else inner


def _fleet(cfg: Configuration) -> FleetOptions | None:
    """Shipping to the fleet, when servers are given: the node named by the host name unless
    the configuration names it."""
    import socket

    from eventsrc.core.fleet_names import node_name_error
    from eventsrc.errors import EventsrcError
    from eventsrc.node.shipper import FleetOptions
    from eventsrc.rpc.jetstream import NatsAuth

    if not cfg.fleet.nats:
        return None
    name = cfg.fleet.node_name or socket.gethostname().lower()
    if why := node_name_error(name):
        raise EventsrcError(f"--node-name is needed: the host name is no node name ({why})")
    auth = NatsAuth.read(cfg.fleet.user or name, Path(cfg.fleet.password_file)) if cfg.fleet.password_file else None
    return FleetOptions(tuple(cfg.fleet.nats), name, cfg.fleet.stream, replicas=cfg.fleet.replicas, auth=auth)


def config_print(args: argparse.Namespace) -> int:
    from eventsrc.inputs import config

    fields = config.as_file(effective_config(args))
    if args.output == "json":
        print(json.dumps(fields, indent=2, ensure_ascii=False))
    else:
        import yaml

        sys.stdout.write(yaml.safe_dump(fields, sort_keys=False, allow_unicode=True, default_flow_style=False))
    return 0
