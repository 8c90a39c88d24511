"""The trio-native unary gRPC client, against grpcio's server (an independent implementation)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import trio
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from eventsrc.gen.deviceplugin.v1beta1 import api_pb2 as pb
from eventsrc.rpc.bridge import CALL_ERRORS, why
from eventsrc.rpc.native_client import UnaryChannel, grpc_timeout

ALLOCATE = "/v1beta1.DevicePlugin/Allocate"


def answer(req: pb.AllocateRequest) -> pb.AllocateResponse:
    ids = list(req.container_requests[0].devices_ids)
    return pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse(envs={"IDS": ",".join(ids)})])


class Server:
    """A grpcio server on a unix socket whose Allocate does what ``behaviour`` says."""

    def __init__(
        self,
        path: Path,
        behaviour: Callable[[pb.AllocateRequest, Any], Any],
        serialize: Callable[[Any], bytes] | None = None,
    ) -> None:
        self.path = path
        self.behaviour = behaviour
        self.serialize = serialize or (lambda m: m.SerializeToString())
        self.server: grpc.Server | None = None
        self.release = threading.Event()

    def start(self) -> Server:
        handler = grpc.method_handlers_generic_handler(
            "v1beta1.DevicePlugin",
            {
                "Allocate": grpc.unary_unary_rpc_method_handler(
                    self.behaviour,
                    request_deserializer=pb.AllocateRequest.FromString,
                    response_serializer=self.serialize,
                )
            },
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[handler])
        self.server.add_insecure_port(f"unix://{self.path}")
        self.server.start()
        return self

    def stop(self) -> None:
        self.release.set()
        if self.server is not None:
            self.server.stop(0).wait()


@pytest.fixture
def sock(root: Path) -> Iterator[Path]:
    root.mkdir(parents=True, exist_ok=True)
    yield root / "p.sock"


def request(*ids: str) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids))])


async def call(ch: UnaryChannel, req: pb.AllocateRequest, timeout: float | None = 5) -> pb.AllocateResponse:
    return await ch.call(ALLOCATE, req, pb.AllocateResponse, timeout)


async def test_calls_share_one_connection_and_get_their_own_answers(sock: Path) -> None:
    seen: list[str] = []

    def behaviour(req: pb.AllocateRequest, ctx: Any) -> pb.AllocateResponse:
        seen.append(dict(ctx.invocation_metadata()).get("user-agent", ""))
        return answer(req)

    server = Server(sock, behaviour).start()
    try:
        ch = UnaryChannel(str(sock))
        got: list[str] = []

        async def one(i: int) -> None:
            resp = await ch.call(ALLOCATE, request(f"dev-{i}"), pb.AllocateResponse, 5)
            got.append(resp.container_responses[0].envs["IDS"])

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(one, i)
        assert sorted(got) == sorted(f"dev-{i}" for i in range(20))
        assert len(seen) == 20 and all("eventsrc" in ua for ua in seen)
        ch.close()
    finally:
        server.stop()


async def test_a_status_and_its_message_reach_the_caller(sock: Path) -> None:
    def behaviour(req: pb.AllocateRequest, ctx: Any) -> None:
        ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, "device dev-1 is on fire: 100% sûr")

    server = Server(sock, behaviour).start()
    try:
        with pytest.raises(GRPCError) as err:
            await call(UnaryChannel(str(sock)), request("dev-1"))
        assert err.value.status is Status.FAILED_PRECONDITION
        assert err.value.message == "device dev-1 is on fire: 100% sûr"
    finally:
        server.stop()


async def test_a_hung_server_times_out_and_the_next_call_works(sock: Path) -> None:
    calls = 0

    def behaviour(req: pb.AllocateRequest, ctx: Any) -> pb.AllocateResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            server.release.wait(10)
        return answer(req)

    server = Server(sock, behaviour).start()
    try:
        ch = UnaryChannel(str(sock))
        # Whichever comes first: the server's deadline (grpc-timeout) or the client's own.
        with pytest.raises((trio.TooSlowError, GRPCError)) as err:
            await call(ch, request("dev-1"), timeout=0.3)
        assert isinstance(err.value, CALL_ERRORS)
        if isinstance(err.value, GRPCError):
            assert err.value.status is Status.DEADLINE_EXCEEDED
        assert why(err.value).startswith("timed out")  # users read the same either way
        server.release.set()
        assert (await call(ch, request("dev-2"))).container_responses[0].envs["IDS"] == "dev-2"
    finally:
        server.stop()


async def test_garbage_is_a_failed_call(sock: Path) -> None:
    server = Server(sock, lambda req, ctx: answer(req), serialize=lambda m: b"\xff\xff\xff\xff garbage").start()
    try:
        with pytest.raises(GRPCError) as err:
            await call(UnaryChannel(str(sock)), request("dev-1"))
        assert err.value.status is Status.INTERNAL and "cannot decode" in (err.value.message or "")
    finally:
        server.stop()


async def test_an_answer_over_the_limit_is_refused(sock: Path) -> None:
    big = pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse(envs={"X": "y" * 200_000})])
    server = Server(sock, lambda req, ctx: big).start()
    try:
        with pytest.raises(GRPCError) as err:
            await call(UnaryChannel(str(sock), max_message=100_000), request("dev-1"))
        assert err.value.status is Status.RESOURCE_EXHAUSTED
        # Under the limit, the same answer goes through whole (flow control included).
        resp = await call(UnaryChannel(str(sock), max_message=1 << 20), request("dev-1"))
        assert len(resp.container_responses[0].envs["X"]) == 200_000
    finally:
        server.stop()


async def test_a_restarted_server_is_dialled_again(sock: Path) -> None:
    server = Server(sock, lambda req, ctx: answer(req)).start()
    ch = UnaryChannel(str(sock))
    try:
        assert (await call(ch, request("dev-1"))).container_responses[0].envs["IDS"] == "dev-1"
    finally:
        server.stop()
    sock.unlink(missing_ok=True)
    server = Server(sock, lambda req, ctx: answer(req)).start()
    try:
        # The kept connection is dead: the call notices before any answer and dials again.
        assert (await call(ch, request("dev-2"))).container_responses[0].envs["IDS"] == "dev-2"
    finally:
        server.stop()


async def test_no_server_is_an_os_error(sock: Path) -> None:
    with pytest.raises(OSError):
        await call(UnaryChannel(str(sock)), request("dev-1"))


@pytest.mark.parametrize(
    ("seconds", "header"),
    [(0.0001, b"1m"), (0.25, b"250m"), (30, b"30000m"), (99_999.999, b"99999999m"), (100_000, b"100000S")],
)
def test_grpc_timeout_header(seconds: float, header: bytes) -> None:
    assert grpc_timeout(seconds) == header


@pytest.mark.parametrize("kib", [200, 3000])
async def test_a_request_larger_than_the_first_windows_is_sent_whole(sock: Path, kib: int) -> None:
    """HTTP/2 starts every window at 64 KiB: the rest of a larger request goes out as the
    server opens them (its SETTINGS, and WINDOW_UPDATEs on the stream and the connection)."""
    ids = [f"dev-{i:07d}" for i in range(kib * 1024 // 13)]
    server = Server(sock, lambda req, ctx: answer(req)).start()
    try:
        ch = UnaryChannel(str(sock))
        for _ in range(2):  # the second call starts on a connection whose windows moved
            resp = await call(ch, request(*ids), timeout=10)
            assert resp.container_responses[0].envs["IDS"] == ",".join(ids)
        ch.close()
    finally:
        server.stop()


# --------------------------------------------------------------------------- hostile or dying peers
# A raw HTTP/2 server (h2 on trio), so that a test can make the peer do what grpcio never does.


async def _raw_server(
    path: Path, behave: Callable[[int, Any, int], Any], *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve on ``path``; for each request ended, ``behave(request_number, conn, stream_id)``
    queues an answer on the h2 connection, and returns "die" to drop the connection at
    once, or "close" to drop it once what it queued is sent."""
    import h2.config
    import h2.connection
    import h2.events

    taken = 0

    async def serve(sock: trio.SocketStream) -> None:
        nonlocal taken
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        c.initiate_connection()
        await sock.send_all(c.data_to_send())
        while data := await sock.receive_some(65536):
            then = None
            for e in c.receive_data(data):
                if isinstance(e, h2.events.StreamEnded):
                    taken += 1
                    then = behave(taken, c, e.stream_id)
                    if then == "die":
                        await sock.aclose()
                        return
            await sock.send_all(c.data_to_send())
            if then == "close":
                await sock.aclose()
                return

    listener = trio.socket.socket(trio.socket.AF_UNIX)
    await listener.bind(str(path))
    listener.listen()
    task_status.started()
    await trio.serve_listeners(serve, [trio.SocketListener(listener)])


def _ok(c: Any, sid: int) -> None:
    from eventsrc.rpc.bridge import frame

    c.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    c.send_data(sid, frame(answer(request("dev-1"))))
    c.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)


async def test_a_request_the_plugin_took_is_never_sent_again(sock: Path) -> None:
    """The plugin reads the second request and dies: Allocate is not idempotent, so the call
    fails saying its outcome is unknown, instead of being sent again on a new connection."""
    taken: list[int] = []

    def behave(n: int, c: Any, sid: int) -> str | None:
        taken.append(n)
        if n == 2:
            return "die"
        _ok(c, sid)
        return None

    async with trio.open_nursery() as nursery:
        await nursery.start(_raw_server, sock, behave)
        ch = UnaryChannel(str(sock))
        await call(ch, request("dev-1"))
        with pytest.raises(CALL_ERRORS) as err:
            await call(ch, request("dev-1"))
        assert "not known" in why(err.value)
        assert taken == [1, 2]  # not 3
        await call(ch, request("dev-1"))  # the next call dials again
        ch.close()
        nursery.cancel_scope.cancel()


async def test_a_peer_that_dies_mid_call_is_a_call_error(sock: Path) -> None:
    """Whatever the socket says when the peer is gone (EOF, EPIPE, ECONNRESET), the caller
    gets one of CALL_ERRORS, which the admission handles, and never trio's own errors."""

    def behave(n: int, c: Any, sid: int) -> str:
        if n % 2:
            return "die"  # EOF
        c.update_settings({4: 1 << 20})  # a SETTINGS frame the client must acknowledge: into a closed socket (EPIPE)
        return "close"

    async with trio.open_nursery() as nursery:
        await nursery.start(_raw_server, sock, behave)
        ch = UnaryChannel(str(sock))
        for _ in range(6):
            with pytest.raises(CALL_ERRORS):
                await call(ch, request("dev-1"))
        nursery.cancel_scope.cancel()


async def test_an_answer_longer_than_it_announced_is_refused_unbuffered(sock: Path) -> None:
    def behave(n: int, c: Any, sid: int) -> None:
        c.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        c.send_data(sid, b"\x00\x00\x00\x00\x0a" + b"\x00" * 10 + b"more than announced")

    async with trio.open_nursery() as nursery:
        await nursery.start(_raw_server, sock, behave)
        ch = UnaryChannel(str(sock), max_message=1024)
        with pytest.raises(GRPCError) as err:
            await call(ch, request("dev-1"))
        assert err.value.status == Status.INTERNAL and "more than one message" in str(err.value.message)
        nursery.cancel_scope.cancel()


async def test_an_answer_that_comes_with_a_goaway_is_the_answer(sock: Path) -> None:
    def behave(n: int, c: Any, sid: int) -> str:
        _ok(c, sid)
        c.close_connection()  # GOAWAY in the same write as the answer
        return "close"

    async with trio.open_nursery() as nursery:
        await nursery.start(_raw_server, sock, behave)
        ch = UnaryChannel(str(sock))
        for _ in range(3):  # and the next call, on a connection the server closed, dials again
            resp = await call(ch, request("dev-1"))
            assert resp.container_responses[0].envs["IDS"] == "dev-1"
        nursery.cancel_scope.cancel()


async def test_many_calls_on_one_connection_give_the_window_back(sock: Path) -> None:
    """Answers on one connection add up past the connection's 64 KiB receive window: the
    client must hand the window back (WINDOW_UPDATE) or the server stops sending."""

    def behaviour(req: pb.AllocateRequest, ctx: Any) -> pb.AllocateResponse:
        return pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse(envs={"PAD": "x" * 4000})])

    server = Server(sock, behaviour).start()
    try:
        ch = UnaryChannel(str(sock))
        for _ in range(100):  # about 400 KB of answers
            resp = await call(ch, request("dev-1"), timeout=5)
            assert len(resp.container_responses[0].envs["PAD"]) == 4000
        ch.close()
    finally:
        server.stop()
