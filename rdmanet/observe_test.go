package rdmanet_test

import (
	"bytes"
	"encoding/json"
	"expvar"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gouct/gouct/rdmanet"
)

// syncBuffer is a bytes.Buffer safe for the listener's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCounters: conns by transport, bytes, fallbacks, handshake failures
// and resets move as conns come and go, and the expvar map shows them.
func TestCounters(t *testing.T) {
	warmRuntime(t)
	before := rdmanet.ReadCounters()
	l := listen(t, cfg("self"))
	defer l.Close()
	c1, c2, err := pipe(l, cfg("self"))
	if err != nil {
		t.Fatal(err)
	}
	now := rdmanet.ReadCounters()
	if d := now.ConnsOpen["self"] - before.ConnsOpen["self"]; d != 2 {
		t.Errorf("conns_open[self] +%d with a pair open, want +2", d)
	}
	if d := now.ConnsTotal["self"] - before.ConnsTotal["self"]; d != 2 {
		t.Errorf("conns_total[self] +%d, want +2", d)
	}
	go c1.Write(make([]byte, 1000))
	if _, err := io.ReadFull(c2, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	c1.Close()
	c2.Close()
	after := rdmanet.ReadCounters()
	if after.ConnsOpen["self"] != before.ConnsOpen["self"] {
		t.Errorf("conns_open[self] %d after close, was %d", after.ConnsOpen["self"], before.ConnsOpen["self"])
	}
	if d := after.BytesWritten - before.BytesWritten; d != 1000 {
		t.Errorf("bytes_written +%d, want +1000", d)
	}
	if d := after.BytesRead - before.BytesRead; d != 1000 {
		t.Errorf("bytes_read +%d, want +1000", d)
	}

	// A fallback (the server allows tcp only), counted on both ends.
	lt := listen(t, cfg("tcp"))
	defer lt.Close()
	f1, f2, err := pipe(lt, cfg("self", "tcp"))
	if err != nil {
		t.Fatal(err)
	}
	reason := f2.(rdmanet.Conn).Stats().Fallback
	now = rdmanet.ReadCounters()
	if d := now.Fallbacks[reason] - after.Fallbacks[reason]; d != 2 {
		t.Errorf("fallbacks[%q] +%d, want +2 (%v)", reason, d, now.Fallbacks)
	}
	if d := now.ConnsOpen["tcp"] - after.ConnsOpen["tcp"]; d != 2 {
		t.Errorf("conns_open[tcp] +%d, want +2", d)
	}
	f1.Close()
	f2.Close()
	if o := rdmanet.ReadCounters().ConnsOpen["tcp"]; o != after.ConnsOpen["tcp"] {
		t.Errorf("conns_open[tcp] %d after close, want %d", o, after.ConnsOpen["tcp"])
	}

	// Handshake failures: garbage at a listener, a refused dial.
	g, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	g.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	io.Copy(io.Discard, g)
	g.Close()
	if _, err := (&rdmanet.Dialer{Config: cfg("shm")}).Dial("rdma", lt.Addr().String()); err == nil {
		t.Fatal("dial with nothing in common succeeded")
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		now = rdmanet.ReadCounters()
		if now.HandshakeFailures["accept"] > after.HandshakeFailures["accept"] || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if now.HandshakeFailures["accept"] <= after.HandshakeFailures["accept"] || now.HandshakeFailures["dial"] <= after.HandshakeFailures["dial"] {
		t.Errorf("handshake_failures %v, was %v", now.HandshakeFailures, after.HandshakeFailures)
	}

	// A reset: a peer forging a rendezvous request gets its conn reset.
	ls := listen(t, cfg("shm"))
	defer ls.Close()
	p, sc := rawDial(t, ls, "shm")
	p.rts(t, 4096, 1<<20, []byte{1, 2, 3, 4})
	if _, err := sc.Read(make([]byte, 10)); err == nil {
		t.Error("read after a forged request succeeded")
	}
	sc.Close()
	p.close()
	if d := rdmanet.ReadCounters().Resets - now.Resets; d != 1 {
		t.Errorf("resets +%d after one reset conn, want +1", d)
	}

	// The expvar map.
	v := expvar.Get("rdmanet")
	if v == nil {
		t.Fatal(`no expvar "rdmanet"`)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(v.String()), &m); err != nil {
		t.Fatalf("expvar rdmanet: %v: %s", err, v)
	}
	for _, k := range []string{"conns_open", "conns_total", "fallbacks", "handshake_failures", "resets", "bytes_read", "bytes_written"} {
		if _, ok := m[k]; !ok {
			t.Errorf("expvar rdmanet has no %q: %s", k, v)
		}
	}
}

// TestLogLevel: RDMANET_LOG_LEVEL=info logs fallbacks; error hides
// handshake failures, which warn (the default) shows.
func TestLogLevel(t *testing.T) {
	var buf syncBuffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer slog.SetDefault(old)
	for _, tc := range []struct {
		level     string
		fallback  bool // "tcp fallback" logged
		handshake bool // "handshake failed" logged
	}{
		{"info", true, true},
		{"", false, true},
		{"error", false, false},
	} {
		t.Run("level="+tc.level, func(t *testing.T) {
			t.Setenv("RDMANET_LOG_LEVEL", tc.level)
			before := len(buf.String())
			l := listen(t, &rdmanet.Config{TLS: []string{"tcp"}})
			defer l.Close()
			c1, c2, err := pipe(l, cfg("self", "tcp"))
			if err != nil {
				t.Fatal(err)
			}
			c1.Close()
			c2.Close()
			g, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			g.Write([]byte("garbage!"))
			io.Copy(io.Discard, g)
			g.Close()
			// The listener logs just after closing the socket.
			for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
				if tc.handshake == strings.Contains(buf.String()[before:], "handshake failed") && tc.handshake {
					break
				}
			}
			out := buf.String()[before:]
			if got := strings.Contains(out, "tcp fallback"); got != tc.fallback {
				t.Errorf("fallback logged = %v, want %v:\n%s", got, tc.fallback, out)
			}
			if got := strings.Contains(out, "handshake failed"); got != tc.handshake {
				t.Errorf("handshake failure logged = %v, want %v:\n%s", got, tc.handshake, out)
			}
		})
	}
}
