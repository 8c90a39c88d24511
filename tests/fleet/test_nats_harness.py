"""The real nats-server harness itself: JetStream stores a message published twice with one
``Nats-Msg-Id`` once, a stream outlives a restart and a SIGKILL, a three-server cluster keeps a
replicated (R3) stream readable after its leader restarts, a site's leaf reaches the cluster's
JetStream until its link is cut and again once it is restored, and nothing it started is left."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js.api import PubAck, StorageType

from testbed.servers import server_process
from tests.support.eventually import eventually
from tests.support.nats import Link, NatsCluster, NatsLeaf, NatsServer

T = TypeVar("T")
STREAM = "FLEETTEST"
SUBJECT = "fleet.node-a"
NATS_ERRORS = (nats.errors.Error, nats.js.errors.Error, OSError, asyncio.TimeoutError)


@asynccontextmanager
async def jetstream(urls: Sequence[str]) -> AsyncIterator[nats.js.JetStreamContext]:
    nc = await nats.connect(servers=list(urls), connect_timeout=2, allow_reconnect=False)
    try:
        yield nc.jetstream(timeout=5)
    finally:
        await nc.close()


def with_jetstream(urls: Sequence[str], step: Callable[[nats.js.JetStreamContext], Awaitable[T]]) -> T:
    """``step`` run with a JetStream context on a connection of its own to ``urls``."""

    async def run() -> T:
        async with jetstream(urls) as js:
            return await step(js)

    return asyncio.run(run())


def answers(urls: Sequence[str], step: Callable[[nats.js.JetStreamContext], Awaitable[T]]) -> T | None:
    """``step``'s result, or None while the servers cannot answer it (starting, electing a leader)."""
    try:
        return with_jetstream(urls, step)
    except NATS_ERRORS:
        return None


async def publish(js: nats.js.JetStreamContext, msg_id: str, data: bytes) -> PubAck:
    return await js.publish(SUBJECT, data, headers={"Nats-Msg-Id": msg_id})


async def stored(js: nats.js.JetStreamContext) -> list[bytes]:
    """Every message of the stream, by sequence."""
    info = await js.stream_info(STREAM)
    return [(await js.get_msg(STREAM, seq)).data or b"" for seq in range(1, info.state.messages + 1)]


def assert_nothing_left(pids: list[int]) -> None:
    assert pids
    assert [pid for pid in pids if server_process.alive(pid)] == []


def test_a_message_id_published_twice_is_stored_once_across_restart_and_kill(nats_server: NatsServer) -> None:
    server = nats_server
    urls = [server.url]

    async def create_and_publish(js: nats.js.JetStreamContext) -> list[PubAck]:
        await js.add_stream(name=STREAM, subjects=["fleet.>"], storage=StorageType.FILE)
        return [
            await publish(js, "node-a/1", b"one"),
            await publish(js, "node-a/1", b"one"),
            await publish(js, "node-a/2", b"two"),
        ]

    first, again, second = with_jetstream(urls, create_and_publish)
    assert (first.seq, bool(first.duplicate)) == (1, False)
    assert (again.seq, again.duplicate) == (1, True)
    assert (second.seq, bool(second.duplicate)) == (2, False)
    assert with_jetstream(urls, stored) == [b"one", b"two"]

    server.restart()
    assert with_jetstream(urls, stored) == [b"one", b"two"]
    # The duplicate window is rebuilt from the stored messages.
    assert with_jetstream(urls, lambda js: publish(js, "node-a/2", b"two")).duplicate is True

    server.kill()
    assert not server.running()
    server.start()
    assert server.url == urls[0]
    assert with_jetstream(urls, stored) == [b"one", b"two"]
    assert (server.store_dir / "jetstream").is_dir()

    server.stop()
    assert_nothing_left(server.pids)
    assert len(server.pids) == 3


def test_a_cluster_keeps_an_r3_stream_readable_after_its_leader_restarts(nats_cluster: NatsCluster) -> None:
    cluster = nats_cluster
    assert len({s.url for s in cluster.servers}) == 3

    async def create_and_publish(js: nats.js.JetStreamContext) -> str:
        await js.add_stream(name=STREAM, subjects=["fleet.>"], storage=StorageType.FILE, num_replicas=3)
        for i in range(1, 4):
            await publish(js, f"node-a/{i}", f"record {i}".encode())
        info = await js.stream_info(STREAM)
        assert info.cluster is not None and info.cluster.leader is not None
        return info.cluster.leader

    leader = with_jetstream(cluster.urls, create_and_publish)
    restarted = cluster.server(leader)
    restarted.restart()

    # Through the restarted server alone: it is routed to the others and its replica caught up.
    alone = [restarted.url]
    eventually(lambda: answers(alone, replicas_current), f"{leader}'s replica of {STREAM} to be current again")
    assert with_jetstream(alone, stored) == [b"record 1", b"record 2", b"record 3"]
    again = with_jetstream(alone, lambda js: publish(js, "node-a/3", b"record 3"))
    assert (again.seq, again.duplicate) == (3, True)

    # A follower killed: the two others still make a quorum, and it catches up when it is back.
    now_leading = with_jetstream(alone, stream_leader)
    killed = next(s for s in cluster.servers if s.name != now_leading)
    killed.kill()
    assert not killed.running()
    others = [s.url for s in cluster.servers if s is not killed]
    assert with_jetstream(others, lambda js: publish(js, "node-a/4", b"record 4")).seq == 4
    killed.start()
    eventually(lambda: answers([killed.url], replicas_current), f"{killed.name}'s replica to catch up")
    assert with_jetstream([killed.url], stored) == [b"record 1", b"record 2", b"record 3", b"record 4"]

    cluster.stop()
    assert_nothing_left(cluster.pids)
    assert len(cluster.pids) == 5


async def stream_leader(js: nats.js.JetStreamContext) -> str | None:
    info = await js.stream_info(STREAM)
    return info.cluster.leader if info.cluster is not None else None


async def replicas_current(js: nats.js.JetStreamContext) -> bool:
    """The stream has a leader, and both other replicas are online and current."""
    info = await js.stream_info(STREAM)
    if info.cluster is None or info.cluster.leader is None:
        return False
    replicas = info.cluster.replicas or []
    return len(replicas) == 2 and all(r.current and not r.offline for r in replicas)


def test_a_leaf_reaches_the_clusters_jetstream_through_its_link_until_it_is_cut(
    nats_unavailable: str | None, tmp_path: Path
) -> None:
    if nats_unavailable is not None:
        pytest.skip(nats_unavailable)
    hub = NatsServer(tmp_path, name="hub", domain="region", leafnodes=True)
    hub.choose_ports()
    link = Link([hub.leafnode_address])
    hub.leafnode_advertise = f"127.0.0.1:{link.ports[0]}"
    leaf = NatsLeaf(tmp_path, remotes=link.urls, domain="region")
    try:
        hub.start()
        leaf.start()
        eventually(leaf.linked, "the leaf linked to the hub")
        assert "store_dir" not in leaf.config_path.read_text()  # no JetStream of its own

        async def create_and_publish(js: nats.js.JetStreamContext) -> PubAck:
            await js.add_stream(name=STREAM, subjects=["fleet.>"], storage=StorageType.FILE)
            return await publish(js, "node-a/1", b"one")

        # the plain JetStream API, through the leaf, is the hub's (default_js_domain)
        assert with_jetstream([leaf.url], create_and_publish).domain == "region"

        link.cut()
        eventually(lambda: not leaf.linked(), "the leaf cut off")
        assert answers([leaf.url], lambda js: publish(js, "node-a/2", b"two")) is None  # no responder
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", link.ports[0]), timeout=5).close()
        assert with_jetstream([hub.url], stored) == [b"one"]

        link.restore()
        eventually(leaf.linked, "the leaf linked again", timeout=10)
        assert with_jetstream([leaf.url], lambda js: publish(js, "node-a/1", b"one")).duplicate is True
        assert with_jetstream([leaf.url], lambda js: publish(js, "node-a/2", b"two")).seq == 2
        assert with_jetstream([hub.url], stored) == [b"one", b"two"]
    finally:
        leaf.stop()
        link.close()
        hub.stop()
    assert_nothing_left(hub.pids + leaf.pids)
