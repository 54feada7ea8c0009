package stream

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/nettest"

	"github.com/gouct/gouct/uct"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNetConn(t *testing.T) {
	for _, tl := range transports() {
		t.Run(tl, func(t *testing.T) {
			e := newEnv(t, tl, nil)
			nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
				p, err := e.newPair()
				if err != nil {
					return nil, nil, nil, err
				}
				return p.c1, p.c2, p.close, nil
			})
		})
	}
}

// TestNetConnSharedMux: both ends on one Mux, one iface, one worker.
func TestNetConnSharedMux(t *testing.T) {
	forEachTL(t, func(t *testing.T, tl string) {
		e := newSharedEnv(t, tl, nil)
		nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
			p, err := e.newPair()
			if err != nil {
				return nil, nil, nil, err
			}
			return p.c1, p.c2, p.close, nil
		})
	})
}

// TestNetConnSmallWindow runs nettest with the smallest window, so every
// test crosses credit exhaustion, and with Read spinning disabled (park path).
func TestNetConnSmallWindow(t *testing.T) {
	cfg := uct.DefaultConfig()
	cfg.RxWindow = initialCredit
	cfg.ReadSpin = 0
	e := newEnv(t, "self", cfg)
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		p, err := e.newPair()
		if err != nil {
			return nil, nil, nil, err
		}
		return p.c1, p.c2, p.close, nil
	})
}

// integritySizes crosses every protocol threshold of m.
func integritySizes(m *Mux) []int {
	s := []int{0, 1, 2, 7, 8, 9}
	if m.maxShort > 0 {
		s = append(s, m.maxShort-1, m.maxShort, m.maxShort+1)
	}
	s = append(s, m.maxFrag-1, m.maxFrag, m.maxFrag+1, 2*m.maxFrag+3)
	if t := m.rndvThresh; t > 0 && t < 8<<20 {
		s = append(s, t-1, t, t+1)
	}
	s = append(s, initialCredit-1, initialCredit+1, m.window-1, m.window+1, 3<<20+17, 9<<20+5)
	return s
}

// pick draws a size: mostly one of the first ten (small, the protocol
// edges: many messages), one time in 32 any (large: many bytes).
func pick(rng *rand.Rand, sizes []int) int {
	if rng.Intn(32) != 0 {
		return sizes[rng.Intn(min(10, len(sizes)))]
	}
	return sizes[rng.Intn(len(sizes))]
}

// forEachTL runs f as a subtest per transport.
func forEachTL(t *testing.T, f func(t *testing.T, tl string)) {
	for _, tl := range transports() {
		t.Run(tl, func(t *testing.T) { f(t, tl) })
	}
}

// writeStream writes total bytes of seeded random data to c in random sizes drawn
// from sizes and returns their hash; the reader side hashes what it reads.
func writeStream(c net.Conn, seed int64, total int, sizes []int) ([32]byte, error) {
	rng := rand.New(rand.NewSource(seed))
	buf := make([]byte, 10<<20)
	h := sha256.New()
	for sent := 0; sent < total; {
		n := min(pick(rng, sizes), total-sent)
		b := buf[:n]
		rng.Read(b)
		h.Write(b)
		w, err := c.Write(b)
		if err != nil {
			return [32]byte{}, err
		}
		if w != n {
			return [32]byte{}, io.ErrShortWrite
		}
		// Reuse of p right after Write must not corrupt the stream.
		clear(b)
		sent += n
	}
	var out [32]byte
	h.Sum(out[:0])
	return out, nil
}

func readStream(c net.Conn, seed int64, total int, sizes []int) ([32]byte, error) {
	rng := rand.New(rand.NewSource(seed))
	buf := make([]byte, 10<<20)
	h := sha256.New()
	for got := 0; got < total; {
		n := max(1, min(pick(rng, sizes), len(buf)))
		k, err := c.Read(buf[:n])
		h.Write(buf[:k])
		got += k
		if err != nil {
			if err == io.EOF && got == total {
				break
			}
			return [32]byte{}, err
		}
	}
	var out [32]byte
	h.Sum(out[:0])
	return out, nil
}

func TestIntegrity(t *testing.T) {
	total := 64 << 20
	if v := os.Getenv("STREAM_INTEGRITY_MB"); v != "" {
		mb, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("STREAM_INTEGRITY_MB=%q: %v", v, err)
		}
		total = mb << 20
	}
	for _, tl := range transports() {
		t.Run(tl, func(t *testing.T) { testIntegrity(t, tl, nil, total) })
		// Copies only: every large write is pipelined bcopy across many
		// credit round trips of a small window.
		cfg := uct.DefaultConfig()
		cfg.RndvThresh = 1 << 30
		cfg.RxWindow = 256 << 10
		t.Run(tl+"-copy", func(t *testing.T) { testIntegrity(t, tl, cfg, total/4) })
	}
}

func testIntegrity(t *testing.T, tl string, cfg *uct.Config, total int) {
	e := newEnv(t, tl, cfg)
	p := e.pair(t)
	defer p.close()
	m := e.a.mux
	sizes := integritySizes(m)
	t.Logf("%s: maxShort %d maxFrag %d rndv %d window %d; %d MiB each way",
		tl, m.maxShort, m.maxFrag, m.rndvThresh, m.window, total>>21)
	var wg sync.WaitGroup
	res := make([][32]byte, 4)
	errs := make([]error, 4)
	run := func(i int, f func() ([32]byte, error)) {
		wg.Add(1)
		go func() { defer wg.Done(); res[i], errs[i] = f() }()
	}
	run(0, func() ([32]byte, error) { return writeStream(p.c1, 1, total/2, sizes) })
	run(1, func() ([32]byte, error) { return readStream(p.c2, 2, total/2, sizes) })
	run(2, func() ([32]byte, error) { return writeStream(p.c2, 3, total/2, sizes) })
	run(3, func() ([32]byte, error) { return readStream(p.c1, 4, total/2, sizes) })
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	if res[0] != res[1] || res[2] != res[3] {
		t.Fatal("data corrupted: checksums differ")
	}
	s := p.c1.Stats()
	t.Logf("c1 stats %+v", s)
	if s.MsgShort == 0 || (m.maxFrag > m.maxShort && s.MsgBcopy == 0) ||
		(m.rndvThresh > 0 && m.rndvThresh < 8<<20 && s.MsgRndv == 0) {
		t.Errorf("not every protocol exercised: %+v", s)
	}
	if s.BytesWritten != uint64(total/2) || s.BytesRead != uint64(total/2) {
		t.Errorf("byte counters %d/%d, want %d", s.BytesWritten, s.BytesRead, total/2)
	}
}

// TestRendezvousReadSizes pulls one rendezvous write with tiny, medium and
// huge Read buffers (staged and direct pulls).
func TestRendezvousReadSizes(t *testing.T) { forEachTL(t, testRendezvousReadSizes) }

// rndvEnv is newEnv with rendezvous from 64 KiB on unless RDMANET_RNDV_THRESH
// says otherwise (shared memory's own threshold is a few MiB): for tests of
// the rendezvous mechanics with writes of about 1 MiB.
func rndvEnv(t *testing.T, tl string) *env {
	cfg := envConfig(t)
	if cfg.RndvThresh == 0 {
		cfg.RndvThresh = 64 << 10
	}
	return newEnv(t, tl, cfg)
}

func testRendezvousReadSizes(t *testing.T, tl string) {
	e := rndvEnv(t, tl)
	if e.a.mux.rndvThresh == 0 {
		if e.a.ti.Attr.Cap.Has(uct.CapGetZcopy) {
			t.Fatal("GetZcopy without rendezvous")
		}
		t.Skipf("%s has no GetZcopy", tl)
	}
	for _, rd := range []int{3, 1000, 64 << 10, 8 << 20} {
		p := e.pair(t)
		size := 5<<20 + 3
		if rd < 64<<10 {
			size = 600<<10 + 3 // several staging buffers' worth
		}
		want := make([]byte, size)
		rand.New(rand.NewSource(int64(rd))).Read(want)
		errc := make(chan error, 1)
		go func() {
			_, err := p.c1.Write(want)
			errc <- err
		}()
		got := make([]byte, 0, len(want))
		buf := make([]byte, rd)
		for len(got) < len(want) {
			n, err := p.c2.Read(buf)
			if err != nil {
				t.Fatalf("read %d: %v", rd, err)
			}
			got = append(got, buf[:n]...)
		}
		if err := <-errc; err != nil {
			t.Fatalf("write: %v", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("read size %d: data differs", rd)
		}
		if s := p.c1.Stats(); s.MsgRndv != 1 {
			t.Fatalf("rendezvous messages %d, want 1", s.MsgRndv)
		}
		p.close()
	}
}

// TestNoRendezvousWithoutGet forces bcopy when the threshold is disabled.
func TestRndvThreshold(t *testing.T) {
	a := uct.IfaceAttr{Cap: uct.CapGetZcopy, MaxGet: 1 << 30, Bandwidth: uct.Bandwidth{Dedicated: 12e9},
		Latency: uct.LinearFunc{C: 1e-6}}
	md := uct.MDAttr{RegCost: uct.LinearFunc{C: 16e-6, M: 0.06e-9}}
	cfg := uct.DefaultConfig()
	if got := rndvThreshold(cfg, a, md, 8184, uct.DeviceNet); got < 64<<10 || got > 256<<10 {
		t.Errorf("derived threshold %d outside [64K,256K]", got)
	}
	// Shared memory: pipelined copies up to a few MiB, whatever the costs.
	shmMD := uct.MDAttr{RegCost: uct.LinearFunc{C: 20e-9}}
	if got := rndvThreshold(cfg, a, shmMD, 8184, uct.DeviceShm); got != shmRndvThresh {
		t.Errorf("shm threshold %d, want %d", got, shmRndvThresh)
	}
	cfg.RndvThresh = 100000
	if got := rndvThreshold(cfg, a, md, 8184, uct.DeviceNet); got != 100000 {
		t.Errorf("configured threshold: got %d", got)
	}
	if got := rndvThreshold(cfg, a, shmMD, 8184, uct.DeviceShm); got != 100000 {
		t.Errorf("configured threshold on shm: got %d", got)
	}
	a.Cap = 0
	if got := rndvThreshold(cfg, a, md, 8184, uct.DeviceNet); got != 0 {
		t.Errorf("without GetZcopy: threshold %d, want 0 (always bcopy)", got)
	}
}

func checkTimeout(t *testing.T, op string, err error) {
	t.Helper()
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != op || oe.Net != "rdma" {
		t.Fatalf("%s: want *net.OpError{Op:%q, Net:rdma}, got %T %v", op, op, err, err)
	}
	if !oe.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%s: not a timeout: %v", op, err)
	}
}

func TestDeadlines(t *testing.T) { forEachTL(t, testDeadlines) }

func testDeadlines(t *testing.T, tl string) {
	e := newEnv(t, tl, nil)
	p := e.pair(t)
	defer p.close()

	// A future read deadline expires a blocked Read.
	p.c1.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	t0 := time.Now()
	_, err := p.c1.Read(make([]byte, 10))
	checkTimeout(t, "read", err)
	if d := time.Since(t0); d < 40*time.Millisecond || d > 2*time.Second {
		t.Fatalf("read timed out after %v", d)
	}
	// Clearing the deadline makes Read work again.
	p.c1.SetReadDeadline(time.Time{})
	go p.c2.Write([]byte("x"))
	if n, err := p.c1.Read(make([]byte, 10)); n != 1 || err != nil {
		t.Fatalf("read after clearing deadline: %d %v", n, err)
	}

	// A Write blocked on credit (nobody reads) times out; setting a past
	// deadline wakes it.
	big := make([]byte, 16<<20)
	errc := make(chan error, 1)
	go func() {
		var err error
		for err == nil { // bcopy writes: rendezvous would not consume credit
			_, err = p.c2.Write(big[:e.a.mux.maxFrag])
		}
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-errc:
		t.Fatalf("write did not block at zero credit: %v", err)
	default:
	}
	p.c2.SetWriteDeadline(time.Unix(1, 0))
	select {
	case err := <-errc:
		checkTimeout(t, "write", err)
	case <-time.After(2 * time.Second):
		t.Fatal("setting a past deadline did not wake the blocked Write")
	}
	// The write timeout does not break reads on the other side.
	if _, err := p.c1.Read(make([]byte, 1)); err != nil {
		t.Fatalf("read after peer's write timeout: %v", err)
	}
}

func TestCloseWrite(t *testing.T) { forEachTL(t, testCloseWrite) }

func testCloseWrite(t *testing.T, tl string) {
	e := newEnv(t, tl, nil)
	p := e.pair(t)
	defer p.close()
	msg := bytes.Repeat([]byte("half-close "), 100000)
	go func() {
		p.c1.Write(msg)
		p.c1.CloseWrite()
	}()
	got, err := io.ReadAll(p.c2)
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("read until EOF: %d bytes, %v", len(got), err)
	}
	if _, err := p.c1.Write([]byte("x")); !errors.Is(err, ErrWriteClosed) {
		t.Fatalf("write after CloseWrite: %v", err)
	}
	// The other direction still works.
	if _, err := p.c2.Write([]byte("reply")); err != nil {
		t.Fatal(err)
	}
	p.c2.Close()
	got, err = io.ReadAll(p.c1)
	if err != nil || string(got) != "reply" {
		t.Fatalf("reverse direction: %q %v", got, err)
	}
}

// TestCloseWithDataInFlight closes right after writing: the peer must still
// read every byte, then io.EOF, whichever of FIN and the notice it sees first.
func TestCloseWithDataInFlight(t *testing.T) {
	forEachTL(t, func(t *testing.T, tl string) { testCloseWithDataInFlight(t, tl, false) })
	t.Run("tcp-ctl", func(t *testing.T) { testCloseWithDataInFlight(t, "self", true) })
}

func testCloseWithDataInFlight(t *testing.T, tl string, tcpCtl bool) {
	e := newEnv(t, tl, nil)
	if tcpCtl {
		e.tcpCtl = t
	}
	for i := 0; i < 8; i++ {
		p := e.pair(t)
		want := make([]byte, 1<<20+i*1001)
		rand.New(rand.NewSource(int64(i))).Read(want)
		done := make(chan error, 1)
		go func() {
			// Writes below the rendezvous threshold, all within the window:
			// they return before the peer reads anything.
			var err error
			for off := 0; off < len(want) && err == nil; off += 32 << 10 {
				_, err = p.c1.Write(want[off:min(off+32<<10, len(want))])
			}
			if err == nil {
				t0 := time.Now()
				err = p.c1.Close()
				if d := time.Since(t0); d > closeTimeout/2 {
					err = fmt.Errorf("Close took %v: FIN or flush stuck", d)
				}
			}
			done <- err
		}()
		if i%2 == 0 {
			// Let the close (and its notice) happen before reading.
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		got, err := io.ReadAll(p.c2)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("iteration %d: read %d of %d bytes, err %v", i, len(got), len(want), err)
		}
		if i%2 != 0 {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		// Writes to a peer that closed fail.
		var werr error
		for j := 0; j < 100 && werr == nil; j++ {
			_, werr = p.c2.Write([]byte("late"))
			time.Sleep(time.Millisecond)
		}
		if !errors.Is(werr, ErrPeerClosed) || !errors.Is(werr, syscall.EPIPE) {
			t.Fatalf("write to closed peer: %v", werr)
		}
		t0 := time.Now()
		p.c2.Close()
		if d := time.Since(t0); d > closeTimeout/4 {
			t.Fatalf("closing after the peer closed took %v", d)
		}
	}
}

func TestCloseUnblocks(t *testing.T) { forEachTL(t, testCloseUnblocks) }

func testCloseUnblocks(t *testing.T, tl string) {
	e := newEnv(t, tl, nil)
	p := e.pair(t)
	errc := make(chan error, 1)
	go func() {
		_, err := p.c1.Read(make([]byte, 10))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	p.c1.Close()
	err := <-errc
	var oe *net.OpError
	if !errors.As(err, &oe) || !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
	if err := p.c1.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
	// The peer sees EOF.
	if _, err := p.c2.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("peer read: %v, want bare io.EOF", err)
	}
	p.c2.Close()
}

// TestPeerDeath kills the liveness channel without notice: blocked calls
// on the survivor fail within a second with a reset.
func TestPeerDeath(t *testing.T) {
	forEachTL(t, func(t *testing.T, tl string) { testPeerDeath(t, tl, false) })
	t.Run("tcp-ctl", func(t *testing.T) { testPeerDeath(t, "self", true) })
}

func testPeerDeath(t *testing.T, tl string, tcpCtl bool) {
	e := newEnv(t, tl, nil)
	if tcpCtl {
		e.tcpCtl = t
	}
	p := e.pair(t)
	defer p.close()
	rerr := make(chan error, 1)
	werr := make(chan error, 1)
	go func() {
		_, err := p.c2.Read(make([]byte, 10))
		rerr <- err
	}()
	go func() {
		var err error
		for err == nil {
			_, err = p.c2.Write(make([]byte, 32<<10))
		}
		werr <- err
	}()
	time.Sleep(50 * time.Millisecond)
	t0 := time.Now()
	// "Process 1 died": its end of the bootstrap socket closes and its
	// iface goes away.
	p.ctl1.Close()
	e.a.ti.Iface.Close()
	for _, ch := range []chan error{rerr, werr} {
		select {
		case err := <-ch:
			if !errors.Is(err, ErrPeerDied) || !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("want peer-died reset, got %v", err)
			}
		case <-time.After(time.Second):
			t.Fatal("blocked call did not fail within 1s of peer death")
		}
	}
	t.Logf("blocked calls failed %v after peer death", time.Since(t0))
	t1 := time.Now()
	p.c2.Close()
	if d := time.Since(t1); d > closeTimeout/2 {
		t.Fatalf("Close after peer death took %v", d)
	}
}

func TestAbort(t *testing.T) { forEachTL(t, testAbort) }

func testAbort(t *testing.T, tl string) {
	e := newEnv(t, tl, nil)
	p := e.pair(t)
	defer p.close()
	errc := make(chan error, 1)
	go func() {
		_, err := p.c2.Read(make([]byte, 10))
		errc <- err
	}()
	p.c1.Abort(errors.New("test abort"))
	p.c1.Abort(nil) // idempotent
	select {
	case err := <-errc:
		if !errors.Is(err, ErrReset) || !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("read on aborted peer: %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("peer not reset")
	}
	if _, err := p.c1.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after abort: %v", err)
	}
	// Abort before Start releases the id.
	c, err := e.a.mux.NewConn()
	if err != nil {
		t.Fatal(err)
	}
	c.Abort(nil)
	if n := len(e.a.mux.conns); n != 0 {
		t.Fatalf("%d conns left in the mux", n)
	}
}

func TestMuxClose(t *testing.T) { forEachTL(t, testMuxClose) }

func testMuxClose(t *testing.T, tl string) {
	e := newEnv(t, tl, nil)
	p := e.pair(t)
	defer p.close()
	errc := make(chan error, 1)
	go func() {
		_, err := p.c2.Read(make([]byte, 10))
		errc <- err
	}()
	e.a.mux.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("read after peer's mux closed: %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("peer not reset")
	}
	if _, err := e.a.mux.NewConn(); err == nil {
		t.Fatal("NewConn on a closed mux succeeded")
	}
}

// TestEarlyData: messages for a conn that arrive before its Start are buffered.
func TestEarlyData(t *testing.T) { forEachTL(t, testEarlyData) }

func testEarlyData(t *testing.T, tl string) {
	e := newEnv(t, tl, nil)
	c1, _ := e.a.mux.NewConn()
	c2, _ := e.b.mux.NewConn()
	ea, eb, err := connectEPs(e.a, e.b)
	if err != nil {
		t.Fatal(err)
	}
	if err := c1.Start(ea, c2.ID(), nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Write([]byte("early")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if err := c2.Start(eb, c1.ID(), nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	n, err := c2.Read(buf)
	if err != nil || string(buf[:n]) != "early" {
		t.Fatalf("early data: %q %v", buf[:n], err)
	}
	if err := c2.Start(eb, c1.ID(), nil, nil, nil); err == nil {
		t.Fatal("second Start succeeded")
	}
	c1.Close()
	c2.Close()
}

// TestMalformed sends hostile messages at a Mux: it must drop or reset,
// never panic, and other conns keep working.
func TestMalformed(t *testing.T) { forEachTL(t, testMalformed) }

func testMalformed(t *testing.T, tl string) {
	e := newEnv(t, tl, nil)
	victim := e.pair(t)
	defer victim.close()
	bystander := e.pair(t)
	defer bystander.close()
	raw, _, err := connectEPs(e.a, e.b)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	id := victim.c2.ID()
	send := func(am uint8, hdr uint64, body []byte) {
		t.Helper()
		for {
			err := raw.AMShort(am, hdr, body)
			if err == nil {
				return
			}
			if !errors.Is(err, uct.ErrNoResource) {
				t.Fatal(err)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// Unknown conn ids and short messages are dropped.
	for am := amData; am <= amRST; am++ {
		send(am, makeHdr(0xdeadbeef, 1), []byte{1, 2, 3})
		raw.AMBcopy(am, func(b []byte) int { return copy(b, []byte{1, 2, 3}) })
	}
	// Malformed bodies for the victim: each resets it; later ones are dropped.
	send(amRTS, makeHdr(id, 0), []byte{1, 2, 3})
	send(amATS, makeHdr(id, 0), []byte{9, 9, 9, 9})
	send(amData, makeHdr(id, 0), make([]byte, 100))
	send(amCredit, makeHdr(id, 0xffffffff), nil)
	_, err = victim.c2.Read(make([]byte, 10))
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("victim read: %v, want protocol reset", err)
	}
	// The victim's peer got the RST.
	_, err = victim.c1.Read(make([]byte, 10))
	if !errors.Is(err, ErrReset) {
		t.Fatalf("victim's peer read: %v, want reset", err)
	}
	// The bystander is unaffected.
	go bystander.c1.Write([]byte("still fine"))
	buf := make([]byte, 20)
	n, err := bystander.c2.Read(buf)
	if err != nil || string(buf[:n]) != "still fine" {
		t.Fatalf("bystander: %q %v", buf[:n], err)
	}
}

// TestDataBeyondWindow: a peer that ignores credit is reset.
func TestDataBeyondWindow(t *testing.T) { forEachTL(t, testDataBeyondWindow) }

func testDataBeyondWindow(t *testing.T, tl string) {
	e := newEnv(t, tl, nil)
	p := e.pair(t)
	defer p.close()
	raw, _, err := connectEPs(e.a, e.b)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	chunk := make([]byte, e.a.mux.maxFrag)
	sent := 0
	for sent <= e.b.mux.window+len(chunk) {
		_, err := raw.AMBcopy(amData, func(b []byte) int {
			copy(b, []byte{byte(p.c2.ID()), byte(p.c2.ID() >> 8), byte(p.c2.ID() >> 16), byte(p.c2.ID() >> 24), 0, 0, 0, 0})
			return hdrLen + copy(b[hdrLen:], chunk)
		})
		if errors.Is(err, uct.ErrNoResource) {
			time.Sleep(100 * time.Microsecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		sent += len(chunk)
	}
	// Nobody reads (reading would return credit): the overrun is detected
	// by the handler alone.
	deadline := time.Now().Add(2 * time.Second)
	for {
		p.c2.mu.Lock()
		err := p.c2.err
		p.c2.mu.Unlock()
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("overrunning the window did not reset the conn")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := p.c2.Read(make([]byte, 10)); !errors.Is(err, ErrProtocol) {
		t.Fatalf("read: %v, want protocol reset", err)
	}
}

// TestAllocs: steady-state Read and Write allocate nothing.
func TestAllocs(t *testing.T) { forEachTL(t, testAllocs) }

func testAllocs(t *testing.T, tl string) {
	e := newEnv(t, tl, nil)
	p := e.pair(t)
	defer p.close()
	// 256 KiB and 1 MiB: pipelined bcopy on shm, rendezvous elsewhere.
	for _, size := range []int{64, e.a.mux.maxShort + 1, 4 * e.a.mux.maxFrag, 256 << 10, 1 << 20} {
		w := make([]byte, size)
		r := make([]byte, size)
		// Warm up pools.
		for i := 0; i < 100; i++ {
			p.c1.Write(w)
			io.ReadFull(p.c2, r)
		}
		allocs := testing.AllocsPerRun(200, func() {
			if _, err := p.c1.Write(w); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(p.c2, r); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > 0 {
			t.Errorf("size %d: %.1f allocations per Write+Read, want 0", size, allocs)
		}
	}
}

// manualPair starts c1 without a liveness channel and gives the test the
// far end of c2's, so the test plays c1's liveness role.
func manualPair(t *testing.T, e *env) (c1, c2 *Conn, ctl net.Conn) {
	t.Helper()
	c1, _ = e.a.mux.NewConn()
	c2, _ = e.b.mux.NewConn()
	ea, eb, err := connectEPs(e.a, e.b)
	if err != nil {
		t.Fatal(err)
	}
	x, y := net.Pipe()
	if err := c1.Start(ea, c2.ID(), nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := c2.Start(eb, c1.ID(), y, nil, nil); err != nil {
		t.Fatal(err)
	}
	return c1, c2, x
}

// TestNoticeBeforeFIN: the closing notice overtakes the data and FIN; the
// reader still gets every byte, then io.EOF, and its Writes fail at once.
func TestNoticeBeforeFIN(t *testing.T) {
	e := newEnv(t, "self", nil)
	c1, c2, ctl := manualPair(t, e)
	defer c1.Close()
	defer c2.Close()
	if _, err := ctl.Write([]byte{noticeClose}); err != nil {
		t.Fatal(err)
	}
	ctl.Close()
	time.Sleep(20 * time.Millisecond)
	if _, err := c2.Write([]byte("x")); !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("write after notice: %v", err)
	}
	want := bytes.Repeat([]byte("late data "), 50000)
	go func() {
		c1.Write(want)
		c1.CloseWrite()
	}()
	got, err := io.ReadAll(c2)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d of %d bytes: %v", len(got), len(want), err)
	}
}

// TestNoticeWithoutFIN: a closing notice whose FIN never comes resets the
// conn after the grace period instead of hanging.
func TestNoticeWithoutFIN(t *testing.T) {
	old := finGrace
	finGrace = 100 * time.Millisecond
	defer func() { finGrace = old }()
	e := newEnv(t, "self", nil)
	c1, c2, ctl := manualPair(t, e)
	defer c1.Close()
	defer c2.Close()
	ctl.Write([]byte{noticeClose})
	ctl.Close()
	c2.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := c2.Read(make([]byte, 10))
	if !errors.Is(err, ErrPeerDied) {
		t.Fatalf("read: %v, want peer-died reset after the FIN grace", err)
	}
}

// TestBadNotice: garbage on the liveness channel resets the conn.
func TestBadNotice(t *testing.T) {
	e := newEnv(t, "self", nil)
	c1, c2, ctl := manualPair(t, e)
	defer c1.Close()
	defer c2.Close()
	defer ctl.Close()
	ctl.Write([]byte{'?'})
	_, err := c2.Read(make([]byte, 10))
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("read: %v, want protocol reset", err)
	}
}

// TestRendezvousWithoutReader: a rendezvous Write within the window returns
// without the peer application reading (the peer pulls ahead into its
// buffers), so both ends may write a large message, then read, as over TCP.
func TestRendezvousWithoutReader(t *testing.T) { forEachTL(t, testRendezvousWithoutReader) }

func testRendezvousWithoutReader(t *testing.T, tl string) {
	e := rndvEnv(t, tl)
	if e.a.mux.rndvThresh == 0 {
		t.Skipf("%s has no GetZcopy", tl)
	}
	p := e.pair(t)
	defer p.close()
	msg := func(seed int64) []byte {
		b := make([]byte, 1<<20+5)
		rand.New(rand.NewSource(seed)).Read(b)
		return b
	}
	m1, m2 := msg(1), msg(2)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	got := make([][]byte, 2)
	exchange := func(i int, c net.Conn, out []byte) {
		defer wg.Done()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(out); err != nil {
			errs[i] = err
			return
		}
		got[i] = make([]byte, len(out))
		_, errs[i] = io.ReadFull(c, got[i])
	}
	wg.Add(2)
	go exchange(0, p.c1, m1)
	go exchange(1, p.c2, m2)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("simultaneous large writes: %v", err)
	}
	if !bytes.Equal(got[0], m2) || !bytes.Equal(got[1], m1) {
		t.Fatal("data differs")
	}
	if s := p.c1.Stats(); s.MsgRndv != 1 {
		t.Fatalf("rendezvous messages %d, want 1", s.MsgRndv)
	}
}

// TestRendezvousSplit: a Write beyond the largest registration goes as
// several rendezvous (and a tail below the threshold by copy).
func TestRendezvousSplit(t *testing.T) {
	e := newEnv(t, "self", nil)
	e.a.mux.maxRndv = 100 << 10
	p := e.pair(t)
	defer p.close()
	want := make([]byte, 1<<20)
	rand.New(rand.NewSource(9)).Read(want)
	go p.c1.Write(want)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(p.c2, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read: %v (equal %v)", err, bytes.Equal(got, want))
	}
	// 1 MiB = 10 × 100 KiB + 24 KiB: ten rendezvous, the tail by copy.
	if s := p.c1.Stats(); s.MsgRndv != 10 || s.MsgBcopy == 0 {
		t.Fatalf("stats %+v, want 10 rendezvous and bcopy for the tail", s)
	}
}

// TestEndpointFailed: an asynchronous endpoint failure reported through
// Mux.EndpointFailed fails blocked calls at once, and the idle peer's too
// (the reset notice on the liveness channel), before anyone closes.
func TestEndpointFailed(t *testing.T) {
	e := newEnv(t, "self", nil)
	p := e.pair(t)
	defer p.close()
	errc := make(chan error, 1)
	peerc := make(chan error, 1)
	go func() {
		_, err := p.c1.Read(make([]byte, 10))
		errc <- err
	}()
	go func() {
		_, err := p.c2.Read(make([]byte, 10))
		peerc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	e.a.mux.EndpointFailed(p.c1.ep, uct.ErrEndpointReset)
	e.a.mux.EndpointFailed(p.c1.ep, uct.ErrEndpointReset) // again: one notice
	e.a.mux.EndpointFailed(nil, uct.ErrEndpointReset)     // unknown: ignored
	select {
	case err := <-errc:
		if !errors.Is(err, ErrReset) || !errors.Is(err, uct.ErrEndpointReset) {
			t.Fatalf("read: %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("blocked Read not failed")
	}
	select {
	case err := <-peerc:
		if !errors.Is(err, ErrReset) || !strings.Contains(err.Error(), "by peer") {
			t.Fatalf("peer read: %v, want a reset by the peer", err)
		}
	case <-time.After(time.Second):
		t.Fatal("the idle peer's blocked Read not failed within 1s of the endpoint failure")
	}
}

// TestRendezvousBeforeStart: an RTS that reaches a conn before its Start
// (the writer started first) waits for Start; then the reader gets all of it.
func TestRendezvousBeforeStart(t *testing.T) { forEachTL(t, testRendezvousBeforeStart) }

func testRendezvousBeforeStart(t *testing.T, tl string) {
	e := rndvEnv(t, tl)
	if e.a.mux.rndvThresh == 0 {
		t.Skipf("%s has no GetZcopy", tl)
	}
	c1, err := e.a.mux.NewConn()
	if err != nil {
		t.Fatal(err)
	}
	c2, err := e.b.mux.NewConn()
	if err != nil {
		t.Fatal(err)
	}
	ea, eb, err := connectEPs(e.a, e.b)
	if err != nil {
		t.Fatal(err)
	}
	x, y := net.Pipe()
	a1, a2 := Addr{Net: "rdma", Addr: "127.0.0.1:1"}, Addr{Net: "rdma", Addr: "127.0.0.1:2"}
	if err := c1.Start(ea, c2.ID(), x, a1, a2); err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	want := make([]byte, 1<<20+5)
	rand.New(rand.NewSource(7)).Read(want)
	errc := make(chan error, 1)
	go func() {
		_, err := c1.Write(want)
		errc <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !c2.rndvWant.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the RTS never reached the unstarted conn")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // a pull started now would have no EP
	if err := c2.Start(eb, c1.ID(), y, a2, a1); err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.SetReadDeadline(time.Now().Add(20 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c2, got); err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("data differs")
	}
}
