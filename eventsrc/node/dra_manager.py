"""Edge to DRA drivers: registration through plugins_registry, NodePrepareResources and
NodeUnprepareResources, and the loop that finishes unfinished claim work.

    DRAManager.run
      └─ reconcile loop: record what is unfinished (core.claims.pending_work), then
         prepare / unprepare with the drivers that are connected; failures are retried
         with backoff (1 s to 30 s) and stay visible in the claims view until they succeed.

Decisions are in eventsrc/core/claims.py; this module calls drivers and records outcomes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from grpclib.client import Channel

from eventsrc import events as ev
from eventsrc.core.backoff import Backoff
from eventsrc.core.claims import ClaimWork, pending_work
from eventsrc.errors import EventsrcError
from eventsrc.gen.dra.v1 import api_grpc as v1_grpc
from eventsrc.gen.dra.v1 import api_pb2 as v1
from eventsrc.gen.dra.v1beta1 import api_grpc as v1beta1_grpc
from eventsrc.gen.dra.v1beta1 import api_pb2 as v1beta1
from eventsrc.log.commit import new_correlation_id
from eventsrc.node.interfaces import Recorder
from eventsrc.obs.logger import correlation, get_logger
from eventsrc.rpc.bridge import CALL_ERRORS, endpoint_socket_error, to_aio, unix_channel, why

log = get_logger(__name__)

_CLAIM_OUTCOMES: dict[type, str] = {
    ev.ClaimPrepared: "claim prepared",
    ev.ClaimPrepareFailed: "claim prepare failed",
    ev.ClaimUnprepared: "claim unprepared",
    ev.ClaimUnprepareFailed: "claim unprepare failed",
}


def log_claim_outcomes(events: list[ev.EventBase]) -> None:
    """One line per claim a driver answered for (the request's cid comes with it)."""
    for e in events:
        if isinstance(e, (ev.ClaimPrepared, ev.ClaimPrepareFailed, ev.ClaimUnprepared, ev.ClaimUnprepareFailed)):
            what = _CLAIM_OUTCOMES[type(e)]
            fields = {"claim": f"{e.claim.namespace}/{e.claim.name}", "claim_uid": e.claim.uid, "driver": e.driver}
            if isinstance(e, (ev.ClaimPrepareFailed, ev.ClaimUnprepareFailed)):
                log.warning(what, **fields, reason=e.reason)
            else:
                log.info(what, **fields)


CALL_TIMEOUT = 45.0  # the kubelet's defaultClientCallTimeout
MAX_DRIVERS = 256  # drivers registered at once; a new name beyond is refused
MAX_NAME_BYTES = 253  # a driver name is a DNS subdomain
SERVICES = {"v1.DRAPlugin": (v1, v1_grpc), "v1beta1.DRAPlugin": (v1beta1, v1beta1_grpc)}
PREFERENCE = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


class DRARejected(EventsrcError):
    pass


@dataclass(eq=False)
class DRAClient:
    driver: str
    endpoint: str
    service: str
    channel: Channel
    stub: Any
    pb: Any

    async def prepare(self, claims: tuple[ev.ClaimRef, ...]) -> dict[str, list[ev.PreparedDevice] | str]:
        """Per claim uid: its prepared devices, or the reason it failed."""
        req = self.pb.NodePrepareResourcesRequest(
            claims=[self.pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
        )
        resp = await to_aio(self.stub.NodePrepareResources)(req, timeout=CALL_TIMEOUT)
        out: dict[str, list[ev.PreparedDevice] | str] = {}
        for c in claims:
            if c.uid not in resp.claims:
                out[c.uid] = (
                    f"NodePrepareResources of driver {self.driver} did not answer for claim {c.namespace}/{c.name}"
                )
                continue
            r = resp.claims[c.uid]
            if r.error:
                out[c.uid] = (
                    f"NodePrepareResources of driver {self.driver} failed for claim {c.namespace}/{c.name}: {r.error}"
                )
                continue
            out[c.uid] = [
                ev.PreparedDevice(
                    request_names=list(d.request_names),
                    pool_name=d.pool_name,
                    device_name=d.device_name,
                    cdi_device_ids=list(d.cdi_device_ids),
                )
                for d in r.devices
            ]
        return out

    async def unprepare(self, claims: tuple[ev.ClaimRef, ...]) -> dict[str, str]:
        """Per claim uid: "" when unprepared, else the reason."""
        req = self.pb.NodeUnprepareResourcesRequest(
            claims=[self.pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]
        )
        resp = await to_aio(self.stub.NodeUnprepareResources)(req, timeout=CALL_TIMEOUT)
        out: dict[str, str] = {}
        for c in claims:
            if c.uid not in resp.claims:
                out[c.uid] = (
                    f"NodeUnprepareResources of driver {self.driver} did not answer for claim {c.namespace}/{c.name}"
                )
            else:
                err = resp.claims[c.uid].error
                out[c.uid] = f"NodeUnprepareResources of driver {self.driver} failed: {err}" if err else ""
        return out


class DRAManager:
    """DRA drivers by name, and the claim work that goes with them
    (``eventsrc.node.interfaces.ClaimDrivers``)."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.clients: dict[str, DRAClient] = {}
        self._kick = trio.Event()
        self._changed = trio.Event()
        # One call to drivers at a time: calls reach a driver in the order their outcomes
        # are recorded (an unprepare decided before a new admission cannot overtake it).
        self._calls = trio.Lock()

    # ------------------------------------------------------------------ the watcher's handler

    async def validate(self, name: str, endpoint: str, versions: list[str]) -> None:
        if not name:
            raise DRARejected("the DRA driver name is empty")
        if len(name.encode()) > MAX_NAME_BYTES:
            raise DRARejected(f"the DRA driver name is longer than {MAX_NAME_BYTES} bytes")
        if not any(v in SERVICES for v in versions):
            raise DRARejected(f"none of the versions {versions} is supported; supported: {list(PREFERENCE)}")
        reason = endpoint_socket_error(endpoint)
        if reason:
            raise DRARejected(reason)
        if name not in self.clients and len(self.clients) >= MAX_DRIVERS:
            raise DRARejected(f"{len(self.clients)} DRA drivers are registered, the most the daemon takes")

    async def register(self, name: str, endpoint: str, versions: list[str], socket_path: Path | None = None) -> None:
        try:
            await self.validate(name, endpoint, versions)
        except DRARejected as err:
            await self.recorder.record(
                [ev.PluginRegistrationRejected(resource=name, endpoint=endpoint, kind="DRAPlugin", reason=str(err))]
            )
            raise
        service = next(v for v in PREFERENCE if v in versions)
        pb, grpc_mod = SERVICES[service]
        channel = unix_channel(endpoint)
        stub = grpc_mod.DRAPluginStub(channel)
        old = self.clients.get(name)
        self.clients[name] = DRAClient(name, endpoint, service, channel, stub, pb)
        if old is not None:
            old.channel.close()
        await self.recorder.record(
            [ev.PluginRegistered(resource=name, endpoint=endpoint, api_version=service, kind="DRAPlugin")]
        )
        log.info("dra driver registered", driver=name, endpoint=endpoint, service=service)
        self.kick()

    async def deregister(self, name: str, endpoint: str, socket_path: Path | None = None) -> None:
        client = self.clients.get(name)
        if client is None or client.endpoint != endpoint:
            return
        del self.clients[name]
        client.channel.close()
        await self.recorder.record(
            [
                ev.PluginDisconnected(
                    resource=name, endpoint=endpoint, kind="DRAPlugin", reason="registration socket removed"
                )
            ]
        )
        log.warning("dra driver deregistered", driver=name, endpoint=endpoint)
        self._notify()

    # ------------------------------------------------------------------ claims

    def kick(self) -> None:
        """Look for unfinished claim work now."""
        self._kick.set()
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def connected(self, driver: str) -> DRAClient | None:
        return self.clients.get(driver)

    async def wait_driver(self, driver: str, timeout: float) -> DRAClient | None:
        with trio.move_on_after(timeout if math.isfinite(timeout) else math.inf):
            while driver not in self.clients:
                await self._changed.wait()
        return self.clients.get(driver)

    async def prepare(self, client: DRAClient, claims: tuple[ev.ClaimRef, ...]) -> list[ev.EventBase]:
        """Call NodePrepareResources; the outcome events (not recorded here)."""
        async with self._calls:
            return await self._prepare(client, claims)

    async def _prepare(self, client: DRAClient, claims: tuple[ev.ClaimRef, ...]) -> list[ev.EventBase]:
        try:
            with self.recorder.metrics.dra_call(client.driver, client.stub.NodePrepareResources.name):
                results = await client.prepare(claims)
        except CALL_ERRORS as exc:
            reason = f"NodePrepareResources of driver {client.driver} failed: {why(exc)}"
            return [ev.ClaimPrepareFailed(claim=c, driver=client.driver, reason=reason) for c in claims]
        out: list[ev.EventBase] = []
        for c in claims:
            r = results[c.uid]
            if isinstance(r, str):
                out.append(ev.ClaimPrepareFailed(claim=c, driver=client.driver, reason=r))
            else:
                out.append(ev.ClaimPrepared(claim=c, driver=client.driver, devices=r))
        return out

    async def unprepare(self, client: DRAClient, claims: tuple[ev.ClaimRef, ...]) -> list[ev.EventBase]:
        async with self._calls:
            return await self._unprepare(client, claims)

    async def _unprepare(self, client: DRAClient, claims: tuple[ev.ClaimRef, ...]) -> list[ev.EventBase]:
        try:
            with self.recorder.metrics.dra_call(client.driver, client.stub.NodeUnprepareResources.name):
                results = await client.unprepare(claims)
        except CALL_ERRORS as exc:
            reason = f"NodeUnprepareResources of driver {client.driver} failed: {why(exc)}"
            return [ev.ClaimUnprepareFailed(claim=c, driver=client.driver, reason=reason) for c in claims]
        return [
            ev.ClaimUnprepareFailed(claim=c, driver=client.driver, reason=results[c.uid])
            if results[c.uid]
            else ev.ClaimUnprepared(claim=c, driver=client.driver)
            for c in claims
        ]

    async def reconcile_once(self) -> bool:
        """Record what is unfinished and do the calls that can be done; True when all done."""
        events, prepares, unprepares = pending_work(self.recorder.views)
        if events:
            await self.recorder.record(events)
        done = True
        work: list[tuple[ClaimWork, bool]] = [(w, False) for w in unprepares] + [(w, True) for w in prepares]
        for w, is_prepare in work:
            client = self.clients.get(w.driver)
            if client is None:
                done = False  # the driver is away: the claim stays pending, never forgotten
                continue
            with correlation(new_correlation_id()):  # one driver call, its outcome and its lines
                if is_prepare:  # a pending prepare retried (not a pod's admission: not timed)
                    outcome = await self.prepare(client, w.claims)
                else:
                    with self.recorder.metrics.dra_operation("UnprepareResources") as outcome:
                        outcome += await self.unprepare(client, w.claims)
                await self.recorder.record(outcome)
                log_claim_outcomes(outcome)
            if any(isinstance(e, (ev.ClaimPrepareFailed, ev.ClaimUnprepareFailed)) for e in outcome):
                done = False
        return done

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Finish claim work until cancelled: at once when kicked, else retried with backoff."""
        task_status.started()
        backoff = Backoff(1.0, 30.0)
        while True:
            self._kick = trio.Event()
            with trio.CancelScope(shield=True):
                try:
                    done = await self.reconcile_once()
                except EventsrcError as exc:  # the log refuses appends (full, lost): try again later
                    log.warning("claim work not recorded", reason=str(exc))
                    done = False
            if done:
                backoff.reset()
            with trio.move_on_after(math.inf if done else backoff.next()):
                await self._kick.wait()
