//go:build linux && cgo && !noverbs

package ibv

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"syscall"
	"unsafe"
)

// Access flags (enum ibv_access_flags).
const (
	AccessLocalWrite  = C.IBV_ACCESS_LOCAL_WRITE
	AccessRemoteWrite = C.IBV_ACCESS_REMOTE_WRITE
	AccessRemoteRead  = C.IBV_ACCESS_REMOTE_READ
)

// PD is a protection domain.
type PD struct {
	p   *C.struct_ibv_pd
	ctx *Context
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	p, err := C.gouct_alloc_pd(c.p)
	if p == nil {
		return nil, fmt.Errorf("ibv_alloc_pd %s: %w", c.name, errnoOr(err, syscall.ENOMEM))
	}
	return &PD{p: p, ctx: c}, nil
}

// Close deallocates the PD; its MRs, SRQs and QPs must be closed first.
func (pd *PD) Close() error {
	if pd == nil || pd.p == nil {
		return nil
	}
	rc := C.gouct_dealloc_pd(pd.p)
	pd.p = nil
	if rc != 0 {
		return fmt.Errorf("ibv_dealloc_pd: %w", syscall.Errno(rc))
	}
	return nil
}

// MR is a memory registration.
type MR struct {
	p          *C.struct_ibv_mr
	Addr       uintptr
	Len        int
	LKey, RKey uint32
}

// RegMR registers [addr, addr+n). The memory must stay mapped (and, for Go
// memory, pinned with runtime.Pinner) until Close. The address crosses into
// C as an integer: Go memory may hold unpinned Go pointers (a buffer inside
// a struct), which cgo's pointer check rejects although C never reads them.
func (pd *PD) RegMR(addr uintptr, n int, access int) (*MR, error) {
	m := new(MR)
	if err := pd.RegMRInto(m, addr, n, access); err != nil {
		return nil, err
	}
	return m, nil
}

// RegMRInto is RegMR filling m (closed, or zero) instead of allocating one.
func (pd *PD) RegMRInto(m *MR, addr uintptr, n int, access int) error {
	p, err := C.gouct_reg_mr(pd.p, C.uintptr_t(addr), C.size_t(n), C.int(access))
	if p == nil {
		return fmt.Errorf("ibv_reg_mr %d bytes: %w", n, errnoOr(err, syscall.ENOMEM))
	}
	*m = MR{p: p, Addr: addr, Len: n, LKey: uint32(p.lkey), RKey: uint32(p.rkey)}
	return nil
}

// Close deregisters the memory.
func (m *MR) Close() error {
	if m == nil || m.p == nil {
		return nil
	}
	rc := C.gouct_dereg_mr(m.p)
	m.p = nil
	if rc != 0 {
		return fmt.Errorf("ibv_dereg_mr: %w", syscall.Errno(rc))
	}
	return nil
}

// CompChannel is a completion event channel.
type CompChannel struct {
	p *C.struct_ibv_comp_channel
}

// CreateCompChannel creates a completion channel.
func (c *Context) CreateCompChannel() (*CompChannel, error) {
	p, err := C.gouct_create_comp_channel(c.p)
	if p == nil {
		return nil, fmt.Errorf("ibv_create_comp_channel: %w", errnoOr(err, syscall.ENOMEM))
	}
	return &CompChannel{p: p}, nil
}

// FD is the channel's file descriptor, owned by the channel.
func (ch *CompChannel) FD() int { return int(ch.p.fd) }

// GetEvent reads one event (ibv_get_cq_event) and returns the handle of its
// CQ (compare with CQ.Handle); on a non-blocking fd without events it
// returns syscall.EAGAIN. The caller acknowledges with CQ.AckEvents.
func (ch *CompChannel) GetEvent() (uintptr, error) {
	cq, err := C.gouct_get_cq_event(ch.p)
	if cq == nil {
		return 0, errnoOr(err, syscall.EIO)
	}
	return uintptr(unsafe.Pointer(cq)), nil
}

// Close destroys the channel; its CQs must be closed first.
func (ch *CompChannel) Close() error {
	if ch == nil || ch.p == nil {
		return nil
	}
	rc := C.gouct_destroy_comp_channel(ch.p)
	ch.p = nil
	if rc != 0 {
		return fmt.Errorf("ibv_destroy_comp_channel: %w", syscall.Errno(rc))
	}
	return nil
}

// CQ is a completion queue.
type CQ struct {
	p   *C.struct_ibv_cq
	CQE int
}

// CreateCQ creates a CQ of at least cqe entries, reporting to ch (may be nil).
func (c *Context) CreateCQ(cqe int, ch *CompChannel) (*CQ, error) {
	var chp *C.struct_ibv_comp_channel
	if ch != nil {
		chp = ch.p
	}
	p, err := C.gouct_create_cq(c.p, C.int(cqe), chp)
	if p == nil {
		return nil, fmt.Errorf("ibv_create_cq %d: %w", cqe, errnoOr(err, syscall.ENOMEM))
	}
	return &CQ{p: p, CQE: int(p.cqe)}, nil
}

// Handle identifies the CQ in CompChannel.GetEvent results.
func (cq *CQ) Handle() uintptr { return uintptr(unsafe.Pointer(cq.p)) }

// WC is one work completion, laid out as struct gouct_wc.
type WC struct {
	WRID      uint64
	Status    uint32
	Opcode    uint32
	ByteLen   uint32
	Imm       uint32
	QPNum     uint32
	VendorErr uint32
}

// Completion statuses and opcodes (enum ibv_wc_status, ibv_wc_opcode).
const (
	WCSuccess  = C.IBV_WC_SUCCESS
	WCFlushErr = C.IBV_WC_WR_FLUSH_ERR
	WCRecv     = C.IBV_WC_RECV
)

// StatusString names a completion status (ibv_wc_status_str's names).
func StatusString(s uint32) string {
	names := map[uint32]string{
		C.IBV_WC_SUCCESS: "success", C.IBV_WC_LOC_LEN_ERR: "local length error",
		C.IBV_WC_LOC_QP_OP_ERR: "local QP operation error", C.IBV_WC_LOC_PROT_ERR: "local protection error",
		C.IBV_WC_WR_FLUSH_ERR: "work request flushed", C.IBV_WC_REM_INV_REQ_ERR: "remote invalid request",
		C.IBV_WC_REM_ACCESS_ERR: "remote access error", C.IBV_WC_REM_OP_ERR: "remote operation error",
		C.IBV_WC_RETRY_EXC_ERR:     "transport retry counter exceeded",
		C.IBV_WC_RNR_RETRY_EXC_ERR: "RNR retry counter exceeded",
		C.IBV_WC_REM_ABORT_ERR:     "remote aborted", C.IBV_WC_GENERAL_ERR: "general error",
	}
	if n, ok := names[s]; ok {
		return n
	}
	return fmt.Sprintf("status %d", s)
}

// PollBoth polls up to min(len, 32) completions of rcq into rwc and of scq
// into swc in one cgo crossing, and returns how many of each.
func PollBoth(rcq *CQ, rwc []WC, scq *CQ, swc []WC) (nr, ns int, err error) {
	n := min(len(rwc), len(swc), 32)
	if n == 0 {
		return 0, 0, nil
	}
	r := C.gouct_poll2(rcq.p, (*C.struct_gouct_wc)(unsafe.Pointer(&rwc[0])), scq.p,
		(*C.struct_gouct_wc)(unsafe.Pointer(&swc[0])), C.int(n))
	if r < 0 {
		return 0, 0, fmt.Errorf("ibv_poll_cq: %w", syscall.EIO)
	}
	return int(r & 0xffff), int(r >> 16), nil
}

// ReqNotify arms the CQ for its next completion (ibv_req_notify_cq).
func (cq *CQ) ReqNotify() error {
	if rc := C.gouct_req_notify(cq.p); rc != 0 {
		return fmt.Errorf("ibv_req_notify_cq: %w", syscall.Errno(rc))
	}
	return nil
}

// AckEvents acknowledges n events got from the channel for this CQ.
func (cq *CQ) AckEvents(n int) {
	if n > 0 {
		C.gouct_ack_cq_events(cq.p, C.uint(n))
	}
}

// Close destroys the CQ; every event got for it must be acknowledged.
func (cq *CQ) Close() error {
	if cq == nil || cq.p == nil {
		return nil
	}
	rc := C.gouct_destroy_cq(cq.p)
	cq.p = nil
	if rc != 0 {
		return fmt.Errorf("ibv_destroy_cq: %w", syscall.Errno(rc))
	}
	return nil
}

// SRQ is a shared receive queue.
type SRQ struct {
	p *C.struct_ibv_srq
}

// CreateSRQ creates a shared receive queue of maxWR single-SGE receives.
func (pd *PD) CreateSRQ(maxWR int) (*SRQ, error) {
	p, err := C.gouct_create_srq(pd.p, C.uint32_t(maxWR), 1)
	if p == nil {
		return nil, fmt.Errorf("ibv_create_srq %d: %w", maxWR, errnoOr(err, syscall.ENOMEM))
	}
	return &SRQ{p: p}, nil
}

// RecvBuf is one receive buffer to post, laid out as struct gouct_rbuf.
type RecvBuf struct {
	Addr uint64
	WRID uint64
	Len  uint32
	LKey uint32
}

// PostRecv posts the buffers in one cgo crossing.
func (s *SRQ) PostRecv(b []RecvBuf) error {
	if len(b) == 0 {
		return nil
	}
	if rc := C.gouct_post_srq(s.p, (*C.struct_gouct_rbuf)(unsafe.Pointer(&b[0])), C.int(len(b))); rc != 0 {
		return fmt.Errorf("ibv_post_srq_recv: %w", syscall.Errno(rc))
	}
	return nil
}

// Close destroys the SRQ; the QPs using it must be closed first.
func (s *SRQ) Close() error {
	if s == nil || s.p == nil {
		return nil
	}
	rc := C.gouct_destroy_srq(s.p)
	s.p = nil
	if rc != 0 {
		return fmt.Errorf("ibv_destroy_srq: %w", syscall.Errno(rc))
	}
	return nil
}

// QP is a reliable-connected queue pair.
type QP struct {
	p         *C.struct_ibv_qp
	QPN       uint32
	MaxInline int
}

// QPCaps are the sizes asked for at QP creation.
type QPCaps struct {
	MaxSendWR, MaxSendSGE, MaxInline int
}

// CreateQP creates an RC QP sending on scq and receiving on srq (completions
// on rcq).
func (pd *PD) CreateQP(scq, rcq *CQ, srq *SRQ, caps QPCaps) (*QP, error) {
	var inl C.uint32_t
	p, err := C.gouct_create_qp(pd.p, scq.p, rcq.p, srq.p, C.uint32_t(caps.MaxSendWR),
		C.uint32_t(caps.MaxSendSGE), C.uint32_t(caps.MaxInline), &inl)
	if p == nil {
		return nil, fmt.Errorf("ibv_create_qp: %w", errnoOr(err, syscall.ENOMEM))
	}
	return &QP{p: p, QPN: uint32(p.qp_num), MaxInline: int(inl)}, nil
}

// ToInit moves the QP to INIT on port with the given remote access flags.
func (q *QP) ToInit(port, access int) error {
	if rc := C.gouct_qp_init(q.p, C.uint8_t(port), C.int(access)); rc != 0 {
		return fmt.Errorf("modify QP %#x to INIT: %w", q.QPN, syscall.Errno(rc))
	}
	return nil
}

// RTRAttr are the remote side's parameters for ToRTR.
type RTRAttr struct {
	Port        int
	DestQPN     uint32
	RQPSN       uint32
	MTU         int // enum ibv_mtu
	DLID        uint16
	DGID        [16]byte
	Global      bool // route with a GRH (RoCE, or IB across subnets)
	SGIDIndex   int
	MaxDestRdAt int
	MinRNRTimer int
}

// ToRTR moves the QP to ready-to-receive.
func (q *QP) ToRTR(a *RTRAttr) error {
	g := 0
	if a.Global {
		g = 1
	}
	rc := C.gouct_qp_rtr(q.p, C.uint8_t(a.Port), C.uint32_t(a.DestQPN), C.uint32_t(a.RQPSN), C.int(a.MTU),
		C.uint16_t(a.DLID), (*C.uint8_t)(unsafe.Pointer(&a.DGID[0])), C.int(g), C.int(a.SGIDIndex),
		C.int(a.MaxDestRdAt), C.int(a.MinRNRTimer))
	if rc != 0 {
		return fmt.Errorf("modify QP %#x to RTR: %w", q.QPN, syscall.Errno(rc))
	}
	return nil
}

// ToRTS moves the QP to ready-to-send.
func (q *QP) ToRTS(sqPSN uint32, timeout, retry, rnrRetry, maxRdAtomic int) error {
	if rc := C.gouct_qp_rts(q.p, C.uint32_t(sqPSN), C.int(timeout), C.int(retry), C.int(rnrRetry),
		C.int(maxRdAtomic)); rc != 0 {
		return fmt.Errorf("modify QP %#x to RTS: %w", q.QPN, syscall.Errno(rc))
	}
	return nil
}

// ToErr moves the QP to the error state: outstanding work completes flushed.
func (q *QP) ToErr() error {
	if rc := C.gouct_qp_to_err(q.p); rc != 0 {
		return fmt.Errorf("modify QP %#x to ERR: %w", q.QPN, syscall.Errno(rc))
	}
	return nil
}

// QPStateErr is the error state (IBV_QPS_ERR).
const QPStateErr = C.IBV_QPS_ERR

// State queries the QP's current state (ibv_query_qp; enum ibv_qp_state).
func (q *QP) State() (int, error) {
	rc := C.gouct_qp_state(q.p)
	if rc < 0 {
		return 0, fmt.Errorf("ibv_query_qp %#x: %w", q.QPN, syscall.Errno(-rc))
	}
	return int(rc), nil
}

// Send opcodes and flags (enum ibv_wr_opcode, ibv_send_flags).
const (
	OpSendImm    = C.IBV_WR_SEND_WITH_IMM
	OpRDMAWrite  = C.IBV_WR_RDMA_WRITE
	OpRDMARead   = C.IBV_WR_RDMA_READ
	SendSignaled = C.IBV_SEND_SIGNALED
	SendInline   = C.IBV_SEND_INLINE
)

// SGE is one scatter/gather element, laid out as struct ibv_sge.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send work request built from scalars, laid out as struct gouct_wr.
type SendWR struct {
	WRID   uint64
	RAddr  uint64
	RKey   uint32
	Imm    uint32
	Opcode uint32
	Flags  uint32
	NSGE   uint32
	_      uint32
}

// PostSend posts wr with sge[:wr.NSGE] (one cgo crossing). wr and sge must
// not hold Go pointers; the SGEs must name registered (or, with
// SendInline, any live) memory.
func (q *QP) PostSend(wr *SendWR, sge *SGE) error {
	if rc := C.gouct_post_send(q.p, (*C.struct_gouct_wr)(unsafe.Pointer(wr)),
		(*C.struct_ibv_sge)(unsafe.Pointer(sge))); rc != 0 {
		return syscall.Errno(rc)
	}
	return nil
}

// PostInline sends hdr (8 bytes little-endian) followed by p inline, as a
// SEND with immediate imm (one cgo crossing). p may be any Go memory,
// including a buffer inside a struct that holds Go pointers: its address
// crosses as an integer (the provider copies the bytes during the call, and
// a goroutine stack does not move while it is in C), p stays reachable
// until the call returns, and p may be reused on return.
func (q *QP) PostInline(wrid uint64, imm uint32, hdr uint64, p []byte, flags uint32) error {
	var addr uintptr
	if len(p) > 0 {
		addr = uintptr(unsafe.Pointer(&p[0]))
	}
	rc := C.gouct_post_inline(q.p, C.uint64_t(wrid), C.uint32_t(imm), C.uint64_t(hdr), C.uintptr_t(addr),
		C.uint32_t(len(p)), C.uint32_t(flags))
	runtime.KeepAlive(p)
	if rc != 0 {
		return syscall.Errno(rc)
	}
	return nil
}

// Close destroys the QP.
func (q *QP) Close() error {
	if q == nil || q.p == nil {
		return nil
	}
	rc := C.gouct_destroy_qp(q.p)
	q.p = nil
	if rc != 0 {
		return fmt.Errorf("ibv_destroy_qp %#x: %w", q.QPN, syscall.Errno(rc))
	}
	return nil
}

func init() {
	if unsafe.Sizeof(WC{}) != C.sizeof_struct_gouct_wc || unsafe.Sizeof(SendWR{}) != C.sizeof_struct_gouct_wr ||
		unsafe.Sizeof(SGE{}) != C.sizeof_struct_ibv_sge || unsafe.Sizeof(RecvBuf{}) != C.sizeof_struct_gouct_rbuf {
		panic("ibv: Go mirror structs do not match the C layout")
	}
}
