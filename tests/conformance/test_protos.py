"""The kubelet API protos: generated code is current, paths and field numbers match the kubelet,
and the generated grpclib stubs interoperate with grpcio."""

from __future__ import annotations

import asyncio
import importlib
import shutil
import subprocess
import sys
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor as _descriptor

from eventsrc.codegen import protos
from tests.support import grpcio_stubs

REPO = Path(__file__).resolve().parent.parent.parent

# (module under eventsrc.gen, Base classes) for the kubelet APIs.
KUBELET_APIS = {
    "deviceplugin.v1beta1.api": ("Registration", "DevicePlugin"),
    "pluginregistration.v1.api": ("Registration",),
    "dra.v1.api": ("DRAPlugin",),
    "dra.v1beta1.api": ("DRAPlugin",),
    "podresources.v1.api": ("PodResourcesLister",),
}

# Section 7 of the wire facts, spelled out.
DRA_V1 = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
DRA_V1BETA1 = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
EXPECTED_PATHS = {
    "/v1beta1.Registration/Register",
    "/v1beta1.DevicePlugin/GetDevicePluginOptions",
    "/v1beta1.DevicePlugin/ListAndWatch",
    "/v1beta1.DevicePlugin/GetPreferredAllocation",
    "/v1beta1.DevicePlugin/Allocate",
    "/v1beta1.DevicePlugin/PreStartContainer",
    "/pluginregistration.Registration/GetInfo",
    "/pluginregistration.Registration/NotifyRegistrationStatus",
    f"{DRA_V1}/NodePrepareResources",
    f"{DRA_V1}/NodeUnprepareResources",
    f"{DRA_V1BETA1}/NodePrepareResources",
    f"{DRA_V1BETA1}/NodeUnprepareResources",
    "/v1.PodResourcesLister/List",
    "/v1.PodResourcesLister/GetAllocatableResources",
    "/v1.PodResourcesLister/Get",
}
STREAMING = {"/v1beta1.DevicePlugin/ListAndWatch"}


def _gen(module: str) -> Any:
    return importlib.import_module(f"eventsrc.gen.{module}")


def _mapping(base: type) -> dict[str, Any]:
    """``__mapping__()`` of a grpclib Base class (abstract methods stubbed out)."""
    concrete = type("Concrete", (base,), {name: lambda self, stream: None for name in base.__abstractmethods__})
    return concrete().__mapping__()


# -- (a) the committed code is what the protos generate ------------------------------------


def test_generated_code_is_current() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "eventsrc.codegen.protos", "--check"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


def test_check_names_the_stale_file_and_touches_nothing(tmp_path: Path) -> None:
    schemas = tmp_path / "schemas"
    shutil.copytree(protos.SCHEMAS_DIR, schemas)
    proto = schemas / "deviceplugin" / "v1beta1" / "api.proto"
    text = proto.read_text()
    assert "int32 allocation_size = 3;" in text
    proto.write_text(text.replace("int32 allocation_size = 3;", "int32 allocation_size = 4;"))
    before = {p: p.read_bytes() for p in protos.GEN_DIR.rglob("*.py*")}

    message = protos.check(schemas, protos.GEN_DIR)
    assert message is not None and "\n" not in message
    assert message.startswith("eventsrc/gen/deviceplugin/v1beta1/api_pb2.py is stale")
    # A field number lives only in the serialized descriptor: the .pyi and stubs are unchanged.
    assert protos.stale_files(schemas, protos.GEN_DIR) == ["deviceplugin/v1beta1/api_pb2.py"]

    proc = subprocess.run(
        [sys.executable, "-m", "eventsrc.codegen.protos", "--check", "--schemas", str(schemas)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "deviceplugin/v1beta1/api_pb2.py" in proc.stderr
    assert {p: p.read_bytes() for p in protos.GEN_DIR.rglob("*.py*")} == before


def test_write_is_deterministic_and_check_sees_orphans(tmp_path: Path) -> None:
    gen = tmp_path / "gen"
    protos.write(protos.SCHEMAS_DIR, gen)
    first = {p.relative_to(gen): p.read_bytes() for p in gen.rglob("*") if p.is_file()}
    assert protos.write(protos.SCHEMAS_DIR, gen) == []
    assert {p.relative_to(gen): p.read_bytes() for p in gen.rglob("*") if p.is_file()} == first
    assert protos.check(protos.SCHEMAS_DIR, gen) is None
    # No grpcio stubs in the package; an __init__.py in every directory.
    assert not list(gen.rglob("*_pb2_grpc.py"))
    for d in [gen, *(p for p in gen.rglob("*") if p.is_dir())]:
        assert (d / "__init__.py").is_file(), d

    (gen / "podresources" / "v1" / "old_pb2.py").write_text("")
    assert protos.stale_files(protos.SCHEMAS_DIR, gen) == ["podresources/v1/old_pb2.py"]
    assert protos.write(protos.SCHEMAS_DIR, gen) == ["podresources/v1/old_pb2.py"]
    assert protos.check(protos.SCHEMAS_DIR, gen) is None


def test_all_generated_modules_load_in_one_process() -> None:
    # Same short names (Device, TopologyInfo, Claim, ...) in different packages: no pool conflict.
    for module in KUBELET_APIS:
        _gen(module + "_pb2")
        _gen(module + "_grpc")
    from eventsrc.gen.deviceplugin.v1beta1 import api_grpc, api_pb2  # the documented spelling

    assert api_pb2.Device.DESCRIPTOR.full_name == "v1beta1.Device"
    assert api_grpc.DevicePluginStub is not None
    # grpcio stubs for every API reuse those message classes, so they load alongside.
    for module in KUBELET_APIS:
        stubs = grpcio_stubs.stubs(module.replace(".", "/") + ".proto")
        assert stubs.pb2 is _gen(module + "_pb2")


# -- (b) gRPC method paths ------------------------------------------------------------------


def test_method_paths_match_the_kubelet() -> None:
    served: dict[str, Any] = {}
    called: set[str] = set()
    for module, services in KUBELET_APIS.items():
        grpc_mod = _gen(module + "_grpc")
        for service in services:
            served.update(_mapping(getattr(grpc_mod, f"{service}Base")))
            stub = getattr(grpc_mod, f"{service}Stub")(channel=None)
            called.update(m.name for m in vars(stub).values())
    assert set(served) == EXPECTED_PATHS
    assert called == EXPECTED_PATHS
    from grpclib.const import Cardinality

    for path, handler in served.items():
        want = Cardinality.UNARY_STREAM if path in STREAMING else Cardinality.UNARY_UNARY
        assert handler.cardinality is want, path


# -- (c) field numbers --------------------------------------------------------------------


def _field(module: str, message: str, name: str) -> _descriptor.FieldDescriptor:
    return _gen(module + "_pb2").DESCRIPTOR.message_types_by_name[message].fields_by_name[name]


@pytest.mark.parametrize(
    ("module", "message", "name", "number"),
    [
        ("deviceplugin.v1beta1.api", "ContainerAllocateResponse", "cdi_devices", 5),
        ("deviceplugin.v1beta1.api", "ContainerAllocateResponse", "annotations", 4),
        ("deviceplugin.v1beta1.api", "Device", "ID", 1),
        ("deviceplugin.v1beta1.api", "Device", "topology", 3),
        ("deviceplugin.v1beta1.api", "NUMANode", "ID", 1),
        ("deviceplugin.v1beta1.api", "ContainerPreferredAllocationRequest", "must_include_deviceIDs", 2),
        ("deviceplugin.v1beta1.api", "ContainerPreferredAllocationResponse", "deviceIDs", 1),
        ("deviceplugin.v1beta1.api", "ContainerAllocateRequest", "devices_ids", 1),
        ("deviceplugin.v1beta1.api", "DevicePluginOptions", "get_preferred_allocation_available", 2),
        ("pluginregistration.v1.api", "PluginInfo", "supported_versions", 4),
        ("dra.v1.api", "Device", "cdi_device_ids", 4),
        ("dra.v1.api", "Claim", "name", 3),
        ("podresources.v1.api", "ContainerResources", "dynamic_resources", 5),
        ("podresources.v1.api", "DynamicResource", "claim_name", 2),
        ("podresources.v1.api", "ClaimResource", "share_id", 5),
        ("podresources.v1.api", "ContainerMemory", "size", 2),
    ],
)
def test_field_numbers(module: str, message: str, name: str, number: int) -> None:
    assert _field(module, message, name).number == number


def test_tricky_fields() -> None:
    envs = _field("deviceplugin.v1beta1.api", "ContainerAllocateResponse", "envs")
    assert envs.number == 1 and envs.message_type.GetOptions().map_entry
    assert _field("deviceplugin.v1beta1.api", "NUMANode", "ID").type == _descriptor.FieldDescriptor.TYPE_INT64
    assert _field("podresources.v1.api", "ContainerMemory", "size").type == _descriptor.FieldDescriptor.TYPE_UINT64

    dynamic = _gen("podresources.v1.api_pb2").DESCRIPTOR.message_types_by_name["DynamicResource"]
    assert 1 not in dynamic.fields_by_number
    pod = _gen("podresources.v1.api_pb2").DESCRIPTOR.message_types_by_name["PodResources"]
    assert sorted(pod.fields_by_number) == [1, 2, 3]  # master's 4 and 5 are left out

    share = _field("dra.v1.api", "Device", "share_id")
    assert share.number == 5 and share.has_presence
    assert "share_id" not in _gen("dra.v1beta1.api_pb2").DESCRIPTOR.message_types_by_name["Device"].fields_by_name
    device = _gen("dra.v1.api_pb2").Device()
    assert not device.HasField("share_id")
    device.share_id = ""
    assert device.HasField("share_id")
    claims = _field("dra.v1.api", "NodePrepareResourcesResponse", "claims")
    assert claims.message_type.GetOptions().map_entry


# -- (d) grpcio and grpclib interoperate -----------------------------------------------------


class _Plugin(grpcio_stubs.device_plugin().DevicePluginServicer):  # type: ignore[misc]
    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        pb2 = grpcio_stubs.device_plugin().pb2
        return pb2.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)


def test_grpcio_server_grpclib_client(tmp_path: Path) -> None:
    from grpclib.client import Channel

    from eventsrc.gen.deviceplugin.v1beta1 import api_grpc, api_pb2

    sock = tmp_path / "plugin.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([grpcio_stubs.device_plugin_handler(_Plugin())])
    server.add_insecure_port(grpcio_stubs.unix_target(sock))
    server.start()
    try:

        async def call() -> Any:
            channel = Channel(path=str(sock))
            try:
                return await api_grpc.DevicePluginStub(channel).GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
            finally:
                channel.close()

        reply = asyncio.run(call())
    finally:
        server.stop(grace=None)
    assert reply == api_pb2.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)


def test_grpclib_server_grpcio_client(tmp_path: Path) -> None:
    from grpclib.server import Server

    from eventsrc.gen.deviceplugin.v1beta1 import api_grpc, api_pb2

    seen: list[Any] = []

    class Registration(api_grpc.RegistrationBase):
        async def Register(self, stream: Any) -> None:
            seen.append(await stream.recv_message())
            await stream.send_message(api_pb2.Empty())

    sock = tmp_path / "kubelet.sock"
    request = api_pb2.RegisterRequest(
        version="v1beta1",
        endpoint="vendor.sock",
        resource_name="vendor.com/gpu",
        options=api_pb2.DevicePluginOptions(pre_start_required=True),
    )

    def register() -> Any:
        with grpc.insecure_channel(grpcio_stubs.unix_target(sock)) as channel:
            return grpcio_stubs.registration_client(channel).Register(request, timeout=10)

    async def main() -> Any:
        server = Server([Registration()])
        await server.start(path=str(sock))
        try:
            return await asyncio.to_thread(register)
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(main()) == api_pb2.Empty()
    assert seen == [request]
