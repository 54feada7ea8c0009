package stream

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/gouct/gouct/uct"
)

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
