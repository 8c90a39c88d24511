"""What the daemon keeps of a long-lived connection's calls stays bounded.

``eventsrc bench soak`` showed the daemon's RSS rising by about 700 bytes an admission:
h2, under grpclib, remembered how every closed stream of a connection ended, up to 65,536 of
them, on the node API's connection (Admit, Remove) and on the daemon's channel to the plugin
(Allocate). Here the daemon runs in this process; one grpcio client admits and removes pods
over one connection, and every HTTP/2 connection the daemon holds afterwards remembers at
most ``MAX_CLOSED_STREAMS`` closed streams (``rpc.limits.bound_closed_streams``).
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio
from h2.connection import H2Connection

from eventsrc.layout import Layout
from eventsrc.node.daemon import serve
from eventsrc.rpc.limits import MAX_CLOSED_STREAMS
from tests.support.eventually import eventually_trio
from tests.support.grpcio_plugin import Dev, GrpcioPlugin
from tests.support.node_client import NodeClient

RES = "example.com/bounded"
CYCLES = MAX_CLOSED_STREAMS + 64  # each an Admit and a Remove, and the plugin's Allocate


@asynccontextmanager
async def daemon_with_plugin(root: Path) -> AsyncIterator[Any]:
    """The daemon in this process, and a grpcio plugin of two devices, registered and listed."""
    async with trio.open_nursery() as nursery:
        daemon = await nursery.start(partial(serve, Layout(root)))
        plugin = GrpcioPlugin(root, RES, [Dev("d-0", numa=0), Dev("d-1", numa=0)]).start()
        try:
            ok, error = await trio.to_thread.run_sync(plugin.register)
            assert ok, error
            await eventually_trio(lambda: RES in daemon.devices.endpoints, "the plugin's first list")
            await eventually_trio(lambda: daemon.devices.endpoints[RES].listed.is_set(), "the plugin's first list")
            yield daemon
        finally:
            await trio.to_thread.run_sync(plugin.stop)
            nursery.cancel_scope.cancel()


def churn(root: Path, cycles: int) -> None:
    """``cycles`` one-device pods admitted and removed, one after the other, over one connection."""
    with NodeClient(root) as client:
        for i in range(cycles):
            info = client.admit(RES, name=f"p{i}")
            client.remove(info.uid)


def h2_connections() -> list[H2Connection]:
    """Every h2 connection of this process (the daemon's: grpcio's are C). The daemon may have
    frozen them after a long collection (daemon.py), which hides them from gc.get_objects."""
    gc.unfreeze()
    return [o for o in gc.get_objects() if isinstance(o, H2Connection)]


async def test_a_long_lived_connection_leaves_a_bounded_trace_of_its_calls(root: Path) -> None:
    async with daemon_with_plugin(root) as daemon:
        await trio.to_thread.run_sync(churn, root, CYCLES)
        assert daemon.views.pods.pods == {}
        connections = h2_connections()
        # The calls went over long-lived connections: the node API's carried two streams a
        # cycle (client stream ids are odd), the plugin's channel one.
        busiest = max(max(c.highest_inbound_stream_id, c.highest_outbound_stream_id) for c in connections)
        assert busiest >= 2 * (2 * CYCLES) - 1
        remembered = sorted((len(c._closed_streams) for c in connections), reverse=True)
        assert remembered[0] <= MAX_CLOSED_STREAMS, remembered
