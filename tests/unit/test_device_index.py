"""The device and CPU indexes beside the views (``state.devices.DeviceIndex``,
``state.cpus.CPUIndex``): kept by the reducers, they equal indexes built from scratch after
any sequence of events; they are never in a snapshot; and a plan made with them is the plan
made from the device table alone, in the packing order the planner has always used."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Generator, Iterable, Mapping

import msgspec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eventsrc import events as ev
from eventsrc.core.devices.choice import (
    Hint,
    PodPlan,
    PreferredAsk,
    PreferredFailed,
    Refusal,
    ResourceState,
    _narrowest_holding,
    _packing_order,
    _Pool,
    _split_by_affinity,
    aligned_nodes,
    filter_by_affinity,
    natural_key,
    plan_pod,
)
from eventsrc.core.devices.holds import holdings
from eventsrc.events import ContainerSpec, Record
from eventsrc.state import cpus as cpu_state
from eventsrc.state import devices as device_state
from eventsrc.state.apply import apply, rebuild
from eventsrc.state.devices import DeviceIndex, index_of
from eventsrc.state.lifecycles import parse_holder
from eventsrc.state.views import DeviceView, Views
from tests.unit.test_projections import as_records
from tests.unit.test_projections import events as any_event

# Device and CPU events on a few pods, containers and devices, so that they collide: holds
# and releases of the same devices, lists and drops of the held ones. The rest of the events
# (any of ``test_projections``) now and then.
pods = st.sampled_from(["p1", "p2"])
containers = st.sampled_from(["main", "init"])
resources = st.sampled_from(["example.com/gpu", "example.com/gpu", "example.com/nic"])
some_ids = st.lists(st.sampled_from(["d0", "d1", "d2", "d10"]), min_size=1, max_size=3, unique=True)
numa = st.lists(st.integers(0, 2), max_size=2)
health = st.sampled_from(["Healthy", "Healthy", "Unhealthy"])
cpus = st.lists(st.integers(0, 5), max_size=3)
device_info = st.builds(ev.DeviceInfo, id=st.sampled_from(["d0", "d1", "d2", "d10"]), health=health, numa_nodes=numa)
DEVICE_STRATEGIES = [
    st.builds(ev.DevicesAdded, resource=resources, devices=st.lists(device_info, min_size=1, max_size=4)),
    st.builds(ev.DevicesRemoved, resource=resources, device_ids=some_ids),
    st.builds(ev.ResourceDropped, resource=resources),
    st.builds(
        ev.DeviceHealthChanged,
        resource=resources,
        device_id=st.sampled_from(["d0", "d1", "d9"]),
        health=health,
        numa_nodes=numa,
    ),
    st.builds(ev.DevicesReserved, pod_uid=pods, container=containers, resource=resources, device_ids=some_ids),
    st.builds(ev.DevicesAllocated, pod_uid=pods, container=containers, resource=resources, device_ids=some_ids),
    st.builds(ev.AllocationFailed, pod_uid=pods, container=containers, resource=resources, device_ids=some_ids),
    st.builds(ev.DevicesReleased, pod_uid=pods, container=containers, resource=resources, device_ids=some_ids),
    st.builds(ev.CPUsAssigned, pod_uid=pods, container=containers, cpus=cpus),
    st.builds(ev.CPUsReleased, pod_uid=pods, container=containers, cpus=cpus),
]
device_events = st.integers(0, len(DEVICE_STRATEGIES) - 1).flatmap(lambda k: DEVICE_STRATEGIES[k])
event_lists = st.lists(
    st.integers(0, 5).flatmap(lambda k: any_event if k == 0 else device_events), min_size=1, max_size=80
)


def record(i: int, e: ev.EventBase) -> Record:
    return Record(i, 1000 + i, "c", e.VERSION, e)  # type: ignore[arg-type]


def assert_indexes_fresh(v: Views) -> None:
    assert index_of(v.devices) == DeviceIndex.build(v.devices.devices)
    assert cpu_state.index_of(v.cpus) == cpu_state.CPUIndex.build(v.cpus.assignments)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_lists, st.data())
def test_the_indexes_the_reducers_keep_equal_indexes_built_from_scratch(
    evs: list[ev.EventBase], data: st.DataObject
) -> None:
    v = Views()
    # built on an empty table, or part way (as after a snapshot), then kept by the reducers
    built_at = data.draw(st.integers(0, len(evs)))
    for i, e in enumerate(evs, start=1):
        if i - 1 == built_at:
            index_of(v.devices)
            cpu_state.index_of(v.cpus)
        apply(v, record(i, e))
        if i - 1 >= built_at and data.draw(st.booleans()):
            assert_indexes_fresh(v)
    assert_indexes_fresh(v)


# Records of many devices at once (a plugin's list: ``DevicesAdded`` of up to 500), some
# listed twice in one record, some already known (an update), some held: the index keeps
# each free set in order with one sort per record (``DeviceIndex.sync_many``).
many_ids = [f"d{i}" for i in range(30)]
many_info = st.builds(ev.DeviceInfo, id=st.sampled_from(many_ids), health=health, numa_nodes=numa)
many_events = st.lists(
    st.one_of(
        st.builds(ev.DevicesAdded, resource=resources, devices=st.lists(many_info, min_size=1, max_size=40)),
        st.builds(ev.DevicesRemoved, resource=resources, device_ids=st.lists(st.sampled_from(many_ids), max_size=10)),
        st.builds(
            ev.DevicesReserved,
            pod_uid=pods,
            container=containers,
            resource=resources,
            device_ids=st.lists(st.sampled_from(many_ids), min_size=1, max_size=3, unique=True),
        ),
    ),
    min_size=1,
    max_size=12,
)


def indexed_views(evs: list[ev.EventBase], after_each: Callable[[Views], None] | None = None) -> Views:
    """The views of ``evs``, their device index built before the first and kept by the
    reducers; ``after_each`` called with them after each record."""
    v = Views()
    index_of(v.devices)
    for i, e in enumerate(evs, start=1):
        apply(v, record(i, e))
        if after_each is not None:
            after_each(v)
    return v


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(many_events)
def test_records_of_many_devices_keep_the_index_fresh(evs: list[ev.EventBase]) -> None:
    indexed_views(evs, after_each=assert_indexes_fresh)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_lists)
def test_the_index_says_what_a_pass_over_the_table_says(evs: list[ev.EventBase]) -> None:
    v = indexed_views(evs)
    index = index_of(v.devices)
    for resource, table in v.devices.devices.items():
        r = index.resources.get(resource, device_state.ResourceIndex())
        # the planner's "healthy - in_use": healthy, listed, held by nobody
        assert set(r.free.set_of) == {
            i for i, d in table.items() if d.health == "Healthy" and not d.removed and not d.holder
        }
        # the hints' "healthy, held by nobody" is the same set: a device no longer listed is held
        assert set(r.free.set_of) == {i for i, d in table.items() if d.health == "Healthy" and not d.holder}
        assert r.healthy == sum(1 for d in table.values() if d.health == "Healthy" and not d.removed)
        for ids in r.free.by_set.values():
            assert ids == sorted(ids, key=lambda i: (natural_key(i), i))
    for uid in {p.pod_uid for t in v.devices.devices.values() for d in t.values() if (p := parse_holder(d.holder))}:
        expected: dict[tuple[str, str], set[str]] = {}
        for resource, table in v.devices.devices.items():
            for device_id, d in table.items():
                holder = parse_holder(d.holder)
                if holder is not None and holder.pod_uid == uid:
                    expected.setdefault((holder.container, resource), set()).add(device_id)
        assert {k: set(ids) for k, ids in holdings(v, uid).items()} == expected
    assigned = {c for containers in v.cpus.assignments.values() for cpus in containers.values() for c in cpus}
    assert cpu_state.index_of(v.cpus).assigned() == assigned
    for uid in v.cpus.assignments:
        others = {c for u, cs in v.cpus.assignments.items() if u != uid for cpus in cs.values() for c in cpus}
        assert cpu_state.index_of(v.cpus).assigned(uid) == others


@settings(max_examples=100, deadline=None)
@given(st.lists(device_events, max_size=40))
def test_the_index_is_not_in_a_snapshot(evs: list[ev.EventBase]) -> None:
    records = as_records(evs)
    plain = rebuild(records)
    indexed = rebuild(records)
    index_of(indexed.devices)
    cpu_state.index_of(indexed.cpus)
    assert msgspec.msgpack.encode(indexed) == msgspec.msgpack.encode(plain)
    assert msgspec.json.encode(indexed) == msgspec.json.encode(plain)
    loaded = msgspec.msgpack.decode(msgspec.msgpack.encode(indexed), type=Views)
    assert loaded == indexed
    assert index_of(loaded.devices) == index_of(indexed.devices)


def test_an_index_follows_a_table_replaced_in_the_views() -> None:
    v = rebuild(as_records([ev.DevicesAdded(resource="r", devices=[ev.DeviceInfo(id="a", health="Healthy")])]))
    assert set(index_of(v.devices).resources["r"].free.set_of) == {"a"}
    v.devices.devices = {"r": {"b": DeviceView(health="Healthy")}}
    assert set(index_of(v.devices).resources["r"].free.set_of) == {"b"}


# --------------------------------------------------------------------------- the planner


def reference_packing_order(
    ids: Iterable[str], table: Mapping[str, DeviceView], needed: int, numa_nodes: list[int]
) -> list[str]:
    """The packing order as the planner had it before the index: a key per device, ties on
    the natural key broken by the id."""
    ids = list(dict.fromkeys(ids))
    if needed <= 0 or not ids:
        return []
    machine = frozenset(numa_nodes)
    nodes_of = {i: tuple(sorted(set(aligned_nodes(table[i].numa_nodes, machine)))) if i in table else () for i in ids}
    per_set: dict[tuple[int, ...], int] = {}
    for nodes in nodes_of.values():
        if nodes:
            per_set[nodes] = per_set.get(nodes, 0) + 1
    best = _narrowest_holding(sorted(machine), per_set, needed)

    def key(i: str) -> tuple[object, ...]:
        nodes = nodes_of[i]
        inside = bool(best) and bool(nodes) and best.issuperset(nodes)
        return (not inside, nodes or (1 << 30,), natural_key(i), i)

    return heapq.nsmallest(needed, ids, key=key)


ids = st.sampled_from([f"{p}{n}" for p in ("d", "d-", "gpu") for n in ("0", "1", "01", "2", "10", "11")])
tables = st.dictionaries(
    ids,
    st.builds(
        DeviceView,
        health=st.sampled_from(["Healthy", "Healthy", "Unhealthy"]),
        numa_nodes=st.lists(st.integers(0, 4), max_size=3),
    ),
    max_size=14,
)
machines = st.sampled_from([[0], [0, 1], [0, 1, 2, 3]])


@example(  # one device on node 0, two on node 1: two go to node 1, the narrowest that holds them
    {
        "d1": DeviceView(health="Healthy", numa_nodes=[0]),
        **dict.fromkeys(["d2", "d3"], DeviceView(health="Healthy", numa_nodes=[1])),
    },
    None,
    [0, 1],
    2,
).via("the narrowest set first")
@settings(max_examples=500, deadline=None)
@given(tables, st.data(), machines, st.integers(0, 8))
def test_the_packing_order_is_the_one_before_the_index(
    table: dict[str, DeviceView], data: st.DataObject | None, machine: list[int], needed: int
) -> None:
    if data is None:
        candidates = list(table)
    else:
        candidates = data.draw(st.lists(st.sampled_from(sorted(table)), max_size=len(table)) if table else st.just([]))
        candidates += data.draw(st.lists(ids, max_size=2))  # not in the table: no topology
    assert _packing_order(candidates, table, needed, machine) == reference_packing_order(
        candidates, table, needed, machine
    )


@settings(max_examples=300, deadline=None)
@given(tables, st.data(), machines)
def test_a_pool_splits_by_affinity_as_the_devices_do(
    table: dict[str, DeviceView], data: st.DataObject, machine: list[int]
) -> None:
    hint = data.draw(st.none() | st.frozensets(st.sampled_from(machine), min_size=1))
    minus = data.draw(st.sets(ids, max_size=4))
    pool = _Pool.of(table, table).without(minus)
    everywhere = _Pool.of(table, table).counts()
    got = _split_by_affinity(pool, everywhere, hint, machine)
    assert tuple(set(p) for p in got) == filter_by_affinity(set(table) - minus, table, hint, machine)
    assert [len(p) for p in got] == [len(set(p)) for p in got]


pod_shapes = st.lists(
    st.tuples(st.sampled_from(["init", "app", "sidecar"]), st.integers(0, 3), st.integers(0, 2)),
    min_size=1,
    max_size=3,
)


def drive(
    gen: Generator[PreferredAsk, list[str] | PreferredFailed, PodPlan], answer: int
) -> tuple[PodPlan | str, list[PreferredAsk]]:
    """Run the planner; the plugin prefers the ``answer``-th device ids of each list it gets."""
    asks: list[PreferredAsk] = []
    try:
        ask = next(gen)
        while True:
            asks.append(ask)
            ask = gen.send(ask.available[answer :: answer + 1] if answer < 3 else PreferredFailed("no"))
    except StopIteration as stop:
        return stop.value, asks
    except Refusal as refusal:
        return str(refusal), asks


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(device_events, max_size=40), pod_shapes, machines, st.data())
def test_a_plan_with_the_index_is_the_plan_from_the_table(
    evs: list[ev.EventBase], shape: list[tuple[str, int, int]], machine: list[int], data: st.DataObject
) -> None:
    v = Views()
    gpu = "example.com/gpu"
    evs = [
        ev.DevicesAdded(
            resource=gpu, devices=[ev.DeviceInfo(id=f"g{i}", health="Healthy", numa_nodes=[i % 2]) for i in range(5)]
        ),
        *evs,
    ]
    for i, e in enumerate(evs, start=1):
        apply(v, record(i, e))
    resources = sorted(v.devices.devices)
    if not resources:
        return
    containers = [ContainerSpec(name=f"c{k}", kind=kind) for k, (kind, _, _) in enumerate(shape)]
    requests = {f"c{k}": {resources[r % len(resources)]: n} for k, (_, n, r) in enumerate(shape) if n}
    hint = data.draw(st.none() | st.frozensets(st.sampled_from(machine), min_size=1))
    hints = {(c, r): hint for c, reqs in requests.items() for r in reqs}
    answer = data.draw(st.integers(0, 3))
    offers = data.draw(st.booleans())
    per_container = data.draw(st.booleans())
    index = index_of(v.devices)

    def plan(indexed: bool) -> tuple[object, ...]:
        states = {}
        for r in resources:
            table = v.devices.devices[r]
            if indexed:
                ri = index.resources.get(r) or device_state.ResourceIndex()
                states[r] = ResourceState(
                    table, set(), offers, free=ri.free, everywhere=ri.everywhere, healthy=ri.healthy
                )
            else:
                states[r] = ResourceState(table, {i for i, d in table.items() if d.holder}, offers)
        seen: list[object] = []

        def affinity_of(c: ContainerSpec, device_hints: dict[str, list[Hint] | None]) -> frozenset[int] | None:
            seen.append((c.name, device_hints))  # the device hints, worked out container by container
            return hint

        if per_container:
            gen = plan_pod(containers, requests, states, numa_nodes=machine, affinity_of=affinity_of)
        else:
            gen = plan_pod(containers, requests, states, hints=hints, numa_nodes=machine)
        got, asks = drive(gen, answer)
        steps = (
            got
            if isinstance(got, str)
            else [(s.container, s.resource, s.device_ids, s.choice, s.note) for s in got.steps]
        )
        taken = {r: s.in_use - {i for i, d in v.devices.devices[r].items() if d.holder} for r, s in states.items()}
        return (
            steps,
            [(a.container, a.resource, sorted(a.available), sorted(a.must_include), a.size) for a in asks],
            taken,
            seen,
        )

    assert plan(indexed=True) == plan(indexed=False)
    assert_indexes_fresh(v)  # planning changes nothing in the views or their index


def test_every_numa_set_is_visited_once_per_take() -> None:
    # 10,000 free devices on two NUMA nodes: taking one reads the sets' heads, never the rest.
    table = {f"d{i}": DeviceView(health="Healthy", numa_nodes=[i % 2]) for i in range(10_000)}
    v = Views()
    v.devices.devices["r"] = table
    free = index_of(v.devices).resources["r"].free
    seen: list[str] = []

    class Spy(list[str]):
        def __iter__(self):  # type: ignore[no-untyped-def]
            for i in super().__iter__():
                seen.append(i)
                yield i

    for key in free.by_set:
        free.by_set[key] = Spy(free.by_set[key])
    state = ResourceState(table, set(), free=free, everywhere={(0,): 5000, (1,): 5000}, healthy=10_000)
    got, _ = drive(plan_pod([ContainerSpec(name="c")], {"c": {"r": 1}}, {"r": state}, numa_nodes=[0, 1]), 0)
    assert isinstance(got, PodPlan)
    assert got.steps[0].device_ids == ["d0"]
    assert seen == ["d0"]


def test_device_ids_in_natural_order_whatever_their_characters() -> None:
    """A plugin names its devices: "¹" is a digit to ``str.isdigit`` and not to ``int``, and
    digits of other scripts are digits (found by test_fuzz_device_lists)."""
    ids = ["dev-10", "¹", "dev-2", "dev-¹0", "٣", "dev-٢", "x"]
    ordered = sorted(ids, key=natural_key)
    assert ordered.index("dev-2") < ordered.index("dev-10")
    assert ordered.index("dev-٢") < ordered.index("dev-10")
    assert natural_key("¹") == ("¹",) and natural_key("dev-2") == ("dev-", 2, "")
