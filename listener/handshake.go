package listener

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/gouct/gouct/internal/rt"
	"github.com/gouct/gouct/internal/wire"
	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/ib"
)

const (
	// selectSize is the message size transports are ranked for (uct.Select).
	selectSize = 1024
	// rcVerbs is the TL whose device follows the bootstrap IP.
	rcVerbs = "rc_verbs"
)

var errClosing = errors.New("listener closed")

// handshake runs the server side of the wireup on c (DESIGN.md "Wireup"):
// read Hello → choose (uct.Select over the common reachable candidates) →
// create the EP → Reply → read Ready → send Ready → stream start. On error
// the caller closes c; on success c belongs to the returned conn.
func (l *Listener) handshake(c *net.TCPConn) (rt.Conn, error) {
	c.SetDeadline(time.Now().Add(l.cfg.HandshakeTimeout))
	buf := make([]byte, 0, wire.MaxFrame)
	frame, err := wire.ReadFrame(c, wire.TypeHello, buf)
	if err != nil {
		if errors.Is(err, wire.ErrVersion) {
			// Answer in our version so a newer or older client can say why,
			// after draining its hello (at most 64 KiB: a u16 length) so
			// that closing does not reset the connection under the reply.
			if hdr, _ := wire.ParseHeader(frame); hdr.Len > 0 {
				io.CopyN(io.Discard, c, int64(hdr.Len))
			}
			out, _ := wire.AppendReply(buf[:0], &wire.Reply{Status: wire.StatusRefused,
				Reason: wire.ReasonVersion, Detail: err.Error()})
			c.Write(out)
		}
		return nil, fmt.Errorf("read hello: %w", err)
	}
	h, err := wire.DecodeHello(frame)
	if err != nil {
		return nil, err
	}

	tcpOK := rt.TCPAllowed(l.cfg) && h.Flags&wire.FlagTCPAllowed != 0
	allowed := l.rt.Allowed(l.cfg)
	offered := rt.Offered(allowed, rt.TCPAllowed(l.cfg))
	// not answers with TCP fallback when both sides allow it, else refuses.
	not := func(reason wire.Reason, detail string) (rt.Conn, error) {
		rep := wire.Reply{Status: wire.StatusRefused, Reason: reason, Offered: offered, Detail: detail}
		if tcpOK {
			rep.Status = wire.StatusFallback
		}
		out, err := wire.AppendReply(buf[:0], &rep)
		if err != nil {
			return nil, err
		}
		if _, err := c.Write(out); err != nil {
			return nil, fmt.Errorf("send reply: %w", err)
		}
		if !tcpOK {
			return nil, fmt.Errorf("refused: client asked for %q, this side offers %s: %v: %s", h.Asked, offered, reason, detail)
		}
		if !l.detach(c) {
			return nil, errClosing
		}
		c.SetDeadline(time.Time{})
		l.log.Info("rdmanet: tcp fallback", "remote", c.RemoteAddr().String(), "reason", reason.String(), "detail", detail)
		return rt.NewTCPConn(c, reason, ""), nil
	}

	// Choose: the common candidates, host-local ones only for a peer of
	// this host and user, ranked by uct.Select (which checks reachability),
	// rc_verbs on the device of the bootstrap socket's IP first (choose).
	sameHost := h.Host == rt.LocalHost()
	var usable []*uct.TLIface
	common := false
	for _, t := range allowed {
		for i := range h.Cands {
			if h.Cands[i].TL != t.TI.Resource.TL {
				continue
			}
			common = true
			if t.HostLocal() && !sameHost {
				continue
			}
			usable = append(usable, t.TI)
			break
		}
	}
	peer := make([]uct.TLAddress, len(h.Cands))
	for i, wc := range h.Cands {
		peer[i] = uct.TLAddress{TL: wc.TL, Device: wc.Device, DevAddr: wc.DevAddr, IfaceAddr: wc.IfaceAddr}
	}
	ti, pa, err := choose(usable, peer, bootstrapDevice(usable, c.LocalAddr()))
	if err != nil {
		failed := l.rt.FailedSummary(l.cfg)
		switch {
		case len(h.Cands) > 0 && !common && failed != "":
			// What we have in common with the client failed here (a
			// removed RDMA device), rather than never being configured.
			return not(wire.ReasonFailed, failed)
		case len(h.Cands) == 0 && h.Flags&wire.FlagForced != 0:
			return not(wire.ReasonDisabled, "client's transport list "+h.Asked+" leaves nothing to offer")
		case !common && l.cfg.TLSForced():
			return not(wire.ReasonDisabled, "transport list "+rt.TLSString(l.cfg))
		case !common:
			return not(wire.ReasonNoCommon, "")
		case len(usable) == 0: // only host-local transports in common
			return not(wire.ReasonOtherHost, "")
		default:
			return not(wire.ReasonUnreachable, "")
		}
	}
	choice := -1
	for i := range peer {
		if peer[i].TL == pa.TL && peer[i].Device == pa.Device &&
			bytes.Equal(peer[i].DevAddr, pa.DevAddr) && bytes.Equal(peer[i].IfaceAddr, pa.IfaceAddr) {
			choice = i
			break
		}
	}
	var t *rt.Transport
	for _, x := range allowed {
		if x.TI == ti {
			t = x
		}
	}
	if choice < 0 || t == nil {
		return not(wire.ReasonInternal, "selected transport not found")
	}
	cand := &h.Cands[choice]

	// Create our EP: connect-to-iface, or connect-to-EP with the client's
	// EP address (rc_verbs: the client created its EP unconnected).
	sc, err := t.Mux.NewConn()
	if err != nil {
		return not(wire.ReasonInternal, err.Error())
	}
	var ep uct.EP
	release := func(err error) {
		sc.Abort(err)
		if ep != nil {
			ep.Close()
		}
	}
	rep := wire.Reply{Status: wire.StatusOK, Choice: uint8(choice), ConnID: sc.ID(),
		DevAddr: ti.Iface.DeviceAddress(), IfaceAddr: ti.Iface.IfaceAddress(), Offered: offered}
	if err := func() error {
		if ti.Attr.Cap.Has(uct.CapConnectToIface) && len(cand.IfaceAddr) > 0 {
			ep, err = ti.Iface.CreateEP(uct.EPParams{DevAddr: cand.DevAddr, IfaceAddr: cand.IfaceAddr})
			return err
		}
		if !ti.Attr.Cap.Has(uct.CapConnectToEP) || len(cand.EPAddr) == 0 {
			return uct.NotSupported(t.Name() + ": no way to connect (no iface or ep address)")
		}
		if ep, err = ti.Iface.CreateEP(uct.EPParams{}); err != nil {
			return err
		}
		// rc_verbs: the QP's source GID is the one of the bootstrap
		// socket's local IP when the port has it, as on the client.
		if ta, ok := c.LocalAddr().(*net.TCPAddr); ok {
			ib.UseGIDForIP(ep, ta.IP)
		}
		if err = ep.ConnectToEP(cand.DevAddr, cand.EPAddr); err != nil {
			return err
		}
		rep.EPAddr, err = ep.Address()
		return err
	}(); err != nil {
		release(err)
		return not(wire.ReasonConnectError, fmt.Sprintf("%s: %v", t.Name(), err))
	}
	ok := false
	defer func() {
		if !ok {
			release(errClosing)
		}
	}()
	out, err := wire.AppendReply(buf[:0], &rep)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write(out); err != nil {
		return nil, fmt.Errorf("send reply: %w", err)
	}

	// Ready both ways: the client has connected its EP (or says why not).
	if frame, err = wire.ReadFrame(c, wire.TypeReady, buf); err != nil {
		return nil, fmt.Errorf("read ready: %w", err)
	}
	cr, err := wire.DecodeReady(frame)
	if err != nil {
		return nil, err
	}
	if cr.Status != wire.StatusOK {
		release(fmt.Errorf("client: %v", cr.Reason))
		ok = true // released
		r := wire.Ready{Status: wire.StatusRefused, Reason: cr.Reason, Detail: cr.Detail}
		if tcpOK && cr.Status == wire.StatusFallback {
			r.Status = wire.StatusFallback
		}
		if out, err = wire.AppendReady(buf[:0], &r); err == nil {
			_, err = c.Write(out)
		}
		if err != nil {
			return nil, fmt.Errorf("send ready: %w", err)
		}
		if r.Status != wire.StatusFallback {
			return nil, fmt.Errorf("client could not connect %s: %v: %s", t.Name(), cr.Reason, cr.Detail)
		}
		if !l.detach(c) {
			return nil, errClosing
		}
		c.SetDeadline(time.Time{})
		l.log.Info("rdmanet: tcp fallback", "remote", c.RemoteAddr().String(), "reason", cr.Reason.String(), "detail", cr.Detail)
		return rt.NewTCPConn(c, cr.Reason, cr.Detail), nil
	}
	// The stream starts before our Ready leaves: the client may write as
	// soon as it reads it.
	if !l.detach(c) {
		return nil, errClosing
	}
	watch, err := rt.StartStream(sc, ep, cand.ConnID, c, l.log)
	if err != nil {
		return nil, fmt.Errorf("start stream on %s: %w", t.Name(), err)
	}
	// From here sc owns c and ep: a failure aborts sc (the deferred release).
	c.SetWriteDeadline(time.Now().Add(l.cfg.HandshakeTimeout))
	if out, err = wire.AppendReady(buf[:0], &wire.Ready{}); err == nil {
		_, err = c.Write(out)
	}
	if err != nil {
		return nil, fmt.Errorf("send ready: %w", err)
	}
	c.SetWriteDeadline(time.Time{})
	ok = true
	watch()
	return sc, nil
}

// choose picks the local iface and the peer address of a conn. uct.Select
// ranks the transports (shm before rc_verbs for a peer of this host); when
// it picks rc_verbs and dev, the device whose RoCE v2 GID is the bootstrap
// socket's local IP, is another usable rc_verbs iface that reaches one of the
// peer's addresses, the conn runs on dev instead: RoCE routes by IP, so the
// device on the bootstrap's netdev takes the path the TCP connection took.
// Among the peer's addresses the first reachable one in the Hello's order
// wins; the client lists its device for its bootstrap IP first. dev "" (no
// RDMA device has the IP: loopback, another netdev) keeps uct.Select's choice.
func choose(usable []*uct.TLIface, peer []uct.TLAddress, dev string) (*uct.TLIface, uct.TLAddress, error) {
	ti, pa, err := uct.Select(usable, peer, selectSize)
	if err != nil || dev == "" || ti.Resource.TL != rcVerbs || ti.Resource.Device == dev {
		return ti, pa, err
	}
	for _, u := range usable {
		if u.Resource.TL != rcVerbs || u.Resource.Device != dev {
			continue
		}
		if ui, upa, err := uct.Select([]*uct.TLIface{u}, peer, selectSize); err == nil {
			return ui, upa, nil
		}
	}
	return ti, pa, nil
}

// bootstrapDevice returns the RDMA device ("rxe1:1") whose RoCE v2 GID is
// the IP of a (the listener side of the bootstrap socket) when ts has an
// rc_verbs iface, or "" (no rc_verbs iface, loopback or non-IP address, no
// RDMA device has that IP). It scans the host's RDMA devices
// (rt.DeviceForAddr, cached). Safe for
// concurrent use.
func bootstrapDevice(ts []*uct.TLIface, a net.Addr) string {
	for _, t := range ts {
		if t.Resource.TL == rcVerbs {
			return rt.DeviceForAddr(a)
		}
	}
	return ""
}
