//go:build linux

package shm

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gouct/gouct/uct"
)

// memh is a registration: nothing is pinned or mapped (the peer copies with
// process_vm_readv/writev, which faults pages in as needed); it records the
// range and access the rkey grants, and the rkey packed once at
// registration. mmapped is set for MemAlloc memory. Registrations of user
// buffers are recycled through the MD's free list after Deregister, so a
// rendezvous per Write allocates nothing.
type memh struct {
	buf     []byte
	access  uct.Access
	mmapped bool
	live    bool // registered and not yet deregistered; under md.mu
	rkey    [rkeyLen]byte
}

// packRKey fills h.rkey from its range and access.
func (h *memh) packRKey() {
	var base uint64
	if len(h.buf) > 0 {
		base = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(h.buf))))
	}
	binary.LittleEndian.PutUint32(h.rkey[0:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint32(h.rkey[4:], uint32(h.access))
	binary.LittleEndian.PutUint64(h.rkey[8:], base)
	binary.LittleEndian.PutUint64(h.rkey[16:], uint64(len(h.buf)))
}

// Packed rkey (little-endian), 24 bytes:
//
//	| off | size | field                              |
//	|   0 |    4 | pid of the process owning the memory |
//	|   4 |    4 | access flags (uct.Access)          |
//	|   8 |    8 | base address of the registration   |
//	|  16 |    8 | length of the registration         |
const rkeyLen = 24

type rkey struct {
	pid    int
	access uct.Access
	base   uint64
	length uint64
}

func unpackRKey(b []byte) (rkey, error) {
	if len(b) != rkeyLen {
		return rkey{}, fmt.Errorf("shm: rkey of %d bytes: %w", len(b), uct.ErrOutOfRange)
	}
	return rkey{pid: int(binary.LittleEndian.Uint32(b)), access: uct.Access(binary.LittleEndian.Uint32(b[4:])),
		base: binary.LittleEndian.Uint64(b[8:]), length: binary.LittleEndian.Uint64(b[16:])}, nil
}

// check validates [raddr, raddr+n) against the registration and access.
func (k rkey) check(raddr uint64, n int, need uct.Access) error {
	if k.access&need != need {
		return fmt.Errorf("shm: rkey lacks access %#x: %w", need, uct.ErrOutOfRange)
	}
	if raddr < k.base || raddr-k.base > k.length || uint64(n) > k.length-(raddr-k.base) {
		return fmt.Errorf("shm: [%#x,+%d) outside registration [%#x,+%d): %w", raddr, n, k.base, k.length, uct.ErrOutOfRange)
	}
	return nil
}

// maxFreeMemH bounds the MD's free list of registrations.
const maxFreeMemH = 64

type md struct {
	comp component
	cfg  *uct.Config

	mu   sync.Mutex
	free []*memh // deregistered handles for reuse, at most maxFreeMemH
}

func newMD(c component, cfg *uct.Config) *md { return &md{comp: c, cfg: cfg} }

func (m *md) Name() string             { return mdName }
func (m *md) Component() uct.Component { return m.comp }

func (m *md) Attr() uct.MDAttr {
	// Registration only records a range: tens of nanoseconds (UCX cma's
	// reg_cost is 9 ns). Local IOVs need no MemH.
	return uct.MDAttr{Flags: uct.MDCanRegister | uct.MDNeedRKey, RKeySize: rkeyLen,
		RegCost: uct.LinearFunc{C: 20e-9}}
}

// Register records b for remote access. The caller keeps b alive and
// unmoved (Go heap memory does not move; do not register stack memory)
// until Deregister, and must not use the handle after Deregister (it is
// recycled). Safe for concurrent use; allocates nothing in steady state.
func (m *md) Register(b []byte, access uct.Access) (uct.MemH, error) {
	m.mu.Lock()
	var h *memh
	if n := len(m.free); n > 0 {
		h = m.free[n-1]
		m.free[n-1] = nil
		m.free = m.free[:n-1]
	}
	m.mu.Unlock()
	if h == nil {
		h = new(memh)
	}
	h.buf, h.access, h.mmapped, h.live = b, access, false, true
	h.packRKey()
	return h, nil
}

// Deregister ends a registration made by Register (a handle deregistered
// twice is refused with ErrInvalidParam); for MemAlloc memory it does
// nothing (MemFree releases it).
func (m *md) Deregister(h uct.MemH) error {
	mh, ok := h.(*memh)
	if !ok || mh == nil {
		return fmt.Errorf("shm: deregister: %w", uct.ErrInvalidParam)
	}
	if mh.mmapped {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !mh.live {
		return fmt.Errorf("shm: deregister: not registered: %w", uct.ErrInvalidParam)
	}
	mh.live, mh.buf = false, nil
	if len(m.free) < maxFreeMemH {
		m.free = append(m.free, mh)
	}
	return nil
}

// PackRKey returns the rkey of a registration: this process's pid and the
// registered range. A peer's GetZcopy/PutZcopy is refused outside it. The
// slice is the handle's own (packed at registration, no allocation): the
// caller must not modify it, and it is valid until Deregister.
func (m *md) PackRKey(h uct.MemH) ([]byte, error) {
	mh, ok := h.(*memh)
	if !ok || mh == nil {
		return nil, fmt.Errorf("shm: pack rkey: %w", uct.ErrInvalidParam)
	}
	return mh.rkey[:], nil
}

// MemAlloc maps anonymous memory off the Go heap and registers it with
// every access.
func (m *md) MemAlloc(size int) (uct.Mem, error) {
	if size <= 0 {
		return uct.Mem{}, fmt.Errorf("shm: mem alloc %d bytes: %w", size, uct.ErrInvalidParam)
	}
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return uct.Mem{}, fmt.Errorf("shm: mem alloc %d bytes: %w", size, err)
	}
	h := &memh{buf: b, mmapped: true,
		access: uct.AccessLocalRead | uct.AccessLocalWrite | uct.AccessRemoteRead | uct.AccessRemoteWrite}
	h.packRKey()
	return uct.Mem{Buf: b, MemH: h}, nil
}

func (m *md) MemFree(mem uct.Mem) error {
	mh, ok := mem.MemH.(*memh)
	if !ok || mh == nil || !mh.mmapped || mh.buf == nil {
		return fmt.Errorf("shm: mem free: %w", uct.ErrInvalidParam)
	}
	b := mh.buf
	mh.buf = nil
	return unix.Munmap(b)
}

func (m *md) TLResources() ([]uct.TLResource, error) {
	return []uct.TLResource{{TL: tlName, Device: deviceName, Type: uct.DeviceShm}}, nil
}

func (m *md) OpenIface(w *uct.Worker, tl uct.TLResource, p uct.IfaceParams) (uct.Iface, error) {
	if tl.TL != tlName || tl.Device != deviceName {
		return nil, fmt.Errorf("shm: no transport %q: %w", tl.Name(), uct.ErrInvalidParam)
	}
	if w == nil {
		return nil, fmt.Errorf("shm: open iface: nil worker: %w", uct.ErrInvalidParam)
	}
	return newIface(m, w, p)
}

func (m *md) Close() error { return nil }
