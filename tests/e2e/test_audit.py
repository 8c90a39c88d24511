"""Audit queries (``eventsrc audit device|pod|claim``): answered from the log's index.

(a) On a log the daemon wrote (the sample device plugin, pods admitted and removed, a
    device marked unhealthy), the answers match what PodResources showed at each step.
(b) On a synthetic log, every field of the answers, the --since/--until window, and
    NAMESPACE/NAME lookup.
(c) Unknown targets and bad times are one-line errors.
(d) The answers are read through the index, never a scan.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
import pytest

from eventsrc import events as ev
from eventsrc.gen.podresources.v1 import api_pb2 as pr
from eventsrc.layout import Layout
from eventsrc.log.store import EventLog
from eventsrc.offline import audit_queries, audit_render
from tests.conftest import run_cli
from tests.e2e.test_devices_e2e import Plugin, pod_yaml
from tests.support.eventually import eventually
from tests.support.grpcio_stubs import pod_resources_client, unix_target

RES = "example.com/dev"
T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
SEC = 1_000_000_000


def iso(t: int) -> str:
    return audit_queries.iso(t)


# --------------------------------------------------------------------------- (b) a synthetic log

CLAIM = ev.ClaimRef(uid="claim-1", namespace="default", name="gpu-claim")
DRIVER = "gpu.example.com"
SPEC = [ev.ContainerSpec(name="main", requests={RES: "1", "cpu": "2"}, limits={RES: "1", "cpu": "2"})]
RESPONSE = ev.ContainerAllocation(
    envs={"DEV": "dev-0"},
    mounts=[ev.Mount(container_path="/data", host_path="/srv/dev-0", read_only=True)],
    devices=[ev.DeviceSpec(container_path="/dev/x0", host_path="/dev/x0", permissions="rw")],
    annotations={"example.com/dev": "dev-0"},
    cdi_devices=["example.com/dev=dev-0"],
)
PREPARED = [
    ev.PreparedDevice(
        request_names=["gpu"], pool_name="node-a", device_name="gpu-0", cdi_device_ids=["gpu.example.com/gpu=gpu-0"]
    )
]


def pod(uid: str, name: str) -> ev.PodRef:
    return ev.PodRef(uid=uid, namespace="default", name=name)


STEPS: list[tuple[int, list[tuple[str, ev.EventBase]]]] = [
    (
        1,
        [
            ("registered", ev.PluginRegistered(resource=RES, endpoint="dev.sock")),
            (
                "listed",
                ev.DevicesAdded(
                    resource=RES,
                    devices=[
                        ev.DeviceInfo(id="dev-0", health="Healthy", numa_nodes=[0]),
                        ev.DeviceInfo(id="dev-1", health="Healthy", numa_nodes=[1]),
                    ],
                ),
            ),
        ],
    ),
    (
        2,
        [
            ("a_started", ev.PodAdmissionStarted(pod=pod("uid-a", "a"), containers=SPEC)),
            (
                "a_reserved",
                ev.DevicesReserved(
                    pod_uid="uid-a",
                    container="main",
                    resource=RES,
                    device_ids=["dev-0"],
                    choice="plugin",
                    note="preferred",
                ),
            ),
            ("a_cpus", ev.CPUsAssigned(pod_uid="uid-a", container="main", cpus=[2, 3])),
            ("a_ref", ev.PodReferenceAdded(claim_uid="claim-1", pod_uid="uid-a")),
            ("c_started", ev.ClaimPrepareStarted(claim=CLAIM, driver=DRIVER, pod_uid="uid-a")),
        ],
    ),
    (
        3,
        [
            (
                "a_allocated",
                ev.DevicesAllocated(
                    pod_uid="uid-a", container="main", resource=RES, device_ids=["dev-0"], response=RESPONSE
                ),
            ),
            ("c_prepared", ev.ClaimPrepared(claim=CLAIM, driver=DRIVER, devices=PREPARED)),
            ("a_admitted", ev.PodAdmitted(pod=pod("uid-a", "a"), containers=SPEC, qos_class="Guaranteed")),
        ],
    ),
    (4, [("unhealthy", ev.DeviceHealthChanged(resource=RES, device_id="dev-0", health="Unhealthy", numa_nodes=[0]))]),
    (
        5,
        [
            ("b_started", ev.PodAdmissionStarted(pod=pod("uid-b", "b"), containers=SPEC)),
            (
                "b_refused",
                ev.AdmissionRejected(
                    pod=pod("uid-b", "b"),
                    reason="Resources cannot be allocated with Topology locality",
                    container="main",
                    topology_hint="{01 false}",
                ),
            ),
        ],
    ),
    (
        6,
        [
            (
                "a_released",
                ev.DevicesReleased(
                    pod_uid="uid-a", container="main", resource=RES, device_ids=["dev-0"], reason="pod removed"
                ),
            ),
            ("a_cpus_released", ev.CPUsReleased(pod_uid="uid-a", container="main", cpus=[2, 3], reason="pod removed")),
            ("a_unref", ev.PodReferenceRemoved(claim_uid="claim-1", pod_uid="uid-a")),
            ("c_unprepare", ev.ClaimUnprepareStarted(claim=CLAIM, driver=DRIVER)),
            ("c_unprepare_failed", ev.ClaimUnprepareFailed(claim=CLAIM, driver=DRIVER, reason="driver down")),
            ("a_removed", ev.PodRemoved(pod_uid="uid-a", reason="deleted")),
        ],
    ),
    (
        7,
        [
            ("c_unprepared", ev.ClaimUnprepared(claim=CLAIM, driver=DRIVER)),
            ("healthy", ev.DeviceHealthChanged(resource=RES, device_id="dev-0", health="Healthy", numa_nodes=[0])),
        ],
    ),
    (
        8,
        [
            ("a2_started", ev.PodAdmissionStarted(pod=pod("uid-a2", "a"), containers=SPEC)),
            (
                "a2_reserved",
                ev.DevicesReserved(
                    pod_uid="uid-a2", container="main", resource=RES, device_ids=["dev-0"], choice="daemon"
                ),
            ),
            (
                "a2_failed",
                ev.AllocationFailed(
                    pod_uid="uid-a2",
                    container="main",
                    resource=RES,
                    device_ids=["dev-0"],
                    reason="Allocate failed: boom",
                ),
            ),
            (
                "a2_refused",
                ev.AdmissionRejected(pod=pod("uid-a2", "a"), reason="Allocate failed: boom", container="main"),
            ),
        ],
    ),
    (
        9,
        [
            ("c_admitted", ev.PodAdmitted(pod=pod("uid-c", "c"), containers=SPEC, qos_class="Burstable")),
            (
                "c_allocated",
                ev.DevicesAllocated(pod_uid="uid-c", container="main", resource=RES, device_ids=["dev-0", "dev-1"]),
            ),
        ],
    ),
    (10, [("removed", ev.DevicesRemoved(resource=RES, device_ids=["dev-0"], reason="not in the plugin's list"))]),
]


@pytest.fixture
def synthetic(tmp_path: Path) -> Iterator[tuple[Path, dict[str, int]]]:
    """A root whose log holds STEPS (step n stamped T0 + n s); label -> sequence."""
    root = tmp_path / "root"
    seqs: dict[str, int] = {}
    with EventLog(Layout(root).log) as log:
        for n, step in STEPS:
            records = log.append([e for _, e in step], f"cid-{n}", T0 + n * SEC)
            seqs.update({label: r.seq for (label, _), r in zip(step, records, strict=True)})
    yield root, seqs


def reader(root: Path) -> EventLog:
    return EventLog(Layout(root).log, readonly=True)


def at(seqs: dict[str, int], label: str, step: int) -> dict[str, Any]:
    return {"seq": seqs[label], "ts_ns": T0 + step * SEC, "time": iso(T0 + step * SEC)}


def as_json(answer: Any) -> Any:
    return json.loads(audit_render.to_json(answer))


def test_device_timeline_every_field(synthetic: tuple[Path, dict[str, int]]) -> None:
    root, s = synthetic
    with reader(root) as log:
        got = as_json(audit_queries.device_timeline(log, RES, "dev-0"))
    assert got["resource"] == RES and got["device_id"] == "dev-0"
    assert (got["health"], got["numa_nodes"], got["listed"]) == ("Healthy", [0], False)
    assert got["since"] is None and got["until"] is None and got["corrupt"] == []
    assert got["changes"] == [
        {"at": at(s, "listed", 1), "what": "listed", "health": "Healthy", "numa_nodes": [0], "reason": ""},
        {"at": at(s, "unhealthy", 4), "what": "health", "health": "Unhealthy", "numa_nodes": [0], "reason": ""},
        {"at": at(s, "healthy", 7), "what": "health", "health": "Healthy", "numa_nodes": [0], "reason": ""},
        {
            "at": at(s, "removed", 10),
            "what": "removed",
            "health": "Healthy",
            "numa_nodes": [],
            "reason": "not in the plugin's list",
        },
    ]
    a, a2, c = got["holders"]
    assert a == {
        "pod": {"uid": "uid-a", "namespace": "default", "name": "a"},
        "container": "main",
        "device_ids": ["dev-0"],
        "start": at(s, "a_reserved", 2),
        "reserved": at(s, "a_reserved", 2),
        "allocated": at(s, "a_allocated", 3),
        "choice": "plugin",
        "note": "preferred",
        "end": at(s, "a_released", 6),
        "still_held": False,
        "released_by": "DevicesReleased",
        "reason": "pod removed",
        "decided_by": "eventsrc",
        "container_ids": [],  # only for the kubelet's holds (eventsrc's: "containers the runtime ran with it")
    }
    assert a2["pod"] == {"uid": "uid-a2", "namespace": "default", "name": "a"}
    assert (a2["start"], a2["reserved"], a2["allocated"]) == (at(s, "a2_reserved", 8), at(s, "a2_reserved", 8), None)
    assert (a2["end"], a2["released_by"], a2["reason"], a2["choice"]) == (
        at(s, "a2_failed", 8),
        "AllocationFailed",
        "Allocate failed: boom",
        "daemon",
    )
    # An allocation without a reservation (an import, say) starts at the allocation.
    assert c["pod"] == {"uid": "uid-c", "namespace": "default", "name": "c"}
    assert (c["start"], c["allocated"], c["reserved"]) == (at(s, "c_allocated", 9), at(s, "c_allocated", 9), None)
    assert (c["end"], c["still_held"], c["released_by"], c["device_ids"]) == (None, True, "", ["dev-0", "dev-1"])


def holders(t: audit_queries.DeviceTimeline) -> list[tuple[str, bool]]:
    return [(h.pod.uid, h.still_held) for h in t.holders]


def test_device_window_by_sequence_and_time(synthetic: tuple[Path, dict[str, int]]) -> None:
    root, s = synthetic
    with reader(root) as log:
        # Up to a point: a holding released later is still held there; nothing later is read.
        t = audit_queries.device_timeline(log, RES, "dev-0", until_seq=s["unhealthy"])
        assert holders(t) == [("uid-a", True)]
        assert [c.what for c in t.changes] == ["listed", "health"] and t.health == "Unhealthy"
        # A window: holdings that overlap it, changes inside it.
        t = audit_queries.device_timeline(log, RES, "dev-0", since_seq=s["a_released"] + 1, until_seq=s["a2_refused"])
        assert holders(t) == [("uid-a2", False)]
        assert [(c.what, c.health) for c in t.changes] == [("health", "Healthy")]
        t = audit_queries.device_timeline(log, RES, "dev-0", since_seq=s["a_released"])
        assert holders(t) == [("uid-a", False), ("uid-a2", False), ("uid-c", True)]
        # The same by time (inclusive bounds).
        t = audit_queries.device_timeline(log, RES, "dev-0", T0 + 4 * SEC + SEC // 2, T0 + 8 * SEC)
        assert holders(t) == [("uid-a", False), ("uid-a2", False)]
        assert [c.at.seq for c in t.changes] == [s["healthy"]]
        assert t.since is not None and t.since.time == "2026-01-01T00:00:04.500000Z"
        t = audit_queries.device_timeline(log, RES, "dev-0", T0 + 9 * SEC)
        assert holders(t) == [("uid-c", True)] and [c.what for c in t.changes] == ["removed"]
        # A window before anything about the device: empty, not an error.
        t = audit_queries.device_timeline(log, RES, "dev-0", until_ns=T0)
        assert t.holders == [] and t.changes == []
    # The CLI takes sequences and RFC 3339 times.
    out = run_cli(
        "audit",
        "device",
        RES,
        "dev-0",
        "--since",
        "2026-01-01T00:00:04.5Z",
        "--until",
        "2026-01-01T00:00:08Z",
        "-o",
        "json",
        root=root,
        check=True,
    )
    assert [h["pod"]["uid"] for h in json.loads(out.stdout)["holders"]] == ["uid-a", "uid-a2"]
    out = run_cli("audit", "device", RES, "dev-0", "--until", str(s["unhealthy"]), "-o", "json", root=root, check=True)
    assert [(h["pod"]["uid"], h["end"]) for h in json.loads(out.stdout)["holders"]] == [("uid-a", None)]
    table = run_cli("audit", "device", RES, "dev-0", root=root, check=True).stdout
    assert "default/a" in table and "still held" in table and "DevicesReleased: pod removed" in table
    assert "AllocationFailed: Allocate failed: boom" in table and "Unhealthy" in table


def test_pod_history_every_field(synthetic: tuple[Path, dict[str, int]]) -> None:
    root, s = synthetic
    with reader(root) as log:
        h = as_json(audit_queries.pod_history(log, "uid-a"))
    assert (h["uid"], h["namespace"], h["name"], h["resolved"], h["other_uids"]) == ("uid-a", "default", "a", "", [])
    spec = [
        {
            "name": "main",
            "kind": "app",
            "requests": {RES: "1", "cpu": "2"},
            "limits": {RES: "1", "cpu": "2"},
            "claims": [],
        }
    ]
    assert h["asked"] == [{"at": at(s, "a_started", 2), "type": "PodAdmissionStarted", "containers": spec}]
    assert h["admitted"] == [{"at": at(s, "a_admitted", 3), "qos_class": "Guaranteed", "container": ""}]
    assert h["refused"] == []
    assert h["devices"] == [
        {
            "container": "main",
            "resource": RES,
            "device_ids": ["dev-0"],
            "reserved": at(s, "a_reserved", 2),
            "choice": "plugin",
            "note": "preferred",
            "allocated": at(s, "a_allocated", 3),
            "response": {
                "envs": {"DEV": "dev-0"},
                "mounts": [{"container_path": "/data", "host_path": "/srv/dev-0", "read_only": True}],
                "devices": [{"container_path": "/dev/x0", "host_path": "/dev/x0", "permissions": "rw"}],
                "annotations": {"example.com/dev": "dev-0"},
                "cdi_devices": ["example.com/dev=dev-0"],
            },
            "failed": None,
            "released": at(s, "a_released", 6),
            "reason": "pod removed",
        }
    ]
    assert h["cpus"] == [
        {
            "container": "main",
            "cpus": [2, 3],
            "assigned": at(s, "a_cpus", 2),
            "released": at(s, "a_cpus_released", 6),
            "reason": "pod removed",
        }
    ]
    # The claim as it was while the pod held it (its unprepare failure came after).
    assert h["claims"] == [
        {
            "uid": "claim-1",
            "namespace": "default",
            "name": "gpu-claim",
            "driver": DRIVER,
            "referenced": at(s, "a_ref", 2),
            "unreferenced": at(s, "a_unref", 6),
            "state": "prepared",
            "cdi_devices": ["gpu.example.com/gpu=gpu-0"],
            "error": "",
        }
    ]
    assert h["removed"] == [{"at": at(s, "a_removed", 6), "reason": "deleted"}]
    pod_seqs = [
        s[k]
        for k in (
            "a_started",
            "a_reserved",
            "a_cpus",
            "a_ref",
            "a_allocated",
            "a_admitted",
            "a_released",
            "a_cpus_released",
            "a_unref",
            "a_removed",
        )
    ]
    assert [e["at"]["seq"] for e in h["events"]] == pod_seqs
    assert h["events"][0]["type"] == "PodAdmissionStarted" and "uid=uid-a" in h["events"][0]["summary"]
    assert h["corrupt"] == []

    with reader(root) as log:
        b = audit_queries.pod_history(log, "uid-b")
        assert [(r.at.seq, r.reason, r.container, r.topology_hint) for r in b.refused] == [
            (s["b_refused"], "Resources cannot be allocated with Topology locality", "main", "{01 false}")
        ]
        assert b.admitted == [] and b.devices == []
        # Refused after a failed Allocate: the grant says so, with its reason.
        a2 = audit_queries.pod_history(log, "uid-a2")
        (g,) = a2.devices
        assert g.failed is not None and g.failed.seq == s["a2_failed"] and g.released is None
        assert g.reason == "Allocate failed: boom" and a2.refused[0].reason == "Allocate failed: boom"
        # Admitted without an intent record (an import): PodAdmitted says what it asked for.
        c = audit_queries.pod_history(log, "uid-c")
        assert [(x.type, x.at.seq) for x in c.asked] == [("PodAdmitted", s["c_admitted"])]
        assert c.devices[0].released is None and c.devices[0].allocated is not None

    table = run_cli("audit", "pod", "uid-a", root=root, check=True).stdout
    for text in (
        "pod default/a  uid uid-a",
        "requests cpu=2 example.com/dev=1",
        "chosen by plugin (preferred)",
        "envs: DEV=dev-0",
        "cdi: example.com/dev=dev-0",
        "mount: /srv/dev-0 -> /data (ro)",
        "2,3 assigned",
        "default/gpu-claim (claim-1)",
        "removed 2026-01-01T00:00:06.000000Z",
    ):
        assert text in table, text
    table = run_cli("audit", "pod", "uid-b", root=root, check=True).stdout
    assert "topology hint {01 false}" in table


def test_pod_by_namespace_and_name(synthetic: tuple[Path, dict[str, int]]) -> None:
    root, s = synthetic
    with reader(root) as log:
        h = audit_queries.pod_history(log, "default/a")
        assert (h.uid, h.other_uids) == ("uid-a2", ["uid-a"])
        assert "uid-a2" in h.resolved and "newest of 2" in h.resolved
        c = audit_queries.pod_history(log, "default/c")
        assert (c.uid, c.other_uids) == ("uid-c", [])
    out = run_cli("audit", "pod", "default/a", root=root, check=True).stdout
    assert "default/a is pod uid-a2 (the newest of 2 pods with that name); older: uid-a" in out


def test_claim_history_every_field(synthetic: tuple[Path, dict[str, int]]) -> None:
    root, s = synthetic
    with reader(root) as log:
        c = as_json(audit_queries.claim_history(log, "claim-1"))
    assert (c["uid"], c["namespace"], c["name"], c["driver"], c["state"]) == (
        "claim-1",
        "default",
        "gpu-claim",
        DRIVER,
        "unprepared",
    )
    assert [(x["at"], x["type"], x["state"], x["pod_uid"], x["reason"]) for x in c["lifecycle"]] == [
        (at(s, "c_started", 2), "ClaimPrepareStarted", "preparing", "uid-a", ""),
        (at(s, "c_prepared", 3), "ClaimPrepared", "prepared", "", ""),
        (at(s, "c_unprepare", 6), "ClaimUnprepareStarted", "unpreparing", "", ""),
        (at(s, "c_unprepare_failed", 6), "ClaimUnprepareFailed", "unprepare-failed", "", "driver down"),
        (at(s, "c_unprepared", 7), "ClaimUnprepared", "unprepared", "", ""),
    ]
    assert c["lifecycle"][1]["devices"] == [
        {
            "request_names": ["gpu"],
            "pool_name": "node-a",
            "device_name": "gpu-0",
            "cdi_device_ids": ["gpu.example.com/gpu=gpu-0"],
        }
    ]
    assert c["cdi_devices"] == ["gpu.example.com/gpu=gpu-0"] and c["devices"] == c["lifecycle"][1]["devices"]
    assert c["pods"] == [
        {
            "pod": {"uid": "uid-a", "namespace": "default", "name": "a"},
            "referenced": at(s, "a_ref", 2),
            "unreferenced": at(s, "a_unref", 6),
        }
    ]
    assert [(e["at"]["seq"], e["reason"]) for e in c["errors"]] == [(s["c_unprepare_failed"], "driver down")]
    table = run_cli("audit", "claim", "claim-1", root=root, check=True).stdout
    assert "claim default/gpu-claim  uid claim-1  driver gpu.example.com  unprepared" in table
    assert "ClaimUnprepareFailed: driver down" in table and "default/a (uid-a)" in table


# --------------------------------------------------------------------------- (c) errors


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("device", RES, "dev-9"), 1, "no device dev-9 of example.com/dev in the log"),
        (("device", "example.com/other", "dev-0"), 1, "no device dev-0 of example.com/other in the log"),
        (("pod", "uid-nope"), 1, "no pod with uid uid-nope in the log"),
        (("pod", "default/nope"), 1, "no pod default/nope in the log"),
        (("claim", "claim-9"), 1, "no claim with uid claim-9 in the log"),
        (
            ("device", RES, "dev-0", "--since", "yesterday"),
            2,
            "--since 'yesterday': expected a sequence number or an RFC 3339 time",
        ),
        (("device", RES, "dev-0", "--until", "2026-13-01T00:00:00Z"), 2, "--until '2026-13-01T00:00:00Z': expected"),
        (("device", RES, "dev-0", "--until", "-5"), 2, "--until '-5': expected"),
    ],
)
def test_unknown_targets_and_bad_times_are_one_line(
    synthetic: tuple[Path, dict[str, int]], args: tuple[str, ...], code: int, message: str
) -> None:
    root, _ = synthetic
    proc = run_cli("audit", *args, root=root)
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(
    "cmd", [["audit"], ["audit", "device"], ["audit", "pod"], ["audit", "claim"], ["bench", "audit"]], ids=" ".join
)
def test_commands_have_help(cmd: list[str]) -> None:
    proc = run_cli(*cmd, "--help")
    assert proc.returncode == 0 and "usage: eventsrc" in proc.stdout and "--root-dir" in proc.stdout


def test_no_log_is_one_line(tmp_path: Path) -> None:
    proc = run_cli("audit", "pod", "uid-a", root=tmp_path / "nothing")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_audit_never_writes(synthetic: tuple[Path, dict[str, int]]) -> None:
    root, _ = synthetic
    data = Layout(root).log / "data.mdb"
    before = (data.read_bytes(), data.stat().st_mtime_ns)
    for args in (("device", RES, "dev-0"), ("pod", "default/a"), ("claim", "claim-1")):
        run_cli("audit", *args, root=root, check=True)
    assert (data.read_bytes(), data.stat().st_mtime_ns) == before


# --------------------------------------------------------------------------- (d) the index, not a scan


def test_answers_come_from_the_index(synthetic: tuple[Path, dict[str, int]], monkeypatch: pytest.MonkeyPatch) -> None:
    root, s = synthetic
    with reader(root) as log:
        expected = [
            audit_queries.device_timeline(log, RES, "dev-0"),
            audit_queries.pod_history(log, "default/a"),
            audit_queries.claim_history(log, "claim-1"),
        ]

    def no_scan(*args: object, **kwargs: object) -> None:
        raise AssertionError("an audit query scanned the log")

    prefixes: list[bytes] = []
    read: list[int] = []
    index_seqs, read_many = EventLog.index_seqs, EventLog.read_many

    def spy_index(self: EventLog, prefix: bytes, from_seq: int = 1, until_seq: int | None = None) -> list[int]:
        prefixes.append(prefix)
        return index_seqs(self, prefix, from_seq, until_seq)

    def spy_read(self: EventLog, seqs: Any) -> Any:
        seqs = list(seqs)
        read.extend(seqs)
        return read_many(self, seqs)

    for name in ("records", "raw_chunks", "read"):
        monkeypatch.setattr(EventLog, name, no_scan)
    monkeypatch.setattr(EventLog, "index_seqs", spy_index)
    monkeypatch.setattr(EventLog, "read_many", spy_read)
    with reader(root) as log:
        got = audit_queries.device_timeline(log, RES, "dev-0")
        assert got == expected[0]
        assert prefixes[0] == b"d\0example.com/dev\0dev-0\0"
        # Only the device's own records, and the first records of its holders' pods (their names).
        device_seqs = index_seqs(log, prefixes[0])
        assert set(read) - set(device_seqs) <= {
            s["a_started"],
            s["a2_started"],
            s["c_admitted"],
            s["a_reserved"],
            s["a_cpus"],
            s["a_ref"],
            s["a2_reserved"],
            s["a2_failed"],
            s["a2_refused"],
            s["c_allocated"],
        }
        assert s["listed"] in read and s["b_started"] not in read and s["c_unprepared"] not in read
        prefixes.clear()
        read.clear()
        assert audit_queries.pod_history(log, "default/a") == expected[1]
        assert prefixes[:2] == [b"n\0default/a\0", b"p\0uid-a2\0"]
        assert s["listed"] not in read and s["unhealthy"] not in read
        assert audit_queries.claim_history(log, "claim-1") == expected[2]


# --------------------------------------------------------------------------- (a) a log the daemon wrote


def pod_resources_snapshot(root: Path) -> tuple[int, dict[tuple[str, str, str], dict[str, list[str]]]]:
    """(the log's last sequence, {(namespace, name, container): {resource: device ids}}) as
    PodResources List showed it, with no record appended in between."""

    def last_seq() -> int:
        return int(json.loads(run_cli("status", "-o", "json", root=root, check=True).stdout)["last_seq"])

    while True:
        before = last_seq()
        with grpc.insecure_channel(unix_target(root / "pod-resources" / "kubelet.sock")) as ch:
            listed = pod_resources_client(ch).List(pr.ListPodResourcesRequest())
        if last_seq() == before:
            break
    out: dict[tuple[str, str, str], dict[str, list[str]]] = {}
    for p in listed.pod_resources:
        for c in p.containers:
            devs: dict[str, list[str]] = {}
            for d in c.devices:  # one entry a device (and NUMA node), as the kubelet lists them
                devs.setdefault(d.resource_name, []).extend(d.device_ids)
            devs = {r: sorted(set(ids)) for r, ids in devs.items() if ids}
            if devs:
                out[(p.namespace, p.name, c.name)] = devs
    return before, out


def audit_holders_at(log: EventLog, seq: int, devices: list[str]) -> dict[tuple[str, str, str], dict[str, list[str]]]:
    """Who held each device at ``seq``, by the device timelines."""
    out: dict[tuple[str, str, str], dict[str, list[str]]] = {}
    for d in devices:
        for h in audit_queries.device_timeline(log, RES, d, until_seq=seq).holders:
            if h.still_held and h.allocated is not None:
                out.setdefault((h.pod.namespace, h.pod.name, h.container), {}).setdefault(RES, []).append(d)
    return {k: {r: sorted(ids) for r, ids in v.items()} for k, v in out.items()}


def pod_devices_at(log: EventLog, uid: str, seq: int) -> dict[str, list[str]]:
    """What the pod history says the pod held at ``seq``: container -> device ids."""
    out: dict[str, list[str]] = {}
    for g in audit_queries.pod_history(log, uid).devices:
        if g.allocated is not None and g.allocated.seq <= seq and (g.released is None or g.released.seq > seq):
            out.setdefault(g.container, []).extend(g.device_ids)
    return {k: sorted(v) for k, v in out.items()}


def test_audit_matches_what_pod_resources_showed(root: Path, tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    daemon_factory()
    plugin = Plugin(root, "--devices", "4", "--numa-nodes", "1")
    try:
        plugin.wait_registered()
        devices = [f"dev-{i}" for i in range(4)]
        snaps: list[tuple[str, int, dict[tuple[str, str, str], dict[str, list[str]]]]] = []

        def admit(name: str, n: int) -> None:
            run_cli("admit", "-f", str(pod_yaml(tmp_path, name, n, uid=f"uid-{name}")), root=root, check=True)
            snaps.append((f"admit {name}", *pod_resources_snapshot(root)))

        admit("a", 2)
        admit("b", 1)
        a_devices = snaps[-1][2][("default", "a", "main")][RES]
        # One of a's devices turns unhealthy: it stays a's (the kubelet does not take it back).
        health = root / "plugins" / "sample-example-com-dev" / "health.json"
        health.write_text(json.dumps({a_devices[0]: "Unhealthy"}))
        eventually(
            lambda: '"DeviceHealthChanged"' in run_cli("log", "-o", "json", root=root).stdout,
            "the health change to be recorded",
            timeout=15,
        )
        snaps.append(("unhealthy", *pod_resources_snapshot(root)))
        run_cli("remove", "uid-a", root=root, check=True)
        snaps.append(("remove a", *pod_resources_snapshot(root)))
        admit("c", 1)
        c_devices = snaps[-1][2][("default", "c", "main")][RES]
        assert not set(c_devices) & {a_devices[0]}, "an unhealthy device was given"

        with EventLog(Layout(root).log, readonly=True) as log:
            for step, seq, shown in snaps:
                # Device by device, the holders at that point are the ones PodResources listed.
                assert audit_holders_at(log, seq, devices) == shown, step
                # Pod by pod, the devices it held at that point are the ones PodResources listed.
                for uid, name in (("uid-a", "a"), ("uid-b", "b"), ("uid-c", "c")):
                    want = {c: devs[RES] for (ns, n, c), devs in shown.items() if (ns, n) == ("default", name)}
                    got = pod_devices_at(log, uid, seq) if _first_seq(log, uid) <= seq else {}
                    assert got == want, (step, uid)
            # The health change sits between the two snapshots around it, on a's device.
            seq_b, seq_unhealthy = snaps[1][1], snaps[2][1]
            t = audit_queries.device_timeline(log, RES, a_devices[0])
            (change,) = [c for c in t.changes if c.what == "health"]
            assert change.health == "Unhealthy" and seq_b < change.at.seq <= seq_unhealthy
            (held,) = t.holders
            assert (held.pod.namespace, held.pod.name, held.pod.uid) == ("default", "a", "uid-a")
            assert held.end is not None and snaps[2][1] < held.end.seq <= snaps[3][1]
            assert held.reason == "pod removed" and held.start is not None and held.start.ts_ns <= change.at.ts_ns
            # The pod history: asked, got (with the plugin's response), released.
            a = audit_queries.pod_history(log, "default/a")
            assert a.uid == "uid-a" and a.asked[0].containers[0].limits[RES] == "2"
            (grant,) = a.devices
            assert sorted(grant.device_ids) == a_devices and grant.response is not None and grant.response.cdi_devices
            assert grant.released is not None and grant.reason == "pod removed" and a.removed
            assert audit_queries.pod_history(log, "uid-c").devices[0].released is None
        # The CLI gives the same answer.
        out = run_cli("audit", "device", RES, a_devices[0], "-o", "json", root=root, check=True).stdout
        assert [h["pod"]["uid"] for h in json.loads(out)["holders"]] == ["uid-a"]
        out = run_cli("audit", "pod", "default/c", root=root, check=True).stdout
        assert "uid uid-c" in out and "still held" in out
        usage_equals_the_allocations(root)
    finally:
        plugin.stop()


def usage_equals_the_allocations(root: Path) -> None:
    """``audit usage --by pod`` of eventsrc's own allocations equals, to the nanosecond, the
    DevicesAllocated-to-DevicesReleased intervals of the log (the open ones up to --until)."""
    records = [json.loads(line) for line in run_cli("log", "-o", "json", root=root, check=True).stdout.splitlines()]
    until = (records[-1]["ts_ns"] // 1000 + 1) * 1000  # --until takes microseconds; past the last record
    start: dict[tuple[str, str], int] = {}
    want: dict[str, int] = {}
    for r in records:
        e = r["event"]
        if r["type"] == "DevicesAllocated":
            start.update({(e["pod_uid"], i): r["ts_ns"] for i in e["device_ids"]})
        elif r["type"] == "DevicesReleased":
            for i in e["device_ids"]:
                want[e["pod_uid"]] = want.get(e["pod_uid"], 0) + r["ts_ns"] - start.pop((e["pod_uid"], i))
    for (uid, _), t in start.items():
        want[uid] = want.get(uid, 0) + until - t
    when = audit_queries.iso(until)
    out = run_cli(
        "audit", "usage", "--by", "pod", "--resource", RES, "--until", when, "-o", "json", root=root, check=True
    ).stdout
    got = {r["uid"]: r["seconds"] for r in json.loads(out, parse_float=Decimal)}
    assert got == {uid: Decimal(ns) / 10**9 for uid, ns in want.items()}
    assert set(got) == {"uid-a", "uid-b", "uid-c"}


def _first_seq(log: EventLog, uid: str) -> int:
    from eventsrc.log.index import pod_prefix

    seqs = log.index_seqs(pod_prefix(uid))
    return seqs[0] if seqs else 1 << 62
