"""``eventsrc status``: whether a daemon is running and ready on a root."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from eventsrc.cli.options import Parents, Subparsers, add_output
from eventsrc.errors import EventsrcError
from eventsrc.layout import Layout


def add_parser(sub: Subparsers, parents: Parents) -> None:
    p = sub.add_parser(
        "status",
        parents=[parents.root],
        help="exit 0 if a daemon is running and ready on this root",
        description="Exit 0 when an eventsrc daemon is running and ready on --root-dir; "
        "otherwise print why not on stderr and exit 1. What needs an operator while it runs "
        "(log retention cuts that fail, fleet shipping disconnected) is a warning on stderr, with exit "
        "status 0.",
    )
    add_output(p)
    p.set_defaults(func=status)


def status(args: argparse.Namespace) -> int:
    from eventsrc.cli.client import call, unary
    from eventsrc.gen.node.v1 import node_pb2
    from eventsrc.log.store import DirLock
    from eventsrc.offline.render import escape

    layout: Layout = args.layout
    info: dict[str, Any] = {"root_dir": str(layout.root), "ready": False}
    reason = warning = ""
    try:
        st = call(layout, unary("Status", node_pb2.StatusRequest()), timeout=10)
        info.update(
            ready=st.ready,
            pid=st.pid,
            version=st.version,
            instance_id=st.instance_id,
            last_seq=st.last_seq,
            sockets=list(st.sockets),
            # how long its loop was held: steps nobody else could interrupt (eventsrc/obs/loop.py)
            loop={
                "steps": st.loop.steps,
                "longest_seconds": st.loop.longest_seconds,
                "longest_task": st.loop.longest_task,
                "over_10ms": st.loop.over_10ms,
                "longest_cpu_seconds": st.loop.longest_cpu_seconds,
                "longest_cpu_task": st.loop.longest_cpu_task,
                "cpu_over_10ms": st.loop.cpu_over_10ms,
                "long_steps": st.loop.long_steps,
            },
        )
        warnings = []
        if st.HasField("retention"):
            info["retention"], said = _retention(st.retention)
            warnings.append(said)
        if st.HasField("fleet"):
            info["fleet"], said = _fleet(st.fleet)
            warnings.append(said)
        warning = "; ".join(w for w in warnings if w)
        if not st.ready:
            reason = f"eventsrc (pid {st.pid}) on {layout.root} is not ready yet"
    except EventsrcError as err:
        pid = DirLock.holder(layout.lock) if layout.root.is_dir() else None
        reason = f"eventsrc (pid {pid}) holds {layout.root} but is not ready yet" if pid else str(err)
        info["pid"] = pid
    if args.output == "json":
        print(json.dumps({**info, "reason": reason, "warning": warning}))
    elif not reason:
        print(
            escape(
                f"eventsrc is running and ready on {layout.root} "
                f"(pid {info['pid']}, version {info['version']}, last sequence {info['last_seq']})"
            )
        )
    if reason:
        print(f"eventsrc: {escape(reason)}", file=sys.stderr)
        return 1
    if warning and args.output != "json":
        print(f"eventsrc: warning: {escape(warning)}", file=sys.stderr)
    return 0


def _retention(r: Any) -> tuple[dict[str, Any], str]:
    """The Status's retention (a node_pb2.RetentionStatus) for JSON, and what needs an
    operator in it ("" for nothing)."""
    import time

    from eventsrc.core.retention_policy import CutHealth, Retention, RetentionReport, trouble

    report = RetentionReport(
        policy=Retention(max_size=r.max_size_bytes, max_age_ns=round(r.max_age_seconds * 1e9)),
        health=CutHealth(
            reason=r.failing, since_ns=r.failing_since_unix_ns, in_a_row=r.failed_attempts, failures=r.failures_total
        ),
        retry_seconds=r.retry_seconds,
        live_bytes=r.live_bytes,
        cut_seconds=r.cut_seconds,
        late=r.cut_late,
        appends_waiting=r.appends_waiting,
    )
    info = {
        "max_size_bytes": r.max_size_bytes,
        "max_age_seconds": r.max_age_seconds,
        "live_bytes": r.live_bytes,
        "failing": r.failing,  # why cuts fail; "" while they succeed
        "failing_since_unix_ns": r.failing_since_unix_ns,
        "failed_attempts": r.failed_attempts,  # in a row
        "failures_total": r.failures_total,
        "retry_seconds": r.retry_seconds,
        "cut_seconds": r.cut_seconds,
        "cut_late": r.cut_late,
        "appends_waiting": r.appends_waiting,
    }
    return info, trouble(report, time.time_ns())


def _fleet(f: Any) -> tuple[dict[str, Any], str]:
    """The Status's fleet shipping (a node_pb2.FleetStatus) for JSON, and what needs an
    operator in it ("" for nothing)."""
    from eventsrc.core.shipping import trouble

    info = {
        "state": f.state,  # connecting, connected, disconnected or diverged
        "reason": f.reason,
        "shipped_seq": f.shipped_seq,
        "lag_records": f.lag_records,
        "lag_seconds": f.lag_seconds,
    }
    return info, trouble(f.state, f.reason, f.lag_records)
