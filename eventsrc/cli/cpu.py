"""``eventsrc cpu topology`` and ``cpu take``: CPUs as the kubelet's CPU manager sees and picks
them, without a daemon."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from eventsrc.cli.options import Parents, Subparsers, add_output, read_input
from eventsrc.errors import EventsrcError

if TYPE_CHECKING:
    from eventsrc.core.cpu.topology import CPUTopology


def add_parser(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "cpu",
        parents=[parents.root],
        help="CPU topology and CPU picking (no daemon needed)",
        description="Look at CPUs the way the kubelet's CPU manager does.",
    )
    csub = p.add_subparsers(dest="cpu_command", metavar="WHAT", required=True)
    c = csub.add_parser(
        "topology",
        parents=[parents.root],
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
    add_output(c)
    c.set_defaults(func=topology)
    c = csub.add_parser(
        "take",
        parents=[parents.root],
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
    c.set_defaults(func=take)


def topology(args: argparse.Namespace) -> int:
    from eventsrc.core.cpu.topology import decode_topology_file, encode_topology_file, summary_lines
    from eventsrc.inputs.sysfs_topology import discover_topology

    if args.topology_file is not None:
        name = str(args.topology_file)
        try:
            data = read_input(args.topology_file)
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


def _bad(message: str) -> EventsrcError:
    """A bad argument: exit 2, as argparse's own errors do."""
    err = EventsrcError(message)
    err.exit_code = 2
    return err


def take(args: argparse.Namespace) -> int:
    from eventsrc.core.cpu.assignment import check_smt_alignment, parse_policy_options, take_by_topology
    from eventsrc.core.cpu.cpuset import parse as parse_cpuset

    topo = _read_topology(args.topology_file)
    available = parse_cpuset(args.available)  # CPUSetParseError exits 2
    unknown = available - topo.cpu_details.cpus()
    if unknown:
        raise _bad(f"--available: CPUs {unknown} are not in the topology")
    if args.count < 0:
        raise _bad("--count must not be negative")
    options: dict[str, str] = {}
    for item in args.option:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise _bad(f"--option {item!r}: expected NAME=VALUE")
        options[key] = value
    opts = parse_policy_options(options, alpha_enabled=True)  # PolicyOptionError exits 2
    if opts.full_pcpus_only and args.count > 0:
        check_smt_alignment(args.count, topo.cpus_per_core(), len(available))
    print(take_by_topology(topo, available, args.count, opts))
    return 0


def _read_topology(path: Path) -> CPUTopology:
    from eventsrc.core.cpu.topology import TopologyError, decode_topology_file

    name = str(path)
    try:
        data = read_input(path)
    except OSError as exc:
        raise _bad(f"cannot read {name}: {exc.strerror or exc}") from None
    try:
        return decode_topology_file(data, name)
    except TopologyError as exc:
        raise _bad(str(exc)) from None
