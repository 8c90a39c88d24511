"""The node API from the command line: one gRPC call over ROOT/eventsrc/api.sock.

The CLI needs no trio: a call is ``asyncio.run`` around a grpclib stub. Every failure
becomes one clear line (an EventsrcError).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from grpclib import GRPCError, Status
from grpclib.client import Channel

from eventsrc.errors import EventsrcError
from eventsrc.gen.node.v1.node_grpc import NodeStub
from eventsrc.layout import Layout

T = TypeVar("T")


class NotRunningError(EventsrcError):
    pass


class RefusedError(EventsrcError):
    """The daemon answered with an error status; the message is its reason."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        if status == Status.INVALID_ARGUMENT:
            self.exit_code = 2


def call(layout: Layout, fn: Callable[[NodeStub], Awaitable[T]], timeout: float = 120.0) -> T:
    """Run ``fn(stub)`` against the daemon on ``layout``; map every failure to one line."""
    sock = layout.api_socket

    async def run() -> T:
        channel = Channel(path=str(sock))
        try:
            return await asyncio.wait_for(fn(NodeStub(channel)), timeout)
        finally:
            channel.close()

    if not layout.root.is_dir():
        raise NotRunningError(f"root directory {layout.root} does not exist")
    if not sock.exists():
        raise NotRunningError(f"eventsrc is not running on {layout.root} (no {sock})")
    try:
        return asyncio.run(run())
    except GRPCError as err:
        raise RefusedError(err.status, err.message or err.status.name) from None
    except (ConnectionRefusedError, FileNotFoundError):
        raise NotRunningError(f"eventsrc is not running on {layout.root} ({sock} does not answer)") from None
    except PermissionError:
        raise EventsrcError(
            f"permission denied on {sock} (the node API socket is mode 0600: run as its owner)"
        ) from None
    except TimeoutError:
        raise EventsrcError(f"no answer from the daemon on {sock} within {timeout:g} s") from None
    except OSError as exc:
        raise NotRunningError(f"cannot reach the daemon on {sock}: {exc}") from None


def unary(method: str, request: Any) -> Callable[[NodeStub], Awaitable[Any]]:
    async def fn(stub: NodeStub) -> Any:
        return await getattr(stub, method)(request)

    return fn
