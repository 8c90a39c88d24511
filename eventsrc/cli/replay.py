"""``eventsrc replay``: a log replayed read-only (the same as tools/replay/replay.py)."""

from __future__ import annotations

import argparse

from eventsrc.cli.options import Parents, Subparsers


def add_parser(sub: Subparsers, parents: Parents) -> None:
    from eventsrc.offline.log_replay import add_arguments

    p = sub.add_parser(
        "replay",
        parents=[parents.root],
        help="replay the log read-only: views at a point, every change, invariant checks",
        description="Replay a log read-only (it never writes to what it reads, so it works on a copy taken "
        "from another machine): the views as they were --until SEQ|TIME, every event with the change it made "
        "(--step), or the invariants checked at every event (--check: stops at the first event that breaks one "
        "and prints it with the events sharing its correlation id; exit 1). Beside a kubelet, what the kubelet "
        "got wrong (a device or exclusive CPU it gave two pods at once) is a finding, printed apart, and the "
        "check goes on. --check exits 0 when nothing is found, 1 when an invariant eventsrc keeps is broken "
        "(or a record is corrupt), 5 when findings about the kubelet are all it found (2 a usage error; 3 and 4 "
        "a log it cannot read: newer, damaged). Same as tools/replay/replay.py.",
    )
    add_arguments(p, path_required=False)
    p.set_defaults(func=replay)


def replay(args: argparse.Namespace) -> int:
    from eventsrc.offline.log_replay import run

    if args.path is None:
        args.path = args.layout.root
    return run(args)
