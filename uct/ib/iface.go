//go:build linux && cgo && !noverbs

package ib

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/internal/ibv"
)

const (
	devAddrLen  = 19 // link layer (1), LID (2, LE), GID (16)
	maxHeader   = 128
	maxIOVLimit = 8
	pollBatch   = 32
	// maxRMAInflight bounds the RDMA READ/WRITE bytes one endpoint has in
	// flight: rxe over a real netdev drops and retransmits when hundreds of
	// 64 KiB writes queue at once (and was seen to fail a QP with "remote
	// invalid request" then); a few MiB keep the link busy.
	maxRMAInflight = 4 << 20
	bounceSlab     = 64
	rxSlab         = 256
	// qpTimeout is the local ACK timeout exponent: 4.096 µs × 2^14 ≈ 67 ms
	// per try, 7 tries before a dead peer fails the endpoint.
	qpTimeout   = 14
	qpRetry     = 7
	qpRNRRetry  = 7 // infinite: a receiver out of buffers slows the sender, never fails it
	minRNRTimer = 12
)

// iface is rc_verbs on one port, progressed by one worker: a send CQ, a
// receive CQ, a shared receive queue of pre-posted registered buffers, and a
// completion channel whose fd sleeps in the Go netpoller.
//
// Locking: pollMu serialises CQ polling (Progress, Arm, Close); each ep has
// its own lock for posting. AM handlers and completions run inside Progress,
// under the worker's progress lock and pollMu, so they must not call
// Progress or Close.
type iface struct {
	md     *md
	w      *uct.Worker
	port   *portInfo
	tl     uct.TLResource
	params uct.IfaceParams
	cfg    *uct.Config
	attr   uct.IfaceAttr

	devAddr   []byte
	scope     *roceScope // RoCE: which peer IPs this GID reaches; nil on InfiniBand
	segSize   int
	txq       int
	maxInline int
	maxIOV    int
	rdAtomic  int

	uct.AMTable

	ch     *ibv.CompChannel
	chFile *os.File // dup of the channel's fd, parked in the netpoller
	evDone chan struct{}
	scq    *ibv.CQ
	rcq    *ibv.CQ
	srq    *ibv.SRQ
	rx     *mpool
	rxSegs []*seg // by receive wr_id
	bounce *mpool

	txCredits atomic.Int32 // free send CQ entries

	pollMu  sync.Mutex
	wcs     [pollBatch]ibv.WC
	swcs    [pollBatch]ibv.WC
	stashR  [pollBatch]ibv.WC // completions Arm found
	stashS  [pollBatch]ibv.WC
	nStashR int
	nStashS int
	repost  []ibv.RecvBuf
	fire    []doneEvent

	epMu  sync.Mutex
	eps   atomic.Pointer[[]*ep] // by slot, copy on write
	free  []int
	alive int
	dead  error // the device is gone (kill): no new endpoints; guarded by epMu

	pendMu  sync.Mutex
	pendEPs []*ep
	pendRun []*ep

	evStarted bool
	killed    atomic.Bool // the device is gone (md.kill): Progress and Arm do nothing
	closing   atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// doneEvent is a completion to fire, or (failed set) an endpoint failure to
// report to IfaceParams.ErrHandler, after the ep lock is released.
type doneEvent struct {
	comp   *uct.Completion
	err    error
	failed *ep
}

func (d *doneEvent) run(h func(uct.EP, error)) {
	if d.failed != nil {
		if h != nil {
			h(d.failed, d.err)
		}
		return
	}
	d.comp.Done(d.err)
}

func newIface(m *md, w *uct.Worker, port *portInfo, tl uct.TLResource, p uct.IfaceParams, cfg *uct.Config) (_ *iface, err error) {
	i := &iface{md: m, w: w, port: port, tl: tl, params: p, cfg: cfg, evDone: make(chan struct{})}
	i.segSize = max(cfg.IBSegSize, 64)
	i.txq = max(min(cfg.IBTxQueueLen, m.dattr.MaxQPWR), 16)
	i.maxIOV = max(min(m.dattr.MaxSGE-1, maxIOVLimit), 1)
	i.rdAtomic = max(min(m.dattr.MaxQPRdAtom, 16), 1)
	rxq := max(min(cfg.IBRxQueueLen, m.dattr.MaxSRQWR), 16)
	defer func() {
		if err != nil {
			i.release()
			err = fmt.Errorf("ib: open iface %s: %w", tl.Device, err)
		}
	}()
	m.devMu.RLock()
	defer m.devMu.RUnlock()
	if m.ctxClosed {
		return nil, m.gone()
	}
	if i.ch, err = m.ctx.CreateCompChannel(); err != nil {
		return nil, err
	}
	scqLen := min(max(4*i.txq, 4096), m.dattr.MaxCQE)
	if i.scq, err = m.ctx.CreateCQ(scqLen, i.ch); err != nil {
		return nil, err
	}
	i.txCredits.Store(int32(scqLen))
	if i.rcq, err = m.ctx.CreateCQ(min(rxq+64, m.dattr.MaxCQE), i.ch); err != nil {
		return nil, err
	}
	if i.srq, err = m.pd.CreateSRQ(rxq); err != nil {
		return nil, err
	}
	// The largest inline send a QP of this device accepts (probed once).
	for _, want := range []int{256, 128, 64, 0} {
		qp, err := m.pd.CreateQP(i.scq, i.rcq, i.srq, ibv.QPCaps{MaxSendWR: i.txq, MaxSendSGE: i.maxIOV + 1, MaxInline: want})
		if err == nil {
			i.maxInline = qp.MaxInline
			qp.Close()
			break
		}
		if want == 0 {
			return nil, err
		}
	}
	i.bounce = newMpool("bounce", m.pd, i.segSize, bounceSlab, max(4*i.txq, 1024), 0)
	i.rx = newMpool("receive", m.pd, i.segSize, rxSlab, rxq, ibv.AccessLocalWrite)
	i.rxSegs = make([]*seg, rxq)
	bufs := make([]ibv.RecvBuf, 0, rxq)
	for range rxq {
		s, err := i.rx.get()
		if err != nil {
			return nil, err
		}
		i.rxSegs[s.id] = s // ids are 0..rxq-1: the pool holds exactly rxq segments
		bufs = append(bufs, ibv.RecvBuf{Addr: s.addr, WRID: uint64(s.id), Len: uint32(i.segSize), LKey: s.lkey})
	}
	if err = i.srq.PostRecv(bufs); err != nil {
		return nil, err
	}
	i.repost = make([]ibv.RecvBuf, 0, 2*pollBatch)
	// The completion channel's fd sleeps in the Go netpoller, through a dup
	// so that the os.File and libibverbs each close their own descriptor
	// (O_NONBLOCK is shared by both).
	if err = unix.SetNonblock(i.ch.FD(), true); err != nil {
		return nil, fmt.Errorf("completion channel: %w", err)
	}
	dfd, err := unix.FcntlInt(uintptr(i.ch.FD()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("completion channel: %w", err)
	}
	i.chFile = os.NewFile(uintptr(dfd), "ibv-comp-channel")
	rc, err := i.chFile.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("completion channel: %w", err)
	}
	empty := []*ep{}
	i.eps.Store(&empty)
	i.devAddr = make([]byte, devAddrLen)
	i.devAddr[0] = port.attr.LinkLayer
	binary.LittleEndian.PutUint16(i.devAddr[1:], port.attr.LID)
	copy(i.devAddr[3:], port.gid.GID[:])
	if port.attr.LinkLayer == ibv.LinkLayerEthernet {
		i.scope = newRoCEScope(port.gid)
	}
	i.attr = i.makeAttr()
	i.evStarted = true
	go i.events(rc)
	w.Add(i)
	return i, nil
}

func (i *iface) makeAttr() uct.IfaceAttr {
	caps := uct.CapAMBcopy | uct.CapAMZcopy | uct.CapPutZcopy | uct.CapGetZcopy |
		uct.CapConnectToEP | uct.CapEvent | uct.CapPending
	maxShort := min(i.maxInline-8, i.segSize-8)
	if maxShort >= 0 {
		caps |= uct.CapAMShort
	} else {
		maxShort = 0
	}
	maxRMA := 1 << 30
	if m := int(i.port.attr.MaxMsgSize); m > 0 {
		maxRMA = min(maxRMA, m)
	}
	overhead := 75e-9
	minSpin := 0.0
	if i.port.rxeSW {
		overhead = 1e-6
		// Soft-RoCE in a 2-vCPU VM, 64 B Conn echo p50: 1.4 ms with the
		// default 50 µs Read spin, 132 µs with 500 µs, 111 µs with 2 ms
		// (scripts/vm-test.sh, BenchmarkRCVerbsEchoRTT64).
		minSpin = 500e-6
	}
	return uct.IfaceAttr{
		MinSpin:  minSpin,
		Cap:      caps,
		MaxShort: maxShort, MaxBcopy: i.segSize, MaxZcopy: i.segSize,
		MaxHeader: min(maxHeader, i.segSize), MaxIOV: i.maxIOV,
		MaxGet: maxRMA, MaxPut: maxRMA,
		Latency:       uct.LinearFunc{C: i.port.lat, M: 1e-9},
		Bandwidth:     uct.Bandwidth{Dedicated: i.port.bw},
		Overhead:      overhead,
		DeviceAddrLen: devAddrLen, IfaceAddrLen: 0, EPAddrLen: epAddrLen,
	}
}

func (i *iface) Attr() uct.IfaceAttr      { return i.attr }
func (i *iface) Resource() uct.TLResource { return i.tl }
func (i *iface) MD() uct.MD               { return i.md }
func (i *iface) DeviceAddress() []byte    { return i.devAddr }
func (i *iface) IfaceAddress() []byte     { return []byte{} }

// IsReachable: a device address of the same link layer; on InfiniBand also
// the same subnet (GID prefix) unless routed; on RoCE a peer IP this GID's
// netdev sends to (roceScope.reaches); RC endpoints need no iface address.
func (i *iface) IsReachable(devAddr, ifaceAddr []byte) bool {
	if len(devAddr) != devAddrLen || len(ifaceAddr) != 0 || devAddr[0] != i.devAddr[0] {
		return false
	}
	var gid [16]byte
	copy(gid[:], devAddr[3:])
	if gid == ([16]byte{}) && binary.LittleEndian.Uint16(devAddr[1:]) == 0 {
		return false
	}
	if devAddr[0] == ibv.LinkLayerEthernet {
		return gid != ([16]byte{}) && (i.scope == nil || i.scope.reaches(net.IP(gid[:])))
	}
	return string(devAddr[3:11]) == string(i.devAddr[3:11])
}

// CreateEP creates an unconnected RC endpoint (CapConnectToEP only).
func (i *iface) CreateEP(p uct.EPParams) (uct.EP, error) {
	if p.IfaceAddr != nil && len(p.IfaceAddr) > 0 {
		return nil, uct.NotSupported("rc_verbs: connect to iface")
	}
	if i.closing.Load() {
		return nil, fmt.Errorf("ib: create ep: %w", uct.ErrClosed)
	}
	if err := i.md.Failed(); err != nil {
		return nil, fmt.Errorf("ib: create ep: %w", err)
	}
	return newEP(i)
}

// Failed returns why the iface is unusable for good (its device was
// removed or failed), nil while it works. The runtime stops offering an
// iface that failed. Safe for concurrent use.
func (i *iface) Failed() error { return i.md.Failed() }

// addEP gives e a slot; its wr_ids carry the slot so send completions find
// it. It fails once the device is gone (kill).
func (i *iface) addEP(e *ep) error {
	i.epMu.Lock()
	defer i.epMu.Unlock()
	if i.dead != nil {
		return i.dead
	}
	old := *i.eps.Load()
	n := append([]*ep(nil), old...)
	if k := len(i.free); k > 0 {
		e.slot = i.free[k-1]
		i.free = i.free[:k-1]
		n[e.slot] = e
	} else {
		e.slot = len(n)
		n = append(n, e)
	}
	i.alive++
	i.eps.Store(&n)
	return nil
}

// removeEP frees e's slot once its QP is destroyed (no completion can name it).
func (i *iface) removeEP(e *ep) {
	i.epMu.Lock()
	defer i.epMu.Unlock()
	old := *i.eps.Load()
	n := append([]*ep(nil), old...)
	n[e.slot] = nil
	i.free = append(i.free, e.slot)
	i.alive--
	i.eps.Store(&n)
}

func (i *iface) epBySlot(s int) *ep {
	eps := *i.eps.Load()
	if s < 0 || s >= len(eps) {
		return nil
	}
	return eps[s]
}

// takeCredit reserves a send CQ entry.
func (i *iface) takeCredit() bool {
	for {
		c := i.txCredits.Load()
		if c <= 0 {
			return false
		}
		if i.txCredits.CompareAndSwap(c, c-1) {
			return true
		}
	}
}

// addPending remembers that e has queued requests.
func (i *iface) addPending(e *ep) {
	i.pendMu.Lock()
	if !e.inPend {
		e.inPend = true
		i.pendEPs = append(i.pendEPs, e)
	}
	i.pendMu.Unlock()
}

// dispatchPending runs the queued requests of every endpoint waiting for
// resources (send completions freed some). Called on the worker.
func (i *iface) dispatchPending() {
	i.pendMu.Lock()
	if len(i.pendEPs) == 0 {
		i.pendMu.Unlock()
		return
	}
	run := append(i.pendRun[:0], i.pendEPs...)
	for _, e := range i.pendEPs {
		e.inPend = false
	}
	clear(i.pendEPs)
	i.pendEPs = i.pendEPs[:0]
	i.pendMu.Unlock()
	for _, e := range run {
		e.dispatch()
	}
	clear(run)
	i.pendRun = run[:0]
}

// events parks the completion channel's fd in the Go netpoller; on each
// readiness it reads and acknowledges the events and wakes the worker, until
// Close closes the file.
func (i *iface) events(rc syscall.RawConn) {
	defer close(i.evDone)
	sh, rh := i.scq.Handle(), i.rcq.Handle()
	var gerr error
	read := func(uintptr) bool { // reads every pending event; false: wait for readiness
		got := false
		for {
			h, err := i.ch.GetEvent()
			if errors.Is(err, syscall.EAGAIN) {
				return got
			}
			if err != nil {
				gerr = err
				return true
			}
			got = true
			switch h {
			case sh:
				i.scq.AckEvents(1)
			case rh:
				i.rcq.AckEvents(1)
			}
		}
	}
	// The read deadline wakes this goroutine every watchPeriod, busy or
	// idle, to check the device (md.check: async events, removal).
	i.chFile.SetReadDeadline(time.Now().Add(watchPeriod))
	for {
		err := rc.Read(read)
		if errors.Is(err, os.ErrDeadlineExceeded) && gerr == nil {
			i.md.check()
			i.chFile.SetReadDeadline(time.Now().Add(watchPeriod))
			continue
		}
		if err != nil || gerr != nil {
			return
		}
		i.w.Wake()
		// Let the woken worker run now, on this P (it sits in runnext).
		runtime.Gosched()
	}
}

// Progress polls both CQs once: receives run AM handlers and are re-posted,
// send completions release resources, fire completions and flushes, and
// dispatch pending requests. Called by the worker.
func (i *iface) Progress() int {
	if i.killed.Load() {
		return 0
	}
	i.pollMu.Lock()
	if i.scq == nil || i.killed.Load() {
		i.pollMu.Unlock()
		return 0
	}
	nr, ns := 0, 0
	if i.nStashR > 0 || i.nStashS > 0 {
		nr += i.handleRecv(i.stashR[:i.nStashR])
		ns += i.handleSend(i.stashS[:i.nStashS])
		i.nStashR, i.nStashS = 0, 0
	}
	// One cgo crossing polls both CQs.
	r, s, err := ibv.PollBoth(i.rcq, i.wcs[:], i.scq, i.swcs[:])
	if err == nil {
		if r > 0 {
			nr += i.handleRecv(i.wcs[:r])
		}
		if s > 0 {
			ns += i.handleSend(i.swcs[:s])
		}
	}
	if len(i.repost) >= 16 || (r == 0 && len(i.repost) > 0) {
		// Re-post in batches (one crossing), at the latest when idle.
		// An error here means the SRQ is gone (device failure); the
		// buffers stay with the pool and the iface stops receiving.
		i.srq.PostRecv(i.repost)
		i.repost = i.repost[:0]
	}
	i.pollMu.Unlock()
	if ns > 0 {
		i.dispatchPending()
	}
	return nr + ns
}

func (i *iface) handleRecv(wcs []ibv.WC) int {
	for k := range wcs {
		wc := &wcs[k]
		if wc.WRID >= uint64(len(i.rxSegs)) || i.rxSegs[wc.WRID] == nil {
			continue // not ours: never happens with a sane provider
		}
		s := i.rxSegs[wc.WRID]
		if wc.Status == ibv.WCSuccess && wc.ByteLen <= uint32(len(s.buf)) && wc.Imm < uct.MaxAMID {
			if h := i.Handler(uint8(wc.Imm)); h != nil {
				h(s.buf[:wc.ByteLen])
			}
		}
		if !i.closing.Load() {
			i.repost = append(i.repost, ibv.RecvBuf{Addr: s.addr, WRID: wc.WRID, Len: uint32(i.segSize), LKey: s.lkey})
		}
	}
	return len(wcs)
}

func (i *iface) handleSend(wcs []ibv.WC) int {
	for k := range wcs {
		wc := &wcs[k]
		i.txCredits.Add(1)
		if e := i.epBySlot(int(wc.WRID >> 32)); e != nil {
			e.complete(wc)
		}
	}
	for k := range i.fire {
		i.fire[k].run(i.params.ErrHandler)
	}
	clear(i.fire)
	i.fire = i.fire[:0]
	return len(wcs)
}

// Arm requests a completion event on both CQs, then polls once more: a
// completion that arrived before arming raises no event, so Arm keeps it for
// the next Progress and returns false. Called by the worker.
func (i *iface) Arm() bool {
	if i.killed.Load() {
		return true
	}
	i.pollMu.Lock()
	defer i.pollMu.Unlock()
	if i.scq == nil || i.killed.Load() {
		return true
	}
	if i.nStashR > 0 || i.nStashS > 0 {
		return false
	}
	if i.scq.ReqNotify() != nil || i.rcq.ReqNotify() != nil {
		return false
	}
	i.nStashR, i.nStashS, _ = ibv.PollBoth(i.rcq, i.stashR[:], i.scq, i.stashS[:])
	return i.nStashR == 0 && i.nStashS == 0
}

// Close closes every endpoint (operations in flight complete with
// ErrCanceled), drains their completions, and releases the CQs, SRQ,
// channel and buffers. Idempotent; must not be called from a handler.
func (i *iface) Close() error {
	i.closeOnce.Do(func() {
		i.closing.Store(true)
		for _, e := range *i.eps.Load() {
			if e != nil {
				e.Close()
			}
		}
		// Drain: flushed completions arrive quickly once the QPs are in
		// the error state; progress them on the worker's lock.
		deadline := time.Now().Add(5 * time.Second)
		for {
			i.epMu.Lock()
			alive := i.alive
			i.epMu.Unlock()
			if alive == 0 || time.Now().After(deadline) {
				break
			}
			i.w.Progress()
			time.Sleep(50 * time.Microsecond)
		}
		i.w.Remove(i)
		for _, e := range *i.eps.Load() {
			if e != nil {
				e.abandon() // drain timed out: destroy anyway, fail what is left
			}
		}
		i.pollMu.Lock()
		i.closeErr = i.release()
		i.pollMu.Unlock()
		i.md.ifaceClosed(i)
	})
	return i.closeErr
}

// stop is md.kill's first phase for one iface: progress stops polling
// (no more handlers or completions), every endpoint fails with err (through
// IfaceParams.ErrHandler, on the worker) and its QP is destroyed,
// operations in flight complete with err, and the event goroutine ends.
// md.kill then releases the CQs, SRQ, channel and buffers (release) with
// the device lock held. The iface stays registered with its worker, idle,
// until Close.
func (i *iface) stop(err error) {
	i.killed.Store(true)
	i.pollMu.Lock() // wait out a Progress or Arm in flight
	i.pollMu.Unlock()
	i.epMu.Lock()
	i.dead = err
	eps := *i.eps.Load()
	i.epMu.Unlock()
	var fire []doneEvent
	for _, e := range eps {
		if e != nil {
			fire = e.kill(err, fire)
		}
	}
	// The event goroutine reads the channel: stop it before the channel
	// goes (stop never runs on it).
	i.pollMu.Lock()
	if i.chFile != nil {
		i.chFile.Close()
		if i.evStarted {
			<-i.evDone
		}
		i.chFile = nil
	}
	i.pollMu.Unlock()
	h := i.params.ErrHandler
	i.w.Post(func() {
		for k := range fire {
			fire[k].run(h)
		}
		for _, e := range eps {
			if e != nil {
				e.dispatch() // queued requests see the error
			}
		}
	})
}

// release frees every verbs resource (called once, without endpoints).
func (i *iface) release() error {
	var errs []error
	if i.chFile != nil {
		i.chFile.Close() // ends the events goroutine's Read
		if i.evStarted {
			<-i.evDone
		}
		i.chFile = nil
	}
	errs = append(errs, i.srq.Close(), i.scq.Close(), i.rcq.Close(), i.ch.Close())
	i.srq, i.scq, i.rcq, i.ch = nil, nil, nil, nil
	if i.bounce != nil {
		errs = append(errs, i.bounce.close())
	}
	if i.rx != nil {
		errs = append(errs, i.rx.close())
	}
	return errors.Join(errs...)
}
