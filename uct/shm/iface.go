//go:build linux

package shm

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gouct/gouct/uct"
)

// Iface address (little-endian), 16 bytes:
//
//	| off | size | field                                            |
//	|   0 |    4 | pid of the owning process                        |
//	|   4 |    4 | fd of the FIFO memfd in that process (proc link) |
//	|   8 |    8 | nonce: matches the FIFO header and doorbell name |
const ifaceAddrLen = 16

const (
	maxBatch  = 64  // elements one Progress call delivers at most
	maxHeader = 128 // AMZcopy header bytes
	maxIOV    = 16  // iov elements of zero-copy operations
	maxRMA    = 1 << 30
)

// Backoff of the timer that re-polls a full peer FIFO while the worker
// sleeps: the fallback when the room doorbell (fifo.go) is not rung. Vars
// for tests.
var (
	minBackoff = 20 * time.Microsecond
	maxBackoff = time.Millisecond
)

type remoteKey struct {
	pid   int
	nonce uint64
}

// remote is a peer iface's FIFO mapped into this process, shared by every
// endpoint of one local iface to it and refcounted under iface.mu; it is
// unmapped when the last endpoint closes.
type remote struct {
	key   remoteKey
	f     *fifo
	local *iface // the peer iface when it is in this process, else nil
	bell  int    // datagram socket connected to the peer's doorbell
	pidfd int    // -1 when pidfd_open is unavailable
	refs  int
	dead  atomic.Bool
	// checked is when alive last asked the kernel (ns since procStart):
	// senders retrying on a full FIFO must not pay a syscall per attempt.
	checked atomic.Int64
}

var procStart = time.Now()

// aliveCheckEvery bounds how often alive polls the peer's pidfd.
const aliveCheckEvery = int64(time.Millisecond)

var bellByte = [1]byte{1}

// localIfaces lets a sender wake a peer iface of its own process directly:
// a doorbell through the netpoller is only seen when the scheduler polls
// the network, which a process whose goroutines spin may not do for
// milliseconds.
var (
	localMu     sync.RWMutex
	localIfaces = map[uint64]*iface{}
	// directLocalWake is false only in tests of the socket doorbell.
	directLocalWake = true
)

// kick rings the peer's doorbell if it announced sleep and this producer
// wins the flag (see fifo.go): one atomic load when the peer is awake.
func (r *remote) kick() {
	s := r.f.sleep()
	if atomic.LoadUint32(s) != 0 && atomic.CompareAndSwapUint32(s, 1, 0) {
		if r.local != nil {
			r.local.w.Wake()
			return
		}
		// EAGAIN: the peer's doorbell queue is full, so a wake-up is pending
		// anyway. ECONNREFUSED: the peer closed its iface or died.
		if _, err := unix.Write(r.bell, bellByte[:]); err == unix.ECONNREFUSED {
			r.dead.Store(true)
		}
	}
}

// alive reports whether the peer process still exists: a poll of its
// pidfd at most every aliveCheckEvery, else the last answer. Slow paths only.
func (r *remote) alive() bool {
	if r.dead.Load() {
		return false
	}
	if atomic.LoadUint32(r.f.closed()) != 0 { // the peer closed its iface
		r.dead.Store(true)
		return false
	}
	now := int64(time.Since(procStart))
	last := r.checked.Load()
	if now-last < aliveCheckEvery || !r.checked.CompareAndSwap(last, now) {
		return true
	}
	if r.pidfd >= 0 {
		fds := [1]unix.PollFd{{Fd: int32(r.pidfd), Events: unix.POLLIN}}
		if n, _ := unix.Poll(fds[:], 0); n > 0 {
			r.dead.Store(true)
		}
	} else if unix.Kill(r.key.pid, 0) == unix.ESRCH {
		r.dead.Store(true)
	}
	return !r.dead.Load()
}

func (r *remote) close() {
	r.f.unmap()
	unix.Close(r.bell)
	if r.pidfd >= 0 {
		unix.Close(r.pidfd)
	}
}

// iface owns one receive FIFO and its doorbell. Every method is safe for
// concurrent use; Progress and Arm are for the worker.
type iface struct {
	md      *md
	w       *uct.Worker
	params  uct.IfaceParams
	rx      *fifo
	memfd   int
	pid     int
	nonce   uint64
	addr    []byte
	devAddr []byte
	rmaErr  error // why GetZcopy/PutZcopy are off, or nil

	// tail is the consumer's next ticket. Progress (under the worker's
	// progress lock) stores it after each element; Arm reads it.
	tail atomic.Uint64
	// armState guards Arm against Close: the worker may call Arm on an
	// iface list loaded before Worker.Remove (which only waits out
	// Progress). Closed bit (epClosed) plus Arm calls in flight.
	armState atomic.Int64
	uct.AMTable

	bell     *net.UnixConn
	bellDone chan struct{}
	// roomBell is an unconnected datagram socket through which Progress
	// rings a producer waiting for room (room protocol, fifo.go); the
	// last address rung is cached (progress lock only).
	roomBell  int
	roomNonce uint64
	roomAddr  *unix.SockaddrUnix

	mu      sync.Mutex
	remotes map[remoteKey]*remote
	eps     map[*ep]struct{}
	closed  bool

	// Endpoints with pending requests: re-checked on every Progress, and
	// by a backoff timer while the worker sleeps (a peer consumer cannot
	// ring us when it frees room).
	pendMu      sync.Mutex
	pendEPs     []*ep
	npend       atomic.Int32
	pendScratch []*ep // progress lock only
	armScratch  []*ep // Arm only
	pendTimer   *time.Timer
	// A reserved element that stays unpublished (checkStuck): its ticket,
	// since when and polls of it (progress lock only), and a timer
	// re-polling while parked, which also asks for a clock reading.
	stuckT        uint64
	stuckAt       time.Time
	stuckPolls    uint32
	stuckDue      atomic.Bool
	stuckTimer    *time.Timer
	deadProducers atomic.Uint64
	backoff       atomic.Int64 // ns before the timer re-polls a full peer FIFO

	bad       atomic.Uint64 // malformed elements dropped
	unhandled atomic.Uint64 // elements for an AM id without handler
}

func newIface(m *md, w *uct.Worker, p uct.IfaceParams) (*iface, error) {
	cfg := p.Config
	if cfg == nil {
		cfg = w.Config()
	}
	devAddr, err := hostIdentity()
	if err != nil {
		return nil, fmt.Errorf("shm: open iface: %v: %w", err, uct.ErrUnavailable)
	}
	var nb [8]byte
	if _, err := rand.Read(nb[:]); err != nil {
		return nil, fmt.Errorf("shm: open iface: nonce: %w", err)
	}
	i := &iface{md: m, w: w, params: p, pid: os.Getpid(), nonce: binary.LittleEndian.Uint64(nb[:]),
		devAddr: devAddr, rmaErr: rmaSupported(), bellDone: make(chan struct{}),
		remotes: map[remoteKey]*remote{}, eps: map[*ep]struct{}{}}
	i.rx, i.memfd, err = createFIFO(cfg.ShmFifoSize, cfg.ShmSegSize, i.nonce)
	if err != nil {
		return nil, fmt.Errorf("shm: open iface: %w", err)
	}
	i.bell, err = net.ListenUnixgram("unixgram", &net.UnixAddr{Name: doorbellName(i.pid, i.nonce), Net: "unixgram"})
	if err != nil {
		i.rx.unmap()
		unix.Close(i.memfd)
		return nil, fmt.Errorf("shm: open iface: doorbell: %w", err)
	}
	i.roomBell, err = unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		i.bell.Close()
		i.rx.unmap()
		unix.Close(i.memfd)
		return nil, fmt.Errorf("shm: open iface: room doorbell socket: %w", err)
	}
	i.addr = binary.LittleEndian.AppendUint32(nil, uint32(i.pid))
	i.addr = binary.LittleEndian.AppendUint32(i.addr, uint32(i.memfd))
	i.addr = binary.LittleEndian.AppendUint64(i.addr, i.nonce)
	i.backoff.Store(int64(minBackoff))
	i.pendTimer = time.AfterFunc(time.Hour, w.Wake)
	i.pendTimer.Stop()
	i.stuckTimer = time.AfterFunc(time.Hour, func() { i.stuckDue.Store(true); w.Wake() })
	i.stuckTimer.Stop()
	go i.doorbell()
	localMu.Lock()
	localIfaces[i.nonce] = i
	localMu.Unlock()
	w.Add(i)
	return i, nil
}

// doorbell parks in the netpoller on the doorbell socket and wakes the
// worker for each datagram, until Close.
func (i *iface) doorbell() {
	defer close(i.bellDone)
	var buf [16]byte
	for {
		if _, err := i.bell.Read(buf[:]); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Not expected on a datagram socket; poll anyway in case a
			// doorbell hid behind it, without spinning on a lasting error.
			i.w.Wake()
			time.Sleep(time.Millisecond)
			continue
		}
		i.w.Wake()
		// Poll once here too unless the worker already is: this goroutine
		// is the one the netpoller just ran, the worker may need another
		// thread wake-up to get a processor (tens of µs on a busy host).
		i.w.TryProgress()
	}
}

func (i *iface) Attr() uct.IfaceAttr {
	seg := i.rx.seg
	a := uct.IfaceAttr{
		Cap: uct.CapAMShort | uct.CapAMBcopy | uct.CapAMZcopy | uct.CapConnectToIface |
			uct.CapEvent | uct.CapPending,
		MaxShort: seg - 8, MaxBcopy: seg, MaxZcopy: seg, MaxHeader: min(maxHeader, seg), MaxIOV: maxIOV,
		// One-way latency of a polled ring between two processes and the
		// bandwidth of the two-copy ring (DESIGN.md "Calibration", far placement).
		Latency:       uct.LinearFunc{C: 700e-9},
		Bandwidth:     uct.Bandwidth{Dedicated: 5e9},
		Overhead:      40e-9,
		DeviceAddrLen: devAddrLen, IfaceAddrLen: ifaceAddrLen,
		Priority: 5,
	}
	if i.rmaErr == nil {
		a.Cap |= uct.CapGetZcopy | uct.CapPutZcopy
		a.MaxGet, a.MaxPut = maxRMA, maxRMA
	}
	return a
}

func (i *iface) Resource() uct.TLResource {
	return uct.TLResource{TL: tlName, Device: deviceName, Type: uct.DeviceShm}
}
func (i *iface) MD() uct.MD            { return i.md }
func (i *iface) DeviceAddress() []byte { return i.devAddr }
func (i *iface) IfaceAddress() []byte  { return i.addr }

func parseIfaceAddr(b []byte) (pid, fd int, nonce uint64, ok bool) {
	if len(b) != ifaceAddrLen {
		return 0, 0, 0, false
	}
	pid = int(binary.LittleEndian.Uint32(b))
	fd = int(int32(binary.LittleEndian.Uint32(b[4:])))
	return pid, fd, binary.LittleEndian.Uint64(b[8:]), pid > 0 && fd >= 0
}

// IsReachable is true for a well-formed iface address of a live process on
// the same host, user and namespaces.
func (i *iface) IsReachable(devAddr, ifaceAddr []byte) bool {
	if string(devAddr) != string(i.devAddr) {
		return false
	}
	pid, _, _, ok := parseIfaceAddr(ifaceAddr)
	return ok && unix.Kill(pid, 0) == nil
}

// CreateEP connects to a peer iface: maps its FIFO (once per peer) and
// connects to its doorbell.
func (i *iface) CreateEP(p uct.EPParams) (uct.EP, error) {
	if p.IfaceAddr == nil {
		return nil, uct.NotSupported("shm: connect to ep")
	}
	if string(p.DevAddr) != string(i.devAddr) {
		return nil, fmt.Errorf("shm: peer on another host, user or namespace: %w", uct.ErrUnreachable)
	}
	pid, fd, nonce, ok := parseIfaceAddr(p.IfaceAddr)
	if !ok {
		return nil, fmt.Errorf("shm: malformed iface address: %w", uct.ErrUnreachable)
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.closed {
		return nil, fmt.Errorf("shm: create ep: %w", uct.ErrClosed)
	}
	r, err := i.acquireLocked(remoteKey{pid: pid, nonce: nonce}, fd)
	if err != nil {
		return nil, fmt.Errorf("shm: connect to pid %d: %v: %w", pid, err, uct.ErrUnreachable)
	}
	e := &ep{iface: i, rem: r, f: r.f}
	i.eps[e] = struct{}{}
	return e, nil
}

func (i *iface) acquireLocked(k remoteKey, fd int) (*remote, error) {
	if r := i.remotes[k]; r != nil {
		r.refs++
		return r, nil
	}
	f, err := openFIFO(k.pid, fd, k.nonce)
	if err != nil {
		return nil, err
	}
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		f.unmap()
		return nil, fmt.Errorf("doorbell socket: %w", err)
	}
	if err := unix.Connect(s, &unix.SockaddrUnix{Name: doorbellName(k.pid, k.nonce)}); err != nil {
		f.unmap()
		unix.Close(s)
		return nil, fmt.Errorf("connect doorbell: %w", err)
	}
	pidfd, err := unix.PidfdOpen(k.pid, 0)
	if err != nil {
		pidfd = -1
	}
	r := &remote{key: k, f: f, bell: s, pidfd: pidfd, refs: 1}
	if k.pid == i.pid && directLocalWake {
		localMu.RLock()
		r.local = localIfaces[k.nonce]
		localMu.RUnlock()
	}
	i.remotes[k] = r
	return r, nil
}

func (i *iface) releaseLocked(r *remote) {
	if r.refs--; r.refs == 0 {
		delete(i.remotes, r.key)
		r.close()
	}
}

// Progress delivers up to maxBatch published elements to their handlers,
// releasing each after its handler returns, then dispatches pending
// requests of endpoints whose peer FIFO has room. Worker only.
func (i *iface) Progress() int {
	f := i.rx
	t := i.tail.Load()
	n := 0
	for n < maxBatch && f.ready(t) {
		i.deliver(t)
		f.release(t)
		t++
		n++
		i.tail.Store(t) // before the next ready check: Arm relies on it
	}
	if n > 0 {
		atomic.StoreUint64(f.tail(), t)
		if pid, nonce := f.takeWaiter(); nonce != 0 {
			i.ringRoom(pid, nonce)
		}
	}
	if n == 0 && atomic.LoadUint64(f.head()) != t {
		n += i.checkStuck(t)
	}
	if i.npend.Load() != 0 {
		n += i.progressPending()
	}
	return n
}

// stuckAfter is how long the next element may stay reserved but
// unpublished before the consumer asks whether its producer died.
const stuckAfter = 20 * time.Millisecond

// checkStuck handles ticket t reserved but not published: after stuckAfter
// (and then at most every stuckAfter) it checks the reserving process, and
// pads the element when that process is dead (fifo.go "Dead producers").
// It returns 1 when it padded the element. Worker only. The common case is
// a producer in the middle of its copy, polled by a spinning consumer, so
// the clock is read only every stuckClockPolls polls of the same ticket, or
// when the stuck timer of a parked worker fired.
func (i *iface) checkStuck(t uint64) int {
	if i.stuckT != t {
		i.stuckT, i.stuckAt, i.stuckPolls = t, time.Time{}, 0
	}
	i.stuckPolls++
	if i.stuckPolls%stuckClockPolls != 0 && !i.stuckDue.Load() {
		return 0
	}
	i.stuckDue.Store(false)
	now := time.Now()
	if i.stuckAt.IsZero() {
		i.stuckAt = now
		return 0
	}
	if now.Sub(i.stuckAt) < stuckAfter {
		return 0
	}
	i.stuckAt = now
	if !i.rx.deadOwner(t) {
		return 0
	}
	i.deadProducers.Add(1)
	i.rx.publish(t, 0, flagPad, 0)
	return 1
}

// stuckClockPolls: polls of one unpublished ticket between clock readings
// (a poll takes tens of nanoseconds; a reading as much).
const stuckClockPolls = 256

// ringRoom wakes the producer iface (pid, nonce) that waits for room in
// our FIFO: directly when it is in this process, else through its doorbell
// (a missing or full doorbell is ignored: the producer's backoff timer
// remains). The values come from shared memory: at worst a spurious wake
// of some gouct iface of this user. Under the progress lock.
func (i *iface) ringRoom(pid int, nonce uint64) {
	if pid == i.pid && directLocalWake {
		localMu.RLock()
		p := localIfaces[nonce]
		localMu.RUnlock()
		if p != nil {
			p.w.Wake()
			return
		}
	}
	if nonce != i.roomNonce || i.roomAddr == nil {
		i.roomNonce, i.roomAddr = nonce, &unix.SockaddrUnix{Name: doorbellName(pid, nonce)}
	}
	unix.Sendto(i.roomBell, bellByte[:], 0, i.roomAddr)
}

// deliver runs the handler of ticket t; malformed elements are counted and dropped.
func (i *iface) deliver(t uint64) {
	f := i.rx
	id, flags, n := f.msg(t)
	switch {
	case flags == flagPad:
	case flags != 0 || id >= uct.MaxAMID || n > uint32(f.seg):
		i.bad.Add(1)
	default:
		if h := i.Handler(id); h != nil {
			h(f.data(t)[:n])
		} else {
			i.unhandled.Add(1)
		}
	}
}

// Arm implements the consumer half of the park protocol (fifo.go). With
// pending requests it also arms the backoff timer: the peer consumer cannot
// ring us when it frees room. Worker only.
func (i *iface) Arm() bool {
	if i.armState.Add(1)&epClosed != 0 {
		i.armState.Add(-1)
		return true // closed: no events to report
	}
	defer i.armState.Add(-1)
	f := i.rx
	s := f.sleep()
	atomic.StoreUint32(s, 1)
	if f.ready(i.tail.Load()) {
		// Take the flag back; if a producer got it first, its doorbell is
		// on its way and the doorbell goroutine absorbs it (one spurious wake).
		atomic.CompareAndSwapUint32(s, 1, 0)
		return false
	}
	if atomic.LoadUint64(f.head()) != i.tail.Load() {
		// Reserved but unpublished: its producer rings when it publishes,
		// unless it died; re-poll later to find out (checkStuck).
		i.stuckTimer.Reset(stuckAfter)
	}
	if i.npend.Load() != 0 {
		if i.pendingRunnable() {
			i.backoff.Store(int64(minBackoff))
			return false
		}
		d := time.Duration(i.backoff.Load())
		i.pendTimer.Reset(d)
		i.backoff.Store(int64(min(2*d, maxBackoff)))
	}
	return true
}

// addPending lists e as having pending requests and wakes the worker so a
// parked worker re-arms with the backoff timer.
func (i *iface) addPending(e *ep) {
	i.pendMu.Lock()
	if !e.listed {
		e.listed = true
		i.pendEPs = append(i.pendEPs, e)
		i.npend.Add(1)
	}
	i.pendMu.Unlock()
	i.w.Wake()
}

func (i *iface) removePending(e *ep) {
	i.pendMu.Lock()
	i.removePendingLocked(e)
	i.pendMu.Unlock()
}

func (i *iface) removePendingLocked(e *ep) {
	if !e.listed {
		return
	}
	e.listed = false
	for k, x := range i.pendEPs {
		if x == e {
			last := len(i.pendEPs) - 1
			i.pendEPs[k] = i.pendEPs[last]
			i.pendEPs[last] = nil
			i.pendEPs = i.pendEPs[:last]
			break
		}
	}
	i.npend.Add(-1)
}

// pendingRunnable reports whether a pending endpoint has room or a dead
// peer (its requests then fail and leave the queue). Worker only.
func (i *iface) pendingRunnable() bool {
	i.pendMu.Lock()
	i.armScratch = append(i.armScratch[:0], i.pendEPs...)
	i.pendMu.Unlock()
	run := false
	for _, e := range i.armScratch {
		if !e.enter() {
			run = true // closed: Progress drops it from the list
			continue
		}
		e.f.wantRoom(i.pid, i.nonce) // then re-check (room protocol)
		if e.f.hasRoom() || !e.rem.alive() {
			run = true
		}
		e.leave()
	}
	clear(i.armScratch)
	return run
}

// progressPending dispatches the pending requests of endpoints whose peer
// FIFO has room (or whose peer died: the retried sends fail and are
// dropped). Under the progress lock.
func (i *iface) progressPending() int {
	i.pendMu.Lock()
	i.pendScratch = append(i.pendScratch[:0], i.pendEPs...)
	i.pendMu.Unlock()
	n := 0
	for _, e := range i.pendScratch {
		if !e.enter() {
			i.removePending(e)
			continue
		}
		run := e.f.hasRoom() || e.rem.dead.Load()
		e.leave()
		if run {
			n += e.pending.Dispatch()
		}
		i.pendMu.Lock()
		if e.pending.Len() == 0 {
			i.removePendingLocked(e)
		}
		i.pendMu.Unlock()
	}
	clear(i.pendScratch)
	if n > 0 {
		i.backoff.Store(int64(minBackoff))
	}
	return n
}

// Close closes the iface's endpoints, detaches it from the worker, stops
// the doorbell and unmaps the FIFO. Peers that mapped it keep their mapping
// until they close their endpoints; nothing waits for them.
func (i *iface) Close() error {
	i.mu.Lock()
	if i.closed {
		i.mu.Unlock()
		return nil
	}
	i.closed = true
	eps := make([]*ep, 0, len(i.eps))
	for e := range i.eps {
		eps = append(eps, e)
	}
	i.mu.Unlock()
	for _, e := range eps {
		e.Close()
	}
	localMu.Lock()
	delete(localIfaces, i.nonce)
	localMu.Unlock()
	i.w.Remove(i)
	for i.armState.Add(epClosed) != epClosed { // wait out an Arm in flight
		i.armState.Add(-epClosed)
		runtime.Gosched()
	}
	i.pendTimer.Stop()
	i.stuckTimer.Stop()
	atomic.StoreUint32(i.rx.closed(), 1) // senders still mapping it get ErrEndpointReset
	errs := []error{i.bell.Close()}
	<-i.bellDone
	errs = append(errs, i.rx.unmap(), unix.Close(i.memfd), unix.Close(i.roomBell))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("shm: close iface: %w", err)
	}
	return nil
}

// stats returns the counts of malformed and unhandled elements dropped.
func (i *iface) stats() (bad, unhandled uint64) { return i.bad.Load(), i.unhandled.Load() }
