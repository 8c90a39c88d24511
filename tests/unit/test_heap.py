"""The heap given back after large answers (``node.heap``): one trim once the daemon has been
quiet for ``QUIET_SECONDS`` after the last large answer, none for small answers or while
idle; and the servers' codec tells the trimmer every answer's length. On trio's MockClock
with autojump: nothing waits for real."""

from __future__ import annotations

from collections.abc import Callable

import trio
import trio.testing

from eventsrc.gen.podresources.v1 import api_pb2 as pb
from eventsrc.node.heap import LARGE_BYTES, QUIET_SECONDS, HeapTrimmer, malloc_trim
from eventsrc.rpc.limits import BoundedCodec, PreEncoded


class Trims:
    """A trim function that records the (mock) time of each call."""

    def __init__(self) -> None:
        self.at: list[float] = []
        self.done = trio.Event()

    def __call__(self) -> None:
        self.at.append(trio.current_time())
        self.done.set()


async def on_the_loop(fn: Callable[[], object]) -> object:
    """The trim run on the loop rather than in a thread: the mock clock cannot jump past it."""
    await trio.lowlevel.checkpoint()
    return fn()


async def test_one_trim_once_quiet_after_the_last_large_answer(autojump_clock: trio.testing.MockClock) -> None:
    trims = Trims()
    trimmer = HeapTrimmer(trims, quiet=QUIET_SECONDS, in_thread=on_the_loop)
    async with trio.open_nursery() as nursery:
        await nursery.start(trimmer.run)
        start = trio.current_time()
        trimmer.sent(LARGE_BYTES)
        await trio.sleep(QUIET_SECONDS * 0.75)
        trimmer.sent(LARGE_BYTES + 1)  # a burst goes on: the quiet starts again
        last = trio.current_time()
        await trims.done.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert trims.at[0] >= last + QUIET_SECONDS > start + QUIET_SECONDS
        await trio.sleep(100 * QUIET_SECONDS)  # nothing sent since: no other trim
        assert len(trims.at) == trimmer.trims == 1
        trimmer.sent(LARGE_BYTES)
        await trio.sleep(2 * QUIET_SECONDS)
        assert trimmer.trims == 2
        nursery.cancel_scope.cancel()


async def test_small_answers_never_wake_it(autojump_clock: trio.testing.MockClock) -> None:
    trims = Trims()
    trimmer = HeapTrimmer(trims, in_thread=on_the_loop)
    async with trio.open_nursery() as nursery:
        await nursery.start(trimmer.run)
        for _ in range(1000):
            trimmer.sent(LARGE_BYTES - 1)
        await trio.sleep(100 * QUIET_SECONDS)
        assert trims.at == []
        trimmer.want()  # the start-up's rebuild: trimmed whatever was sent
        await trims.done.wait()
        await trio.testing.wait_all_tasks_blocked()
        assert trimmer.trims == 1
        nursery.cancel_scope.cancel()


async def test_without_glibc_nothing_runs(autojump_clock: trio.testing.MockClock) -> None:
    trimmer = HeapTrimmer(None)
    trimmer.sent(LARGE_BYTES)
    trimmer.want()
    with trio.fail_after(1):
        await trimmer.run()  # returns at once
    assert trimmer.trims == 0


def test_glibcs_trim_runs() -> None:
    trim = malloc_trim()
    assert trim is not None  # Debian: glibc
    trim()


def test_the_codec_tells_every_answers_length() -> None:
    seen: list[int] = []
    codec = BoundedCodec(on_encoded=seen.append)
    answer = pb.ListPodResourcesResponse(pod_resources=[pb.PodResources(name="a" * 300, namespace="default")])
    data = answer.SerializeToString()
    codec.encode(answer, pb.ListPodResourcesResponse)
    codec.encode(PreEncoded(pb.ListPodResourcesResponse, data * 2), pb.ListPodResourcesResponse)
    assert seen == [len(data), 2 * len(data)]
    codec.decode(data, pb.ListPodResourcesResponse)  # what it receives is not an answer
    assert seen == [len(data), 2 * len(data)]


def test_status_tells_the_trims() -> None:
    from eventsrc.api.node import status_response

    assert status_response(True, "i", 1, [], 1, heap_trims=3).heap_trims == 3
    assert status_response(True, "i", 1, [], 1).heap_trims == 0
