"""``eventsrc sample-plugin`` and ``sample-dra-driver``: a real device plugin and a real DRA
driver, for demos and tests."""

from __future__ import annotations

import argparse
from pathlib import Path

from eventsrc.cli.options import Parents, Subparsers
from eventsrc.errors import EventsrcError


def add_parser(sub: Subparsers, parents: Parents) -> None:
    _add_sample_plugin(sub, parents)
    _add_sample_dra_driver(sub, parents)


def _add_sample_plugin(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "sample-plugin",
        parents=[parents.root],
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
    p.add_argument(
        "--cdi-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="write a CDI spec for the devices into DIR (a runtime's cdi_spec_dirs), so the CDI names Allocate "
        "gives resolve: device dev-N sets SAMPLE_CDI_DEV_N=dev-N in the container",
    )
    p.set_defaults(func=sample_plugin)


def _add_sample_dra_driver(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "sample-dra-driver",
        parents=[parents.root],
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
        help="append every call (GetInfo, NotifyRegistrationStatus, NodePrepareResources, NodeUnprepareResources) "
        "to FILE as JSON lines",
    )
    p.set_defaults(func=sample_dra_driver)


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
