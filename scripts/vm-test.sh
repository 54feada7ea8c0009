#!/bin/bash
# vm-test.sh - the Soft-RoCE part of `make test`: builds test binaries on the
# host, boots a throw-away VM (scripts/rxevm/run-in-rxe-vm.sh: rxe0 on a dummy
# netdev, rxe1<->rxe2 on a veth pair) and runs them there with RXEVM=1, where
# tests that need RDMA fail instead of skipping: the uct suites (ibv, ib), the
# stream layer and the Conn level (nettest, two-process echo, gRPC plain and
# TLS) over rc_verbs, and the cmd tests. Then it runs our benchmarks (uct
# level and Conn level) and perftest on the same devices and prints them
# side by side.
#
#   scripts/vm-test.sh            everything (~15 min under TCG on 2 cores)
#   VMTEST_BENCH=0 ...            skip the benchmarks
#   VMTEST_ROUNDS=N ...           benchmark rounds (default 3; the best of each is compared)
#   VMTEST_STRICT_PERF=1 ...      fail when a benchmark misses its target
#                                 (RTT <= 2x ib_send_lat's, bandwidth >= 0.6x ib_write_bw's)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$(mktemp -d "${TMPDIR:-/tmp}/gouct-vmtest.XXXXXX")
trap 'rm -rf "$OUT"' EXIT

# Test binaries: "label package [VAR=value ...] [-test.flag=value ...]". Each
# package is built once on the host with -race and runs in the guest as
#   VAR=value... <binary> -test.v -test.timeout 300s -test.flag=value...
# with RXEVM=1, RXE_DEV=rxe0, RXE_IP=10.77.0.1, IBTEST_DEV_A/B=rxe0:1 set.
# Adding a suite is one line here.
TESTS=(
  "ibv ./uct/internal/ibv"
  "ib ./uct/ib"
  # The stream layer's per-transport suites, rc_verbs subtests only (the
  # others run on the host; under TCG with -race the whole suite takes >5 min).
  "stream ./internal/stream -test.run=/rc_verbs"
  # Conn level over rc_verbs with every rxe device open (uct.Select must pick
  # a reachable pair), bootstrap on the rxe netdev IP: nettest, two-process
  # echo and gRPC (plain and TLS).
  # TestRCVerbsDeviceForBootstrapIP: with rxe0, rxe1, rxe2 open, each conn
  # runs on the device whose GID is the bootstrap socket's IP, on both ends.
  "rdmanet ./rdmanet RDMANET_TLS=rc_verbs -test.run=^TestRCVerbs(NetIP|TwoProcess|DeviceForBootstrapIP)$"
  # Faults with live conns: a QP forced into error (that conn fails, its
  # peer too, others and the listener go on), and an RDMA device removed
  # with `rdma link delete` (conns fail, new Dials fall back to TCP,
  # registrations back to baseline).
  "rdmanet-faults ./rdmanet RDMANET_TLS=rc_verbs -test.run=^TestRCVerbs(QPError|DeviceRemoved)$"
  # rdmanet's own rc_verbs test expects the first device: rxe0 only.
  "rdmanet-rxe0 ./rdmanet RDMANET_TLS=rc_verbs RDMANET_NET_DEVICES=rxe0:1 -test.run=^TestRCVerbs$"
  "rdmanet-perf ./cmd/rdmanet-perf"
  "rdmanet-info ./cmd/rdmanet-info"
)

binof() { echo "$1" | sed 's|^\./||; s|/|_|g'; }   # package -> binary name
echo "vm-test: building test binaries (race detector on; benchmarks without)"
built=" "
for t in "${TESTS[@]}"; do
  set -- $t
  b=$(binof "$2")
  case "$built" in *" $b "*) continue ;; esac
  go test -race -c -o "$OUT/$b.test" "$2"
  built+="$b "
done
go test -c -o "$OUT/uct_ib.bench" ./uct/ib
go test -c -o "$OUT/rdmanet.bench" ./rdmanet

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
  label=$1 bin=$(echo "$2" | sed 's|^\./||; s|/|_|g'); shift 2
  envs=() args=()
  for w in "$@"; do case "$w" in -*) args+=("$w") ;; *) envs+=("$w") ;; esac; done
  s=$SECONDS
  run "$label (rxe0)" IBTEST_DEV_A=rxe0:1 IBTEST_DEV_B=rxe0:1 "${envs[@]}" "./$bin.test" -test.v -test.timeout 300s "${args[@]}"
  echo "    ($label: $((SECONDS - s)) s)"
done
# Across the veth pair: rxe1 -> rxe2 (two devices, two netdevs).
run "ib rxe1->rxe2 (veth)" IBTEST_DEV_A=rxe1:1 IBTEST_DEV_B=rxe2:1 ./uct_ib.test -test.v -test.timeout 120s \
  -test.run 'TestPair|TestForkWithLiveQPs|TestEndpointFailure|TestPendingBeforeConnect|TestAttributes|TestGoMemoryWithPointers|TestForcedQPError|TestDeviceGone|TestUseGIDForIP'

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
  bench() {  # our figure: name-regexp unit-column [file]
    awk -v b="$1" -v u="$2" '$1 ~ b { for (i = 2; i < NF; i++) if ($(i+1) == u) { print $i; exit } }' "${3:-bench.out}"
  }
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "n/a" }'; }
  verdict() {  # ratio op limit
    awk -v r="$1" -v op="$2" -v l="$3" 'BEGIN { if (r == "n/a") print "n/a"; else if ((op == "le" && r <= l) || (op == "ge" && r >= l)) print "met"; else print "MISSED" }'
  }
  best() {  # min|max values... : the best of the rounds (empty values skipped)
    local how=$1; shift
    printf '%s\n' "$@" | awk -v h="$how" '$1 ~ /^[0-9]+(\.[0-9]+)?$/ && $1 > 0 { if (!n++ || (h == "min" ? $1 < v : $1 > v)) v = $1 } END { if (n) print v }'
  }
  summary() {  # label dev-a dev-b perftest-server-dev perftest-client-dev server-ip [conn]
    # conn=1: also the Conn level (rdmanet over rc_verbs on dev-a, two
    # processes, bootstrap on server-ip) and Go TCP over the same IP.
    local label=$1 da=$2 db=$3 ds=$4 dc=$5 ip=$6 conn=${7:-0}
    local l_med=() l_mean=() l_put=() l_am=() l_prtt=() l_pmean=() l_pbw=()
    local l_crtt=() l_ctrtt=() l_cbw=() l_ctbw=()
    # Rounds alternate perftest and ours; each figure is the best of the
    # rounds, so a host hiccup in one round does not decide the ratio.
    for round in $(seq "$ROUNDS"); do
      perf lat.out ib_send_lat -d "$ds" -x 1 -s 8 -n 3000 -- ib_send_lat -d "$dc" -x 1 -s 8 -n 3000 "$ip"
      perf bw.out ib_write_bw -d "$ds" -x 1 -s 65536 -n 1000 --report_gbits -- ib_write_bw -d "$dc" -x 1 -s 65536 -n 1000 --report_gbits "$ip"
      IBTEST_DEV_A=$da IBTEST_DEV_B=$db ./uct_ib.bench -test.run '^$' -test.bench '^Benchmark(AMPingPong8|PutBW64K|AMZcopyBW64K)$' \
        -test.benchtime 1000x -test.timeout 300s > bench.out 2>&1 || { cat bench.out; fails=$((fails+1)); }
      grep -E '^Benchmark' bench.out | sed "s/^/  round $round: /"
      l_prtt+=("$(col lat.out 5 | awk '{ printf "%.1f", 2 * $1 }')")     # t_typical: one-way µs (RTT/2)
      l_pmean+=("$(col lat.out 6 | awk '{ printf "%.1f", 2 * $1 }')")    # t_avg
      l_pbw+=("$(col bw.out 4 | awk '{ printf "%.1f", $1 * 125 }')")     # BW average Gb/s -> MB/s (1e6 B)
      l_med+=("$(bench '^BenchmarkAMPingPong8-' p50-us)")
      l_mean+=("$(bench '^BenchmarkAMPingPong8-' ns/op | awk '{ printf "%.1f", $1 / 1000 }')")
      l_put+=("$(bench '^BenchmarkPutBW64K-' MB/s)")
      l_am+=("$(bench '^BenchmarkAMZcopyBW64K-' MB/s)")
      if [ "$conn" = 1 ]; then
        RDMANET_NET_DEVICES=$da RXE_IP=$ip ./rdmanet.bench -test.run '^$' -test.bench '^BenchmarkRCVerbsEchoRTT64$' \
          -test.benchtime 1000x -test.timeout 300s > cbench.out 2>&1 || { cat cbench.out; fails=$((fails+1)); }
        RDMANET_NET_DEVICES=$da RXE_IP=$ip ./rdmanet.bench -test.run '^$' -test.bench '^BenchmarkRCVerbsStream1MiB$' \
          -test.benchtime 300x -test.timeout 300s >> cbench.out 2>&1 || { cat cbench.out; fails=$((fails+1)); }
        grep -E '^Benchmark' cbench.out | sed "s/^/  round $round: /"
        l_crtt+=("$(bench '^BenchmarkRCVerbsEchoRTT64/rc_verbs-' p50-us cbench.out)")
        l_ctrtt+=("$(bench '^BenchmarkRCVerbsEchoRTT64/tcp-' p50-us cbench.out)")
        l_cbw+=("$(bench '^BenchmarkRCVerbsStream1MiB/rc_verbs-' MB/s cbench.out)")
        l_ctbw+=("$(bench '^BenchmarkRCVerbsStream1MiB/tcp-' MB/s cbench.out)")
      fi
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
    local r5="" r6=""
    if [ "$conn" = 1 ]; then
      local crtt ctrtt cbw ctbw
      crtt=$(best min "${l_crtt[@]}"); ctrtt=$(best min "${l_ctrtt[@]}"); cbw=$(best max "${l_cbw[@]}"); ctbw=$(best max "${l_ctbw[@]}")
      r5=$(ratio "$crtt" "$prtt"); r6=$(ratio "$cbw" "$pbw")
      printf '%-36s %10s %10s %7s  %s\n' "Conn 64 B echo RTT p50 (us)" "$crtt" "$prtt" "$r5" "<= 2.0 $(verdict "$r5" le 2.0)"
      printf '%-36s %10s %10s %7s  %s\n' "Conn 1 MiB writes bandwidth (MB/s)" "$cbw" "$pbw" "$r6" ">= 0.6 $(verdict "$r6" ge 0.6)"
      printf '%-36s %10s %10s %7s  %s\n' "Go TCP 64 B echo RTT p50 (us)" "$ctrtt" "$prtt" "$(ratio "$ctrtt" "$prtt")" "(info, same IP)"
      printf '%-36s %10s %10s %7s  %s\n' "Go TCP 1 MiB writes (MB/s)" "$ctbw" "$pbw" "$(ratio "$ctbw" "$pbw")" "(info, same IP)"
    fi
    echo "(perftest: ib_send_lat -s 8 t_typical/t_avg x2, ib_write_bw -s 65536 BW average;"
    echo " gouct: BenchmarkAMPingPong8 p50/mean, BenchmarkPutBW64K, BenchmarkAMZcopyBW64K;"
    [ "$conn" = 1 ] && echo " Conn: rdmanet BenchmarkRCVerbsEchoRTT64/rc_verbs p50, BenchmarkRCVerbsStream1MiB/rc_verbs, two processes;"
    echo " round trips timed with the CPU's time-stamp counter on both sides, as perftest does)"
    echo
    if [ "$STRICT" = 1 ]; then
      local vs=("$(verdict "$r1" le 2.0)" "$(verdict "$r3" ge 0.6)" "$(verdict "$r4" ge 0.6)")
      [ "$conn" = 1 ] && vs+=("$(verdict "$r5" le 2.0)" "$(verdict "$r6" ge 0.6)")
      for v in "${vs[@]}"; do
        [ "$v" = met ] || fails=$((fails+1))
      done
    fi
  }
  summary "rxe0 loopback" rxe0:1 rxe0:1 rxe0 rxe0 "$RXE_IP" 1
  summary "rxe1->rxe2 over veth" rxe1:1 rxe2:1 rxe2 rxe1 10.78.0.2
fi
echo
echo "vm-test: $fails failure(s)"
exit $fails
GUEST_EOF
chmod +x "$OUT/guest.sh"

echo "vm-test: booting the Soft-RoCE VM"
scripts/rxevm/run-in-rxe-vm.sh --veth -t 1100 -- "$OUT/guest.sh"
