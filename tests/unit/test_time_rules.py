"""Time never orders anything: records are stamped with the wall clock per batch, and the
clock may step back or forward. ``replay --until TIME`` keeps the records stamped at or before
TIME in sequence order (as ``audit --until`` does), and ``replay --check``'s dangling
reservation is counted in sequence order within one daemon instance, never in seconds."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from eventsrc import events as ev
from eventsrc.core.invariants import Checker, Violation
from eventsrc.log.store import EventLog
from eventsrc.offline.log_replay import _records, parse_until

RES = "example.com/dev"
T0 = int(dt.datetime(2026, 11, 21, 23, 0, tzinfo=dt.UTC).timestamp()) * 1_000_000_000
S = 1_000_000_000
HOUR = 3600 * S


def rec(seq: int, event: ev.EventBase, ts_ns: int, cid: str) -> ev.Record:
    return ev.Record(seq=seq, ts_ns=ts_ns, correlation_id=cid, version=1, event=event)


def ref(name: str) -> ev.PodRef:
    return ev.PodRef(uid=f"uid-{name}", namespace="default", name=name)


def boot(instance: str) -> list[ev.EventBase]:
    return [
        ev.DaemonStarted(boot_id="b", version="0.1.0", instance_id=instance),
        ev.PluginRegistered(resource=RES, endpoint="sample.sock"),
        ev.DevicesAdded(resource=RES, devices=[ev.DeviceInfo(id=f"dev-{i}", health="Healthy") for i in range(8)]),
    ]


def reserve(name: str, dev: str) -> list[ev.EventBase]:
    return [
        ev.PodAdmissionStarted(pod=ref(name), containers=[ev.ContainerSpec(name="main")]),
        ev.DevicesReserved(pod_uid=f"uid-{name}", container="main", resource=RES, device_ids=[dev]),
    ]


def finish(name: str, dev: str) -> list[ev.EventBase]:
    return [
        ev.DevicesAllocated(pod_uid=f"uid-{name}", container="main", resource=RES, device_ids=[dev]),
        ev.PodAdmitted(pod=ref(name)),
    ]


def run(batches: list[tuple[str, int, list[ev.EventBase]]], window: int) -> list[Violation]:
    """Feed the batches (correlation id, stamp, events) to a Checker; every violation."""
    checker = Checker(reservation_window=window)
    found: list[Violation] = []
    seq = 0
    for cid, ts, events in batches:
        for e in events:
            seq += 1
            found += checker.feed(rec(seq, e, ts, cid))
    return found + checker.finish()


def test_a_clock_step_neither_makes_nor_hides_a_dangling_reservation() -> None:
    # b reserves and gets its outcome promptly, but the clock jumps a day forward in between
    # (a stamp-based timeout called that dangling), and c's reservation is never finished
    # while the clock steps back (a stamp-based timeout never saw it wait).
    batches = [
        ("boot", T0, boot("i1")),
        ("b", T0 + S, reserve("b", "dev-0")),
        ("b", T0 + 24 * HOUR, finish("b", "dev-0")),
        ("c", T0 + 24 * HOUR, reserve("c", "dev-1")),
    ]
    for i in range(3):  # later admissions, stamped before c's reservation
        name = f"d{i}"
        batches += [(name, T0 - HOUR, reserve(name, f"dev-{2 + i}")), (name, T0 - HOUR, finish(name, f"dev-{2 + i}"))]
    found = run(batches, window=2)
    assert [(v.rule, v.seq) for v in found] == [("dangling-reservation", 9)]
    assert "no outcome while 3 later admissions had theirs (window 2)" in found[0].message
    assert run(batches, window=3) == []


def test_a_restart_that_does_not_finish_a_reservation_makes_it_dangling_whatever_the_clock() -> None:
    lost = [
        ("boot", T0, boot("i1")),
        ("a", T0 + HOUR, reserve("a", "dev-0")),
        ("boot2", T0 - HOUR, [ev.DaemonStarted(boot_id="b", version="0.1.0", instance_id="i2")]),  # clock back
        ("lw", T0 - HOUR, [ev.DeviceHealthChanged(resource=RES, device_id="dev-7", health="Healthy")]),
    ]
    found = run(lost, window=1000)
    assert [(v.rule, v.seq, v.detected_seq) for v in found] == [("dangling-reservation", 5, 6)]
    assert "the daemon restarted (DaemonStarted at seq 6) without its outcome" in found[0].message
    # The restart that finishes it in its start-up run: sound.
    finished = [
        *lost[:2],
        (
            "boot2",
            T0 - HOUR,
            [
                ev.DaemonStarted(boot_id="b", version="0.1.0", instance_id="i2"),
                ev.DevicesReleased(pod_uid="uid-a", container="main", resource=RES, device_ids=["dev-0"]),
                ev.AdmissionRejected(pod=ref("a"), reason="the daemon restarted during the admission"),
            ],
        ),
        lost[3],
    ]
    assert run(finished, window=1000) == []


def test_replay_until_a_time_keeps_what_was_stamped_before_it_in_sequence_order(tmp_path: Path) -> None:
    stamps = [T0, T0 + 10 * S, T0 + HOUR, T0 + 20 * S, T0 + 30 * S]  # the clock stepped back after seq 3
    with EventLog(tmp_path) as log:
        for i, ts in enumerate(stamps):
            log.append([ev.DeviceHealthChanged(resource=RES, device_id=f"dev-{i}", health="Healthy")], f"c{i}", ts)
        until = parse_until("2026-11-21T23:00:20Z")
        kept = [r.seq for r in _records(log, until) if not isinstance(r, Exception)]
    # seq 3 is stamped later than TIME; seq 4, stamped at TIME after it, still counts.
    assert kept == [1, 2, 4]
