// Package rdmanet is a net.Conn / net.Listener over UCT transports: a Go
// server changes one line and its connections run over RDMA (rc_verbs)
// between hosts with RDMA NICs, shared memory between processes of one host,
// an in-process copy inside one process, and plain TCP otherwise:
//
//	lis, err := rdmanet.Listen("rdma", ":50051") // was net.Listen("tcp", ":50051")
//	conn, err := rdmanet.Dial("rdma", "host:50051")
//
// Each connection starts as a TCP connection to the listener's address (the
// bootstrap socket), on which both ends negotiate the best transport they
// share (DESIGN.md "Wireup"). The bootstrap socket stays open as the
// connection's liveness channel; when nothing better is common and TCP is
// allowed, it simply is the connection (Transport() "tcp", no framing).
//
// Configuration comes from RDMANET_* environment variables (see
// `rdmanet-info -f`), or a Config whose zero fields take the environment's
// values. RDMANET_TLS (Config.TLS) restricts the transports; a forced list
// with nothing in common with the peer makes Dial fail with ErrNoTransport
// instead of using something else.
//
// Every conn returned by Dial, DialContext and a Listener's Accept
// implements Conn.
package rdmanet

import (
	"context"
	"net"
	"net/http"

	"github.com/gouct/gouct/dialer"
	"github.com/gouct/gouct/internal/rt"
	"github.com/gouct/gouct/internal/stream"
	"github.com/gouct/gouct/listener"
	"github.com/gouct/gouct/uct"
)

// Config is the library configuration (transports, handshake limits,
// stream and transport tuning); each field documents its RDMANET_*
// variable. A nil *Config means the environment; zero fields of a non-nil
// Config take the environment's values.
type Config = uct.Config

// Conn is implemented by every conn rdmanet returns, TCP fallback included.
type Conn = rt.Conn

// Addr is the address of rdmanet conns and listeners: Network() "rdma",
// String() the bootstrap socket's host:port.
type Addr = stream.Addr

// Stats are a conn's counters: transport, bytes, messages by protocol, and
// why it fell back to TCP ("" when it did not).
type Stats = stream.Stats

// Dialer dials with options (Timeout, Config); see package dialer.
type Dialer = dialer.Dialer

// Errors.
var (
	ErrUnknownNetwork = rt.ErrUnknownNetwork
	ErrNoTransport    = rt.ErrNoTransport
	ErrHandshake      = rt.ErrHandshake
)

// Listen announces on address (host:port of the bootstrap TCP socket) for
// network "rdma", "rdma4" or "rdma6", configured by the environment.
func Listen(network, address string) (net.Listener, error) {
	return (&ListenConfig{}).Listen(context.Background(), network, address)
}

// ListenConfig holds listener options.
type ListenConfig struct {
	// Config: nil means the environment.
	Config *Config
}

// Listen announces on address with lc's options. ctx bounds the creation
// of the bootstrap listening socket only.
func (lc *ListenConfig) Listen(ctx context.Context, network, address string) (net.Listener, error) {
	l, err := listener.Listen(ctx, network, address, lc.Config)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Dial connects to the rdmanet listener at address over network "rdma",
// "rdma4" or "rdma6", configured by the environment.
func Dial(network, address string) (net.Conn, error) {
	return dialer.Dial(network, address)
}

// DialContext is Dial bounded by ctx (TCP connect and handshake).
func DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return dialer.DialContext(ctx, network, address)
}

// GRPCDialer returns a dialer for grpc.WithContextDialer that connects over
// rdmanet with the environment's configuration (see dialer.GRPC):
//
//	grpc.NewClient("passthrough:///host:50051", grpc.WithContextDialer(rdmanet.GRPCDialer()), ...)
func GRPCDialer() func(ctx context.Context, addr string) (net.Conn, error) { return dialer.GRPC() }

// HTTPTransport returns an *http.Transport whose connections go over
// rdmanet with the environment's configuration (see dialer.HTTPTransport).
func HTTPTransport() *http.Transport { return dialer.HTTPTransport() }

// Counters is a snapshot of the process-wide counters, also published as
// the expvar map "rdmanet" (conns_open and conns_total by transport,
// fallbacks by reason, handshake_failures by side, resets, bytes_read,
// bytes_written). They change once per conn event, never per message.
type Counters = rt.Counters

// ReadCounters returns a snapshot of the process-wide counters. Safe from
// any goroutine.
func ReadCounters() Counters { return rt.ReadCounters() }
