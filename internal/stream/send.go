package stream

import (
	"encoding/binary"
	"errors"
	"sync/atomic"

	"github.com/gouct/gouct/uct"
)

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
