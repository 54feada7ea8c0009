#!/bin/bash
# grpc-cpu-bound.sh - where the CPU of the demo's gRPC 1 MiB server-streaming
# goes, and what that allows a transport to gain over TCP on this host.
#
# Runs the example server and client as two processes, twice: streaming over
# rdmanet (shm) and over plain TCP, each under `perf` (software cpu-clock
# event: no hardware counters needed). For TCP it splits both processes' CPU
# into the socket syscalls (syscall.read in the client, syscall.write in the
# server, kernel copies included) and everything else (gRPC, protobuf, Go
# runtime). If the transport cost nothing and both processes kept all CPUs
# busy, throughput could rise at most by
#     (TCP CPU / non-socket CPU) x (CPUs / CPUs the TCP run used)
# which is the "bound" printed. Needs perf (Debian: linux-perf).
# Usage: scripts/grpc-cpu-bound.sh [GiB per run, default 2] [runs, default 3]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v perf >/dev/null || { echo "grpc-cpu-bound: needs perf (apt-get install linux-perf)"; exit 1; }
gib=${1:-2}
runs=${2:-3}
mkdir -p bin
go build -o bin/ ./examples/grpc-over-rdma/server ./examples/grpc-over-rdma/client
tmp=$(mktemp -d)
port=0
trap 'pkill -INT -f "bin/server -addr 127.0.0.1:$port " 2>/dev/null || true; rm -rf "$tmp"' EXIT
ncpu=$(nproc)
bytes=$((gib << 30))

# run MODE: one server, one client, both under perf; sets res to
# "MB/s client-ms server-ms read% write%"
run() {
	local mode=$1 ev=() out
	port=$((30000 + RANDOM % 20000))
	perf record -q -e cpu-clock -F 1000 -g -o "$tmp/srv.data" \
		bin/server -addr 127.0.0.1:$port -tcp-addr 127.0.0.1:$((port + 1)) >"$tmp/srv.log" 2>&1 &
	for _ in $(seq 100); do grep -q '^ready' "$tmp/srv.log" 2>/dev/null && break; sleep 0.1; done
	if [ "$mode" = tcp ]; then
		ev=(-baseline-only -tcp-addr 127.0.0.1:$((port + 1)))
	fi
	out=$(perf record -q -e cpu-clock -F 1000 -g -o "$tmp/cli.data" \
		bin/client -addr 127.0.0.1:$port "${ev[@]}" -n 10 -stream-bytes $bytes 2>&1)
	pkill -INT -f "bin/server -addr 127.0.0.1:$port "
	while pgrep -f "bin/server -addr 127.0.0.1:$port " >/dev/null; do sleep 0.1; done
	sleep 0.5 # perf writes its file
	local mbps ct st cr sw
	mbps=$(echo "$out" | awk '/^stream/{print $(NF-1)}')
	[ -n "$mbps" ] || { echo "grpc-cpu-bound: client failed: $out" >&2; exit 1; }
	ct=$(total "$tmp/cli.data")
	st=$(total "$tmp/srv.data")
	cr=$(share "$tmp/cli.data" syscall.read)
	sw=$(share "$tmp/srv.data" syscall.write)
	res="$mbps $ct $st $cr $sw"
}
# total FILE: sampled CPU ms; share FILE SYM: % of samples under SYM (callers included)
total() { perf report -i "$1" --no-children --sort comm -g none 2>/dev/null | awk '/Event count/{printf "%.0f", $NF/1e6}'; }
share() {
	perf report -i "$1" --children --sort sym -g none 2>/dev/null |
		awk -v s="$2" '$NF==s && $3=="[.]" && !f{print $1+0; f=1} END{if(!f) print 0}'
}

for r in $(seq "$runs"); do
	run shm
	read -r sm sct sst _ _ <<<"$res"
	run tcp
	read -r tm tct tst tcr tsw <<<"$res"
	awk -v gib=$gib -v n=$ncpu -v sm=$sm -v sct=$sct -v sst=$sst -v tm=$tm -v tct=$tct -v tst=$tst -v tcr=$tcr -v tsw=$tsw 'BEGIN{
		mb = gib*1073.741824
		sw = mb/sm; tw = mb/tm
		tcpu = (tct+tst)/1000; rest = (tct*(1-tcr/100)+tst*(1-tsw/100))/1000
		used = tcpu/tw
		printf "run: shm %4.0f MB/s (client %4.0f ms, server %4.0f ms CPU, %.2f CPUs) | tcp %4.0f MB/s (client %4.0f ms, %2.0f%% in read; server %4.0f ms, %2.0f%% in write; %.2f CPUs) | ratio %.2fx, bound with a free transport %.2fx\n",
			sm, sct, sst, (sct+sst)/1000/sw, tm, tct, tcr, tst, tsw, used, sm/tm, (tcpu/rest)*(n/used)
	}'
done
