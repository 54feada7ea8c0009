package rt

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"

	"github.com/gouct/gouct/internal/stream"
	"github.com/gouct/gouct/internal/wire"
)

// Errors of the wireup, re-exported by rdmanet.
var (
	// ErrUnknownNetwork: the network is not rdma, rdma4 or rdma6.
	ErrUnknownNetwork = errors.New("rdmanet: unknown network")
	// ErrNoTransport: the configuration forced a transport list without
	// tcp and the peer shares none of it. The error text names what each
	// side asked for and offered.
	ErrNoTransport = errors.New("rdmanet: no common transport")
	// ErrHandshake: the wireup handshake failed (peer misbehaved, not an
	// rdmanet peer, version mismatch, endpoint connect error).
	ErrHandshake = errors.New("rdmanet: handshake failed")
)

// Conn is what every Dial and Accept returns, whatever the transport.
type Conn interface {
	net.Conn
	// CloseWrite shuts down the writing side: the peer reads io.EOF after
	// the data already written.
	CloseWrite() error
	// Transport names the transport the conn runs on: "self", "shm",
	// "rc_verbs/rxe0:1", or "tcp" for the raw TCP fallback.
	Transport() string
	// Stats returns the conn's counters (a snapshot).
	Stats() stream.Stats
}

// Addr returns the rdmanet address of a bootstrap socket address.
func Addr(a net.Addr) stream.Addr {
	if a == nil {
		return stream.Addr{Net: "rdma"}
	}
	return stream.Addr{Net: "rdma", Addr: a.String()}
}

// TCPConn is the raw TCP fallback: the bootstrap socket itself, with no
// framing and no extra copy. Read and Write count bytes for Stats; the
// *net.TCPConn methods promoted through the embedding (ReadFrom, WriteTo:
// splice and sendfile paths) bypass the counters. Safe for concurrent use as
// *net.TCPConn is.
type TCPConn struct {
	*net.TCPConn
	reason  string
	read    atomic.Uint64
	written atomic.Uint64
	once    sync.Once
}

var (
	_ Conn = (*TCPConn)(nil)
	_ Conn = (*stream.Conn)(nil)
)

// NewTCPConn wraps c, which fell back to TCP for reason (detail: the
// peer's or the local explanation, may be empty), and counts it (conns_open
// "tcp" until Close; fallbacks by reason).
func NewTCPConn(c *net.TCPConn, reason wire.Reason, detail string) *TCPConn {
	text := reason.String()
	if detail != "" {
		text += ": " + detail
	}
	t := &TCPConn{TCPConn: c, reason: text}
	fallbacks.Add(reason.String(), 1)
	opened(t, "tcp")
	return t
}

// Close closes the socket.
func (c *TCPConn) Close() error {
	c.once.Do(func() { closed(c, "tcp") })
	return c.TCPConn.Close()
}

// Read reads from the socket.
func (c *TCPConn) Read(p []byte) (int, error) {
	n, err := c.TCPConn.Read(p)
	c.read.Add(uint64(n))
	return n, err
}

// Write writes to the socket.
func (c *TCPConn) Write(p []byte) (int, error) {
	n, err := c.TCPConn.Write(p)
	c.written.Add(uint64(n))
	return n, err
}

// Transport is "tcp".
func (c *TCPConn) Transport() string { return "tcp" }

// Stats reports the byte counters and the fallback reason.
func (c *TCPConn) Stats() stream.Stats {
	return stream.Stats{Transport: "tcp", BytesRead: c.read.Load(), BytesWritten: c.written.Load(), Fallback: c.reason}
}
