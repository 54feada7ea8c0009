package rdmanet_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gouct/gouct/rdmanet"
)

// soakDuration: RDMANET_SOAK_DURATION (a time.Duration), else 2 minutes
// under RDMANET_SOAK=1, else a few seconds.
func soakDuration(t testing.TB) time.Duration {
	if s := os.Getenv("RDMANET_SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("RDMANET_SOAK_DURATION: %v", err)
		}
		return d
	}
	if soak() {
		return 2 * time.Minute
	}
	return 3 * time.Second
}

// soakSizes cross every stream threshold: AMShort, one bcopy fragment,
// pipelined fragments, rendezvous.
var soakSizes = []int{1, 13, 100, 4096, 8184, 8193, 65536, 100000, 300000, 1 << 20}

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// soakWriter writes total bytes of stream seed in random sizes; with chaos,
// under random write deadlines (a timed-out Write's remainder is retried,
// so the stream stays the same). It returns the bytes Write reported
// written. When a Close races a Write, the Write may fail having handed
// its bytes over (Close flushes them): the peer may then read more than
// reported, up to what the last Write was given.
func soakWriter(c net.Conn, seed uint64, total int, rng *rand.Rand, chaos bool) (written, extra int, err error) {
	src := streamBytes(seed)
	buf := make([]byte, 1<<20)
	for written < total {
		n := min(soakSizes[rng.IntN(len(soakSizes))], total-written)
		src.Read(buf[:n])
		p := buf[:n]
		for len(p) > 0 {
			if chaos && rng.IntN(4) == 0 {
				c.SetWriteDeadline(time.Now().Add(time.Duration(1+rng.IntN(20)) * time.Millisecond))
			} else {
				c.SetWriteDeadline(time.Time{})
			}
			k, err := c.Write(p)
			written += k
			p = p[k:]
			if err != nil && !isTimeout(err) {
				return written, len(p), err
			}
		}
	}
	c.SetWriteDeadline(time.Time{})
	return written, 0, c.(rdmanet.Conn).CloseWrite()
}

// soakReader reads and checks stream seed until EOF or an error, under
// random read deadlines (a timeout is retried). A wrong byte is reported
// as errCorrupt.
func soakReader(c net.Conn, seed uint64, rng *rand.Rand) (int, error) {
	want := streamBytes(seed)
	got, exp := make([]byte, 1<<20), make([]byte, 1<<20)
	off := 0
	for {
		if rng.IntN(4) == 0 {
			c.SetReadDeadline(time.Now().Add(time.Duration(1+rng.IntN(20)) * time.Millisecond))
		} else {
			c.SetReadDeadline(time.Time{})
		}
		n, err := c.Read(got[:soakSizes[rng.IntN(len(soakSizes))]])
		if n > 0 {
			want.Read(exp[:n])
			if !bytes.Equal(got[:n], exp[:n]) {
				return off, fmt.Errorf("%w in bytes [%d, %d)", errCorrupt, off, off+n)
			}
			off += n
		}
		switch {
		case err == io.EOF:
			return off, nil
		case err != nil && !isTimeout(err):
			return off, err
		}
	}
}

var errCorrupt = errors.New("corrupt data")

// soakSession runs one conn pair: both directions at once, random sizes and
// deadlines. A calm session must deliver every byte and end in EOF both
// ways; a chaotic one also uses write deadlines and closes one side at a
// random moment, and must only never deliver a wrong byte and never hang.
func soakSession(seed uint64, c1, c2 net.Conn) (calm bool, moved int, err error) {
	rng := rand.New(rand.NewPCG(seed, 99))
	calm = rng.IntN(3) != 0
	totals := [2]int{rng.IntN(4 << 20), rng.IntN(4 << 20)}
	conns := [2]net.Conn{c1, c2}
	type res struct {
		n, extra int // extra: bytes the failed last Write was given
		err      error
	}
	var wres, rres [2]res
	var wg sync.WaitGroup
	for i := range 2 {
		wr, rr := rand.New(rand.NewPCG(seed, uint64(i))), rand.New(rand.NewPCG(seed, uint64(10+i)))
		wg.Add(2)
		go func() {
			defer wg.Done()
			n, extra, err := soakWriter(conns[i], seed+uint64(i), totals[i], wr, !calm)
			wres[i] = res{n, extra, err}
		}()
		go func() {
			defer wg.Done()
			n, err := soakReader(conns[1-i], seed+uint64(i), rr)
			rres[i] = res{n, 0, err}
		}()
	}
	if !calm {
		victim := conns[rng.IntN(2)]
		time.AfterFunc(time.Duration(rng.IntN(50))*time.Millisecond, func() { victim.Close() })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		return calm, 0, fmt.Errorf("session %d (calm %v) hung: writers %+v readers %+v; stats %+v / %+v", seed, calm,
			wres, rres, c1.(rdmanet.Conn).Stats(), c2.(rdmanet.Conn).Stats())
	}
	c1.Close()
	c2.Close()
	for i := range 2 {
		moved += rres[i].n
		if errors.Is(rres[i].err, errCorrupt) {
			return calm, moved, fmt.Errorf("direction %d: %w", i, rres[i].err)
		}
		if rres[i].n > wres[i].n+wres[i].extra {
			return calm, moved, fmt.Errorf("direction %d: read %d bytes, only %d+%d written (%v)",
				i, rres[i].n, wres[i].n, wres[i].extra, wres[i].err)
		}
		if calm && (wres[i].err != nil || rres[i].err != nil || rres[i].n != totals[i]) {
			return calm, moved, fmt.Errorf("calm session %d direction %d: wrote %d/%d (%v), read %d (%v)",
				seed, i, wres[i].n, totals[i], wres[i].err, rres[i].n, rres[i].err)
		}
	}
	return calm, moved, nil
}

// TestSoak: random sizes both ways, random deadlines, random closes, on
// every in-process transport at once, for soakDuration; then no leak.
func TestSoak(t *testing.T) {
	dur := soakDuration(t)
	base := leakBaseline(t)
	// One listener per worker and transport: pipe pairs its dial with the
	// next Accept.
	tls := [][]string{{"self"}, {"shm"}, {"tcp"}}
	var ls [4][]net.Listener
	for w := range ls {
		for _, x := range tls {
			ls[w] = append(ls[w], listen(t, cfg(x...)))
		}
	}
	var sessions, calm, moved atomic.Int64
	var seeds atomic.Uint64
	end := time.Now().Add(dur)
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; time.Now().Before(end); i++ {
				k := i % len(tls)
				c1, c2, err := pipe(ls[w][k], cfg(tls[k]...))
				if err != nil {
					errs <- fmt.Errorf("%s: %w", tls[k][0], err)
					return
				}
				seed := seeds.Add(1) << 8
				ok, n, err := soakSession(seed, c1, c2)
				if err != nil {
					errs <- fmt.Errorf("%s: %w", tls[k][0], err)
					return
				}
				sessions.Add(1)
				moved.Add(int64(n))
				if ok {
					calm.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, wl := range ls {
		for _, l := range wl {
			l.Close()
		}
	}
	t.Logf("soak %v: %d sessions (%d calm, %d with deadlines and random closes), %d MiB checked",
		dur, sessions.Load(), calm.Load(), sessions.Load()-calm.Load(), moved.Load()>>20)
	if sessions.Load() == 0 {
		t.Fatal("no session completed")
	}
	base.check(t)
}
