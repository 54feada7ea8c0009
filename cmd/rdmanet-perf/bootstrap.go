package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"time"
)

// The bootstrap is a TCP connection from client to server that carries
// control messages, as ucx_perftest's out-of-band socket does: test
// parameters, transport addresses, rkeys, and the start and end of each
// step. Framing, both directions:
//
//	| field  | size     | meaning                               |
//	|--------|----------|---------------------------------------|
//	| length | 4 B (BE) | JSON body length, 1..maxMsg           |
//	| body   | length   | one msg, JSON                         |
//
// A peer that sends a longer frame or malformed JSON ends the session with
// an error; nothing it sends can make the reader allocate more than maxMsg.
const (
	protoVersion = 1
	maxMsg       = 1 << 20
)

// Ops, client → server unless noted.
const (
	opHello     = "hello"     // Version, TLS
	opUCTOpen   = "uct_open"  // server opens its ifaces; replies opUCTAddrs
	opUCTAddrs  = "uct_addrs" // server → client: Addrs
	opUCTPick   = "uct_pick"  // Index (of the server's Addrs), Addr (client's), EPAddr
	opConnOpen  = "conn_open" // Net; server listens, replies opConnPort
	opConnPort  = "conn_port" // server → client: Port
	opRun       = "run"       // Layer, Net, Test, Size, Iters, Warmup
	opReady     = "ready"     // server → client: RAddr, RKey for put/get
	opFinish    = "finish"    // client's measurement is over
	opDone      = "done"      // server → client: step (or any request) finished
	opBye       = "bye"       // end of session
	opError     = "error"     // either way: Err
	opConnected = "uct_connected"
)

// addrMsg is a transport address as exchanged over the bootstrap.
type addrMsg struct {
	TL        string `json:"tl"`
	Device    string `json:"device"`
	DevAddr   []byte `json:"dev_addr"`
	IfaceAddr []byte `json:"iface_addr"`
	Caps      uint64 `json:"caps"`
}

// msg is every bootstrap message; Op says which fields matter.
type msg struct {
	Op      string    `json:"op"`
	Version int       `json:"version,omitempty"`
	TLS     []string  `json:"tls,omitempty"`
	Addrs   []addrMsg `json:"addrs,omitempty"`
	Index   int       `json:"index,omitempty"`
	Addr    *addrMsg  `json:"addr,omitempty"`
	EPAddr  []byte    `json:"ep_addr,omitempty"`
	Net     string    `json:"net,omitempty"`
	Port    int       `json:"port,omitempty"`
	Layer   string    `json:"layer,omitempty"`
	Test    string    `json:"test,omitempty"`
	Size    int       `json:"size,omitempty"`
	Iters   int       `json:"iters,omitempty"`
	Warmup  int       `json:"warmup,omitempty"`
	RAddr   uint64    `json:"raddr,omitempty"`
	RKey    []byte    `json:"rkey,omitempty"`
	Info    string    `json:"info,omitempty"` // free text: the transport a conn ended up on
	Err     string    `json:"err,omitempty"`
}

// boot is one end of the bootstrap connection. Not safe for concurrent use:
// one goroutine of each side drives the session.
type boot struct {
	c       net.Conn
	timeout time.Duration
	hdr     [4]byte
}

func (b *boot) send(m *msg) error {
	body, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if len(body) > maxMsg {
		return fmt.Errorf("bootstrap: %s message of %d bytes exceeds %d", m.Op, len(body), maxMsg)
	}
	frame := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(frame, uint32(len(body)))
	copy(frame[4:], body)
	b.c.SetWriteDeadline(time.Now().Add(b.timeout))
	if _, err := b.c.Write(frame); err != nil {
		return fmt.Errorf("bootstrap: send %s: %w", m.Op, err)
	}
	return nil
}

// recv reads one message. An opError from the peer becomes an error.
func (b *boot) recv() (*msg, error) {
	b.c.SetReadDeadline(time.Now().Add(b.timeout))
	if _, err := io.ReadFull(b.c, b.hdr[:]); err != nil {
		return nil, fmt.Errorf("bootstrap: receive: %w", err)
	}
	n := binary.BigEndian.Uint32(b.hdr[:])
	if n == 0 || n > maxMsg {
		return nil, fmt.Errorf("bootstrap: frame of %d bytes (limit %d)", n, maxMsg)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(b.c, body); err != nil {
		return nil, fmt.Errorf("bootstrap: receive: %w", err)
	}
	m := &msg{}
	if err := json.Unmarshal(body, m); err != nil {
		return nil, fmt.Errorf("bootstrap: malformed message: %w", err)
	}
	if m.Op == opError {
		return nil, fmt.Errorf("peer: %s", m.Err)
	}
	return m, nil
}

// expect receives one message and checks its op.
func (b *boot) expect(op string) (*msg, error) {
	m, err := b.recv()
	if err != nil {
		return nil, err
	}
	if m.Op != op {
		return nil, fmt.Errorf("bootstrap: got %q, want %q", m.Op, op)
	}
	return m, nil
}

// call sends m and waits for the reply op.
func (b *boot) call(m *msg, reply string) (*msg, error) {
	if err := b.send(m); err != nil {
		return nil, err
	}
	return b.expect(reply)
}

// watch receives the next message in a goroutine and reports whether it
// was op: a step's measuring goroutine runs meanwhile, and a peer that
// dies (the bootstrap connection fails) aborts the step at once instead of
// leaving it to wait for its deadline. The caller may send on b while the
// watch runs, and must not receive until it has reported.
func (b *boot) watch(op string) <-chan error {
	ch := make(chan error, 1)
	go func() {
		_, err := b.expect(op)
		ch <- err
	}()
	return ch
}

// measure runs fn on its own goroutine while watching the bootstrap for op
// (see watch). If the watch fails first, abort is called, fn's result
// awaited, and the watch error returned. Otherwise it returns the
// still-pending watch (nil when it already reported success) and fn's error.
func measure(b *boot, op string, fn func() error, abort func()) (<-chan error, error) {
	w := b.watch(op)
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return w, err
	case werr := <-w:
		if werr != nil {
			abort()
			<-done
			return nil, werr
		}
		return nil, <-done
	}
}
