"""The daemon's configuration: the file's schema, flags over the file, and its checks.

    eventsrc serve --config FILE [flags]

``Configuration`` is the file (YAML, or TOML when the name ends in ``.toml``), decoded
strictly: an unknown key or a value of the wrong type is one line naming the key. Fields
that mean what a KubeletConfiguration field means have its name (``cpuManagerPolicy``,
``reservedSystemCPUs``, ``featureGates``, ...); durations are Go durations ("30s", "5m").
A flag given on the command line overrides the file; what neither sets has its default.
The result, ``recorded(cfg)``, is what ``DaemonStarted`` records, and a difference from
the previous start's is a ``ConfigurationChanged`` (``changes``).

Everything here is pure but ``load`` (reads the file).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from eventsrc import events as ev
from eventsrc.core.cpu.assignment import parse_policy_options
from eventsrc.core.cpu.cpuset import CPUSet
from eventsrc.core.fleet_names import node_name_error
from eventsrc.core.memory.machine import MemoryConfigError, parse_reserved_memory_flag
from eventsrc.core.topology_manager import new_policy_options, validate_config
from eventsrc.errors import EventsrcError

API_VERSION = "eventsrc/v1alpha1"
KIND = "EventsrcConfiguration"


class ConfigError(EventsrcError):
    """A configuration file or value that cannot be used; the message names the key."""


# --------------------------------------------------------------------------- durations


_UNITS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "μs": 1_000,
    "ms": 1_000_000,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
_DURATION = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


#: How long an observation may wait in memory to share its append with others (seconds), by
#: default, and at most (``serve --observations-wait``, docs/adr/0042; the default's
#: measurement: docs/performance.md).
OBSERVATIONS_WAIT = 0.1
MAX_OBSERVATIONS_WAIT = 1.0


class Duration:
    """A Go duration ("30s", "5m", "1m30s", "500ms"), as the kubelet's config files hold
    them; whole nanoseconds. ``str()`` is Go's ``Duration.String()``."""

    __slots__ = ("ns",)

    def __init__(self, ns: int) -> None:
        if ns < 0:
            raise ValueError("a duration must not be negative")
        self.ns = ns

    @classmethod
    def of_seconds(cls, seconds: float) -> Duration:
        return cls(round(seconds * 10**9))

    @classmethod
    def parse(cls, text: str) -> Duration:
        """Go's ``time.ParseDuration`` (without a sign: nothing here may be negative)."""
        if text == "0":
            return cls(0)
        pos, ns = 0, 0.0
        for m in _DURATION.finditer(text):
            if m.start() != pos:
                break
            ns += float(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
        if pos == 0 or pos != len(text):
            raise ValueError(f'invalid duration "{text}" (expected e.g. "30s", "5m", "1m30s")')
        return cls(round(ns))

    @property
    def seconds(self) -> float:
        return self.ns / 10**9

    def __str__(self) -> str:
        ns = self.ns
        if ns == 0:
            return "0s"
        if ns < 1_000:
            return f"{ns}ns"
        if ns < 1_000_000:
            return _frac(ns, 1_000) + "µs"
        if ns < 10**9:
            return _frac(ns, 1_000_000) + "ms"
        hours, rest = divmod(ns, 3600 * 10**9)
        minutes, rest = divmod(rest, 60 * 10**9)
        out = f"{hours}h" if hours else ""
        if hours or minutes:
            out += f"{minutes}m"
        return out + _frac(rest, 10**9) + "s"

    def __repr__(self) -> str:
        return f"Duration({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Duration) and other.ns == self.ns

    def __hash__(self) -> int:
        return hash(self.ns)


def _frac(value: int, unit: int) -> str:
    whole, part = divmod(value, unit)
    if not part:
        return str(whole)
    digits = str(part).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


def parse_seconds_or_duration(text: str) -> Duration:
    """A flag's value: seconds ("30", "0.5") or a Go duration ("30s", "5m")."""
    try:
        seconds = float(text)
    except ValueError:
        return Duration.parse(text)
    if seconds < 0 or seconds != seconds or seconds == float("inf"):
        raise ValueError(f"{text!r} is not a duration (seconds must be a finite number, not negative)")
    return Duration.of_seconds(seconds)


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(|k|K|M|G|T|Ki|Mi|Gi|Ti|KB|MB|GB|TB|KiB|MiB|GiB|TiB|B)$")
_SIZE_UNITS = (
    {"": 1, "B": 1}
    | {
        u: 1000**i
        for i, units in enumerate((("k", "K", "KB"), ("M", "MB"), ("G", "GB"), ("T", "TB")), 1)
        for u in units
    }
    | {
        u: 1024**i
        for i, units in enumerate((("Ki", "KiB"), ("Mi", "MiB"), ("Gi", "GiB"), ("Ti", "TiB")), 1)
        for u in units
    }
)


class ByteSize:
    """A size in bytes: a number, or one with a suffix ("512Mi", "1G", "10MB", "4KiB"):
    k/M/G/T and KB/MB/GB/TB are powers of 1000, Ki/Mi/Gi/Ti and KiB/MiB/GiB/TiB of 1024.
    ``str()`` prints the largest binary suffix that divides it."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        if n < 0:
            raise ValueError("a size must not be negative")
        self.n = n

    @classmethod
    def parse(cls, text: str | int) -> ByteSize:
        if isinstance(text, int) and not isinstance(text, bool):
            return cls(text)
        shown = str(text) if len(str(text)) <= 40 else str(text)[:40] + "..."
        m = _SIZE.match(str(text).strip())
        if not m:
            raise ValueError(f'invalid size "{shown}" (expected bytes, or e.g. "512Mi", "1G", "10MB")')
        n = int(Decimal(m.group(1)) * _SIZE_UNITS[m.group(2)]) if len(m.group(1)) <= 24 else 1 << 63
        if n >= 1 << 63:
            raise ValueError(f'size "{shown}" is too large (at most 2^63-1 bytes)')
        return cls(n)

    def __str__(self) -> str:
        for suffix, unit in (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
            if self.n and self.n % unit == 0:
                return f"{self.n // unit}{suffix}"
        return str(self.n)

    def __repr__(self) -> str:
        return f"ByteSize({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteSize) and other.n == self.n

    def __hash__(self) -> int:
        return hash(self.n)


def _dec_hook(t: type, obj: Any) -> Any:
    if t is ByteSize:
        if isinstance(obj, ByteSize):
            return obj
        if isinstance(obj, bool) or not isinstance(obj, (str, int)):
            raise TypeError(f'expected a size like "512Mi" or a number of bytes, got {type(obj).__name__}')
        return ByteSize.parse(obj)
    if t is Duration:
        if isinstance(obj, Duration):
            return obj
        if not isinstance(obj, str):
            raise TypeError(f'expected a duration string like "30s" or "5m", got {type(obj).__name__}')
        return Duration.parse(obj)
    raise NotImplementedError


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, ByteSize):
        text = str(obj)
        return int(text) if text.isdigit() else text  # 0 and odd sizes as numbers, not '0'
    if isinstance(obj, Duration):
        return str(obj)
    raise NotImplementedError


# --------------------------------------------------------------------------- the schema


class LogRetention(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """What the live log keeps (docs/adr/0018); 0 is "no limit", and both 0 keep everything."""

    max_age: Duration = Duration(0)
    max_size: ByteSize = ByteSize(0)
    archive: bool = True  # what leaves is written to ROOT/eventsrc/archive first


class Fleet(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """Shipping the log to the fleet's NATS JetStream (docs/fleet.md); no servers: off."""

    nats: list[str] = []  # server URLs (nats://host:port)
    stream: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,255}$")] = "EVENTSRC"
    node_name: str = ""  # "" the host name
    # the stream's copies when this node creates it (3 in a three-server cluster); an existing
    # stream keeps its own
    replicas: Annotated[int, msgspec.Meta(ge=1, le=5)] = 1
    # the NATS user this node connects as ("" with a password file: the node's name), and the
    # file holding its password (docs/fleet.md, "NATS permissions"); "": no credentials
    user: str = ""
    password_file: str = ""


class ReservedMemory(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """The memory kept back on one NUMA node (the kubelet's ``reservedMemory`` entry)."""

    numa_node: Annotated[int, msgspec.Meta(ge=0, le=63)]
    limits: dict[str, str]


#: The kubelet's default hard eviction thresholds that keep back what a pod can request.
EVICTION_HARD = {"memory.available": "100Mi", "nodefs.available": "10%"}


class Configuration(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True, rename="camel"):
    """The configuration file's fields; a missing one has the default shown here."""

    api_version: str = ""  # optional; API_VERSION when given
    kind: str = ""  # optional; KIND when given
    root_dir: str = ""  # "" is --root-dir's default
    # The kubelet's (KubeletConfiguration) fields, with its names and meanings.
    cpu_manager_policy: Literal["none", "static"] = "none"
    cpu_manager_policy_options: dict[str, str] = {}
    reserved_system_cpus: str = msgspec.field(default="", name="reservedSystemCPUs")
    feature_gates: dict[str, bool] = {}
    topology_manager_policy: str = "none"
    topology_manager_scope: str = "container"
    topology_manager_policy_options: dict[str, str] = {}
    # What the node keeps back from pods (the resource fit, docs/adr/0043): resource -> quantity.
    system_reserved: dict[str, str] = {}
    kube_reserved: dict[str, str] = {}
    # signal -> threshold ("100Mi" or "10%"); memory.available and nodefs.available count
    eviction_hard: dict[str, str] = msgspec.field(default_factory=lambda: dict(EVICTION_HARD))
    max_pods: Annotated[int, msgspec.Meta(ge=1)] = 110
    # The memory manager (docs/adr/0044): None, or Static with memory kept back per NUMA node.
    memory_manager_policy: Literal["None", "Static"] = "None"
    reserved_memory: list[ReservedMemory] = []
    # eventsrc's own.
    reserved_cpu_count: Annotated[int, msgspec.Meta(ge=0)] = msgspec.field(default=0, name="reservedCPUCount")
    topology_file: str = ""  # "" reads the topology from sysfs
    sysfs_root: str = "/"
    snapshot_every: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    admission_wait: Duration = Duration.of_seconds(30)
    plugin_grace_period: Duration = Duration.of_seconds(300)
    watch_stall_timeout: Duration = Duration.of_seconds(30)
    # How long an observation may wait to share its append with others (docs/adr/0042).
    observations_wait: Duration = Duration.of_seconds(OBSERVATIONS_WAIT)
    metrics_address: str = ""  # host:port; "" serves no metrics
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Start a new, empty history although the root shows the log held one (docs/adr/0005).
    accept_empty_log: bool = False
    # The container runtime's NRI socket ("" connects to none), the plugin's two-digit index
    # and whether eventsrc adjusts containers or only records them (docs/nri.md).
    nri_socket: str = ""
    nri_plugin_index: Annotated[str, msgspec.Meta(pattern="^[0-9]{2}$")] = "10"
    nri_mode: Literal["enforce", "observe"] = "enforce"
    # Namespaces whose pods may ask for devices with the eventsrc.dev/resources annotation
    # (enforce mode); elsewhere the annotation fails the container: a pod's author writes it
    # (docs/security.md).
    nri_annotation_namespaces: list[Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]] = []
    # The runtime's CRI socket (the kubelet's name): the sandboxes a runtime recovered at its
    # start are removed without an NRI event, and only its listing shows them gone. "" takes
    # the kubelet's default for the runtime NRI names (containerd, CRI-O).
    container_runtime_endpoint: str = ""
    log_retention: LogRetention = LogRetention()
    # Record what the kubelet running with this directory decides, and decide nothing
    # (docs/kubelet-node.md); "" runs eventsrc as the node's resource managers.
    beside_kubelet: str = ""
    beside_kubelet_resync: Duration = Duration.of_seconds(60)
    fleet: Fleet = Fleet()


#: Each field that a ``serve`` flag sets: the field's name in the file -> the flag.
FLAGS: Mapping[str, str] = {
    "rootDir": "--root-dir",
    "cpuManagerPolicy": "--cpu-manager-policy",
    "cpuManagerPolicyOptions": "--cpu-manager-policy-options",
    "reservedSystemCPUs": "--reserved-cpus",
    "featureGates": "--feature-gates",
    "topologyManagerPolicy": "--topology-manager-policy",
    "topologyManagerScope": "--topology-manager-scope",
    "topologyManagerPolicyOptions": "--topology-manager-policy-options",
    "systemReserved": "--system-reserved",
    "kubeReserved": "--kube-reserved",
    "evictionHard": "--eviction-hard",
    "maxPods": "--max-pods",
    "memoryManagerPolicy": "--memory-manager-policy",
    "reservedMemory": "--reserved-memory",
    "reservedCPUCount": "--reserved-cpu-count",
    "topologyFile": "--topology-file",
    "sysfsRoot": "--sysfs-root",
    "snapshotEvery": "--snapshot-every",
    "admissionWait": "--admission-wait",
    "pluginGracePeriod": "--plugin-grace",
    "watchStallTimeout": "--watch-stall-timeout",
    "observationsWait": "--observations-wait",
    "metricsAddress": "--metrics-address",
    "logFormat": "--log-format",
    "logLevel": "--log-level",
    "acceptEmptyLog": "--accept-empty-log",
    "nriSocket": "--nri-socket",
    "nriPluginIndex": "--nri-plugin-index",
    "nriMode": "--nri-mode",
    "nriAnnotationNamespaces": "--nri-annotation-namespaces",
    "containerRuntimeEndpoint": "--container-runtime-endpoint",
    "logRetention.maxAge": "--log-retention-max-age",
    "logRetention.maxSize": "--log-retention-max-size",
    "logRetention.archive": "--log-retention-archive",
    "besideKubelet": "--beside-kubelet",
    "besideKubeletResync": "--beside-kubelet-resync",
    "fleet.nats": "--fleet-nats",
    "fleet.stream": "--fleet-stream",
    "fleet.nodeName": "--node-name",
    "fleet.replicas": "--fleet-replicas",
    "fleet.user": "--fleet-nats-user",
    "fleet.passwordFile": "--fleet-nats-password-file",
}

_FIELDS = {f.encode_name: f for f in msgspec.structs.fields(Configuration)}
_PATH_FIELDS = ("rootDir", "topologyFile", "sysfsRoot", "nriSocket", "besideKubelet")
_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<key>[^`]*)`")


def _explain(err: msgspec.ValidationError, data: Mapping[str, Any]) -> tuple[str, str, str]:
    """msgspec's error as (field, key, what is wrong), naming the key (of a map, too)."""
    text = str(err)
    unknown = _UNKNOWN.search(text)
    if unknown:
        key = unknown.group("key")
        close = difflib.get_close_matches(key, list(_FIELDS), n=1, cutoff=0.6)
        return key, "", f"unknown field '{key}'" + (f"; did you mean '{close[0]}'?" if close else "")
    if "`key` in" in text:
        return "", "", "every key must be a string"
    m = _AT.match(text)
    assert m is not None
    what, path = m.group("what").replace("`", ""), (m.group("path") or "").lstrip(".")
    name = re.split(r"[.\[]", path, maxsplit=1)[0]
    if path.endswith("[...]") and isinstance(data.get(name), Mapping):
        # Name the map's key: msgspec says only that one of its values is wrong.
        value_type = dict[str, bool] if name == "featureGates" else dict[str, str]
        for key, value in data[name].items():
            try:
                msgspec.convert({key: value}, value_type)
            except msgspec.ValidationError:
                path = f"{name}[{key!r}]"
                break
    what = what.replace("Invalid enum value", "invalid value")
    allowed = _choices(name)
    if allowed and what.startswith("invalid value"):
        what += f" (expected one of: {', '.join(allowed)})"
    return name, path, what[:1].lower() + what[1:]


def _choices(name: str) -> tuple[str, ...]:
    f = _FIELDS.get(name)
    if f is None or getattr(f.type, "__origin__", None) is not Literal:
        return ()
    return tuple(a for a in f.type.__args__ if isinstance(a, str))


def decode(data: bytes, name: str) -> Configuration:
    """The configuration in ``data`` (TOML when ``name`` ends in .toml, else YAML)."""
    return _convert(_mapping(data, name), name)


def fields_set(path: Path) -> set[str]:
    """The fields the configuration file at ``path`` sets itself (by their names in the file)."""
    try:
        return set(_mapping(path.read_bytes(), str(path)))
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None


def _mapping(data: bytes, name: str) -> dict[str, Any]:
    if name.endswith(".toml"):
        import tomllib

        try:
            obj: Any = tomllib.loads(data.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {name}: not valid TOML: {exc}") from None
    else:
        import yaml

        try:
            obj = yaml.safe_load(data)
        except yaml.YAMLError as exc:
            where = ""
            mark = getattr(exc, "problem_mark", None)
            if mark is not None:
                where = f" at line {mark.line + 1} column {mark.column + 1}"
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(f"config file {name}: not valid YAML: {problem}{where}") from None
    if obj is None:
        obj = {}
    if not isinstance(obj, dict):
        raise ConfigError(f"config file {name}: expected a mapping of fields, got {type(obj).__name__}")
    return obj


#: Why an empty node name given on purpose is refused: left out, the host name is the node's name.
EMPTY_NODE_NAME = "is empty: leave it out to name the node by its host name, or give the node's name"


def _convert(obj: dict[str, Any], name: str) -> Configuration:
    fleet = obj.get("fleet")
    if isinstance(fleet, dict) and fleet.get("nodeName") == "":
        raise ConfigError(f"config file {name}: fleet.nodeName {EMPTY_NODE_NAME}")
    try:
        cfg = msgspec.convert(obj, Configuration, dec_hook=_dec_hook)
    except msgspec.ValidationError as err:
        _, key, what = _explain(err, obj)
        raise ConfigError(f"config file {name}: {key}: {what}" if key else f"config file {name}: {what}") from None
    if cfg.api_version and cfg.api_version != API_VERSION:
        raise ConfigError(f"config file {name}: apiVersion: {cfg.api_version!r} is not {API_VERSION!r}")
    if cfg.kind and cfg.kind != KIND:
        raise ConfigError(f"config file {name}: kind: {cfg.kind!r} is not {KIND!r}")
    return cfg


def resolve_paths(cfg: Configuration, base: Path) -> Configuration:
    """Relative paths in a file are relative to the file's directory, as in the kubelet's."""
    changes: dict[str, Any] = {}
    for name in _PATH_FIELDS:
        attr = _FIELDS[name].name
        value = getattr(cfg, attr)
        if value and not Path(value).is_absolute():
            changes[attr] = str(base / value)
    if cfg.fleet.password_file and not Path(cfg.fleet.password_file).is_absolute():
        changes["fleet"] = msgspec.structs.replace(cfg.fleet, password_file=str(base / cfg.fleet.password_file))
    return msgspec.structs.replace(cfg, **changes) if changes else cfg


def load(path: Path) -> Configuration:
    """Read and decode the configuration file at ``path``."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    return resolve_paths(decode(data, str(path)), path.absolute().parent)


def merge(base: Configuration, overrides: Mapping[str, Any]) -> Configuration:
    """``base`` with the fields in ``overrides`` (file names, flag values) replaced."""
    if not overrides:
        return base
    if overrides.get("fleet.nodeName") == "":
        raise ConfigError(f"{FLAGS['fleet.nodeName']} {EMPTY_NODE_NAME}")
    fields = msgspec.to_builtins(base, enc_hook=_enc_hook)
    for name, value in overrides.items():
        value = str(value) if isinstance(value, (Duration, ByteSize)) else value
        outer, _, inner = name.partition(".")
        if inner:  # a field of a nested section: logRetention.maxSize
            fields[outer] = {**fields.get(outer, {}), inner: value}
        else:
            fields[name] = value
    try:
        return msgspec.convert(fields, Configuration, dec_hook=_dec_hook)
    except msgspec.ValidationError as err:
        name, _, what = _explain(err, fields)
        raise ConfigError(f"{FLAGS.get(name, name)}: {what}") from None


_GO_BOOL = {"1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True} | {
    "0": False,
    "f": False,
    "F": False,
    "FALSE": False,
    "false": False,
    "False": False,
}


def parse_map(text: str, flag: str) -> dict[str, str]:
    """``k=v,k=v``, as the kubelet's map flags take it."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag}: {part!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def parse_thresholds(text: str, flag: str) -> dict[str, str]:
    """``signal<quantity,...``, as the kubelet's ``--eviction-hard`` takes it."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("<")
        if not sep or not key or not value:
            raise ConfigError(f"{flag}: {part!r} is not SIGNAL<QUANTITY")
        out[key.strip()] = value.strip()
    return out


def parse_reserved_memory(values: list[str]) -> list[dict[str, Any]]:
    """``--reserved-memory``, each time it is given, as the kubelet reads it (``0:memory=1Gi;1:...``),
    in the configuration file's form."""
    try:
        parsed = parse_reserved_memory_flag(values) or []
    except MemoryConfigError as err:
        raise ConfigError(f"--reserved-memory: {err}") from None
    return [{"numaNode": r.numa_node, "limits": dict(r.limits)} for r in parsed]


def parse_list(text: str) -> list[str]:
    """``a,b,c``, as the kubelet's list flags take it (spaces and empty items dropped)."""
    return [part for part in (p.strip() for p in text.split(",")) if part]


def parse_feature_gates(text: str, flag: str = "--feature-gates") -> dict[str, bool]:
    """``Name=true,Other=false``; the values as Go's ``strconv.ParseBool`` reads them."""
    out = {}
    for key, value in parse_map(text, flag).items():
        if value not in _GO_BOOL:
            raise ConfigError(f"{flag}: invalid value of {key}={value}: expected true or false")
        out[key] = _GO_BOOL[value]
    return out


def check(cfg: Configuration) -> None:
    """What the kubelet checks before it starts, short of the machine (serve checks the
    rest against the topology): the policy names, their options, the reserved CPU list."""

    def wrap(name: str, err: Exception) -> ConfigError:
        return ConfigError(f"invalid configuration: {name} ({FLAGS[name]}): {err}")

    validate_config(cfg.topology_manager_policy, cfg.topology_manager_scope)
    if cfg.topology_manager_policy != "none":
        try:
            new_policy_options(cfg.topology_manager_policy_options)
        except EventsrcError as err:
            raise wrap("topologyManagerPolicyOptions", err) from None
    try:
        parse_policy_options(
            cfg.cpu_manager_policy_options,
            alpha_enabled=cfg.feature_gates.get("CPUManagerPolicyAlphaOptions", False),
            beta_enabled=cfg.feature_gates.get("CPUManagerPolicyBetaOptions", True),
        )
    except EventsrcError as err:
        raise wrap("cpuManagerPolicyOptions", err) from None
    if cfg.reserved_system_cpus:
        try:
            CPUSet.parse(cfg.reserved_system_cpus)
        except ValueError as err:
            raise wrap("reservedSystemCPUs", err) from None
    if cfg.beside_kubelet and cfg.nri_socket and cfg.nri_mode != "observe":
        raise wrap(
            "nriMode",
            ValueError("beside a kubelet (besideKubelet) NRI only observes: the kubelet decides; use observe"),
        )
    if cfg.watch_stall_timeout.seconds <= 0:
        raise wrap("watchStallTimeout", ValueError("must be more than 0"))
    if cfg.observations_wait.seconds > MAX_OBSERVATIONS_WAIT:
        raise wrap("observationsWait", ValueError(f"must be at most {Duration.of_seconds(MAX_OBSERVATIONS_WAIT)}"))
    if cfg.fleet.node_name and (why := node_name_error(cfg.fleet.node_name)):
        raise wrap("fleet.nodeName", ValueError(why))
    for url in cfg.fleet.nats:
        if not re.fullmatch(r"(nats|tls)://[^\s/]+", url):
            raise wrap("fleet.nats", ValueError(f"{url!r} is not a NATS server URL (nats://HOST:PORT)"))
    if cfg.fleet.user and not cfg.fleet.password_file:
        raise wrap("fleet.user", ValueError("needs fleet.passwordFile (--fleet-nats-password-file)"))
    if cfg.beside_kubelet_resync.seconds <= 0:
        raise wrap("besideKubeletResync", ValueError("must be more than 0"))
    endpoint = cfg.container_runtime_endpoint
    path = endpoint.removeprefix("unix://")
    if endpoint and ("://" in path or not path.startswith("/")):
        raise wrap("containerRuntimeEndpoint", ValueError(f"{endpoint!r} is not unix:///PATH or an absolute path"))


# --------------------------------------------------------------------------- printing and recording


def to_builtins(cfg: Configuration) -> dict[str, Any]:
    """Every field by its name in the file, durations as strings: what ``config print`` shows."""
    out: dict[str, Any] = msgspec.to_builtins(cfg, enc_hook=_enc_hook)
    out["apiVersion"], out["kind"] = API_VERSION, KIND
    return {"apiVersion": out.pop("apiVersion"), "kind": out.pop("kind"), **out}


def as_file(cfg: Configuration) -> dict[str, Any]:
    """What ``config print`` shows: ``to_builtins``, a valid file, so without the node name
    when it is left to the host name (an empty one in a file is refused)."""
    out = to_builtins(cfg)
    if not cfg.fleet.node_name:
        out["fleet"].pop("nodeName", None)
    return out


def recorded(cfg: Configuration) -> dict[str, Any]:
    """What a start records (``DaemonStarted.config``) and compares with the previous one's."""
    out = to_builtins(cfg)
    # acceptEmptyLog acts once, at a start DaemonStarted.fresh_start records; it is no
    # setting of the node to compare from one start to the next.
    del out["apiVersion"], out["kind"], out["acceptEmptyLog"]
    return out


def changes(previous: Mapping[str, Any], current: Mapping[str, Any]) -> ev.ConfigurationChanged | None:
    """The event for a start whose configuration differs from the one last recorded
    (none for the first start: there is nothing to differ from)."""
    if not previous or dict(previous) == dict(current):
        return None
    changed = sorted(k for k in previous.keys() | current.keys() if previous.get(k) != current.get(k))
    return ev.ConfigurationChanged(old=dict(previous), new=dict(current), changed=changed)
