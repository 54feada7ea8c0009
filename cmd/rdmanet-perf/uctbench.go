package main

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gouct/gouct/uct"
)

// AM ids used by the uct tests.
const (
	amData = 1 // ping, pong, and stream messages
	amAck  = 2 // am_bw: receiver has counted what it waited for
)

// uctSide is one process's half of a uct-level session: a worker, every
// allowed iface, the one chosen with the peer, and an endpoint to the peer.
// It is driven by one goroutine (the session's); AM handlers only count.
type uctSide struct {
	w    *uct.Worker
	ifs  *uct.Ifaces
	ti   *uct.TLIface
	ep   uct.EP
	recv atomic.Uint64 // amData messages received
	acks atomic.Uint64 // amAck messages received

	// Waiting: poll the worker for spin (RDMANET_READ_SPIN), then park on
	// wake until a handler, completion or pending callback signals. A spin
	// that never parks starves the Go netpoller (the scheduler polls it only
	// when a P runs out of goroutines), and with it every event source that
	// goes through it: a transport's wake-ups, the bootstrap socket.
	spin   time.Duration
	parked atomic.Bool
	wake   chan struct{} // 1 slot; stale tokens are harmless (callers re-check)
	timer  *time.Timer
	preq   uct.PendingReq
	// abortCh is closed (by abort, from the session goroutine) when the
	// peer's bootstrap connection fails during a step; a new one per step.
	abortCh chan struct{}
	aborted atomic.Bool

	payload []byte // preallocated send payload, grown per step
	packN   int    // bytes the pack function writes this step
	pack    func(buf []byte) int
	// progress, when non-nil, receives the iteration count every 256 iterations.
	progress *atomic.Int64
	progBase int64
}

// openUCT opens every iface that cfg allows on a new worker.
func openUCT(cfg *uct.Config) (*uctSide, error) {
	s := &uctSide{w: uct.NewWorker(cfg), spin: cfg.ReadSpin, wake: make(chan struct{}, 1), timer: time.NewTimer(time.Hour)}
	s.timer.Stop()
	s.preq.Func = func() error { s.signal(); return nil }
	s.ifs = uct.OpenIfaces(s.w, cfg, uct.IfaceParams{Config: cfg})
	if len(s.ifs.List) == 0 {
		err := fmt.Errorf("no transport available (RDMANET_TLS=%v): %w", cfg.TLS, errors.Join(s.ifs.Skipped...))
		s.close()
		return nil, err
	}
	s.pack = func(buf []byte) int { return copy(buf, s.payload[:s.packN]) }
	return s, nil
}

func (s *uctSide) addrs() []addrMsg {
	out := make([]addrMsg, 0, len(s.ifs.List))
	for _, t := range s.ifs.List {
		out = append(out, addrMsg{TL: t.Resource.TL, Device: t.Resource.Device,
			DevAddr: t.Iface.DeviceAddress(), IfaceAddr: t.Iface.IfaceAddress(), Caps: uint64(t.Attr.Cap)})
	}
	return out
}

// use selects ti and installs the counting handlers.
func (s *uctSide) use(ti *uct.TLIface) error {
	s.ti = ti
	if err := ti.Iface.SetAMHandler(amData, func([]byte) { s.recv.Add(1); s.notify() }); err != nil {
		return err
	}
	return ti.Iface.SetAMHandler(amAck, func([]byte) { s.acks.Add(1); s.notify() })
}

// createEP creates an endpoint to the peer's iface (connect-to-iface
// transports) or an unconnected one (connect-to-EP: rc_verbs), which the
// caller connects once the peer's endpoint address is known.
func (s *uctSide) createEP(peer addrMsg) error {
	p := uct.EPParams{}
	if s.ti.Attr.Cap.Has(uct.CapConnectToIface) {
		p = uct.EPParams{DevAddr: peer.DevAddr, IfaceAddr: peer.IfaceAddr}
	} else if !s.ti.Attr.Cap.Has(uct.CapConnectToEP) {
		return fmt.Errorf("%s connects neither to ifaces nor to endpoints", s.ti.Name())
	}
	ep, err := s.ti.Iface.CreateEP(p)
	if err != nil {
		return fmt.Errorf("create endpoint on %s: %w", s.ti.Name(), err)
	}
	s.ep = ep
	return nil
}

func (s *uctSide) epToEP() bool { return !s.ti.Attr.Cap.Has(uct.CapConnectToIface) }

func (s *uctSide) close() {
	if s.ep != nil {
		s.ep.Close()
	}
	if s.ifs != nil {
		s.ifs.Close()
	}
	s.w.Close()
}

// prepare sizes the payload for one step.
func (s *uctSide) prepare(size int) {
	if cap(s.payload) < size {
		s.payload = make([]byte, size)
		for i := range s.payload {
			s.payload[i] = byte(i)
		}
	}
	s.payload = s.payload[:cap(s.payload)]
	s.packN = size
	s.recv.Store(0)
	s.acks.Store(0)
	s.abortCh = make(chan struct{})
	s.aborted.Store(false)
}

// abort makes the step's waits return errAborted. Called once per step at
// most, from another goroutine than the one measuring.
func (s *uctSide) abort() {
	s.aborted.Store(true)
	close(s.abortCh)
}

// method is how a message of size bytes travels: AMShort when it fits
// (size counts the 8-byte header), else AMBcopy. bw tests always use bcopy.
func (s *uctSide) method(test string, size int) (string, error) {
	a := s.ti.Attr
	switch test {
	case "am_lat":
		if a.Cap.Has(uct.CapAMShort) && size <= a.MaxShort+8 {
			return "short", nil
		}
		fallthrough
	case "am_bw":
		if a.Cap.Has(uct.CapAMBcopy) && size <= a.MaxBcopy {
			return "bcopy", nil
		}
		return "", fmt.Errorf("%s: %d B exceeds %s's max bcopy (%d B)", test, size, s.ti.Name(), a.MaxBcopy)
	case "put_bw":
		if !a.Cap.Has(uct.CapPutZcopy) {
			return "", fmt.Errorf("put_bw: %s: %w", s.ti.Name(), uct.NotSupported("put_zcopy"))
		}
		if a.MaxPut > 0 && size > a.MaxPut {
			return "", fmt.Errorf("put_bw: %d B exceeds %s's max put (%d B)", size, s.ti.Name(), a.MaxPut)
		}
		return "zcopy", nil
	case "get_bw":
		if !a.Cap.Has(uct.CapGetZcopy) {
			return "", fmt.Errorf("get_bw: %s: %w", s.ti.Name(), uct.NotSupported("get_zcopy"))
		}
		if a.MaxGet > 0 && size > a.MaxGet {
			return "", fmt.Errorf("get_bw: %d B exceeds %s's max get (%d B)", size, s.ti.Name(), a.MaxGet)
		}
		return "zcopy", nil
	}
	return "", fmt.Errorf("unknown uct test %q", test)
}

var (
	errStepTimeout = errors.New("step timed out (peer gone or stuck?)")
	errAborted     = errors.New("step aborted: the peer's bootstrap connection failed")
)

// notify wakes the session goroutine if it is parked (handlers call it
// after counting; one atomic load when it is not).
func (s *uctSide) notify() {
	if s.parked.Load() {
		s.signal()
	}
}

func (s *uctSide) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// spinUntil polls the worker from the calling goroutine (ucx_perftest's
// loop) until done() or the spin budget is over; it reports done().
func (s *uctSide) spinUntil(done func() bool) bool {
	var start time.Time
	for i := 0; ; i++ {
		if done() {
			return true
		}
		s.w.TryProgress()
		if i&63 == 63 {
			runtime.Gosched()
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) >= s.spin || s.aborted.Load() {
				return done()
			}
		}
	}
}

// park blocks until a signal or the deadline. The caller has set parked
// and re-checked its condition after setting it (lost-wakeup safe).
func (s *uctSide) park(deadline time.Time) error {
	d := time.Until(deadline)
	if d <= 0 {
		s.parked.Store(false)
		return errStepTimeout
	}
	s.timer.Reset(d)
	select {
	case <-s.wake:
		s.timer.Stop()
		s.parked.Store(false)
		return nil
	case <-s.abortCh:
		s.timer.Stop()
		s.parked.Store(false)
		return errAborted
	case <-s.timer.C:
		s.parked.Store(false)
		return errStepTimeout
	}
}

// waitCount waits until *c >= target: spin, then park until a handler
// signals.
func (s *uctSide) waitCount(c *atomic.Uint64, target uint64, deadline time.Time) error {
	if c.Load() >= target || s.spinUntil(func() bool { return c.Load() >= target }) {
		return nil
	}
	for {
		s.parked.Store(true)
		if c.Load() >= target {
			s.parked.Store(false)
			return nil
		}
		if err := s.park(deadline); err != nil {
			return err
		}
	}
}

// send sends one amData (or amAck) message of size bytes by method. When
// the transport has no resources it polls for the spin budget, then queues
// a pending request (uct's documented retry path) and parks until it runs.
func (s *uctSide) send(id uint8, method string, size int, seq uint64, deadline time.Time) error {
	var start time.Time
	for i := 0; ; i++ {
		var err error
		if method == "short" {
			n := max(size-8, 0)
			err = s.ep.AMShort(id, seq, s.payload[:n])
		} else {
			_, err = s.ep.AMBcopy(id, s.pack)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, uct.ErrNoResource) {
			return fmt.Errorf("send %d B (%s): %w", size, method, err)
		}
		if i&63 != 63 {
			s.w.TryProgress()
			continue
		}
		runtime.Gosched()
		if start.IsZero() {
			start = time.Now()
		}
		if time.Since(start) < s.spin || !s.ti.Attr.Cap.Has(uct.CapPending) {
			if time.Now().After(deadline) {
				return errStepTimeout
			}
			if s.aborted.Load() {
				return errAborted
			}
			continue
		}
		s.parked.Store(true)
		switch err := s.ep.PendingAdd(&s.preq); {
		case err == nil:
			if err := s.park(deadline); err != nil {
				return err
			}
		case errors.Is(err, uct.ErrBusy):
			s.parked.Store(false) // room now: retry at once
		default:
			s.parked.Store(false)
			return fmt.Errorf("pending add: %w", err)
		}
	}
}

func (s *uctSide) tick(i int) {
	if s.progress != nil && i&255 == 0 {
		s.progress.Store(s.progBase + int64(i))
	}
}

// clientLat runs am_lat's ping side; samples receive half round trips in ns.
func (s *uctSide) clientLat(method string, size, warmup int, samples []int64, deadline time.Time) error {
	total := warmup + len(samples)
	for i := 0; i < total; i++ {
		t0 := time.Now()
		if err := s.send(amData, method, size, uint64(i), deadline); err != nil {
			return err
		}
		if err := s.waitCount(&s.recv, uint64(i+1), deadline); err != nil {
			return err
		}
		if i >= warmup {
			samples[i-warmup] = int64(time.Since(t0)) / 2
		}
		s.tick(i)
	}
	return nil
}

// serverLat runs am_lat's pong side.
func (s *uctSide) serverLat(method string, size, total int, deadline time.Time) error {
	for i := 0; i < total; i++ {
		if err := s.waitCount(&s.recv, uint64(i+1), deadline); err != nil {
			return err
		}
		if err := s.send(amData, method, size, uint64(i), deadline); err != nil {
			return err
		}
	}
	return nil
}

// clientBW streams warmup messages, waits for the first ack, then streams
// iters messages and returns the time until the second ack.
func (s *uctSide) clientBW(method string, size, warmup, iters int, deadline time.Time) (time.Duration, error) {
	for i := 0; i < warmup; i++ {
		if err := s.send(amData, method, size, uint64(i), deadline); err != nil {
			return 0, err
		}
	}
	if err := s.waitCount(&s.acks, 1, deadline); err != nil {
		return 0, err
	}
	t0 := time.Now()
	for i := 0; i < iters; i++ {
		if err := s.send(amData, method, size, uint64(i), deadline); err != nil {
			return 0, err
		}
		s.tick(warmup + i)
	}
	if err := s.waitCount(&s.acks, 2, deadline); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// serverBW counts the stream and acks after the warmup and at the end.
func (s *uctSide) serverBW(warmup, iters int, deadline time.Time) error {
	for _, target := range []int{warmup, warmup + iters} {
		if err := s.waitCount(&s.recv, uint64(target), deadline); err != nil {
			return err
		}
		if err := s.send(amAck, "short", 8, 0, deadline); err != nil {
			return err
		}
	}
	return nil
}

// rmaWindow bounds zero-copy operations in flight.
const rmaWindow = 16

// rmaTarget is the server's registered buffer for put_bw / get_bw.
type rmaTarget struct {
	md  uct.MD
	mem uct.Mem
}

func (s *uctSide) newTarget(size int) (*rmaTarget, uint64, []byte, error) {
	md := s.ti.MD
	mem, err := md.MemAlloc(max(size, 1))
	if err != nil {
		return nil, 0, nil, fmt.Errorf("allocate %d B target: %w", size, err)
	}
	var rkey []byte
	if md.Attr().Flags&uct.MDNeedRKey != 0 {
		if rkey, err = md.PackRKey(mem.MemH); err != nil {
			md.MemFree(mem)
			return nil, 0, nil, fmt.Errorf("pack rkey: %w", err)
		}
	}
	return &rmaTarget{md: md, mem: mem}, bufAddr(mem.Buf), rkey, nil
}

func (t *rmaTarget) free() error { return t.md.MemFree(t.mem) }

func bufAddr(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// clientRMA runs put_bw or get_bw: warmup then iters zero-copy operations of
// size bytes against the peer's buffer, at most rmaWindow in flight, and
// returns the time from the first measured operation to the last completion.
func (s *uctSide) clientRMA(get bool, size, warmup, iters int, raddr uint64, rkey []byte, deadline time.Time) (time.Duration, error) {
	md := s.ti.MD
	mem, err := md.MemAlloc(max(size, 1))
	if err != nil {
		return 0, fmt.Errorf("allocate %d B source: %w", size, err)
	}
	defer md.MemFree(mem)
	iov := []uct.IOV{{Buf: mem.Buf[:size], MemH: mem.MemH}}
	free := make(chan *uct.Completion, rmaWindow)
	var firstErr atomic.Pointer[error]
	for range rmaWindow {
		c := &uct.Completion{}
		c.Func = func(err error) {
			if err != nil {
				firstErr.CompareAndSwap(nil, &err)
			}
			free <- c
		}
		free <- c
	}
	op := s.ep.PutZcopy
	if get {
		op = s.ep.GetZcopy
	}
	// take returns a free completion: spin, then block on free.
	take := func() (*uct.Completion, error) {
		var c *uct.Completion
		if s.spinUntil(func() bool {
			select {
			case c = <-free:
				return true
			default:
				return false
			}
		}) {
			return c, nil
		}
		d := time.Until(deadline)
		if d <= 0 {
			return nil, errStepTimeout
		}
		s.timer.Reset(d)
		select {
		case c = <-free:
			s.timer.Stop()
			return c, nil
		case <-s.abortCh:
			s.timer.Stop()
			return nil, errAborted
		case <-s.timer.C:
			return nil, errStepTimeout
		}
	}
	// drain waits for every operation in flight: all completions back.
	drain := func() error {
		var got [rmaWindow]*uct.Completion
		for i := range got {
			c, err := take()
			if err != nil {
				for _, c := range got[:i] {
					free <- c
				}
				return err
			}
			got[i] = c
		}
		for _, c := range got {
			free <- c
		}
		if p := firstErr.Load(); p != nil {
			return *p
		}
		return nil
	}
	post := func(n, base int) error {
		for i := 0; i < n; i++ {
			c, err := take()
			if err != nil {
				return err
			}
			for {
				c.Count.Store(1)
				err := op(iov, raddr, rkey, c)
				if err == nil {
					free <- c
					break
				}
				if errors.Is(err, uct.ErrInProgress) {
					break
				}
				if !errors.Is(err, uct.ErrNoResource) {
					free <- c
					return fmt.Errorf("%d B zcopy: %w", size, err)
				}
				s.w.TryProgress()
				runtime.Gosched()
				if time.Now().After(deadline) || s.aborted.Load() {
					free <- c
					return errStepTimeout
				}
			}
			s.tick(base + i)
		}
		return nil
	}
	if err := post(warmup, 0); err != nil {
		return 0, err
	}
	if err := drain(); err != nil {
		return 0, err
	}
	t0 := time.Now()
	if err := post(iters, warmup); err != nil {
		return 0, err
	}
	if err := drain(); err != nil {
		return 0, err
	}
	// Flush: every operation posted before it is complete when it fires.
	fc := <-free
	fc.Count.Store(1)
	if err := s.ep.Flush(fc); err == nil {
		free <- fc
	} else if !errors.Is(err, uct.ErrInProgress) {
		free <- fc
		return 0, fmt.Errorf("flush: %w", err)
	}
	if err := drain(); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}
