// Package dialer is the client side of rdmanet: a Dialer like net.Dialer
// that runs the wireup handshake over a bootstrap TCP connection and returns
// a conn on the best transport both ends share (raw TCP when none), plus
// helpers to plug it into gRPC and net/http.
//
// Most programs use rdmanet.Dial; this package is for tuning (Timeout,
// Config) and the gRPC/HTTP helpers.
package dialer

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/gouct/gouct/internal/rt"
	"github.com/gouct/gouct/uct"
)

// errAborted is the reason given to candidates released when the dial stops.
var errAborted = errors.New("rdmanet: dial aborted")

// Dialer holds options for dialing rdmanet listeners. The zero value dials
// with the environment's configuration. A Dialer may be used by several
// goroutines at once and must not be modified while in use.
type Dialer struct {
	// Timeout bounds the whole dial (TCP connect and handshake); 0 means
	// no limit other than Config.HandshakeTimeout on the handshake.
	Timeout time.Duration
	// Config selects transports (TLS) and tunes the handshake; nil means
	// the environment (RDMANET_*). Zero fields take their value from the
	// environment. Worker and iface tuning come from the first Dial or
	// Listen of the process (the runtime is process-wide).
	Config *uct.Config
	// LocalAddr is the local address of the bootstrap TCP socket (nil: any).
	LocalAddr *net.TCPAddr
	// KeepAlive of the bootstrap socket, as net.Dialer.KeepAlive.
	KeepAlive time.Duration
}

// Dial connects to the rdmanet listener at address.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// DialContext connects to the rdmanet listener at address (host:port of its
// bootstrap TCP socket) over network "rdma", "rdma4" or "rdma6". The
// returned conn implements rdmanet.Conn. ctx bounds the dial, TCP connect
// and handshake included; once DialContext returns, ctx no longer affects
// the conn. Errors are *net.OpError{Op: "dial"}; a forced transport list
// with nothing in common with the peer unwraps to rdmanet.ErrNoTransport.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := d.dial(ctx, network, address)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Addr: rt.Addr(stringAddr(address)), Err: err}
	}
	return c, nil
}

type stringAddr string

func (a stringAddr) Network() string { return "tcp" }
func (a stringAddr) String() string  { return string(a) }

func (d *Dialer) dial(ctx context.Context, network, address string) (rt.Conn, error) {
	tcpNet, err := rt.TCPNetwork(network)
	if err != nil {
		return nil, err
	}
	cfg, err := rt.Resolve(d.Config)
	if err != nil {
		return nil, err
	}
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	nd := net.Dialer{KeepAlive: d.KeepAlive}
	if d.LocalAddr != nil {
		nd.LocalAddr = d.LocalAddr
	}
	c, err := nd.DialContext(ctx, tcpNet, address)
	if err != nil {
		return nil, err
	}
	tc := c.(*net.TCPConn)

	// The handshake runs under its own deadline and ctx's, whichever is
	// first; cancelling ctx pushes the socket's deadline into the past so
	// the blocked read or write returns at once.
	dl := time.Now().Add(cfg.HandshakeTimeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(dl) {
		dl = cd
	}
	tc.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { tc.SetDeadline(time.Unix(1, 0)) })
	detach := func() bool {
		if !stop() {
			return false
		}
		tc.SetDeadline(time.Time{})
		return true
	}
	rearm := func() {
		tc.SetDeadline(dl)
		if ctx.Err() != nil {
			tc.SetDeadline(time.Unix(1, 0))
		}
	}
	conn, err := handshake(tc, cfg, detach, rearm)
	if err != nil {
		stop()
		tc.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if cd, ok := ctx.Deadline(); ok && !time.Now().Before(cd) {
			return nil, context.DeadlineExceeded // the socket's deadline was ctx's
		}
		rt.HandshakeFailed("dial")
		rt.Logger(cfg).Info("rdmanet: handshake failed", "remote", address, "err", err)
		return nil, err
	}
	return conn, nil
}

var defaultDialer Dialer

// Dial connects with the zero Dialer.
func Dial(network, address string) (net.Conn, error) { return defaultDialer.Dial(network, address) }

// DialContext connects with the zero Dialer.
func DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return defaultDialer.DialContext(ctx, network, address)
}

// GRPC returns a dialer for grpc.WithContextDialer that connects over
// rdmanet ("rdma" network) with the zero Dialer:
//
//	grpc.NewClient("passthrough:///host:50051", grpc.WithContextDialer(dialer.GRPC()), ...)
func GRPC() func(ctx context.Context, addr string) (net.Conn, error) { return defaultDialer.GRPC() }

// GRPC returns a grpc.WithContextDialer function dialing with d.
func (d *Dialer) GRPC() func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		return d.DialContext(ctx, "rdma", addr)
	}
}

// HTTPTransport returns an *http.Transport, configured like
// http.DefaultTransport but without a proxy, whose connections go over
// rdmanet with the zero Dialer ("tcp" in a URL's network maps to "rdma",
// "tcp4" to "rdma4", "tcp6" to "rdma6").
func HTTPTransport() *http.Transport { return defaultDialer.HTTPTransport() }

// HTTPTransport returns an *http.Transport dialing with d.
func (d *Dialer) HTTPTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		switch network {
		case "tcp4":
			network = "rdma4"
		case "tcp6":
			network = "rdma6"
		default:
			network = "rdma"
		}
		return d.DialContext(ctx, network, addr)
	}
	return t
}
