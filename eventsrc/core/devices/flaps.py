"""Health flap coalescing: of the device changes a plugin's lists make, which to record now,
which to hold, and how many changes each record stands for (ADR 0017).

Theory of operation
-------------------
A device plugin may flip a device's health (or its NUMA nodes) far faster than anything can
act on it; recorded one by one, a plugin flapping a device 1,000 times a second would write
1,000 records a second. Per device of one resource:

* a change that takes the device out of service (its recorded health is "Healthy", its
  listed health is not) is recorded at once: admission reads the views, and must never hand
  out a device its plugin calls unhealthy because a record waited;
* any other change is recorded at once when the device is quiet (nothing recorded of it for
  ``window`` seconds), else held until ``window`` after its last record; the newest listing
  wins, so flips inside the window cost nothing but a count;
* every change the plugin lists is counted; a record carries, in ``coalesced``, the changes
  since the device's previous record that it stands for beyond its own. A device that came
  back to its recorded state inside the window gets, when the window ends, one record that
  restates that state and carries the count: counts reach the log without a record per flip.

The bound: a record other than an out-of-service one comes at least ``window`` after the
device's previous record, so those are ``window`` apart; an out-of-service record needs the
recorded health to be "Healthy" again, which only such a record can make it, so those too
are ``window`` apart. A device that stays in its plugin's list
has at most 2 * (floor(T / window) + 1) records in T seconds, however fast its health flaps,
and one more when the stream ends (``final``: what is held is recorded then, without
waiting). A device that leaves the list and comes back (DevicesRemoved, DevicesAdded) is not
held by this bound: each list pass can record it again, so such flaps are bounded by the
list pacing (10 recorded passes a second), not by the window.

Pure: lists and the views in, events out; the shell passes the time in and asks again at
``Decision.due``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import msgspec

from eventsrc import events as ev
from eventsrc.state.views import DeviceView

#: Seconds between two records of one device's health (out-of-service changes excepted).
FLAP_WINDOW = 1.0
HEALTHY = "Healthy"

Listing = tuple[str, tuple[int, ...]]  # (health, NUMA nodes) as a list gives them


@dataclass(slots=True)
class DeviceFlaps:
    """One device of the plugin's newest list."""

    listed: Listing
    changes: int = 0  # changes listed since the device's last record
    recorded_at: float = -math.inf  # when its last record (added, or health) was decided


@dataclass(frozen=True)
class Decision:
    events: list[ev.EventBase]  # to record now, in order
    due: float = math.inf  # when a held change's window ends: decide again then, lists or not


@dataclass
class HealthThrottle:
    """The flap state of one resource's devices, for one plugin stream."""

    resource: str
    window: float = FLAP_WINDOW
    devices: dict[str, DeviceFlaps] = field(default_factory=dict)

    def listed(self, devices: Iterable[ev.DeviceInfo]) -> None:
        """Count the changes one list makes, against the list before it (a device listed twice
        counts by its last listing, as ``check_device_list`` takes it). A device the list
        leaves out is forgotten: its going is the diff's to record, not a flap."""
        seen: dict[Listing, Listing] = {}  # equal listings shared: a plugin's devices have a few
        newest = {d.id: seen.setdefault(x := (d.health, tuple(d.numa_nodes)), x) for d in devices}
        before, self.devices = self.devices, {}
        for device_id, listing in newest.items():
            flaps = before.get(device_id)
            if flaps is None:
                flaps = DeviceFlaps(listing)
            elif flaps.listed != listing:
                flaps.listed = listing
                flaps.changes += 1
            self.devices[device_id] = flaps

    def decide(
        self, events: list[ev.EventBase], known: Mapping[str, DeviceView], now: float, *, final: bool = False
    ) -> Decision:
        """Which of ``events`` (what the newest list changed against ``known``, the recorded
        devices still listed: ``list_and_watch_events``) to record at ``now``, with the
        restatements whose window has ended. ``final``: the stream has ended, record all
        that is held."""
        out: list[ev.EventBase] = []
        due = math.inf
        touched: set[str] = set()
        for e in events:
            if isinstance(e, ev.DeviceHealthChanged):
                touched.add(e.device_id)
                flaps = self.devices.get(e.device_id)
                if flaps is None:  # not in the newest list: cannot be, but never hold what is unknown
                    out.append(e)
                    continue
                old = known.get(e.device_id)
                out_of_service = old is not None and old.health == HEALTHY and e.health != HEALTHY
                if final or out_of_service or now >= flaps.recorded_at + self.window:
                    out.append(msgspec.structs.replace(e, coalesced=max(flaps.changes - 1, 0)))
                    flaps.changes, flaps.recorded_at = 0, now
                else:
                    due = min(due, flaps.recorded_at + self.window)
                continue
            out.append(e)
            if isinstance(e, ev.DevicesAdded):
                for d in e.devices:
                    if (flaps := self.devices.get(d.id)) is not None:
                        flaps.changes, flaps.recorded_at = 0, now
            elif isinstance(e, ev.DevicesRemoved):
                touched.update(e.device_ids)
        for device_id, flaps in self.devices.items():
            recorded = known.get(device_id)
            if not flaps.changes or device_id in touched or recorded is None:
                continue
            if final or now >= flaps.recorded_at + self.window:
                out.append(
                    ev.DeviceHealthChanged(
                        resource=self.resource,
                        device_id=device_id,
                        health=recorded.health,
                        numa_nodes=list(recorded.numa_nodes),
                        coalesced=flaps.changes,
                    )
                )
                flaps.changes, flaps.recorded_at = 0, now
            else:
                due = min(due, flaps.recorded_at + self.window)
        return Decision(out, due)
