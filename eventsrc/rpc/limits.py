"""What the daemon takes from a gRPC peer: the received-message limit (docs/adr/0012).

grpclib has no message size option on its Channel or Server. Every message it receives
goes through the codec it was given, whole, before anyone sees it; so the limit is a codec,
``BoundedCodec``, handed to every Channel and Server the daemon makes (``rpc.bridge``'s
``unix_channel`` and ``serve_unix``). It refuses a message over the limit with grpc-go's
status and words, and turns a message that is not a protobuf of the expected type into a
GRPCError, which every caller handles (``rpc.bridge.CALL_ERRORS``); on the server side the
peer gets that status.

The codec sees a message once grpclib has read all of it: an oversized message is refused
after it arrived, not from its 5-byte length prefix (docs/adr/0012 says what that costs).
"""

from __future__ import annotations

from typing import Any

from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.exceptions import GRPCError

#: The largest message the daemon takes from a peer: grpc-go's default receive limit, which
#: the kubelet keeps for its device-plugin client and its registration and PodResources
#: servers (none of them sets MaxRecvMsgSize).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class BoundedCodec(ProtoCodec):
    """grpclib's protobuf codec, refusing what a hostile peer may send.

    - A message longer than ``max_bytes`` is RESOURCE_EXHAUSTED, "received message larger
      than max (N vs. M)", as grpc-go says it.
    - Bytes that do not decode as the expected message are INTERNAL, "cannot decode the
      <type>: <protobuf's reason>".

    Encoding is grpclib's own (the content type stays ``application/grpc``).
    """

    def __init__(self, max_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.max_bytes = max_bytes

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
