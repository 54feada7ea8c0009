package main

import (
	"context"
	"net"
	"time"
)

// rdmaNote is set while the Conn tests of network "rdma" cannot use
// rdmanet: they then run over Go TCP and every result says so.
const rdmaNote = "rdmanet not built in yet: Conn tests ran over Go TCP"

// listenNet listens for data connections of network on addr.
func listenNet(network, addr string, tls []string) (net.Listener, error) {
	return net.Listen("tcp", addr)
}

// dialNet dials a data connection of network to addr.
func dialNet(ctx context.Context, network, addr string, tls []string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	return d.DialContext(ctx, "tcp", addr)
}

// connTransport names what a data connection runs over.
func connTransport(network string, c net.Conn) (name, note string) {
	if network == netRDMA {
		return "tcp(fallback)", rdmaNote
	}
	return "go-tcp", ""
}
