package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gouct/gouct/uct"
)

// client is one client session: the bootstrap to the server and what was
// set up over it. Driven by one goroutine.
type client struct {
	cmd   *command
	b     *boot
	host  string
	u     *uctSide
	conns map[string]*connSide
	notes map[string][2]string // network → transport name, note
	done  *atomic.Int64        // progress: iterations of the whole plan done so far (nil: no bar)
}

// runClient runs every step of the plan against the server at addr.
func (c *command) runClient(addr string, progress *atomic.Int64) ([]Result, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	conn, err := net.DialTimeout("tcp", addr, c.timeout)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	defer conn.Close()
	cl := &client{cmd: c, b: &boot{c: conn, timeout: c.timeout}, host: host,
		conns: map[string]*connSide{}, notes: map[string][2]string{}, done: progress}
	defer cl.close()
	if _, err := cl.b.call(&msg{Op: opHello, Version: protoVersion, TLS: c.opt.tls}, opDone); err != nil {
		return nil, err
	}
	var out []Result
	var base int64
	for _, test := range c.opt.tests {
		for _, size := range c.opt.sizesFor(test) {
			iters, warmup := c.opt.itersFor(test, size)
			r, err := cl.step(test, size, iters, warmup, base)
			if err != nil {
				return out, fmt.Errorf("%s %d B: %w", test, size, err)
			}
			base += int64(iters + warmup)
			if c.opt.compare == netTCP && !r.Skipped {
				bt := baselineTest(test)
				bi, bw := c.opt.itersFor(bt, size)
				br, err := cl.step(bt, size, bi, bw, base)
				if err != nil {
					return out, fmt.Errorf("tcp baseline %s %d B: %w", bt, size, err)
				}
				base += int64(bi + bw)
				br.Baseline = true
				compare(&r, br)
				out = append(out, r, br)
				continue
			}
			out = append(out, r)
		}
	}
	if _, err := cl.b.call(&msg{Op: opBye}, opDone); err != nil {
		return out, err
	}
	return out, nil
}

func (cl *client) close() {
	if cl.u != nil {
		cl.u.close()
	}
	for _, cs := range cl.conns {
		cs.c.Close()
	}
}

// baselineTest is the Go TCP test that -compare tcp runs beside test.
func baselineTest(test string) string {
	if isLat(test) {
		return "tcp:stream_lat"
	}
	return "tcp:stream_bw"
}

// step measures one test at one size. A test the chosen transport cannot
// run at that size comes back as a Result with a Note, not as an error.
func (cl *client) step(test string, size, iters, warmup int, base int64) (Result, error) {
	network := netRDMA
	if t, ok := strings.CutPrefix(test, "tcp:"); ok {
		network, test = netTCP, t
	}
	r := Result{Test: test, Size: size, Iterations: iters, Warmup: warmup}
	if layerOf(test) == "uct" {
		r.Layer = "uct"
		return r, cl.uctStep(&r, base)
	}
	r.Layer = "conn"
	return r, cl.connStep(&r, network, base)
}

func layerOf(test string) string {
	switch test {
	case "stream_lat", "stream_bw":
		return "conn"
	}
	return "uct"
}

func (cl *client) uctStep(r *Result, base int64) error {
	if err := cl.openUCT(); err != nil {
		return err
	}
	u := cl.u
	r.Transport = u.ti.Name()
	method, err := u.method(r.Test, r.Size)
	if err != nil {
		r.Skipped, r.Note = true, err.Error()
		return nil
	}
	r.Method = method
	u.prepare(r.Size)
	u.progress = nil
	ready, err := cl.b.call(&msg{Op: opRun, Layer: "uct", Test: r.Test, Size: r.Size, Iters: r.Iterations, Warmup: r.Warmup}, opReady)
	if err != nil {
		return err
	}
	u.progress, u.progBase = cl.done, base
	deadline := time.Now().Add(cl.cmd.timeout)
	return cl.finish(func() error {
		switch r.Test {
		case "am_lat":
			samples := make([]int64, r.Iterations)
			if err := u.clientLat(method, r.Size, r.Warmup, samples, deadline); err != nil {
				return err
			}
			latResult(r, samples)
		case "am_bw":
			d, err := u.clientBW(method, r.Size, r.Warmup, r.Iterations, deadline)
			if err != nil {
				return err
			}
			bwResult(r, d)
		case "put_bw", "get_bw":
			d, err := u.clientRMA(r.Test == "get_bw", r.Size, r.Warmup, r.Iterations, ready.RAddr, ready.RKey, deadline)
			if err != nil {
				return err
			}
			bwResult(r, d)
		}
		return nil
	}, u.abort)
}

// finish runs a step's measurement while watching the bootstrap (a server
// that dies or fails mid-step aborts it at once), then tells the server the
// step is over and waits for its done.
func (cl *client) finish(fn func() error, abort func()) error {
	done, err := measure(cl.b, opDone, fn, abort)
	if err != nil {
		return err
	}
	if done == nil {
		return errors.New("server ended the step before the client")
	}
	if err := cl.b.send(&msg{Op: opFinish}); err != nil {
		return err
	}
	return <-done
}

// openUCT opens the client's ifaces once per session, picks the transport
// with the lowest estimated latency that reaches one of the server's, and
// connects an endpoint each way.
func (cl *client) openUCT() error {
	if cl.u != nil {
		return nil
	}
	cfg, err := uct.ConfigFromEnv()
	if err != nil {
		return err
	}
	if len(cl.cmd.opt.tls) > 0 {
		cfg.TLS = cl.cmd.opt.tls
	}
	peer, err := cl.b.call(&msg{Op: opUCTOpen}, opUCTAddrs)
	if err != nil {
		return err
	}
	u, err := openUCT(cfg)
	if err != nil {
		return err
	}
	cl.u = u
	pa := make([]uct.TLAddress, len(peer.Addrs))
	for i, a := range peer.Addrs {
		pa[i] = uct.TLAddress{TL: a.TL, Device: a.Device, DevAddr: a.DevAddr, IfaceAddr: a.IfaceAddr}
	}
	// Prefer transports that can run every test asked for (put/get need RMA).
	need := uct.CapAMShort
	for _, t := range cl.cmd.opt.tests {
		switch t {
		case "am_bw":
			need |= uct.CapAMBcopy
		case "put_bw":
			need |= uct.CapPutZcopy
		case "get_bw":
			need |= uct.CapGetZcopy
		}
	}
	var able []*uct.TLIface
	for _, t := range u.ifs.List {
		if t.Attr.Cap.Has(need) {
			able = append(able, t)
		}
	}
	if len(able) == 0 {
		able = u.ifs.List
	}
	ti, chosen, err := uct.Select(able, pa, 64)
	if err != nil {
		return fmt.Errorf("no common transport with the server (mine: %s; server's: %s): %w",
			names(u.ifs.List), addrNames(peer.Addrs), err)
	}
	idx := -1
	for i, a := range peer.Addrs {
		if a.TL == chosen.TL && a.Device == chosen.Device && bytes.Equal(a.DevAddr, chosen.DevAddr) && bytes.Equal(a.IfaceAddr, chosen.IfaceAddr) {
			idx = i
			break
		}
	}
	if idx < 0 {
		return fmt.Errorf("selected %s/%s is not among the server's addresses", chosen.TL, chosen.Device)
	}
	if err := u.use(ti); err != nil {
		return err
	}
	sa := peer.Addrs[idx]
	if err := u.createEP(sa); err != nil {
		return err
	}
	a := ti.Address()
	pick := &msg{Op: opUCTPick, Index: idx, Addr: &addrMsg{TL: a.TL, Device: a.Device, DevAddr: a.DevAddr, IfaceAddr: a.IfaceAddr, Caps: uint64(ti.Attr.Cap)}}
	if u.epToEP() {
		if pick.EPAddr, err = u.ep.Address(); err != nil {
			return fmt.Errorf("endpoint address: %w", err)
		}
	}
	rep, err := cl.b.call(pick, opConnected)
	if err != nil {
		return err
	}
	if u.epToEP() {
		if err := u.ep.ConnectToEP(sa.DevAddr, rep.EPAddr); err != nil {
			return fmt.Errorf("connect endpoint: %w", err)
		}
	}
	return nil
}

func names(ts []*uct.TLIface) string {
	s := ""
	for _, t := range ts {
		if s != "" {
			s += ","
		}
		s += t.Name()
	}
	return s
}

func addrNames(as []addrMsg) string {
	s := ""
	for _, a := range as {
		if s != "" {
			s += ","
		}
		s += a.TL + "/" + a.Device
	}
	return s
}

func (cl *client) connStep(r *Result, network string, base int64) error {
	cs, err := cl.conn(network)
	if err != nil {
		return err
	}
	n := cl.notes[network]
	r.Transport, r.Note = n[0], n[1]
	cs.prepare(r.Size)
	cs.progress = nil
	if _, err := cl.b.call(&msg{Op: opRun, Layer: "conn", Net: network, Test: r.Test, Size: r.Size, Iters: r.Iterations, Warmup: r.Warmup}, opReady); err != nil {
		return err
	}
	cs.progress, cs.progBase = cl.done, base
	deadline := time.Now().Add(cl.cmd.timeout)
	return cl.finish(func() error {
		switch r.Test {
		case "stream_lat":
			samples := make([]int64, r.Iterations)
			if err := cs.clientLat(r.Size, r.Warmup, samples, deadline); err != nil {
				return err
			}
			latResult(r, samples)
		case "stream_bw":
			d, err := cs.clientBW(r.Size, r.Warmup, r.Iterations, deadline)
			if err != nil {
				return err
			}
			bwResult(r, d)
		default:
			return fmt.Errorf("unknown conn test %q", r.Test)
		}
		return nil
	}, cs.abort)
}

// conn dials the data connection of network once per session.
func (cl *client) conn(network string) (*connSide, error) {
	if cs, ok := cl.conns[network]; ok {
		return cs, nil
	}
	rep, err := cl.b.call(&msg{Op: opConnOpen, Net: network}, opConnPort)
	if err != nil {
		return nil, err
	}
	if rep.Port <= 0 || rep.Port > 65535 {
		return nil, errors.New("server sent a bad port")
	}
	ctx, cancel := context.WithTimeout(context.Background(), cl.cmd.timeout)
	defer cancel()
	c, err := dialNet(ctx, network, net.JoinHostPort(cl.host, strconv.Itoa(rep.Port)), cl.cmd.opt.tls, cl.cmd.timeout)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", network, err)
	}
	name, note := connTransport(network, c)
	cl.notes[network] = [2]string{name, note}
	cs := &connSide{c: c}
	cl.conns[network] = cs
	return cs, nil
}
