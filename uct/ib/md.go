//go:build linux && cgo && !noverbs

package ib

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
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

	mu      sync.Mutex
	closed  bool
	ifaces  map[*iface]struct{}
	regs    int     // live registrations (leak accounting)
	free    []*memh // recycled Register handles, at most maxFreeMemh
	regHead *memh   // live registrations, released by kill
	deadErr error   // why the device is unusable (removed, fatal); guarded by mu
	dead    atomic.Bool

	// devMu keeps the PD and context alive: verbs calls on them outside
	// an endpoint's lock (registration, QP creation, async events) hold it
	// for reading; kill and Close take it to release them.
	devMu     sync.RWMutex
	ctxClosed bool // guarded by devMu

	watchMu sync.Mutex // one device check at a time (TryLock)
	devPath string     // uverbs sysfs directory: gone once the device is being removed
	ibdevZ  []byte     // devPath/ibdev, NUL-terminated (registered reads it without allocating)
	ibdevB  [64]byte   // registered's read buffer; guarded by watchMu after openMD
	asyncOK bool       // the async event fd is non-blocking: check reads it
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
	m.devPath = ctx.DevPath()
	m.ibdevZ = append([]byte(filepath.Join(m.devPath, "ibdev")), 0)
	if !m.registered() {
		m.devPath = "" // sysfs not readable here: removal goes unnoticed
	}
	// Async events are read without blocking by the ifaces' event
	// goroutines (md.check): libibverbs owns the fd; O_NONBLOCK is all
	// this changes on it.
	m.asyncOK = unix.SetNonblock(ctx.AsyncFD(), true) == nil
	mdsMu.Lock()
	mds[m] = struct{}{}
	mdsMu.Unlock()
	return m, nil
}

// mds are the open MDs of the process (fault-injection hooks).
var (
	mdsMu sync.Mutex
	mds   = map[*md]struct{}{}
)

// watchPeriod is how often an iface's event goroutine checks its device
// (async events, removal) when no completion event woke it meanwhile.
const watchPeriod = 200 * time.Millisecond

// check drains the device's async events and checks the device is still
// registered; on a fatal event or removal it releases everything (kill, on
// a goroutine of its own: it waits for the event goroutines). Called by
// the ifaces' event goroutines; concurrent calls return at once.
func (m *md) check() {
	if !m.watchMu.TryLock() {
		return
	}
	defer m.watchMu.Unlock()
	if m.dead.Load() {
		return
	}
	if !m.devMu.TryRLock() { // kill holds it
		return
	}
	if m.ctxClosed {
		m.devMu.RUnlock()
		return
	}
	var fatal error
	for m.asyncOK {
		ev, err := m.ctx.GetAsyncEvent()
		if err != nil {
			break // EAGAIN: no more events
		}
		if err := m.asyncEvent(ev); err != nil && fatal == nil {
			fatal = err
		}
	}
	if fatal == nil && !m.registered() {
		fatal = fmt.Errorf("ib: device %s removed: %w", m.name, uct.ErrEndpointReset)
	}
	m.devMu.RUnlock()
	if fatal != nil {
		go m.kill(fatal)
	}
}

// registered reports whether the device is still registered with the
// kernel: its uverbs sysfs directory exists and still names it (removal
// deletes the directory first, then waits for every user to close the
// device, so this is how a process learns it must let go when the driver
// raises no async event, as Soft-RoCE does).
func (m *md) registered() bool {
	if m.devPath == "" {
		return true
	}
	// 5 times a second per iface, also while an application measures its
	// allocations: raw syscalls on a prepared path, nothing allocated.
	fd, _, e := syscall.Syscall6(syscall.SYS_OPENAT, atFDCWD, uintptr(unsafe.Pointer(&m.ibdevZ[0])),
		syscall.O_RDONLY|syscall.O_CLOEXEC, 0, 0, 0)
	if e != 0 {
		return e != syscall.ENOENT && e != syscall.ENODEV
	}
	n, err := syscall.Read(int(fd), m.ibdevB[:])
	syscall.Close(int(fd))
	if err != nil || n <= 0 {
		return err != syscall.ENODEV // read of a file being removed
	}
	return string(bytes.TrimSpace(m.ibdevB[:n])) == m.name
}

// atFDCWD is AT_FDCWD: openat relative to the working directory (the path
// is absolute anyway).
const atFDCWD = ^uintptr(99) // -100

// asyncEvent handles one async event: a QP error fails its endpoint; a
// device or CQ/SRQ error returns the error that kills the device. Called
// by check with devMu held for reading.
func (m *md) asyncEvent(ev ibv.AsyncEvent) error {
	switch ev.Type {
	case ibv.EventDeviceFatal, ibv.EventCQErr, ibv.EventSRQErr:
		return fmt.Errorf("ib: device %s: %s: %w", m.name, ibv.EventString(ev.Type), uct.ErrEndpointReset)
	case ibv.EventQPFatal, ibv.EventQPReqErr, ibv.EventQPAccessErr, ibv.EventPathMigErr, ibv.EventQPLastWQE:
		if e := m.epByQPN(ev.QPN); e != nil {
			e.asyncFail(fmt.Errorf("ib: QP %#x: %s: %w", ev.QPN, ibv.EventString(ev.Type), uct.ErrEndpointReset))
		}
	}
	return nil
}

// epByQPN finds a live endpoint of this MD by QP number.
func (m *md) epByQPN(qpn uint32) *ep {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.ifaces {
		for _, e := range *i.eps.Load() {
			if e != nil && e.qpn == qpn {
				return e
			}
		}
	}
	return nil
}

// Failed returns why the device is unusable (removed, fatal error), nil
// while it works. Safe for concurrent use.
func (m *md) Failed() error {
	if !m.dead.Load() {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.deadErr
}

// kill releases every verbs resource of a device that is gone, so the
// kernel can finish removing it: each iface fails its endpoints (their
// conns see err at once, through IfaceParams.ErrHandler) and releases its
// QPs, CQs, SRQ and buffers; then the live registrations, the PD and the
// context are released. Handles stay valid: later calls fail with err,
// Deregister and Close do nothing more. Must not run on an iface's event
// goroutine (it waits for them).
func (m *md) kill(err error) {
	m.mu.Lock()
	if m.deadErr != nil || m.closed {
		m.mu.Unlock()
		return
	}
	m.deadErr = err
	m.dead.Store(true)
	ifs := make([]*iface, 0, len(m.ifaces))
	for i := range m.ifaces {
		ifs = append(ifs, i)
	}
	m.mu.Unlock()
	for _, i := range ifs {
		i.stop(err)
	}
	m.devMu.Lock()
	defer m.devMu.Unlock()
	for _, i := range ifs {
		i.pollMu.Lock()
		i.release()
		i.nStashR, i.nStashS = 0, 0
		i.pollMu.Unlock()
	}
	m.mu.Lock()
	for h := m.regHead; h != nil; {
		next := h.next
		h.mr.Close() // the handle stays with its owner until Deregister
		h.prev, h.next, h.listed = nil, nil, false
		uncount(h)
		h = next
	}
	m.regHead = nil
	m.mu.Unlock()
	m.pd.Close()
	m.ctx.Close()
	m.ctxClosed = true
}

// uncount removes a released registration from RegStats.
func uncount(h *memh) {
	if h.alloc {
		regAllocs.Add(-1)
	} else {
		regLive.Add(-1)
	}
}

// link adds h to the live registrations. Called with mu held.
func (m *md) link(h *memh) {
	h.prev, h.next, h.listed = nil, m.regHead, true
	if m.regHead != nil {
		m.regHead.prev = h
	}
	m.regHead = h
}

// unlink removes h from the live registrations. Called with mu held.
func (m *md) unlink(h *memh) {
	if h.prev != nil {
		h.prev.next = h.next
	} else {
		m.regHead = h.next
	}
	if h.next != nil {
		h.next.prev = h.prev
	}
	h.prev, h.next, h.listed = nil, nil, false
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

	alloc      bool  // from MemAlloc (counted in RegStats.Allocs)
	prev, next *memh // md.regHead list; guarded by md.mu
	listed     bool  // in the list: the MR is live (kill releases listed MRs)
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
	m.devMu.RLock()
	if m.ctxClosed {
		m.devMu.RUnlock()
		h.pin.Unpin()
		m.recycle(h)
		return nil, fmt.Errorf("ib: register %d bytes: %w", len(b), m.gone())
	}
	if err := m.pd.RegMRInto(&h.mrv, uintptr(p), len(b), ibvAccess(access)); err != nil {
		m.devMu.RUnlock()
		h.pin.Unpin()
		m.recycle(h)
		return nil, fmt.Errorf("ib: register %d bytes: %w", len(b), err)
	}
	h.mr = &h.mrv
	k := h.mrv.RKey
	h.rkey = [4]byte{byte(k), byte(k >> 8), byte(k >> 16), byte(k >> 24)}
	m.mu.Lock()
	m.regs++
	m.link(h)
	m.mu.Unlock()
	m.devMu.RUnlock()
	regLive.Add(1)
	regTotal.Add(1)
	return h, nil
}

// gone is the error of an MD whose device was released (kill), else ErrClosed.
func (m *md) gone() error {
	if err := m.Failed(); err != nil {
		return err
	}
	return fmt.Errorf("ib: md %s: %w", m.name, uct.ErrClosed)
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
	if m.deadErr != nil {
		return m.deadErr
	}
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
	var err error
	m.devMu.RLock()
	m.mu.Lock()
	live := h.listed
	if live {
		m.unlink(h)
	}
	m.regs--
	m.mu.Unlock()
	if live { // else kill released it with the device
		err = h.mr.Close()
		uncount(h)
	}
	m.devMu.RUnlock()
	h.mr = nil
	h.pin.Unpin()
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
	m.devMu.RLock()
	defer m.devMu.RUnlock()
	if m.ctxClosed {
		unix.Munmap(b)
		return uct.Mem{}, fmt.Errorf("ib: mem alloc %d bytes: %w", size, m.gone())
	}
	mr, err := m.pd.RegMR(uintptr(unsafe.Pointer(&b[0])), size, ibvAccess(acc))
	if err != nil {
		unix.Munmap(b)
		return uct.Mem{}, fmt.Errorf("ib: mem alloc %d bytes: %w", size, err)
	}
	h := &memh{mr: mr, access: acc, mmapped: b, alloc: true}
	m.mu.Lock()
	m.regs++
	m.link(h)
	m.mu.Unlock()
	regAllocs.Add(1)
	return uct.Mem{Buf: b, MemH: h}, nil
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
	mdsMu.Lock()
	delete(mds, m)
	mdsMu.Unlock()
	m.devMu.Lock()
	defer m.devMu.Unlock()
	if m.ctxClosed { // released by kill
		return nil
	}
	m.ctxClosed = true
	return errors.Join(m.pd.Close(), m.ctx.Close())
}
