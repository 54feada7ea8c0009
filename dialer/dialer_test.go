package dialer_test

import (
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gouct/gouct/dialer"
	"github.com/gouct/gouct/internal/rt"
	"github.com/gouct/gouct/internal/wire"
	"github.com/gouct/gouct/uct"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/gouct/gouct/uct.(*Worker).run"),
		goleak.IgnoreAnyFunction("github.com/gouct/gouct/uct/shm.(*iface).doorbell"),
		goleak.IgnoreAnyFunction("github.com/gouct/gouct/uct/ib.(*iface).events"))
}

// fakeServer accepts one conn and runs script on it.
func fakeServer(t *testing.T, script func(c net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		script(c)
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return l.Addr().String()
}

func readHello(t *testing.T, c net.Conn) wire.Hello {
	f, err := wire.ReadFrame(c, wire.TypeHello, nil)
	if err != nil {
		t.Error(err)
		return wire.Hello{}
	}
	h, err := wire.DecodeHello(f)
	if err != nil {
		t.Error(err)
	}
	return h
}

func send(t *testing.T, c net.Conn, b []byte, err error) {
	if err != nil {
		t.Error(err)
		return
	}
	if _, err := c.Write(b); err != nil {
		t.Error(err)
	}
}

// TestClientConnectError: the server picks a candidate and sends an address
// the client cannot connect to. With tcp allowed, both sides agree on the
// fallback through Ready; without, Dial fails and says why.
func TestClientConnectError(t *testing.T) {
	for _, tcpOK := range []bool{true, false} {
		tls := []string{"self"}
		if tcpOK {
			tls = append(tls, "tcp")
		}
		var got wire.Ready
		addr := fakeServer(t, func(c net.Conn) {
			h := readHello(t, c)
			if len(h.Cands) == 0 || h.Cands[0].TL != "self" {
				t.Errorf("candidates %+v, want self", h.Cands)
				return
			}
			b, err := wire.AppendReply(nil, &wire.Reply{Status: wire.StatusOK, Choice: 0, ConnID: 1,
				DevAddr: []byte("not-this-process"), IfaceAddr: []byte{1, 2, 3, 4, 5, 6, 7, 8}})
			send(t, c, b, err)
			f, err := wire.ReadFrame(c, wire.TypeReady, nil)
			if err != nil {
				t.Error(err)
				return
			}
			if got, err = wire.DecodeReady(f); err != nil {
				t.Error(err)
				return
			}
			b, err = wire.AppendReady(nil, &wire.Ready{Status: got.Status, Reason: got.Reason})
			send(t, c, b, err)
			if got.Status == wire.StatusFallback {
				io.Copy(c, c) // the raw TCP conn: echo
			}
		})
		d := dialer.Dialer{Config: &uct.Config{TLS: tls}, Timeout: 5 * time.Second}
		conn, err := d.Dial("rdma", addr)
		if !tcpOK {
			if err == nil {
				conn.Close()
				t.Fatal("dial succeeded without a way to connect")
			}
			if !errors.Is(err, rt.ErrHandshake) || !strings.Contains(err.Error(), "connect") {
				t.Errorf("err = %v, want a handshake error naming the connect failure", err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		rc := conn.(rt.Conn)
		if rc.Transport() != "tcp" || !strings.Contains(rc.Stats().Fallback, "connect error") {
			t.Errorf("conn on %s, fallback %q", rc.Transport(), rc.Stats().Fallback)
		}
		conn.Write([]byte("ping"))
		b := make([]byte, 4)
		if _, err := io.ReadFull(conn, b); err != nil || string(b) != "ping" {
			t.Errorf("echo %q, %v", b, err)
		}
		conn.Close()
	}
}

// TestBadServers: peers that are not rdmanet listeners, or misbehave, give
// clear errors, never a panic or a hang.
func TestBadServers(t *testing.T) {
	okReply, _ := wire.AppendReply(nil, &wire.Reply{Status: wire.StatusOK, Choice: 9})
	fallback, _ := wire.AppendReply(nil, &wire.Reply{Status: wire.StatusFallback, Reason: wire.ReasonNoCommon})
	v2 := append([]byte(nil), okReply...)
	v2[4] = 2
	for _, tc := range []struct {
		name  string
		reply []byte
		tls   []string
		want  string
	}{
		{"http server", []byte("HTTP/1.1 400 Bad Request\r\n\r\n"), nil, "bad magic"},
		{"silent close", nil, nil, "truncated"},
		{"newer version", v2, nil, "version 2"},
		{"choice out of range", okReply, nil, "candidate 9"},
		{"fallback we forbid", fallback, []string{"self"}, "does not allow"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := fakeServer(t, func(c net.Conn) {
				readHello(t, c)
				c.Write(tc.reply)
			})
			var cfg *uct.Config
			if tc.tls != nil {
				cfg = &uct.Config{TLS: tc.tls}
			}
			d := dialer.Dialer{Config: cfg, Timeout: 5 * time.Second}
			conn, err := d.Dial("rdma", addr)
			if err == nil {
				conn.Close()
				t.Fatal("dial succeeded")
			}
			var oe *net.OpError
			if !errors.As(err, &oe) || oe.Op != "dial" || !errors.Is(err, rt.ErrHandshake) {
				t.Errorf("err = %#v, want a *net.OpError dial wrapping ErrHandshake", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}
