"""A served connection's write budget (``rpc.bridge._ServedConnection``): one loop step
writes to it for at most ``WRITE_BUDGET_SECONDS``; what a step writes past that waits in
asyncio's transport, whose protocol is paused, for a later step; nothing is lost or
reordered. The clock is a fake one that each read moves on, so the budget runs out after a
known number of writes."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import pytest
import trio
import trio_asyncio
from grpclib import Status as GrpcStatus
from grpclib.exceptions import GRPCError

from eventsrc.gen.node.v1 import node_pb2 as pb
from eventsrc.gen.node.v1.node_grpc import NodeBase, NodeStub
from eventsrc.rpc import bridge
from eventsrc.rpc.bridge import WRITE_BUDGET_SECONDS, _ServedConnection, open_loop, serve_unix, unix_channel
from tests.support.grpcio_stubs import unix_target

FRAME = 16 * 1024 + 9  # what grpclib writes at a time to a client with 16 KiB frames
#: 12 frames (197 KB): what a unix socket takes at once with Linux's default buffer sizes
FRAMES = 12
TICK = WRITE_BUDGET_SECONDS * 0.6  # each clock read: the budget is spent at the third write


class _Writer(asyncio.Protocol):
    """Writes ``FRAMES`` frames as grpclib's send loop does: one after the other while not
    paused, waiting while paused; notes each step it wrote in."""

    def __init__(self) -> None:
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.pauses = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def pause_writing(self) -> None:
        self.pauses += 1
        self.resumed.clear()

    def resume_writing(self) -> None:
        self.resumed.set()

    async def send(self, frames: list[bytes]) -> list[int]:
        """The frames written; for each step that wrote, how many it wrote."""
        steps: list[int] = []
        in_step = 0
        for frame in frames:
            if not self.resumed.is_set():
                steps.append(in_step)
                in_step = 0
                await self.resumed.wait()
            self.transport.write(frame)  # type: ignore[attr-defined]
            in_step += 1
        steps.append(in_step)
        return steps


def _frames() -> list[bytes]:
    return [bytes([i % 251]) * FRAME for i in range(FRAMES)]


async def _send_through(sock: socket.socket, peer: socket.socket) -> tuple[list[int], bytes, int]:
    """Serve ``sock`` as asyncio does an accepted connection, write the frames, read them
    all from ``peer``: the writes per step, what arrived, how often the writer was paused."""
    frames = _frames()
    received = bytearray()

    async def read_all() -> None:
        with trio.fail_after(30):
            while len(received) < FRAME * FRAMES:
                await trio.lowlevel.wait_readable(peer)
                got = peer.recv(1 << 20)
                assert got, f"the connection ended after {len(received)} bytes"
                received.extend(got)

    async def write_all() -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        transport, writer = await loop.connect_accepted_socket(_Writer, sock=sock)
        try:
            steps = await writer.send(frames)
            while transport.get_write_buffer_size():
                await asyncio.sleep(0)
        finally:
            transport.close()
        return steps, writer.pauses

    peer.setblocking(False)
    async with open_loop(), trio.open_nursery() as nursery:
        nursery.start_soon(read_all)
        steps, pauses = await trio_asyncio.aio_as_trio(write_all)()
    return steps, bytes(received), pauses


def _pair(served: bool) -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)  # the socket would take it all
    if served:
        a = _ServedConnection(a.family, a.type, a.proto, fileno=a.detach())
    return a, b


@pytest.fixture
def ticking_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]

    def clock() -> float:
        now[0] += TICK
        return now[0]

    monkeypatch.setattr(bridge, "_clock", clock)


@pytest.mark.usefixtures("ticking_clock")
async def test_a_large_answer_is_written_over_many_steps() -> None:
    sock, peer = _pair(served=True)
    with peer:
        steps, received, pauses = await _send_through(sock, peer)
    assert received == b"".join(_frames())  # nothing lost, nothing reordered
    assert pauses > 0
    assert len(steps) > 1
    # the first step sends two frames; the third is refused, and it and those after it wait
    # in the transport's buffer until it is over its high-water mark (64 KiB by default)
    assert steps[0] == 2 + (64 * 1024) // FRAME + 1


@pytest.mark.usefixtures("ticking_clock")
async def test_a_plain_socket_takes_it_in_one_step() -> None:
    """What the budget mends: grpclib's loop writes the whole answer in one step."""
    sock, peer = _pair(served=False)
    with peer:
        steps, received, pauses = await _send_through(sock, peer)
    assert received == b"".join(_frames())
    assert (steps, pauses) == ([FRAMES], 0)


async def test_small_writes_within_the_budget_go_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bridge, "_clock", lambda: 1000.0)  # however long the machine takes
    sock, peer = _pair(served=True)
    with sock, peer:
        async with open_loop():

            async def write() -> int:
                loop = asyncio.get_running_loop()
                transport, _ = await loop.connect_accepted_socket(_Writer, sock=sock)
                transport.write(b"x" * 100)
                transport.write(b"y" * 100)
                left = transport.get_write_buffer_size()
                transport.close()
                return left

            assert await trio_asyncio.aio_as_trio(write)() == 0
        assert peer.recv(1000) == b"x" * 100 + b"y" * 100


class _BigListing(NodeBase):
    """A node API whose ListPods answers ``PODS`` pods (about 2 MB); nothing else."""

    def __init__(self) -> None:
        pods = [pb.PodInfo(uid=f"uid-{i:06d}", namespace="ns", name=f"{'p' * 100}{i}") for i in range(PODS)]
        self.answer = pb.ListPodsResponse(pods=pods)

    async def ListPods(self, stream) -> None:  # type: ignore[no-untyped-def]
        await stream.recv_message()
        await stream.send_message(self.answer)

    async def _unimplemented(self, stream) -> None:  # type: ignore[no-untyped-def]
        raise GRPCError(GrpcStatus.UNIMPLEMENTED)

    Admit = GetPod = Remove = Status = Watch = _unimplemented


PODS = 15_000


@pytest.mark.usefixtures("ticking_clock")
async def test_a_served_answer_arrives_whole_to_both_clients(tmp_path: Path) -> None:
    """Through grpclib's server: a grpclib client (16 KiB frames) and a grpcio one get the
    whole answer, which the budget (spent many times over) deferred."""
    service = _BigListing()
    path = tmp_path / "api.sock"
    async with open_loop(), trio.open_nursery() as nursery:
        await nursery.start(serve_unix, [service], path)

        async def grpclib_call() -> pb.ListPodsResponse:
            channel = unix_channel(str(path))
            try:
                return await NodeStub(channel).ListPods(pb.ListPodsRequest(), timeout=60)
            finally:
                channel.close()

        deferred = _ServedConnection.deferred
        got = await trio_asyncio.aio_as_trio(grpclib_call)()
        assert got == service.answer
        assert _ServedConnection.deferred > deferred  # it went out over several steps
        deferred = _ServedConnection.deferred

        def grpcio_call() -> pb.ListPodsResponse:
            with grpc.insecure_channel(unix_target(path)) as channel:
                call = channel.unary_unary(
                    "/eventsrc.node.v1.Node/ListPods",
                    request_serializer=pb.ListPodsRequest.SerializeToString,
                    response_deserializer=pb.ListPodsResponse.FromString,
                )
                return call(pb.ListPodsRequest(), timeout=60)

        got = await trio.to_thread.run_sync(grpcio_call)
        assert got == service.answer
        assert _ServedConnection.deferred > deferred
        nursery.cancel_scope.cancel()


@pytest.mark.usefixtures("ticking_clock")
def test_outside_a_loop_it_is_a_plain_socket() -> None:
    sock, peer = _pair(served=True)
    with sock, peer:
        for _ in range(5):
            assert sock.send(b"z" * 10) == 10
        assert peer.recv(100) == b"z" * 50
