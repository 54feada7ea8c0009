package stream

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
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
	rndvTx      struct {
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
	ctlBody  [4]byte

	// Writer-owned (wrMu).
	rtsBuf    []byte
	nextToken uint32
	pinner    runtime.Pinner

	// Reader-owned (rdMu).
	getComp  uct.Completion
	getDone  atomic.Bool
	getErr   error
	iov      [1]uct.IOV
	stage    uct.Mem
	stR, stW int

	ctlDone     chan struct{}
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
	c.packFn = c.pack
	c.kickFn = c.kickCtl
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
	c.mu.Unlock()
	c.flushCtlLocked()
	c.unlockSend()
	if ctl != nil {
		ctl.SetDeadline(time.Time{}) // handshake deadlines no longer apply
		go c.watchCtl(ctl)
	}
	return nil
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
// then parks. nil channels are never ready.
func (c *Conn) wait(wake chan struct{}, dl, done <-chan struct{}) {
	if spin := c.mux.cfg.ReadSpin; spin > 0 && len(wake) == 0 {
		start := time.Now()
		for i := 1; len(wake) == 0; i++ {
			c.mux.w.TryProgress()
			if i&7 == 0 {
				if time.Since(start) > spin || closedChan(dl) || closedChan(done) {
					break
				}
				runtime.Gosched()
			}
		}
	}
	select {
	case <-wake:
	case <-dl:
	case <-done:
	}
}

// ---------------------------------------------------------------- Read

// Read reads up to len(p) bytes: buffered data first, else a pull of
// rendezvous data (straight into p when p is large, else through a pooled
// registered buffer), else it blocks. io.EOF after the peer's FIN.
func (c *Conn) Read(p []byte) (int, error) {
	c.rdMu.Lock()
	defer c.rdMu.Unlock()
	for {
		dl := c.rdDL.wait()
		c.mu.Lock()
		switch {
		case c.closed:
			c.mu.Unlock()
			return 0, c.opErr("read", net.ErrClosed)
		case closedChan(dl):
			c.mu.Unlock()
			return 0, c.opErr("read", os.ErrDeadlineExceeded)
		case c.err != nil:
			err := c.err
			c.mu.Unlock()
			return 0, c.opErr("read", err)
		case !c.started:
			c.mu.Unlock()
			return 0, c.opErr("read", ErrNotStarted)
		case len(p) == 0:
			c.mu.Unlock()
			return 0, nil
		case c.stR < c.stW:
			c.mu.Unlock()
			return c.readStage(p), nil
		case c.rx.n > 0:
			return c.readChunksLocked(p), nil
		case c.rndvRx.active:
			c.mu.Unlock()
			return c.pullRndv(p)
		case c.finRecv:
			c.mu.Unlock()
			return 0, io.EOF
		}
		c.mu.Unlock()
		c.wait(c.rdWake, dl, c.done)
	}
}

// readChunksLocked copies buffered bytes out (the copy itself runs unlocked:
// the handler only appends past w and only the reader consumes), returns
// their credit, and unlocks c.mu.
func (c *Conn) readChunksLocked(p []byte) int {
	n := 0
	for n < len(p) {
		ch := c.rx.front()
		if ch == nil || ch.r == ch.w {
			break
		}
		seg := ch.buf[ch.r:ch.w]
		c.mu.Unlock()
		k := copy(p[n:], seg)
		c.mu.Lock()
		c.rx.consumed(ch, k, &c.mux.chunks)
		n += k
	}
	c.owed += n
	kick := c.owed >= c.batch
	c.mu.Unlock()
	if kick {
		c.kickCtl()
	}
	c.bytesRead.Add(uint64(n))
	return n
}

func (c *Conn) readStage(p []byte) int {
	n := copy(p, c.stage.Buf[c.stR:c.stW])
	c.stR += n
	if c.stR == c.stW {
		c.stR, c.stW = 0, 0
		c.mux.stages.put(c.stage)
		c.stage = uct.Mem{}
	}
	c.bytesRead.Add(uint64(n))
	return n
}

// pullRndv reads rendezvous data with GetZcopy: into p when it is at least
// directMin bytes (registering it for local write where the MD needs it),
// else into a pooled registered buffer that later Reads drain. When the
// whole request is pulled, ATS releases the writer.
func (c *Conn) pullRndv(p []byte) (int, error) {
	r := &c.rndvRx
	md := c.mux.ti.MD
	want := r.length - r.off
	if g := uint64(c.mux.attr.MaxGet); want > g {
		want = g
	}
	var dst []byte
	var mh uct.MemH
	direct := false
	if len(p) >= c.mux.directMin {
		dst = p[:min(uint64(len(p)), want)]
		direct = true
		if c.mux.mdAttr.Flags&uct.MDNeedMemH != 0 {
			h, err := md.Register(dst, uct.AccessLocalWrite)
			if err != nil {
				direct = false
			} else {
				mh = h
			}
		}
	}
	if !direct {
		if c.stage.Buf == nil {
			m, err := c.mux.stages.get()
			if err != nil {
				return 0, c.failRead(fmt.Errorf("rendezvous staging buffer: %w", err))
			}
			c.stage = m
		}
		dst = c.stage.Buf[:min(uint64(len(c.stage.Buf)), want)]
		mh = c.stage.MemH
	}
	c.iov[0] = uct.IOV{Buf: dst, MemH: mh}
	err := c.get(r.addr+r.off, r.rkey)
	c.iov[0] = uct.IOV{}
	if direct && mh != nil {
		md.Deregister(mh)
	}
	if err != nil {
		return 0, c.failRead(err)
	}
	c.mu.Lock()
	r.off += uint64(len(dst))
	ats := r.off == r.length
	if ats {
		r.active = false
		c.atsOwed, c.atsToken = true, r.token
	}
	c.mu.Unlock()
	if ats {
		c.kickCtl()
	}
	if direct {
		c.bytesRead.Add(uint64(len(dst)))
		return len(dst), nil
	}
	c.stR, c.stW = 0, len(dst)
	return c.readStage(p), nil
}

// failRead resets the conn after a failed pull and returns Read's error.
func (c *Conn) failRead(err error) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opErr("read", net.ErrClosed)
	}
	c.resetLocked(resetBy(false, rstRndv, err), rstRndv)
	e := c.err
	c.mu.Unlock()
	c.wakeAll()
	c.kickCtl()
	return c.opErr("read", e)
}

// get runs one GetZcopy of c.iov and waits for it. It never returns while
// the transport may still write into the destination.
func (c *Conn) get(raddr uint64, rkey []byte) error {
	for {
		c.getDone.Store(false)
		c.getErr = nil
		c.getComp.Count.Store(1)
		err := c.ep.GetZcopy(c.iov[:], raddr, rkey, &c.getComp)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, uct.ErrInProgress):
			for !c.getDone.Load() {
				c.wait(c.rdWake, nil, nil)
			}
			if c.getErr != nil {
				return fmt.Errorf("rendezvous get: %w", c.getErr)
			}
			return nil
		case errors.Is(err, uct.ErrNoResource):
			c.mu.Lock()
			stop := c.closed || c.err != nil
			c.mu.Unlock()
			if stop {
				return fmt.Errorf("rendezvous get: %w", uct.ErrCanceled)
			}
			if c.addPending(&c.rdPend, &c.rdPendQ) {
				c.wait(c.rdWake, nil, c.done)
			}
		default:
			return fmt.Errorf("rendezvous get: %w", err)
		}
	}
}

func (c *Conn) onGetDone(status error) {
	c.getErr = status
	c.getDone.Store(true)
	signal(c.rdWake)
}

// ---------------------------------------------------------------- Write

// Write writes p: up to MaxShort bytes as one AMShort, then AMBcopy
// fragments pipelined within the peer's credit, and from the rendezvous
// threshold on (with GetZcopy) by rendezvous: p is registered and the peer
// pulls it. Write returns once every byte is in the transport's hands or
// delivered; p may be reused then. It blocks (deadline-aware) at zero
// credit. A Write abandoned during rendezvous (deadline, Close) resets the
// conn: the peer may have pulled part of p.
func (c *Conn) Write(p []byte) (int, error) {
	c.wrMu.Lock()
	defer c.wrMu.Unlock()
	if t := c.mux.rndvThresh; t > 0 && len(p) >= t {
		if n, err, ok := c.writeRndv(p); ok {
			return n, err
		}
	}
	return c.writeCopy(p)
}

func (c *Conn) writeErrLocked(dl <-chan struct{}) error {
	switch {
	case c.closed:
		return c.opErr("write", net.ErrClosed)
	case closedChan(dl):
		return c.opErr("write", os.ErrDeadlineExceeded)
	case c.err != nil:
		return c.opErr("write", c.err)
	case c.wrClosed:
		return c.opErr("write", ErrWriteClosed)
	case c.peerClosed:
		return c.opErr("write", ErrPeerClosed)
	case !c.started:
		return c.opErr("write", ErrNotStarted)
	}
	return nil
}

func (c *Conn) writeCopy(p []byte) (int, error) {
	n := 0
	for {
		dl := c.wrDL.wait()
		c.mu.Lock()
		if err := c.writeErrLocked(dl); err != nil {
			c.mu.Unlock()
			return n, err
		}
		if n == len(p) {
			c.mu.Unlock()
			return n, nil
		}
		k := min(len(p)-n, c.txCredit, c.mux.maxFrag)
		if k == 0 {
			c.mu.Unlock()
			c.wait(c.wrWake, dl, c.done)
			continue
		}
		c.txCredit -= k
		grant := c.takeGrantLocked()
		c.mu.Unlock()
		c.sendMu.Lock()
		short, err := c.sendLocked(amData, grant, p[n:n+k])
		c.unlockSend()
		if err != nil {
			c.mu.Lock()
			c.txCredit += k
			c.returnGrantLocked(grant)
			c.mu.Unlock()
			if err = c.sendFailed(err, dl); err != nil {
				return n, err
			}
			continue
		}
		if short {
			c.msgShort.Add(1)
		} else {
			c.msgBcopy.Add(1)
		}
		c.bytesWritten.Add(uint64(k))
		n += k
	}
}

// sendFailed handles a failed send of the writer: ErrNoResource queues a
// pending request and waits (nil: retry); other errors reset the conn.
func (c *Conn) sendFailed(err error, dl <-chan struct{}) error {
	if errors.Is(err, uct.ErrNoResource) {
		if c.addPending(&c.wrPend, &c.wrPendQ) {
			c.wait(c.wrWake, dl, c.done)
		}
		return nil
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opErr("write", net.ErrClosed)
	}
	c.resetLocked(resetBy(false, rstAbort, err), 0)
	e := c.err
	c.mu.Unlock()
	c.wakeAll()
	return c.opErr("write", e)
}

// writeRndv writes p by rendezvous. ok false: registration failed, use copies.
func (c *Conn) writeRndv(p []byte) (n int, err error, ok bool) {
	md := c.mux.ti.MD
	c.pinner.Pin(&p[0])
	defer c.pinner.Unpin()
	mh, err := md.Register(p, uct.AccessRemoteRead)
	if err != nil {
		return 0, nil, false
	}
	defer md.Deregister(mh)
	rkey, err := md.PackRKey(mh)
	if err != nil || len(rkey) > maxRKeyLen {
		return 0, nil, false
	}
	if need := rtsFixedLen + len(rkey); cap(c.rtsBuf) < need {
		c.rtsBuf = make([]byte, need)
	}
	c.nextToken++
	tok := c.nextToken
	body := c.rtsBuf[:putRTS(c.rtsBuf[:cap(c.rtsBuf)], tok, uint64(len(p)), addrOf(p), rkey)]
	for {
		dl := c.wrDL.wait()
		c.mu.Lock()
		if err := c.writeErrLocked(dl); err != nil {
			c.mu.Unlock()
			return 0, err, true
		}
		c.rndvTx.active, c.rndvTx.done, c.rndvTx.token = true, false, tok
		grant := c.takeGrantLocked()
		c.mu.Unlock()
		c.sendMu.Lock()
		_, err := c.sendLocked(amRTS, grant, body)
		c.unlockSend()
		if err == nil {
			break
		}
		c.mu.Lock()
		c.rndvTx.active = false
		c.returnGrantLocked(grant)
		c.mu.Unlock()
		if err = c.sendFailed(err, dl); err != nil {
			return 0, err, true
		}
	}
	c.msgRndv.Add(1)
	for {
		dl := c.wrDL.wait()
		c.mu.Lock()
		if c.rndvTx.done {
			c.rndvTx.active, c.rndvTx.done = false, false
			c.mu.Unlock()
			c.bytesWritten.Add(uint64(len(p)))
			return len(p), nil, true
		}
		if err := c.writeErrLocked(dl); err != nil {
			// The peer may be pulling from p now: the stream cannot go on.
			c.rndvTx.active = false
			c.resetLocked(resetBy(false, rstWriteAbrt, nil), rstWriteAbrt)
			c.mu.Unlock()
			c.wakeAll()
			c.kickCtl()
			return 0, err, true
		}
		c.mu.Unlock()
		c.wait(c.wrWake, dl, c.done)
	}
}

// takeGrantLocked takes every owed credit byte to piggyback on a message.
func (c *Conn) takeGrantLocked() uint32 {
	g := c.owed
	if g > 0 {
		c.owed = 0
		c.rxAllowed += g
		c.forceCredit = false
	}
	return uint32(g)
}

func (c *Conn) returnGrantLocked(g uint32) {
	c.owed += int(g)
	c.rxAllowed -= int(g)
}

// ---------------------------------------------------------------- sending

// sendLocked sends AM id with the stream header (peer id, credit) and body:
// AMShort when body fits, else AMBcopy. The caller holds sendMu.
func (c *Conn) sendLocked(id uint8, credit uint32, body []byte) (short bool, err error) {
	hdr := makeHdr(c.peerID, credit)
	if len(body) <= c.mux.maxShort {
		return true, c.ep.AMShort(id, hdr, body)
	}
	c.packHdr, c.packBody = hdr, body
	_, err = c.ep.AMBcopy(id, c.packFn)
	c.packBody = nil
	return false, err
}

func (c *Conn) pack(b []byte) int {
	binary.LittleEndian.PutUint64(b, c.packHdr)
	return hdrLen + copy(b[hdrLen:], c.packBody)
}

// unlockSend releases sendMu and runs control sends that were requested
// while it was held (see kickCtl).
func (c *Conn) unlockSend() {
	c.sendMu.Unlock()
	if c.ctlDirty.Load() {
		c.kickCtl()
	}
}

// kickCtl sends owed control messages (RST, ATS, CREDIT, FIN) from any
// goroutine, the worker included, without blocking: if another goroutine
// holds sendMu, it leaves the work to that goroutine's unlockSend.
func (c *Conn) kickCtl() {
	c.ctlDirty.Store(true)
	for c.ctlDirty.Load() && c.sendMu.TryLock() {
		c.ctlDirty.Store(false)
		c.flushCtlLocked()
		c.sendMu.Unlock()
	}
}

// flushCtlLocked sends owed control messages in order: RST (then nothing
// more), ATS, CREDIT (at the batch threshold or when forced), FIN.
// Credit is piggybacked on ATS and FIN. On ErrNoResource it queues ctlPend.
func (c *Conn) flushCtlLocked() {
	for {
		c.mu.Lock()
		if !c.started || c.released || c.rstSent || c.sendBroken || (c.err != nil && !c.rstOwed) {
			c.mu.Unlock()
			return
		}
		var id uint8
		var body []byte
		var credit uint32
		switch {
		case c.rstOwed:
			id, c.rstOwed = amRST, false
			binary.LittleEndian.PutUint32(c.ctlBody[:], c.rstCode)
			body = c.ctlBody[:]
		case c.atsOwed:
			id, c.atsOwed = amATS, false
			binary.LittleEndian.PutUint32(c.ctlBody[:], c.atsToken)
			body = c.ctlBody[:]
			credit = c.takeGrantLocked()
		case c.owed > 0 && (c.forceCredit || c.owed >= c.batch):
			id = amCredit
			credit = c.takeGrantLocked()
		case c.finOwed:
			id, c.finOwed = amFIN, false
			credit = c.takeGrantLocked()
		default:
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		_, err := c.sendLocked(id, credit, body)
		c.mu.Lock()
		if err == nil {
			switch id {
			case amRST:
				c.rstSent = true
			case amFIN:
				c.finSent = true
			}
			c.mu.Unlock()
			continue
		}
		if !errors.Is(err, uct.ErrNoResource) {
			// The endpoint or the peer is gone: nothing more can be sent.
			c.sendBroken = true
			if id == amRST {
				c.rstSent = true
			} else if c.err == nil && !c.closed {
				c.resetLocked(resetBy(false, rstAbort, err), 0)
				c.mu.Unlock()
				c.wakeAll()
				return
			}
			c.mu.Unlock()
			return
		}
		c.returnGrantLocked(credit)
		switch id {
		case amRST:
			c.rstOwed = true
		case amATS:
			c.atsOwed = true
		case amFIN:
			c.finOwed = true
		}
		c.mu.Unlock()
		if !c.addPending(&c.ctlPend, &c.ctlPendQ) {
			c.mux.w.Post(c.kickFn) // resources are free now: retry on the next poll
		}
		return
	}
}

// addPending queues r unless it is queued already. It reports true when the
// caller should wait for r's signal, false when it should retry now
// (ErrBusy) or r is already queued (then its signal is pending too, so
// waiting is right: report true in that case as well).
func (c *Conn) addPending(r *uct.PendingReq, queued *atomic.Bool) bool {
	if queued.Swap(true) {
		return true
	}
	if err := c.ep.PendingAdd(r); err != nil {
		queued.Store(false)
		return false
	}
	return true
}

// ---------------------------------------------------------------- receiving (handlers)

func (c *Conn) addCreditLocked(credit uint32) bool {
	if credit == 0 {
		return true
	}
	c.txCredit += int(credit)
	if c.txCredit > 1<<31 {
		c.resetLocked(fmt.Errorf("%w: credit overflow", ErrProtocol), rstProtocol)
		return false
	}
	return true
}

// usableLocked reports whether an incoming message should be processed.
func (c *Conn) usableLocked() bool { return !c.released && c.err == nil }

func (c *Conn) recvData(credit uint32, body []byte) {
	c.mu.Lock()
	if !c.usableLocked() {
		c.mu.Unlock()
		return
	}
	var bad string
	switch {
	case len(body) == 0:
		bad = "empty DATA"
	case len(body) > c.rxAllowed:
		bad = "DATA beyond the receive window"
	case c.finRecv:
		bad = "DATA after FIN"
	case c.rndvRx.active:
		bad = "DATA during rendezvous"
	}
	if bad != "" {
		c.mu.Unlock()
		c.protocolError(bad)
		return
	}
	if !c.addCreditLocked(credit) {
		c.mu.Unlock()
		c.wakeAll()
		c.kickCtl()
		return
	}
	c.rxAllowed -= len(body)
	c.rx.write(body, &c.mux.chunks)
	c.mu.Unlock()
	signal(c.rdWake)
	if credit > 0 {
		signal(c.wrWake)
	}
}

func (c *Conn) recvCredit(credit uint32) {
	c.mu.Lock()
	if !c.usableLocked() {
		c.mu.Unlock()
		return
	}
	ok := c.addCreditLocked(credit)
	c.mu.Unlock()
	if !ok {
		c.wakeAll()
		c.kickCtl()
		return
	}
	signal(c.wrWake)
}

func (c *Conn) recvRTS(credit uint32, r rts) {
	c.mu.Lock()
	if !c.usableLocked() {
		c.mu.Unlock()
		return
	}
	if c.rndvRx.active || c.finRecv {
		c.mu.Unlock()
		c.protocolError("unexpected RTS")
		return
	}
	ok := c.addCreditLocked(credit)
	if ok {
		c.rndvRx = rndvRecv{active: true, token: r.token, addr: r.addr, length: r.length,
			rkey: append(c.rndvRx.rkey[:0], r.rkey...)}
	}
	c.mu.Unlock()
	c.wakeAll()
	if !ok {
		c.kickCtl()
	}
}

func (c *Conn) recvATS(credit uint32, token uint32) {
	c.mu.Lock()
	if !c.usableLocked() {
		c.mu.Unlock()
		return
	}
	if !c.rndvTx.active || c.rndvTx.done || c.rndvTx.token != token {
		c.mu.Unlock()
		c.protocolError("unexpected ATS")
		return
	}
	c.rndvTx.done = true
	ok := c.addCreditLocked(credit)
	c.mu.Unlock()
	c.wakeAll()
	if !ok {
		c.kickCtl()
	}
}

func (c *Conn) recvFIN(credit uint32) {
	c.mu.Lock()
	if !c.usableLocked() {
		c.mu.Unlock()
		return
	}
	if c.rndvRx.active || c.finRecv {
		c.mu.Unlock()
		c.protocolError("unexpected FIN")
		return
	}
	c.finRecv = true
	ok := c.addCreditLocked(credit)
	if c.graceTimer != nil {
		c.graceTimer.Stop()
	}
	c.mu.Unlock()
	c.wakeAll()
	if !ok {
		c.kickCtl()
	}
}

func (c *Conn) recvRST(code uint32) {
	c.mu.Lock()
	if !c.usableLocked() {
		c.mu.Unlock()
		return
	}
	c.resetLocked(resetBy(true, code, nil), 0)
	c.mu.Unlock()
	c.wakeAll()
}

// protocolError resets the conn after a malformed message and tells the peer.
func (c *Conn) protocolError(what string) {
	c.mu.Lock()
	c.resetLocked(fmt.Errorf("%w: %s", ErrProtocol, what), rstProtocol)
	c.mu.Unlock()
	c.wakeAll()
	c.kickCtl()
}

// resetLocked fails the conn with err (first error wins) and, with a
// nonzero code, owes the peer an RST. Blocked calls are woken by closing done.
func (c *Conn) resetLocked(err error, rstCode uint32) {
	if c.err != nil || c.released {
		return
	}
	c.err = err
	if rstCode != 0 && c.started && !c.rstSent {
		c.rstOwed, c.rstCode = true, rstCode
	}
	c.closeDone()
}

// ---------------------------------------------------------------- liveness

// watchCtl reads the liveness channel until it ends: a closing notice
// stops Writes and arms the FIN grace timer; the end without a notice, or a
// reset notice, resets the conn at once.
func (c *Conn) watchCtl(ctl net.Conn) {
	defer close(c.ctlDone)
	var b [1]byte
	graceful := false
	for {
		n, err := ctl.Read(b[:])
		if n == 1 {
			switch {
			case b[0] == noticeClose && !graceful:
				graceful = true
				c.peerClosing()
			case b[0] == noticeReset:
				c.fail(resetBy(true, rstAbort, nil))
				return
			default:
				c.fail(fmt.Errorf("%w: unexpected byte %#x on the liveness channel", ErrProtocol, b[0]))
				return
			}
		}
		if err != nil {
			if !graceful {
				c.fail(fmt.Errorf("%w (%v)", ErrPeerDied, err))
			}
			return
		}
	}
}

// peerClosing handles the closing notice: FIN is due (it was flushed before
// the notice, though it may be processed after it); Writes to the peer fail.
func (c *Conn) peerClosing() {
	c.mu.Lock()
	c.peerClosed = true
	if !c.finRecv && !c.released && c.err == nil {
		c.graceTimer = time.AfterFunc(finGrace, func() {
			c.fail(fmt.Errorf("%w: peer closed but its FIN never arrived", ErrPeerDied))
		})
	}
	c.mu.Unlock()
	c.wakeAll()
}

// fail resets the conn from outside the data path (liveness), without RST.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.closed || (err != nil && c.finRecv && errors.Is(err, ErrPeerDied) && c.peerClosed) {
		c.mu.Unlock()
		return
	}
	c.resetLocked(err, 0)
	c.mu.Unlock()
	c.wakeAll()
}

// ---------------------------------------------------------------- close

// CloseWrite half-closes: FIN follows the data written so far; the peer
// reads it all, then io.EOF. Reads go on. Later Writes fail.
func (c *Conn) CloseWrite() error {
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	case !c.started:
		c.mu.Unlock()
		return c.opErr("close", ErrNotStarted)
	case c.wrClosed:
		c.mu.Unlock()
		return nil
	}
	c.wrClosed = true
	c.mu.Unlock()
	signal(c.wrWake)
	c.wrMu.Lock() // wait out a Write in progress: FIN goes after its data
	c.mu.Lock()
	if c.err == nil && !c.finSent {
		c.finOwed = true
	}
	c.mu.Unlock()
	c.wrMu.Unlock()
	c.kickCtl()
	return nil
}

// Close closes the conn: blocked Reads and Writes return net.ErrClosed, FIN
// follows the data already written, the endpoint is flushed, the peer gets
// the closing notice on ctl, and every resource (endpoint, ctl, buffers)
// is released once. The peer reads everything written, then io.EOF.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.closed = true
	c.wrClosed = true
	started := c.started
	c.mu.Unlock()
	c.closeDone()
	c.wakeAll()
	if !started {
		c.release(noticeReset)
		return nil
	}
	c.wrMu.Lock() // a Write in progress fails promptly; FIN goes after its data
	c.mu.Lock()
	if c.err == nil && !c.finSent {
		c.finOwed = true
	}
	c.mu.Unlock()
	c.wrMu.Unlock()
	c.kickCtl()
	end := time.Now().Add(closeTimeout)
	for {
		c.mu.Lock()
		sent, bad := c.finSent, c.err != nil || c.sendBroken
		c.mu.Unlock()
		if sent || bad || time.Now().After(end) {
			break
		}
		c.mux.w.TryProgress()
		time.Sleep(20 * time.Microsecond)
	}
	notice := noticeReset
	c.mu.Lock()
	if c.err == nil && c.finSent {
		notice = noticeClose
	}
	c.mu.Unlock()
	if notice == noticeClose {
		c.flushEP(time.Until(end))
	}
	c.release(notice)
	return nil
}

// flushEP waits (bounded) until every operation posted on the endpoint completed.
func (c *Conn) flushEP(d time.Duration) {
	done := make(chan struct{})
	comp := uct.NewCompletion(1, func(error) { close(done) })
	end := time.Now().Add(d)
	for {
		err := c.ep.Flush(comp)
		switch {
		case err == nil:
			return
		case errors.Is(err, uct.ErrInProgress):
			t := time.NewTimer(max(time.Until(end), 0))
			select {
			case <-done:
			case <-t.C:
			}
			t.Stop()
			return
		case errors.Is(err, uct.ErrNoResource) && time.Now().Before(end):
			c.mux.w.TryProgress()
			time.Sleep(20 * time.Microsecond)
		default:
			return
		}
	}
}

// Abort releases the conn at once, before or after Start, resetting the
// peer (RST and the reset notice). Idempotent; err is the local cause.
func (c *Conn) Abort(err error) { c.abort(rstAbort, err) }

func (c *Conn) abort(code uint32, cause error) {
	c.mu.Lock()
	c.resetLocked(resetBy(false, code, cause), code)
	c.closed, c.wrClosed = true, true
	started := c.started
	c.mu.Unlock()
	c.closeDone()
	c.wakeAll()
	if started {
		c.kickCtl()
		end := time.Now().Add(abortWait)
		for {
			c.mu.Lock()
			owed := c.rstOwed && !c.released && !c.sendBroken
			c.mu.Unlock()
			if !owed || time.Now().After(end) {
				break
			}
			c.mux.w.TryProgress()
			time.Sleep(20 * time.Microsecond)
		}
	}
	c.release(noticeReset)
}

// release frees every resource exactly once: the conn id, the notice and
// ctl, the endpoint (cancelling operations in flight), then, once no Read
// runs, the receive buffers.
func (c *Conn) release(notice byte) {
	c.releaseOnce.Do(func() {
		c.mux.remove(c)
		c.mu.Lock()
		c.released = true
		if c.graceTimer != nil {
			c.graceTimer.Stop()
		}
		ctl, ep := c.ctl, c.ep
		c.mu.Unlock()
		c.closeDone()
		c.wakeAll()
		if ctl != nil {
			ctl.SetWriteDeadline(time.Now().Add(ctlWriteTime))
			ctl.Write([]byte{notice})
			ctl.Close()
			<-c.ctlDone
		}
		if ep != nil {
			c.sendMu.Lock()
			ep.Close()
			c.sendMu.Unlock()
		}
		c.rdDL.stop()
		c.wrDL.stop()
		c.rdMu.Lock()
		c.mu.Lock()
		c.rx.release(&c.mux.chunks)
		c.mu.Unlock()
		if c.stage.Buf != nil {
			c.mux.stages.put(c.stage)
			c.stage = uct.Mem{}
			c.stR, c.stW = 0, 0
		}
		c.rdMu.Unlock()
	})
}
