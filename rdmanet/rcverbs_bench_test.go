package rdmanet_test

import (
	"encoding/binary"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/gouct/gouct/internal/benchclock"
)

// Two-process Conn benchmarks over rc_verbs, bootstrap on RXE_IP, beside a
// Go TCP echo on the same IP in the same child (scripts/vm-test.sh compares
// them with ib_send_lat and ib_write_bw on the same device).

// rcTargets: the rc_verbs conn and the TCP baseline of an rcVerbsServer.
func rcTargets(p *peer) []struct{ name, network, addr string } {
	return []struct{ name, network, addr string }{
		{"rc_verbs", "rdma", p.addrs.Echo},
		{"tcp", "tcp", p.addrs.TCP},
	}
}

// BenchmarkRCVerbsEchoRTT64: 64 B ping-pong; p50-us and p99-us of the round trip.
func BenchmarkRCVerbsEchoRTT64(b *testing.B) {
	c := rcVerbsConfig(b)
	p := startRCServer(b)
	p50 := map[string]float64{}
	for _, tg := range rcTargets(p) {
		b.Run(tg.name, func(b *testing.B) {
			conn := dialEchoRC(b, tg.network, tg.addr, c, 'E')
			defer conn.Close()
			if tc, ok := conn.(*net.TCPConn); ok {
				tc.SetNoDelay(true)
			}
			msg, buf := make([]byte, 64), make([]byte, 64)
			for i := 0; i < 200; i++ { // warm up
				conn.Write(msg)
				io.ReadFull(conn, buf)
			}
			// Rounds are timed with the CPU's counter, as ib_send_lat times
			// its own (benchclock: a clock_gettime is a system call in the VM).
			ticks, lat := make([]int64, b.N), make([]time.Duration, b.N)
			clk := benchclock.Start()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := benchclock.Ticks()
				if _, err := conn.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(conn, buf); err != nil {
					b.Fatal(err)
				}
				ticks[i] = benchclock.Ticks() - t0
			}
			b.StopTimer()
			if neg := clk.Durations(ticks, lat); neg > 0 {
				b.Logf("%d rounds timed negative (counter not synchronized across CPUs): counted as 0", neg)
			}
			slices.Sort(lat)
			p50[tg.name] = float64(lat[len(lat)/2].Nanoseconds()) / 1e3
			b.ReportMetric(p50[tg.name], "p50-us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-us")
		})
	}
	if p50["tcp"] > 0 {
		b.Logf("64 B RTT p50: rdmanet(rc_verbs) %.1f µs, Go TCP %.1f µs, ratio %.2f×",
			p50["rc_verbs"], p50["tcp"], p50["rc_verbs"]/p50["tcp"])
	}
}

// BenchmarkRCVerbsStream1MiB: 1 MiB writes to a sink in the child, timed
// to its acknowledgement of the last byte.
func BenchmarkRCVerbsStream1MiB(b *testing.B) {
	c := rcVerbsConfig(b)
	p := startRCServer(b)
	rate := map[string]float64{}
	for _, tg := range rcTargets(p) {
		b.Run(tg.name, func(b *testing.B) {
			conn := dialEchoRC(b, tg.network, tg.addr, c, 'S')
			defer conn.Close()
			msg := make([]byte, 1<<20)
			var hdr [8]byte
			ack := make([]byte, 1)
			round := func(n int) {
				binary.LittleEndian.PutUint64(hdr[:], uint64(n)*uint64(len(msg)))
				if _, err := conn.Write(hdr[:]); err != nil {
					b.Fatal(err)
				}
				for i := 0; i < n; i++ {
					if _, err := conn.Write(msg); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := io.ReadFull(conn, ack); err != nil {
					b.Fatal(err)
				}
			}
			round(4) // warm up
			b.SetBytes(int64(len(msg)))
			b.ResetTimer()
			t0 := time.Now()
			round(b.N)
			rate[tg.name] = float64(b.N) * float64(len(msg)) / time.Since(t0).Seconds()
		})
	}
	if rate["tcp"] > 0 {
		b.Logf("1 MiB writes: rdmanet(rc_verbs) %.1f MB/s, Go TCP %.1f MB/s, ratio %.2f×",
			rate["rc_verbs"]/1e6, rate["tcp"]/1e6, rate["rc_verbs"]/rate["tcp"])
	}
}
