"""Tell systemd how the daemon is doing (``sd_notify``), without libsystemd.

Under a ``Type=notify`` unit (``deploy/eventsrc.service``) systemd sets ``NOTIFY_SOCKET``
to a unix datagram socket and waits for ``READY=1`` before it counts the service as
started. The protocol is one datagram of newline-separated ``KEY=VALUE`` lines; a name
starting with ``@`` is in the abstract namespace. Anywhere else (no ``NOTIFY_SOCKET``)
this does nothing.
"""

from __future__ import annotations

import os
import socket

from eventsrc.obs.logger import get_logger

_log = get_logger(__name__)


def notify(state: str) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to systemd; True if sent. Never raises: the
    daemon must run the same whether or not anyone listens."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        _log.warning("cannot notify systemd", socket=os.environ["NOTIFY_SOCKET"], state=state, error=str(exc))
        return False
    return True
