"""The daemon: one trio task tree that wires the edges to the log and the views.

    serve()                          inside one trio-asyncio loop (grpclib runs on asyncio)
      │  (before the tree: take the root's lock, rebuild the views from snapshot + log)
      ├─ GroupCommitter.run          appends; applies each committed batch to the views
      ├─ serve_http(HealthApp)       --metrics-address only: /metrics, /healthz, /readyz (obs/metrics.py)
      │  (records DaemonStarted, ConfigurationChanged, what the last run left unfinished,
      │   then this start's CPU manager configuration; beside a kubelet, the time it was not
      │   running as a gap instead: node/beside.start_events)
      ├─ DeviceManager.run           device-plugins/kubelet.sock (Registration, through
      │                              rpc/bridge.serve_unix); one task per plugin endpoint
      ├─ DRAManager.run              finishes claim work (prepare, unprepare) when kicked, retries
      ├─ PluginWatcher.run           plugins_registry/: DRA drivers and device plugins register
      │                              (these three and PodResources: not beside a kubelet)
      ├─ Turns.run, Stalls.run       give Watch streams their turns to read the history, after
      │                              the decisions; cut off those whose client reads nothing
      │                              (api/readers.py)
      ├─ serve_unix(NodeService)     eventsrc/api.sock, mode 0600 (api/node.py): admit, remove,
      │                              list pods, watch; admission is node/admitter.py asking
      │                              core/admission.py for its decisions
      ├─ serve_unix(PodResources)    pod-resources/kubelet.sock (api/podresources.py)
      ├─ Beside.run                  --beside-kubelet only, in PodResources' place: asks the
      │                              kubelet and reads its files; records what it decided as
      │                              observed (node/beside.py, core/kubelet_observations.py)
      ├─ NRIPlugin.run               --nri-socket only: containerd's NRI plugin over ttrpc,
      │                              observe or enforce (node/nri.py, core/runtime_decisions.py)
      ├─ Shipper.run                 --fleet-nats only: the log's records to NATS JetStream for the
      │                              fleet; nothing waits for it (node/shipper.py, docs/fleet.md)
      ├─ Daemon.scrub                checks every record written before this start
      ├─ Daemon.snapshot_loop        writes a snapshot every ``snapshot_every`` records
      ├─ Retainer.run                finishes an interrupted retention cut; with logRetention,
      │                              cuts the live log at piece boundaries, a failed cut again
      │                              after a pause of 1 s doubling to 60 s (node/retainer.py)
      ├─ UsageKeeper.run             keeps the usage index current: its feeder, a process of
      │                              its own, every 5,000 records or 5 minutes (node/usage_keeper.py)
      └─ (ready; waits for SIGTERM / SIGINT, records DaemonStopped, writes a snapshot, cancels)

Every unix socket is served by grpclib through ``rpc/bridge.serve_unix``. State changes only
through ``Daemon.record``: append, and once the commit is durable, apply to the views.
Before any unix socket is served, the daemon records what the previous run left unfinished
(``core.devices.holds.restart_events``).
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio
import trio_asyncio

from eventsrc import __version__
from eventsrc import events as ev
from eventsrc.api.node import History, NodeService, status_response
from eventsrc.api.podresources import PodResourcesService
from eventsrc.api.readers import WATCH_STALL, Stalls, Turns
from eventsrc.core.admission import AdmissionConfig
from eventsrc.core.cpu.assignment import StaticPolicyOptions
from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.core.cpu.static import CPUManagerConfig, allocatable_cpus, pool_events, startup_events
from eventsrc.core.cpu.topology import single_cpu_topology
from eventsrc.core.devices.holds import restart_events
from eventsrc.core.memory.manager import MemoryManagerConfig, allocatable_memory
from eventsrc.core.memory.manager import startup_events as memory_startup_events
from eventsrc.core.retention_policy import Retention
from eventsrc.core.retention_policy import trouble as retention_trouble
from eventsrc.core.shipping import ShippingReport
from eventsrc.core.shipping import trouble as shipping_trouble
from eventsrc.core.topology_manager import TopologyManager, parse_topology_manager
from eventsrc.errors import DamagedLogError, EventsrcError, NewerLogError
from eventsrc.events import CorruptRecordError, FutureRecordError, Record, newer_unreadable
from eventsrc.gen.node.v1 import node_pb2
from eventsrc.inputs.config import OBSERVATIONS_WAIT, Configuration, Duration
from eventsrc.inputs.config import changes as configuration_changes
from eventsrc.inputs.config import recorded as recorded_config
from eventsrc.layout import Layout
from eventsrc.log.commit import GroupCommitter
from eventsrc.log.cut_steps import undo_unfinished
from eventsrc.log.snapshots import (
    RebuildInfo,
    fork_snapshot,
    furthest,
    load_views,
    remove_stale_temporaries,
    snapshot_files,
    snapshot_path,
    wait_snapshot,
)
from eventsrc.log.store import DirLock, EventLog
from eventsrc.node.admitter import DEFAULT_ADMISSION_WAIT, Admission
from eventsrc.node.beside import Beside, BesideOptions, refuse_root_inside, start_events
from eventsrc.node.device_manager import DEFAULT_GRACE, DeviceManager, RegistryHandler
from eventsrc.node.dra_manager import DRAManager
from eventsrc.node.interfaces import record_or_log
from eventsrc.node.nri import NRIOptions, NRIPlugin
from eventsrc.node.plugin_watcher import PluginWatcher
from eventsrc.node.retainer import Retainer
from eventsrc.node.shipper import FleetOptions, Shipper
from eventsrc.node.usage_keeper import UsageKeeper
from eventsrc.obs import systemd
from eventsrc.obs.logger import current_correlation_id, get_logger
from eventsrc.obs.loop import LoopHolds
from eventsrc.obs.metrics import (
    STALL_SECONDS,
    HealthApp,
    Metrics,
    check_address,
    parse_address,
    serve_http,
)
from eventsrc.rpc.bridge import check_socket_path, raise_open_files_limit, serve_unix
from eventsrc.state.apply import apply_all
from eventsrc.state.lifecycles import QUARANTINED
from eventsrc.state.views import Views

log = get_logger(__name__)

DEFAULT_SNAPSHOT_EVERY = 10_000


def machine_boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def refuse_newer_records(event_log: EventLog, views: Views) -> None:
    """Raise NewerLogError when the log holds records of a newer eventsrc that this one cannot
    read (docs/adr/0010). The restart rules and every decision would work on views that
    miss them, and what this daemon wrote next (releases, refusals) would contradict that
    version's history. Read-only commands still show them, raw."""
    found = event_log.read_many(sorted(views.meta.corrupt))
    newer = [r for r in found if newer_unreadable(r)]
    if newer:
        first = newer[0]
        raise NewerLogError(
            f"{len(newer)} record(s) of the log were written by a newer eventsrc (the first: {first.seq}, "
            f"{first.type_name} v{first.version}; the last daemon started here was {views.meta.version or 'unknown'}, "
            f"this is {__version__}): this daemon does not write on a log it cannot read; run the newer version "
            "('eventsrc log', 'state', 'audit' and 'backup' still work)"
        )


#: records after which the shared pool's containers may need a new cpuset
_CPU_CHANGES = (ev.SharedPoolChanged, ev.CPUsAssigned, ev.CPUsReleased)


READ_ONLY_BESIDE = (
    "eventsrc runs beside a kubelet (--beside-kubelet): the kubelet admits and removes pods, eventsrc only records"
)


class Daemon:
    def __init__(
        self,
        layout: Layout,
        log_: EventLog,
        views: Views,
        snapshot_every: int,
        admission_wait: float = DEFAULT_ADMISSION_WAIT,
        grace: float = DEFAULT_GRACE,
        cpus: CPUManagerConfig | None = None,
        topology: TopologyManager | None = None,
        nri: NRIOptions | None = None,
        retention: Retention | None = None,
        beside: BesideOptions | None = None,
        watch_stall: float = WATCH_STALL,
        fleet: FleetOptions | None = None,
        observations_wait: float = OBSERVATIONS_WAIT,
        allocatable: Mapping[str, int] | None = None,
        memory: MemoryManagerConfig | None = None,
    ) -> None:
        self.layout = layout
        self.cpus = cpus or CPUManagerConfig("none", single_cpu_topology(), CPUSet(), StaticPolicyOptions())
        self.topology = topology or parse_topology_manager(
            "none", "container", {}, self.cpus.topology.cpu_details.numa_nodes().sorted_list()
        )
        self.memory = memory or MemoryManagerConfig()
        self.event_log = log_
        self.views = views
        self.snapshot_every = snapshot_every
        # (metrics are made below: looked up at each batch)
        self.committer = GroupCommitter(
            log_,
            on_commit=self._applied,
            on_batch=self._written,
            observations_wait=observations_wait,
        )
        self.boot_id = machine_boot_id()
        self.instance_id = uuid.uuid4().hex
        self._snapshot_seq = views.meta.last_seq
        self._snapshot_due = trio.Event()
        self._snapshot_lock = trio.Lock()  # one snapshot written at a time
        self.ready = False
        self.not_ready = "starting: the sockets are not served yet"  # /readyz's reason
        self.metrics = Metrics(
            log_bytes=log_.disk_bytes,
            last_seq=log_.last_seq,
            corrupt_records=lambda: len(self.views.meta.corrupt),
            retention=lambda: self.retainer.health,
            views=lambda: self.views,
            fleet=self.fleet_report,
        )
        self.metrics_address: str | None = None  # as bound (port 0 resolved)
        self.loop_holds = LoopHolds()  # the loop's task steps, timed while serve runs
        # For /healthz: appends in flight, since when, and when the last commit landed.
        self._appending = 0
        self._appending_since = self._last_commit = time.monotonic()
        # The one place the parts meet: each is handed what it uses (the daemon as a Recorder).
        self.devices = DeviceManager(self, layout.device_plugins, grace, self.topology.numa_info.nodes)
        self.dra = DRAManager(self)
        # Readers of the history take turns, after the decisions (api.readers).
        self.turns, self.stalls = Turns(), Stalls(watch_stall)
        self.admission = Admission(
            self,
            AdmissionConfig(self.cpus, self.topology, admission_wait, memory=self.memory, allocatable=allocatable),
            self.devices,
            self.dra,
            readers_wait=self.turns.decision_runs,
        )
        self.nri = NRIPlugin(self, self.admission, self.cpus, nri) if nri is not None else None
        # serve --fleet-nats: beside the rest, nothing waits for it (docs/fleet.md); retention's
        # age cuts wait for what it shipped
        self.shipper = Shipper(log_, self.appended, fleet, layout.archive) if fleet is not None else None
        shipper = self.shipper
        self.retainer = Retainer(
            self,
            log_,
            layout.archive,
            retention or Retention(),
            snapshot_every,
            shipped=(lambda: shipper.shipped) if shipper is not None else lambda: None,
        )
        self.usage = UsageKeeper(layout, log_.last_seq)
        # Beside a kubelet: eventsrc records what the kubelet decided, and decides nothing.
        self.beside = Beside(self, beside, self._runtime_synchronized) if beside is not None else None
        if self.beside is not None and self.nri is not None:
            self.nri.on_synchronized = self.beside.look_again

    def _runtime_synchronized(self) -> bool:
        return self.nri is not None and self.nri.synchronized

    def node_service(self) -> NodeService:
        def status(holds_since_ns: int) -> node_pb2.StatusResponse:
            served = (self.layout.api_socket, self.devices.socket, self.layout.pod_resources_socket)
            sockets = [str(p) for p in (served[:1] if self.beside is not None else served)]
            return status_response(
                self.ready,
                self.instance_id,
                self.event_log.last_seq(),
                sockets,
                os.getpid(),
                self.loop_holds,
                holds_since_ns,
                self.retainer.report() if self.retainer.policy.enabled else None,
                self.fleet_report(),
            )

        read_only = READ_ONLY_BESIDE if self.beside is not None else ""
        history = History(self.records_from, self.appended, self.turns, self.stalls)
        return NodeService(lambda: self.views, self.admission, status, history, read_only=read_only)

    def pod_resources_service(self) -> PodResourcesService:
        return PodResourcesService(
            lambda: self.views,
            cpus=lambda: allocatable_cpus(self.cpus).sorted_list(),
            metrics=self.metrics,
            memory=allocatable_memory(self.memory),
        )

    def records_from(self, seq: int, limit: int) -> list[Record | CorruptRecordError]:
        """Up to ``limit`` records from ``seq``, or from the live log's start when ``seq`` is
        before it (a retention cut took those: docs/adr/0018)."""
        start = max(seq, self.event_log.first_seq())
        # Up to what this writer knows synced: a transaction LMDB shows while its sync is
        # still under way is not served (docs/adr/0042).
        return list(self.event_log.records(start, min(start + limit - 1, self.event_log.last_seq())))

    async def appended(self, seq: int) -> None:
        """Returns once the log holds ``seq``: a Watch stream with nothing to send waits on
        the committer, not on a clock (grpclib cancels it when its client goes)."""
        while self.event_log.last_seq() < seq:
            await self.committer.wait_appended()

    async def apply_cpu_config(self) -> None:
        """Record what this start's CPU manager configuration changes, and the memory manager's
        machine when it changed (never refuses)."""
        views = self.views
        events = startup_events(self.cpus, views.cpus.policy, views.cpus.assignments)
        for e in events:
            if isinstance(e, ev.PolicyConfigurationChanged):
                log.warning("cpu manager configuration changed", old=e.old, new=e.new)
        if events:
            await self.record(events)
        pool = pool_events(self.cpus, self.views.cpus.shared, self.views.cpus.assignments, "cpu manager started")
        if pool:
            await self.record(pool)
        changed = memory_startup_events(self.memory, self.views.memory)
        for e in changed:
            assert isinstance(e, ev.MemoryMachineChanged)
            log.warning("memory manager: the machine's memory changed", old=e.old, new=e.new)
            for line in e.no_longer_fit:
                log.warning("memory manager: an assignment no longer fits", reason=line)
        if changed:
            await self.record(changed)

    def _applied(self, records: list[Record]) -> None:
        apply_all(self.views, records)
        if self.beside is not None:
            self.beside.saw(records)
        if self.nri is not None and any(isinstance(r.event, _CPU_CHANGES) for r in records):
            self.nri.kick()  # the shared pool's containers follow
        self.metrics.committed(records)
        if self.views.meta.last_seq - self._snapshot_seq >= self.snapshot_every:
            self._snapshot_due.set()
        self.retainer.maybe_due(self.event_log.last_seq())
        self.usage.maybe_due(self.event_log.last_seq())

    def _written(self, records: int) -> None:
        """A batch of ``records`` records is durable (a projection is not: /healthz's stall
        watch counts only writes)."""
        self.metrics.batch_committed(records)
        self._last_commit = time.monotonic()

    async def record(self, events: Sequence[ev.EventBase], correlation_id: str | None = None) -> list[Record]:
        """Append ``events`` as one unit; they are in the views when this returns. Without
        ``correlation_id``, the records carry the current request's (``logs.correlation``)."""
        correlation_id = correlation_id or current_correlation_id() or None
        await self.retainer.wait_for_room()  # a size cut far behind: the log stays bounded
        start = time.monotonic()
        if not self._appending:
            self._appending_since = start
        self._appending += 1
        try:
            records = await self.committer.append(events, correlation_id)
        finally:
            self._appending -= 1
        self.metrics.append_observed(time.monotonic() - start)
        return records

    async def observe(
        self, observed: Callable[[], Sequence[ev.EventBase]], correlation_id: str | None = None
    ) -> list[Record]:
        """Record an observation (docs/adr/0042): in the views when this returns, durable with
        the next decision or within the committer's ``observations_wait``."""
        await self.retainer.wait_for_room()
        return await self.committer.observe(observed, correlation_id or current_correlation_id() or None)

    async def synced(self) -> int:
        """Until the views hold nothing the log has not synced (the observations projected so
        far are written); the views' last sequence then. No await between this and a use of
        the views that must match the log (a snapshot)."""
        while self.views.meta.last_seq != self.event_log.last_seq():
            await self.committer.append(())  # carries what is queued before it
        return self.views.meta.last_seq

    def liveness(self) -> str:
        """/healthz: "" while alive, else why not. It answers from the trio loop, so an answer
        says the loop runs; appends waiting ``STALL_SECONDS`` with no commit say the committer
        does not (a disk that stopped syncing); a log file deleted or replaced under the
        daemon says nothing can be acknowledged any more."""
        lost = self.event_log.check_file()
        if lost:
            return lost
        if self._appending:
            waited = time.monotonic() - max(self._appending_since, self._last_commit)
            if waited > STALL_SECONDS:
                return f"committer stalled: {self._appending} append(s) waiting, no commit for {waited:.0f} s"
        return ""

    def fleet_report(self) -> tuple[ShippingReport, int] | None:
        """How fleet shipping fares and the time of asking (None without --fleet-nats)."""
        return None if self.shipper is None else (self.shipper.report(), time.time_ns())

    def warning(self) -> str:
        """/healthz's warning after its "ok": what needs an operator but not a restart (a
        restart would not empty a full archive disk, nor bring the fleet's servers back),
        "" for nothing."""
        said = []
        if self.retainer.policy.enabled:
            said.append(retention_trouble(self.retainer.report(), time.time_ns()))
        if self.shipper is not None:
            report = self.shipper.report()
            said.append(shipping_trouble(report.state, report.reason, report.lag_records))
        return "; ".join(s for s in said if s)

    def readiness(self) -> str:
        """/readyz: "" once every socket is served, else why not."""
        return "" if self.ready else self.not_ready

    async def write_snapshot(self) -> None:
        """A snapshot of the views as they are now, encoded and written by a forked child
        (``log.snapshots.fork_snapshot``: the loop never waits for the encoding); returns
        once it is written. Snapshots are a cache: one that cannot be written (a full or
        failing disk) is logged, and the daemon goes on."""
        async with self._snapshot_lock:
            try:
                seq = await self.synced()  # a snapshot never holds what a power loss can take back
            except EventsrcError as exc:  # the log failed: nothing to vouch for
                log.warning("snapshot not written: the log did not sync", error=str(exc))
                return
            if seq == self._snapshot_seq:
                return  # taken at this sequence already (every start records events first)
            try:
                pid = fork_snapshot(self.layout.snapshots, self.views, self.event_log.log_id())
            except OSError as exc:  # no process to spare (EAGAIN, ENOMEM): a cache, not the truth
                log.warning("snapshot not written: cannot start its process", seq=seq, error=str(exc))
                return
            self._snapshot_seq = seq  # before the write: commits meanwhile do not ask again
            with trio.CancelScope(shield=True):  # the child is always waited for: no zombie
                failed = await trio.to_thread.run_sync(wait_snapshot, pid)
            if failed:
                log.warning("snapshot not written; the next start replays more of the log", seq=seq, error=failed)
                return
            path = snapshot_path(self.layout.snapshots, seq)
            log.info("snapshot written", seq=seq, path=path, bytes=path.stat().st_size)

    async def snapshot_loop(self) -> None:
        while True:
            await self._snapshot_due.wait()
            self._snapshot_due = trio.Event()
            await self.write_snapshot()

    async def scrub(self, until_seq: int) -> None:
        """Check every record up to ``until_seq`` (those the snapshot vouched for) in a thread;
        record each corrupt one not yet on record, so that it is never skipped silently."""

        def find() -> list[CorruptRecordError]:
            return [r for r in self.event_log.records(1, until_seq) if isinstance(r, CorruptRecordError)]

        corrupt = await trio.to_thread.run_sync(find)
        # A newer eventsrc's record is not corrupt: it may be ignored, or the snapshot this
        # start used was made by code that read it (docs/adr/0010).
        for c in corrupt:
            if newer_unreadable(c):
                log.warning("record from a newer eventsrc (the snapshot holds its effect)", seq=c.seq, reason=c.reason)
        corrupt = [c for c in corrupt if not isinstance(c, FutureRecordError)]
        corrupt += [
            CorruptRecordError(seq, reason) for seq, reason in self.views.meta.corrupt.items() if seq > until_seq
        ]
        new = [c for c in corrupt if c.seq not in self.views.meta.corrupt_reported]
        for c in corrupt:
            log.error("corrupt record (left in place; see docs/adr/0005)", seq=c.seq, reason=c.reason)
        if new:
            await record_or_log(self, [ev.CorruptRecordFound(seq=c.seq, reason=c.reason) for c in new], "scrub")
        log.info("scrub done", records=until_seq, corrupt=len(corrupt))

    def write_status(self, ready: bool) -> None:
        status: dict[str, Any] = {
            "pid": os.getpid(),
            "instance_id": self.instance_id,
            "version": __version__,
            "ready": ready,
            "last_seq": self.event_log.last_seq(),
        }
        if self.metrics_address is not None:
            status["metrics_address"] = self.metrics_address
        tmp = self.layout.status.with_suffix(".tmp")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), "w") as f:
            f.write(json.dumps(status))
        os.replace(tmp, self.layout.status)


async def serve(
    layout: Layout,
    *,
    snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
    admission_wait: float = DEFAULT_ADMISSION_WAIT,
    grace: float = DEFAULT_GRACE,
    cpus: CPUManagerConfig | None = None,
    topology: TopologyManager | None = None,
    config: dict[str, Any] | None = None,
    metrics_address: str | None = None,
    accept_empty_log: bool = False,
    nri: NRIOptions | None = None,
    retention: Retention | None = None,
    beside: BesideOptions | None = None,
    watch_stall: float = WATCH_STALL,
    fleet: FleetOptions | None = None,
    observations_wait: float = OBSERVATIONS_WAIT,
    allocatable: Mapping[str, int] | None = None,
    memory: MemoryManagerConfig | None = None,
    task_status: trio.TaskStatus[Daemon] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until SIGTERM or SIGINT (or until cancelled).

    ``metrics_address`` (HOST:PORT, port 0 picks one): serve /metrics, /healthz and /readyz
    there; the address bound is logged and written to the status file.
    Raises AlreadyRunningError when another process holds the state directory, and
    DamagedLogError when the log is missing or empty while the root shows it held a history
    (unless ``accept_empty_log``: then the new history's DaemonStarted says what was lost).
    """
    if metrics_address is not None:
        parse_address(metrics_address)  # a malformed address is refused before anything starts
    raise_open_files_limit()  # each socket's connection cap is a share of it (rpc.bridge.connection_cap)
    if beside is not None:
        refuse_root_inside(layout.root, beside.kubelet_dir)
        layout.create(own_only=True)  # none of the kubelet's directories: it serves none of its sockets
        check_socket_path(layout.api_socket)
    else:
        layout.create()
        for sock in (layout.api_socket, layout.device_plugins / "kubelet.sock", layout.pod_resources_socket):
            check_socket_path(sock)
    lock = DirLock(layout.lock)
    lock.acquire()
    event_log: EventLog | None = None
    daemon_holds: LoopHolds | None = None
    try:
        if metrics_address is not None:
            check_address(metrics_address)
        lost = _refuse_lost_history(lost_history(layout), accept_empty_log)  # before LMDB creates a file
        event_log = EventLog(layout.log)
        if not lost:
            lost = _refuse_lost_history(lost_records(layout, event_log), accept_empty_log)
        if lost:
            log.warning("starting a new history over a lost log (--accept-empty-log)", lost=lost)
        for undone in undo_unfinished(event_log, layout.archive):
            log.warning("archive segment of an unfinished retention cut removed (its records are live)", path=undone)
        views, info = _rebuild_views(layout, event_log)
        daemon = Daemon(
            layout,
            event_log,
            views,
            snapshot_every,
            admission_wait=admission_wait,
            grace=grace,
            cpus=cpus,
            topology=topology,
            nri=nri,
            retention=retention,
            beside=beside,
            watch_stall=watch_stall,
            observations_wait=observations_wait,
            fleet=fleet,
            allocatable=allocatable,
            memory=memory,
        )
        daemon.metrics.replayed(info.seconds, info.tail_records)
        # Beside a kubelet, or with the runtime's NRI: what happened while eventsrc was away is a gap.
        last_ts = _last_record_ts(event_log, views) if beside is not None or nri is not None else None
        stopped_cleanly = not views.meta.running
        start_seq = views.meta.last_seq
        if config is None:  # the CLI passes the whole configuration; a bare caller, what it set
            config = _configuration_set(layout, snapshot_every, admission_wait, grace, metrics_address)
        daemon_holds = daemon.loop_holds
        trio.lowlevel.add_instrument(daemon_holds)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
                await nursery.start(daemon.committer.run)
                if metrics_address is not None:
                    app = HealthApp(daemon.metrics, live=daemon.liveness, ready=daemon.readiness, warn=daemon.warning)
                    daemon.metrics_address = await nursery.start(serve_http, app, metrics_address)
                    daemon.write_status(ready=False)
                await _record_start(daemon, config, fresh_start=lost)
                if daemon.beside is None:
                    if daemon.nri is not None:  # the runtime's news until its Synchronize: unseen
                        begun = start_events(daemon.views, last_ts, time.time_ns(), False, stopped_cleanly)
                        if begun:
                            await daemon.record(begun)
                    await daemon.apply_cpu_config()
                    await nursery.start(daemon.devices.run)
                    await nursery.start(daemon.dra.run)
                    await nursery.start(_plugin_watcher(daemon).run)
                else:
                    begun = start_events(daemon.views, last_ts, time.time_ns(), daemon.nri is not None, stopped_cleanly)
                    if begun:
                        await daemon.record(begun)
                nursery.start_soon(daemon.turns.run)
                nursery.start_soon(daemon.stalls.run)
                await nursery.start(serve_unix, [daemon.node_service()], layout.api_socket, 0o600)
                if daemon.beside is None:
                    # 0o755 as the kubelet's, under the usual umask 022: only its owner connects
                    await nursery.start(
                        serve_unix, [daemon.pod_resources_service()], layout.pod_resources_socket, 0o755
                    )
                else:
                    await nursery.start(daemon.beside.run)
                if daemon.nri is not None:
                    await nursery.start(daemon.nri.run)
                if daemon.shipper is not None:  # beside the rest: nothing waits for it (docs/fleet.md)
                    await nursery.start(daemon.shipper.run)
                nursery.start_soon(daemon.scrub, start_seq)
                nursery.start_soon(daemon.snapshot_loop)
                nursery.start_soon(daemon.retainer.run)
                nursery.start_soon(daemon.usage.run)
                _announce_ready(daemon)
                task_status.started(daemon)
                reason = await _stop_signal(signals)
                if daemon.nri is not None:
                    await daemon.nri.drain()  # what it answered before observing it, before the stop
                await _record_stop(daemon, reason)
                nursery.cancel_scope.cancel()
        log.info("stopped", last_seq=daemon.views.meta.last_seq)
    finally:
        if daemon_holds is not None:
            trio.lowlevel.remove_instrument(daemon_holds)
        layout.status.unlink(missing_ok=True)
        if event_log is not None:
            event_log.close()
        lock.release()


def _last_record_ts(event_log: EventLog, views: Views) -> int | None:
    """When the previous run's last record was written (None for a new log): until then it saw."""
    if not views.meta.last_seq:
        return None
    first = max(1, views.meta.last_seq - 64)  # the newest readable one, should the last be damaged
    try:
        found = [item.ts_ns for item in event_log.records(first, views.meta.last_seq) if isinstance(item, Record)]
    except EventsrcError as err:  # a damaged file: the scrub says so; the gap has no start it can trust
        log.warning("the time of the previous run's last record cannot be read", reason=str(err))
        return None
    return found[-1] if found else None


def _rebuild_views(layout: Layout, event_log: EventLog) -> tuple[Views, RebuildInfo]:
    """The views from the newest usable snapshot and the log after it; refuses a log holding
    records of a newer eventsrc."""
    remove_stale_temporaries(layout.snapshots)
    views, info = load_views(event_log, layout.snapshots)
    refuse_newer_records(event_log, views)
    if info.snapshot_seq is None:
        log.info(
            "full replay",
            reason=info.reason or "no snapshot",
            records=info.tail_records,
            seconds=round(info.seconds, 3),
        )
    else:
        log.info(
            "views rebuilt", snapshot_seq=info.snapshot_seq, tail=info.tail_records, seconds=round(info.seconds, 3)
        )
    return views, info


def _configuration_set(
    layout: Layout, snapshot_every: int, admission_wait: float, grace: float, metrics_address: str | None
) -> dict[str, Any]:
    """The configuration DaemonStarted records when the caller gave only serve()'s arguments."""
    return recorded_config(
        Configuration(
            root_dir=str(layout.root),
            snapshot_every=snapshot_every,
            admission_wait=Duration.of_seconds(admission_wait),
            plugin_grace_period=Duration.of_seconds(grace),
            metrics_address=metrics_address or "",
        )
    )


def _refuse_lost_history(lost: str, accept: bool) -> str:
    if lost and not accept:
        raise DamagedLogError(
            f"{lost}: refusing to start over a lost history; restore the log (docs/operations.md), "
            "or start afresh with 'serve --accept-empty-log'"
        )
    return lost


def lost_records(layout: Layout, event_log: EventLog) -> str:
    """What shows that the open log lost records, or "": none left next to snapshots, or
    fewer than a snapshot of this very log was taken at (a data file damaged or swapped
    for an older copy)."""
    last = event_log.last_seq()
    if last == 0:
        return lost_history(layout, opened=True)
    seq, name = furthest(layout.snapshots, event_log.log_id())
    if seq > last:
        return (
            f"the event log {layout.log / 'data.mdb'} ends at record {last}, but its snapshot {name} "
            f"was taken at record {seq}: its newest records are lost"
        )
    return ""


def lost_history(layout: Layout, opened: bool = False) -> str:
    """What shows that the log at ``layout.log`` held a history it no longer has, or "".

    Before the log is opened (``opened=False``), a missing or empty ``data.mdb`` next to
    snapshots, or next to LMDB's ``lock.mdb`` (created with the data file, by the first
    open); once opened and found without a record, snapshots alone (a data file replaced
    by a fresh one)."""
    data = layout.log / "data.mdb"
    if not opened:
        try:
            if data.stat().st_size:
                return ""
            what = "empty"
        except FileNotFoundError:
            what = "missing"
    else:
        what = "without a record"
    evidence = []
    snaps = snapshot_files(layout.snapshots)
    if snaps:
        evidence.append(f"{len(snaps)} snapshot(s) of a history (the newest {snaps[0].name}) are in {layout.snapshots}")
    if not opened and (layout.log / "lock.mdb").exists():
        evidence.append(f"{layout.log / 'lock.mdb'} shows a daemon opened it before")
    return f"the event log {data} is {what}, but {' and '.join(evidence)}" if evidence else ""


async def _record_start(daemon: Daemon, config: dict[str, Any], fresh_start: str = "") -> None:
    """Record DaemonStarted, the configuration's changes since the last run, and the end of
    what the previous run left unfinished (from the log alone), in one append; log every
    pod quarantined now or before."""
    views = daemon.views
    start_seq = views.meta.last_seq
    if views.meta.running:
        log.warning("previous run did not stop cleanly", instance_id=views.meta.instance_id)
    started = ev.DaemonStarted(
        boot_id=daemon.boot_id,
        instance_id=daemon.instance_id,
        version=__version__,
        config=config,
        pid=os.getpid(),
        fresh_start=fresh_start,
    )
    changed = configuration_changes(views.meta.config, config)
    finish = restart_events(daemon.views)
    (first, *rest) = await daemon.record([started, *([changed] if changed else []), *finish])
    cid = first.correlation_id
    for r in rest:
        if isinstance(r.event, ev.PodQuarantined):
            ref = r.event.pod
            log.error(
                "pod quarantined: its records are in doubt; it keeps what it holds until an operator removes it "
                "(docs/operations.md)",
                pod=f"{ref.namespace}/{ref.name}",
                uid=ref.uid,
                corrupt_seqs=r.event.corrupt_seqs,
                seq=r.seq,
                cid=cid,
            )
    for pod in daemon.views.pods.pods.values():
        if pod.state == QUARANTINED and pod.quarantined_seq <= start_seq:
            log.error(
                "pod still quarantined: remove it once its records are checked",
                uid=pod.uid,
                corrupt_seqs=pod.in_doubt,
                cid=cid,
            )
    log.info(
        "daemon started",
        version=__version__,
        instance_id=daemon.instance_id,
        pid=os.getpid(),
        boot_id=daemon.boot_id,
        cid=cid,
    )
    if changed:
        log.warning(
            "configuration changed",
            changed=changed.changed,
            old={k: changed.old.get(k) for k in changed.changed},
            new={k: changed.new.get(k) for k in changed.changed},
            cid=cid,
        )


def _plugin_watcher(daemon: Daemon) -> PluginWatcher:
    """plugins_registry/: DRA drivers to the DRA manager, device plugins to the device manager."""
    return PluginWatcher(
        daemon.layout.plugins_registry, {"DRAPlugin": daemon.dra, "DevicePlugin": RegistryHandler(daemon.devices)}
    )


def _announce_ready(daemon: Daemon) -> None:
    """Every socket is served: say so in the status file, the log and to systemd."""
    daemon.ready = True
    daemon.write_status(ready=True)
    log.info("ready", root=daemon.layout.root, last_seq=daemon.views.meta.last_seq, instance_id=daemon.instance_id)
    systemd.notify(f"READY=1\nMAINPID={os.getpid()}\nSTATUS=ready, last sequence {daemon.views.meta.last_seq}")


async def _stop_signal(signals: AsyncIterator[int]) -> str:
    """Wait for SIGTERM or SIGINT; its name."""
    async for signum in signals:
        reason = signal.Signals(signum).name
        log.info("stopping", signal=reason)
        systemd.notify("STOPPING=1")
        return reason
    raise AssertionError("the signal receiver never ends")


async def _record_stop(daemon: Daemon, reason: str) -> None:
    """Not ready any more; DaemonStopped recorded and a snapshot written."""
    daemon.ready = False
    daemon.not_ready = f"stopping: {reason}"
    try:
        await daemon.record([ev.DaemonStopped(boot_id=daemon.boot_id, instance_id=daemon.instance_id, reason=reason)])
    except EventsrcError as err:  # a lost log file: nothing more to record, nor to snapshot
        log.error("stop not recorded", reason=str(err))
        return
    await daemon.write_snapshot()
