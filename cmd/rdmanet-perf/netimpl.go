package main

import (
	"context"
	"net"
	"time"

	"github.com/gouct/gouct/rdmanet"
)

// listenNet listens for data connections of network on addr: rdmanet's
// listener (transports restricted to tls when given) or Go TCP.
func listenNet(network, addr string, tls []string) (net.Listener, error) {
	if network == netTCP {
		return net.Listen("tcp", addr)
	}
	lc := rdmanet.ListenConfig{Config: rdmaConfig(tls)}
	return lc.Listen(context.Background(), "rdma", addr)
}

// dialNet dials a data connection of network to addr.
func dialNet(ctx context.Context, network, addr string, tls []string, timeout time.Duration) (net.Conn, error) {
	if network == netTCP {
		d := net.Dialer{Timeout: timeout}
		return d.DialContext(ctx, "tcp", addr)
	}
	d := rdmanet.Dialer{Timeout: timeout, Config: rdmaConfig(tls)}
	return d.DialContext(ctx, "rdma", addr)
}

// rdmaConfig is nil (the environment) or a Config forcing the transports;
// its zero fields take the environment's values.
func rdmaConfig(tls []string) *rdmanet.Config {
	if len(tls) == 0 {
		return nil
	}
	return &rdmanet.Config{TLS: tls}
}

// connTransport names what a data connection runs over, and why it fell
// back to TCP when it did.
func connTransport(network string, c net.Conn) (name, note string) {
	if network == netTCP {
		return "go-tcp", ""
	}
	rc, ok := c.(rdmanet.Conn)
	if !ok {
		return "rdma", ""
	}
	name = rc.Transport()
	if fb := rc.Stats().Fallback; fb != "" {
		note = "rdmanet fell back to TCP: " + fb
	}
	return "rdma:" + name, note
}
