"""Prometheus metrics and the health endpoints, served inside the daemon's trio process.

    serve_http(app, "127.0.0.1:10266")     one task in the daemon's nursery (hypercorn on trio)
      /metrics   the Prometheus text format (version 0.0.4, as the kubelet writes it)
      /healthz   200 "ok" while the trio loop answers and the committer is not stalled (and,
                 while something needs an operator but not a restart, such as failing
                 retention cuts, a "warning:" line after it)
      /readyz    200 "ok" once every socket is served; 503 and the reason otherwise

The kubelet's series keep the kubelet's names, labels, types and buckets
(pkg/kubelet/metrics/metrics.go; DRA's dra_grpc_operations_duration_seconds), so that its
dashboards and alerts work unchanged; eventsrc's own series start with ``eventsrc_``.
Every series lives in a private CollectorRegistry, never prometheus_client's global one:
two daemons (or a test and a daemon) in one process never share counts.

The shell calls the small methods below; what follows from committed events (plugin
registrations, device health transitions) is counted in ``committed``, which the daemon
calls with each durable batch. Nothing here is imported by the pure core.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from decimal import Decimal
from functools import partial
from typing import Any, Protocol

import trio
from grpclib import GRPCError, Status
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.context_managers import Timer
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from eventsrc import events as ev
from eventsrc.core.retention_policy import CutHealth
from eventsrc.core.shipping import ShippingReport
from eventsrc.errors import EventsrcError
from eventsrc.events import Record
from eventsrc.obs.logger import get_logger
from eventsrc.obs.text import escape
from eventsrc.state.kubelet import claim_device_id
from eventsrc.state.views import Views

log = get_logger(__name__)

#: Where ``--metrics-address`` with no value serves (kube-proxy has 10256 on most nodes).
DEFAULT_METRICS_ADDRESS = "127.0.0.1:10266"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: /healthz fails when appends have waited this long with no commit (a stuck disk).
STALL_SECONDS = 60.0

# Go's prometheus.DefBuckets (prometheus_client's default has three more).
GO_DEF_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def exponential_buckets(start: float, factor: float, count: int) -> tuple[float, ...]:
    """Go's prometheus.ExponentialBuckets."""
    return tuple(start * factor**i for i in range(count))


def _alpha(text: str) -> str:
    return f"[ALPHA] {text}"  # component-base prefixes the help of the kubelet's ALPHA series


class MetricsAddressError(EventsrcError):
    pass


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT`` or ``:PORT`` (every interface): the host and the port."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise MetricsAddressError(f"metrics address {text!r}: expected HOST:PORT (e.g. {DEFAULT_METRICS_ADDRESS})")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise MetricsAddressError(f"metrics address {text!r}: write an IPv6 host in brackets, e.g. [::1]:10266")
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name (or "" for every interface): assume the network can reach it


_GO_CODE_NAMES = {Status.OK: "OK", Status.CANCELLED: "Canceled"}


def grpc_code(exc: BaseException | None) -> str:
    """The gRPC status of a call as grpc-go names it (``status.Code(err).String()``)."""
    if exc is None:
        return "OK"
    if isinstance(exc, GRPCError):
        status = exc.status
        return _GO_CODE_NAMES.get(status) or "".join(w.capitalize() for w in status.name.split("_"))
    if isinstance(exc, (trio.TooSlowError, TimeoutError)):
        return "DeadlineExceeded"
    if isinstance(exc, trio.Cancelled):
        return "Canceled"
    if isinstance(exc, OSError):
        return "Unavailable"  # the driver's socket refused or broke the connection
    return "Unknown"


class Metrics:
    """The daemon's series. ``log_bytes``, ``last_seq``, ``corrupt_records`` and
    ``retention`` are read at scrape time (cheap: a stat and attribute reads)."""

    def __init__(
        self,
        *,
        log_bytes: Callable[[], int] = lambda: 0,
        last_seq: Callable[[], int] = lambda: 0,
        corrupt_records: Callable[[], int] = lambda: 0,
        retention: Callable[[], CutHealth] = CutHealth,
        views: Callable[[], Views] = Views,
        fleet: Callable[[], tuple[ShippingReport, int] | None] = lambda: None,
    ) -> None:
        r = self.registry = CollectorRegistry(auto_describe=False)
        # ------------------------------------------------------------ the kubelet's
        self.device_plugin_registration = Counter(
            "kubelet_device_plugin_registration_total",
            _alpha("Cumulative number of device plugin registrations. Broken down by resource name."),
            ["resource_name"],
            registry=r,
        )
        self.device_plugin_alloc = Histogram(
            "kubelet_device_plugin_alloc_duration_seconds",
            _alpha("Duration in seconds to serve a device plugin Allocation request. Broken down by resource name."),
            ["resource_name"],
            buckets=GO_DEF_BUCKETS,
            registry=r,
        )
        self.cpu_pinning_requests = Counter(
            "kubelet_cpu_manager_pinning_requests_total",
            _alpha("The number of cpu core allocations which required pinning."),
            registry=r,
        )
        self.cpu_pinning_errors = Counter(
            "kubelet_cpu_manager_pinning_errors_total",
            _alpha("The number of cpu core allocations which required pinning failed."),
            registry=r,
        )
        self.topology_requests = Counter(
            "kubelet_topology_manager_admission_requests_total",
            _alpha("The number of admission requests where resources have to be aligned."),
            registry=r,
        )
        self.topology_errors = Counter(
            "kubelet_topology_manager_admission_errors_total",
            _alpha("The number of admission request failures where resources could not be aligned."),
            registry=r,
        )
        self.topology_duration_ms = Histogram(
            "kubelet_topology_manager_admission_duration_ms",
            _alpha("Duration in milliseconds to serve a pod admission request."),
            buckets=exponential_buckets(0.05, 2, 15),
            registry=r,
        )
        self.dra_grpc = Histogram(
            "dra_grpc_operations_duration_seconds",
            _alpha("Duration in seconds of the DRA gRPC operations"),
            ["driver_name", "grpc_status_code", "method_name"],
            buckets=GO_DEF_BUCKETS,
            registry=r,
        )
        self.dra_operations = Histogram(
            "dra_operations_duration_seconds",
            _alpha(
                "Latency histogram in seconds for the duration of handling all ResourceClaims referenced by a pod "
                "when the pod starts or stops. Identified by the name of the operation (PrepareResources or "
                "UnprepareResources) and separated by the success of the operation. The number of failed operations "
                "is provided through the histogram's overall count."
            ),
            ["operation_name", "is_error"],
            buckets=GO_DEF_BUCKETS,
            registry=r,
        )
        # The pod resources counters are named without "_total" (prometheus_client would
        # add it): plain counts, written by the collector below.
        self.pod_resources: dict[str, int] = {}
        # ------------------------------------------------------------ eventsrc's own
        self.append_duration = Histogram(
            "eventsrc_log_append_duration_seconds",
            "Seconds from Daemon.record to its events being durable and applied (group commit included).",
            buckets=exponential_buckets(0.0001, 2, 16),
            registry=r,
        )
        self.commit_batch = Histogram(
            "eventsrc_log_commit_batch_records",
            "Records per group commit (one write transaction, one sync).",
            buckets=exponential_buckets(1, 2, 12),
            registry=r,
        )
        self.replay_seconds = Gauge(
            "eventsrc_replay_duration_seconds",
            "Seconds this start took to rebuild the views (snapshot and log tail).",
            registry=r,
        )
        self.replay_records = Gauge(
            "eventsrc_replay_records",
            "Records this start replayed on top of the snapshot (all of them without one).",
            registry=r,
        )
        self.health_transitions = Counter(
            "eventsrc_device_health_transitions_total",
            "Device health changes reported by device plugins, by resource and the health changed to.",
            ["resource_name", "to"],
            registry=r,
        )
        self.waiting_for_plugin = Gauge(
            "eventsrc_admissions_waiting_for_plugin",
            "Admissions waiting for a known device plugin or DRA driver to come back.",
            registry=r,
        )
        r.register(_ScrapeTime(self, log_bytes, last_seq, corrupt_records, retention))
        r.register(_Fleet(fleet))
        r.register(_Allocations(views))
        self._on_event: dict[type, Callable[[Any], None]] = {
            ev.PluginRegistered: self._registration,
            ev.PluginRegistrationRejected: self._registration,
            ev.DeviceHealthChanged: self._health_changed,
        }

    # ---------------------------------------------------------------- from the log

    def batch_committed(self, records: int) -> None:
        """One durable batch of ``records`` records."""
        self.commit_batch.observe(records)

    def committed(self, records: list[Record]) -> None:
        """What durable records' events count for (cheap: one dict lookup per record)."""
        on_event = self._on_event
        for r in records:
            count = on_event.get(type(r.event))
            if count is not None:
                count(r.event)

    def _registration(self, e: ev.PluginRegistered | ev.PluginRegistrationRejected) -> None:
        # The kubelet counts every Register request, accepted or not.
        if e.kind == "DevicePlugin":
            self.device_plugin_registration.labels(resource_name=e.resource).inc()

    def _health_changed(self, e: ev.DeviceHealthChanged) -> None:
        self.health_transitions.labels(resource_name=e.resource, to=e.health).inc()

    def append_observed(self, seconds: float) -> None:
        self.append_duration.observe(seconds)

    def replayed(self, seconds: float, records: int) -> None:
        self.replay_seconds.set(seconds)
        self.replay_records.set(records)

    # ---------------------------------------------------------------- from the shell

    def alloc_timer(self, resource: str) -> Timer:
        """Times one Allocate call to a device plugin, failed or not (as the kubelet does)."""
        return self.device_plugin_alloc.labels(resource_name=resource).time()

    def cpu_pinning(self, failed: bool) -> None:
        """A container that needs exclusive CPUs was given them, or could not be."""
        self.cpu_pinning_requests.inc()
        if failed:
            self.cpu_pinning_errors.inc()

    @contextmanager
    def topology_admission(self) -> Iterator[None]:
        """One pod through the topology manager (hints, merge, CPUs and devices chosen);
        an exception out of the block is an admission error."""
        self.topology_requests.inc()
        start = time.perf_counter()
        try:
            yield
        except Exception:
            self.topology_errors.inc()
            raise
        finally:
            self.topology_duration_ms.observe((time.perf_counter() - start) * 1000)

    def topology_admission_failed(self) -> None:
        """A pod admitted by the planner whose Allocate then failed (the kubelet allocates
        inside the topology manager's admission, so it counts there)."""
        self.topology_errors.inc()

    def pod_resources_request(self, method: str, version: str = "v1") -> None:
        """``method``: list, get_allocatable or get."""
        for name in (
            "kubelet_pod_resources_endpoint_requests_total",
            f"kubelet_pod_resources_endpoint_requests_{method}",
        ):
            key = f"{name}\0{version}"
            self.pod_resources[key] = self.pod_resources.get(key, 0) + 1

    def pod_resources_error(self, method: str, version: str = "v1") -> None:
        key = f"kubelet_pod_resources_endpoint_errors_{method}\0{version}"
        self.pod_resources[key] = self.pod_resources.get(key, 0) + 1

    @contextmanager
    def dra_call(self, driver: str, method: str) -> Iterator[None]:
        """One gRPC call to a DRA driver; ``method`` is the full name
        (/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources)."""
        start = time.perf_counter()
        code = "OK"
        try:
            yield
        except BaseException as exc:
            code = grpc_code(exc)
            raise
        finally:
            self.dra_grpc.labels(driver_name=driver, grpc_status_code=code, method_name=method).observe(
                time.perf_counter() - start
            )

    @contextmanager
    def dra_operation(self, operation: str) -> Iterator[list[ev.EventBase]]:
        """PrepareResources (a pod's claims at admission) or UnprepareResources (claims
        released by the reconcile loop), timed as the kubelet's DRA manager times them.
        The block adds the drivers' outcome events to the list it gets: the operation
        failed if one of them is a failure (or if the block raised)."""
        start = time.perf_counter()
        outcome: list[ev.EventBase] = []
        failed = True
        try:
            yield outcome
            failed = any(isinstance(e, (ev.ClaimPrepareFailed, ev.ClaimUnprepareFailed)) for e in outcome)
        finally:
            self.dra_operations.labels(operation_name=operation, is_error="true" if failed else "false").observe(
                time.perf_counter() - start
            )

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """An admission waiting for a plugin or driver that is away."""
        self.waiting_for_plugin.inc()
        try:
            yield
        finally:
            self.waiting_for_plugin.dec()

    # ---------------------------------------------------------------- out

    def exposition(self) -> bytes:
        return exposition(self.registry.collect())


_POD_RESOURCES_HELP = {
    "kubelet_pod_resources_endpoint_requests_total": "Cumulative number of requests to the PodResource endpoint. Broken down by server api version.",  # noqa: E501
    "kubelet_pod_resources_endpoint_requests_list": "Number of requests to the PodResource List endpoint. Broken down by server api version.",  # noqa: E501
    "kubelet_pod_resources_endpoint_requests_get_allocatable": "Number of requests to the PodResource GetAllocatableResources endpoint. Broken down by server api version.",  # noqa: E501
    "kubelet_pod_resources_endpoint_requests_get": "Number of requests to the PodResource Get endpoint. Broken down by server api version.",  # noqa: E501
    "kubelet_pod_resources_endpoint_errors_list": "Number of requests to the PodResource List endpoint which returned error. Broken down by server api version.",  # noqa: E501
    "kubelet_pod_resources_endpoint_errors_get_allocatable": "Number of requests to the PodResource GetAllocatableResources endpoint which returned error. Broken down by server api version.",  # noqa: E501
    "kubelet_pod_resources_endpoint_errors_get": "Number of requests to the PodResource Get endpoint which returned error. Broken down by server api version.",  # noqa: E501
}


class _ScrapeTime:
    """Series computed when scraped: the log's size and last sequence, corrupt records,
    how retention cuts fare, and the pod resources counts."""

    def __init__(
        self,
        metrics: Metrics,
        log_bytes: Callable[[], int],
        last_seq: Callable[[], int],
        corrupt: Callable[[], int],
        retention: Callable[[], CutHealth],
    ) -> None:
        self._metrics = metrics
        self._log_bytes = log_bytes
        self._last_seq = last_seq
        self._corrupt = corrupt
        self._retention = retention

    def collect(self) -> Iterable[Metric]:
        for name, help_ in _POD_RESOURCES_HELP.items():
            family = Metric(name, _alpha(help_), "counter")
            prefix = f"{name}\0"
            for key, value in sorted(self._metrics.pod_resources.items()):
                if key.startswith(prefix):
                    family.add_sample(name, {"server_api_version": key[len(prefix) :]}, value)
            yield family
        try:
            size = self._log_bytes()
        except OSError:
            size = 0
        yield GaugeMetricFamily(
            "eventsrc_log_bytes", "Size of the event log on disk (LMDB data file), in bytes.", value=size
        )
        yield GaugeMetricFamily(
            "eventsrc_log_last_sequence", "Sequence number of the last committed record.", value=self._last_seq()
        )
        yield GaugeMetricFamily(
            "eventsrc_log_corrupt_records",
            "Records known to be corrupt (left in place, skipped by replay).",
            value=self._corrupt(),
        )
        health = self._retention()
        yield GaugeMetricFamily(
            "eventsrc_log_retention_failing",
            "1 while the log's retention cuts fail (the live log grows past its bound), else 0.",
            value=1 if health.failing else 0,
        )
        yield CounterMetricFamily(
            "eventsrc_log_retention_failures",
            "Retention cuts that failed since the start (tried again with a pause that doubles, up to 60 s).",
            value=health.failures,
        )


class _Fleet:
    """Fleet shipping's series, when it is configured (``serve --fleet-nats``)."""

    def __init__(self, fleet: Callable[[], tuple[ShippingReport, int] | None]) -> None:
        self._fleet = fleet

    def collect(self) -> Iterable[Metric]:
        asked = self._fleet()
        if asked is None:
            return
        report, now_ns = asked
        yield GaugeMetricFamily(
            "eventsrc_fleet_connected",
            "1 while fleet shipping is connected to JetStream, else 0 (the node goes on without it).",
            value=1 if report.state == "connected" else 0,
        )
        yield GaugeMetricFamily(
            "eventsrc_fleet_diverged",
            "1 while the stream's last record of this log is not the log's (nothing is shipped), else 0.",
            value=1 if report.state == "diverged" else 0,
        )
        yield GaugeMetricFamily(
            "eventsrc_fleet_shipped_sequence",
            "The highest sequence up to which JetStream acknowledged every record of the log.",
            value=report.shipped_seq,
        )
        yield GaugeMetricFamily(
            "eventsrc_fleet_lag_records",
            "Records of the log not acknowledged by JetStream yet.",
            value=report.lag_records,
        )
        yield GaugeMetricFamily(
            "eventsrc_fleet_lag_seconds",
            "Seconds since the oldest record not acknowledged by JetStream yet was written (0: none).",
            value=report.lag_seconds(now_ns),
        )


ALLOCATION_LABELS = ("resource", "device", "namespace", "pod", "container")


def device_allocations(views: Views) -> Iterator[tuple[str, str, str, str, str]]:
    """(resource, device, namespace, pod, container) of every device held now: eventsrc's own
    grants (``views.pods``) and, beside a kubelet, what it observed the kubelet give
    (``views.kubelet``; a DRA claim's device as resource = its driver, device = ``pool/device``)."""
    for pod in views.pods.pods.values():
        for cname, c in pod.containers.items():
            for resource, ids in c.devices.items():
                for i in ids:
                    yield resource, i, pod.namespace, pod.name, cname
    for opod in views.kubelet.pods.values():
        for cname, oc in opod.containers.items():
            for resource, held in oc.devices.items():
                for i in held:
                    yield resource, i, opod.namespace, opod.name, cname
            for devices in oc.claims.values():
                for d in devices:
                    yield d.driver, claim_device_id(d), opod.namespace, opod.name, cname


class _Allocations:
    """``eventsrc_device_allocation_info``, as kube-state-metrics writes its ``_info`` series:
    1 per device held now, built from the views when scraped (nothing is kept per event)."""

    def __init__(self, views: Callable[[], Views]) -> None:
        self._views = views

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "eventsrc_device_allocation_info",
            "A device held now, by its pod's container (eventsrc's grants, or the kubelet's as observed beside it).",
            labels=list(ALLOCATION_LABELS),
        )
        for series in sorted(set(device_allocations(self._views()))):
            family.add_metric(list(series), 1)
        yield family


def go_float(value: float) -> str:
    """``value`` as Go's ``strconv.FormatFloat(v, 'g', -1, 64)`` writes it (Go's text encoder
    does): "1" and "0.005", not Python's "1.0"; "1e+06" from a million on. A histogram's
    ``le`` labels must read the same as the kubelet's for queries that join them."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    d = Decimal(repr(float(value))).normalize()
    sign, digits, exponent = d.as_tuple()
    assert isinstance(exponent, int)
    x = len(digits) + exponent - 1  # the decimal exponent of the first digit
    if -4 <= x < 6:
        return format(d, "f")
    mantissa = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'+' if x >= 0 else '-'}{abs(x):02d}"


def _label(key: str, value: str) -> str:
    if key == "le":
        value = go_float(float(value))
    return f'{key}="{_escape(value, quote=True)}"'


def _escape(value: str, quote: bool) -> str:
    value = value.replace("\\", r"\\").replace("\n", r"\n")
    return value.replace('"', r"\"") if quote else value


def exposition(families: Iterable[Metric]) -> bytes:
    """The text format as Go's client writes it: a counter's HELP and TYPE name is the
    sample's (``..._total``, or the kubelet's names without it), no ``_created`` series,
    and a labelled series appears once it has a child."""
    out: list[str] = []
    for family in families:
        created = family.name + "_created"
        samples = [s for s in family.samples if s.name != created]
        if not samples:
            continue
        name = samples[0].name if family.type == "counter" else family.name
        out.append(f"# HELP {name} {_escape(family.documentation, quote=False)}\n# TYPE {name} {family.type}\n")
        for s in samples:
            labels = ",".join(_label(k, v) for k, v in s.labels.items())
            out.append(f"{s.name}{{{labels}}} {go_float(s.value)}\n" if labels else f"{s.name} {go_float(s.value)}\n")
    return "".join(out).encode()


# -------------------------------------------------------------------- HTTP

Probe = Callable[[], str]  # "" when fine, else the reason


class Exposes(Protocol):
    """What /metrics serves: the daemon's ``Metrics``, or another process's series."""

    def exposition(self) -> bytes: ...


class HealthApp:
    """The ASGI application: /metrics, /healthz and /readyz, GET or HEAD."""

    def __init__(self, metrics: Exposes, live: Probe, ready: Probe, warn: Probe = lambda: "") -> None:
        self.metrics = metrics
        self.live = live
        self.ready = ready
        self.warn = warn  # what /healthz says after its "ok": needs an operator, not a restart

    def answer(self, path: str) -> tuple[int, bytes, str]:
        if path == "/metrics":
            return 200, self.metrics.exposition(), CONTENT_TYPE
        if path in ("/healthz", "/readyz"):
            reason = (self.live if path == "/healthz" else self.ready)()
            if reason:
                return (500 if path == "/healthz" else 503), f"{reason}\n".encode(), "text/plain; charset=utf-8"
            warning = self.warn() if path == "/healthz" else ""
            body = f"ok\nwarning: {escape(warning)}\n".encode() if warning else b"ok"  # one line
            return 200, body, "text/plain; charset=utf-8"
        return 404, b"404 page not found\n", "text/plain; charset=utf-8"

    async def __call__(
        self, scope: dict[str, Any], receive: Callable[[], Any], send: Callable[[dict[str, Any]], Any]
    ) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["method"] not in ("GET", "HEAD"):
            status, body, content_type = 405, b"405 method not allowed\n", "text/plain; charset=utf-8"
        else:
            status, body, content_type = self.answer(scope["path"])
        headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


def _not_running_on(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Running on")  # hypercorn's "(CTRL + C to quit)": serve_http says it


_http_log = logging.getLogger("eventsrc.obs.metrics.http")
_http_log.addFilter(_not_running_on)


def _config(address: str) -> Any:
    from hypercorn.config import Config

    host, port = parse_address(address)
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.errorlog = _http_log
    config.accesslog = None
    config.include_server_header = False
    config.graceful_timeout = 1.0
    return config


def check_address(address: str) -> None:
    """Refuse, in one line, an address that is malformed or cannot be bound (before any task
    starts); warn when the network can reach it."""
    try:
        for sock in _config(address).create_sockets().insecure_sockets:
            sock.close()
    except OSError as err:
        raise MetricsAddressError(f"cannot serve metrics on {address}: {err.strerror or err}") from None
    host, _ = parse_address(address)
    if not is_loopback(host):
        log.warning(
            "the metrics endpoint is reachable from the network (there is no authentication)",
            address=address,
            local_example=DEFAULT_METRICS_ADDRESS,
        )


async def serve_http(
    app: HealthApp, address: str, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve ``app`` on ``address`` (HOST:PORT; port 0 picks a free one) until cancelled.
    Started with the address actually bound (``check_address`` first for a clear error)."""
    from hypercorn.trio import serve

    config = _config(address)
    async with trio.open_nursery() as nursery:
        binds: Sequence[str] = await nursery.start(partial(serve, app, config, mode="asgi"))  # type: ignore[arg-type]
        bound = binds[0].removeprefix("http://")
        log.info("serving metrics", address=bound, paths="/metrics,/healthz,/readyz")
        task_status.started(bound)
