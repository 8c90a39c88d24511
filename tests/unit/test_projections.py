"""Projections: reducers are total and pure; full rebuild == incremental == snapshot + tail."""

from __future__ import annotations

import copy
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventsrc import events as ev
from eventsrc.events import Record, decode_record, encode_payload
from eventsrc.log.snapshots import encode_snapshot, load_views, write_snapshot
from eventsrc.log.store import EventLog
from eventsrc.state.apply import apply, apply_all, rebuild
from eventsrc.state.views import Views

# Small vocabularies so that random events collide on the same pods, devices and claims.
pods = st.sampled_from(["p1", "p2", "p3"])
containers = st.sampled_from(["main", "init", "side"])
resources = st.sampled_from(["example.com/gpu", "example.com/nic"])
device_ids = st.lists(st.sampled_from(["d0", "d1", "d2", "d3"]), max_size=3, unique=True)
health = st.sampled_from(["Healthy", "Unhealthy"])
numa = st.lists(st.integers(0, 3), max_size=2)
cpus = st.lists(st.integers(0, 15), max_size=4, unique=True)
memory_types = st.sampled_from(["memory", "hugepages-2Mi"])
memory_blocks = st.lists(
    st.builds(
        ev.MemoryBlock,
        numa_affinity=st.lists(st.integers(0, 1), min_size=1, max_size=2, unique=True),
        type=memory_types,
        size=st.integers(0, 4),
    ),
    max_size=2,
)
node_sizes = st.dictionaries(
    st.sampled_from(["0", "1"]), st.dictionaries(memory_types, st.integers(1, 4), max_size=2), max_size=2
)
claim_refs = st.builds(
    ev.ClaimRef, uid=st.sampled_from(["c1", "c2"]), namespace=st.just("ns"), name=st.sampled_from(["a", "b"])
)
drivers = st.sampled_from(["gpu.example.com", "nic.example.com"])
text = st.sampled_from(["", "why", "because"])
sandboxes = st.sampled_from(["s1", "s2"])
container_ids = st.sampled_from(["k1", "k2", "k3"])
pod_refs = st.builds(ev.PodRef, uid=pods, namespace=st.just("default"), name=st.sampled_from(["web", "job"]))
# observed pods: the uid known or not yet
observed_pods = st.builds(ev.PodRef, uid=st.sampled_from(["", "p1"]), namespace=st.just("default"), name=st.just("web"))
claim_devices = st.lists(
    st.builds(ev.ObservedClaimDevice, driver=drivers, pool=st.just("pool"), device=st.sampled_from(["g0", "g1"])),
    max_size=2,
)
container_specs = st.builds(
    ev.ContainerSpec,
    name=containers,
    kind=st.sampled_from(["init", "sidecar", "app"]),
    requests=st.dictionaries(resources, st.sampled_from(["1", "2"]), max_size=1),
)
allocation = st.builds(
    ev.ContainerAllocation,
    envs=st.dictionaries(st.sampled_from(["A", "B"]), st.sampled_from(["1", "2"]), max_size=2),
    cdi_devices=st.lists(st.sampled_from(["v/x=1", "v/x=2"]), max_size=2),
)

STRATEGIES: dict[type, st.SearchStrategy] = {
    ev.DaemonStarted: st.builds(
        ev.DaemonStarted, boot_id=text, version=st.just("0.1.0"), instance_id=text, config=st.just({"k": 1})
    ),
    ev.DaemonStopped: st.builds(ev.DaemonStopped, boot_id=text, instance_id=text, reason=text),
    ev.CorruptRecordFound: st.builds(ev.CorruptRecordFound, seq=st.integers(1, 50), reason=text),
    ev.LogTrimmed: st.builds(ev.LogTrimmed, base_seq=st.integers(1, 50), records=st.integers(1, 50), segment=text),
    ev.PolicyConfigurationChanged: st.builds(
        ev.PolicyConfigurationChanged, manager=st.sampled_from(["cpu", "topology"]), new=st.just({"policy": "static"})
    ),
    ev.ConfigurationChanged: st.builds(
        ev.ConfigurationChanged,
        old=st.just({"k": 1}),
        new=st.sampled_from([{"k": 2}, {"k": 1, "logLevel": "debug"}]),
        changed=st.sampled_from([["k"], ["logLevel"]]),
    ),
    ev.PluginRegistered: st.builds(
        ev.PluginRegistered,
        resource=resources | drivers,
        endpoint=st.sampled_from(["a.sock", "b.sock"]),
        kind=st.sampled_from(["DevicePlugin", "DRAPlugin"]),
    ),
    ev.PluginRegistrationRejected: st.builds(
        ev.PluginRegistrationRejected, resource=resources, endpoint=st.just("x.sock"), reason=text
    ),
    ev.PluginDisconnected: st.builds(
        ev.PluginDisconnected,
        resource=resources | drivers,
        endpoint=st.sampled_from(["", "a.sock", "b.sock"]),
        kind=st.sampled_from(["DevicePlugin", "DRAPlugin"]),
    ),
    ev.DevicesAdded: st.builds(
        ev.DevicesAdded,
        resource=resources,
        devices=st.lists(
            st.builds(ev.DeviceInfo, id=st.sampled_from(["d0", "d1", "d2", "d3"]), health=health, numa_nodes=numa),
            max_size=3,
        ),
    ),
    ev.DevicesRemoved: st.builds(ev.DevicesRemoved, resource=resources, device_ids=device_ids, reason=text),
    ev.ResourceDropped: st.builds(ev.ResourceDropped, resource=resources, reason=text),
    ev.DeviceHealthChanged: st.builds(
        ev.DeviceHealthChanged,
        resource=resources,
        device_id=st.sampled_from(["d0", "d1", "d9"]),
        health=health,
        numa_nodes=numa,
    ),
    ev.PodAdmissionStarted: st.builds(
        ev.PodAdmissionStarted, pod=pod_refs, containers=st.lists(container_specs, max_size=2)
    ),
    ev.ContainerAdmissionStarted: st.builds(
        ev.ContainerAdmissionStarted,
        pod=pod_refs,
        container=container_specs,
        finished=st.lists(containers, max_size=2),
    ),
    ev.ContainerAdmitted: st.builds(ev.ContainerAdmitted, pod=pod_refs, container=containers),
    ev.PodAdmitted: st.builds(ev.PodAdmitted, pod=pod_refs, containers=st.lists(container_specs, max_size=2)),
    ev.AdmissionRejected: st.builds(ev.AdmissionRejected, pod=pod_refs, reason=text),
    ev.PodRemoved: st.builds(ev.PodRemoved, pod_uid=pods),
    ev.PodQuarantined: st.builds(
        ev.PodQuarantined, pod=pod_refs, corrupt_seqs=st.lists(st.integers(1, 50), max_size=3), reason=text
    ),
    ev.DevicesReserved: st.builds(
        ev.DevicesReserved,
        pod_uid=pods,
        container=containers,
        resource=resources,
        device_ids=device_ids,
        choice=st.sampled_from(["", "kept", "plugin", "daemon"]),
    ),
    ev.DevicesAllocated: st.builds(
        ev.DevicesAllocated,
        pod_uid=pods,
        container=containers,
        resource=resources,
        device_ids=device_ids,
        response=allocation,
    ),
    ev.AllocationFailed: st.builds(
        ev.AllocationFailed, pod_uid=pods, container=containers, resource=resources, device_ids=device_ids, reason=text
    ),
    ev.DevicesReleased: st.builds(
        ev.DevicesReleased, pod_uid=pods, container=containers, resource=resources, device_ids=device_ids
    ),
    ev.CPUsAssigned: st.builds(ev.CPUsAssigned, pod_uid=pods, container=containers, cpus=cpus),
    ev.CPUsReleased: st.builds(ev.CPUsReleased, pod_uid=pods, container=containers, cpus=cpus),
    ev.SharedPoolChanged: st.builds(ev.SharedPoolChanged, cpus=cpus, reason=text),
    ev.MemoryAssigned: st.builds(
        ev.MemoryAssigned, pod_uid=pods, container=containers, blocks=memory_blocks, taken=node_sizes
    ),
    ev.MemoryReleased: st.builds(ev.MemoryReleased, pod_uid=pods, container=containers, returned=node_sizes),
    ev.MemoryMachineChanged: st.builds(
        ev.MemoryMachineChanged,
        old=node_sizes,
        new=node_sizes,
        taken=node_sizes,
        unaccounted=st.dictionaries(pods, st.lists(containers, max_size=2), max_size=2),
    ),
    ev.ClaimPrepareStarted: st.builds(ev.ClaimPrepareStarted, claim=claim_refs, driver=drivers, pod_uid=pods),
    ev.ClaimPrepared: st.builds(
        ev.ClaimPrepared,
        claim=claim_refs,
        driver=drivers,
        devices=st.lists(
            st.builds(ev.PreparedDevice, pool_name=st.just("pool"), device_name=st.sampled_from(["g0", "g1"])),
            max_size=2,
        ),
    ),
    ev.ClaimPrepareFailed: st.builds(ev.ClaimPrepareFailed, claim=claim_refs, driver=drivers, reason=text),
    ev.ClaimUnprepareStarted: st.builds(ev.ClaimUnprepareStarted, claim=claim_refs, driver=drivers),
    ev.ClaimUnprepared: st.builds(ev.ClaimUnprepared, claim=claim_refs, driver=drivers),
    ev.ClaimUnprepareFailed: st.builds(ev.ClaimUnprepareFailed, claim=claim_refs, driver=drivers, reason=text),
    ev.PodReferenceAdded: st.builds(ev.PodReferenceAdded, claim_uid=st.sampled_from(["c1", "c2"]), pod_uid=pods),
    ev.PodReferenceRemoved: st.builds(ev.PodReferenceRemoved, claim_uid=st.sampled_from(["c1", "c2"]), pod_uid=pods),
    ev.RuntimeConnected: st.builds(ev.RuntimeConnected, runtime=text, mode=st.sampled_from(["enforce", "observe"])),
    ev.RuntimeDisconnected: st.builds(ev.RuntimeDisconnected, reason=text),
    ev.PodSandboxStarted: st.builds(ev.PodSandboxStarted, sandbox_id=sandboxes, pod=pod_refs),
    ev.PodSandboxRemoved: st.builds(ev.PodSandboxRemoved, sandbox_id=sandboxes, pod_uid=pods),
    ev.ContainerCreated: st.builds(
        ev.ContainerCreated,
        container_id=container_ids,
        sandbox_id=sandboxes,
        pod_uid=pods,
        name=containers,
        cpus=cpus,
        mems=st.lists(st.integers(0, 1), max_size=2),
        device_ids=st.dictionaries(resources, device_ids, max_size=1),
        adjusted=st.booleans(),
    ),
    ev.ContainerStarted: st.builds(ev.ContainerStarted, container_id=container_ids, pod_uid=pods),
    ev.ContainerStopped: st.builds(ev.ContainerStopped, container_id=container_ids, exit_code=st.integers(-1, 2)),
    ev.ContainerRemoved: st.builds(ev.ContainerRemoved, container_id=container_ids),
    ev.ContainerCPUsUpdated: st.builds(ev.ContainerCPUsUpdated, container_id=container_ids, cpus=cpus),
    ev.KubeletPodObserved: st.builds(ev.KubeletPodObserved, pod=observed_pods, source=text),
    ev.KubeletPodReleased: st.builds(ev.KubeletPodReleased, pod=observed_pods, reason=text),
    ev.KubeletDevicesObserved: st.builds(
        ev.KubeletDevicesObserved,
        pod=observed_pods,
        container=containers,
        resource=resources,
        device_ids=device_ids,
        numa_nodes=numa,
    ),
    ev.KubeletDevicesReleased: st.builds(
        ev.KubeletDevicesReleased, pod=observed_pods, container=containers, resource=resources, device_ids=device_ids
    ),
    ev.KubeletCPUsObserved: st.builds(ev.KubeletCPUsObserved, pod=observed_pods, container=containers, cpus=cpus),
    ev.KubeletCPUsReleased: st.builds(ev.KubeletCPUsReleased, pod=observed_pods, container=containers, cpus=cpus),
    ev.KubeletMemoryObserved: st.builds(
        ev.KubeletMemoryObserved,
        pod=observed_pods,
        container=containers,
        memory=st.lists(
            st.builds(ev.ObservedMemory, memory_type=st.just("memory"), size=st.integers(0, 9), numa_nodes=numa),
            max_size=2,
        ),
    ),
    ev.KubeletClaimObserved: st.builds(
        ev.KubeletClaimObserved, pod=observed_pods, container=containers, claim=claim_refs, devices=claim_devices
    ),
    ev.KubeletClaimReleased: st.builds(
        ev.KubeletClaimReleased, pod=observed_pods, container=containers, claim=claim_refs, devices=claim_devices
    ),
    ev.KubeletAllocatableChanged: st.builds(
        ev.KubeletAllocatableChanged,
        added=st.dictionaries(
            resources,
            st.lists(st.builds(ev.DeviceInfo, id=st.sampled_from(["d0", "d1"]), health=health, numa_nodes=numa)),
            max_size=2,
        ),
        removed=st.dictionaries(resources, device_ids, max_size=2),
        cpus_added=cpus,
        cpus_removed=cpus,
    ),
    ev.KubeletSharedPoolObserved: st.builds(ev.KubeletSharedPoolObserved, cpus=cpus, source=text),
    ev.KubeletCPUsDisagreed: st.builds(
        ev.KubeletCPUsDisagreed, pod=observed_pods, container=containers, listed=cpus, checkpoint=cpus, source=text
    ),
    ev.KubeletCheckpointReadFailed: st.builds(ev.KubeletCheckpointReadFailed, path=text, reason=text),
    ev.KubeletDoubleAllocationFound: st.builds(
        ev.KubeletDoubleAllocationFound,
        resource=st.sampled_from(["example.com/dev", "cpu"]),
        ids=st.lists(st.sampled_from(["d0", "d1", "3"]), min_size=1, max_size=2),
        holders=st.lists(st.sampled_from(["default/a/main", "default/b/main", "x"]), min_size=2, max_size=2),
    ),
    ev.ObservationGapFound: st.builds(
        ev.ObservationGapFound,
        source=st.sampled_from(["kubelet", "runtime"]),
        since_ns=st.sampled_from([1, 2]),
        until_ns=st.sampled_from([0, 3]),
    ),
}
events = st.one_of(*STRATEGIES.values())


def test_the_strategy_covers_every_event_type() -> None:
    assert {t.__name__ for t in STRATEGIES} == set(ev.EVENT_TYPES)


def as_records(evs: list[ev.EventBase]) -> list[Record]:
    return [decode_record(i, encode_payload(e, 1000 + i, f"c{i // 3}")) for i, e in enumerate(evs, start=1)]


def canonical(v: Views) -> bytes:
    # Through msgpack and back: what a snapshot would hold, with dict order kept.
    return msgspec.msgpack.encode(v)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events, max_size=60), st.data())
def test_full_rebuild_equals_incremental_equals_snapshot_plus_tail(
    evs: list[ev.EventBase], data: st.DataObject
) -> None:
    records = as_records(evs)
    full = rebuild(records)

    # Incremental, as the daemon does it: the events it just appended, never decoded.
    incremental = Views()
    for i, e in enumerate(evs, start=1):
        apply(incremental, Record(i, 1000 + i, f"c{i // 3}", e.VERSION, e))  # type: ignore[arg-type]
    assert incremental == full

    cut = data.draw(st.integers(0, len(records)))
    head = rebuild(records[:cut])
    snapshot = msgspec.msgpack.decode(msgspec.msgpack.encode(head), type=Views)
    assert snapshot == head
    resumed = apply_all(snapshot, records[cut:])
    assert resumed == full
    assert canonical(resumed) == canonical(full)


@settings(max_examples=100, deadline=None)
@given(st.lists(events, max_size=40))
def test_reducers_do_not_touch_their_event_or_depend_on_anything_else(evs: list[ev.EventBase]) -> None:
    records = as_records(evs)
    before = copy.deepcopy(records)
    a = rebuild(records)
    b = rebuild(records)
    assert a == b
    assert records == before


def test_allocation_lifecycle_in_the_views() -> None:
    gpu = "example.com/gpu"
    records = as_records(
        [
            ev.PluginRegistered(resource=gpu, endpoint="gpu.sock"),
            ev.DevicesAdded(resource=gpu, devices=[ev.DeviceInfo(id="g0", health="Healthy", numa_nodes=[0])]),
            ev.PodAdmitted(
                pod=ev.PodRef(uid="u1", namespace="ns", name="p"),
                containers=[ev.ContainerSpec(name="c", requests={gpu: "1"})],
            ),
            ev.DevicesReserved(pod_uid="u1", container="c", resource=gpu, device_ids=["g0"]),
        ]
    )
    v = rebuild(records)
    assert (v.devices.devices[gpu]["g0"].holder, v.devices.devices[gpu]["g0"].hold) == ("u1/c", "reserved")
    apply(
        v,
        as_records(
            [
                ev.DevicesAllocated(
                    pod_uid="u1",
                    container="c",
                    resource=gpu,
                    device_ids=["g0"],
                    response=ev.ContainerAllocation(envs={"X": "1"}),
                )
            ]
        )[0],
    )
    assert v.devices.devices[gpu]["g0"].hold == "allocated"
    assert v.pods.pods["u1"].containers["c"].allocations[gpu].envs == {"X": "1"}
    # A release by someone else does not free it.
    apply(v, as_records([ev.DevicesReleased(pod_uid="u2", container="c", resource=gpu, device_ids=["g0"])])[0])
    assert v.devices.devices[gpu]["g0"].holder == "u1/c"
    apply(v, as_records([ev.DevicesReleased(pod_uid="u1", container="c", resource=gpu, device_ids=["g0"])])[0])
    assert v.devices.devices[gpu]["g0"].holder == ""
    assert v.pods.pods["u1"].containers["c"].devices == {}


def test_claim_shared_by_two_pods_stays_until_both_are_gone() -> None:
    claim = ev.ClaimRef(uid="c1", namespace="ns", name="shared")
    v = rebuild(
        as_records(
            [
                ev.PodReferenceAdded(claim_uid="c1", pod_uid="a"),
                ev.ClaimPrepareStarted(claim=claim, driver="d", pod_uid="a"),
                ev.ClaimPrepared(claim=claim, driver="d"),
                ev.PodReferenceAdded(claim_uid="c1", pod_uid="b"),
                ev.PodReferenceRemoved(claim_uid="c1", pod_uid="a"),
            ]
        )
    )
    assert v.claims.claims["c1"].state == "prepared" and v.claims.claims["c1"].pods == ["b"]


def _fill(log: EventLog, n: int) -> None:
    from eventsrc.bench.log import workload

    log.append(list(workload(n)), "c", 1)


def test_snapshots_are_only_a_cache(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    log = EventLog(tmp_path / "log")
    _fill(log, 3000)
    snapdir = tmp_path / "snapshots"
    truth, info = load_views(log, snapdir)
    assert info.snapshot_seq is None and info.reason == "no snapshot"

    head = apply_all(Views(), log.records(1, 2000))
    write_snapshot(snapdir, encode_snapshot(head, log.log_id()), 2000)
    views, info = load_views(log, snapdir)
    assert info.snapshot_seq == 2000 and info.tail_records == 1000
    assert views == truth

    # Unreadable newest snapshot: the older one is used; it is logged.
    head2 = apply_all(Views(), log.records(1, 2500))
    newest = write_snapshot(snapdir, encode_snapshot(head2, log.log_id()), 2500)
    newest.write_bytes(newest.read_bytes()[:-7] + b"garbage")
    views, info = load_views(log, snapdir)
    assert info.snapshot_seq == 2000 and "ignored" in info.reason
    assert views == truth
    assert any("ignored" in r.message for r in caplog.records)

    # Old version, another log, or every snapshot deleted: a full replay, same views.
    for path in list(snapdir.iterdir()):
        try:
            snap = msgspec.msgpack.decode(path.read_bytes())
        except msgspec.DecodeError:  # the one damaged above (how depends on where its last bytes fall)
            continue
        snap["schema"] = "0ld"
        path.write_bytes(msgspec.msgpack.encode(snap))
    views, info = load_views(log, snapdir)
    assert info.snapshot_seq is None and "old version" in info.reason
    assert views == truth
    write_snapshot(snapdir, encode_snapshot(head, "another-log"), 2000)
    views, info = load_views(log, snapdir)
    assert info.snapshot_seq is None and "another log" in info.reason
    for path in snapdir.iterdir():
        path.unlink()
    views, info = load_views(log, snapdir)
    assert info.snapshot_seq is None and views == truth


def test_snapshot_writes_do_not_share_a_temporary_file_and_crash_leftovers_are_removed(tmp_path: Path) -> None:
    import threading

    from eventsrc.log.snapshots import remove_stale_temporaries, snapshot_files

    snapdir = tmp_path / "snapshots"
    errors: list[BaseException] = []

    def write() -> None:
        try:
            write_snapshot(snapdir, b"x" * (1 << 20), 100)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    for _ in range(10):
        threads = [threading.Thread(target=write) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == [] and [p.name for p in snapshot_files(snapdir)] == ["snapshot-00000000000000000100.msgpack"]
    (snapdir / ".snapshot-00000000000000000200.msgpack.abc.tmp").write_bytes(b"half")  # a crash mid-write
    remove_stale_temporaries(snapdir)
    assert sorted(p.name for p in snapdir.iterdir()) == ["snapshot-00000000000000000100.msgpack"]


def test_views_written_with_plain_string_states_decode_into_the_typed_views() -> None:
    """Before the lifecycle tables typed them, states were plain strings: the same values decode."""
    old = {
        "devices": {"devices": {"r": {"d0": {"health": "Healthy", "holder": "u1/c", "hold": "reserved"}}}},
        "pods": {"pods": {"u1": {"uid": "u1", "state": "admitting"}}},
        "claims": {"claims": {"c1": {"uid": "c1", "state": ""}, "c2": {"uid": "c2", "state": "prepare-failed"}}},
    }
    v = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=Views)
    assert v.devices.devices["r"]["d0"].hold == "reserved" and v.pods.pods["u1"].state == "admitting"
    assert [c.state for c in v.claims.claims.values()] == ["", "prepare-failed"]
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(
            msgspec.msgpack.encode({"pods": {"pods": {"u": {"uid": "u", "state": "odd"}}}}), type=Views
        )
