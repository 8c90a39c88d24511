"""The ``eventsrc`` command line: the parser assembled from the command modules beside it, and
the one place a command runs.

Each module of ``eventsrc.cli`` declares its commands (``add_parser``) next to the functions
that run them. Expected errors (``EventsrcError``) print one line on stderr and exit non-zero;
only a bug prints a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from eventsrc import __version__
from eventsrc.cli import (
    audit,
    backup,
    bench,
    cpu,
    fleet,
    kubelet_import,
    pod_commands,
    records,
    replay,
    samples,
    serve,
    status,
)
from eventsrc.cli.options import Parents, logging_parent, root_parent
from eventsrc.errors import EventsrcError
from eventsrc.layout import BESIDE_ROOT, DEFAULT_ROOT, Layout
from eventsrc.obs import logger as logs

# In the order ``eventsrc --help`` lists them.
COMMAND_MODULES = (
    serve,
    pod_commands,
    samples,
    status,
    records,
    replay,
    cpu,
    kubelet_import,
    audit,
    fleet,
    backup,
    bench,
)


def default_root() -> Path:
    """Where the commands look without --root-dir or EVENTSRC_ROOT_DIR: the kubelet's root,
    unless only a log of eventsrc beside a kubelet is on this node (its own root, BESIDE_ROOT)."""
    if not Layout(DEFAULT_ROOT).log.is_dir() and Layout(BESIDE_ROOT).log.is_dir():
        return BESIDE_ROOT
    return DEFAULT_ROOT


def build_parser() -> argparse.ArgumentParser:
    # --root-dir and the logging flags are accepted before or after the command name.
    parents = Parents(root=root_parent(), logging=logging_parent())
    parser = argparse.ArgumentParser(
        prog="eventsrc",
        description="An event-sourced node resource daemon: the kubelet's device, CPU and DRA "
        "managers, with every registration, health change, allocation and release kept "
        "in an append-only log.",
        parents=[parents.root, parents.logging],
    )
    parser.add_argument("--version", action="version", version=f"eventsrc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.add_parser(sub, parents)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # A developers' bench takes the rest of the line to parse itself (cli/bench.py); for any
    # other command, an argument it does not know is an error, as parse_args makes it.
    args, rest = parser.parse_known_args(argv)
    if rest and not getattr(args, "takes_the_rest", False):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    # Where the root came from: serve takes a config file's rootDir only over the default.
    args.root_dir_from = (
        "flag" if hasattr(args, "root_dir") else "env" if "EVENTSRC_ROOT_DIR" in os.environ else "default"
    )
    if not hasattr(args, "root_dir"):
        args.root_dir = Path(os.environ.get("EVENTSRC_ROOT_DIR", str(default_root())))
    args.root_dir = args.root_dir.absolute()
    args.layout = Layout(args.root_dir)
    # serve sets this up again once its configuration (logLevel, logFormat) is known.
    logs.setup(getattr(args, "log_level", "info"), getattr(args, "log_format", "text"))
    try:
        return int(args.func(args))
    except EventsrcError as err:
        from eventsrc.offline.render import escape  # the message may quote a plugin or a manifest

        print(f"eventsrc: error: {escape(str(err))}", file=sys.stderr)
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
