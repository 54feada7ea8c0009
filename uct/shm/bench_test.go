//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/uctest"
)

// Shared suite benchmarks: two workers in one process.
func BenchmarkPingPong8(b *testing.B)     { uctest.BenchPingPong(b, tlName, 8) }
func BenchmarkBandwidth8K(b *testing.B)   { uctest.BenchBandwidth(b, tlName, 8<<10) }
func BenchmarkBandwidth256K(b *testing.B) { uctest.BenchBandwidth(b, tlName, 256<<10) }

// quantile returns the q-quantile of d in µs (sorts d).
func quantile(d []time.Duration, q float64) float64 {
	slices.Sort(d)
	return float64(d[int(q*float64(len(d)-1))].Nanoseconds()) / 1e3
}

// BenchmarkTwoProcessPingPong: round trip of an 8-byte AMShort (header
// only) between this process and a peer process that echoes it from its
// handler; this side polls the worker itself while waiting (the stream's
// Read path). Beside it, in the same run and between the same two
// processes, an 8-byte Go TCP loopback ping-pong. Reports medians in µs.
func BenchmarkTwoProcessPingPong(b *testing.B) {
	// "worker-spins": this side's worker spins its budget while the
	// benchmark goroutine polls too (three spinners on two vCPUs with the
	// peer's worker); "worker-parks": ProgressSpin 0, only the waiting
	// goroutine polls here, as a blocked Read does.
	b.Run("worker-spins", func(b *testing.B) { benchPingPong(b, uct.DefaultConfig()) })
	b.Run("worker-parks", func(b *testing.B) {
		cfg := uct.DefaultConfig()
		cfg.ProgressSpin = 0
		benchPingPong(b, cfg)
	})
}

func benchPingPong(b *testing.B, cfg *uct.Config) {
	s := openSide(b, cfg, uct.IfaceParams{})
	p := startPeer(b, s)
	var got atomic.Uint64
	s.iface.SetAMHandler(amEcho, func(d []byte) { got.Store(binary.LittleEndian.Uint64(d)) })
	rt := make([]time.Duration, b.N)
	round := func(i uint64) {
		for {
			err := p.ep.AMShort(amEcho, i, nil)
			if err == nil {
				break
			}
			if !errors.Is(err, uct.ErrNoResource) {
				b.Fatal(err)
			}
		}
		for spins := 0; got.Load() != i; spins++ {
			if _, ok := s.w.TryProgress(); !ok || spins&15 == 15 {
				runtime.Gosched()
			}
		}
	}
	for i := uint64(1); i <= 1000; i++ { // warm up
		round(i)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		round(uint64(i) + 1001)
		rt[i] = time.Since(t0)
	}
	b.StopTimer()
	shm, shm99 := quantile(rt, 0.5), quantile(rt, 0.99)

	c, err := net.Dial("tcp", p.tcp)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	var msg [8]byte
	c.Write([]byte{'p'})
	n := min(max(b.N, 1000), 20000)
	tcp := make([]time.Duration, n)
	for i := range tcp {
		t0 := time.Now()
		if _, err := c.Write(msg[:]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, msg[:]); err != nil {
			b.Fatal(err)
		}
		tcp[i] = time.Since(t0)
	}
	tcpMed := quantile(tcp, 0.5)
	b.ReportMetric(shm, "p50-µs/rt")
	b.ReportMetric(shm99, "p99-µs/rt")
	b.ReportMetric(tcpMed, "tcp-p50-µs/rt")
	b.ReportMetric(shm/tcpMed, "x-tcp")
}

// BenchmarkTwoProcessBandwidth: a stream of 8 KiB AMBcopy messages to a
// peer process that counts them, beside a Go TCP loopback stream of the
// same bytes in 8 KiB writes between the same two processes.
func BenchmarkTwoProcessBandwidth(b *testing.B) {
	const size = 8 << 10
	s := openSide(b, nil, uct.IfaceParams{})
	p := startPeer(b, s)
	count := make(chan uint64, 1)
	s.iface.SetAMHandler(amCount, func(d []byte) { count <- binary.LittleEndian.Uint64(d) })
	data := make([]byte, size)
	pack := func(buf []byte) int { return copy(buf, data) }
	send := func(fn func() error) {
		for spins := 0; ; spins++ {
			err := fn()
			if err == nil {
				return
			}
			if !errors.Is(err, uct.ErrNoResource) {
				b.Fatal(err)
			}
			runtime.Gosched()
		}
	}
	bcopy := func() error { _, err := p.ep.AMBcopy(amSink, pack); return err }
	b.SetBytes(size)
	b.ResetTimer()
	t0 := time.Now()
	for i := 0; i < b.N; i++ {
		send(bcopy)
	}
	send(func() error { return p.ep.AMShort(amCount, 0, nil) })
	select {
	case n := <-count:
		if n != uint64(b.N)*size {
			b.Fatalf("peer counted %d bytes, sent %d", n, b.N*size)
		}
	case <-time.After(30 * time.Second):
		b.Fatal("no count from peer")
	}
	el := time.Since(t0)
	b.StopTimer()
	ours := float64(b.N) * size / el.Seconds() / 1e6

	c, err := net.Dial("tcp", p.tcp)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	total := min(max(int64(b.N)*size, 64<<20), 512<<20)
	var hdr [9]byte
	hdr[0] = 'b'
	binary.LittleEndian.PutUint64(hdr[1:], uint64(total))
	t0 = time.Now()
	if _, err := c.Write(hdr[:]); err != nil {
		b.Fatal(err)
	}
	for sent := int64(0); sent < total; sent += size {
		if _, err := c.Write(data); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := io.ReadFull(c, hdr[:1]); err != nil {
		b.Fatal(err)
	}
	tcp := float64(total) / time.Since(t0).Seconds() / 1e6
	b.ReportMetric(tcp, "tcp-MB/s")
	b.ReportMetric(ours/tcp, "x-tcp")
}

// BenchmarkTwoProcessIdleWake: round trip of an 8-byte AMShort to a peer
// process whose worker has parked (2 ms idle before each message), so each
// message goes through the doorbell; beside it, the same over TCP loopback.
// wake-p50-µs is the one-way time to the peer's handler, back-p50-µs the
// way back (CLOCK_MONOTONIC stamps). "poll": this side polls the worker
// while waiting; "block": it waits on a channel its handler signals.
func BenchmarkTwoProcessIdleWake(b *testing.B) {
	b.Run("poll", func(b *testing.B) { benchIdleWake(b, false) })
	b.Run("block", func(b *testing.B) { benchIdleWake(b, true) })
}

func benchIdleWake(b *testing.B, block bool) {
	s := openSide(b, nil, uct.IfaceParams{})
	p := startPeer(b, s)
	var got atomic.Uint64
	var stamp atomic.Int64
	notify := make(chan struct{}, 1)
	s.iface.SetAMHandler(amStamp, func(d []byte) {
		stamp.Store(int64(binary.LittleEndian.Uint64(d)))
		got.Add(1)
		select {
		case notify <- struct{}{}:
		default:
		}
	})
	c, err := net.Dial("tcp", p.tcp)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte{'p'})
	var msg [8]byte
	rt := make([]time.Duration, b.N)
	oneWay := make([]time.Duration, b.N)
	back := make([]time.Duration, b.N)
	tcp := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		time.Sleep(2 * time.Millisecond)
		t0 := time.Now()
		m0 := monotonic()
		if err := p.ep.AMShort(amStamp, 0, nil); err != nil {
			b.Fatal(err)
		}
		for spins := 0; got.Load() != uint64(i)+1; spins++ {
			if block {
				<-notify
				continue
			}
			if _, ok := s.w.TryProgress(); !ok || spins&15 == 15 {
				runtime.Gosched()
			}
		}
		rt[i] = time.Since(t0)
		back[i] = time.Duration(monotonic() - stamp.Load())
		oneWay[i] = time.Duration(stamp.Load() - m0)
		time.Sleep(2 * time.Millisecond)
		t0 = time.Now()
		c.Write(msg[:])
		if _, err := io.ReadFull(c, msg[:]); err != nil {
			b.Fatal(err)
		}
		tcp[i] = time.Since(t0)
	}
	b.StopTimer()
	shm, tcpMed := quantile(rt, 0.5), quantile(tcp, 0.5)
	b.ReportMetric(shm, "p50-µs/rt")
	b.ReportMetric(quantile(rt, 0.99), "p99-µs/rt")
	b.ReportMetric(quantile(oneWay, 0.5), "wake-p50-µs")
	b.ReportMetric(quantile(back, 0.5), "back-p50-µs")
	b.ReportMetric(tcpMed, "tcp-p50-µs/rt")
	b.ReportMetric(shm/tcpMed, "x-tcp")
}

// BenchmarkTwoProcessGetZcopy: single-copy reads (process_vm_readv) of
// 256 KiB from the peer process's registered buffer, beside a Go TCP
// loopback stream of 256 KiB writes between the same two processes.
func BenchmarkTwoProcessGetZcopy(b *testing.B) {
	const size = 256 << 10
	s := openSide(b, nil, uct.IfaceParams{})
	if !s.iface.Attr().Cap.Has(uct.CapGetZcopy) {
		b.Skipf("no get_zcopy: %v", rmaSupported())
	}
	p := startPeer(b, s)
	local := make([]byte, size)
	iov := []uct.IOV{{Buf: local}}
	b.SetBytes(size)
	b.ResetTimer()
	t0 := time.Now()
	for i := 0; i < b.N; i++ {
		off := uint64(i%(rmaLen/size)) * size
		if err := p.ep.GetZcopy(iov, p.raddr+off, p.rkey, nil); err != nil {
			b.Fatal(err)
		}
	}
	ours := float64(b.N) * size / time.Since(t0).Seconds() / 1e6
	b.StopTimer()
	c, err := net.Dial("tcp", p.tcp)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	total := min(max(int64(b.N)*size, 64<<20), 512<<20)
	var hdr [9]byte
	hdr[0] = 'b'
	binary.LittleEndian.PutUint64(hdr[1:], uint64(total))
	t0 = time.Now()
	c.Write(hdr[:])
	for sent := int64(0); sent < total; sent += size {
		if _, err := c.Write(local); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := io.ReadFull(c, hdr[:1]); err != nil {
		b.Fatal(err)
	}
	tcp := float64(total) / time.Since(t0).Seconds() / 1e6
	b.ReportMetric(tcp, "tcp-MB/s")
	b.ReportMetric(ours/tcp, "x-tcp")
}
