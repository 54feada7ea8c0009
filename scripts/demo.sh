#!/bin/bash
# demo.sh - what `make demo` runs: the grpc-over-rdma example as two processes on the
# embedded default transport (shared memory on one host; no RDMA hardware needed),
# with the same calls over plain TCP printed beside it. Extra args go to the client
# (e.g. DEMO_ARGS="-tls" or "-transport tcp").
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bin
go build -o bin/ ./examples/grpc-over-rdma/server ./examples/grpc-over-rdma/client
port=$((20000 + RANDOM % 20000))
log=$(mktemp)
srv_args=()
for a in ${DEMO_ARGS:-}; do [ "$a" = -tls ] && srv_args+=(-tls); done
bin/server -addr 127.0.0.1:$port -tcp-addr 127.0.0.1:$((port + 1)) "${srv_args[@]}" >"$log" 2>&1 &
srv=$!
trap 'kill $srv 2>/dev/null; wait $srv 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 100); do grep -q '^ready' "$log" && break; kill -0 $srv 2>/dev/null || { cat "$log"; exit 1; }; sleep 0.1; done
grep -q '^ready' "$log" || { echo "demo: server did not start"; cat "$log"; exit 1; }
echo "gRPC over rdmanet: server (pid $srv) and client are two processes on one host"
bin/client -addr 127.0.0.1:$port -tcp-addr 127.0.0.1:$((port + 1)) ${DEMO_ARGS:-}
echo "--- server log"
cat "$log"
