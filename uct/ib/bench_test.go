package ib_test

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
	"unsafe"

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
	b.SetBytes(size)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if err := retry(func() error { return a.ep.PutZcopy(iov, raddr, rkey, c) }); !errors.Is(err, uct.ErrInProgress) {
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
