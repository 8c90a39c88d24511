"""The fleet tests' real servers: a nats-server with JetStream, a three-server JetStream cluster,
a PostgreSQL server. Each fixture skips with one line where its server cannot be had, and stops
what it started."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import nats, postgres


@pytest.fixture(scope="session")
def nats_unavailable() -> str | None:
    """Why a real nats-server cannot run here (one line), or None; fetches it once per session
    (a no-op, without network, once the cache is complete)."""
    return nats.why_unavailable()


@pytest.fixture
def nats_server(nats_unavailable: str | None, tmp_path: Path) -> Iterator[nats.NatsServer]:
    """A started nats-server with JetStream, its storage under the test's directory."""
    if nats_unavailable is not None:
        pytest.skip(nats_unavailable)
    server = nats.NatsServer(tmp_path / "nats")
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_cluster(nats_unavailable: str | None, tmp_path: Path) -> Iterator[nats.NatsCluster]:
    """A started three-server JetStream cluster on loopback ports."""
    if nats_unavailable is not None:
        pytest.skip(nats_unavailable)
    cluster = nats.NatsCluster(tmp_path / "nats", 3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def postgres_unavailable() -> str | None:
    """Why a real PostgreSQL cannot run here (one line), or None; finds or fetches it once per
    session (a no-op, without network, once the cache is complete or where it is installed)."""
    return postgres.why_unavailable()


@pytest.fixture
def postgres_server(postgres_unavailable: str | None) -> Iterator[postgres.PostgresServer]:
    """A started PostgreSQL server of its own (``.dsn``), its directory removed afterwards."""
    if postgres_unavailable is not None:
        pytest.skip(postgres_unavailable)
    server = postgres.PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()
