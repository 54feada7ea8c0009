package rdmanet_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/nettest"

	"github.com/gouct/gouct/internal/wire"
	"github.com/gouct/gouct/listener"
	"github.com/gouct/gouct/rdmanet"
)

func TestMain(m *testing.M) {
	if childMain() {
		return
	}
	goleak.VerifyTestMain(m, leakOpts...)
}

// leakOpts ignore the process-wide runtime, which lives as long as the process.
var leakOpts = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/gouct/gouct/uct.(*Worker).run"),
	goleak.IgnoreAnyFunction("github.com/gouct/gouct/uct.(*Worker).run"),
	goleak.IgnoreAnyFunction("github.com/gouct/gouct/uct/shm.(*iface).doorbell"),
	goleak.IgnoreAnyFunction("github.com/gouct/gouct/uct/ib.(*iface).events"),
	// net/http lingers 500 ms after a CloseWrite before closing a conn.
	goleak.IgnoreAnyFunction("net/http.(*conn).closeWriteAndWait"),
}

func cfg(tls ...string) *rdmanet.Config {
	if len(tls) == 0 {
		return nil
	}
	return &rdmanet.Config{TLS: tls}
}

func listen(t testing.TB, c *rdmanet.Config) net.Listener {
	t.Helper()
	lc := rdmanet.ListenConfig{Config: c}
	l, err := lc.Listen(context.Background(), "rdma", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// pipe dials l with c and returns (client, server).
func pipe(l net.Listener, c *rdmanet.Config) (net.Conn, net.Conn, error) {
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := l.Accept()
		ch <- res{s, err}
	}()
	d := rdmanet.Dialer{Config: c, Timeout: 10 * time.Second}
	cl, err := d.DialContext(context.Background(), "rdma", l.Addr().String())
	if err != nil {
		l.Close()
		<-ch
		return nil, nil, err
	}
	r := <-ch
	if r.err != nil {
		cl.Close()
		return nil, nil, r.err
	}
	return cl, r.c, nil
}

func transportOf(t testing.TB, c net.Conn) string {
	t.Helper()
	rc, ok := c.(rdmanet.Conn)
	if !ok {
		t.Fatalf("%T does not implement rdmanet.Conn", c)
	}
	return rc.Transport()
}

func TestConn(t *testing.T) {
	for _, tc := range []struct {
		name string
		tls  []string
		want string
	}{
		{"self", []string{"self"}, "self"},
		{"shm", []string{"shm"}, "shm"}, // forced: shm inside one process
		{"tcp", []string{"tcp"}, "tcp"},
		{"default", nil, "self"},            // one process: self beats every other transport
		{"env", []string{"env:tcp"}, "tcp"}, // RDMANET_TLS=tcp, nil Config
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.tls) == 1 && strings.HasPrefix(tc.tls[0], "env:") {
				// RDMANET_TLS read from the environment (nil Config).
				t.Setenv("RDMANET_TLS", strings.TrimPrefix(tc.tls[0], "env:"))
				tc.tls = nil
			}
			if tc.name == "default" && envTLS() != "" {
				t.Skipf("RDMANET_TLS=%s overrides the default", envTLS())
			}
			c := cfg(tc.tls...)
			nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
				l := listen(t, c)
				c1, c2, err := pipe(l, c)
				if err != nil {
					return nil, nil, nil, err
				}
				if got1, got2 := transportOf(t, c1), transportOf(t, c2); got1 != tc.want || got2 != tc.want {
					t.Errorf("transport = %q/%q, want %q", got1, got2, tc.want)
				}
				return c1, c2, func() { c1.Close(); c2.Close(); l.Close() }, nil
			})
		})
	}
}

func TestFallbackStats(t *testing.T) {
	// Client allows self and tcp, server only tcp: raw TCP, both sides know why.
	l := listen(t, cfg("tcp"))
	defer l.Close()
	c1, c2, err := pipe(l, cfg("self", "tcp"))
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	defer c2.Close()
	for _, c := range []net.Conn{c1, c2} {
		st := c.(rdmanet.Conn).Stats()
		if st.Transport != "tcp" || st.Fallback == "" {
			t.Errorf("stats %+v: want tcp with a fallback reason", st)
		}
		if _, ok := c.(interface{ SetNoDelay(bool) error }); !ok {
			t.Errorf("fallback conn %T does not expose *net.TCPConn", c)
		}
	}
	if _, err := c1.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 5)
	if _, err := io.ReadFull(c2, b); err != nil || string(b) != "hello" {
		t.Fatalf("read %q, %v", b, err)
	}
	if st := c2.(rdmanet.Conn).Stats(); st.BytesRead != 5 {
		t.Errorf("BytesRead = %d, want 5", st.BytesRead)
	}
}

func TestForcedListNothingCommon(t *testing.T) {
	for _, tc := range []struct {
		name           string
		server, client []string
		wantIn         []string
	}{
		{"server tcp only", []string{"tcp"}, []string{"self"}, []string{`"self"`, "peer offers tcp"}},
		{"transport absent here", nil, []string{"rc_verbs"}, []string{`"rc_verbs"`, "this side offers nothing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := listen(t, cfg(tc.server...))
			defer l.Close()
			go func() {
				if c, err := l.Accept(); err == nil {
					t.Errorf("server accepted a refused conn (%s)", transportOf(t, c))
					c.Close()
				}
			}()
			d := rdmanet.Dialer{Config: cfg(tc.client...)}
			c, err := d.Dial("rdma", l.Addr().String())
			if err == nil {
				c.Close()
				t.Fatalf("dial succeeded on %s; want an error", transportOf(t, c))
			}
			if !errors.Is(err, rdmanet.ErrNoTransport) {
				t.Fatalf("err = %v, want ErrNoTransport", err)
			}
			for _, s := range tc.wantIn {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %s", err, s)
				}
			}
		})
	}
}

func TestUnknownNetwork(t *testing.T) {
	if _, err := rdmanet.Listen("tcp", "127.0.0.1:0"); !errors.Is(err, rdmanet.ErrUnknownNetwork) {
		t.Errorf("Listen tcp: %v", err)
	}
	if _, err := rdmanet.Dial("rdma7", "127.0.0.1:1"); !errors.Is(err, rdmanet.ErrUnknownNetwork) {
		t.Errorf("Dial rdma7: %v", err)
	}
}

func TestAddr(t *testing.T) {
	l := listen(t, cfg("self"))
	defer l.Close()
	if l.Addr().Network() != "rdma" {
		t.Errorf("listener network %q", l.Addr().Network())
	}
	c1, c2, err := pipe(l, cfg("self"))
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	defer c2.Close()
	if c1.RemoteAddr().String() != l.Addr().String() || c1.RemoteAddr().Network() != "rdma" {
		t.Errorf("client remote %v (%s), listener %v", c1.RemoteAddr(), c1.RemoteAddr().Network(), l.Addr())
	}
	if c2.RemoteAddr().String() != c1.LocalAddr().String() {
		t.Errorf("server remote %v, client local %v", c2.RemoteAddr(), c1.LocalAddr())
	}
}

// TestBadHellos runs hostile clients against a live listener: each gets a
// clear refusal or a closed socket, and a good client connects meanwhile.
func TestBadHellos(t *testing.T) {
	c := &rdmanet.Config{TLS: []string{"self", "tcp"}, HandshakeTimeout: 2 * time.Second}
	l := listen(t, c)
	defer l.Close()
	addr := l.Addr().String()

	good, _ := wire.AppendHello(nil, &wire.Hello{Flags: wire.FlagTCPAllowed})
	wrongVersion := append([]byte(nil), good...)
	wrongVersion[4] = 9
	huge := append([]byte(nil), good...)
	binary.BigEndian.PutUint16(huge[6:], 0xffff)
	bad := map[string][]byte{
		"garbage":   []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		"truncated": good[:len(good)-2],
		"huge":      huge,
		"version":   wrongVersion,
		"slowloris": good,
	}
	var wg sync.WaitGroup
	results := make(chan string, len(bad))
	for name, msg := range bad {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			start := time.Now()
			if name == "slowloris" {
				for i := 0; i < len(msg); i++ {
					if _, err := c.Write(msg[i : i+1]); err != nil {
						break // the server gave up on us: good
					}
					time.Sleep(150 * time.Millisecond)
				}
			} else {
				c.Write(msg)
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			b, err := io.ReadAll(c)
			if name == "version" {
				r, derr := wire.DecodeReply(b)
				if derr != nil || r.Status != wire.StatusRefused || r.Reason != wire.ReasonVersion {
					t.Errorf("version: reply %+v, %v (raw %q)", r, derr, b)
				}
			} else if len(b) != 0 || (err != nil && !errors.Is(err, syscall.ECONNRESET)) {
				t.Errorf("%s: server answered %q, %v; want the socket closed", name, b, err)
			}
			results <- name + " closed after " + time.Since(start).Round(10*time.Millisecond).String()
		}()
	}
	// A good client connects while the hostile ones hold their slots.
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	c1, c2, err := pipe(l, c)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("good client took %v", d)
	}
	if transportOf(t, c1) != "self" {
		t.Errorf("good client on %s", transportOf(t, c1))
	}
	c1.Close()
	c2.Close()
	wg.Wait()
	close(results)
	for r := range results {
		t.Log(r)
	}
	if n := l.(*listener.Listener).Failed.Load(); n != uint64(len(bad)) {
		t.Errorf("Failed = %d, want %d", n, len(bad))
	}
}

// TestDialCancel: a server that never answers; DialContext returns when ctx is cancelled.
func TestDialCancel(t *testing.T) {
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	}()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	_, err = rdmanet.DialContext(ctx, "rdma", tl.Addr().String())
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("cancel took %v", d)
	}
	d := rdmanet.Dialer{Timeout: 300 * time.Millisecond}
	if _, err = d.Dial("rdma", tl.Addr().String()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Timeout: err = %v, want DeadlineExceeded", err)
	}
}

// TestCloseAbortsHandshakes: Close returns at once with a handshake in
// flight, whose socket gets closed, and Accept reports net.ErrClosed.
func TestCloseAbortsHandshakes(t *testing.T) {
	l := listen(t, cfg("self"))
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("rdm")) // a partial header: the handshake waits
	time.Sleep(100 * time.Millisecond)
	acc := make(chan error, 1)
	go func() { _, err := l.Accept(); acc <- err }()
	start := time.Now()
	l.Close()
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v", d)
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("handshake socket still open after Close: %d, %v", n, err)
	}
	if err := <-acc; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v", err)
	}
}

// TestMaxHandshakes: with one slot held by a silent client, the next client
// waits in the kernel's queue and connects when the slot frees.
func TestMaxHandshakes(t *testing.T) {
	c := &rdmanet.Config{TLS: []string{"self"}, MaxHandshakes: 1, HandshakeTimeout: 500 * time.Millisecond}
	l := listen(t, c)
	defer l.Close()
	silent, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	c1, c2, err := pipe(l, c)
	if err != nil {
		t.Fatal(err)
	}
	c1.Close()
	c2.Close()
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("second client connected after %v, before the silent one's deadline", d)
	}
}
