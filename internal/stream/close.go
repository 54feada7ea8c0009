package stream

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/gouct/gouct/uct"
)

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
				c.fail(fmt.Errorf("%w: liveness channel closed without notice (%v)", ErrPeerDied, err))
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
	// A peer that sent its closing notice released its endpoint: FIN and
	// the flush would only wait for a receiver that is gone.
	peerGone := c.peerClosed
	if c.err == nil && !c.finSent && !peerGone {
		c.finOwed = true
	}
	c.mu.Unlock()
	c.wrMu.Unlock()
	notice := noticeReset
	if !peerGone {
		c.kickCtl()
		end := time.Now().Add(closeTimeout)
		for {
			c.mu.Lock()
			sent, stop := c.finSent, c.err != nil || c.sendBroken || c.peerClosed
			c.mu.Unlock()
			if sent || stop || time.Now().After(end) {
				break
			}
			c.mux.w.TryProgress()
			time.Sleep(20 * time.Microsecond)
		}
		c.mu.Lock()
		if c.err == nil && c.finSent {
			notice = noticeClose
		}
		c.mu.Unlock()
		if notice == noticeClose {
			c.flushEP(time.Until(end))
		}
	} else {
		c.mu.Lock()
		if c.err == nil {
			notice = noticeClose
		}
		c.mu.Unlock()
	}
	c.release(notice)
	return nil
}

// flushEP waits (bounded) until every operation posted on the endpoint
// completed, or the peer is known to be gone (its notice, a reset).
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
			t := time.NewTicker(time.Millisecond)
			defer t.Stop()
			for time.Now().Before(end) {
				select {
				case <-done:
					return
				case <-t.C:
				}
				c.mu.Lock()
				gone := c.peerClosed || c.err != nil
				c.mu.Unlock()
				if gone {
					return
				}
			}
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
		c.rxn.Store(0)
		c.mu.Unlock()
		c.rdMu.Unlock()
	})
}
