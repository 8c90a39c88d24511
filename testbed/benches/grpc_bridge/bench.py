"""What does the trio-asyncio bridge cost grpclib on unary gRPC calls?

Usage::

    .venv/bin/python -m testbed.benches.grpc_bridge.bench [--calls N] [--rounds R]

One run starts every server kind below in its own subprocess, each listening
on a unix socket in a fresh temporary directory, and drives them all with the
same client: a *grpcio synchronous* stub (an independent implementation of
gRPC) running in this process, so client and server never share a GIL.

Server kinds:

  grpcio          grpcio's threaded server -- the ceiling, a bare gRPC round trip
  grpclib-asyncio grpclib on a plain ``asyncio.run`` loop
  grpclib-trio    the same grpclib server inside ``trio.run`` through
                  ``trio_asyncio.open_loop()``; ``Server.start(path=...)`` is
                  awaited through ``trio_asyncio.aio_as_trio`` and a trio
                  heartbeat task runs next to it -- the way eventsrc runs it
  grpclib-trio+call
                  as grpclib-trio, but every handler also awaits a trio
                  function through ``trio_asyncio.trio_as_aio`` (what the
                  daemon's real handlers do to reach trio-owned state)

Rounds are interleaved (every round visits every server, in a rotating order)
so that drift on a shared, noisy machine spreads over all kinds evenly.
Reported: calls/s (median over rounds), p50 and p99 latency in microseconds
(over all calls of all rounds), and ratios of the trio variants to
grpclib-asyncio and to grpcio.

The generated stubs (echo_pb2.py, echo_grpc.py, echo_pb2_grpc.py) live next
to this file; regenerate them with ``testbed/benches/grpc_bridge/gen.sh``.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # generated stubs import "echo_pb2" top-level

KINDS = ("grpcio", "grpclib-asyncio", "grpclib-trio", "grpclib-trio+call")
HEARTBEAT_S = 0.01


# --------------------------------------------------------------------------
# servers (each runs in its own subprocess: ``bench.py --serve KIND --socket P``)
# --------------------------------------------------------------------------


def serve_grpcio(path: str) -> None:
    from concurrent import futures

    import echo_pb2
    import echo_pb2_grpc
    import grpc

    class Echo(echo_pb2_grpc.EchoServicer):
        def Ping(self, request, context):
            return echo_pb2.PingReply(payload=request.payload)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    echo_pb2_grpc.add_EchoServicer_to_server(Echo(), server)
    server.add_insecure_port("unix:" + path)
    server.start()
    signal.sigwait({signal.SIGTERM})
    server.stop(grace=None)
    print("grpcio: stopped", flush=True)


def _grpclib_echo(call_trio: bool):
    """Build the grpclib servicer; must run with an asyncio loop current."""
    import echo_grpc
    import echo_pb2

    if call_trio:
        import trio
        import trio_asyncio

        async def touch_trio_state(payload: bytes) -> bytes:
            # stand-in for "look something up in trio-owned daemon state"
            await trio.lowlevel.checkpoint()
            return payload

        to_trio = trio_asyncio.trio_as_aio(touch_trio_state)

        class Echo(echo_grpc.EchoBase):
            async def Ping(self, stream):
                request = await stream.recv_message()
                payload = await to_trio(request.payload)
                await stream.send_message(echo_pb2.PingReply(payload=payload))

    else:

        class Echo(echo_grpc.EchoBase):
            async def Ping(self, stream):
                request = await stream.recv_message()
                await stream.send_message(echo_pb2.PingReply(payload=request.payload))

    return Echo()


def serve_grpclib_asyncio(path: str) -> None:
    import asyncio

    from grpclib.server import Server

    async def main() -> None:
        server = Server([_grpclib_echo(call_trio=False)])
        await server.start(path=path)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
    print("grpclib-asyncio: stopped", flush=True)


def serve_grpclib_trio(path: str, call_trio: bool, label: str) -> None:
    import trio
    import trio_asyncio
    from grpclib.server import Server

    ticks = 0

    async def heartbeat() -> None:
        # a trio task that keeps running while gRPC is served: proves the
        # trio scheduler is alive and adds realistic scheduling work
        nonlocal ticks
        while True:
            await trio.sleep(HEARTBEAT_S)
            ticks += 1

    async def main() -> None:
        async with trio_asyncio.open_loop():
            server = Server([_grpclib_echo(call_trio=call_trio)])
            await trio_asyncio.aio_as_trio(server.start)(path=path)
            started = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(heartbeat)
                with trio.open_signal_receiver(signal.SIGTERM) as signals:
                    async for _ in signals:
                        break
                nursery.cancel_scope.cancel()
            server.close()
            await trio_asyncio.aio_as_trio(server.wait_closed)()
            elapsed = trio.current_time() - started
        expected = elapsed / HEARTBEAT_S
        print(
            f"{label}: stopped; trio heartbeat ticked {ticks} times (at most ~{expected:.0f} possible)",
            flush=True,
        )

    trio.run(main)


def serve(kind: str, path: str) -> None:
    if kind == "grpcio":
        serve_grpcio(path)
    elif kind == "grpclib-asyncio":
        serve_grpclib_asyncio(path)
    elif kind == "grpclib-trio":
        serve_grpclib_trio(path, call_trio=False, label=kind)
    elif kind == "grpclib-trio+call":
        serve_grpclib_trio(path, call_trio=True, label=kind)
    else:
        raise SystemExit(f"unknown server kind {kind!r}")


# --------------------------------------------------------------------------
# client / driver
# --------------------------------------------------------------------------


def _block_sigterm() -> None:
    # in the grpcio child, so serve_grpcio can sigwait() for SIGTERM
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def start_server(kind: str, path: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--serve", kind, "--socket", path],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_block_sigterm if kind == "grpcio" else None,
    )


def connect(path: str, timeout: float = 20.0):
    import echo_pb2_grpc
    import grpc

    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"server socket {path} never appeared")
        time.sleep(0.02)
    channel = grpc.insecure_channel("unix:" + path, options=[("grpc.default_authority", "localhost")])
    grpc.channel_ready_future(channel).result(timeout=timeout)
    return channel, echo_pb2_grpc.EchoStub(channel)


def run_round(stub, request, calls: int) -> tuple[float, list[int]]:
    lat = [0] * calls
    clock = time.perf_counter_ns
    ping = stub.Ping
    t0 = clock()
    for i in range(calls):
        s = clock()
        ping(request)
        lat[i] = clock() - s
    wall = (clock() - t0) / 1e9
    return calls / wall, lat


def percentile(sorted_ns: list[int], q: float) -> float:
    idx = min(len(sorted_ns) - 1, max(0, round(q * (len(sorted_ns) - 1))))
    return sorted_ns[idx] / 1000.0  # -> microseconds


def versions() -> str:
    names = ("trio", "trio-asyncio", "grpclib", "grpcio", "protobuf", "h2")
    out = []
    for n in names:
        try:
            out.append(f"{n} {metadata.version(n)}")
        except metadata.PackageNotFoundError:
            out.append(f"{n} -")
    return ", ".join(out)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def bench(calls: int, rounds: int, warmup: int, payload: int, kinds: list[str]) -> None:
    import echo_pb2

    request = echo_pb2.PingRequest(payload=b"x" * payload)
    print(
        f"python {platform.python_version()} on {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs ({cpu_model()}), loadavg {os.getloadavg()[0]:.2f}"
    )
    print(versions())
    print(
        f"{calls} calls x {rounds} rounds per server, {payload}-byte payload, "
        f"{warmup} warm-up calls; grpcio sync client in pid {os.getpid()}, "
        "one server subprocess per kind, unix sockets"
    )

    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="grpc-bridge-") as tmp:
        procs: dict[str, subprocess.Popen] = {}
        channels = {}
        stubs = {}
        try:
            for i, kind in enumerate(kinds):
                path = os.path.join(tmp, f"s{i}.sock")
                procs[kind] = start_server(kind, path)
                channels[kind], stubs[kind] = connect(path)
            for kind in kinds:
                run_round(stubs[kind], request, warmup)

            rates: dict[str, list[float]] = {k: [] for k in kinds}
            lats: dict[str, list[int]] = {k: [] for k in kinds}
            for r in range(rounds):
                order = kinds[r % len(kinds) :] + kinds[: r % len(kinds)]
                for kind in order:
                    rate, lat = run_round(stubs[kind], request, calls)
                    rates[kind].append(rate)
                    lats[kind].extend(lat)
                print(
                    f"  round {r + 1}/{rounds}: " + "  ".join(f"{k} {rates[k][-1]:.0f}/s" for k in kinds),
                    flush=True,
                )
        finally:
            for ch in channels.values():
                ch.close()
            for p in procs.values():
                p.send_signal(signal.SIGTERM)
            notes = []
            for p in procs.values():
                try:
                    out, _ = p.communicate(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    out, _ = p.communicate()
                if out and "heartbeat" in out:
                    notes.append(f"  {out.strip()}")

    results = {}
    for kind in kinds:
        s = sorted(lats[kind])
        results[kind] = (
            statistics.median(rates[kind]),
            percentile(s, 0.50),
            percentile(s, 0.99),
        )

    print()
    print("| server | calls/s (median) | p50 µs | p99 µs | vs grpclib-asyncio | vs grpcio |")
    print("|---|---:|---:|---:|---:|---:|")
    base_aio = results.get("grpclib-asyncio", (None,))[0]
    base_grpcio = results.get("grpcio", (None,))[0]
    for kind in kinds:
        rate, p50, p99 = results[kind]
        r_aio = f"{rate / base_aio:.2f}x" if base_aio else "-"
        r_grpcio = f"{rate / base_grpcio:.2f}x" if base_grpcio else "-"
        print(f"| {kind} | {rate:,.0f} | {p50:,.0f} | {p99:,.0f} | {r_aio} | {r_grpcio} |")
    print()
    for n in notes:
        print(n)
    print(f"total {time.monotonic() - t_start:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3000, help="unary calls per round (default 3000)")
    ap.add_argument("--rounds", type=int, default=7, help="rounds per server (default 7)")
    ap.add_argument("--warmup", type=int, default=300, help="warm-up calls per server (default 300)")
    ap.add_argument("--payload", type=int, default=64, help="payload bytes (default 64)")
    ap.add_argument("--only", action="append", choices=KINDS, help="measure only this server kind (repeatable)")
    ap.add_argument("--serve", choices=KINDS, help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.serve:
        serve(args.serve, args.socket)
        return
    bench(args.calls, args.rounds, args.warmup, args.payload, list(args.only or KINDS))


if __name__ == "__main__":
    main()
