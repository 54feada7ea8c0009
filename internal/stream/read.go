package stream

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"

	"github.com/gouct/gouct/uct"
)

// Read reads up to len(p) bytes: buffered data first (DATA, and
// rendezvous data pulled ahead), else a pull of rendezvous data (straight
// into p when p is large), else it blocks. io.EOF after the peer's FIN.
func (c *Conn) Read(p []byte) (int, error) {
	c.rdMu.Lock()
	n, err := c.read(p)
	c.rdMu.Unlock()
	if c.rndvWant.Load() && int(c.rxn.Load()) <= c.mux.window/2 {
		c.kickPull() // pull the rest of a rendezvous ahead while the app works
	}
	return n, err
}

func (c *Conn) read(p []byte) (int, error) {
	for {
		dl := c.rdDL.wait()
		c.mu.Lock()
		if c.rdPost != nil {
			n := c.rdPostN
			c.rdPost, c.rdPostN = nil, 0
			if n > 0 {
				return c.postedLocked(n), nil
			}
		}
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
		case c.rx.n > 0:
			return c.readChunksLocked(p), nil
		case c.rndvRx.active:
			c.mu.Unlock()
			if len(p) >= c.mux.directMin {
				if n, err := c.pullDirect(p); n > 0 || err != nil {
					return n, err
				}
				continue
			}
			if err := c.pullChunks(max(len(p), pullStep)); err != nil {
				return 0, c.failRead(err)
			}
			continue
		case c.finRecv:
			c.mu.Unlock()
			return 0, io.EOF
		}
		c.rdPost, c.rdPostN = p, 0 // DATA may land in p while we wait
		c.mu.Unlock()
		c.wait(c.rdWake, dl, c.done)
	}
}

// pullStep is how much rendezvous data a Read with a small buffer pulls
// into chunks at once; the puller then works ahead up to the window.
const pullStep = 256 << 10

// readChunksLocked copies buffered bytes out (the copy itself runs unlocked:
// appends go past w and only the reader consumes), returns the credit of
// the DATA bytes among them, and unlocks c.mu.
func (c *Conn) readChunksLocked(p []byte) int {
	n, credit := 0, 0
	pool := &c.mux.chunks
	for n < len(p) {
		ch := c.rx.front(pool)
		if ch == nil {
			break
		}
		seg := ch.buf[ch.r:ch.w]
		c.mu.Unlock()
		k := copy(p[n:], seg)
		c.mu.Lock()
		c.rx.consumed(ch, k)
		if !ch.rndv {
			credit += k
		}
		n += k
	}
	c.rx.front(pool) // recycle what was drained
	c.rxn.Store(int64(c.rx.n))
	c.owed += credit
	kick := c.owed >= c.batch
	c.mu.Unlock()
	if kick {
		c.kickCtl()
	}
	c.bytesRead.Add(uint64(n))
	return n
}

// postedLocked accounts for n DATA bytes that handlers copied straight
// into the Read's buffer (credit owed back as for queued bytes) and
// unlocks c.mu.
func (c *Conn) postedLocked(n int) int {
	c.owed += n
	kick := c.owed >= c.batch
	c.mu.Unlock()
	if kick {
		c.kickCtl()
	}
	c.bytesRead.Add(uint64(n))
	return n
}

// pullDirect pulls rendezvous data with one GetZcopy straight into p
// (registered for local write where the MD needs it). The caller holds rdMu.
// It returns 0, nil when p could not be registered and the data went to
// the chunks instead.
func (c *Conn) pullDirect(p []byte) (int, error) {
	r := &c.rndvRx
	md := c.mux.ti.MD
	dst := p[:min(uint64(len(p)), r.length-r.off, uint64(c.mux.attr.MaxGet))]
	var mh uct.MemH
	if c.mux.mdAttr.Flags&uct.MDNeedMemH != 0 {
		h, err := md.Register(dst, uct.AccessLocalWrite)
		if err != nil {
			// Not registrable: go through the chunks instead.
			if err := c.pullChunks(pullStep); err != nil {
				return 0, c.failRead(err)
			}
			return 0, nil
		}
		mh = h
	}
	c.iov[0] = uct.IOV{Buf: dst, MemH: mh}
	err := c.get(r.addr+r.off, r.rkey)
	c.iov[0] = uct.IOV{}
	if mh != nil {
		md.Deregister(mh)
	}
	if err != nil {
		return 0, c.failRead(err)
	}
	c.pulled(len(dst))
	c.bytesRead.Add(uint64(len(dst)))
	return len(dst), nil
}

// pulled records n more bytes of the rendezvous as delivered; the last ones
// owe the writer its ATS.
func (c *Conn) pulled(n int) {
	r := &c.rndvRx
	c.mu.Lock()
	r.off += uint64(n)
	done := r.off == r.length
	if done {
		r.active = false
		c.rndvWant.Store(false)
		c.atsOwed, c.atsToken = true, r.token
	}
	c.mu.Unlock()
	if done {
		c.kickCtl()
	}
}

// pullChunks pulls up to limit bytes of the active rendezvous into
// rendezvous chunks of the receive queue (through a registered staging
// buffer where the MD needs registrations), stopping at the window. The
// caller holds rdMu; DATA cannot arrive meanwhile (it would be a protocol
// error), so the chunk tail is the puller's alone.
func (c *Conn) pullChunks(limit int) error {
	r := &c.rndvRx
	needMemH := c.mux.mdAttr.Flags&uct.MDNeedMemH != 0
	for limit > 0 {
		c.mu.Lock()
		if !r.active || !c.started || c.closed || c.err != nil || c.released || c.rx.n >= c.mux.window {
			c.mu.Unlock()
			return nil
		}
		ch := c.rx.tail(true, &c.mux.chunks)
		k := int(min(uint64(len(ch.buf)-ch.w), r.length-r.off, uint64(limit), uint64(c.mux.attr.MaxGet)))
		dst := ch.buf[ch.w : ch.w+k]
		c.mu.Unlock()
		var err error
		if needMemH {
			var st uct.Mem
			if st, err = c.mux.stages.get(); err == nil {
				k = min(k, len(st.Buf))
				dst = dst[:k]
				c.iov[0] = uct.IOV{Buf: st.Buf[:k], MemH: st.MemH}
				if err = c.get(r.addr+r.off, r.rkey); err == nil {
					copy(dst, st.Buf[:k])
				}
				c.mux.stages.put(st)
			}
		} else {
			c.iov[0] = uct.IOV{Buf: dst}
			err = c.get(r.addr+r.off, r.rkey)
		}
		c.iov[0] = uct.IOV{}
		if err != nil {
			return err
		}
		c.mu.Lock()
		ch.w += k
		c.rx.n += k
		c.rxn.Store(int64(c.rx.n))
		c.mu.Unlock()
		c.pulled(k)
		limit -= k
	}
	return nil
}

// kickPull starts the puller unless it runs: a goroutine that pulls a
// rendezvous ahead into the receive queue (up to the window) while no Read
// runs, so the writer is released without waiting for the application.
func (c *Conn) kickPull() {
	if c.pulling.CompareAndSwap(false, true) {
		go c.pullFn() // a func value: no closure allocated per rendezvous
	}
}

func (c *Conn) pullAhead() {
	for {
		if !c.rdMu.TryLock() {
			// A Read runs: it pulls itself, and kicks again when it returns.
			c.pulling.Store(false)
			return
		}
		err := c.pullChunks(c.mux.window)
		c.rdMu.Unlock()
		if err != nil {
			c.failRead(err)
		}
		signal(c.rdWake)
		c.pulling.Store(false)
		if !c.rndvWant.Load() || int(c.rxn.Load()) > c.mux.window/2 || c.isClosed() ||
			!c.pulling.CompareAndSwap(false, true) {
			return
		}
	}
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
			} else {
				runtime.Gosched() // resources are free again (ErrBusy): retry
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
