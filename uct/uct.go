// Package uct is a Go implementation of the UCX UCT transport layer: components,
// memory domains (MD), interfaces (Iface), endpoints (EP), active messages and a
// worker with a dedicated progress goroutine.
//
// Transports live in sub-packages (uct/self, uct/shm, uct/tcp, uct/ib) and register
// themselves at init, like database/sql drivers; import them for their side effect.
//
// Concurrency: every EP and Iface method is safe for concurrent use. AM handlers,
// Completion callbacks and pending callbacks run serialised under the worker's
// progress lock (normally on the worker's progress goroutine); they must not block
// and must not call user code directly: they hand off and signal.
package uct

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// Errors. ErrNoResource is an ordinary send result: the transport has no room now;
// queue the operation with EP.PendingAdd and retry when its callback runs.
var (
	ErrNoResource    = errors.New("uct: no resource")
	ErrInProgress    = errors.New("uct: operation in progress")
	ErrUnreachable   = errors.New("uct: destination unreachable")
	ErrNotSupported  = errors.New("uct: not supported")
	ErrUnavailable   = errors.New("uct: component unavailable")
	ErrBusy          = errors.New("uct: resources available now, retry the operation")
	ErrClosed        = errors.New("uct: closed")
	ErrCanceled      = errors.New("uct: operation canceled")
	ErrEndpointReset = errors.New("uct: endpoint failed")
	ErrInvalidParam  = errors.New("uct: invalid parameter")
	ErrOutOfRange    = errors.New("uct: remote address or key out of range")
	ErrMessageSize   = errors.New("uct: message too large")
)

// NotSupported returns an error wrapping ErrNotSupported that names the missing feature.
func NotSupported(feature string) error {
	return fmt.Errorf("%w: %s", ErrNotSupported, feature)
}

// Capability flags of an Iface (UCX UCT_IFACE_FLAG_*).
type Capability uint64

const (
	CapAMShort Capability = 1 << iota
	CapAMBcopy
	CapAMZcopy
	CapPutZcopy
	CapGetZcopy
	CapConnectToIface
	CapConnectToEP
	CapEvent // the iface can wake a sleeping worker
	CapPending
)

var capNames = []string{"am_short", "am_bcopy", "am_zcopy", "put_zcopy", "get_zcopy",
	"connect_to_iface", "connect_to_ep", "event", "pending"}

// Has reports whether every flag in f is set.
func (c Capability) Has(f Capability) bool { return c&f == f }

func (c Capability) String() string {
	s := ""
	for i, n := range capNames {
		if c&(1<<i) != 0 {
			if s != "" {
				s += ","
			}
			s += n
		}
	}
	return s
}

// AMHandler receives an active message. data is only valid during the call: a
// handler that keeps it must copy it. For AMShort, data is the 8-byte
// little-endian header followed by the payload; for AMBcopy, what the pack
// function wrote; for AMZcopy, the header followed by the iov contents.
// Handlers run under the worker's progress lock and must not block.
type AMHandler func(data []byte)

// MaxAMID bounds AM ids: valid ids are 0..MaxAMID-1.
const MaxAMID = 32

// IOV is one element of a zero-copy scatter/gather list. MemH is the
// registration of Buf (nil where the MD needs no registration).
type IOV struct {
	Buf  []byte
	MemH MemH
}

// IOVLen is the total length of iov.
func IOVLen(iov []IOV) int {
	n := 0
	for _, v := range iov {
		n += len(v.Buf)
	}
	return n
}

// Completion tracks asynchronous operations (UCX uct_completion_t). Each
// operation that returns ErrInProgress decrements Count when it finishes; when
// Count reaches zero, Func runs on the worker with the first error seen (nil
// on success). Set Count to the number of operations before posting them.
type Completion struct {
	Count  atomic.Int32
	status atomic.Pointer[error]
	Func   func(status error)
}

// NewCompletion returns a Completion expecting count operations.
func NewCompletion(count int32, fn func(status error)) *Completion {
	c := &Completion{Func: fn}
	c.Count.Store(count)
	return c
}

// Done records one finished operation with status err (transports call it).
func (c *Completion) Done(err error) {
	if c == nil {
		return
	}
	if err != nil {
		e := err // only an error costs an allocation: a successful Done allocates nothing
		c.status.CompareAndSwap(nil, &e)
	}
	if c.Count.Add(-1) == 0 && c.Func != nil {
		var st error
		if p := c.status.Load(); p != nil {
			st = *p
		}
		c.Func(st)
	}
}

// Status is the first error recorded, or nil.
func (c *Completion) Status() error {
	if p := c.status.Load(); p != nil {
		return *p
	}
	return nil
}
