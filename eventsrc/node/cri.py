"""The container runtime's own listing of its pod sandboxes and their containers, over CRI
(``ListPodSandbox``, ``ListContainers``).

NRI tells a plugin every sandbox removal but one kind: containerd (2.x) keeps which sandboxes
it has told its plugins about in memory only, so the sandboxes it recovers at its start are
removed with no NRI event (its ``RemovePodSandbox`` asks that memory first). Only the
runtime's listing then shows them gone (``eventsrc.core.runtime_decisions.vanished``); the NRI plugin
asks it (``eventsrc.node.nri``). It asks the containers too before a pod grows by a container
(NRI tells of a container's own exit asynchronously: the kubelet may create the next one
first). This module only asks.
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
    """A CRI client to one runtime socket, connected on first use. Its listing is trusted only
    once the socket's runtime says it is the one NRI named (``Version``): the listing of
    another runtime lacks every sandbox, and would read as all of them removed."""

    def __init__(self, path: str, runtime_name: str, runtime_version: str) -> None:
        self.path = path
        self.runtime = (runtime_name, runtime_version)
        self._channel: Channel | None = None
        self._stub: cri_grpc.RuntimeServiceStub | None = None
        self._checked = False

    async def sandbox_ids(self) -> set[str]:
        """The ids of every sandbox the runtime has (ready or not). Raises ListingFailed."""
        answer = await self._ask("ListPodSandbox", cri.ListPodSandboxRequest())
        assert isinstance(answer, cri.ListPodSandboxResponse)
        return {item.id for item in answer.items}

    async def exited(self, sandbox_id: str) -> set[str]:
        """The ids of the containers of sandbox ``sandbox_id`` that have exited. Raises ListingFailed."""
        request = cri.ListContainersRequest(filter=cri.ContainerFilter(pod_sandbox_id=sandbox_id))
        answer = await self._ask("ListContainers", request)
        assert isinstance(answer, cri.ListContainersResponse)
        return {c.id for c in answer.containers if c.state == cri.CONTAINER_EXITED}

    async def _ask(
        self, method: str, request: cri.ListPodSandboxRequest | cri.ListContainersRequest
    ) -> cri.ListPodSandboxResponse | cri.ListContainersResponse:
        """One listing call, once the socket's runtime is known to be NRI's. Raises ListingFailed."""
        if not self.path:
            raise ListingFailed(f"no CRI socket is known for runtime {self.runtime[0]!r}")
        reason = endpoint_socket_error(self.path)
        if reason:
            raise ListingFailed(reason)
        if self._stub is None:
            self._channel = unix_channel(self.path)
            self._stub = cri_grpc.RuntimeServiceStub(self._channel)
        try:
            if not self._checked:
                version = await to_aio(self._stub.Version)(cri.VersionRequest(), timeout=LIST_TIMEOUT)
                said = (version.runtime_name, version.runtime_version)
                if not same_runtime(said, self.runtime):
                    raise ListingFailed(
                        f"{self.path} answers as runtime {' '.join(said)!r}, not {' '.join(self.runtime)!r} "
                        "as NRI says: another runtime's listing is not this one's"
                    )
                self._checked = True
            call = self._stub.ListPodSandbox if method == "ListPodSandbox" else self._stub.ListContainers
            answer: cri.ListPodSandboxResponse | cri.ListContainersResponse = await to_aio(call)(
                request, timeout=LIST_TIMEOUT
            )
        except CALL_ERRORS as exc:
            self.close()
            raise ListingFailed(f"{method} on {self.path}: {why(exc)}") from None
        return answer

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel, self._stub, self._checked = None, None, False


def same_runtime(a: tuple[str, str], b: tuple[str, str]) -> bool:
    """Two (name, version) pairs name one runtime: the name alike in case, the version alike
    but for a leading "v"."""
    return a[0].lower() == b[0].lower() and a[1].removeprefix("v") == b[1].removeprefix("v")
