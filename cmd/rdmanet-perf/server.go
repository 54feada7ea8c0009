package main

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/gouct/gouct/uct"
)

// serve runs sessions on ln: one client at a time, like ucx_perftest; it
// returns after the first session unless forever is set, or when ln closes.
func (c *command) serve(ln net.Listener, forever bool) error {
	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		err = c.session(conn)
		conn.Close()
		if err != nil {
			c.logf("session with %s: %v", conn.RemoteAddr(), err)
		}
		if !forever {
			return err
		}
	}
}

// serverState is what one session holds; close releases all of it.
type serverState struct {
	tls     []string // the client's -x: restricts the Conn tests too
	u       *uctSide
	lns     map[string]net.Listener
	accepts map[string]chan acceptResult
	conns   map[string]*connSide
}

type acceptResult struct {
	c   net.Conn
	err error
}

func (st *serverState) close() {
	if st.u != nil {
		st.u.close()
	}
	for _, ln := range st.lns {
		ln.Close()
	}
	for n, ch := range st.accepts {
		if _, ok := st.conns[n]; !ok {
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}
	}
	for _, cs := range st.conns {
		cs.c.Close()
	}
}

// session serves one client over its bootstrap connection.
func (c *command) session(conn net.Conn) error {
	b := &boot{c: conn, timeout: c.timeout}
	hello, err := b.expect(opHello)
	if err != nil {
		return err
	}
	if hello.Version != protoVersion {
		b.send(&msg{Op: opError, Err: fmt.Sprintf("protocol version %d, server speaks %d", hello.Version, protoVersion)})
		return fmt.Errorf("client speaks protocol version %d", hello.Version)
	}
	cfg, err := uct.ConfigFromEnv()
	if err != nil {
		b.send(&msg{Op: opError, Err: err.Error()})
		return err
	}
	if len(hello.TLS) > 0 {
		cfg.TLS = hello.TLS // the client's -x rules both sides
	}
	if err := b.send(&msg{Op: opDone, Version: protoVersion}); err != nil {
		return err
	}
	st := &serverState{tls: hello.TLS, lns: map[string]net.Listener{}, accepts: map[string]chan acceptResult{}, conns: map[string]*connSide{}}
	defer st.close()
	host, _, _ := net.SplitHostPort(conn.LocalAddr().String())
	for {
		m, err := b.recv()
		if err != nil {
			return err
		}
		var reply *msg
		switch m.Op {
		case opBye:
			return b.send(&msg{Op: opDone})
		case opUCTOpen:
			reply, err = st.uctOpen(cfg)
		case opUCTPick:
			reply, err = st.uctPick(m)
		case opConnOpen:
			reply, err = st.connOpen(m.Net, host)
		case opRun:
			err = c.serverStep(b, st, m)
		default:
			err = fmt.Errorf("unexpected %q", m.Op)
		}
		if err != nil {
			b.send(&msg{Op: opError, Err: err.Error()})
			return err
		}
		if reply != nil {
			if err := b.send(reply); err != nil {
				return err
			}
		}
	}
}

func (st *serverState) uctOpen(cfg *uct.Config) (*msg, error) {
	if st.u == nil {
		u, err := openUCT(cfg)
		if err != nil {
			return nil, err
		}
		st.u = u
	}
	return &msg{Op: opUCTAddrs, Addrs: st.u.addrs()}, nil
}

func (st *serverState) uctPick(m *msg) (*msg, error) {
	u := st.u
	if u == nil || u.ep != nil {
		return nil, errors.New("uct_pick out of order")
	}
	if m.Index < 0 || m.Index >= len(u.ifs.List) || m.Addr == nil {
		return nil, fmt.Errorf("uct_pick: bad index %d", m.Index)
	}
	ti := u.ifs.List[m.Index]
	if !ti.Iface.IsReachable(m.Addr.DevAddr, m.Addr.IfaceAddr) {
		return nil, fmt.Errorf("%s: client address %w", ti.Name(), uct.ErrUnreachable)
	}
	if err := u.use(ti); err != nil {
		return nil, err
	}
	if err := u.createEP(*m.Addr); err != nil {
		return nil, err
	}
	reply := &msg{Op: opConnected, Info: ti.Name()}
	if u.epToEP() {
		if err := u.ep.ConnectToEP(m.Addr.DevAddr, m.EPAddr); err != nil {
			return nil, fmt.Errorf("connect endpoint: %w", err)
		}
		a, err := u.ep.Address()
		if err != nil {
			return nil, fmt.Errorf("endpoint address: %w", err)
		}
		reply.EPAddr = a
	}
	return reply, nil
}

func (st *serverState) connOpen(network, host string) (*msg, error) {
	if network != netRDMA && network != netTCP {
		return nil, fmt.Errorf("unknown network %q", network)
	}
	if _, dup := st.lns[network]; dup {
		return nil, fmt.Errorf("conn_open %s twice", network)
	}
	ln, err := listenNet(network, net.JoinHostPort(host, "0"), st.tls)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", network, err)
	}
	st.lns[network] = ln
	ch := make(chan acceptResult, 1)
	st.accepts[network] = ch
	go func() {
		c, err := ln.Accept()
		ch <- acceptResult{c, err}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	p, _ := strconv.Atoi(port)
	return &msg{Op: opConnPort, Port: p}, nil
}

// conn returns the accepted data connection of network.
func (st *serverState) conn(network string, timeout time.Duration) (*connSide, error) {
	if cs, ok := st.conns[network]; ok {
		return cs, nil
	}
	ch, ok := st.accepts[network]
	if !ok {
		return nil, fmt.Errorf("run on %s before conn_open", network)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("accept %s: %w", network, r.err)
		}
		cs := &connSide{c: r.c}
		st.conns[network] = cs
		return cs, nil
	case <-time.After(timeout):
		return nil, fmt.Errorf("accept %s: timed out", network)
	}
}

// serverStep runs the server's side of one step: prepare, ready, its loop,
// then the client's finish and done.
func (c *command) serverStep(b *boot, st *serverState, m *msg) error {
	if m.Size < 0 || m.Iters <= 0 || m.Warmup < 0 || m.Size > maxSize || m.Iters > maxIters || m.Warmup > maxIters {
		return fmt.Errorf("run: bad parameters size=%d iters=%d warmup=%d", m.Size, m.Iters, m.Warmup)
	}
	deadline := time.Now().Add(c.timeout)
	ready := &msg{Op: opReady}
	var loop func() error
	var abort func() // makes loop return at once
	var cleanup func() error
	switch m.Layer {
	case "uct":
		u := st.u
		if u == nil || u.ep == nil {
			return errors.New("uct run before uct_pick")
		}
		method, err := u.method(m.Test, m.Size)
		if err != nil {
			return err
		}
		u.prepare(m.Size)
		abort = u.abort
		switch m.Test {
		case "am_lat":
			loop = func() error { return u.serverLat(method, m.Size, m.Warmup+m.Iters, deadline) }
		case "am_bw":
			loop = func() error { return u.serverBW(m.Warmup, m.Iters, deadline) }
		case "put_bw", "get_bw":
			t, raddr, rkey, err := u.newTarget(m.Size)
			if err != nil {
				return err
			}
			ready.RAddr, ready.RKey = raddr, rkey
			cleanup = t.free
		}
	case "conn":
		cs, err := st.conn(m.Net, c.timeout)
		if err != nil {
			return err
		}
		cs.prepare(m.Size)
		abort = cs.abort
		switch m.Test {
		case "stream_lat":
			loop = func() error { return cs.serverLat(m.Size, m.Warmup+m.Iters, deadline) }
		case "stream_bw":
			loop = func() error { return cs.serverBW(m.Size, m.Warmup, m.Iters, deadline) }
		default:
			return fmt.Errorf("unknown conn test %q", m.Test)
		}
	default:
		return fmt.Errorf("unknown layer %q", m.Layer)
	}
	err := b.send(ready)
	switch {
	case err != nil:
	case loop != nil:
		// A client that dies mid-step aborts the loop at once.
		var fin <-chan error
		if fin, err = measure(b, opFinish, loop, abort); err == nil && fin != nil {
			err = <-fin
		}
	default:
		_, err = b.expect(opFinish)
	}
	if cleanup != nil {
		err = errors.Join(err, cleanup())
	}
	if err != nil {
		return err
	}
	return b.send(&msg{Op: opDone})
}
