"""The daemon's calls to a device plugin on the admission path (``Endpoint.allocate``,
``preferred``, ``pre_start``: grpclib on a ``unix_channel``, called from trio), against
grpcio's server (an independent implementation) and, for what grpcio never does, a raw
HTTP/2 peer."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import pytest
import trio
import trio_asyncio
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from eventsrc import events as ev
from eventsrc.gen.deviceplugin.v1beta1 import api_pb2 as pb
from eventsrc.gen.deviceplugin.v1beta1.api_grpc import DevicePluginStub
from eventsrc.node.device_manager import Endpoint
from eventsrc.rpc.bridge import CALL_ERRORS, unix_channel, why
from eventsrc.rpc.codec import MAX_MESSAGE_BYTES

Behaviour = Callable[[Any, Any], Any]


def request(*ids: str) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids))])


def answer(req: pb.AllocateRequest) -> pb.AllocateResponse:
    ids = list(req.container_requests[0].devices_ids)
    return pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse(envs={"IDS": ",".join(ids)})])


class Server:
    """A grpcio server on a unix socket whose Allocate (and, when given, GetPreferredAllocation
    and PreStartContainer) does what its behaviour says."""

    def __init__(
        self,
        path: Path,
        allocate: Behaviour,
        serialize: Callable[[Any], bytes] | None = None,
        preferred: Behaviour | None = None,
        pre_start: Behaviour | None = None,
    ) -> None:
        self.path = path
        self.serialize = serialize or (lambda m: m.SerializeToString())
        self.methods = {
            "Allocate": (allocate, pb.AllocateRequest),
            "GetPreferredAllocation": (preferred, pb.PreferredAllocationRequest),
            "PreStartContainer": (pre_start, pb.PreStartContainerRequest),
        }
        self.server: grpc.Server | None = None
        self.release = threading.Event()

    def start(self) -> Server:
        handler = grpc.method_handlers_generic_handler(
            "v1beta1.DevicePlugin",
            {
                name: grpc.unary_unary_rpc_method_handler(
                    behaviour, request_deserializer=request_type.FromString, response_serializer=self.serialize
                )
                for name, (behaviour, request_type) in self.methods.items()
                if behaviour is not None
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


@contextlib.contextmanager
def serving(server: Server) -> Iterator[Server]:
    """``server`` started (unless it is), stopped on the way out."""
    if server.server is None:
        server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def sock(root: Path) -> Iterator[Path]:
    root.mkdir(parents=True, exist_ok=True)
    yield root / "p.sock"


@contextlib.asynccontextmanager
async def endpoint(sock: Path, max_message: int = MAX_MESSAGE_BYTES) -> AsyncIterator[Endpoint]:
    """The plugin on ``sock`` as the device manager holds it once registered."""
    async with trio_asyncio.open_loop():
        channel = unix_channel(str(sock), max_message)
        ep = Endpoint("example.com/dev", sock.name, sock, channel, DevicePluginStub(channel), ev.PluginOptions())
        try:
            yield ep
        finally:
            ep.close()


async def allocate(ep: Endpoint, *ids: str, timeout: float = 5) -> str:
    """The IDS the plugin's answer names."""
    return (await ep.allocate(list(ids), timeout)).envs["IDS"]


# --------------------------------------------------------------------------- against grpcio


async def test_concurrent_calls_get_their_own_answers(sock: Path) -> None:
    with serving(Server(sock, lambda req, ctx: answer(req))):
        async with endpoint(sock) as ep:
            got: list[str] = []

            async def one(i: int) -> None:
                got.append(await allocate(ep, f"dev-{i}"))

            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(one, i)
            assert sorted(got) == sorted(f"dev-{i}" for i in range(20))


async def test_each_call_reaches_its_method(sock: Path) -> None:
    asked: list[tuple[str, list[str]]] = []

    def preferred(req: pb.PreferredAllocationRequest, ctx: Any) -> pb.PreferredAllocationResponse:
        r = req.container_requests[0]
        asked.append(("preferred", [*r.available_deviceIDs, *r.must_include_deviceIDs, str(r.allocation_size)]))
        return pb.PreferredAllocationResponse(
            container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=list(r.available_deviceIDs)[:1])]
        )

    def pre_start(req: pb.PreStartContainerRequest, ctx: Any) -> pb.PreStartContainerResponse:
        asked.append(("pre_start", list(req.devices_ids)))
        return pb.PreStartContainerResponse()

    with serving(Server(sock, lambda req, ctx: answer(req), preferred=preferred, pre_start=pre_start)):
        async with endpoint(sock) as ep:
            assert await ep.preferred(["d-1", "d-2"], ["d-0"], 2) == ["d-1"]
            await ep.pre_start(["d-1"])
            assert await allocate(ep, "d-1") == "d-1"
    assert asked == [("preferred", ["d-1", "d-2", "d-0", "2"]), ("pre_start", ["d-1"])]


async def test_a_status_and_its_message_reach_the_caller(sock: Path) -> None:
    def behaviour(req: pb.AllocateRequest, ctx: Any) -> None:
        ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, "device dev-1 is on fire: 100% sûr")

    with serving(Server(sock, behaviour)):
        async with endpoint(sock) as ep:
            with pytest.raises(GRPCError) as err:
                await allocate(ep, "dev-1")
    assert err.value.status is Status.FAILED_PRECONDITION
    assert err.value.message == "device dev-1 is on fire: 100% sûr"
    assert why(err.value) == "FAILED_PRECONDITION: device dev-1 is on fire: 100% sûr"


async def test_a_hung_plugin_times_out_and_the_next_call_works(sock: Path) -> None:
    calls = 0

    def behaviour(req: pb.AllocateRequest, ctx: Any) -> pb.AllocateResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            server.release.wait(10)
        return answer(req)

    with serving(Server(sock, behaviour)) as server:
        async with endpoint(sock) as ep:
            # Whichever comes first: the plugin's deadline (grpc-timeout) or the daemon's own.
            with pytest.raises(CALL_ERRORS) as err:
                await allocate(ep, "dev-1", timeout=0.3)
            if isinstance(err.value, GRPCError):
                assert err.value.status is Status.DEADLINE_EXCEEDED
            assert why(err.value).startswith("timed out")  # users read the same either way
            server.release.set()
            assert await allocate(ep, "dev-2") == "dev-2"


async def test_garbage_is_a_failed_call(sock: Path) -> None:
    with serving(Server(sock, lambda req, ctx: answer(req), serialize=lambda m: b"\xff\xff\xff\xff garbage")):
        async with endpoint(sock) as ep:
            with pytest.raises(GRPCError) as err:
                await allocate(ep, "dev-1")
    assert err.value.status is Status.INTERNAL
    assert (err.value.message or "").startswith("cannot decode the AllocateResponse: ")


async def test_an_answer_over_the_limit_is_refused(sock: Path) -> None:
    big = pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse(envs={"X": "y" * 100_000})])
    with serving(Server(sock, lambda req, ctx: big)):
        async with endpoint(sock, max_message=50_000) as ep:
            with pytest.raises(GRPCError) as err:
                await ep.allocate(["dev-1"], 5)
        assert err.value.status is Status.RESOURCE_EXHAUSTED
        assert err.value.message == f"received message larger than max ({big.ByteSize()} vs. 50000)"
        # Under the limit, the same answer goes through whole (flow control included).
        async with endpoint(sock, max_message=1 << 20) as ep:
            assert len((await ep.allocate(["dev-1"], 5)).envs["X"]) == 100_000


async def test_the_daemons_limit_is_grpc_gos_default(sock: Path) -> None:
    """An answer of 4 MiB and one byte is refused; one of 4 MiB is taken."""
    wanted: dict[str, int] = {}

    def preferred(req: pb.PreferredAllocationRequest, ctx: Any) -> pb.PreferredAllocationResponse:
        size = wanted["size"]
        # One ID of n bytes: two tags and two 4-byte lengths around it.
        resp = pb.PreferredAllocationResponse(
            container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=["x" * (size - 10)])]
        )
        assert resp.ByteSize() == size
        return resp

    with serving(Server(sock, lambda req, ctx: answer(req), preferred=preferred)):
        async with endpoint(sock) as ep:
            wanted["size"] = MAX_MESSAGE_BYTES + 1
            with pytest.raises(GRPCError) as err:
                await ep.preferred(["a"], [], 1)
            assert err.value.status is Status.RESOURCE_EXHAUSTED
            assert why(err.value) == (
                "RESOURCE_EXHAUSTED: received message larger than max "
                f"({MAX_MESSAGE_BYTES + 1} vs. {MAX_MESSAGE_BYTES})"
            )
            wanted["size"] = MAX_MESSAGE_BYTES
            assert len((await ep.preferred(["a"], [], 1))[0]) == MAX_MESSAGE_BYTES - 10


async def test_a_restarted_plugin_is_dialled_again(sock: Path) -> None:
    """The plugin stops and starts again while the daemon's loop runs (as it always does): the
    old connection is seen closed, and the next call dials the new plugin. grpclib never
    resends a request, so a call racing the restart itself fails instead (docs/adr/0012)."""
    async with endpoint(sock) as ep:
        server = Server(sock, lambda req, ctx: answer(req)).start()
        assert await allocate(ep, "dev-1") == "dev-1"
        await trio.to_thread.run_sync(server.stop)
        sock.unlink(missing_ok=True)
        with serving(await trio.to_thread.run_sync(Server(sock, lambda req, ctx: answer(req)).start)):
            assert await allocate(ep, "dev-2") == "dev-2"


async def test_no_plugin_is_an_os_error(sock: Path) -> None:
    async with endpoint(sock) as ep:
        with pytest.raises(OSError):
            await allocate(ep, "dev-1")


@pytest.mark.parametrize("kib", [400, 3000])
async def test_a_request_and_an_answer_larger_than_the_first_windows_go_whole(sock: Path, kib: int) -> None:
    """HTTP/2 starts every window at 64 KiB: the rest of a larger message goes as the peer
    opens them. Twice: the second call starts on a connection whose windows moved."""
    ids = [f"dev-{i:07d}" for i in range(kib * 1024 // 13)]

    def preferred(req: pb.PreferredAllocationRequest, ctx: Any) -> pb.PreferredAllocationResponse:
        available = list(req.container_requests[0].available_deviceIDs)
        return pb.PreferredAllocationResponse(
            container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=available)]
        )

    with serving(Server(sock, lambda req, ctx: answer(req), preferred=preferred)):
        async with endpoint(sock) as ep:
            for _ in range(2):
                assert await ep.preferred(ids, [], len(ids)) == ids


async def test_many_calls_on_one_connection_give_the_window_back(sock: Path) -> None:
    """Answers on one connection add up past the connection's receive window: the daemon
    must hand the window back (WINDOW_UPDATE) or the plugin stops sending."""

    def behaviour(req: pb.AllocateRequest, ctx: Any) -> pb.AllocateResponse:
        return pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse(envs={"PAD": "x" * 4000})])

    with serving(Server(sock, behaviour)):
        async with endpoint(sock) as ep:
            for _ in range(100):  # about 400 KB of answers
                assert len((await ep.allocate(["dev-1"], 5)).envs["PAD"]) == 4000


# --------------------------------------------------------------------------- hostile or dying peers
# A raw HTTP/2 server (h2 on trio), so that a test can make the peer do what grpcio never does.


def frame(message: Any) -> bytes:
    body = message.SerializeToString()
    return b"\x00" + len(body).to_bytes(4, "big") + body


async def _raw_server(
    path: Path, behave: Callable[[int, Any, int], Any], *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve on ``path``; for each request ended, ``behave(request_number, conn, stream_id)``
    queues an answer on the h2 connection, and returns "die" to drop the connection at
    once, or "close" to drop it once what it queued is sent."""
    taken = 0

    async def serve(sock: trio.SocketStream) -> None:
        nonlocal taken
        c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        c.initiate_connection()
        await sock.send_all(c.data_to_send())
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
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


def _ok(c: Any, sid: int, body: bytes | None = None) -> None:
    c.send_headers(sid, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    c.send_data(sid, frame(answer(request("dev-1"))) if body is None else body)
    c.send_headers(sid, [(b"grpc-status", b"0")], end_stream=True)


async def test_a_request_the_plugin_took_is_never_sent_again(sock: Path) -> None:
    """The plugin reads the second request and dies: Allocate is not idempotent, so the call
    fails, instead of being sent again on a new connection; the next call dials again."""
    taken: list[int] = []

    def behave(n: int, c: Any, sid: int) -> str | None:
        taken.append(n)
        if n == 2:
            return "die"
        _ok(c, sid)
        return None

    async with trio.open_nursery() as nursery:
        await nursery.start(_raw_server, sock, behave)
        async with endpoint(sock) as ep:
            await allocate(ep, "dev-1")
            with pytest.raises(CALL_ERRORS):
                await allocate(ep, "dev-1")
            assert taken == [1, 2]  # not 3
            await allocate(ep, "dev-1")
        nursery.cancel_scope.cancel()
    assert taken == [1, 2, 3]


async def test_a_peer_that_dies_mid_call_is_a_call_error(sock: Path) -> None:
    """Whatever the socket says when the peer is gone (EOF, EPIPE, ECONNRESET), the caller
    gets one of CALL_ERRORS, which the admission handles."""

    def behave(n: int, c: Any, sid: int) -> str:
        if n % 2:
            return "die"  # EOF
        c.update_settings({4: 1 << 20})  # a SETTINGS frame the client must acknowledge: into a closed socket
        return "close"

    async with trio.open_nursery() as nursery:
        await nursery.start(_raw_server, sock, behave)
        async with endpoint(sock) as ep:
            for _ in range(6):
                with pytest.raises(CALL_ERRORS):
                    await allocate(ep, "dev-1")
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"\x00\x00\x00\x00\x0a" + b"\x00" * 4, "the peer ended the stream in the middle of a message"),
        (b"\x01\x00\x00\x00\x00", "UNIMPLEMENTED: compressed messages are not supported"),
        (b"\x00\x00\x00\x00\x04\xff\xff\xff\xff", "INTERNAL: cannot decode the AllocateResponse: "),
    ],
    ids=["truncated", "compressed", "garbage"],
)
async def test_a_malformed_answer_is_a_call_error(sock: Path, body: bytes, words: str) -> None:
    def behave(n: int, c: Any, sid: int) -> None:
        _ok(c, sid, body)

    async with trio.open_nursery() as nursery:
        await nursery.start(_raw_server, sock, behave)
        async with endpoint(sock) as ep:
            with pytest.raises(CALL_ERRORS) as err:
                await allocate(ep, "dev-1")
            assert why(err.value).startswith(words), why(err.value)
        nursery.cancel_scope.cancel()


async def test_a_goaway_fails_the_calls_on_its_connection_and_the_next_call_dials_again(sock: Path) -> None:
    """grpclib ends every stream of a connection that says GOAWAY, even one whose answer came
    in the same write (docs/adr/0012): the call fails as a call error, saying so, and the
    next call opens a new connection."""

    def behave(n: int, c: Any, sid: int) -> str | None:
        _ok(c, sid)
        if n == 1:
            c.close_connection()  # GOAWAY in the same write as the answer
            return "close"
        return None

    async with trio.open_nursery() as nursery:
        await nursery.start(_raw_server, sock, behave)
        async with endpoint(sock) as ep:
            with pytest.raises(CALL_ERRORS) as err:
                await allocate(ep, "dev-1")
            assert "GOAWAY" in why(err.value)
            for _ in range(2):
                assert await allocate(ep, "dev-1") == "dev-1"
        nursery.cancel_scope.cancel()
