"""NATS JetStream, as the node's shipper and the fleet's sink both speak it: one connection at a
time to the first server that answers (nats-py on trio-asyncio's loop, ``to_aio``), the
stream made when missing, a user and password read from a file, the errors that mean the
server or the connection went away, and the server's refusal said as such (docs/fleet.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
import trio
from nats.js import JetStreamContext

from eventsrc.core.fleet_names import DEFAULT_PREFIX, DUPLICATE_WINDOW_S, stream_subjects
from eventsrc.inputs.secret_file import read_secret
from eventsrc.obs.logger import get_logger
from eventsrc.rpc.bridge import to_aio

log = get_logger(__name__)

#: the wait between connections, doubling (``core.backoff``)
BACKOFF_FIRST, BACKOFF_MAX = 0.25, 10.0
CONNECT_TIMEOUT = 5.0

#: what a NATS server or connection that went away raises; ValueError: the stream's last
#: message on this node's subject is not this log's (``fleet_names.acknowledged``)
FAILURES: tuple[type[BaseException], ...] = (
    ValueError,
    OSError,
    asyncio.TimeoutError,
    trio.TooSlowError,
    nats.errors.Error,
    nats.js.errors.Error,
)


@dataclass(frozen=True)
class NatsAuth:
    """A NATS user and its password (nats-py's ``user`` and ``password`` options), the password
    read from a file (docs/fleet.md, "NATS permissions"; ADR 0036)."""

    user: str
    password: str = field(repr=False)

    @classmethod
    def read(cls, user: str, password_file: Path, what: str = "--fleet-nats-password-file") -> NatsAuth:
        """The user with the password ``password_file`` holds; SecretFileError (one line) when
        the file cannot be used."""
        return cls(user, read_secret(password_file, what))


async def ensure_stream(js: JetStreamContext, stream: str, prefix: str = DEFAULT_PREFIX, replicas: int = 1) -> None:
    """The stream, created when missing (docs/fleet.md): every node's records, kept on disk in
    ``replicas`` copies, a message id stored once within the duplicate window. An existing
    stream is left as it is. An asyncio coroutine (``to_aio``)."""
    try:
        await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        config: dict[str, Any] = {
            "name": stream,
            "subjects": stream_subjects(prefix),
            "storage": "file",
            "duplicate_window": DUPLICATE_WINDOW_S,
            "num_replicas": replicas,
        }
        await js.add_stream(**config)
        log.info("fleet stream created", stream=stream, replicas=replicas)


#: how nats-py names the server's refusal of a publish or a subscription (``last_error``)
PERMISSIONS_VIOLATION = "permissions violation"


@contextmanager
def said_refused(nc: nats.NATS) -> Iterator[None]:
    """A timeout that follows the server's refusal of a publish (a permissions violation,
    docs/fleet.md "NATS permissions": the server answers nothing to a request it refused, and
    nats-py tells the error callback) is raised as that refusal, so that the reason said is
    the server's and not a timeout. The sink's; the shipper ends its session at the refusal."""
    try:
        yield
    except TimeoutError as exc:  # nats-py's and asyncio's are TimeoutError
        refused = nc.last_error
        if refused is not None and PERMISSIONS_VIOLATION in str(refused).lower():
            raise ConnectionError(f"the server refused: {refused}") from exc
        raise


async def _quiet(exc: Exception) -> None:
    """nats-py's error callback: what went wrong is said by whoever called, once."""


async def connect(
    servers: Sequence[str],
    closed: Callable[[], Awaitable[None]] | None = None,
    auth: NatsAuth | None = None,
    error: Callable[[Exception], Awaitable[None]] | None = None,
) -> nats.NATS:
    """One connection to the first of ``servers`` that answers, or an error within the connect
    timeout (nats-py alone would retry the servers for ever); it does not reconnect: the
    caller connects again, and resumes from the stream. ``closed``: an asyncio coroutine
    function, called when the connection closes (nats-py's ``closed_cb``). ``auth``: the user
    and password to connect as (None: none). ``error``: an asyncio coroutine function called
    with what the server says is wrong (nats-py's ``error_cb``; a permissions violation too).
    On trio-asyncio's loop; ``connect_aio`` is the same on any asyncio loop."""
    with trio.fail_after(connect_deadline(servers)):
        return await to_aio(connect_aio)(servers, closed, auth, error)


def connect_deadline(servers: Sequence[str]) -> float:
    """Seconds ``connect`` takes at most: each server's connect timeout, and one more."""
    return CONNECT_TIMEOUT * max(1, len(servers)) + 1


async def connect_aio(
    servers: Sequence[str],
    closed: Callable[[], Awaitable[None]] | None = None,
    auth: NatsAuth | None = None,
    error: Callable[[Exception], Awaitable[None]] | None = None,
) -> nats.NATS:
    """``connect``'s connection, made on the running asyncio loop (bounded by the caller)."""
    credentials: dict[str, str] = {} if auth is None else {"user": auth.user, "password": auth.password}
    nc: nats.NATS = await nats.connect(
        servers=list(servers),
        connect_timeout=CONNECT_TIMEOUT,
        allow_reconnect=False,
        max_reconnect_attempts=1,
        error_cb=error or _quiet,
        closed_cb=closed,
        **credentials,
    )
    return nc
