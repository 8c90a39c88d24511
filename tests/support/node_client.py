"""A grpcio client of the daemon's node API (eventsrc/api.sock), for tests that drive pods."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import grpc

from tests.support.grpcio_stubs import stubs, unix_target


def node() -> Any:
    return stubs("node/v1/node.proto")


class NodeClient:
    def __init__(self, root: Path, timeout: float = 30) -> None:
        self.channel = grpc.insecure_channel(unix_target(root / "eventsrc" / "api.sock"))
        self.m = node()
        self.stub = self.m.NodeStub(self.channel)
        self.timeout = timeout

    def admit(self, resource: str, n: int = 1, name: str = "", uid: str = "") -> Any:
        """A one-container pod asking for ``n`` of ``resource``; its PodInfo."""
        pb = self.m.pb2
        uid = uid or str(uuid.uuid4())
        limits = {resource: str(n)}
        pod = pb.Pod(
            uid=uid,
            namespace="default",
            name=name or f"p-{uid[:8]}",
            containers=[pb.Container(name="main", kind="app", limits=limits, requests=limits)],
        )
        return self.stub.Admit(pb.AdmitRequest(pod=pod), timeout=self.timeout)

    def remove(self, uid: str) -> Any:
        pb = self.m.pb2
        return self.stub.Remove(pb.RemoveRequest(pod=pb.PodSelector(uid=uid)), timeout=self.timeout)

    def get(self, uid: str) -> Any:
        pb = self.m.pb2
        return self.stub.GetPod(pb.PodSelector(uid=uid), timeout=self.timeout)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
