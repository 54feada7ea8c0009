package stream

import (
	"io"
	"net"
	"testing"
	"time"
)

// Benchmarks run a Go TCP loopback baseline first, then every in-process
// transport, in the same run (this machine's speed varies between runs:
// only ratios within one run mean something). Each transport reports its
// ratio to the baseline ("x_tcp": >1 is faster than TCP).
//
//	go test -run '^$' -bench . -benchtime 2s ./internal/stream

// tcpPair is a connected TCP loopback pair.
func tcpPair(b testing.TB) (net.Conn, net.Conn) {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			ch <- nil
			return
		}
		ch <- c
	}()
	c1, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	c2 := <-ch
	if c2 == nil {
		b.Fatal("accept failed")
	}
	return c1, c2
}

// benchPairs yields "tcp" and then each transport with a fresh conn pair.
func benchPairs(b *testing.B, f func(b *testing.B, c1, c2 net.Conn) float64, unit string) {
	var base float64
	b.Run("tcp", func(b *testing.B) {
		c1, c2 := tcpPair(b)
		defer c1.Close()
		defer c2.Close()
		base = f(b, c1, c2)
	})
	for _, tl := range transports() {
		b.Run(tl, func(b *testing.B) {
			e := newEnv(b, tl, nil)
			p := e.pair(b)
			defer p.close()
			v := f(b, p.c1, p.c2)
			if base > 0 && v > 0 {
				r := base / v
				if unit == "MB/s" {
					r = v / base
				}
				b.ReportMetric(r, "x_tcp")
			}
		})
	}
}

// BenchmarkEcho64 is a 64-byte request/response round trip.
func BenchmarkEcho64(b *testing.B) {
	benchPairs(b, func(b *testing.B, c1, c2 net.Conn) float64 {
		go func() {
			buf := make([]byte, 64)
			for {
				if _, err := io.ReadFull(c2, buf); err != nil {
					return
				}
				if _, err := c2.Write(buf); err != nil {
					return
				}
			}
		}()
		buf := make([]byte, 64)
		b.ReportAllocs()
		b.ResetTimer()
		t0 := time.Now()
		for i := 0; i < b.N; i++ {
			if _, err := c1.Write(buf); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c1, buf); err != nil {
				b.Fatal(err)
			}
		}
		ns := float64(time.Since(t0).Nanoseconds()) / float64(b.N)
		b.ReportMetric(ns/1000, "µs/rtt")
		return ns
	}, "ns")
}

// BenchmarkWrite streams writes of 4 KiB, 32 KiB (bcopy fragments within
// credit) and 1 MiB (rendezvous) to a reader with a 32 KiB buffer (io.Copy's
// size: rendezvous data goes through the receive queue), and 1 MiB writes to
// a reader with a 1 MiB buffer (pulls land straight in it).
func BenchmarkWrite(b *testing.B) {
	cases := []struct {
		name      string
		size, buf int
	}{
		{"4KiB", 4 << 10, 32 << 10},
		{"32KiB", 32 << 10, 32 << 10},
		{"1MiB", 1 << 20, 32 << 10},
		{"1MiB-read1MiB", 1 << 20, 1 << 20},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			benchPairs(b, func(b *testing.B, c1, c2 net.Conn) float64 {
				done := make(chan struct{})
				go func() {
					defer close(done)
					buf := make([]byte, tc.buf)
					for {
						if _, err := c2.Read(buf); err != nil {
							return
						}
					}
				}()
				p := make([]byte, tc.size)
				b.SetBytes(int64(len(p)))
				b.ReportAllocs()
				b.ResetTimer()
				t0 := time.Now()
				for i := 0; i < b.N; i++ {
					if _, err := c1.Write(p); err != nil {
						b.Fatal(err)
					}
				}
				mbs := float64(b.N) * float64(len(p)) / time.Since(t0).Seconds() / 1e6
				b.StopTimer()
				c1.Close()
				<-done
				return mbs
			}, "MB/s")
		})
	}
}
