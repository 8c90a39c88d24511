"""The daemon: one trio task tree that wires the edges to the log and the views.

    serve()                        (inside one trio-asyncio loop, for grpclib)
      ├─ GroupCommitter.run      appends; applies each committed batch to the views
      ├─ DeviceManager.run       device-plugins/kubelet.sock, one task per plugin endpoint
      ├─ serve_unix(Node)        eventsrc/api.sock: admit, remove, list pods
      ├─ serve_unix(PodResources) pod-resources/kubelet.sock
      ├─ Daemon.scrub            checks every record written before this start
      ├─ Daemon.snapshot_loop    writes a snapshot every ``snapshot_every`` records
      └─ (waits for SIGTERM / SIGINT, records DaemonStopped, writes a snapshot)

State changes only through ``Daemon.record``: append, and once the commit is durable,
apply to the views. At start, before any socket is served, the daemon records what the
previous run left unfinished (``core.devices.restart_events``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio
import trio_asyncio

from eventsrc import __version__
from eventsrc import events as ev
from eventsrc.admission import DEFAULT_ADMISSION_WAIT, Admission
from eventsrc.api.node import NodeService, status_response
from eventsrc.api.podresources import PodResourcesService
from eventsrc.core.cpu_assignment import StaticPolicyOptions
from eventsrc.core.cpu_static import CPUManagerConfig, allocatable_cpus, pool_events, startup_events
from eventsrc.core.cpuset import CPUSet
from eventsrc.core.devices import restart_events
from eventsrc.core.topology import single_cpu_topology
from eventsrc.core.topology_manager import TopologyManager, parse_topology_manager
from eventsrc.events import CorruptRecordError, Record
from eventsrc.gen.node.v1 import node_pb2
from eventsrc.layout import Layout
from eventsrc.log.commit import GroupCommitter
from eventsrc.log.snapshots import encode_snapshot, load_views, write_snapshot
from eventsrc.log.store import DirLock, EventLog
from eventsrc.plugins.device_plugins import DEFAULT_GRACE, DeviceManager, RegistryHandler
from eventsrc.plugins.dra import DRAManager
from eventsrc.plugins.registry import PluginWatcher
from eventsrc.rpc import check_socket_path, serve_unix
from eventsrc.state.apply import apply_all
from eventsrc.state.views import Views

log = logging.getLogger("eventsrc.daemon")

DEFAULT_SNAPSHOT_EVERY = 10_000


def machine_boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


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
    ) -> None:
        self.layout = layout
        self.cpus = cpus or CPUManagerConfig("none", single_cpu_topology(), CPUSet(), StaticPolicyOptions())
        self.topology = topology or parse_topology_manager("none", "container", {}, self.cpus.topology.cpu_details.numa_nodes().sorted_list())
        self.log = log_
        self.views = views
        self.snapshot_every = snapshot_every
        self.committer = GroupCommitter(log_, on_commit=self._applied)
        self.boot_id = machine_boot_id()
        self.instance_id = uuid.uuid4().hex
        self._snapshot_seq = views.meta.last_seq
        self._snapshot_due = trio.Event()
        self.ready = False
        self.devices = DeviceManager(self, grace=grace)
        self.dra = DRAManager(self)
        self.admission = Admission(self, self.devices, wait=admission_wait)

    def node_service(self) -> NodeService:
        def status() -> node_pb2.StatusResponse:
            sockets = [str(p) for p in (self.layout.api_socket, self.devices.socket, self.layout.pod_resources_socket)]
            return status_response(self.ready, self.instance_id, self.views.meta.last_seq, sockets, os.getpid())

        return NodeService(lambda: self.views, self.admission, status, self.records_from)

    async def records_from(self, seq: int, limit: int = 512, wait: float = 1.0) -> list[Record | CorruptRecordError]:
        """Up to ``limit`` records from ``seq``; when there are none yet, waits up to ``wait``
        seconds for an append (an empty list then: the watcher asks again)."""
        items = list(self.log.records(seq, seq + limit - 1))
        if not items:
            with trio.move_on_after(wait):
                await self.committer.wait_appended()
            items = list(self.log.records(seq, seq + limit - 1))
        return items

    async def apply_cpu_config(self) -> None:
        """Record what this start's CPU manager configuration changes (never refuses)."""
        views = self.views
        events = startup_events(self.cpus, views.cpus.policy, views.cpus.assignments)
        for e in events:
            if isinstance(e, ev.PolicyConfigurationChanged):
                log.warning("cpu manager configuration changed old=%s new=%s", e.old, e.new)
        if events:
            await self.record(events)
        pool = pool_events(self.cpus, self.views.cpus.shared, self.views.cpus.assignments, "cpu manager started")
        if pool:
            await self.record(pool)

    def _applied(self, records: list[Record]) -> None:
        apply_all(self.views, records)
        if self.views.meta.last_seq - self._snapshot_seq >= self.snapshot_every:
            self._snapshot_due.set()

    async def record(self, events: Sequence[ev._Event], correlation_id: str | None = None) -> list[Record]:
        """Append ``events`` as one unit; they are in the views when this returns."""
        return await self.committer.append(events, correlation_id)

    async def write_snapshot(self) -> None:
        data = encode_snapshot(self.views, self.log.log_id())
        seq = self.views.meta.last_seq
        path = await trio.to_thread.run_sync(write_snapshot, self.layout.snapshots, data, seq)
        self._snapshot_seq = seq
        log.info("snapshot written seq=%d path=%s bytes=%d", seq, path, len(data))

    async def snapshot_loop(self) -> None:
        while True:
            await self._snapshot_due.wait()
            self._snapshot_due = trio.Event()
            await self.write_snapshot()

    async def scrub(self, until_seq: int) -> None:
        """Check every record up to ``until_seq`` (those the snapshot vouched for) in a thread;
        record each corrupt one not yet on record, so that it is never skipped silently."""

        def find() -> list[CorruptRecordError]:
            return [r for r in self.log.records(1, until_seq) if isinstance(r, CorruptRecordError)]

        corrupt = await trio.to_thread.run_sync(find)
        corrupt += [
            CorruptRecordError(seq, reason)
            for seq, reason in self.views.meta.corrupt.items()
            if seq > until_seq
        ]
        new = [c for c in corrupt if c.seq not in self.views.meta.corrupt_reported]
        for c in corrupt:
            log.error("corrupt record seq=%d reason=%r (left in place; see docs/adr/0005)", c.seq, c.reason)
        if new:
            await self.record([ev.CorruptRecordFound(seq=c.seq, reason=c.reason) for c in new])
        log.info("scrub done records=%d corrupt=%d", until_seq, len(corrupt))

    def write_status(self, ready: bool) -> None:
        status: dict[str, Any] = {
            "pid": os.getpid(),
            "instance_id": self.instance_id,
            "version": __version__,
            "ready": ready,
            "last_seq": self.views.meta.last_seq,
        }
        tmp = self.layout.status.with_suffix(".tmp")
        tmp.write_text(json.dumps(status))
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
    task_status: trio.TaskStatus[Daemon] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until SIGTERM or SIGINT (or until cancelled).

    Raises AlreadyRunningError when another process holds the state directory.
    """
    layout.create()
    for sock in (layout.api_socket, layout.device_plugins / "kubelet.sock", layout.pod_resources_socket):
        check_socket_path(sock)
    lock = DirLock(layout.lock)
    lock.acquire()
    event_log: EventLog | None = None
    try:
        event_log = EventLog(layout.log)
        views, info = load_views(event_log, layout.snapshots)
        if info.snapshot_seq is None:
            log.info("full replay reason=%r records=%d seconds=%.3f", info.reason or "no snapshot", info.tail_records, info.seconds)
        else:
            log.info(
                "views rebuilt snapshot_seq=%d tail=%d seconds=%.3f", info.snapshot_seq, info.tail_records, info.seconds
            )
        daemon = Daemon(layout, event_log, views, snapshot_every, admission_wait=admission_wait, grace=grace, cpus=cpus, topology=topology)
        start_seq = views.meta.last_seq
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
                await nursery.start(daemon.committer.run)
                cfg = {
                    "root_dir": str(layout.root),
                    "snapshot_every": snapshot_every,
                    "admission_wait_seconds": admission_wait,
                    "plugin_grace_seconds": grace,
                    "cpu_manager": daemon.cpus.describe(),
                    "topology_manager": {"policy": daemon.topology.policy.name, "scope": daemon.topology.scope},
                    **(config or {}),
                }
                if views.meta.running:
                    log.warning("previous run did not stop cleanly instance_id=%s", views.meta.instance_id)
                started = ev.DaemonStarted(
                    boot_id=daemon.boot_id, instance_id=daemon.instance_id, version=__version__, config=cfg, pid=os.getpid()
                )
                # What the previous run left unfinished is finished now, from the log alone.
                await daemon.record([started, *restart_events(daemon.views)])
                await daemon.apply_cpu_config()
                await nursery.start(daemon.devices.run)
                await nursery.start(daemon.dra.run)
                watcher = PluginWatcher(
                    layout.plugins_registry, {"DRAPlugin": daemon.dra, "DevicePlugin": RegistryHandler(daemon.devices)}
                )
                await nursery.start(watcher.run)
                await nursery.start(serve_unix, [daemon.node_service()], layout.api_socket, 0o600)
                await nursery.start(
                    serve_unix,
                    [PodResourcesService(lambda: daemon.views, cpus=lambda: allocatable_cpus(daemon.cpus).sorted_list())],
                    layout.pod_resources_socket,
                    None,
                )
                nursery.start_soon(daemon.scrub, start_seq)
                nursery.start_soon(daemon.snapshot_loop)
                daemon.ready = True
                daemon.write_status(ready=True)
                log.info("ready root=%s last_seq=%d instance_id=%s", layout.root, daemon.views.meta.last_seq, daemon.instance_id)
                task_status.started(daemon)
                async for signum in signals:
                    reason = signal.Signals(signum).name
                    log.info("stopping signal=%s", reason)
                    break
                daemon.ready = False
                await daemon.record(
                    [ev.DaemonStopped(boot_id=daemon.boot_id, instance_id=daemon.instance_id, reason=reason)]
                )
                await daemon.write_snapshot()
                nursery.cancel_scope.cancel()
        log.info("stopped last_seq=%d", daemon.views.meta.last_seq)
    finally:
        layout.status.unlink(missing_ok=True)
        if event_log is not None:
            event_log.close()
        lock.release()
