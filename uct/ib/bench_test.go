package ib_test

import (
	"errors"
	"io"
	"net"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/gouct/gouct/internal/benchclock"
	"github.com/gouct/gouct/uct"
)

// BenchmarkPutBW64K streams 64 KiB RDMA WRITEs (PutZcopy) from IBTEST_DEV_A
// to IBTEST_DEV_B, as many in flight as the send queue holds (ib_write_bw's
// pattern), and reports MB/s with a Go TCP loopback stream of 64 KiB writes
// measured in the same run (tcp-MB/s, x-tcp).
func BenchmarkPutBW64K(b *testing.B) {
	const size = 64 << 10
	a, p := newPair(b)
	local := make([]byte, size)
	remote := make([]byte, size)
	lh, err := a.md.Register(local, uct.AccessLocalRead)
	if err != nil {
		b.Fatal(err)
	}
	defer a.md.Deregister(lh)
	rh, err := p.md.Register(remote, uct.AccessRemoteWrite)
	if err != nil {
		b.Fatal(err)
	}
	defer p.md.Deregister(rh)
	rkey, _ := p.md.PackRKey(rh)
	raddr := uint64(uintptr(unsafe.Pointer(&remote[0])))
	iov := []uct.IOV{{Buf: local, MemH: lh}}
	done := make(chan error, 1)
	c := uct.NewCompletion(int32(b.N), func(err error) { done <- err })
	send := sender(a.ep)
	b.SetBytes(size)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if err := send(func() error { return a.ep.PutZcopy(iov, raddr, rkey, c) }); err != nil {
			b.Fatalf("put %d: %v", i, err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			b.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		b.Fatal("puts did not complete in 60s")
	}
	ours := float64(b.N) * size / time.Since(start).Seconds() / 1e6
	b.StopTimer()
	tcp, err := tcpStream(size, min(max(int64(b.N)*size, 32<<20), 256<<20))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(tcp, "tcp-MB/s")
	b.ReportMetric(ours/tcp, "x-tcp")
}

// tcpStream is the baseline: MB/s of total bytes written in size-byte
// writes over Go TCP loopback.
func tcpStream(size int, total int64) (float64, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	rd := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			rd <- err
			return
		}
		defer c.Close()
		_, err = io.CopyN(io.Discard, c, total)
		rd <- err
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	buf := make([]byte, size)
	start := time.Now()
	for sent := int64(0); sent < total; sent += int64(size) {
		if _, err := c.Write(buf[:min(int64(size), total-sent)]); err != nil {
			return 0, err
		}
	}
	if err := <-rd; err != nil {
		return 0, err
	}
	return float64(total) / time.Since(start).Seconds() / 1e6, nil
}

// BenchmarkAMPingPong8 is an 8-byte AMShort ping-pong from IBTEST_DEV_A to
// IBTEST_DEV_B (the peer replies from its handler, ib_send_lat's pattern;
// the waiting side polls with Worker.TryProgress like a blocked Read).
// Besides the mean (ns/op) it reports the median and 99th percentile round
// trip (p50-us, p99-us), to hold against ib_send_lat's typical and average,
// and a Go TCP loopback ping-pong's median in the same run (tcp-p50-us).
func BenchmarkAMPingPong8(b *testing.B) {
	a, p := newPair(b)
	var got atomic.Int64
	note := make(chan struct{}, 1)
	var replyErr atomic.Value
	p.iface.SetAMHandler(6, func([]byte) {
		if err := p.ep.AMShort(6, 0, nil); err != nil {
			replyErr.Store(err)
		}
	})
	a.iface.SetAMHandler(6, func([]byte) {
		got.Add(1)
		select {
		case note <- struct{}{}:
		default:
		}
	})
	round := func(i int64) {
		if err := retry(func() error { return a.ep.AMShort(6, 0, nil) }); err != nil {
			b.Fatal(err)
		}
		// Wait as a blocked Read does (DESIGN.md "Calibration"): poll the
		// transport ourselves for a while, yielding now and then, then park.
		for spin := 0; got.Load() < i; spin++ {
			if spin < 4000 {
				a.w.TryProgress()
				if spin%16 == 15 {
					runtime.Gosched()
				}
				continue
			}
			select {
			case <-note:
			case <-time.After(5 * time.Second):
				b.Fatalf("no reply in 5s (reply error %v)", replyErr.Load())
			}
		}
	}
	for i := int64(1); i <= 100; i++ {
		round(i)
	}
	// Rounds are timed with the CPU's counter, as ib_send_lat times its own
	// (benchclock: a clock_gettime is a system call in the VM).
	ticks, lat := make([]int64, b.N), make([]time.Duration, b.N)
	clk := benchclock.Start()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s := benchclock.Ticks()
		round(int64(101 + i))
		ticks[i] = benchclock.Ticks() - s
	}
	b.StopTimer()
	if neg := clk.Durations(ticks, lat); neg > 0 {
		b.Logf("%d rounds timed negative (counter not synchronized across CPUs): counted as 0", neg)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2])/1e3, "p50-us")
	b.ReportMetric(float64(lat[len(lat)*99/100])/1e3, "p99-us")
	tcp, err := tcpPingPong(8, min(max(b.N, 200), 5000))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(tcp/1e3, "tcp-p50-us")
}

// tcpPingPong is the baseline: the median round trip of size bytes over Go
// TCP loopback, in ns.
func tcpPingPong(size, n int) (float64, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, size)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	buf := make([]byte, size)
	lat := make([]time.Duration, n)
	for i := -100; i < n; i++ {
		s := time.Now()
		if _, err := c.Write(buf); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return 0, err
		}
		if i >= 0 {
			lat[i] = time.Since(s)
		}
	}
	slices.Sort(lat)
	return float64(lat[n/2]), nil
}

// sender returns a function that runs op until it is accepted: out of send
// resources it sleeps until a pending request runs (UCT's ErrNoResource →
// PendingAdd), leaving the CPU to the device instead of spinning.
func sender(ep uct.EP) func(op func() error) error {
	room := make(chan struct{}, 1)
	req := &uct.PendingReq{Func: func() error { room <- struct{}{}; return nil }}
	return func(op func() error) error {
		for {
			err := op()
			if errors.Is(err, uct.ErrInProgress) || err == nil {
				return nil
			}
			if !errors.Is(err, uct.ErrNoResource) {
				return err
			}
			if err := ep.PendingAdd(req); err == nil {
				<-room
			} else if !errors.Is(err, uct.ErrBusy) {
				return err
			}
		}
	}
}

// BenchmarkAMZcopyBW64K streams 64 KiB messages as AMZcopy fragments of
// MaxZcopy bytes from registered memory (IBTEST_DEV_A to IBTEST_DEV_B) and
// reports MB/s delivered to the peer's handler, with a Go TCP loopback
// stream of 64 KiB writes in the same run.
func BenchmarkAMZcopyBW64K(b *testing.B) {
	const size = 64 << 10
	a, p := newPair(b)
	frag := a.iface.Attr().MaxZcopy
	buf := make([]byte, size)
	h, err := a.md.Register(buf, uct.AccessLocalRead)
	if err != nil {
		b.Fatal(err)
	}
	defer a.md.Deregister(h)
	var rcvd atomic.Int64
	all := make(chan struct{})
	nfrag := (size + frag - 1) / frag
	want := int64(b.N) * size
	p.iface.SetAMHandler(4, func(d []byte) {
		if rcvd.Add(int64(len(d))) == want {
			close(all)
		}
	})
	iovs := make([][]uct.IOV, nfrag)
	for f := range iovs {
		iovs[f] = []uct.IOV{{Buf: buf[f*frag : min((f+1)*frag, size)], MemH: h}}
	}
	c := uct.NewCompletion(1<<30, nil) // the buffer is never modified: one completion absorbs all
	send := sender(a.ep)
	b.SetBytes(size)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		for f := range iovs {
			if err := send(func() error { return a.ep.AMZcopy(4, nil, iovs[f], c) }); err != nil {
				b.Fatalf("am zcopy %d/%d: %v", i, f, err)
			}
		}
	}
	select {
	case <-all:
	case <-time.After(60 * time.Second):
		b.Fatalf("received %d of %d bytes in 60s", rcvd.Load(), want)
	}
	ours := float64(want) / time.Since(start).Seconds() / 1e6
	b.StopTimer()
	tcp, err := tcpStream(size, min(max(want, 32<<20), 256<<20))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(ours, "MB/s-delivered")
	b.ReportMetric(tcp, "tcp-MB/s")
	b.ReportMetric(ours/tcp, "x-tcp")
}
