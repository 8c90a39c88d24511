"""Open files: idle clients cannot take the file descriptors the daemon needs.

The daemon runs here under an open-files limit of 256 that it cannot raise, so each gRPC
socket holds at most 64 connections (``rpc.bridge.connection_cap``). Three hundred idle
clients of the node API would take every descriptor the daemon has without the cap.
"""

from __future__ import annotations

import errno
import resource
import socket
from pathlib import Path

import grpc

from eventsrc.gen.podresources.v1 import api_pb2 as prpb
from eventsrc.rpc.bridge import CappedListener
from tests.conftest import Daemon, run_cli
from tests.support import grpcio_stubs

LIMIT = 256
CAP = LIMIT // 4
CLIENTS = 300


def low_open_files_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def connect_idle(path: Path, n: int) -> list[socket.socket]:
    """Up to ``n`` connections to ``path`` that send nothing; one the listen queue has no
    room for is not made (the daemon is not accepting)."""
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        if s.connect_ex(str(path)) in (0, errno.EINPROGRESS):
            out.append(s)
        else:
            s.close()
    return out


def closed_by_the_daemon(conns: list[socket.socket]) -> int:
    """How many of ``conns`` the daemon has closed (end of stream, nothing sent)."""
    n = 0
    for s in conns:
        try:
            n += s.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            pass  # open, nothing sent yet
        except ConnectionResetError:
            n += 1
    return n


def pod_resources_list(root: Path) -> int:
    target = f"unix://{root / 'pod-resources' / 'kubelet.sock'}"
    with grpc.insecure_channel(target) as channel:
        stub = grpcio_stubs.pod_resources().PodResourcesListerStub(channel)
        return len(stub.List(prpb.ListPodResourcesRequest(), timeout=10).pod_resources)


def test_idle_clients_over_the_cap_are_closed_and_the_daemon_serves_on(daemon_factory: type[Daemon]) -> None:
    daemon = daemon_factory(preexec_fn=low_open_files_limit)
    api = daemon.root / "eventsrc" / "api.sock"
    conns = connect_idle(api, CLIENTS)
    try:
        assert len(conns) > CAP
        daemon.eventually(lambda: closed_by_the_daemon(conns) >= len(conns) - CAP, "connections over the cap closed")
        # The daemon's other sockets have their own room: PodResources answers meanwhile.
        assert pod_resources_list(daemon.root) == 0
        # Those under the cap are served as before: grpclib sent its settings on each.
        assert len(conns) - closed_by_the_daemon(conns) == CAP
    finally:
        for s in conns:
            s.close()
    # Once the idle clients go, the node API accepts again.
    daemon.eventually(lambda: run_cli("status", root=daemon.root).returncode == 0, "the node API to answer again")
    out = daemon.output()
    assert "connections refused: at the cap" in out and "cap=64" in out, out
    assert "Too many open files" not in out and "EMFILE" not in out, out
    assert daemon.proc.poll() is None


def test_the_cap_counts_connections_until_they_close(tmp_path: Path) -> None:
    listener = CappedListener(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.setup(2, "test.sock")
    path = tmp_path / "test.sock"
    listener.bind(str(path))
    listener.listen(8)
    clients = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
    try:
        for c in clients:
            c.connect(str(path))
        first, _ = listener.accept()
        second, _ = listener.accept()
        listener.setblocking(False)
        try:
            listener.accept()  # the third is over the cap: closed, and nothing else waits
            raise AssertionError("a third connection was accepted over the cap")
        except BlockingIOError:
            pass
        assert (listener.live, listener.refused) == (2, 1)
        assert clients[2].recv(1) == b""  # its client sees the end of the stream
        first.close()
        assert listener.live == 1
        first.close()  # closing twice gives its place back once
        assert listener.live == 1
        second.close()
        assert listener.live == 0
    finally:
        for c in clients:
            c.close()
        listener.close()
