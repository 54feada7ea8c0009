package tcp

import (
	"encoding/binary"
	"errors"
	"net"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gouct/gouct/uct"
)

// openLo opens a tcp iface on loopback with its own worker; cleanup closes both.
func openLo(t *testing.T, p uct.IfaceParams) *iface {
	t.Helper()
	m, err := component{}.OpenMD(mdName, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := uct.NewWorker(nil)
	ifc, err := m.OpenIface(w, uct.TLResource{TL: tlName, Device: "lo"}, p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ifc.Close(); w.Close(); m.Close() })
	return ifc.(*iface)
}

func TestResources(t *testing.T) {
	m, err := component{}.OpenMD(mdName, nil)
	if err != nil {
		t.Fatal(err)
	}
	tls, err := m.TLResources()
	if err != nil {
		t.Fatal(err)
	}
	if len(tls) == 0 || tls[0].Device != "lo" || tls[0].TL != "tcp" || tls[0].Type != uct.DeviceNet {
		t.Fatalf("resources %v: want tcp/lo first", tls)
	}
	if _, err := m.OpenIface(uct.NewWorker(nil), uct.TLResource{TL: tlName, Device: "no-such-dev0"}, uct.IfaceParams{}); err == nil {
		t.Errorf("OpenIface on a missing device: no error")
	}
	if _, err := m.PackRKey(nil); !errors.Is(err, uct.ErrNotSupported) {
		t.Errorf("PackRKey: %v, want ErrNotSupported", err)
	}
}

// TestBadPeer: malformed input closes that connection, never the iface.
func TestBadPeer(t *testing.T) {
	i := openLo(t, uct.IfaceParams{})
	var got atomic.Int64
	i.SetAMHandler(1, func([]byte) { got.Add(1) })
	addr := &net.TCPAddr{IP: net.IP(i.DeviceAddress()), Port: int(binary.BigEndian.Uint16(i.IfaceAddress()))}
	frame := func(id uint8, n uint32, payload int) []byte {
		b := []byte{id, 0, 0, 0, 0}
		binary.LittleEndian.PutUint32(b[1:], n)
		return append(b, make([]byte, payload)...)
	}
	cases := []struct {
		name string
		data []byte
		bad  bool // counted as bad input
	}{
		{"wrong magic", []byte("GET / HTTP/1.1\r\n\r\n"), true},
		{"unknown id", append([]byte(magic), frame(uct.MaxAMID, 0, 0)...), true},
		{"id 255", append([]byte(magic), frame(255, 8, 8)...), true},
		{"oversized length", append([]byte(magic), frame(1, maxPayload+1, 100)...), true},
		{"huge length", append([]byte(magic), frame(1, 1<<31, 0)...), true},
		{"valid then bad", append(append([]byte(magic), frame(1, 8, 8)...), frame(77, 1, 1)...), true},
		{"truncated frame", append([]byte(magic), frame(1, 1000, 10)...), false},
	}
	for _, c := range cases {
		before := i.rxErrors.Load()
		conn, err := net.DialTCP("tcp4", nil, addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(c.data)
		if !c.bad {
			conn.CloseWrite() // EOF in the middle of a frame
		}
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s: connection not closed by the iface (%v)", c.name, err)
		}
		conn.Close()
		if c.bad && i.rxErrors.Load() == before {
			t.Errorf("%s: not counted as bad input", c.name)
		}
	}
	if got.Load() != 1 {
		t.Errorf("handler ran %d times, want 1 (the valid frame only)", got.Load())
	}
	// The iface still serves well-behaved peers.
	w2 := openLo(t, uct.IfaceParams{})
	e, err := w2.CreateEP(uct.EPParams{DevAddr: i.DeviceAddress(), IfaceAddr: i.IfaceAddress()})
	if err != nil {
		t.Fatal(err)
	}
	for e.AMShort(1, 0, nil) != nil {
		time.Sleep(time.Millisecond)
	}
	deadline := time.Now().Add(5 * time.Second)
	for got.Load() != 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got.Load() != 2 {
		t.Errorf("message from a good peer after bad ones: handler ran %d times, want 2", got.Load())
	}
}

// TestPeerGone: an EP whose peer is gone (refused, or closed later) fails
// with ErrHandler called on the worker and later sends returning an error.
func TestPeerGone(t *testing.T) {
	errs := make(chan error, 4)
	i := openLo(t, uct.IfaceParams{ErrHandler: func(ep uct.EP, err error) { errs <- err }})
	// A port nobody listens on.
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := binary.BigEndian.AppendUint16(nil, uint16(l.Addr().(*net.TCPAddr).Port))
	l.Close()
	e, err := i.CreateEP(uct.EPParams{DevAddr: net.IPv4(127, 0, 0, 1).To4(), IfaceAddr: port})
	if err != nil {
		t.Fatal(err)
	}
	e.AMShort(1, 0, nil)
	select {
	case err := <-errs:
		if !errors.Is(err, uct.ErrUnreachable) {
			t.Errorf("refused connection: ErrHandler got %v, want ErrUnreachable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("refused connection: ErrHandler not called")
	}
	if err := e.AMShort(1, 0, nil); err == nil || errors.Is(err, uct.ErrNoResource) {
		t.Errorf("send after connect failure: %v", err)
	}
	e.Close()

	// A peer that closes while we stream to it.
	peer := openLo(t, uct.IfaceParams{})
	e, err = i.CreateEP(uct.EPParams{DevAddr: peer.DeviceAddress(), IfaceAddr: peer.IfaceAddress()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var got atomic.Int64
	peer.SetAMHandler(1, func([]byte) { got.Add(1) })
	for got.Load() == 0 {
		e.AMShort(1, 0, nil)
		time.Sleep(time.Millisecond)
	}
	peer.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := e.AMBcopy(1, func(b []byte) int { return len(b) })
		if err != nil && !errors.Is(err, uct.ErrNoResource) {
			if !errors.Is(err, uct.ErrEndpointReset) {
				t.Errorf("send to a closed peer: %v, want ErrEndpointReset", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sends to a closed peer keep succeeding")
		}
		time.Sleep(100 * time.Microsecond)
	}
	select {
	case err := <-errs:
		if !errors.Is(err, uct.ErrEndpointReset) {
			t.Errorf("closed peer: ErrHandler got %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("closed peer: ErrHandler not called")
	}
}

// TestIdlePeerGone: an idle EP learns that its peer closed (no send
// needed), reports it, and the worker parks instead of polling a dead socket.
func TestIdlePeerGone(t *testing.T) {
	errs := make(chan error, 4)
	i := openLo(t, uct.IfaceParams{ErrHandler: func(ep uct.EP, err error) { errs <- err }})
	peer := openLo(t, uct.IfaceParams{})
	var got atomic.Int64
	peer.SetAMHandler(1, func([]byte) { got.Add(1) })
	e, err := i.CreateEP(uct.EPParams{DevAddr: peer.DeviceAddress(), IfaceAddr: peer.IfaceAddress()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	e.AMShort(1, 0, nil)
	for got.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	peer.Close()
	select {
	case err := <-errs:
		if !errors.Is(err, uct.ErrEndpointReset) {
			t.Errorf("ErrHandler got %v, want ErrEndpointReset", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("idle EP: peer close not reported")
	}
	if err := e.AMShort(1, 0, nil); !errors.Is(err, uct.ErrEndpointReset) {
		t.Errorf("send after the peer closed: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		wk := i.w.Wakeups.Load()
		if i.w.Sleeps.Load() > wk {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("worker does not park after the peer closed")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestNotSupported(t *testing.T) {
	i := openLo(t, uct.IfaceParams{})
	peer := openLo(t, uct.IfaceParams{})
	e, err := i.CreateEP(uct.EPParams{DevAddr: peer.DeviceAddress(), IfaceAddr: peer.IfaceAddress()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for name, err := range map[string]error{
		"put_zcopy": e.PutZcopy(nil, 0, nil, nil),
		"get_zcopy": e.GetZcopy(nil, 0, nil, nil),
	} {
		if !errors.Is(err, uct.ErrNotSupported) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := i.CreateEP(uct.EPParams{}); !errors.Is(err, uct.ErrNotSupported) {
		t.Errorf("CreateEP without address: %v", err)
	}
	if _, err := e.Address(); !errors.Is(err, uct.ErrNotSupported) {
		t.Errorf("Address: %v", err)
	}
	if _, err := i.CreateEP(uct.EPParams{DevAddr: []byte{8, 8, 8, 8}, IfaceAddr: []byte{0, 80}}); !errors.Is(err, uct.ErrUnreachable) {
		t.Errorf("CreateEP to a non-loopback address from lo: %v", err)
	}
}

// TestNoAllocs: the AM data path (send, receive, handler) does not allocate
// per message once warm.
func TestNoAllocs(t *testing.T) {
	a := openLo(t, uct.IfaceParams{})
	b := openLo(t, uct.IfaceParams{})
	var got atomic.Int64
	b.SetAMHandler(1, func([]byte) { got.Add(1) })
	e, err := a.CreateEP(uct.EPParams{DevAddr: b.DeviceAddress(), IfaceAddr: b.IfaceAddress()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	payload := make([]byte, 256)
	pack := func(buf []byte) int { return copy(buf, payload) }
	sent := int64(0)
	send := func() {
		for e.AMShort(1, 7, payload) != nil {
			runtime.Gosched()
		}
		for {
			if _, err := e.AMBcopy(1, pack); err == nil {
				break
			}
			runtime.Gosched()
		}
		sent += 2
		for got.Load() < sent {
			runtime.Gosched()
		}
	}
	for range 100 {
		send()
	}
	n := testing.AllocsPerRun(500, send)
	t.Logf("%.3f allocations per round", n)
	if n > 0.5 {
		t.Errorf("%.2f allocations per AMShort+AMBcopy round (send, receive, handler)", n)
	}
}

// FuzzFrames: the frame decoder never panics, never reads past its input,
// and re-encoding what it decoded gives the input back.
func FuzzFrames(f *testing.F) {
	frame := func(id uint8, payload []byte) []byte {
		b := []byte{id, 0, 0, 0, 0}
		binary.LittleEndian.PutUint32(b[1:], uint32(len(payload)))
		return append(b, payload...)
	}
	f.Add([]byte{})
	f.Add(frame(1, []byte("hello")))
	f.Add(append(frame(0, nil), frame(31, make([]byte, 100))...))
	f.Add(frame(32, nil))
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff})
	f.Add(frame(1, make([]byte, 70000))[:100])
	f.Fuzz(func(t *testing.T, b []byte) {
		var out []byte
		rest := b
		for {
			id, payload, n, err := nextFrame(rest)
			if err != nil {
				if !errors.Is(err, uct.ErrInvalidParam) && !errors.Is(err, uct.ErrMessageSize) {
					t.Fatalf("error %v", err)
				}
				return
			}
			if n == 0 {
				break
			}
			if id >= uct.MaxAMID || len(payload) > maxPayload || n != frameHdr+len(payload) || n > len(rest) {
				t.Fatalf("frame id %d, %d bytes, n %d of %d", id, len(payload), n, len(rest))
			}
			out = append(out, frame(id, payload)...)
			rest = rest[n:]
		}
		out = append(out, rest...)
		if string(out) != string(b) {
			t.Fatalf("re-encoding differs")
		}
	})
}
