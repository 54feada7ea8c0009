package stream

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/gouct/gouct/uct"
	_ "github.com/gouct/gouct/uct/ib"
	_ "github.com/gouct/gouct/uct/self"
	_ "github.com/gouct/gouct/uct/shm"
)

// side is one "process": a worker, an iface of transport tl and a Mux on it.
type side struct {
	w   *uct.Worker
	md  uct.MD
	ti  *uct.TLIface
	mux *Mux
}

// componentOf maps a transport to its component.
func componentOf(tl string) string {
	if tl == "rc_verbs" {
		return "ib"
	}
	return tl
}

// openSide opens transport tl, on device dev ("rxe0:1"; "" for the first),
// with its own worker, and a Mux on it. Asynchronous endpoint failures are
// wired to Mux.EndpointFailed.
func openSide(tl, dev string, cfg *uct.Config) (*side, error) {
	comp, ok := uct.LookupComponent(componentOf(tl))
	if !ok {
		return nil, fmt.Errorf("component %q not registered", componentOf(tl))
	}
	res, err := comp.MDResources()
	if err != nil {
		return nil, err
	}
	s := &side{w: uct.NewWorker(cfg)}
	for _, r := range res {
		if dev != "" && r.Name != strings.Split(dev, ":")[0] {
			continue
		}
		md, err := comp.OpenMD(r.Name, cfg)
		if err != nil {
			continue
		}
		tls, _ := md.TLResources()
		for _, tr := range tls {
			if tr.TL != tl || (dev != "" && tr.Device != dev && strings.Contains(dev, ":")) {
				continue
			}
			ifc, err := md.OpenIface(s.w, tr, uct.IfaceParams{Config: cfg, ErrHandler: func(ep uct.EP, err error) {
				if s.mux != nil {
					s.mux.EndpointFailed(ep, err)
				}
			}})
			if err != nil {
				md.Close()
				s.w.Close()
				return nil, fmt.Errorf("open iface %s: %w", tr.Name(), err)
			}
			s.md = md
			s.ti = &uct.TLIface{Component: comp.Name(), MD: md, Resource: tr, Iface: ifc, Attr: ifc.Attr()}
			mux, err := NewMux(s.w, s.ti, cfg)
			if err != nil {
				ifc.Close()
				md.Close()
				s.w.Close()
				return nil, err
			}
			s.mux = mux
			return s, nil
		}
		md.Close()
	}
	s.w.Close()
	return nil, fmt.Errorf("no %s resource (device %q)", tl, dev)
}

func (s *side) close() {
	s.mux.Close()
	s.ti.Iface.Close()
	s.md.Close()
	s.w.Close()
}

// env is two sides of one transport, as two processes would have them.
type env struct {
	tl     string
	a, b   *side
	tcpCtl testing.TB // non-nil: liveness channels are TCP loopback sockets, not net.Pipe
}

// envConfig is the configuration of the suites: RDMANET_* from the
// environment (to tune benchmarks, e.g. RDMANET_READ_SPIN), else defaults.
func envConfig(t testing.TB) *uct.Config {
	cfg, err := uct.ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func newEnv(t testing.TB, tl string, cfg *uct.Config) *env {
	t.Helper()
	if cfg == nil {
		cfg = envConfig(t)
	}
	a, err := openSide(tl, devFor(tl, "A"), cfg)
	if err != nil {
		t.Fatalf("open %s: %v", tl, err)
	}
	b, err := openSide(tl, devFor(tl, "B"), cfg)
	if err != nil {
		a.close()
		t.Fatalf("open %s: %v", tl, err)
	}
	e := &env{tl: tl, a: a, b: b}
	t.Cleanup(e.close)
	return e
}

// newSharedEnv is one side used by both conns of a pair: one worker, one
// iface, one Mux (what a process dialing itself gets).
func newSharedEnv(t testing.TB, tl string, cfg *uct.Config) *env {
	t.Helper()
	if cfg == nil {
		cfg = envConfig(t)
	}
	a, err := openSide(tl, devFor(tl, "A"), cfg)
	if err != nil {
		t.Fatalf("open %s: %v", tl, err)
	}
	e := &env{tl: tl, a: a, b: a}
	t.Cleanup(e.close)
	return e
}

func (e *env) close() {
	e.a.close()
	if e.b != e.a {
		e.b.close()
	}
}

// connectEPs creates an EP from each side to the other.
func connectEPs(a, b *side) (uct.EP, uct.EP, error) {
	if a.ti.Attr.Cap.Has(uct.CapConnectToIface) {
		ea, err := a.ti.Iface.CreateEP(uct.EPParams{DevAddr: b.ti.Iface.DeviceAddress(), IfaceAddr: b.ti.Iface.IfaceAddress()})
		if err != nil {
			return nil, nil, err
		}
		eb, err := b.ti.Iface.CreateEP(uct.EPParams{DevAddr: a.ti.Iface.DeviceAddress(), IfaceAddr: a.ti.Iface.IfaceAddress()})
		if err != nil {
			ea.Close()
			return nil, nil, err
		}
		return ea, eb, nil
	}
	ea, err := a.ti.Iface.CreateEP(uct.EPParams{})
	if err != nil {
		return nil, nil, err
	}
	eb, err := b.ti.Iface.CreateEP(uct.EPParams{})
	if err != nil {
		ea.Close()
		return nil, nil, err
	}
	aa, err1 := ea.Address()
	ba, err2 := eb.Address()
	if err := errors.Join(err1, err2); err != nil {
		ea.Close()
		eb.Close()
		return nil, nil, err
	}
	if err := errors.Join(ea.ConnectToEP(b.ti.Iface.DeviceAddress(), ba), eb.ConnectToEP(a.ti.Iface.DeviceAddress(), aa)); err != nil {
		ea.Close()
		eb.Close()
		return nil, nil, err
	}
	return ea, eb, nil
}

// pair is a started conn pair; ctlA/ctlB are the test's handles on the
// liveness sockets (to simulate peer death).
type pair struct {
	c1, c2     *Conn
	ctl1, ctl2 net.Conn
}

var addrSeq struct {
	sync.Mutex
	n int
}

func (e *env) pair(t testing.TB) *pair {
	t.Helper()
	p, err := e.newPair()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *env) newPair() (*pair, error) {
	c1, err := e.a.mux.NewConn()
	if err != nil {
		return nil, err
	}
	c2, err := e.b.mux.NewConn()
	if err != nil {
		c1.Abort(err)
		return nil, err
	}
	ea, eb, err := connectEPs(e.a, e.b)
	if err != nil {
		c1.Abort(err)
		c2.Abort(err)
		return nil, err
	}
	x, y := net.Pipe()
	if e.tcpCtl != nil {
		x, y = tcpPair(e.tcpCtl)
	}
	addrSeq.Lock()
	addrSeq.n++
	n := addrSeq.n
	addrSeq.Unlock()
	a1 := Addr{Net: "rdma", Addr: fmt.Sprintf("127.0.0.1:%d", 10000+2*n)}
	a2 := Addr{Net: "rdma", Addr: fmt.Sprintf("127.0.0.1:%d", 10001+2*n)}
	if err := c1.Start(ea, c2.ID(), x, a1, a2); err != nil {
		return nil, err
	}
	if err := c2.Start(eb, c1.ID(), y, a2, a1); err != nil {
		return nil, err
	}
	return &pair{c1: c1, c2: c2, ctl1: x, ctl2: y}, nil
}

func (p *pair) close() {
	p.c1.Close()
	p.c2.Close()
}

// transports lists the transports the suites run over: self always, shm
// where available, and rc_verbs where an RDMA device is (required under
// RXEVM=1, the Soft-RoCE VM suite; IBTEST_DEV_A/B pick the devices).
func transports() []string {
	out := []string{"self"}
	if c, ok := uct.LookupComponent("shm"); ok {
		if _, err := c.MDResources(); err == nil {
			out = append(out, "shm")
		}
	}
	if c, ok := uct.LookupComponent("ib"); ok {
		_, err := c.MDResources()
		if err == nil {
			out = append(out, "rc_verbs")
		} else if os.Getenv("RXEVM") == "1" {
			panic(fmt.Sprintf("RXEVM=1 but rc_verbs is unavailable: %v", err))
		}
	}
	return out
}

// devFor is the device of side "A" or "B" for tl ("" for any).
func devFor(tl, which string) string {
	if tl != "rc_verbs" {
		return ""
	}
	if d := os.Getenv("IBTEST_DEV_" + which); d != "" {
		return d
	}
	return os.Getenv("RXE_DEV")
}
