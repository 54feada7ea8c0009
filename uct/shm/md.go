//go:build linux

package shm

import (
	"encoding/binary"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gouct/gouct/uct"
)

// memh is a registration: nothing is pinned or mapped (the peer copies with
// process_vm_readv/writev, which faults pages in as needed); it records the
// range and access the rkey grants. mmapped is set for MemAlloc memory.
type memh struct {
	buf     []byte
	access  uct.Access
	mmapped bool
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

type md struct {
	comp component
	cfg  *uct.Config
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
// until Deregister.
func (m *md) Register(b []byte, access uct.Access) (uct.MemH, error) {
	return &memh{buf: b, access: access}, nil
}

func (m *md) Deregister(h uct.MemH) error {
	if mh, ok := h.(*memh); !ok || mh == nil {
		return fmt.Errorf("shm: deregister: %w", uct.ErrInvalidParam)
	}
	return nil
}

// PackRKey returns the rkey of a registration: this process's pid and the
// registered range. A peer's GetZcopy/PutZcopy is refused outside it.
func (m *md) PackRKey(h uct.MemH) ([]byte, error) {
	mh, ok := h.(*memh)
	if !ok || mh == nil {
		return nil, fmt.Errorf("shm: pack rkey: %w", uct.ErrInvalidParam)
	}
	var base uint64
	if len(mh.buf) > 0 {
		base = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(mh.buf))))
	}
	b := make([]byte, 0, rkeyLen)
	b = binary.LittleEndian.AppendUint32(b, uint32(os.Getpid()))
	b = binary.LittleEndian.AppendUint32(b, uint32(mh.access))
	b = binary.LittleEndian.AppendUint64(b, base)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(mh.buf)))
	return b, nil
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
