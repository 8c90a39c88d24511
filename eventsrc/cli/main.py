"""The ``eventsrc`` command line. Each command is a thin caller of the package.

Expected errors (``EventsrcError``) print one line on stderr and exit non-zero; only a
bug prints a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from eventsrc import __version__
from eventsrc.errors import EventsrcError
from eventsrc.layout import DEFAULT_ROOT, Layout
from eventsrc.obs import logger as logs

Command = Callable[[argparse.Namespace], int]


def _root_parent() -> argparse.ArgumentParser:
    # --root-dir is accepted before or after the command name.
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--root-dir",
        type=Path,
        default=argparse.SUPPRESS,
        metavar="DIR",
        help=f"the kubelet root directory to work under (default {DEFAULT_ROOT}; the log lives in DIR/eventsrc/)",
    )
    return p


def _output(p: argparse.ArgumentParser, choices: Sequence[str] = ("table", "json")) -> None:
    p.add_argument("-o", "--output", choices=choices, default=choices[0], help="output format (default %(default)s)")


def _logging_parent() -> argparse.ArgumentParser:
    # Like --root-dir: accepted before or after the command name.
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=argparse.SUPPRESS,
        help="log level (default info; config logLevel)",
    )
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=argparse.SUPPRESS,
        help="text (key=value, the default) or json (one object per line); config logFormat",
    )
    return p


def _duration(text: str) -> Any:
    from eventsrc.inputs.config import parse_seconds_or_duration

    try:
        return parse_seconds_or_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _serve_flags(p: argparse.ArgumentParser) -> None:
    """The daemon's configuration flags (serve, config print). Every default is None: a flag
    overrides the config file only when given; the defaults are eventsrc.inputs.config's."""
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
        help="reserve N CPUs, chosen as the kubelet chooses them (kube-reserved + system-reserved cpu), when --reserved-cpus is not given",
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
    cpu.add_argument(
        "--feature-gates",
        default=None,
        metavar="K=V,...",
        help="CPUManagerPolicyAlphaOptions=true enables the alpha policy options (align-by-socket, distribute-cpus-across-cores)",
    )


def build_parser() -> argparse.ArgumentParser:
    root = _root_parent()
    logging_flags = _logging_parent()
    parser = argparse.ArgumentParser(
        prog="eventsrc",
        description="An event-sourced node resource daemon: the kubelet's device, CPU and DRA "
        "managers, with every registration, health change, allocation and release kept "
        "in an append-only log.",
        parents=[root, logging_flags],
    )
    parser.add_argument("--version", action="version", version=f"eventsrc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "serve",
        parents=[root, logging_flags],
        help="run the daemon",
        description="Run the daemon under --root-dir until SIGTERM or SIGINT. It rebuilds its "
        "views from the log (newest snapshot plus the tail), records that it started, and "
        "on a signal records that it stopped and writes a snapshot. Its configuration comes from "
        "--config FILE, then the flags given here (a flag overrides the file), then the defaults; "
        "'eventsrc config print' shows the result.",
    )
    _serve_flags(p)
    p.set_defaults(func=_cmd("serve"))

    p = sub.add_parser(
        "config",
        parents=[root],
        help="the daemon's configuration (no daemon needed)",
        description="The daemon's configuration, as 'eventsrc serve' would take it.",
    )
    csub = p.add_subparsers(dest="config_command", metavar="WHAT", required=True)
    c = csub.add_parser(
        "print",
        parents=[root, logging_flags],
        help="print the effective configuration: file, flags, defaults",
        description="Print the configuration 'eventsrc serve' would run with, given the same --config FILE "
        "and flags: every field, by its name in the file (a flag overrides the file; the rest are the "
        "defaults). The output is a valid configuration file. Checks the values as serve does, short of "
        "the machine's topology; starts nothing.",
    )
    _serve_flags(c)
    c.add_argument(
        "-o", "--output", choices=["yaml", "json"], default="yaml", help="output format (default %(default)s)"
    )
    c.set_defaults(func=_cmd("config_print"))

    p = sub.add_parser(
        "admit",
        parents=[root],
        help="admit a pod from its manifest",
        description="Admit a pod: send its manifest (a Kubernetes Pod, YAML or JSON, as 'kubectl get pod -o yaml' "
        "prints it) to the daemon, which gives its containers their devices. Prints what each container got "
        "(devices, envs, mounts, device nodes, annotations, CDI names). A missing metadata.uid is generated and "
        "printed. Exits 1 with the reason on stderr when the pod is refused, 2 when the manifest is malformed.",
    )
    p.add_argument(
        "-f",
        "--filename",
        dest="files",
        action="append",
        required=True,
        type=Path,
        metavar="FILE",
        help="the pod manifest first ('-' for stdin), then the ResourceClaims it uses (resource.k8s.io v1 or v1beta1, "
        "as the scheduler left them: allocated, reserved for the pod)",
    )
    _output(p)
    p.set_defaults(func=_cmd("admit"))

    p = sub.add_parser(
        "remove",
        parents=[root],
        help="remove a pod and release what it holds",
        description="Remove a pod (by uid, or NAMESPACE/NAME) and release every device it holds.",
    )
    p.add_argument("pod", metavar="POD_UID|NAMESPACE/NAME")
    _output(p)
    p.set_defaults(func=_cmd("remove"))

    p = sub.add_parser(
        "claims",
        parents=[root],
        help="list DRA claims: prepared, pending, failed",
        description="The DRA claims as the log has them: their state (preparing, prepared, prepare-failed, "
        "unpreparing, unprepare-failed), driver, pods and last error. Pending work stays listed until the "
        "driver answers.",
    )
    _output(p)
    p.set_defaults(func=_cmd("claims"))

    p = sub.add_parser(
        "pods",
        parents=[root],
        help="list the pods and what they hold",
        description="List the daemon's pods and what each container holds.",
    )
    _output(p)
    p.set_defaults(func=_cmd("pods"))

    p = sub.add_parser(
        "sample-plugin",
        parents=[root],
        help="run the sample device plugin",
        description="A real v1beta1 device plugin for demos and tests: serves its own socket in DIR/device-plugins, "
        "registers with kubelet.sock, lists N devices (dev-0..dev-N-1) spread over K NUMA nodes, answers Allocate "
        "with envs, device nodes, annotations and CDI names, and registers again when the kubelet (or eventsrc) "
        'restarts. Mark devices unhealthy at runtime by writing {"dev-3": "Unhealthy"} to the health file.',
    )
    p.add_argument("--resource", default="example.com/dev", help="extended resource name (default %(default)s)")
    p.add_argument("--devices", type=int, default=8, metavar="N", help="number of devices (default %(default)s)")
    p.add_argument(
        "--numa-nodes",
        type=int,
        default=2,
        metavar="K",
        help="NUMA nodes to spread them over; 0 for no topology (default %(default)s)",
    )
    p.add_argument(
        "--preferred", action="store_true", help="offer GetPreferredAllocation (packs devices on one NUMA node)"
    )
    p.add_argument("--pre-start", action="store_true", help="ask for PreStartContainer before every container start")
    p.add_argument(
        "--socket-name",
        default=None,
        metavar="NAME",
        help="socket file name in DIR/device-plugins (default sample-<resource>.sock)",
    )
    p.add_argument(
        "--health-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="JSON map of device id to health, read every 0.2 s (default DIR/plugins/sample-<resource>/health.json)",
    )
    p.add_argument(
        "--calls-log",
        type=Path,
        default=None,
        metavar="FILE",
        help="append every Allocate / GetPreferredAllocation / PreStartContainer call to FILE as JSON lines",
    )
    p.set_defaults(func=_cmd("sample_plugin"))

    p = sub.add_parser(
        "sample-dra-driver",
        parents=[root],
        help="run the sample DRA driver",
        description="A real DRA kubelet plugin (DRA v1 and v1beta1) for demos and tests: serves "
        "pluginregistration.Registration on DIR/plugins_registry/<driver>-reg.sock and the DRA service on "
        "DIR/plugins/<driver>/dra.sock, answers NodePrepareResources with devices named after each claim "
        "(CDI ids <driver>/device=<claim-name>-<n>), keeps the prepared claims in a JSON state file, and serves "
        "and registers again when its registration socket is removed. Failures are injected through a control "
        'file read on every call: {"fail_prepare": [uid], "fail_unprepare": [uid], "omit": [uid], "down": true}.',
    )
    p.add_argument(
        "--driver", required=True, metavar="NAME", help="the driver name (a DNS subdomain, e.g. gpu.example.com)"
    )
    p.add_argument(
        "--state",
        type=Path,
        default=None,
        metavar="FILE",
        help="the prepared claims, as JSON (default DIR/plugins/<driver>/state.json)",
    )
    p.add_argument(
        "--control-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="failure injection, re-read on every call (default DIR/plugins/<driver>/control.json)",
    )
    p.add_argument(
        "--fail-prepare", default="", metavar="UID,...", help="claim uids whose NodePrepareResources always fails"
    )
    p.add_argument(
        "--versions",
        default="v1,v1beta1",
        metavar="V,...",
        help="DRA APIs to serve and advertise: v1, v1beta1 (default %(default)s)",
    )
    p.add_argument(
        "--devices-per-claim",
        type=int,
        default=1,
        metavar="N",
        help="devices prepared for each claim (default %(default)s)",
    )
    p.add_argument(
        "--pool", default="sample", metavar="NAME", help="pool name of the prepared devices (default %(default)s)"
    )
    p.add_argument(
        "--calls-log",
        type=Path,
        default=None,
        metavar="FILE",
        help="append every call (GetInfo, NotifyRegistrationStatus, NodePrepareResources, NodeUnprepareResources) to FILE as JSON lines",
    )
    p.set_defaults(func=_cmd("sample_dra_driver"))

    p = sub.add_parser(
        "status",
        parents=[root],
        help="exit 0 if a daemon is running and ready on this root",
        description="Exit 0 when an eventsrc daemon is running and ready on --root-dir; "
        "otherwise print why not on stderr and exit 1.",
    )
    _output(p)
    p.set_defaults(func=_cmd("status"))

    p = sub.add_parser(
        "log",
        parents=[root],
        help="print records of the event log",
        description="Print the records of the event log, oldest first. A corrupt record is "
        "named by its sequence and the rest are printed; the exit status is then 1.",
    )
    p.add_argument(
        "--from", dest="from_seq", type=int, default=1, metavar="SEQ", help="first sequence to print (default 1)"
    )
    p.add_argument("--until", dest="until_seq", type=int, default=None, metavar="SEQ", help="last sequence to print")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new records as they are appended")
    _output(p)
    p.set_defaults(func=_cmd("log"))

    p = sub.add_parser(
        "export",
        parents=[root],
        help="stream the log as JSON lines, for fleet pipelines",
        description="Print records as JSON lines (one per record, with its sequence number), oldest first, for "
        "Fluent Bit, Vector or a Kafka producer. Resume after the last sequence a consumer saw with "
        "--from LAST+1; --follow keeps streaming new records. Reads the log directly (the daemon may run).",
    )
    p.add_argument("--from", dest="from_seq", type=int, default=1, metavar="SEQ", help="first sequence (default 1)")
    p.add_argument("--until", dest="until_seq", type=int, default=None, metavar="SEQ", help="last sequence")
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming new records")
    p.add_argument("-o", "--output", choices=["jsonl"], default="jsonl", help="output format (default %(default)s)")
    p.set_defaults(func=_cmd("export"))

    p = sub.add_parser(
        "state",
        parents=[root],
        help="print the views rebuilt from the log",
        description="Rebuild the devices, CPUs, claims and pods views from the whole log "
        "(the truth; snapshots are not trusted here unless --use-snapshot) and print them. "
        "Corrupt records are named; the exit status is then 1.",
    )
    p.add_argument(
        "--until",
        dest="until_seq",
        type=int,
        default=None,
        metavar="SEQ",
        help="the views as they were after record SEQ",
    )
    p.add_argument(
        "--use-snapshot",
        action="store_true",
        help="start from the newest valid snapshot (faster; skips checking older records)",
    )
    _output(p)
    p.set_defaults(func=_cmd("state"))

    p = sub.add_parser(
        "replay",
        parents=[root],
        help="replay the log read-only: views at a point, every change, invariant checks",
        description="Replay a log read-only (it never writes to what it reads, so it works on a copy taken "
        "from another machine): the views as they were --until SEQ|TIME, every event with the change it made "
        "(--step), or the invariants checked at every event (--check: stops at the first event that breaks one "
        "and prints it with the events sharing its correlation id; exit 1). Same as tools/replay/replay.py.",
    )
    from eventsrc.offline.replay import add_arguments as replay_arguments

    replay_arguments(p, path_required=False)
    p.set_defaults(func=_cmd("replay"))

    p = sub.add_parser(
        "cpu",
        parents=[root],
        help="CPU topology and CPU picking (no daemon needed)",
        description="Look at CPUs the way the kubelet's CPU manager does.",
    )
    csub = p.add_subparsers(dest="cpu_command", metavar="WHAT", required=True)
    c = csub.add_parser(
        "topology",
        parents=[root],
        help="print the CPU topology",
        description="Print the CPU topology the kubelet would see: from this machine's sysfs (default /), "
        "another sysfs tree (--sysfs-root), or a topology file (--topology-file). With -o json it prints "
        "the topology file format, so a capture can be replayed elsewhere with --topology-file.",
    )
    src = c.add_mutually_exclusive_group()
    src.add_argument(
        "--sysfs-root", type=Path, default=None, metavar="DIR", help="the directory holding sys/ (default /)"
    )
    src.add_argument("--topology-file", type=Path, default=None, metavar="FILE", help="a topology file ('-' for stdin)")
    _output(c)
    c.set_defaults(func=_cmd("cpu_topology"))
    c = csub.add_parser(
        "take",
        parents=[root],
        help="which CPUs the static policy would pick from a free set",
        description="Print, in canonical list form and nothing else, the CPUs the kubelet's static policy would "
        "pick (its take-by-topology, with these policy options) from the free CPUs --available of the machine "
        "in --topology-file. Alpha options are accepted as if CPUManagerPolicyAlphaOptions were on. With "
        "full-pcpus-only the policy's SMT alignment checks come first. Exits 1 with the kubelet's reason on "
        "stderr when the kubelet would fail, 2 on bad arguments.",
    )
    c.add_argument("--topology-file", type=Path, required=True, metavar="FILE", help="a topology file ('-' for stdin)")
    c.add_argument("--available", required=True, metavar="CPUSET", help="the free CPUs, in list form (e.g. 0-3,8)")
    c.add_argument("--count", type=int, required=True, metavar="N", help="how many CPUs to take")
    c.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a CPU manager policy option, e.g. full-pcpus-only=true (repeatable)",
    )
    c.set_defaults(func=_cmd("cpu_take"))

    p = sub.add_parser(
        "import-kubelet",
        parents=[root],
        help="import the kubelet's checkpoint files into the log (migration without draining)",
        description="Read the kubelet's checkpoint files (device manager, CPU manager, DRA manager), verify "
        "their checksums as the kubelet does (a mismatch is reported, never guessed around), and append the "
        "events that reproduce their state in one append with one correlation id. Refused while a daemon "
        "runs on --root-dir, and when the log already has pods (unless --force). The checkpoints record no "
        "pod names or namespaces: imported pods have none.",
    )
    p.add_argument(
        "--device-checkpoint",
        type=Path,
        default=None,
        metavar="FILE",
        help="the device manager's kubelet_internal_checkpoint",
    )
    p.add_argument("--cpu-state", type=Path, default=None, metavar="FILE", help="the CPU manager's cpu_manager_state")
    p.add_argument("--dra-state", type=Path, default=None, metavar="FILE", help="the DRA manager's dra_manager_state")
    p.add_argument("--dry-run", action="store_true", help="print the events without writing anything")
    p.add_argument("--force", action="store_true", help="import even when the log already has pods")
    _output(p)
    p.set_defaults(func=_cmd("import_kubelet"))

    p = sub.add_parser(
        "audit",
        parents=[root],
        help="who held a device and when, a pod's or a claim's history (from the log's index)",
        description="Audit queries answered from the log's secondary index (no scan), read-only: the daemon "
        "may run. An unknown device, pod or claim is one line on stderr and exit 1.",
    )
    asub = p.add_subparsers(dest="audit", metavar="WHAT", required=True)
    a = asub.add_parser(
        "device",
        parents=[root],
        help="a device's timeline: health changes and every holder",
        description="The device's timeline: listed/removed by its plugin, health changes, and each holder (pod "
        "namespace/name/uid, container, from, until or 'still held', why released), with times and sequences. "
        "With --since/--until, what overlaps that window (a holding released after --until is still held).",
    )
    a.add_argument("resource", metavar="RESOURCE", help="the extended resource name, e.g. example.com/gpu")
    a.add_argument("device_id", metavar="DEVICE_ID", help="the device id as its plugin lists it")
    a.add_argument(
        "--since",
        default=None,
        metavar="SEQ|TIME",
        help="from record SEQ, or from TIME (RFC 3339, e.g. 2026-11-21T23:40:00Z)",
    )
    a.add_argument("--until", default=None, metavar="SEQ|TIME", help="up to record SEQ, or up to TIME (RFC 3339)")
    _output(a)
    a.set_defaults(func=_cmd("audit"))
    a = asub.add_parser(
        "pod",
        parents=[root],
        help="everything a pod asked for, got, was refused and released",
        description="Everything the pod asked for (containers and requests), got (devices with the plugin's "
        "response, exclusive CPUs, claims), was refused (reason, topology hint) and released, each with its time "
        "and sequence. NAMESPACE/NAME names the newest pod with that name (the answer says which uid).",
    )
    a.add_argument("pod", metavar="UID|NAMESPACE/NAME")
    _output(a)
    a.set_defaults(func=_cmd("audit"))
    a = asub.add_parser(
        "claim",
        parents=[root],
        help="a DRA claim's prepare/unprepare lifecycle, pods, CDI devices and errors",
        description="The claim's prepare/unprepare lifecycle with times, the pods that referenced it, its CDI "
        "devices and the driver's errors.",
    )
    a.add_argument("claim", metavar="UID")
    _output(a)
    a.set_defaults(func=_cmd("audit"))
    a = asub.add_parser(
        "verify",
        parents=[root],
        help="check the hash chain: name the first record altered, removed or reordered",
        description="Walk the log and check every record's checksum and its link to the record before it (the "
        "hash chain), and the anchor over records written before the chain existed. Names each record that was "
        "altered, removed or reordered; exit 1 if any.",
    )
    _output(a)
    a.set_defaults(func=_cmd("audit_verify"))

    p = sub.add_parser(
        "backup",
        parents=[root],
        help="copy the log (and snapshots) consistently, while the daemon runs",
        description="Copy the event log with LMDB's own consistent copy (one read transaction, compacted, as "
        "'mdb_copy -c' does) and the snapshots at or before it into DEST, laid out as a root directory: "
        "'eventsrc --root-dir DEST log|state|audit verify' read it. Safe while the daemon writes; a plain cp of "
        "data.mdb is not. DEST must be new or empty.",
    )
    p.add_argument("dest", type=Path, metavar="DEST", help="a new or empty directory")
    _output(p)
    p.set_defaults(func=_cmd("backup"))

    p = sub.add_parser(
        "bench",
        parents=[root],
        help="measure this machine (a command, not a test)",
        description="Benchmarks. Each prints its figures next to a raw ceiling measured in the same run.",
    )
    bsub = p.add_subparsers(dest="bench", metavar="WHAT", required=True)
    b = bsub.add_parser(
        "log",
        parents=[root],
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
    b.set_defaults(func=_cmd("bench_log"))
    b = bsub.add_parser(
        "devices",
        parents=[root],
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
    b.set_defaults(func=_cmd("bench_devices"))
    b = bsub.add_parser(
        "cpu",
        parents=[root],
        help="time of the kubelet's CPU picking on a 256-CPU machine",
        description="Median and p99 time of a take of 1, 4, 16 and 64 CPUs (the static policy's take-by-topology) "
        "on a simulated 2-socket, 4-NUMA-node, 128-core, 2-thread machine with half of its CPUs taken, "
        "beside the goal of under 1 ms median.",
    )
    b.add_argument("--repetitions", type=int, default=2000, help="calls per figure (default %(default)s)")
    b.set_defaults(func=_cmd("bench_cpu"))
    b = bsub.add_parser(
        "audit",
        parents=[root],
        help="time of audit queries on a 1,000,000-event log",
        description="Builds a log with the 'bench log' workload (through the log's commit, so the index is "
        "written as the daemon writes it), then times 'audit device' for a busy device and 'audit pod' for a pod: "
        "median and p99 over --runs, beside one LMDB point lookup and a raw index range read measured in the "
        "same run; goal under 100 ms. Works in a temporary directory unless --root-dir is given.",
    )
    b.add_argument("--events", type=int, default=1_000_000, help="size of the log (default %(default)s)")
    b.add_argument("--runs", type=int, default=200, help="timed runs per figure (default %(default)s)")
    b.set_defaults(func=_cmd("bench_audit"))
    return parser


def _cmd(name: str) -> Command:
    def run(args: argparse.Namespace) -> int:
        from eventsrc.cli import commands

        fn: Command = getattr(commands, name)
        return fn(args)

    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Where the root came from: serve takes a config file's rootDir only over the default.
    args.root_dir_from = (
        "flag" if hasattr(args, "root_dir") else "env" if "EVENTSRC_ROOT_DIR" in os.environ else "default"
    )
    if not hasattr(args, "root_dir"):
        args.root_dir = Path(os.environ.get("EVENTSRC_ROOT_DIR", str(DEFAULT_ROOT)))
    args.root_dir = args.root_dir.absolute()
    args.layout = Layout(args.root_dir)
    # serve sets this up again once its configuration (logLevel, logFormat) is known.
    logs.setup(getattr(args, "log_level", "info"), getattr(args, "log_format", "text"))
    try:
        return int(args.func(args))
    except EventsrcError as err:
        print(f"eventsrc: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output closed early (``eventsrc log | head``): not an error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
