package uctest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gouct/gouct/uct"
)

// BenchPingPong measures the round trip of an AM of size bytes between two
// workers of transport tl (AMShort up to MaxShort, else AMBcopy, else
// AMZcopy); the peer replies from its handler. It reports, measured in the
// same run, a Go TCP loopback ping-pong of the same size as tcp-ns/op and
// x-tcp = our ns/op ÷ TCP's (below 1: faster than TCP); p50-ns, p99-ns and
// tcp-p99-ns are round-trip percentiles.
func BenchPingPong(b *testing.B, tl string, size int) {
	BenchPingPongOptions(b, Options{TL: tl}, size)
}

// BenchPingPongOptions is BenchPingPong on the resource o selects.
func BenchPingPongOptions(b *testing.B, o Options, size int) {
	p := newPair(b, o)
	p.warmup()
	send, err := sender(b, p.a, size)
	if err != nil {
		b.Fatal(err)
	}
	reply, err := sender(b, p.b, size)
	if err != nil {
		b.Fatal(err)
	}
	var got atomic.Int64
	var replyErr atomic.Value
	notify := make(chan struct{}, 1)
	p.b.iface.SetAMHandler(amID, func([]byte) {
		if err := reply(); err != nil {
			replyErr.Store(err) // ping-pong keeps one message in flight: no back-pressure expected
		}
	})
	p.a.iface.SetAMHandler(amID, func([]byte) {
		got.Add(1)
		select {
		case notify <- struct{}{}:
		default:
		}
	})
	wait := func(n int64) {
		for spin := 0; got.Load() < n; spin++ {
			if spin < 2000 {
				runtime.Gosched()
				continue
			}
			select {
			case <-notify:
			case <-time.After(time.Second):
				if e := replyErr.Load(); e != nil {
					b.Fatalf("reply: %v", e)
				}
			}
		}
	}
	// Warm up, then measure.
	for i := int64(1); i <= 100; i++ {
		if err := retry(send); err != nil {
			b.Fatal(err)
		}
		wait(i)
	}
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	start := time.Now()
	base := got.Load()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := retry(send); err != nil {
			b.Fatal(err)
		}
		wait(base + int64(i) + 1)
		lat[i] = time.Since(t0)
	}
	ours := float64(time.Since(start).Nanoseconds()) / float64(b.N)
	b.StopTimer()
	tcp, tcpLat, err := tcpPingPong(max(size, 1), min(max(b.N, 200), 10000))
	if err != nil {
		b.Fatalf("tcp baseline: %v", err)
	}
	b.ReportMetric(tcp, "tcp-ns/op")
	b.ReportMetric(ours/tcp, "x-tcp")
	b.ReportMetric(float64(percentile(lat, 50)), "p50-ns")
	b.ReportMetric(float64(percentile(lat, 99)), "p99-ns")
	b.ReportMetric(float64(percentile(tcpLat, 99)), "tcp-p99-ns")
}

// percentile sorts d and returns its p-th percentile.
func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)*p/100, len(d)-1)]
}

// sender returns a function that sends one AM of size bytes on s.ep with
// the cheapest kind that fits. It keeps its buffers: no allocation per call.
func sender(tb testing.TB, s *side, size int) (func() error, error) {
	a := s.attr
	buf := make([]byte, size)
	switch {
	case a.Cap.Has(uct.CapAMShort) && size <= a.MaxShort:
		return func() error { return s.ep.AMShort(amID, 0, buf) }, nil
	case a.Cap.Has(uct.CapAMBcopy) && size <= a.MaxBcopy:
		pack := func(b []byte) int { return copy(b, buf) }
		return func() error { _, err := s.ep.AMBcopy(amID, pack); return err }, nil
	case a.Cap.Has(uct.CapAMZcopy) && size <= a.MaxZcopy:
		iov := []uct.IOV{{Buf: buf}}
		tb.Cleanup(register(tb, s.md, iov, uct.AccessLocalRead))
		// The buffer is never modified, so operations may overlap; one
		// completion that never reaches zero absorbs them all.
		comp := uct.NewCompletion(1<<30, nil)
		return func() error {
			err := s.ep.AMZcopy(amID, nil, iov, comp)
			if errors.Is(err, uct.ErrInProgress) {
				return nil
			}
			return err
		}, nil
	}
	return nil, fmt.Errorf("%s: no AM kind carries %d bytes (%v, short %d, bcopy %d, zcopy %d)",
		s.iface.Resource().Name(), size, a.Cap, a.MaxShort, a.MaxBcopy, a.MaxZcopy)
}

// BenchBandwidth streams writes of size bytes from one worker to the other
// (AMBcopy up to MaxBcopy; larger writes as AMZcopy fragments of MaxZcopy,
// or AMBcopy fragments without zcopy) and reports MB/s (b.SetBytes), with a
// Go TCP loopback stream of the same write size measured in the same run as
// tcp-MB/s and x-tcp = our MB/s ÷ TCP's (above 1: faster than TCP).
func BenchBandwidth(b *testing.B, tl string, size int) {
	BenchBandwidthOptions(b, Options{TL: tl}, size)
}

// BenchBandwidthOptions is BenchBandwidth on the resource o selects.
func BenchBandwidthOptions(b *testing.B, o Options, size int) {
	p := newPair(b, o)
	p.warmup()
	a := p.a.attr
	frag := a.MaxBcopy
	if size > a.MaxBcopy && a.Cap.Has(uct.CapAMZcopy) {
		frag = a.MaxZcopy
	}
	frag = max(min(frag, size), 1)
	send, err := sender(b, p.a, frag)
	if err != nil {
		b.Fatal(err)
	}
	var rcvd atomic.Int64
	p.b.iface.SetAMHandler(amID, func(d []byte) { rcvd.Add(int64(len(d))) })
	nfrag := max((size+frag-1)/frag, 1)
	b.SetBytes(int64(size))
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		for f := 0; f < nfrag; f++ {
			if err := retry(send); err != nil {
				b.Fatal(err)
			}
		}
	}
	want := int64(b.N) * int64(nfrag) * int64(frag)
	deadline := time.Now().Add(60 * time.Second)
	for rcvd.Load() < want {
		if time.Now().After(deadline) {
			b.Fatalf("received %d of %d bytes", rcvd.Load(), want)
		}
		runtime.Gosched()
	}
	el := time.Since(start)
	b.StopTimer()
	ours := float64(want) / el.Seconds() / 1e6
	total := min(max(want, 64<<20), 512<<20)
	tcp, err := tcpStream(max(size, 1), total)
	if err != nil {
		b.Fatalf("tcp baseline: %v", err)
	}
	b.ReportMetric(tcp, "tcp-MB/s")
	b.ReportMetric(ours/tcp, "x-tcp")
}

// loopback returns a connected pair of TCP sockets on 127.0.0.1.
func loopback() (client, server net.Conn, err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		acc <- c
	}()
	client, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		return nil, nil, err
	}
	server = <-acc
	if server == nil {
		client.Close()
		return nil, nil, errors.New("accept failed")
	}
	return client, server, nil
}

// tcpPingPong is the baseline: ns per round trip of size bytes over Go TCP
// loopback, and each round trip's time.
func tcpPingPong(size, n int) (float64, []time.Duration, error) {
	c, s, err := loopback()
	if err != nil {
		return 0, nil, err
	}
	defer c.Close()
	defer s.Close()
	go func() {
		buf := make([]byte, size)
		for {
			if _, err := io.ReadFull(s, buf); err != nil {
				return
			}
			if _, err := s.Write(buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, size)
	round := func() error {
		if _, err := c.Write(buf); err != nil {
			return err
		}
		_, err := io.ReadFull(c, buf)
		return err
	}
	for i := 0; i < 100; i++ {
		if err := round(); err != nil {
			return 0, nil, err
		}
	}
	lat := make([]time.Duration, n)
	start := time.Now()
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if err := round(); err != nil {
			return 0, nil, err
		}
		lat[i] = time.Since(t0)
	}
	return float64(time.Since(start).Nanoseconds()) / float64(n), lat, nil
}

// tcpStream is the baseline: MB/s streaming total bytes in writes of size over Go TCP loopback.
func tcpStream(size int, total int64) (float64, error) {
	c, s, err := loopback()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	defer s.Close()
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 256<<10)
		var n int64
		for n < total {
			k, err := s.Read(buf)
			n += int64(k)
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	buf := make([]byte, size)
	start := time.Now()
	for sent := int64(0); sent < total; {
		k := int64(size)
		if total-sent < k {
			k = total - sent
		}
		if _, err := c.Write(buf[:k]); err != nil {
			return 0, err
		}
		sent += k
	}
	if err := <-done; err != nil {
		return 0, err
	}
	return float64(total) / time.Since(start).Seconds() / 1e6, nil
}
