package rdmanet_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/gouct/gouct/internal/rt"
	"github.com/gouct/gouct/internal/wire"
	"github.com/gouct/gouct/uct"
)

// Stream wire constants (internal/stream/wire.go), restated here to forge
// messages from outside the package: the RTS active message id and its
// fixed body length.
const (
	amRTS       = 18
	rtsFixedLen = 4 + 8 + 8 + 2
)

// rawPeer is a hand-driven client: it runs the wireup itself and keeps a
// bare endpoint to the server's conn, to send whatever it likes.
type rawPeer struct {
	tc     net.Conn
	ep     uct.EP
	connID uint32 // the server conn's id
	t      *rt.Transport
}

// rawDial handshakes with l on transport tl and returns the raw peer and
// the server's accepted conn.
func rawDial(t *testing.T, l net.Listener, tl string) (*rawPeer, net.Conn) {
	t.Helper()
	c, _ := rt.Resolve(nil)
	var tr *rt.Transport
	for _, x := range rt.Get(c).Transports {
		if x.TI.Resource.TL == tl {
			tr = x
		}
	}
	if tr == nil {
		t.Fatalf("no %s transport here", tl)
	}
	tc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a := tr.TI.Address()
	h := wire.Hello{Host: rt.LocalHost(), Cands: []wire.Candidate{{TL: a.TL, Device: a.Device, DevAddr: a.DevAddr,
		IfaceAddr: a.IfaceAddr, Cap: uint64(tr.TI.Attr.Cap), ConnID: 0xfff1}}}
	buf := make([]byte, 0, wire.MaxFrame)
	out, _ := wire.AppendHello(buf, &h)
	if _, err := tc.Write(out); err != nil {
		t.Fatal(err)
	}
	f, err := wire.ReadFrame(tc, wire.TypeReply, buf)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := wire.DecodeReply(f)
	if err != nil || rep.Status != wire.StatusOK {
		t.Fatalf("reply %+v, %v", rep, err)
	}
	ep, err := tr.TI.Iface.CreateEP(uct.EPParams{DevAddr: rep.DevAddr, IfaceAddr: rep.IfaceAddr})
	if err != nil {
		t.Fatal(err)
	}
	out, _ = wire.AppendReady(buf[:0], &wire.Ready{})
	if _, err := tc.Write(out); err != nil {
		t.Fatal(err)
	}
	if f, err = wire.ReadFrame(tc, wire.TypeReady, buf); err != nil {
		t.Fatal(err)
	}
	sc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return &rawPeer{tc: tc, ep: ep, connID: rep.ConnID, t: tr}, sc
}

func (p *rawPeer) close() {
	p.ep.Close()
	p.tc.Close()
}

// rts sends a forged rendezvous request to the server conn.
func (p *rawPeer) rts(t *testing.T, length, addr uint64, rkey []byte) {
	t.Helper()
	msg := make([]byte, 8+rtsFixedLen+len(rkey))
	binary.LittleEndian.PutUint32(msg, p.connID)
	b := msg[8:]
	binary.LittleEndian.PutUint32(b, 1)
	binary.LittleEndian.PutUint64(b[4:], length)
	binary.LittleEndian.PutUint64(b[12:], addr)
	binary.LittleEndian.PutUint16(b[20:], uint16(len(rkey)))
	copy(b[rtsFixedLen:], rkey)
	for {
		_, err := p.ep.AMBcopy(amRTS, func(dst []byte) int { return copy(dst, msg) })
		if err == nil {
			return
		}
		if !errors.Is(err, uct.ErrNoResource) {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestForgedRendezvous: a peer that sends a rendezvous request for memory
// outside what it registered (bad address, bad length, bad rkey) gets the
// conn reset; the reader never returns data, and other conns go on.
func TestForgedRendezvous(t *testing.T) {
	const tl = "shm"
	l := listen(t, cfg(tl))
	defer l.Close()
	base := leakBaseline(t)
	bc1, bc2, err := pipe(l, cfg(tl))
	if err != nil {
		t.Fatal(err)
	}
	defer bc1.Close()
	defer bc2.Close()

	// Memory the forger legitimately registered, to take a real rkey from.
	secret := make([]byte, 1<<20)
	probe, psc := rawDial(t, l, tl)
	md := probe.t.TI.MD
	probe.close()
	psc.Close()
	mh, err := md.Register(secret, uct.AccessLocalRead|uct.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	defer md.Deregister(mh)
	rkey, err := md.PackRKey(mh)
	if err != nil {
		t.Fatal(err)
	}
	addr := uint64(uintptr(unsafe.Pointer(&secret[0])))
	bogus := append([]byte(nil), rkey...)
	for i := range bogus {
		bogus[i] ^= 0x5a
	}
	for _, tc := range []struct {
		name         string
		length, addr uint64
		rkey         []byte
	}{
		{"address past the registration", 4096, addr + 1<<40, rkey},
		{"address before the registration", 4096, addr - 1<<20, rkey},
		{"length past the registration", 2 << 20, addr, rkey},
		{"bogus rkey", 4096, addr, bogus},
		{"short rkey", 4096, addr, rkey[:len(rkey)/2]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, sc := rawDial(t, l, tl)
			defer p.close()
			defer sc.Close()
			p.rts(t, tc.length, tc.addr, tc.rkey)
			sc.SetReadDeadline(time.Now().Add(2 * time.Second))
			// The reader pulls in chunks: chunks inside the registration
			// may arrive (the forger exposed them), never one outside.
			total, buf := 0, make([]byte, 8192)
			var err error
			for err == nil {
				var n int
				n, err = sc.Read(buf)
				total += n
			}
			if total > len(secret) || errors.Is(err, io.EOF) || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("server read %d bytes, then %v; want a reset, at most %d bytes", total, err, len(secret))
			}
			t.Logf("after %d bytes: %v", total, err)
		})
	}
	// The bystander still works.
	go bc1.Write([]byte("fine"))
	b := make([]byte, 4)
	if _, err := io.ReadFull(bc2, b); err != nil || string(b) != "fine" {
		t.Fatalf("bystander: %q, %v", b, err)
	}
	bc1.Close()
	bc2.Close()
	l.Close()
	base.check(t)
}
