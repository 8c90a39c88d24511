"""The tests' real nats-server with JetStream: ``testbed.servers.nats_server`` (``eventsrc bench fleet``
runs it too), named here for the tests. ``NatsServer(base)`` is one server on loopback ports,
``NatsCluster(base, 3)`` three routed as one JetStream cluster, ``NatsLeaf`` a site's leaf node
and ``Link`` the network to it, cut and restored; each server is ended by pid. The cache is
filled ahead with::

    python -m tests.support.nats fetch [--cache DIR]
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass

from testbed.servers.nats_server import ARCHIVE, Link, NatsCluster, NatsLeaf, NatsServer, why_unavailable

__all__ = ["Link", "NatsCluster", "NatsLeaf", "NatsServer", "why_unavailable"]


# ---------------------------------------------------------------------------------------------
# Reading a stream


@dataclass(frozen=True)
class StoredMessage:
    headers: dict[str, str]
    data: bytes


#: reads of a stream that time out before one is answered: a cluster's server may not answer a
#: request within its 5 s while the stream's replicas elect a leader (the stream just made, a
#: server stopped), on a loaded machine
READS = 3


def stream_messages(url: str, stream: str, *, user: str = "", password: str = "") -> list[StoredMessage]:
    """Every message the stream holds, in its order ([] when there is no such stream);
    connected as ``user`` when one is given. A read that times out is made again, ``READS``
    times at most."""
    import asyncio

    import nats
    import nats.errors
    import nats.js.errors

    credentials = {"user": user, "password": password} if user else {}

    async def read() -> list[StoredMessage]:
        nc = await nats.connect(url, **credentials)
        try:
            js = nc.jetstream()
            try:
                info = await js.stream_info(stream)
            except nats.js.errors.NotFoundError:
                return []
            out = []
            for n in range(info.state.first_seq, info.state.last_seq + 1):
                m = await js.get_msg(stream, n)
                out.append(StoredMessage(dict(m.headers or {}), m.data or b""))
            return out
        finally:
            await nc.close()

    for _ in range(READS - 1):
        try:
            return asyncio.run(read())
        except nats.errors.TimeoutError:
            continue
    return asyncio.run(read())


def main(argv: Iterable[str] | None = None) -> int:
    return ARCHIVE.command("python -m tests.support.nats", argv)


if __name__ == "__main__":
    sys.exit(main())
