#!/bin/bash
# vm-test.sh - the Soft-RoCE part of `make test`: builds test binaries on the
# host, boots a throw-away VM (scripts/rxevm/run-in-rxe-vm.sh: rxe0 on a dummy
# netdev, rxe1<->rxe2 on a veth pair) and runs them there with RXEVM=1, where
# tests that need RDMA fail instead of skipping. Then it runs our benchmarks
# and perftest on the same devices and prints them side by side.
#
#   scripts/vm-test.sh            everything (~5 min under TCG)
#   VMTEST_BENCH=0 ...            skip the benchmarks
#   VMTEST_ROUNDS=N ...           benchmark rounds (default 3; the best of each is compared)
#   VMTEST_STRICT_PERF=1 ...      fail when a benchmark misses its target
#                                 (RTT <= 2x ib_send_lat's, bandwidth >= 0.6x ib_write_bw's)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$(mktemp -d "${TMPDIR:-/tmp}/gouct-vmtest.XXXXXX")
trap 'rm -rf "$OUT"' EXIT

# Test binaries: "name package [VAR=value ...]". Each is built on the host
# with -race and runs in the guest as  VAR=value... <name>.test -test.v  with
# RXEVM=1, RXE_DEV=rxe0, RXE_IP=10.77.0.1, IBTEST_DEV_A/B=rxe0:1 set.
# Adding a suite is one line here, e.g. "rdmanet ./rdmanet RDMANET_TLS=rc_verbs".
TESTS=(
  "ibv ./uct/internal/ibv"
  "ib  ./uct/ib"
)

echo "vm-test: building test binaries (race detector on; benchmarks without)"
for t in "${TESTS[@]}"; do
  set -- $t
  go test -race -c -o "$OUT/$1.test" "$2"
done
go test -c -o "$OUT/ib.bench" ./uct/ib

cat > "$OUT/guest.sh" <<GUEST_EOF
#!/bin/bash
# Runs inside the VM.
OUT=$OUT
BENCH=${VMTEST_BENCH:-1}
ROUNDS=${VMTEST_ROUNDS:-3}
STRICT=${VMTEST_STRICT_PERF:-0}
TESTS=(${TESTS[*]@Q})
GUEST_EOF
cat >> "$OUT/guest.sh" <<'GUEST_EOF'
fails=0
run() {  # label, env..., binary, args...
  local label=$1; shift
  echo "=== vm-test: $label"
  if env "$@"; then echo "--- vm-test ok: $label"; else echo "--- vm-test FAIL: $label"; fails=$((fails+1)); fi
}
cd "$OUT"
for t in "${TESTS[@]}"; do
  set -- $t
  name=$1; shift 2
  run "$name (rxe0)" IBTEST_DEV_A=rxe0:1 IBTEST_DEV_B=rxe0:1 "$@" "./$name.test" -test.v -test.timeout 300s
done
# Across the veth pair: rxe1 -> rxe2 (two devices, two netdevs).
run "ib rxe1->rxe2 (veth)" IBTEST_DEV_A=rxe1:1 IBTEST_DEV_B=rxe2:1 ./ib.test -test.v -test.timeout 120s \
  -test.run 'TestPair|TestForkWithLiveQPs|TestEndpointFailure|TestPendingBeforeConnect|TestAttributes'

if [ "$BENCH" = 1 ]; then
  # perftest on the same devices: server in the background, client in the foreground.
  perf() {  # out-file server-args... -- client-args...
    local out=$1; shift
    local srv=() cli=()
    while [ "$1" != -- ]; do srv+=("$1"); shift; done; shift; cli=("$@")
    timeout 60 stdbuf -oL "${srv[@]}" > "$out.srv" 2>&1 & local sp=$!
    for _ in $(seq 100); do ss -ltn | grep -q ':18515 ' && break; sleep 0.1; done   # perftest's port
    timeout 60 stdbuf -oL "${cli[@]}" > "$out" 2>&1; local rc=$?
    wait $sp
    [ $rc = 0 ] || { echo "perftest failed: ${cli[*]}"; tail -n 5 "$out" "$out.srv"; }
  }
  # The data line follows the column header line that starts with " #bytes".
  col() { awk -v c="$2" 'f && NF > c {print $c; exit} /^ *#bytes/ {f=1}' "$1"; }
  bench() {  # our figure: name-regexp unit-column
    awk -v b="$1" -v u="$2" '$1 ~ b { for (i = 2; i < NF; i++) if ($(i+1) == u) { print $i; exit } }' bench.out
  }
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "n/a" }'; }
  verdict() {  # ratio op limit
    awk -v r="$1" -v op="$2" -v l="$3" 'BEGIN { if (r == "n/a") print "n/a"; else if ((op == "le" && r <= l) || (op == "ge" && r >= l)) print "met"; else print "MISSED" }'
  }
  best() {  # min|max values... : the best of the rounds (empty values skipped)
    local how=$1; shift
    printf '%s\n' "$@" | awk -v h="$how" '$1 ~ /^[0-9]+(\.[0-9]+)?$/ && $1 > 0 { if (!n++ || (h == "min" ? $1 < v : $1 > v)) v = $1 } END { if (n) print v }'
  }
  summary() {  # label dev-a dev-b perftest-server-dev perftest-client-dev server-ip
    local label=$1 da=$2 db=$3 ds=$4 dc=$5 ip=$6
    local l_med=() l_mean=() l_put=() l_am=() l_prtt=() l_pmean=() l_pbw=()
    # Rounds alternate perftest and ours; each figure is the best of the
    # rounds, so a host hiccup in one round does not decide the ratio.
    for round in $(seq "$ROUNDS"); do
      perf lat.out ib_send_lat -d "$ds" -x 1 -s 8 -n 3000 -- ib_send_lat -d "$dc" -x 1 -s 8 -n 3000 "$ip"
      perf bw.out ib_write_bw -d "$ds" -x 1 -s 65536 -n 1000 --report_gbits -- ib_write_bw -d "$dc" -x 1 -s 65536 -n 1000 --report_gbits "$ip"
      IBTEST_DEV_A=$da IBTEST_DEV_B=$db ./ib.bench -test.run '^$' -test.bench '^Benchmark(AMPingPong8|PutBW64K|AMZcopyBW64K)$' \
        -test.benchtime 1000x -test.timeout 300s > bench.out 2>&1 || { cat bench.out; fails=$((fails+1)); }
      grep -E '^Benchmark' bench.out | sed "s/^/  round $round: /"
      l_prtt+=("$(col lat.out 5 | awk '{ printf "%.1f", 2 * $1 }')")     # t_typical: one-way µs (RTT/2)
      l_pmean+=("$(col lat.out 6 | awk '{ printf "%.1f", 2 * $1 }')")    # t_avg
      l_pbw+=("$(col bw.out 4 | awk '{ printf "%.1f", $1 * 125 }')")     # BW average Gb/s -> MB/s (1e6 B)
      l_med+=("$(bench '^BenchmarkAMPingPong8-' p50-us)")
      l_mean+=("$(bench '^BenchmarkAMPingPong8-' ns/op | awk '{ printf "%.1f", $1 / 1000 }')")
      l_put+=("$(bench '^BenchmarkPutBW64K-' MB/s)")
      l_am+=("$(bench '^BenchmarkAMZcopyBW64K-' MB/s)")
      echo "  round $round perftest: ib_send_lat RTT typical ${l_prtt[-1]} us, mean ${l_pmean[-1]} us; ib_write_bw ${l_pbw[-1]} MB/s"
    done
    local med mean put am prtt pmean pbw
    med=$(best min "${l_med[@]}"); mean=$(best min "${l_mean[@]}"); put=$(best max "${l_put[@]}"); am=$(best max "${l_am[@]}")
    prtt=$(best min "${l_prtt[@]}"); pmean=$(best min "${l_pmean[@]}"); pbw=$(best max "${l_pbw[@]}")
    local r1 r2 r3 r4
    r1=$(ratio "$med" "$prtt"); r2=$(ratio "$mean" "$pmean"); r3=$(ratio "$put" "$pbw"); r4=$(ratio "$am" "$pbw")
    echo
    echo "=== vm-test benchmarks: $label (gouct vs perftest, same VM run, best of $ROUNDS rounds)"
    printf '%-36s %10s %10s %7s  %s\n' "measure" "gouct" "perftest" "ratio" "target"
    printf '%-36s %10s %10s %7s  %s\n' "8 B AM ping-pong RTT median (us)" "$med" "$prtt" "$r1" "<= 2.0 $(verdict "$r1" le 2.0)"
    printf '%-36s %10s %10s %7s  %s\n' "8 B AM ping-pong RTT mean (us)" "$mean" "$pmean" "$r2" "(info)"
    printf '%-36s %10s %10s %7s  %s\n' "64 KiB put bandwidth (MB/s)" "$put" "$pbw" "$r3" ">= 0.6 $(verdict "$r3" ge 0.6)"
    printf '%-36s %10s %10s %7s  %s\n' "64 KiB AM zcopy bandwidth (MB/s)" "$am" "$pbw" "$r4" ">= 0.6 $(verdict "$r4" ge 0.6)"
    echo "(perftest: ib_send_lat -s 8 t_typical/t_avg x2, ib_write_bw -s 65536 BW average;"
    echo " gouct: BenchmarkAMPingPong8 p50/mean, BenchmarkPutBW64K, BenchmarkAMZcopyBW64K)"
    echo
    if [ "$STRICT" = 1 ]; then
      for v in "$(verdict "$r1" le 2.0)" "$(verdict "$r3" ge 0.6)" "$(verdict "$r4" ge 0.6)"; do
        [ "$v" = met ] || fails=$((fails+1))
      done
    fi
  }
  summary "rxe0 loopback" rxe0:1 rxe0:1 rxe0 rxe0 "$RXE_IP"
  summary "rxe1->rxe2 over veth" rxe1:1 rxe2:1 rxe2 rxe1 10.78.0.2
fi
echo
echo "vm-test: $fails failure(s)"
exit $fails
GUEST_EOF
chmod +x "$OUT/guest.sh"

echo "vm-test: booting the Soft-RoCE VM"
scripts/rxevm/run-in-rxe-vm.sh --veth -t 1100 -- "$OUT/guest.sh"
