//go:build linux && cgo && !noverbs

package ib

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/internal/ibv"
)

// EP address (ConnectToEP), little-endian:
//
//	offset size field
//	0      4    QP number
//	4      4    initial PSN (24 bits used)
//	8      16   GID
//	24     2    LID
//	26     1    active MTU (enum ibv_mtu)
const epAddrLen = 27

type epState int

const (
	epCreated   epState = iota // QP in INIT: sends wait (ErrNoResource, pending)
	epConnected                // QP in RTS
	epFailed                   // a completion failed: ErrEndpointReset
	epClosed
)

// txOp is one posted send work request, released by its completion.
type txOp struct {
	comp   *uct.Completion
	bounce *seg
	rma    int // RDMA bytes, counted in ep.rmaBytes until completion
}

// flushReq fires comp when the send with sequence number seq completed.
type flushReq struct {
	seq  uint64
	comp *uct.Completion
}

// ep is one RC QP. Every method is safe for concurrent use: posting holds
// mu for the few instructions that build and post one work request.
// Completions are in posting order (every send is signalled), so the ring
// ops[head..tail) is released from the head.
type ep struct {
	i    *iface
	slot int
	qp   *ibv.QP
	qpn  uint32 // qp.QPN, readable without the lock (async events)
	psn  uint32
	gid  ibv.GIDEntry // source GID: the port's, or the bootstrap IP's (UseGIDForIP)
	seq  uint64       // creation order in the process (TestingEndpointQPs)

	mu         sync.Mutex
	state      epState
	err        error // why the endpoint failed
	ops        []txOp
	head, tail uint64
	wr         ibv.SendWR
	sges       [maxIOVLimit + 1]ibv.SGE
	flushes    []flushReq
	destroyed  bool
	rmaBytes   int // RDMA READ/WRITE bytes in flight

	pending uct.PendingQueue
	inPend  bool // in iface.pendEPs; guarded by iface.pendMu
}

// epSeq numbers the endpoints in creation order.
var epSeq atomic.Uint64

func newEP(i *iface) (*ep, error) {
	m := i.md
	// The device lock keeps the CQs, SRQ and PD alive (md.kill releases
	// them with it held, after marking the MD dead).
	m.devMu.RLock()
	defer m.devMu.RUnlock()
	if m.ctxClosed || m.dead.Load() || i.scq == nil {
		return nil, fmt.Errorf("ib: create ep: %w", m.gone())
	}
	qp, err := m.pd.CreateQP(i.scq, i.rcq, i.srq, ibv.QPCaps{MaxSendWR: i.txq, MaxSendSGE: i.maxIOV + 1, MaxInline: i.maxInline})
	if err != nil {
		return nil, fmt.Errorf("ib: create ep: %w", err)
	}
	if err := qp.ToInit(i.port.num, ibv.AccessLocalWrite|ibv.AccessRemoteWrite|ibv.AccessRemoteRead); err != nil {
		qp.Close()
		return nil, fmt.Errorf("ib: create ep: %w", err)
	}
	var r [4]byte
	rand.Read(r[:])
	e := &ep{i: i, qp: qp, qpn: qp.QPN, seq: epSeq.Add(1), psn: binary.LittleEndian.Uint32(r[:]) & 0xffffff, gid: i.port.gid, ops: make([]txOp, i.txq)}
	if err := i.addEP(e); err != nil {
		qp.Close()
		return nil, fmt.Errorf("ib: create ep: %w", err)
	}
	return e, nil
}

// Address packs this endpoint's QP for the peer's ConnectToEP.
func (e *ep) Address() ([]byte, error) {
	i := e.i
	b := make([]byte, epAddrLen)
	binary.LittleEndian.PutUint32(b[0:], e.qp.QPN)
	binary.LittleEndian.PutUint32(b[4:], e.psn)
	copy(b[8:24], e.gid.GID[:])
	binary.LittleEndian.PutUint16(b[24:], i.port.attr.LID)
	b[26] = byte(i.port.attr.ActiveMTU)
	return b, nil
}

// ConnectToEP moves the QP INIT→RTR→RTS towards the peer endpoint whose
// address is epAddr (rnr_retry=7, path MTU the smaller of both ports').
// Requests queued with PendingAdd before run once connected.
func (e *ep) ConnectToEP(devAddr, epAddr []byte) error {
	i := e.i
	if len(epAddr) != epAddrLen {
		return fmt.Errorf("ib: connect: ep address of %d bytes, want %d: %w", len(epAddr), epAddrLen, uct.ErrInvalidParam)
	}
	if devAddr != nil && !i.IsReachable(devAddr, nil) {
		return fmt.Errorf("ib: connect: %w", uct.ErrUnreachable)
	}
	mtu := min(int(epAddr[26]), i.port.attr.ActiveMTU)
	if mtu < 1 {
		return fmt.Errorf("ib: connect: peer MTU %d: %w", epAddr[26], uct.ErrInvalidParam)
	}
	a := ibv.RTRAttr{Port: i.port.num, DestQPN: binary.LittleEndian.Uint32(epAddr[0:]) & 0xffffff,
		RQPSN: binary.LittleEndian.Uint32(epAddr[4:]) & 0xffffff, MTU: mtu,
		DLID: binary.LittleEndian.Uint16(epAddr[24:]), SGIDIndex: e.gid.Index,
		MaxDestRdAt: i.rdAtomic, MinRNRTimer: minRNRTimer}
	copy(a.DGID[:], epAddr[8:24])
	// RoCE always routes with a GRH; InfiniBand only across subnets.
	a.Global = i.port.attr.LinkLayer == ibv.LinkLayerEthernet || string(a.DGID[:8]) != string(e.gid.GID[:8])
	e.mu.Lock()
	if e.state != epCreated {
		st := e.state
		e.mu.Unlock()
		if st == epClosed {
			return fmt.Errorf("ib: connect: %w", uct.ErrClosed)
		}
		if st == epFailed {
			return fmt.Errorf("ib: connect: %w", e.err)
		}
		return fmt.Errorf("ib: connect: endpoint already connected: %w", uct.ErrInvalidParam)
	}
	err := e.qp.ToRTR(&a)
	if err == nil {
		retry := qpRetry
		if i.port.rxeSW {
			// Soft-RoCE retries forever with a retry count of 7 (only
			// the RNR count means that in the spec): 6 bounds it, so
			// a QP whose peer is gone fails (~0.5 s) instead of hanging.
			retry = 6
		}
		err = e.qp.ToRTS(e.psn, qpTimeout, retry, qpRNRRetry, i.rdAtomic)
	}
	if err != nil {
		e.mu.Unlock()
		return fmt.Errorf("ib: connect: %w", err)
	}
	e.state = epConnected
	queued := e.pending.Len() > 0
	e.mu.Unlock()
	if queued {
		i.w.Post(e.dispatch)
	}
	return nil
}

// reserve checks the endpoint can post one more work request and takes a
// send CQ credit. Called with mu held.
func (e *ep) reserve() error {
	switch e.state {
	case epCreated:
		return uct.ErrNoResource
	case epFailed:
		return e.err
	case epClosed:
		return fmt.Errorf("ib: %w", uct.ErrClosed)
	}
	if e.tail-e.head >= uint64(len(e.ops)) || !e.i.takeCredit() {
		return uct.ErrNoResource
	}
	return nil
}

func (e *ep) wrid() uint64 { return uint64(e.slot)<<32 | (e.tail & 0xffffffff) }

// posted commits the reserved op after a post: on failure the credit is
// returned and the endpoint fails (a post only fails on a broken QP).
func (e *ep) posted(err error, comp *uct.Completion, b *seg) error {
	if err != nil {
		e.i.txCredits.Add(1)
		e.failLocked(fmt.Errorf("ib: post send: %v: %w", err, uct.ErrEndpointReset))
		return e.err
	}
	e.ops[e.tail%uint64(len(e.ops))] = txOp{comp: comp, bounce: b}
	e.tail++
	return nil
}

func checkID(id uint8) error {
	if id >= uct.MaxAMID {
		return fmt.Errorf("ib: am id %d: %w", id, uct.ErrInvalidParam)
	}
	return nil
}

// AMShort sends hdr and payload inline, the AM id in the immediate data.
func (e *ep) AMShort(id uint8, hdr uint64, payload []byte) error {
	if err := checkID(id); err != nil {
		return err
	}
	if len(payload) > e.i.attr.MaxShort || !e.i.attr.Cap.Has(uct.CapAMShort) {
		return fmt.Errorf("ib: am short of %d bytes (max %d): %w", len(payload), e.i.attr.MaxShort, uct.ErrMessageSize)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.reserve(); err != nil {
		return err
	}
	return e.posted(e.qp.PostInline(e.wrid(), uint32(id), hdr, payload, ibv.SendSignaled), nil, nil)
}

// AMBcopy packs into a registered bounce buffer and sends it; small
// messages go inline and release the buffer at once.
func (e *ep) AMBcopy(id uint8, pack func(buf []byte) int) (int, error) {
	if err := checkID(id); err != nil {
		return 0, err
	}
	i := e.i
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.reserve(); err != nil {
		return 0, err
	}
	b, err := i.bounce.get()
	if err != nil {
		i.txCredits.Add(1)
		return 0, err
	}
	n := pack(b.buf)
	if n < 0 || n > len(b.buf) {
		i.bounce.put(b)
		i.txCredits.Add(1)
		return 0, fmt.Errorf("ib: am bcopy packed %d bytes (max %d): %w", n, len(b.buf), uct.ErrMessageSize)
	}
	e.wr = ibv.SendWR{WRID: e.wrid(), Imm: uint32(id), Opcode: ibv.OpSendImm, Flags: ibv.SendSignaled, NSGE: 1}
	e.sges[0] = ibv.SGE{Addr: b.addr, Length: uint32(n), LKey: b.lkey}
	if n <= i.maxInline {
		e.wr.Flags |= ibv.SendInline
		err = e.posted(e.qp.PostSend(&e.wr, &e.sges[0]), nil, nil)
		i.bounce.put(b) // inline data was copied by the post
	} else if err = e.posted(e.qp.PostSend(&e.wr, &e.sges[0]), nil, b); err != nil {
		i.bounce.put(b)
	}
	if err != nil {
		return 0, err
	}
	return n, nil
}

// fillIOV appends iov to the SGE list from index k, checking each buffer
// lies in its registration; it returns the new SGE count and total bytes.
func (e *ep) fillIOV(k int, iov []uct.IOV, needWrite bool) (int, int, error) {
	total := 0
	for _, v := range iov {
		if len(v.Buf) == 0 {
			continue
		}
		h, ok := v.MemH.(*memh)
		if !ok || h == nil || h.mr == nil {
			return 0, 0, fmt.Errorf("ib: iov of %d bytes without a registration: %w", len(v.Buf), uct.ErrInvalidParam)
		}
		if needWrite && h.access&(uct.AccessLocalWrite|uct.AccessRemoteWrite) == 0 {
			return 0, 0, fmt.Errorf("ib: get into memory registered without local write: %w", uct.ErrInvalidParam)
		}
		addr := uintptr(unsafe.Pointer(unsafe.SliceData(v.Buf)))
		if addr < h.mr.Addr || addr+uintptr(len(v.Buf)) > h.mr.Addr+uintptr(h.mr.Len) {
			return 0, 0, fmt.Errorf("ib: iov outside its registration: %w", uct.ErrInvalidParam)
		}
		e.sges[k] = ibv.SGE{Addr: uint64(addr), Length: uint32(len(v.Buf)), LKey: h.mr.LKey}
		k++
		total += len(v.Buf)
	}
	return k, total, nil
}

// AMZcopy sends header (copied to a bounce buffer) and iov from registered
// user memory; comp fires when the peer acknowledged it and iov may be reused.
func (e *ep) AMZcopy(id uint8, header []byte, iov []uct.IOV, comp *uct.Completion) error {
	if err := checkID(id); err != nil {
		return err
	}
	i := e.i
	if len(header) > i.attr.MaxHeader || len(iov) > i.maxIOV || len(header)+uct.IOVLen(iov) > i.attr.MaxZcopy {
		return fmt.Errorf("ib: am zcopy of %d+%d bytes in %d iovs: %w", len(header), uct.IOVLen(iov), len(iov), uct.ErrMessageSize)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.reserve(); err != nil {
		return err
	}
	var b *seg
	k := 0
	if len(header) > 0 {
		var err error
		if b, err = i.bounce.get(); err != nil {
			i.txCredits.Add(1)
			return err
		}
		copy(b.buf, header)
		e.sges[0] = ibv.SGE{Addr: b.addr, Length: uint32(len(header)), LKey: b.lkey}
		k = 1
	}
	k, _, err := e.fillIOV(k, iov, false)
	if err != nil {
		if b != nil {
			i.bounce.put(b)
		}
		i.txCredits.Add(1)
		return err
	}
	e.wr = ibv.SendWR{WRID: e.wrid(), Imm: uint32(id), Opcode: ibv.OpSendImm, Flags: ibv.SendSignaled, NSGE: uint32(k)}
	if err := e.posted(e.qp.PostSend(&e.wr, &e.sges[0]), comp, b); err != nil {
		if b != nil {
			i.bounce.put(b)
		}
		return err
	}
	return uct.ErrInProgress
}

func (e *ep) rma(op uint32, iov []uct.IOV, raddr uint64, rkey []byte, comp *uct.Completion) error {
	i := e.i
	if len(rkey) != 4 {
		return fmt.Errorf("ib: rkey of %d bytes, want 4: %w", len(rkey), uct.ErrInvalidParam)
	}
	if len(iov) > i.maxIOV {
		return fmt.Errorf("ib: %d iovs (max %d): %w", len(iov), i.maxIOV, uct.ErrMessageSize)
	}
	total := uct.IOVLen(iov)
	if total > i.attr.MaxPut {
		return fmt.Errorf("ib: rma of %d bytes: %w", total, uct.ErrMessageSize)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.reserve(); err != nil {
		return err
	}
	if total == 0 {
		i.txCredits.Add(1)
		return nil
	}
	if e.rmaBytes > 0 && e.rmaBytes+total > maxRMAInflight {
		i.txCredits.Add(1)
		return uct.ErrNoResource
	}
	k, _, err := e.fillIOV(0, iov, op == ibv.OpRDMARead)
	if err != nil {
		i.txCredits.Add(1)
		return err
	}
	e.wr = ibv.SendWR{WRID: e.wrid(), RAddr: raddr, RKey: binary.LittleEndian.Uint32(rkey),
		Opcode: op, Flags: ibv.SendSignaled, NSGE: uint32(k)}
	if err := e.posted(e.qp.PostSend(&e.wr, &e.sges[0]), comp, nil); err != nil {
		return err
	}
	e.ops[(e.tail-1)%uint64(len(e.ops))].rma = total
	e.rmaBytes += total
	return uct.ErrInProgress
}

// PutZcopy writes iov to the peer's registered memory (RDMA WRITE).
func (e *ep) PutZcopy(iov []uct.IOV, raddr uint64, rkey []byte, comp *uct.Completion) error {
	return e.rma(ibv.OpRDMAWrite, iov, raddr, rkey, comp)
}

// GetZcopy reads the peer's registered memory into iov (RDMA READ); iov must
// be registered with local write access.
func (e *ep) GetZcopy(iov []uct.IOV, raddr uint64, rkey []byte, comp *uct.Completion) error {
	return e.rma(ibv.OpRDMARead, iov, raddr, rkey, comp)
}

// Flush completes when every operation posted before it has completed.
func (e *ep) Flush(comp *uct.Completion) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch e.state {
	case epFailed:
		return e.err
	case epClosed:
		return fmt.Errorf("ib: flush: %w", uct.ErrClosed)
	}
	if e.pending.Len() > 0 {
		return uct.ErrNoResource
	}
	if e.head == e.tail {
		return nil
	}
	e.flushes = append(e.flushes, flushReq{seq: e.tail - 1, comp: comp})
	return uct.ErrInProgress
}

// PendingAdd queues r until a send completion frees resources (or the
// endpoint connects); ErrBusy when it could send now.
func (e *ep) PendingAdd(r *uct.PendingReq) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch e.state {
	case epFailed:
		return e.err
	case epClosed:
		return fmt.Errorf("ib: pending add: %w", uct.ErrClosed)
	case epConnected:
		// Busy only when nothing could have refused the send; an RDMA
		// operation in flight (the bytes cap) will dispatch the queue.
		if e.tail-e.head < uint64(len(e.ops)) && e.i.txCredits.Load() > 0 && e.i.bounce.available() && e.rmaBytes == 0 {
			return uct.ErrBusy
		}
		e.pending.Add(r)
		e.i.addPending(e)
		return nil
	}
	e.pending.Add(r) // not connected yet: ConnectToEP dispatches
	return nil
}

// dispatch runs queued requests (on the worker).
func (e *ep) dispatch() {
	e.pending.Dispatch()
	if e.pending.Len() == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch e.state {
	case epConnected:
		if e.head == e.tail {
			// Nothing in flight on this EP will complete to re-dispatch:
			// retry from the worker (iface-wide resources are short).
			e.i.w.Post(e.dispatch)
			return
		}
		e.i.addPending(e)
	case epFailed, epClosed:
		e.pending.Purge(nil)
	}
}

func (e *ep) PendingPurge(cb func(r *uct.PendingReq)) { e.pending.Purge(cb) }

// complete releases the op a send completion names. Called by Progress
// under pollMu; completions to fire are collected in i.fire.
func (e *ep) complete(wc *ibv.WC) {
	i := e.i
	e.mu.Lock()
	if e.head == e.tail {
		e.mu.Unlock()
		return
	}
	op := &e.ops[e.head%uint64(len(e.ops))]
	comp, b := op.comp, op.bounce
	e.rmaBytes -= op.rma
	*op = txOp{}
	seq := e.head
	e.head++
	var err error
	if wc.Status != ibv.WCSuccess {
		switch e.state {
		case epClosed:
			err = fmt.Errorf("ib: %w", uct.ErrCanceled)
		case epFailed:
			err = e.err
		default:
			e.failLocked(fmt.Errorf("ib: %s (vendor error %#x): %w", ibv.StatusString(wc.Status), wc.VendorErr, uct.ErrEndpointReset))
			err = e.err
			i.fire = append(i.fire, doneEvent{failed: e, err: err})
		}
	}
	if comp != nil {
		i.fire = append(i.fire, doneEvent{comp: comp, err: err})
	}
	for len(e.flushes) > 0 && e.flushes[0].seq <= seq {
		fe := err
		if e.state == epFailed {
			fe = e.err
		}
		i.fire = append(i.fire, doneEvent{comp: e.flushes[0].comp, err: fe})
		e.flushes[0] = flushReq{}
		e.flushes = e.flushes[1:]
	}
	destroy := e.state == epClosed && e.head == e.tail && !e.destroyed
	if destroy {
		e.destroyed = true
	}
	e.mu.Unlock()
	if b != nil {
		i.bounce.put(b)
	}
	if destroy {
		e.qp.Close()
		i.removeEP(e)
	}
	if err != nil && e.pending.Len() > 0 {
		i.addPending(e) // let queued requests see the error
	}
}

// failLocked moves the endpoint to the failed state and its QP to error, so
// the remaining work requests complete (flushed) promptly.
func (e *ep) failLocked(err error) {
	if e.state != epConnected && e.state != epCreated {
		return
	}
	e.state = epFailed
	e.err = err
	e.qp.ToErr()
}

// asyncFail fails a live endpoint whose QP the device reports in the error
// state (an async event, confirmed by querying the QP: the QP number may
// have been reused): operations in flight complete flushed with err, and
// IfaceParams.ErrHandler hears of it on the worker. Called by md.check.
func (e *ep) asyncFail(err error) {
	e.mu.Lock()
	if e.state != epConnected && e.state != epCreated {
		e.mu.Unlock()
		return
	}
	if st, qerr := e.qp.State(); qerr == nil && st != ibv.QPStateErr {
		e.mu.Unlock()
		return // a stale event about an earlier QP of the same number
	}
	e.failLocked(err)
	e.mu.Unlock()
	i := e.i
	h := i.params.ErrHandler
	i.w.Post(func() {
		if h != nil {
			h(e, err)
		}
		e.dispatch() // queued requests see the error
	})
}

// kill fails the endpoint for good with err (its device is gone, md.kill):
// operations in flight and flushes fail with err (ErrCanceled if it was
// closed), the QP is destroyed, the slot freed. It appends what to fire to
// fire (completions, and the failure of a live endpoint) and returns it.
func (e *ep) kill(err error, fire []doneEvent) []doneEvent {
	e.mu.Lock()
	opErr := err
	switch e.state {
	case epConnected, epCreated:
		e.state = epFailed
		e.err = err
		fire = append(fire, doneEvent{failed: e, err: err})
	case epFailed:
		opErr = e.err
	case epClosed:
		opErr = fmt.Errorf("ib: %w", uct.ErrCanceled)
	}
	if e.destroyed {
		e.mu.Unlock()
		return fire
	}
	e.destroyed = true
	for ; e.head != e.tail; e.head++ {
		op := &e.ops[e.head%uint64(len(e.ops))]
		if op.bounce != nil {
			e.i.bounce.put(op.bounce)
		}
		if op.comp != nil {
			fire = append(fire, doneEvent{comp: op.comp, err: opErr})
		}
		*op = txOp{}
	}
	e.rmaBytes = 0
	for _, f := range e.flushes {
		fire = append(fire, doneEvent{comp: f.comp, err: opErr})
	}
	e.flushes = nil
	e.qp.Close()
	e.mu.Unlock()
	e.i.removeEP(e)
	return fire
}

// Close moves the QP to the error state; operations in flight complete with
// ErrCanceled and the QP is destroyed once they have. Idempotent.
func (e *ep) Close() error {
	e.mu.Lock()
	if e.state == epClosed {
		e.mu.Unlock()
		return nil
	}
	e.state = epClosed
	if e.destroyed { // kill released it with its device
		e.mu.Unlock()
		e.pending.Purge(nil)
		return nil
	}
	idle := e.head == e.tail
	if idle {
		e.destroyed = true
	} else {
		e.qp.ToErr()
	}
	e.mu.Unlock()
	e.pending.Purge(nil)
	if idle {
		err := e.qp.Close()
		e.i.removeEP(e)
		if err != nil {
			return fmt.Errorf("ib: close ep: %w", err)
		}
	}
	return nil
}

// abandon destroys a closed endpoint whose completions never came (iface
// close after its drain timed out) and fails what was left in flight.
func (e *ep) abandon() {
	e.mu.Lock()
	if e.destroyed {
		e.mu.Unlock()
		return
	}
	e.destroyed = true
	var fire []doneEvent
	for ; e.head != e.tail; e.head++ {
		op := &e.ops[e.head%uint64(len(e.ops))]
		if op.bounce != nil {
			e.i.bounce.put(op.bounce)
		}
		if op.comp != nil {
			fire = append(fire, doneEvent{comp: op.comp, err: fmt.Errorf("ib: %w", uct.ErrCanceled)})
		}
		*op = txOp{}
	}
	for _, f := range e.flushes {
		fire = append(fire, doneEvent{comp: f.comp, err: fmt.Errorf("ib: %w", uct.ErrCanceled)})
	}
	e.flushes = nil
	e.mu.Unlock()
	e.qp.Close()
	e.i.removeEP(e)
	for _, f := range fire {
		f.comp.Done(f.err)
	}
}
