// Package tcp is the TCP socket transport (UCX uct/tcp): one TL resource
// "tcp" per IPv4 network interface that is up (loopback first), active
// messages framed on TCP connections, no RMA. It is the fallback every host
// has, ranked below shm and self. Import it for its side effect of
// registering the "tcp" component.
//
// Addresses: the device address is the interface's IPv4 address (4 bytes),
// the iface address the listening port (2 bytes, big endian). Endpoints
// connect to an iface (CapConnectToIface); each EP owns one outgoing
// connection, and an iface receives on every connection accepted by its
// listener.
//
// Wire format, per connection: the connecting side first sends the 8-byte
// magic "gouctTC1", then frames:
//
//	| offset | size | field                                          |
//	|--------|------|------------------------------------------------|
//	| 0      | 1    | AM id (< uct.MaxAMID)                          |
//	| 1      | 4    | payload length, little endian (<= maxPayload)  |
//	| 5      | len  | payload: AMShort 8-byte header + data; AMBcopy |
//	|        |      | packed bytes; AMZcopy header then iov contents |
//
// A peer that sends a wrong magic, an id >= uct.MaxAMID or a length above
// maxPayload has its connection closed (logged, counted); it never panics
// the receiver.
//
// Progress (UCX tcp's epoll-driven progress): the iface keeps its sockets
// in an epoll set. The worker's Progress asks it, without blocking, which
// sockets are ready, reads them with non-blocking reads and runs the AM
// handlers straight from the connection's receive buffer, and writes queued
// sends. A send writes to its socket at once (non-blocking writev) when
// nothing is queued; the rest waits in the EP's bounded queue. Nothing is
// handed between goroutines on the data path, so a spinning worker sees
// data as soon as the kernel has it (a goroutine parked in the Go
// netpoller is only scheduled when a processor goes idle). When the worker
// parks, one waiter goroutine per iface blocks in epoll_wait and wakes it
// (see poller for why not in the netpoller). Accepting and the magic
// handshake run on their own goroutines.
//
// Linux only (epoll); elsewhere the component reports itself unavailable.
package tcp

import (
	"fmt"

	"github.com/gouct/gouct/uct"
)

const (
	componentName = "tcp"
	mdName        = "tcp"
	tlName        = "tcp"
)

type component struct{}

func init() { uct.Register(component{}) }

func (component) Name() string { return componentName }

// MDResources lists the single "tcp" memory domain, or ErrUnavailable when
// the host has no IPv4 interface that is up.
func (component) MDResources() ([]uct.MDResource, error) {
	if err := pollSupported(); err != nil {
		return nil, err
	}
	devs, err := devices()
	if err != nil {
		return nil, fmt.Errorf("tcp: list interfaces: %v: %w", err, uct.ErrUnavailable)
	}
	if len(devs) == 0 {
		return nil, fmt.Errorf("tcp: no IPv4 interface is up: %w", uct.ErrUnavailable)
	}
	return []uct.MDResource{{Name: mdName}}, nil
}

func (c component) OpenMD(name string, cfg *uct.Config) (uct.MD, error) {
	if name != mdName {
		return nil, fmt.Errorf("tcp: no md %q: %w", name, uct.ErrInvalidParam)
	}
	if cfg == nil {
		cfg = uct.DefaultConfig()
	}
	return &md{comp: c, cfg: cfg}, nil
}
