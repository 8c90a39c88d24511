"""The container runtime's own listing of its pod sandboxes, over CRI (``ListPodSandbox``).

NRI tells a plugin every sandbox removal but one kind: containerd (2.x) keeps which sandboxes
it has told its plugins about in memory only, so the sandboxes it recovers at its start are
removed with no NRI event (its ``RemovePodSandbox`` asks that memory first). Only the
runtime's listing then shows them gone (``eventsrc.core.runtime.vanished``); the NRI plugin
asks it (``eventsrc.node.nri``). This module only asks.
"""

from __future__ import annotations

from grpclib.client import Channel

from eventsrc.errors import EventsrcError
from eventsrc.gen.cri.v1 import api_grpc as cri_grpc
from eventsrc.gen.cri.v1 import api_pb2 as cri
from eventsrc.rpc.bridge import CALL_ERRORS, endpoint_socket_error, to_aio, unix_channel, why

#: The kubelet's default CRI endpoint of each runtime, by the name the runtime gives NRI.
DEFAULT_ENDPOINTS = {
    "containerd": "unix:///run/containerd/containerd.sock",
    "cri-o": "unix:///var/run/crio/crio.sock",
}
LIST_TIMEOUT = 10.0
SCHEME = "unix://"


class ListingFailed(EventsrcError):
    pass


def socket_path(endpoint: str, runtime_name: str) -> str:
    """The socket to dial: ``endpoint``, else the kubelet's default for ``runtime_name``
    ("" when there is none)."""
    endpoint = endpoint or DEFAULT_ENDPOINTS.get(runtime_name.lower(), "")
    return endpoint[len(SCHEME) :] if endpoint.startswith(SCHEME) else endpoint


class SandboxLister:
    """A CRI client to one runtime socket, connected on first use."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._channel: Channel | None = None
        self._stub: cri_grpc.RuntimeServiceStub | None = None

    async def sandbox_ids(self) -> set[str]:
        """The ids of every sandbox the runtime has (ready or not). Raises ListingFailed."""
        if not self.path:
            raise ListingFailed("the runtime has no known CRI socket")
        reason = endpoint_socket_error(self.path)
        if reason:
            raise ListingFailed(reason)
        if self._stub is None:
            self._channel = unix_channel(self.path)
            self._stub = cri_grpc.RuntimeServiceStub(self._channel)
        try:
            answer = await to_aio(self._stub.ListPodSandbox)(cri.ListPodSandboxRequest(), timeout=LIST_TIMEOUT)
        except CALL_ERRORS as exc:
            self.close()
            raise ListingFailed(f"ListPodSandbox on {self.path}: {why(exc)}") from None
        return {item.id for item in answer.items}

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel, self._stub = None, None
