package self

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gouct/gouct/uct"
)

const (
	queueLen  = 64
	segSize   = 8192
	maxShort  = 2048
	addrBytes = 8
)

// processToken is this process's device address: only ifaces of the same
// process are reachable.
var processToken = func() []byte {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return b
}()

var (
	ifacesMu sync.RWMutex
	ifaces   = map[uint64]*iface{}
	nextID   atomic.Uint64
)

type msg struct {
	id  uint8
	n   int
	buf []byte
}

type iface struct {
	md     *md
	w      *uct.Worker
	id     uint64
	addr   []byte
	params uct.IfaceParams

	uct.AMTable

	mu      sync.Mutex
	q       [queueLen]msg
	head    int // next to deliver
	count   int
	waiters map[*ep]struct{} // senders with pending requests, waiting for room
	closed  bool
	queued  atomic.Int32
}

func newIface(m *md, w *uct.Worker, p uct.IfaceParams) (*iface, error) {
	i := &iface{md: m, w: w, id: nextID.Add(1), params: p, waiters: map[*ep]struct{}{}}
	i.addr = binary.LittleEndian.AppendUint64(nil, i.id)
	ifacesMu.Lock()
	ifaces[i.id] = i
	ifacesMu.Unlock()
	w.Add(i)
	return i, nil
}

func (i *iface) Attr() uct.IfaceAttr {
	return uct.IfaceAttr{
		Cap: uct.CapAMShort | uct.CapAMBcopy | uct.CapAMZcopy | uct.CapPutZcopy | uct.CapGetZcopy |
			uct.CapConnectToIface | uct.CapEvent | uct.CapPending,
		MaxShort: maxShort, MaxBcopy: segSize, MaxZcopy: segSize, MaxHeader: 64, MaxIOV: 8,
		MaxGet: 1 << 30, MaxPut: 1 << 30,
		Latency:       uct.LinearFunc{C: 50e-9},
		Bandwidth:     uct.Bandwidth{Dedicated: 20e9},
		Overhead:      10e-9,
		DeviceAddrLen: len(processToken), IfaceAddrLen: addrBytes,
		Priority: 10,
	}
}

func (i *iface) Resource() uct.TLResource {
	return uct.TLResource{TL: tlName, Device: deviceName, Type: uct.DeviceSelf}
}
func (i *iface) MD() uct.MD            { return i.md }
func (i *iface) DeviceAddress() []byte { return processToken }
func (i *iface) IfaceAddress() []byte  { return i.addr }

func lookupIface(devAddr, ifaceAddr []byte) *iface {
	if string(devAddr) != string(processToken) || len(ifaceAddr) != addrBytes {
		return nil
	}
	ifacesMu.RLock()
	defer ifacesMu.RUnlock()
	return ifaces[binary.LittleEndian.Uint64(ifaceAddr)]
}

func (i *iface) IsReachable(devAddr, ifaceAddr []byte) bool {
	return lookupIface(devAddr, ifaceAddr) != nil
}

func (i *iface) CreateEP(p uct.EPParams) (uct.EP, error) {
	if p.IfaceAddr == nil {
		return nil, uct.NotSupported("self: connect to ep")
	}
	t := lookupIface(p.DevAddr, p.IfaceAddr)
	if t == nil {
		return nil, fmt.Errorf("self: %w", uct.ErrUnreachable)
	}
	return &ep{iface: i, target: t}, nil
}

// enqueue copies one message in with fill; ErrNoResource when the queue is full.
func (i *iface) enqueue(id uint8, fill func(buf []byte) int) (int, error) {
	i.mu.Lock()
	if i.closed {
		i.mu.Unlock()
		return 0, uct.ErrUnreachable
	}
	if i.count == queueLen {
		i.mu.Unlock()
		return 0, uct.ErrNoResource
	}
	slot := &i.q[(i.head+i.count)%queueLen]
	if slot.buf == nil {
		slot.buf = make([]byte, segSize)
	}
	n := fill(slot.buf)
	if n < 0 || n > segSize {
		i.mu.Unlock()
		return 0, fmt.Errorf("self: pack wrote %d bytes of %d: %w", n, segSize, uct.ErrMessageSize)
	}
	slot.id, slot.n = id, n
	i.count++
	i.queued.Store(int32(i.count))
	i.mu.Unlock()
	i.w.Wake()
	return n, nil
}

func (i *iface) Progress() int {
	if i.queued.Load() == 0 {
		return 0
	}
	n := 0
	for {
		i.mu.Lock()
		if i.count == 0 {
			i.mu.Unlock()
			break
		}
		slot := &i.q[i.head]
		i.mu.Unlock()
		// Only this worker consumes, so the slot is stable while the handler runs.
		if h := i.Handler(slot.id); h != nil {
			h(slot.buf[:slot.n])
		}
		i.mu.Lock()
		i.head = (i.head + 1) % queueLen
		i.count--
		i.queued.Store(int32(i.count))
		var waiters map[*ep]struct{}
		if len(i.waiters) > 0 {
			waiters = i.waiters
			i.waiters = map[*ep]struct{}{}
		}
		i.mu.Unlock()
		for e := range waiters {
			e.iface.w.Post(e.dispatch)
		}
		n++
	}
	return n
}

func (i *iface) Arm() bool { return i.queued.Load() == 0 }

func (i *iface) Close() error {
	i.mu.Lock()
	if i.closed {
		i.mu.Unlock()
		return nil
	}
	i.closed = true
	i.mu.Unlock()
	ifacesMu.Lock()
	delete(ifaces, i.id)
	ifacesMu.Unlock()
	i.w.Remove(i)
	return nil
}
