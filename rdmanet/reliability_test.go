package rdmanet_test

// Load and leak tests (issue 7 "Load and scale"): many concurrent conns
// echoing random data, dial/close cycles, memory per idle conn. Sizes are
// small by default so `go test -race` stays quick; RDMANET_SOAK=1 runs the
// full ones (1,000 conns, 10,000 cycles, longer soak).

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gouct/gouct/rdmanet"
)

// soak reports whether the long versions run (RDMANET_SOAK=1).
func soak() bool { return os.Getenv("RDMANET_SOAK") != "" }

func countFDs(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// leakBase is what must come back after a test: fds, /dev/shm entries, the
// library's open-conn counters and the goroutines.
type leakBase struct {
	fds  int
	shm  []string
	open int64
	g    goleak.Option
}

// warmRuntime opens the process-wide runtime (worker, ifaces: fds and
// goroutines that live as long as the process) before a baseline is taken.
func warmRuntime(t testing.TB) {
	t.Helper()
	l := listen(t, nil)
	l.Close()
}

func leakBaseline(t testing.TB) *leakBase {
	t.Helper()
	warmRuntime(t)
	return &leakBase{fds: countFDs(t), shm: shmEntries(t), open: rdmanet.ReadCounters().Open(), g: goleak.IgnoreCurrent()}
}

// check waits (≤ 5 s: releases finish asynchronously) for fds, /dev/shm,
// open conns and goroutines to return to the baseline.
func (b *leakBase) check(t testing.TB) {
	t.Helper()
	end := time.Now().Add(5 * time.Second)
	for {
		fds, open := countFDs(t), rdmanet.ReadCounters().Open()
		var extra []string
		for _, e := range shmEntries(t) {
			if !slices.Contains(b.shm, e) {
				extra = append(extra, e)
			}
		}
		if fds <= b.fds && open <= b.open && len(extra) == 0 {
			break
		}
		if time.Now().After(end) {
			t.Errorf("leak: fds %d (baseline %d), open conns %d (baseline %d; %v), new /dev/shm entries %v",
				fds, b.fds, open, b.open, rdmanet.ReadCounters().ConnsOpen, extra)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := goleak.Find(append(slices.Clone(leakOpts), b.g)...); err != nil {
		t.Errorf("goroutines left: %v", err)
	}
}

// inProcessEcho runs serveEcho on a listener with c until stop is called
// (or the test ends).
func inProcessEcho(t testing.TB, c *rdmanet.Config) (addr string, stop func()) {
	t.Helper()
	l := listen(t, c)
	done := make(chan struct{})
	go func() { serveEcho(l); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { l.Close(); <-done }) }
	t.Cleanup(stop)
	return l.Addr().String(), stop
}

// dialMode dials a serveEcho server, checks the transport both sides name
// and sends the mode byte. Safe from any goroutine (no t.Fatal).
func dialMode(ctx context.Context, d *rdmanet.Dialer, addr string, mode byte, want string) (net.Conn, error) {
	c, err := d.DialContext(ctx, "rdma", addr)
	if err != nil {
		return nil, err
	}
	var n [1]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		c.Close()
		return nil, fmt.Errorf("read transport name: %w", err)
	}
	name := make([]byte, n[0])
	if _, err := io.ReadFull(c, name); err != nil {
		c.Close()
		return nil, fmt.Errorf("read transport name: %w", err)
	}
	if got := c.(rdmanet.Conn).Transport(); string(name) != want || got != want {
		c.Close()
		return nil, fmt.Errorf("transport: server %q, client %q; want %q", name, got, want)
	}
	if _, err := c.Write([]byte{mode}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// streamBytes is the deterministic byte stream number seed (the same bytes
// whatever the read sizes).
func streamBytes(seed uint64) *rand.ChaCha8 {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	s[31] = 0x5a
	return rand.NewChaCha8(s)
}

// echoVerify writes total bytes of stream seed in random sizes up to
// maxChunk (then CloseWrite) while reading the echo, and checks every byte
// and the EOF. Safe from any goroutine.
func echoVerify(c net.Conn, seed uint64, total, maxChunk int) error {
	werr := make(chan error, 1)
	go func() {
		src, rng := streamBytes(seed), rand.New(rand.NewPCG(seed, 7))
		buf := make([]byte, maxChunk)
		for left := total; left > 0; {
			n := min(1+rng.IntN(maxChunk), left)
			src.Read(buf[:n])
			if _, err := c.Write(buf[:n]); err != nil {
				werr <- fmt.Errorf("write: %w", err)
				return
			}
			left -= n
		}
		werr <- c.(rdmanet.Conn).CloseWrite()
	}()
	want := streamBytes(seed)
	got, exp := make([]byte, 32<<10), make([]byte, 32<<10)
	off := 0
	for {
		n, err := c.Read(got)
		if n > 0 {
			if off+n > total {
				return fmt.Errorf("echo longer than %d bytes", total)
			}
			want.Read(exp[:n])
			if !bytes.Equal(got[:n], exp[:n]) {
				return fmt.Errorf("corrupt echo in bytes [%d, %d)", off, off+n)
			}
			off += n
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read after %d bytes: %w (writer: %v)", off, err, errOf(werr))
		}
	}
	if off != total {
		return fmt.Errorf("echoed %d bytes, want %d", off, total)
	}
	return <-werr
}

func errOf(ch chan error) error {
	select {
	case err := <-ch:
		return err
	case <-time.After(time.Second):
		return errors.New("still running")
	}
}

// TestManyConns: n conns open at once, each echoing random data of random
// write sizes, every byte checked; then everything returns to the baseline.
func TestManyConns(t *testing.T) {
	n, per := 1000, 32<<10
	if soak() {
		per = 1 << 20
	}
	for _, tc := range []struct {
		name string
		tls  []string
		n    int
	}{
		{"shm two processes", nil, n},
		{"self", []string{"self"}, n / 4},
		{"shm", []string{"shm"}, n / 4},
		{"tcp", []string{"tcp"}, n / 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.n
			if soak() {
				n = 1000
			}
			want := tc.name
			var addr string
			if tc.tls == nil {
				skipIfForced(t)
				addr = startServer(t).addrs.Echo
				want = wantTwoProc
			}
			base := leakBaseline(t)
			stop, ends := func() {}, 1
			if tc.tls != nil {
				addr, stop = inProcessEcho(t, cfg(tc.tls...))
				ends = 2 // both ends in this process
			}
			manyConns(t, addr, cfg(tc.tls...), want, n, ends, per)
			stop()
			base.check(t)
		})
	}
}

// manyConns opens n conns to the serveEcho server at addr (ends: conn ends
// per conn in this process), echoes per bytes on each at once, closes them.
func manyConns(t *testing.T, addr string, c *rdmanet.Config, want string, n, ends, per int) {
	before := rdmanet.ReadCounters()
	d := &rdmanet.Dialer{Config: c, Timeout: 30 * time.Second}
	conns := make([]net.Conn, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				c, err := dialMode(context.Background(), d, addr, 'e', want)
				if err != nil {
					errs <- fmt.Errorf("conn %d: %w", i, err)
					return
				}
				conns[i] = c
			}
		}()
	}
	wg.Wait()
	dialTime := time.Since(start)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if open := rdmanet.ReadCounters().ConnsOpen[want] - before.ConnsOpen[want]; open != int64(n*ends) {
		t.Errorf("conns_open[%s] grew by %d with %d conns open", want, open, n)
	}
	start = time.Now()
	errs = make(chan error, n)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := echoVerify(c, uint64(i), per, 20000); err != nil {
				errs <- fmt.Errorf("conn %d: %w (stats %+v)", i, err, c.(rdmanet.Conn).Stats())
			}
		}()
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if failed++; failed <= 5 {
			t.Error(err)
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d conns failed", failed, n)
	}
	el := time.Since(start)
	t.Logf("%d conns on %s: dialed in %v (%.0f conns/s); echoed %d KiB each in %v (%.1f MB/s total)",
		n, want, dialTime.Round(time.Millisecond), float64(n)/dialTime.Seconds(), per>>10,
		el.Round(time.Millisecond), float64(2*n*per)/el.Seconds()/1e6)
	for i, c := range conns {
		c.Close()
		conns[i] = nil
	}
	after := rdmanet.ReadCounters()
	if got := after.BytesWritten - before.BytesWritten; got < uint64(n*per) {
		t.Errorf("bytes_written grew by %d, want ≥ %d", got, n*per)
	}
}

// TestDialCloseCycles: dial, exchange a few checked bytes, close; many
// times, several dialers at once; nothing grows.
func TestDialCloseCycles(t *testing.T) {
	cycles := 4000
	if raceOn {
		cycles = 2000
	}
	if soak() {
		cycles = 10000
	}
	for _, tc := range []struct {
		name string
		tls  []string
		div  int
	}{
		{"shm two processes", nil, 1},
		{"self", []string{"self"}, 4},
		{"tcp", []string{"tcp"}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.name
			var addr string
			if tc.tls == nil {
				skipIfForced(t)
				addr = startServer(t).addrs.Echo
				want = wantTwoProc
			}
			base := leakBaseline(t)
			stop := func() {}
			if tc.tls != nil {
				addr, stop = inProcessEcho(t, cfg(tc.tls...))
			}
			before := rdmanet.ReadCounters()
			n := cycles / tc.div
			d := &rdmanet.Dialer{Config: cfg(tc.tls...), Timeout: 10 * time.Second}
			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			start := time.Now()
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					msg, got := make([]byte, 64), make([]byte, 64)
					for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
						c, err := dialMode(context.Background(), d, addr, 'e', want)
						if err != nil {
							errs <- fmt.Errorf("cycle %d: %w", i, err)
							return
						}
						streamBytes(uint64(i)).Read(msg)
						_, err = c.Write(msg)
						if err == nil {
							_, err = io.ReadFull(c, got)
						}
						c.Close()
						if err == nil && !bytes.Equal(got, msg) {
							err = errors.New("corrupt echo")
						}
						if err != nil {
							errs <- fmt.Errorf("cycle %d: %w", i, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			el := time.Since(start)
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			t.Logf("%d dial/close cycles on %s in %v: %.0f conns/s", n, want, el.Round(time.Millisecond), float64(n)/el.Seconds())
			if got := rdmanet.ReadCounters().ConnsTotal[want] - before.ConnsTotal[want]; got < int64(n) {
				t.Errorf("conns_total[%s] grew by %d after %d dials", want, got, n)
			}
			stop()
			base.check(t)
		})
	}
}

// rss is the process's resident set in bytes.
func rss(t testing.TB) int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Fatal(err)
	}
	var size, res int64
	fmt.Sscan(string(b), &size, &res)
	return res * int64(os.Getpagesize())
}

// goMem is the Go runtime's in-use memory: heap objects' spans and stacks.
// It collects first and returns free memory to the OS, so that rss after it
// counts live memory only.
func goMem() int64 {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse + ms.StackInuse)
}

// TestIdleConnMemory measures what an idle conn costs per end (both ends
// live in this process: the totals are divided by 2n) and bounds it: the
// Go heap and stacks always, the resident set without the race detector
// (its shadow memory inflates RSS). Goal: shm ≤ 64 KiB per idle conn.
func TestIdleConnMemory(t *testing.T) {
	n := 300
	if soak() {
		n = 2000
	}
	for _, tc := range []struct {
		tl    string
		bound int64 // bytes per conn end
	}{
		{"tcp", 64 << 10},
		{"shm", 64 << 10},
		{"self", 64 << 10},
	} {
		t.Run(tc.tl, func(t *testing.T) {
			c := cfg(tc.tl)
			l := listen(t, c)
			defer l.Close()
			// One conn first so that per-iface and per-peer state (mapped
			// FIFOs, pools) is not counted per conn.
			warm := make([]net.Conn, 0, 2)
			c1, c2, err := pipe(l, c)
			if err != nil {
				t.Fatal(err)
			}
			warm = append(warm, c1, c2)
			defer func() {
				for _, c := range warm {
					c.Close()
				}
			}()
			if _, err := c1.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c2, make([]byte, 1)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond) // the previous subtest's conns finish releasing
			fds0, heap0, rss0 := countFDs(t), goMem(), rss(t)
			conns := make([]net.Conn, 0, 2*n)
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			for range n {
				c1, c2, err := pipe(l, c)
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c1, c2)
				if transportOf(t, c1) != tc.tl {
					t.Fatalf("conn on %s", transportOf(t, c1))
				}
			}
			// One byte each way: the conns have been used, then idle.
			for i := 0; i < len(conns); i += 2 {
				if _, err := conns[i].Write([]byte("x")); err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadFull(conns[i+1], make([]byte, 1)); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(50 * time.Millisecond)
			fds, heap, res := countFDs(t)-fds0, goMem()-heap0, rss(t)-rss0
			ends := int64(2 * n)
			t.Logf("%s: %d idle conns: per conn end %.1f KiB Go heap+stacks, %.1f KiB RSS, %.1f fds",
				tc.tl, n, float64(heap)/float64(ends)/1024, float64(res)/float64(ends)/1024, float64(fds)/float64(ends))
			if heap/ends > tc.bound {
				t.Errorf("%s: %d B of Go memory per idle conn end, bound %d", tc.tl, heap/ends, tc.bound)
			}
			if !raceOn && res/ends > tc.bound {
				t.Errorf("%s: %d B RSS per idle conn end, bound %d", tc.tl, res/ends, tc.bound)
			}
			if raceOn {
				t.Logf("race detector on: RSS bound not checked")
			}
		})
	}
}
