package stream

import (
	"errors"
	"net"
	"os"
	"runtime"

	"github.com/gouct/gouct/uct"
)

// Write writes p: up to MaxShort bytes as one AMShort, then AMBcopy
// fragments pipelined within the peer's credit, and from the rendezvous
// threshold on (with GetZcopy) by rendezvous: p is registered and the peer
// pulls it. Write returns once every byte is in the transport's hands or
// delivered; p may be reused then. It blocks (deadline-aware) at zero
// credit. A Write abandoned during rendezvous (deadline, Close) resets the
// conn: the peer may have pulled part of p. Writes larger than the MD's
// largest registration go as several rendezvous.
func (c *Conn) Write(p []byte) (int, error) {
	c.wrMu.Lock()
	defer c.wrMu.Unlock()
	t := c.mux.rndvThresh
	if t == 0 || len(p) < t {
		return c.writeCopy(p)
	}
	n := 0
	for n < len(p) {
		piece := p[n:]
		if m := c.mux.maxRndv; m > 0 && len(piece) > m {
			piece = piece[:m]
		}
		k, err, ok := 0, error(nil), false
		if len(piece) >= t {
			k, err, ok = c.writeRndv(piece)
		}
		if !ok {
			k, err = c.writeCopy(piece)
		}
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
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
		if n == len(p) {
			// Every byte is in the transport's hands: a peer that closes
			// now does not turn this completed Write into an error.
			return n, nil
		}
	}
}

// sendFailed handles a failed send of the writer: ErrNoResource queues a
// pending request and waits (nil: retry); other errors reset the conn.
func (c *Conn) sendFailed(err error, dl <-chan struct{}) error {
	if errors.Is(err, uct.ErrNoResource) {
		if c.addPending(&c.wrPend, &c.wrPendQ) {
			c.wait(c.wrWake, dl, c.done)
		} else {
			runtime.Gosched() // resources are free again (ErrBusy): retry
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
