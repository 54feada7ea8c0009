package dialer

import (
	"fmt"
	"net"
	"os"

	"github.com/gouct/gouct/internal/rt"
	"github.com/gouct/gouct/internal/stream"
	"github.com/gouct/gouct/internal/wire"
	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/ib"
)

// rcVerbs is the TL whose device follows the bootstrap IP.
const rcVerbs = "rc_verbs"

// candidate is one transport offered in the Hello, with what the client
// prepared for it: a stream conn (its id goes in the Hello) and, for
// connect-to-EP transports, the unconnected EP whose address goes in it too.
type candidate struct {
	t  *rt.Transport
	sc *stream.Conn
	ep uct.EP
}

func (c *candidate) release(err error) {
	if c.sc != nil {
		c.sc.Abort(err)
		c.sc = nil
	}
	if c.ep != nil {
		c.ep.Close()
		c.ep = nil
	}
}

// handshake runs the client side of the wireup on the bootstrap socket tc
// (DESIGN.md "Wireup"): Hello with candidates → Reply → connect → Ready both
// ways → stream start. The caller has set tc's deadline (rearm sets it
// again) and closes tc when handshake fails; on success tc belongs to the
// returned conn.
func handshake(tc *net.TCPConn, cfg *uct.Config, detach func() bool, rearm func()) (rt.Conn, error) {
	r := rt.Get(cfg)
	tcpOK := rt.TCPAllowed(cfg)
	allowed := r.Allowed(cfg)
	// RoCE routes by IP: the rc_verbs device whose GID is the bootstrap
	// socket's local IP goes first (the server takes the first candidate
	// its device reaches).
	if dev := bootstrapDevice(allowed, tc.LocalAddr()); dev != "" {
		allowed = preferDevice(allowed, dev)
	}
	if len(allowed) > wire.MaxCandidates {
		allowed = allowed[:wire.MaxCandidates]
	}

	// Step 1 (seed: exchange addresses out of band): prepare candidates and send Hello.
	cands := make([]candidate, 0, len(allowed))
	defer func() {
		for i := range cands {
			cands[i].release(errAborted)
		}
	}()
	h := wire.Hello{Host: rt.LocalHost(), PID: uint32(os.Getpid()), Asked: rt.TLSString(cfg)}
	if tcpOK {
		h.Flags |= wire.FlagTCPAllowed
	}
	if cfg.TLSForced() {
		h.Flags |= wire.FlagForced
	}
	var localIP net.IP
	if ta, ok := tc.LocalAddr().(*net.TCPAddr); ok {
		localIP = ta.IP
	}
	for _, t := range allowed {
		c, wc, err := prepare(t, localIP)
		if err != nil {
			// A transport that cannot take a conn now is not offered.
			continue
		}
		cands = append(cands, c)
		h.Cands = append(h.Cands, wc)
	}
	buf := make([]byte, 0, wire.MaxFrame)
	out, err := wire.AppendHello(buf, &h)
	if err != nil {
		return nil, fmt.Errorf("%w: encode hello: %w", rt.ErrHandshake, err)
	}
	if _, err := tc.Write(out); err != nil {
		return nil, fmt.Errorf("%w: send hello: %w", rt.ErrHandshake, err)
	}

	// Step 2: the server's choice.
	frame, err := wire.ReadFrame(tc, wire.TypeReply, buf)
	if err != nil {
		return nil, fmt.Errorf("%w: read reply: %w", rt.ErrHandshake, err)
	}
	rep, err := wire.DecodeReply(frame)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", rt.ErrHandshake, err)
	}
	switch rep.Status {
	case wire.StatusFallback:
		if !tcpOK {
			return nil, fmt.Errorf("%w: server fell back to tcp (%v), which this side does not allow (RDMANET_TLS=%s)",
				rt.ErrHandshake, rep.Reason, rt.TLSString(cfg))
		}
		if !detach() {
			return nil, errAborted
		}
		reason, detail := rep.Reason, rep.Detail
		if len(h.Cands) == 0 {
			// Nothing offered: say so when it is because transports this
			// side allows failed (a removed RDMA device), not the config.
			if f := r.FailedSummary(cfg); f != "" {
				reason, detail = wire.ReasonFailed, f
			}
		}
		rt.Logger(cfg).Info("rdmanet: tcp fallback", "remote", tc.RemoteAddr().String(), "reason", reason.String(), "detail", detail)
		return rt.NewTCPConn(tc, reason, detail), nil
	case wire.StatusRefused:
		return nil, refused(cfg, rt.Offered(allowed, tcpOK), rep.Offered, rep.Reason, rep.Detail)
	}
	if int(rep.Choice) >= len(cands) {
		return nil, fmt.Errorf("%w: server chose candidate %d of %d", rt.ErrHandshake, rep.Choice, len(cands))
	}
	ch := &cands[rep.Choice]

	// Step 3: connect our EP to the server's iface or EP and start the
	// stream, then Ready both ways. The stream starts before our Ready
	// leaves: the server may write as soon as it reads it.
	ready := wire.Ready{}
	var sc *stream.Conn
	var watch func()
	ep, err := connect(ch, &rep)
	if err == nil {
		if watch, err = rt.StartStream(ch.sc, ep, rep.ConnID, tc, r.Log); err == nil {
			sc = ch.sc
			ch.sc, ch.ep = nil, nil // sc owns ep now, and tc until we fail
			rearm()                 // Start cleared tc's deadline
		}
	}
	if err != nil {
		ready = wire.Ready{Status: wire.StatusRefused, Reason: wire.ReasonConnectError, Detail: err.Error()}
		if tcpOK {
			ready.Status = wire.StatusFallback
		}
	}
	ok := false
	defer func() {
		if sc != nil && !ok {
			sc.Abort(errAborted)
		}
	}()
	if out, err = wire.AppendReady(buf[:0], &ready); err == nil {
		_, err = tc.Write(out)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: send ready: %w", rt.ErrHandshake, err)
	}
	frame, err = wire.ReadFrame(tc, wire.TypeReady, buf)
	if err != nil {
		return nil, fmt.Errorf("%w: read ready: %w", rt.ErrHandshake, err)
	}
	sr, err := wire.DecodeReady(frame)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", rt.ErrHandshake, err)
	}
	switch {
	case sr.Status == wire.StatusFallback && tcpOK && sc == nil:
		if !detach() {
			return nil, errAborted
		}
		rt.Logger(cfg).Info("rdmanet: tcp fallback", "remote", tc.RemoteAddr().String(), "reason", sr.Reason.String(), "detail", sr.Detail)
		return rt.NewTCPConn(tc, sr.Reason, sr.Detail), nil
	case sr.Status != wire.StatusOK:
		return nil, fmt.Errorf("%w: %s: server gave up: %v: %s", rt.ErrHandshake, ch.t.Name(), sr.Reason, sr.Detail)
	case sc == nil:
		return nil, fmt.Errorf("%w: server ignored our connect error on %s", rt.ErrHandshake, ch.t.Name())
	}

	// Step 4: the stream reads tc from now on.
	if !detach() {
		return nil, errAborted
	}
	ok = true
	watch()
	return sc, nil
}

// bootstrapDevice returns the RDMA device ("rxe1:1") whose RoCE v2 GID is
// the IP of a (the bootstrap socket's local address) when ts has an
// rc_verbs transport, or "" (no rc_verbs transport, loopback or non-IP
// address, no RDMA device has that IP). It scans the host's RDMA devices
// (rt.DeviceForAddr, cached). Safe for
// concurrent use.
func bootstrapDevice(ts []*rt.Transport, a net.Addr) string {
	for _, t := range ts {
		if t.TI.Resource.TL == rcVerbs {
			return rt.DeviceForAddr(a)
		}
	}
	return ""
}

// preferDevice returns ts with the rc_verbs transports on device dev first,
// the others after them in their order. ts is not modified.
func preferDevice(ts []*rt.Transport, dev string) []*rt.Transport {
	out := make([]*rt.Transport, 0, len(ts))
	for _, t := range ts {
		if t.TI.Resource.TL == rcVerbs && t.TI.Resource.Device == dev {
			out = append(out, t)
		}
	}
	for _, t := range ts {
		if t.TI.Resource.TL != rcVerbs || t.TI.Resource.Device != dev {
			out = append(out, t)
		}
	}
	return out
}

// prepare allocates the stream conn (and the unconnected EP of a
// connect-to-EP transport) for one candidate. An rc_verbs EP takes the
// RoCE v2 GID of the bootstrap socket's local IP when its port has it.
func prepare(t *rt.Transport, localIP net.IP) (candidate, wire.Candidate, error) {
	c := candidate{t: t}
	sc, err := t.Mux.NewConn()
	if err != nil {
		return c, wire.Candidate{}, err
	}
	c.sc = sc
	a := t.TI.Address()
	wc := wire.Candidate{TL: a.TL, Device: a.Device, DevAddr: a.DevAddr, IfaceAddr: a.IfaceAddr,
		Cap: uint64(t.TI.Attr.Cap), ConnID: sc.ID()}
	if !t.TI.Attr.Cap.Has(uct.CapConnectToIface) && t.TI.Attr.Cap.Has(uct.CapConnectToEP) {
		ep, err := t.TI.Iface.CreateEP(uct.EPParams{})
		if err == nil {
			c.ep = ep
			ib.UseGIDForIP(ep, localIP)
			wc.EPAddr, err = ep.Address()
		}
		if err != nil {
			c.release(err)
			return c, wire.Candidate{}, err
		}
	}
	return c, wc, nil
}

// connect finishes the chosen candidate's EP against the server's addresses.
func connect(c *candidate, rep *wire.Reply) (uct.EP, error) {
	if c.ep != nil {
		if err := c.ep.ConnectToEP(rep.DevAddr, rep.EPAddr); err != nil {
			return nil, fmt.Errorf("%s: connect to server ep: %w", c.t.Name(), err)
		}
		return c.ep, nil
	}
	ep, err := c.t.TI.Iface.CreateEP(uct.EPParams{DevAddr: rep.DevAddr, IfaceAddr: rep.IfaceAddr})
	if err != nil {
		return nil, fmt.Errorf("%s: connect to server iface: %w", c.t.Name(), err)
	}
	c.ep = ep
	return ep, nil
}

// refused is the error of a forced transport list that found nothing common:
// it names what was asked and what each side offered.
func refused(cfg *uct.Config, local, peer string, r wire.Reason, detail string) error {
	sentinel := rt.ErrNoTransport
	switch r {
	case wire.ReasonVersion, wire.ReasonInternal, wire.ReasonConnectError:
		sentinel = rt.ErrHandshake
	}
	s := fmt.Sprintf("%v: asked for %q (this side offers %s), peer offers %s: %v",
		sentinel, rt.TLSString(cfg), local, peer, r)
	if detail != "" {
		s += ": " + detail
	}
	return &refusedError{msg: s, sentinel: sentinel}
}

type refusedError struct {
	msg      string
	sentinel error
}

func (e *refusedError) Error() string { return e.msg }
func (e *refusedError) Unwrap() error { return e.sentinel }
