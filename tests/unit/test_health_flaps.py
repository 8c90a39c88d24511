"""The health flap throttle (``eventsrc.core.devices.flaps``, ADR 0017), pure: lists go in as
the shell receives them, recording passes at given times, and what each pass records is
applied to real Views, as the daemon does.

Each case starts after ``d0`` and ``d1`` (Healthy, NUMA node 0) were listed and added at
t = 0, with a window of 1 s. A step is a list (device -> health, or (health, NUMA nodes)) or
a pass: ``P(t, [what it records], due)``, ``F(t, [...])`` for the pass at the stream's end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventsrc import events as ev
from eventsrc.core.devices.flaps import HealthThrottle
from eventsrc.core.devices.holds import list_and_watch_events
from eventsrc.state.views import DeviceView, Views
from tests.unit.test_device_core import known_to_the_shell, record

GPU = "example.com/gpu"
H, U = "Healthy", "Unhealthy"
INF = math.inf

Listing = str | tuple[str, list[int]] | None  # None: the device leaves the list
Shown = tuple[str, ...]


@dataclass(frozen=True)
class P:
    """A recording pass at ``t``: the events it records, shown short, and when it asks again."""

    t: float
    records: list[Shown] = field(default_factory=list)
    due: float = INF
    final: bool = False


def F(t: float, records: list[Shown]) -> P:  # noqa: N802 - a step's name in the table
    return P(t, records, INF, final=True)


def shown(e: ev.EventBase) -> Shown:
    if isinstance(e, ev.DeviceHealthChanged):
        numa = () if e.numa_nodes == [0] else (f"numa {e.numa_nodes}",)
        return (e.device_id, e.health, *numa, *((f"+{e.coalesced}",) if e.coalesced else ()))
    if isinstance(e, ev.DevicesAdded):
        return ("added", *(d.id for d in e.devices))
    if isinstance(e, ev.DevicesRemoved):
        return ("removed", *e.device_ids)
    raise AssertionError(e)


class Plugin:
    """One resource's stream as the shell sees it: the newest list, the throttle, the views."""

    def __init__(self, window: float = 1.0) -> None:
        self.views = Views()
        self.throttle = HealthThrottle(GPU, window)
        self.newest: list[ev.DeviceInfo] = []
        self.listing: dict[str, tuple[str, list[int]]] = {}

    def lists(self, change: dict[str, Listing]) -> None:
        """The plugin sends its list with ``change`` made (a device given None leaves it)."""
        for device_id, listing in change.items():
            if listing is None:
                self.listing.pop(device_id, None)
            else:
                self.listing[device_id] = (listing, [0]) if isinstance(listing, str) else listing
        self.newest = [ev.DeviceInfo(id=i, health=h, numa_nodes=n) for i, (h, n) in self.listing.items()]
        self.throttle.listed(self.newest)

    def passes(self, now: float, final: bool = False) -> tuple[list[ev.EventBase], float]:
        known = known_to_the_shell(self.views, GPU)
        changed = list_and_watch_events(GPU, known, self.newest)
        decision = self.throttle.decide(changed, known, now, final=final)
        record(self.views, decision.events)
        return decision.events, decision.due

    def health(self, device_id: str) -> str:
        return self.views.devices.devices[GPU][device_id].health


def started() -> Plugin:
    plugin = Plugin()
    plugin.lists({"d0": H, "d1": H})
    events, due = plugin.passes(0.0)
    assert [shown(e) for e in events] == [("added", "d0", "d1")] and due == INF
    return plugin


CASES: dict[str, list[dict[str, Listing] | P]] = {
    "going out of service is recorded at once, inside the window of the add": [
        {"d0": U},
        P(0.1, [("d0", U)]),
    ],
    "coming back inside the window is held to its end, then recorded": [
        {"d0": U},
        P(0.1, [("d0", U)]),
        {"d0": H},
        P(0.2, [], due=1.1),
        P(0.9, [], due=1.1),
        P(1.1, [("d0", H)]),
    ],
    "a quiet device's change is recorded at once, whatever it is": [
        {"d0": U},
        P(10.0, [("d0", U)]),
        {"d0": H},
        P(20.0, [("d0", H)]),
    ],
    "flaps inside the window: one record at its end, the newest health, the rest counted": [
        {"d0": U},
        P(0.1, [("d0", U)]),
        {"d0": H},
        {"d0": U},
        P(0.3, [], due=1.1),  # the newest is what is recorded: only its two flaps are held...
        {"d0": H},
        {"d0": U},
        {"d0": H},
        P(0.5, [], due=1.1),
        P(1.1, [("d0", H, "+4")]),  # ... five changes since the last record: this one and four
    ],
    "back to the recorded health inside the window: a restatement carries the count": [
        {"d0": U},
        P(0.1, [("d0", U)]),
        {"d0": H},
        {"d0": U},
        {"d0": H},
        {"d0": U},
        P(0.5, [], due=1.1),
        P(1.1, [("d0", U, "+4")]),
        P(5.0, []),  # counted once
    ],
    "lists coalesced between two passes still count": [
        {"d0": U},
        {"d0": H},
        {"d0": U},
        P(10.0, [("d0", U, "+2")]),
        {"d0": H},
        {"d0": U},
        P(20.0, [("d0", U, "+2")]),  # quiet: the restatement is not held
    ],
    "out of service again after a trailing record: at once, then held again": [
        {"d0": U},
        P(0.1, [("d0", U)]),
        {"d0": H},
        P(0.2, [], due=1.1),
        P(1.1, [("d0", H)]),
        {"d0": U},
        P(1.2, [("d0", U)]),
        {"d0": H},
        P(1.3, [], due=2.2),
    ],
    "one unhealthy state to another is not a new failure: held": [
        {"d0": U},
        P(0.1, [("d0", U)]),
        {"d0": "Unknown"},
        P(0.2, [], due=1.1),
        P(1.1, [("d0", "Unknown")]),
    ],
    "a NUMA change of a healthy device is held like any other": [
        {"d0": (H, [1])},
        P(0.5, [], due=1.0),
        P(1.0, [("d0", H, "numa [1]")]),
    ],
    "going out of service on other NUMA nodes is recorded at once, nodes and all": [
        {"d0": (U, [1])},
        P(0.5, [("d0", U, "numa [1]")]),
    ],
    "the stream's end records what is held, without waiting": [
        {"d0": U},
        P(0.1, [("d0", U)]),
        {"d0": H},
        {"d0": U},
        {"d0": H},
        F(0.3, [("d0", H, "+2")]),
    ],
    "the stream's end records the counts of a device back to its recorded health": [
        {"d0": U},
        P(0.1, [("d0", U)]),
        {"d0": H},
        {"d0": U},
        F(0.3, [("d0", U, "+2")]),
    ],
    "the stream's end with nothing held records nothing": [
        {"d0": U},
        P(0.1, [("d0", U)]),
        F(0.2, []),
    ],
    "each device has its own window": [
        {"d0": U},
        P(0.1, [("d0", U)]),
        {"d1": U},
        P(0.5, [("d1", U)]),
        {"d0": H, "d1": H},
        P(0.7, [], due=1.1),
        P(1.1, [("d0", H)], due=1.5),
        P(1.5, [("d1", H)]),
    ],
    "a device leaving the list is removed, its held change and counts with it": [
        {"d0": U},
        P(0.1, [("d0", U)]),
        {"d0": H},
        P(0.2, [], due=1.1),
        {"d0": None},
        P(0.3, [("removed", "d0")]),
        P(1.1, []),
    ],
    "a device added is recorded by its add: its window starts there": [
        {"d2": H},
        P(5.0, [("added", "d2")]),
        {"d2": (H, [1])},
        P(5.5, [], due=6.0),
        {"d2": (U, [1])},
        P(5.6, [("d2", U, "numa [1]", "+1")]),
    ],
}


@pytest.mark.parametrize("name", CASES)
def test_throttle(name: str) -> None:
    plugin = started()
    for i, step in enumerate(CASES[name]):
        if isinstance(step, dict):
            plugin.lists(step)
            continue
        events, due = plugin.passes(step.t, final=step.final)
        assert ([shown(e) for e in events], due) == (step.records, step.due), f"step {i}: {step}"


def flap_storm(flips: int, per_second: float, window: float = 1.0) -> tuple[Plugin, list[ev.DeviceHealthChanged]]:
    """``d0`` flips ``flips`` times at ``per_second``, a pass after every list (the worst case:
    the shell's list rate limit would pass less often), and the stream ends after the last."""
    plugin = started()
    out: list[ev.DeviceHealthChanged] = []
    t = 0.0
    for i in range(flips):
        t = (i + 1) / per_second
        plugin.lists({"d0": U if i % 2 == 0 else H})
        events, _ = plugin.passes(t)
        out += [e for e in events if isinstance(e, ev.DeviceHealthChanged)]
    events, _ = plugin.passes(t, final=True)
    out += [e for e in events if isinstance(e, ev.DeviceHealthChanged)]
    return plugin, out


def accounted(records: list[ev.DeviceHealthChanged], start: str = H) -> int:
    """The changes ``records`` account for: one for each that changes the health, and its count."""
    total, health = 0, start
    for e in records:
        total += (e.health != health) + e.coalesced
        health = e.health
    return total


@pytest.mark.parametrize(
    ("per_second", "expected"),
    [
        (1000.0, 62),  # each window ends on Unhealthy, as recorded: one restatement a window
        (999.0, 120),  # each ends on Healthy: a trailing record, then the next failure at once
    ],
)
def test_a_minute_of_1000_flips_a_second_costs_at_most_two_records_a_window(per_second: float, expected: int) -> None:
    plugin, records = flap_storm(60_000, per_second)
    # Bound: 2 * (floor(T / 1 s) + 1) while the stream is open, one more at its end.
    seconds = 60_000 / per_second
    assert len(records) <= 2 * (math.floor(seconds) + 1) + 1
    assert len(records) == expected
    assert accounted(records) == 60_000  # every flip is in the log, as a record or a count
    assert plugin.health("d0") == H  # the plugin's last word
    assert records[0].health == U and records[0].coalesced == 0  # the first failure, at once
    print(f"\n60,000 flips of one device at {per_second:g}/s, window 1 s: {len(records)} records")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=0.7),  # time to the next step
            st.sampled_from(["d0", "d1"]),
            st.sampled_from([H, U, "Unknown"]),
            st.booleans(),  # a pass after the list
        ),
        max_size=60,
    )
)
def test_whatever_the_flaps_the_bound_safety_and_counts_hold(steps: list[tuple[float, str, str, bool]]) -> None:
    plugin = started()
    now = 0.0
    times: dict[str, list[float]] = {f"{i} {kind}": [] for i in ("d0", "d1") for kind in ("out", "other")}
    records: dict[str, list[ev.DeviceHealthChanged]] = {"d0": [], "d1": []}
    changes = {"d0": 0, "d1": 0}
    for gap, device_id, health, then_pass in steps:
        now += gap
        if plugin.listing[device_id][0] != health:
            changes[device_id] += 1
        plugin.lists({device_id: health})
        if not then_pass:
            continue
        before = {i: plugin.health(i) for i in ("d0", "d1")}
        events, due = plugin.passes(now)
        assert due > now
        for e in events:
            assert isinstance(e, ev.DeviceHealthChanged)
            kind = "out" if before[e.device_id] == H and e.health != H else "other"
            times[f"{e.device_id} {kind}"].append(now)
            records[e.device_id].append(e)
        for i in ("d0", "d1"):  # a device its plugin calls unhealthy never waits to leave service
            if before[i] == H and plugin.listing[i][0] != H:
                assert plugin.health(i) != H
    events, _ = plugin.passes(now, final=True)
    for e in events:
        assert isinstance(e, ev.DeviceHealthChanged)
        records[e.device_id].append(e)
    for i in ("d0", "d1"):
        assert plugin.health(i) == plugin.listing[i][0]  # the plugin's last word, after the end
        assert accounted(records[i]) == changes[i]
    # Records of one device of one kind (the end's aside) are a window apart: the bound.
    for key, at in times.items():
        assert all(b - a >= 1.0 for a, b in zip(at, at[1:], strict=False)), (key, at)


def test_known_is_what_the_throttle_restates() -> None:
    """A restatement states the recorded health and NUMA nodes, not the plugin's list's."""
    throttle = HealthThrottle(GPU, 1.0)
    throttle.listed([ev.DeviceInfo(id="d0", health=H, numa_nodes=[3])])
    throttle.listed([ev.DeviceInfo(id="d0", health=U, numa_nodes=[3])])
    throttle.listed([ev.DeviceInfo(id="d0", health=H, numa_nodes=[3])])
    known = {"d0": DeviceView(health=H, numa_nodes=[3])}
    decision = throttle.decide([], known, 5.0)
    assert decision.events == [
        ev.DeviceHealthChanged(resource=GPU, device_id="d0", health=H, numa_nodes=[3], coalesced=2)
    ]
