"""The tests' real PostgreSQL 15: ``testbed.servers.postgres_server`` (``eventsrc bench fleet`` runs it
too), named here for the tests. ``PostgresServer()`` is a server of its own on a new directory under
/tmp, on a unix socket only, as ``nobody`` when the tests run as root; ``cleanup()`` stops it by pid
and removes the directory. The cache is filled ahead with::

    python -m tests.support.postgres fetch [--cache DIR]
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from testbed.servers.postgres_server import ARCHIVE, PostgresServer, why_unavailable

__all__ = ["PostgresServer", "why_unavailable"]


def main(argv: Iterable[str] | None = None) -> int:
    return ARCHIVE.command("python -m tests.support.postgres", argv)


if __name__ == "__main__":
    sys.exit(main())
