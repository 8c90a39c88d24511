"""The pod annotation that carries device requests for pods the container runtime creates.

CRI carries no extended resources, so a pod eventsrc admits from what the runtime tells it
(over NRI) names its devices in one annotation (docs/nri.md):

    eventsrc.dev/resources: '{"<container>": {"<resource>": <count>, ...}, ...}'

Validated with msgspec: a JSON object of container names to objects of extended resource
names to whole counts, no key twice. A bad value is one ``ManifestError`` line naming the
annotation.

A pod's author writes its annotations, and what they ask was never counted by the scheduler
or ResourceQuota: the annotation is honoured only for pods of the namespaces the node's
operator names (``--nri-annotation-namespaces``); anywhere else it is refused.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

import msgspec

from eventsrc.core.devices.names import is_extended_resource_name
from eventsrc.core.runtime_decisions import RESOURCES_ANNOTATION
from eventsrc.inputs.manifest import ManifestError

#: Bounds on what one annotation may ask (the apiserver bounds annotations at 256 KiB in all).
MAX_ANNOTATION_BYTES = 64 * 1024
MAX_COUNT = 1 << 16

_decoder = msgspec.json.Decoder(dict[str, dict[str, int]])


#: the flag that names the namespaces whose pods may use the annotation
NAMESPACES_FLAG = "--nri-annotation-namespaces"


def device_requests(
    annotations: Mapping[str, str], namespace: str, allowed: Collection[str]
) -> dict[str, dict[str, int]]:
    """container -> resource -> count, from the pod's ``eventsrc.dev/resources`` ({} without
    one); refused for a pod of a namespace not in ``allowed``."""
    text = annotations.get(RESOURCES_ANNOTATION)
    if text is None:
        return {}
    where = f"annotation {RESOURCES_ANNOTATION}"
    if namespace not in allowed:
        raise ManifestError(
            f"{where}: pods of namespace {namespace!r} may not ask for devices by annotation "
            f"(the node's {NAMESPACES_FLAG} does not name it)"
        )
    if len(text.encode()) > MAX_ANNOTATION_BYTES:
        raise ManifestError(f"{where}: longer than {MAX_ANNOTATION_BYTES} bytes")
    try:
        value = _decoder.decode(text)
    except msgspec.DecodeError as exc:
        raise ManifestError(f"{where}: {_one_line(exc)}") from None
    try:  # msgspec keeps the last of two equal keys: which one the author meant is not known
        json.loads(text, object_pairs_hook=_once)
    except _Twice as twice:
        raise ManifestError(f"{where}: key {twice.key!r} appears twice") from None
    for container, resources in value.items():
        for resource, count in resources.items():
            if not is_extended_resource_name(resource):
                raise ManifestError(
                    f"{where}: {resource!r} of container {container!r} is not an extended resource name"
                )
            if not 0 <= count <= MAX_COUNT:
                raise ManifestError(
                    f"{where}: {resource} of container {container!r} must be 0..{MAX_COUNT}, not {count}"
                )
    return value


class _Twice(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Twice(key)
        out[key] = value
    return out


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
