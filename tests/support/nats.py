"""The tests' real nats-server with JetStream: ``eventsrc.bench.nats_server`` (``eventsrc bench fleet``
runs it too), named here for the tests. ``NatsServer(base)`` is one server on loopback ports,
``NatsCluster(base, 3)`` three routed as one JetStream cluster; each is ended by pid. The cache is
filled ahead with::

    python -m tests.support.nats fetch [--cache DIR]
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from eventsrc.bench.nats_server import ARCHIVE, NatsCluster, NatsServer, why_unavailable

__all__ = ["NatsCluster", "NatsServer", "why_unavailable"]


def main(argv: Iterable[str] | None = None) -> int:
    return ARCHIVE.command("python -m tests.support.nats", argv)


if __name__ == "__main__":
    sys.exit(main())
