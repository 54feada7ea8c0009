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

	rxRing    = 128       // messages an iface buffers for its worker
	rxBufSize = 128 << 10 // a reader's socket buffer: holds any whole frame

	handshakeTimeout = 10 * time.Second
)

// rxSlot is one received message waiting for the worker.
type rxSlot struct {
	id  uint8
	n   int
	buf []byte // grows to the largest message this slot carried, bounded by maxPayload
}

// iface listens on the device's IPv4 address. Methods are safe for
// concurrent use; Progress and Arm are called by the worker only.
type iface struct {
	md                 *md
	w                  *uct.Worker
	dev                device
	params             uct.IfaceParams
	lis                *net.TCPListener
	port               uint16
	devAddr, ifaceAddr []byte

	handlers [uct.MaxAMID]atomic.Pointer[uct.AMHandler]

	// Receive ring, filled by readers, drained by Progress.
	mu        sync.Mutex
	space     *sync.Cond // readers wait here while the ring is full
	ring      [rxRing]rxSlot
	head      int
	count     int
	waiting   int // readers waiting for space
	closed    bool
	conns     map[net.Conn]struct{}
	eps       map[*ep]struct{}
	queued    atomic.Int32
	wg        sync.WaitGroup // accept loop and readers
	closeOnce sync.Once

	// RxErrors counts connections closed for bad peer input.
	rxErrors atomic.Uint64
}

func newIface(m *md, w *uct.Worker, d device, p uct.IfaceParams) (*iface, error) {
	lis, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: d.ip})
	if err != nil {
		return nil, fmt.Errorf("tcp: listen on %s (%s): %w", d.name, d.ip, err)
	}
	i := &iface{md: m, w: w, dev: d, params: p, lis: lis,
		conns: map[net.Conn]struct{}{}, eps: map[*ep]struct{}{}}
	i.space = sync.NewCond(&i.mu)
	i.port = uint16(lis.Addr().(*net.TCPAddr).Port)
	i.devAddr = append([]byte(nil), d.ip...)
	i.ifaceAddr = binary.BigEndian.AppendUint16(nil, i.port)
	i.wg.Add(1)
	go i.acceptLoop()
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

func (i *iface) SetAMHandler(id uint8, h uct.AMHandler) error {
	if id >= uct.MaxAMID {
		return fmt.Errorf("tcp: am id %d: %w", id, uct.ErrInvalidParam)
	}
	if h == nil {
		i.handlers[id].Store(nil)
	} else {
		i.handlers[id].Store(&h)
	}
	return nil
}

// CreateEP creates an endpoint to the iface at p's addresses. It does not
// block: the EP's writer goroutine connects, and sends queue meanwhile.
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
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			// EMFILE and the like: back off instead of spinning.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		i.mu.Lock()
		if i.closed {
			i.mu.Unlock()
			c.Close()
			return
		}
		i.conns[c] = struct{}{}
		i.wg.Add(1)
		i.mu.Unlock()
		go i.reader(c)
	}
}

// badPeer closes c for malformed input.
func (i *iface) badPeer(c net.Conn, err error) {
	i.rxErrors.Add(1)
	slog.Warn("uct/tcp: closing connection", "iface", i.dev.name, "port", i.port, "peer", c.RemoteAddr(), "err", err)
}

// reader receives frames from one accepted connection until it fails, the
// peer misbehaves or the iface closes. It parks in the netpoller in Read,
// or on i.space while the ring is full.
func (i *iface) reader(c net.Conn) {
	defer i.wg.Done()
	defer func() {
		c.Close()
		i.mu.Lock()
		delete(i.conns, c)
		i.mu.Unlock()
	}()
	var m [len(magic)]byte
	c.SetReadDeadline(time.Now().Add(handshakeTimeout))
	if _, err := io.ReadFull(c, m[:]); err != nil {
		if !errors.Is(err, net.ErrClosed) {
			i.badPeer(c, fmt.Errorf("no magic: %w", err))
		}
		return
	}
	if string(m[:]) != magic {
		i.badPeer(c, fmt.Errorf("bad magic %q", m[:]))
		return
	}
	c.SetReadDeadline(time.Time{})
	buf := make([]byte, rxBufSize)
	r, w := 0, 0
	for {
		for w-r >= frameHdr {
			id := buf[r]
			n := binary.LittleEndian.Uint32(buf[r+1:])
			if id >= uct.MaxAMID {
				i.badPeer(c, fmt.Errorf("am id %d: %w", id, uct.ErrInvalidParam))
				return
			}
			if n > maxPayload {
				i.badPeer(c, fmt.Errorf("frame of %d bytes: %w", n, uct.ErrMessageSize))
				return
			}
			end := r + frameHdr + int(n)
			if end > w {
				break
			}
			if !i.deliver(id, buf[r+frameHdr:end]) {
				return
			}
			r = end
		}
		if r == w {
			r, w = 0, 0
		} else if len(buf)-r < frameHdr+maxPayload {
			w = copy(buf, buf[r:w])
			r = 0
		}
		k, err := c.Read(buf[w:])
		w += k
		if err != nil && k == 0 {
			return // EOF, reset, or closed by Close
		}
	}
}

// deliver copies one message into the ring, waiting while it is full. It
// returns false when the iface is closed.
func (i *iface) deliver(id uint8, data []byte) bool {
	i.mu.Lock()
	for i.count == rxRing && !i.closed {
		i.waiting++
		i.space.Wait()
		i.waiting--
	}
	if i.closed {
		i.mu.Unlock()
		return false
	}
	s := &i.ring[(i.head+i.count)%rxRing]
	if cap(s.buf) < len(data) {
		s.buf = make([]byte, max(len(data), 1024))
	}
	s.id, s.n = id, copy(s.buf[:cap(s.buf)], data)
	i.count++
	i.queued.Store(int32(i.count))
	i.mu.Unlock()
	i.w.Wake()
	return true
}

// Progress runs the handlers of the messages in the ring (worker only).
func (i *iface) Progress() int {
	if i.queued.Load() == 0 {
		return 0
	}
	n := 0
	for {
		i.mu.Lock()
		if i.count == 0 {
			i.mu.Unlock()
			return n
		}
		s := &i.ring[i.head]
		i.mu.Unlock()
		// Only the worker consumes: the head slot is stable during the handler.
		if h := i.handlers[s.id].Load(); h != nil {
			(*h)(s.buf[:s.n])
		}
		i.mu.Lock()
		i.head = (i.head + 1) % rxRing
		i.count--
		i.queued.Store(int32(i.count))
		if i.waiting > 0 {
			i.space.Broadcast()
		}
		i.mu.Unlock()
		n++
	}
}

// Arm: readers call Worker.Wake after every message they queue.
func (i *iface) Arm() bool { return i.queued.Load() == 0 }

// Close stops accepting, closes every connection and endpoint of the iface,
// waits for its goroutines and detaches it from the worker. Messages not yet
// handled are dropped. Idempotent.
func (i *iface) Close() error {
	i.closeOnce.Do(func() {
		i.mu.Lock()
		i.closed = true
		conns := make([]net.Conn, 0, len(i.conns))
		for c := range i.conns {
			conns = append(conns, c)
		}
		eps := make([]*ep, 0, len(i.eps))
		for e := range i.eps {
			eps = append(eps, e)
		}
		i.space.Broadcast()
		i.mu.Unlock()
		i.lis.Close()
		for _, c := range conns {
			c.Close()
		}
		for _, e := range eps {
			e.Close()
		}
		i.wg.Wait()
		i.w.Remove(i)
	})
	return nil
}
