"""A real nats-server with JetStream of one's own: fetched once, started under a directory, ended by
pid. ``eventsrc bench fleet`` runs it, and so do the tests (``tests/support/nats.py``).

Nothing is installed system-wide. ``fetch()`` downloads Debian 12's ``nats-server`` (2.9.10, one
binary) through the private apt configuration of ``testbed.servers.debian_packages`` and unpacks it
with ``dpkg -x`` into the cache (env ``EVENTSRC_NATS_CACHE``, default
``/var/cache/eventsrc-tests/nats``), reused once complete, without network::

    python -m testbed.servers.nats_server fetch [--cache DIR]

``NatsServer(base)`` runs one server on loopback ports with its configuration, log and JetStream
storage under ``base/<name>``; ``NatsCluster(base, 3)`` runs three, routed to each other as one
JetStream cluster::

    server = NatsServer(tmp_path)   # extra_config="authorization { ... }": users and permissions
    server.start()                  # returns once /healthz says ok
    server.url                      # "nats://127.0.0.1:PORT", the same after a restart
    server.restart()                # SIGTERM, then the same ports and storage again
    server.kill()                   # SIGKILL
    server.stop()

    cluster = NatsCluster(tmp_path, 3)
    cluster.start()                 # returns once every server knows the metadata leader
    cluster.servers[0].restart()
    cluster.stop()

A site's leaf node (docs/fleet.md, "Deploying"): the cluster in a JetStream domain, listening for
leaf nodes; a ``Link`` of its own between them that can be cut and restored; a leaf without
JetStream whose remote is the link, its clients' JetStream API sent to the cluster's domain::

    cluster = NatsCluster(tmp_path, 3, domain="region", leafnodes=True)
    link = Link(cluster.leafnode_addresses)    # a TCP relay per server, on loopback ports
    cluster.behind(link)            # each member advertises its relay's address to leaf nodes
    cluster.start()
    leaf = NatsLeaf(tmp_path, remotes=link.urls, domain="region")
    leaf.start()                    # returns once /healthz says ok
    leaf.linked()                   # whether its link to the cluster is up (/leafz)
    link.cut()                      # every connection through it closed, its ports refusing
    link.restore()                  # listening again on the same ports: the leaf connects again

Ports are free loopback ports chosen at the first start and kept for restarts (a server's routes
name its peers' ports); a first start that finds its port taken meanwhile picks others. Only the
processes a harness started are signalled, by their pid.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.servers import debian_packages, server_process
from testbed.servers.debian_packages import FetchError
from testbed.servers.server_process import eventually, eventually_up

DEFAULT_CACHE = Path("/var/cache/eventsrc-tests/nats")
CACHE_ENV = "EVENTSRC_NATS_CACHE"
# (package, suite): the machine's own Debian 12; JetStream clustering and Nats-Msg-Id are older than 2.9.
PACKAGES = (("nats-server", "bookworm"),)
STAMP_VERSION = 1
HOST = "127.0.0.1"
CLUSTER_NAME = "eventsrc-test"
FIRST_START_TRIES = 3  # a free port taken by someone else between its choice and the server's bind


# ---------------------------------------------------------------------------------------------
# Fetch


class Fetched(debian_packages.Unpacked):
    """A complete cache: the unpacked package under ``root``."""

    @property
    def nats_server(self) -> Path:
        return self.root / "usr/sbin/nats-server"

    def required(self) -> list[Path]:
        return [self.nats_server]


def _check(fetched: Fetched, _progress: Callable[[str], None]) -> None:
    if not fetched.nats_server.exists():
        raise FetchError(f"{fetched.nats_server.relative_to(fetched.cache)} is not in the package")
    debian_packages.run([fetched.nats_server, "--version"], "nats-server --version", timeout=30)


ARCHIVE = debian_packages.Packages(
    Fetched, PACKAGES, version=STAMP_VERSION, default_cache=DEFAULT_CACHE, cache_env=CACHE_ENV, finish=_check
)
fetch = ARCHIVE.fetch  # fetch(cache=None, progress=...): the unpacked nats-server; FetchError (one line)
fetched_or_error = ARCHIVE.fetched_or_error  # fetch() once per process: the result or the one-line error


def why_unavailable(cache: Path | None = None) -> str | None:
    """One line saying why a real nats-server cannot be run here, or None."""
    outcome = fetched_or_error(cache)
    if isinstance(outcome, str):
        return f"nats-server fetch failed: {outcome}"
    return None


# ---------------------------------------------------------------------------------------------
# One server


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free now (bound together, then released)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass(frozen=True)
class Ports:
    client: int
    monitor: int
    cluster: int
    leafnodes: int = 0  # listening for leaf nodes (``leafnodes=True``); 0: not


def _conf(value: str | Path) -> str:
    return json.dumps(str(value))  # a quoted string of nats-server's configuration is a JSON string


class NatsServer(server_process.Server):
    """One nats-server with JetStream (configuration, log and storage under ``base/name``).
    ``peers`` (set by ``NatsCluster``) makes it a member of a cluster routed to them."""

    def __init__(
        self,
        base: Path,
        *,
        name: str = "nats-1",
        fetched: Fetched | None = None,
        extra_config: str = "",
        domain: str = "",
        leafnodes: bool = False,
    ) -> None:
        self.directory = Path(base) / name
        #: appended to the server's configuration (an ``authorization`` block: docs/fleet.md, "NATS
        #: permissions"); ``ready()`` asks the monitoring port, which it does not concern
        self.extra_config = extra_config
        #: the JetStream domain ("": none), and whether it listens for leaf nodes (``leafnode_address``)
        self.domain = domain
        self.leafnodes = leafnodes
        #: the "HOST:PORT" it advertises to leaf nodes as its leaf node address ("": its own)
        self.leafnode_advertise = ""
        super().__init__(name, self.directory / "nats.log")
        self.store_dir = self.directory / "store"  # nats-server keeps its streams under store/jetstream
        self.config_path = self.directory / "nats.conf"
        self.peers: Sequence[NatsServer] = ()
        self.ports: Ports | None = None
        self._fetched = fetched
        self._started_once = False

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self._ports.client}"

    @property
    def monitor_url(self) -> str:
        return f"http://{HOST}:{self._ports.monitor}"

    @property
    def leafnode_address(self) -> tuple[str, int]:
        """Where it listens for leaf nodes (``leafnodes=True``)."""
        if not self._ports.leafnodes:
            raise RuntimeError(f"{self.name} does not listen for leaf nodes")
        return HOST, self._ports.leafnodes

    @property
    def _ports(self) -> Ports:
        if self.ports is None:
            raise RuntimeError(f"{self.name} has not been started")
        return self.ports

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, timeout: float = 30) -> None:
        """Start the server (nothing when it runs) and wait until it answers ``ready()``."""
        self.launch()
        self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the server without waiting for it (a cluster starts all its members first).
        A first start whose port was taken meanwhile is tried again on other ports."""
        if self.running():
            return
        for attempt in range(1, FIRST_START_TRIES + 1):
            if self.ports is None:
                self.ports = self._free_ports()
            self._spawn()
            if self._started_once or attempt == FIRST_START_TRIES or not self._lost_its_port():
                return
            self.ports = None

    def choose_ports(self) -> Ports:
        """Its loopback ports, chosen now when not yet: a ``Link`` to its leaf node port is made
        before it starts (to advertise the link's address)."""
        if self.ports is None:
            self.ports = self._free_ports()
        return self.ports

    def _free_ports(self) -> Ports:
        client, monitor, cluster, leafnodes = free_ports(4)
        return Ports(client, monitor, cluster, leafnodes if self.leafnodes else 0)

    def _lost_its_port(self) -> bool:
        """Whether the process just spawned exited because a port it was given is in use (it
        exits at once then; once it says it is ready, it has every port)."""
        try:
            eventually(
                lambda: self.exited() is not None or "Server is ready" in self.this_start_log(),
                f"{self.name} to listen or exit",
                timeout=10,
                interval=0.02,
            )
        except AssertionError:
            return False
        return self.exited() is not None and "address already in use" in self.this_start_log()

    def _spawn(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self._config())
        fetched = self._fetched or ARCHIVE.fetched()
        self.spawn([fetched.nats_server, "--config", self.config_path])

    def _config(self) -> str:
        ports = self._ports
        lines = [
            f"server_name: {_conf(self.name)}",
            f"host: {_conf(HOST)}",
            f"port: {ports.client}",
            f"http: {_conf(f'{HOST}:{ports.monitor}')}",
            *self._role_config(),
        ]
        if self.leafnodes:
            # A leaf connects to what the members advertise (their own address, always: no_advertise
            # only keeps the others'): the Link's address when there is one, so that a cut stays cut.
            listen = _conf(f"{HOST}:{ports.leafnodes}")
            advertise = f", advertise: {_conf(self.leafnode_advertise)}" if self.leafnode_advertise else ""
            lines.append(f"leafnodes {{ listen: {listen}{advertise} }}")
        if self.peers:
            # Every member names every member (itself too: a server ignores a route to itself).
            routes = ", ".join(_conf(f"nats-route://{HOST}:{p._ports.cluster}") for p in self.peers)
            listen = _conf(f"{HOST}:{ports.cluster}")
            lines.append(f"cluster {{ name: {_conf(CLUSTER_NAME)}, listen: {listen}, routes: [{routes}] }}")
        if self.extra_config:
            lines.append(self.extra_config)
        return "\n".join(lines) + "\n"

    def _role_config(self) -> list[str]:
        domain = f", domain: {_conf(self.domain)}" if self.domain else ""
        return [f"jetstream {{ store_dir: {_conf(self.store_dir)}{domain} }}"]

    def wait_ready(self, timeout: float = 30) -> None:
        what = f"{self.name} to be ready (/healthz ok, a JetStream metadata leader in a cluster)"
        eventually_up(self, self.ready, what, timeout)
        self._started_once = True

    def ready(self) -> bool:
        """/healthz says ok and, in a cluster, this server knows the JetStream metadata leader."""
        if self._monitor("/healthz").get("status") != "ok":
            return False
        return not self.peers or bool(self.jsz().get("meta_cluster", {}).get("leader"))

    def _monitor(self, path: str) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(self.monitor_url + path, timeout=2) as answer:
                got: dict[str, Any] = json.load(answer)
                return got
        except (OSError, ValueError):  # not listening yet, or an HTTP error status
            return {}

    def jsz(self) -> dict[str, Any]:
        """The monitoring endpoint's JetStream report (``{}`` when it does not answer)."""
        return self._monitor("/jsz")

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM (a clean shutdown) and wait; SIGKILL after ``timeout`` s. Idempotent."""
        self.end(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL, as a crash: JetStream recovers its storage at the next start."""
        self.end(signal.SIGKILL)

    def restart(self, timeout: float = 30) -> None:
        """Stop, then start again on the same ports with the same storage."""
        self.stop()
        self.start(timeout)


# ---------------------------------------------------------------------------------------------
# A cluster


class NatsCluster:
    """``size`` nats-servers (``nats-1`` ...) under ``base``, routed to each other as one
    JetStream cluster; each can be stopped, killed and restarted on its own."""

    def __init__(
        self, base: Path, size: int = 3, *, fetched: Fetched | None = None, domain: str = "", leafnodes: bool = False
    ) -> None:
        self.servers = [
            NatsServer(base, name=f"nats-{i}", fetched=fetched, domain=domain, leafnodes=leafnodes)
            for i in range(1, size + 1)
        ]
        ports = free_ports(4 * size)
        for i, server in enumerate(self.servers):
            client, monitor, cluster, leaf = ports[4 * i : 4 * i + 4]
            server.ports = Ports(client, monitor, cluster, leaf if leafnodes else 0)
            server.peers = self.servers

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    @property
    def pids(self) -> list[int]:
        return [pid for s in self.servers for pid in s.pids]

    @property
    def leafnode_addresses(self) -> list[tuple[str, int]]:
        """Where each member listens for leaf nodes (``leafnodes=True``)."""
        return [s.leafnode_address for s in self.servers]

    def behind(self, link: Link) -> None:
        """Each member advertises the link's address for it to leaf nodes (before ``start()``)."""
        for server, port in zip(self.servers, link.ports, strict=True):
            server.leafnode_advertise = f"{HOST}:{port}"

    def server(self, name: str) -> NatsServer:
        return next(s for s in self.servers if s.name == name)

    def start(self, timeout: float = 30) -> None:
        """Start every member, then wait until each knows the metadata leader."""
        try:
            for server in self.servers:
                server.launch()
            for server in self.servers:
                server.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


# ---------------------------------------------------------------------------------------------
# A site's leaf node


class NatsLeaf(NatsServer):
    """A leaf node of a site (docs/fleet.md, "Deploying"): a nats-server without JetStream of its
    own whose ``leafnodes`` remote is the cluster (``remotes``: ``nats-leaf://`` URLs of its
    members' leaf node ports, or of a ``Link`` to them). Its clients' JetStream API (``$JS.API``)
    is sent to the cluster's JetStream ``domain`` (``default_js_domain``): nats-server denies the
    plain ``$JS.API`` across a leaf node connection, not ``$JS.<domain>.API``."""

    def __init__(
        self, base: Path, *, remotes: Sequence[str], domain: str, name: str = "leaf-a", fetched: Fetched | None = None
    ) -> None:
        super().__init__(base, name=name, fetched=fetched, domain=domain)
        self.remotes = list(remotes)

    def _role_config(self) -> list[str]:
        urls = ", ".join(map(_conf, self.remotes))
        return [
            # the leaf retries its remote every second (nats-server's default, said here)
            f"leafnodes {{ reconnect: 1, remotes = [ {{ urls: [{urls}] }} ] }}",
            f"default_js_domain: {{ {_conf('$G')}: {_conf(self.domain)} }}",
        ]

    def ready(self) -> bool:
        return self._monitor("/healthz").get("status") == "ok"

    def linked(self) -> bool:
        """Whether its leaf node connection to the cluster is up (the monitoring port's /leafz)."""
        return bool(self._monitor("/leafz").get("leafnodes"))


class Link:
    """The network between a site's leaf and the cluster, of one's own: a TCP relay on a loopback
    port for each of ``targets`` (the members' leaf node addresses), its bytes copied both ways as
    they come. ``cut()`` closes every connection through it and its listening sockets, so the leaf
    and the cluster see their connection close and the leaf's attempts to connect again are
    refused; ``restore()`` listens again on the same ports. Threads of this process, no server."""

    def __init__(self, targets: Sequence[tuple[str, int]]) -> None:
        self.targets = list(targets)
        self.ports = [0] * len(self.targets)
        self._lock = threading.Lock()
        self._listeners: list[socket.socket] = []
        self._connections: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._up = threading.Event()
        self.restore()

    @property
    def urls(self) -> list[str]:
        return [f"nats-leaf://{HOST}:{port}" for port in self.ports]

    def restore(self) -> None:
        """Listen (again, on the same ports) and relay each connection to its target."""
        if self._up.is_set():
            return
        self._threads = [t for t in self._threads if t.is_alive()]
        self._up.set()
        for i, target in enumerate(self.targets):
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((HOST, self.ports[i]))
            listener.listen(16)
            listener.settimeout(0.1)  # so that the accepting thread sees a cut
            self.ports[i] = listener.getsockname()[1]
            self._listeners.append(listener)
            self._thread(self._accept, listener, target)

    def cut(self) -> None:
        """Close every connection through the link and stop listening: nothing passes, and a
        connection attempt is refused, until ``restore()``."""
        self._up.clear()
        with self._lock:
            listeners, self._listeners = self._listeners, []
            connections, self._connections = self._connections, set()
        for s in listeners:
            s.close()
        for s in connections:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        for t in self._threads:
            t.join(timeout=5)

    close = cut

    def _thread(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name="nats-link")
        self._threads.append(thread)
        thread.start()

    def _accept(self, listener: socket.socket, target: tuple[str, int]) -> None:
        while self._up.is_set():
            try:
                near, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by cut()
            try:
                far = socket.create_connection(target, timeout=5)
            except OSError:
                near.close()  # the member is down: as a refused connection would be
                continue
            near.settimeout(None)
            far.settimeout(None)
            with self._lock:
                if not self._up.is_set():
                    near.close()
                    far.close()
                    return
                self._connections.update((near, far))
            self._thread(self._pump, near, far)
            self._thread(self._pump, far, near)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Copy ``source`` to ``sink`` until either closes; then close both."""
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        with self._lock:
            self._connections.difference_update((source, sink))
        source.close()
        sink.close()


def main(argv: Iterable[str] | None = None) -> int:
    return ARCHIVE.command("python -m testbed.servers.nats_server", argv)


if __name__ == "__main__":
    sys.exit(main())
