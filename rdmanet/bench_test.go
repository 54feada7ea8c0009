package rdmanet_test

import (
	"encoding/binary"
	"io"
	"net"
	"slices"
	"testing"
	"time"
)

// Two-process benchmarks: this process dials a server child (shm by default)
// and, in the same run, the child's plain Go TCP loopback echo as the
// baseline. Run: go test -run '^$' -bench . -benchtime 2s ./rdmanet

// TestZeroAllocs: a 64 B Write and Read on an established shm conn allocate nothing.
func TestZeroAllocs(t *testing.T) {
	skipIfForced(t)
	p := startServer(t)
	c := dialEcho(t, "rdma", p.addrs.Echo, nil, 'E', wantTwoProc)
	defer c.Close()
	msg, buf := make([]byte, 64), make([]byte, 64)
	rt := func() {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 100; i++ { // warm up pools
		rt()
	}
	if n := testing.AllocsPerRun(500, rt); n != 0 {
		t.Errorf("%.2f allocations per 64 B Write+Read, want 0", n)
	}
}

type benchTarget struct {
	name    string
	network string
	addr    func(*peer) string
	want    string
}

var benchTargets = []benchTarget{
	{"rdmanet", "rdma", func(p *peer) string { return p.addrs.Echo }, wantTwoProc},
	{"tcp-loopback", "tcp", func(p *peer) string { return p.addrs.TCP }, "tcp"},
}

// BenchmarkEchoRTT64 is a 64 B ping-pong; it reports the round trip's p50
// and p99, and allocations per Write+Read.
func BenchmarkEchoRTT64(b *testing.B) {
	skipIfForced(b)
	p := startServer(b)
	p50 := map[string]float64{}
	for _, tg := range benchTargets {
		b.Run(tg.name, func(b *testing.B) {
			c := dialEcho(b, tg.network, tg.addr(p), nil, 'E', tg.want)
			defer c.Close()
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetNoDelay(true)
			}
			msg, buf := make([]byte, 64), make([]byte, 64)
			for i := 0; i < 1000; i++ { // warm up
				c.Write(msg)
				io.ReadFull(c, buf)
			}
			lat := make([]time.Duration, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
				lat[i] = time.Since(t0)
			}
			b.StopTimer()
			slices.Sort(lat)
			p50[tg.name] = float64(lat[len(lat)/2].Nanoseconds())
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
		})
	}
	if p50["tcp-loopback"] > 0 {
		b.Logf("64 B RTT p50: rdmanet(%s) %.1f µs, Go TCP loopback %.1f µs, ratio %.2f×",
			wantTwoProc, p50["rdmanet"]/1e3, p50["tcp-loopback"]/1e3, p50["rdmanet"]/p50["tcp-loopback"])
	}
}

// BenchmarkStream1MiB streams 1 MiB writes to a sink in the child and waits
// for its acknowledgement of the last byte.
func BenchmarkStream1MiB(b *testing.B) {
	skipIfForced(b)
	p := startServer(b)
	rate := map[string]float64{}
	for _, tg := range benchTargets {
		b.Run(tg.name, func(b *testing.B) {
			c := dialEcho(b, tg.network, tg.addr(p), nil, 'S', tg.want)
			defer c.Close()
			msg := make([]byte, 1<<20)
			var hdr [8]byte
			ack := make([]byte, 1)
			round := func(n int) {
				binary.LittleEndian.PutUint64(hdr[:], uint64(n)*uint64(len(msg)))
				if _, err := c.Write(hdr[:]); err != nil {
					b.Fatal(err)
				}
				for i := 0; i < n; i++ {
					if _, err := c.Write(msg); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := io.ReadFull(c, ack); err != nil {
					b.Fatal(err)
				}
			}
			round(8) // warm up
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			b.ResetTimer()
			t0 := time.Now()
			round(b.N)
			d := time.Since(t0)
			rate[tg.name] = float64(b.N) * float64(len(msg)) / d.Seconds()
		})
	}
	if rate["tcp-loopback"] > 0 {
		b.Logf("1 MiB writes: rdmanet(%s) %.2f GB/s, Go TCP loopback %.2f GB/s, ratio %.2f×",
			wantTwoProc, rate["rdmanet"]/1e9, rate["tcp-loopback"]/1e9, rate["rdmanet"]/rate["tcp-loopback"])
	}
}
