package uctest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gouct/gouct/uct"
)

// Options selects the transport resource the suite runs on.
type Options struct {
	// TL is the transport name ("self", "tcp", "shm", "rc_verbs").
	TL string
	// Device picks the resource of TL on that device ("lo", "rxe0:1");
	// empty means the first resource the registry lists.
	Device string
	// Config is given to the MDs, workers and ifaces; nil means uct.DefaultConfig.
	Config *uct.Config
	// SkipIfAbsent skips instead of failing when no resource of TL (on
	// Device) is available. Leave it false where the transport must be
	// there (e.g. rc_verbs inside the Soft-RoCE VM).
	SkipIfAbsent bool
}

// side is one end of a pair: its own worker, MD and iface, like a separate process.
type side struct {
	w     *uct.Worker
	md    uct.MD
	iface uct.Iface
	attr  uct.IfaceAttr
	ep    uct.EP // to the other side
}

// pair is two connected ifaces of the same transport on two workers.
type pair struct {
	tb   testing.TB
	o    Options
	a, b *side
	errs chan error // async endpoint errors from IfaceParams.ErrHandler
	once sync.Once
}

// find opens the MD holding the first TL resource matching o.
func find(o Options, cfg *uct.Config) (uct.MD, uct.TLResource, error) {
	var why []string
	for _, ci := range uct.Components() {
		if ci.Err != nil {
			why = append(why, fmt.Sprintf("%s: %v", ci.Component.Name(), ci.Err))
			continue
		}
		for _, mr := range ci.Resources {
			md, err := ci.Component.OpenMD(mr.Name, cfg)
			if err != nil {
				why = append(why, fmt.Sprintf("%s/%s: %v", ci.Component.Name(), mr.Name, err))
				continue
			}
			tls, err := md.TLResources()
			if err != nil {
				why = append(why, fmt.Sprintf("%s/%s: %v", ci.Component.Name(), mr.Name, err))
			}
			for _, tl := range tls {
				if tl.TL == o.TL && (o.Device == "" || tl.Device == o.Device) {
					return md, tl, nil
				}
			}
			md.Close()
		}
	}
	return nil, uct.TLResource{}, fmt.Errorf("no resource %s/%s (%s): %w", o.TL, o.Device,
		strings.Join(why, "; "), uct.ErrUnavailable)
}

// Resources reports whether o names an available resource (for callers
// that decide themselves whether to skip).
func Resources(o Options) (uct.TLResource, error) {
	cfg := o.Config
	if cfg == nil {
		cfg = uct.DefaultConfig()
	}
	md, tl, err := find(o, cfg)
	if err != nil {
		return tl, err
	}
	md.Close()
	return tl, nil
}

func openSide(o Options, cfg *uct.Config, p uct.IfaceParams) (*side, error) {
	md, tl, err := find(o, cfg)
	if err != nil {
		return nil, err
	}
	w := uct.NewWorker(cfg)
	ifc, err := md.OpenIface(w, tl, p)
	if err != nil {
		w.Close()
		md.Close()
		return nil, fmt.Errorf("open iface %s: %w", tl.Name(), err)
	}
	return &side{w: w, md: md, iface: ifc, attr: ifc.Attr()}, nil
}

// newPair opens and connects two sides; the test's cleanup closes them.
func newPair(tb testing.TB, o Options) *pair {
	tb.Helper()
	cfg := o.Config
	if cfg == nil {
		cfg = uct.DefaultConfig()
	}
	p := &pair{tb: tb, o: o, errs: make(chan error, 16)}
	params := uct.IfaceParams{Config: cfg, ErrHandler: func(ep uct.EP, err error) {
		select {
		case p.errs <- err:
		default:
		}
	}}
	var err error
	if p.a, err = openSide(o, cfg, params); err != nil {
		if o.SkipIfAbsent && errors.Is(err, uct.ErrUnavailable) {
			tb.Skipf("uctest: %v", err)
		}
		tb.Fatalf("uctest: %v", err)
	}
	if p.b, err = openSide(o, cfg, params); err != nil {
		p.closeSide(p.a)
		tb.Fatalf("uctest: %v", err)
	}
	tb.Cleanup(p.close)
	if err := p.connect(); err != nil {
		tb.Fatalf("uctest: connect %s: %v", o.TL, err)
	}
	return p
}

// connect creates ep a→b and b→a: to the peer's iface when the transport
// can, else unconnected EPs joined by their addresses.
func (p *pair) connect() error {
	a, b := p.a, p.b
	if a.attr.Cap.Has(uct.CapConnectToIface) {
		var err error
		if a.ep, err = a.iface.CreateEP(uct.EPParams{DevAddr: b.iface.DeviceAddress(), IfaceAddr: b.iface.IfaceAddress()}); err != nil {
			return err
		}
		b.ep, err = b.iface.CreateEP(uct.EPParams{DevAddr: a.iface.DeviceAddress(), IfaceAddr: a.iface.IfaceAddress()})
		return err
	}
	if !a.attr.Cap.Has(uct.CapConnectToEP) {
		return fmt.Errorf("iface has neither connect_to_iface nor connect_to_ep (%v)", a.attr.Cap)
	}
	var err error
	if a.ep, err = a.iface.CreateEP(uct.EPParams{}); err != nil {
		return err
	}
	if b.ep, err = b.iface.CreateEP(uct.EPParams{}); err != nil {
		return err
	}
	aa, err := a.ep.Address()
	if err != nil {
		return fmt.Errorf("ep address: %w", err)
	}
	ba, err := b.ep.Address()
	if err != nil {
		return fmt.Errorf("ep address: %w", err)
	}
	if err := a.ep.ConnectToEP(b.iface.DeviceAddress(), ba); err != nil {
		return err
	}
	return b.ep.ConnectToEP(a.iface.DeviceAddress(), aa)
}

func (p *pair) closeSide(s *side) {
	if s == nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if s.ep != nil {
			s.ep.Close()
		}
		s.iface.Close()
		s.w.Close()
		s.md.Close()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		p.tb.Errorf("uctest: closing %s side hangs (ep, iface, worker, md)", p.o.TL)
	}
}

func (p *pair) close() {
	p.once.Do(func() {
		p.closeSide(p.a)
		p.closeSide(p.b)
	})
}

// warmup sends one AM each way and waits for it, so that connections set
// up lazily (tcp connects in the background) are established.
func (p *pair) warmup() {
	p.tb.Helper()
	const id = amID + 1
	for _, d := range [][2]*side{{p.a, p.b}, {p.b, p.a}} {
		rec := newRecorder()
		d[1].iface.SetAMHandler(id, rec.handle)
		var err error
		if d[0].attr.Cap.Has(uct.CapAMShort) {
			err = retry(func() error { return d[0].ep.AMShort(id, 0, nil) })
		} else {
			err = retry(func() error { _, err := d[0].ep.AMBcopy(id, func([]byte) int { return 0 }); return err })
		}
		if err != nil {
			p.tb.Fatalf("uctest: warm-up send: %v", err)
		}
		rec.wait(p.tb, 1, 10*time.Second)
		d[1].iface.SetAMHandler(id, nil)
	}
}

// recorder is an AM handler that keeps a copy of every message and checks
// that handlers of one worker never run concurrently.
type recorder struct {
	mu      sync.Mutex
	msgs    [][]byte
	n       atomic.Int64
	ch      chan struct{}
	busy    atomic.Int32
	overlap atomic.Bool
	gate    chan struct{} // when non-nil, the first message blocks on it
	gated   atomic.Bool
	discard bool // count only
}

func newRecorder() *recorder { return &recorder{ch: make(chan struct{}, 1)} }

func (r *recorder) handle(data []byte) {
	if r.busy.Add(1) != 1 {
		r.overlap.Store(true)
	}
	if r.gate != nil && r.gated.CompareAndSwap(false, true) {
		<-r.gate // test only: stall the receiving worker to build back-pressure
	}
	if !r.discard {
		c := append([]byte(nil), data...)
		r.mu.Lock()
		r.msgs = append(r.msgs, c)
		r.mu.Unlock()
	}
	r.n.Add(1)
	r.busy.Add(-1)
	select {
	case r.ch <- struct{}{}:
	default:
	}
}

// wait returns once n messages arrived, or fails the test at the timeout.
func (r *recorder) wait(tb testing.TB, n int, timeout time.Duration) [][]byte {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for r.n.Load() < int64(n) {
		select {
		case <-r.ch:
		case <-deadline.C:
			tb.Fatalf("received %d of %d messages in %v", r.n.Load(), n, timeout)
		}
	}
	if r.overlap.Load() {
		tb.Errorf("AM handlers of one worker ran concurrently")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.msgs...)
}

// quiet checks that no more than n messages arrive within d.
func (r *recorder) quiet(tb testing.TB, n int, d time.Duration) {
	tb.Helper()
	time.Sleep(d)
	if got := r.n.Load(); got != int64(n) {
		tb.Errorf("received %d messages, want exactly %d", got, n)
	}
}

// retry calls send until it returns something other than ErrNoResource
// (the worker frees resources meanwhile) or the timeout passes.
func retry(send func() error) error {
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		err := send()
		if !errors.Is(err, uct.ErrNoResource) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still ErrNoResource after 20s: %w", err)
		}
		if i < 64 {
			runtimeGosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// completion is a uct.Completion whose result is read from a channel.
type completion struct {
	c  *uct.Completion
	ch chan error
}

func newCompletion() *completion {
	cp := &completion{ch: make(chan error, 1)}
	cp.c = uct.NewCompletion(1, func(st error) { cp.ch <- st })
	return cp
}

// result waits for an operation that returned err: nil means done; ErrInProgress
// means the completion must fire within the timeout.
func (cp *completion) result(tb testing.TB, err error, what string) error {
	tb.Helper()
	if !errors.Is(err, uct.ErrInProgress) {
		return err
	}
	select {
	case st := <-cp.ch:
		return st
	case <-time.After(10 * time.Second):
		tb.Fatalf("%s: completion did not fire in 10s", what)
		return nil
	}
}
