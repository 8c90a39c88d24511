"""The NRI transport (eventsrc.rpc.ttrpc) against a fake runtime written here from raw bytes.

The fake packs and unpacks the mux frames and the ttrpc headers with ``struct`` itself, and
reads ttrpc's Request/Response/Status with protobuf, so nothing of the module's own encoder
or demux checks itself. Nothing sleeps to synchronise: the fake reads what the session wrote,
and trio.testing.wait_all_tasks_blocked says when everything waits.
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
import trio.testing

from eventsrc.gen.ttrpc import request_pb2, status_pb2
from eventsrc.rpc import ttrpc
from eventsrc.rpc.ttrpc import ConnectionLost, Session, TtrpcError, nri_session, session_over

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME = "nri.pkg.api.v1alpha1.Runtime"
REQUEST, RESPONSE, DATA = 1, 2, 3
MAX = 4 << 20


# ------------------------------------------------------------------ the fake runtime, by hand


def frame(conn: int, data: bytes) -> bytes:
    return struct.pack(">II", conn, len(data)) + data


def message(stream_id: int, kind: int, payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">IIBB", len(payload), stream_id, kind, flags) + payload


def request(method: str, payload: bytes, service: str = PLUGIN, timeout_nano: int = 0) -> bytes:
    return request_pb2.Request(
        service=service, method=method, payload=payload, timeout_nano=timeout_nano
    ).SerializeToString()


def response(payload: bytes = b"", code: int = 0, text: str = "") -> bytes:
    return request_pb2.Response(status=status_pb2.Status(code=code, message=text), payload=payload).SerializeToString()


@dataclass
class Received:
    conn: int
    stream_id: int
    kind: int
    flags: int
    payload: bytes

    def request(self) -> request_pb2.Request:
        assert (self.conn, self.kind) == (2, REQUEST), self
        return request_pb2.Request.FromString(self.payload)

    def response(self) -> request_pb2.Response:
        assert (self.conn, self.kind) == (1, RESPONSE), self
        return request_pb2.Response.FromString(self.payload)


class Runtime:
    """The runtime's end of the socket, in raw frames."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.raw = bytearray()
        self.conns = {1: bytearray(), 2: bytearray()}
        self.frame_sizes: list[int] = []

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def serve_request(self, stream_id: int, method: str, payload: bytes, timeout_nano: int = 0) -> None:
        """A request of the runtime to the plugin, on conn 1, in one frame."""
        await self.send(frame(1, message(stream_id, REQUEST, request(method, payload, timeout_nano=timeout_nano))))

    async def answer(self, stream_id: int, body: bytes) -> None:
        """An answer to the plugin's call, on conn 2, in one frame."""
        await self.send(frame(2, message(stream_id, RESPONSE, body)))

    async def _fill(self, n: int) -> None:
        while len(self.raw) < n:
            data = await self.stream.receive_some()
            if not data:
                raise EOFError(f"closed with {len(self.raw)} bytes of a frame")
            self.raw += data

    async def receive(self) -> Received:
        """The next whole ttrpc message the plugin wrote, on either connection."""
        while True:
            for conn, buf in self.conns.items():
                if len(buf) >= 10:
                    length, stream_id, kind, flags = struct.unpack(">IIBB", buf[:10])
                    if len(buf) >= 10 + length:
                        payload = bytes(buf[10 : 10 + length])
                        del buf[: 10 + length]
                        return Received(conn, stream_id, kind, flags, payload)
            await self._fill(8)
            conn, n = struct.unpack(">II", self.raw[:8])
            assert conn in (1, 2), conn
            assert n <= MAX + 10, n  # mux.go's maxPayloadSize
            self.frame_sizes.append(n)
            await self._fill(8 + n)
            self.conns[conn] += self.raw[8 : 8 + n]
            del self.raw[: 8 + n]

    async def eof(self) -> bool:
        """Whether the plugin closed the socket (after whatever it still had to say)."""
        return await self.stream.receive_some() == b""


Handle = Callable[[str, str, bytes], Awaitable[bytes]]


async def echo(service: str, method: str, payload: bytes) -> bytes:
    return f"{service}/{method}:".encode() + payload


@asynccontextmanager
async def connected(handler: Handle = echo, **kw: int) -> AsyncIterator[tuple[Session, Runtime]]:
    """A session over one end of a socketpair, the fake runtime on the other."""
    ours, theirs = trio.socket.socketpair()
    runtime = Runtime(trio.SocketStream(theirs))
    try:
        async with session_over(trio.SocketStream(ours), handler, **kw) as session:
            yield session, runtime
    finally:
        await runtime.stream.aclose()


class Calls:
    """Calls run in tasks of their own; their outcomes, by name."""

    def __init__(self, nursery: trio.Nursery, session: Session) -> None:
        self.nursery = nursery
        self.session = session
        self.outcomes: dict[str, object] = {}
        self.done: dict[str, trio.Event] = {}

    def start(self, name: str, method: str, payload: bytes, timeout: float | None = None) -> None:
        self.done[name] = trio.Event()

        async def run() -> None:
            try:
                self.outcomes[name] = await self.session.call(RUNTIME, method, payload, timeout)
            except (TtrpcError, ConnectionLost, trio.TooSlowError) as exc:
                self.outcomes[name] = exc
            self.done[name].set()

        self.nursery.start_soon(run)

    async def outcome(self, name: str) -> object:
        await self.done[name].wait()
        return self.outcomes[name]


# ------------------------------------------------------------------ calling the runtime (conn 2)


async def test_a_call_goes_out_on_conn_2_with_odd_increasing_ids_and_its_answer_comes_back(mock_clock) -> None:
    async with connected() as (session, runtime), trio.open_nursery() as nursery:
        calls = Calls(nursery, session)
        calls.start("register", "RegisterPlugin", b"\x0a\x08eventsrc", timeout=5)
        sent = await runtime.receive()
        req = sent.request()
        assert (sent.stream_id, sent.flags) == (1, 0)
        assert (req.service, req.method, req.payload) == (RUNTIME, "RegisterPlugin", b"\x0a\x08eventsrc")
        assert req.timeout_nano == 5_000_000_000  # the mock clock stands still
        await runtime.answer(1, response(b"registered"))
        assert await calls.outcome("register") == b"registered"

        calls.start("update", "UpdateContainers", b"")
        sent = await runtime.receive()
        assert sent.stream_id == 3
        assert sent.request().timeout_nano == 0  # no deadline, none sent
        await runtime.answer(3, response(b"\x12\x00"))
        assert await calls.outcome("update") == b"\x12\x00"


async def test_an_enclosing_deadline_is_sent_when_it_comes_before_the_timeout(mock_clock) -> None:
    async with connected() as (session, runtime), trio.open_nursery() as nursery:

        async def call() -> None:
            with trio.move_on_after(2):
                await session.call(RUNTIME, "UpdateContainers", b"", timeout=30)

        nursery.start_soon(call)
        assert (await runtime.receive()).request().timeout_nano == 2_000_000_000
        await runtime.answer(1, response())


async def test_a_non_ok_status_raises_ttrpc_error_with_its_code_and_message() -> None:
    async with connected() as (session, runtime), trio.open_nursery() as nursery:
        calls = Calls(nursery, session)
        calls.start("c", "RegisterPlugin", b"")
        await runtime.receive()
        await runtime.answer(1, response(code=3, text="plugin index must be\ntwo digits"))
        err = await calls.outcome("c")
        assert isinstance(err, TtrpcError)
        assert (err.code, err.message) == (3, "plugin index must be\ntwo digits")
        assert str(err) == "InvalidArgument: plugin index must be two digits"


async def test_concurrent_calls_each_get_their_own_answer_when_the_runtime_answers_out_of_order() -> None:
    async with connected() as (session, runtime), trio.open_nursery() as nursery:
        calls = Calls(nursery, session)
        for name in ("a", "b", "c"):
            calls.start(name, "UpdateContainers", name.encode())
        seen = [await runtime.receive() for _ in range(3)]
        ids = [m.stream_id for m in seen]
        assert ids == sorted(ids) and len(set(ids)) == 3 and all(i % 2 == 1 for i in ids)
        for m in reversed(seen):
            await runtime.answer(m.stream_id, response(b"for " + m.request().payload))
        assert [await calls.outcome(n) for n in ("a", "b", "c")] == [b"for a", b"for b", b"for c"]


async def test_a_call_times_out_with_too_slow_error_and_its_late_answer_is_dropped(autojump_clock) -> None:
    async with connected() as (session, runtime), trio.open_nursery() as nursery:
        calls = Calls(nursery, session)
        calls.start("slow", "UpdateContainers", b"", timeout=2)
        assert (await runtime.receive()).request().timeout_nano == 2_000_000_000
        assert isinstance(await calls.outcome("slow"), trio.TooSlowError)
        await runtime.answer(1, response(b"late"))  # nobody waits for it any more
        calls.start("next", "UpdateContainers", b"")
        sent = await runtime.receive()
        assert sent.stream_id == 3
        await runtime.answer(3, response(b"on time"))
        assert await calls.outcome("next") == b"on time"


async def test_an_answer_over_4_mib_fails_its_call_and_the_connection_serves_on() -> None:
    async with connected() as (session, runtime), trio.open_nursery() as nursery:
        calls = Calls(nursery, session)
        calls.start("big", "UpdateContainers", b"")
        await runtime.receive()
        oversized = message(1, RESPONSE, bytes(MAX + 1))
        # a message may span frames: this one takes two, the second also carries the next answer's start
        await runtime.send(frame(2, oversized[: MAX // 2]))
        calls.start("small", "UpdateContainers", b"")
        assert (await runtime.receive()).stream_id == 3
        after = message(3, RESPONSE, response(b"fits"))
        await runtime.send(frame(2, oversized[MAX // 2 :] + after[:5]) + frame(2, after[5:]))
        err = await calls.outcome("big")
        assert isinstance(err, TtrpcError) and err.code == 8, err
        assert await calls.outcome("small") == b"fits"


async def test_an_answer_that_is_not_a_response_fails_its_call() -> None:
    async with connected() as (session, runtime), trio.open_nursery() as nursery:
        calls = Calls(nursery, session)
        calls.start("a", "UpdateContainers", b"a")
        calls.start("b", "UpdateContainers", b"b")
        ids = {m.request().payload: m.stream_id for m in [await runtime.receive(), await runtime.receive()]}
        await runtime.send(frame(2, message(ids[b"a"], DATA, b"")))
        await runtime.send(frame(2, message(ids[b"b"], RESPONSE, b"\xff\xff")))  # not protobuf
        a, b = await calls.outcome("a"), await calls.outcome("b")
        assert isinstance(a, TtrpcError) and a.code == 13, a
        assert isinstance(b, TtrpcError) and b.code == 13 and "decode" in b.message, b


# ------------------------------------------------------------------ serving the runtime (conn 1)


async def test_a_request_of_the_runtime_is_served_and_answered_on_its_stream() -> None:
    async with connected() as (_session, runtime):
        await runtime.serve_request(1, "Configure", b"config")
        got = await runtime.receive()
        assert (got.conn, got.stream_id, got.kind) == (1, 1, RESPONSE)
        answer = got.response()
        assert answer.status.code == 0
        assert answer.payload == f"{PLUGIN}/Configure:config".encode()


async def test_a_handlers_refusal_reaches_the_runtime_with_its_code_and_its_message_in_field_2() -> None:
    assert status_pb2.Status.DESCRIPTOR.fields_by_name["message"].number == 2  # google.rpc.Status, as containerd reads

    async def refuse(service: str, method: str, payload: bytes) -> bytes:
        raise TtrpcError(9, "pod default/web: no 4 exclusive CPUs free")

    async with connected(refuse) as (_session, runtime):
        await runtime.serve_request(1, "CreateContainer", b"")
        status = (await runtime.receive()).response().status
        assert (status.code, status.message) == (9, "pod default/web: no 4 exclusive CPUs free")
        raw = request_pb2.Response(status=status).status.SerializeToString()
        assert raw.startswith(b"\x08\x09\x12")  # field 1 varint 9, then field 2


async def test_a_handlers_bug_is_answered_unknown_and_the_next_request_is_served() -> None:
    async def buggy(service: str, method: str, payload: bytes) -> bytes:
        if method == "Synchronize":
            raise KeyError("container abc")
        return b"fine"

    async with connected(buggy) as (_session, runtime):
        await runtime.serve_request(1, "Synchronize", b"")
        status = (await runtime.receive()).response().status
        assert (status.code, status.message) == (2, "'container abc'")
        await runtime.serve_request(3, "StateChange", b"")
        got = await runtime.receive()
        assert got.stream_id == 3 and got.response().status.code == 0 and got.response().payload == b"fine"


async def test_a_message_split_across_frames_and_two_messages_in_one_frame_both_parse() -> None:
    async with connected() as (_session, runtime):
        one = message(1, REQUEST, request("Configure", b"x" * 5000))
        # cut inside the 10-byte header, and again in the payload; a frame for a connection
        # nobody opened and an empty frame in between are dropped
        await runtime.send(frame(1, one[:4]) + frame(7, b"ignored") + frame(1, b""))
        await runtime.send(frame(1, one[4:3000]))
        await runtime.send(frame(1, one[3000:]))
        got = await runtime.receive()
        assert got.stream_id == 1 and got.response().payload == f"{PLUGIN}/Configure:".encode() + b"x" * 5000
        both = message(3, REQUEST, request("StateChange", b"a")) + message(5, REQUEST, request("StateChange", b"b"))
        await runtime.send(frame(1, both))
        answers = {m.stream_id: m.response().payload for m in [await runtime.receive(), await runtime.receive()]}
        assert answers == {3: f"{PLUGIN}/StateChange:a".encode(), 5: f"{PLUGIN}/StateChange:b".encode()}


async def test_a_request_of_exactly_4_mib_is_served_and_one_byte_more_is_answered_resource_exhausted() -> None:
    async def size(service: str, method: str, payload: bytes) -> bytes:
        return str(len(payload)).encode()

    body = request("Synchronize", b"")
    n = MAX - len(body)
    while len(body := request("Synchronize", bytes(n))) > MAX:
        n -= 1
    assert len(body) == MAX

    async with connected(size) as (_session, runtime):
        await runtime.send(frame(1, message(1, REQUEST, body)))
        assert (await runtime.receive()).response().payload == str(n).encode()
        over = message(3, REQUEST, bytes(MAX + 1))
        await runtime.send(frame(1, over[: MAX // 2]) + frame(1, over[MAX // 2 :]))
        got = await runtime.receive()
        assert got.stream_id == 3
        assert got.response().status.code == 8
        assert str(MAX + 1) in got.response().status.message
        await runtime.serve_request(5, "StateChange", b"")  # skipped, not held: the next one parses
        assert (await runtime.receive()).response().payload == str(0).encode()


async def test_bad_stream_ids_data_and_streaming_requests_are_refused_as_ttrpc_refuses_them() -> None:
    async with connected() as (_session, runtime):
        await runtime.serve_request(2, "Configure", b"")  # even: not a client's
        await runtime.serve_request(5, "Configure", b"")
        await runtime.serve_request(3, "Configure", b"")  # not above the last
        await runtime.send(frame(1, message(7, DATA, b"")))
        await runtime.send(frame(1, message(9, REQUEST, request("Stream", b""), flags=0x2)))
        got = {m.stream_id: m.response().status.code for m in [await runtime.receive() for _ in range(5)]}
        assert got == {2: 3, 5: 0, 3: 3, 7: 3, 9: 12}


async def test_a_request_past_its_timeout_nano_is_answered_deadline_exceeded(autojump_clock) -> None:
    async def forever(service: str, method: str, payload: bytes) -> bytes:
        await trio.sleep_forever()
        raise AssertionError

    async with connected(forever) as (_session, runtime):
        await runtime.serve_request(1, "CreateContainer", b"", timeout_nano=2_000_000_000)
        with trio.fail_after(60):  # the clock's time, which jumps: fails at once rather than hanging
            assert (await runtime.receive()).response().status.code == 4


async def test_requests_beyond_the_in_flight_cap_are_answered_resource_exhausted_at_once() -> None:
    release = trio.Event()

    async def held(service: str, method: str, payload: bytes) -> bytes:
        await release.wait()
        return payload

    async with connected(held, max_in_flight=2) as (_session, runtime):
        for sid in (1, 3, 5):
            await runtime.serve_request(sid, "StateChange", str(sid).encode())
        first = await runtime.receive()
        assert (first.stream_id, first.response().status.code) == (5, 8)
        release.set()
        rest = {m.stream_id: m.response().payload for m in [await runtime.receive(), await runtime.receive()]}
        assert rest == {1: b"1", 3: b"3"}
        await trio.testing.wait_all_tasks_blocked()  # their tasks have ended (after queueing the answers)
        await runtime.serve_request(7, "StateChange", b"7")  # the slots are free again
        assert (await runtime.receive()).response().payload == b"7"


async def test_requests_are_served_concurrently_and_answers_never_interleave() -> None:
    arrived = 0
    release = trio.Event()

    async def held(service: str, method: str, payload: bytes) -> bytes:
        nonlocal arrived
        arrived += 1
        await release.wait()
        return payload * 100_000

    async with connected(held) as (_session, runtime):
        await runtime.send(b"".join(frame(1, message(s, REQUEST, request("X", bytes([s])))) for s in (1, 3, 5)))
        await trio.testing.wait_all_tasks_blocked()
        assert arrived == 3  # all three are being served at once
        release.set()
        got = {m.stream_id: m.response().payload for m in [await runtime.receive() for _ in range(3)]}
        assert got == {s: bytes([s]) * 100_000 for s in (1, 3, 5)}


# ------------------------------------------------------------------ the connection's end


async def test_the_peer_closing_raises_connection_lost_out_of_the_session_and_fails_a_pending_call() -> None:
    outside: dict[str, BaseException] = {}
    async with trio.open_nursery() as elsewhere:
        with pytest.raises(ConnectionLost) as lost:
            async with connected() as (session, runtime):

                async def pending_call() -> None:
                    try:
                        await session.call(RUNTIME, "UpdateContainers", b"")
                    except ConnectionLost as exc:
                        outside["call"] = exc

                elsewhere.start_soon(pending_call)
                await runtime.receive()  # the call is out and waiting
                await runtime.send(frame(1, message(1, REQUEST, b"")[:4]))  # half a header
                await runtime.stream.aclose()
                await trio.sleep_forever()  # cancelled by the loss
    assert type(lost.value) is ConnectionLost
    assert str(lost.value) == "the peer closed the connection in the middle of a message"
    assert str(outside["call"]) == "the peer closed the connection in the middle of a message"
    await session.closed()  # returns: the connection is gone
    with pytest.raises(ConnectionLost):
        await session.call(RUNTIME, "UpdateContainers", b"")


async def test_a_close_between_messages_is_connection_lost_and_closed_returns() -> None:
    with pytest.raises(ConnectionLost, match="closed the connection$"):
        async with connected() as (session, runtime):
            await runtime.stream.aclose()
            await session.closed()
            await trio.sleep_forever()


async def test_leaving_the_session_closes_the_socket_cancels_handlers_and_fails_calls_elsewhere() -> None:
    cancelled = trio.Event()

    async def held(service: str, method: str, payload: bytes) -> bytes:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()
        raise AssertionError

    outside: dict[str, BaseException] = {}
    async with trio.open_nursery() as elsewhere:
        ours, theirs = trio.socket.socketpair()
        runtime = Runtime(trio.SocketStream(theirs))
        async with session_over(trio.SocketStream(ours), held) as session:

            async def pending_call() -> None:
                try:
                    await session.call(RUNTIME, "UpdateContainers", b"")
                except ConnectionLost as exc:
                    outside["call"] = exc

            elsewhere.start_soon(pending_call)
            await runtime.receive()
            await runtime.serve_request(1, "CreateContainer", b"")
            await trio.testing.wait_all_tasks_blocked()
    assert cancelled.is_set()
    assert str(outside["call"]) == "the session was closed"
    assert await runtime.eof()
    await runtime.stream.aclose()


async def test_an_error_of_the_body_comes_out_bare() -> None:
    with pytest.raises(KeyError):
        async with connected():
            raise KeyError("mine")


async def test_nri_session_connects_to_a_unix_socket_and_a_missing_one_is_os_error() -> None:
    with tempfile.TemporaryDirectory(prefix="ttrpc") as tmp:
        path = Path(tmp) / "nri.sock"
        with pytest.raises(OSError):
            async with nri_session(path, echo):
                raise AssertionError("connected to nothing")

        listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await listener.bind(str(path))
        listener.listen(1)
        async with nri_session(path, echo) as session, trio.open_nursery() as nursery:
            sock, _ = await listener.accept()
            runtime = Runtime(trio.SocketStream(sock))
            calls = Calls(nursery, session)
            calls.start("register", "RegisterPlugin", b"r")
            assert (await runtime.receive()).request().method == "RegisterPlugin"
            await runtime.answer(1, response(b"ok"))
            assert await calls.outcome("register") == b"ok"
        assert await runtime.eof()
        await runtime.stream.aclose()
        listener.close()


# ------------------------------------------------------------------ the pure parts


def test_the_demux_yields_whole_messages_whatever_the_cut() -> None:
    stream = (
        frame(2, message(1, RESPONSE, b"abc"))
        + frame(1, message(1, REQUEST, b"de")[:7])
        + frame(3, b"not ours")
        + frame(1, message(1, REQUEST, b"de")[7:] + message(3, REQUEST, b""))
    )
    want = [(2, ttrpc.Message(1, RESPONSE, 0, b"abc")), (1, ttrpc.Message(1, REQUEST, 0, b"de"))]
    want.append((1, ttrpc.Message(3, REQUEST, 0, b"")))
    for cut in range(1, len(stream)):
        demux = ttrpc.Demux()
        got = demux.feed(stream[:cut]) + demux.feed(stream[cut:])
        assert got == want, cut
        assert demux.idle


def test_the_encoder_writes_one_frame_per_message_and_refuses_more_than_4_mib() -> None:
    assert ttrpc.encode(2, 7, REQUEST, 0, b"hi") == frame(2, message(7, REQUEST, b"hi"))
    with pytest.raises(ValueError):
        ttrpc.encode(1, 1, RESPONSE, 0, bytes(MAX + 1))
    assert (ttrpc.MAX_MESSAGE, ttrpc.PLUGIN_CONN, ttrpc.RUNTIME_CONN) == (MAX, 1, 2)


async def test_a_call_over_4_mib_is_refused_before_it_is_sent() -> None:
    async with connected() as (session, runtime):
        with pytest.raises(TtrpcError) as err:
            await session.call(RUNTIME, "UpdateContainers", bytes(MAX))
        assert err.value.code == 8
        await runtime.serve_request(1, "Configure", b"")  # nothing of the refused call was written
        got = await runtime.receive()
        assert (got.conn, got.stream_id) == (1, 1)
