"""grpcio stubs for the kubelet APIs, generated at test time (nothing is written to the repo).

Tests talk to the daemon with grpcio, an implementation independent of the daemon's grpclib.
protoc's grpc plugin generates ``<name>_pb2_grpc.py`` from ``schemas/``; its messages come from
the committed ``eventsrc.gen`` ``_pb2`` modules and are *not* generated a second time: protobuf's
runtime (upb) refuses a second file that defines the same full names (``duplicate symbol
'v1beta1.DevicePluginOptions'``) even under another file name, so there is one set of message
classes per process. The bytes on the wire are still grpcio's.

    dp = device_plugin()                      # the module: DevicePluginServicer, RegistrationStub, ...
    server = grpc.server(ThreadPoolExecutor())
    server.add_generic_rpc_handlers([device_plugin_handler(MyPlugin())])
    server.add_insecure_port(unix_target(sock))
    RegistrationStub(channel).Register(dp.pb2.RegisterRequest(...))
"""

from __future__ import annotations

import functools
import tempfile
import types
from pathlib import Path
from typing import Any

import grpc

from eventsrc.codegen import protos

SCHEMAS = protos.SCHEMAS_DIR


@functools.cache
def stubs(proto: str) -> types.ModuleType:
    """The grpcio module for ``schemas/<proto>`` (e.g. ``"deviceplugin/v1beta1/api.proto"``).

    It has the usual ``<Service>Stub``, ``<Service>Servicer`` and ``add_<Service>Servicer_to_server``;
    ``module.pb2`` is the matching ``eventsrc.gen`` messages module.
    """
    stem = proto.removesuffix(".proto")
    with tempfile.TemporaryDirectory(prefix="eventsrc-grpcio-") as tmp:
        protos.run_protoc([f"-I{SCHEMAS}", f"--grpc_python_out={tmp}", proto])
        source = (Path(tmp) / f"{stem}_pb2_grpc.py").read_text()
    source = protos.rewrite_imports(source, protos.module_names(protos.proto_files(SCHEMAS)))
    name = "grpcio_stubs." + stem.replace("/", ".") + "_pb2_grpc"
    module = types.ModuleType(name)
    module.__file__ = f"<grpcio stubs for schemas/{proto}>"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    module.pb2 = __import__(f"{protos.GEN_PACKAGE}.{stem.replace('/', '.')}_pb2", fromlist=["_"])
    return module


def device_plugin() -> types.ModuleType:
    """v1beta1: ``DevicePluginServicer`` (plugins serve it) and ``RegistrationStub`` (they call it)."""
    return stubs("deviceplugin/v1beta1/api.proto")


def plugin_registration() -> types.ModuleType:
    """pluginregistration: ``RegistrationServicer`` (plugins serve it on the registry socket)."""
    return stubs("pluginregistration/v1/api.proto")


def pod_resources() -> types.ModuleType:
    """PodResources v1: ``PodResourcesListerStub`` (clients call the daemon)."""
    return stubs("podresources/v1/api.proto")


def dra(version: str = "v1") -> types.ModuleType:
    """DRA ``v1`` or ``v1beta1``: ``DRAPluginServicer`` (drivers serve it)."""
    return stubs(f"dra/{version}/api.proto")


class _Recorder:
    """Stands in for a grpc.Server to catch what ``add_<Service>Servicer_to_server`` registers."""

    handlers: tuple[grpc.GenericRpcHandler, ...] = ()

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.handlers = tuple(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        pass


def generic_handler(module: types.ModuleType, service: str, servicer: Any) -> grpc.GenericRpcHandler:
    """The ``grpc.GenericRpcHandler`` serving ``service`` of ``module`` with ``servicer``."""
    recorder = _Recorder()
    getattr(module, f"add_{service}Servicer_to_server")(servicer, recorder)
    (handler,) = recorder.handlers
    return handler


def device_plugin_handler(servicer: Any) -> grpc.GenericRpcHandler:
    """Handler for ``/v1beta1.DevicePlugin/*``; subclass ``device_plugin().DevicePluginServicer``."""
    return generic_handler(device_plugin(), "DevicePlugin", servicer)


def plugin_registration_handler(servicer: Any) -> grpc.GenericRpcHandler:
    """Handler for ``/pluginregistration.Registration/*``; subclass ``plugin_registration().RegistrationServicer``."""
    return generic_handler(plugin_registration(), "Registration", servicer)


def dra_plugin_handler(servicer: Any, version: str = "v1") -> grpc.GenericRpcHandler:
    """Handler for ``/k8s.io.kubelet.pkg.apis.dra.<version>.DRAPlugin/*``."""
    return generic_handler(dra(version), "DRAPlugin", servicer)


def registration_client(channel: grpc.Channel) -> Any:
    """Client of ``/v1beta1.Registration/Register`` (the daemon serves it on ``device-plugins/kubelet.sock``)."""
    return device_plugin().RegistrationStub(channel)


def pod_resources_client(channel: grpc.Channel) -> Any:
    """Client of ``/v1.PodResourcesLister/*`` (the daemon serves it on ``pod-resources/kubelet.sock``)."""
    return pod_resources().PodResourcesListerStub(channel)


def unix_target(path: str | Path) -> str:
    """grpcio's address for a unix socket (absolute path)."""
    return f"unix://{Path(path).resolve()}"
