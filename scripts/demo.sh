#!/bin/bash
# demo.sh - what `make demo` runs. Until the gRPC demo lands: uct ping-pong on the default transport.
set -euo pipefail
cd "$(dirname "$0")/.."
go run ./examples/uct-pingpong
