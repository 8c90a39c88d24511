"""``eventsrc bench log``: this machine's figures next to raw ceilings from the same run.

Nothing here is a test: it prints numbers. Each figure is the median of ``rounds``.
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

import lmdb
import trio

from eventsrc import events as ev
from eventsrc.log.commit import GroupCommitter, new_correlation_id
from eventsrc.log.snapshots import encode_snapshot, load_views, write_snapshot
from eventsrc.log.store import EventLog, PendingAppend, seq_key
from eventsrc.state.apply import apply_all, rebuild
from eventsrc.state.views import Views

GPU = "example.com/gpu"
NIC = "example.com/nic"


def workload(n_events: int, live_pods: int = 32) -> Iterator[ev.EventBase]:
    """A realistic stream: two plugins, then pods that come and go, each taking a device,
    CPUs and a claim and giving them back. Deterministic."""
    plugins = _plugin_events()
    yield from plugins
    count = len(plugins)
    live: list[_LivePod] = []
    i = 0
    while count < n_events:
        batch, pod = _pod_events(i)
        live.append(pod)
        if len(live) > live_pods:
            batch += _removal_events(live.pop(0))
        for e in batch:
            if count >= n_events:
                return
            yield e
            count += 1
        i += 1


_LivePod = tuple[str, str, list[int], str]  # pod uid, its VF, its CPUs, its claim's uid


def _plugin_events() -> list[ev.EventBase]:
    """A GPU plugin (8 devices, with preferred allocations), a NIC plugin (64 VFs) and a DRA driver."""
    return [
        ev.PluginRegistered(
            resource=GPU, endpoint="gpu.sock", options=ev.PluginOptions(get_preferred_allocation_available=True)
        ),
        ev.DevicesAdded(
            resource=GPU,
            devices=[ev.DeviceInfo(id=f"gpu-{i}", health="Healthy", numa_nodes=[i // 4]) for i in range(8)],
        ),
        ev.PluginRegistered(resource=NIC, endpoint="nic.sock"),
        ev.DevicesAdded(
            resource=NIC,
            devices=[ev.DeviceInfo(id=f"vf-{i}", health="Healthy", numa_nodes=[i % 2]) for i in range(64)],
        ),
        ev.PluginRegistered(resource="gpu.example.com", endpoint="/plugins/gpu/dra.sock", kind="DRAPlugin"),
    ]


def _pod_events(i: int) -> tuple[list[ev.EventBase], _LivePod]:
    """Pod ``i`` admitted with a VF, 2 CPUs and a prepared claim (every 50th pod, a GPU's
    health changes as well)."""
    uid = f"pod-{i:08d}"
    vf = f"vf-{i % 64}"
    cpus = [2 + (i % 30), 34 + (i % 30)]
    claim = ev.ClaimRef(uid=f"claim-{i:08d}", namespace="default", name=f"gpu-claim-{i}")
    batch: list[ev.EventBase] = [
        ev.PodAdmitted(
            pod=ev.PodRef(uid=uid, namespace="default", name=f"job-{i}"),
            containers=[ev.ContainerSpec(name="main", requests={NIC: "1", "cpu": "2"}, limits={NIC: "1", "cpu": "2"})],
            qos_class="Guaranteed",
        ),
        ev.DevicesReserved(pod_uid=uid, container="main", resource=NIC, device_ids=[vf]),
        ev.DevicesAllocated(
            pod_uid=uid,
            container="main",
            resource=NIC,
            device_ids=[vf],
            response=ev.ContainerAllocation(
                envs={"NIC_VF": vf},
                devices=[ev.DeviceSpec(container_path="/dev/vfio/1", host_path="/dev/vfio/1", permissions="rw")],
                cdi_devices=[f"example.com/nic={vf}"],
            ),
        ),
        ev.CPUsAssigned(pod_uid=uid, container="main", cpus=cpus),
        ev.PodReferenceAdded(claim_uid=claim.uid, pod_uid=uid),
        ev.ClaimPrepareStarted(claim=claim, driver="gpu.example.com", pod_uid=uid),
        ev.ClaimPrepared(
            claim=claim,
            driver="gpu.example.com",
            devices=[
                ev.PreparedDevice(
                    request_names=["gpu"],
                    pool_name="node-a",
                    device_name=f"gpu-{i % 8}",
                    cdi_device_ids=[f"gpu.example.com/gpu=gpu-{i % 8}"],
                )
            ],
        ),
    ]
    if i % 50 == 0:
        batch.append(
            ev.DeviceHealthChanged(
                resource=GPU,
                device_id=f"gpu-{i % 8}",
                health="Unhealthy" if i % 100 else "Healthy",
                numa_nodes=[(i % 8) // 4],
            )
        )
    return batch, (uid, vf, cpus, claim.uid)


def _removal_events(pod: _LivePod) -> list[ev.EventBase]:
    """The pod's VF, CPUs and claim given back, then the pod removed."""
    uid, vf, cpus, claim_uid = pod
    ref = ev.ClaimRef(uid=claim_uid, namespace="default")
    return [
        ev.DevicesReleased(pod_uid=uid, container="main", resource=NIC, device_ids=[vf], reason="pod removed"),
        ev.CPUsReleased(pod_uid=uid, container="main", cpus=cpus, reason="pod removed"),
        ev.PodReferenceRemoved(claim_uid=claim_uid, pod_uid=uid),
        ev.ClaimUnprepareStarted(claim=ref, driver="gpu.example.com"),
        ev.ClaimUnprepared(claim=ref, driver="gpu.example.com"),
        ev.PodRemoved(pod_uid=uid, reason="deleted"),
    ]


# --------------------------------------------------------------------------- ceilings


def fsyncs_per_second(directory: Path, seconds: float) -> float:
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        n = 0
        t0 = time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < seconds:
            os.write(fd, b"x" * 128)
            os.fdatasync(fd)
            n += 1
        return n / elapsed
    finally:
        os.close(fd)
        path.unlink()


def lmdb_commits_per_second(directory: Path, seconds: float) -> float:
    path = directory / "lmdb-probe"
    env = lmdb.open(str(path), map_size=1 << 28, sync=True, metasync=True)
    try:
        n = 0
        t0 = time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < seconds:
            with env.begin(write=True) as txn:
                txn.put(seq_key(n + 1), b"y" * 160, append=True)
            n += 1
        return n / elapsed
    finally:
        env.close()


def raw_iteration_rate(log: EventLog) -> float:
    t0 = time.perf_counter()
    n = 0
    with log.env.begin(db=log.events_db, buffers=True) as txn:
        for _ in txn.cursor().iternext(keys=True, values=True):
            n += 1
    return n / (time.perf_counter() - t0)


# --------------------------------------------------------------------------- measurements


def appends_per_second(path: Path, writers: int, seconds: float) -> tuple[float, float]:
    """Durable appends/s with ``writers`` concurrent trio tasks, and the mean batch size."""
    event = ev.DeviceHealthChanged(resource=GPU, device_id="gpu-0", health="Healthy", numa_nodes=[0])
    log = EventLog(path)
    try:
        committer = GroupCommitter(log)
        result: list[float] = []

        running = True

        async def writer() -> None:
            while running:
                await committer.append([event])

        async def main() -> None:
            nonlocal running
            async with trio.open_nursery() as nursery:
                await nursery.start(committer.run)
                await committer.append([event])  # warm the thread pool
                n0, b0 = committer.appended, committer.batches
                t0 = trio.current_time()
                async with trio.open_nursery() as inner:
                    for _ in range(writers):
                        inner.start_soon(writer)
                    await trio.sleep(seconds)
                    running = False
                elapsed = trio.current_time() - t0
                n, b = committer.appended - n0, committer.batches - b0
                result.extend([n / elapsed, n / max(b, 1)])
                nursery.cancel_scope.cancel()

        trio.run(main)
        return result[0], result[1]
    finally:
        log.close()


def trio_wake_floor(tasks: int, seconds: float) -> float:
    """Seconds per append of trio's own part at ``tasks`` writers: each task queues itself
    and parks, one task wakes the whole queue, as the committer does, with no work at all."""
    from trio.lowlevel import Abort, current_task, reschedule, wait_task_rescheduled

    queue: list[trio.lowlevel.Task] = []
    idle: list[trio.lowlevel.Task] = []
    woken = 0
    stop = False

    async def writer() -> None:
        while not stop:
            queue.append(current_task())
            if idle:
                reschedule(idle.pop())
            await wait_task_rescheduled(lambda _: Abort.FAILED)

    async def waker() -> None:
        nonlocal woken
        while not stop or queue:
            if not queue:
                idle.append(current_task())
                await wait_task_rescheduled(lambda _: Abort.FAILED)
            batch = queue[:]
            queue.clear()
            await trio.lowlevel.checkpoint()
            for t in batch:
                reschedule(t)
            woken += len(batch)

    async def main() -> float:
        nonlocal stop
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waker)
            for _ in range(tasks):
                nursery.start_soon(writer)
            await trio.sleep(0.05)
            n0, t0 = woken, time.perf_counter()
            await trio.sleep(seconds)
            n, dt = woken - n0, time.perf_counter() - t0
            stop = True  # every writer leaves at its next wake-up, the waker after them
            while idle:  # the waker may have parked before the writers saw ``stop``
                reschedule(idle.pop())
        return dt / max(n, 1)

    return trio.run(main)


def prepare_cost(path: Path, writers: int, rounds: int = 200) -> float:
    """Seconds per record to give a batch of ``writers`` one-event appends their sequence
    numbers, encoding, CRC, hash-chain link and index keys (``EventLog.prepare``; no I/O)."""
    event = ev.DeviceHealthChanged(resource=GPU, device_id="gpu-0", health="Healthy", numa_nodes=[0])
    log = EventLog(path)
    try:
        times = []
        for _ in range(rounds):
            batch = [PendingAppend([event], new_correlation_id()) for _ in range(writers)]
            t = time.perf_counter()
            log.prepare(batch)
            times.append(time.perf_counter() - t)
            log.abandon()
        return statistics.median(times) / writers  # a median, like the figures it is set beside
    finally:
        log.close()


def build_log(path: Path, n_events: int, progress: Callable[[int], None]) -> EventLog:
    log = EventLog(path)
    batch: list[ev.EventBase] = []
    cid = new_correlation_id()
    done = 0
    for e in workload(n_events):
        batch.append(e)
        if len(batch) == 20_000:
            log.commit([PendingAppend(batch, cid, time.time_ns())])
            done += len(batch)
            progress(done)
            batch = []
    if batch:
        log.commit([PendingAppend(batch, cid, time.time_ns())])
        progress(n_events)
    return log


def _fmt(x: float) -> str:
    return f"{x:,.0f}"


def run_log_bench(
    *,
    events: int,
    writers: int,
    seconds: float,
    rounds: int,
    snapshot_every: int,
    workdir: Path | None = None,
) -> None:
    out = sys.stdout
    with tempfile.TemporaryDirectory(prefix="eventsrc-bench-", dir=workdir) as tmp:
        d = Path(tmp)
        out.write(
            f"eventsrc bench log: {os.cpu_count()} cpus, Python {platform.python_version()}, "
            f"lmdb {lmdb.version()[0]}.{lmdb.version()[1]}.{lmdb.version()[2]}, in {d}\n"
            f"every figure is the median of {rounds} rounds\n\n"
        )

        def med(fn: Callable[[], float]) -> float:
            return statistics.median(fn() for _ in range(rounds))

        commit = _ceilings(out, d, med, seconds)
        _appends(out, d, med, writers, seconds, rounds, commit)
        log = _replay(out, d, med, events)
        _restart(out, d, med, log, events, snapshot_every)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out.write(f"peak RSS                                {rss:>12,.0f} MB\n")


_Median = Callable[[Callable[[], float]], float]  # the median of a figure over the rounds


def _ceilings(out: TextIO, d: Path, med: _Median, seconds: float) -> float:
    """Bare fdatasync and bare LMDB commit rates; the commit rate."""
    out.write("ceilings (raw, same run)\n")
    fsync = med(lambda: fsyncs_per_second(d, seconds / 2))
    out.write(f"  bare file write+fdatasync             {_fmt(fsync):>12} syncs/s\n")
    commit = med(lambda: lmdb_commits_per_second(d, seconds / 2))
    out.write(f"  bare LMDB durable commit (1 put)      {_fmt(commit):>12} commits/s\n")
    out.flush()

    return commit


def _appends(out: TextIO, d: Path, med: _Median, writers: int, seconds: float, rounds: int, commit: float) -> None:
    """Durable appends by one writer and by ``writers``, and where an append's time goes."""
    out.write("appends (durable: each returns after its commit is synced)\n")
    # One and many writers alternate in short pairs, so that the machine's drift hits
    # both alike; the ratio is the median of the per-pair ratios (3 pairs per round).
    ones: list[float] = []
    manys: list[float] = []
    batches: list[float] = []
    for r in range(3 * rounds):
        ones.append(appends_per_second(d / f"one-{r}", 1, seconds / 3)[0])
        rate, batch = appends_per_second(d / f"many-{r}", writers, seconds / 3)
        manys.append(rate)
        batches.append(batch)
    one = statistics.median(ones)
    many = statistics.median(manys)
    ratio = statistics.median(m / o for m, o in zip(manys, ones, strict=True))
    out.write(
        f"  1 writer                              {_fmt(one):>12} appends/s  ({one / commit:.2f} x bare LMDB commit)\n"
    )
    verdict = "ok" if ratio >= 20 else "BELOW TARGET"
    paired = ", ".join(f"{m / o:.1f}" for m, o in zip(manys, ones, strict=True))
    out.write(
        f"  {writers} writers                           {_fmt(many):>12} appends/s  "
        f"= {ratio:.1f} x one writer (median of {len(ones)} paired runs: {paired}; "
        f"target >= 20 x: {verdict}); mean batch {statistics.median(batches):.1f}\n"
    )
    # Where the time of one append goes at many writers, against what the goal allows:
    # with every writer in each batch, an append costs its share of one commit (about
    # what one writer's append costs) plus work of its own that no batch shares.
    own = 1 / many - (1 / one) / writers
    allowed = (1 / one) / 20 - (1 / one) / writers
    floor = med(lambda: trio_wake_floor(writers, 0.3))
    prep = prepare_cost(d / "prepare", writers)
    out.write(
        f"  per append at {writers} writers: {1e6 / many:.2f} us = "
        f"its share of a commit ({1e6 / one / writers:.2f} us) "
        f"+ its own work {own * 1e6:.2f} us; 20 x one writer allows its own work {allowed * 1e6:.2f} us\n"
        f"    of which: trio waking a parked task (floor, no work) {floor * 1e6:.2f} us; encode, CRC, hash chain "
        f"and index keys {prep * 1e6:.2f} us; the rest (queueing, records to LMDB, their pages) "
        f"{(own - floor - prep) * 1e6:.2f} us\n"
    )
    out.flush()


def _replay(out: TextIO, d: Path, med: _Median, events: int) -> EventLog:
    """A log of ``events`` built, iterated raw and replayed into every view; the log, open."""
    out.write(f"replay ({events:,} events)\n")
    t0 = time.perf_counter()

    def progress(done: int) -> None:
        if sys.stderr.isatty():
            sys.stderr.write(f"\r  building log: {done:,}/{events:,}")
            sys.stderr.flush()

    log = build_log(d / "big", events, progress)
    if sys.stderr.isatty():
        sys.stderr.write("\r" + " " * 60 + "\r")
    out.write(f"  built in {time.perf_counter() - t0:.1f} s, {log.disk_bytes() / 1e6:,.0f} MB on disk\n")
    raw = med(lambda: raw_iteration_rate(log))
    out.write(f"  LMDB iteration, no decoding (ceiling) {_fmt(raw):>12} records/s\n")

    def replay() -> float:
        t = time.perf_counter()
        views = rebuild(log.records())
        dt = time.perf_counter() - t
        assert views.meta.last_seq == events
        return events / dt

    rate = med(replay)
    verdict = "ok" if rate >= 300_000 else "BELOW TARGET"
    out.write(
        f"  full replay into all projections      {_fmt(rate):>12} events/s  "
        f"({rate / raw:.1%} of raw iteration; target >= 300,000: {verdict})\n"
    )
    out.flush()

    return log


def _restart(out: TextIO, d: Path, med: _Median, log: EventLog, events: int, snapshot_every: int) -> None:
    """A snapshot where the daemon would have written its last, then restarts timed (the log closed)."""
    # The daemon snapshots every N records, so a restart replays at most N - 1.
    snap_seq = max(events - (snapshot_every - 1), 1)
    views = apply_all(Views(), log.records(1, snap_seq))
    write_snapshot(d / "snapshots", encode_snapshot(views, log.log_id()), snap_seq)
    log.close()

    def restart() -> float:
        t = time.perf_counter()
        reopened = EventLog(d / "big")
        v, info = load_views(reopened, d / "snapshots")
        dt = time.perf_counter() - t
        assert info.snapshot_seq == snap_seq and v.meta.last_seq == events
        reopened.close()
        return dt

    restart_s = med(restart)
    verdict = "ok" if restart_s < 0.5 else "ABOVE TARGET"
    out.write(
        f"  restart: open + snapshot + tail       {restart_s:>12.3f} s         "
        f"(snapshot at {snap_seq:,}, tail {events - snap_seq:,}; target < 0.5 s: {verdict})\n"
    )
