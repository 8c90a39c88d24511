"""The usage index (``eventsrc.log.usage_index``) gives the answer of a plain scan of every
record, for random logs: gaps that hide holds (the nanoseconds inside them counted apart),
clocks that step back, records cut into the archive by the real retention code, the index
brought up to date in several steps of chunks of any size, and any window."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eventsrc import events as ev
from eventsrc.core.chargeback import window
from eventsrc.layout import Layout
from eventsrc.log import cut_steps as steps
from eventsrc.log import usage_index
from eventsrc.log.history import History
from eventsrc.log.store import EventLog
from eventsrc.log.usage_index import UsageIndex, kept
from eventsrc.offline.usage import scan_totals
from tests.unit.test_usage import EVENTS, GPU, T0, H, S

STEPS = st.integers(-15, 30).map(lambda m: m * 60 * S)  # minutes between records, a few backwards
QUARTERS = st.integers(-2, 40).map(lambda q: T0 + q * H // 4)
#: gaps opened and closed (a few since_ns, so that closing records find what they close), or
#: recorded closed at once; of every source, one that hides nothing ("kubelet allocatable")
GAPS = st.builds(
    ev.ObservationGapFound,
    source=st.sampled_from(["eventsrc", "kubelet", "runtime", "kubelet allocatable"]),
    since_ns=QUARTERS,
    until_ns=st.just(0) | QUARTERS,
)


@contextmanager
def chunks_of(records: int) -> Iterator[None]:
    kept_chunk, usage_index.CHUNK = usage_index.CHUNK, records
    try:
        yield
    finally:
        usage_index.CHUNK = kept_chunk


def cut(log: EventLog, archive: Path, seq: int) -> None:
    steps.commit(log, steps.prepare(log, archive, seq))
    while steps.delete_some(log)[0]:
        pass


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(EVENTS | GAPS, STEPS), min_size=1, max_size=60),
    st.lists(st.floats(0, 1), max_size=3),
    st.floats(0, 0.8) | st.none(),
    st.lists(st.tuples(st.integers(-2, 40), st.integers(-2, 40)), min_size=1, max_size=4),
    st.sets(st.sampled_from(["cpu", GPU, "dra1", "memory", "hugepages-2Mi"]), max_size=2),
    st.integers(1, 8) | st.just(usage_index.CHUNK),
)
@example(  # found in CI's run: a point older than the last one already in the index, in a later update
    records=[
        (ev.KubeletCPUsObserved(pod=ev.PodRef(uid="", namespace="ns", name="p"), container="m", cpus=[0]), 0),
        (ev.CPUsAssigned(cpus=[0], pod_uid="a", container="m"), -1 * 60 * S),
    ],
    splits=[0.5],
    cut_at=None,
    windows=[(0, 0)],
    resources=set(),
    chunk=usage_index.CHUNK,
)
@example(  # memory: holds weighted by their bytes, one changed, one ended by its pod's release
    records=[
        (ev.KubeletMemoryObserved(pod=ev.PodRef(uid="u", namespace="ns", name="p"), container="m", memory=[
            ev.ObservedMemory(memory_type="memory", size=3 << 30, numa_nodes=[0]),
            ev.ObservedMemory(memory_type="hugepages-2Mi", size=1, numa_nodes=[]),
        ]), 0),
        (ev.KubeletMemoryObserved(pod=ev.PodRef(uid="u", namespace="ns", name="p"), container="m", memory=[
            ev.ObservedMemory(memory_type="memory", size=1 << 30, numa_nodes=[0]),
        ]), 15 * 60 * S),
        (ev.KubeletPodReleased(pod=ev.PodRef(uid="u", namespace="ns", name="p")), 30 * 60 * S),
    ],
    splits=[0.5],
    cut_at=None,
    windows=[(-1, -1), (1, 2)],
    resources=set(),
    chunk=1,
)  # fmt: skip
def test_the_index_answers_as_a_scan_does(
    records: list[tuple[ev.EventBase, int]],
    splits: list[float],
    cut_at: float | None,
    windows: list[tuple[int, int]],
    resources: set[str],
    chunk: int,
) -> None:
    """``chunk``: records a write transaction (and a mapping of the files) takes."""
    with tempfile.TemporaryDirectory() as tmp, chunks_of(chunk):
        layout = Layout(Path(tmp))
        layout.state.mkdir()
        log = EventLog(layout.log)
        index = UsageIndex(layout.usage)
        points = sorted({int(f * len(records)) for f in splits})
        ts = T0
        for i, (e, step) in enumerate(records):
            ts += step
            log.append([e], f"c{i}", ts)
            if i + 1 in points:  # the index brought up to date part way
                index.catch_up(kept(History(log, layout.archive)))
        if cut_at is not None and int(cut_at * len(records)) >= 1:
            cut(log, layout.archive, int(cut_at * len(records)))
        history = History(log, layout.archive)
        index.catch_up(kept(history))
        now = ts + 10 * H
        for a, b in windows:
            since, until = (None if a < 0 else T0 + a * H // 4), (None if b < 0 else T0 + b * H // 4)
            w = window(since, until, now)
            for by in ("namespace", "pod", "device", "resource"):
                expected, _ = scan_totals(history, by, w, frozenset(resources))
                assert index.totals(by, w, frozenset(resources)) == expected, (by, w)
        index.close()
        log.close()


def test_a_log_restored_to_another_history_is_rebuilt(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.state.mkdir()
    log = EventLog(layout.log)
    admit = ev.PodAdmitted(pod=ev.PodRef(uid="a", namespace="n", name="p"))
    log.append([admit, ev.DevicesAllocated(pod_uid="a", container="m", resource=GPU, device_ids=["g0"])], "c", T0)
    with UsageIndex(layout.usage) as index:
        assert index.catch_up(kept(History(log, layout.archive))).how == "built"
        assert index.catch_up(kept(History(log, layout.archive))).how == "current"
    log.close()
    for f in layout.log.iterdir():
        f.unlink()
    log = EventLog(layout.log)  # another log (another id) in its place
    log.append([admit], "c", T0)
    with UsageIndex(layout.usage) as index:
        update = index.catch_up(kept(History(log, layout.archive)))
        assert update.how == "rebuilt" and "another log" in update.why
        assert index.totals("device", window(None, None, T0 + H)) == []
    log.close()


def test_a_point_older_than_the_last_one_rewrites_the_running_sums_after_it(tmp_path: Path) -> None:
    """A clock stepped back: pod b's hold starts before pod a's, in a later record."""
    layout = Layout(tmp_path)
    layout.state.mkdir()
    log = EventLog(layout.log)
    for i, (t, e) in enumerate(
        [
            (T0, ev.PodAdmitted(pod=ev.PodRef(uid="a", namespace="n", name="a"))),
            (T0, ev.PodAdmitted(pod=ev.PodRef(uid="b", namespace="n", name="b"))),
            (T0 + 2 * H, ev.DevicesAllocated(pod_uid="a", container="m", resource=GPU, device_ids=["g0"])),
            (T0 + 3 * H, ev.DevicesAllocated(pod_uid="a", container="m", resource=GPU, device_ids=["g1"])),
            (T0 + H, ev.DevicesAllocated(pod_uid="b", container="m", resource=GPU, device_ids=["g2"])),
            (T0 + 4 * H, ev.DevicesReleased(pod_uid="b", container="m", resource=GPU, device_ids=["g2"])),
        ]
    ):
        log.append([e], f"c{i}", t)
    history = History(log, layout.archive)
    with UsageIndex(layout.usage) as index:
        index.catch_up(kept(history))
        for since, until in [(None, None), (T0 + 2 * H + H // 2, T0 + 5 * H), (T0, T0 + 3 * H)]:
            w = window(since, until, T0 + 6 * H)
            assert index.totals("namespace", w) == scan_totals(history, "namespace", w, frozenset())[0]
    log.close()
