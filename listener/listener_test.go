package listener_test

import (
	"context"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gouct/gouct/internal/rt"
	"github.com/gouct/gouct/internal/wire"
	"github.com/gouct/gouct/listener"
	"github.com/gouct/gouct/uct"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/gouct/gouct/uct.(*Worker).run"),
		goleak.IgnoreAnyFunction("github.com/gouct/gouct/uct/shm.(*iface).doorbell"),
		goleak.IgnoreAnyFunction("github.com/gouct/gouct/uct/ib.(*iface).events"))
}

// exchange sends h to a fresh listener configured with tls and returns the
// reply and, for a fallback, the conn Accept produced.
func exchange(t *testing.T, tls []string, h *wire.Hello) (wire.Reply, rt.Conn) {
	t.Helper()
	l, err := listener.Listen(context.Background(), "rdma", "127.0.0.1:0", &uct.Config{TLS: tls, HandshakeTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	out, err := wire.AppendHello(nil, h)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	f, err := wire.ReadFrame(c, wire.TypeReply, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := wire.DecodeReply(f)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != wire.StatusFallback {
		return r, nil
	}
	ac, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	return r, ac.(rt.Conn)
}

// localCand is the runtime's own candidate for transport tl.
func localCand(t *testing.T, tl string) wire.Candidate {
	t.Helper()
	cfg, err := rt.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range rt.Get(cfg).Transports {
		if x.TI.Resource.TL == tl {
			a := x.TI.Address()
			return wire.Candidate{TL: a.TL, Device: a.Device, DevAddr: a.DevAddr, IfaceAddr: a.IfaceAddr,
				Cap: uint64(x.TI.Attr.Cap), ConnID: 12345}
		}
	}
	t.Fatalf("no %s transport in this process", tl)
	return wire.Candidate{}
}

func TestReasons(t *testing.T) {
	same := rt.LocalHost()
	other := same
	other.BootID[0] ^= 0xff
	otherUser := same
	otherUser.UID++
	all := []string{"all"} // not the environment's RDMANET_TLS
	bogus := localCand(t, "self")
	bogus.IfaceAddr = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}
	for _, tc := range []struct {
		name   string
		server []string
		hello  wire.Hello
		status wire.Status
		reason wire.Reason
	}{
		{"other host", all, wire.Hello{Host: other, Flags: wire.FlagTCPAllowed, Cands: []wire.Candidate{localCand(t, "shm")}},
			wire.StatusFallback, wire.ReasonOtherHost},
		{"other user", all, wire.Hello{Host: otherUser, Flags: wire.FlagTCPAllowed, Cands: []wire.Candidate{localCand(t, "shm"), localCand(t, "self")}},
			wire.StatusFallback, wire.ReasonOtherHost},
		{"other host, no tcp", all, wire.Hello{Host: other, Cands: []wire.Candidate{localCand(t, "shm")}},
			wire.StatusRefused, wire.ReasonOtherHost},
		{"unknown transport", all, wire.Hello{Host: same, Flags: wire.FlagTCPAllowed, Cands: []wire.Candidate{{TL: "quantum", Device: "q0"}}},
			wire.StatusFallback, wire.ReasonNoCommon},
		{"client offers nothing", all, wire.Hello{Host: same, Flags: wire.FlagTCPAllowed | wire.FlagForced, Asked: "tcp"},
			wire.StatusFallback, wire.ReasonDisabled},
		{"server disabled", []string{"tcp"}, wire.Hello{Host: same, Flags: wire.FlagTCPAllowed, Cands: []wire.Candidate{localCand(t, "self")}},
			wire.StatusFallback, wire.ReasonDisabled},
		{"server forbids tcp", []string{"self"}, wire.Hello{Host: same, Flags: wire.FlagTCPAllowed, Cands: []wire.Candidate{bogus}},
			wire.StatusRefused, wire.ReasonUnreachable},
		{"unreachable", all, wire.Hello{Host: same, Flags: wire.FlagTCPAllowed, Cands: []wire.Candidate{bogus}},
			wire.StatusFallback, wire.ReasonUnreachable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, c := exchange(t, tc.server, &tc.hello)
			if r.Status != tc.status || r.Reason != tc.reason {
				t.Fatalf("reply %v/%v (%s), want %v/%v", r.Status, r.Reason, r.Detail, tc.status, tc.reason)
			}
			if r.Offered == "" {
				t.Errorf("reply does not say what the server offers")
			}
			if c != nil {
				if st := c.Stats(); c.Transport() != "tcp" || st.Fallback != tc.reason.String() {
					t.Errorf("accepted %s conn with fallback %q, want tcp with %q", c.Transport(), st.Fallback, tc.reason)
				}
			}
		})
	}
}

func TestResolve(t *testing.T) {
	t.Setenv("RDMANET_RX_WINDOW", "1M")
	c, err := rt.Resolve(&uct.Config{TLS: []string{"self"}})
	if err != nil {
		t.Fatal(err)
	}
	if c.RxWindow != 1<<20 || c.HandshakeTimeout != 10*time.Second || len(c.TLS) != 1 {
		t.Errorf("resolved %+v", c)
	}
	for n, want := range map[string]string{"rdma": "tcp", "rdma4": "tcp4", "rdma6": "tcp6", "tcp": ""} {
		got, err := rt.TCPNetwork(n)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("TCPNetwork(%q) = %q, %v", n, got, err)
		}
	}
}
