//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/gouct/gouct/uct"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(peerEnv); role != "" {
		os.Exit(peerMain(role))
	}
	before := devShm()
	code := m.Run()
	if code == 0 {
		if after := devShm(); after != before {
			fmt.Fprintf(os.Stderr, "/dev/shm changed:\nbefore: %s\nafter:  %s\n", before, after)
			code = 1
		}
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// devShm lists /dev/shm: the transport must never leave anything there.
func devShm() string {
	ents, _ := os.ReadDir("/dev/shm")
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return strings.Join(names, ",")
}

// side is one worker with an open shm iface.
type side struct {
	w     *uct.Worker
	md    uct.MD
	iface *iface
}

func openSide(tb testing.TB, cfg *uct.Config, p uct.IfaceParams) *side {
	tb.Helper()
	if cfg == nil {
		cfg = uct.DefaultConfig()
	}
	c, ok := uct.LookupComponent(componentName)
	if !ok {
		tb.Fatal("shm component not registered")
	}
	res, err := c.MDResources()
	if err != nil {
		tb.Fatalf("shm resources: %v", err)
	}
	md, err := c.OpenMD(res[0].Name, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tls, err := md.TLResources()
	if err != nil || len(tls) != 1 || tls[0].Type != uct.DeviceShm {
		tb.Fatalf("tl resources %v, %v", tls, err)
	}
	w := uct.NewWorker(cfg)
	p.Config = cfg
	ifc, err := md.OpenIface(w, tls[0], p)
	if err != nil {
		w.Close()
		tb.Fatal(err)
	}
	s := &side{w: w, md: md, iface: ifc.(*iface)}
	tb.Cleanup(s.close)
	return s
}

func (s *side) close() {
	s.iface.Close()
	s.w.Close()
	s.md.Close()
}

func (s *side) connect(tb testing.TB, to *side) uct.EP {
	tb.Helper()
	ep, err := s.iface.CreateEP(uct.EPParams{DevAddr: to.iface.DeviceAddress(), IfaceAddr: to.iface.IfaceAddress()})
	if err != nil {
		tb.Fatal(err)
	}
	return ep
}

func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func TestAttrAndAddresses(t *testing.T) {
	a := openSide(t, nil, uct.IfaceParams{})
	attr := a.iface.Attr()
	cfg := uct.DefaultConfig()
	if attr.MaxBcopy != cfg.ShmSegSize || attr.MaxShort != cfg.ShmSegSize-8 {
		t.Errorf("MaxBcopy %d MaxShort %d for segment %d", attr.MaxBcopy, attr.MaxShort, cfg.ShmSegSize)
	}
	if !attr.Cap.Has(uct.CapAMShort | uct.CapAMBcopy | uct.CapConnectToIface | uct.CapEvent | uct.CapPending) {
		t.Errorf("caps %v", attr.Cap)
	}
	if attr.Cap.Has(uct.CapGetZcopy) != (rmaSupported() == nil) {
		t.Errorf("caps %v with rma probe %v", attr.Cap, rmaSupported())
	}
	if len(a.iface.DeviceAddress()) != attr.DeviceAddrLen || len(a.iface.IfaceAddress()) != attr.IfaceAddrLen {
		t.Errorf("address lengths")
	}
	dev, ifa := a.iface.DeviceAddress(), a.iface.IfaceAddress()
	if !a.iface.IsReachable(dev, ifa) {
		t.Error("own address unreachable")
	}
	other := append([]byte(nil), dev...)
	other[0] ^= 1 // another boot
	if a.iface.IsReachable(other, ifa) {
		t.Error("reachable from another boot id")
	}
	otherUser := append([]byte(nil), dev...)
	binary.LittleEndian.PutUint32(otherUser[16:], uint32(os.Getuid()+1))
	if a.iface.IsReachable(otherUser, ifa) {
		t.Error("reachable from another uid")
	}
	if a.iface.IsReachable(dev, ifa[:5]) {
		t.Error("truncated iface address reachable")
	}
	if _, err := a.iface.CreateEP(uct.EPParams{DevAddr: otherUser, IfaceAddr: ifa}); !errors.Is(err, uct.ErrUnreachable) {
		t.Errorf("create ep to another user: %v", err)
	}
	// Right host, but an iface that does not exist (wrong nonce).
	bad := append([]byte(nil), ifa...)
	bad[15] ^= 0xff
	if _, err := a.iface.CreateEP(uct.EPParams{DevAddr: dev, IfaceAddr: bad}); !errors.Is(err, uct.ErrUnreachable) {
		t.Errorf("create ep with wrong nonce: %v", err)
	}
	// A stale address whose fd now names something else: a pipe, a file.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	tmp, err := os.CreateTemp(t.TempDir(), "notafifo")
	if err != nil {
		t.Fatal(err)
	}
	defer tmp.Close()
	tmp.Truncate(1 << 20)
	for _, fd := range []uintptr{r.Fd(), tmp.Fd()} {
		stale := append([]byte(nil), ifa...)
		binary.LittleEndian.PutUint32(stale[4:], uint32(fd))
		if _, err := a.iface.CreateEP(uct.EPParams{DevAddr: dev, IfaceAddr: stale}); !errors.Is(err, uct.ErrUnreachable) {
			t.Errorf("create ep to fd %d (not a fifo): %v", fd, err)
		}
	}
}

// The FIFO is a sealed, private memfd: nothing on disk, and peers refuse
// one that is not 0600 or not ours.
func TestFIFOFilePermissions(t *testing.T) {
	a := openSide(t, nil, uct.IfaceParams{})
	link, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", a.iface.memfd))
	if err != nil || !strings.HasPrefix(link, "/memfd:") {
		t.Fatalf("fifo fd is %q (%v), want a memfd", link, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(a.iface.memfd, &st); err != nil || st.Mode&0o777 != 0o600 {
		t.Fatalf("mode %o (%v)", st.Mode, err)
	}
	if err := unix.Ftruncate(a.iface.memfd, 4096); err == nil {
		t.Fatal("sealed fifo could be shrunk")
	}
	if err := unix.Fchmod(a.iface.memfd, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := openFIFO(a.iface.pid, a.iface.memfd, a.iface.nonce); err == nil || !strings.Contains(err.Error(), "mode") {
		t.Errorf("open of a 0644 fifo: %v", err)
	}
	unix.Fchmod(a.iface.memfd, 0o600)
	f, err := openFIFO(a.iface.pid, a.iface.memfd, a.iface.nonce)
	if err != nil {
		t.Fatal(err)
	}
	f.unmap()
}

// Malformed elements (bad id, bad length, unknown flags) are counted and
// dropped; the messages around them still arrive.
func TestBadElementsDropped(t *testing.T) {
	a := openSide(t, nil, uct.IfaceParams{})
	b := openSide(t, nil, uct.IfaceParams{})
	var got atomic.Int64
	var sum atomic.Uint64
	a.iface.SetAMHandler(3, func(d []byte) { got.Add(1); sum.Add(binary.LittleEndian.Uint64(d)) })
	u := b.connect(t, a)
	e := u.(*ep)
	f := e.f
	inject := func(id, flags uint8, n int) {
		t.Helper()
		tk, ok := f.reserve()
		if !ok {
			t.Fatal("fifo full")
		}
		f.publish(tk, id, flags, n)
		e.rem.kick()
	}
	if err := u.AMShort(3, 1, nil); err != nil {
		t.Fatal(err)
	}
	inject(uct.MaxAMID, 0, 8) // bad id
	inject(255, 0, 8)         // bad id
	inject(3, 0, f.seg+1)     // too long
	inject(3, 0, -1)          // length 0xffffffff
	inject(3, 0x80, 8)        // unknown flags
	inject(0, flagPad, 0)     // padding: skipped, not an error
	inject(7, 0, 0)           // no handler: counted as unhandled
	if err := u.AMShort(3, 2, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "good messages", func() bool { return got.Load() == 2 })
	waitFor(t, "drops counted", func() bool { bad, un := a.iface.stats(); return bad == 5 && un == 1 })
	if sum.Load() != 3 {
		t.Errorf("payload sum %d, want 3", sum.Load())
	}
}

// A full FIFO reports ErrNoResource; a pending request runs once the
// consumer frees room, even though the consumer cannot ring the sender.
func TestFullFIFOAndPending(t *testing.T) {
	cfg := uct.DefaultConfig()
	cfg.ShmFifoSize = 4
	cfg.ShmSegSize = 256
	a := openSide(t, cfg, uct.IfaceParams{})
	b := openSide(t, cfg, uct.IfaceParams{})
	block := make(chan struct{})
	var got atomic.Int64
	a.iface.SetAMHandler(1, func([]byte) {
		if got.Add(1) == 1 {
			<-block // stall the consumer until the FIFO is full
		}
	})
	ep := b.connect(t, a)
	sent := 0
	for ; sent < 100; sent++ {
		err := ep.AMShort(1, uint64(sent), nil)
		if errors.Is(err, uct.ErrNoResource) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if sent < 4 || sent > 5 { // 4 elements, plus one the stalled handler may hold
		t.Fatalf("sent %d before ErrNoResource", sent)
	}
	done := make(chan struct{})
	var req uct.PendingReq
	req.Func = func() error {
		if err := ep.AMShort(1, 99, nil); err != nil {
			return err
		}
		close(done)
		return nil
	}
	if err := ep.PendingAdd(&req); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // let b's worker park with the request queued
	close(block)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("pending request never dispatched")
	}
	waitFor(t, "all messages", func() bool { return got.Load() == int64(sent+1) })
	if err := ep.PendingAdd(&req); !errors.Is(err, uct.ErrBusy) {
		t.Errorf("PendingAdd with room: %v, want ErrBusy", err)
	}
}

// TestRoomDoorbell: a producer whose worker parked with a request waiting
// for room in a full FIFO is woken by the consumer as soon as it frees room
// (room protocol), not by its backoff timer (made an hour here), both
// within the process and through the doorbell socket.
func TestRoomDoorbell(t *testing.T) {
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			directLocalWake = direct
			oldMin, oldMax := minBackoff, maxBackoff
			minBackoff, maxBackoff = time.Hour, time.Hour
			// Registered first, so it runs after the sides' cleanups
			// have stopped their workers.
			t.Cleanup(func() { directLocalWake, minBackoff, maxBackoff = true, oldMin, oldMax })
			cfg := uct.DefaultConfig()
			cfg.ShmFifoSize = 4
			cfg.ShmSegSize = 256
			a := openSide(t, cfg, uct.IfaceParams{})
			b := openSide(t, cfg, uct.IfaceParams{})
			block := make(chan struct{})
			unblock := sync.OnceFunc(func() { close(block) })
			t.Cleanup(unblock) // runs before the sides close: a failed test must not wedge a's worker
			var got atomic.Int64
			a.iface.SetAMHandler(1, func([]byte) {
				if got.Add(1) == 1 {
					<-block // stall the consumer until the FIFO is full
				}
			})
			ep := b.connect(t, a)
			for sent := 0; ; sent++ {
				err := ep.AMShort(1, 0, nil)
				if errors.Is(err, uct.ErrNoResource) {
					break
				}
				if err != nil || sent > 100 {
					t.Fatalf("fill: %v after %d", err, sent)
				}
			}
			done := make(chan struct{})
			var req uct.PendingReq
			req.Func = func() error { close(done); return nil }
			sleeps := b.w.Sleeps.Load() // PendingAdd wakes the worker, which then parks again
			if err := ep.PendingAdd(&req); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the producer's worker to park", func() bool { return b.w.Sleeps.Load() > sleeps })
			time.Sleep(time.Millisecond)
			unblock()
			select {
			case <-done:
			case <-time.After(3 * time.Second):
				t.Fatal("pending request not dispatched when the consumer freed room")
			}
		})
	}
}

// Memory per idle endpoint and per iface: heap beyond the shared FIFO, and
// the FIFO's resident pages.
func TestMemoryFootprint(t *testing.T) {
	a := openSide(t, nil, uct.IfaceParams{})
	b := openSide(t, nil, uct.IfaceParams{})
	const neps = 1000
	eps := make([]uct.EP, neps)
	eps[0] = b.connect(t, a) // maps the peer FIFO once
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	h0 := heap()
	for i := 1; i < neps; i++ {
		eps[i] = b.connect(t, a)
	}
	perEP := float64(heap()-h0) / (neps - 1)
	if n := len(b.iface.remotes); n != 1 {
		t.Errorf("%d mappings for %d endpoints to one iface", n, neps)
	}
	for _, ep := range eps {
		ep.Close()
	}
	if n := len(b.iface.remotes); n != 0 {
		t.Errorf("%d mappings left after closing every endpoint", n)
	}

	const nifaces = 16
	rss := func() int64 {
		b, _ := os.ReadFile("/proc/self/statm")
		var size, res int64
		fmt.Sscan(string(b), &size, &res)
		return res * int64(os.Getpagesize())
	}
	h0, r0 := heap(), rss()
	sides := make([]*side, nifaces)
	for i := range sides {
		sides[i] = openSide(t, nil, uct.IfaceParams{})
	}
	perIfaceHeap := float64(heap()-h0) / nifaces
	perIfaceRSS := float64(rss()-r0) / nifaces
	_, fifoSize, _ := fifoGeometry(uct.DefaultConfig().ShmFifoSize, uct.DefaultConfig().ShmSegSize)
	t.Logf("idle endpoint: %.0f B heap (FIFO mapping shared per peer iface); iface: %.0f B heap, %.0f B RSS growth, %d B FIFO mapping (pages resident only once used)",
		perEP, perIfaceHeap, perIfaceRSS, fifoSize)
	if perEP > 64<<10 {
		t.Errorf("%.0f B of heap per endpoint, want <= 64 KiB", perEP)
	}
	if perIfaceHeap > 256<<10 {
		t.Errorf("%.0f B of heap per iface, want <= 256 KiB", perIfaceHeap)
	}
	if perIfaceRSS > 512<<10 {
		t.Errorf("%.0f B RSS growth per idle iface, want <= 512 KiB", perIfaceRSS)
	}
	for _, s := range sides {
		s.close()
	}
}

// The hot path allocates nothing.
func TestNoAllocPerMessage(t *testing.T) {
	a := openSide(t, nil, uct.IfaceParams{})
	b := openSide(t, nil, uct.IfaceParams{})
	var got atomic.Int64
	a.iface.SetAMHandler(1, func([]byte) { got.Add(1) })
	ep := b.connect(t, a)
	payload := make([]byte, 64)
	pack := func(buf []byte) int { return copy(buf, payload) }
	send := func() {
		for ep.AMShort(1, 7, payload) != nil {
			runtime.Gosched()
		}
		for {
			if _, err := ep.AMBcopy(1, pack); err == nil {
				break
			}
			runtime.Gosched()
		}
	}
	send()
	if n := testing.AllocsPerRun(200, send); n != 0 {
		t.Errorf("%.1f allocations per AMShort+AMBcopy", n)
	}
	waitFor(t, "delivery", func() bool { return got.Load() == 2*202 })
}

// Register, PackRKey and Deregister of a user buffer (one rendezvous Write)
// allocate nothing once the free list is warm; the rkey names the buffer
// being registered, not a recycled handle's old one; a second Deregister
// of one handle is refused.
func TestRegisterNoAlloc(t *testing.T) {
	a := openSide(t, nil, uct.IfaceParams{})
	m := a.iface.MD()
	bufs := [2][]byte{make([]byte, 4096), make([]byte, 1<<20)}
	i := 0
	reg := func() {
		b := bufs[i%2]
		i++
		h, err := m.Register(b, uct.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		rk, err := m.PackRKey(h)
		if err != nil {
			t.Fatal(err)
		}
		k, err := unpackRKey(rk)
		if err != nil || k.base != uint64(uintptr(unsafe.Pointer(&b[0]))) || k.length != uint64(len(b)) ||
			k.access != uct.AccessRemoteRead || k.pid != os.Getpid() {
			t.Fatalf("rkey %+v (%v) for a buffer of %d bytes at %p", k, err, len(b), &b[0])
		}
		if err := m.Deregister(h); err != nil {
			t.Fatal(err)
		}
	}
	reg()
	if n := testing.AllocsPerRun(200, reg); n != 0 {
		t.Errorf("%.1f allocations per Register+PackRKey+Deregister", n)
	}
	h, err := m.Register(bufs[0], uct.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Deregister(h); err != nil {
		t.Fatal(err)
	}
	if err := m.Deregister(h); !errors.Is(err, uct.ErrInvalidParam) {
		t.Errorf("second Deregister: %v, want ErrInvalidParam", err)
	}
}

// Close with traffic in flight on other goroutines never crashes or hangs.
func TestCloseRace(t *testing.T) {
	for round := 0; round < 20; round++ {
		a := openSide(t, nil, uct.IfaceParams{})
		b := openSide(t, nil, uct.IfaceParams{})
		a.iface.SetAMHandler(1, func([]byte) {})
		ep := b.connect(t, a)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := ep.AMShort(1, 0, nil); errors.Is(err, uct.ErrClosed) {
					<-stop
					return
				}
			}
		}()
		time.Sleep(time.Millisecond)
		if round%2 == 0 {
			ep.Close()
		} else {
			b.iface.Close() // closes ep too
		}
		close(stop)
		<-done
		a.close()
		b.close()
	}
}

// Sends to an iface that closed fail with ErrEndpointReset once its FIFO
// is full, rather than ErrNoResource forever.
func TestPeerIfaceClosed(t *testing.T) {
	cfg := uct.DefaultConfig()
	cfg.ShmFifoSize = 8
	a := openSide(t, cfg, uct.IfaceParams{})
	b := openSide(t, cfg, uct.IfaceParams{})
	ep := a.connect(t, b)
	b.close()
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		err = ep.AMShort(1, 0, nil)
	}
	if !errors.Is(err, uct.ErrEndpointReset) {
		t.Fatalf("send to a closed iface: %v, want ErrEndpointReset", err)
	}
	if err := ep.PendingAdd(&uct.PendingReq{Func: func() error { return nil }}); err != nil {
		// queued: it must be dispatched (and fail) rather than wait forever
		t.Logf("PendingAdd: %v", err)
	}
	if err := ep.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ep.AMShort(1, 0, nil); !errors.Is(err, uct.ErrClosed) {
		t.Errorf("send on a closed ep: %v, want ErrClosed", err)
	}
}

// A hostile or broken peer scribbling random bytes over the whole FIFO
// (header, sequence words, lengths, ids) while the consumer and a sender
// run: no panic, no out-of-bounds access, and Close still works.
func TestFIFOScribble(t *testing.T) {
	cfg := uct.DefaultConfig()
	cfg.ShmFifoSize = 16
	cfg.ShmSegSize = 256
	a := openSide(t, cfg, uct.IfaceParams{})
	b := openSide(t, cfg, uct.IfaceParams{})
	a.iface.SetAMHandler(1, func(d []byte) {
		if len(d) > 256 {
			panic("handler got more than a segment")
		}
	})
	ep := b.connect(t, a)
	hostile, err := openFIFO(a.iface.pid, a.iface.memfd, a.iface.nonce)
	if err != nil {
		t.Fatal(err)
	}
	defer hostile.unmap()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			ep.AMShort(1, 0, make([]byte, 16))
			b.w.TryProgress()
		}
	}()
	seed := uint64(1)
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		for k := 0; k < 64; k++ {
			seed = seed*6364136223846793005 + 1442695040888963407
			off := int(seed>>33) % (len(hostile.mem) - 8)
			off &^= 7
			atomic.StoreUint64((*uint64)(unsafe.Pointer(&hostile.mem[off])), seed)
		}
		// Forge a published element with random id, flags and length
		// where the consumer will look next.
		tail := atomic.LoadUint64(hostile.tail())
		e := hostile.elem(tail)
		*(*uint64)(unsafe.Add(e, 8)) = seed
		hostile.setSeq(tail, tail+1)
		a.w.TryProgress()
	}
	close(stop)
	<-done
	bad, _ := a.iface.stats()
	t.Logf("%d malformed elements dropped", bad)
	if bad == 0 {
		t.Error("no forged element was seen as malformed")
	}
}

// Lost-wakeup stress: the receiving worker parks at once when idle
// (ProgressSpin 0), and single messages arrive at random moments around
// its park, through the socket doorbell and through the direct in-process
// wake. A lost wake-up shows as a message never delivered.
func TestParkRace(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			directLocalWake = direct
			defer func() { directLocalWake = true }()
			cfg := uct.DefaultConfig()
			cfg.ProgressSpin = 0
			a := openSide(t, cfg, uct.IfaceParams{})
			b := openSide(t, cfg, uct.IfaceParams{})
			var got atomic.Int64
			a.iface.SetAMHandler(1, func([]byte) { got.Add(1) })
			u := b.connect(t, a)
			if (u.(*ep).rem.local != nil) != direct {
				t.Fatal("direct wake not as configured")
			}
			seed := uint64(7)
			for i := int64(1); i <= 300; i++ {
				seed = seed*6364136223846793005 + 1442695040888963407
				if d := time.Duration(seed>>54) * time.Microsecond; d > 200*time.Microsecond {
					time.Sleep(d - 200*time.Microsecond) // sometimes: let it park
				} else {
					for end := time.Now().Add(d); time.Now().Before(end); { // sometimes: race the park
					}
				}
				if err := u.AMShort(1, 0, nil); err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(2 * time.Second)
				for got.Load() != i {
					if time.Now().After(deadline) {
						t.Fatalf("message %d not delivered: lost wake-up (sleeps %d)", i, a.w.Sleeps.Load())
					}
					time.Sleep(20 * time.Microsecond)
				}
			}
			if a.w.Sleeps.Load() < 100 {
				t.Errorf("receiver parked only %d times: the race was not exercised", a.w.Sleeps.Load())
			}
		})
	}
}

// Pending requests on an endpoint whose peer goes away while its FIFO is
// full are dispatched (their retry fails with ErrEndpointReset), not left
// queued forever.
func TestPendingPeerGone(t *testing.T) {
	cfg := uct.DefaultConfig()
	cfg.ShmFifoSize = 4
	cfg.ShmSegSize = 256
	a := openSide(t, cfg, uct.IfaceParams{})
	b := openSide(t, cfg, uct.IfaceParams{})
	block := make(chan struct{})
	var once atomic.Bool
	b.iface.SetAMHandler(1, func([]byte) {
		if !once.Swap(true) {
			<-block
		}
	})
	defer close(block)
	u := a.connect(t, b)
	for i := 0; ; i++ {
		err := u.AMShort(1, 0, nil)
		if errors.Is(err, uct.ErrNoResource) {
			break
		}
		if err != nil || i > 100 {
			t.Fatalf("filling: %v after %d", err, i)
		}
	}
	result := make(chan error, 1)
	req := &uct.PendingReq{Func: func() error {
		err := u.AMShort(1, 0, nil)
		if !errors.Is(err, uct.ErrNoResource) {
			result <- err
		}
		return err
	}}
	if err := u.PendingAdd(req); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)           // a's worker parks with the request queued
	atomic.StoreUint32(b.iface.rx.closed(), 1) // what b's Close announces
	select {
	case err := <-result:
		if !errors.Is(err, uct.ErrEndpointReset) {
			t.Fatalf("pending retry: %v, want ErrEndpointReset", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("pending request never dispatched after the peer went away")
	}
	waitFor(t, "pending queue drained", func() bool { return a.iface.npend.Load() == 0 })
}

// A producer that dies between reserving an element and publishing it must
// not wedge the FIFO: the consumer pads the element once it finds the
// reserving process gone, and later messages (from other senders) arrive.
// A reservation by a live process is waited for, however long.
func TestDeadProducerDoesNotWedge(t *testing.T) {
	a := openSide(t, nil, uct.IfaceParams{})
	b := openSide(t, nil, uct.IfaceParams{})
	var got atomic.Int64
	a.iface.SetAMHandler(3, func([]byte) { got.Add(1) })
	u := b.connect(t, a)
	f := u.(*ep).f

	// A pid that surely names no process: a child that has exited and been reaped.
	child, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	deadPid := child.Pid
	child.Wait()

	// A live owner (this process) holding an element: nothing is skipped.
	live, ok := f.reserve()
	if !ok {
		t.Fatal("fifo full")
	}
	if err := u.AMShort(3, 1, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * stuckAfter)
	if got.Load() != 0 || a.iface.deadProducers.Load() != 0 {
		t.Fatalf("message behind a live reservation delivered early (%d) or reservation padded (%d)",
			got.Load(), a.iface.deadProducers.Load())
	}
	// The owner "dies": its stamp now names a reaped process.
	atomic.StoreUint32(f.lenp(live), ownerBit|uint32(deadPid))
	a.w.Wake()
	waitFor(t, "message behind the dead reservation", func() bool { return got.Load() == 1 })
	if n := a.iface.deadProducers.Load(); n != 1 {
		t.Errorf("dead producers %d, want 1", n)
	}
	if err := u.AMShort(3, 2, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "later message", func() bool { return got.Load() == 2 })
}
