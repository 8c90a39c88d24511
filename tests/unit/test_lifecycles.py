"""The lifecycle tables: complete, the ones the reducers follow, the ones the ADRs draw, and
the ones ``replay --check`` holds the log to."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventsrc import events as ev
from eventsrc.core.invariants import RULES, Checker
from eventsrc.events import Record
from eventsrc.log.store import EventLog
from eventsrc.state import lifecycles as lc
from eventsrc.state.apply import HANDLERS, apply, lifecycle_steps
from eventsrc.state.views import Views
from tests.conftest import REPO, run_cli
from tests.unit.test_projections import STRATEGIES

ADR = REPO / "docs" / "adr"


def drawn(path: Path, name: str) -> str:
    """The diagram an ADR shows for lifecycle ``name`` (the fenced block after its marker)."""
    text = path.read_text()
    m = re.search(
        rf"^( *)<!-- rendered from eventsrc/state/lifecycles.py: {re.escape(name)} -->\n *```text\n(.*?)^ *```",
        text,
        re.S | re.M,
    )
    assert m is not None, f"{path.name} has no diagram of the {name} lifecycle"
    indent = len(m.group(1))
    return "".join(line[indent:] if line.strip() else "\n" for line in m.group(2).splitlines(keepends=True))


@pytest.mark.parametrize(
    ("lifecycle", "adr"),
    [(lc.CLAIM, "0008-dra-claims.md"), (lc.POD, "0013-lifecycle-tables.md"), (lc.DEVICE, "0013-lifecycle-tables.md")],
    ids=lambda x: getattr(x, "name", x),
)
def test_the_adrs_show_the_tables(lifecycle: lc.Lifecycle[str], adr: str) -> None:
    assert drawn(ADR / adr, lifecycle.name) == lifecycle.render()


def test_rendering_is_one_line_per_expected_transition() -> None:
    lines = lc.POD.render().splitlines()
    assert lines[0].split() == ["(none)", "--PodAdmissionStarted-->", "admitting"]
    assert len(lines) == len(lc.POD.expected)
    claim = lc.CLAIM.render().splitlines()
    assert claim[0].split() == ["(any)", "--PodReferenceAdded-->", "(unchanged)"]
    assert claim[-1].split() == ["referenced,", "unprepared", "--(no", "pod", "left)-->", "(none)"]


@pytest.mark.parametrize("lifecycle", lc.LIFECYCLES, ids=lambda x: x.name)
def test_every_state_and_event_has_exactly_one_next_state(lifecycle: lc.Lifecycle[str]) -> None:
    cells = {(s, e) for s in lifecycle.states for e in lifecycle.events}
    assert set(lifecycle.expected) | set(lifecycle.tolerated) == cells
    assert not set(lifecycle.expected) & set(lifecycle.tolerated)
    assert set(lifecycle.expected.values()) | set(lifecycle.tolerated.values()) <= set(lifecycle.states)
    # Every state is reached by the daemon's own events, or is where nothing exists yet.
    reached = {lifecycle.absent, *lifecycle.expected.values()}
    assert reached == set(lifecycle.states)


def test_each_lifecycle_names_events_its_reducers_handle() -> None:
    for lifecycle in lc.LIFECYCLES:
        assert set(lifecycle.events) <= set(HANDLERS), lifecycle.name
    # The claim's driver events each leave it in one state, whatever it was in: audit relies on it.
    assert lc.CLAIM.target(ev.ClaimPrepareFailed) == lc.PREPARE_FAILED
    with pytest.raises(ValueError):
        lc.POD.target(ev.AdmissionRejected)


def _subjects(v: Views) -> dict[tuple[str, str], str]:
    """Every pod, device and claim in ``v`` with its lifecycle state."""
    out: dict[tuple[str, str], str] = {}
    for uid, p in v.pods.pods.items():
        out[(lc.POD.name, uid)] = p.state
    for resource, table in v.devices.devices.items():
        for i, d in table.items():
            out[(lc.DEVICE.name, f"{resource} {i}")] = lc.device_state(d.hold, not d.removed)
    for uid, c in v.claims.claims.items():
        out[(lc.CLAIM.name, uid)] = c.state
    return out


_BY_NAME: dict[str, lc.Lifecycle[Any]] = {x.name: x for x in lc.LIFECYCLES}
_ABSENT = {x.name: x.absent for x in lc.LIFECYCLES}


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(*STRATEGIES.values()), max_size=40))
def test_the_reducers_follow_the_tables(evs: list[Any]) -> None:
    """Any change of a subject's state is a step of its table, to the state the table gives
    (a claim no pod references leaves the views in the table's ``leaves`` states)."""
    v = Views()
    for seq, e in enumerate(evs, 1):
        before = _subjects(v)
        steps = lifecycle_steps(v, e)
        keys = [(s.lifecycle, f"{s.resource} {s.key}" if s.resource else s.key) for s in steps]
        apply(v, Record(seq=seq, ts_ns=0, correlation_id="", version=1, event=e))
        after = _subjects(v)
        stepped = dict(zip(keys, steps, strict=True))
        for key in before.keys() | after.keys():
            old = before.get(key, _ABSENT[key[0]])
            new = after.get(key, _ABSENT[key[0]])
            if key not in stepped:
                assert old == new, f"{type(e).__name__} changed {key} from {old!r} to {new!r} without a step"
                continue
            if len(keys) != len(set(keys)):
                continue  # one event naming a device twice: the second sees the first's result
            lifecycle = _BY_NAME[key[0]]
            want = lifecycle.next(old, type(e))
            if key[0] == lc.CLAIM.name and want in lc.CLAIM.leaves:
                claim = v.claims.claims.get(key[1])
                want = want if claim is not None and claim.pods else lc.CLAIM_ABSENT
            assert new == want, f"{type(e).__name__}: {key} {old!r} -> {new!r}, the table says {want!r}"
            assert stepped[key].expected == lifecycle.expects(old, type(e))


# --------------------------------------------------------------------------- replay --check

POD = ev.PodRef(uid="uid-a", namespace="default", name="a")


def _records(events: list[Any]) -> list[Record]:
    return [Record(seq=i, ts_ns=i, correlation_id="c", version=1, event=e) for i, e in enumerate(events, 1)]


def test_the_checker_reports_an_unexpected_transition_with_its_sequence() -> None:
    assert "unexpected-transition" in RULES
    events: list[ev.EventBase] = [
        ev.PodAdmissionStarted(pod=POD),
        ev.PodAdmitted(pod=POD),
        ev.PodAdmitted(pod=POD),  # admitted twice: seq 3
        ev.PodRemoved(pod_uid="uid-a"),
        ev.ClaimUnprepared(claim=ev.ClaimRef(uid="c1", namespace="default", name="gpu"), driver="d"),  # seq 5
    ]
    checker = Checker()
    found = [v for r in _records(events) for v in checker.feed(r)] + checker.finish()
    assert [(v.rule, v.seq) for v in found] == [("unexpected-transition", 3), ("unexpected-transition", 5)]
    assert found[0].message == (
        "pod default/a: PodAdmitted in state admitted; the pod lifecycle expects it in (none), admitting"
    )
    assert found[1].message.startswith("claim c1: ClaimUnprepared in state (none); the claim lifecycle expects it in")
    # The reducers applied them anyway.
    assert checker.views.pods.pods == {} and checker.views.claims.claims == {}


def test_a_device_lifecycle_that_is_sound_has_no_report() -> None:
    res = "example.com/dev"
    events: list[ev.EventBase] = [
        ev.DevicesAdded(resource=res, devices=[ev.DeviceInfo(id="d0", health="Healthy")]),
        ev.PodAdmissionStarted(pod=POD, containers=[ev.ContainerSpec(name="setup", kind="init")]),
        ev.DevicesReserved(pod_uid="uid-a", container="setup", resource=res, device_ids=["d0"]),
        ev.DevicesReserved(pod_uid="uid-a", container="main", resource=res, device_ids=["d0"]),
        ev.DevicesRemoved(resource=res, device_ids=["d0"]),
        ev.AllocationFailed(pod_uid="uid-a", container="setup", resource=res, device_ids=["d0"]),  # not its holder
        ev.DevicesReleased(pod_uid="uid-a", container="main", resource=res, device_ids=["d0"]),
        ev.AdmissionRejected(pod=POD, reason="Allocate failed"),
    ]
    checker = Checker()
    assert [v for r in _records(events) for v in checker.feed(r)] + checker.finish() == []
    assert checker.views.devices.devices == {} and checker.views.pods.pods == {}
    # An Allocate failing for a device that is allocated is not in the table.
    events[4:] = [
        ev.DevicesAllocated(pod_uid="uid-a", container="main", resource=res, device_ids=["d0"]),
        ev.AllocationFailed(pod_uid="uid-a", container="main", resource=res, device_ids=["d0"]),
    ]
    checker = Checker()
    found = [v for r in _records(events) for v in checker.feed(r)]
    assert [(v.rule, v.seq, v.message) for v in found] == [
        (
            "unexpected-transition",
            6,
            f"d0 {res}: AllocationFailed in state allocated; the device hold lifecycle expects it in reserved, "
            "reserved-unlisted",
        )
    ]


def test_replay_check_reports_an_injected_unexpected_transition(root: Path) -> None:
    with EventLog(root / "eventsrc" / "log") as log:
        log.append([ev.DaemonStarted(boot_id="b", version="0.1.0", instance_id="i")], "boot", 1)
        log.append([ev.PodAdmissionStarted(pod=POD), ev.PodAdmitted(pod=POD)], "adm-a", 2)
        log.append([ev.PodAdmissionStarted(pod=POD)], "again", 3)  # seq 4: an admitted pod admitted again
    proc = run_cli("replay", str(root), "--check", "-o", "json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["violation"]["rule"] == "unexpected-transition" and report["violation"]["seq"] == 4
    assert "PodAdmissionStarted in state admitted" in report["violation"]["message"]
    assert run_cli("replay", str(root), "--check", "--until", "3").returncode == 0


# --------------------------------------------------------------------------- quarantine
# A corrupt record's pod is unknown: the start quarantines every pod it could be instead of
# finishing that pod's admission on a guess (docs/adr/0005).


def _running_pod(corrupt_at: set[int]) -> list[Record | ev.CorruptRecordError]:
    """A plugin with two devices, pod p1 admitted holding both; the records at ``corrupt_at``
    replaced by corrupt ones (as a reader yields them)."""
    ref = ev.PodRef(uid="p1", namespace="default", name="web")
    spec = ev.ContainerSpec(name="main", limits={"example.com/dev": "2"})
    events: list[ev.EventBase] = [
        ev.DevicesAdded(
            resource="example.com/dev", devices=[ev.DeviceInfo(id=f"d{i}", health="Healthy") for i in (0, 1)]
        ),
        ev.PodAdmissionStarted(pod=ref, containers=[spec]),
        ev.DevicesReserved(pod_uid="p1", container="main", resource="example.com/dev", device_ids=["d0", "d1"]),
        ev.DevicesAllocated(pod_uid="p1", container="main", resource="example.com/dev", device_ids=["d0", "d1"]),
        ev.PodAdmitted(pod=ref, containers=[spec]),
    ]
    return [
        ev.CorruptRecordError(seq, "checksum mismatch") if seq in corrupt_at else Record(seq, 1, "c", 1, e)  # type: ignore[arg-type]
        for seq, e in enumerate(events, 1)
    ]


def _views(items: list[Record | ev.CorruptRecordError]) -> Views:
    views = Views()
    for item in items:
        apply(views, item)
    return views


def _finish(views: Views) -> list[ev.EventBase]:
    from eventsrc.core.devices.holds import restart_events

    events = restart_events(views)
    for i, e in enumerate(events, views.meta.last_seq + 1):
        apply(views, Record(i, 1, "start", 1, e))  # type: ignore[arg-type]
    return events


def test_a_corrupt_outcome_quarantines_the_admitting_pod_and_its_devices_stay_held() -> None:
    from eventsrc.core.admission import removal
    from eventsrc.core.cpu.assignment import StaticPolicyOptions
    from eventsrc.core.cpu.cpuset import CPUSet
    from eventsrc.core.cpu.static import CPUManagerConfig
    from eventsrc.core.cpu.topology import single_cpu_topology

    views = _views(_running_pod({5}))  # its PodAdmitted unreadable
    assert views.pods.pods["p1"].state == lc.ADMITTING
    events = _finish(views)
    assert not [e for e in events if isinstance(e, (ev.DevicesReleased, ev.AdmissionRejected))]
    assert [(type(e), e.corrupt_seqs) for e in events if isinstance(e, ev.PodQuarantined)] == [(ev.PodQuarantined, [5])]
    pod = views.pods.pods["p1"]
    assert (pod.state, pod.in_doubt) == (lc.QUARANTINED, [5])
    assert {d.holder for d in views.devices.devices["example.com/dev"].values()} == {"p1/main"}
    # The next start leaves it as it is.
    assert not [e for e in _finish(views) if not isinstance(e, ev.PluginDisconnected)]
    # An operator's removal releases it, and says so.
    cpus = CPUManagerConfig("none", single_cpu_topology(), CPUSet(), StaticPolicyOptions())
    out = removal(views, cpus, "p1", "removed by eventsrc remove")
    released = [e for e in out if isinstance(e, ev.DevicesReleased)]
    assert [e.device_ids for e in released] == [["d0", "d1"]]
    (gone,) = [e for e in out if isinstance(e, ev.PodRemoved)]
    assert "quarantined" in gone.reason and "[5]" in gone.reason


def test_without_a_corrupt_record_after_its_start_an_unfinished_admission_is_refused() -> None:
    views = _views(_running_pod(set())[:4])  # stopped before its outcome: never acknowledged
    events = _finish(views)
    assert [type(e) for e in events] == [ev.DevicesReleased, ev.AdmissionRejected]
    views = _views([ev.CorruptRecordError(1, "x"), *_running_pod(set())[1:4]])  # corrupt before its start
    assert ev.PodQuarantined not in [type(e) for e in _finish(views)]


def test_devices_held_by_a_pod_whose_admission_is_unreadable_stay_held() -> None:
    views = _views(_running_pod({2, 5}))  # neither PodAdmissionStarted nor PodAdmitted readable
    assert "p1" not in views.pods.pods
    events = _finish(views)
    assert not [e for e in events if isinstance(e, ev.DevicesReleased)]
    assert views.pods.pods["p1"].state == lc.QUARANTINED and views.pods.pods["p1"].in_doubt == [2, 5]
    # With no corrupt record, such a holder was never admitted: released.
    views = _views(_running_pod(set())[:4])
    del views.pods.pods["p1"]
    assert [type(e) for e in _finish(views)] == [ev.DevicesReleased]


def test_an_unprepares_outcome_after_the_next_prepare_began_leaves_the_claim_preparing() -> None:
    """A pod lets go of a shared claim (its unprepare in flight), another pod's admission
    prepares it again, then the unprepare's outcome is recorded, and the daemon is killed before
    the prepare's: the claim is still being prepared (the driver's calls run in the order they
    began, so it may be prepared), never unprepared; the restart's claim work, with no pod left,
    unprepares it (a CI crash loop left it prepared on its driver)."""
    from eventsrc.core.claims import pending_work

    shared = ev.ClaimRef(uid="c-shared", namespace="default", name="shared")
    driver = "gpu.example.com"
    first, second = (
        ev.PodRef(uid="p1", namespace="default", name="p1"),
        ev.PodRef(uid="p2", namespace="default", name="p2"),
    )
    events: list[ev.EventBase] = [
        ev.PodAdmissionStarted(pod=first),
        ev.PodReferenceAdded(claim_uid=shared.uid, pod_uid=first.uid),
        ev.ClaimPrepareStarted(claim=shared, driver=driver, pod_uid=first.uid),
        ev.ClaimPrepared(claim=shared, driver=driver),
        ev.PodAdmitted(pod=first),
        ev.PodReferenceRemoved(claim_uid=shared.uid, pod_uid=first.uid),
        ev.ClaimUnprepareStarted(claim=shared, driver=driver),
        ev.PodRemoved(pod_uid=first.uid),
        ev.PodAdmissionStarted(pod=second),
        ev.PodReferenceAdded(claim_uid=shared.uid, pod_uid=second.uid),
        ev.ClaimPrepareStarted(claim=shared, driver=driver, pod_uid=second.uid),
        ev.ClaimUnprepared(claim=shared, driver=driver),  # the first pod's unprepare, done first
    ]
    v = Views()
    for seq, e in enumerate(events, 1):
        apply(v, Record(seq=seq, ts_ns=seq, correlation_id="", version=1, event=e))
    assert v.claims.claims[shared.uid].state == lc.PREPARING
    # The other order (the prepare ran, then the unprepare): the unprepare's outcome is the last word.
    assert lc.CLAIM.next(lc.PREPARED, ev.ClaimUnprepared) == lc.UNPREPARED
    apply(
        v, Record(seq=len(events) + 1, ts_ns=0, correlation_id="", version=1, event=ev.PodRemoved(pod_uid=second.uid))
    )
    _, prepares, unprepares = pending_work(v)  # the second pod gone at the restart: nothing needs the claim
    assert prepares == [] and [c.uid for w in unprepares for c in w.claims] == [shared.uid]
