package rdmanet_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gouct/gouct/internal/rt"
	"github.com/gouct/gouct/internal/wire"
	"github.com/gouct/gouct/listener"
	"github.com/gouct/gouct/rdmanet"
)

// childRoles are the extra peer roles of fault tests (see childMain).
var childRoles = map[string]func(){"fault": faultChild}

// faultChild is a peer that reaches one stage (TEST_MODE), prints "ready"
// and waits to be killed:
//
//	hello       raw client: Hello with this process's real candidates, reads the Reply, never sends Ready
//	idle        a conn that does nothing
//	sink        a conn that never reads
//	pull-stall  a conn that reads 1 byte, then never again
//	write-big   a conn that writes 256 MiB in one Write
//	server      raw server: accepts, reads the Hello, never answers ("ready <addr>" first)
func faultChild() {
	die := func(err error) {
		fmt.Fprintln(os.Stderr, "fault child:", err)
		os.Exit(1)
	}
	addr := os.Getenv("TEST_ADDR")
	switch mode := os.Getenv("TEST_MODE"); mode {
	case "hello":
		c, err := net.Dial("tcp", addr)
		if err != nil {
			die(err)
		}
		cfg, _ := rt.Resolve(nil)
		h := wire.Hello{Host: rt.LocalHost(), PID: uint32(os.Getpid()), Flags: wire.FlagTCPAllowed}
		for _, x := range rt.Get(cfg).Transports {
			a := x.TI.Address()
			h.Cands = append(h.Cands, wire.Candidate{TL: a.TL, Device: a.Device, DevAddr: a.DevAddr,
				IfaceAddr: a.IfaceAddr, Cap: uint64(x.TI.Attr.Cap), ConnID: 0xfff0})
		}
		out, err := wire.AppendHello(nil, &h)
		if err == nil {
			_, err = c.Write(out)
		}
		if err == nil {
			_, err = wire.ReadFrame(c, wire.TypeReply, make([]byte, 0, wire.MaxFrame))
		}
		if err != nil {
			die(err)
		}
	case "server":
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			die(err)
		}
		fmt.Println("addr", l.Addr())
		c, err := l.Accept()
		if err != nil {
			die(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 8)); err != nil {
			die(err)
		}
	default:
		c, err := rdmanet.Dial("rdma", addr)
		if err != nil {
			die(err)
		}
		switch mode {
		case "pull-stall":
			fmt.Println("ready")
			if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
				die(err)
			}
			time.Sleep(time.Hour)
		case "write-big":
			fmt.Println("ready")
			c.Write(make([]byte, 256<<20))
			time.Sleep(time.Hour)
		}
	}
	fmt.Println("ready")
	time.Sleep(time.Hour)
}

// startFault starts a fault child and waits for its "ready" line (the
// server mode prints "addr <addr>" first: returned).
func startFault(t *testing.T, mode, addr string) (*exec.Cmd, string, chan struct{}) {
	t.Helper()
	cmd := startChild(t, "fault", "TEST_MODE="+mode, "TEST_ADDR="+addr)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	lines := make(chan string, 2)
	go func() {
		r := bufio.NewReader(out)
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				close(lines)
				return
			}
			lines <- strings.TrimSpace(l)
		}
	}()
	var got string
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("%s child ended before ready", mode)
			}
			if strings.HasPrefix(l, "addr ") {
				got = strings.TrimPrefix(l, "addr ")
				if mode == "server" {
					return cmd, got, done // it reads the Hello of the dial to come
				}
				continue
			}
			if l == "ready" {
				return cmd, got, done
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s child not ready", mode)
		}
	}
}

// TestPeerKillStages: the peer process is SIGKILLed at each stage; the
// survivor's blocked call fails within 1 s (not as a clean EOF), everything
// is released, and the listener keeps serving.
func TestPeerKillStages(t *testing.T) {
	skipIfForced(t)
	l := listen(t, nil)
	defer l.Close()
	ln := l.(*listener.Listener)
	for _, mode := range []string{"hello", "idle", "sink", "pull-stall", "write-big"} {
		t.Run(mode, func(t *testing.T) {
			base := leakBaseline(t)
			cmd, _, done := startFault(t, mode, l.Addr().String())
			failed := make(chan error, 1)
			var conn net.Conn
			if mode == "hello" {
				before := ln.Failed.Load()
				go func() {
					for ln.Failed.Load() == before {
						time.Sleep(time.Millisecond)
					}
					failed <- errors.New("handshake failed")
				}()
			} else {
				c, err := l.Accept()
				if err != nil {
					t.Fatal(err)
				}
				conn = c
				defer c.Close()
				if got := transportOf(t, c); got != wantTwoProc {
					t.Fatalf("transport %s, want %s", got, wantTwoProc)
				}
				go func() {
					var err error
					switch mode {
					case "idle":
						_, err = c.Read(make([]byte, 1))
					case "sink":
						for err == nil {
							_, err = c.Write(make([]byte, 64<<10))
						}
					case "pull-stall":
						_, err = c.Write(make([]byte, 64<<20))
					case "write-big":
						buf := make([]byte, 1<<20)
						for err == nil {
							_, err = c.Read(buf)
						}
					}
					failed <- err
				}()
			}
			time.Sleep(200 * time.Millisecond)
			select {
			case err := <-failed:
				t.Fatalf("%s: failed before the kill: %v", mode, err)
			default:
			}
			if mode == "pull-stall" || mode == "write-big" {
				st := conn.(rdmanet.Conn).Stats()
				if mode == "pull-stall" && st.MsgRndv == 0 {
					t.Errorf("no rendezvous in flight: %+v", st)
				}
				if mode == "write-big" && st.BytesRead == 0 {
					t.Errorf("nothing read yet: %+v", st)
				}
			}
			killed := time.Now()
			cmd.Process.Signal(syscall.SIGKILL)
			select {
			case err := <-failed:
				d := time.Since(killed)
				t.Logf("%s: failed %v after SIGKILL: %v", mode, d.Round(time.Millisecond), err)
				if d > time.Second {
					t.Errorf("failed only %v after the kill", d)
				}
				if err == nil || err == io.EOF {
					t.Errorf("a killed peer ends the call with %v", err)
				}
			case <-time.After(3 * time.Second):
				t.Fatalf("%s: still blocked 3 s after SIGKILL", mode)
			}
			<-done
			if conn != nil {
				conn.Close()
			}
			// The listener still serves.
			c1, c2, err := pipe(l, nil)
			if err != nil {
				t.Fatalf("listener after the kill: %v", err)
			}
			go c1.Write([]byte("ok"))
			if b, err := io.ReadAll(io.LimitReader(c2, 2)); err != nil || string(b) != "ok" {
				t.Errorf("listener after the kill: %q, %v", b, err)
			}
			c1.Close()
			c2.Close()
			base.check(t)
		})
	}
	t.Run("dialer survives a dead server", func(t *testing.T) {
		base := leakBaseline(t)
		cmd, addr, done := startFault(t, "server", "")
		errc := make(chan error, 1)
		go func() {
			c, err := rdmanet.Dial("rdma", addr)
			if err == nil {
				c.Close()
			}
			errc <- err
		}()
		time.Sleep(200 * time.Millisecond)
		killed := time.Now()
		cmd.Process.Signal(syscall.SIGKILL)
		<-done
		select {
		case err := <-errc:
			d := time.Since(killed)
			t.Logf("Dial failed %v after SIGKILL: %v", d.Round(time.Millisecond), err)
			if err == nil || d > time.Second {
				t.Errorf("Dial: %v after %v", err, d)
			}
			if !errors.Is(err, rdmanet.ErrHandshake) {
				t.Errorf("Dial error %v does not wrap ErrHandshake", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("Dial still blocked 3 s after the server's SIGKILL")
		}
		base.check(t)
	})
}

// TestWriteRightAfterHandshake: a rendezvous-sized Write the moment Accept
// (or Dial) returns reaches a peer whose handshake may still be finishing;
// it must arrive intact (it used to reach a conn not yet started, whose
// puller had no endpoint: nil dereference).
func TestWriteRightAfterHandshake(t *testing.T) {
	msg := make([]byte, 1<<20)
	streamBytes(42).Read(msg)
	for _, tl := range []string{"self", "shm"} {
		for _, serverWrites := range []bool{true, false} {
			name := tl + "/client writes"
			if serverWrites {
				name = tl + "/server writes"
			}
			t.Run(name, func(t *testing.T) {
				c := cfg(tl)
				l := listen(t, c)
				defer l.Close()
				got := make(chan []byte, 1)
				go func() {
					for {
						s, err := l.Accept()
						if err != nil {
							return
						}
						go func() {
							defer s.Close()
							if serverWrites {
								s.Write(msg)
								return
							}
							b, _ := io.ReadAll(s)
							got <- b
						}()
					}
				}()
				d := &rdmanet.Dialer{Config: c, Timeout: 10 * time.Second}
				for i := range 30 {
					cl, err := d.Dial("rdma", l.Addr().String())
					if err != nil {
						t.Fatal(err)
					}
					var b []byte
					if serverWrites {
						b, err = io.ReadAll(cl)
					} else {
						_, err = cl.Write(msg)
						cl.Close()
						b = <-got
					}
					cl.Close()
					if err != nil || !bytes.Equal(b, msg) {
						t.Fatalf("round %d: got %d bytes (equal %v), %v", i, len(b), bytes.Equal(b, msg), err)
					}
				}
			})
		}
	}
}

// TestListenerCloseInFlight: Close with handshakes at every stage (waiting
// for the Hello, for the client's Ready with an endpoint made, completed
// but not accepted) returns at once, closes them all and releases
// everything.
func TestListenerCloseInFlight(t *testing.T) {
	base := leakBaseline(t)
	c := cfg("self")
	l := listen(t, c)
	addr := l.Addr().String()
	var socks []net.Conn
	defer func() {
		for _, s := range socks {
			s.Close()
		}
	}()
	// Waiting for the Hello.
	for range 2 {
		s, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		socks = append(socks, s)
	}
	// Reply received (the server made its conn and endpoint), no Ready.
	cfgr, _ := rt.Resolve(nil)
	var self *rt.Transport
	for _, x := range rt.Get(cfgr).Transports {
		if x.TI.Resource.TL == "self" {
			self = x
		}
	}
	for range 2 {
		s, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		socks = append(socks, s)
		a := self.TI.Address()
		out, _ := wire.AppendHello(nil, &wire.Hello{Host: rt.LocalHost(), Cands: []wire.Candidate{{TL: a.TL,
			Device: a.Device, DevAddr: a.DevAddr, IfaceAddr: a.IfaceAddr, Cap: uint64(self.TI.Attr.Cap), ConnID: 0xfff2}}})
		s.Write(out)
		f, err := wire.ReadFrame(s, wire.TypeReply, make([]byte, 0, wire.MaxFrame))
		if err != nil {
			t.Fatal(err)
		}
		if r, err := wire.DecodeReply(f); err != nil || r.Status != wire.StatusOK {
			t.Fatalf("reply %+v %v", r, err)
		}
	}
	// Completed, never accepted.
	var dialed []net.Conn
	for range 2 {
		d := &rdmanet.Dialer{Config: c, Timeout: 5 * time.Second}
		cl, err := d.Dial("rdma", addr)
		if err != nil {
			t.Fatal(err)
		}
		dialed = append(dialed, cl)
	}
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v", d)
	}
	for i, s := range socks {
		s.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.Copy(io.Discard, s); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("socket %d not closed by Close: %v", i, err)
		}
	}
	for i, cl := range dialed {
		cl.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := cl.Read(make([]byte, 1))
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("conn %d completed but not accepted: still open after Close (%v)", i, err)
		}
		cl.Close()
	}
	for _, s := range socks {
		s.Close()
	}
	socks = nil
	base.check(t)
}

// TestDialCancelSteps: ctx cancelled before the dial, and after the
// server's Reply (endpoint connected, stream started, waiting for the
// server's Ready); and cancelling after DialContext returned does not touch
// the conn. (Cancelling while waiting for the Reply: TestDialCancel.)
func TestDialCancelSteps(t *testing.T) {
	base := leakBaseline(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := rdmanet.DialContext(ctx, "rdma", "127.0.0.1:1"); !errors.Is(err, context.Canceled) {
		t.Errorf("dial with a cancelled ctx: %v", err)
	}

	// A server that answers the Hello with a real choice, then stalls.
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	cfgr, _ := rt.Resolve(nil)
	var self *rt.Transport
	for _, x := range rt.Get(cfgr).Transports {
		if x.TI.Resource.TL == "self" {
			self = x
		}
	}
	gotReady := make(chan net.Conn, 1)
	go func() {
		s, err := tl.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 0, wire.MaxFrame)
		if _, err := wire.ReadFrame(s, wire.TypeHello, buf); err != nil {
			s.Close()
			return
		}
		a := self.TI.Address()
		out, _ := wire.AppendReply(buf[:0], &wire.Reply{Status: wire.StatusOK, Choice: 0, ConnID: 0xfff3,
			DevAddr: a.DevAddr, IfaceAddr: a.IfaceAddr, Offered: "self"})
		s.Write(out)
		if _, err := wire.ReadFrame(s, wire.TypeReady, buf); err != nil {
			s.Close()
			return
		}
		gotReady <- s
	}()
	ctx, cancel = context.WithCancel(context.Background())
	errc := make(chan error, 1)
	before := rdmanet.ReadCounters()
	go func() {
		c, err := (&rdmanet.Dialer{Config: cfg("self")}).DialContext(ctx, "rdma", tl.Addr().String())
		if err == nil {
			c.Close()
		}
		errc <- err
	}()
	var s net.Conn
	select {
	case s = <-gotReady:
		defer s.Close()
	case err := <-errc:
		t.Fatalf("dial ended before its Ready: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no Ready from the client")
	}
	if d := rdmanet.ReadCounters().ConnsOpen["self"] - before.ConnsOpen["self"]; d != 1 {
		t.Errorf("conns_open[self] +%d with the stream started, want +1", d)
	}
	start := time.Now()
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) || time.Since(start) > time.Second {
			t.Errorf("dial after cancel: %v after %v", err, time.Since(start))
		}
	case <-time.After(3 * time.Second):
		t.Fatal("dial still blocked 3 s after cancel")
	}
	s.Close()
	tl.Close()

	// Cancelling after success leaves the conn alone.
	l := listen(t, cfg("self"))
	ctx, cancel = context.WithCancel(context.Background())
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			acc <- c
		}
	}()
	cl, err := (&rdmanet.Dialer{Config: cfg("self")}).DialContext(ctx, "rdma", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc := <-acc
	cancel()
	time.Sleep(20 * time.Millisecond)
	go cl.Write([]byte("still"))
	b := make([]byte, 5)
	if _, err := io.ReadFull(sc, b); err != nil || string(b) != "still" {
		t.Errorf("after cancel: %q, %v", b, err)
	}
	cl.Close()
	sc.Close()
	l.Close()
	base.check(t)
}
