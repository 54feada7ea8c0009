#!/bin/bash
# deps.sh - install what `make test` / `make demo` need, idempotently.
#   deps.sh go     Go modules only
#   deps.sh vm     + Debian packages for the Soft-RoCE VM suite (as root, via apt-get)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v go >/dev/null || { echo "deps: Go toolchain not found (need go >= 1.26)" >&2; exit 1; }
go mod download
[ "${1:-go}" = vm ] || exit 0
PKGS="qemu-system-x86 linux-image-amd64 busybox-static rdma-core ibverbs-providers ibverbs-utils
      libibverbs-dev perftest ucx-utils iproute2 kmod cpio xz-utils"
missing=()
for p in $PKGS; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "deps: missing packages (${missing[*]}); run as root or: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "deps: apt-get install ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
