//go:build linux && cgo && !noverbs

package ib

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/internal/ibv"
)

// md is one RDMA device: its context and protection domain, and what its
// ports offer. Methods are safe for concurrent use.
type md struct {
	comp  component
	name  string
	cfg   *uct.Config
	ctx   *ibv.Context
	pd    *ibv.PD
	dattr ibv.DeviceAttr
	sw    bool
	ports []*portInfo
	why   []error // ports not offered, and why

	mu     sync.Mutex
	closed bool
	ifaces map[*iface]struct{}
	regs   int     // live registrations (leak accounting)
	free   []*memh // recycled Register handles, at most maxFreeMemh
}

// maxFreeMemh bounds the recycled registration handles per MD: a rendezvous
// registers and deregisters per Write, and should not allocate.
const maxFreeMemh = 64

func openMD(c component, name string, cfg *uct.Config) (*md, error) {
	ctx, err := ibv.Open(name)
	if err != nil {
		return nil, fmt.Errorf("ib: %w", err)
	}
	m := &md{comp: c, name: name, cfg: cfg, ctx: ctx, ifaces: map[*iface]struct{}{}}
	fail := func(err error) (*md, error) {
		m.pd.Close()
		ctx.Close()
		return nil, fmt.Errorf("ib: open md %s: %w", name, err)
	}
	if m.dattr, err = ctx.QueryDevice(); err != nil {
		return fail(err)
	}
	m.sw = isSoftware(name, m.dattr.VendorID)
	if m.pd, err = ctx.AllocPD(); err != nil {
		return fail(err)
	}
	for port := 1; port <= m.dattr.PhysPortCnt; port++ {
		pi, err := m.queryPort(port)
		if err != nil {
			m.why = append(m.why, fmt.Errorf("%s:%d: %w", name, port, err))
			continue
		}
		m.ports = append(m.ports, pi)
	}
	return m, nil
}

// queryPort reads one port: state, MTU, speed, GIDs (the chosen one per
// RDMANET_IB_GID_INDEX), LAG.
func (m *md) queryPort(port int) (*portInfo, error) {
	pa, err := m.ctx.QueryPort(port)
	if err != nil {
		return nil, err
	}
	if pa.State != ibv.PortActive {
		return nil, fmt.Errorf("port not active (state %d)", pa.State)
	}
	pi := &portInfo{num: port, attr: pa, rxeSW: m.sw}
	if pi.gids, err = m.ctx.GIDs(port); err != nil {
		return nil, err
	}
	if pa.LinkLayer == ibv.LinkLayerEthernet || m.cfg.IBGIDIndex >= 0 {
		if pi.gid, err = chooseGID(pi.gids, m.cfg.IBGIDIndex, nil); err != nil {
			return nil, err
		}
	} else if len(pi.gids) > 0 {
		pi.gid = pi.gids[0]
	}
	if pa.LinkLayer == ibv.LinkLayerEthernet {
		pi.lag = lagSlaves(m.name, port)
	}
	pi.estimate()
	return pi, nil
}

func (m *md) Name() string             { return m.name }
func (m *md) Component() uct.Component { return m.comp }

func (m *md) Attr() uct.MDAttr {
	return uct.MDAttr{
		Flags:    uct.MDCanRegister | uct.MDNeedMemH | uct.MDNeedRKey,
		RegCost:  uct.LinearFunc{C: 16e-6, M: 0.06e-9},
		MaxReg:   m.dattr.MaxMRSize,
		RKeySize: 4,
	}
}

// memh is a registration: the MR, and the pin that keeps Go memory in place
// until Deregister. mmapped is set for MemAlloc memory (unmapped by MemFree).
// Register's handles are recycled after Deregister (md.free), with their MR
// storage, pinner and packed rkey: no allocation per registration.
type memh struct {
	mr      *ibv.MR // nil for an empty buffer or once deregistered; &mrv for Register
	mrv     ibv.MR
	pin     runtime.Pinner
	access  uct.Access
	mmapped []byte
	rkey    [4]byte // packed at registration (PackRKey returns a view)
	pooled  bool    // from md.free: back there at Deregister
}

// ibvAccess maps uct access to the minimal verbs flags (remote write needs
// local write, as verbs requires).
func ibvAccess(a uct.Access) int {
	f := 0
	if a&(uct.AccessLocalWrite|uct.AccessRemoteWrite) != 0 {
		f |= ibv.AccessLocalWrite
	}
	if a&uct.AccessRemoteWrite != 0 {
		f |= ibv.AccessRemoteWrite
	}
	if a&uct.AccessRemoteRead != 0 {
		f |= ibv.AccessRemoteRead
	}
	return f
}

// Register pins b (Go memory stays in place while registered) and registers
// it with ibv_reg_mr for access. The caller keeps b alive until Deregister,
// and must not use the handle after Deregister (it is recycled).
func (m *md) Register(b []byte, access uct.Access) (uct.MemH, error) {
	if len(b) == 0 {
		return &memh{access: access}, nil
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, fmt.Errorf("ib: md %s: %w", m.name, uct.ErrClosed)
	}
	var h *memh
	if n := len(m.free); n > 0 {
		h = m.free[n-1]
		m.free = m.free[:n-1]
	}
	m.mu.Unlock()
	if h == nil {
		h = &memh{pooled: true}
	}
	h.access = access
	p := unsafe.Pointer(&b[0])
	h.pin.Pin(p)
	if err := m.pd.RegMRInto(&h.mrv, uintptr(p), len(b), ibvAccess(access)); err != nil {
		h.pin.Unpin()
		m.recycle(h)
		return nil, fmt.Errorf("ib: register %d bytes: %w", len(b), err)
	}
	h.mr = &h.mrv
	k := h.mrv.RKey
	h.rkey = [4]byte{byte(k), byte(k >> 8), byte(k >> 16), byte(k >> 24)}
	m.mu.Lock()
	m.regs++
	m.mu.Unlock()
	return h, nil
}

// recycle keeps a deregistered Register handle for reuse (bounded).
func (m *md) recycle(h *memh) {
	if !h.pooled {
		return
	}
	m.mu.Lock()
	if len(m.free) < maxFreeMemh {
		m.free = append(m.free, h)
	}
	m.mu.Unlock()
}

func (m *md) live() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("ib: md %s: %w", m.name, uct.ErrClosed)
	}
	return nil
}

// Deregister releases a registration made by Register or MemAlloc.
func (m *md) Deregister(mh uct.MemH) error {
	h, ok := mh.(*memh)
	if !ok || h == nil {
		return fmt.Errorf("ib: deregister %T: %w", mh, uct.ErrInvalidParam)
	}
	if h.mr == nil {
		return nil
	}
	err := h.mr.Close()
	h.mr = nil
	h.pin.Unpin()
	m.mu.Lock()
	m.regs--
	m.mu.Unlock()
	m.recycle(h)
	if err != nil {
		return fmt.Errorf("ib: %w", err)
	}
	return nil
}

// PackRKey returns the 4-byte little-endian rkey of a registration; for a
// Register handle the bytes are the handle's, valid until Deregister.
func (m *md) PackRKey(mh uct.MemH) ([]byte, error) {
	h, ok := mh.(*memh)
	if !ok || h == nil {
		return nil, fmt.Errorf("ib: pack rkey %T: %w", mh, uct.ErrInvalidParam)
	}
	if h.mr == &h.mrv {
		return h.rkey[:], nil // valid until Deregister
	}
	var k uint32
	if h.mr != nil {
		k = h.mr.RKey
	}
	return []byte{byte(k), byte(k >> 8), byte(k >> 16), byte(k >> 24)}, nil
}

// MemAlloc maps size bytes off the Go heap and registers them for local and
// remote access.
func (m *md) MemAlloc(size int) (uct.Mem, error) {
	if size <= 0 {
		return uct.Mem{}, fmt.Errorf("ib: mem alloc %d bytes: %w", size, uct.ErrInvalidParam)
	}
	if err := m.live(); err != nil {
		return uct.Mem{}, err
	}
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return uct.Mem{}, fmt.Errorf("ib: mem alloc %d bytes: %w", size, err)
	}
	acc := uct.AccessLocalRead | uct.AccessLocalWrite | uct.AccessRemoteRead | uct.AccessRemoteWrite
	mr, err := m.pd.RegMR(uintptr(unsafe.Pointer(&b[0])), size, ibvAccess(acc))
	if err != nil {
		unix.Munmap(b)
		return uct.Mem{}, fmt.Errorf("ib: mem alloc %d bytes: %w", size, err)
	}
	m.mu.Lock()
	m.regs++
	m.mu.Unlock()
	return uct.Mem{Buf: b, MemH: &memh{mr: mr, access: acc, mmapped: b}}, nil
}

// MemFree deregisters and unmaps memory from MemAlloc.
func (m *md) MemFree(mem uct.Mem) error {
	h, ok := mem.MemH.(*memh)
	if !ok || h == nil || h.mmapped == nil {
		return fmt.Errorf("ib: mem free: not from MemAlloc: %w", uct.ErrInvalidParam)
	}
	b := h.mmapped
	h.mmapped = nil
	return errors.Join(m.Deregister(h), unix.Munmap(b))
}

// TLResources lists rc_verbs on every active port allowed by
// RDMANET_NET_DEVICES.
func (m *md) TLResources() ([]uct.TLResource, error) {
	var out []uct.TLResource
	for _, p := range m.ports {
		if !m.cfg.DeviceAllowed(m.name, p.num) {
			continue
		}
		out = append(out, uct.TLResource{TL: tlName, Device: fmt.Sprintf("%s:%d", m.name, p.num), Type: uct.DeviceNet})
	}
	if len(out) == 0 {
		why := errors.Join(m.why...)
		if why == nil {
			why = errors.New("disabled by RDMANET_NET_DEVICES")
		}
		return nil, fmt.Errorf("ib: %s: no usable port: %w", m.name, why)
	}
	return out, nil
}

// OpenIface opens rc_verbs on the port tl names.
func (m *md) OpenIface(w *uct.Worker, tl uct.TLResource, p uct.IfaceParams) (uct.Iface, error) {
	if tl.TL != tlName {
		return nil, fmt.Errorf("ib: no transport %q: %w", tl.TL, uct.ErrInvalidParam)
	}
	var port *portInfo
	for _, pi := range m.ports {
		if tl.Device == fmt.Sprintf("%s:%d", m.name, pi.num) {
			port = pi
		}
	}
	if port == nil {
		return nil, fmt.Errorf("ib: no device %q on md %s: %w", tl.Device, m.name, uct.ErrInvalidParam)
	}
	if err := m.live(); err != nil {
		return nil, err
	}
	cfg := p.Config
	if cfg == nil {
		cfg = m.cfg
	}
	i, err := newIface(m, w, port, tl, p, cfg)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.ifaces[i] = struct{}{}
	m.mu.Unlock()
	return i, nil
}

func (m *md) ifaceClosed(i *iface) {
	m.mu.Lock()
	delete(m.ifaces, i)
	m.mu.Unlock()
}

// Close releases the PD and the device. Ifaces must be closed and memory
// deregistered first; otherwise Close returns ErrBusy and may be retried.
func (m *md) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	if n := len(m.ifaces); n > 0 {
		m.mu.Unlock()
		return fmt.Errorf("ib: close md %s: %d ifaces still open: %w", m.name, n, uct.ErrBusy)
	}
	if m.regs > 0 {
		n := m.regs
		m.mu.Unlock()
		return fmt.Errorf("ib: close md %s: %d registrations still alive: %w", m.name, n, uct.ErrBusy)
	}
	m.closed = true
	m.mu.Unlock()
	return errors.Join(m.pd.Close(), m.ctx.Close())
}
