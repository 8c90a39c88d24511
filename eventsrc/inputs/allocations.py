"""A device plugin's ContainerAllocateResponse as the event that records it."""

from __future__ import annotations

from eventsrc import events as ev
from eventsrc.gen.deviceplugin.v1beta1 import api_pb2 as pb


def allocation_from_proto(r: pb.ContainerAllocateResponse) -> ev.ContainerAllocation:
    return ev.ContainerAllocation(
        envs=dict(r.envs),
        mounts=[
            ev.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only) for m in r.mounts
        ],
        devices=[
            ev.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in r.devices
        ],
        annotations=dict(r.annotations),
        cdi_devices=[c.name for c in r.cdi_devices],
    )
