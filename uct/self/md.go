package self

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/gouct/gouct/uct"
)

// memh is a registration: the registered bytes and the key peers name them by.
type memh struct {
	key    uint64
	rkey   [8]byte // key, packed once at Register
	buf    []byte
	access uct.Access
}

// regTable maps rkeys to registrations process-wide: an rkey from another
// self iface in this process resolves here, and an unknown or out-of-range
// (address, key) pair is refused rather than read.
var (
	regMu   sync.RWMutex
	regs    = map[uint64]*memh{}
	nextKey atomic.Uint64
	// freeH recycles handles (bounded), so a registration per rendezvous
	// allocates nothing in steady state.
	freeH []*memh
)

const maxFreeH = 256

type md struct {
	comp component
	cfg  *uct.Config
}

func newMD(c component, cfg *uct.Config) *md { return &md{comp: c, cfg: cfg} }

func (m *md) Name() string             { return componentName }
func (m *md) Component() uct.Component { return m.comp }
func (m *md) Attr() uct.MDAttr {
	return uct.MDAttr{Flags: uct.MDCanRegister | uct.MDNeedRKey, RKeySize: 8,
		RegCost: uct.LinearFunc{C: 50e-9}}
}

func (m *md) Register(b []byte, access uct.Access) (uct.MemH, error) {
	regMu.Lock()
	var h *memh
	if n := len(freeH); n > 0 {
		h, freeH = freeH[n-1], freeH[:n-1]
	} else {
		h = new(memh)
	}
	h.key, h.buf, h.access = nextKey.Add(1), b, access
	binary.LittleEndian.PutUint64(h.rkey[:], h.key)
	regs[h.key] = h
	regMu.Unlock()
	return h, nil
}

func (m *md) Deregister(h uct.MemH) error {
	mh, ok := h.(*memh)
	if !ok || mh == nil {
		return fmt.Errorf("self: deregister: %w", uct.ErrInvalidParam)
	}
	regMu.Lock()
	defer regMu.Unlock()
	if regs[mh.key] != mh {
		return fmt.Errorf("self: deregister: not registered: %w", uct.ErrInvalidParam)
	}
	delete(regs, mh.key)
	*mh = memh{}
	if len(freeH) < maxFreeH {
		freeH = append(freeH, mh)
	}
	return nil
}

func (m *md) PackRKey(h uct.MemH) ([]byte, error) {
	mh, ok := h.(*memh)
	if !ok || mh == nil {
		return nil, fmt.Errorf("self: pack rkey: %w", uct.ErrInvalidParam)
	}
	// The packed key lives in the handle: valid until Deregister.
	return mh.rkey[:], nil
}

func (m *md) MemAlloc(size int) (uct.Mem, error) {
	b := make([]byte, size)
	h, err := m.Register(b, uct.AccessLocalRead|uct.AccessLocalWrite|uct.AccessRemoteRead|uct.AccessRemoteWrite)
	return uct.Mem{Buf: b, MemH: h}, err
}

func (m *md) MemFree(mem uct.Mem) error { return m.Deregister(mem.MemH) }

func (m *md) TLResources() ([]uct.TLResource, error) {
	return []uct.TLResource{{TL: tlName, Device: deviceName, Type: uct.DeviceSelf}}, nil
}

func (m *md) OpenIface(w *uct.Worker, tl uct.TLResource, p uct.IfaceParams) (uct.Iface, error) {
	if tl.TL != tlName {
		return nil, fmt.Errorf("self: no transport %q", tl.TL)
	}
	return newIface(m, w, p)
}

func (m *md) Close() error { return nil }

// resolve returns the registered bytes [raddr, raddr+n) named by rkey, or
// ErrOutOfRange when the key is unknown, lacks access, or the range leaves it.
func resolve(rkey []byte, raddr uint64, n int, need uct.Access) ([]byte, error) {
	if len(rkey) != 8 {
		return nil, fmt.Errorf("self: rkey of %d bytes: %w", len(rkey), uct.ErrOutOfRange)
	}
	// Copy what is needed under the lock: handles are recycled by Deregister.
	regMu.RLock()
	var buf []byte
	var access uct.Access
	h := regs[binary.LittleEndian.Uint64(rkey)]
	if h != nil {
		buf, access = h.buf, h.access
	}
	regMu.RUnlock()
	if h == nil || access&need != need {
		return nil, fmt.Errorf("self: unknown rkey: %w", uct.ErrOutOfRange)
	}
	if len(buf) == 0 {
		if n == 0 {
			return nil, nil
		}
		return nil, uct.ErrOutOfRange
	}
	base := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	if raddr < base || raddr-base > uint64(len(buf)) || uint64(n) > uint64(len(buf))-(raddr-base) {
		return nil, fmt.Errorf("self: [%#x,+%d) outside registration: %w", raddr, n, uct.ErrOutOfRange)
	}
	off := raddr - base
	return buf[off : off+uint64(n)], nil
}
