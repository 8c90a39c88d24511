"""The node API as the daemon serves it (grpclib, ``rpc.bridge.serve_unix``), spoken to with
grpcio (C-core, an independent implementation) and over raw HTTP/2 for what grpcio never sends."""

from __future__ import annotations

import os
import select
import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.events
import pytest

from eventsrc.gen.node.v1 import node_pb2 as pb
from tests.conftest import Daemon, run_cli
from tests.support.grpcio_stubs import stubs, unix_target

NODE = "/eventsrc.node.v1.Node/"


@pytest.fixture
def channel(root: Path, daemon_factory) -> grpc.Channel:  # type: ignore[no-untyped-def]
    daemon_factory("--max-pods", "2000")  # 1,500 pods below: more than a kubelet's 110
    ch = grpc.insecure_channel(unix_target(root / "eventsrc" / "api.sock"))
    yield ch
    ch.close()


def raw(channel: grpc.Channel, method: str) -> grpc.UnaryUnaryMultiCallable:
    return channel.unary_unary(NODE + method, request_serializer=lambda b: b, response_deserializer=lambda b: b)


def test_unary_calls_answer_and_statuses_carry_their_message(root: Path, channel: grpc.Channel) -> None:
    node = stubs("node/v1/node.proto").NodeStub(channel)
    status = node.Status(pb.StatusRequest(), timeout=5)
    assert status.ready and status.pid == int(
        (root / "eventsrc" / "status.json").read_text().split('"pid": ')[1].split(",")[0]
    )
    with pytest.raises(grpc.RpcError) as err:
        node.Remove(pb.RemoveRequest(pod=pb.PodSelector(namespace="ns", name="nobody-ü")), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "nobody-ü" in err.value.details()


def test_many_concurrent_calls_on_one_connection(channel: grpc.Channel) -> None:
    node = stubs("node/v1/node.proto").NodeStub(channel)
    futures = [node.Status.future(pb.StatusRequest(), timeout=10) for _ in range(100)]
    assert all(f.result().ready for f in futures)


def test_unknown_method_is_unimplemented(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as err:
        raw(channel, "Nope")(b"", timeout=5)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_garbage_request_is_a_clear_error_and_the_server_stays(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as err:
        raw(channel, "GetPod")(b"\xff\xff\xff\xff", timeout=5)
    assert err.value.code() == grpc.StatusCode.INTERNAL and "cannot decode" in err.value.details()
    assert raw(channel, "Status")(b"", timeout=5)  # still serving


def test_a_request_over_the_limit_is_refused(channel: grpc.Channel) -> None:
    big = pb.PodSelector(name="x" * (5 * 1024 * 1024)).SerializeToString()
    with pytest.raises(grpc.RpcError) as err:
        raw(channel, "GetPod")(big, timeout=10)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.details() == f"received message larger than max ({len(big)} vs. {4 * 1024 * 1024})"
    assert raw(channel, "Status")(b"", timeout=5)


def test_a_large_answer_crosses_flow_control(channel: grpc.Channel) -> None:
    # ListPods of 1,500 pods is one message far over HTTP/2's initial 64 KiB window.
    node = stubs("node/v1/node.proto").NodeStub(channel)
    pods = [
        pb.Pod(
            uid=f"uid-{i:04d}", namespace="big", name=f"pod-{i:04d}", containers=[pb.Container(name="c", kind="app")]
        )
        for i in range(1500)
    ]
    futures = [node.Admit.future(pb.AdmitRequest(pod=p), timeout=60) for p in pods]
    assert all(f.result().uid for f in futures)
    listed = node.ListPods(pb.ListPodsRequest(), timeout=30)
    assert listed.ByteSize() > 65_535
    assert {p.uid for p in listed.pods} >= {p.uid for p in pods}


def test_the_socket_is_private(root: Path, channel: grpc.Channel) -> None:
    assert os.stat(root / "eventsrc" / "api.sock").st_mode & 0o777 == 0o600


def _raw_h2(sock_path: Path, headers: list[tuple[str, str]]) -> dict[str, str]:
    """One request with ``headers`` and an empty message over a plain socket; the answer's
    headers (h2 validates both ends here: the request is well-formed HTTP/2)."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(sock_path))
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, headers)
        conn.send_data(sid, b"\x00\x00\x00\x00\x00", end_stream=True)
        s.sendall(conn.data_to_send())
        answer: dict[str, str] = {}
        while True:
            data = s.recv(65536)
            assert data, "the server closed the connection"
            for e in conn.receive_data(data):
                if isinstance(e, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    answer.update(dict(e.headers))  # type: ignore[arg-type]
                if isinstance(e, h2.events.StreamEnded):
                    return answer
            s.sendall(conn.data_to_send())


@pytest.mark.parametrize(
    ("change", "http", "grpc_status"),
    [
        ({":method": "GET"}, "405", None),
        ({"content-type": None}, "415", "2"),
        ({"content-type": "text/html"}, "415", "2"),
        ({"te": None}, "400", "2"),
        ({}, "200", "0"),  # the same request, well-formed, is answered
    ],
)
def test_a_request_that_is_not_grpc_gets_grpclibs_answer(
    root: Path, channel: grpc.Channel, change: dict[str, str | None], http: str, grpc_status: str | None
) -> None:
    headers = {
        ":method": "POST",
        ":scheme": "http",
        ":authority": "localhost",
        ":path": NODE + "Status",
        "content-type": "application/grpc",
        "te": "trailers",
    }
    headers.update(change)  # type: ignore[arg-type]
    answer = _raw_h2(root / "eventsrc" / "api.sock", [(k, v) for k, v in headers.items() if v is not None])
    assert answer[":status"] == http
    assert answer.get("grpc-status") == grpc_status
    assert ("content-type" in answer) == (http == "200")  # a refusal does not claim to be gRPC
    assert raw(channel, "Status")(b"", timeout=5)  # still serving


def _request_headers(method: str) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "x"),
        (":path", NODE + method),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


def _readable(s: socket.socket) -> None:
    """Until the server's first bytes (its SETTINGS) wait unread on ``s``."""
    ready, _, _ = select.select([s], [], [], 10)
    assert ready, "the server sent nothing within 10 s"


def _serving(daemon: Daemon, channel: grpc.Channel) -> None:
    """The daemon runs, answers a call and says it is ready (``eventsrc status`` exits 0)."""
    assert raw(channel, "Status")(b"", timeout=5)
    proc = run_cli("status", root=daemon.root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert daemon.proc.poll() is None, daemon.output()


@pytest.fixture
def served(root: Path, daemon_factory: type[Daemon]) -> Iterator[tuple[Daemon, grpc.Channel, str]]:
    daemon = daemon_factory()
    ch = grpc.insecure_channel(unix_target(root / "eventsrc" / "api.sock"))
    yield daemon, ch, str(root / "eventsrc" / "api.sock")
    ch.close()


def test_clients_that_connect_and_close_at_once_do_not_stop_the_daemon(
    served: tuple[Daemon, grpc.Channel, str],
) -> None:
    daemon, channel, path = served
    for _ in range(20):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
    _serving(daemon, channel)


def test_clients_that_vanish_do_not_stop_the_daemon(served: tuple[Daemon, grpc.Channel, str]) -> None:
    """A client that closes while the server's bytes are unread (its reads and writes then
    fail with ECONNRESET or EPIPE), one that leaves mid-request, one that leaves with its
    answer unread: the daemon serves on."""
    daemon, channel, path = served
    for i in range(21):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            c.initiate_connection()
            if i % 3 == 1:  # a request's headers, never its end
                c.send_headers(1, _request_headers("Status"))
            elif i % 3 == 2:  # a whole request; gone before the answer is read
                c.send_headers(1, _request_headers("ListPods"))
                c.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)
            if i % 3:
                s.sendall(c.data_to_send())
            _readable(s)
    _serving(daemon, channel)


def test_status_says_how_long_the_loop_was_held(channel: grpc.Channel) -> None:
    node = stubs("node/v1/node.proto").NodeStub(channel)
    plain = node.Status(pb.StatusRequest(), timeout=5)
    assert plain.loop.steps > 0 and plain.loop.longest_seconds > 0 and plain.loop.longest_task
    assert not plain.loop.recent  # listed only when asked for
    since = 1  # every kept step (CLOCK_MONOTONIC ns)
    asked = node.Status(pb.StatusRequest(loop_holds_since_ns=since), timeout=5)
    assert asked.loop.steps > plain.loop.steps
    assert len(asked.loop.recent) <= asked.loop.long_steps
    ends = [h.end_monotonic_ns for h in asked.loop.recent]
    assert ends == sorted(ends) and all(end > since for end in ends)
    assert all(0.004 <= h.seconds <= asked.loop.longest_seconds and h.task for h in asked.loop.recent)
    # the loop thread's CPU in a step is at most the process's, and about at most its wall time
    assert all(h.cpu_seconds <= h.process_cpu_seconds for h in asked.loop.recent)
    assert all(h.cpu_seconds <= h.seconds + 0.001 for h in asked.loop.recent)
    assert asked.loop.longest_cpu_seconds >= max((h.cpu_seconds for h in asked.loop.recent), default=0.0)
    assert asked.loop.cpu_over_10ms <= asked.loop.long_steps
    if ends:  # a later span holds none of them
        later = node.Status(pb.StatusRequest(loop_holds_since_ns=ends[-1]), timeout=5)
        assert all(h.end_monotonic_ns > ends[-1] for h in later.loop.recent)
