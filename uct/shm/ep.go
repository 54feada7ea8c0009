//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/gouct/gouct/uct"
)

// epClosed is the closed bit of ep.state; the low bits count calls in
// flight that may touch the peer's mapping.
const epClosed = 1 << 62

// ep sends into one peer iface's FIFO. Every method is safe for concurrent
// use. Sends complete before they return: buffers may be reused at once.
type ep struct {
	iface   *iface
	rem     *remote
	f       *fifo // rem.f
	state   atomic.Int64
	pending uct.PendingQueue
	listed  bool // in iface.pendEPs; under iface.pendMu
	failed  atomic.Bool
}

// enter counts a call that uses the peer mapping; false after Close.
func (e *ep) enter() bool {
	if e.state.Add(1)&epClosed != 0 {
		e.state.Add(-1)
		return false
	}
	return true
}

func (e *ep) leave() { e.state.Add(-1) }

var errClosed = fmt.Errorf("shm: endpoint: %w", uct.ErrClosed)

// noResource is the result of a full FIFO: ErrNoResource, or
// ErrEndpointReset when the peer process is gone (reported once to the
// iface's ErrHandler). Called between enter and leave.
func (e *ep) noResource() error {
	if e.rem.alive() {
		return uct.ErrNoResource
	}
	return e.reset()
}

func (e *ep) reset() error {
	err := fmt.Errorf("shm: peer iface in pid %d closed or exited: %w", e.rem.key.pid, uct.ErrEndpointReset)
	if h := e.iface.params.ErrHandler; h != nil && !e.failed.Swap(true) {
		e.iface.w.Post(func() { h(e, err) })
	}
	return err
}

func badID(id uint8) error { return fmt.Errorf("shm: am id %d: %w", id, uct.ErrInvalidParam) }

// AMShort copies hdr and payload into one FIFO element.
func (e *ep) AMShort(id uint8, hdr uint64, payload []byte) error {
	if id >= uct.MaxAMID {
		return badID(id)
	}
	if len(payload) > e.f.seg-8 {
		return fmt.Errorf("shm: am short of %d bytes: %w", len(payload), uct.ErrMessageSize)
	}
	if !e.enter() {
		return errClosed
	}
	f := e.f
	t, ok := f.reserve()
	if !ok {
		err := e.noResource()
		e.leave()
		return err
	}
	d := f.data(t)
	binary.LittleEndian.PutUint64(d, hdr)
	copy(d[8:], payload)
	f.publish(t, id, 0, 8+len(payload))
	e.rem.kick()
	e.leave()
	return nil
}

// AMBcopy lets pack fill one FIFO element in place (MaxBcopy bytes). pack
// must not block: the element is reserved, and the consumer waits for it.
// A length outside [0, MaxBcopy] (or a panic in pack) publishes an element
// the receiver skips.
func (e *ep) AMBcopy(id uint8, pack func(buf []byte) int) (int, error) {
	if id >= uct.MaxAMID {
		return 0, badID(id)
	}
	if !e.enter() {
		return 0, errClosed
	}
	f := e.f
	t, ok := f.reserve()
	if !ok {
		err := e.noResource()
		e.leave()
		return 0, err
	}
	n := e.pack(f, t, id, pack)
	if n < 0 || n > f.seg {
		return 0, fmt.Errorf("shm: am bcopy: pack returned %d of %d bytes: %w", n, f.seg, uct.ErrMessageSize)
	}
	return n, nil
}

// pack fills ticket t with pack and always publishes it, even if pack
// panics, so that a caller's bug cannot wedge the peer's FIFO.
func (e *ep) pack(f *fifo, t uint64, id uint8, pack func([]byte) int) (n int) {
	n = -1
	defer func() {
		if n < 0 || n > f.seg {
			f.publish(t, 0, flagPad, 0)
		} else {
			f.publish(t, id, 0, n)
		}
		e.rem.kick()
		e.leave()
	}()
	n = pack(f.data(t))
	return n
}

// AMZcopy copies header and iov into one FIFO element (shared memory has no
// zero-copy send; large transfers use GetZcopy). It completes before it
// returns: comp is not used.
func (e *ep) AMZcopy(id uint8, header []byte, iov []uct.IOV, comp *uct.Completion) error {
	if id >= uct.MaxAMID {
		return badID(id)
	}
	if len(header) > maxHeader || len(iov) > maxIOV || len(header)+uct.IOVLen(iov) > e.f.seg {
		return fmt.Errorf("shm: am zcopy: header %d, %d iov, %d bytes: %w",
			len(header), len(iov), uct.IOVLen(iov), uct.ErrMessageSize)
	}
	if !e.enter() {
		return errClosed
	}
	f := e.f
	t, ok := f.reserve()
	if !ok {
		err := e.noResource()
		e.leave()
		return err
	}
	d := f.data(t)
	n := copy(d, header)
	for _, v := range iov {
		n += copy(d[n:], v.Buf)
	}
	f.publish(t, id, 0, n)
	e.rem.kick()
	e.leave()
	return nil
}

// PutZcopy writes iov into the peer's registered memory with one
// process_vm_writev copy; it completes before it returns.
func (e *ep) PutZcopy(iov []uct.IOV, raddr uint64, rkey []byte, comp *uct.Completion) error {
	return e.rma(iov, raddr, rkey, false)
}

// GetZcopy reads the peer's registered memory into iov with one
// process_vm_readv copy (UCX cma); it completes before it returns.
func (e *ep) GetZcopy(iov []uct.IOV, raddr uint64, rkey []byte, comp *uct.Completion) error {
	return e.rma(iov, raddr, rkey, true)
}

func (e *ep) rma(iov []uct.IOV, raddr uint64, rkb []byte, get bool) error {
	op, need := "put_zcopy", uct.AccessRemoteWrite
	if get {
		op, need = "get_zcopy", uct.AccessRemoteRead
	}
	if e.iface.rmaErr != nil {
		return fmt.Errorf("%w: shm: %s: %v", uct.ErrNotSupported, op, e.iface.rmaErr)
	}
	if len(iov) > maxIOV {
		return fmt.Errorf("shm: %s: %d iov elements: %w", op, len(iov), uct.ErrInvalidParam)
	}
	k, err := unpackRKey(rkb)
	if err != nil {
		return err
	}
	if k.pid != e.rem.key.pid {
		return fmt.Errorf("shm: %s: rkey of pid %d on an endpoint to pid %d: %w", op, k.pid, e.rem.key.pid, uct.ErrOutOfRange)
	}
	total := uct.IOVLen(iov)
	if err := k.check(raddr, total, need); err != nil {
		return err
	}
	if total > maxRMA {
		return fmt.Errorf("shm: %s of %d bytes: %w", op, total, uct.ErrMessageSize)
	}
	if !e.enter() {
		return errClosed
	}
	defer e.leave()
	var local [maxIOV]unix.Iovec
	nl := 0
	for _, v := range iov {
		if len(v.Buf) > 0 {
			local[nl] = unix.Iovec{Base: &v.Buf[0], Len: uint64(len(v.Buf))}
			nl++
		}
	}
	lv := local[:nl]
	for done := 0; done < total; {
		remote := [1]unix.RemoteIovec{{Base: uintptr(raddr) + uintptr(done), Len: total - done}}
		var n int
		if get {
			n, err = unix.ProcessVMReadv(k.pid, lv, remote[:], 0)
		} else {
			n, err = unix.ProcessVMWritev(k.pid, lv, remote[:], 0)
		}
		runtime.KeepAlive(iov)
		if err != nil || n <= 0 {
			return e.rmaError(op, err)
		}
		done += n
		lv = advance(lv, n)
	}
	return nil
}

// advance drops the first n bytes of v.
func advance(v []unix.Iovec, n int) []unix.Iovec {
	for n > 0 && len(v) > 0 {
		if uint64(n) < v[0].Len {
			v[0].Base = (*byte)(unsafeAdd(v[0].Base, n))
			v[0].Len -= uint64(n)
			return v
		}
		n -= int(v[0].Len)
		v = v[1:]
	}
	return v
}

func (e *ep) rmaError(op string, err error) error {
	switch {
	case errors.Is(err, unix.ESRCH):
		return e.reset()
	case errors.Is(err, unix.EFAULT):
		return fmt.Errorf("shm: %s: peer memory not mapped: %w", op, uct.ErrOutOfRange)
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("%w: shm: %s: not permitted by the kernel", uct.ErrNotSupported, op)
	case err == nil:
		return fmt.Errorf("shm: %s: no progress: %w", op, uct.ErrOutOfRange)
	}
	return fmt.Errorf("shm: %s: %v: %w", op, err, uct.ErrEndpointReset)
}

// Flush: sends complete when they return, so there is nothing to wait for.
func (e *ep) Flush(comp *uct.Completion) error {
	if e.state.Load()&epClosed != 0 {
		return errClosed
	}
	return nil
}

// PendingAdd queues r until the peer's FIFO has room: the iface re-checks
// on every progress and on a backoff timer while the worker sleeps.
func (e *ep) PendingAdd(r *uct.PendingReq) error {
	if !e.enter() {
		return errClosed
	}
	defer e.leave()
	// Ask the consumer to ring us when it frees room, then check
	// (room protocol, fifo.go).
	e.f.wantRoom(e.iface.pid, e.iface.nonce)
	if e.f.hasRoom() {
		return uct.ErrBusy
	}
	e.pending.Add(r)
	e.iface.addPending(e)
	return nil
}

func (e *ep) PendingPurge(cb func(r *uct.PendingReq)) { e.pending.Purge(cb) }

func (e *ep) Address() ([]byte, error) { return nil, uct.NotSupported("shm: ep address") }

func (e *ep) ConnectToEP(devAddr, epAddr []byte) error {
	return uct.NotSupported("shm: connect to ep")
}

// Close waits out calls in flight on other goroutines (each is bounded),
// drops pending requests and releases the peer mapping. It never waits for
// the peer. Close is idempotent.
func (e *ep) Close() error {
	for {
		s := e.state.Load()
		if s&epClosed != 0 {
			return nil
		}
		if e.state.CompareAndSwap(s, s|epClosed) {
			break
		}
	}
	for e.state.Load() != epClosed {
		runtime.Gosched()
	}
	i := e.iface
	i.removePending(e)
	e.pending.Purge(nil)
	i.mu.Lock()
	delete(i.eps, e)
	i.releaseLocked(e.rem)
	i.mu.Unlock()
	return nil
}
