#!/bin/sh
# Regenerate the protobuf / gRPC stubs for the bridge benchmark:
#   echo_pb2.py       protobuf messages
#   echo_grpc.py      grpclib stubs (protoc-gen-grpclib_python, ships with grpclib)
#   echo_pb2_grpc.py  grpcio stubs (grpc_tools built-in plugin)
# Usage: testbed/benches/grpc_bridge/gen.sh   (uses $PYTHON, default: repo .venv)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
PYTHON=${PYTHON:-$root/.venv/bin/python}
bindir=$(dirname "$PYTHON")
plugin=$(command -v protoc-gen-grpclib_python 2>/dev/null || echo "$bindir/protoc-gen-grpclib_python")
cd "$here"
"$PYTHON" -m grpc_tools.protoc \
    -I. \
    --plugin=protoc-gen-grpclib_python="$plugin" \
    --python_out=. \
    --grpclib_python_out=. \
    --grpc_python_out=. \
    echo.proto
echo "generated: echo_pb2.py echo_grpc.py echo_pb2_grpc.py (plugin: $plugin)"
