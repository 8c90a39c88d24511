"""A gRPC answer kept from call to call as its items' encodings (``SeqCache``): the
listings of PodResources' List (``api.podresources.ListCache``) and the node API's ListPods
(``api.node.PodsCache``), sent as they are (``rpc.codec.PreEncoded``, ``send_encoded``).

An answer whose one field set is a repeated message is the concatenation of its elements'
encodings (``element``), so each item is encoded once, when it changes, and the answer is a
join of bytes. The build is paced: it yields to the loop every few encodings, so that building a listing
of 10,000 pods is many short steps of the daemon's loop, not one long one (docs/adr/0028).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Generic, TypeVar

from google.protobuf.message import Message

from eventsrc.rpc.codec import PreEncoded
from eventsrc.state.views import Views

M = TypeVar("M", bound=Message)


#: Messages a paced build makes between two pauses (a few ms of work at most: at 500, a
#: chunk of List's took 8-16 ms of the loop on a busy machine).
CHUNK = 150
#: Pods a paced build looks at between two pauses when it builds none (a pass over 10,000
#: pods whose messages are kept took 5-15 ms).
VISITS = 2_000
#: Paced passes a build tries before it builds without pausing (records kept landing).
PACED_PASSES = 3


def element(field: int, message: Message) -> bytes:
    """``message`` encoded as one element of the repeated message field numbered ``field``:
    its key (wire type 2, length-delimited), its length, its bytes. A message whose only
    field set is that one is encoded as its elements' encodings one after the other, so an
    answer joined from elements kept per pod is what the whole answer's
    ``SerializeToString(deterministic=True)`` gives, byte for byte (maps by key)."""
    data = message.SerializeToString(deterministic=True)
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


async def _yield_to_loop() -> None:
    """Lets the loop run others: handlers are asyncio coroutines on trio-asyncio's loop, which
    passes through a trio checkpoint between two asyncio callbacks (``rpc.bridge``)."""
    await asyncio.sleep(0)


class SeqCache(Generic[M]):
    """An answer of type ``M`` kept per log sequence (``views.meta.last_seq``) as its items'
    encodings, built in chunks and kept from one answer to the next.

    ``_build`` sets ``_parts`` (the items' ``element`` encodings, in the answer's order) from
    one views state, yielding after every ``chunk`` encodings it had to build or ``visits``
    items it looked at. ``answer`` runs it through; ``answer_paced`` pauses at each yield so
    that the loop runs others meanwhile, and starts again when a record landed during a
    pause (the answer is always that of one sequence). After ``PACED_PASSES`` passes that
    records kept interrupting, it builds without pausing. Encodings built by an interrupted
    pass stay cached under their own keys: the next pass reuses those still current.

    The answer is ``PreEncoded``: the parts joined for each call and sent as they are
    (``rpc.codec``), so no whole message is made or serialised. The joined bytes live only
    while they are sent: kept, they would double what the cache holds (3.3 MB of ListPods
    at 10,000 pods), and the join costs about a millisecond."""

    #: encodings built between two yields (tests make it small)
    chunk = CHUNK
    #: items looked at between two yields
    visits = VISITS

    def __init__(self, message_type: type[M]) -> None:
        self._seq = -1
        self._type = message_type
        self._parts: list[bytes] = []
        self.passes = 0  # builds started (tests: an answer of a kept sequence builds nothing)

    def _build(self, views: Views) -> Iterator[None]:
        raise NotImplementedError

    def _joined(self) -> PreEncoded[M]:
        return PreEncoded(self._type, b"".join(self._parts))

    def answer(self, views: Views) -> PreEncoded[M]:
        seq = views.meta.last_seq
        if seq != self._seq:
            self.passes += 1
            for _ in self._build(views):
                pass
            self._seq = seq
        return self._joined()

    async def answer_paced(
        self, views: Callable[[], Views], pause: Callable[[], Awaitable[None]] = _yield_to_loop
    ) -> PreEncoded[M]:
        for _ in range(PACED_PASSES):
            v = views()
            seq = v.meta.last_seq
            if seq == self._seq:
                return self._joined()
            self.passes += 1
            for _ in self._build(v):
                await pause()
                if views() is not v or v.meta.last_seq != seq:
                    break  # a record landed: this pass would mix two states
            else:
                self._seq = seq
                return self._joined()
        return self.answer(views())
