"""The pod annotation that carries device requests for pods the container runtime creates.

CRI carries no extended resources, so a pod eventsrc admits from what the runtime tells it
(over NRI) names its devices in one annotation (docs/nri.md):

    eventsrc.dev/resources: '{"<container>": {"<resource>": <count>, ...}, ...}'

Validated with msgspec: a JSON object of container names to objects of extended resource
names to whole counts. A bad value is one ``ManifestError`` line naming the annotation.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from eventsrc.core.devices.names import is_extended_resource_name
from eventsrc.core.runtime import RESOURCES_ANNOTATION
from eventsrc.inputs.manifest import ManifestError

#: Bounds on what one annotation may ask (the apiserver bounds annotations at 256 KiB in all).
MAX_ANNOTATION_BYTES = 64 * 1024
MAX_COUNT = 1 << 16

_decoder = msgspec.json.Decoder(dict[str, dict[str, int]])


def device_requests(annotations: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """container -> resource -> count, from the pod's ``eventsrc.dev/resources`` ({} without one)."""
    text = annotations.get(RESOURCES_ANNOTATION)
    if text is None:
        return {}
    where = f"annotation {RESOURCES_ANNOTATION}"
    if len(text.encode()) > MAX_ANNOTATION_BYTES:
        raise ManifestError(f"{where}: longer than {MAX_ANNOTATION_BYTES} bytes")
    try:
        value = _decoder.decode(text)
    except msgspec.DecodeError as exc:
        raise ManifestError(f"{where}: {_one_line(exc)}") from None
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


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
