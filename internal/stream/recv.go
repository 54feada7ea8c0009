package stream

import (
	"fmt"
)

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
	if c.rdPost != nil && c.rx.n == 0 {
		// A Read waits with its buffer and nothing is queued before this.
		k := copy(c.rdPost[c.rdPostN:], body)
		c.rdPostN += k
		body = body[k:]
	}
	if len(body) > 0 {
		c.rx.write(body, &c.mux.chunks)
	}
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
		c.rndvWant.Store(true)
	}
	started := c.started
	c.mu.Unlock()
	c.wakeAll()
	if !ok {
		c.kickCtl()
		return
	}
	if started { // before Start there is no EP to pull with: Start kicks
		c.kickPull() // a blocked Read pulls itself; otherwise the puller works ahead
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
