package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gouct/gouct/uct"
)

const (
	magic      = "gouctTC1" // first bytes of every connection
	frameHdr   = 5          // id u8, length u32 LE
	maxBcopy   = 8192
	maxShort   = maxBcopy - 8
	maxZcopy   = 64 << 10
	maxHeader  = 128
	maxIOV     = 16
	maxPayload = maxHeader + maxZcopy // largest frame payload accepted

	rxBufStart = 16 << 10  // a connection's receive buffer at first,
	rxBufSize  = 128 << 10 // and once it carried a large frame or a stream: holds any whole frame
	maxEvents  = 64        // sockets handled per Progress

	handshakeTimeout = 10 * time.Second
)

// rxConn is a connection accepted by the iface, read by Progress.
type rxConn struct {
	c      *net.TCPConn
	raw    syscall.RawConn
	fd     int
	buf    []byte
	r, w   int
	n      int   // result of the last read
	err    error // of the last read; nil with n == 0 means EAGAIN
	readFn func(fd uintptr) bool
}

// iface listens on the device's IPv4 address. Methods are safe for
// concurrent use; Progress and Arm are called by the worker only, and run
// the AM handlers and completions.
type iface struct {
	md                 *md
	w                  *uct.Worker
	dev                device
	params             uct.IfaceParams
	lis                *net.TCPListener
	port               uint16
	devAddr, ifaceAddr []byte
	poll               *poller

	uct.AMTable

	mu        sync.Mutex
	closed    bool
	socks     map[int]any // fd -> *rxConn or *ep, for the poller's events
	handshake map[net.Conn]struct{}
	eps       map[*ep]struct{}
	wg        sync.WaitGroup // accept loop, handshakes
	armed     chan struct{}  // 1 slot: the worker is about to sleep
	waiterEnd chan struct{}
	closeOnce sync.Once

	// Worker only.
	evs  [maxEvents]pollEvent
	idle int // Progress calls since the last event

	rxErrors atomic.Uint64 // connections closed for bad peer input
}

func newIface(m *md, w *uct.Worker, d device, p uct.IfaceParams) (*iface, error) {
	pl, err := newPoller()
	if err != nil {
		return nil, fmt.Errorf("tcp: %w", err)
	}
	lis, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: d.ip})
	if err != nil {
		pl.close()
		return nil, fmt.Errorf("tcp: listen on %s (%s): %w", d.name, d.ip, err)
	}
	i := &iface{md: m, w: w, dev: d, params: p, lis: lis, poll: pl,
		socks: map[int]any{}, handshake: map[net.Conn]struct{}{}, eps: map[*ep]struct{}{},
		armed: make(chan struct{}, 1), waiterEnd: make(chan struct{})}
	i.port = uint16(lis.Addr().(*net.TCPAddr).Port)
	i.devAddr = append([]byte(nil), d.ip...)
	i.ifaceAddr = binary.BigEndian.AppendUint16(nil, i.port)
	i.wg.Add(1)
	go i.acceptLoop()
	go i.waiter()
	w.Add(i)
	return i, nil
}

func (i *iface) Attr() uct.IfaceAttr {
	return uct.IfaceAttr{
		Cap: uct.CapAMShort | uct.CapAMBcopy | uct.CapAMZcopy | uct.CapConnectToIface |
			uct.CapEvent | uct.CapPending,
		MaxShort: maxShort, MaxBcopy: maxBcopy, MaxZcopy: maxZcopy, MaxHeader: maxHeader, MaxIOV: maxIOV,
		// Go TCP loopback ping-pong is 25-35 µs a round trip here (DESIGN.md).
		Latency:       uct.LinearFunc{C: 10e-6},
		Bandwidth:     uct.Bandwidth{Dedicated: i.dev.bw},
		Overhead:      1e-6, // one syscall
		DeviceAddrLen: net.IPv4len, IfaceAddrLen: 2,
		Priority: 0,
	}
}

func (i *iface) Resource() uct.TLResource {
	return uct.TLResource{TL: tlName, Device: i.dev.name, Type: uct.DeviceNet}
}

func (i *iface) MD() uct.MD            { return i.md }
func (i *iface) DeviceAddress() []byte { return i.devAddr }
func (i *iface) IfaceAddress() []byte  { return i.ifaceAddr }

// peerAddr decodes a peer's addresses, or nil if they are malformed.
func peerAddr(devAddr, ifaceAddr []byte) *net.TCPAddr {
	if len(devAddr) != net.IPv4len || len(ifaceAddr) != 2 {
		return nil
	}
	ip := net.IP(append([]byte(nil), devAddr...))
	port := binary.BigEndian.Uint16(ifaceAddr)
	if port == 0 || ip.IsUnspecified() || ip.IsMulticast() || ip.Equal(net.IPv4bcast) {
		return nil
	}
	return &net.TCPAddr{IP: ip, Port: int(port)}
}

// IsReachable: a loopback device reaches loopback addresses only; another
// device reaches the non-loopback addresses of its own IPv4 subnet.
func (i *iface) IsReachable(devAddr, ifaceAddr []byte) bool {
	a := peerAddr(devAddr, ifaceAddr)
	if a == nil {
		return false
	}
	if i.dev.loopback {
		return a.IP.IsLoopback()
	}
	if a.IP.IsLoopback() {
		return false
	}
	return a.IP.Mask(i.dev.mask).Equal(i.dev.ip.Mask(i.dev.mask))
}

// CreateEP creates an endpoint to the iface at p's addresses. It does not
// block: a goroutine connects, and sends queue meanwhile.
func (i *iface) CreateEP(p uct.EPParams) (uct.EP, error) {
	if p.IfaceAddr == nil {
		return nil, uct.NotSupported("tcp: connect to ep")
	}
	a := peerAddr(p.DevAddr, p.IfaceAddr)
	if a == nil || !i.IsReachable(p.DevAddr, p.IfaceAddr) {
		return nil, fmt.Errorf("tcp: %x:%x from %s: %w", p.DevAddr, p.IfaceAddr, i.dev.name, uct.ErrUnreachable)
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.closed {
		return nil, fmt.Errorf("tcp: create ep: %w", uct.ErrClosed)
	}
	e := newEP(i, a)
	i.eps[e] = struct{}{}
	return e, nil
}

// attach registers a connected socket with the poller.
func (i *iface) attach(fd int, owner any, events uint32) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.closed {
		return fmt.Errorf("tcp: iface closed: %w", uct.ErrClosed)
	}
	if err := i.poll.add(fd, events); err != nil {
		return fmt.Errorf("tcp: epoll add: %w", err)
	}
	i.socks[fd] = owner
	return nil
}

// detach unregisters fd; call it before closing the socket (fd numbers are reused).
func (i *iface) detach(fd int, owner any) {
	i.mu.Lock()
	if i.socks[fd] == owner {
		delete(i.socks, fd)
		if !i.closed {
			i.poll.del(fd)
		}
	}
	i.mu.Unlock()
}

func (i *iface) forget(e *ep) {
	i.mu.Lock()
	delete(i.eps, e)
	i.mu.Unlock()
}

func (i *iface) acceptLoop() {
	defer i.wg.Done()
	for {
		c, err := i.lis.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: back off, don't spin
			continue
		}
		i.mu.Lock()
		if i.closed {
			i.mu.Unlock()
			c.Close()
			return
		}
		i.handshake[c] = struct{}{}
		i.wg.Add(1)
		i.mu.Unlock()
		go i.accept(c)
	}
}

// accept reads the magic (concurrently with other handshakes, under a
// deadline), then hands the connection to the poller and Progress.
func (i *iface) accept(c *net.TCPConn) {
	defer i.wg.Done()
	defer func() {
		i.mu.Lock()
		delete(i.handshake, c)
		i.mu.Unlock()
	}()
	var m [len(magic)]byte
	c.SetReadDeadline(time.Now().Add(handshakeTimeout))
	if _, err := io.ReadFull(c, m[:]); err != nil {
		if !errors.Is(err, net.ErrClosed) {
			i.badPeer(c, fmt.Errorf("no magic: %w", err))
		}
		c.Close()
		return
	}
	if string(m[:]) != magic {
		i.badPeer(c, fmt.Errorf("bad magic %q", m[:]))
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	raw, err := c.SyscallConn()
	if err != nil {
		c.Close()
		return
	}
	rc := &rxConn{c: c, raw: raw, buf: make([]byte, rxBufStart)}
	rc.readFn = rc.read
	raw.Control(func(fd uintptr) { rc.fd = int(fd) })
	if err := i.attach(rc.fd, rc, evIn); err != nil {
		c.Close()
		return
	}
	i.w.Wake()
}

// badPeer logs and counts a connection closed for malformed input.
func (i *iface) badPeer(c net.Conn, err error) {
	i.rxErrors.Add(1)
	slog.Warn("uct/tcp: closing connection", "iface", i.dev.name, "port", i.port, "peer", c.RemoteAddr(), "err", err)
}

func (i *iface) closeRx(rc *rxConn) {
	i.detach(rc.fd, rc)
	rc.c.Close()
}

// nextFrame decodes the frame at the start of b (see the wire format in the
// package doc). It returns the bytes the frame takes, 0 when b holds only
// part of it, or an error for an id >= uct.MaxAMID or a length above
// maxPayload. payload aliases b.
func nextFrame(b []byte) (id uint8, payload []byte, n int, err error) {
	if len(b) < frameHdr {
		return 0, nil, 0, nil
	}
	id = b[0]
	size := binary.LittleEndian.Uint32(b[1:])
	if id >= uct.MaxAMID {
		return 0, nil, 0, fmt.Errorf("am id %d: %w", id, uct.ErrInvalidParam)
	}
	if size > maxPayload {
		return 0, nil, 0, fmt.Errorf("frame of %d bytes (max %d): %w", size, maxPayload, uct.ErrMessageSize)
	}
	end := frameHdr + int(size)
	if end > len(b) {
		return 0, nil, 0, nil
	}
	return id, b[frameHdr:end:end], end, nil
}

// receive reads what rc has and runs the handler of every whole frame
// (worker only). It returns the number of messages handled.
func (i *iface) receive(rc *rxConn) int {
	if err := rc.raw.Read(rc.readFn); err != nil {
		i.closeRx(rc)
		return 0
	}
	rc.w += rc.n
	n := 0
	for {
		id, payload, k, err := nextFrame(rc.buf[rc.r:rc.w])
		if err != nil {
			i.badPeer(rc.c, err)
			i.closeRx(rc)
			return n
		}
		if k == 0 {
			break
		}
		if h := i.Handler(id); h != nil {
			h(payload)
		}
		rc.r += k
		n++
	}
	full := rc.w == len(rc.buf)
	if rc.r == rc.w {
		rc.r, rc.w = 0, 0
	} else if len(rc.buf)-rc.r < frameHdr+maxPayload {
		rc.w = copy(rc.buf, rc.buf[rc.r:rc.w])
		rc.r = 0
	}
	// Grow a small buffer to rxBufSize for a frame that does not fit, or
	// when the peer streams (the read filled it).
	if len(rc.buf) < rxBufSize && (full || rc.w-rc.r >= frameHdr &&
		frameHdr+int(binary.LittleEndian.Uint32(rc.buf[rc.r+1:])) > len(rc.buf)-rc.r) {
		b := make([]byte, rxBufSize)
		rc.w = copy(b, rc.buf[rc.r:rc.w])
		rc.r, rc.buf = 0, b
	}
	if rc.err != nil {
		i.closeRx(rc) // EOF or reset: the peer's EP is gone
	}
	return n
}

// Progress handles the ready sockets: runs the handlers of received
// messages, writes queued sends, fires completions (worker only). While
// idle it asks the poller only every 8th call, to keep the worker's spin
// cheap for the other ifaces it polls.
func (i *iface) Progress() int {
	if i.idle > 64 && i.idle&7 != 0 {
		i.idle++
		return 0
	}
	k := i.poll.wait(i.evs[:])
	if k == 0 {
		i.idle++
		return 0
	}
	i.idle = 0
	n := 0
	for j := 0; j < k; j++ {
		fd := eventFd(&i.evs[j])
		i.mu.Lock()
		s := i.socks[fd]
		i.mu.Unlock()
		switch s := s.(type) {
		case *rxConn:
			n += i.receive(s) + 1
		case *ep:
			n += s.progress(eventFlags(&i.evs[j])) + 1
		}
	}
	return n
}

// Arm returns false when a socket is ready; else it lets the waiter
// goroutine park in the netpoller on the epoll fd, to wake the worker.
func (i *iface) Arm() bool {
	if i.poll.ready() {
		return false
	}
	i.idle = 0
	select {
	case i.armed <- struct{}{}:
	default:
	}
	return true
}

// waiter wakes the worker when a socket becomes ready after Arm, and polls
// once itself (under the progress lock, like the worker).
func (i *iface) waiter() {
	defer close(i.waiterEnd)
	for range i.armed {
		if err := i.poll.block(); err != nil {
			return // poller closed
		}
		i.w.Wake()
		// Poll once from here: the first message is handled without
		// waiting for the worker goroutine to be scheduled (skipped when
		// the worker already polls).
		i.w.TryProgress()
	}
}

// Close stops accepting, closes every connection and endpoint of the iface,
// waits for its goroutines and detaches it from the worker. Messages not yet
// handled are dropped. Idempotent.
func (i *iface) Close() error {
	i.closeOnce.Do(func() {
		i.mu.Lock()
		eps := make([]*ep, 0, len(i.eps))
		for e := range i.eps {
			eps = append(eps, e)
		}
		i.mu.Unlock()
		for _, e := range eps {
			e.Close()
		}
		i.mu.Lock()
		i.closed = true
		hs := make([]net.Conn, 0, len(i.handshake))
		for c := range i.handshake {
			hs = append(hs, c)
		}
		i.mu.Unlock()
		i.lis.Close()
		for _, c := range hs {
			c.Close()
		}
		i.wg.Wait()
		i.w.Remove(i) // Progress no longer runs: the sockets are ours to close
		i.mu.Lock()
		for fd, s := range i.socks {
			if rc, ok := s.(*rxConn); ok {
				rc.c.Close()
			}
			delete(i.socks, fd)
		}
		i.mu.Unlock()
		close(i.armed)
		i.poll.wake() // ends a waiter blocked in epoll_wait
		<-i.waiterEnd
		i.poll.close()
	})
	return nil
}
