"""The smallest NRI plugin that takes part in a container's start: the floor ``eventsrc bench nri``
sets eventsrc beside (``python -m testbed.benches.minimal_nri SOCKET``).

It registers, subscribes to the events enforce mode does (one call during CreateContainer, as
either eventsrc mode has), and answers every call at once with an empty answer of its type,
recording nothing. One thread, blocking socket calls, the multiplexer and ttrpc framing written
out here: nothing of eventsrc's NRI stack (``eventsrc.rpc.ttrpc``, ``eventsrc.node.nri``), only
the generated protobuf messages. It prints "synchronized" once the runtime's Synchronize is
answered, and exits when the runtime closes the connection.
"""

from __future__ import annotations

import socket
import struct
import sys

from eventsrc.gen.nri.v1alpha1 import api_pb2 as nri
from eventsrc.gen.ttrpc import request_pb2, status_pb2

PLUGIN_CONN, RUNTIME_CONN = 1, 2  # the runtime calls us on 1; we call it on 2
REQUEST, RESPONSE = 1, 2
MUX = struct.Struct(">II")  # connection id, payload length
TTRPC = struct.Struct(">IIBB")  # length, stream id, type, flags
E = nri.Event
#: enforce mode's events: one call during CreateContainer, as each eventsrc mode has
SANDBOX_EVENTS = ("RUN_POD_SANDBOX", "REMOVE_POD_SANDBOX")
CONTAINER_EVENTS = ("CREATE_CONTAINER", "START_CONTAINER", "STOP_CONTAINER", "REMOVE_CONTAINER")
EVENTS = [E.Value(name) for name in SANDBOX_EVENTS + CONTAINER_EVENTS]
CONFIGURED = nri.ConfigureResponse(events=sum(1 << (e - 1) for e in EVENTS)).SerializeToString()
OK = status_pb2.Status(code=0)


def frame(conn: int, stream_id: int, kind: int, body: bytes) -> bytes:
    message = TTRPC.pack(len(body), stream_id, kind, 0) + body
    return MUX.pack(conn, len(message)) + message


def answer(method: str) -> bytes:
    """The answer's payload: Configure's subscription; every other answer is an empty message."""
    return CONFIGURED if method == "Configure" else b""


def serve(path: str, index: str) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    register = nri.RegisterPluginRequest(plugin_name="minimal", plugin_idx=index).SerializeToString()
    call = request_pb2.Request(service="nri.pkg.api.v1alpha1.Runtime", method="RegisterPlugin", payload=register)
    sock.sendall(frame(RUNTIME_CONN, 1, REQUEST, call.SerializeToString()))
    buf = b""
    while True:
        data = sock.recv(1 << 16)
        if not data:
            return
        buf += data
        while len(buf) >= MUX.size:
            conn, length = MUX.unpack_from(buf)
            if len(buf) < MUX.size + length:
                break
            message, buf = buf[MUX.size : MUX.size + length], buf[MUX.size + length :]
            _, stream_id, kind, _ = TTRPC.unpack_from(message)
            if conn != PLUGIN_CONN or kind != REQUEST:
                continue  # RegisterPlugin's answer
            method = request_pb2.Request.FromString(message[TTRPC.size :]).method
            response = request_pb2.Response(status=OK, payload=answer(method))
            sock.sendall(frame(PLUGIN_CONN, stream_id, RESPONSE, response.SerializeToString()))
            if method == "Synchronize":
                print("synchronized", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python -m testbed.benches.minimal_nri SOCKET [INDEX]", file=sys.stderr)
        return 2
    try:
        serve(argv[0], argv[1] if len(argv) == 2 else "90")
    except OSError as exc:
        print(f"minimal_nri: {argv[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
