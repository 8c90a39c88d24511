"""Issue 39, item 4: a site's leaf node, as docs/fleet.md's "Deploying" sets it up. A three-server
JetStream cluster in the domain ``region`` listens for leaf nodes; the site's leaf (a nats-server
without JetStream, ``default_js_domain`` the cluster's) connects to it through a link of the
test's own; two daemons of the site ship to the leaf; a sink reads from the cluster into
PostgreSQL. The link is cut while the nodes ship, and restored, more than once. Afterwards the
stream holds each node's every record once, and so does PostgreSQL.

``EVENTSRC_LEAF_CUTS`` (default 2) is how many times the link is cut and restored."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Daemon, run_cli
from tests.fleet.test_fleet_acceptance import stored_seqs
from tests.fleet.test_shipping import log_records, shipped
from tests.support.eventually import eventually
from tests.support.fleet_sink import sink_process
from tests.support.nats import Link, NatsCluster, NatsLeaf
from tests.support.postgres import PostgresServer

CUTS = int(os.environ.get("EVENTSRC_LEAF_CUTS", "2"))
DOMAIN = "region"
NODES = ("site-a-1", "site-a-2")


class Site:
    """The region's cluster, the site's leaf and the link between them."""

    def __init__(self, base: Path) -> None:
        self.cluster = NatsCluster(base, 3, domain=DOMAIN, leafnodes=True)
        self.link: Link | None = None
        self.leaf: NatsLeaf | None = None

    def start(self) -> None:
        self.link = Link(self.cluster.leafnode_addresses)
        self.cluster.behind(self.link)  # the members advertise the link to leaf nodes, not themselves
        self.cluster.start()
        self.leaf = NatsLeaf(self.cluster.servers[0].directory.parent, remotes=self.link.urls, domain=DOMAIN)
        self.leaf.start()
        eventually(self.leaf.linked, "the leaf linked to the cluster", context=self.leaf.log_tail)

    def stop(self) -> None:
        if self.leaf is not None:
            self.leaf.stop()
        if self.link is not None:
            self.link.close()
        self.cluster.stop()


@pytest.fixture
def site(nats_unavailable: str | None, tmp_path: Path) -> Iterator[Site]:
    if nats_unavailable is not None:
        pytest.skip(nats_unavailable)
    made = Site(tmp_path / "nats")
    try:
        made.start()
        yield made
    finally:
        made.stop()


@pytest.fixture
def roots() -> Iterator[list[Path]]:
    """A root per node, with short paths (unix sockets allow 107 bytes)."""
    made = [Path(tempfile.mkdtemp(prefix="es-", dir="/tmp")) for _ in NODES]
    yield [d / "root" for d in made]
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


class Node:
    """A daemon of the site shipping to its leaf; pods admitted and removed through the CLI."""

    def __init__(self, name: str, root: Path, leaf_url: str, manifests: Path) -> None:
        self.name, self.root, self.manifests = name, root, manifests
        self.daemon = Daemon(root, "--fleet-nats", leaf_url, "--fleet-replicas", "3", "--node-name", name)
        self.n = 0

    def work(self, pods: int) -> None:
        """``pods`` pods admitted, and every other one removed again."""
        for _ in range(pods):
            self.n += 1
            uid = f"{self.name}-uid-{self.n}"
            manifest = self.manifests / f"{self.name}-{self.n}.yaml"
            manifest.write_text(
                f"kind: Pod\nmetadata: {{name: p{self.n}, uid: {uid}}}\nspec: {{containers: [{{name: a}}]}}\n"
            )
            run_cli("admit", "-f", str(manifest), root=self.root, check=True)
            if self.n % 2 == 0:
                run_cli("remove", uid, root=self.root, check=True)

    def shipping(self, state: str, what: str) -> None:
        """Wait until the node's ``status`` says its shipping is in ``state``."""

        def now() -> str:
            return str(json.loads(run_cli("status", "-o", "json", root=self.root, check=True).stdout)["fleet"]["state"])

        self.daemon.eventually(lambda: now() == state, f"{self.name} {what}")

    def records(self) -> list[tuple[int, str]]:
        return log_records(self.root)

    def stop(self) -> None:
        if self.daemon.proc.poll() is None:
            self.daemon.stop()


def on_stream(url: str) -> dict[str, list[tuple[int, str]]]:
    """Each node's messages on the stream, in the stream's order: (sequence, type)."""
    out: dict[str, list[tuple[int, str]]] = {}
    for seq, kind, node, _ in shipped(url):
        out.setdefault(node, []).append((seq, kind))
    return out


stored = stored_seqs  # each node's records in PostgreSQL, by sequence: (sequence, type)


def test_a_sites_leaf_cut_off_and_back_loses_and_doubles_nothing(
    site: Site, roots: list[Path], tmp_path: Path, postgres_server: PostgresServer
) -> None:
    assert site.leaf is not None and site.link is not None
    leaf, link, region = site.leaf, site.link, site.cluster.urls
    nodes: list[Node] = []
    try:
        nodes = [Node(name, root, leaf.url, tmp_path) for name, root in zip(NODES, roots, strict=True)]
        for node in nodes:
            node.work(2)

        def every_record_on_the_stream() -> bool:
            stream = on_stream(region[1])
            return all(stream.get(n.name) == n.records() for n in nodes)

        eventually(every_record_on_the_stream, "every record on the region's stream, through the leaf", timeout=60)
        with sink_process(tmp_path, ",".join(region), postgres_server.dsn) as sink:
            for cut in range(1, CUTS + 1):
                for node in nodes:
                    node.work(2)  # shipping as the link goes
                link.cut()
                eventually(lambda: not leaf.linked(), f"the leaf cut off ({cut})", context=leaf.log_tail)
                for node in nodes:
                    node.work(2)  # the site goes on working: its logs are the spool
                for node in nodes:
                    node.shipping("disconnected", f"cut off ({cut})")  # it tried, and saw the region gone
                link.restore()
                eventually(leaf.linked, f"the leaf linked again ({cut})", context=leaf.log_tail)
                for node in nodes:
                    node.work(1)
            for node in nodes:
                node.shipping("connected", "shipping again")

            # every record of each node's log on the stream once, in order, and in PostgreSQL once
            eventually(every_record_on_the_stream, "every record on the stream once, after the cuts", timeout=60)
            eventually(
                lambda: stored(postgres_server.dsn) == {n.name: n.records() for n in nodes},
                "every record in PostgreSQL once",
                timeout=60,
                stop=lambda: None if sink.alive() else sink.output(),
            )
            assert sink.alive(), sink.output()
        for node in nodes:
            assert "fleet shipping disconnected" in node.daemon.output()  # the cut was seen where it ships
            assert len(node.records()) > 4 * (CUTS + 1)
    finally:
        for node in nodes:
            node.stop()
