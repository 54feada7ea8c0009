//go:build linux && cgo && !noverbs

package ib

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/gouct/gouct/uct"
	"github.com/gouct/gouct/uct/internal/ibv"
)

// Fault injection, for tests only: nothing in gouct calls these. They let a
// test break a live connection the way a fatal QP error would, and check
// that the transport notices by itself.

// TestingEndpointQPs lists the QP numbers of the process's connected
// rc_verbs endpoints, every open MD, in the order the endpoints were
// created. For fault-injection tests only. Safe for concurrent use.
func TestingEndpointQPs() []TestingQP {
	type qp struct {
		seq uint64
		id  TestingQP
	}
	var qps []qp
	mdsMu.Lock()
	defer mdsMu.Unlock()
	for m := range mds {
		m.mu.Lock()
		for i := range m.ifaces {
			for _, e := range *i.eps.Load() {
				if e == nil {
					continue
				}
				e.mu.Lock()
				if e.state == epConnected {
					qps = append(qps, qp{e.seq, TestingQP{m.name, e.qpn}})
				}
				e.mu.Unlock()
			}
		}
		m.mu.Unlock()
	}
	slices.SortFunc(qps, func(a, b qp) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]TestingQP, len(qps))
	for k, q := range qps {
		out[k] = q.id
	}
	return out
}

// TestingForceQPError moves the QP q (a connected endpoint of this
// process) to the error state with ibv_modify_qp, as a fatal fault
// would, then hands the transport the QP-fatal async event such a fault
// raises: Soft-RoCE raises no event when a QP is moved to the error state by
// ibv_modify_qp, so the hook delivers it (md.asyncEvent, exactly as read
// from the device's event queue; a provider that does raise one has it
// ignored, the endpoint having failed already). It fails with
// ErrInvalidParam when no connected endpoint has that QP. For
// fault-injection tests only; safe for concurrent use.
func TestingForceQPError(q TestingQP) error {
	qpn := q.QPN
	mdsMu.Lock()
	defer mdsMu.Unlock()
	for m := range mds {
		if m.name != q.Device {
			continue
		}
		e := m.epByQPN(qpn)
		if e == nil {
			continue
		}
		e.mu.Lock()
		var err error
		if e.state != epConnected {
			err = fmt.Errorf("ib: QP %#x not connected: %w", qpn, uct.ErrInvalidParam)
		} else {
			err = e.qp.ToErr()
		}
		e.mu.Unlock()
		if err != nil {
			return err
		}
		m.devMu.RLock()
		defer m.devMu.RUnlock()
		if m.ctxClosed {
			return m.gone()
		}
		return m.asyncEvent(ibv.AsyncEvent{Type: ibv.EventQPFatal, QPN: qpn})
	}
	return fmt.Errorf("ib: no endpoint with QP %v: %w", q, uct.ErrInvalidParam)
}
