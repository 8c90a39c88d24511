"""The codec of every gRPC channel and server the daemon makes: what it takes from a peer (the
received-message limit, docs/adr/0012) and how it sends an answer encoded beforehand.

grpclib has no message size option on its Channel or Server. Every message it receives
goes through the codec it was given, whole, before anyone sees it; so the limit is a codec,
``BoundedCodec``, handed to every Channel and Server the daemon makes (``rpc.bridge``'s
``unix_channel`` and ``serve_unix``). It refuses a message over the limit with grpc-go's
status and words, and turns a message that is not a protobuf of the expected type into a
GRPCError, which every caller handles (``rpc.bridge.CALL_ERRORS``); on the server side the
peer gets that status.

The codec sees a message once grpclib has read all of it: an oversized message is refused
after it arrived, not from its 5-byte length prefix (docs/adr/0012 says what that costs).

The codec also sends an answer encoded beforehand (``PreEncoded``, through ``send_encoded``)
as it is: the listings at 10,000 pods are megabytes, and serialising one whole held the
daemon's loop for 4-15 ms, where joining the pods' encodings kept from call to call costs
about one (``rpc.answer_cache.SeqCache``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError
from grpclib.server import Stream

#: The largest message the daemon takes from a peer: grpc-go's default receive limit, which
#: the kubelet keeps for its device-plugin client and its registration and PodResources
#: servers (none of them sets MaxRecvMsgSize).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

M = TypeVar("M")


class BoundedCodec(ProtoCodec):
    """grpclib's protobuf codec, refusing what a hostile peer may send.

    - A message longer than ``max_bytes`` is RESOURCE_EXHAUSTED, "received message larger
      than max (N vs. M)", as grpc-go says it.
    - Bytes that do not decode as the expected message are INTERNAL, "cannot decode the
      <type>: <protobuf's reason>".

    Encoding is grpclib's own (the content type stays ``application/grpc``), except for a
    ``PreEncoded`` message, whose bytes are sent as they are once its type is checked
    against the one the method sends.
    """

    def __init__(self, max_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.max_bytes = max_bytes

    def encode(self, message: Any, message_type: Any) -> bytes:
        if isinstance(message, PreEncoded):
            if message.message_type is not message_type:
                raise TypeError(f"Message must be of type {message_type!r}, not {message.message_type!r} (pre-encoded)")
            data = message.data
        else:
            data = super().encode(message, message_type)
        return data

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self.max_bytes:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED, f"received message larger than max ({len(data)} vs. {self.max_bytes})"
            )
        try:
            return message_type.FromString(data)
        except Exception as exc:  # protobuf's DecodeError, or its complaint about the type
            name = getattr(message_type, "__name__", "message")
            raise GRPCError(Status.INTERNAL, f"cannot decode the {name}: {exc}") from None


@dataclass(frozen=True, slots=True)
class PreEncoded(Generic[M]):
    """A message of type ``message_type`` encoded beforehand: ``data`` is what its
    ``SerializeToString`` would give. Only ``BoundedCodec`` knows how to send it."""

    message_type: type[M]
    data: bytes

    def decoded(self) -> M:
        decoded: M = cast(Any, self.message_type).FromString(self.data)
        return decoded


#: a message encoded beforehand this large is sent from a loop step after the one that made it
YIELD_BEFORE_BYTES = 256 * 1024


async def send_encoded(stream: Stream[Any, M], message: PreEncoded[M]) -> None:
    """``stream.send_message`` of a message encoded beforehand (the stream's server must have
    a ``BoundedCodec``; grpclib's own codec raises TypeError, as for any wrong type).

    A large one is sent from the next loop step: joining its parts (3.3 MB for ListPods at
    10,000 pods) and grpclib's copy of it with its prefix, each 1-3 ms, are not one step."""
    if len(message.data) >= YIELD_BEFORE_BYTES:
        await asyncio.sleep(0)
    await stream.send_message(cast(M, message))
