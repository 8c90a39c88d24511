"""PodResources List and the node API's ListPods, sent encoded beforehand (each pod's part
kept, the answer joined: ``rpc.codec.PreEncoded``), as a grpcio client receives them: byte
for byte the whole answer serialised from the views rebuilt from the log, and one message of
the reply type to grpcio's own stubs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from eventsrc.api.node import pod_info
from eventsrc.api.podresources import pod_resources
from eventsrc.gen.node.v1 import node_pb2 as npb
from eventsrc.gen.podresources.v1 import api_pb2 as pb
from eventsrc.log.store import EventLog
from eventsrc.state.apply import rebuild
from eventsrc.state.lifecycles import ADMITTED
from eventsrc.state.views import Views
from tests.conformance.test_interop import admit, gpus, podresources_channel, start_plugin
from tests.conftest import Daemon
from tests.support.grpcio_plugin import GrpcioPlugin
from tests.support.grpcio_stubs import pod_resources_client, unix_target


def raw(channel: grpc.Channel, method: str, request: Any) -> bytes:
    """The answer's bytes as grpcio received them (no deserializer)."""
    call: Callable[..., bytes] = channel.unary_unary(method, request_serializer=type(request).SerializeToString)
    return call(request, timeout=10)


def views_from_log(root: Path) -> Views:
    log = EventLog(root / "eventsrc" / "log", readonly=True)
    try:
        return rebuild(log.records())
    finally:
        log.env.close()


def test_list_and_list_pods_are_the_whole_answers_byte_for_byte(daemon_factory: type[Daemon], tmp_path: Path) -> None:
    daemon = daemon_factory()
    root = daemon.root
    plugins: list[GrpcioPlugin] = []
    try:
        start_plugin(plugins, daemon, gpus(8, 2))
        for name, count in [("p1", 1), ("p2", 3), ("p3", 2)]:
            admit(root, tmp_path, name, count)
        api_sock = unix_target(root / "eventsrc" / "api.sock")
        with podresources_channel(root) as prc, grpc.insecure_channel(api_sock) as api:
            listed = raw(prc, "/v1.PodResourcesLister/List", pb.ListPodResourcesRequest())
            pods = raw(api, "/eventsrc.node.v1.Node/ListPods", npb.ListPodsRequest())
            typed = pod_resources_client(prc).List(pb.ListPodResourcesRequest(), timeout=10)
        views = views_from_log(root)
        daemon.stop()  # before its plugin: it does not see it go away
    finally:
        for p in plugins:
            p.stop()

    fresh_list = pb.ListPodResourcesResponse(
        pod_resources=[pod_resources(views, p) for p in views.pods.pods.values() if p.state == ADMITTED]
    )
    fresh_pods = npb.ListPodsResponse(
        pods=[pod_info(p, shared=views.cpus.shared, views=views) for p in views.pods.pods.values()]
    )
    assert [p.name for p in fresh_list.pod_resources] == ["p1", "p2", "p3"]
    assert [len(p.containers[0].devices) for p in fresh_list.pod_resources] == [1, 3, 2]  # one entry a device
    assert listed == fresh_list.SerializeToString(deterministic=True) == fresh_list.SerializeToString()
    assert pods == fresh_pods.SerializeToString(deterministic=True) == fresh_pods.SerializeToString()
    assert typed == fresh_list
