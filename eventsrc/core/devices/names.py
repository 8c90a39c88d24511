"""Resource name rules, as the kubelet and apimachinery apply them (see kubelet-api.md 6.1)."""

from __future__ import annotations

import re

DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{DNS1123_LABEL}(\.{DNS1123_LABEL})*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
SUPPORTED_VERSIONS = ("v1beta1",)


def is_dns1123_subdomain(value: str) -> bool:
    return 0 < len(value) <= 253 and _DNS1123_SUBDOMAIN.fullmatch(value) is not None


def is_qualified_name(value: str) -> bool:
    """apimachinery IsQualifiedName: optional DNS-1123 subdomain prefix, '/', 1-63 char name."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix or not is_dns1123_subdomain(prefix):
            return False
    else:
        return False
    return 0 < len(name) <= 63 and _QUALIFIED_NAME.fullmatch(name) is not None


def is_extended_resource_name(name: str) -> bool:
    """The kubelet's IsExtendedResourceName: a domain-prefixed name outside kubernetes.io,
    not starting with ``requests.``, and ``requests.<name>`` a valid qualified name."""
    if "kubernetes.io/" in name or "/" not in name or name.startswith("requests."):
        return False
    return is_qualified_name("requests." + name)


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def go_quote(value: str) -> str:
    """Go's ``%q`` of a string (strconv.Quote)."""
    out = []
    for ch in value:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def registration_error(version: str, resource_name: str) -> str:
    """The kubelet's Register checks, in its order, with its messages ("" when valid)."""
    if version not in SUPPORTED_VERSIONS:
        # Go's %q of a []string quotes each element: ["v1beta1"].
        supported = "[" + " ".join(go_quote(v) for v in SUPPORTED_VERSIONS) + "]"
        return (
            f"requested API version {go_quote(version)} is not supported by kubelet. Supported version is {supported}"
        )
    if not is_extended_resource_name(resource_name):
        return f"the ResourceName {go_quote(resource_name)} is invalid"
    return ""


def endpoint_error(endpoint: str) -> str:
    """eventsrc's stricter rule: a plain file name inside the device-plugin directory."""
    if not endpoint:
        return "the endpoint is empty"
    if "/" in endpoint or "\\" in endpoint or endpoint in (".", "..") or ".." in endpoint:
        return (
            f'the endpoint "{endpoint}" must be a plain file name inside the device-plugin directory (no "/", no "..")'
        )
    if "\x00" in endpoint:
        return "the endpoint contains a NUL byte"
    if endpoint == "kubelet.sock":
        return 'the endpoint "kubelet.sock" is the registration socket itself'
    return ""
