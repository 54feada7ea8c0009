package stream

import (
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gouct/gouct/uct"
)

// Liveness notices: the only bytes a Conn writes on its ctl socket, once,
// just before closing it. A peer that sees ctl end without a notice resets
// the conn (peer death).
const (
	// noticeClose: closed gracefully. Every byte written and the FIN were
	// handed to the transport and flushed before this notice, so the reader
	// keeps reading until FIN; it stops accepting Writes to the closer.
	noticeClose byte = 'C'
	// noticeReset: aborted; the conn is reset at once.
	noticeReset byte = 'R'
)

// finGrace bounds how long FIN may take to arrive after noticeClose (a var
// for tests).
var finGrace = 5 * time.Second

// Timing of Close and liveness.
const (
	closeTimeout = 2 * time.Second        // Close's bound on sending FIN and flushing
	ctlWriteTime = 1 * time.Second        // bound on writing the notice
	abortWait    = 100 * time.Millisecond // Abort's bound on sending RST
)

// Conn is a byte stream over active messages: a net.Conn. Read, Write,
// deadlines, Close, CloseWrite and Abort may be called from any goroutine at
// any time. Reads are serialised with each other, Writes with each other
// (each Write is atomic with respect to other Writes); a Read and a Write
// run concurrently.
type Conn struct {
	mux   *Mux
	id    uint32
	batch int // credit return threshold: window/4

	// Set by Start under sendMu and mu; read by senders under sendMu, by
	// Read/Write after Start (the conn is handed out after Start).
	ep            uct.EP
	peerID        uint32
	ctl           net.Conn
	local, remote net.Addr

	rdMu sync.Mutex // serialises Reads; guards the reader-owned fields below

	wrMu sync.Mutex // serialises Writes; guards the writer-owned fields below

	sendMu   sync.Mutex // serialises EP sends; guards the send staging fields
	ctlDirty atomic.Bool

	mu          sync.Mutex // guards the state below; handlers take it
	started     bool
	rx          rxQueue
	rxAllowed   int  // DATA bytes the peer may still send
	owed        int  // consumed bytes not yet granted back
	forceCredit bool // send owed credit even below batch
	txCredit    int  // DATA bytes we may still send
	finRecv     bool
	rndvRx      rndvRecv
	// A blocked Read's buffer: while the receive queue is empty, DATA is
	// copied straight into rdPost[:rdPostN] (one copy fewer). Set by the
	// reader just before it waits, taken back (and cleared) by the reader
	// under mu before Read returns, so nothing writes into it afterwards.
	rdPost  []byte
	rdPostN int
	rndvTx  struct {
		active, done bool
		token        uint32
	}
	atsOwed    bool
	atsToken   uint32
	finOwed    bool
	finSent    bool
	rstOwed    bool
	rstSent    bool
	rstCode    uint32
	sendBroken bool  // a control send failed for good (endpoint or peer gone)
	err        error // reset: fails Read and Write
	peerClosed bool  // noticeClose seen: Writes fail
	closed     bool  // Close or Abort called
	wrClosed   bool  // CloseWrite or Close called
	released   bool
	graceTimer *time.Timer

	done     chan struct{} // closed on Close, Abort or reset: wakes every blocked call
	doneOnce sync.Once
	rdWake   chan struct{} // 1 slot: handlers signal the reader
	wrWake   chan struct{} // 1 slot: handlers signal the writer
	rdDL     *deadline
	wrDL     *deadline

	wrPend, rdPend, ctlPend    uct.PendingReq
	wrPendQ, rdPendQ, ctlPendQ atomic.Bool
	kickFn                     func()

	// Send staging (sendMu).
	packHdr  uint64
	packBody []byte
	packFn   func([]byte) int
	ctlBody  *[4]byte // its own pointer-free allocation: transports may hand it to C (cgo pointer rules)

	// Writer-owned (wrMu).
	rtsBuf    []byte
	nextToken uint32
	pinner    runtime.Pinner

	// Reader-owned (rdMu).
	getComp  uct.Completion
	getDone  atomic.Bool
	getErr   error
	iov      [1]uct.IOV
	rndvWant atomic.Bool  // a rendezvous is being received (mirror of rndvRx.active)
	rxn      atomic.Int64 // mirror of rx.n, for the puller's budget
	pulling  atomic.Bool  // the puller goroutine runs
	pullFn   func()       // c.pullAhead, bound once

	ctlDone     chan struct{}
	failNoticed atomic.Bool // EndpointFailed sent the reset notice on ctl
	releaseOnce sync.Once

	bytesRead, bytesWritten     atomic.Uint64
	msgShort, msgBcopy, msgRndv atomic.Uint64
}

// rndvRecv is an incoming rendezvous: the handler fills it (while inactive)
// and the reader pulls from it (while active) without the lock.
type rndvRecv struct {
	active bool
	token  uint32
	addr   uint64
	length uint64
	off    uint64
	rkey   []byte
}

func newConn(m *Mux, id uint32) *Conn {
	c := &Conn{
		mux: m, id: id, batch: m.window / 4,
		rxAllowed: initialCredit, txCredit: initialCredit,
		done: make(chan struct{}), rdWake: make(chan struct{}, 1), wrWake: make(chan struct{}, 1),
		rdDL: newDeadline(), wrDL: newDeadline(),
	}
	c.ctlBody = new([4]byte)
	c.packFn = c.pack
	c.kickFn = c.kickCtl
	c.pullFn = c.pullAhead
	c.wrPend.Func = func() error { c.wrPendQ.Store(false); signal(c.wrWake); return nil }
	c.rdPend.Func = func() error { c.rdPendQ.Store(false); signal(c.rdWake); return nil }
	c.ctlPend.Func = func() error { c.ctlPendQ.Store(false); c.kickCtl(); return nil }
	c.getComp.Func = c.onGetDone
	return c
}

// ID is the local conn id the peer addresses its messages to.
func (c *Conn) ID() uint32 { return c.id }

// Start attaches ep (connected to the peer's iface or EP) and the peer's conn
// id, and grants the peer the rest of the receive window. From Start on the
// Conn owns ctl, the bootstrap socket kept as liveness channel: it reads it
// to detect peer death and closes it exactly once; nobody else may use it
// (nil: no liveness channel). local and remote are the conn's addresses.
// If Start fails, ep and ctl remain the caller's.
func (c *Conn) Start(ep uct.EP, peerID uint32, ctl net.Conn, local, remote net.Addr) error {
	if ep == nil {
		return fmt.Errorf("stream: start conn %d: nil endpoint: %w", c.id, uct.ErrInvalidParam)
	}
	if local == nil {
		local = Addr{Net: "rdma"}
	}
	if remote == nil {
		remote = Addr{Net: "rdma"}
	}
	c.sendMu.Lock()
	c.mu.Lock()
	if c.started || c.closed || c.released {
		c.mu.Unlock()
		c.sendMu.Unlock()
		return fmt.Errorf("stream: start conn %d: already started or closed", c.id)
	}
	c.ep, c.peerID, c.ctl, c.local, c.remote = ep, peerID, ctl, local, remote
	c.started = true
	if g := c.mux.window - initialCredit; g > 0 {
		c.owed += g
		c.forceCredit = true
	}
	if ctl != nil {
		c.ctlDone = make(chan struct{})
	}
	rndv := c.rndvRx.active // an RTS that arrived before Start waits for it
	c.mu.Unlock()
	c.flushCtlLocked()
	c.unlockSend()
	if rndv {
		c.kickPull()
	}
	if ctl != nil {
		ctl.SetDeadline(time.Time{}) // handshake deadlines no longer apply
		go c.watchCtl(ctl)
	}
	return nil
}

func (c *Conn) hasEP(ep uct.EP) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ep != nil && c.ep == ep
}

// Transport names the transport: the TL name for shm and self ("shm",
// "self"), "tl/device" for network devices ("rc_verbs/rxe0:1").
func (c *Conn) Transport() string { return c.mux.transport }

// Stats returns the conn's counters. Safe at any time.
func (c *Conn) Stats() Stats {
	return Stats{Transport: c.mux.transport,
		BytesRead: c.bytesRead.Load(), BytesWritten: c.bytesWritten.Load(),
		MsgShort: c.msgShort.Load(), MsgBcopy: c.msgBcopy.Load(), MsgRndv: c.msgRndv.Load()}
}

// LocalAddr and RemoteAddr are the addresses given to Start.
func (c *Conn) LocalAddr() net.Addr  { return c.local }
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets both deadlines. As net.Pipe: a deadline in the past fails
// blocked and future calls with a timeout; zero means none.
func (c *Conn) SetDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdDL.set(t)
	c.wrDL.set(t)
	return nil
}

// SetReadDeadline sets the deadline of current and future Reads.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opErr("set", net.ErrClosed)
	}
	c.rdDL.set(t)
	return nil
}

// SetWriteDeadline sets the deadline of current and future Writes.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.isClosed() {
		return c.opErr("set", net.ErrClosed)
	}
	c.wrDL.set(t)
	return nil
}

func (c *Conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *Conn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "rdma", Source: c.local, Addr: c.remote, Err: err}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (c *Conn) wakeAll() {
	signal(c.rdWake)
	signal(c.wrWake)
}

func (c *Conn) closeDone() { c.doneOnce.Do(func() { close(c.done) }) }

// wait blocks until wake is signalled, dl or done closes. A blocked caller
// first polls the transport itself for cfg.ReadSpin (the fast path for
// ping-pong traffic, DESIGN.md "Calibration"), yielding every few polls,
// then parks; it parks at once while the host's CPUs are oversubscribed and
// spins mostly fail (uct.Worker.SpinAllowed), unless the transport's events
// wake it slowly (IfaceAttr.MinSpin). nil channels are never ready.
func (c *Conn) wait(wake chan struct{}, dl, done <-chan struct{}) {
	if spin := c.mux.cfg.ReadSpin; spin > 0 && len(wake) == 0 && (c.mux.keepSpin || c.mux.w.SpinAllowed()) {
		w := c.mux.w
		w.BeginPoll() // the worker parks while we poll
		start := time.Now()
		expired := false
		for i := 1; len(wake) == 0; i++ {
			w.TryProgress()
			if i&7 == 0 {
				if closedChan(dl) || closedChan(done) {
					break
				}
				if time.Since(start) > spin {
					expired = true
					break
				}
				runtime.Gosched()
			}
		}
		hit := len(wake) > 0
		w.EndPoll(!hit) // hand progress back at once if we block
		if hit || expired {
			w.SpinDone(hit)
		}
		if hit { // take the token without a three-way select (callers re-check)
			select {
			case <-wake:
			default:
			}
			return
		}
	}
	select {
	case <-wake:
	case <-dl:
	case <-done:
	}
}
